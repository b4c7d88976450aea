"""uvicorn settings that close idle and slow connections.

uvicorn closes a keep-alive connection that stays silent ``timeout_keep_alive`` seconds
after a response, but it waits forever for the first request of a new connection and
for the rest of a request head that arrives slowly (slowloris). The protocol class built
here adds a header deadline: a connection must deliver a complete request head within
``timeout_request_header`` seconds of opening (or of its previous response), or it is
closed. Slow bodies are bounded by :class:`~ragsieve.server.security.BodyLimitMiddleware`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._optional import require
from .._validation import check_real

__all__ = ["header_timeout_protocol", "uvicorn_config"]

logger = logging.getLogger(__name__)


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float number of seconds > 0: ``TypeError`` for a non-number (or a bool),
    ``ValueError`` for one <= 0 or NaN."""
    return check_real(value, name, min_value=0, include_boundaries="neither", hint="seconds")


def header_timeout_protocol(timeout_request_header: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with a deadline for each request head.

    Parameters
    ----------
    timeout_request_header : float
        Seconds a connection has to deliver a complete request head, counted from the
        moment it opens and from the end of each response (an absolute deadline, so a
        client trickling one header byte at a time is closed too).

    Returns
    -------
    type[asyncio.Protocol]
        A subclass of uvicorn's automatic HTTP protocol (httptools when installed, else
        h11), for ``uvicorn.Config(http=...)``.
    """
    check_seconds("timeout_request_header", timeout_request_header)
    require("uvicorn", "server")
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc]
        """Closes a connection whose request head is not complete in time."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None
            self._waiting_after: Any = None  # the cycle before the awaited head

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._waiting_after:
                self._cancel_head_timer()  # a complete head arrived: a new request cycle

        def on_response_complete(self) -> None:
            super().on_response_complete()
            idle = self.cycle is None or self.cycle.response_complete
            if idle and not self.transport.is_closing():
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._waiting_after = self.cycle
            self._head_timer = self.loop.call_later(timeout_request_header, self._head_timeout)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._waiting_after = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.cycle is not self._waiting_after or self.transport.is_closing():
                return
            logger.info(
                "closing a connection from %s: no complete request head within %g s",
                self.client,
                timeout_request_header,
            )
            self.transport.close()  # connection_lost then tells the protocol's state machine

    return HeaderTimeoutProtocol


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    timeout_keep_alive: int = 5,
    timeout_request_header: float = 10.0,
) -> Any:
    """The ``uvicorn.Config`` the service runs with.

    Parameters
    ----------
    app : ASGI application
        Usually :func:`~ragsieve.server.create_app`'s result.
    host, port : str, int
        Where to listen.
    log_level : str
        uvicorn's log level.
    timeout_keep_alive : int, default=5
        Seconds an idle keep-alive connection stays open after a response.
    timeout_request_header : float, default=10.0
        Seconds a connection has to deliver a complete request head (see
        :func:`header_timeout_protocol`).

    Returns
    -------
    uvicorn.Config

    Raises
    ------
    ValueError
        A timeout is not a number > 0.
    ImportError
        uvicorn is not installed (extra ``server``).
    """
    check_seconds("timeout_keep_alive", timeout_keep_alive)
    uvicorn = require("uvicorn", "server")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=timeout_keep_alive,
        http=header_timeout_protocol(timeout_request_header),
    )
