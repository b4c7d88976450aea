"""The FastAPI app: the served filter (and optionally an index) behind its routes.

The routes read the :class:`~ragsieve.server.runtime.Runtime`'s current service once per
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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import fastapi
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._version import __version__
from ..errors import ArtifactError, ArtifactTooLargeError
from ..filter import ConformalFilter
from .answers import monitor_info
from .feedback import FeedbackStore
from .metrics import ServiceMetrics
from .options import ServeOptions, check_delta, serve_options
from .page import page_key_check, page_response
from .parsing import (
    StrictJSONRoute,
    UnexpectedErrorMiddleware,
    http_error_handler,
    printable,
    unexpected_error_handler,
    validation_error_handler,
)
from .reload import Generation, Generations, Publisher, Trigger, read_text
from .request_checks import http_error
from .rerank import (
    ALL_PREFIX,
    RERANK_DESCRIPTION,
    RERANK_ROUTES,
    Api,
    RerankRequest,
    RerankResponse,
    TEIRerankResult,
)
from .runtime import NO_MONITOR, Runtime
from .schemas import (
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    FilterRequest,
    FilterResponse,
    Health,
    MonitorResetResponse,
    QueryRequest,
    QueryResponse,
    ReloadResponse,
    StatusResponse,
)
from .security import (
    CLIENT_HEADER,
    APIKeyMiddleware,
    BodyLimitMiddleware,
    CrossSiteGuard,
    HostCheckMiddleware,
    HostPolicy,
    api_key_check,
    is_loopback_host,
)
from .state import StateLock

__all__ = ["ServeOptions", "check_delta", "create_app"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at the published generation (and, with watch, the file).
POLL_SECONDS = 0.5
#: The paths a keyed service answers without the key (the page asks for it itself).
OPEN_PATHS = ("/healthz", "/")

Role = Literal["single", "worker"]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


#: The error answers of every route that changes state (the guards of security.py).
_GUARD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Host header not one the service answers to (--allowed-hosts), or a "
                "malformed Content-Length header."),
    403: _error("Cross-site request: Sec-Fetch-Site other than same-origin, or an Origin "
                "that is not the service's own (scheme, host and port)."),
    415: _error(f"Neither Content-Type: application/json nor a program's header "
                f"({CLIENT_HEADER}, X-API-Key or Authorization: Bearer)."),
}

#: The error answers of a route that reads a JSON body (``/filter``, ``/query``).
_BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    **_GUARD_ERRORS,
    408: _error("The body did not arrive within the service's body timeout, or no byte of "
                "it arrived for body_idle_timeout seconds."),
    413: _error("Body larger than the service's max_body_bytes."),
    415: _error("Content-Type is not application/json."),
    422: _error(
        "Body is not strict JSON (UTF-8, finite numbers, unique keys, valid Unicode), does "
        "not match the schema, or holds values the filter refuses (detail says which)."
    ),
    429: _error("The bodies this client address is sending at once would pass "
                "max_receiving_per_client; Retry-After says when to retry."),
    503: _error("The bodies being received at once would pass max_receiving_bytes; "
                "Retry-After says when to retry."),
}


@dataclass(frozen=True)
class _RouteErrors:
    """The error answers each route documents (OpenAPI ``responses``)."""

    key: dict[int | str, dict[str, Any]]  # of a route that only checks the API key
    filter: dict[int | str, dict[str, Any]]
    query: dict[int | str, dict[str, Any]]
    feedback: dict[int | str, dict[str, Any]]
    reload: dict[int | str, dict[str, Any]]

    @classmethod
    def of(cls, api_key: str | None) -> _RouteErrors:
        """The tables of a service with or without an API key."""
        errors = dict(_BODY_ERRORS)
        key_errors: dict[int | str, dict[str, Any]] = {}
        if api_key is not None:
            errors[401] = key_errors[401] = _error("Missing or invalid API key.")
        return cls(
            key=key_errors,
            filter={
                **errors,
                413: _error("Body larger than max_body_bytes, or more snippets than "
                            "max_snippets."),
                502: _error("The reranker the served score calls (a filter calibrated on "
                            "--scorer rerank) is down, refused or answered out of shape."),
            },
            query={
                **errors,
                404: _error("The service has no index (start it with --index)."),
                413: _error("Body larger than max_body_bytes, or k larger than max_k."),
            },
            feedback={
                **errors,
                413: _error("Body larger than max_body_bytes, or more labels than max_snippets."),
            },
            reload={
                **_GUARD_ERRORS,
                **key_errors,
                403: _error("Cross-site request (Sec-Fetch-Site, Origin), or no API key is "
                            "configured and the client is not on a loopback address."),
                413: _error("The artifact file is larger than max_artifact_bytes (refused "
                            "unread); the previous one keeps serving."),
                422: _error("The artifact at the served path was refused (detail says why); "
                            "the previous one keeps serving."),
            },
        )


def _add_routes(app: fastapi.FastAPI, runtime: Runtime, publisher: Publisher,
                api_key: str | None) -> None:
    protected: list[Any] = []
    if api_key is not None:
        protected = [fastapi.Depends(api_key_check(api_key))]
    errors = _RouteErrors.of(api_key)

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return runtime.current.health()

    @app.get("/openapi.json", dependencies=protected, include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    _add_page(app, runtime, api_key, protected, errors.key)
    _add_filter_routes(app, runtime, protected, errors)
    _add_rerank_routes(app, runtime, protected, errors)
    _add_admin_routes(app, runtime, publisher, api_key, protected, errors)


def _add_filter_routes(app: fastapi.FastAPI, runtime: Runtime, protected: list[Any],
                       errors: _RouteErrors) -> None:
    """``POST /filter``, ``/query`` and ``/feedback``: the served filter's work."""

    @app.post(
        "/filter", response_model=FilterResponse, dependencies=protected, responses=errors.filter
    )
    def filter_snippets(request: FilterRequest) -> FilterResponse:
        return runtime.current.run_filter(request)

    @app.post(
        "/query", response_model=QueryResponse, dependencies=protected, responses=errors.query
    )
    def query_index(request: QueryRequest) -> QueryResponse:
        return runtime.current.run_query(request)

    @app.post(
        "/feedback", response_model=FeedbackResponse, dependencies=protected,
        responses=errors.feedback,
    )
    def feedback(request: FeedbackRequest, http: fastapi.Request) -> FeedbackResponse:
        client = http.client.host if http.client is not None else ""
        return runtime.current.run_feedback(request, client=client)


