"""File writes: a finished file or none, never half of one; special files left in place.

A regular output is written to a temporary file beside it and renamed over it: artifacts,
HTML pages, figures and small JSON / JSONL outputs through the one writer
:func:`atomic_write_bytes` (:func:`atomic_write_text` for text), the streaming writers
through :func:`create_temp`. A rename would replace a *special* file (a character device
such as ``/dev/null``, a FIFO) by a regular one, so :func:`direct_target` tells the
writers which outputs to open and write in place instead, and refuses those no write
makes sense for (a block device, a socket).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "create_temp", "direct_target",
           "special_kind"]

_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISFIFO, "FIFO"),
          (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
_STREAMS = ("character device", "FIFO")


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What kind of special file ``path`` is (symlinks followed), or None.

    Returns
    -------
    str or None
        ``"character device"``, ``"FIFO"``, ``"block device"`` or ``"socket"``; None for a
        regular file, a directory or a path that does not exist.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def direct_target(path: str | os.PathLike[str], *, stream: bool = True) -> bool:
    """Whether ``path`` must be written in place rather than replaced by a rename.

    Parameters
    ----------
    path : path-like
        The output.
    stream : bool, default True
        The writer produces a byte stream that may go to a device or a FIFO; False for
        outputs that cannot (a Parquet file, a directory of parts).

    Returns
    -------
    bool
        True for a character device or a FIFO (write to it directly); False for anything
        else that is not special (temporary file and rename).

    Raises
    ------
    ValueError
        For a block device or a socket, and, when ``stream`` is False, for any special
        file: naming the path and its kind.
    """
    kind = special_kind(path)
    if kind is None:
        return False
    if stream and kind in _STREAMS:
        return True
    what = "a regular file path" if stream else "a regular file path (this output is not a stream)"
    raise ValueError(f"{os.fspath(path)} is a {kind}; expected {what}. Nothing was written.")


def create_temp(directory: Path, name: str) -> tuple[int, Path]:
    """Create ``directory/.{name}.<random>.tmp`` exclusively; return its descriptor and path.

    Unlike :func:`tempfile.mkstemp` the file gets the usual permissions (``0o666``
    minus the umask), so renaming it onto ``name`` yields an ordinary file.
    """
    for _ in range(100):
        path = directory / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")  # pragma: no cover


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    The one writer of finished files: parent directories are created; on any error the
    temporary file is removed and an existing ``path`` is left untouched. A character
    device or a FIFO is written to directly (it stays what it is); a block device or a
    socket is refused (:func:`direct_target`).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        ``path`` is a block device or a socket.
    OSError
        The write failed (e.g. ``ENOSPC`` from ``/dev/full``).
    """
    path = Path(path)
    if direct_target(path):
        with open(path, "wb") as handle:
            handle.write(data)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 (newlines as given) with :func:`atomic_write_bytes`.

    Raises
    ------
    UnicodeEncodeError
        ``text`` holds a lone surrogate (it has no UTF-8); nothing is written.
    ValueError, OSError
        As :func:`atomic_write_bytes`: a block device or socket, a failed write.
    """
    return atomic_write_bytes(path, text.encode("utf-8"))
