"""What every engine shares: the task contract, the work on one shard, and a run.

A *task* turns a batch of pairs (whole queries) into output records: scores
(:class:`~ragsieve.engines.tasks.ScoreTask`), filter results
(:class:`~ragsieve.engines.tasks.FilterTask`) or LLM labels
(:class:`ragsieve.labeling.LabelTask`). An *engine* decides where shards are processed:
in this process (:class:`~ragsieve.engines.local.LocalEngine`) or in a pool of Ray actors
(:class:`~ragsieve.engines.ray_engine.RayEngine`). Both call :func:`process_shard` on the
same shards with the same batches, so they write the same parts; :func:`run_job` plans
the shards, skips those a killed run already finished, and records every part in the
output's manifest as it arrives.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._validation import check_int
from ..data.partitioned import PartitionedOutput
from ..data.shards import (
    DEFAULT_SHARD_BYTES,
    Shard,
    check_not_empty,
    expand_inputs,
    input_fingerprint,
    plan_shards,
    query_batches,
    read_shard,
)
from ..errors import DataError

__all__ = [
    "DEFAULT_BATCH_PAIRS",
    "QUERY_HASHES",
    "Engine",
    "JobOutput",
    "RunReport",
    "Task",
    "check_queries_whole",
    "merge_stats",
    "output_directory",
    "process_shard",
    "query_hash",
    "run_job",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_PAIRS = 2048
"""Pairs handed to a task at once (whole queries): bounds the memory of a worker."""


@runtime_checkable
class Task(Protocol):
    """What an engine runs on every batch of pairs.

    A task is built on the driver from plain options, pickled to the workers, and
    :meth:`setup` there loads its models once per worker.
    """

    #: "score", "filter" or "label"
    kind: str
    #: pairs must carry a 0/1 label
    require_labels: bool
    #: a meta key every pair must hold as a number (outside scores), or None
    score_field: str | None
    #: extra columns of Parquet output (keys present on every record), e.g. ("score",)
    columns: tuple[str, ...]

    def spec(self) -> dict[str, Any]:
        """JSON identity of the task; resuming a run requires an equal spec."""
        ...

    def setup(self) -> None:
        """Load models (called once in each worker before the first batch)."""
        ...

    def process(self, pairs: list[Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Records for a batch of whole queries, and counts to add up (``merge_stats``)."""
        ...

    def arrow(self, records: list[dict[str, Any]]) -> Any:
        """The records as an Arrow table (Parquet output)."""
        ...

    def close(self) -> None:
        """Release what :meth:`setup` loaded."""
        ...


class Engine(Protocol):
    """Where shards are processed."""

    name: str

    def map_shards(self, task: Task, shards: Sequence[Shard], directory: Path, fmt: str,
                   batch_pairs: int, progress: bool) -> Iterator[dict[str, Any]]:
        """Process the shards, yielding each finished part's entry as it finishes."""
        ...

    def describe(self) -> dict[str, Any]:
        """What ran where (engine, workers, address), for the report."""
        ...


