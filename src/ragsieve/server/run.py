"""Serve a filter: :func:`run_server`, in this process or in N worker processes.

One process runs the app of :func:`~ragsieve.server.app.create_app` with uvicorn; with
``workers > 1`` :mod:`ragsieve.server.workers` starts the worker processes.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._optional import require
from .app import create_app
from .connections import check_seconds, uvicorn_config
from .reload import Trigger
from .security import is_loopback_host

__all__ = ["run_server"]

logger = logging.getLogger(__name__)


def _install_sighup(trigger: Trigger) -> Any:
    """Route SIGHUP to a reload request (main thread, POSIX); returns the previous handler."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGHUP, lambda *_: trigger.request("SIGHUP"))


def run_server(
    filter_path: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "info",
    timeout_keep_alive: int = 5,
    timeout_request_header: float = 10.0,
    workers: int = 1,
    on_start: Callable[[], object] | None = None,
    **app_options: Any,
) -> None:
    """Serve a filter artifact with uvicorn (blocks until stopped).

    ``SIGHUP`` reloads the artifact from ``filter_path`` (see :mod:`ragsieve.server.reload`).

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
    workers : int, default=1
        Worker processes. With more than one, each loads the model; they share the
        listening socket, the feedback database, the adaptive threshold, the monitor
        (one martingale over all requests) and the metrics (:mod:`ragsieve.server.workers`).
    on_start : callable, optional
        Called once the artifact is checked and loaded, just before serving (the CLI
        prints where the state lives).
    **app_options
        The other options of :func:`create_app` (``max_body_bytes``, ``max_snippets``,
        ``scorer_options``, ``index_path``, ``max_k``, ``body_timeout``, ``state_dir``,
        ``feedback_db``, ``adaptive``, ``monitor_delta``, ``watch``, ...).

    Raises
    ------
    ValueError
        ``host`` is not loopback and no API key is set, a timeout is not a number > 0, or
        ``workers`` is not an int >= 1.
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
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers == {workers!r}, must be an int >= 1.")
    uvicorn = require("uvicorn", "server")
    if workers > 1:
        from .workers import run_workers

        run_workers(filter_path, host=host, port=port, api_key=api_key, log_level=log_level,
                    timeout_keep_alive=timeout_keep_alive,
                    timeout_request_header=timeout_request_header, workers=workers,
                    on_start=on_start, **app_options)
        return
    app = create_app(filter_path, api_key=api_key, **app_options)
    if on_start is not None:
        on_start()
    config = uvicorn_config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=timeout_keep_alive,
        timeout_request_header=timeout_request_header,
    )
    logger.info("ragsieve server on http://%s:%d", host, port)
    previous = _install_sighup(app.state.trigger)
    try:
        uvicorn.Server(config).run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)

