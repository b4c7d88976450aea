"""Guarantees beyond the marginal one: per query, with confidence, per group, per topic.

Every calibrator here follows the estimator contract of
:class:`~ragsieve.calibration.split.SplitConformalCalibrator`: keyword parameters in
``__init__``, validation and learning in ``fit``, learned state ending in ``_``, and
``predict(scores, groups=None)`` returning the keep-mask ``score <= threshold``.
``fit`` takes the scores of *all* calibration snippets with their relevance labels and,
where the mode needs them, the query id and the group of each snippet.

=============== ========================================== =====================================
mode            guarantee (new query / topic exchangeable)  rule
=============== ========================================== =====================================
marginal        P(relevant snippet kept) >= 1 - alpha        split conformal on relevant scores
query-recall    E[share of a query's relevant snippets       conformal risk control (Angelopoulos
                dropped] <= alpha                            et al.) of the per-query miss rate
query-all       P(all of a query's relevant snippets         split conformal on each query's
                kept) >= 1 - alpha                           largest relevant score
pac             P_cal(coverage >= 1 - alpha) >= 1 - delta   order statistic with a Beta/binomial
                (training-conditional)                       tail bound
group           per group g: P(kept | relevant, g)           Mondrian: split conformal per group,
                >= 1 - alpha                                 pooled fallback below a minimum size
topic           P(kept | relevant, new topic) >= 1 - alpha   pooled-CDF two-layer rule (Dunn,
                with each topic weighted equally             Wasserman & Ramdas), 1/K inflation
=============== ========================================== =====================================
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ..errors import CalibrationError, NotFittedError
from .split import (
    SplitConformalCalibrator,
    check_alpha,
    check_scores,
    conformal_rank,
    min_calibration_size,
)

__all__ = [
    "MODES",
    "MondrianCalibrator",
    "PACCalibrator",
    "QueryAllCalibrator",
    "QueryRecallCalibrator",
    "TopicCalibrator",
    "binomial_sf",
    "make_calibrator",
]

logger = logging.getLogger(__name__)

MODES = ("marginal", "query-recall", "query-all", "pac", "group", "topic")


def _relevant_mask(relevant: Any, n: int) -> np.ndarray:
    if relevant is None:
        return np.ones(n, dtype=bool)
    rel = np.asarray(relevant)
    if rel.shape != (n,):
        raise ValueError(f"relevant has shape {rel.shape}, expected ({n},) to match scores.")
    if rel.dtype != bool and not set(np.unique(rel).tolist()) <= {0, 1}:
        raise ValueError(f"relevant must hold only 0/1 or booleans, got {sorted(set(np.unique(rel).tolist()))!r}.")
    return rel.astype(bool)


def _labels(values: Any, n: int, name: str) -> np.ndarray:
    if values is None:
        raise ValueError(f"this mode needs {name} aligned with the scores; got None.")
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise ValueError(f"{name} has shape {arr.shape}, expected ({n},) to match scores.")
    return arr


def _pooled_cdf(scores: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The CDF averaged over units (queries, topics), each unit weighing the same.

    Returns the distinct sorted scores ``t``, ``(1/K) * sum_k F_k(t)`` at each of them
    (ties counted: the value includes every score <= t) and the number of units K.
    """
    uniq, inv = np.unique(units, return_inverse=True)
    k = uniq.size
    counts = np.bincount(inv, minlength=k).astype(float)
    order = np.argsort(scores, kind="stable")
    s_sorted = scores[order]
    pooled = np.cumsum(1.0 / (k * counts[inv[order]]))
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    return s_sorted[last], pooled[last], int(k)


class _Base:
    mode = ""
    threshold_: float

    def __init__(self, *, alpha: float = 0.1) -> None:
        self.alpha = alpha

    def _check_fitted(self) -> None:
        if not hasattr(self, "threshold_"):
            raise NotFittedError(f"This {type(self).__name__} is not fitted yet; call fit(...) first.")

    def predict(self, scores: Any, groups: Any = None) -> np.ndarray:
        """Boolean keep-mask ``scores <= threshold`` (``groups`` used by ``group`` mode only)."""
        self._check_fitted()
        return check_scores(scores) <= self.threshold_

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"


