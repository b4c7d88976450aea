"""Atomic file writes: a finished file or none, never half of one."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write_text", "create_temp"]


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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename.

    Parent directories are created. On any error the temporary file is removed and an
    existing ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
