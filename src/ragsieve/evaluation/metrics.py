"""Coverage and removal metrics on keep-masks.

All functions take flat arrays with one entry per (query, snippet) pair:
``kept`` (bool), ``relevant`` (bool), ``query_index`` (int) and ``lengths`` (int).
"""

from __future__ import annotations

import numpy as np

# defined with the scores that need it (the "rank" relative score); re-exported here
from ..scoring.relative import within_query_rank

__all__ = ["char_removal", "coverage", "query_coverage", "removal", "within_query_rank"]


def coverage(kept: np.ndarray, relevant: np.ndarray) -> float:
    """Micro coverage: the fraction of relevant snippets that are kept.

    Returns NaN when there is no relevant snippet.

    Examples
    --------
    >>> coverage(np.array([True, False, True]), np.array([True, True, False]))
    0.5
    """
    rel = np.asarray(relevant, dtype=bool)
    if not rel.any():
        return float("nan")
    return float(np.asarray(kept, dtype=bool)[rel].mean())


def query_coverage(kept: np.ndarray, relevant: np.ndarray, query_index: np.ndarray) -> np.ndarray:
    """Per-query coverage (recall of the query's relevant snippets).

    Only queries with at least one relevant snippet appear, in increasing query index.

    Examples
    --------
    >>> kept, relevant = np.array([1, 0, 1, 1], bool), np.array([1, 1, 1, 0], bool)
    >>> query_coverage(kept, relevant, np.array([0, 0, 1, 1]))
    array([0.5, 1. ])
    """
    rel = np.asarray(relevant, dtype=bool)
    q = np.asarray(query_index)[rel]
    k = np.asarray(kept, dtype=bool)[rel].astype(float)
    if q.size == 0:
        return np.zeros(0)
    uniq, inv = np.unique(q, return_inverse=True)
    hits = np.bincount(inv, weights=k, minlength=uniq.size)
    counts = np.bincount(inv, minlength=uniq.size)
    return hits / counts


def removal(kept: np.ndarray) -> float:
    """Fraction of snippets removed (0 for no snippets)."""
    k = np.asarray(kept, dtype=bool)
    return 0.0 if k.size == 0 else float(1.0 - k.mean())


def char_removal(kept: np.ndarray, lengths: np.ndarray) -> float:
    """Fraction of context characters removed (0 for no characters)."""
    k = np.asarray(kept, dtype=bool)
    ln = np.asarray(lengths, dtype=float)
    total = ln.sum()
    return 0.0 if total == 0 else float(1.0 - ln[k].sum() / total)