class QueryRecallCalibrator(_Base):
    """Conformal risk control of the expected per-query miss rate.

    For a calibration query i with ``n_i >= 1`` relevant snippets, the loss at threshold
    ``t`` is ``L_i(t) = #{relevant scores > t} / n_i`` (non-increasing in t, bounded by
    B = 1). With n calibration queries, ``threshold_`` is the smallest t with

        n / (n + 1) * mean_i L_i(t) + 1 / (n + 1) <= alpha,

    which guarantees ``E[L_new(threshold_)] <= alpha``: on average over new queries at
    least ``1 - alpha`` of each query's evidence is kept (Angelopoulos, Bates, Fisch, Lei
    & Schuster, *Conformal Risk Control*, 2022). Needs ``n >= 1/alpha - 1`` queries for a
    finite threshold; otherwise ``+inf`` with a warning.
    """

    mode = "query-recall"

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> QueryRecallCalibrator:
        alpha = check_alpha(self.alpha)
        arr = check_scores(scores)
        rel = _relevant_mask(relevant, arr.size)
        q = _labels(query_ids, arr.size, "query_ids")[rel]
        s = arr[rel]
        if s.size == 0:
            raise CalibrationError("no relevant calibration snippet: need at least one query with relevant == 1.")
        cand, cdf, n = _pooled_cdf(s, q)
        # mean miss rate when keeping scores <= t is 1 - the query-pooled CDF at t
        cand, risk = np.r_[cand, np.inf], np.r_[1.0 - cdf, 0.0]
        bound = n / (n + 1) * risk + 1.0 / (n + 1)
        ok = np.flatnonzero(bound <= alpha + 1e-12)
        self.n_calibration_ = int(n)
        self.n_relevant_ = int(s.size)
        self.threshold_ = float(cand[ok[0]]) if ok.size else math.inf
        self.infinite_ = math.isinf(self.threshold_)
        if self.infinite_:
            logger.warning(
                "query-recall: %d calibration queries are too few for alpha=%g (need >= %d); "
                "threshold is +inf (keep everything).", n, alpha, math.ceil(1 / alpha - 1),
            )
        return self

    def guarantee(self) -> dict[str, Any]:
        self._check_fitted()
        return {"mode": self.mode, "metric": "query_coverage", "statement":
                f"mean share of a new query's relevant snippets kept >= {1 - self.alpha:.3g}",
                "n_calibration_queries": self.n_calibration_}


