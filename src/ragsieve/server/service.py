"""The served filter behind the routes, and the runtime that swaps it on a reload.

A :class:`Service` is built once per artifact generation and never changed afterwards
(only its caches fill): the filter, what ``/healthz`` shows of the artifact, the
exchangeability monitor and, under ``--adaptive``, the link to the shared adaptive
threshold. The :class:`Runtime` holds what outlives a swap (the model thread, the index,
the feedback store, the metrics) and the current service in one attribute. A request
reads that attribute once and uses the service it got to the end, so a reload never
touches an in-flight request: requests that started before the swap finish on the old
service, the next ones get the new one.

``/filter`` and ``/query`` are sync endpoints, so requests are parsed, checked and
answered in Starlette's threadpool and served concurrently. Every call that may run the
model (scoring snippet texts, embedding a ``/query`` question) is handed to one
dedicated model thread: the embedding cache serialises model calls anyway, and doing
them all in one thread keeps the model's working memory in one allocator arena instead
of one per pool thread (measured in ``benchmarks/bench_server.py --long``).

Model work is fair (:class:`~ragsieve.server.scheduling.FairQueue`): a request's model work
is counted before any of it is done, by the characters the model reads in pieces of 500
(:func:`~ragsieve.server.scheduling.work_pieces`: the query, every snippet piece, every
sentence or piece of a long sentence, and for a sentence filter each snippet read whole as
context; 413 beyond ``max_pieces``, first from a bound on the texts as sent, so that a
request far over the budget is not even cut), then embedded into the scorer's cache in
steps of at most ``PIECES_PER_STEP`` pieces of work
(:func:`~ragsieve.server.scheduling.cost_steps`), one step per waiting request in turn,
and the request's final ``filter`` call (which a list-relative score needs whole) reads
them back from the cache. A small request therefore waits for one step of each request
ahead of it, not for a large request to finish; more than ``max_queue`` waiting requests
get 429 with ``Retry-After``. Requests with vectors or outside scores need no model and stay
in the pool (vectors must have the dimension of the scorer's model). Index searches are
serialised with a lock, and so are scorers not known to be thread-safe outside the model
thread. A served index whose directory is removed answers 503 and logs an error.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import fastapi
import numpy as np

from .._version import __version__
from ..artifact import Artifact
from ..embeddings.detection import LanguageWatch
from ..errors import ArtifactError, DataError, RerankError
from ..filter import ConformalFilter
from ..keeping import p_value_rule
from ..types import FilterResult
from .feedback import AdaptiveThreshold, FeedbackStore, LabelRateLimited, ServedRow, scorer_key
from .list_store import SharedListWatch, lists_path, reset_lists_file
from .metrics import ServiceMetrics
from .options import DEFAULT_MAX_PIECES, DEFAULT_MAX_QUEUE, ServeOptions  # noqa: F401 (re-exported)
from .page import RecentRequests
from .parsing import BUSY_RETRY_AFTER, printable
from .reload import ArtifactCheck, Generation, Generations, check_artifact
from .rerank import (
    Api,
    RerankAnswer,
    RerankRequest,
    ServedFilter,
    rerank_answer,
    to_filter_request,
)
from .scheduling import (
    PIECE_CHARS,
    PIECE_WORDS,
    FairQueue,
    QueueFull,
    cost_steps,
    least_work,
    text_cost,
    work_pieces,
)
from .schemas import (
    AdaptiveInfo,
    ArtifactInfo,
    FeedbackRequest,
    FeedbackResponse,
    FilterRequest,
    FilterResponse,
    Health,
    HitOut,
    IndexInfo,
    KeepRuleInfo,
    KeptSnippet,
    ListsInfo,
    MonitorInfo,
    QueryRequest,
    QueryResponse,
    RemovedSnippet,
    StatusResponse,
)

__all__ = ["Runtime", "Service", "monitor_from_artifact", "monitor_info", "monitor_path",
           "probe_scorer", "reset_shared_monitor"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How many filters with a request's own ``min_keep`` are kept for reuse.
_MAX_CACHED_FILTERS = 64
#: Most model work of one request per turn of the fair model queue, in pieces of 500
#: characters: about what a small request waits for beside a large one (p99 443 ms at load
#: 4.5 in ``--fairness``). Only a single text costing more (the query, or a snippet a
#: sentence filter reads whole) makes a bigger step, bounded by ``max_pieces``.
PIECES_PER_STEP = 8
#: Measured model throughput (pieces/s, see ``options.DEFAULT_MAX_PIECES``), for ``Retry-After``.
PIECES_PER_SECOND = 50
NO_MONITOR = "artifact has no monitor reference; recalibrate to enable the alarm"


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON: numpy scalars unwrapped, tuples as lists, inf/NaN as null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _finite_or_none(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def http_error(status: int, detail: str, *,
               retry_after: float | None = None) -> fastapi.HTTPException:
    """An ``HTTPException`` with a one-line JSON ``detail`` (and ``Retry-After`` seconds)."""
    headers = None if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}
    return fastapi.HTTPException(status_code=status, detail=detail, headers=headers)


@contextmanager
def bad_request_as_422() -> Iterator[None]:
    """Turn the library's errors about a request (bad values, types, data) into 422."""
    try:
        yield
    except (DataError, ValueError, TypeError) as exc:
        message = printable(str(exc))
        logger.info("request refused (422): %s", message)
        raise http_error(422, message) from exc


