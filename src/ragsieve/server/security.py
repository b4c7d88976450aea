"""Guards of the HTTP service: Host check, cross-site refusal, API key, body limits.

Every request passes, outermost first: :class:`HostCheckMiddleware` (the ``Host`` header
must name the service: no DNS rebinding), :class:`CrossSiteGuard` (a request that changes
state must come from the service's own origin and carry JSON or the client header
``X-Ragsieve``, which no cross-site form or ``no-cors`` fetch can send),
:class:`APIKeyMiddleware` (the API key, from the request head, before any byte of the body
is reserved or read) and :class:`BodyLimitMiddleware` (the per-request body cap, deadline
and idle timeout, and caps on the bytes being received across all connections and per
client address); then the routes' API-key check (:func:`api_key_check`: the same
comparison, :func:`key_refusal`, which also declares the schemes in the OpenAPI schema).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

import fastapi
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

__all__ = [
    "API_KEY_HEADER",
    "API_KEY_SCHEME",
    "BEARER_SCHEME",
    "CLIENT_HEADER",
    "APIKeyMiddleware",
    "BodyLimitMiddleware",
    "CrossSiteGuard",
    "HostCheckMiddleware",
    "HostPolicy",
    "api_key_check",
    "api_key_from_env",
    "basic_password",
    "check_allowed_hosts",
    "cross_site_refusal",
    "is_loopback_host",
    "is_same_origin",
    "key_refusal",
    "same_origin",
    "split_host",
]

logger = logging.getLogger(__name__)

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


#: Host names every loopback service answers to (besides the address it is bound to).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: Bind addresses that mean "every interface": no Host names anyone would use.
_WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: A DNS name or IPv4 address (lower case), with the characters Docker / Kubernetes use.
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*)(?:\.[a-z0-9_-]+)*\.?")
_PORT = re.compile(r"[0-9]{1,5}")


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header or a ``host[:port]`` (the name in lower case, an
    IPv6 address without its brackets, port None when absent), or None when malformed.

    Examples
    --------
    >>> split_host("LocalHost:8000"), split_host("[::1]"), split_host("a.example:x")
    (('localhost', 8000), ('::1', None), None)
    """
    text = value.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        if not bracket:
            return None
    else:
        name, colon, port_text = text.partition(":")
        rest = colon + port_text
        if len(name) > 253 or not _NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    if rest[0] != ":" or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return name, int(rest[1:])


def _shown(name: str, port: int | None = None) -> str:
    """``name[:port]`` as in a Host header (an IPv6 address in brackets)."""
    text = f"[{name}]" if ":" in name else name
    return text if port is None else f"{text}:{port}"


