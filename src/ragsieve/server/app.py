"""The FastAPI app: one loaded filter (and optionally an index) behind three routes.

``/filter`` and ``/query`` are sync endpoints, so requests are parsed, checked and
answered in Starlette's threadpool and served concurrently. Every call that may run the
model (scoring snippet texts, embedding a ``/query`` question) is handed to one
dedicated model thread: the embedding cache serialises model calls anyway, and doing
them all in one thread keeps the model's working memory in one allocator arena instead
of one per pool thread (four concurrent long requests otherwise hold several copies of
it: measured in ``benchmarks/bench_server.py --long``). Requests with vectors or
outside scores need no model and stay in the pool. Index searches are serialised with
a lock, and so are scorers not known to be thread-safe.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import fastapi
import numpy as np
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._optional import require
from .._version import __version__
from ..errors import DataError
from ..filter import ConformalFilter, read_artifact
from ..types import FilterResult
from .connections import check_seconds, uvicorn_config
from .parsing import (
    StrictJSONRoute,
    http_error_handler,
    printable,
    unexpected_error_handler,
    validation_error_handler,
)
from .schemas import (
    ArtifactInfo,
    ErrorResponse,
    FilterRequest,
    FilterResponse,
    Health,
    HitOut,
    IndexInfo,
    KeptSnippet,
    QueryRequest,
    QueryResponse,
)
from .security import BodyLimitMiddleware, api_key_check, is_loopback_host

__all__ = ["create_app", "run_server"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Scorers known to be safe to call from several threads at once (after warm-up).
_THREAD_SAFE_SCORERS = frozenset({"embedding", "field"})
#: Scorers that load no model (nothing to warm up; they read an outside score).
_NO_MODEL_SCORERS = frozenset({"field"})
#: How many filters with a request's own ``min_keep`` are kept for reuse.
_MAX_CACHED_FILTERS = 64


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
    return None if math.isinf(value) else float(value)


def _http_error(status: int, detail: str) -> fastapi.HTTPException:
    return fastapi.HTTPException(status_code=status, detail=detail)


@contextmanager
def _bad_request_as_422() -> Iterator[None]:
    """Turn the library's errors about a request (bad values, types, data) into 422."""
    try:
        yield
    except (DataError, ValueError, TypeError) as exc:
        message = printable(str(exc))
        logger.info("request refused (422): %s", message)
        raise _http_error(422, message) from exc


def _check_query(query: str) -> None:
    if not query.strip():
        raise _http_error(422, "query is blank; expected a non-empty string.")