@contextmanager
def upstream_as_502() -> Iterator[None]:
    """Turn a failure of the endpoint a score calls (a reranker that is down, refuses or
    answers out of shape, after its retries) into 502 Bad Gateway naming it: the request
    was fine, the service behind the filter was not. Logged; never a score."""
    try:
        yield
    except RerankError as exc:
        message = printable(str(exc))
        logger.warning("upstream reranker failed (502): %s", message)
        raise http_error(502, f"the reranker this filter's score calls failed: {message}"
                         ) from exc


def _request_snippet_ids(request: FilterRequest) -> list[str]:
    """Each snippet's id (its own, else its position), refusing a repeated one with 422: the
    served record keys a snippet by (query_id, snippet_id), so ``POST /feedback`` on a
    repeated id would label another snippet than the one meant."""
    ids = [str(i) if isinstance(s, str) or s.snippet_id is None else s.snippet_id
           for i, s in enumerate(request.snippets)]
    first: dict[str, int] = {}
    for i, sid in enumerate(ids):
        if sid in first:
            raise http_error(
                422, f"snippets[{i}].snippet_id == {printable(sid)[:80]!r} repeats "
                     f"snippets[{first[sid]}]'s (a snippet without an id takes its position as "
                     "its id); every snippet of a request needs its own id, or POST /feedback "
                     "would label another snippet than the one meant.")
        first[sid] = i
    return ids


def _check_query(query: str) -> None:
    if not query.strip():
        raise http_error(422, "query is blank; expected a non-empty string.")


def _show_int(value: int) -> str:
    """``value`` for an error message (a description when it is very long)."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 20 else f"a {digits}-digit number"


def _check_min_keep(min_keep: int | None, limit: int, what: str) -> None:
    if min_keep is not None and min_keep > limit:
        raise http_error(
            422,
            f"min_keep == {_show_int(min_keep)}, must be <= {limit} (the {what} a request "
            "may have).",
        )


def _check_vector_dim(dim: int, scorer_dim: int | None, spec: Mapping[str, Any]) -> None:
    """422 unless the request's vectors have the dimension the served scorer takes."""
    if scorer_dim is None:
        raise http_error(
            422,
            f"the served scorer ({spec.get('scorer')}) does not score from vectors; send the "
            "snippets' texts (or outside scores) without 'query_vector' and 'vector'.",
        )
    if dim != scorer_dim:
        raise http_error(
            422,
            f"query_vector and the snippet vectors have dimension {dim}; the served scorer's "
            f"model ({_model_of(spec)}) makes vectors of dimension "
            f"{scorer_dim}. Embed with that model.",
        )


def _model_of(spec: Mapping[str, Any]) -> Any:
    """The embedding model named by a scorer spec (or by its base scorer's)."""
    base = spec.get("base")
    return spec.get("model") or (base.get("model") if isinstance(base, Mapping) else base)


def _snippet_vectors(request: FilterRequest) -> np.ndarray | None:
    """The ``(n, dim)`` snippet vectors of a request with ``query_vector``, else None.

    Raises 422 when a snippet lacks a vector or its length differs from the query's,
    and when snippets carry vectors but the request has no ``query_vector``.
    """
    snippets = request.snippets
    if request.query_vector is None:
        carrying = [i for i, s in enumerate(snippets) if not isinstance(s, str) and s.vector]
        if carrying:
            raise http_error(
                422,
                f"snippet {carrying[0]} has a 'vector' but the request has no 'query_vector'; "
                "send the query's vector too, or drop the snippet vectors.",
            )
        return None
    dim = len(request.query_vector)
    for i, s in enumerate(snippets):
        vector = None if isinstance(s, str) else s.vector
        if vector is None or len(vector) != dim:
            got = "no 'vector'" if vector is None else f"a vector of length {len(vector)}"
            raise http_error(
                422,
                f"snippet {i} has {got}; with a query_vector of length {dim} every snippet "
                f"must be an object with a 'vector' of length {dim}.",
            )
    rows = [s.vector for s in snippets if not isinstance(s, str)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), dim)


def monitor_from_artifact(artifact: Artifact, *, delta: float,
                          store: str | Path | None) -> Any:
    """The exchangeability monitor of an artifact, or None when it carries no reference."""
    from ..monitoring import ExchangeabilityMonitor

    return ExchangeabilityMonitor.from_artifact(artifact, delta=delta, store=store)


def monitor_path(monitor_dir: Path, checksum: str) -> Path:
    """The shared monitor file of the artifact ``checksum`` in ``monitor_dir``."""
    return monitor_dir / f"monitor-{checksum[:16]}.sqlite"