def check_allowed_hosts(value: Any) -> tuple[str, ...]:
    """``--allowed-hosts`` as a tuple of ``host[:port]`` entries (or ``("*",)``).

    Accepts a comma-separated string or a sequence of strings; entries are stripped and
    lower-cased, empty ones dropped.

    Raises
    ------
    TypeError
        Not a string or a sequence of strings.
    ValueError
        An entry that is no host name, IP address or ``host:port`` (``*`` is the only
        pattern).

    Examples
    --------
    >>> check_allowed_hosts("A.example, b.example:8443")
    ('a.example', 'b.example:8443')
    """
    if isinstance(value, str):
        items: Sequence[Any] = value.split(",")
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise TypeError("allowed_hosts must be a comma-separated str or a sequence of str "
                        f"(e.g. 'a.example,b.example:8443'), got {type(value).__name__}.")
    out: list[str] = []
    for item in (v.strip().lower() for v in items):
        if not item:
            continue
        if item != "*" and split_host(item) is None:
            raise ValueError(f"allowed_hosts: {item[:200]!r} is not a host name, IP address or "
                             "host:port (e.g. 'ragsieve.example', '10.0.0.5:8000', "
                             "'[::1]'; '*' answers to any Host, unsafe).")
        out.append(item)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` values a service answers to (a guard against DNS rebinding).

    The names of the address it is bound to (``bound``), and the address and port each
    connection arrived on (from the server, never from the client); ``localhost``,
    ``127.0.0.1`` and ``[::1]`` when either is a loopback address. A Host with a port must
    name the port the connection arrived on. ``allowed`` adds names (``host`` with any
    port, ``host:port`` that port only); ``*`` answers to any Host.

    Examples
    --------
    >>> policy = HostPolicy.of("127.0.0.1", ())
    >>> policy.accepts("localhost:8000", ("127.0.0.1", 8000))
    True
    >>> policy.accepts("attacker.example:8000", ("127.0.0.1", 8000))
    False
    """

    bound: str
    allowed: tuple[tuple[str, int | None], ...] = ()
    any_host: bool = False

    @classmethod
    def of(cls, host: str, allowed_hosts: Iterable[str]) -> HostPolicy:
        """The policy of a service bound to ``host`` with ``--allowed-hosts``."""
        entries = check_allowed_hosts(tuple(allowed_hosts))
        parsed = tuple(split_host(e) for e in entries if e != "*")
        bound = host.strip().lower().strip("[]")
        return cls(bound, tuple(p for p in parsed if p is not None), "*" in entries)

    def names(self, server: tuple[str, int] | None) -> list[str]:
        """The host names accepted on a connection that arrived at ``server``."""
        names = [] if self.bound in _WILDCARD_BINDS else [self.bound]
        local = (server[0] or "").lower() if server else ""
        if local:
            names.append(local)
            mapped = _ipv4_mapped(local)  # a dual-stack socket's view of an IPv4 client
            if mapped:
                names.append(mapped)
        if is_loopback_host(self.bound) or (local and is_loopback_host(local)):
            names.extend(LOOPBACK_NAMES)
        return list(dict.fromkeys(names))

    def accepts(self, host: str | None, server: tuple[str, int] | None) -> bool:
        """Whether a request with ``Host: host`` that arrived at ``server`` is answered."""
        if self.any_host:
            return True
        parsed = split_host(host or "")
        if parsed is None:
            return False
        name, port = parsed
        if any(name == n and (p is None or p == port) for n, p in self.allowed):
            return True
        local_port = server[1] if server else None
        return name in self.names(server) and (port is None or local_port is None
                                               or port == local_port)

    def refusal(self, host: str | None, server: tuple[str, int] | None) -> str:
        """The one-line 400 detail for a Host this policy refuses."""
        if host is None:
            got = "no Host header"
        else:
            got = f"Host {host[:200]!r}"
            if split_host(host) is None:
                got += " (not a host[:port])"
        names = [_shown(n) for n in self.names(server)] + [_shown(n, p) for n, p in self.allowed]
        port = f" on port {server[1]}" if server else ""
        return (f"{got} is not one this service answers to: it answers to "
                f"{', '.join(names) or 'no name'}{port}; add the name it is reached by with "
                "--allowed-hosts (ServeOptions.allowed_hosts).")


def _ipv4_mapped(address: str) -> str | None:
    """``10.0.0.5`` for ``::ffff:10.0.0.5``, else None."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return None if mapped is None else str(mapped)


def _server(scope: _Scope) -> tuple[str, int] | None:
    server = scope.get("server")
    if not server or server[1] is None:
        return None
    return str(server[0]), int(server[1])


def _header(scope: _Scope, name: bytes) -> str | None:
    """The first ``name`` header of ``scope`` (latin-1 decoded, as Starlette does)."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class HostCheckMiddleware:
    """ASGI middleware: 400 unless the ``Host`` header names the service (:class:`HostPolicy`).

    A page of another site whose name was rebound to the service's address (DNS
    rebinding) sends its own name as Host, and is refused before anything else runs.
    """

    def __init__(self, app: Any, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "http" and not self.policy.any_host:
            host = _header(scope, b"host")
            server = _server(scope)
            if not self.policy.accepts(host, server):
                detail = self.policy.refusal(host, server)
                logger.info("request refused (400): %s", detail)
                await _send_json(send, 400, {"detail": detail})
                return
        await self.app(scope, receive, send)


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


def same_origin(origin: str, scheme: str, host: str | None) -> bool:
    """True when ``origin`` (an ``Origin`` header) is ``scheme://host``: scheme, host name
    and port all equal (a missing port is the scheme's default: 80, 443).

    Examples
    --------
    >>> same_origin("http://127.0.0.1:8000", "http", "127.0.0.1:8000")
    True
    >>> same_origin("https://127.0.0.1:8000", "http", "127.0.0.1:8000")  # another scheme
    False
    >>> same_origin("http://127.0.0.1", "http", "127.0.0.1:80"), same_origin("null", "http", "x")
    (True, False)
    """
    own = split_host(host or "")
    if own is None:
        return False
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:  # a port that is no number
        return False
    name = (parts.hostname or "").lower()
    if not name or parts.path or parts.query or parts.fragment or parts.username is not None:
        return False
    scheme = scheme.lower()
    default = _DEFAULT_PORTS.get(scheme)
    return (parts.scheme.lower() == scheme and name == own[0]
            and (port or default) == (own[1] or default))


def is_same_origin(request: fastapi.Request) -> bool:
    """True when a browser says the request comes from the service's own origin.

    ``Sec-Fetch-Site: same-origin`` when the browser sends it, and an ``Origin`` header, when
    sent, equal to the service's own origin (scheme, host and port: :func:`same_origin`).
    A request with neither header (curl, a script) is not same-origin.
    """
    return _same_origin_headers(request.headers, request.scope.get("scheme", "http"))


def _same_origin_headers(headers: Any, scheme: str) -> bool:
    """:func:`is_same_origin` of a request's headers (a case-insensitive mapping)."""
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    if site is None and origin is None:
        return False
    if site is not None and site.strip().lower() != "same-origin":
        return False
    return origin is None or same_origin(origin, scheme, headers.get("host"))


#: The 401 detail of a request without the key (or with another one).
_NO_KEY = ("missing or invalid API key: send 'Authorization: Bearer <key>' or "
           "'X-API-Key: <key>'.")
#: The 403 detail of the key as a Basic password from another origin.
_BASIC_ELSEWHERE = ("Basic credentials are accepted only from the service's page at / "
                    "(same-origin requests); send 'Authorization: Bearer <key>' or "
                    "'X-API-Key: <key>'.")


def key_refusal(headers: Any, scheme: str, key: bytes) -> tuple[int, str] | None:
    """Why a request's head does not carry the API key ``key`` (status, one-line detail), or
    None when it does: the one comparison of the middleware and the routes' dependency.

    The key is accepted as ``Authorization: Bearer <key>``, ``X-API-Key: <key>`` or, from
    same-origin requests only (:func:`is_same_origin`; elsewhere 403), as the password of
    ``Authorization: Basic``; every candidate is compared in constant time
    (``hmac.compare_digest``). ``headers`` is a case-insensitive mapping.

    Examples
    --------
    >>> key_refusal({"x-api-key": "s3cret"}, "http", b"s3cret") is None
    True
    >>> key_refusal({}, "http", b"s3cret")[0]
    401
    """
    offered: list[str] = []
    authorization = headers.get("authorization") or ""
    scheme_name, _, credentials = authorization.partition(" ")
    if scheme_name.lower() == "bearer" and credentials.strip():
        offered.append(credentials.strip())
    x_api_key = headers.get(API_KEY_HEADER.lower())
    if x_api_key:
        offered.append(x_api_key)
    password = basic_password(authorization)
    if password is not None:
        if not _same_origin_headers(headers, scheme):
            return 403, _BASIC_ELSEWHERE
        offered.append(password)
    ok = False  # compare every candidate (no short-circuit) in constant time
    for candidate in offered:
        ok |= hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), key)
    return None if ok else (401, _NO_KEY)


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
        del credentials, x_api_key  # declared for the OpenAPI schema; read by key_refusal
        if key_bytes is None:
            return
        refused = key_refusal(request.headers, request.scope.get("scheme", "http"), key_bytes)
        if refused is not None:
            status, detail = refused
            raise fastapi.HTTPException(status_code=status, detail=detail,
                                        headers=_challenge(status))

    return check_api_key


def _challenge(status: int) -> dict[str, str] | None:
    return {"WWW-Authenticate": "Bearer"} if status == 401 else None


class APIKeyMiddleware:
    """ASGI middleware: 401 (403 for Basic credentials from another origin) unless the
    request head carries the API key (:func:`key_refusal`), before its body is reserved or
    read, so clients without the key cannot hold any of the receiving caps.

    Every path but ``open_paths`` (``/healthz``; the page ``/``, which asks for the key
    itself) needs the key, unknown paths included: they would reserve their body too.
    """

    def __init__(self, app: Any, api_key: str, open_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.key = api_key.encode()
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            refused = key_refusal(fastapi.Request(scope).headers, scope.get("scheme", "http"),
                                  self.key)
            if refused is not None:
                status, detail = refused
                logger.info("request refused (%d): %s %s without the API key", status,
                            scope.get("method"), _clip(scope["path"]))
                await _send_json(send, status, {"detail": detail}, _challenge(status))
                return
        await self.app(scope, receive, send)


async def _send_json(send: _Send, status: int, payload: dict[str, Any],
                     headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


#: Methods that change nothing: never refused as cross-site.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The header a program may send instead of a JSON body on a route without one (``POST
#: /admin/reload``, ``/admin/monitor/reset``): a browser sends it only after a CORS
#: preflight, which the service never grants, so no other site can.
CLIENT_HEADER = "X-Ragsieve"
#: ``Sec-Fetch-Site`` values of a request the service's own page (or the user) made.
_OWN_SITES = frozenset({"same-origin", "none"})


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


def _clip(value: str) -> str:
    return repr(value[:200])


def cross_site_refusal(method: str, path: str, headers: Any,
                       scheme: str) -> tuple[int, str] | None:
    """Why a request that changes state is refused (status, one-line detail), or None.

    Refused with 403: ``Sec-Fetch-Site`` other than ``same-origin`` (or ``none``), or an
    ``Origin`` that is not the service's own (scheme, host and port,
    :func:`same_origin`). Refused with 415: neither a JSON ``Content-Type`` nor a header
    only a program can send (``X-Ragsieve``, ``X-API-Key``, ``Authorization: Bearer``):
    what a cross-site ``<form>`` or ``fetch(..., {mode: "no-cors"})`` sends. ``headers``
    is a case-insensitive mapping (Starlette's ``Headers``).
    """
    route = f"{method} {path}"
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in _OWN_SITES:
        return 403, (f"{route} refused: Sec-Fetch-Site == {_clip(site)}; a request that "
                     "changes state is accepted from the service's own origin only "
                     "(Sec-Fetch-Site: same-origin), never from another site or port.")
    origin = headers.get("origin")
    host = headers.get("host")
    if origin is not None and not same_origin(origin, scheme, host):
        own = f"{scheme}://{host}" if host else f"{scheme}://<no Host>"
        return 403, (f"{route} refused: Origin == {_clip(origin)} is not the service's own "
                     f"origin {_clip(own)} (scheme, host and port must all match); a request "
                     "that changes state is accepted from the service's own origin only.")
    content_type = headers.get("content-type")
    bearer = (headers.get("authorization") or "").strip().lower().startswith("bearer ")
    if _is_json(content_type) or bearer or headers.get(CLIENT_HEADER) is not None \
            or headers.get(API_KEY_HEADER) is not None:
        return None
    got = "no Content-Type" if content_type is None else f"Content-Type == {_clip(content_type)}"
    return 415, (f"{route} needs 'Content-Type: application/json' or the header "
                 f"'{CLIENT_HEADER}: 1' (a program's request; a cross-site form or no-cors "
                 f"fetch can send neither); got {got}.")


class CrossSiteGuard:
    """ASGI middleware: requests that change state are refused unless a program or the
    service's own page sent them (:func:`cross_site_refusal`), before their body is read.

    A request changes state when its method is not GET / HEAD / OPTIONS and a route of
    ``routes`` takes that method at that path (``POST /filter``, ``/query``,
    ``/feedback``, ``/admin/reload``, ``/admin/monitor/reset`` and any route added later);
    other requests pass untouched (a ``PUT /`` still gets its 405).
    """

    def __init__(self, app: Any, routes: Sequence[Any]) -> None:
        self.app = app
        self.routes = routes  # the app's route list, read at each request

    def _changes_state(self, method: str, path: str) -> bool:
        if method in SAFE_METHODS:
            return False
        for route in self.routes:
            methods = getattr(route, "methods", None)
            regex = getattr(route, "path_regex", None)
            if methods and method in methods and regex is not None and regex.match(path):
                return True
        return False

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "http" and self._changes_state(scope["method"], scope["path"]):
            headers = fastapi.Request(scope).headers
            refused = cross_site_refusal(scope["method"], scope["path"], headers,
                                         scope.get("scheme", "http"))
            if refused is not None:
                status, detail = refused
                logger.info("request refused (%d): %s", status, detail)
                await _send_json(send, status, {"detail": detail})
                return
        await self.app(scope, receive, send)


#: ``max_receiving_bytes`` when not given: this many times ``max_body_bytes``.
RECEIVING_FACTOR = 4
#: Seconds a request refused by the receiving cap is told to wait (``Retry-After``).
RECEIVING_RETRY_AFTER = 2
#: ``max_receiving_per_client`` when not given: this many times ``max_body_bytes`` (and at
#: most ``max_receiving_bytes``), so one address never holds the whole receiving cap.
PER_CLIENT_FACTOR = 2
#: Seconds a body may go without a byte arriving before 408 (``--body-idle-timeout``).
BODY_IDLE_TIMEOUT = 10.0


async def _retry_later(send: _Send, status: int, detail: str) -> None:
    """Refuse a body the receiving caps cannot hold now: ``status`` (503 for the service's
    cap, 429 for one client's), logged, with ``Retry-After``."""
    logger.warning("request refused (%d): %s", status, detail)
    await _send_json(send, status, {"detail": detail},
                     {"Retry-After": str(RECEIVING_RETRY_AFTER)})


class _Held:
    """Bytes one request (of client address ``client``) holds of the receiving caps."""

    __slots__ = ("client", "n")

    def __init__(self, client: str) -> None:
        self.client = client
        self.n = 0


class BodyLimitMiddleware:
    """ASGI middleware: 413 for bodies over ``max_body_bytes``, 408 for slow or idle bodies,
    503 when the bodies being received at once would pass ``max_receiving_bytes``, 429 when
    one client address would hold more than ``max_receiving_per_client`` of them.

    The limit is checked on the ``Content-Length`` header and on the bytes actually
    received (chunked uploads have no header); the body is buffered once and replayed
    (the middleware keeps no copy of it while the request is served). A body that has
    not fully arrived ``body_timeout`` seconds after the request head, or that goes
    ``body_idle_timeout`` seconds without a byte, gets 408 and the connection is closed.

    The receiving cap holds across all connections of this process: a request reserves its
    ``Content-Length`` before its first byte is read (a chunked one reserves each chunk as
    it arrives) and gives it back once its body is read, refused or timed out. A request
    that would take the reserved total over ``max_receiving_bytes`` gets 503 with
    ``Retry-After`` before its body is read, so slow uploads hold at most that much memory.
    """

    def __init__(self, app: Any, max_body_bytes: int, body_timeout: float = 60.0,
                 max_receiving_bytes: int | None = None, *,
                 max_receiving_per_client: int | None = None,
                 body_idle_timeout: float = BODY_IDLE_TIMEOUT) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.body_idle_timeout = body_idle_timeout
        self.max_receiving_bytes = (RECEIVING_FACTOR * max_body_bytes
                                    if max_receiving_bytes is None else max_receiving_bytes)
        self.max_receiving_per_client = (
            min(PER_CLIENT_FACTOR * max_body_bytes, self.max_receiving_bytes)
            if max_receiving_per_client is None else max_receiving_per_client)
        self.receiving = 0  # bytes reserved by the bodies being received (one event loop)
        self.by_client: dict[str, int] = {}  # of them, by client address

    def _too_large(self, size: str) -> dict[str, Any]:
        return {
            "detail": f"request body is {size} bytes; the limit is {self.max_body_bytes} bytes."
        }

    async def _busy(self, send: _Send, size: str) -> None:
        detail = (f"the service is receiving {self.receiving} bytes of request bodies at once; "
                  f"this body ({size} bytes) would take that over the limit of "
                  f"{self.max_receiving_bytes} (--max-receiving-bytes): retry after "
                  f"{RECEIVING_RETRY_AFTER} s.")
        await _retry_later(send, 503, detail)

    async def _client_busy(self, send: _Send, held: _Held, size: str) -> None:
        holding = self.by_client.get(held.client, 0)
        detail = (f"client {_clip(held.client)} is sending {holding} bytes of request bodies "
                  f"at once; this body ({size} bytes) would take that over the limit of "
                  f"{self.max_receiving_per_client} per client address "
                  f"(--max-receiving-per-client): retry after {RECEIVING_RETRY_AFTER} s.")
        await _retry_later(send, 429, detail)

    def _reserve(self, held: _Held, n: int) -> str | None:
        """Reserve ``n`` more bytes for one request; the cap that would be passed
        (``"all"``, ``"client"``) refuses it, else None."""
        if not n:
            return None
        if self.receiving + n > self.max_receiving_bytes:
            return "all"
        holding = self.by_client.get(held.client, 0)
        if holding + n > self.max_receiving_per_client:
            return "client"
        self.receiving += n
        self.by_client[held.client] = holding + n
        held.n += n
        return None

    def _release(self, held: _Held) -> None:
        self.receiving -= held.n
        left = self.by_client.get(held.client, 0) - held.n
        if left > 0:
            self.by_client[held.client] = left
        else:
            self.by_client.pop(held.client, None)
        held.n = 0

    async def _refuse(self, send: _Send, cap: str, held: _Held, size: str) -> None:
        if cap == "client":
            await self._client_busy(send, held, size)
        else:
            await self._busy(send, size)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        n_declared = 0
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
        client = scope.get("client")
        held = _Held(str(client[0]) if client else "")
        try:
            cap = self._reserve(held, max(n_declared, 0))
            if cap is not None:
                await self._refuse(send, cap, held, str(n_declared))
                return
            try:
                body = await asyncio.wait_for(self._read_body(receive, send, held),
                                              self.body_timeout)
            except TimeoutError:
                detail = (
                    f"request body not complete {self.body_timeout:g} s after the request head; "
                    "send the head and the whole body at once."
                )
                await _send_json(send, 408, {"detail": detail})
                return
        finally:
            self._release(held)
        if body is None:
            return
        pending: list[bytes] = [body]
        del body  # only the replayed message holds the body from here on

        async def replay() -> _Message:
            if pending:
                return {"type": "http.request", "body": pending.pop(), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, receive: _Receive, send: _Send, held: _Held) -> bytes | None:
        """The whole body, or None after answering 413 / 503 (or on disconnect)."""
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.body_idle_timeout)
            except TimeoutError:
                detail = (f"no byte of the request body for {self.body_idle_timeout:g} s "
                          f"(--body-idle-timeout), {total} bytes received; send the whole "
                          "body at once.")
                logger.info("request refused (408): %s", detail)
                await _send_json(send, 408, {"detail": detail})
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await _send_json(send, 413, self._too_large(f"more than {total - len(chunk)}"))
                return None
            cap = self._reserve(held, total - held.n) if total > held.n else None
            if cap is not None:
                await self._refuse(send, cap, held, f"more than {total - len(chunk)}")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
