"""Strict JSON request bodies and JSON error answers that can always be encoded.

A request body is parsed once, here, as RFC 8259 JSON by the parser the data readers use
too (:func:`ragsieve._validation.loads_json`): UTF-8 only, no ``NaN`` / ``Infinity``
literals, no duplicate keys, no lone surrogates (``"\\ud800"``), at most 64 levels of
nesting (refused before the parser recurses), every number a finite double (no 400-digit
integer). Anything else is refused with 422 and a one-line ``detail`` naming the field
(``snippets[0].text``), what was received and what is expected, so no malformed string or
number reaches the validation, the filter, the log or the response encoder. The error handlers echo request values only
after making them printable (surrogates escaped, non-finite numbers as null, long values
clipped), so an error answer itself can never fail to encode (never a 500). An error no
handler expected is answered by :class:`UnexpectedErrorMiddleware` inside the app, so the
connection it came on stays open for the next request.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import fastapi
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._sqlite import is_busy
from .._validation import loads_json

__all__ = [
    "BodyError",
    "StrictJSONRoute",
    "UnexpectedErrorMiddleware",
    "http_error_handler",
    "parse_json_body",
    "printable",
    "safe_echo",
    "unexpected_error_handler",
    "validation_error_handler",
]

logger = logging.getLogger(__name__)

#: Longest string echoed back in an error (characters).
_ECHO_CHARS = 200
#: Longest one-line ``detail`` of a route's own error (characters): the service's own words,
#: which may hold a file path before the reason, so longer than an echo of client input
#: (which the detail holds already clipped, by :func:`safe_echo`).
_DETAIL_CHARS = 2000
#: Longest message of one validation error (characters): a validator's own words, which
#: hold the value they refuse clipped (an id to 60 characters) and the rule.
_MESSAGE_CHARS = 500
#: Most items of a list or object echoed back in an error.
_ECHO_ITEMS = 20
#: Deepest nesting echoed back in an error.
_ECHO_DEPTH = 4
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyError(ValueError):
    """A request body that is not strict JSON (answered 422)."""


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``), so it always encodes as UTF-8.

    Examples
    --------
    >>> printable("a\\ud800b")
    'a\\\\ud800b'
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def parse_json_body(body: bytes) -> Any:
    """Parse a request body as strict JSON.

    Parameters
    ----------
    body : bytes
        The raw body.

    Returns
    -------
    Any
        The parsed value (a dict for every valid request of this service).

    Raises
    ------
    BodyError
        The body is not UTF-8, not JSON, nested more than 64 deep, has a number beyond
        the range of a double, a ``NaN`` / ``Infinity`` literal, a duplicate key or a
        lone surrogate; the message names the field by its path.

    Examples
    --------
    >>> parse_json_body(b'{"query": "x", "k": 3}')
    {'query': 'x', 'k': 3}
    >>> parse_json_body(b'{"k": NaN}')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ragsieve.server.parsing.BodyError: NaN is not valid JSON: numbers must be finite ...
    >>> parse_json_body(b'{"snippets": [{"text": "a", "bm25": 1' + b'0' * 400 + b'}]}')
    Traceback (most recent call last):
    ...
    ragsieve.server.parsing.BodyError: snippets[0].bm25 == an integer of 401 digits: a JSON number must be finite and within +-1.8e308 (a double).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            f"body is not valid UTF-8 (byte {exc.start}: {body[exc.start : exc.start + 1]!r}); "
            "send JSON encoded as UTF-8."
        ) from None
    text = text.removeprefix("\ufeff")  # a byte order mark may be ignored (RFC 8259, 8.1)
    try:
        return loads_json(text, "body")
    except json.JSONDecodeError as exc:
        raise BodyError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from None
    except ValueError as exc:
        raise BodyError(printable(str(exc))) from None


