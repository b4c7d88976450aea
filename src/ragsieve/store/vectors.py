"""Exact search over an index's stored vectors: the ``k`` nearest by cosine, as hits.

By default (``"memory"``) the vectors are read once into a numpy matrix, re-read when the
table's version changes, and searched with one matrix-vector product, much faster than
LanceDB's brute force (``benchmarks/bench_store.py``; the times are in the integrations
guide). The matrix costs ``4 * dim`` bytes per snippet; ``"lancedb"`` searches on disk
instead, without that memory.

A hit's score is ``1 - cos`` of the stored unit vectors, the score of
:class:`~ragsieve.scoring.EmbeddingScorer` on the same model, so a filter calibrated with
that scorer applies to hits unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..embeddings.base import cosine_distances
from .records import Hit
from .tables import SNIPPETS, SnippetTables

__all__ = ["SEARCH_BACKENDS", "VectorSearch"]

logger = logging.getLogger(__name__)

SEARCH_BACKENDS = ("memory", "lancedb")


class VectorSearch:
    """The exact nearest-neighbour search of one index's ``snippets`` table.

    Parameters
    ----------
    tables : SnippetTables
        The index's tables.
    backend : {"memory", "lancedb"}
        Search an in-memory copy of the vectors, or LanceDB's brute force on disk.

    Raises
    ------
    ValueError
        Another backend.
    """

    def __init__(self, tables: SnippetTables, backend: str = "memory") -> None:
        if backend not in SEARCH_BACKENDS:
            raise ValueError(f"search == {backend!r}, must be one of {SEARCH_BACKENDS}.")
        self.tables = tables
        self.backend = backend
        self._snapshot: tuple[int, np.ndarray, Any] | None = None  # (version, vectors, rows)

    def nearest(self, qvec: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` hits of one query vector (the search itself, for every caller)."""
        table = self.tables.table(SNIPPETS)
        if self.backend == "memory":
            matrix, table_rows = self._vectors(table)
            if not len(matrix):
                return []
            top = np.argpartition(-(matrix @ qvec), min(k, len(matrix)) - 1)[:k]
            rows = table_rows.take(top).to_pylist()
            vecs = matrix[top]
        else:
            if table.count_rows() == 0:
                return []
            rows = table.search(qvec).distance_type("cosine").limit(k).to_list()
            if not rows:
                return []
            vecs = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        scores = cosine_distances(qvec, vecs)
        hits = [
            Hit(snippet_id=r["snippet_id"], doc_id=r["doc_id"], path=r["path"],
                start=int(r["start"]), end=int(r["end"]), text=r["text"],
                vector=vecs[i], score=float(scores[i]))
            for i, r in enumerate(rows)
        ]
        hits.sort(key=lambda h: (h.score, h.snippet_id))
        return hits

    def _vectors(self, table: Any) -> tuple[np.ndarray, Any]:
        """``(vectors (n, dim) float32, rows without vectors)`` of the table's current version."""
        version = int(table.version)
        if self._snapshot is None or self._snapshot[0] != version:
            arrow = table.to_arrow()
            column = arrow.column("vector").combine_chunks()
            matrix = np.asarray(column.flatten(), dtype=np.float32).reshape(len(arrow), self.tables.dim)
            self._snapshot = (version, matrix, arrow.drop_columns(["vector"]))
            logger.debug("loaded %d vectors of %s (version %d)", len(arrow), self.tables.path, version)
        return self._snapshot[1], self._snapshot[2]
