"""The generic JSONL format: one (query, snippet) pair per line.

A line is a JSON object with the keys ``query_id``, ``query``, ``snippet_id``,
``text`` (required, non-empty), ``relevant`` (0, 1, ``true``, ``false``, ``null`` or
absent = unlabelled) and ``group`` (the topic for disjoint splits; defaults to
``query_id``). Ids (``query_id``, ``snippet_id``, ``group``, ``doc_id``) hold no control,
bidirectional-control or zero-width characters (NUL, newline, U+202E, U+200B, ...). A line
is strict JSON (:func:`ragsieve._validation.loads_json`, the parser of the HTTP service
too): no ``NaN``, no duplicate key, at most 64 levels of nesting, every number a finite
double, no lone surrogate (``"\\ud800"``) in any string. An optional ``evidence`` holds
the character spans of the snippet text that are evidence (``[[start, end], ...]``, what
the sentence unit labels its sentences by). Any further keys are kept in :attr:`ragsieve.types.Pair.meta` and
written back, so a read/write round trip loses nothing. See ``docs/data-format.md``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ragsieve._io import create_temp, direct_target
from ragsieve._spans import check_spans
from ragsieve._validation import (
    MAX_JSON_DEPTH,
    check_id,
    check_json_value,
    is_finite_number,
    loads_json,
    show_number,
)
from ragsieve.errors import DataError
from ragsieve.types import Pair, fingerprint_pairs

__all__ = [
    "EVIDENCE_KEY",
    "OPTIONAL_KEYS",
    "QUERY_LIST_KEYS",
    "REQUIRED_KEYS",
    "describe_pairs",
    "fingerprint_pairs",
    "group_by_query",
    "iter_pairs",
    "load_line",
    "pair_from_record",
    "pair_to_record",
    "parse_line",
    "read_pairs",
    "write_pairs",
]

logger = logging.getLogger(__name__)

REQUIRED_KEYS: tuple[str, ...] = ("query_id", "query", "snippet_id", "text")
"""Keys every line must have, each a non-empty string (ids may also be integers)."""

OPTIONAL_KEYS: tuple[str, ...] = ("relevant", "group")
"""Standard keys that may be absent or ``null``."""

QUERY_LIST_KEYS: tuple[str, ...] = ("answers", "nuggets")
"""Optional per-query keys (kept in ``Pair.meta``): lists of non-empty strings, the gold
answers and the gold nuggets of the query, used by answer evaluation. Lines of one query
that carry one of them must carry the same list."""

EVIDENCE_KEY = "evidence"
"""Optional per-line key (kept in ``Pair.meta``): the evidence spans of the snippet text, a
list of ``[start, end]`` integer character offsets with ``0 <= start < end <= len(text)``
(or null). The sentence unit (:func:`ragsieve.units.sentence_pairs`) marks a relevant
snippet's sentences that overlap a span as its evidence sentences."""

_STANDARD_KEYS = frozenset(REQUIRED_KEYS + OPTIONAL_KEYS)
_ID_KEYS = frozenset({"query_id", "snippet_id"})
_META_ID_KEYS = ("doc_id",)

PathOrFile = str | os.PathLike[str] | IO[Any]


# --------------------------------------------------------------------------- validation


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_id(value: str, key: str, where: str) -> str:
    """Return an id unchanged, or raise ``DataError`` when it holds a control,
    bidirectional-control or zero-width character (:func:`ragsieve._validation.check_id`,
    the HTTP service's definition too)."""
    try:
        return check_id(value, key)
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None


def _string_field(record: Mapping[str, Any], key: str, where: str) -> str:
    """Return ``record[key]`` as a non-empty string or raise ``DataError``."""
    if key not in record or record[key] is None:
        raise DataError(
            f"{where}: missing required key {key!r}; every line needs {list(REQUIRED_KEYS)}."
        )
    value = record[key]
    if key in _ID_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        accepted = "a string or an integer" if key in _ID_KEYS else "a string"
        raise DataError(f"{where}: {key} == {value!r} ({_type_name(value)}), must be {accepted}.")
    if not value.strip():
        raise DataError(f"{where}: {key} is empty, must be a non-empty string.")
    return _check_id(value, key, where) if key in _ID_KEYS else value


