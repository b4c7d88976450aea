"""ragsieve: filter the context a RAG system retrieves, with a conformal guarantee.

Score each retrieved snippet with a nonconformity score (lower = more relevant),
calibrate a threshold on labelled snippets from other topics, and keep the snippets
whose score is at most the threshold: a relevant snippet is then kept with
probability at least ``1 - alpha``.

Heavy dependencies (torch, sentence-transformers, matplotlib) are imported only
when a model is loaded or a plot is drawn, so ``import ragsieve`` stays light.
"""

from ._version import __version__
from .artifact import Artifact
from .calibration import (
    MODES,
    AdaptiveCalibrator,
    AdaptiveConformalFilter,
    BaseCalibrator,
    BudgetCalibrator,
    Guarantee,
    MondrianCalibrator,
    PACCalibrator,
    QueryAllCalibrator,
    QueryRecallCalibrator,
    SplitConformalCalibrator,
    TopicCalibrator,
    make_calibrator,
    min_calibration_size,
    select_within_budget,
)
from .chunking import Chunker, chunk_documents, chunk_text
from .errors import (
    ArtifactError,
    CalibrationError,
    DataError,
    LLMError,
    LLMResponseError,
    NotFittedError,
    RagsieveError,
    RerankError,
    RerankResponseError,
    ScorerError,
    ScorerMismatchError,
)
from .filter import ConformalFilter
from .labeling import LLMLabeler
from .monitoring import ExchangeabilityMonitor, MonitorState, drift_check
from .scoring import (
    EmbeddingScorer,
    FieldScorer,
    FusedScorer,
    LLMScorer,
    RelativeScorer,
    RerankScorer,
    Scorer,
    ScorerTags,
    register_scorer,
    resolve_scorer,
)
from .types import DEFAULT_ALPHA, FilterResult, Pair, Scored, Snippet

__all__ = [
    "DEFAULT_ALPHA",
    "MODES",
    "AdaptiveCalibrator",
    "AdaptiveConformalFilter",
    "Artifact",
    "ArtifactError",
    "BaseCalibrator",
    "BudgetCalibrator",
    "CalibrationError",
    "Chunker",
    "ConformalFilter",
    "DataError",
    "EmbeddingScorer",
    "ExchangeabilityMonitor",
    "FieldScorer",
    "FilterResult",
    "FusedScorer",
    "Guarantee",
    "LLMError",
    "LLMLabeler",
    "LLMResponseError",
    "LLMScorer",
    "MondrianCalibrator",
    "MonitorState",
    "NotFittedError",
    "PACCalibrator",
    "Pair",
    "QueryAllCalibrator",
    "QueryRecallCalibrator",
    "RagsieveError",
    "RelativeScorer",
    "RerankError",
    "RerankResponseError",
    "RerankScorer",
    "Scored",
    "Scorer",
    "ScorerError",
    "ScorerMismatchError",
    "ScorerTags",
    "Snippet",
    "SplitConformalCalibrator",
    "TopicCalibrator",
    "__version__",
    "chunk_documents",
    "chunk_text",
    "drift_check",
    "make_calibrator",
    "min_calibration_size",
    "register_scorer",
    "resolve_scorer",
    "select_within_budget",
]
