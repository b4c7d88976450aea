"""Paths: where ragsieve keeps its caches, and whether an output would touch an input
(the lowest layer: no ragsieve imports).

``llm`` (reply cache), ``data`` (downloaded datasets) and the CLI (embedding cache) all
put files under :func:`cache_dir`, each kind in its own folder (:data:`CACHE_KINDS`); it
lives here so that none of them has to import another for it. :func:`check_outputs_apart` is the CLI's guard that no command writes
over, or into, what it reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CACHE_ENV", "CACHE_KINDS", "cache_dir", "check_outputs_apart", "embeddings_dir",
           "figure_path", "overlap"]

logger = logging.getLogger(__name__)

CACHE_ENV = "RAGSIEVE_CACHE"
"""Environment variable naming the cache directory (default ``~/.cache/ragsieve``)."""

CACHE_KINDS = {
    "embeddings/": "the per-text embedding cache (embeddings.sqlite)",
    "onnx/": "the ONNX graphs exported from the embedding models",
    "serve/": "each served filter's feedback, monitor and adaptive state",
    "models/": "the local LLM's weights",
    "datasets/": "downloaded datasets",
    "inputs/": "named datasets written once as JSONL for engine jobs",
    "llm-cache.sqlite": "the LLM replies",
    "rerank-cache.sqlite": "an outside reranker's replies",
}
"""What :func:`cache_dir` holds, each kind in its own place (``--help`` and the docs say it)."""

_LEGACY_WARNED: set[Path] = set()


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


def embeddings_dir() -> Path:
    """The embedding cache's directory: ``cache_dir() / "embeddings"``.

    Earlier versions put the command line's embedding cache directly in
    ``$RAGSIEVE_CACHE`` (the ``--cache-dir`` default was the variable itself). When that file exists and the new
    place holds none, the old place is used (vectors already computed are not lost), with
    one logged warning per process saying how to move it.

    Returns
    -------
    Path
        The directory of ``embeddings.sqlite`` (not created here).
    """
    root = cache_dir()
    new, old = root / "embeddings", root / "embeddings.sqlite"
    if old.is_file() and not (new / "embeddings.sqlite").exists():
        if root not in _LEGACY_WARNED:
            _LEGACY_WARNED.add(root)
            logger.warning("using the embedding cache at its old place %s; each cache now has "
                           "its own folder under %s: `mkdir -p %s && mv %s* %s/` moves it there",
                           old, root, new, old, new)
        return root
    return new


def _resolved(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with symlinks followed as far as it exists."""
    return Path(path).expanduser().resolve(strict=False)


def _same_file(a: Path, b: Path) -> bool:
    """Whether two existing paths are one file (same ``st_dev`` and ``st_ino``: hard links)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _contains(directory: Path, path: Path) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (both resolved)."""
    return path == directory or path.is_relative_to(directory)


def overlap(output: str | os.PathLike[str], source: str | os.PathLike[str]) -> str | None:
    """How writing ``output`` would touch the input ``source``, or None when it cannot.

    Parameters
    ----------
    output : path-like
        A file or directory a command writes (it need not exist yet).
    source : path-like
        A file or directory the command reads; a path that does not exist (a dataset
        name, ``-``) never overlaps.

    Returns
    -------
    str or None
        ``"is the same file as"`` / ``"is the same directory as"`` (same path after
        following symlinks, or the same inode: a hard link), ``"is inside"`` (the output lies in the input directory),
        ``"contains"`` (the input lies in the output directory), or None.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "pairs.jsonl").write_text("{}")
    2
    >>> overlap(d / "pairs.jsonl", d / "pairs.jsonl"), overlap(d / "parts", d / "pairs.jsonl")
    ('is the same file as', None)
    >>> overlap(d / "scores", d), overlap(d, d / "pairs.jsonl")
    ('is inside', 'contains')
    """
    src = Path(source)
    if os.fspath(source) in ("", "-") or not src.exists():
        return None
    out, src = _resolved(output), _resolved(source)
    if out == src or _same_file(out, src):
        return "is the same directory as" if src.is_dir() else "is the same file as"
    if src.is_dir() and _contains(src, out):
        return "is inside"
    if _contains(out, src):
        return "contains"
    return None


def check_outputs_apart(outputs: Mapping[str, str | os.PathLike[str] | None],
                        inputs: Mapping[str, str | os.PathLike[str] | None]) -> None:
    """Refuse outputs that would overwrite, or write into, any of the inputs.

    Parameters
    ----------
    outputs, inputs : mapping
        Paths keyed by how the user named them (e.g. ``"--out"``, ``"--data"``); ``None``
        values are skipped.

    Raises
    ------
    ValueError
        Naming both options and paths: ``--out data.jsonl is the same file as --data
        data.jsonl; writing it would destroy the input: choose another --out.``
    """
    for out_name, out in outputs.items():
        for in_name, source in inputs.items():
            if out is None or source is None:
                continue
            how = overlap(out, source)
            if how is not None:
                raise ValueError(
                    f"{out_name} {os.fspath(out)} {how} {in_name} {os.fspath(source)}; writing "
                    f"it would overwrite or mix with the input: choose another {out_name}.")


def figure_path(path: str | os.PathLike[str]) -> Path:
    """The file a figure asked for at ``path`` is written to.

    A path without a suffix gets ``.png`` appended (``--plot results`` writes
    ``results.png``, as matplotlib would); a character device or a FIFO is written as it
    is; any other path is used as given (its suffix names the format).

    Examples
    --------
    >>> figure_path("out/plot"), figure_path("out/plot.pdf")
    (PosixPath('out/plot.png'), PosixPath('out/plot.pdf'))
    """
    import stat

    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or path.suffix:
        return path
    return path.with_name(path.name + ".png")
