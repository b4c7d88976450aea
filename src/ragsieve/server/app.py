"""The FastAPI app: the served filter (and optionally an index) behind its routes.

The routes read the :class:`~ragsieve.server.service.Runtime`'s current service once per
request, so a hot reload swaps the artifact between requests, never inside one.
:func:`~ragsieve.server.run.run_server` serves it (in this process, or in N worker
processes with :mod:`ragsieve.server.workers`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Literal

import fastapi
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._version import __version__
from ..errors import ArtifactError, ArtifactTooLargeError
from ..filter import ConformalFilter
from .connections import check_seconds
from .feedback import (
    DEFAULT_FEEDBACK_RETENTION,
    DEFAULT_MAX_LABELS_PER_MINUTE,
    DEFAULT_MAX_LABELS_PER_QUERY,
    DEFAULT_MAX_SERVED_ROWS,
    FeedbackStore,
)
from .metrics import ServiceMetrics
from .page import page_key_check, page_response
from .parsing import (
    StrictJSONRoute,
    http_error_handler,
    printable,
    unexpected_error_handler,
    validation_error_handler,
)
from .reload import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    Generation,
    Generations,
    Publisher,
    Trigger,
    read_text,
)
from .schemas import (
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    FilterRequest,
    FilterResponse,
    Health,
    MonitorInfo,
    QueryRequest,
    QueryResponse,
    ReloadResponse,
    StatusResponse,
)
from .security import BodyLimitMiddleware, api_key_check, is_loopback_host
from .service import (
    DEFAULT_MAX_PIECES,
    DEFAULT_MAX_QUEUE,
    NO_MONITOR,
    Runtime,
    http_error,
    monitor_info,
)
from .state import StateLock

__all__ = ["check_delta", "create_app"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at the published generation (and, with watch, the file).
POLL_SECONDS = 0.5

Role = Literal["single", "worker"]


def _check_options(api_key: str | None, **limits: int) -> None:
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} == {value!r}, must be an int >= 1.")
    if api_key is not None and not api_key:
        raise ValueError("api_key == '', must be a non-empty string or None.")


def check_delta(delta: Any) -> float:
    """``delta`` of the exchangeability alarm, a number in (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"monitor_delta == {delta!r}, must be a number in (0, 1) (e.g. 0.01).")
    return float(delta)


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


#: The error answers of a route that reads a JSON body (``/filter``, ``/query``).
_BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Malformed Content-Length header."),
    408: _error("The body did not arrive within the service's body timeout."),
    413: _error("Body larger than the service's max_body_bytes."),
    415: _error("Content-Type is not application/json."),
    422: _error(
        "Body is not strict JSON (UTF-8, finite numbers, unique keys, valid Unicode), does "
        "not match the schema, or holds values the filter refuses (detail says which)."
    ),
}


