"""Topic-disjoint evaluation of the conformal filter against top-k and threshold baselines.

Scores are computed once for every pair; each of ``n_splits`` random group-disjoint
calibration/test splits then calibrates tau on the calibration groups and measures,
on the test groups, micro coverage, per-query coverage and removal, for the conformal
filter and, on the same test groups, for per-query top-k and fixed cut-offs on the score.
The fixed cut-offs are by default quantiles of the score itself, taken on each split's
calibration side (so they mean something for any score, in any units), and are reported
as keep rules in the score's own units and direction (``keep bm25 >= 6.1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_alpha, check_int, check_scores
from ..calibration import CALIBRATORS, MODES, BaseCalibrator, BudgetCalibrator, make_calibrator
from ..calibration.inputs import CalibrationInputs
from ..data.splits import MAX_SPLITS, group_splits
from ..errors import DataError, ScorerError
from ..fitting import fit_split
from ..scoring.base import KeepRule
from ..scoring.fusion import FUSION_FIT_FRACTION, FusionFeatures
from ..types import Pair
from .metrics import char_removal, coverage, query_coverage, removal, within_query_rank

__all__ = [
    "DEFAULT_ALPHAS",
    "DEFAULT_THRESHOLD_QUANTILES",
    "DEFAULT_TOP_K",
    "TOLERANCE_SE",
    "EvaluationConfig",
    "EvaluationReport",
    "ScoredData",
    "evaluate",
    "evaluate_scores",
]

logger = logging.getLogger(__name__)

DEFAULT_ALPHAS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)
DEFAULT_TOP_K: tuple[int, ...] = (1, 2, 3, 5)
#: Quantiles of the score (on each split's calibration side) that the fixed-threshold
#: baselines cut at: ``keep score <= its q-quantile`` keeps about a share q of the snippets.
DEFAULT_THRESHOLD_QUANTILES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
#: A conformal row passes when coverage_mean >= target - TOLERANCE_SE * standard error
#: of the mean over splits (about a 3-sigma sampling tolerance).
TOLERANCE_SE = 3.0


@dataclass(frozen=True)
class EvaluationConfig:
    """What :func:`evaluate_scores` sweeps.

    Attributes
    ----------
    alphas : tuple of float
        Miscoverage levels of the conformal rows.
    top_k : tuple of int
        Per-query top-k baselines (keep the k lowest scores of each query).
    thetas : tuple of float or None
        Fixed cut-offs in the score's own units and direction, as its keep rule reads
        them (``keep 1 - cos <= theta``, ``keep bm25 >= theta``; see
        :meth:`ragsieve.scoring.Scorer.keep_rule`). None (the default): cut at the
        ``threshold_quantiles`` of the score instead. An empty tuple: no fixed cut-offs.
    threshold_quantiles : tuple of float
        With ``thetas=None``: the quantiles, in (0, 1), of the scores of each split's
        calibration topics (all snippets, relevant or not) that the fixed-threshold rows
        cut at; the test topics never choose a cut-off.
    n_splits : int
        Number R of random group-disjoint splits, in [1, ``MAX_SPLITS``] (10000).
    calibration_fraction : float
        Fraction of groups used for calibration in each split.
    seed : int
        Seed of the split generator.
    modes : tuple of str
        Guarantee modes to calibrate (see :mod:`ragsieve.calibration.modes`); each
        conformal row carries ``mode``, ``guaranteed_metric`` and ``guaranteed_value``.
    delta : float
        Confidence parameter of the ``pac`` mode.
    min_group_size : int or None
        Minimum group size of the ``group`` mode.
    budgets : tuple of int
        Character budgets per query: each gets a ``budget`` row with the coverage measured
        on the test topics and ``predicted_coverage_lower``, the lower bound that the
        calibration topics gave for it. The ``budget`` mode's conformal rows use the first.
    calibrated_baselines : bool
        Also report, per alpha, top-k and threshold baselines whose k / theta is chosen on
        the calibration topics to reach 1 - alpha (without the conformal correction).
    bound : {"auto", "wsr", "hb"}
        Confidence bound of the ``topic-pac`` mode.
    fusion_fraction : float
        With ``fusion_features``: share of each split's calibration topics that fit the
        fused score's weights (the rest calibrate the threshold).
    calibrator_params : Mapping
        Further parameters of every conformal calibrator (``unit``, ``gamma``, ...,
        as :func:`ragsieve.calibration.make_calibrator` takes them).
    """

    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    top_k: tuple[int, ...] = DEFAULT_TOP_K
    thetas: tuple[float, ...] | None = None
    threshold_quantiles: tuple[float, ...] = DEFAULT_THRESHOLD_QUANTILES
    n_splits: int = 20
    calibration_fraction: float = 0.5
    seed: int = 0
    modes: tuple[str, ...] = ("marginal",)
    delta: float = 0.1
    min_group_size: int | None = None
    budgets: tuple[int, ...] = ()
    calibrated_baselines: bool = True
    bound: str = "auto"
    fusion_fraction: float = FUSION_FIT_FRACTION
    calibrator_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "alphas", tuple(check_alpha(a) for a in self.alphas))
        top_k = tuple(int(k) for k in self.top_k)
        if any(k < 1 for k in top_k):
            raise ValueError(f"top_k values must be >= 1, got {list(top_k)}.")
        object.__setattr__(self, "top_k", top_k)
        if self.thetas is not None:
            thetas = tuple(float(t) for t in self.thetas)
            if any(not math.isfinite(t) for t in thetas):
                raise ValueError(f"thetas must be finite numbers, got {list(thetas)}.")
            object.__setattr__(self, "thetas", thetas)
        quantiles = tuple(float(q) for q in self.threshold_quantiles)
        if any(not 0.0 < q < 1.0 for q in quantiles):
            raise ValueError(f"threshold_quantiles must lie in (0, 1), got {list(quantiles)}.")
        object.__setattr__(self, "threshold_quantiles", quantiles)
        modes = tuple(self.modes)
        for mode in modes:
            if mode not in MODES:
                raise ValueError(f"mode == {mode!r}; accepted modes: {', '.join(MODES)}.")
        object.__setattr__(self, "modes", modes)
        object.__setattr__(self, "budgets", tuple(int(b) for b in self.budgets))
        if "budget" in modes and not self.budgets:
            raise ValueError("mode 'budget' needs a budget: pass budgets=(N,) (CLI --budget N).")
        check_alpha(self.delta, name="delta")
        object.__setattr__(self, "n_splits",
                           check_int(self.n_splits, "n_splits", min_value=1, max_value=MAX_SPLITS))

    def calibrator(self, mode: str, alpha: float) -> BaseCalibrator:
        """A fresh calibrator of ``mode`` at ``alpha`` with this config's parameters (those
        ``mode`` takes: the config holds the parameters of every mode it sweeps)."""
        from ..calibration.modes import mode_params

        params = {"delta": self.delta, "min_group_size": self.min_group_size,
                  "budget": self.budgets[0] if self.budgets else None, "bound": self.bound,
                  **self.calibrator_params, "alpha": alpha}
        taken = mode_params(mode)
        return make_calibrator(mode, **{k: v for k, v in params.items() if k in taken})


@dataclass(frozen=True, kw_only=True)
class ScoredData(CalibrationInputs):
    """A scored dataset as flat arrays, one entry per (query, snippet) pair: the calibrator
    inputs of its pairs (:class:`~ragsieve.calibration.inputs.CalibrationInputs`, which
    ``calibrate`` reads from its pairs too: ``relevant``, ``query_index``, ``group_index``
    (the topic, which splits respect), ``lengths``, ``attribute``, ``texts``) and their
    ``scores`` (numpy.ndarray of float; keyword-only).
    """

    scores: np.ndarray

    @classmethod
    def from_pairs(cls, pairs: Sequence[Pair], scores: Any, *,  # type: ignore[override]
                   group_by: str | None = None, missing_group: str | None = "(none)") -> ScoredData:
        """Build from labelled pairs and their aligned scores.

        ``group_by`` names a ``Pair.meta`` key (e.g. ``"language"``) whose value is the
        attribute of the ``group`` mode; pairs without it get ``missing_group``.
        """
        arr = check_scores(scores)
        if arr.size != len(pairs):
            raise ValueError(f"got {arr.size} scores for {len(pairs)} pairs; they must align.")
        missing = sum(p.relevant is None for p in pairs)
        if missing:
            raise DataError(
                f"{missing} pair(s) have no relevance label; evaluation needs relevant = 0/1."
            )
        inputs = CalibrationInputs.from_pairs(pairs, group_by=group_by,
                                              missing_group=missing_group)
        return cls(scores=arr, **inputs.fields())

    @property
    def inputs(self) -> CalibrationInputs:
        """The calibrator inputs of these pairs (the translation ``calibrate`` uses too)."""
        return CalibrationInputs(**CalibrationInputs.fields(self))

    @property
    def n_queries(self) -> int:
        return int(np.unique(self.query_index).size)


@dataclass
class EvaluationReport:
    """Result of :func:`evaluate`; ``to_dict()`` is the ``--json`` schema."""

    n_queries: int
    n_snippets: int
    n_relevant: int
    n_groups: int
    n_splits: int
    calibration_fraction: float
    seed: int
    results: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_queries": self.n_queries,
            "n_snippets": self.n_snippets,
            "n_relevant": self.n_relevant,
            "n_groups": self.n_groups,
            "n_splits": self.n_splits,
            "calibration_fraction": self.calibration_fraction,
            "seed": self.seed,
            **self.info,
            "results": self.results,
        }

    def rows(self, method: str) -> list[dict[str, Any]]:
        """Result rows of one method (``"conformal"``, ``"top-k"`` or ``"threshold"``)."""
        return [r for r in self.results if r["method"] == method]


def _split_metrics(data: ScoredData, kept: np.ndarray, test: np.ndarray) -> dict[str, float]:
    qc = query_coverage(kept[test], data.relevant[test], data.query_index[test])
    tc = query_coverage(kept[test], data.relevant[test], data.group_index[test])  # per topic
    return {
        "topic_coverage": float(tc.mean()) if tc.size else math.nan,
        "coverage": coverage(kept[test], data.relevant[test]),
        "query_coverage_mean": float(qc.mean()) if qc.size else math.nan,
        "query_coverage_std": float(qc.std()) if qc.size else math.nan,
        "query_all_kept": float((qc == 1.0).mean()) if qc.size else math.nan,
        "removal": removal(kept[test]),
        "removal_chars": char_removal(kept[test], data.lengths[test]),
    }


def calibrated_k(data: ScoredData, ranks: np.ndarray, cal_idx: np.ndarray, alpha: float) -> int:
    """Smallest k whose top-k coverage on the calibration pairs ``cal_idx`` reaches 1 - alpha.

    The plain empirical choice (no conformal correction): the baseline a user would tune
    by hand on labelled data.
    """
    rel_ranks = np.sort(ranks[cal_idx][data.relevant[cal_idx]])
    need = math.ceil(rel_ranks.size * (1 - alpha) - 1e-9)
    return int(rel_ranks[max(need, 1) - 1]) + 1


def _calibrated_topk(data: ScoredData, ranks: np.ndarray, cal_idx: np.ndarray, test: np.ndarray,
                     alpha: float) -> dict[str, Any]:
    """Smallest k whose coverage on the calibration topics reaches 1 - alpha, on the test topics."""
    k = calibrated_k(data, ranks, cal_idx, alpha)
    m: dict[str, Any] = _split_metrics(data, ranks < k, test)
    m["k"] = k
    return m


def _calibrated_threshold(data: ScoredData, cal_idx: np.ndarray, test: np.ndarray,
                          alpha: float) -> dict[str, Any]:
    """The plain empirical (1 - alpha) quantile of calibration relevant scores, on the test topics."""
    rel = np.sort(data.scores[cal_idx][data.relevant[cal_idx]])
    t = float(rel[max(math.ceil(rel.size * (1 - alpha) - 1e-9), 1) - 1])
    m: dict[str, Any] = _split_metrics(data, data.scores <= t, test)
    m["threshold"] = t
    return m


def _fixed_threshold(data: ScoredData, t: float, test: np.ndarray) -> dict[str, Any]:
    """A fixed cut-off ``score <= t`` (nonconformity units) on the test topics."""
    m: dict[str, Any] = _split_metrics(data, data.scores <= t, test)
    m["threshold"] = t
    return m


def _quantile_threshold(data: ScoredData, cal_idx: np.ndarray, test: np.ndarray,
                        q: float) -> dict[str, Any]:
    """Cut at the q-quantile of the calibration topics' scores (a score value, so about
    a share q of the calibration snippets is kept), measured on the test topics."""
    t = float(np.quantile(data.scores[cal_idx], q, method="inverted_cdf"))
    return _fixed_threshold(data, t, test)


def nonconformity_keep_rule(threshold: float) -> KeepRule:
    """The keep rule of bare nonconformity scores: ``keep score <= threshold``."""
    return KeepRule(score="score", keep_if="<=", threshold=float(threshold))


def to_nonconformity(keep_rule: Callable[[float], KeepRule], value: float) -> float:
    """The nonconformity threshold whose keep rule reads ``value`` in the score's units.

    A keep rule maps the nonconformity threshold to the score's units by an affine map
    (the identity, or a negation for a higher-is-better outside score); this inverts it.

    Raises
    ------
    ValueError
        The keep rule does not depend on the threshold.
    """
    at0, at1 = keep_rule(0.0).threshold, keep_rule(1.0).threshold
    if at1 == at0:
        raise ValueError(f"keep rule {keep_rule(0.0)} does not move with its threshold; "
                         "cannot read a cut-off in its units.")
    return (float(value) - at0) / (at1 - at0)


def _keep_fields(keep_rule: Callable[[float], KeepRule], threshold: float) -> dict[str, Any]:
    """``keep`` (the rule as text) and ``keep_rule`` (its dict) of a mean threshold."""
    rule = keep_rule(threshold)
    return {"keep": str(rule), "keep_rule": rule.to_dict()}


class _OncePerMessage(logging.Filter):
    """Let each distinct log message through once (the same warning from every split)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


