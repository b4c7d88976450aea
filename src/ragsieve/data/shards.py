"""Cut large pair files into shards that keep every query's list whole.

A shard is a byte range of a JSONL file or a range of row groups of a Parquet file.
Planning reads only file sizes and Parquet footers, never the data, so a driver can plan
millions of pairs without loading them. A shard *owns* the queries whose first line (row)
starts inside it: its reader skips the lines that continue a query begun before its
start, and reads past its end until the last query it owns is complete. Every line is
therefore read by exactly one shard, and a query's list is never split, whatever the byte
boundaries are — provided the lines of one query are together in the file (as
``ragsieve export`` and every ragsieve output write them). A query whose lines are not
together is an error, reported where it is found (within a shard).

Finding a shard's edges is linear in the input however long its lines are: a shard reads
forwards at most to its end for its first line start, backwards once, a chunk at a time,
for the line before it, and that line only up to its ``query_id`` (a small JSON walker
that never holds the line). Only the lines a shard owns are held whole (it parses them).

Examples
--------
>>> import os, tempfile
>>> from ragsieve.data import write_pairs
>>> from ragsieve.types import Pair
>>> d = tempfile.mkdtemp()
>>> path = os.path.join(d, "pairs.jsonl")
>>> n = write_pairs([Pair(f"q{i // 3}", "Who?", f"s{i}", "text " * 20) for i in range(30)], path)
>>> shards = plan_shards([path], shard_bytes=500)
>>> owned = [[p.query_id for p in read_shard(s)] for s in shards]
>>> sum(len(o) for o in owned), all(len(set(o)) * 3 == len(o) for o in owned)
(30, True)
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ragsieve._validation import check_int
from ragsieve.errors import DataError
from ragsieve.types import Pair

from .jsonl import _check_score_field, parse_line
from .parquet import parquet_file

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "Shard",
    "check_not_empty",
    "expand_inputs",
    "input_fingerprint",
    "iter_input_pairs",
    "plan_shards",
    "query_batches",
    "read_shard",
]

logger = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 16 * 1024 * 1024
"""Bytes of input per shard: a unit of work and of resumption (one output part each)."""

_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
_CHUNK = 1 << 16
"""Bytes read at a time where a shard's edges are found (memory held there: one chunk)."""
_KEY_BYTES = 64  # a longer key is not "query_id", however it is escaped
_NOT_SPACE = re.compile(rb"[^ \t\r]")  # a newline ends the line: it is a token here
_DEPTH = {0x7B: 1, 0x5B: 1, 0x7D: -1, 0x5D: -1}  # { [ } ]
_SCALAR_END = re.compile(rb"[,}\]\s]")


@dataclass(frozen=True, slots=True)
class Shard:
    """One unit of work: a byte range of a JSONL file or row groups of a Parquet file.

    Attributes
    ----------
    index : int
        Position among all shards of a run; names the output part.
    path : str
        The input file.
    kind : {"jsonl", "parquet"}
    start, end : int
        Byte offsets (JSONL) or row-group numbers (Parquet), ``end`` exclusive.
    """

    index: int
    path: str
    kind: str
    start: int
    end: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shard:
        return cls(int(data["index"]), str(data["path"]), str(data["kind"]), int(data["start"]),
                   int(data["end"]))


def _kind(path: Path) -> str:
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{path}: expected a .jsonl or .parquet file of pairs, got suffix "
                        f"{path.suffix or '(none)'!r}.")
    return kind


def _skip_reason(entry: Path) -> str | None:
    """Why a directory entry is not read as input (None: it is a file of pairs)."""
    if entry.name.startswith("."):
        return "a hidden entry"
    if entry.is_dir():
        return "a subdirectory (only the directory's own files are read)"
    if not entry.is_file():
        return "not a regular file"
    if entry.suffix.lower() not in _SUFFIXES:
        return f"suffix {entry.suffix or '(none)'!r}, not .jsonl or .parquet"
    return None


