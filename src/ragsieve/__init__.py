"""ragsieve: filter the context a RAG system retrieves, with a conformal guarantee.

Score each retrieved snippet with a nonconformity score (lower = more relevant),
calibrate a threshold on labelled snippets from other topics, and keep the snippets
whose score is at most the threshold: a relevant snippet is then kept with
probability at least ``1 - alpha``.

Heavy dependencies (torch, sentence-transformers, matplotlib) are imported only
when a model is loaded or a plot is drawn, so ``import ragsieve`` stays light.
"""

from ._version import __version__
from .calibration import SplitConformalCalibrator, min_calibration_size
from .chunking import Chunker, chunk_documents, chunk_text
from .errors import (
    ArtifactError,
    CalibrationError,
    DataError,
    LLMError,
    LLMResponseError,
    NotFittedError,
    RagsieveError,
    ScorerError,
    ScorerMismatchError,
)
from .filter import ConformalFilter
from .labeling import LLMLabeler
from .scoring import EmbeddingScorer, LLMScorer, Scorer, register_scorer, resolve_scorer
from .types import FilterResult, Pair, Scored, Snippet

__all__ = [
    "ArtifactError",
    "CalibrationError",
    "Chunker",
    "ConformalFilter",
    "DataError",
    "EmbeddingScorer",
    "FilterResult",
    "LLMError",
    "LLMLabeler",
    "LLMResponseError",
    "LLMScorer",
    "NotFittedError",
    "Pair",
    "RagsieveError",
    "Scored",
    "Scorer",
    "ScorerError",
    "ScorerMismatchError",
    "Snippet",
    "SplitConformalCalibrator",
    "__version__",
    "chunk_documents",
    "chunk_text",
    "min_calibration_size",
    "register_scorer",
    "resolve_scorer",
]
