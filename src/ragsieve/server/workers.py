"""``serve --workers N``: N uvicorn worker processes sharing one socket and one state.

:func:`run_workers` (called by :func:`~ragsieve.server.run_server` with ``workers > 1``)
prepares everything the workers share, then runs uvicorn's process supervisor:

* the state directory (locked by this parent process): the artifact is checked (by
  building what a worker builds) and published as generation 1 in ``control.sqlite``;
  each worker serves the newest generation it can build and polls for a newer one every
  0.5 s;
* the exchangeability monitor's store (``monitor-<checksum>.sqlite``) and the list
  check's (``lists-<checksum>.sqlite``), reset at start when the state directory's newest
  generation is another artifact and on a reload of another artifact, kept otherwise: one
  sequential test over the merged stream of requests of all workers, updated in a
  transaction per request;
* the feedback database and its adaptive threshold;
* a fresh ``PROMETHEUS_MULTIPROC_DIR`` (removed at exit), so ``GET /metrics`` on any
  worker reports the sum over all workers.

The workers are started by uvicorn with the import string
``ragsieve.server.workers:app_from_env`` (an app factory reading its options from the
environment variable ``RAGSIEVE_SERVE_CONFIG``, the API key from
``RAGSIEVE_SERVE_API_KEY``), so every worker loads its own model. The parent handles
``SIGHUP`` by checking the artifact file and publishing it (uvicorn's own handler would
restart the processes); a refused artifact is logged and nothing changes. ``--watch``
runs in the parent too. A worker that dies is replaced by uvicorn and starts from the
newest published generation it can build (walking back through the kept ones, reported
by ``/healthz`` as ``degraded``). A worker that can build none exits with uvicorn's
start-up failure code, which stops the service (an error, exit 2) instead of a loop of
replacement workers dying at start.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._optional import require
from ..errors import ArtifactError, DataError
from .answers import artifact_view
from .options import ServeOptions
from .reload import (
    ArtifactCheck,
    Generations,
    Publisher,
    Trigger,
    check_artifact,
    probe_scorer,
    read_text,
)
from .state import StateLock, monitor_from_artifact, reset_shared_monitor

__all__ = ["API_KEY_ENV", "CONFIG_ENV", "app_from_env", "run_workers"]

logger = logging.getLogger(__name__)

#: Environment variable holding the workers' options (JSON), set by :func:`run_workers`.
CONFIG_ENV = "RAGSIEVE_SERVE_CONFIG"
#: Environment variable holding the API key for the workers, set by :func:`run_workers`.
API_KEY_ENV = "RAGSIEVE_SERVE_API_KEY"
#: Seconds between two looks at the artifact file (``--watch``).
POLL_SECONDS = 0.5
#: uvicorn's exit code of a worker that failed before serving (its supervisor then stops).
STARTUP_FAILURE = 3


def __getattr__(name: str) -> Any:
    """``HeaderTimeoutProtocol``: uvicorn's protocol with the request-head deadline of
    :mod:`~ragsieve.server.connections`, built in the worker from ``RAGSIEVE_SERVE_CONFIG``
    (uvicorn loads it by import string, as a class cannot be sent to a spawned worker)."""
    if name == "HeaderTimeoutProtocol":
        from .connections import header_timeout_protocol

        config = json.loads(os.environ.get(CONFIG_ENV, "{}"))
        timeout = config.get("app", {}).get("timeout_request_header",
                                            ServeOptions.timeout_request_header)
        return header_timeout_protocol(float(timeout))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_from_env() -> Any:
    """The app of one worker process, built from ``$RAGSIEVE_SERVE_CONFIG`` (uvicorn factory).

    Raises
    ------
    RuntimeError
        The variable is unset (the factory is meant for workers of :func:`run_workers`).
    """
    text = os.environ.get(CONFIG_ENV)
    if not text:
        raise RuntimeError(f"{CONFIG_ENV} is unset; app_from_env builds the workers of "
                           "`ragsieve serve --workers N` (run_server(workers=N)).")
    config = json.loads(text)
    level = config.get("ragsieve_log_level", logging.WARNING)
    package = logging.getLogger("ragsieve")
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        package.setLevel(level)
    if hasattr(signal, "SIGHUP"):  # the parent reloads on SIGHUP; a worker must not die of it
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from .app import _create_app

    try:
        options = ServeOptions.from_dict(config["app"], api_key=os.environ.get(API_KEY_ENV) or None)
        return _create_app(config["filter_path"], options, role="worker")
    except (ArtifactError, ValueError, TypeError, OSError) as exc:
        logging.getLogger(__name__).error("worker pid %d cannot start: %s", os.getpid(), exc)
        sys.exit(STARTUP_FAILURE)  # the supervisor stops the service: no restart loop


def run_workers(filter_path: str | Path, options: ServeOptions, *,
                on_start: Callable[[], object] | None = None) -> None:
    """Serve with ``options.workers`` uvicorn processes (blocks until stopped); see the
    module doc. Each worker receives ``options`` as JSON (:meth:`ServeOptions.to_dict`,
    the API key apart), with this parent's state directory and without ``watch``.

    Raises
    ------
    ValueError
        The state directory is locked by another service.
    ArtifactError, ScorerMismatchError
        The artifact cannot be served (checked here, before any worker starts).
    """
    uvicorn = require("uvicorn", "server")
    from uvicorn.supervisors import Multiprocess

    temporary = options.state_dir is None
    state = (Path(tempfile.mkdtemp(prefix="ragsieve-serve-")) if options.state_dir is None
             else options.state_dir)
    lock = StateLock(state).acquire()
    metrics_dir = tempfile.mkdtemp(prefix="ragsieve-metrics-")
    saved_env = {k: os.environ.get(k) for k in (CONFIG_ENV, API_KEY_ENV,
                                                 "PROMETHEUS_MULTIPROC_DIR")}
    generations: Generations | None = None
    trigger: Trigger | None = None
    try:
        generations = Generations(state / "control.sqlite")
        trigger = _publish_first(filter_path, options, state, generations)
        _export_worker_config(filter_path, options.replace(state_dir=state, watch=False),
                              metrics_dir)
        config = uvicorn.Config(
            "ragsieve.server.workers:app_from_env", factory=True, host=options.host,
            port=options.port, workers=options.workers, log_level=options.log_level,
            timeout_keep_alive=options.timeout_keep_alive,
            http="ragsieve.server.workers:HeaderTimeoutProtocol")
        sock = _tcp(config.bind_socket())
        supervisor = _supervisor_class(Multiprocess)(config, sockets=[sock])
        supervisor.trigger = trigger
        supervisor.metrics_dir = metrics_dir
        trigger.start()
        if on_start is not None:
            on_start()
        logger.info("ragsieve server on http://%s:%d (%d workers)", options.host, options.port,
                    options.workers)
        supervisor.run()
        failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
        if failed:
            raise ArtifactError(f"worker {failed[0]} could not start (see the log above); the "
                                "service stopped rather than restart it in a loop.")
    finally:
        if trigger is not None:
            trigger.stop()
        if generations is not None:
            generations.close()
        lock.release()
        _restore_env(saved_env)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if temporary:
            shutil.rmtree(state, ignore_errors=True)


def _publish_first(filter_path: str | Path, options: ServeOptions, state: Path,
                   generations: Generations) -> Trigger:
    """Check the artifact by building what a worker builds, start a new martingale,
    publish it as the first generation; the trigger of later reloads (SIGHUP, watch)."""
    delta = options.monitor_delta

    def check(text: str, source: str) -> ArtifactCheck:
        checked = check_artifact(
            text, source, scorer_options=options.scorer_options, index_path=options.index_path,
            adaptive=options.adaptive,
            monitor_check=lambda p: monitor_from_artifact(p, delta=delta, store=None),
            verify_key=options.verify_key())
        artifact_view(checked)  # what a worker builds and shows: a bad one fails here
        return checked

    def before_publish(checked: ArtifactCheck, previous: str | None) -> None:
        if checked.checksum != previous:
            reset_shared_monitor(checked.artifact, checked.checksum, state, delta)

    def check_to_publish(text: str, source: str) -> ArtifactCheck:
        checked = check(text, source)
        probe_scorer(checked, source)  # weights loaded, one score: before any worker sees it
        return checked

    max_bytes = options.max_artifact_bytes
    checked = check(read_text(filter_path, max_bytes=max_bytes), str(filter_path))
    previous = generations.latest()
    if previous is None or previous.checksum != checked.checksum:
        _remove_monitor_stores(state)  # another artifact: a new martingale and list check
        reset_shared_monitor(checked.artifact, checked.checksum, state, delta)
        if previous is not None:
            logger.warning("state directory held the monitors' state of another artifact "
                           "(checksum %s); discarded", previous.checksum[:12])
    else:
        logger.info("state directory holds the monitors' state of this artifact (checksum "
                    "%s): the drift alarm and the list check go on from it",
                    checked.checksum[:12])
    number = generations.publish(checked.text, checked.checksum, "start")
    logger.info("serving %s (generation %d, checksum %s) with %d workers; state dir %s",
                filter_path, number, checked.checksum[:12], options.workers, state)
    publisher = Publisher(filter_path, generations, check_to_publish, before_publish,
                          max_bytes=max_bytes)
    return Trigger(publisher, watch=options.watch, interval=POLL_SECONDS)


def _export_worker_config(filter_path: str | Path, options: ServeOptions,
                          metrics_dir: str) -> None:
    """Set the environment the worker processes read (:func:`app_from_env`)."""
    os.environ[CONFIG_ENV] = json.dumps({
        "filter_path": os.fspath(filter_path), "app": options.to_dict(),
        "ragsieve_log_level": logging.getLogger("ragsieve").getEffectiveLevel(),
    })
    if options.api_key:
        os.environ[API_KEY_ENV] = options.api_key
    else:
        os.environ.pop(API_KEY_ENV, None)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir


def _restore_env(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _remove_monitor_stores(state: Path) -> None:
    """Delete the monitor stores of an earlier serve (``DataError`` naming one that stays)."""
    for old in [*state.glob("monitor-*.sqlite*"), *state.glob("lists-*.sqlite*")]:
        try:
            old.unlink(missing_ok=True)
        except OSError as exc:
            raise DataError(f"state file {str(old)!r} cannot be removed ({exc}); move it away or "
                            "pass another --state-dir.") from exc


def _tcp(sock: socket.socket) -> socket.socket:
    """The listening socket marked as TCP (``proto = IPPROTO_TCP``).

    Some uvicorn releases bind it with ``proto = 0`` (newer ones pass ``IPPROTO_TCP``, and the
    socket is then returned as it is); the accepted connections inherit it, and asyncio sets
    ``TCP_NODELAY`` only on sockets whose ``proto`` is TCP. Without it every response
    on a keep-alive connection waited for the client's delayed ACK (docs/serving.md).
    """
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.proto == socket.IPPROTO_TCP:
        return sock
    return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())


def _supervisor_class(base: type) -> type:
    """uvicorn's ``Multiprocess`` with SIGHUP as an artifact reload (not a restart) and the
    live gauges of dead workers dropped from the metrics."""

    class Supervisor(base):  # type: ignore[misc, valid-type]
        trigger: Trigger
        metrics_dir: str

        def handle_hup(self) -> None:
            logger.warning("SIGHUP: reloading the artifact (the workers keep running)")
            self.trigger.request("SIGHUP")

        def keep_subprocess_alive(self) -> None:
            before = {p.pid for p in self.processes}
            super().keep_subprocess_alive()
            gone = before - {p.pid for p in self.processes}
            if gone:
                from prometheus_client import multiprocess

                for pid in gone:
                    if pid is not None:
                        multiprocess.mark_process_dead(pid, self.metrics_dir)

    return Supervisor