def _directory_files(directory: Path) -> list[Path]:
    """The ``.jsonl`` / ``.parquet`` files of a directory in name order; every other entry
    is skipped with a logged warning naming it and why."""
    found = []
    for entry in sorted(directory.iterdir()):
        reason = _skip_reason(entry)
        if reason is None:
            found.append(entry)
        else:
            logger.warning("%s: skipped %s: %s", directory, entry.name, reason)
    return found


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files behind ``inputs``: files as given, directories as their ``*.jsonl`` and
    ``*.parquet`` files in name order (a ragsieve output directory: its finished parts).
    Any other entry of a directory (a subdirectory, a ``.json`` file, a hidden file) is
    skipped with a logged warning that names it and says why.

    Raises
    ------
    DataError
        A path that does not exist, a file that is not .jsonl/.parquet, or no file at all.
    """
    from .partitioned import finished_parts  # a directory written by ragsieve

    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = finished_parts(path)
            if found is None:
                found = _directory_files(path)
            if not found:
                raise DataError(f"{path}: directory holds no .jsonl or .parquet file of pairs.")
            files.extend(found)
        elif path.is_file():
            _kind(path)
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or directory; expected a JSONL or Parquet "
                            "file of pairs, or a directory of them.")
    if not files:
        raise DataError("no input files given; expected JSONL or Parquet files of pairs.")
    return files


def _has_pairs(path: Path) -> bool:
    """Whether a file can hold a pair: a Parquet file with a row, a JSONL file with a byte
    that is not whitespace (nor a UTF-8 byte-order mark)."""
    if _kind(path) == "parquet":
        return bool(parquet_file(path).metadata.num_rows)
    with open(path, "rb") as handle:
        first = True
        while chunk := handle.read(1 << 16):
            if first and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            first = False
            if chunk.strip():
                return True
    return False


def check_not_empty(files: Sequence[Path]) -> None:
    """Refuse inputs without a single pair (before any output is written).

    Raises
    ------
    DataError
        Every file is empty or blank (Parquet: has no row), naming the files.
    """
    if not any(_has_pairs(path) for path in files):
        names = ", ".join(str(p) for p in files[:3]) + (" ..." if len(files) > 3 else "")
        raise DataError(f"{names}: contains no pairs; expected one JSON object per line "
                        "(or Parquet rows) of (query, snippet) pairs.")


def input_fingerprint(files: Sequence[Path]) -> list[dict[str, Any]]:
    """What identifies the inputs of a run (path, size, modification time), to refuse
    resuming a run on changed inputs."""
    out = []
    for path in files:
        st = path.stat()
        out.append({"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def plan_shards(inputs: Sequence[str | os.PathLike[str]], *,
                shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Shard]:
    """Cut the inputs into shards of about ``shard_bytes`` (from sizes and footers only).

    Parameters
    ----------
    inputs : sequence of path
        JSONL/Parquet files or directories of them (see :func:`expand_inputs`).
    shard_bytes : int
        Target input bytes per shard (a Parquet shard holds whole row groups, at least one).

    Returns
    -------
    list of Shard
        In input order, numbered from 0.
    """
    shard_bytes = check_int(shard_bytes, "shard_bytes", min_value=1)
    shards: list[Shard] = []
    for path in expand_inputs(inputs):
        kind = _kind(path)
        if kind == "jsonl":
            size = path.stat().st_size
            for start in range(0, max(size, 1), shard_bytes):
                shards.append(Shard(len(shards), str(path), kind, start,
                                    min(start + shard_bytes, size)))
            continue
        pq = parquet_file(path)
        meta = pq.metadata
        first, acc = 0, 0
        for g in range(meta.num_row_groups):
            acc += meta.row_group(g).total_byte_size
            if acc >= shard_bytes or g == meta.num_row_groups - 1:
                shards.append(Shard(len(shards), str(path), kind, first, g + 1))
                first, acc = g + 1, 0
    return shards


# ----------------------------------------------------------------------------- reading


def _first_line_start(handle: Any, start: int, end: int) -> int | None:
    """Where the first line starting at or after ``start`` (> 0) starts, when that is before
    ``end``; None when no line starts in ``[start, end)`` (the shard owns nothing).

    Only ``[start - 1, end - 1)`` is read, a chunk at a time: a line crossing the whole
    shard is never read to its end here.
    """
    pos = start - 1
    handle.seek(pos)
    while pos < end - 1:
        chunk = handle.read(min(_CHUNK, end - 1 - pos))
        if not chunk:
            return None
        cut = chunk.find(b"\n")
        if cut >= 0:
            return pos + cut + 1
        pos += len(chunk)
    return None


def _previous_line(handle: Any, offset: int) -> int | None:
    """Where the last non-blank line ending before ``offset`` (a line start) starts, or None.

    Scans backwards once, a chunk at a time: every byte between that line's start and
    ``offset`` is read once (plus less than a chunk before it), and one chunk is held.
    """
    pos = offset
    blank = True  # what has been seen of the current line is whitespace
    while pos > 0:
        begin = max(0, pos - _CHUNK)
        handle.seek(begin)
        chunk = handle.read(pos - begin)
        stop = len(chunk)
        while True:
            cut = chunk.rfind(b"\n", 0, stop)
            if blank and chunk[cut + 1:stop].strip():
                blank = False
            if cut < 0:
                break
            if not blank:
                return begin + cut + 1
            stop = cut
        pos = begin
    return None if blank else 0


class _LineReader:
    """The bytes of one line from an offset on, a chunk at a time (the line ends at a
    newline): enough of a JSON reader to find a top-level key's value without holding
    the line."""

    def __init__(self, handle: Any, start: int) -> None:
        self.handle = handle
        handle.seek(start)
        self.buf = handle.read(_CHUNK)
        self.i = 3 if start == 0 and self.buf.startswith(b"\xef\xbb\xbf") else 0

    def _more(self) -> bool:
        self.buf, self.i = self.handle.read(_CHUNK), 0
        return bool(self.buf)

    def token(self) -> int | None:
        """The next byte that is not JSON whitespace (consumed); None where the line ends."""
        while True:
            found = _NOT_SPACE.search(self.buf, self.i)
            if found is not None:
                self.i = found.end()
                byte = self.buf[found.start()]
                return None if byte == 0x0A else byte
            if not self._more():
                return None

    def _segment(self) -> tuple[int, int]:
        """``(quote, stop)``: the next double quote from ``self.i`` in the chunk (-1: none)
        and where the bytes before it end (the chunk's end when there is none)."""
        quote = self.buf.find(b'"', self.i)
        return quote, len(self.buf) if quote < 0 else quote

    def string(self, keep: int | None) -> bytes | None:
        """The raw text of a string whose opening quote was read, up to its closing quote
        (consumed); only its first ``keep`` + 1 bytes are kept (``None``: all). None when
        the line ends first."""
        parts: list[bytes] = []
        kept = 0
        run = 0  # backslashes right before self.i (carried over a chunk's end)
        while True:
            quote, stop = self._segment()
            if self.buf.find(b"\n", self.i, stop) >= 0:
                return None
            back = stop
            while back > self.i and self.buf[back - 1] == 0x5C:  # backslash
                back -= 1
            run = stop - back + (run if back == self.i else 0)
            if keep is None or kept <= keep:
                parts.append(self.buf[self.i:stop])
                kept += stop - self.i
            if quote < 0:
                if not self._more():
                    return None
                continue
            self.i = quote + 1
            if run % 2 == 0:  # an unescaped quote: the end
                return b"".join(parts)
            if keep is None or kept <= keep:
                parts.append(b'"')
                kept += 1
            run = 0

    def nested(self) -> bool:
        """Skip an object or an array whose opening bracket was read (False: the line ends
        first). Between two strings the brackets are counted; in valid JSON the value can
        only close in the stretch where the count comes to 0, looked at byte by byte."""
        depth = 1
        while True:
            quote, stop = self._segment()
            if self.buf.find(b"\n", self.i, stop) >= 0:
                return False
            change = sum(self.buf.count(b, self.i, stop) for b in (b"{", b"[")) - sum(
                self.buf.count(b, self.i, stop) for b in (b"}", b"]"))
            if depth + change <= 0:
                for at in range(self.i, stop):
                    depth += _DEPTH.get(self.buf[at], 0)
                    if depth == 0:
                        self.i = at + 1
                        return True
            depth += change
            if quote < 0:
                if not self._more():
                    return False
                continue
            self.i = quote + 1
            if self.string(0) is None:
                return False

    def value(self, first: int, keep: bool) -> bytes | None:
        """Read a value whose first byte was read; its raw text when ``keep`` (a string's
        or a number's; b"" otherwise), None when the line ends first."""
        if first == 0x22:  # a string
            text = self.string(None if keep else 0)
            if text is None:
                return None
            return b'"' + text + b'"' if keep else b""
        if first in (0x7B, 0x5B):  # an object or an array: skipped
            return b"" if self.nested() else None
        parts = [bytes([first])]  # a number or a literal: up to the next delimiter
        while True:
            found = _SCALAR_END.search(self.buf, self.i)
            stop = len(self.buf) if found is None else found.start()
            parts.append(self.buf[self.i:stop])
            self.i = stop
            if found is not None or not self._more():
                return b"".join(parts) if keep else b""


def _query_id_at(handle: Any, start: int) -> str | None:
    """The query_id of the line starting at ``start``, read up to the end of that value
    (None when it cannot be told: no JSON object, no string or integer ``query_id``).

    A line's first top-level ``query_id`` is taken: a line with two is refused by its
    own shard (:func:`~ragsieve.data.jsonl.parse_line`), and so is a line that is not
    JSON past the value read here. Memory: a chunk and the value.
    """
    line = _LineReader(handle, start)
    if line.token() != 0x7B:  # {
        return None
    byte = line.token()
    while byte == 0x22:  # a key
        key = line.string(_KEY_BYTES)
        if key is None or line.token() != 0x3A:  # :
            return None
        first = line.token()
        if first is None:
            return None
        if _is_query_id(key):
            raw = line.value(first, keep=True)
            return None if raw is None else _query_id_of(raw)
        if line.value(first, keep=False) is None or line.token() != 0x2C:  # ,
            return None
        byte = line.token()
    return None


def _is_query_id(key: bytes) -> bool:
    if key == b"query_id":
        return True
    if b"\\" not in key or len(key) > _KEY_BYTES:
        return False
    try:
        return bool(json.loads(b'"' + key + b'"') == "query_id")
    except ValueError:
        return False


def _query_id_of(raw: bytes) -> str | None:
    """A query_id from its raw JSON value (a string or an integer), else None."""
    try:
        qid = json.loads(raw)
    except ValueError:
        return None
    return str(qid) if isinstance(qid, (str, int)) and not isinstance(qid, bool) else None


def _jsonl_lines(path: str, start: int, end: int) -> Iterator[tuple[int, bytes, str | None]]:
    """``(offset, raw line, query_id before the first line)`` from the first line that
    starts at or after ``start``, if it starts before ``end``; the third item is set on
    the first yield only."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc}).") from exc
    with handle:
        previous: str | None = None
        offset = 0
        if start > 0:
            first_line = _first_line_start(handle, start, end)
            if first_line is None:
                return  # no line starts in the shard: it owns nothing
            offset = first_line
            before = _previous_line(handle, offset)
            previous = None if before is None else _query_id_at(handle, before)
            handle.seek(offset)
        first = True
        for raw in handle:
            size = len(raw)
            if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # the byte-order mark; the line still starts at 0
            yield offset, raw, (previous if first else None)
            first = False
            offset += size


def _owned_jsonl(shard: Shard, require_labels: bool,
                 score_field: str | None) -> Iterator[tuple[Pair, str]]:
    previous: str | None = None
    current: str | None = None
    skipping = True
    for offset, raw, before in _jsonl_lines(shard.path, shard.start, shard.end):
        if before is not None:
            previous = before
        where = f"{shard.path}:byte {offset}"
        if offset >= shard.end and (current is None or skipping):
            return  # nothing owned starts here
        pair = parse_line(raw, where, require_labels=require_labels, score_field=score_field)
        if pair is None:
            continue
        if skipping:
            if previous is not None and pair.query_id == previous:
                continue  # the tail of a query owned by the shard before
            skipping = False
        if offset >= shard.end and pair.query_id != current:
            return  # the next query belongs to the next shard
        current = pair.query_id
        yield pair, where


def _owned_parquet(shard: Shard, require_labels: bool,
                   score_field: str | None) -> Iterator[tuple[Pair, str]]:
    from .parquet import iter_parquet_records, read_parquet_rows

    meta = parquet_file(shard.path).metadata
    rows_before = [0]
    for g in range(meta.num_row_groups):
        rows_before.append(rows_before[-1] + meta.row_group(g).num_rows)
    previous: str | None = None
    if shard.start > 0:
        ids = read_parquet_rows(shard.path, shard.start - 1, columns=["query_id"])
        previous = str(ids[-1]["query_id"]) if ids else None
    current: str | None = None
    skipping = True
    for g in range(shard.start, meta.num_row_groups):
        beyond = g >= shard.end
        if beyond and (current is None or skipping):
            return
        for pair, where in iter_parquet_records(shard.path, g, first_row=rows_before[g],
                                                require_labels=require_labels):
            if score_field is not None:
                _check_score_field(pair, score_field, where)
            if skipping:
                if previous is not None and pair.query_id == previous:
                    continue
                skipping = False
            if beyond and pair.query_id != current:
                return
            current = pair.query_id
            yield pair, where


def read_shard(shard: Shard, *, require_labels: bool = False,
               score_field: str | None = None) -> Iterator[Pair]:
    """The pairs a shard owns, in file order, each query's list whole and validated.

    Raises
    ------
    DataError
        An invalid line (naming ``file:byte N`` or ``file:row N``); a query whose lines
        are not together (it reappears after another query's lines); a duplicate snippet
        within a query; two texts for one query_id.
    """
    reader = _owned_jsonl if shard.kind == "jsonl" else _owned_parquet
    closed: set[str] = set()
    current: Pair | None = None
    snippets: set[str] = set()
    for pair, where in reader(shard, require_labels, score_field):
        if current is None or pair.query_id != current.query_id:
            if pair.query_id in closed:
                raise DataError(
                    f"{where}: query_id {pair.query_id!r} reappears after other queries; a "
                    "query's lines must be together (sort the input by query_id, as "
                    "`ragsieve export` writes it), so that its list is scored whole.")
            if current is not None:
                closed.add(current.query_id)
            current, snippets = pair, set()
        elif pair.query != current.query:
            raise DataError(f"{where}: query_id {pair.query_id!r} has query text "
                            f"{pair.query[:60]!r} and {current.query[:60]!r}; one query_id "
                            "must have one query text.")
        if pair.snippet_id in snippets:
            raise DataError(f"{where}: duplicate pair query_id={pair.query_id!r}, snippet_id="
                            f"{pair.snippet_id!r}; each snippet may appear once per query.")
        snippets.add(pair.snippet_id)
        yield pair


def iter_input_pairs(inputs: Sequence[str | os.PathLike[str]], *, require_labels: bool = False,
                     score_field: str | None = None) -> Iterator[Pair]:
    """Every pair of JSONL / Parquet files or directories of them (a ragsieve output
    directory: its finished parts), in order, shard by shard."""
    for shard in plan_shards(inputs):
        yield from read_shard(shard, require_labels=require_labels, score_field=score_field)


def query_batches(pairs: Iterator[Pair], max_pairs: int) -> Iterator[list[Pair]]:
    """Group consecutive pairs into lists of whole queries of at most ``max_pairs`` pairs
    (a query longer than that is one batch of its own)."""
    batch: list[Pair] = []
    query: list[Pair] = []
    for pair in pairs:
        if query and pair.query_id != query[0].query_id:
            if batch and len(batch) + len(query) > max_pairs:
                yield batch
                batch = []
            batch.extend(query)
            query = []
        query.append(pair)
    if batch and len(batch) + len(query) > max_pairs:
        yield batch
        batch = []
    batch.extend(query)
    if batch:
        yield batch
