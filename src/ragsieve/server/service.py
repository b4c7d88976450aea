"""The served filter behind the routes: one artifact generation answering requests.

A :class:`Service` is built once per artifact generation and never changed afterwards
(only its caches fill): the filter, what ``/healthz`` shows of the artifact, the
exchangeability monitor and, under ``--adaptive``, the link to the shared adaptive
threshold. The :class:`~ragsieve.server.runtime.Runtime` holds what outlives a swap (the model thread, the index,
the feedback store, the metrics) and the current service in one attribute. A request
reads that attribute once and uses the service it got to the end, so a reload never
touches an in-flight request: requests that started before the swap finish on the old
service, the next ones get the new one.

A request is checked (:mod:`ragsieve.server.request_checks`), its model work is run in the
one model thread in fair turns (:mod:`ragsieve.server.model_work`; requests with vectors or
outside scores need no model and stay in the pool), and its answer is built from the
filter's result (:mod:`ragsieve.server.answers`). Index searches are serialised with a
lock, and so are scorers not known to be thread-safe outside the model thread. A served
index whose directory is removed answers 503 and logs an error. The state directory's
monitor files are :mod:`ragsieve.server.state`'s.
"""

from __future__ import annotations

import copy
import logging
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np

from .._version import __version__
from ..embeddings.detection import LanguageWatch
from ..filter import ConformalFilter
from ..types import FilterResult
from .answers import (
    artifact_info,
    filter_response,
    lists_info,
    monitor_info,
    p_value_rule_of,
    query_response,
)
from .feedback import AdaptiveThreshold, FeedbackStore, LabelRateLimited, ServedRow, scorer_key
from .metrics import ServiceMetrics
from .model_work import ModelWork, filter_with_model
from .options import DEFAULT_MAX_PIECES, DEFAULT_MAX_QUEUE, ServeOptions  # noqa: F401 (re-exported)
from .page import RecentRequests
from .reload import ArtifactCheck, probe_scorer  # probe_scorer: re-exported (its old home)
from .request_checks import (
    bad_request_as_422,
    check_min_keep,
    check_outside_scores,
    check_query,
    check_vector_dim,
    http_error,
    model_of,
    request_snippet_ids,
    show_int,
    snippet_vectors,
    state_unavailable,
    upstream_as_502,
)
from .rerank import (
    Api,
    RerankAnswer,
    RerankRequest,
    ServedFilter,
    rerank_answer,
    to_filter_request,
)
from .scheduling import work_pieces
from .schemas import (
    AdaptiveInfo,
    FeedbackRequest,
    FeedbackResponse,
    FilterRequest,
    FilterResponse,
    Health,
    IndexInfo,
    KeepRuleInfo,
    ListsInfo,
    QueryRequest,
    QueryResponse,
    StatusResponse,
)
from .state import monitor_from_artifact, monitor_path, reset_shared_monitor  # old home

__all__ = ["Service", "Shared", "monitor_from_artifact", "monitor_info", "monitor_path",
           "probe_scorer", "reset_shared_monitor"]

logger = logging.getLogger(__name__)

#: How many filters with a request's own ``min_keep`` are kept for reuse.
_MAX_CACHED_FILTERS = 64


class Shared(Protocol):
    """What a :class:`Service` reads of the runtime that built it, which outlives it
    (:class:`~ragsieve.server.runtime.Runtime`): limits, index, store, metrics, model work."""

    @property
    def max_snippets(self) -> int: ...
    @property
    def max_k(self) -> int: ...
    @property
    def max_labels_per_query(self) -> int: ...
    @property
    def max_labels_per_minute(self) -> int: ...
    @property
    def index(self) -> Any: ...
    @property
    def index_lock(self) -> AbstractContextManager[Any]: ...
    @property
    def index_info(self) -> IndexInfo | None: ...
    @property
    def store(self) -> FeedbackStore: ...
    @property
    def metrics(self) -> ServiceMetrics: ...
    @property
    def recent(self) -> RecentRequests: ...
    @property
    def model_work(self) -> ModelWork: ...
    @property
    def published(self) -> tuple[int | None, str | None]: ...


