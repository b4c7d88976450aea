"""Guards of the HTTP service: loopback check, API key, request-body limit."""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import fastapi

__all__ = ["BodyLimitMiddleware", "api_key_check", "api_key_from_env", "is_loopback_host"]

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


def api_key_check(api_key: str | None) -> Callable[..., None]:
    """A FastAPI dependency: 401 unless the request carries ``api_key``.

    The key is accepted as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` and
    compared in constant time; with ``api_key=None`` every request passes.
    """
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
    """ASGI middleware: 413 for bodies over ``max_body_bytes``.

    The limit is checked on the ``Content-Length`` header and on the bytes actually
    received (chunked uploads have no header); the body is buffered and replayed.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

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
        body = await self._read_body(receive, send)
        if body is None:
            return
        replayed = False

        async def replay() -> _Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
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