@contextlib.contextmanager
def _calibration_warnings_once() -> Iterator[None]:
    """Show the same calibration warning once, not once per split.

    Logger filters apply to the logger that emits the record, so each calibration module's
    logger gets the filter for the duration.
    """
    loggers = [logging.getLogger(name) for name in logging.root.manager.loggerDict
               if name.startswith("ragsieve.calibration.")]
    once = _OncePerMessage()
    for lg in loggers:
        lg.addFilter(once)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(once)


def _budget_split(data: ScoredData, budget: int, cal_idx: np.ndarray, test: np.ndarray) -> dict[str, Any]:
    """One split of a character budget: calibration-side prediction, test-side measurement."""
    cal = BudgetCalibrator(budget=budget)
    kept = _calibrate_split(data, cal, cal_idx)
    m: dict[str, Any] = _split_metrics(data, kept, test)
    m["predicted_coverage_lower"] = cal.report_.coverage_lower
    return m


def _per_group_coverage(kept: np.ndarray, relevant: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    for g in sorted(set(groups[relevant].tolist()), key=str):
        mask = relevant & (groups == g)
        out[str(g)] = float(kept[mask].mean())
    return out


_PER_SPLIT = {"coverage": "coverage", "query_coverage": "query_coverage_mean",
              "query_all_kept": "query_all_kept", "topic_coverage": "topic_coverage",
              "miss_rate": "coverage"}


def _per_split_values(metric: str, ms: list[dict[str, Any]]) -> np.ndarray:
    """The mode's own metric in each split (the PAC metrics: the quantity they bound)."""
    if metric == "group_coverage_min":
        return np.array([min(m["per_group"].values()) if m["per_group"] else math.nan for m in ms])
    base = metric.split("_quantile_")[0]
    return np.array([m[_PER_SPLIT[base]] for m in ms], dtype=float)


def _spread(metric: str, ms: list[dict[str, Any]], target: float, delta: float) -> dict[str, float]:
    """How one deployment fares: the delta-quantile of the metric over splits, and the share
    of splits at or above target (a split is one calibration, as a user deploys it)."""
    v = _per_split_values(metric, ms)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"coverage_q": math.nan, "share_at_target": math.nan}
    return {"coverage_q": float(np.quantile(v, delta)),
            "share_at_target": float(np.mean(v >= target - 1e-12))}


