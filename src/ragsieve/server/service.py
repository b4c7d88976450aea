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
of one per pool thread (measured in ``benchmarks/bench_server.py --long``). Requests with
vectors or outside scores need no model and stay in the pool. Index searches are
serialised with a lock, and so are scorers not known to be thread-safe.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import fastapi
import numpy as np

from .._version import __version__
from ..errors import ArtifactError, DataError
from ..filter import ConformalFilter
from ..types import FilterResult
from .feedback import AdaptiveThreshold, FeedbackStore, ServedRow, scorer_key
from .metrics import ServiceMetrics
from .parsing import printable
from .reload import ArtifactCheck, Generation, Generations, check_artifact
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
    KeptSnippet,
    MonitorInfo,
    QueryRequest,
    QueryResponse,
)

__all__ = ["Runtime", "Service", "monitor_from_artifact", "monitor_path", "reset_shared_monitor"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Scorers known to be safe to call from several threads at once (after warm-up).
_THREAD_SAFE_SCORERS = frozenset({"embedding", "field"})
#: Scorers that load no model (nothing to warm up; they read an outside score).
_NO_MODEL_SCORERS = frozenset({"field"})
#: How many filters with a request's own ``min_keep`` are kept for reuse.
_MAX_CACHED_FILTERS = 64
#: Most snippet pieces one request may have scored by the model (413 beyond).
DEFAULT_MAX_PIECES = 4000
#: Most requests waiting for model work at once (429 beyond).
DEFAULT_MAX_QUEUE = 64
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


def monitor_from_artifact(payload: Mapping[str, Any], *, delta: float,
                          store: str | Path | None) -> Any:
    """The exchangeability monitor of an artifact, or None when it carries no reference."""
    from ..monitoring import ExchangeabilityMonitor

    return ExchangeabilityMonitor.from_artifact(payload, delta=delta, store=store)


def monitor_path(monitor_dir: Path, checksum: str) -> Path:
    """The shared monitor file of the artifact ``checksum`` in ``monitor_dir``."""
    return monitor_dir / f"monitor-{checksum[:16]}.sqlite"


def reset_shared_monitor(payload: Mapping[str, Any], checksum: str, monitor_dir: Path,
                         delta: float, factory: Callable[..., Any] | None = None) -> bool:
    """Reset an artifact's shared monitor store; False when the artifact has no reference."""
    monitor = (factory or monitor_from_artifact)(payload, delta=delta,
                                                 store=monitor_path(monitor_dir, checksum))
    if monitor is None:
        return False
    monitor.reset()
    return True


def _monitor_info(state: Any) -> MonitorInfo:
    return MonitorInfo(
        alarm=bool(state.alarm),
        martingale=_finite_or_none(float(state.martingale)),
        log10_martingale=_finite_or_none(float(state.log10_martingale)),
        fired_at=state.fired_at,
        fired_time=state.fired_time,
        n_observed=int(state.n_observed),
        delta=float(state.delta),
    )


def _artifact_info(flt: ConformalFilter, payload: Mapping[str, Any], checksum: str) -> ArtifactInfo:
    guarantee = _json_safe(flt.guarantee())
    n_calibration = guarantee.get("n_calibration")
    return ArtifactInfo(
        format_version=payload.get("format_version"),
        library_version=payload.get("library_version"),
        created=payload.get("created"),
        mode=guarantee.get("mode"),
        guaranteed_metric=guarantee.get("metric"),
        alpha=guarantee.get("alpha"),
        threshold=_finite_or_none(flt.threshold),
        n_calibration=None if n_calibration is None else int(n_calibration),
        min_keep=flt.min_keep,
        group_by=getattr(flt, "group_by", None),
        scorer=flt.scorer.spec(),
        guarantee=guarantee,
        checksum=checksum,
    )


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
        self.payload = checked.payload
        self.checksum = checked.checksum
        self.generation = generation
        self.monitor = monitor
        self.adaptive = adaptive
        self.info = _artifact_info(flt, checked.payload, checked.checksum)
        self.guarantee = self.info.guarantee
        self.scorer_key = scorer_key(flt.scorer.spec())
        thread_safe = flt.scorer.spec().get("scorer") in _THREAD_SAFE_SCORERS
        self.lock: AbstractContextManager[Any] = nullcontext() if thread_safe else threading.Lock()
        self.uses_model = flt.scorer.spec().get("scorer") not in _NO_MODEL_SCORERS
        self._cache_lock = threading.Lock()
        self._adaptive_version: int | None = None
        self._filters: dict[int, ConformalFilter] = {flt.min_keep: flt}

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
        rt = self.runtime
        _check_query(request.query)
        n = len(request.snippets)
        if n > rt.max_snippets:
            raise http_error(413, f"got {n} snippets; the limit is {rt.max_snippets} per request.")
        _check_min_keep(request.min_keep, rt.max_snippets, "snippets")
        vectors = _snippet_vectors(request)
        items = [s if isinstance(s, str) else s.as_item() for s in request.snippets]
        use = self.filter_for(request.min_keep)
        with bad_request_as_422(), self.lock:
            if vectors is None and self.uses_model:
                res = rt.in_model_thread(
                    lambda: use.filter(request.query, items, group=request.group)
                )
            elif vectors is None:
                res = use.filter(request.query, items, group=request.group)
            else:
                query_vector = np.asarray(request.query_vector, dtype=np.float64)
                res = use.filter_vectors(
                    request.query, query_vector, vectors, items, group=request.group
                )
        query_id = request.query_id or uuid.uuid4().hex
        snippet_ids = [str(i) if isinstance(s, str) or s.snippet_id is None else s.snippet_id
                       for i, s in enumerate(request.snippets)]
        groups = [request.group if isinstance(s, str) or s.group is None else s.group
                  for s in request.snippets]
        self._served("/filter", query_id, snippet_ids, groups, res)
        return self._filter_response(res, query_id)

    def _filter_response(self, res: FilterResult, query_id: str) -> FilterResponse:
        kept = [
            KeptSnippet(
                index=s.index,
                snippet_id=s.snippet_id,
                text=s.text,
                score=s.score,
                spans=[(int(a), int(b)) for a, b in getattr(s, "spans", ())],
            )
            for s in res.kept
        ]
        return FilterResponse(
            kept=kept,
            scores=list(res.scores),
            threshold=_finite_or_none(res.threshold),
            removal=res.removal,
            note=res.note,
            guarantee=self.guarantee,
            n_cut=getattr(res, "n_cut", 0),
            query_id=query_id,
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
        if request.k > rt.max_k:
            raise http_error(413, f"k == {_show_int(request.k)}; the limit is {rt.max_k}.")
        _check_min_keep(request.min_keep, rt.max_k, "hits (k)")
        use = self.filter_for(request.min_keep)
        with bad_request_as_422(), rt.index_lock:
            hits, res = rt.in_model_thread(  # embeds the question
                lambda: rt.index.query_with_filter(
                    request.query, use, k=request.k, group=request.group
                )
            )
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
                    kept=i in kept,
                )
                for i, h in enumerate(hits)
            ],
            n_kept=len(kept),
            threshold=_finite_or_none(res.threshold),
            removal=res.removal,
            note=res.note,
            guarantee=self.guarantee,
            query_id=query_id,
        )

    def _served(self, endpoint: str, query_id: str, snippet_ids: Sequence[str],
                groups: Sequence[Any], res: FilterResult) -> None:
        """After an answer is computed: metrics, the served record, the monitor.

        None of them may fail the request: their errors are logged.
        """
        rt = self.runtime
        kept = {s.index for s in res.kept}
        try:
            rt.metrics.served(endpoint, res.scores, len(kept), res.threshold)
        except Exception:  # pragma: no cover - prometheus-client does not raise here
            logger.exception("metrics update failed")
        if rt.store is not None:
            rows = [ServedRow(query_id, str(sid), float(score), float(res.threshold), i in kept,
                              None if g is None else str(g))
                    for i, (sid, score, g) in enumerate(zip(snippet_ids, res.scores, groups,
                                                            strict=True))]
            try:
                rt.store.record_served(rows, key=self.scorer_key, checksum=self.checksum,
                                       endpoint=endpoint)
            except Exception:
                logger.exception("could not record the served scores of query_id %r "
                                 "(feedback for it will need its score)", query_id)
        if self.monitor is not None and res.scores:
            self.observe(res.scores)

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
        """``POST /feedback``: store labels; under --adaptive, move the threshold."""
        rt = self.runtime
        if rt.store is None:  # pragma: no cover - every runtime has a store
            raise http_error(404, "this service keeps no feedback.")
        n = len(request.items)
        if n > rt.max_snippets:
            raise http_error(413, f"got {n} labels; the limit is {rt.max_snippets} per request.")
        items = [(i.query_id, i.snippet_id, bool(i.relevant), i.score) for i in request.items]
        try:
            rt.store.flush()  # this process's served rows are joinable before the labels
        except Exception:
            logger.exception("could not write the queued served scores before a feedback batch")
        with bad_request_as_422():
            outcome = rt.store.add_labels(items, key=self.scorer_key, adaptive=self.adaptive)
        for item in request.items:
            rt.metrics.feedback.labels("1" if item.relevant else "0").inc()
        if outcome.adaptive_updates:
            logger.info("feedback: %d relevant label(s) applied; adaptive threshold now %s",
                        outcome.adaptive_updates, outcome.adaptive)
            rt.metrics.threshold.set(self.threshold)
        return FeedbackResponse(
            stored=outcome.stored, new=outcome.new, with_served_score=outcome.with_served_score,
            with_given_score=outcome.with_given_score, without_score=outcome.without_score,
            adaptive_updates=outcome.adaptive_updates,
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
        monitor = None if self.monitor is None else _monitor_info(self.monitor.state)
        return Health(status="ok", library_version=__version__, artifact=info,
                      index=rt.index_info, generation=self.generation, monitor=monitor,
                      adaptive=adaptive)


class Runtime:
    """What an app keeps across artifact swaps, and the current :class:`Service`.

    Parameters
    ----------
    generations : Generations
        The control file the artifact generations are published in.
    store : FeedbackStore
        Served scores, labels and the adaptive state.
    metrics : ServiceMetrics
    index : SnippetIndex or None
    scorer_options : Mapping, optional
    max_snippets, max_k : int
    adaptive : bool
        Serve the threshold followed from feedback (mode ``adaptive`` required).
    monitor_delta : float
        The alarm's false-alarm bound.
    monitor_dir : Path, optional
        Directory of the shared monitor stores (one SQLite file per artifact checksum), for
        several worker processes; None keeps the monitor in memory.
    warmup : bool
        Load the model of a new scorer before serving it.
    max_pieces, max_queue : int
        Model work one request may cause (413 beyond); requests waiting for it (429 beyond).
    max_labels_per_query, max_labels_per_minute : int, optional
        Feedback caps: labels counted per query_id; labels per client per minute.
    monitor_factory : callable, optional
        ``(payload, delta=, store=) -> monitor or None`` (default
        :func:`monitor_from_artifact`).
    """

    def __init__(self, *, generations: Generations, store: FeedbackStore,
                 metrics: ServiceMetrics, index: Any, scorer_options: Mapping[str, Any] | None,
                 max_snippets: int, max_k: int, adaptive: bool, monitor_delta: float,
                 monitor_dir: Path | None, warmup: bool,
                 monitor_factory: Callable[..., Any] | None = None,
                 max_pieces: int = DEFAULT_MAX_PIECES, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_labels_per_query: int | None = None,
                 max_labels_per_minute: int | None = None) -> None:
        self.generations = generations
        self.store = store
        self.metrics = metrics
        self.index = index
        self.index_lock = threading.Lock()
        self.scorer_options = dict(scorer_options or {})
        self.max_snippets = max_snippets
        self.max_k = max_k
        self.max_pieces = max_pieces
        self.max_queue = max_queue
        self.max_labels_per_query = max_labels_per_query
        self.max_labels_per_minute = max_labels_per_minute
        self.adaptive = adaptive
        self.monitor_delta = monitor_delta
        self.monitor_dir = monitor_dir
        self.warmup = warmup
        self.monitor_factory = monitor_factory or monitor_from_artifact
        self.index_info = self.index_info_of(index)
        self.swap_lock = threading.Lock()
        self._refused_generation = 0
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragsieve-model")
        self.service: Service | None = None

    @staticmethod
    def index_info_of(index: Any) -> IndexInfo | None:
        """What ``/healthz`` shows of a served index (its directory's name, not its path)."""
        if index is None:
            return None
        return IndexInfo(name=Path(index.path).resolve().name, model=index.model_id,
                         n_snippets=index.count())

    # ------------------------------------------------------------------ model thread
    def in_model_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run in the one model thread (its exceptions re-raised here)."""
        return self._model_thread.submit(fn).result()

    def close(self) -> None:
        """Stop the model thread (after the call it is running, if any) and close the files."""
        self._model_thread.shutdown(wait=False, cancel_futures=True)
        monitor = None if self.service is None else self.service.monitor
        for closable in (self.store, self.generations, monitor):
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

    def check_monitor(self, payload: Mapping[str, Any]) -> None:
        """Build (and drop) an artifact's monitor in memory: raises on a malformed reference."""
        self.monitor_factory(payload, delta=self.monitor_delta, store=None)

    def before_publish(self, checked: ArtifactCheck, previous_checksum: str | None) -> None:
        """Reset the shared monitor store of a newly published, different artifact."""
        if checked.checksum != previous_checksum and self.monitor_dir is not None:
            reset_shared_monitor(checked.payload, checked.checksum, self.monitor_dir,
                                 self.monitor_delta, self.monitor_factory)

    # ------------------------------------------------------------------ building, swapping
    def check(self, text: str, source: str) -> ArtifactCheck:
        """Check an artifact as this runtime would serve it (see :func:`check_artifact`)."""
        current = self.service
        return check_artifact(
            text, source, scorer_options=self.scorer_options,
            index_path=None if self.index is None else self.index.path, adaptive=self.adaptive,
            monitor_check=self.check_monitor,
            scorer=None if current is None else current.flt.scorer)

    def build(self, checked: ArtifactCheck, generation: int) -> Service:
        """A service for a checked artifact: model warmed up, monitor and adaptive attached."""
        flt = checked.filter
        current = self.service
        if self.index is not None:
            self.index.list_scorer(flt)
        reused = current is not None and flt.scorer is current.flt.scorer
        if self.warmup and not reused and flt.scorer.spec().get("scorer") not in _NO_MODEL_SCORERS:
            self.in_model_thread(lambda: flt.scorer.score_batch("warm-up", ["warm-up"]))
        if current is not None and current.checksum == checked.checksum:
            monitor = current.monitor  # the same artifact again: the martingale goes on
        else:
            monitor = self.monitor_factory(checked.payload, delta=self.monitor_delta,
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
        logger.warning("pid %d now serves generation %d (checksum %s, mode %s; was generation "
                       "%d, checksum %s)", os.getpid(), service.generation, service.checksum[:12],
                       service.flt.mode, old.generation, old.checksum[:12])

    def load_generation(self, gen: Generation) -> Service:
        """Build and swap in a published generation (``ArtifactError`` keeps the old one)."""
        checked = self.check(gen.text, f"generation {gen.number}")
        service = self.build(checked, gen.number)
        self.swap(service)
        return service

    def sync(self) -> None:
        """Swap in the newest published generation if it is newer than the served one."""
        current = self.service
        if current is not None and self.generations.latest_number() <= current.generation:
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
            except (ArtifactError, ValueError, OSError) as exc:
                self._refused_generation = gen.number
                self.metrics.reloads.labels("refused").inc()
                logger.error("pid %d cannot serve generation %d: %s; still serving generation %s",
                             os.getpid(), gen.number, exc,
                             None if current is None else current.generation)