def _add_routes(app: fastapi.FastAPI, runtime: Runtime, publisher: Publisher,
                api_key: str | None) -> None:
    protected: list[Any] = []
    errors = dict(_BODY_ERRORS)
    key_errors: dict[int | str, dict[str, Any]] = {}
    if api_key is not None:
        protected = [fastapi.Depends(api_key_check(api_key))]
        errors[401] = key_errors[401] = _error("Missing or invalid API key.")
    filter_errors = {
        **errors,
        413: _error("Body larger than max_body_bytes, or more snippets than max_snippets."),
    }
    query_errors = {
        **errors,
        404: _error("The service has no index (start it with --index)."),
        413: _error("Body larger than max_body_bytes, or k larger than max_k."),
    }
    feedback_errors = {
        **errors,
        413: _error("Body larger than max_body_bytes, or more labels than max_snippets."),
    }
    reload_errors = {
        **key_errors,
        403: _error("No API key is configured and the client is not on a loopback address."),
        413: _error("The artifact file is larger than max_artifact_bytes (refused unread); "
                    "the previous one keeps serving."),
        422: _error("The artifact at the served path was refused (detail says why); the "
                    "previous one keeps serving."),
    }

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return runtime.current.health()

    _add_page(app, runtime, api_key, protected, key_errors)

    @app.post(
        "/filter", response_model=FilterResponse, dependencies=protected, responses=filter_errors
    )
    def filter_snippets(request: FilterRequest) -> FilterResponse:
        return runtime.current.run_filter(request)

    @app.post(
        "/query", response_model=QueryResponse, dependencies=protected, responses=query_errors
    )
    def query_index(request: QueryRequest) -> QueryResponse:
        return runtime.current.run_query(request)

    @app.post(
        "/feedback", response_model=FeedbackResponse, dependencies=protected,
        responses=feedback_errors,
    )
    def feedback(request: FeedbackRequest, http: fastapi.Request) -> FeedbackResponse:
        client = http.client.host if http.client is not None else ""
        return runtime.current.run_feedback(request, client=client)

    @app.get(
        "/metrics", dependencies=protected, responses=key_errors, response_class=Response,
        summary="Prometheus metrics (text exposition format)",
    )
    def metrics() -> Response:
        return Response(runtime.metrics.exposition(), media_type=runtime.metrics.content_type)

    @app.post(
        "/admin/reload", response_model=ReloadResponse, dependencies=protected,
        responses=reload_errors,
    )
    def admin_reload(request: fastapi.Request) -> ReloadResponse:
        _admin_client(request, api_key, "/admin/reload")
        before = runtime.current
        try:
            checked, number = publisher.publish("POST /admin/reload")
        except ArtifactError as exc:
            runtime.metrics.reloads.labels("refused").inc()
            raise http_error(
                413 if isinstance(exc, ArtifactTooLargeError) else 422,
                f"artifact refused, still serving generation {before.generation} (checksum "
                f"{before.checksum[:12]}): {printable(str(exc))}") from exc
        runtime.sync()
        now = runtime.current
        if now.generation < number:  # built from the file a moment ago: should not happen
            raise http_error(422, f"generation {number} was published but could not be "
                                  "loaded here; see the service log.")
        changed = checked.checksum != before.checksum
        return ReloadResponse(generation=now.generation, checksum=now.checksum, changed=changed,
                              monitor_reset=changed and now.monitor is not None)


def _add_page(app: fastapi.FastAPI, runtime: Runtime, api_key: str | None,
              protected: list[Any], key_errors: dict[int | str, dict[str, Any]]) -> None:
    """``GET /`` (the page, :mod:`ragsieve.server.page`) and ``GET /status`` (what it shows)."""
    page_guard = [fastapi.Depends(page_key_check(api_key))] if api_key is not None else []
    status_errors = dict(key_errors)
    if api_key is not None:
        status_errors[403] = _error("Basic credentials sent by a request that is not "
                                    "same-origin (only the page at / may use them).")

    @app.get("/", dependencies=page_guard, include_in_schema=False)
    def page() -> Response:
        return page_response()

    @app.get("/status", response_model=StatusResponse, dependencies=protected,
             responses=status_errors)
    def status() -> StatusResponse:
        return runtime.current.status()


def _admin_client(request: fastapi.Request, api_key: str | None, route: str) -> str:
    """The client of an admin route; 403 unless a key is set (checked by the route's
    dependency) or the client is on a loopback address."""
    client = request.client.host if request.client is not None else ""
    if api_key is None and not is_loopback_host(client):
        raise http_error(403, f"POST {route} without an API key is accepted from loopback "
                              "clients only; start the service with an API key.")
    return client


def _add_monitor_reset(app: fastapi.FastAPI, runtime: Runtime, api_key: str | None) -> None:
    """``POST /admin/monitor/reset``: restart the exchangeability alarm (all workers)."""
    protected = [fastapi.Depends(api_key_check(api_key))] if api_key is not None else []
    responses: dict[int | str, dict[str, Any]] = {
        403: _error("No API key is configured and the client is not on a loopback address."),
        404: _error("The served artifact has no monitor reference."),
    }
    if api_key is not None:
        responses[401] = _error("Missing or invalid API key.")

    @app.post("/admin/monitor/reset", response_model=MonitorInfo, dependencies=protected,
              responses=responses)
    def admin_monitor_reset(request: fastapi.Request) -> MonitorInfo:
        client = _admin_client(request, api_key, "/admin/monitor/reset")
        service = runtime.current
        if service.monitor is None:
            raise http_error(404, NO_MONITOR)
        service.monitor.reset()
        state = service.monitor.state
        runtime.metrics.set_monitor(state)
        logger.warning("exchangeability monitor reset by POST /admin/monitor/reset from %s "
                       "(generation %d)", printable(client), service.generation)
        return monitor_info(state)


