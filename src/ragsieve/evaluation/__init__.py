"""Evaluation: metrics, topic-disjoint split sweeps, baselines, tables and plots."""

from .metrics import char_removal, coverage, query_coverage, removal, within_query_rank
from .sweep import (
    DEFAULT_ALPHAS,
    DEFAULT_THETAS,
    DEFAULT_TOP_K,
    TOLERANCE_SE,
    EvaluationConfig,
    EvaluationReport,
    ScoredData,
    evaluate,
    evaluate_scores,
)
from .table import format_table

__all__ = [
    "DEFAULT_ALPHAS",
    "DEFAULT_THETAS",
    "DEFAULT_TOP_K",
    "TOLERANCE_SE",
    "EvaluationConfig",
    "EvaluationReport",
    "ScoredData",
    "char_removal",
    "coverage",
    "evaluate",
    "evaluate_scores",
    "format_table",
    "query_coverage",
    "removal",
    "within_query_rank",
]