def _guaranteed(metric: str, ms: list[dict[str, Any]], delta: float) -> dict[str, Any]:
    """The measured value of a mode's guaranteed metric over the splits, with its standard error."""

    def mean_se(key: str) -> dict[str, Any]:
        v = np.array([m[key] for m in ms], dtype=float)
        v = v[np.isfinite(v)]
        se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
        return {"value": float(v.mean()) if v.size else math.nan, "se": se}

    if "_quantile_" in metric:
        # a PAC guarantee: the metric >= target in at least a 1 - delta share of draws
        return {"value": float(np.quantile(_per_split_values(metric, ms), delta)), "se": 0.0}
    if metric == "group_coverage_min":
        groups = sorted({g for m in ms for g in m["per_group"]})
        if not groups:
            return {"value": math.nan, "se": math.nan, "per_group_coverage": {}}
        vals = {g: [m["per_group"][g] for m in ms if g in m["per_group"]] for g in groups}
        per = {g: float(np.mean(v)) for g, v in vals.items()}
        ses = {g: float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
               for g, v in vals.items()}
        worst = min(per, key=lambda g: per[g])
        return {"value": per[worst], "se": ses[worst], "per_group_coverage": per}
    key = {"query_coverage": "query_coverage_mean", "miss_rate": "coverage"}.get(metric, metric)
    return mean_se(key)