class _StrictJSONRequest(fastapi.Request):
    """A request whose ``json()`` is :func:`parse_json_body` (422 on a bad body)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json_body(await self.body())
            except BodyError as exc:
                logger.info("request refused (422): %s", exc)
                raise fastapi.HTTPException(status_code=422, detail=str(exc)) from None
        return self._json


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class StrictJSONRoute(APIRoute):
    """A route reading its JSON body with :func:`parse_json_body`.

    A route with a body also refuses any other ``Content-Type`` with 415.
    """

    def get_route_handler(self) -> Callable[[fastapi.Request], Coroutine[Any, Any, Any]]:
        handler = super().get_route_handler()
        needs_json = self.body_field is not None

        async def strict_handler(request: fastapi.Request) -> Any:
            if needs_json and not _is_json(request.headers.get("content-type")):
                got = request.headers.get("content-type")
                raise fastapi.HTTPException(
                    status_code=415,
                    detail=f"Content-Type == {printable(repr(got)[:_ECHO_CHARS])}; "
                    "expected 'application/json' (a UTF-8 JSON object).",
                )
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def _clipped(text: str, limit: int) -> str:
    """``text`` printable, cut at ``limit`` characters (``...`` says it was cut)."""
    return printable(text[:limit] + ("..." if len(text) > limit else ""))


def safe_echo(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that always encodes: for echoing request input in errors.

    Strings have lone surrogates escaped and are clipped to 200 characters, bytes are
    decoded (invalid UTF-8 escaped), non-finite floats become null, very long integers
    a description, lists and objects keep their first 20 items and 4 levels, and any
    other object becomes its ``str``.

    Examples
    --------
    >>> safe_echo({"a": [float("nan"), "x\\udc00"], "b": b"\\xff"})
    {'a': [None, 'x\\\\udc00'], 'b': '\\\\xff'}
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 10**30 else f"<an integer of {len(str(abs(value)))} digits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: _ECHO_CHARS * 4]).decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        return _clipped(value, _ECHO_CHARS)
    if depth >= _ECHO_DEPTH:
        return "..."
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {
            printable(str(k))[:_ECHO_CHARS]: safe_echo(v, depth + 1) for k, v in items[:_ECHO_ITEMS]
        }
        if len(items) > _ECHO_ITEMS:
            out["..."] = f"{len(items) - _ECHO_ITEMS} more keys"
        return out
    if isinstance(value, (list, tuple)):
        out_list = [safe_echo(v, depth + 1) for v in value[:_ECHO_ITEMS]]
        if len(value) > _ECHO_ITEMS:
            out_list.append(f"... {len(value) - _ECHO_ITEMS} more items")
        return out_list
    return printable(str(value))[:_ECHO_CHARS]


def _json_response(status: int, detail: Any, headers: Mapping[str, str] | None = None) -> Any:
    try:
        return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)
    except (ValueError, TypeError):  # cannot happen after safe_echo; never answer 500 for it
        logger.exception("could not encode the error detail of a %d answer", status)
        return JSONResponse(
            status_code=status, content={"detail": "invalid request"}, headers=headers
        )


def _message(msg: Any) -> Any:
    """A validation message: the service's own words (its values already clipped), so
    clipped at ``_MESSAGE_CHARS``, not at an echo's 200 characters."""
    return _clipped(msg, _MESSAGE_CHARS) if isinstance(msg, str) else safe_echo(msg)


async def validation_error_handler(
    request: fastapi.Request, exc: RequestValidationError
) -> JSONResponse:
    """422 with FastAPI's list of errors, their ``input`` and ``ctx`` made printable."""
    errors = []
    for err in exc.errors():
        out = {
            "type": safe_echo(err.get("type")),
            "loc": [safe_echo(part) for part in err.get("loc", ())],
            "msg": _message(err.get("msg")),
            "input": safe_echo(err.get("input")),
        }
        if err.get("ctx"):
            out["ctx"] = safe_echo(err["ctx"])
        errors.append(out)
    return _json_response(422, errors)  # type: ignore[no-any-return]


async def http_error_handler(request: fastapi.Request, exc: StarletteHTTPException) -> JSONResponse:
    """The route's error (401, 404, 413, 415, 422) as ``{"detail": ...}``, printable (a
    string detail clipped at ``_DETAIL_CHARS``, anything else as :func:`safe_echo` echoes it)."""
    detail = exc.detail
    shown = _clipped(detail, _DETAIL_CHARS) if isinstance(detail, str) else safe_echo(detail)
    return _json_response(  # type: ignore[no-any-return]
        exc.status_code, shown, getattr(exc, "headers", None)
    )


#: Seconds a client is told to wait (``Retry-After``) when the service's state file is busy.
BUSY_RETRY_AFTER = 2


async def unexpected_error_handler(request: fastapi.Request, exc: Exception) -> JSONResponse:
    """A bug: 500 with a JSON ``detail`` (the traceback goes to the server log).

    A busy or locked state file is no bug: 503 with ``Retry-After`` (nothing was
    acknowledged, so the client may send the request again).
    """
    if is_busy(exc):
        logger.warning("state file busy (%s): answered 503", exc)
        return _json_response(  # type: ignore[no-any-return]
            503, "the service's state file is busy (locked by another writer); nothing was "
                 f"stored, retry after {BUSY_RETRY_AFTER} s.",
            {"Retry-After": str(BUSY_RETRY_AFTER)})
    return _json_response(  # type: ignore[no-any-return]
        500, "internal server error; the server log has the details."
    )


class UnexpectedErrorMiddleware:
    """ASGI middleware, innermost: an exception no route handled is answered here with
    :func:`unexpected_error_handler` (500, or 503 for a busy state file) and logged, and
    the keep-alive connection stays open.

    Starlette's own last-resort handler sends the same answer and then re-raises, and
    uvicorn closes a connection whose application raised: the client's next request on
    it was reset. An exception raised after the answer has started is re-raised (the
    answer cannot be replaced).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            if not is_busy(exc):
                logger.error("unexpected error answering %s %s", scope.get("method"),
                             scope.get("path"), exc_info=exc)
            response = await unexpected_error_handler(fastapi.Request(scope), exc)
            await response(scope, receive, send)
