"""Per-query modes: the expected share of a query's evidence kept, or all of it.

=============== ========================================== =====================================
mode            guarantee (new query exchangeable)          rule
=============== ========================================== =====================================
query-recall    E[share of a query's relevant snippets       conformal risk control (Angelopoulos
                dropped] <= alpha                            et al. 2022) of the per-query miss rate
query-all       P(all of a query's relevant snippets         split conformal on each query's
                kept) >= 1 - alpha                           largest relevant score
=============== ========================================== =====================================
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import numpy as np

from .._validation import check_alpha, check_codes
from .base import Guarantee, ThresholdCalibrator
from .split import SplitConformalCalibrator, relevant_by_unit, relevant_scores
from .stats import (
    left_out_details,
    left_out_of,
    min_calibration_size,
    pooled_cdf,
)

__all__ = ["QueryAllCalibrator", "QueryRecallCalibrator"]

logger = logging.getLogger(__name__)


class QueryRecallCalibrator(ThresholdCalibrator):
    """Conformal risk control of the expected per-query miss rate.

    For a calibration query i with ``n_i >= 1`` relevant snippets, the loss at threshold
    ``t`` is ``L_i(t) = #{relevant scores > t} / n_i`` (non-increasing in t, bounded by
    B = 1). With n calibration queries, ``threshold_`` is the smallest t with

        n / (n + 1) * mean_i L_i(t) + 1 / (n + 1) <= alpha,

    which guarantees ``E[L_new(threshold_)] <= alpha``: on average over new queries at
    least ``1 - alpha`` of each query's evidence is kept (Angelopoulos, Bates, Fisch, Lei
    & Schuster, *Conformal Risk Control*, 2022). Needs ``n >= 1/alpha - 1`` queries for a
    finite threshold; otherwise ``+inf`` with a warning. A calibration query without a
    relevant snippet has no miss rate and is left out (logged, ``n_queries_left_out_``,
    a note in the guarantee).
    """

    mode = "query-recall"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"query_ids"})

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> QueryRecallCalibrator:
        alpha = check_alpha(self.alpha)
        relevant_s, q, self.n_queries_left_out_ = relevant_by_unit(
            scores, relevant, query_ids, name="query_ids", mode=self.mode, unit="query")
        cand, cdf, n = pooled_cdf(relevant_s, q)
        # mean miss rate when keeping scores <= t is 1 - the query-pooled CDF at t
        cand, risk = np.r_[cand, np.inf], np.r_[1.0 - cdf, 0.0]
        bound = n / (n + 1) * risk + 1.0 / (n + 1)
        ok = np.flatnonzero(bound <= alpha + 1e-12)
        self._set_fitted(float(cand[ok[0]]) if ok.size else math.inf, n)
        self.n_relevant_ = int(relevant_s.size)
        if self.infinite_:
            logger.warning(
                "query-recall: %d calibration queries are too few for alpha=%g (need >= %d); "
                "threshold is +inf (keep everything).", n, alpha, math.ceil(1 / alpha - 1),
            )
        return self

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        a = float(self.alpha)
        return self._promise(
            "query_coverage", "mean share of a new query's {relevant_plural} kept >= {target}",
            unit=unit, n_required=math.ceil(1 / a - 1 - 1e-9),
            details={"unit": "query", **left_out_details(self.n_queries_left_out_, "query")})

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "n_queries_left_out": self.n_queries_left_out_}

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self.n_queries_left_out_ = left_out_of(state, "query", self.mode)


class QueryAllCalibrator(ThresholdCalibrator):
    """Keep *all* of a query's relevant snippets with probability >= 1 - alpha.

    Split conformal on the per-query maximum relevant score ``m_i``: ``threshold_`` is
    the ``ceil((n+1)(1-alpha))``-th smallest of the n calibration queries' ``m_i``; a new
    exchangeable query has all its evidence kept exactly when ``m_new <= threshold_``.
    """

    mode = "query-all"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"query_ids"})

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> QueryAllCalibrator:
        check_alpha(self.alpha)
        arr, rel = relevant_scores(scores, relevant)
        q = check_codes(query_ids, arr.size, "query_ids", mode=self.mode)[rel]
        _, inv = np.unique(q, return_inverse=True)
        worst = np.full(inv.max() + 1, -np.inf)
        np.maximum.at(worst, inv, arr[rel])
        inner = SplitConformalCalibrator(alpha=self.alpha).fit(worst)
        self._set_fitted(inner.threshold_, inner.n_calibration_)
        return self

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        return self._promise("query_all_kept",
                             "P(all {relevant_plural} of a new query kept) >= {target}", unit=unit,
                             n_required=min_calibration_size(float(self.alpha)),
                             details={"unit": "query"})