def _add_rerank_routes(app: fastapi.FastAPI, runtime: Runtime, protected: list[Any],
                       errors: _RouteErrors) -> None:
    """``POST /v1/rerank``, ``/v2/rerank`` and ``/rerank`` (and each under ``/all``): the
    rerank API with the calibrated cut inside (:mod:`ragsieve.server.rerank`)."""
    default = runtime.options.rerank_return
    for path, api in RERANK_ROUTES:
        for prefix in ("", ALL_PREFIX):
            route = prefix + path
            tei = api == "tei"
            app.post(
                route, dependencies=protected, responses=errors.filter,
                response_model=list[TEIRerankResult] | RerankResponse if tei else RerankResponse,
                summary=("TEI's rerank (texts), or the Cohere body" if tei else
                         f"Cohere {api} / Jina / vLLM rerank")
                + (": every document, ranked" if prefix else ": the documents kept"),
                description=RERANK_DESCRIPTION,
            )(_rerank_handler(runtime, route, api, default, everything=bool(prefix)))


def _rerank_handler(runtime: Runtime, route: str, api: Api, default: str, *,
                    everything: bool) -> Any:
    """The handler of one rerank route (``everything``: under the ``/all`` prefix)."""

    def rerank(request: RerankRequest, returned: Literal["kept", "all"] | None = fastapi.Query(
            default=None, alias="return", description="'all': every document, ranked, with "
            "its p-value; 'kept': the documents the filter keeps (default: the service's "
            "--rerank-return, or 'all' under the /all prefix).")) -> JSONResponse:
        if everything and returned == "kept":
            raise http_error(422, f"{route} answers every document; drop ?return=kept or "
                                  f"call {route.removeprefix(ALL_PREFIX)}.")
        want_all = everything or (returned or default) == "all"
        body, headers = runtime.current.run_rerank(request, route=route, api=api,
                                                   everything=want_all)
        return JSONResponse(body, headers=headers)

    return rerank


