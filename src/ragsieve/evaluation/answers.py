"""Does the filtered context still answer? Downstream evaluation of kept contexts.

On the same topic-disjoint splits as :func:`ragsieve.evaluation.evaluate`, every test
query gets one context per *method*, and each context is measured:

methods
    ``all`` (every retrieved snippet); ``conformal`` at each alpha and guarantee mode;
    with ``unit="sentence"`` also ``conformal (sentence)``: the same mode and alpha at the
    sentence unit, each kept snippet reduced to its kept sentences (``Scored.pruned_text``
    of a :class:`~ragsieve.ConformalFilter` of unit ``"sentence"``, calibrated on the
    split's calibration topics and applied to every test query as it is deployed), and
    the two label-chosen bounds ``oracle`` (every relevant snippet whole) and ``oracle
    (sentence)`` (only the relevant snippets' evidence sentences);
    ``top-k (calibrated)`` (the smallest k reaching 1 - alpha on the calibration topics,
    without the conformal correction); ``top-k (equal size)`` (top-k with, on the test
    queries of the split, the same mean number of snippets as the conformal row: the
    fair equal-budget opponent; k is ``floor(m)`` for some queries and ``floor(m) + 1``
    for a seeded random share of them so the mean is exactly ``m``).
model-free metrics
    ``answer_in_context`` (a gold answer occurs in the kept context after SQuAD
    normalisation, see :mod:`~ragsieve.evaluation.answer_metrics`), context characters,
    word tokens and snippets per query, and the share of empty contexts.
generated-answer metrics
    A short answer from an OpenAI-compatible generator (:func:`ragsieve.generation.short_answer`):
    EM and token F1 against the gold answers, answer length, the share of abstentions,
    prompt tokens reported by the server, and the latency of requests not served from the cache.
nugget metrics (ARGUE-style)
    An LLM judge (:class:`ragsieve.evaluation.nuggets.NuggetJudge`): sentence precision
    (answer sentences the kept context supports), nugget recall (gold nuggets the answer
    contains) and their F1. An unparseable judgement is left out, never counted as a yes.
statistics
    For every method, the paired bootstrap interval over queries of its difference from
    ``all`` (:func:`ragsieve.evaluation.bootstrap.paired_bootstrap`).

A query's value is the mean over the splits in which it is a test query, so every query
is one paired observation. An empty context is not sent to the generator: the answer is
an abstention (EM 0, F1 0). Every generation and judgement goes through the LLM client's
persistent reply cache, so a killed run resumes without asking twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._io import atomic_write_text
from .._validation import check_alpha, check_int
from ..calibration import CALIBRATORS
from ..data.splits import group_splits
from ..errors import DataError
from ..fitting import fit_split
from ..scoring.fusion import FUSION_FIT_FRACTION, FusionFeatures
from ..scoring.shares import pairs_fit_mask
from ..types import Pair
from ..units import check_unit
from .answer_metrics import answer_in_context, answer_tokens, count_tokens, exact_match, token_f1
from .bootstrap import paired_bootstrap
from .metrics import within_query_rank
from .sweep import (
    EvaluationConfig,
    ScoredData,
    _calibrate_split,
    calibrated_k,
    score_for_evaluation,
)

if TYPE_CHECKING:
    from ..llm.connect import LLMConnection
    from ..scoring.base import Scorer

__all__ = ["AnswerConfig", "AnswerReport", "evaluate_answers", "write_per_query"]

logger = logging.getLogger(__name__)

#: Context window of the local model started for answer evaluation (tokens), room for a
#: whole retrieved list.
LOCAL_N_CTX = 8192

#: Per-query metrics, in the order of the report; ``None`` marks a value not computed.
MODEL_FREE = ("answer_in_context", "context_chars", "context_tokens", "context_snippets", "empty_context")
GENERATED = ("em", "f1", "answer_chars", "abstained", "prompt_tokens", "latency_s")
JUDGED = ("nugget_precision", "nugget_recall", "nugget_f1")
#: Metrics that get a paired bootstrap interval against ``all``.
CI_METRICS = ("answer_in_context", "context_chars", "context_tokens", "em", "f1", "nugget_f1")


@dataclass(frozen=True)
class AnswerConfig:
    """What :func:`evaluate_answers` measures.

    Attributes
    ----------
    alphas : tuple of float
        Miscoverage levels of the conformal and calibrated top-k rows.
    modes : tuple of str
        Guarantee modes of the conformal rows (each gets its equal-size top-k row).
    n_splits : int
        Topic-disjoint splits; every extra split repeats the work for its test queries.
    calibration_fraction, seed, delta, min_group_size, budgets, bound, fusion_fraction
        As for :class:`~ragsieve.evaluation.EvaluationConfig`.
    limit_queries : int or None
        Evaluate at most this many test queries (a seeded sample; calibration still uses
        every calibration topic). Bounds the LLM cost.
    generate : bool
        Generate answers (EM, F1, ...); False computes the model-free metrics only.
    judge : bool or None
        With ``generate``: also judge the answers (nugget metrics). None (default): judge
        with an endpoint, not with the local default model: Gemma 3 270M answered "no" to
        28 of 30 answer sentences and to all 30 gold nuggets, 8 of them exact matches, so
        its nugget scores carry no signal (force it with True).
    max_tokens : int
        Length cap of a generated answer.
    confidence : float
        Level of the paired bootstrap intervals.
    n_resamples : int
        Bootstrap resamples.
    language : str or None
        Language of the normalisation when a pair has no ``meta["language"]`` (None:
        SQuAD's English rules).
    unit : {"snippet", "sentence"}
        ``"sentence"``: also measure the sentence-unit conformal rows (``conformal
        (sentence)``, one per mode and alpha) beside the snippet rows, on the same test
        queries, and the ``oracle`` and ``oracle (sentence)`` rows (the labels' relevant
        snippets and their evidence sentences: what a perfect score would keep at each
        unit). Their calibration needs the evidence sentences of the relevant
        calibration snippets: ``meta["evidence"]`` spans or the query's ``answers``
        (:func:`ragsieve.units.sentence_pairs`).
    """

    alphas: tuple[float, ...] = (0.05, 0.1, 0.2)
    modes: tuple[str, ...] = ("marginal",)
    n_splits: int = 1
    calibration_fraction: float = 0.5
    seed: int = 0
    delta: float = 0.1
    min_group_size: int | None = None
    budgets: tuple[int, ...] = ()
    bound: str = "auto"
    fusion_fraction: float = FUSION_FIT_FRACTION
    limit_queries: int | None = None
    generate: bool = True
    judge: bool | None = None
    max_tokens: int = 32
    confidence: float = 0.95
    n_resamples: int = 2000
    language: str | None = None
    unit: str = "snippet"

    def __post_init__(self) -> None:
        self.sweep  # validates the shared fields  # noqa: B018
        check_unit(self.unit)
        object.__setattr__(self, "limit_queries", check_int(
            self.limit_queries, "limit_queries", min_value=1, allow_none=True))
        object.__setattr__(self, "max_tokens", check_int(self.max_tokens, "max_tokens", min_value=1))
        check_alpha(self.confidence, name="confidence")

    @property
    def sweep(self) -> EvaluationConfig:
        """The split and calibrator settings as an :class:`EvaluationConfig`."""
        return EvaluationConfig(
            alphas=self.alphas, modes=self.modes, n_splits=self.n_splits,
            calibration_fraction=self.calibration_fraction, seed=self.seed, delta=self.delta,
            min_group_size=self.min_group_size, budgets=self.budgets, bound=self.bound,
            fusion_fraction=self.fusion_fraction, top_k=(), thetas=(), calibrated_baselines=False,
        )


@dataclass
class AnswerReport:
    """Result of :func:`evaluate_answers`; ``to_dict()`` is the ``--json`` schema.

    Attributes
    ----------
    results : list of dict
        One row per method: ``method``, ``alpha`` / ``mode`` / ``k`` where they apply,
        ``<metric>_mean`` for every metric computed, ``n_queries`` and ``ci`` (paired
        bootstrap intervals of the difference from ``all``, per metric; empty for ``all``).
    per_query : dict
        ``{row label: {query_id: {metric: value}}}`` (not in ``to_dict``; for analyses,
        see :func:`write_per_query`).
    row_fields : dict
        ``{row label: {"method": ..., "mode": ..., "alpha": ...}}``.
    info : dict
        Run facts: queries, splits, scorer, generator, judge, request counts.
    """

    results: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)
    per_query: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    row_fields: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {**self.info, "results": self.results}

    def row(self, method: str, alpha: float | None = None) -> dict[str, Any]:
        """The row of ``method`` (at ``alpha``); KeyError when there is none."""
        for r in self.results:
            if r["method"] == method and (alpha is None or r.get("alpha") == alpha):
                return r
        raise KeyError(f"no row for method {method!r} at alpha {alpha!r}")


@dataclass(frozen=True)
class _Query:
    query_id: str
    question: str
    golds: tuple[str, ...]
    nuggets: tuple[str, ...]
    language: str | None
    positions: np.ndarray  # pair indices of the query's list, in input order


#: One snippet of a context: its pair index and the kept sentence spans of its text
#: (``()``: the whole text).
_Item = tuple[int, tuple[tuple[int, int], ...]]
#: A context: the query's index and its snippets, in list order.
_Context = tuple[int, tuple[_Item, ...]]


@dataclass(frozen=True)
class _Scored:
    """The scored pairs every split plans its contexts from (built once per run)."""

    pairs: list[Pair]
    data: ScoredData
    features: np.ndarray | FusionFeatures | None
    queries: list[_Query]
    answerable: np.ndarray  # per query: it carries gold answers


@dataclass(frozen=True)
class _Deployed:
    """What a sentence-unit filter of a split is built from: the score as given (an alias
    with its options, or a scorer) and the ``group`` mode's field."""

    scorer: Any
    scorer_options: dict[str, Any] | None
    group_by: str | None


@dataclass(frozen=True)
class _Row:
    """One method row: how it is labelled and the JSON fields that identify it."""

    label: str
    method: str
    fields: tuple[tuple[str, Any], ...]


def _queries(pairs: Sequence[Pair], data: ScoredData, language: str | None) -> list[_Query]:
    by_query: dict[int, list[int]] = {}
    for i, q in enumerate(data.query_index.tolist()):
        by_query.setdefault(q, []).append(i)
    out: list[_Query] = []
    for q in range(len(by_query)):
        idx = by_query[q]
        first = pairs[idx[0]]
        answers = next((pairs[i].meta["answers"] for i in idx if pairs[i].meta.get("answers")), None)
        nuggets = next((pairs[i].meta["nuggets"] for i in idx if pairs[i].meta.get("nuggets")), None)
        lang = first.meta.get("language", language)
        # a gold that normalises to nothing (only articles, e.g. German "eine") cannot be matched
        golds = tuple(str(a) for a in answers or () if answer_tokens(str(a), lang))
        out.append(_Query(first.query_id, first.query, golds,
                          tuple(str(n) for n in nuggets) if nuggets else golds, lang, np.array(idx)))
    return out


def _equal_size_mask(ranks: np.ndarray, data: ScoredData, kept: np.ndarray, test_queries: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Top-k per query with the same mean number of kept snippets as ``kept`` on the test queries."""
    sizes = np.bincount(data.query_index[kept], minlength=int(data.query_index.max()) + 1)
    m = float(sizes[test_queries].mean()) if test_queries.size else 0.0
    base = math.floor(m)
    n_extra = round((m - base) * test_queries.size)
    k_per_query = np.full(sizes.size, base, dtype=np.int64)
    k_per_query[rng.permutation(test_queries)[:n_extra]] += 1
    return ranks < k_per_query[data.query_index], m


def _split_contexts(data: ScoredData, ranks: np.ndarray, features: np.ndarray | FusionFeatures | None,
                    config: AnswerConfig, cal_idx: np.ndarray, test_queries: np.ndarray,
                    split_no: int) -> list[tuple[_Row, np.ndarray, float | None]]:
    """The keep-mask of every method in one split, with its k for the top-k rows."""
    sweep = config.sweep
    scored, conf_cal_idx = data, cal_idx
    if features is not None:
        fused, conf_cal_idx = fit_split(features, data.relevant, data.group_index, cal_idx,
                                        seed=config.seed, split=split_no,
                                        fraction=config.fusion_fraction)
        scored = dataclasses.replace(data, scores=fused)
    rng = np.random.default_rng([config.seed, split_no, 7])
    out: list[tuple[_Row, np.ndarray, float | None]] = [
        (_Row("all", "all", ()), np.ones(data.scores.size, dtype=bool), None)]
    for mode in config.modes:
        for a in config.alphas:
            kept = _calibrate_split(scored, sweep.calibrator(mode, a), conf_cal_idx)
            tag = "" if len(config.modes) == 1 else f" {mode}"
            fields = (("mode", mode), ("alpha", a))
            out.append((_Row(f"conformal{tag} a={a:g}", "conformal", fields), kept, None))
            mask, m = _equal_size_mask(ranks, data, kept, test_queries, rng)
            out.append((_Row(f"top-k (equal size){tag} a={a:g}", "top-k (equal size)", fields), mask, m))
    for a in config.alphas:
        k = calibrated_k(data, ranks, cal_idx, a)
        out.append((_Row(f"top-k (calibrated) a={a:g}", "top-k (calibrated)", (("alpha", a),)),
                    ranks < k, float(k)))
    return out


def _sentence_contexts(scored: _Scored, deployed: _Deployed, config: AnswerConfig,
                       cal_idx: np.ndarray, test_queries: np.ndarray, split_no: int,
                       pruned: dict[_Item, str],
                       ) -> list[tuple[_Row, dict[int, tuple[_Item, ...]]]]:
    """The sentence-unit conformal rows of one split: per mode and alpha, a filter of unit
    ``"sentence"`` calibrated on the calibration topics' pairs, applied to each test query's
    list as deployed; each kept snippet is the item ``(pair index, kept spans)``, its text
    the filter's ``Scored.pruned_text`` (stored in ``pruned``).

    A score that learns is fitted once per split, by the first filter's calibrate; every
    other mode and alpha calibrates that fitted score on the topics it was not fitted on
    (:func:`_calibration_share`), the threshold a filter of its own would calibrate (the
    fit depends on the split's seed and topics, not on the mode or alpha), without
    fine-tuning a reader once per alpha."""
    from ..filter import ConformalFilter
    from ..scoring import resolve_scorer

    pairs, queries, group_by = scored.pairs, scored.queries, deployed.group_by
    calibration = [pairs[i] for i in cal_idx.tolist()]
    seed = config.seed + split_no
    fitted: tuple[Any, list[Pair]] | None = None
    out: list[tuple[_Row, dict[int, tuple[_Item, ...]]]] = []
    for mode in config.modes:
        for a in config.alphas:
            calibrator = config.sweep.calibrator(mode, a)
            if fitted is None:
                # a scorer of its own: calibrate fits an unfitted (fused) score on its topics
                unfitted = resolve_scorer(deployed.scorer, **(deployed.scorer_options or {}))
                flt = ConformalFilter(unfitted, calibrator, unit="sentence")
                flt.calibrate(calibration, group_by=group_by, seed=seed, monitor=False,
                              language=config.language)
                if not unfitted.is_fitted:
                    fitted = flt.scorer_, _calibration_share(flt.scorer_, calibration, seed)
            else:
                flt = ConformalFilter(fitted[0], calibrator, unit="sentence")
                flt.calibrate(fitted[1], group_by=group_by, seed=seed, monitor=False,
                              language=config.language)
            contexts_of: dict[int, tuple[_Item, ...]] = {}
            for q in test_queries.tolist():
                pos = queries[q].positions
                result = flt.filter(queries[q].question, [pairs[i] for i in pos.tolist()])
                items = []
                for kept in result.kept:
                    item = (int(pos[kept.index]), tuple(kept.spans))
                    pruned[item] = kept.pruned_text
                    items.append(item)
                contexts_of[q] = tuple(items)
            tag = "" if len(config.modes) == 1 else f" {mode}"
            out.append((_Row(f"conformal (sentence){tag} a={a:g}", "conformal (sentence)",
                             (("mode", mode), ("alpha", a), ("unit", "sentence"))), contexts_of))
    return out


def _calibration_share(fitted: Scorer, calibration: list[Pair], seed: int) -> list[Pair]:
    """The calibration pairs a score fitted by ``calibrate(seed=seed)`` calibrated on: the
    topics :func:`~ragsieve.scoring.shares.pairs_fit_mask` did not draw, for the
    sentence-in-context score; every pair for a score that fell back to one fitted on
    nothing (the sentence score alone, :func:`~ragsieve.scoring.sentence_context.fit_sentence_context`)."""
    if not fitted.tags.sentence_in_context:  # the scorer's tag, not its class
        return calibration
    fit = pairs_fit_mask(calibration, seed=seed)
    return [p for p, f in zip(calibration, fit.tolist(), strict=True) if not f]


def _evidence_spans(pairs: list[Pair], queries: list[_Query], answerable: np.ndarray,
                    language: str | None) -> dict[int, tuple[tuple[int, int], ...]]:
    """The evidence sentences' spans of every relevant snippet of the answerable queries, by
    pair index (:func:`ragsieve.units.sentence_pairs` over each query's whole list, so the
    query's ``answers`` count on whichever of its lines they stand)."""
    from ..units import sentence_pairs

    lists = [queries[q].positions.tolist() for q in np.flatnonzero(answerable).tolist()]
    owner = {(pairs[i].query_id, k): i for positions in lists for k, i in enumerate(positions)}
    spans: dict[int, list[tuple[int, int]]] = {}
    for s in sentence_pairs([pairs[i] for positions in lists for i in positions], language=language):
        if s.relevant == 1:
            i = owner[(s.query_id, int(s.meta["parent_position"]))]
            spans.setdefault(i, []).append((int(s.meta["sentence_start"]), int(s.meta["sentence_end"])))
    return {i: tuple(v) for i, v in spans.items()}


def _oracle_contexts(pairs: list[Pair], queries: list[_Query], test_queries: np.ndarray,
                     evidence_spans: dict[int, tuple[tuple[int, int], ...]],
                     pruned: dict[_Item, str],
                     ) -> list[tuple[_Row, dict[int, tuple[_Item, ...]]]]:
    """The two oracle rows of the sentence unit (labels, not a score, choose): ``oracle``
    keeps every relevant snippet whole, ``oracle (sentence)`` only the evidence sentences of
    the relevant snippets (:func:`_evidence_spans`). They bound what any score can remove
    at either unit; each item's text goes into ``pruned``."""
    whole: dict[int, tuple[_Item, ...]] = {}
    evidence: dict[int, tuple[_Item, ...]] = {}
    for q in test_queries.tolist():
        relevant = [i for i in queries[q].positions.tolist() if pairs[i].relevant == 1]
        whole[q] = tuple((i, ()) for i in relevant)
        items = [(i, evidence_spans[i]) for i in relevant if i in evidence_spans]
        for item in items:
            pruned[item] = " ".join(pairs[item[0]].text[b:e] for b, e in item[1])
        evidence[q] = tuple(items)
    return [(_Row("oracle", "oracle", ()), whole),
            (_Row("oracle (sentence)", "oracle (sentence)", (("unit", "sentence"),)), evidence)]


def evaluate_answers(
    pairs: Sequence[Pair],
    scorer: Any,
    config: AnswerConfig | None = None,
    *,
    connection: LLMConnection | None = None,
    group_by: str | None = None,
    scorer_options: dict[str, Any] | None = None,
    progress: bool = False,
    **config_kwargs: Any,
) -> AnswerReport:
    """Measure what the generator gets from each method's kept context.

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled pairs with groups; queries whose pairs carry ``meta["answers"]`` (a list
        of gold answer strings; ``meta["nuggets"]`` optionally) are evaluated, the others
        only calibrate.
    scorer : Scorer or str
        The nonconformity score (``"best"``: fused, fitted per split).
    config : AnswerConfig, optional
        What to measure; or pass its fields as keyword arguments.
    connection : LLMConnection, optional
        The generator and judge (:func:`ragsieve.llm.connect`). Without one and with
        ``config.generate``, the local default model is started for this call (context
        window :data:`LOCAL_N_CTX`) with the default reply cache, and stopped after.
    group_by : str, optional
        ``Pair.meta`` key of the ``group`` mode's attribute.
    scorer_options : dict, optional
        Keyword arguments of a scorer built from an alias.
    progress : bool
        Progress bars while scoring, generating and judging.

    Returns
    -------
    AnswerReport

    Raises
    ------
    DataError
        When no query carries gold answers, or no split has a test query with answers.
    """
    config = _answer_config(config, config_kwargs)
    pairs = list(pairs)
    if not pairs:
        raise DataError("no pairs to evaluate: the dataset is empty.")
    pairs, scores, features, scorer_info, _ = score_for_evaluation(
        pairs, scorer, progress=progress, scorer_options=scorer_options,
        fusion_fraction=config.fusion_fraction)
    group_by = _group_field(group_by, config)
    data = ScoredData.from_pairs(pairs, scores, group_by=group_by)
    queries = _queries(pairs, data, config.language)
    answerable = _answerable(queries)
    splits = group_splits(data.group_index.tolist(), calibration_fraction=config.calibration_fraction,
                          n_splits=config.n_splits, seed=config.seed)
    tests, chosen = _test_queries(data, splits, answerable, config)
    plan = _plan_contexts(_Scored(pairs, data, features, queries, answerable), tests, chosen,
                          config, _Deployed(scorer, scorer_options, group_by))
    contexts = sorted({(q, ctx) for _, q, ctx in plan.assignments})
    text_of = plan.text_reader(pairs)

    def texts_of(key: _Context) -> list[str]:
        return [text_of(item) for item in key[1]]

    measured = _measure_contexts(queries, contexts, text_of)
    info: dict[str, Any] = {
        "n_queries_evaluated": int(chosen.size), "n_queries": len(queries),
        "n_queries_with_answers": int(answerable.sum()), "n_splits": len(splits),
        "calibration_fraction": config.calibration_fraction, "seed": config.seed,
        "modes": list(config.modes), "scorer": scorer_info, "n_contexts": len(contexts),
        "confidence": config.confidence, "generated": False, "judged": False,
    }
    if config.generate:
        _generate_and_judge(config, connection, queries, texts_of, contexts, measured, info, progress)

    per_query = _per_query(plan.assignments, measured, queries)
    results = _rows(plan.rows, per_query, plan.k_values, config, generated=info["generated"],
                    judged=info["judged"])
    fields = {label: {"method": row.method, **dict(row.fields)} for label, row in plan.rows.items()}
    return AnswerReport(results=results, info=info, per_query=per_query, row_fields=fields)


def _answer_config(config: AnswerConfig | None, config_kwargs: dict[str, Any]) -> AnswerConfig:
    """``config``, or one built from its fields given as keywords (not both)."""
    if config is None:
        return AnswerConfig(**config_kwargs)
    if config_kwargs:
        raise TypeError(f"pass either config or its fields, not both (got {sorted(config_kwargs)}).")
    return config


def _group_field(group_by: str | None, config: AnswerConfig) -> str | None:
    """The ``group`` mode's attribute: ``group_by``, or ``"language"`` (with a warning) when
    a mode needs one and none is given."""
    if group_by is None and any(CALIBRATORS[m].group_kind == "attribute" for m in config.modes):
        group_by = "language"
        logger.warning("mode 'group' without group_by: calibrating per meta field 'language' "
                       "(pairs without it form one group); pass group_by / --group-by FIELD")
    return group_by


def _answerable(queries: list[_Query]) -> np.ndarray:
    """Which queries carry gold answers (a warning names how many do not).

    Raises
    ------
    DataError
        No query carries gold answers.
    """
    answerable = np.array([bool(q.golds) for q in queries])
    if not answerable.any():
        raise DataError("no query carries gold answers: answer evaluation needs an 'answers' list "
                        "(JSONL key 'answers', see docs/data-format.md) on the lines of some queries.")
    if not answerable.all():
        logger.warning("%d of %d queries have no gold answers (or only answers that normalise to "
                       "nothing): they calibrate but are not evaluated",
                       int((~answerable).sum()), answerable.size)
    return answerable


def _test_queries(data: ScoredData, splits: list[tuple[np.ndarray, np.ndarray]],
                  answerable: np.ndarray, config: AnswerConfig,
                  ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Each split's calibration rows with its answerable test queries, and the queries
    evaluated (all of those, or a seeded sample of ``config.limit_queries``).

    Raises
    ------
    DataError
        No split has a test query with gold answers.
    """
    tests = []
    for cal_idx, test_idx in splits:
        tq = np.unique(data.query_index[test_idx])
        tests.append((cal_idx, tq[answerable[tq]]))
    chosen = np.unique(np.concatenate([t for _, t in tests]))
    if chosen.size == 0:
        raise DataError("no split has a test query with gold answers.")
    if config.limit_queries is not None and config.limit_queries < chosen.size:
        rng = np.random.default_rng([config.seed, 13])
        chosen = np.sort(rng.choice(chosen, size=config.limit_queries, replace=False))
    return tests, chosen


@dataclass
class _Plan:
    """Every (row, query, split) and its context, before anything is measured."""

    rows: dict[str, _Row] = field(default_factory=dict)
    assignments: list[tuple[str, int, tuple[_Item, ...]]] = field(default_factory=list)
    k_values: dict[str, list[float]] = field(default_factory=dict)
    pruned: dict[_Item, str] = field(default_factory=dict)  # sentence-unit items' text

    def add(self, row: _Row, contexts_of: dict[int, tuple[_Item, ...]]) -> None:
        self.rows.setdefault(row.label, row)
        self.assignments.extend((row.label, q, items) for q, items in contexts_of.items())

    def text_reader(self, pairs: list[Pair]) -> Callable[[_Item], str]:
        """An item's text: its pruned text (sentence unit), or its pair's whole text."""
        pruned = self.pruned

        def text_of(item: _Item) -> str:
            return pruned[item] if item[1] else pairs[item[0]].text

        return text_of


def _plan_contexts(scored: _Scored, tests: list[tuple[np.ndarray, np.ndarray]],
                   chosen: np.ndarray, config: AnswerConfig, deployed: _Deployed) -> _Plan:
    """Every method's context for every chosen test query of every usable split; identical
    contexts are measured once later.

    Raises
    ------
    DataError
        No split has a relevant snippet on its calibration side.
    """
    pairs, data, queries = scored.pairs, scored.data, scored.queries
    ranks = within_query_rank(data.scores, data.query_index)
    plan = _Plan()
    evidence_spans = (_evidence_spans(pairs, queries, scored.answerable, config.language)
                      if config.unit == "sentence" else {})
    for split_no, (cal_idx, tq) in enumerate(tests):
        if not data.relevant[cal_idx].any():
            logger.warning("split %d skipped: no relevant snippet among its calibration topics", split_no)
            continue
        tq = np.intersect1d(tq, chosen)
        for row, mask, k in _split_contexts(data, ranks, scored.features, config, cal_idx, tq,
                                            split_no):
            plan.rows.setdefault(row.label, row)
            if k is not None:
                plan.k_values.setdefault(row.label, []).append(k)
            for q in tq.tolist():
                pos = queries[q].positions
                plan.assignments.append(
                    (row.label, q, tuple((i, ()) for i in pos[mask[pos]].tolist())))
        if config.unit == "sentence":
            for row, contexts_of in _sentence_contexts(scored, deployed, config, cal_idx, tq,
                                                       split_no, plan.pruned):
                plan.add(row, contexts_of)
            for row, contexts_of in _oracle_contexts(pairs, queries, tq, evidence_spans,
                                                     plan.pruned):
                plan.add(row, contexts_of)
    if not plan.assignments:
        raise DataError("no usable split: every split lacked relevant snippets on the calibration side.")
    return plan


def _measure_contexts(queries: list[_Query], contexts: list[_Context],
                      text_of: Callable[[_Item], str]) -> dict[_Context, dict[str, float]]:
    """The model-free measures of every distinct context."""
    # a snippet is in many contexts (methods, splits): count its tokens once
    tokens = {item: count_tokens(text_of(item))
              for item in sorted({item for _, ctx in contexts for item in ctx})}
    return {key: _model_free(queries[key[0]], [text_of(item) for item in key[1]],
                             sum(tokens[item] for item in key[1])) for key in contexts}


def _model_free(query: _Query, texts: list[str], n_tokens: int) -> dict[str, float]:
    context = "\n".join(texts)
    return {
        "answer_in_context": float(bool(texts) and answer_in_context(context, query.golds,
                                                                     query.language)),
        "context_chars": float(sum(len(t) for t in texts)),
        "context_tokens": float(n_tokens),
        "context_snippets": float(len(texts)),
        "empty_context": float(not texts),
    }


def _generate_and_judge(config: AnswerConfig, connection: LLMConnection | None, queries: list[_Query],
                        texts_of: Callable[[_Context], list[str]], contexts: list[_Context],
                        measured: dict[_Context, dict[str, float]],
                        info: dict[str, Any], progress: bool) -> None:
    """Generate an answer for every distinct context, score it, and judge it (in place)."""
    owned = connection is None
    if connection is None:
        from ..llm.connect import connect

        connection = connect(n_ctx=LOCAL_N_CTX)
    try:
        client = connection.client
        before = dict(client.usage)
        t0 = time.perf_counter()
        answers = _generate(config, connection, queries, texts_of, contexts, measured, info,
                            progress)
        judging = config.judge if config.judge is not None else not connection.is_local
        if config.judge is None and connection.is_local:
            logger.warning("nugget judge skipped: the local model's judgements carry no signal; "
                           "judge with a real model (--base-url) or force it (--judge)")
        if judging:
            _judge(connection, queries, texts_of, contexts, answers, measured, info, progress)
        after = client.usage
        info["llm_requests"] = int(after["n_requests"] - before.get("n_requests", 0))
        info["llm_cache_hits"] = int(after["n_cache_hits"] - before.get("n_cache_hits", 0))
        info["llm_seconds"] = round(time.perf_counter() - t0, 2)
    finally:
        if owned:
            connection.close()


def _generate(config: AnswerConfig, connection: LLMConnection, queries: list[_Query],
              texts_of: Callable[[_Context], list[str]], contexts: list[_Context],
              measured: dict[_Context, dict[str, float]], info: dict[str, Any],
              progress: bool) -> list[Any]:
    """Generate an answer for every distinct context and score it (in place); the answers."""
    from ..generation import short_answer

    def generate(key: _Context) -> Any:
        q = queries[key[0]]
        return short_answer(connection, q.question, texts_of(key), max_tokens=config.max_tokens)

    answers = _map(connection.client, generate, contexts, progress, "generating answers")
    n_errors = 0
    for key, ans in zip(contexts, answers, strict=True):
        q, m = queries[key[0]], measured[key]
        if ans.error is not None:
            n_errors += 1  # a failed request is missing, not a wrong answer
            continue
        m["em"] = exact_match(ans.text, q.golds, q.language)
        m["f1"] = token_f1(ans.text, q.golds, q.language)
        m["answer_chars"] = float(len(ans.text))
        m["abstained"] = float(ans.abstained)
        if ans.n_context:
            m["prompt_tokens"] = float(ans.prompt_tokens)
        if ans.latency_s is not None:
            m["latency_s"] = float(ans.latency_s)
    info.update(generated=True, generator={"model": connection.model, "base_url": connection.base_url,
                                           "style": connection.style, "local": connection.is_local},
                generation_errors=n_errors)
    return answers


def _judge(connection: LLMConnection, queries: list[_Query],
           texts_of: Callable[[_Context], list[str]], contexts: list[_Context], answers: list[Any],
           measured: dict[_Context, dict[str, float]], info: dict[str, Any],
           progress: bool) -> None:
    """Judge every answer that was generated against the query's nuggets (in place)."""
    from .nuggets import NuggetJudge

    client = connection.client
    judge = NuggetJudge(client, style=connection.style)
    answer_of = {key: ans.text for key, ans in zip(contexts, answers, strict=True)
                 if ans.error is None}
    todo = list(answer_of)

    def ask(key: _Context) -> Any:
        q = queries[key[0]]
        return judge.judge(q.question, texts_of(key), answer_of[key], q.nuggets)

    judgements = _map(client, ask, todo, progress, "judging answers")
    n_unparsed = 0
    for key, j in zip(todo, judgements, strict=True):
        n_unparsed += j.n_unparsed
        m = measured[key]
        m["nugget_precision"], m["nugget_recall"], m["nugget_f1"] = j.precision, j.recall, j.f1
    info.update(judged=True, judge_unparsed=n_unparsed)


def _map(client: Any, fn: Callable[[Any], Any], items: list[Any], progress: bool, desc: str) -> list[Any]:
    """``client.map`` that re-raises anything that is not a per-item result (a bug, an interrupt)."""
    out = client.map(fn, items, progress=progress, desc=desc)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return list(out)


def _per_query(assignments: list[tuple[str, int, tuple[_Item, ...]]],
               measured: dict[_Context, dict[str, float]],
               queries: list[_Query]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean of every numeric metric over the splits in which a query was tested, per row."""
    sums: dict[str, dict[int, dict[str, list[float]]]] = {}
    for label, q, ctx in assignments:
        slot = sums.setdefault(label, {}).setdefault(q, {})
        for name, value in measured[(q, ctx)].items():
            if not math.isnan(value):
                slot.setdefault(name, []).append(value)
    return {label: {queries[q].query_id: {name: float(np.mean(v)) for name, v in metrics.items()}
                    for q, metrics in by_q.items()}
            for label, by_q in sums.items()}


def _rows(rows: dict[str, _Row], per_query: dict[str, dict[str, dict[str, float]]],
          k_values: dict[str, list[float]], config: AnswerConfig, *, generated: bool,
          judged: bool) -> list[dict[str, Any]]:
    baseline = per_query["all"]
    qids = sorted(baseline)
    names = list(MODEL_FREE) + (list(GENERATED) if generated else []) + (list(JUDGED) if judged else [])

    def column(label: str, name: str) -> np.ndarray:
        values = per_query[label]
        return np.array([values.get(q, {}).get(name, math.nan) for q in qids], dtype=float)

    out: list[dict[str, Any]] = []
    for label, row in rows.items():
        entry: dict[str, Any] = {"method": row.method, **dict(row.fields)}
        if label in k_values:  # top-k rows: the (mean) k over splits
            entry["k"] = float(np.mean(k_values[label]))
        entry["n_queries"] = len(per_query[label])
        for name in names:
            col = column(label, name)
            entry[f"{name}_mean"] = float(np.nanmean(col)) if np.isfinite(col).any() else None
        entry["ci"] = {} if label == "all" else {
            name: paired_bootstrap(column(label, name), column("all", name),
                                   confidence=config.confidence, n_resamples=config.n_resamples,
                                   seed=config.seed).to_dict()
            for name in CI_METRICS if name in names}
        out.append(entry)
    order = {"all": 0, "conformal": 1, "conformal (sentence)": 2, "top-k (equal size)": 3,
             "top-k (calibrated)": 4, "oracle": 5, "oracle (sentence)": 6}
    out.sort(key=lambda r: (r.get("alpha", 0.0), order.get(r["method"], 9)))
    return out


def write_per_query(report: AnswerReport, path: str | os.PathLike[str]) -> int:
    """Write one JSON line per (method row, query) with the query's value of every metric.

    Each line carries ``method`` (and ``mode`` / ``alpha`` where they apply), ``query_id``
    and the metrics; the file is replaced atomically. Returns the number of lines.
    """
    lines = [json.dumps({**report.row_fields.get(label, {}), "query_id": query_id, **values},
                        ensure_ascii=False, allow_nan=False)
             for label, by_query in report.per_query.items() for query_id, values in by_query.items()]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)