def _aggregate(per_split: list[dict[str, float]]) -> dict[str, float]:
    def col(key: str) -> np.ndarray:
        return np.array([m[key] for m in per_split], dtype=float)

    cov = col("coverage")
    out = {
        "coverage_mean": float(np.nanmean(cov)),
        "coverage_std": float(np.nanstd(cov)),
        "coverage_se": float(np.nanstd(cov, ddof=1) / math.sqrt(len(cov))) if len(cov) > 1 else math.nan,
        "coverage_min": float(np.nanmin(cov)),
        "coverage_max": float(np.nanmax(cov)),
        "query_coverage_mean": float(np.nanmean(col("query_coverage_mean"))),
        "query_coverage_std": float(np.nanmean(col("query_coverage_std"))),
        "query_all_kept_mean": float(np.nanmean(col("query_all_kept"))),
        "removal_mean": float(np.mean(col("removal"))),
        "removal_std": float(np.std(col("removal"))),
        "removal_min": float(np.min(col("removal"))),
        "removal_max": float(np.max(col("removal"))),
        "removal_chars_mean": float(np.mean(col("removal_chars"))),
        "topic_coverage_mean": float(np.nanmean(col("topic_coverage"))),
    }
    if "threshold" in per_split[0]:
        thr = col("threshold")
        finite = thr[np.isfinite(thr)]
        out["threshold_mean"] = float(finite.mean()) if finite.size else math.inf
        out["infinite_threshold_fraction"] = float(np.mean(~np.isfinite(thr)))
    return out


