"""HTTP service around a calibrated :class:`~ragsieve.filter.ConformalFilter`.

``create_app(path)`` loads a filter artifact once and serves

* ``GET /healthz`` -- status, library version and the artifact's alpha, threshold,
  scorer spec and versions (no authentication, for liveness probes);
* ``POST /filter`` -- ``{"query", "snippets", "min_keep"?}`` -> kept snippets, all
  scores, tau, removal, note and the guarantee (API key required when configured);
* ``POST /query`` -- ``{"query", "k"?, "min_keep"?}`` -> the ``k`` hits retrieved from a
  :class:`~ragsieve.store.SnippetIndex` (when the app is built with ``index_path``),
  scored from their stored vectors, each marked kept or not, plus tau, removal and the
  guarantee (API key required when configured; 404 without an index);
* ``GET /openapi.json`` -- the typed schema.

FastAPI and uvicorn are optional (``pip install 'ragsieve[server]'``) and imported
only when an app is built. ``/filter`` is a sync endpoint, so scoring runs in
Starlette's threadpool and concurrent requests are served; the embedding scorer is
thread-safe (its cache serialises model calls under a lock) once warmed up, other
scorers are serialised with a lock, and so are index searches.

Note: this module deliberately has no ``from __future__ import annotations``:
FastAPI resolves the annotations of the endpoint functions defined inside
:func:`create_app` at runtime.
"""

import hmac
import ipaddress
import json
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from ._optional import require
from ._version import __version__
from .filter import ConformalFilter, read_artifact

__all__ = ["api_key_from_env", "create_app", "is_loopback_host", "run_server"]

logger = logging.getLogger(__name__)

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]

#: Scorers known to be safe to call from several threads at once (after warm-up).
_THREAD_SAFE_SCORERS = frozenset({"embedding"})


