"""The service's page at ``GET /``: a form over ``POST /filter``, a form over ``POST /query``
when the service serves an index, the guarantee, the keep rule, the drift state and the
last requests' removal.

The HTML (``page.html`` beside this module) is one file with its CSS and JS inline; each
answer carries a fresh nonce in a strict Content-Security-Policy (``default-src 'none'``,
``connect-src 'self'``), so the page loads nothing but itself and talks to nothing but the
service. It reads ``GET /status`` for what it shows and ``GET /healthz`` for whether an
index is served (without one the index form is removed). The JS renders every value with
``textContent`` (snippets are untrusted text), and one function (``scoreCells``) renders
the score cells of a kept or removed snippet of either form.

When the service has an API key the page is behind it: the key is accepted as the password
of HTTP Basic (any user name) as well as the API's own headers, and a request without a
valid key gets 401 with ``WWW-Authenticate: Basic realm="ragsieve"``, so a browser asks for
it. The page's JS never holds the key: its ``fetch`` calls are same-origin and carry the
browser's Basic credentials, which the API accepts from same-origin requests only
(:func:`~ragsieve.server.security.api_key_check`).
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import cache
from importlib import resources

import fastapi
from fastapi.responses import HTMLResponse

from .._validation import check_int
from .schemas import RecentRequest
from .security import API_KEY_HEADER, basic_password

__all__ = ["DEFAULT_RECENT", "RecentRequests", "page_key_check", "page_response"]

#: Requests remembered for the page's "last requests" table (per process).
DEFAULT_RECENT = 50

#: The challenge of ``GET /`` without a valid key: a browser prompts for user and password.
BASIC_CHALLENGE = 'Basic realm="ragsieve"'


class RecentRequests:
    """A bounded ring of the last answered requests' kept and total counts.

    Only counts, the endpoint and the time are kept (no query, no snippet, no id); the
    oldest entry drops out when ``capacity`` is reached. Thread-safe.

    Examples
    --------
    >>> ring = RecentRequests(capacity=2)
    >>> for kept in (1, 2, 3):
    ...     ring.add("/filter", kept=kept, total=4)
    >>> [r.kept for r in ring.snapshot()]
    [2, 3]
    """

    def __init__(self, capacity: int = DEFAULT_RECENT) -> None:
        self.capacity = capacity = check_int(capacity, "capacity", min_value=1)
        self._items: deque[RecentRequest] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, endpoint: str, *, kept: int, total: int) -> None:
        """Remember one answered request: ``kept`` of ``total`` snippets kept."""
        item = RecentRequest(time=datetime.now(UTC).isoformat(timespec="seconds"),
                             endpoint=endpoint, kept=int(kept), total=int(total))
        with self._lock:
            self._items.append(item)

    def snapshot(self) -> list[RecentRequest]:
        """The remembered requests, oldest first."""
        with self._lock:
            return list(self._items)


@cache
def _template() -> str:
    return (resources.files(__package__) / "page.html").read_text(encoding="utf-8")


def _policy(nonce: str) -> str:
    return "; ".join([
        "default-src 'none'",
        f"script-src 'nonce-{nonce}'",
        f"style-src 'nonce-{nonce}'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])


def page_response() -> HTMLResponse:
    """The page, with a fresh nonce in its Content-Security-Policy and no caching."""
    nonce = secrets.token_urlsafe(18)
    html = _template().replace("{{NONCE}}", nonce)
    return HTMLResponse(html, headers={
        "Content-Security-Policy": _policy(nonce),
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    })


def page_key_check(api_key: str | None) -> Callable[[fastapi.Request], Awaitable[None]]:
    """A FastAPI dependency of ``GET /``: 401 with a Basic challenge unless the request
    carries ``api_key`` (Basic password, ``Authorization: Bearer`` or ``X-API-Key``).

    With ``api_key=None`` every request passes, as on the API routes.
    """
    key_bytes = api_key.encode() if api_key is not None else None

    async def check_page_key(request: fastapi.Request) -> None:
        if key_bytes is None:
            return
        offered = [request.headers.get(API_KEY_HEADER, "")]
        authorization = request.headers.get("authorization", "")
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            offered.append(value.strip())
        password = basic_password(authorization)
        if password is not None:
            offered.append(password)
        ok = False  # compare every candidate (no short-circuit) in constant time
        for candidate in offered:
            ok |= bool(candidate) and hmac.compare_digest(candidate.encode(), key_bytes)
        if not ok:
            raise fastapi.HTTPException(
                status_code=401,
                detail="missing or invalid API key: give it as the password (any user name), "
                "or send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'.",
                headers={"WWW-Authenticate": BASIC_CHALLENGE})

    return check_page_key