def evaluate_scores(
    data: ScoredData,
    config: EvaluationConfig | None = None,
    *,
    fusion_features: np.ndarray | FusionFeatures | None = None,
    keep_rule: Callable[[float], KeepRule] | None = None,
    splits: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
    **config_kwargs: Any,
) -> EvaluationReport:
    """Run the split sweep on precomputed scores.

    Parameters
    ----------
    data : ScoredData
        Scores, labels, queries and groups.
    config : EvaluationConfig, optional
        What to sweep; built from ``config_kwargs`` when None (the field names of
        :class:`EvaluationConfig`: ``alphas``, ``top_k``, ``thetas``, ``n_splits``, ...).
    fusion_features : numpy.ndarray or FusionFeatures, optional
        Feature matrix (see :func:`ragsieve.scoring.fusion.feature_matrix`; a bare matrix is
        fitted by logistic regression, a ``FusionFeatures`` by its learner). When given,
        the conformal rows use a fused score fitted per split on a random
        ``fusion_fraction`` of the calibration topics and calibrated on the rest
        (``--scorer best``).
    keep_rule : callable, optional
        The scorer's :meth:`~ragsieve.scoring.Scorer.keep_rule` (of the base score when
        the score is fused per split): explicit ``thetas`` are read in its units and the
        fixed-threshold rows report their cut-off through it (``keep``, ``keep_rule``).
        Default: bare nonconformity scores, ``keep score <= theta``.
    splits : sequence of (ndarray, ndarray), optional
        Calibration/test index pairs to use instead of ``n_splits`` random group-disjoint
        splits (e.g. the topic-disjoint folds of
        :func:`~ragsieve.evaluation.expect.expected_on_new_topics`).
    **config_kwargs
        Fields of :class:`EvaluationConfig` (not allowed together with ``config``).

    Returns
    -------
    EvaluationReport
        One row per method and parameter, averaged over splits. Conformal rows carry
        the theoretical band for the mean calibration size and ``within_tolerance``:
        ``guaranteed_value >= target - TOLERANCE_SE * its standard error``.
    """
    if config is None:
        config = EvaluationConfig(**config_kwargs)
    elif config_kwargs:
        raise TypeError(f"pass either config or its fields, not both (got {sorted(config_kwargs)}).")
    needs_attribute = [m for m in config.modes if CALIBRATORS[m].group_kind == "attribute"]
    if needs_attribute and data.attribute is None:
        raise ValueError(f"mode(s) {needs_attribute} need a per-pair attribute: pass group_by "
                         "(CLI --group-by FIELD).")
    if splits is None:
        splits = group_splits(
            data.group_index.tolist(),
            calibration_fraction=config.calibration_fraction,
            n_splits=config.n_splits,
            seed=config.seed,
        )
    splits = list(splits)
    ranks = within_query_rank(data.scores, data.query_index)
    with _calibration_warnings_once():
        results = _sweep(data, splits, ranks, config, fusion_features,
                         keep_rule or nonconformity_keep_rule)
    return EvaluationReport(
        n_queries=data.n_queries,
        n_snippets=int(data.scores.size),
        n_relevant=int(data.relevant.sum()),
        n_groups=int(np.unique(data.group_index).size),
        n_splits=len(splits),
        calibration_fraction=config.calibration_fraction,
        seed=config.seed,
        results=results,
        info={"tolerance_se": TOLERANCE_SE},
    )