def _add_admin_routes(app: fastapi.FastAPI, runtime: Runtime, publisher: Publisher,
                      api_key: str | None, protected: list[Any], errors: _RouteErrors) -> None:
    """``GET /metrics`` and ``POST /admin/reload``: the operator's routes."""

    @app.get(
        "/metrics", dependencies=protected, responses=errors.key, response_class=Response,
        summary="Prometheus metrics (text exposition format)",
    )
    def metrics() -> Response:
        return Response(runtime.metrics.exposition(), media_type=runtime.metrics.content_type)

    @app.post(
        "/admin/reload", response_model=ReloadResponse, dependencies=protected,
        responses=errors.reload,
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
                              monitor_reset=changed and now.monitor is not None,
                              lists_reset=changed and now.flt.list_watch is not None
                              and now.flt.list_watch.active)


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
        **_GUARD_ERRORS,
        403: _error("Cross-site request (Sec-Fetch-Site, Origin), or no API key is "
                    "configured and the client is not on a loopback address."),
        404: _error("The served artifact has neither a monitor reference nor a record of "
                    "its calibration lists."),
    }
    if api_key is not None:
        responses[401] = _error("Missing or invalid API key.")

    @app.post("/admin/monitor/reset", response_model=MonitorResetResponse,
              dependencies=protected, responses=responses)
    def admin_monitor_reset(request: fastapi.Request) -> MonitorResetResponse:
        client = _admin_client(request, api_key, "/admin/monitor/reset")
        service = runtime.current
        watch = service.flt.list_watch
        if service.monitor is None and (watch is None or not watch.active):
            raise http_error(404, NO_MONITOR)
        state, lists_reset = runtime.reset_monitors(service)
        logger.warning("exchangeability monitor%s reset by POST /admin/monitor/reset from %s "
                       "(generation %d)", " and list check" if lists_reset else "",
                       printable(client), service.generation)
        info = {} if state is None else monitor_info(state).model_dump()
        return MonitorResetResponse(**info, monitor_reset=state is not None,
                                    lists_reset=lists_reset)


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
    from ..filtered_search import list_scorer
    from ..store import SnippetIndex

    if not Path(index_path).is_dir():
        raise FileNotFoundError(
            f"index {str(index_path)!r} is not a directory; build one with `ragsieve index`."
        )
    if flt.unit != "snippet":
        raise ArtifactError(
            f"the served filter's unit is {flt.unit!r}: it scores the sentences of each snippet, "
            "and the index stores one vector per snippet, so /query cannot score its hits from "
            "it. Serve it without --index and POST /filter the hits' texts.")
    index = SnippetIndex.open(index_path)  # reads metadata only, loads no weights
    list_scorer(index, flt)  # raises ScorerMismatchError now, not on the first request
    # the filter's score is the index's 1 - cos (or built on it): share the loaded model
    model = flt.scorer_.embedding_model()
    return index if model is None else SnippetIndex.open(index_path, model=model)


def create_app(filter_path: str | Path, options: ServeOptions | None = None,
               **kwargs: Any) -> fastapi.FastAPI:
    """Build the FastAPI app serving one filter artifact (and optionally an index).

    Routes: ``GET /healthz`` (no key), ``POST /filter``, ``POST /query``, ``POST
    /feedback``, ``GET /metrics``, ``GET /status`` and ``POST /admin/reload`` (key required
    when one is set; without a key ``/admin/reload`` answers loopback clients only), and
    the page ``GET /`` (:mod:`ragsieve.server.page`; behind the key, which it also takes
    as a Basic password), and ``GET /openapi.json`` (behind the key; no ``/docs`` or
    ``/redoc``, whose scripts FastAPI takes from a CDN).

    Every request passes the guards of :mod:`ragsieve.server.security` first: a ``Host``
    that does not name the service (``options.host``, the address the connection arrived
    on, loopback names for a loopback one, ``options.allowed_hosts``) gets 400; a request
    that changes state (every route but GET) from another origin gets 403 and one with
    neither a JSON body nor a program's header (``X-Ragsieve: 1``, ``X-API-Key``,
    ``Authorization: Bearer``) 415, with or without a key; a body that would take the
    bytes being received over ``options.max_receiving_bytes`` gets 503.

    Parameters
    ----------
    filter_path : str or Path
        JSON artifact written by ``ConformalFilter.save``; re-read on a reload.
    options : ServeOptions, optional
        The service's settings (:class:`~ragsieve.server.options.ServeOptions`: API key,
        limits, state directory, feedback, adaptive, monitor, watch, index, ...); default
        ``ServeOptions()``. ``host``, ``port``, ``workers`` and the connection timeouts are
        :func:`~ragsieve.server.run_server`'s.
    **kwargs
        Options by name (``api_key=...``, ``max_snippets=...``, any field of
        ``ServeOptions``), applied over ``options``: ``create_app(path, max_k=10)`` is
        ``create_app(path, ServeOptions(max_k=10))``.

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    TypeError
        A keyword is no option of ``ServeOptions`` (the message lists them), or an option
        has the wrong type.
    ValueError
        An option's value breaks its rule (a limit is not an int >= 1, ``body_timeout``
        not a number > 0, ``api_key`` empty, ``monitor_delta`` not in (0, 1); the message
        names it), or ``state_dir`` is locked by another service.
    ImportError
        LanceDB is not installed (extra ``store``) and ``index_path`` is given.
    ArtifactError, ScorerMismatchError
        The artifact or the index cannot be loaded, they do not match, or ``adaptive``
        is set for an artifact of another mode.

    Examples
    --------
    >>> create_app("filter.json", ServeOptions(max_snippets=100))  # doctest: +SKIP
    >>> create_app("filter.json", max_snippets=100)  # the same  # doctest: +SKIP
    """
    return _create_app(filter_path, serve_options(options, kwargs), role="single")


