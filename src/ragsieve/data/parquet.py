"""The generic pair format as Parquet: the same fields as the JSONL lines, in columns.

A Parquet file of pairs has the string columns ``query_id``, ``query``, ``snippet_id``,
``text`` (required), ``relevant`` (0/1 or null) and ``group``; any other column becomes a
``Pair.meta`` key, and a string column ``meta`` holds further keys as one JSON object per
row (how :func:`records_table` stores keys that have no column of their own), parsed as
strictly as a JSONL line (:func:`~ragsieve.data.jsonl.load_line`). Rows are validated
exactly like JSONL lines; errors name ``file:row N`` (a string cell that is not UTF-8, such
as an encoded lone surrogate, too).

Needs ``pyarrow`` (extra ``ray``, or any install of pyarrow).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ragsieve._optional import require
from ragsieve.errors import DataError
from ragsieve.types import Pair

from .jsonl import _pair_from_record, load_line, pair_to_record

__all__ = [
    "META_COLUMN",
    "PAIR_COLUMNS",
    "iter_parquet_records",
    "pairs_table",
    "parquet_file",
    "read_parquet_rows",
    "records_table",
]

PAIR_COLUMNS: tuple[str, ...] = ("query_id", "query", "snippet_id", "text", "relevant", "group")
"""The standard columns, in the order written."""

META_COLUMN = "meta"
"""A string column holding the remaining keys of each row as a JSON object."""


def _pa() -> Any:
    return require("pyarrow", "ray")


def _pq() -> Any:
    return require("pyarrow.parquet", "ray")


def parquet_file(path: str | os.PathLike[str]) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` (only the footer is read when opened).

    Raises
    ------
    DataError
        The file cannot be read or is not Parquet (the message names it).
    """
    try:
        return _pq().ParquetFile(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc}).") from exc


def _record(row: dict[str, Any], where: str) -> dict[str, Any]:
    meta = row.pop(META_COLUMN, None)
    if meta is not None:
        extra = load_line(meta, f"{where}: column {META_COLUMN!r}") if isinstance(meta, str) \
            else None
        if not isinstance(extra, dict):
            raise DataError(f"{where}: column {META_COLUMN!r} == {str(meta)[:60]!r}, expected a "
                            "JSON object (a string) or null.")
        clash = set(extra).intersection(row)
        if clash:
            raise DataError(f"{where}: keys {sorted(clash)} are both columns and keys of "
                            f"{META_COLUMN!r}; keep one.")
        row.update(extra)
    return row


def read_parquet_rows(
    path: str | os.PathLike[str], row_group: int, *, columns: Sequence[str] | None = None,
    first_row: int | None = None,
) -> list[dict[str, Any]]:
    """The rows of one row group as dicts (``columns`` limits what is read).

    ``first_row``, the number of rows in the groups before, lets an error name its row.

    Raises
    ------
    DataError
        The row group cannot be read, or a string cell is not UTF-8 (naming ``file:row N``
        and the column when ``first_row`` is given).
    """
    try:
        table = parquet_file(path).read_row_group(
            row_group, columns=list(columns) if columns else None)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: row group {row_group} cannot be read ({exc}).") from exc
    try:
        rows: list[dict[str, Any]] = table.to_pylist()
    except UnicodeDecodeError as exc:
        raise _not_utf8(table, path, row_group, first_row) or DataError(
            f"{path}: row group {row_group}: a string is not valid UTF-8 ({exc}).") from None
    return rows


def _not_utf8(table: Any, path: str | os.PathLike[str], row_group: int,
              first_row: int | None) -> DataError | None:
    """The error naming the first string cell of ``table`` that is not UTF-8 (a lone
    surrogate written as bytes, ``b"\\xed\\xa0\\x80"``, among them)."""
    for name in table.column_names:
        column = table.column(name)
        try:
            column.to_pylist()
            continue
        except UnicodeDecodeError:
            pass
        for i in range(len(column)):
            try:
                column[i].as_py()
            except UnicodeDecodeError as exc:
                where = f"{path}:row {first_row + i + 1}" if first_row is not None else \
                    f"{path}: row group {row_group}, row {i + 1} of the group"
                bad = exc.object[exc.start:exc.start + 3]
                return DataError(
                    f"{where}: column {name!r} is not valid UTF-8 (bytes {bad!r} at byte "
                    f"{exc.start}, e.g. an encoded lone surrogate); strings must be valid "
                    "Unicode.")
    return None


def iter_parquet_records(
    path: str | os.PathLike[str], row_group: int, *, first_row: int, require_labels: bool = False
) -> Iterator[tuple[Pair, str]]:
    """Validated pairs of one row group, each with where it came from (``file:row N``).

    ``first_row`` is the number of rows in the groups before (for error messages).
    """
    for k, row in enumerate(read_parquet_rows(path, row_group, first_row=first_row)):
        where = f"{path}:row {first_row + k + 1}"
        row = {key: value for key, value in row.items() if value is not None or key in PAIR_COLUMNS}
        # typed columns hold no lone surrogate or 400-digit integer (Arrow refuses them);
        # the meta column is parsed by load_line
        yield _pair_from_record(_record(row, where), where, require_labels,
                                values_checked=True), where


def records_table(records: Iterable[dict[str, Any]], *, columns: Sequence[str] = (),
                  float_columns: Sequence[str] = ()) -> Any:
    """An Arrow table of pair records (as :func:`~ragsieve.data.jsonl.pair_to_record`
    gives): the standard columns, one column per name in ``columns`` (a key present on
    every record, e.g. the score), and the other keys as JSON in :data:`META_COLUMN`.
    Columns named in ``float_columns`` are float64 even when empty."""
    pa = _pa()
    names = (*PAIR_COLUMNS, *columns)
    data: dict[str, list[Any]] = {name: [] for name in (*names, META_COLUMN)}
    for record in records:
        rest = dict(record)
        for name in names:
            data[name].append(rest.pop(name, None))
        data[META_COLUMN].append(json.dumps(rest, ensure_ascii=False, allow_nan=False)
                                 if rest else None)
    types = {"relevant": pa.int8()}
    arrays = [pa.array(data[n], type=types.get(n, pa.string())) for n in PAIR_COLUMNS]
    arrays += [pa.array(data[n], type=pa.float64() if n in float_columns else None)
               for n in columns]
    arrays.append(pa.array(data[META_COLUMN], type=pa.string()))
    return pa.table(arrays, names=[*names, META_COLUMN])


def pairs_table(pairs: Iterable[Pair], *, columns: Sequence[str] = ()) -> Any:
    """:func:`records_table` of pairs (their meta keys named in ``columns`` get columns)."""
    return records_table((pair_to_record(p) for p in pairs), columns=columns)
