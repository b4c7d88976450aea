"""Nonconformity scores (lower = more relevant) and the table of the built-in ones.

``resolve_scorer`` (:mod:`~ragsieve.scoring.registry`, the one place aliases are resolved) turns an alias (``"embedding"``), a spec mapping as produced by
``Scorer.spec()``, or a ``Scorer`` instance into a scorer. Built in: ``"embedding"``, ``"llm"``,
``"relative"``, ``"fusion"`` (fitted weights), ``"best"`` (the fused score, still to be
fitted on labelled data: :func:`~ragsieve.scoring.fusion.FusedScorer.unfitted`, its
signals those of a preset, :mod:`~ragsieve.scoring.signals`), ``"bm25-list"`` (BM25 within
the query's own list), ``"bm25-corpus"`` (BM25 with statistics frozen from a corpus it was
fitted on: list-free), ``"idf-cov"`` and ``"sent-bm25"`` (the share of the query's IDF
mass in the snippet, and the best sentence's frozen-corpus BM25, on the same statistics),
``"sentence-cos"`` (the best sentence's ``1 - cos``),
``"field"`` (an outside score) and ``"rerank"`` (minus the relevance any reranker behind the
rerank API gives, asked pair by pair: :class:`~ragsieve.scoring.rerank.RerankScorer`), and ``"auto"``, the default: the list-aware fused score when
the calibration lists are the deployed retriever's, else the list-free (``portable``) fused
score, or ``1 - cos`` when neither can be fitted, chosen when a filter is calibrated
(:func:`~ragsieve.scoring.auto.choose_score`), and ``"sentence_context"`` (a sentence's
score in its snippet, the sentence unit's). They are registered here, from one table
(:data:`BUILTIN_SCORERS`); further scorers plug in with :func:`register_scorer`.

Each alias has its declared options (:class:`~ragsieve.scoring.options.ScorerOption`,
:func:`scorer_options`): the keywords it takes and their command-line flags. The CLI adds
those flags and builds every scorer through :func:`resolve_scorer` from them.
"""

from __future__ import annotations

from .auto import AutoScorer, ScoreChoice, choose_score
from .base import KeepRule, Scorer
from .corpus_bm25 import CorpusBM25Scorer
from .corpus_lexical import IDFCoverageScorer, SentenceBM25Scorer
from .embedding import EMBEDDING_OPTIONS, EmbeddingScorer
from .field import FieldScorer
from .fusion import BEST_OPTIONS, FusedScorer
from .lexical import ListBM25Scorer
from .llm import LLMScorer
from .options import ScorerOption
from .reader import ReaderScorer
from .registry import (
    ScorerFactory,
    _lookup,  # noqa: F401  (the factory of an alias: integrations, tests)
    register_scorer,
    registered_scorers,
    resolve_scorer,
    scorer_options,
)
from .relative import RelativeScorer
from .rerank import RerankScorer
from .sentence_context import SentenceContextScorer
from .sentence_cosine import SentenceCosineScorer
from .tags import ScorerTags

__all__ = [
    "BUILTIN_SCORERS",
    "AutoScorer",
    "CorpusBM25Scorer",
    "EmbeddingScorer",
    "FieldScorer",
    "FusedScorer",
    "IDFCoverageScorer",
    "KeepRule",
    "LLMScorer",
    "ListBM25Scorer",
    "ReaderScorer",
    "RelativeScorer",
    "RerankScorer",
    "ScoreChoice",
    "Scorer",
    "ScorerFactory",
    "ScorerOption",
    "ScorerTags",
    "SentenceBM25Scorer",
    "SentenceCosineScorer",
    "choose_score",
    "register_scorer",
    "registered_scorers",
    "resolve_scorer",
    "scorer_options",
]

#: The built-in scorers: ``(alias, factory, declared options)``, registered in this order
#: (:func:`registered_scorers`) below, the one place they are registered. A scorer class
#: declares its own options (``declared_options``); the fused score's are those of its
#: embedding base (and, for ``"best"``, its preset).
BUILTIN_SCORERS: tuple[tuple[str, ScorerFactory, tuple[ScorerOption, ...]], ...] = (
    ("embedding", EmbeddingScorer, EmbeddingScorer.declared_options),
    ("llm", LLMScorer, LLMScorer.declared_options),
    ("relative", RelativeScorer, RelativeScorer.declared_options),
    ("fusion", FusedScorer, EMBEDDING_OPTIONS),
    ("field", FieldScorer, FieldScorer.declared_options),
    ("bm25-list", ListBM25Scorer, ListBM25Scorer.declared_options),
    ("bm25-corpus", CorpusBM25Scorer, CorpusBM25Scorer.declared_options),
    # two more list-free lexical signals on its statistics (the portable score's)
    ("idf-cov", IDFCoverageScorer, IDFCoverageScorer.declared_options),
    ("sent-bm25", SentenceBM25Scorer, SentenceBM25Scorer.declared_options),
    ("sentence-cos", SentenceCosineScorer, SentenceCosineScorer.declared_options),
    # the fused score, unfitted: evaluate fits it per split, calibrate on half of the topics
    ("best", FusedScorer.unfitted, BEST_OPTIONS),
    # the strongest of the two the calibration pairs allow, chosen by ConformalFilter.calibrate
    ("auto", AutoScorer, AutoScorer.declared_options),
    # a sentence's score in its snippet (the sentence unit)
    (SentenceContextScorer.name, SentenceContextScorer, EMBEDDING_OPTIONS),
    # a cross-encoder fine-tuned on the calibration fit topics (multilingual-e5 base)
    ("reader", ReaderScorer, ReaderScorer.declared_options),
    # any reranker behind the rerank API (Cohere / Jina / vLLM / TEI), pair by pair
    ("rerank", RerankScorer, RerankScorer.declared_options),
)

for _alias, _factory, _options in BUILTIN_SCORERS:
    register_scorer(_alias, _factory, options=_options)
del _alias, _factory, _options