def reset_shared_monitor(artifact: Artifact, checksum: str, monitor_dir: Path,
                         delta: float, factory: Callable[..., Any] | None = None) -> bool:
    """Reset an artifact's shared monitor store and its list check's
    (:mod:`ragsieve.server.list_store`) when they were kept (a store not there yet starts
    fresh, at epoch 0, like a monitor in memory); False when nothing was reset or the
    artifact has no monitor reference."""
    lists = lists_path(monitor_dir, checksum)
    try:
        reset_lists_file(lists)
    except (sqlite3.Error, OSError) as exc:
        raise DataError(f"state file {str(lists)!r} cannot be reset ({exc}); move it away or "
                        "pass another --state-dir.") from exc
    store = monitor_path(monitor_dir, checksum)
    if not store.exists():
        return False
    monitor = (factory or monitor_from_artifact)(artifact, delta=delta, store=store)
    if monitor is None:
        return False
    try:
        monitor.reset()
    finally:
        close = getattr(monitor, "close", None)
        if callable(close):
            close()
    return True


def probe_scorer(checked: ArtifactCheck, source: str,
                 run: Callable[[Callable[[], Any]], Any] | None = None) -> None:
    """Score one pair with a checked artifact's scorer (its model and learned weights are
    loaded here), so an artifact whose scorer cannot score is refused before it is
    published. A scorer that needs no model (an outside score) has nothing to load.

    Raises
    ------
    ArtifactError
        The scorer failed (one line naming the artifact and the reason).
    """
    scorer = checked.filter.scorer
    if scorer.model_free:
        return
    call = run or (lambda fn: fn())
    try:
        call(lambda: scorer.score_batch("ragsieve reload check", ["ragsieve reload check"]))
    except Exception as exc:  # whatever the weights or the model raise: refused, never published
        raise ArtifactError(f"artifact {source!r} cannot score with its scorer "
                            f"({type(exc).__name__}: {printable(str(exc))[:300]})") from exc


def _check_outside_scores(request: FilterRequest, scorer: Any) -> None:
    """422 for an outside score the served filter does not read (never ignored).

    A filter calibrated on an outside score reads it as ``score`` or under its field name
    (e.g. ``bm25``); any other filter reads none.
    """
    field = scorer.outside_field()
    for i, s in enumerate(request.snippets):
        if isinstance(s, str):
            continue
        extra = sorted(s.outside)
        if field is None and (s.score is not None or extra):
            given = ["score"] if s.score is not None else []
            raise http_error(422, f"snippet {i} has {given + extra}, but this filter scores "
                                  f"{scorer.keep_rule(0.0).score} and reads no outside score; "
                                  "drop them.")
        unknown = [k for k in extra if k != field]
        if unknown:
            raise http_error(422, f"snippet {i} has unknown key(s) {unknown}; this filter reads "
                                  f"its outside score as {field!r} (or 'score').")
        if field in extra and s.score is not None and field != "score":
            raise http_error(422, f"snippet {i} has both 'score' and {field!r}; they name the "
                                  "same outside score: give one.")


def _unit_scores(res: FilterResult) -> list[float]:
    """The scores of what the filter scored and kept: each snippet's, or (unit sentence)
    each sentence's -- what the calibration reference of the monitor holds."""
    if res.unit == "sentence":
        return [s[3] for s in res.sentences]
    return list(res.scores)


def _removed(res: FilterResult) -> list[RemovedSnippet]:
    """The removed snippets of a result, each with its score and the threshold it missed."""
    tau = _finite_or_none(res.threshold)
    return [RemovedSnippet(index=s.index, snippet_id=s.snippet_id, score=s.score,
                           p_value=s.p_value, threshold=tau)
            for s in res.removed]


def _p_value_rule(flt: ConformalFilter) -> str | None:
    """How the p-values read beside the filter's rule; None when it has none."""
    return None if flt.evidence is None else p_value_rule(flt.calibrator)


def monitor_info(state: Any) -> MonitorInfo:
    """What ``/healthz`` (and ``/admin/monitor/reset``) show of a monitor state."""
    return MonitorInfo(
        alarm=bool(state.alarm),
        martingale=_finite_or_none(float(state.martingale)),
        log10_martingale=_finite_or_none(float(state.log10_martingale)),
        fired_at=state.fired_at,
        fired_time=state.fired_time,
        n_observed=int(state.n_observed),
        delta=float(state.delta),
    )


def artifact_view(checked: ArtifactCheck) -> ArtifactInfo:
    """Build what ``/healthz`` shows of a checked artifact, so a reload that cannot be shown
    is refused before it is published (``ArtifactError``)."""
    try:
        info = _artifact_info(checked.filter, checked.artifact, checked.checksum)
        Health(status="ok", library_version=__version__, artifact=info)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ArtifactError(f"artifact cannot be shown by /healthz: {printable(str(exc))}") from exc
    return info


def _artifact_info(flt: ConformalFilter, artifact: Artifact, checksum: str) -> ArtifactInfo:
    guarantee = _json_safe(flt.guarantee())
    n_calibration = guarantee.get("n_calibration")
    return ArtifactInfo(
        format_version=artifact.format_version,
        library_version=artifact.library_version,
        created=artifact.created,
        mode=guarantee.get("mode"),
        guaranteed_metric=guarantee.get("metric"),
        alpha=guarantee.get("alpha"),
        threshold=_finite_or_none(flt.threshold),
        n_calibration=None if n_calibration is None else int(n_calibration),
        min_keep=flt.min_keep,
        unit=flt.unit,
        group_by=getattr(flt, "group_by", None),
        scorer=flt.scorer.spec(),
        guarantee=guarantee,
        checksum=checksum,
    )


