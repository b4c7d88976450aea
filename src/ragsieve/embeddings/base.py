"""The embedding model contract: one abstract batch method, and the shared row normalisation.

Every backend (:mod:`~ragsieve.embeddings.models`, :mod:`~ragsieve.embeddings.e5`,
:mod:`~ragsieve.embeddings.onnx`) builds on :class:`EmbeddingModel`; the loader in
:mod:`~ragsieve.embeddings.models` only chooses among them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

__all__ = ["EmbeddingModel", "cosine_distances"]


class EmbeddingModel(ABC):
    """A sentence embedding model: one abstract batch method.

    Attributes
    ----------
    model_id : str
        Stable identifier used in caches and artifacts.
    dim : int
        Embedding dimension.
    """

    model_id: str
    dim: int

    @property
    def cache_id(self) -> str:
        """Key of this model's vectors in :class:`EmbeddingCache`: ``model_id`` unless a
        backend computes the same model differently (ONNX fp32: ``…@onnx``)."""
        return self.__dict__.get("cache_id", self.model_id)

    @cache_id.setter
    def cache_id(self, value: str) -> None:
        self.__dict__["cache_id"] = value

    #: True when queries are embedded differently from snippets (see :meth:`embed_queries`);
    #: the cache then keys query vectors separately.
    asymmetric: bool = False

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Parameters
        ----------
        texts : sequence of str
            Texts to embed (the empty string is allowed).

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32 array with L2-normalised rows.
        """

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed queries; the same as :meth:`embed_batch` unless the model is asymmetric.

        Asymmetric models (e5: ``"query: "`` vs ``"passage: "``) override this and set
        ``asymmetric = True``.
        """
        return self.embed_batch(texts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, dim={self.dim})"


class _QueryView(EmbeddingModel):
    """The query side of an asymmetric model, with its own ``model_id`` (``…#query``)."""

    def __init__(self, model: EmbeddingModel) -> None:
        self.model = model
        self.model_id = f"{model.model_id}#query"
        self.cache_id = f"{model.cache_id}#query"
        self.dim = model.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.embed_queries(texts)


def _normalise_rows(vecs: np.ndarray) -> np.ndarray:
    """L2-normalise rows in float32; all-zero rows stay zero."""
    vecs = np.asarray(vecs, dtype=np.float32)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(norms > 0, norms, np.float32(1.0))


def cosine_distances(query_vec: np.ndarray, snippet_vecs: np.ndarray) -> np.ndarray:
    """``1 - cos`` of a unit query vector and unit rows, float64 clipped to [0, 2].

    Examples
    --------
    >>> cosine_distances(np.array([1.0, 0.0]), np.eye(2))
    array([0., 1.])
    """
    scores = 1.0 - np.asarray(snippet_vecs, dtype=np.float64) @ np.asarray(query_vec,
                                                                          dtype=np.float64)
    return np.clip(scores, 0.0, 2.0, out=scores)