def _label_field(record: Mapping[str, Any], where: str, require_labels: bool) -> int | None:
    """Return the label as 0, 1 or ``None``; anything else is an error, never coerced."""
    value = record.get("relevant")
    if value is None:
        if require_labels:
            raise DataError(
                f"{where}: 'relevant' is missing or null, but labels are required here "
                "(calibration needs 0 or 1 on every line)."
            )
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value in (0, 1):
        return value
    shown = show_number(value) if isinstance(value, (int, float)) else f"{value!r:.80}"
    raise DataError(
        f"{where}: relevant == {shown} ({_type_name(value)}), must be one of 0, 1, true, "
        "false or null."
    )


def _group_field(record: Mapping[str, Any], where: str) -> str:
    """Return the group, or ``""`` (meaning: use the query id) when absent/null/empty."""
    value = record.get("group")
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataError(
            f"{where}: group == {value!r} ({_type_name(value)}), must be a string, an integer "
            "or null."
        )
    return _check_id(value, "group", where) if value.strip() else ""


def _string_list_field(record: Mapping[str, Any], key: str, where: str) -> None:
    """Check an optional per-query list (``answers``, ``nuggets``): absent, null, or a
    non-empty list of non-empty strings."""
    value = record.get(key)
    if value is None:
        return
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v.strip() for v in value)):
        raise DataError(
            f"{where}: {key} == {_shown_json(value, 80)} "
            f"({_type_name(value)}), must be a non-empty list of non-empty strings or null."
        )


def _pair_from_record(record: Any, where: str, require_labels: bool, *,
                      values_checked: bool = False) -> Pair:
    """The pair of one record; ``values_checked``: its strings and numbers are known to be
    valid already (parsed by :func:`loads_json`, or typed Parquet columns)."""
    if not isinstance(record, dict):
        raise DataError(
            f"{where}: expected a JSON object per line, got {_type_name(record)} "
            f"({_shown_json(record)})."
        )
    if not values_checked:
        _check_values(record, where)
    query_id, query, snippet_id, text = (_string_field(record, k, where) for k in REQUIRED_KEYS)
    for key in QUERY_LIST_KEYS:
        _string_list_field(record, key, where)
    if record.get(EVIDENCE_KEY) is not None:
        check_spans(record[EVIDENCE_KEY], len(text), where, name=EVIDENCE_KEY)
    for key in _META_ID_KEYS:
        if isinstance(record.get(key), str):
            _check_id(record[key], key, where)
    return Pair(
        query_id=query_id,
        query=query,
        snippet_id=snippet_id,
        text=text,
        relevant=_label_field(record, where, require_labels),
        group=_group_field(record, where),
        meta={k: v for k, v in record.items() if k not in _STANDARD_KEYS},
    )