class Service:
    """One artifact generation as served: filter, health, monitor, adaptive threshold.

    Built by :meth:`~ragsieve.server.runtime.Runtime.build`; requests call
    :meth:`run_filter`, :meth:`run_query`, :meth:`run_feedback` and :meth:`health` on the
    service they read at their start.
    """

    def __init__(self, runtime: Shared, checked: ArtifactCheck, generation: int, *,
                 monitor: Any, adaptive: AdaptiveThreshold | None) -> None:
        flt = checked.filter
        self.runtime = runtime
        self.flt = flt
        self.artifact = checked.artifact
        self.checksum = checked.checksum
        self.generation = generation
        self.monitor = monitor
        self.adaptive = adaptive
        self.info = artifact_info(flt, checked.artifact, checked.checksum)
        self.guarantee = self.info.guarantee
        self.scorer_key = scorer_key(flt.scorer_.spec())
        # the scorer's tags (ScorerTags.thread_safe, .model_free) say how it may be called;
        # the lock guards calls outside the model thread (vectors, outside scores); the model
        # thread runs one call at a time anyway
        self.lock: AbstractContextManager[Any] = (nullcontext() if flt.scorer_.tags.thread_safe
                                                  else threading.Lock())
        self.uses_model = not flt.scorer_.tags.model_free
        self._vector_dim: tuple[int | None] | None = None
        self._cache_lock = threading.Lock()
        self._adaptive_version: int | None = None
        self._filters: dict[int, ConformalFilter] = {flt.min_keep: flt}
        self._retriever_notes: dict[int, str | None] = {}
        # warns once if the first requests' queries are in another language than the artifact's
        # (the queries' language: an English-over-German filter expects English queries, a
        # German filter German ones; knowing the snippets' language, the note also points at
        # --query-language)
        query_language = flt.calibration_info.query_language or flt.language
        self.language_watch = LanguageWatch(query_language, model=model_of(flt.scorer_.spec()),
                                            snippets=flt.language)

    # ------------------------------------------------------------------ filters
    def _base(self) -> ConformalFilter:
        """The filter in force (under --adaptive: with the shared calibrator's latest state)."""
        if self.adaptive is None:
            return self.flt
        version, calibrator = self.adaptive.current()
        with self._cache_lock:
            if version != self._adaptive_version:
                base = copy.copy(self.flt)
                base.calibrator_ = calibrator
                self._filters = {base.min_keep: base}
                self._adaptive_version = version
            return self._filters[self.flt.min_keep]

    def filter_for(self, min_keep: int | None) -> ConformalFilter:
        """The served filter with another ``min_keep`` (a few are kept for reuse)."""
        base = self._base()
        k = base.min_keep if min_keep is None else min_keep
        with self._cache_lock:
            use = self._filters.get(k)
            if use is None:
                use = copy.copy(base)  # shares the scorer and the fitted calibrator
                use.min_keep = k
                if len(self._filters) < _MAX_CACHED_FILTERS:
                    self._filters[k] = use
        return use

    @property
    def threshold(self) -> float:
        """The threshold in force now."""
        return float(self._base().threshold)

    # ------------------------------------------------------------------ requests
    def run_filter(self, request: FilterRequest) -> FilterResponse:
        """``POST /filter``: score the request's snippets (or use its vectors) and filter."""
        res, query_id = self.filter_request(request, endpoint="/filter")
        return filter_response(res, query_id, self.flt, self.guarantee)

    def run_rerank(self, request: RerankRequest, *, route: str, api: Api,
                   everything: bool) -> RerankAnswer:
        """``POST /v1/rerank``, ``/v2/rerank``, ``/rerank`` (and their ``/all`` forms): the
        request's documents filtered as ``/filter`` snippets, answered in the rerank API
        (:mod:`ragsieve.server.rerank`). 422 for a filter without calibration evidence (no
        p-value to answer with) and for TEI's ``texts`` on a Cohere route."""
        if api != "tei" and request.texts is not None:
            raise http_error(422, f"POST {route} takes the documents as 'documents' (Cohere, "
                                  "Jina, vLLM); TEI's 'texts' go to POST /rerank.")
        if self.flt.evidence is None:
            raise http_error(422, "the served filter stores no calibration evidence, so it has "
                                  "no p-value to answer as relevance_score; recalibrate it "
                                  "with this ragsieve (`ragsieve calibrate`), or use POST "
                                  "/filter.")
        res, query_id = self.filter_request(to_filter_request(request), endpoint=route)
        served = ServedFilter(guarantee=self.guarantee, rule=str(self.flt.scorer_.keep_rule(
            res.threshold)), name=self.flt.scorer_.name, p_value_rule=p_value_rule_of(self.flt),
            endpoint_note=self.flt.scorer_.endpoint_note())
        return rerank_answer(res, query_id, request, api=api, everything=everything,
                             info=served)

    def filter_request(self, request: FilterRequest, *,
                       endpoint: str) -> tuple[FilterResult, str]:
        """Check, score and filter one request's snippets, and record what was served.

        Returns the result and the request's ``query_id`` (its own, or a new one); the
        served rows, metrics and monitor are updated under ``endpoint``'s name."""
        rt = self.runtime
        check_query(request.query)
        self.language_watch.see(request.query)
        n = len(request.snippets)
        if n > rt.max_snippets:
            raise http_error(413, f"got {n} snippets; the limit is {rt.max_snippets} per request.")
        check_min_keep(request.min_keep, rt.max_snippets, "snippets")
        snippet_ids = request_snippet_ids(request)  # unique, before any model work
        check_outside_scores(request, self.flt.scorer_)
        vectors = snippet_vectors(request)
        if vectors is not None:
            check_vector_dim(vectors.shape[1], self.vector_dim(), self.flt.scorer_.spec())
        items = [s if isinstance(s, str) else s.as_item() for s in request.snippets]
        use = self.filter_for(request.min_keep)
        with upstream_as_502(), bad_request_as_422():
            if vectors is None and self.uses_model:
                res = filter_with_model(rt.model_work, use, request.query, items,
                                        request.group)
            else:
                with self.lock:
                    res = self._filter_in_pool(use, request, items, vectors)
        query_id = request.query_id or uuid.uuid4().hex
        groups = [request.group if isinstance(s, str) or s.group is None else s.group
                  for s in request.snippets]
        self._served(endpoint, query_id, snippet_ids, groups, res)
        return res, query_id

    def vector_dim(self) -> int | None:
        """The dimension of the vectors the served scorer takes (None: it takes none)."""
        if self._vector_dim is None:  # asked once: it may load the model
            self._vector_dim = (self.runtime.model_work.in_model_thread(
                self.flt.scorer_.vector_dim),)
        return self._vector_dim[0]

    def _filter_in_pool(self, use: ConformalFilter, request: FilterRequest, items: list[Any],
                        vectors: np.ndarray | None) -> FilterResult:
        """Filter without the model: outside scores, or the request's own vectors."""
        if vectors is None:
            return use.filter(request.query, items, group=request.group)
        query_vector = np.asarray(request.query_vector, dtype=np.float64)
        return use.filter_vectors(request.query, query_vector, vectors, items,
                                  group=request.group)

    def run_query(self, request: QueryRequest) -> QueryResponse:
        """``POST /query``: retrieve ``k`` hits from the index and filter them."""
        rt = self.runtime
        if rt.index is None:
            raise http_error(
                404,
                "this service has no index; start it with `ragsieve serve --filter F --index DIR` "
                "or use POST /filter with your own snippets.",
            )
        check_query(request.query)
        self.language_watch.see(request.query)
        if request.k > rt.max_k:
            raise http_error(413, f"k == {show_int(request.k)}; the limit is {rt.max_k}.")
        check_min_keep(request.min_keep, rt.max_k, "hits (k)")
        use = self.filter_for(request.min_keep)
        rt.model_work.check_budget([request.query])  # the question is embedded; the hits are stored
        from ..filtered_search import query_with_filter
        from ..store import IndexMissingError

        try:
            with bad_request_as_422(), rt.index_lock:
                hits, res = rt.model_work.run(  # embeds the question; hits use stored vectors
                    [lambda: query_with_filter(
                        rt.index, request.query, use, k=request.k, group=request.group)],
                    costs=[max(1, work_pieces([request.query]))],
                )
        except IndexMissingError as exc:
            logger.error("cannot answer /query: %s", exc)
            raise http_error(503, "the served index is missing (removed while serving); the "
                             "operator must restore or rebuild it.") from exc
        query_id = request.query_id or uuid.uuid4().hex
        self._served("/query", query_id, [h.snippet_id for h in hits],
                     [request.group] * len(hits), res)
        return query_response(hits, res, use, guarantee=self.guarantee, query_id=query_id,
                              lists_note=self._query_lists_note(res, request.k))

    def _query_lists_note(self, res: FilterResult, k: int) -> str | None:
        """``/query``'s lists note: the list check's, and (once per ``k``, then cached) why the
        served index's top ``k`` are not the calibration lists' retriever, when they are not."""
        with self._cache_lock:
            if k not in self._retriever_notes and len(self._retriever_notes) < 64:
                self._retriever_notes[k] = self._retriever_note(k)
            reason = self._retriever_notes.get(k)
        notes = [n for n in (reason, res.lists_note) if n]
        return "; ".join(notes) or None

    def _retriever_note(self, k: int) -> str | None:
        """Why the served index's top ``k`` are not the calibration lists' retriever (logged
        once per ``k``); None when nothing known differs."""
        from ..lists import DOCS, compare_retriever

        index = self.runtime.index
        if index is None:
            return None
        try:
            reason = compare_retriever(self.flt.lists, index.retriever_identity(k))
        except Exception:  # the note must not fail a request; the index errors are /query's
            logger.exception("comparing the served index with the artifact's calibration lists "
                             "failed")
            return None
        if reason:
            logger.warning("%s; the filter's score reads the whole list, so its guarantee holds "
                           "for lists like its calibration lists: calibrate through this index "
                           "(`ragsieve retrieve --index ... -k %d`); see %s", reason, k, DOCS)
        return reason

    def _served(self, endpoint: str, query_id: str, snippet_ids: Sequence[str],
                groups: Sequence[Any], res: FilterResult) -> None:
        """After an answer is computed: the served record, metrics, the monitor.

        The served rows are committed before the request is answered; when the state
        file cannot be written the request is answered 503 (with ``Retry-After``) and
        nothing of it counts. Metrics and monitor errors are logged, never raised.
        """
        rt = self.runtime
        kept = {s.index for s in res.kept}
        if rt.store is not None:
            rows = [ServedRow(query_id, str(sid), float(score), float(res.threshold), i in kept,
                              None if g is None else str(g))
                    for i, (sid, score, g) in enumerate(zip(snippet_ids, res.scores, groups,
                                                            strict=True))]
            try:
                rt.store.record_served(rows, key=self.scorer_key, checksum=self.checksum,
                                       endpoint=endpoint)
            except sqlite3.Error as exc:
                raise state_unavailable(rt.store, exc) from exc
        rt.recent.add(endpoint, kept=len(kept), total=len(res.scores))
        try:
            rt.metrics.served(endpoint, res.scores, len(kept), res.threshold,
                              lists_unlike=res.lists_unlike)
        except Exception:  # pragma: no cover - prometheus-client does not raise here
            logger.exception("metrics update failed")
        scores = res.unit_scores  # the monitor ranks what was calibrated: sentences or snippets
        if self.monitor is not None and scores:
            self.observe(scores)

    def observe(self, scores: Sequence[float]) -> None:
        """Feed one request's served scores to the monitor (errors are logged, not raised).

        The monitor logs the alarm itself, once, when a request makes it fire."""
        try:
            state = self.monitor.observe(np.asarray(scores, dtype=np.float64))
        except Exception:
            logger.exception("exchangeability monitor failed on a request; the request is "
                             "answered anyway")
            return
        try:
            self.runtime.metrics.set_monitor(state)
        except Exception:  # pragma: no cover
            logger.exception("metrics update failed")
        # the monitor itself logs the alarm once, in the process whose request fired it

    def run_feedback(self, request: FeedbackRequest, *, client: str = "") -> FeedbackResponse:
        """``POST /feedback``: store labels of served snippets; under --adaptive, move the
        threshold. 413 over ``max_snippets`` (or the per-minute cap) items, 429 beyond
        ``max_labels_per_minute`` for ``client``, 503 when the state file is busy."""
        rt = self.runtime
        if rt.store is None:  # pragma: no cover - every runtime has a store
            raise http_error(404, "this service keeps no feedback.")
        n, per_minute = len(request.items), rt.max_labels_per_minute
        for limit, what in ((rt.max_snippets, "per request"), (per_minute, "per minute")):
            if limit is not None and n > limit:
                raise http_error(413, f"got {n} labels; the limit is {limit} {what}.")
        items = [(i.query_id, i.snippet_id, bool(i.relevant)) for i in request.items]
        try:
            outcome = rt.store.add_labels(
                items, key=self.scorer_key, client=client, adaptive=self.adaptive,
                max_per_query=rt.max_labels_per_query, max_per_minute=per_minute)
        except LabelRateLimited as exc:
            raise http_error(429, str(exc), retry_after=exc.retry_after) from exc
        except sqlite3.Error as exc:
            raise state_unavailable(rt.store, exc) from exc
        for item in request.items:
            rt.metrics.feedback.labels("1" if item.relevant else "0").inc()
        if outcome.adaptive_updates:
            logger.info("feedback: %d relevant label(s) applied; adaptive threshold now %s",
                        outcome.adaptive_updates, outcome.adaptive)
            rt.metrics.threshold.set(self.threshold)
        return FeedbackResponse(
            accepted=outcome.accepted, new=outcome.new, unknown=outcome.unknown,
            over_limit=outcome.over_limit, adaptive_updates=outcome.adaptive_updates,
            adaptive=None if outcome.adaptive is None else AdaptiveInfo(**outcome.adaptive),
        )

    def health(self) -> Health:
        """``GET /healthz``: the artifact, index, generation, monitor and adaptive state."""
        rt = self.runtime
        info = self.info
        adaptive = None
        if self.adaptive is not None:
            adaptive = AdaptiveInfo(**self.adaptive.info())
            info = info.model_copy(update={"threshold": adaptive.threshold})
        monitor = None if self.monitor is None else monitor_info(self.monitor.state)
        published_generation, degraded = rt.published  # one snapshot of the pair
        return Health(status="ok", library_version=__version__, artifact=info,
                      index=rt.index_info, generation=self.generation, monitor=monitor,
                      adaptive=adaptive, published_generation=published_generation,
                      degraded=degraded, lists=self.lists_info(),
                      endpoint_note=self.flt.scorer_.endpoint_note())

    def lists_info(self) -> ListsInfo | None:
        """The calibration lists and the service's list check (None without a record)."""
        return lists_info(self.flt)

    def status(self) -> StatusResponse:
        """``GET /status``: the guarantee, keep rule, drift state and last requests (the
        page at ``/`` shows it)."""
        rule = self.flt.scorer_.keep_rule(self.threshold)
        sign = -1 if self.flt.scorer_.keep_rule(1.0).threshold < 0 else 1
        monitor = None if self.monitor is None else monitor_info(self.monitor.state)
        recent = self.runtime.recent
        return StatusResponse(
            generation=self.generation, statement=str(self.guarantee.get("statement", "")),
            keep_rule=KeepRuleInfo(score_sign=sign, **rule.to_dict()), monitor=monitor,
            recent=recent.snapshot(), recent_capacity=recent.capacity)
