"""Where dataset files are found, and how they are downloaded and verified.

Lookup order for a dataset file ``relpath`` (e.g. ``"xquad/xquad.en.json"``):

1. ``data_dir() / relpath`` -- the data directory (see :func:`data_dir`). A checksum
   mismatch there is logged as a warning and the file is still used: it is the
   user's own copy and may be a newer upstream version.
2. ``cache_dir() / "datasets" / relpath`` -- files this module downloaded earlier.
   A pinned checksum mismatch there means a corrupt cache entry: it is deleted and
   fetched again.
3. Download from the canonical URL (only when ``download=True``), to a temporary file
   that is verified against the pinned SHA-256 and then renamed into the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from ragsieve._io import create_temp, special_kind
from ragsieve._paths import CACHE_ENV, cache_dir  # re-exported: defined below data/ and llm/
from ragsieve.errors import DataError

__all__ = [
    "CACHE_ENV",
    "DATA_ENV",
    "cache_dir",
    "data_dir",
    "resolve_dataset_file",
    "sha256_file",
]

logger = logging.getLogger(__name__)

DATA_ENV = "RAGSIEVE_DATA"
"""Environment variable naming the data directory."""

DOWNLOAD_TIMEOUT = 60.0
"""Seconds to wait for the server before a download fails."""

_SHARED = Path("..") / "shared" / "datasets"


def _repo_root() -> Path | None:
    """The nearest ancestor of this file holding ``pyproject.toml`` (source checkouts)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return None


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """Locate the directory holding the datasets.

    Parameters
    ----------
    explicit : str or os.PathLike, optional
        A directory given by the caller; wins over everything else.

    Returns
    -------
    Path or None
        The first of: ``explicit``; ``$RAGSIEVE_DATA``; ``../shared/datasets`` relative
        to the working directory; ``../shared/datasets`` relative to the repository
        root (the directory with ``pyproject.toml`` above this file) -- the last two
        only if they exist. ``None`` when nothing applies.

    Raises
    ------
    DataError
        When ``explicit`` or ``$RAGSIEVE_DATA`` is set but is not a directory (a
        misconfiguration is reported, not silently skipped).
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_dir():
            raise DataError(f"data_dir == {os.fspath(explicit)!r} is not a directory.")
        return path
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataError(
                f"{DATA_ENV} == {env!r} is not a directory; point it at the folder holding "
                "xquad/ and selqa/, or unset it."
            )
        return path
    candidate = Path.cwd() / _SHARED
    if candidate.is_dir():
        return candidate.resolve()
    root = _repo_root()
    if root is not None and (root / _SHARED).is_dir():
        return (root / _SHARED).resolve()
    return None


_locate_data_dir = data_dir  # reachable inside functions whose parameter is named data_dir


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hexadecimal SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_relpath(relpath: str) -> PurePosixPath:
    rel = PurePosixPath(relpath)
    if not relpath or rel.is_absolute() or ".." in rel.parts:
        raise DataError(
            f"relpath == {relpath!r}, must be a relative path inside the data directory "
            "such as 'xquad/xquad.en.json'."
        )
    return rel


def _download(url: str, target: Path, sha256: str | None, timeout: float) -> None:
    """Fetch ``url`` into ``target`` via a verified temporary file."""
    if not url.startswith(("https://", "http://")):
        raise DataError(f"url == {url!r}, must be an http(s) URL.")
    kind = special_kind(target)
    if kind is not None:  # a rename would replace it: never touch a special file
        raise DataError(f"{target}: is a {kind}, not a dataset file; remove it from the cache.")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(target.parent, target.name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    for block in iter(lambda: response.read(1 << 16), b""):
                        digest.update(block)
                        out.write(block)
            except (urllib.error.URLError, OSError) as exc:
                raise DataError(f"download of {url} failed ({exc}).") from exc
        got = digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            raise DataError(
                f"checksum mismatch for {url}: got sha256 {got}, expected {sha256}; the "
                "download was discarded."
            )
        if sha256 is None:
            logger.warning(
                "%s has no pinned checksum; downloaded file has sha256 %s (not verified)",
                url,
                got,
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("downloaded %s to %s", url, target)


def resolve_dataset_file(
    relpath: str,
    *,
    url: str,
    sha256: str | None,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    timeout: float = DOWNLOAD_TIMEOUT,
) -> Path:
    """Find a dataset file locally or download it into the cache.

    Parameters
    ----------
    relpath : str
        Path relative to the data directory, e.g. ``"xquad/xquad.en.json"``.
    url : str
        Canonical download URL.
    sha256 : str or None
        Pinned SHA-256 of the file; ``None`` accepts any download with a warning.
    data_dir : str or os.PathLike, optional
        Explicit data directory (see :func:`data_dir`).
    download : bool, default True
        Whether a missing file may be fetched from ``url``.
    timeout : float, default 60
        Network timeout in seconds.

    Returns
    -------
    Path
        An existing local file.

    Raises
    ------
    DataError
        When the file is not found and cannot be downloaded (the message lists the
        places searched and how to set ``RAGSIEVE_DATA``), or when a download's
        checksum does not match (the partial file is removed).
    """
    rel = _check_relpath(relpath)
    searched: list[str] = []
    root = _locate_data_dir(data_dir)
    if root is not None:
        local = root.joinpath(*rel.parts)
        searched.append(str(local))
        if local.is_file():
            if sha256 is not None:
                got = sha256_file(local)
                if got != sha256.lower():
                    logger.warning(
                        "%s has sha256 %s, expected %s (a different version?); using it anyway",
                        local,
                        got,
                        sha256,
                    )
            return local
    cached = cache_dir().joinpath("datasets", *rel.parts)
    searched.append(str(cached))
    if cached.is_file():
        if sha256 is None or sha256_file(cached) == sha256.lower():
            return cached
        logger.warning("cached %s fails its checksum; removing it", cached)
        cached.unlink()
    if not download:
        raise DataError(
            f"dataset file {relpath!r} not found (looked in {', '.join(searched)}) and "
            f"download=False. Set {DATA_ENV} to a directory containing {relpath}, or allow "
            f"the download from {url}."
        )
    try:
        _download(url, cached, sha256, timeout)
    except DataError as exc:
        raise DataError(
            f"{exc} Dataset file {relpath!r} was not found locally (looked in "
            f"{', '.join(searched)}); set {DATA_ENV} to a directory containing {relpath}."
        ) from exc.__cause__
    return cached