def _prepare_index(runtime: Runtime, index_path: str | Path | None, checked: Any, *,
                   warmup: bool) -> None:
    """Open the served index once, with the first artifact built (shares its model)."""
    if index_path is None or runtime.index is not None:
        return
    runtime.index = _open_index(index_path, checked.filter)
    runtime.index_info = Runtime.index_info_of(runtime.index)
    if warmup:
        runtime.index.search("warm-up", k=1)


def _open_index(index_path: str | Path, flt: ConformalFilter) -> Any:
    """Open a served index, sharing the filter's loaded model, and check they match."""
    from ..scoring import EmbeddingScorer
    from ..store import SnippetIndex

    if not Path(index_path).is_dir():
        raise FileNotFoundError(
            f"index {str(index_path)!r} is not a directory; build one with `ragsieve index`."
        )
    index = SnippetIndex.open(index_path)  # reads metadata only, loads no weights
    index.list_scorer(flt)  # raises ScorerMismatchError now, not on the first request
    # the filter's score is the index's 1 - cos (or built on it): share the loaded model
    embedding = getattr(flt.scorer, "base", flt.scorer)
    if isinstance(embedding, EmbeddingScorer):
        return SnippetIndex.open(index_path, model=embedding.model)
    return index


def create_app(
    filter_path: str | Path,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_snippets: int = 1000,
    scorer_options: dict[str, Any] | None = None,
    warmup: bool = True,
    index_path: str | Path | None = None,
    max_k: int = 100,
    body_timeout: float = 60.0,
    state_dir: str | Path | None = None,
    feedback_db: str | Path | None = None,
    adaptive: bool = False,
    monitor_delta: float = 0.01,
    watch: bool = False,
    max_served_rows: int = DEFAULT_MAX_SERVED_ROWS,
    max_pieces: int = DEFAULT_MAX_PIECES,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    feedback_retention: float = DEFAULT_FEEDBACK_RETENTION,
    max_labels_per_query: int = DEFAULT_MAX_LABELS_PER_QUERY,
    max_labels_per_minute: int = DEFAULT_MAX_LABELS_PER_MINUTE,
) -> fastapi.FastAPI:
    """Build the FastAPI app serving one filter artifact (and optionally an index).

    Routes: ``GET /healthz`` (no key), ``POST /filter``, ``POST /query``, ``POST
    /feedback``, ``GET /metrics``, ``GET /status`` and ``POST /admin/reload`` (key required
    when one is set; without a key ``/admin/reload`` answers loopback clients only), and
    the page ``GET /`` (:mod:`ragsieve.server.page`; behind the key, which it also takes
    as a Basic password).

    Parameters
    ----------
    filter_path : str or Path
        JSON artifact written by ``ConformalFilter.save``; re-read on a reload.
    api_key : str, optional
        When set, every route but ``/healthz`` requires ``Authorization: Bearer <key>`` or
        ``X-API-Key: <key>`` (401 otherwise; compared in constant time). The key is also
        the password of HTTP Basic (any user name): on ``GET /`` from anywhere, on the
        other routes from same-origin requests only (403 otherwise).
    max_body_bytes : int, default=1_000_000
        Larger request bodies get 413.
    max_snippets : int, default=1000
        Requests with more snippets (or feedback labels) get 413.
    scorer_options : dict, optional
        Passed to ``ConformalFilter.load`` (e.g. ``{"cache_dir": ...}``).
    warmup : bool, default=True
        Score one dummy snippet at startup (and after a reload to another scorer) so the
        model is loaded before serving.
    index_path : str or Path, optional
        A :class:`~ragsieve.store.SnippetIndex` directory served by ``POST /query``. The
        filter must be one the index can compute from its stored vectors (see
        :meth:`~ragsieve.store.SnippetIndex.list_scorer`); checked here and on reloads.
    max_k : int, default=100
        Largest ``k`` a ``/query`` request may ask for (413 above).
    body_timeout : float, default=60.0
        Seconds a request has, after its head, to deliver the whole body (408 and the
        connection closed otherwise).
    state_dir : str or Path, optional
        Directory of the feedback, control and monitor files (:mod:`ragsieve.server.state`),
        locked while the app lives. None: a temporary directory removed at shutdown
        (``ragsieve serve`` passes a stable one so restarts continue).
    feedback_db : str or Path, optional
        The feedback database (default ``<state_dir>/feedback.sqlite``).
    adaptive : bool, default=False
        Serve the threshold followed from ``POST /feedback`` by adaptive conformal
        inference; the artifact must be of mode ``adaptive``.
    monitor_delta : float, default=0.01
        The exchangeability alarm fires on exchangeable traffic with probability at most
        ``monitor_delta``.
    watch : bool, default=False
        Reload when the artifact file changes (its mtime, size or inode, polled every
        0.5 s).
    max_served_rows : int, default=1_000_000
        Served-score rows kept in the feedback database (oldest pruned).
    max_pieces : int
        Most pieces of model work (snippet pieces scored) one request may cause; more
        get 413 with the limit in the message.
    max_queue : int
        Most requests waiting for model work at once; more get 429 with ``Retry-After``.
    max_artifact_bytes : int, default=64 MiB
        Larger artifact files are refused on a reload (413 from ``/admin/reload``) and
        at start.
    feedback_retention : float
        Seconds a served score can be labelled; older served rows and their labels are
        pruned.
    max_labels_per_query : int
        Most labels counted for one query_id.
    max_labels_per_minute : int
        Most labels one client may send per minute (429 beyond).

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ValueError
        A limit is not an int >= 1, ``body_timeout`` is not a number > 0, ``api_key`` is
        empty, ``monitor_delta`` is not in (0, 1), or ``state_dir`` is locked by another
        service.
    ImportError
        LanceDB is not installed (extra ``store``) and ``index_path`` is given.
    ArtifactError, ScorerMismatchError
        The artifact or the index cannot be loaded, they do not match, or ``adaptive``
        is set for an artifact of another mode.
    """
    return _create_app(filter_path, role="single", api_key=api_key, max_body_bytes=max_body_bytes,
                       max_snippets=max_snippets, scorer_options=scorer_options, warmup=warmup,
                       index_path=index_path, max_k=max_k, body_timeout=body_timeout,
                       state_dir=state_dir, feedback_db=feedback_db, adaptive=adaptive,
                       monitor_delta=monitor_delta, watch=watch, max_served_rows=max_served_rows,
                       max_pieces=max_pieces, max_queue=max_queue,
                       max_artifact_bytes=max_artifact_bytes,
                       feedback_retention=feedback_retention,
                       max_labels_per_query=max_labels_per_query,
                       max_labels_per_minute=max_labels_per_minute)


