"""Where ragsieve keeps its caches (the lowest layer: no ragsieve imports).

``llm`` (reply cache), ``data`` (downloaded datasets) and the CLI (embedding cache) all
put files under :func:`cache_dir`; it lives here so that none of them has to import
another for it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

CACHE_ENV = "RAGSIEVE_CACHE"
"""Environment variable naming the cache directory (default ``~/.cache/ragsieve``)."""


def cache_dir() -> Path:
    """The ragsieve cache directory: ``$RAGSIEVE_CACHE`` or ``~/.cache/ragsieve``.

    The directory is not created here.

    Returns
    -------
    Path
        ``$RAGSIEVE_CACHE`` (``~`` expanded) when set and non-empty, otherwise
        ``~/.cache/ragsieve``.
    """
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ragsieve"
