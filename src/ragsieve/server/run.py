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
from .connections import uvicorn_config
from .options import ServeOptions, serve_options
from .reload import Trigger
from .security import is_loopback_host

__all__ = ["run_server"]

logger = logging.getLogger(__name__)


def _install_sighup(trigger: Trigger) -> Any:
    """Route SIGHUP to a reload request (main thread, POSIX); returns the previous handler."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGHUP, lambda *_: trigger.request("SIGHUP"))


def run_server(filter_path: str | Path, options: ServeOptions | None = None, *,
               on_start: Callable[[], object] | None = None, **kwargs: Any) -> None:
    """Serve a filter artifact with uvicorn (blocks until stopped).

    ``SIGHUP`` reloads the artifact from ``filter_path`` (see :mod:`ragsieve.server.reload`).

    Parameters
    ----------
    filter_path : str or Path
        The filter artifact.
    options : ServeOptions, optional
        The service's settings (:class:`~ragsieve.server.options.ServeOptions`), here also
        ``host`` / ``port`` (a non-loopback host requires ``api_key``), ``workers`` (with
        more than one, each loads the model; they share the listening socket, the
        feedback database, the adaptive threshold, the monitor and the metrics:
        :mod:`ragsieve.server.workers`), ``log_level`` and the connection timeouts
        ``timeout_keep_alive`` / ``timeout_request_header``.
    on_start : callable, optional
        Called once the artifact is checked and loaded, just before serving (the CLI
        prints where the state lives).
    **kwargs
        Options by name, applied over ``options`` (``port=8001``, ``max_k=10``, ...; see
        :func:`~ragsieve.server.create_app`).

    Raises
    ------
    TypeError
        A keyword is no option of ``ServeOptions``, or an option has the wrong type.
    ValueError
        ``host`` is not loopback and no API key is set, or an option's value breaks its
        rule (a timeout not a number > 0, ``workers`` not an int >= 1, ...).
    ImportError
        uvicorn is not installed (extra ``server``).
    """
    options = serve_options(options, kwargs, caller="run_server")  # before any weights load
    if not options.api_key and not is_loopback_host(options.host):
        raise ValueError(
            f"host == {options.host!r} is not a loopback address and no API key is set; "
            "refusing to serve the filter unauthenticated on the network. Set an API key or "
            "bind to 127.0.0.1."
        )
    uvicorn = require("uvicorn", "server")
    if options.workers > 1:
        from .workers import run_workers

        run_workers(filter_path, options, on_start=on_start)
        return
    app = create_app(filter_path, options)
    if on_start is not None:
        on_start()
    config = uvicorn_config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        timeout_keep_alive=options.timeout_keep_alive,
        timeout_request_header=options.timeout_request_header,
    )
    logger.info("ragsieve server on http://%s:%d", options.host, options.port)
    previous = _install_sighup(app.state.trigger)
    try:
        uvicorn.Server(config).run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)
