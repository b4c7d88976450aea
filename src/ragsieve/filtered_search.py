"""Retrieve, then filter: an index's hits for a query kept by a calibrated filter.

What ``ragsieve query --filter`` and ``ragsieve serve --index`` (``POST /query``) do: search
the index (:meth:`SnippetIndex.search <ragsieve.store.SnippetIndex.search>`), turn the hits'
stored ``1 - cos`` into the filter's own score without re-embedding anything
(:func:`list_scorer`; a fused score of several signals scores the hit texts, its cosine
from the hits' stored vectors put into its embedding cache), and apply the filter
(:func:`query_with_filter`). It sits above both
the index, which knows no filter, and the filter, which knows no index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ScorerMismatchError
from .index_vectors import embedding_cache_of
from .scoring.embedding import EmbeddingScorer
from .types import Snippet

if TYPE_CHECKING:
    from .filter import ConformalFilter
    from .store import Hit, SnippetIndex
    from .types import FilterResult

__all__ = ["list_scorer", "query_with_filter"]


def list_scorer(index: SnippetIndex, flt: ConformalFilter) -> Callable[[np.ndarray], np.ndarray]:
    """How ``flt``'s score is computed from ``index``'s stored ``1 - cos`` of a hit list.

    Supported: the embedding scorer of the index's model (the scores themselves), and
    the list-relative scores built on it (``relative`` and the fused score of that
    cosine alone), recomputed from the stored vectors -- nothing is re-embedded. A
    fused score of several signals on this model (the ``best`` presets: BM25, other
    embedders, ...) is accepted too, but its callable raises ``TypeError``: the other
    signals need the texts, and :func:`query_with_filter` scores the hit texts instead.

    Parameters
    ----------
    index : SnippetIndex
        The index whose hits are filtered.
    flt : ConformalFilter
        A calibrated filter.

    Returns
    -------
    callable
        ``to_scores(one_minus_cos) -> scores`` of the filter, for one hit list.

    Raises
    ------
    ScorerMismatchError
        The filter was calibrated on another score (another model, an LLM, ...).
    """
    scorer = flt.scorer_
    spec = scorer.spec()
    expected = {"scorer": EmbeddingScorer.name, "model": index.model_id}
    if spec == expected:
        return lambda base: base
    base = scorer.base_scorer()
    if base is not None and base.spec() == expected:  # a list transform of this 1 - cos
        return scorer.scores_from_base
    raise ScorerMismatchError(
        f"the filter was calibrated with scorer {spec!r}, but this index can only compute "
        f"{expected!r} and the relative or fused scores built on it from its stored "
        f"vectors; calibrate a filter with EmbeddingScorer({index.model_id!r}) (or "
        "`ragsieve calibrate --scorer embedding|relative|best` with that model)."
    )

def query_with_filter(
    index: SnippetIndex, query: str, flt: ConformalFilter, k: int = 20, *, group: Any = None
) -> tuple[list[Hit], FilterResult]:
    """Search, then apply a calibrated filter to the hits, scored from stored vectors.

    Parameters
    ----------
    index : SnippetIndex
        The index searched.
    query : str
        Query text.
    flt : ConformalFilter
        A calibrated filter whose score the index computes (see :func:`list_scorer`):
        the embedding scorer of the index's model, or a relative / fused score on it.
    k : int
        Number of hits to retrieve before filtering.
    group : optional
        The query's group, for a filter of the ``group`` mode.

    Returns
    -------
    (list of Hit, FilterResult)
        All ``k`` hits (``Hit.score`` is always ``1 - cos``) and what the filter kept
        of them; ``FilterResult.scores`` are the filter's own scores.

    Raises
    ------
    ScorerMismatchError
        The filter was calibrated on a score the index cannot compute.

    Notes
    -----
    A relative or fused score depends on the list it is computed in. Its guarantee
    transfers when the calibration lists were formed like these hit lists (the same
    retriever and ``k``: ``ragsieve retrieve`` calibrates on them); the ``1 - cos`` score of
    a snippet does not depend on the list. The filter's list check sees every hit list
    with its stored ``1 - cos`` (:attr:`ConformalFilter.list_watch
    <ragsieve.filter.ConformalFilter.list_watch>`); :func:`ragsieve.lists.compare_retriever`
    with :meth:`SnippetIndex.retriever_identity` says when the filter was calibrated on another
    retriever's lists.
    """
    to_scores = list_scorer(index, flt)
    # a fused score of several signals scores the hit texts (embedding_model() is None):
    # its cosine signal embeds the query through its cache, so the search takes that vector
    cache = (embedding_cache_of(flt.scorer_, index.model_id)
             if flt.scorer_.embedding_model() is None else None)
    if cache is not None:
        hits = index.search_vector(cache.embed([query], kind="query")[0], k=k)
    else:
        hits = index.search(query, k=k)
    snippets = [Snippet(h.doc_id, h.start, h.end, h.text) for h in hits]
    scores = np.array([h.score for h in hits], dtype=float)
    if hits:
        try:
            scores = to_scores(scores)
        except TypeError:  # a fused score of several signals: they need the hit texts
            if cache is not None:  # its cosine reads the hits' stored vectors, not the model
                cache.add_known([h.text for h in hits], np.stack([h.vector for h in hits]))
            scores = flt.scorer_.score_batch(query, [h.text for h in hits])
    # the filter's root score is this index's 1 - cos (list_scorer checked it)
    result = flt.filter_scores(query, scores, snippets, group=group,
                               root_scores=[h.score for h in hits])
    return hits, result