def _create_app(filter_path: str | Path, options: ServeOptions, *, role: Role,
                monitor_factory: Any = None) -> fastapi.FastAPI:
    """``create_app`` for one process (``role="single"``) or one of N workers.

    A single app owns its state directory (lock) and publishes the artifact; a worker
    finds the state directory prepared by the parent and serves its latest generation.
    """
    state = _ServedState.open(options.state_dir, lock=role == "single")
    try:
        runtime, publisher, number = _start_runtime(filter_path, options, state, role,
                                                    monitor_factory)
    except BaseException:
        state.close()
        raise
    service = runtime.current
    logger.info("serving %r from %s (generation %d, lock=%s, index=%s, state dir %s)",
                service.flt, filter_path, number, not isinstance(service.lock, nullcontext),
                runtime.index, state.path)
    trigger = Trigger(publisher, watch=options.watch and role == "single",
                      interval=POLL_SECONDS, tick=runtime.sync)
    app = fastapi.FastAPI(
        title="ragsieve",
        version=__version__,
        description="Conformal context filter: keeps the snippets the calibrated filter keeps.",
        lifespan=_lifespan(trigger, runtime, state),
        # no Swagger UI / ReDoc: FastAPI loads them from a CDN into the service's origin
        # (and they fail offline); /openapi.json is served by _add_routes, behind the key
        docs_url=None, redoc_url=None, openapi_url=None,
    )
    _wire(app, runtime, publisher, options)
    app.state.filter = runtime.current.flt
    app.state.index = runtime.index
    app.state.runtime = runtime
    app.state.trigger = trigger
    app.state.state_dir = state.path
    return app


@dataclass(frozen=True)
class _ServedState:
    """The state directory of one app: its path, whether it is temporary (removed at the
    end), and its lock (held by a single app, not by a worker)."""

    path: Path
    temporary: bool
    lock: StateLock | None

    @classmethod
    def open(cls, state_dir: Path | None, *, lock: bool) -> _ServedState:
        temporary = state_dir is None
        path = Path(tempfile.mkdtemp(prefix="ragsieve-serve-")) if state_dir is None else state_dir
        try:
            held = StateLock(path).acquire() if lock else None
        except BaseException:
            if temporary:
                shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, temporary, held)

    def close(self) -> None:
        """Release the lock and remove a temporary directory."""
        if self.lock is not None:
            self.lock.release()
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)


def _start_runtime(filter_path: str | Path, options: ServeOptions, state: _ServedState,
                   role: Role, monitor_factory: Any) -> tuple[Runtime, Publisher, int]:
    """The runtime serving its first generation, the publisher of reloads, and the
    generation number; the stores opened here are closed again on an error."""
    closables: list[Any] = []
    try:
        store = FeedbackStore(options.feedback_db or state.path / "feedback.sqlite",
                              max_served_rows=options.max_served_rows,
                              retention_seconds=options.feedback_retention)
        closables.append(store)
        generations = Generations(state.path / "control.sqlite")
        closables.append(generations)
        runtime = Runtime(options, generations=generations, store=store,
                          metrics=ServiceMetrics(), index=None,
                          monitor_dir=state.path,
                          monitor_factory=monitor_factory)
        publisher = Publisher(filter_path, generations, runtime.check_to_publish,
                              runtime.before_publish,
                              max_bytes=options.max_artifact_bytes,
                              served=lambda: runtime.current.generation)
        prepare = partial(_prepare_index, runtime, options.index_path, warmup=options.warmup)
        if role == "single":
            number = _start_single(runtime, filter_path, options, prepare)
        else:
            number = _start_worker(runtime, state.path, prepare)
    except BaseException:
        for closable in closables:
            closable.close()
        raise
    return runtime, publisher, number