def _state_unavailable(store: FeedbackStore, exc: sqlite3.Error) -> fastapi.HTTPException:
    """503 with ``Retry-After`` for a state file that could not be written (logged)."""
    logger.error("feedback database %s: %s; answered 503", store.path, exc)
    return http_error(503, f"the service's state file is unavailable ({printable(str(exc))}); "
                           f"nothing was stored, retry after {BUSY_RETRY_AFTER} s.",
                      retry_after=BUSY_RETRY_AFTER)


class Service:
    """One artifact generation as served: filter, health, monitor, adaptive threshold.

    Built by :meth:`Runtime.build`; requests call :meth:`run_filter`, :meth:`run_query`,
    :meth:`run_feedback` and :meth:`health` on the service they read at their start.
    """

    def __init__(self, runtime: Runtime, checked: ArtifactCheck, generation: int, *,
                 monitor: Any, adaptive: AdaptiveThreshold | None) -> None:
        flt = checked.filter
        self.runtime = runtime
        self.flt = flt
        self.artifact = checked.artifact
        self.checksum = checked.checksum
        self.generation = generation
        self.monitor = monitor
        self.adaptive = adaptive
        self.info = _artifact_info(flt, checked.artifact, checked.checksum)
        self.guarantee = self.info.guarantee
        self.scorer_key = scorer_key(flt.scorer.spec())
        # the scorer's tags (Scorer.thread_safe, Scorer.model_free) say how it may be called;
        # the lock guards calls outside the model thread (vectors, outside scores); the model
        # thread runs one call at a time anyway
        self.lock: AbstractContextManager[Any] = (nullcontext() if flt.scorer.thread_safe
                                                  else threading.Lock())
        self.uses_model = not flt.scorer.model_free
        self._vector_dim: tuple[int | None] | None = None
        self._cache_lock = threading.Lock()
        self._adaptive_version: int | None = None
        self._filters: dict[int, ConformalFilter] = {flt.min_keep: flt}
        self._retriever_notes: dict[int, str | None] = {}
        # warns once if the first requests' queries are in another language than the artifact's
        # (the queries' language: an English-over-German filter expects English queries, a
        # German filter German ones; knowing the snippets' language, the note also points at
        # --query-language)
        query_language = (flt.calibration_info or {}).get("query_language") or flt.language
        self.language_watch = LanguageWatch(query_language, model=_model_of(flt.scorer.spec()),
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
                base.calibrator = calibrator
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
        return self._filter_response(res, query_id)

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
        served = ServedFilter(guarantee=self.guarantee, rule=str(self.flt.scorer.keep_rule(
            res.threshold)), name=self.flt.scorer.name, p_value_rule=_p_value_rule(self.flt),
            endpoint_note=self.flt.scorer.endpoint_note())
        return rerank_answer(res, query_id, request, api=api, everything=everything,
                             info=served)

    def filter_request(self, request: FilterRequest, *,
                       endpoint: str) -> tuple[FilterResult, str]:
        """Check, score and filter one request's snippets, and record what was served.

        Returns the result and the request's ``query_id`` (its own, or a new one); the
        served rows, metrics and monitor are updated under ``endpoint``'s name."""
        rt = self.runtime
        _check_query(request.query)
        self.language_watch.see(request.query)
        n = len(request.snippets)
        if n > rt.max_snippets:
            raise http_error(413, f"got {n} snippets; the limit is {rt.max_snippets} per request.")
        _check_min_keep(request.min_keep, rt.max_snippets, "snippets")
        snippet_ids = _request_snippet_ids(request)  # unique, before any model work
        _check_outside_scores(request, self.flt.scorer)
        vectors = _snippet_vectors(request)
        if vectors is not None:
            _check_vector_dim(vectors.shape[1], self.vector_dim(), self.flt.scorer.spec())
        items = [s if isinstance(s, str) else s.as_item() for s in request.snippets]
        use = self.filter_for(request.min_keep)
        with upstream_as_502(), bad_request_as_422():
            if vectors is None and self.uses_model:
                res = self._filter_with_model(use, request.query, items, request.group)
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
            self._vector_dim = (self.runtime.in_model_thread(self.flt.scorer.vector_dim),)
        return self._vector_dim[0]

    def _filter_with_model(self, use: ConformalFilter, query: str, items: list[Any],
                           group: Any) -> FilterResult:
        """Count the model work (413 over budget: from below on the texts as sent, then
        exactly on the cut), embed it in fair steps of bounded cost, then filter."""
        rt = self.runtime
        sent = [t for t in (it if isinstance(it, str) else it.get("text") for it in items)
                if isinstance(t, str)]
        rt.check_budget([query, *sent], uncut=True, whole_too=use.unit == "sentence")
        texts = use.piece_texts(items)
        rt.check_budget([query, *texts])
        chunks = cost_steps(texts, PIECES_PER_STEP, first_cost=text_cost(query))
        # all chunks but the last go to the cache first (the first with the query); the
        # last step embeds the last chunk and reads the others back (a request of one
        # chunk is a single step)
        steps: list[Callable[[], Any]] = [partial(use.scorer.prepare, query, c)
                                          for c, _ in chunks[:-1]]
        steps.append(lambda: use.filter(query, items, group=group))
        return rt.run_model_work(steps, costs=[cost for _, cost in chunks])

    def _filter_in_pool(self, use: ConformalFilter, request: FilterRequest, items: list[Any],
                        vectors: np.ndarray | None) -> FilterResult:
        """Filter without the model: outside scores, or the request's own vectors."""
        if vectors is None:
            return use.filter(request.query, items, group=request.group)
        query_vector = np.asarray(request.query_vector, dtype=np.float64)
        return use.filter_vectors(request.query, query_vector, vectors, items,
                                  group=request.group)

    def _filter_response(self, res: FilterResult, query_id: str) -> FilterResponse:
        kept = [
            KeptSnippet(
                index=s.index,
                snippet_id=s.snippet_id,
                text=s.text,
                score=s.score,
                p_value=s.p_value,
                spans=[(int(a), int(b)) for a, b in getattr(s, "spans", ())],
                pruned_text=s.pruned_text if res.unit == "sentence" else None,
            )
            for s in res.kept
        ]
        return FilterResponse(
            kept=kept,
            removed=_removed(res),
            scores=list(res.scores),
            p_values=list(res.p_values),
            p_value_rule=_p_value_rule(self.flt),
            threshold=_finite_or_none(res.threshold),
            removal=res.removal,
            note=res.note,
            guarantee=self.guarantee,
            n_cut=getattr(res, "n_cut", 0),
            unit=res.unit,
            query_id=query_id,
            lists_unlike=res.lists_unlike,
            lists_note=res.lists_note,
        )

    def run_query(self, request: QueryRequest) -> QueryResponse:
        """``POST /query``: retrieve ``k`` hits from the index and filter them."""
        rt = self.runtime
        if rt.index is None:
            raise http_error(
                404,
                "this service has no index; start it with `ragsieve serve --filter F --index DIR` "
                "or use POST /filter with your own snippets.",
            )
        _check_query(request.query)
        self.language_watch.see(request.query)
        if request.k > rt.max_k:
            raise http_error(413, f"k == {_show_int(request.k)}; the limit is {rt.max_k}.")
        _check_min_keep(request.min_keep, rt.max_k, "hits (k)")
        use = self.filter_for(request.min_keep)
        rt.check_budget([request.query])  # the question is embedded; the hits are stored
        from ..filtered_search import query_with_filter
        from ..store import IndexMissingError

        try:
            with bad_request_as_422(), rt.index_lock:
                hits, res = rt.run_model_work(  # embeds the question; hits use stored vectors
                    [lambda: query_with_filter(
                        rt.index, request.query, use, k=request.k, group=request.group)],
                    costs=[max(1, work_pieces([request.query]))],
                )
        except IndexMissingError as exc:
            logger.error("cannot answer /query: %s", exc)
            raise http_error(503, "the served index is missing (removed while serving); the "
                             "operator must restore or rebuild it.") from exc
        kept = {s.index for s in res.kept}
        query_id = request.query_id or uuid.uuid4().hex
        self._served("/query", query_id, [h.snippet_id for h in hits],
                     [request.group] * len(hits), res)
        return QueryResponse(
            hits=[
                HitOut(
                    index=i,
                    snippet_id=h.snippet_id,
                    doc_id=h.doc_id,
                    path=h.path,
                    start=h.start,
                    end=h.end,
                    text=h.text,
                    distance=h.score,
                    score=res.scores[i],
                    p_value=res.p_values[i] if res.p_values else None,
                    kept=i in kept,
                )
                for i, h in enumerate(hits)
            ],
            n_kept=len(kept),
            removed=_removed(res),
            p_value_rule=_p_value_rule(use),
            threshold=_finite_or_none(res.threshold),
            removal=res.removal,
            note=res.note,
            guarantee=self.guarantee,
            query_id=query_id,
            lists_unlike=res.lists_unlike,
            lists_note=self._query_lists_note(res, request.k),
        )

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
                raise _state_unavailable(rt.store, exc) from exc
        rt.recent.add(endpoint, kept=len(kept), total=len(res.scores))
        try:
            rt.metrics.served(endpoint, res.scores, len(kept), res.threshold,
                              lists_unlike=res.lists_unlike)
        except Exception:  # pragma: no cover - prometheus-client does not raise here
            logger.exception("metrics update failed")
        scores = _unit_scores(res)  # the monitor ranks what was calibrated: sentences or snippets
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
            raise _state_unavailable(rt.store, exc) from exc
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
        return Health(status="ok", library_version=__version__, artifact=info,
                      index=rt.index_info, generation=self.generation, monitor=monitor,
                      adaptive=adaptive, published_generation=rt.published_generation,
                      degraded=rt.degraded, lists=self.lists_info(),
                      endpoint_note=self.flt.scorer.endpoint_note())

    def lists_info(self) -> ListsInfo | None:
        """The calibration lists and the service's list check (None without a record)."""
        flt = self.flt
        if flt.lists is None or flt.list_watch is None:
            return None
        state = flt.list_watch.state()
        return ListsInfo(calibration=flt.lists.describe(), source=flt.lists.source["kind"],
                         list_dependent=flt.lists.list_dependent, n_seen=state["n_seen"],
                         n_outside=state["n_outside"], alarm=state["alarm"],
                         fired_at=state["fired_at"], mean_length=state["mean_length"],
                         calibration_mean_length=state["calibration_mean_length"],
                         delta=state["delta"])

    def status(self) -> StatusResponse:
        """``GET /status``: the guarantee, keep rule, drift state and last requests (the
        page at ``/`` shows it)."""
        rule = self.flt.scorer.keep_rule(self.threshold)
        sign = -1 if self.flt.scorer.keep_rule(1.0).threshold < 0 else 1
        monitor = None if self.monitor is None else monitor_info(self.monitor.state)
        recent = self.runtime.recent
        return StatusResponse(
            generation=self.generation, statement=str(self.guarantee.get("statement", "")),
            keep_rule=KeepRuleInfo(score_sign=sign, **rule.to_dict()), monitor=monitor,
            recent=recent.snapshot(), recent_capacity=recent.capacity)


class Runtime:
    """What an app keeps across artifact swaps, and the current :class:`Service`.

    Parameters
    ----------
    options : ServeOptions
        The service's settings (limits, scorer options, adaptive, monitor delta, warm-up,
        feedback caps); read here once.
    generations : Generations
        The control file the artifact generations are published in.
    store : FeedbackStore
        Served scores, labels and the adaptive state.
    metrics : ServiceMetrics
    index : SnippetIndex or None
    monitor_dir : Path, optional
        Directory of the shared monitor stores (one SQLite file per artifact checksum), for
        several worker processes; None keeps the monitor in memory.
    monitor_factory : callable, optional
        ``(payload, delta=, store=) -> monitor or None`` (default
        :func:`monitor_from_artifact`).
    """

    def __init__(self, options: ServeOptions, *, generations: Generations,
                 store: FeedbackStore, metrics: ServiceMetrics, index: Any,
                 monitor_dir: Path | None,
                 monitor_factory: Callable[..., Any] | None = None) -> None:
        self.options = options
        self.generations = generations
        self.store = store
        self.metrics = metrics
        self.index = index
        self.index_lock = threading.Lock()
        self.scorer_options = dict(options.scorer_options)
        self.max_snippets = options.max_snippets
        self.max_k = options.max_k
        self.max_pieces = options.max_pieces
        self.max_queue = options.max_queue
        self.max_labels_per_query = options.max_labels_per_query
        self.max_labels_per_minute = options.max_labels_per_minute
        self.adaptive = options.adaptive
        self.monitor_delta = options.monitor_delta
        self.monitor_dir = monitor_dir
        self.warmup = options.warmup
        self.monitor_factory = monitor_factory or monitor_from_artifact
        self.index_info = self.index_info_of(index)
        self.swap_lock = threading.Lock()
        self._refused_generation = 0
        self.published_generation: int | None = None  # the newest in the control file
        self.degraded: str | None = None  # why the newest generation is not served here
        self._model_queue = FairQueue(max_waiting=options.max_queue, on_change=metrics.set_queue)
        self.service: Service | None = None
        self.recent = RecentRequests()  # the last requests' kept/total counts (GET /status)

    @staticmethod
    def index_info_of(index: Any) -> IndexInfo | None:
        """What ``/healthz`` shows of a served index (its directory's name, not its path)."""
        if index is None:
            return None
        return IndexInfo(name=Path(index.path).resolve().name, model=index.model_id,
                         n_snippets=index.count())

    # ------------------------------------------------------------------ model thread
    def in_model_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run in the one model thread, in turn (never refused; exceptions re-raised)."""
        result: _T = self._model_queue.run([fn], costs=[1], refuse_when_full=False)
        return result

    def check_budget(self, texts: Sequence[str], *, uncut: bool = False,
                     whole_too: bool = False) -> None:
        """413 when reading ``texts`` is more than ``max_pieces`` pieces of model work
        (characters in pieces of 500, :mod:`ragsieve.server.scheduling`).

        Parameters
        ----------
        texts : sequence of str
            The query first, then what the filter hands the model
            (``ConformalFilter.piece_texts``), counted exactly
            (:func:`~ragsieve.server.scheduling.work_pieces`).
        uncut : bool
            ``texts`` are the query and the snippets as sent, counted from below before
            the filter cuts them (:func:`~ragsieve.server.scheduling.least_work`), so a
            request far over the budget costs no cutting either.
        whole_too : bool
            With ``uncut``: the filter also reads each snippet whole (unit sentence).

        Raises
        ------
        fastapi.HTTPException
            413 naming the work, the limit and the unit; counted in
            ``ragsieve_refused_requests_total{reason="max_pieces"}``.
        """
        if uncut:
            n_pieces = least_work(texts[0], texts[1:], whole_too=whole_too)
        else:
            n_pieces = work_pieces(texts)
        if n_pieces <= self.max_pieces:
            return
        self.metrics.refused.labels("max_pieces").inc()
        n_chars = sum(len(t) for t in texts)
        logger.info("request refused (413): %d pieces of model work (%d characters), limit %d",
                    n_pieces, n_chars, self.max_pieces)
        counted = (f"this request's query and {len(texts) - 1:,} snippet(s) come to "
                   f"{n_chars:,} characters, which the model reads at least {n_pieces} "
                   "pieces of, however they are cut" if uncut else
                   f"this request's query, snippets and sentences come to {n_chars:,} "
                   f"characters in {len(texts):,} texts")
        raise http_error(
            413,
            f"request needs {n_pieces} pieces of model work; the limit is "
            f"{self.max_pieces} per request (--max-pieces). A piece is {PIECE_CHARS} "
            f"characters the model reads, or {PIECE_WORDS} words and marks where a text is "
            f"denser: {counted} (a snippet or sentence longer than the filter's window is "
            "read as its pieces; a sentence filter also reads each snippet whole). Send "
            "fewer or shorter snippets, or a shorter query.",
        )

    def run_model_work(self, steps: Sequence[Callable[[], Any]], *,
                       costs: Sequence[int]) -> Any:
        """Run ``steps`` in the model thread, in turn with other requests (429 when full)."""
        try:
            return self._model_queue.run(steps, costs=costs)
        except QueueFull as exc:
            self.metrics.refused.labels("max_queue").inc()
            retry = min(60.0, max(1.0, exc.pending_cost / PIECES_PER_SECOND))
            logger.info("request refused (429): %d requests already wait for model work",
                        exc.waiting)
            raise http_error(
                429,
                f"{exc.waiting} requests are waiting for model work, the limit is "
                f"{self.max_queue} (--max-queue); retry in {math.ceil(retry)} s.",
                retry_after=retry,
            ) from exc

    def close(self) -> None:
        """Stop the model thread (after the step it is running, if any) and close the files."""
        self._model_queue.close()
        monitor = None if self.service is None else self.service.monitor
        watch: Any = None if self.service is None else self.service.flt.list_watch
        for closable in (self.store, self.generations, monitor, watch):
            if closable is None or not callable(getattr(closable, "close", None)):
                continue
            try:
                closable.close()
            except Exception:  # pragma: no cover
                logger.exception("closing %r failed", closable)

    @property
    def current(self) -> Service:
        """The service requests are answered with now."""
        service = self.service
        if service is None:  # pragma: no cover - set before the app serves
            raise RuntimeError("no artifact loaded yet")
        return service

    # ------------------------------------------------------------------ monitor
    def monitor_store(self, checksum: str) -> Path | None:
        """The shared monitor file of an artifact (None: the monitor lives in memory)."""
        if self.monitor_dir is None:
            return None
        return monitor_path(self.monitor_dir, checksum)

    def check_monitor(self, artifact: Artifact) -> None:
        """Build (and drop) an artifact's monitor in memory: raises on a malformed reference."""
        self.monitor_factory(artifact, delta=self.monitor_delta, store=None)

    def before_publish(self, checked: ArtifactCheck, previous_checksum: str | None) -> None:
        """Reset the shared monitor store of a newly published, different artifact."""
        if checked.checksum != previous_checksum and self.monitor_dir is not None:
            reset_shared_monitor(checked.artifact, checked.checksum, self.monitor_dir,
                                 self.monitor_delta, self.monitor_factory)

    def _list_watch(self, flt: ConformalFilter, checksum: str) -> Any:
        """The filter's list check, kept in the state directory when there is one."""
        watch = flt.list_watch
        if watch is None or self.monitor_dir is None:
            return watch
        try:
            return SharedListWatch(watch, lists_path(self.monitor_dir, checksum))
        except (sqlite3.Error, OSError) as exc:
            logger.error("list check state %s cannot be used (%s); the check runs in memory",
                         lists_path(self.monitor_dir, checksum), exc)
            return watch

    def reset_monitors(self, service: Service) -> tuple[Any, bool]:
        """Reset a service's exchangeability monitor (its state, or None without one) and
        its list check (True when it has one that watches: a list-dependent score):
        ``POST /admin/monitor/reset``."""
        state = None
        if service.monitor is not None:
            service.monitor.reset()
            state = service.monitor.state
            self.metrics.set_monitor(state)
        watch = service.flt.list_watch
        if watch is None or not watch.active:
            return state, False
        watch.reset()
        return state, True

    # ------------------------------------------------------------------ building, swapping
    def check_to_publish(self, text: str, source: str) -> ArtifactCheck:
        """:meth:`check`, then one score computed with the new scorer (model and weights
        loaded: :func:`probe_scorer`) in the model thread: what a reload publishes."""
        checked = self.check(text, source)
        current = self.service
        if current is None or checked.filter.scorer is not current.flt.scorer:
            probe_scorer(checked, source, self.in_model_thread)
        return checked

    def check(self, text: str, source: str) -> ArtifactCheck:
        """Check an artifact by building what this runtime would serve from it
        (:func:`check_artifact`, then :func:`artifact_view`)."""
        current = self.service
        checked = check_artifact(
            text, source, scorer_options=self.scorer_options,
            index_path=None if self.index is None else self.index.path, adaptive=self.adaptive,
            monitor_check=self.check_monitor,
            scorer=None if current is None else current.flt.scorer,
            verify_key=self.options.verify_key())
        artifact_view(checked)
        return checked

    def build(self, checked: ArtifactCheck, generation: int) -> Service:
        """A service for a checked artifact: model warmed up, monitor and adaptive attached."""
        flt = checked.filter
        current = self.service
        if self.index is not None:
            from ..filtered_search import list_scorer

            list_scorer(self.index, flt)
        reused = current is not None and flt.scorer is current.flt.scorer
        if self.warmup and not reused and not flt.scorer.model_free:
            self.in_model_thread(lambda: flt.scorer.score_batch("warm-up", ["warm-up"]))
        if current is not None and current.checksum == checked.checksum:
            monitor = current.monitor  # the same artifact again: the martingale goes on
            flt.list_watch = current.flt.list_watch  # and so does the list check
        else:
            flt.list_watch = self._list_watch(flt, checked.checksum)
            monitor = self.monitor_factory(checked.artifact, delta=self.monitor_delta,
                                           store=self.monitor_store(checked.checksum))
            if monitor is None:
                logger.warning("%s (checksum %s)", NO_MONITOR, checked.checksum[:12])
        adaptive = None
        if self.adaptive:
            adaptive = AdaptiveThreshold(self.store, checked.checksum, flt.calibrator)
        return Service(self, checked, generation, monitor=monitor, adaptive=adaptive)

    def swap(self, service: Service) -> None:
        """Serve ``service`` from the next request on (in-flight requests keep theirs)."""
        old = self.service
        self.service = service  # one attribute write: atomic for the request threads
        self.metrics.set_artifact(service.info.model_dump(), service.generation, service.threshold)
        self.metrics.set_monitor(None if service.monitor is None else service.monitor.state)
        if old is None:
            return
        watch: Any = old.flt.list_watch
        if watch is not None and watch is not service.flt.list_watch \
                and callable(getattr(watch, "close", None)):
            watch.close()  # its file: the old artifact's (in-flight requests go on in memory)
        logger.warning("pid %d now serves generation %d (checksum %s, mode %s; was generation "
                       "%d, checksum %s)", os.getpid(), service.generation, service.checksum[:12],
                       service.flt.mode, old.generation, old.checksum[:12])

    def load_generation(self, gen: Generation) -> Service:
        """Build and swap in a published generation (``ArtifactError`` keeps the old one)."""
        checked = self.check_to_publish(gen.text, f"generation {gen.number}")
        service = self.build(checked, gen.number)
        self.swap(service)
        return service

    def start(self, generations: Sequence[Generation],
              prepare: Callable[[ArtifactCheck], object] | None = None, *,
              checked: ArtifactCheck | None = None) -> Service:
        """Serve the newest of ``generations`` (newest first) that can be built.

        A worker starting after a crash walks back to an older generation rather than die
        on one it cannot build; ``/healthz`` then reports ``degraded``. ``prepare(checked)``
        runs before the first build (the app opens its index there); ``checked`` is the
        first generation already checked (a single app checks the file before publishing).

        Raises
        ------
        ArtifactError
            No generation can be built (the reasons of all of them); with one generation,
            the error that stopped it.
        """
        reasons: list[str] = []
        error: BaseException | None = None
        for i, gen in enumerate(generations):
            try:
                if i or checked is None:
                    checked = self.check(gen.text, f"generation {gen.number}")
                if prepare is not None:
                    prepare(checked)
                self.swap(self.build(checked, gen.number))
            except Exception as exc:  # noqa: BLE001 (a scorer's load error is any type)
                reasons.append(f"generation {gen.number}: {exc}")
                error = exc
                if i + 1 < len(generations):
                    logger.error("pid %d cannot serve generation %d (%s); trying generation %d",
                                 os.getpid(), gen.number, exc, generations[i + 1].number)
                continue
            self._set_published(generations[0].number, reasons[0] if reasons else None)
            self._refused_generation = generations[0].number if reasons else 0
            return self.current
        if len(reasons) == 1 and error is not None:
            raise error
        raise ArtifactError("no published generation can be served here: " + "; ".join(reasons)
                            if reasons else "no generation is published")

    def _set_published(self, number: int, refusal: str | None) -> None:
        """Record the newest published generation and why it is not served (None: it is)."""
        self.published_generation = number
        self.degraded = None if refusal is None else (
            f"serving generation {self.current.generation}, not the newest ({refusal})")

    def sync(self) -> None:
        """Swap in the newest published generation if it is newer than the served one.

        One that cannot be built is tried once (logged); the served one stays and
        ``/healthz`` says so (``degraded``) until a newer generation is served.
        """
        current = self.service
        latest = self.generations.latest_number()
        if current is not None and latest <= current.generation:
            if latest == current.generation:
                self._set_published(latest, None)
            return
        with self.swap_lock:
            gen = self.generations.latest()
            current = self.service
            if gen is None or (current is not None and gen.number <= current.generation):
                return
            if gen.number == self._refused_generation:
                return  # refused once already (logged); wait for the next generation
            try:
                self.load_generation(gen)
                self.metrics.reloads.labels("loaded").inc()
                self._set_published(gen.number, None)
            except Exception as exc:  # noqa: BLE001 (a scorer's load error is any type): logged once
                self._refused_generation = gen.number
                self.metrics.reloads.labels("refused").inc()
                self._set_published(gen.number, f"generation {gen.number}: {printable(str(exc))}")
                logger.error("pid %d cannot serve generation %d: %s; still serving generation %s",
                             os.getpid(), gen.number, exc,
                             None if current is None else current.generation)