def _calibrate_split(data: ScoredData, cal: BaseCalibrator, cal_idx: np.ndarray) -> np.ndarray:
    """Fit ``cal`` on the calibration indices and return its keep-mask over every pair.

    Each calibrator gets the inputs :class:`~ragsieve.calibration.inputs.CalibrationInputs`
    gives it, the same as in ``ConformalFilter.calibrate``.
    """
    inputs = data.inputs
    inputs.fit(cal, data.scores, cal_idx)
    return inputs.predict(cal, data.scores)


def _conformal_metrics(data: ScoredData, cal: BaseCalibrator, kept: np.ndarray,
                       test: np.ndarray) -> dict[str, Any]:
    metrics: dict[str, Any] = _split_metrics(data, kept, test)
    g = cal.guarantee()
    metrics["threshold"] = cal.threshold_
    metrics["n_calibration"] = g.n_calibration
    metrics["n_required"] = g.n_required
    metrics["metric"] = g.metric
    # calibration units (queries, topics) without a relevant snippet, left out of the fit
    metrics["n_left_out"] = int(g.details.get("n_topics_left_out",
                                              g.details.get("n_queries_left_out", 0)))
    if g.metric == "group_coverage_min" and data.attribute is not None:
        # groups calibrated on their own (fallback ones carry the marginal guarantee only)
        own_groups = [k for k in g.details["groups"] if k not in g.details["fallback_groups"]]
        own = test & np.isin(data.attribute.astype(str), own_groups)
        metrics["per_group"] = _per_group_coverage(kept[own], data.relevant[own], data.attribute[own])
    return metrics


def _sweep(data: ScoredData, splits: list[tuple[np.ndarray, np.ndarray]], ranks: np.ndarray,
           config: EvaluationConfig, fusion_features: np.ndarray | FusionFeatures | None,
           keep_rule: Callable[[float], KeepRule]) -> list[dict[str, Any]]:
    """The loop over splits of :func:`evaluate_scores`; returns the aggregated rows."""
    alphas, modes = config.alphas, config.modes
    conf: dict[tuple[str, float], list[dict[str, Any]]] = {(md, a): [] for md in modes for a in alphas}
    with_baselines = config.calibrated_baselines
    cal_topk: dict[float, list[dict[str, Any]]] = {a: [] for a in alphas} if with_baselines else {}
    cal_thr: dict[float, list[dict[str, Any]]] = {a: [] for a in alphas} if with_baselines else {}
    topk: dict[int, list[dict[str, float]]] = {k: [] for k in config.top_k}
    budget_rows: dict[int, list[dict[str, Any]]] = {b: [] for b in config.budgets}
    # fixed cut-offs: explicit ones (read in the score's units) or quantiles of the score
    explicit = config.thetas is not None
    cutoffs: tuple[float, ...] = config.threshold_quantiles if config.thetas is None else config.thetas
    fixed = {v: to_nonconformity(keep_rule, v) for v in cutoffs} if explicit else {}
    thr: dict[float, list[dict[str, Any]]] = {v: [] for v in cutoffs}
    for split_no, (cal_idx, test_idx) in enumerate(splits):
        test = np.zeros(data.scores.size, dtype=bool)
        test[test_idx] = True
        if not data.relevant[cal_idx].any() or not data.relevant[test].any():
            logger.warning("split skipped: no relevant snippet on the calibration or test side")
            continue
        scored, conf_cal_idx = data, cal_idx
        if fusion_features is not None:  # fit the fusion on some of the calibration topics
            fused, conf_cal_idx = fit_split(fusion_features, data.relevant, data.group_index,
                                            cal_idx, seed=config.seed, split=split_no,
                                            fraction=config.fusion_fraction)
            scored = dataclasses.replace(data, scores=fused)
        for a, rows in cal_topk.items():
            rows.append(_calibrated_topk(data, ranks, cal_idx, test, a))
            cal_thr[a].append(_calibrated_threshold(data, cal_idx, test, a))
        for (mode, a), rows in conf.items():
            cal = config.calibrator(mode, a)
            kept = _calibrate_split(scored, cal, conf_cal_idx)
            rows.append(_conformal_metrics(scored, cal, kept, test))
        for k in config.top_k:
            topk[k].append(_split_metrics(data, ranks < k, test))
        for b in config.budgets:
            budget_rows[b].append(_budget_split(data, b, cal_idx, test))
        for v, rows in thr.items():
            rows.append(_fixed_threshold(data, fixed[v], test) if explicit
                        else _quantile_threshold(data, cal_idx, test, v))
    if not any(conf.values()) and alphas:
        raise DataError("no usable split: every split lacked relevant snippets on one side.")
    results: list[dict[str, Any]] = [_conformal_row(mode, a, ms, config.delta)
                                     for (mode, a), ms in conf.items()]
    return results + _baseline_rows(topk, cal_topk, cal_thr, budget_rows, thr,
                                    explicit=explicit, keep_rule=keep_rule)


