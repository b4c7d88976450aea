"""The two LanceDB tables of an index directory and the order they are written in.

``snippets`` holds one row per snippet (text, offsets, file hash, unit vector), ``files``
one row per indexed file (path, sha256, number of snippets). For a group of files the
``files`` rows are deleted first, then the old snippet rows, then the new snippets are
added and only then the ``files`` rows: a file whose ``files`` row is missing or has
another hash is re-done on the next run (its snippet rows deleted first), so a killed run
leaves no duplicate. :meth:`SnippetTables.repair` deletes what unlocked writers of older
versions left (extra copies of rows, files with rows of two versions).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._optional import require
from ..types import Snippet
from .records import IndexMissingError

__all__ = ["FILES", "META_NAME", "SNIPPETS", "SnippetTables"]

logger = logging.getLogger(__name__)

#: the index's metadata file (model, dim, chunking); its absence means the index is gone
META_NAME = "ragsieve_index.json"
SNIPPETS = "snippets"
FILES = "files"
_IDS_PER_READ = 500  # ids per filtered read of vectors_of
#: ``(path, sha256, snippets)`` of each file of a group committed together
FileGroup = list[tuple[str, str, list[Snippet]]]


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _in_list(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(_quote(v) for v in values)})"


class SnippetTables:
    """The ``snippets`` and ``files`` tables of the index at ``path`` (vectors of ``dim``).

    Parameters
    ----------
    path : pathlib.Path
        The index directory (a LanceDB database).
    dim : int
        The embedding dimension of the stored vectors.
    """

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.dim = dim
        self._db = require("lancedb", "store").connect(str(path))

    def schemas(self) -> dict[str, Any]:
        """The pyarrow schema of each table."""
        pa = require("pyarrow", "store")
        return {
            SNIPPETS: pa.schema([
                ("snippet_id", pa.string()), ("doc_id", pa.string()), ("path", pa.string()),
                ("start", pa.int64()), ("end", pa.int64()), ("text", pa.string()),
                ("file_sha256", pa.string()), ("vector", pa.list_(pa.float32(), self.dim)),
            ]),
            FILES: pa.schema([
                ("path", pa.string()), ("sha256", pa.string()), ("n_snippets", pa.int64()),
            ]),
        }

    def table(self, name: str) -> Any:
        """Table ``name`` (created empty in a new index, never in a removed one).

        Raises
        ------
        IndexMissingError
            The index directory or its metadata file is gone.
        """
        if not (self.path / META_NAME).is_file():
            raise IndexMissingError(
                f"index {str(self.path)!r} is gone (no {META_NAME} in it any more); it was "
                "removed or moved while open. Rebuild it with `ragsieve index DOCS --index "
                f"{self.path}` and restart, or restore the directory."
            )
        return self._db.create_table(name, schema=self.schemas()[name], exist_ok=True)

    def rows(self, name: str, columns: list[str]) -> list[dict[str, Any]]:
        """``columns`` of every row of table ``name`` (the vectors are not read)."""
        query = self.table(name).search().select(columns).limit(None)
        rows: list[dict[str, Any]] = query.to_arrow().to_pylist()
        return rows

    def count(self) -> int:
        """Number of stored snippets."""
        return int(self.table(SNIPPETS).count_rows())

    def vectors_of(self, snippet_ids: Sequence[str]) -> dict[str, tuple[str, np.ndarray]]:
        """``{snippet_id: (text, vector)}`` of the stored snippets among ``snippet_ids``
        (ids the index does not hold are left out), read in chunks of ids."""
        ids = list(dict.fromkeys(snippet_ids))
        table = self.table(SNIPPETS)
        out: dict[str, tuple[str, np.ndarray]] = {}
        for i in range(0, len(ids), _IDS_PER_READ):
            where = _in_list("snippet_id", ids[i : i + _IDS_PER_READ])
            arrow = (table.search().where(where).select(["snippet_id", "text", "vector"])
                     .limit(None).to_arrow())
            if not len(arrow):
                continue
            vectors = np.asarray(arrow.column("vector").combine_chunks().flatten(),
                                 dtype=np.float32).reshape(len(arrow), self.dim)
            for sid, text, vec in zip(arrow.column("snippet_id").to_pylist(),
                                      arrow.column("text").to_pylist(), vectors):
                out[str(sid)] = (str(text), vec)
        return out

    def files(self) -> dict[str, str]:
        """``{path: sha256}`` of the committed files."""
        return {r["path"]: r["sha256"] for r in self.rows(FILES, ["path", "sha256"])}

    def add(self, group: FileGroup, vecs: np.ndarray) -> None:
        """Store a group of files with their snippets' vectors (in the order of the module
        docstring: old rows deleted, snippets added, then the ``files`` rows)."""
        pa = require("pyarrow", "store")
        schemas = self.schemas()
        snippets = [s for _, _, snips in group for s in snips]
        rels = [rel for rel, _, _ in group]
        self.delete(rels)
        file_of = {id(s): (rel, sha) for rel, sha, snips in group for s in snips}
        rows = pa.table({
            "snippet_id": [s.snippet_id for s in snippets],
            "doc_id": [s.doc_id for s in snippets],
            "path": [file_of[id(s)][0] for s in snippets],
            "start": [s.start for s in snippets],
            "end": [s.end for s in snippets],
            "text": [s.text for s in snippets],
            "file_sha256": [file_of[id(s)][1] for s in snippets],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), self.dim),
        }, schema=schemas[SNIPPETS])
        self.table(SNIPPETS).add(rows)
        self.table(FILES).add(pa.table({
            "path": rels, "sha256": [sha for _, sha, _ in group],
            "n_snippets": [len(snips) for _, _, snips in group],
        }, schema=schemas[FILES]))

    def repair(self) -> int:
        """Delete the duplicate rows concurrent unlocked writers left; return how many
        snippet rows were copies of another.

        A file is consistent when it has one ``files`` row and exactly its ``n_snippets``
        snippet rows, all of its hash (a JSONL file may repeat a snippet id on purpose).
        Otherwise, when the distinct snippet rows are exactly the ``n_snippets`` of the
        one hash its rows carry, the extra copies are deleted (nothing is re-embedded);
        when rows of two versions are mixed, every row of the file is deleted and the
        file is embedded again by this run. Rewrites follow the commit order of the
        module docstring, so a run killed here is repaired by the next.
        """
        files: dict[str, list[tuple[str, int]]] = {}
        for r in self.rows(FILES, ["path", "sha256", "n_snippets"]):
            files.setdefault(r["path"], []).append((r["sha256"], int(r["n_snippets"])))
        rows: dict[str, list[tuple[str, int, int, str]]] = {}
        for r in self.rows(SNIPPETS, ["path", "snippet_id", "start", "end", "file_sha256"]):
            rows.setdefault(r["path"], []).append(
                (r["snippet_id"], int(r["start"]), int(r["end"]), r["file_sha256"]))
        dedupe: dict[str, tuple[str, int]] = {}
        redo: list[str] = []
        n_duplicates = 0
        for path, entries in files.items():
            mine = rows.get(path, [])
            shas = {sha for sha, _ in entries} | {r[3] for r in mine}
            if len(entries) == 1 and len(shas) == 1 and len(mine) == entries[0][1]:
                continue
            n_duplicates += len(mine) - len(set(mine))
            if len(shas) == 1 and len(set(mine)) == entries[0][1]:
                dedupe[path] = entries[0]
            else:
                redo.append(path)
        if redo:
            logger.warning("index %s: the rows of %s are inconsistent (two versions, or "
                           "snippets missing); embedding them again", self.path, redo)
            self.delete(redo)
        if dedupe:
            self._rewrite_distinct(dedupe)
        if n_duplicates:
            logger.warning("index %s: deleted %d duplicate snippet row(s) of %d file(s)",
                           self.path, n_duplicates, len(dedupe) + len(redo))
        return n_duplicates

    def _rewrite_distinct(self, files: dict[str, tuple[str, int]]) -> None:
        """Store one copy of each snippet row, and one ``files`` row, of ``files``."""
        pa = require("pyarrow", "store")
        rels = sorted(files)
        snippets = self.table(SNIPPETS)
        table = pa.concat_tables([
            snippets.search().where(_in_list("path", rels[i : i + 500])).limit(None).to_arrow()
            for i in range(0, len(rels), 500)
        ]).cast(self.schemas()[SNIPPETS])
        keys = zip(*(table.column(c).to_pylist()
                     for c in ("path", "snippet_id", "start", "end", "file_sha256")))
        first: dict[tuple[Any, ...], int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        distinct = table.take(pa.array(sorted(first.values()), type=pa.int64()))
        self.delete(rels)
        snippets.add(distinct)
        self.table(FILES).add(pa.table({
            "path": rels, "sha256": [files[r][0] for r in rels],
            "n_snippets": [files[r][1] for r in rels],
        }, schema=self.schemas()[FILES]))

    def delete(self, rels: Sequence[str]) -> None:
        """Delete the file rows, then the snippet rows, of ``rels``."""
        for i in range(0, len(rels), 500):
            where = _in_list("path", rels[i : i + 500])
            self.table(FILES).delete(where)
            self.table(SNIPPETS).delete(where)