def merge_stats(total: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    """Add the counts of ``more`` into ``total`` (returned)."""
    for key, value in more.items():
        total[key] = total.get(key, 0) + value
    return total


class _PartWriter:
    """Streams records into a part's temporary file; ``commit`` renames it into place."""

    def __init__(self, temp: Path, final: Path, fmt: str, task: Task) -> None:
        self.temp, self.final, self.fmt, self.task = temp, final, fmt, task
        self.rows = 0
        self._parquet: Any = None
        self._text = open(temp, "w", encoding="utf-8", newline="\n") if fmt == "jsonl" else None  # noqa: SIM115

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        if self._text is not None:
            self._text.writelines(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n"
                                  for r in records)
        else:
            from .._optional import require

            table = self.task.arrow(records)
            if self._parquet is None:
                pq = require("pyarrow.parquet", "ray")
                self._parquet = pq.ParquetWriter(self.temp, table.schema)
            self._parquet.write_table(table)
        self.rows += len(records)

    def commit(self) -> None:
        if self._text is not None:
            self._text.flush()
            os.fsync(self._text.fileno())
            self._text.close()
        elif self._parquet is not None:
            self._parquet.close()
        else:  # a Parquet part without rows: an empty table of the task's schema
            from .._optional import require

            require("pyarrow.parquet", "ray").write_table(self.task.arrow([]), self.temp)
        os.replace(self.temp, self.final)

    def discard(self) -> None:
        for handle in (self._text, self._parquet):
            try:
                if handle is not None:
                    handle.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                logger.debug("closing a discarded part failed: %s", exc)
        self.temp.unlink(missing_ok=True)


def process_shard(task: Task, shard: Shard, directory: str | os.PathLike[str], fmt: str,
                  batch_pairs: int = DEFAULT_BATCH_PAIRS) -> dict[str, Any]:
    """Run ``task`` over one shard and write its part (temporary file, then rename).

    Returns
    -------
    dict
        The part's manifest entry: ``shard``, ``rows`` written, ``pairs`` read,
        ``stats`` (the task's counts) and ``seconds``.
    """
    from .._io import create_temp

    directory = Path(directory)
    name = f"part-{shard.index:05d}.{fmt}"
    fd, temp = create_temp(directory, name)
    os.close(fd)
    writer = _PartWriter(temp, directory / name, fmt, task)
    t0 = time.perf_counter()
    n_pairs = 0
    stats: dict[str, float] = {}
    queries: list[int] = []
    try:
        pairs = read_shard(shard, require_labels=task.require_labels,
                           score_field=task.score_field)
        for batch in query_batches(pairs, batch_pairs):
            records, counts = task.process(batch)
            writer.write(records)
            merge_stats(stats, counts)
            n_pairs += len(batch)
            queries.extend(query_hash(q) for q in dict.fromkeys(p.query_id for p in batch))
        _write_query_hashes(directory, name, queries)  # before the part: it is the commit
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    entry = {"shard": shard.index, "rows": writer.rows, "pairs": n_pairs, "stats": stats,
             "seconds": round(time.perf_counter() - t0, 3)}
    info = getattr(task, "info", None)
    if callable(info):  # strings a task reports (e.g. the LLM's model name)
        entry["info"] = info()
    return entry


QUERY_HASHES = ".qids"
"""Suffix of a part's sidecar: the 64-bit hashes of the query ids it holds, so that a run
can check that no query's lines were split between two shards."""


def query_hash(query_id: str) -> int:
    """A stable 64-bit hash of a query id (blake2b)."""
    return int.from_bytes(hashlib.blake2b(query_id.encode("utf-8"), digest_size=8).digest(),
                          "little")


def _write_query_hashes(directory: Path, part: str, hashes: list[int]) -> None:
    from .._io import create_temp

    fd, temp = create_temp(directory, part + QUERY_HASHES)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(np.asarray(hashes, dtype="<u8").tobytes())
        os.replace(temp, directory / (part + QUERY_HASHES))
    finally:
        temp.unlink(missing_ok=True)


def check_queries_whole(parts: Sequence[Path]) -> None:
    """Refuse a run in which one query id occurs in two shards' parts.

    Raises
    ------
    DataError
        Naming the two parts: the query's lines were not together in the input, so its
        list was processed in pieces (list-relative scores and filter results wrong).
    """
    arrays, owners = [], []
    for k, part in enumerate(parts):
        sidecar = part.with_name(part.name + QUERY_HASHES)
        if not sidecar.is_file():
            raise DataError(f"{sidecar}: missing; rerun with --overwrite.")
        hashes = np.frombuffer(sidecar.read_bytes(), dtype="<u8")
        arrays.append(hashes)
        owners.append(np.full(hashes.size, k))
    if not arrays:
        return
    hashes, owner = np.concatenate(arrays), np.concatenate(owners)
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if same.size:
        first, second = owner[order][same[0]], owner[order][same[0] + 1]
        raise DataError(
            f"a query's lines are in two places of the input (queries of {parts[first].name} "
            f"and {parts[second].name} share a query_id, {same.size} in all); sort the input "
            "by query_id (as `ragsieve export` writes it) so that each list is processed whole.")


@dataclass
class RunReport:
    """What a run did.

    Attributes
    ----------
    output : Path
        The output directory (or file, after merging).
    n_shards, n_resumed : int
        Shards in all, and shards a previous run had already finished.
    rows, pairs : int
        Records written and pairs read, over all parts (resumed ones included).
    stats : dict
        The task's counts, added up over all parts.
    seconds : float
        Wall time of this run.
    engine : dict
        The engine's description.
    info : dict
        Strings the task reported (e.g. the LLM's model name).
    new_stats : dict
        The counts of the parts written by this run only (``pairs`` among them).
    """

    output: Path
    n_shards: int
    n_resumed: int
    rows: int
    pairs: int
    stats: dict[str, float]
    seconds: float
    engine: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    new_stats: dict[str, float] = field(default_factory=dict)

    @property
    def pairs_per_second(self) -> float:
        """Pairs read per second in this run (resumed parts excluded)."""
        return self.new_stats.get("pairs", 0) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["output"] = str(self.output)
        out["pairs_per_second"] = round(self.pairs_per_second, 3)
        return out


def output_directory(out: str | os.PathLike[str]) -> Path:
    """Where a run writes its parts for ``out`` (``<out>.parts`` for a file output)."""
    return _output_dir(Path(out))[0]


def _output_dir(out: Path) -> tuple[Path, str | None]:
    """Where parts go, and the format of a single output file (None: a directory)."""
    suffix = out.suffix.lower()
    if suffix in (".jsonl", ".parquet"):
        return out.with_name(out.name + ".parts"), suffix[1:]
    return out, None


def _copy_parts(parts: Sequence[Path], sink: Any) -> None:
    """Stream the bytes of JSONL parts into an open binary file, in order."""
    for part in parts:
        with open(part, "rb") as source:
            while chunk := source.read(1 << 20):
                sink.write(chunk)


def _merge_parts(parts: Sequence[Path], out: Path, fmt: str, *, direct: bool = False) -> None:
    """Concatenate finished parts into one file, atomically (streaming, bounded memory);
    with ``direct`` (a JSONL output that is a device or a FIFO) written to it in place."""
    from .._io import create_temp

    if direct:
        with open(out, "wb") as sink:
            _copy_parts(parts, sink)
        return
    fd, temp = create_temp(out.parent, out.name)
    os.close(fd)
    try:
        if fmt == "jsonl":
            with open(temp, "wb") as sink:
                _copy_parts(parts, sink)
        else:
            from .._optional import require

            pq = require("pyarrow.parquet", "ray")
            writer = None
            for part in parts:
                handle = pq.ParquetFile(part)
                for g in range(handle.num_row_groups):
                    table = handle.read_row_group(g)
                    if writer is None:
                        writer = pq.ParquetWriter(temp, table.schema)
                    writer.write_table(table)
            if writer is None:  # no rows at all: an empty file of the parts' schema
                if not parts:
                    raise DataError(f"{out}: no parts to merge.")
                pq.write_table(pq.read_table(parts[0]), temp)
            else:
                writer.close()
        os.replace(temp, out)
    finally:
        temp.unlink(missing_ok=True)


def _check_output(out: Path, file_fmt: str | None) -> bool:
    """Whether the output file is written in place (a device or FIFO given for JSONL).

    Raises
    ------
    ValueError
        A special file given for Parquet or for a directory of parts, or a block device
        or a socket (see :func:`ragsieve._io.direct_target`).
    """
    from .._io import direct_target, special_kind

    kind = special_kind(out)
    if file_fmt is None and kind is not None:
        raise DataError(f"{out}: is a {kind}; expected an output directory, or a .jsonl / "
                        ".parquet file path. Nothing was written.")
    return direct_target(out, stream=file_fmt == "jsonl")


@dataclass(frozen=True)
class JobOutput:
    """Where a run writes, in which part format, and whether it may replace another run's.

    Attributes
    ----------
    path : path
        A directory (parts + manifest are kept there), or a file ending in ``.jsonl`` /
        ``.parquet``: parts go to ``<path>.parts/`` while the run lasts, then are merged
        into the file and removed. A ``.jsonl`` output that is a character device or a
        FIFO is written to in place (never replaced); a Parquet output, or a directory
        output, that is a special file is refused before any work.
    fmt : {"jsonl", "parquet"}, optional
        Part format of a directory output (default jsonl; a file's suffix decides for a
        file output).
    overwrite : bool
        Replace the output of another run instead of refusing.
    """

    path: str | os.PathLike[str]
    fmt: str | None = None
    overwrite: bool = False

    @classmethod
    def of(cls, out: str | os.PathLike[str] | JobOutput) -> JobOutput:
        """``out`` as a :class:`JobOutput` (a bare path: its defaults)."""
        return out if isinstance(out, JobOutput) else cls(out)


def run_job(task: Task, inputs: Sequence[str | os.PathLike[str]],
            out: str | os.PathLike[str] | JobOutput, engine: Engine, *,
            shard_bytes: int = DEFAULT_SHARD_BYTES, batch_pairs: int = DEFAULT_BATCH_PAIRS,
            progress: bool = False) -> RunReport:
    """Run ``task`` over the inputs with ``engine``, resumably.

    Parameters
    ----------
    task : Task
        What to compute per batch.
    inputs : sequence of path
        JSONL/Parquet files or directories of them.
    out : path or JobOutput
        Where to write (see :class:`JobOutput`); a bare path has its part format from
        its suffix (jsonl for a directory) and refuses another run's output.
    engine : Engine
        Local or Ray.
    shard_bytes : int
        Input bytes per shard (the unit of work and of resumption).
    batch_pairs : int
        Pairs per task call (whole queries).
    progress : bool
        Show a progress bar over shards.

    Returns
    -------
    RunReport

    Raises
    ------
    DataError
        Unreadable, invalid or empty input (naming file and byte/row), or an output that
        holds another run.
    """
    t0 = time.perf_counter()
    target_of = JobOutput.of(out)
    out, fmt, overwrite = Path(target_of.path), target_of.fmt, target_of.overwrite
    directory, file_fmt = _output_dir(out)
    if file_fmt is not None:
        if fmt is not None and fmt != file_fmt:
            raise ValueError(f"--format {fmt} contradicts the output file suffix {out.suffix}.")
        fmt = file_fmt
        if out.is_dir():
            raise DataError(f"{out}: is a directory; a file output needs a file path.")
    direct = _check_output(out, file_fmt)
    fmt = fmt or "jsonl"
    batch_pairs = check_int(batch_pairs, "batch_pairs", min_value=1)
    files = expand_inputs(inputs)
    check_not_empty(files)  # an empty input is an error, as for every other command
    shards = plan_shards(files, shard_bytes=shard_bytes)
    job = {"task": task.spec(), "inputs": input_fingerprint(files), "shard_bytes": shard_bytes}
    output = PartitionedOutput(directory, job, fmt=fmt, overwrite=overwrite)
    output.start(len(shards))
    done = output.done
    todo = [s for s in shards if s.index not in done]
    n_resumed = len(shards) - len(todo)
    if n_resumed:
        logger.warning("%s: resuming: %d of %d shards already written", directory, n_resumed,
                       len(shards))
    new_stats: dict[str, float] = {}
    for entry in engine.map_shards(task, todo, directory, fmt, batch_pairs, progress):
        output.record(int(entry["shard"]), {k: v for k, v in entry.items() if k != "shard"})
        merge_stats(new_stats, {**(entry.get("stats") or {}), "pairs": int(entry["pairs"])})
    stats: dict[str, float] = {}
    info: dict[str, Any] = {}
    rows = pairs = 0
    for entry in output.done.values():
        merge_stats(stats, entry.get("stats") or {})
        info.update(entry.get("info") or {})
        rows += int(entry["rows"])
        pairs += int(entry["pairs"])
    check_queries_whole(output.parts())
    output.finish(len(shards), summary={"rows": rows, "pairs": pairs, **stats})
    target = directory
    if file_fmt is not None:
        _merge_parts(output.parts(), out, fmt, direct=direct)
        import shutil

        shutil.rmtree(directory)
        target = out
    return RunReport(output=target, n_shards=len(shards), n_resumed=n_resumed, rows=rows,
                     pairs=pairs, stats=stats, seconds=time.perf_counter() - t0,
                     engine=engine.describe(), info=info,
                     new_stats=new_stats)