def _baseline_rows(topk: dict[int, list[dict[str, float]]],
                   cal_topk: dict[float, list[dict[str, Any]]],
                   cal_thr: dict[float, list[dict[str, Any]]],
                   budget_rows: dict[int, list[dict[str, Any]]],
                   thr: dict[float, list[dict[str, Any]]], *, explicit: bool,
                   keep_rule: Callable[[float], KeepRule]) -> list[dict[str, Any]]:
    """The rows of the baselines (top-k, calibrated top-k and threshold, budgets, fixed
    cut-offs), each averaged over the splits of :func:`_sweep`."""
    results: list[dict[str, Any]] = []
    for k, ms in topk.items():
        results.append({"method": "top-k", "k": k, "target": None, **_aggregate(ms), "threshold_mean": None})
    for a, ms in cal_topk.items():
        results.append({"method": "top-k (calibrated)", "alpha": a, "target": 1.0 - a, **_aggregate(ms),
                        "k_mean": float(np.mean([m["k"] for m in ms])), "threshold_mean": None})
    for a, ms in cal_thr.items():
        agg = _aggregate(ms)
        results.append({"method": "threshold (calibrated)", "alpha": a, "target": 1.0 - a, **agg,
                        **_keep_fields(keep_rule, agg["threshold_mean"])})
    for b, ms in budget_rows.items():
        row = {"method": "budget", "budget": b, "target": None, **_aggregate(ms), "threshold_mean": None}
        row["predicted_coverage_lower_mean"] = float(np.mean([m["predicted_coverage_lower"] for m in ms]))
        results.append(row)
    for v, ms in thr.items():
        agg = _aggregate(ms)
        results.append({"method": "threshold", ("theta" if explicit else "quantile"): v,
                        "target": None, **agg, **_keep_fields(keep_rule, agg["threshold_mean"])})
    return results


def _conformal_row(mode: str, a: float, ms: list[dict[str, Any]], delta: float) -> dict[str, Any]:
    """One conformal row: averages over splits and the guaranteed metric against its target."""
    row: dict[str, Any] = {"method": "conformal", "mode": mode, "alpha": a, "target": 1.0 - a}
    row.update(_aggregate(ms))
    n_mean = float(np.mean([m["n_calibration"] for m in ms]))
    row["n_calibration_mean"] = n_mean
    row["n_required"] = ms[0]["n_required"]
    left_out = float(np.mean([m["n_left_out"] for m in ms]))
    if left_out:
        row["n_left_out_mean"] = left_out
        row["note"] = (f"on average {left_out:g} calibration units (queries or topics) without "
                       "a relevant snippet were left out of each calibration")
    if ms[0]["metric"] == "topic_coverage":
        row["topics_required"] = ms[0]["n_required"]
    row["band_low"] = 1.0 - a
    row["band_high"] = min(1.0, 1.0 - a + 1.0 / (n_mean + 1.0))
    values = _guaranteed(ms[0]["metric"], ms, delta)
    row.update(_spread(ms[0]["metric"], ms, 1.0 - a, delta))
    row["delta"] = delta
    row["guaranteed_metric"] = ms[0]["metric"]
    row["guaranteed_value"] = values["value"]
    row.update({k: v for k, v in values.items() if k != "value"})
    se = values.get("se", row["coverage_se"])
    tol = TOLERANCE_SE * (se if math.isfinite(se) else 0.0)
    row["within_tolerance"] = bool(row["guaranteed_value"] >= row["target"] - tol)
    return row