def _start_single(runtime: Runtime, filter_path: str | Path, options: ServeOptions,
                  prepare: Any) -> int:
    """Check the artifact file, publish it as the first generation and serve it."""
    checked = runtime.check(read_text(filter_path, max_bytes=options.max_artifact_bytes),
                            str(filter_path))
    previous = runtime.generations.latest()
    if previous is not None and previous.checksum == checked.checksum:
        logger.info("state directory holds the monitors' state of this artifact (checksum "
                    "%s): the drift alarm and the list check go on from it",
                    checked.checksum[:12])
    else:
        if previous is not None:
            logger.warning("state directory held the monitors' state of another artifact "
                           "(checksum %s); discarded: the drift alarm and the list check start "
                           "afresh for checksum %s", previous.checksum[:12],
                           checked.checksum[:12])
        runtime.before_publish(checked, None)  # a fresh martingale and list check
    number = runtime.generations.publish(checked.text, checked.checksum, "start")
    runtime.start([Generation(number, checked.checksum, checked.text, "start")], prepare,
                  checked=checked)
    return number


def _start_worker(runtime: Runtime, state: Path, prepare: Any) -> int:
    """Serve the newest published generation this worker can build (walks back after a
    bad one)."""
    history = runtime.generations.history()
    if not history:
        raise ArtifactError(f"state directory {str(state)!r} holds no published artifact; "
                            "workers are started by run_server(workers=N).")
    return runtime.start(history, prepare).generation


def _lifespan(trigger: Trigger, runtime: Runtime, state: _ServedState) -> Any:
    """The app's lifespan: reloads run while it serves; everything is closed after."""

    @asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        trigger.start()
        try:
            yield
        finally:
            trigger.stop()
            runtime.close()
            runtime.metrics.mark_process_dead()
            state.close()

    return lifespan


def _wire(app: fastapi.FastAPI, runtime: Runtime, publisher: Publisher,
          options: ServeOptions) -> None:
    """Strict JSON bodies, the error handlers, the routes and the middleware."""
    app.router.route_class = StrictJSONRoute  # bodies parsed as strict JSON (parsing.py)
    handlers: list[tuple[type[Exception], Any]] = [
        (RequestValidationError, validation_error_handler),
        (StarletteHTTPException, http_error_handler),
        (Exception, unexpected_error_handler),
    ]
    for exc_class, handler in handlers:
        app.add_exception_handler(exc_class, handler)
    _add_routes(app, runtime, publisher, options.api_key)
    _add_monitor_reset(app, runtime, options.api_key)
    # the last added runs first: metrics, Host, cross-site, API key, body limits,
    # unexpected errors, then the routes
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=options.max_body_bytes,
                       body_timeout=options.body_timeout,
                       max_receiving_bytes=options.receiving_limit,
                       max_receiving_per_client=options.per_client_limit,
                       body_idle_timeout=options.body_idle_timeout)
    if options.api_key is not None:  # from the request head, before any body is reserved
        app.add_middleware(APIKeyMiddleware, api_key=options.api_key,
                           open_paths=OPEN_PATHS)
    app.add_middleware(CrossSiteGuard, routes=app.router.routes)
    if "*" in options.allowed_hosts:
        logger.warning("allowed_hosts '*': the Host check is off; a page of any site can "
                       "reach this service through a name rebound to its address (DNS "
                       "rebinding)")
    app.add_middleware(HostCheckMiddleware,
                       policy=HostPolicy.of(options.host, options.allowed_hosts))
    # outermost: counts 400, 403, 413, 408 and 503 too
    app.add_middleware(_MetricsMiddleware, metrics=runtime.metrics)


class _MetricsMiddleware:
    """ASGI middleware: :meth:`ServiceMetrics.middleware` as a class Starlette can stack."""

    def __init__(self, app: Any, metrics: ServiceMetrics) -> None:
        self._call = metrics.middleware(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._call(scope, receive, send)
