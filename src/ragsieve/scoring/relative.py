"""Query-relative nonconformity scores, computed from a query's own retrieved list.

A global cut-off on ``1 - cos`` treats every query alike, but absolute cosines vary by
topic and phrasing: a query's relevant snippets sit near the top of *its own* list even
when all its cosines are low. These scores re-express each snippet's base score relative
to the other snippets retrieved for the same query:

``gap``
    ``max_cos - cos``: distance to the best snippet of the list (0 for the best).
``z``
    ``-(cos - mean) / sd`` over the list (sd floored at 1e-6; a list of one gives 0).
``rank``
    0-based rank in the list by decreasing cosine, equal cosines sharing the lowest rank
    (competition ranking: the number of snippets with a strictly higher cosine); discrete.
    Two copies of one text in a list therefore get one rank, as they get one cosine.
``ratio``
    ``(max_cos - cos) / max(max_cos, 1e-3)``: the gap relative to the best cosine.

Why they are valid nonconformity scores: each is a fixed function of the query and its
retrieved list — never of labels — applied identically at calibration and at test time.
When (query, retrieved list) units are exchangeable between calibration and test (the
topic-disjoint splits of ``evaluate``), so are the resulting scores of their relevant
snippets, and split conformal calibration keeps its guarantee. The scores of one list
are not independent of each other, but neither are cosines of snippets that share a
query; the guarantee never needed that. What changes is the unit of deployment: a
relative score is only defined for a whole retrieved list, so filter lists, not
single snippets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..types import Pair
from .base import ListTransform, Scorer, group_pairs
from .embedding import EMBEDDING_OPTIONS
from .options import ScorerOption
from .registry import resolve_scorer
from .tags import ScorerTags

__all__ = [
    "RELATIVE_KINDS",
    "RelativeScorer",
    "query_index_of",
    "relative_scores",
    "within_query_min_rank",
    "within_query_rank",
]

RELATIVE_KINDS = ("gap", "z", "rank", "ratio")


def within_query_rank(scores: np.ndarray, query_index: np.ndarray) -> np.ndarray:
    """0-based rank of each snippet within its query's list by increasing score.

    Ties are broken by position (stable), so top-k keeps exactly k per query.

    Examples
    --------
    >>> within_query_rank(np.array([0.3, 0.1, 0.2, 0.5, 0.4]), np.array([0, 0, 0, 1, 1]))
    array([2, 0, 1, 1, 0])
    """
    s = np.asarray(scores, dtype=float)
    q = np.asarray(query_index)
    order = np.lexsort((np.arange(s.size), s, q))  # by query, then score, then position
    ranks = np.empty(s.size, dtype=np.int64)
    sorted_q = q[order]
    starts = np.r_[0, np.flatnonzero(sorted_q[1:] != sorted_q[:-1]) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, s.size]))
    ranks[order] = np.arange(s.size) - first
    return ranks


def within_query_min_rank(scores: np.ndarray, query_index: np.ndarray) -> np.ndarray:
    """0-based competition ("min") rank of each snippet within its query's list by increasing
    score: the number of snippets of its list with a strictly lower score.

    Equal scores (to 12 decimals, as :func:`relative_scores` rounds its gaps) share the
    lowest rank, so two copies of one text in a list get the same rank and whatever is
    computed from it. The top-k baselines, which need exactly k per query, use
    :func:`within_query_rank` instead.

    Examples
    --------
    >>> within_query_min_rank(np.array([0.3, 0.1, 0.3, 0.5, 0.5]), np.array([0, 0, 0, 1, 1]))
    array([1, 0, 1, 0, 0])
    """
    s = np.round(np.asarray(scores, dtype=float), 12)
    q = np.asarray(query_index)
    if s.shape != q.shape:
        raise ValueError(f"scores has shape {s.shape} and query_index {q.shape}; expected one "
                         "query per score.")
    order = np.lexsort((s, q))  # by query, then score (stable: then position)
    sq, ss = q[order], s[order]
    n = s.size
    new_query = np.r_[True, sq[1:] != sq[:-1]] if n else np.zeros(0, dtype=bool)
    new_value = new_query | np.r_[True, ss[1:] != ss[:-1]] if n else new_query
    positions = np.arange(n)
    query_start = np.maximum.accumulate(np.where(new_query, positions, 0))
    value_start = np.maximum.accumulate(np.where(new_value, positions, 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = value_start - query_start
    return ranks


def relative_scores(base: np.ndarray, query_index: np.ndarray, kind: str) -> np.ndarray:
    """Transform base scores (lower = more relevant, e.g. ``1 - cos``) within each query.

    Parameters
    ----------
    base : numpy.ndarray
        Base nonconformity scores of all pairs.
    query_index : numpy.ndarray of int
        Query of each pair (0..n_queries-1, any order).
    kind : {"gap", "z", "rank", "ratio"}

    Returns
    -------
    numpy.ndarray
        Relative scores, lower = more relevant.

    Examples
    --------
    >>> relative_scores(np.array([0.3, 0.1, 0.6]), np.array([0, 0, 0]), "gap")
    array([0.2, 0. , 0.5])
    """
    if kind not in RELATIVE_KINDS:
        raise ValueError(f"kind == {kind!r}, must be one of {RELATIVE_KINDS}.")
    s = np.asarray(base, dtype=float)
    q = np.asarray(query_index)
    _, inv = np.unique(q, return_inverse=True)
    sim = 1.0 - s
    if kind == "rank":  # equal scores share a rank (a copy of a text scores as the text)
        return within_query_min_rank(s, inv).astype(float)
    best = np.full(inv.max() + 1 if inv.size else 0, -np.inf)
    np.maximum.at(best, inv, sim)
    gap = best[inv] - sim
    if kind == "gap":
        return np.round(gap, 12)
    if kind == "ratio":
        return gap / np.maximum(best[inv], 1e-3)
    counts = np.bincount(inv).astype(float)
    mean = np.bincount(inv, sim) / counts
    var = np.maximum(np.bincount(inv, sim**2) / counts - mean**2, 0.0)
    sd = np.maximum(np.sqrt(var), 1e-6)
    return -(sim - mean[inv]) / sd[inv]


class RelativeScorer(ListTransform):
    """A base scorer's scores made relative to each query's retrieved list.

    Parameters
    ----------
    base : Scorer or str or Mapping
        The base score (``"embedding"`` by default), resolved by ``resolve_scorer``.
    kind : {"gap", "z", "rank", "ratio"}
        The transformation (see the module docstring).
    **base_options
        Passed to the base scorer when it is built from an alias or spec.
    """

    name: ClassVar[str] = "relative"
    score_label: ClassVar[str] = "relative score"
    tags = ScorerTags(list_dependent=True)
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("kind", str, "gap", "scorer relative: how a snippet's cosine is compared "
                     "with its list", "--relative-kind", choices=RELATIVE_KINDS),
        *EMBEDDING_OPTIONS,  # the base embedding scorer's
    )

    def __init__(self, base: Any = "embedding", *, kind: str = "gap", **base_options: Any) -> None:
        if kind not in RELATIVE_KINDS:
            raise ValueError(f"kind == {kind!r}, must be one of {RELATIVE_KINDS}.")
        self.kind = kind
        if base_options or not isinstance(base, Scorer):
            base = resolve_scorer(base, **base_options)
        self.base = base

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name, "kind": self.kind, "base": self.base.spec()}

    def scores_from_base(self, base: np.ndarray) -> np.ndarray:
        """Relative scores of one query's list from its base scores (e.g. stored ``1 - cos``)."""
        base = np.asarray(base, dtype=float)
        return relative_scores(base, np.zeros(len(base), dtype=int), self.kind)

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's whole retrieved list (relative scores need the list)."""
        return self.scores_from_base(self.base.score_batch(query, snippets))

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Base scores for all pairs in one pass, then the per-query transformation."""
        pairs = list(pairs)
        base = self.base.score_pairs(pairs, progress=progress)
        return relative_scores(base, query_index_of(pairs), self.kind)


def query_index_of(pairs: Sequence[Pair]) -> np.ndarray:
    """0-based query number of each pair (queries numbered by first appearance)."""
    qidx = np.empty(len(pairs), dtype=int)
    for i, (_, idx) in enumerate(group_pairs(pairs).values()):
        qidx[idx] = i
    return qidx