def _create_app(
    filter_path: str | Path, *, role: Role, api_key: str | None, max_body_bytes: int,
    max_snippets: int, scorer_options: dict[str, Any] | None, warmup: bool,
    index_path: str | Path | None, max_k: int, body_timeout: float,
    state_dir: str | Path | None, feedback_db: str | Path | None, adaptive: bool,
    monitor_delta: float, watch: bool, max_served_rows: int, max_pieces: int, max_queue: int,
    max_artifact_bytes: int, feedback_retention: float, max_labels_per_query: int,
    max_labels_per_minute: int, monitor_factory: Any = None,
) -> fastapi.FastAPI:
    """``create_app`` for one process (``role="single"``) or one of N workers.

    A single app owns its state directory (lock) and publishes the artifact; a worker
    finds the state directory prepared by the parent and serves its latest generation.
    """
    _check_options(api_key, max_body_bytes=max_body_bytes, max_snippets=max_snippets, max_k=max_k,
                   max_pieces=max_pieces, max_queue=max_queue,
                   max_artifact_bytes=max_artifact_bytes,
                   max_labels_per_query=max_labels_per_query,
                   max_labels_per_minute=max_labels_per_minute)
    check_seconds("body_timeout", body_timeout)
    check_seconds("feedback_retention", feedback_retention)
    delta = check_delta(monitor_delta)
    temporary = state_dir is None
    state = Path(tempfile.mkdtemp(prefix="ragsieve-serve-") if temporary else state_dir)  # type: ignore[arg-type]
    lock = StateLock(state).acquire() if role == "single" else None
    closables: list[Any] = []
    try:
        metrics = ServiceMetrics()
        store = FeedbackStore(Path(feedback_db) if feedback_db else state / "feedback.sqlite",
                              max_served_rows=max_served_rows,
                              retention_seconds=feedback_retention)
        closables.append(store)
        generations = Generations(state / "control.sqlite")
        closables.append(generations)
        runtime = Runtime(
            generations=generations, store=store, metrics=metrics, index=None,
            scorer_options=scorer_options, max_snippets=max_snippets, max_k=max_k,
            adaptive=adaptive, monitor_delta=delta,
            monitor_dir=state if role == "worker" else None, warmup=warmup,
            monitor_factory=monitor_factory, max_pieces=max_pieces, max_queue=max_queue,
            max_labels_per_query=max_labels_per_query,
            max_labels_per_minute=max_labels_per_minute)
        publisher = Publisher(filter_path, generations, runtime.check, runtime.before_publish,
                              max_bytes=max_artifact_bytes, served=lambda: runtime.current.generation)
        prepare = partial(_prepare_index, runtime, index_path, warmup=warmup)
        if role == "single":
            checked = runtime.check(read_text(filter_path, max_bytes=max_artifact_bytes),
                                    str(filter_path))
            number = generations.publish(checked.text, checked.checksum, "start")
            runtime.start([Generation(number, checked.checksum, checked.text, "start")], prepare,
                          checked=checked)
        else:  # the newest generation this worker can build (walks back after a bad one)
            history = generations.history()
            if not history:
                raise ArtifactError(f"state directory {str(state)!r} holds no published artifact; "
                                    "workers are started by run_server(workers=N).")
            number = runtime.start(history, prepare).generation
    except BaseException:
        for closable in closables:
            closable.close()
        if lock is not None:
            lock.release()
        if temporary:
            shutil.rmtree(state, ignore_errors=True)
        raise
    service = runtime.current
    logger.info("serving %r from %s (generation %d, lock=%s, index=%s, state dir %s)",
                service.flt, filter_path, number, not isinstance(service.lock, nullcontext),
                runtime.index, state)
    trigger = Trigger(publisher, watch=watch and role == "single", interval=POLL_SECONDS,
                      tick=runtime.sync)

    @asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        trigger.start()
        try:
            yield
        finally:
            trigger.stop()
            runtime.close()
            metrics.mark_process_dead()
            if lock is not None:
                lock.release()
            if temporary:
                shutil.rmtree(state, ignore_errors=True)

    app = fastapi.FastAPI(
        title="ragsieve",
        version=__version__,
        description="Conformal context filter: keeps the snippets the calibrated filter keeps.",
        lifespan=lifespan,
    )
    app.router.route_class = StrictJSONRoute  # bodies parsed as strict JSON (parsing.py)
    handlers: list[tuple[type[Exception], Any]] = [
        (RequestValidationError, validation_error_handler),
        (StarletteHTTPException, http_error_handler),
        (Exception, unexpected_error_handler),
    ]
    for exc_class, handler in handlers:
        app.add_exception_handler(exc_class, handler)
    _add_routes(app, runtime, publisher, api_key)
    _add_monitor_reset(app, runtime, api_key)
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=max_body_bytes, body_timeout=body_timeout
    )
    app.add_middleware(_MetricsMiddleware, metrics=metrics)  # outermost: counts 413 and 408 too
    app.state.filter = runtime.current.flt
    app.state.index = runtime.index
    app.state.runtime = runtime
    app.state.trigger = trigger
    app.state.state_dir = state
    return app


class _MetricsMiddleware:
    """ASGI middleware: :meth:`ServiceMetrics.middleware` as a class Starlette can stack."""

    def __init__(self, app: Any, metrics: ServiceMetrics) -> None:
        self._call = metrics.middleware(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._call(scope, receive, send)
