"""Guards of the HTTP service: loopback check, API key, request-body limit and deadline."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any
from urllib.parse import urlsplit

import fastapi
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

__all__ = [
    "API_KEY_HEADER",
    "API_KEY_SCHEME",
    "BEARER_SCHEME",
    "BodyLimitMiddleware",
    "api_key_check",
    "api_key_from_env",
    "basic_password",
    "is_loopback_host",
    "is_same_origin",
]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]


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


#: The schemes ``/openapi.json`` declares (components.securitySchemes) for the API key.
BEARER_SCHEME = "bearerAuth"
API_KEY_SCHEME = "apiKeyHeader"
API_KEY_HEADER = "X-API-Key"


_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name=BEARER_SCHEME,
    description="The service's API key as 'Authorization: Bearer <key>'.",
)
_API_KEY_HEADER = APIKeyHeader(
    name=API_KEY_HEADER,
    auto_error=False,
    scheme_name=API_KEY_SCHEME,
    description="The service's API key as 'X-API-Key: <key>'.",
)
_BearerKey = Annotated[HTTPAuthorizationCredentials | None, fastapi.Security(_BEARER)]
_HeaderKey = Annotated[str | None, fastapi.Security(_API_KEY_HEADER)]


def basic_password(authorization: str | None) -> str | None:
    """The password of an ``Authorization: Basic`` header (None: no or a malformed one).

    Examples
    --------
    >>> basic_password("Basic " + base64.b64encode(b"me:s3cret").decode())
    's3cret'
    >>> basic_password("Bearer s3cret") is None
    True
    """
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _user, colon, password = decoded.partition(":")
    return password if colon else None


def is_same_origin(request: fastapi.Request) -> bool:
    """True when a browser says the request comes from the service's own origin.

    ``Sec-Fetch-Site: same-origin`` when the browser sends it; otherwise an ``Origin``
    header whose host is the request's ``Host``. A request with neither (curl, a script)
    is not same-origin.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() == "same-origin"
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if not origin or not host:
        return False
    return urlsplit(origin.strip()).netloc.lower() == host.strip().lower()


def api_key_check(api_key: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency: 401 unless the request carries ``api_key``.

    The key is accepted as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` and
    compared in constant time; with ``api_key=None`` every request passes. The two
    headers are read through FastAPI's security classes, so the OpenAPI schema declares
    both schemes (HTTP bearer, API-key header) and lists them on every protected route.
    The key as the password of ``Authorization: Basic`` (what a browser sends after the
    page at ``/`` asked for it) is accepted from same-origin requests only
    (:func:`is_same_origin`): elsewhere it is 403, so another site cannot use the
    browser's cached credentials.
    """
    key_bytes = api_key.encode() if api_key is not None else None

    async def check_api_key(request: fastapi.Request, credentials: _BearerKey,
                            x_api_key: _HeaderKey) -> None:
        if key_bytes is None:
            return
        offered: list[str] = []
        if credentials is not None:
            offered.append(credentials.credentials.strip())
        if x_api_key:
            offered.append(x_api_key)
        password = basic_password(request.headers.get("authorization"))
        if password is not None:
            if not is_same_origin(request):
                raise fastapi.HTTPException(
                    status_code=403,
                    detail="Basic credentials are accepted only from the service's page at / "
                    "(same-origin requests); send 'Authorization: Bearer <key>' or "
                    "'X-API-Key: <key>'.")
            offered.append(password)
        ok = False  # compare every candidate (no short-circuit) in constant time
        for candidate in offered:
            ok |= hmac.compare_digest(candidate.encode(), key_bytes)
        if not ok:
            raise fastapi.HTTPException(
                status_code=401,
                detail="missing or invalid API key: send 'Authorization: Bearer <key>' "
                "or 'X-API-Key: <key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_api_key


async def _send_json(send: _Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """ASGI middleware: 413 for bodies over ``max_body_bytes``, 408 for slow bodies.

    The limit is checked on the ``Content-Length`` header and on the bytes actually
    received (chunked uploads have no header); the body is buffered once and replayed
    (the middleware keeps no copy of it while the request is served). A body that has
    not fully arrived ``body_timeout`` seconds after the request head gets 408 and the
    connection is closed.
    """

    def __init__(self, app: Any, max_body_bytes: int, body_timeout: float = 60.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    def _too_large(self, size: str) -> dict[str, Any]:
        return {
            "detail": f"request body is {size} bytes; the limit is {self.max_body_bytes} bytes."
        }

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                n_declared = int(declared)
            except ValueError:
                detail = f"Content-Length == {declared!r}, expected an integer."
                await _send_json(send, 400, {"detail": detail})
                return
            if n_declared > self.max_body_bytes:
                await _send_json(send, 413, self._too_large(str(n_declared)))
                return
        try:
            body = await asyncio.wait_for(self._read_body(receive, send), self.body_timeout)
        except TimeoutError:
            detail = (
                f"request body not complete {self.body_timeout:g} s after the request head; "
                "send the head and the whole body at once."
            )
            await _send_json(send, 408, {"detail": detail})
            return
        if body is None:
            return
        pending: list[bytes] = [body]
        del body  # only the replayed message holds the body from here on

        async def replay() -> _Message:
            if pending:
                return {"type": "http.request", "body": pending.pop(), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, receive: _Receive, send: _Send) -> bytes | None:
        """The whole body, or None after answering 413 (or on disconnect)."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await _send_json(send, 413, self._too_large(f"more than {total - len(chunk)}"))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