def _show_int(value: int) -> str:
    """``value`` for an error message (a description when it is very long)."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 20 else f"a {digits}-digit number"


def _check_min_keep(min_keep: int | None, limit: int, what: str) -> None:
    if min_keep is not None and min_keep > limit:
        raise _http_error(
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
            raise _http_error(
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
            raise _http_error(
                422,
                f"snippet {i} has {got}; with a query_vector of length {dim} every snippet "
                f"must be an object with a 'vector' of length {dim}.",
            )
    rows = [s.vector for s in snippets if not isinstance(s, str)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), dim)


class _Service:
    """The loaded filter (and index) behind the routes, with their locks and limits."""

    def __init__(
        self, flt: ConformalFilter, index: Any, health: Health, *, max_snippets: int, max_k: int
    ) -> None:
        self.flt = flt
        self.index = index
        self.health = health
        self.guarantee = health.artifact.guarantee
        self.max_snippets = max_snippets
        self.max_k = max_k
        thread_safe = flt.scorer.spec().get("scorer") in _THREAD_SAFE_SCORERS
        self.lock: AbstractContextManager[Any] = nullcontext() if thread_safe else threading.Lock()
        self.index_lock = threading.Lock()
        self._filters: dict[int, ConformalFilter] = {flt.min_keep: flt}
        self.uses_model = flt.scorer.spec().get("scorer") not in _NO_MODEL_SCORERS
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragsieve-model")

    def in_model_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run in the one model thread (its exceptions re-raised here)."""
        return self._model_thread.submit(fn).result()

    def close(self) -> None:
        """Stop the model thread (after the call it is running, if any)."""
        self._model_thread.shutdown(wait=False, cancel_futures=True)

    def filter_for(self, min_keep: int | None) -> ConformalFilter:
        """The served filter with another ``min_keep`` (a few are kept for reuse)."""
        k = self.flt.min_keep if min_keep is None else min_keep
        use = self._filters.get(k)
        if use is None:
            use = copy.copy(self.flt)  # shares the scorer and the fitted calibrator
            use.min_keep = k
            if len(self._filters) < _MAX_CACHED_FILTERS:
                self._filters[k] = use
        return use

    def run_filter(self, request: FilterRequest) -> FilterResponse:
        """``POST /filter``: score the request's snippets (or use its vectors) and filter."""
        _check_query(request.query)
        n = len(request.snippets)
        if n > self.max_snippets:
            raise _http_error(
                413, f"got {n} snippets; the limit is {self.max_snippets} per request."
            )
        _check_min_keep(request.min_keep, self.max_snippets, "snippets")
        vectors = _snippet_vectors(request)
        items = [s if isinstance(s, str) else s.as_item() for s in request.snippets]
        use = self.filter_for(request.min_keep)
        with _bad_request_as_422(), self.lock:
            if vectors is None and self.uses_model:
                res = self.in_model_thread(
                    lambda: use.filter(request.query, items, group=request.group)
                )
            elif vectors is None:
                res = use.filter(request.query, items, group=request.group)
            else:
                query_vector = np.asarray(request.query_vector, dtype=np.float64)
                res = use.filter_vectors(
                    request.query, query_vector, vectors, items, group=request.group
                )
        return self._filter_response(res)

    def _filter_response(self, res: FilterResult) -> FilterResponse:
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
        )

    def run_query(self, request: QueryRequest) -> QueryResponse:
        """``POST /query``: retrieve ``k`` hits from the index and filter them."""
        if self.index is None:
            raise _http_error(
                404,
                "this service has no index; start it with `ragsieve serve --filter F --index DIR` "
                "or use POST /filter with your own snippets.",
            )
        _check_query(request.query)
        if request.k > self.max_k:
            raise _http_error(413, f"k == {_show_int(request.k)}; the limit is {self.max_k}.")
        _check_min_keep(request.min_keep, self.max_k, "hits (k)")
        use = self.filter_for(request.min_keep)
        with _bad_request_as_422(), self.index_lock:
            hits, res = self.in_model_thread(  # embeds the question
                lambda: self.index.query_with_filter(
                    request.query, use, k=request.k, group=request.group
                )
            )
        kept = {s.index for s in res.kept}
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
        )


def _health(flt: ConformalFilter, artifact: Mapping[str, Any], index: Any) -> Health:
    """The ``/healthz`` answer (fixed for the life of the app)."""
    guarantee = _json_safe(flt.guarantee())
    n_calibration = guarantee.get("n_calibration")
    info = ArtifactInfo(
        format_version=artifact.get("format_version"),
        library_version=artifact.get("library_version"),
        created=artifact.get("created"),
        mode=guarantee.get("mode"),
        guaranteed_metric=guarantee.get("metric"),
        alpha=guarantee.get("alpha"),
        threshold=_finite_or_none(flt.threshold),
        n_calibration=None if n_calibration is None else int(n_calibration),
        min_keep=flt.min_keep,
        group_by=getattr(flt, "group_by", None),
        scorer=flt.scorer.spec(),
        guarantee=guarantee,
    )
    index_info = None
    if index is not None:
        index_info = IndexInfo(
            name=Path(index.path).resolve().name, model=index.model_id, n_snippets=index.count()
        )
    return Health(status="ok", library_version=__version__, artifact=info, index=index_info)


def _check_options(api_key: str | None, **limits: int) -> None:
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} == {value!r}, must be an int >= 1.")
    if api_key is not None and not api_key:
        raise ValueError("api_key == '', must be a non-empty string or None.")


def _warm_up(flt: ConformalFilter, index: Any) -> None:
    """Load the model (and open the index table) before the first request."""
    if flt.scorer.spec().get("scorer") not in _NO_MODEL_SCORERS:
        flt.scorer.score_batch("warm-up", ["warm-up"])
    if index is not None:
        index.search("warm-up", k=1)


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