def evaluate(
    pairs: Sequence[Pair],
    scorer: Any,
    *,
    progress: bool = False,
    on_error: str = "raise",
    group_by: str | None = None,
    scorer_options: dict[str, Any] | None = None,
    config: EvaluationConfig | None = None,
    **config_kwargs: Any,
) -> EvaluationReport:
    """Score labelled pairs once and run :func:`evaluate_scores`.

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled pairs with groups.
    scorer : Scorer or str
        The nonconformity score (alias or spec resolved by ``resolve_scorer``). An
        unfitted fused score (``"best"``) is fitted in every split on ``fusion_fraction``
        of the calibration topics and calibrated on the rest.
    progress : bool
        Progress bar while scoring.
    on_error : {"raise", "drop"}
        When the scorer cannot score some pairs (e.g. unusable LLM replies): re-raise
        the ``ScorerError`` (default) or drop those pairs, log how many, and record the
        count as ``n_dropped_errors`` in the report.
    group_by : str, optional
        ``Pair.meta`` key giving the attribute of the ``group`` mode.
    scorer_options : dict, optional
        Keyword arguments for the scorer built from an alias.
    config : EvaluationConfig, optional
        What to sweep; or pass its fields as keyword arguments.
    **config_kwargs
        Fields of :class:`EvaluationConfig`.
    """
    pairs = list(pairs)
    if not pairs:
        raise DataError("no pairs to evaluate: the dataset is empty.")
    if on_error not in ("raise", "drop"):
        raise ValueError(f"on_error == {on_error!r}, must be 'raise' or 'drop'.")
    if config is None:
        config = EvaluationConfig(**config_kwargs)
    elif config_kwargs:
        raise TypeError(f"pass either config or its fields, not both (got {sorted(config_kwargs)}).")
    from ..scoring import resolve_scorer

    scorer = resolve_scorer(scorer, **(scorer_options or {}))
    pairs, scores, features, scorer_info, n_dropped = score_for_evaluation(
        pairs, scorer, progress=progress, on_error=on_error,
        fusion_fraction=config.fusion_fraction)
    needs_attribute = any(CALIBRATORS[m].group_kind == "attribute" for m in config.modes)
    if group_by is None and needs_attribute:
        group_by = "language"
        logger.warning("mode 'group' without group_by: calibrating per meta field 'language' "
                       "(pairs without it form one group); pass group_by / --group-by FIELD")
    report = evaluate_scores(ScoredData.from_pairs(pairs, scores, group_by=group_by), config,
                             fusion_features=features, keep_rule=baseline_scorer(scorer).keep_rule)
    report.info["group_by"] = group_by
    report.info["scorer"] = scorer_info
    report.info["n_dropped_errors"] = n_dropped
    return report


def score_for_evaluation(
    pairs: list[Pair], scorer: Any, *, progress: bool = False, on_error: str = "raise",
    scorer_options: dict[str, Any] | None = None, fusion_fraction: float = FUSION_FIT_FRACTION,
) -> tuple[list[Pair], np.ndarray, FusionFeatures | None, dict[str, Any], int]:
    """Score labelled pairs once for a split sweep.

    Returns
    -------
    pairs, scores, fusion_features, scorer_info, n_dropped
        The pairs kept (all unless ``on_error="drop"`` dropped some), their scores (the
        base's for an unfitted fused score), the features of every signal with the learner
        when ``scorer`` is an unfitted fused score (fitted per split on ``fusion_fraction``
        of the calibration topics, see :func:`evaluate_scores`), else None, the scorer's
        spec for the report, and the number of pairs dropped.
    """
    from ..scoring import resolve_scorer

    scorer = resolve_scorer(scorer, **(scorer_options or {}))
    base = baseline_scorer(scorer)  # the fused score is fitted per split on its signals
    fusion = base is not scorer
    if not fusion and not scorer.is_fitted:
        raise ValueError(
            f"the {scorer.name} score learns from labelled pairs and evaluate fits only the "
            "fused score per split; evaluate it as a signal of the fused score (e.g. --scorer "
            "best --preset portable-reader) or calibrate a filter with it.")
    pairs, scores, n_dropped = _score_or_drop(base, pairs, progress, on_error)
    if not fusion:
        return pairs, scores, None, scorer.spec(), n_dropped
    features = scorer.features_for_evaluation(pairs, base_scores=scores, progress=progress)
    info = {**scorer.spec(), "scorer": "fusion", "features": list(features.names),
            "fitted": f"per split, on a random {fusion_fraction:g} of the calibration topics"}
    return pairs, scores, features, info, n_dropped


def baseline_scorer(scorer: Any) -> Any:
    """The score the baselines (top-k, fixed cut-offs) use: an unfitted fused score's base
    (the fused score is fitted per split), else the scorer itself."""
    base = scorer.base_scorer()
    return base if base is not None and not scorer.is_fitted else scorer


def _score_or_drop(scorer: Any, pairs: list[Pair], progress: bool,
                   on_error: str) -> tuple[list[Pair], np.ndarray, int]:
    """Score every pair; with ``on_error="drop"`` drop those the scorer could not score."""
    try:
        return pairs, scorer.score_pairs(pairs, progress=progress), 0
    except ScorerError as exc:
        partial = getattr(exc, "scores", None)
        if on_error == "raise" or partial is None:
            raise
        keep = np.isfinite(partial)
        n_dropped = int((~keep).sum())
        logger.warning(
            "dropping %d of %d pairs whose score could not be computed (%s); coverage is "
            "measured on the remaining pairs only", n_dropped, len(pairs), exc,
        )
        return [p for p, k in zip(pairs, keep, strict=True) if k], partial[keep], n_dropped
