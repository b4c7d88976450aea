"""Partitioned output: one part file per input shard, and a manifest of finished parts.

A run writes ``part-00000.jsonl`` (or ``.parquet``), ``part-00001...`` into its output
directory, each first to a hidden temporary file and then renamed, and records a part in
``_manifest.json`` (rewritten atomically) only after its rename. The manifest also holds
what the run is (its job: the task, its parameters and the inputs' sizes and times), so:

* a killed run resumes where it stopped: finished parts are skipped, a part renamed but
  not yet recorded is redone, and temporary files are removed — no pair is written twice;
* a rerun with another job into the same directory is refused (or, with ``overwrite``,
  starts afresh) instead of mixing two runs;
* readers (:func:`finished_parts`) see only recorded parts, in shard order.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragsieve._io import atomic_write_text
from ragsieve.errors import DataError

__all__ = ["FORMATS", "MANIFEST", "PartitionedOutput", "finished_parts", "parts_written"]

logger = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
"""Name of the manifest file in an output directory."""

FORMATS = ("jsonl", "parquet")
"""Part formats."""

_VERSION = 1
_SIDECAR = ".qids"  # a part's query-id hashes (ragsieve.engines.base.QUERY_HASHES)


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable manifest ({exc}); remove the directory or pass "
                        "--overwrite.") from exc
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(
            data.get("parts"), dict):
        raise DataError(f"{path}: not a ragsieve manifest of version {_VERSION}.")
    return data


def finished_parts(directory: str | os.PathLike[str]) -> list[Path] | None:
    """The recorded parts of a ragsieve output directory, in shard order.

    Returns None when the directory has no manifest (not a ragsieve output).

    Raises
    ------
    DataError
        The run did not finish (rerun its command to complete it), or a recorded part
        is missing.
    """
    directory = Path(directory)
    data = _read_manifest(directory)
    if data is None:
        return None
    if not data.get("complete"):
        n, total = len(data["parts"]), data.get("n_shards", "?")
        raise DataError(f"{directory}: an unfinished run ({n} of {total} parts); rerun its "
                        "command to finish it before reading the output.")
    parts = []
    for key in sorted(data["parts"], key=int):
        path = directory / data["parts"][key]["part"]
        if not path.is_file():
            raise DataError(f"{path}: recorded in {MANIFEST} but missing; rerun with "
                            "--overwrite.")
        parts.append(path)
    return parts


def parts_written(directory: str | os.PathLike[str]) -> tuple[int, int | None]:
    """``(parts recorded, shards in all)`` of an output directory (``(0, None)`` when it
    has no manifest)."""
    try:
        data = _read_manifest(Path(directory))
    except DataError:
        return 0, None
    if data is None:
        return 0, None
    total = data.get("n_shards")
    return len(data["parts"]), int(total) if isinstance(total, int) else None


class PartitionedOutput:
    """The output directory of one run (see the module docstring).

    Parameters
    ----------
    directory : path
        Created if missing.
    job : mapping
        JSON-serialisable identity of the run; resuming requires an equal job.
    fmt : {"jsonl", "parquet"}
        Part format.
    overwrite : bool, default False
        Start afresh when the directory holds another run (its parts are deleted).
    """

    def __init__(self, directory: str | os.PathLike[str], job: Mapping[str, Any], *,
                 fmt: str = "jsonl", overwrite: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt == {fmt!r}, expected one of {FORMATS}.")
        self.directory = Path(directory)
        self.fmt = fmt
        self.job = json.loads(json.dumps(dict(job), sort_keys=True))
        if self.directory.exists() and not self.directory.is_dir():
            raise DataError(f"{self.directory}: exists and is not a directory; expected an "
                            "output directory.")
        self.directory.mkdir(parents=True, exist_ok=True)
        data = _read_manifest(self.directory)
        if data is not None and (data.get("job") != self.job or data.get("format") != fmt):
            if not overwrite:
                raise DataError(
                    f"{self.directory}: holds the output of another run ({_difference(data, self.job, fmt)}); "
                    "give a new output path, or --overwrite to replace it.")
            logger.warning("%s: replacing the output of another run", self.directory)
            data = None
            self._remove_parts(keep=set())
            (self.directory / MANIFEST).unlink(missing_ok=True)
        elif data is None and overwrite:
            self._remove_parts(keep=set())
        if data is None and any(self.directory.glob("part-*")):
            raise DataError(f"{self.directory}: holds part files but no {MANIFEST}; give an "
                            "empty or new output directory, or --overwrite.")
        self.manifest: dict[str, Any] = data or {
            "version": _VERSION, "format": fmt, "job": self.job, "parts": {}, "complete": False}
        self._remove_parts(keep={p["part"] for p in self.manifest["parts"].values()})
        if data is not None and self.manifest["parts"]:
            logger.info("%s: resuming, %d part(s) already written", self.directory,
                        len(self.manifest["parts"]))

    # ----------------------------------------------------------------- state
    @property
    def done(self) -> dict[int, dict[str, Any]]:
        """Recorded parts by shard index."""
        return {int(k): v for k, v in self.manifest["parts"].items()}

    def part_name(self, shard: int) -> str:
        """File name of a shard's part."""
        return f"part-{shard:05d}.{self.fmt}"

    def record(self, shard: int, entry: Mapping[str, Any]) -> None:
        """Record a finished part (its file already renamed into place)."""
        name = self.part_name(shard)
        if not (self.directory / name).is_file():
            raise DataError(f"{self.directory / name}: part missing; cannot record it.")
        self.manifest["parts"][str(shard)] = {"part": name, **dict(entry)}
        self._save()

    def finish(self, n_shards: int, summary: Mapping[str, Any] | None = None) -> None:
        """Mark the run complete (every shard recorded)."""
        missing = sorted(set(range(n_shards)) - set(self.done))
        if missing:
            raise DataError(f"{self.directory}: shards {missing[:10]} have no part; the run "
                            "is not complete.")
        self.manifest["n_shards"] = n_shards
        self.manifest["complete"] = True
        if summary is not None:
            self.manifest["summary"] = dict(summary)
        self._save()

    def start(self, n_shards: int) -> None:
        """Record how many shards the run has (before any part)."""
        self.manifest["n_shards"] = n_shards
        self._save()

    def parts(self) -> list[Path]:
        """The recorded parts in shard order."""
        return [self.directory / self.done[k]["part"] for k in sorted(self.done)]

    # ----------------------------------------------------------------- helpers
    def _save(self) -> None:
        atomic_write_text(self.directory / MANIFEST,
                          json.dumps(self.manifest, indent=1, sort_keys=True) + "\n")

    def _remove_parts(self, keep: set[str]) -> None:
        keep = keep | {name + _SIDECAR for name in keep}
        for path in self.directory.iterdir():
            stray_part = path.name.startswith("part-") and path.name not in keep
            temp = path.name.startswith(".part-") and path.name.endswith(".tmp")
            if stray_part or temp:
                path.unlink(missing_ok=True)


def _difference(data: Mapping[str, Any], job: Mapping[str, Any], fmt: str) -> str:
    if data.get("format") != fmt:
        return f"format {data.get('format')} there, {fmt} now"
    old = data.get("job") or {}
    keys = sorted(k for k in set(old) | set(job) if old.get(k) != job.get(k))
    return "it differs in " + ", ".join(keys) if keys else "another job"