class _Consistency:
    """Cross-line checks: unique (query_id, snippet_id), one query text per query_id, and
    one ``answers`` / ``nuggets`` list per query_id among the lines that carry one."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], str] = {}
        self.queries: dict[str, tuple[str, str]] = {}
        self.lists: dict[tuple[str, str], tuple[Any, str]] = {}

    def check(self, pair: Pair, where: str) -> None:
        key = (pair.query_id, pair.snippet_id)
        if key in self.seen:
            raise DataError(
                f"{where}: duplicate pair query_id={pair.query_id!r}, "
                f"snippet_id={pair.snippet_id!r} (first seen at {self.seen[key]}); each "
                "snippet may appear once per query."
            )
        self.seen[key] = where
        first = self.queries.setdefault(pair.query_id, (pair.query, where))
        if first[0] != pair.query:
            raise DataError(
                f"{where}: query_id {pair.query_id!r} has query text {pair.query[:60]!r}, but "
                f"{first[1]} gave {first[0][:60]!r}; one query_id must have one query text."
            )
        for name in QUERY_LIST_KEYS:
            value = pair.meta.get(name)
            if value is None:
                continue
            known = self.lists.setdefault((pair.query_id, name), (value, where))
            if known[0] != value:
                raise DataError(
                    f"{where}: query_id {pair.query_id!r} has {name} {value!r}, but {known[1]} gave "
                    f"{known[0]!r}; a query's {name} must be the same on every line that has them."
                )


# --------------------------------------------------------------------------- reading


def _source_name(source: PathOrFile) -> str:
    if isinstance(source, (str, os.PathLike)):
        return "<stdin>" if os.fspath(source) == "-" else os.fspath(source)
    return str(getattr(source, "name", "<stream>"))


def _binary_lines(source: PathOrFile, name: str, *, max_line_bytes: int | None = None,
                  what: str = "") -> Iterator[bytes]:
    """Yield raw lines of ``source``; file-system errors become ``DataError``.

    With ``max_line_bytes``, a longer line is refused (``DataError`` naming ``file:line``,
    its size, the limit and ``what`` the limit is for) before it is held whole: a file or
    stdin is read at most ``max_line_bytes + 1`` bytes of a line at a time.
    """
    if not isinstance(source, (str, os.PathLike)):
        for lineno, line in enumerate(source, start=1):
            raw = line.encode("utf-8") if isinstance(line, str) else line
            if max_line_bytes is not None and len(raw.rstrip(b"\r\n")) > max_line_bytes:
                raise _line_too_long(name, lineno, len(raw.rstrip(b"\r\n")), max_line_bytes, what)
            yield raw
        return
    if os.fspath(source) == "-":
        yield from _bounded_lines(sys.stdin.buffer, name, max_line_bytes, what)
        return
    try:
        handle = open(source, "rb")  # noqa: SIM115 - closed below, generator-friendly
    except FileNotFoundError:
        raise DataError(
            f"{name}: no such file; expected a JSONL file of (query, snippet) pairs."
        ) from None
    except IsADirectoryError:
        raise DataError(f"{name}: is a directory, expected a JSONL file.") from None
    except OSError as exc:
        raise DataError(f"{name}: cannot be read ({exc.strerror or exc}).") from exc
    with handle:
        try:
            yield from _bounded_lines(handle, name, max_line_bytes, what)
        except OSError as exc:  # pragma: no cover - I/O failure mid-read
            raise DataError(f"{name}: read failed ({exc.strerror or exc}).") from exc


def _bounded_lines(handle: IO[bytes], name: str, max_line_bytes: int | None,
                   what: str) -> Iterator[bytes]:
    """The lines of a binary file, none held whole beyond ``max_line_bytes`` (None: any)."""
    if max_line_bytes is None:
        yield from handle
        return
    lineno = 0
    while line := handle.readline(max_line_bytes + 1):
        lineno += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            size = len(line)
            while rest := handle.readline(1 << 20):  # counted a MiB at a time, not kept
                size += len(rest)
                if rest.endswith(b"\n"):
                    size -= 1
                    break
            raise _line_too_long(name, lineno, size, max_line_bytes, what)
        yield line


def _line_too_long(name: str, lineno: int, size: int, limit: int, what: str) -> DataError:
    return DataError(f"{name}:{lineno}: the line holds {size:,} bytes; a line may hold at most "
                     f"{limit:,}{what}.")


def _shown_json(value: Any, limit: int = 60) -> str:
    """The start of ``value`` as JSON, for a message (always printable)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def _check_values(record: Any, where: str) -> None:
    """``DataError`` unless every string of ``record`` is valid Unicode and every number a
    finite double (what :func:`loads_json` refuses in a line)."""
    try:
        check_json_value(record, "record")
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None


def load_line(line: str, where: str) -> Any:
    """Parse one line as strict JSON (:func:`ragsieve._validation.loads_json`).

    Raises
    ------
    DataError
        ``where: malformed JSON (...)`` for text that is not JSON; otherwise one line naming
        the field and the rule (``NaN``, a duplicate key, nesting deeper than 64, a number
        beyond a double, a lone surrogate).
    """
    try:
        return loads_json(line, "line")
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON ({exc}).") from None
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None


def _check_score_field(pair: Pair, field: str, where: str) -> None:
    value = pair.meta.get(field, ...)
    if value is ...:
        raise DataError(f"{where}: no {field!r} field; every line needs the outside score {field!r}.")
    if not is_finite_number(value):
        shown = show_number(value) if isinstance(value, (int, float)) else repr(value)[:60]
        raise DataError(f"{where}: {field!r} == {shown}, expected a finite number (the outside score).")


def parse_line(
    raw: bytes, where: str, *, require_labels: bool = False, score_field: str | None = None
) -> Pair | None:
    """Decode, parse and validate one JSONL line (``None`` for a blank line).

    Parameters
    ----------
    raw : bytes
        The line, with or without its newline (a UTF-8 byte-order mark is not stripped).
    where : str
        Where the line is (``file:line``), named in errors.
    require_labels, score_field
        As in :func:`iter_pairs`.

    Returns
    -------
    Pair or None

    Raises
    ------
    DataError
        For bytes that are not UTF-8, malformed JSON (or JSON :func:`load_line` refuses)
        or an invalid record. Cross-line checks (duplicates, one text per query_id) are
        the caller's.
    """
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: bytes are not valid UTF-8 (byte {raw[exc.start : exc.start + 1]!r} at "
            f"column {exc.start + 1}); save the file as UTF-8."
        ) from None
    if not line.strip():
        return None
    record = load_line(line, where)
    pair = _pair_from_record(record, where, require_labels, values_checked=True)
    if score_field is not None:
        _check_score_field(pair, score_field, where)
    return pair


