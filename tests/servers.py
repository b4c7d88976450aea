"""A real uvicorn server in a background thread on a bound loopback socket (for tests).

``ThreadServer(app)`` runs the app with the service's own uvicorn settings
(``uvicorn_config``: keep-alive and request-head timeouts; ``options`` override them);
``with ThreadServer(app) as srv`` gives ``srv.url``. :func:`serving` builds the app with
``create_app`` first.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

from ragsieve.server import create_app, uvicorn_config

__all__ = ["ThreadServer", "free_port", "http_server", "serving", "wait_until"]


class ThreadServer:
    """uvicorn in a background thread on an already-bound loopback socket."""

    def __init__(self, app: Any, **options: Any) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, log_level="warning", **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@contextmanager
def serving(path: Path, **kwargs: Any) -> Iterator[ThreadServer]:
    """``create_app(path, **kwargs)`` served by a :class:`ThreadServer`."""
    with ThreadServer(create_app(path, **kwargs)) as server:
        yield server


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A plain ``http.server`` of ``handler`` on 127.0.0.1 in a background thread (an
    endpoint double for failure injection, or a server whose answers a test controls);
    yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    """A loopback port free now (for a server started in another process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``check`` (a refused or dropped connection counts as not yet) until it returns
    something true, which is returned; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except httpx.TransportError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
