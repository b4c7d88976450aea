"""One writer per index directory: an advisory ``flock`` on ``.ragsieve-write.lock``.

A second writer fails at once with ``BlockingIOError`` naming the holder's pid. The kernel
drops the lock when its holder exits, however it exits, so the file a killed writer leaves
behind is taken over by the next one. Readers take no lock.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Self

__all__ = ["LOCK_NAME", "WriteLock"]

#: the lock file in the index directory (it records the writer's pid)
LOCK_NAME = ".ragsieve-write.lock"


class WriteLock:
    """Exclusive lock of one index directory's writers (an advisory ``flock``).

    The lock file holds the pid of the writer for the error message only: the lock itself
    is the kernel's, dropped when its holder exits (kill -9 included), so a lock file left
    by a dead writer is simply taken over.

    Parameters
    ----------
    directory : pathlib.Path
        The index directory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``BlockingIOError`` naming the writer that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _lock(fd)
        except BlockingIOError:
            os.lseek(fd, 0, os.SEEK_SET)
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise BlockingIOError(
                f"index {str(self.directory)!r} is being written by {who}; wait for it to "
                "finish (or stop it) and run again."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Clear the recorded pid and drop the lock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing the descriptor drops the lock

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _lock(fd: int) -> None:
    """Lock ``fd`` exclusively without waiting; ``BlockingIOError`` when it is held."""
    if sys.platform == "win32":  # pragma: no cover - lock one byte far past the pid
        import msvcrt

        os.lseek(fd, 1 << 20, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from exc
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