def iter_pairs(
    source: PathOrFile, *, require_labels: bool = False, score_field: str | None = None
) -> Iterator[Pair]:
    """Stream the pairs of a JSONL file, validating every line.

    Parameters
    ----------
    source : str, os.PathLike or file object
        Path of the file, ``"-"`` for standard input, or an open (text or binary) file.
    require_labels : bool, default False
        If True, a missing or null ``relevant`` is an error (needed for calibration).
    score_field : str, optional
        A key every line must carry as a finite number (an outside score, see
        ``FieldScorer``); a missing, non-numeric or NaN value is an error naming file:line.

    Yields
    ------
    Pair
        One pair per non-blank line, in file order.

    Raises
    ------
    DataError
        With ``file:line`` for: unreadable file, bytes that are not UTF-8, malformed
        JSON, ``NaN``, a duplicate key, nesting deeper than 64 levels, a number beyond the
        range of a double (a 400-digit integer), a lone surrogate in any string, a line
        that is not an object, a missing/empty/mistyped required key, an id
        (``query_id``, ``snippet_id``, ``group``, ``doc_id``) holding a control,
        bidirectional-control or zero-width character (NUL, newline, U+202E, U+200B,
        ...), a label outside {0, 1, true, false, null}, ``evidence`` that is not a list of
        ``[start, end]`` spans inside the text, a duplicate (query_id, snippet_id),
        two query texts for one query_id, or a file without any pair.
    """
    name = _source_name(source)
    consistency = _Consistency()
    n = 0
    for lineno, raw in enumerate(_binary_lines(source, name), start=1):
        where = f"{name}:{lineno}"
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        pair = parse_line(raw, where, require_labels=require_labels, score_field=score_field)
        if pair is None:
            continue
        consistency.check(pair, where)
        n += 1
        yield pair
    if n == 0:
        raise DataError(f"{name}: contains no pairs; expected one JSON object per line.")


def read_pairs(
    source: PathOrFile, *, require_labels: bool = False, score_field: str | None = None
) -> list[Pair]:
    """Read and validate a JSONL file of (query, snippet) pairs.

    Parameters
    ----------
    source : str, os.PathLike or file object
        Path of the file, ``"-"`` for standard input, or an open file.
    require_labels : bool, default False
        If True, every line must have ``relevant`` equal to 0 or 1.
    score_field : str, optional
        A key every line must hold as a finite number (see :func:`iter_pairs`).

    Returns
    -------
    list of Pair
        The pairs in file order; unknown keys are kept in ``Pair.meta``.

    Raises
    ------
    DataError
        When the file is unreadable or any line is invalid (see :func:`iter_pairs`).

    Examples
    --------
    >>> import io
    >>> line = '{"query_id": "q1", "query": "Who?", "snippet_id": "s1", "text": "Ada.", "relevant": 1}'
    >>> read_pairs(io.StringIO(line))[0].group
    'q1'
    """
    return list(iter_pairs(source, require_labels=require_labels, score_field=score_field))


# --------------------------------------------------------------------------- writing


def pair_from_record(record: Any, where: str, *, require_labels: bool = False) -> Pair:
    """Validate one decoded record (a JSON object of the generic format) into a Pair.

    Its strings and numbers are checked as a line's are (no lone surrogate, every number
    a finite double).

    Raises
    ------
    DataError
        Naming ``where`` and the field, as :func:`iter_pairs` does.
    """
    return _pair_from_record(record, where, require_labels)


def pair_to_record(pair: Pair) -> dict[str, Any]:
    """The JSON object of one pair (standard keys first, then ``meta``), as written by
    :func:`write_pairs`."""
    return _pair_to_record(pair)