def _add_routes(app: fastapi.FastAPI, service: _Service, api_key: str | None) -> None:
    protected: list[Any] = []
    errors = dict(_BODY_ERRORS)
    if api_key is not None:
        protected = [fastapi.Depends(api_key_check(api_key))]
        errors[401] = _error("Missing or invalid API key.")
    filter_errors = {
        **errors,
        413: _error("Body larger than max_body_bytes, or more snippets than max_snippets."),
    }
    query_errors = {
        **errors,
        404: _error("The service has no index (start it with --index)."),
        413: _error("Body larger than max_body_bytes, or k larger than max_k."),
    }

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return service.health

    @app.post(
        "/filter", response_model=FilterResponse, dependencies=protected, responses=filter_errors
    )
    def filter_snippets(request: FilterRequest) -> FilterResponse:
        return service.run_filter(request)

    @app.post(
        "/query", response_model=QueryResponse, dependencies=protected, responses=query_errors
    )
    def query_index(request: QueryRequest) -> QueryResponse:
        return service.run_query(request)


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
) -> fastapi.FastAPI:
    """Build the FastAPI app serving one filter artifact (and optionally an index).

    Parameters
    ----------
    filter_path : str or Path
        JSON artifact written by ``ConformalFilter.save``; loaded once, here.
    api_key : str, optional
        When set, ``POST /filter`` and ``POST /query`` require ``Authorization: Bearer
        <key>`` or ``X-API-Key: <key>`` (401 otherwise; compared in constant time).
    max_body_bytes : int, default=1_000_000
        Larger request bodies get 413.
    max_snippets : int, default=1000
        Requests with more snippets get 413.
    scorer_options : dict, optional
        Passed to ``ConformalFilter.load`` (e.g. ``{"cache_dir": ...}``).
    warmup : bool, default=True
        Score one dummy snippet at startup so the model is loaded before serving.
    index_path : str or Path, optional
        A :class:`~ragsieve.store.SnippetIndex` directory served by ``POST /query``. The
        filter must be one the index can compute from its stored vectors (see
        :meth:`~ragsieve.store.SnippetIndex.list_scorer`); checked here, at startup.
    max_k : int, default=100
        Largest ``k`` a ``/query`` request may ask for (413 above).
    body_timeout : float, default=60.0
        Seconds a request has, after its head, to deliver the whole body (408 and the
        connection closed otherwise).

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ValueError
        A limit is not an int >= 1, ``body_timeout`` is not a number > 0, or ``api_key``
        is empty.
    ImportError
        LanceDB is not installed (extra ``store``) and ``index_path`` is given.
    ArtifactError, ScorerMismatchError
        The artifact or the index cannot be loaded, or they do not match.
    """
    _check_options(api_key, max_body_bytes=max_body_bytes, max_snippets=max_snippets, max_k=max_k)
    check_seconds("body_timeout", body_timeout)
    flt = ConformalFilter.load(filter_path, scorer_options=scorer_options)
    index = _open_index(index_path, flt) if index_path is not None else None
    if warmup:
        _warm_up(flt, index)
    health = _health(flt, read_artifact(filter_path), index)
    service = _Service(flt, index, health, max_snippets=max_snippets, max_k=max_k)
    logger.info(
        "serving %r from %s (lock=%s, index=%s)",
        flt,
        filter_path,
        not isinstance(service.lock, nullcontext),
        index,
    )

    @asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

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
    _add_routes(app, service, api_key)
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=max_body_bytes, body_timeout=body_timeout
    )
    app.state.filter = flt
    app.state.index = index
    return app


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


def run_server(
    filter_path: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "info",
    timeout_keep_alive: int = 5,
    timeout_request_header: float = 10.0,
    **app_options: Any,
) -> None:
    """Serve a filter artifact with uvicorn (blocks until stopped).

    Parameters
    ----------
    filter_path : str or Path
        The filter artifact.
    host, port : str, int
        Where to listen. A non-loopback host requires ``api_key``.
    api_key : str, optional
        See :func:`create_app`.
    log_level : str
        uvicorn's log level.
    timeout_keep_alive : int, default=5
        Seconds an idle keep-alive connection stays open after a response.
    timeout_request_header : float, default=10.0
        Seconds a connection has to deliver a complete request head after it opens or
        after its previous response; then it is closed (idle and slowloris connections).
    **app_options
        The other options of :func:`create_app` (``max_body_bytes``, ``max_snippets``,
        ``scorer_options``, ``index_path``, ``max_k``, ``body_timeout``).

    Raises
    ------
    ValueError
        ``host`` is not loopback and no API key is set, or a timeout is not a number > 0.
    ImportError
        uvicorn is not installed (extra ``server``).
    """
    if not api_key and not is_loopback_host(host):
        raise ValueError(
            f"host == {host!r} is not a loopback address and no API key is set; refusing to "
            "serve the filter unauthenticated on the network. Set an API key or bind to 127.0.0.1."
        )
    check_seconds("timeout_keep_alive", timeout_keep_alive)  # before any weights load
    check_seconds("timeout_request_header", timeout_request_header)
    uvicorn = require("uvicorn", "server")
    app = create_app(filter_path, api_key=api_key, **app_options)
    config = uvicorn_config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=timeout_keep_alive,
        timeout_request_header=timeout_request_header,
    )
    logger.info("ragsieve server on http://%s:%d", host, port)
    uvicorn.Server(config).run()