def is_loopback_host(host: str) -> bool:
    """True when ``host`` is ``localhost`` or a loopback IP address.

    Examples
    --------
    >>> is_loopback_host("127.0.0.1"), is_loopback_host("::1"), is_loopback_host("0.0.0.0")
    (True, True, False)
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _send_json(send: _Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _BodyLimitMiddleware:
    """ASGI middleware: 413 for bodies over ``max_body_bytes``.

    The limit is checked on the ``Content-Length`` header and on the bytes actually
    received (chunked uploads have no header); the body is buffered and replayed.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self, size: str) -> dict[str, Any]:
        return {"detail": f"request body is {size} bytes; the limit is {self.max_body_bytes} bytes."}

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                n_declared = int(declared)
            except ValueError:
                await _send_json(send, 400, {"detail": f"Content-Length == {declared!r}, expected an integer."})
                return
            if n_declared > self.max_body_bytes:
                await _send_json(send, 413, self._too_large(str(n_declared)))
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await _send_json(send, 413, self._too_large(f"more than {total - len(chunk)}"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> _Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _check_limits(**limits: int) -> None:
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} == {value!r}, must be an int >= 1.")


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
) -> Any:
    """Build the FastAPI app serving one filter artifact (and optionally an index).

    Parameters
    ----------
    filter_path : str or Path
        JSON artifact written by ``ConformalFilter.save``; loaded once, here.
    api_key : str, optional
        When set, ``POST /filter`` requires ``Authorization: Bearer <key>`` or
        ``X-API-Key: <key>`` (401 otherwise; compared in constant time).
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

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ImportError
        FastAPI is not installed (extra ``server``), or LanceDB for ``index_path``.
    ArtifactError, ScorerMismatchError
        The artifact or the index cannot be loaded, or they do not match.
    """
    fastapi = require("fastapi", "server")
    require("pydantic", "server")
    _check_limits(max_body_bytes=max_body_bytes, max_snippets=max_snippets, max_k=max_k)
    if api_key is not None and not api_key:
        raise ValueError("api_key == '', must be a non-empty string or None.")

    flt = ConformalFilter.load(filter_path, scorer_options=scorer_options)
    artifact = read_artifact(filter_path)
    scorer_spec = flt.scorer.spec()
    lock: threading.Lock | None = (
        None if scorer_spec.get("scorer") in _THREAD_SAFE_SCORERS else threading.Lock()
    )
    index = _open_index(index_path, flt) if index_path is not None else None
    index_lock = threading.Lock()
    if warmup:
        flt.filter("warm-up", ["warm-up"])
        if index is not None:
            index.search("warm-up", k=1)
    tau = flt.threshold
    guarantee = flt.guarantee()
    filters: dict[int, ConformalFilter] = {flt.min_keep: flt}
    logger.info("serving %r from %s (lock=%s, index=%s)", flt, filter_path, lock is not None, index)

    def filter_for(min_keep: int | None) -> ConformalFilter:
        """The served filter with another ``min_keep`` (a few are kept for reuse)."""
        k = flt.min_keep if min_keep is None else min_keep
        use = filters.get(k)
        if use is None:
            use = ConformalFilter(flt.scorer, flt.calibrator, min_keep=k)
            if len(filters) < 64:
                filters[k] = use
        return use

    from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr  # after require()

    class SnippetIn(BaseModel):
        """A snippet with an identifier; ``snippet_id`` defaults to its position."""

        model_config = ConfigDict(extra="forbid")
        text: StrictStr
        snippet_id: StrictStr | None = None

    class FilterRequest(BaseModel):
        """One query and its retrieved snippets."""

        model_config = ConfigDict(extra="forbid")
        query: StrictStr = Field(min_length=1, description="The query (non-empty).")
        snippets: list[StrictStr | SnippetIn] = Field(
            description=f"Snippets as strings or objects; at most {max_snippets}."
        )
        min_keep: StrictInt | None = Field(
            default=None, ge=0, description="Keep at least this many best snippets (outside the guarantee)."
        )

    class KeptSnippet(BaseModel):
        index: int
        snippet_id: str
        text: str
        score: float

    class FilterResponse(BaseModel):
        kept: list[KeptSnippet]
        scores: list[float]
        threshold: float | None = Field(description="Calibrated tau; null means keep all.")
        removal: float
        note: str | None
        guarantee: dict[str, Any]

    class ArtifactInfo(BaseModel):
        format_version: int | None
        library_version: str | None
        created: str | None
        alpha: float
        threshold: float | None
        n_calibration: int
        min_keep: int
        scorer: dict[str, Any]

    class QueryRequest(BaseModel):
        """A query answered from the served index."""

        model_config = ConfigDict(extra="forbid")
        query: StrictStr = Field(min_length=1, description="The query (non-empty).")
        k: StrictInt = Field(default=20, ge=1, description=f"Snippets to retrieve; at most {max_k}.")
        min_keep: StrictInt | None = Field(
            default=None, ge=0, description="Keep at least this many best snippets (outside the guarantee)."
        )

    class HitOut(BaseModel):
        index: int
        snippet_id: str
        doc_id: str
        path: str
        start: int
        end: int
        text: str
        distance: float = Field(description="1 - cosine of the query and the stored snippet vector.")
        score: float = Field(description="The filter's nonconformity score (kept when <= threshold).")
        kept: bool

    class QueryResponse(BaseModel):
        hits: list[HitOut]
        n_kept: int
        threshold: float | None = Field(description="Calibrated tau; null means keep all.")
        removal: float
        note: str | None
        guarantee: dict[str, Any]

    class IndexInfo(BaseModel):
        path: str
        model: str
        n_snippets: int

    class Health(BaseModel):
        status: str
        library_version: str
        artifact: ArtifactInfo
        index: IndexInfo | None = None

    health = Health(
        status="ok",
        library_version=__version__,
        artifact=ArtifactInfo(
            format_version=artifact.get("format_version"),
            library_version=artifact.get("library_version"),
            created=artifact.get("created"),
            alpha=flt.alpha,
            threshold=None if math.isinf(tau) else tau,
            n_calibration=int(guarantee["n_calibration"]),
            min_keep=flt.min_keep,
            scorer=scorer_spec,
        ),
        index=None if index is None else IndexInfo(
            path=str(index.path), model=index.model_id, n_snippets=index.count()
        ),
    )

    key_bytes = api_key.encode() if api_key is not None else None

    def check_api_key(
        authorization: str | None = fastapi.Header(default=None),
        x_api_key: str | None = fastapi.Header(default=None),
    ) -> None:
        if key_bytes is None:
            return
        offered: list[str] = []
        if authorization and authorization[:7].lower() == "bearer ":
            offered.append(authorization[7:].strip())
        if x_api_key:
            offered.append(x_api_key)
        # compare every candidate (no short-circuit) in constant time
        ok = False
        for candidate in offered:
            ok |= hmac.compare_digest(candidate.encode(), key_bytes)
        if not ok:
            raise fastapi.HTTPException(
                status_code=401,
                detail="missing or invalid API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )

    app = fastapi.FastAPI(
        title="ragsieve",
        version=__version__,
        description="Conformal context filter: keeps the snippets whose score is <= the calibrated tau.",
    )

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return health

    @app.post("/filter", response_model=FilterResponse, dependencies=[fastapi.Depends(check_api_key)])
    def filter_snippets(request: FilterRequest) -> FilterResponse:
        if not request.query.strip():
            raise fastapi.HTTPException(status_code=422, detail="query is blank; expected a non-empty string.")
        n = len(request.snippets)
        if n > max_snippets:
            raise fastapi.HTTPException(
                status_code=413, detail=f"got {n} snippets; the limit is {max_snippets} per request."
            )
        items: list[Any] = [
            s if isinstance(s, str)
            else ({"text": s.text} if s.snippet_id is None else {"text": s.text, "snippet_id": s.snippet_id})
            for s in request.snippets
        ]
        use = filter_for(request.min_keep)
        if lock is None:
            res = use.filter(request.query, items)
        else:
            with lock:
                res = use.filter(request.query, items)
        return FilterResponse(
            kept=[KeptSnippet(index=s.index, snippet_id=s.snippet_id, text=s.text, score=s.score) for s in res.kept],
            scores=list(res.scores),
            threshold=None if math.isinf(res.threshold) else res.threshold,
            removal=res.removal,
            note=res.note,
            guarantee=guarantee,
        )

    @app.post("/query", response_model=QueryResponse, dependencies=[fastapi.Depends(check_api_key)])
    def query_index(request: QueryRequest) -> QueryResponse:
        if index is None:
            raise fastapi.HTTPException(
                status_code=404,
                detail="this service has no index; start it with `ragsieve serve --filter F --index DIR` "
                "or use POST /filter with your own snippets.",
            )
        if not request.query.strip():
            raise fastapi.HTTPException(status_code=422, detail="query is blank; expected a non-empty string.")
        if request.k > max_k:
            raise fastapi.HTTPException(status_code=413, detail=f"k == {request.k}; the limit is {max_k}.")
        with index_lock:
            hits, res = index.query_with_filter(request.query, filter_for(request.min_keep), k=request.k)
        kept = {s.index for s in res.kept}
        return QueryResponse(
            hits=[
                HitOut(index=i, snippet_id=h.snippet_id, doc_id=h.doc_id, path=h.path, start=h.start,
                       end=h.end, text=h.text, distance=h.score, score=res.scores[i], kept=i in kept)
                for i, h in enumerate(hits)
            ],
            n_kept=len(kept),
            threshold=None if math.isinf(res.threshold) else res.threshold,
            removal=res.removal,
            note=res.note,
            guarantee=guarantee,
        )

    app.add_middleware(_BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    app.state.filter = flt
    app.state.index = index
    return app


def _open_index(index_path: str | Path, flt: ConformalFilter) -> Any:
    """Open a served index, sharing the filter's loaded model, and check they match."""
    from .scoring import EmbeddingScorer
    from .store import SnippetIndex

    if not Path(index_path).is_dir():
        raise FileNotFoundError(f"index {str(index_path)!r} is not a directory; build one with `ragsieve index`.")
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
    **app_options
        The other options of :func:`create_app` (``max_body_bytes``, ``max_snippets``,
        ``scorer_options``, ``index_path``, ``max_k``).

    Raises
    ------
    ValueError
        ``host`` is not loopback and no API key is set.
    """
    if not api_key and not is_loopback_host(host):
        raise ValueError(
            f"host == {host!r} is not a loopback address and no API key is set; refusing to "
            "serve the filter unauthenticated on the network. Set an API key or bind to 127.0.0.1."
        )
    uvicorn = require("uvicorn", "server")
    app = create_app(filter_path, api_key=api_key, **app_options)
    logger.info("ragsieve server on http://%s:%d", host, port)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def api_key_from_env(name: str) -> str:
    """Read an API key from environment variable ``name`` (for the CLI).

    Raises
    ------
    ValueError
        The variable is unset or empty.
    """
    value = os.environ.get(name, "")
    if not value:
        raise ValueError(f"environment variable {name!r} is unset or empty; expected the API key.")
    return value