def _pair_to_record(pair: Pair) -> dict[str, Any]:
    if not isinstance(pair, Pair):
        raise TypeError(f"write_pairs expects Pair objects, got {type(pair).__name__}.")
    clash = _STANDARD_KEYS.intersection(pair.meta)
    if clash:
        raise DataError(
            f"pair ({pair.query_id!r}, {pair.snippet_id!r}) has meta keys {sorted(clash)} that "
            "clash with standard fields; rename them."
        )
    record: dict[str, Any] = {
        "query_id": pair.query_id,
        "query": pair.query,
        "snippet_id": pair.snippet_id,
        "text": pair.text,
        "relevant": pair.relevant,
        "group": pair.group,
    }
    record.update(pair.meta)
    return record


def _serialise(pairs: Iterable[Pair], out: IO[str]) -> int:
    consistency = _Consistency()
    n = 0
    for n, pair in enumerate(pairs, start=1):
        record = _pair_to_record(pair)
        where = f"pair #{n}"
        # Validate exactly as the reader will, so a written file is always readable.
        _pair_from_record(record, where, require_labels=False, values_checked=True)
        consistency.check(pair, where)
        try:
            line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: meta is not JSON-serialisable ({exc}).") from exc
        except RecursionError:
            raise DataError(f"{where}: meta is nested too deeply to be written as JSON.") from None
        _check_values(record, where)  # a lone surrogate, a number beyond a double
        if line.count("[") + line.count("{") > MAX_JSON_DEPTH:
            load_line(line, where)  # nesting the reader refuses
        out.write(line + "\n")
    return n


def write_pairs(pairs: Iterable[Pair], destination: PathOrFile) -> int:
    """Write pairs as JSONL (UTF-8), atomically when writing to a path.

    Parameters
    ----------
    pairs : iterable of Pair
        The pairs; ``meta`` keys become extra keys of each line.
    destination : str, os.PathLike or text file object
        A path (written to a temporary file in the same directory, then renamed, so
        readers never see a half-written file; a character device or a FIFO is written
        in place, a block device or a socket refused), ``"-"`` for standard output, or an
        open text file.

    Returns
    -------
    int
        Number of lines written.

    Raises
    ------
    DataError
        When a pair would not read back (invalid field, duplicate, clashing or
        non-JSON meta); nothing is written to a path in that case.
    TypeError
        When an item is not a :class:`~ragsieve.types.Pair`.
    """
    if not isinstance(destination, (str, os.PathLike)):
        return _serialise(pairs, destination)
    if os.fspath(destination) == "-":
        return _serialise(pairs, sys.stdout)
    path = Path(destination)
    if direct_target(path):  # a device or FIFO: written in place, never replaced
        with open(path, "w", encoding="utf-8", newline="\n") as handle:
            return _serialise(pairs, handle)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a file path for the JSONL output.")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise DataError(f"{path}: directory {directory} does not exist; create it first.")
    fd, tmp = create_temp(directory, path.name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            n = _serialise(pairs, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.debug("wrote %d pairs to %s", n, path)
    return n


# --------------------------------------------------------------------------- helpers


def group_by_query(pairs: Iterable[Pair]) -> dict[str, list[int]]:
    """Map each query id to the indices of its pairs, in first-appearance order.

    Examples
    --------
    >>> ps = [Pair("a", "?", "1", "x"), Pair("b", "?", "1", "y"), Pair("a", "?", "2", "z")]
    >>> group_by_query(ps)
    {'a': [0, 2], 'b': [1]}
    """
    out: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        out.setdefault(pair.query_id, []).append(i)
    return out


def describe_pairs(pairs: Sequence[Pair]) -> dict[str, int | float]:
    """Summary counts of a list of pairs.

    Returns
    -------
    dict
        ``n_queries``, ``n_pairs``, ``n_snippets`` (unique snippet ids), ``n_groups``,
        ``n_relevant``, ``n_unlabelled``, ``snippets_per_query`` and
        ``relevant_per_query`` (means), and ``queries_without_relevant``.
    """
    by_query = group_by_query(pairs)
    n_queries = len(by_query)
    n_relevant = sum(1 for p in pairs if p.relevant == 1)
    without = sum(1 for idx in by_query.values() if not any(pairs[i].relevant == 1 for i in idx))
    return {
        "n_queries": n_queries,
        "n_pairs": len(pairs),
        "n_snippets": len({p.snippet_id for p in pairs}),
        "n_groups": len({p.group for p in pairs}),
        "n_relevant": n_relevant,
        "n_unlabelled": sum(1 for p in pairs if p.relevant is None),
        "snippets_per_query": len(pairs) / n_queries if n_queries else 0.0,
        "relevant_per_query": n_relevant / n_queries if n_queries else 0.0,
        "queries_without_relevant": without,
    }