class QueryAllCalibrator(_Base):
    """Keep *all* of a query's relevant snippets with probability >= 1 - alpha.

    Split conformal on the per-query maximum relevant score ``m_i``: ``threshold_`` is
    the ``ceil((n+1)(1-alpha))``-th smallest of the n calibration queries' ``m_i``; a new
    exchangeable query has all its evidence kept exactly when ``m_new <= threshold_``.
    """

    mode = "query-all"

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> QueryAllCalibrator:
        check_alpha(self.alpha)
        arr = check_scores(scores)
        rel = _relevant_mask(relevant, arr.size)
        q = _labels(query_ids, arr.size, "query_ids")[rel]
        if not rel.any():
            raise CalibrationError("no relevant calibration snippet: need at least one query with relevant == 1.")
        uniq, inv = np.unique(q, return_inverse=True)
        worst = np.full(uniq.size, -np.inf)
        np.maximum.at(worst, inv, arr[rel])
        inner = SplitConformalCalibrator(alpha=self.alpha).fit(worst)
        self.n_calibration_ = inner.n_calibration_
        self.threshold_ = inner.threshold_
        self.infinite_ = inner.infinite_
        return self

    def guarantee(self) -> dict[str, Any]:
        self._check_fitted()
        return {"mode": self.mode, "metric": "query_all_kept", "statement":
                f"P(all relevant snippets of a new query kept) >= {1 - self.alpha:.3g}",
                "n_calibration_queries": self.n_calibration_}


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) >= k)`` computed in log space with numpy (no scipy).

    Examples
    --------
    >>> round(binomial_sf(2, 3, 0.5), 6)
    0.5
    """
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    j = np.arange(k, n + 1)
    logc = np.array([math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1) for x in j])
    with np.errstate(divide="ignore"):
        logp = logc + j * math.log(p) + (n - j) * (math.log1p(-p) if p < 1 else -np.inf)
    m = logp.max()
    return float(min(1.0, math.exp(m) * np.exp(logp - m).sum()))


class PACCalibrator(_Base):
    """Training-conditional coverage: P(coverage >= 1 - alpha) >= 1 - delta over calibration draws.

    The coverage of the k-th smallest of n calibration scores is Beta(k, n - k + 1), so
    ``P(coverage < 1 - alpha) = P(Binomial(n, 1 - alpha) >= k)``. ``threshold_`` is the
    k*-th smallest score with k* the smallest k for which that probability is at most
    delta (Vovk 2012; Bates et al. 2021). ``n_required_`` is the smallest n for which a
    finite threshold exists: ``(1 - alpha)^n <= delta``.

    Parameters
    ----------
    alpha : float
        Miscoverage.
    delta : float, default=0.1
        Allowed probability that the calibration draw is unlucky.
    """

    mode = "pac"

    def __init__(self, *, alpha: float = 0.1, delta: float = 0.1) -> None:
        self.alpha = alpha
        self.delta = delta

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "delta": self.delta}

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> PACCalibrator:
        alpha = check_alpha(self.alpha)
        delta = check_alpha(self.delta)
        arr = check_scores(scores)
        s = np.sort(arr[_relevant_mask(relevant, arr.size)])
        n = s.size
        if n == 0:
            raise CalibrationError("no relevant calibration snippet: got 0 scores, need at least 1.")
        self.n_calibration_ = int(n)
        self.n_required_ = math.ceil(math.log(delta) / math.log(1 - alpha))
        rank = conformal_rank(n, alpha)  # PAC never needs a smaller rank than the marginal one
        while rank <= n and binomial_sf(rank, n, 1 - alpha) > delta:
            rank += 1
        self.rank_ = rank
        self.threshold_ = float(s[rank - 1]) if rank <= n else math.inf
        self.infinite_ = rank > n
        if self.infinite_:
            logger.warning("pac: n=%d relevant calibration snippets are too few for alpha=%g, "
                           "delta=%g (need n >= %d); threshold is +inf.", n, alpha, delta, self.n_required_)
        return self

    def guarantee(self) -> dict[str, Any]:
        self._check_fitted()
        return {"mode": self.mode, "metric": "coverage", "statement":
                f"with probability >= {1 - self.delta:.3g} over the calibration draw, coverage >= "
                f"{1 - self.alpha:.3g}", "n_calibration": self.n_calibration_, "n_required": self.n_required_}


class MondrianCalibrator(_Base):
    """Per-group (Mondrian) split conformal: coverage >= 1 - alpha within every group.

    Each group with at least ``min_group_size`` relevant calibration snippets gets its own
    threshold. Smaller groups, and groups unseen at calibration, fall back to the pooled
    (marginal) threshold: logged, and listed in ``fallback_groups_``; for them only the
    marginal guarantee holds.

    Parameters
    ----------
    alpha : float
    min_group_size : int, optional
        Defaults to the smallest n with a finite threshold, ``min_calibration_size(alpha)``.
    """

    mode = "group"

    def __init__(self, *, alpha: float = 0.1, min_group_size: int | None = None) -> None:
        self.alpha = alpha
        self.min_group_size = min_group_size

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "min_group_size": self.min_group_size}

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> MondrianCalibrator:
        alpha = check_alpha(self.alpha)
        arr = check_scores(scores)
        rel = _relevant_mask(relevant, arr.size)
        g = _labels(groups, arr.size, "groups")[rel]
        s = arr[rel]
        minimum = self.min_group_size if self.min_group_size is not None else min_calibration_size(alpha)
        if not isinstance(minimum, int) or minimum < 1:
            raise ValueError(f"min_group_size == {minimum!r}, must be an int >= 1.")
        self.pooled_ = SplitConformalCalibrator(alpha=alpha).fit(s)
        self.thresholds_: dict[Any, float] = {}
        self.group_sizes_: dict[Any, int] = {}
        self.fallback_groups_: list[Any] = []
        for key in np.unique(g).tolist():
            gs = s[g == key]
            self.group_sizes_[key] = int(gs.size)
            if gs.size >= minimum:
                self.thresholds_[key] = SplitConformalCalibrator(alpha=alpha).fit(gs).threshold_
            else:
                self.fallback_groups_.append(key)
        if self.fallback_groups_:
            logger.warning("group: %d group(s) below min_group_size=%d use the pooled threshold "
                           "(marginal guarantee only): %s", len(self.fallback_groups_), minimum,
                           self.fallback_groups_[:10])
        self.threshold_ = self.pooled_.threshold_
        self.n_calibration_ = int(s.size)
        return self

    def threshold_for(self, group: Any) -> float:
        """The threshold applied to a snippet of ``group`` (pooled for small/unseen groups)."""
        self._check_fitted()
        return self.thresholds_.get(group, self.pooled_.threshold_)

    def predict(self, scores: Any, groups: Any = None) -> np.ndarray:
        self._check_fitted()
        arr = check_scores(scores)
        g = _labels(groups, arr.size, "groups")
        unseen = sorted({x for x in g.tolist() if x not in self.group_sizes_}, key=str)
        if unseen:
            logger.info("group: unseen group(s) %s use the pooled threshold", unseen[:10])
        taus = np.array([self.threshold_for(x) for x in g.tolist()], dtype=float)
        return arr <= taus

    def guarantee(self) -> dict[str, Any]:
        self._check_fitted()
        return {"mode": self.mode, "metric": "group_coverage_min", "statement":
                f"within each calibrated group, P(relevant snippet kept) >= {1 - self.alpha:.3g}",
                "groups": dict(self.group_sizes_), "fallback_groups": list(self.fallback_groups_)}


class TopicCalibrator(_Base):
    """Coverage for a *new topic*: the two-layer pooled-CDF rule.

    Pooled snippet-level conformal assumes snippets are exchangeable; when topics are
    the exchangeable units (calibrate on some topics, deploy on others) the number that
    matters is K, the number of calibration topics. With ``F_k`` the empirical CDF of
    topic k's relevant scores, ``threshold_`` is the smallest score t with

        (1/K) * sum_k F_k(t) >= (1 - alpha) * (K + 1) / K,

    the pooled-CDF method of Dunn, Wasserman & Ramdas (2022, *Distribution-free
    prediction sets for two-layer hierarchical models*): each topic weighs the same
    however many snippets it has, and the (K+1)/K inflation is the finite-sample
    correction at the topic level. The level exceeds 1 — threshold ``+inf`` with a
    warning — unless ``K >= (1 - alpha) / alpha`` (9 topics at alpha = 0.1, 4 at 0.2):
    ``topics_required_``. Its guarantee concerns a relevant snippet drawn from a new
    topic with topics weighted equally; ``tests/test_modes.py`` checks it over many
    topic splits of synthetic and real data.
    """

    mode = "topic"

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> TopicCalibrator:
        alpha = check_alpha(self.alpha)
        arr = check_scores(scores)
        rel = _relevant_mask(relevant, arr.size)
        g = _labels(groups, arr.size, "groups (topics)")[rel]
        s = arr[rel]
        if s.size == 0:
            raise CalibrationError("no relevant calibration snippet: need at least one topic with relevant == 1.")
        cand, cdf, k = _pooled_cdf(s, g)
        self.n_topics_ = int(k)
        self.n_calibration_ = int(s.size)
        self.topics_required_ = math.ceil((1 - alpha) / alpha - 1e-9)
        level = (1 - alpha) * (k + 1) / k
        ok = np.flatnonzero(cdf >= level - 1e-12)
        self.threshold_ = float(cand[ok[0]]) if ok.size else math.inf
        self.infinite_ = math.isinf(self.threshold_)
        if self.infinite_:
            logger.warning("topic: %d calibration topics are too few for alpha=%g (need >= %d); "
                           "threshold is +inf (keep everything).", k, alpha, self.topics_required_)
        return self

    def guarantee(self) -> dict[str, Any]:
        self._check_fitted()
        return {"mode": self.mode, "metric": "topic_coverage", "statement":
                f"a relevant snippet of a new topic (topics weighted equally) is kept with "
                f"probability >= {1 - self.alpha:.3g}", "n_topics": self.n_topics_,
                "topics_required": self.topics_required_}


class _Marginal(SplitConformalCalibrator):
    """Marginal mode with the common ``fit(scores, relevant, query_ids=, groups=)`` signature."""

    mode = "marginal"

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None, groups: Any = None) -> _Marginal:  # type: ignore[override]
        super().fit(scores, relevant)
        return self

    def predict(self, scores: Any, groups: Any = None) -> np.ndarray:  # type: ignore[override]
        return super().predict(scores)


def make_calibrator(mode: str, *, alpha: float, delta: float = 0.1, min_group_size: int | None = None) -> Any:
    """The calibrator of a guarantee mode (the one place mode names are resolved).

    Parameters
    ----------
    mode : {"marginal", "query-recall", "query-all", "pac", "group", "topic"}
    alpha : float
    delta : float
        ``pac`` only.
    min_group_size : int, optional
        ``group`` only.
    """
    if mode == "marginal":
        return _Marginal(alpha=alpha)
    if mode == "query-recall":
        return QueryRecallCalibrator(alpha=alpha)
    if mode == "query-all":
        return QueryAllCalibrator(alpha=alpha)
    if mode == "pac":
        return PACCalibrator(alpha=alpha, delta=delta)
    if mode == "group":
        return MondrianCalibrator(alpha=alpha, min_group_size=min_group_size)
    if mode == "topic":
        return TopicCalibrator(alpha=alpha)
    raise ValueError(f"mode == {mode!r}; accepted modes: {', '.join(MODES)}.")
