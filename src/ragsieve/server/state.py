"""The state directory of one ``serve``: feedback, control and monitor files, and its lock.

``<state dir>/feedback.sqlite`` (served scores, labels, adaptive state; ``--feedback``
puts it elsewhere), ``control.sqlite`` (published artifact generations),
``monitor-<checksum>.sqlite`` and ``lists-<checksum>.sqlite`` (the exchangeability monitor and
the list check, shared by worker processes and kept across restarts on one artifact) and
``serve.lock``
(held by the serving process, so two services never share one directory).

The default directory is stable for one artifact path, so a restart finds its feedback
and adaptive state again: ``$RAGSIEVE_CACHE/serve/<artifact stem>-<8 hex of its absolute
path>`` (``~/.cache/ragsieve/serve/...`` when the variable is unset).

A new artifact starts a fresh monitor and list check: :func:`reset_shared_monitor` resets
its files (:func:`monitor_path`, :func:`~ragsieve.server.list_store.lists_path`) before it is
published; the same artifact served again goes on with them.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Self

from .._paths import cache_dir
from ..artifact import Artifact
from ..errors import DataError
from .list_store import lists_path, reset_lists_file

__all__ = ["StateLock", "default_state_dir", "monitor_from_artifact", "monitor_path",
           "reset_shared_monitor"]


def default_state_dir(filter_path: str | os.PathLike[str]) -> Path:
    """The state directory ``serve`` uses for ``filter_path`` unless told another.

    Examples
    --------
    >>> default_state_dir("/srv/filters/en.json").name.startswith("en-")
    True
    """
    path = Path(filter_path).expanduser().resolve()
    digest = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:8]
    return cache_dir() / "serve" / f"{path.stem}-{digest}"


class StateLock:
    """An exclusive lock on a state directory (``serve.lock``, ``flock``) for one service.

    Raises
    ------
    ValueError
        Another process (or another app in this one) holds it.
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / "serve.lock"
        self._file: IO[str] | None = None

    def acquire(self) -> Self:
        """Take the lock (non-blocking) and write this pid into the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            self._file = handle
            return self
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            handle.close()
            raise ValueError(
                f"state directory {str(self.path.parent)!r} is in use by another ragsieve serve "
                f"(pid {owner}); stop it or pass another --state-dir."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Release the lock (closing the file releases the flock)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def monitor_from_artifact(artifact: Artifact, *, delta: float,
                          store: str | Path | None) -> Any:
    """The exchangeability monitor of an artifact, or None when it carries no reference."""
    from ..monitoring import ExchangeabilityMonitor

    return ExchangeabilityMonitor.from_artifact(artifact, delta=delta, store=store)


def monitor_path(monitor_dir: Path, checksum: str) -> Path:
    """The shared monitor file of the artifact ``checksum`` in ``monitor_dir``."""
    return monitor_dir / f"monitor-{checksum[:16]}.sqlite"


def reset_shared_monitor(artifact: Artifact, checksum: str, monitor_dir: Path,
                         delta: float, factory: Callable[..., Any] | None = None) -> bool:
    """Reset an artifact's shared monitor store and its list check's
    (:mod:`ragsieve.server.list_store`) when they were kept (a store not there yet starts
    fresh, at epoch 0, like a monitor in memory); False when nothing was reset or the
    artifact has no monitor reference."""
    lists = lists_path(monitor_dir, checksum)
    try:
        reset_lists_file(lists)
    except (sqlite3.Error, OSError) as exc:
        raise DataError(f"state file {str(lists)!r} cannot be reset ({exc}); move it away or "
                        "pass another --state-dir.") from exc
    store = monitor_path(monitor_dir, checksum)
    if not store.exists():
        return False
    monitor = (factory or monitor_from_artifact)(artifact, delta=delta, store=store)
    if monitor is None:
        return False
    try:
        monitor.reset()
    finally:
        close = getattr(monitor, "close", None)
        if callable(close):
            close()
    return True

