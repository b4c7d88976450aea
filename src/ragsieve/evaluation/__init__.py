"""Evaluation: metrics, topic-disjoint split sweeps, baselines, answers, tables and plots."""

from .answer_metrics import (
    ARTICLES,
    answer_in_context,
    answer_tokens,
    count_tokens,
    exact_match,
    normalize_answer,
    token_f1,
)
from .answers import AnswerConfig, AnswerReport, evaluate_answers
from .bootstrap import PairedInterval, paired_bootstrap
from .choose import DEFAULT_ALPHA_GRID, AlphaChoice, AlphaTarget, choose_alpha
from .expect import Expectation, TopicFolds, expected_on_new_topics
from .metrics import char_removal, coverage, query_coverage, removal, within_query_rank
from .sweep import (
    DEFAULT_ALPHAS,
    DEFAULT_THRESHOLD_QUANTILES,
    DEFAULT_TOP_K,
    TOLERANCE_SE,
    EvaluationConfig,
    EvaluationReport,
    ScoredData,
    evaluate,
    evaluate_scores,
)
from .table import format_answer_table, format_table

__all__ = [
    "ARTICLES",
    "DEFAULT_ALPHAS",
    "DEFAULT_ALPHA_GRID",
    "DEFAULT_THRESHOLD_QUANTILES",
    "DEFAULT_TOP_K",
    "TOLERANCE_SE",
    "AlphaChoice",
    "AlphaTarget",
    "AnswerConfig",
    "AnswerReport",
    "EvaluationConfig",
    "EvaluationReport",
    "Expectation",
    "PairedInterval",
    "ScoredData",
    "TopicFolds",
    "answer_in_context",
    "answer_tokens",
    "char_removal",
    "choose_alpha",
    "count_tokens",
    "coverage",
    "evaluate",
    "evaluate_answers",
    "evaluate_scores",
    "exact_match",
    "expected_on_new_topics",
    "format_answer_table",
    "format_table",
    "normalize_answer",
    "paired_bootstrap",
    "query_coverage",
    "removal",
    "token_f1",
    "within_query_rank",
]
