"""PAC mode: training-conditional coverage, with confidence over the calibration draw."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .._validation import check_alpha
from ..types import DEFAULT_ALPHA
from .base import Guarantee, ThresholdCalibrator, nouns
from .split import relevant_scores
from .stats import binomial_sf, conformal_rank

__all__ = ["PACCalibrator"]

logger = logging.getLogger(__name__)


class PACCalibrator(ThresholdCalibrator):
    """Training-conditional coverage: P(coverage >= 1 - alpha) >= 1 - delta over calibration draws.

    The coverage of the k-th smallest of n calibration scores is Beta(k, n - k + 1), so
    ``P(coverage < 1 - alpha) = P(Binomial(n, 1 - alpha) >= k)``. ``threshold_`` is the
    k*-th smallest score with k* the smallest k for which that probability is at most
    delta (Vovk 2012; Bates et al. 2021). ``n_required_`` is the smallest n for which a
    finite threshold exists: ``(1 - alpha)^n <= delta``. It assumes exchangeable
    *snippets*; across topics see the ``topic`` mode.

    Parameters
    ----------
    alpha : float
        Miscoverage.
    delta : float, default=0.1
        Allowed probability that the calibration draw is unlucky.
    """

    mode = "pac"

    def __init__(self, *, alpha: float = DEFAULT_ALPHA, delta: float = 0.1) -> None:
        self.alpha = alpha
        self.delta = delta

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> PACCalibrator:
        alpha = check_alpha(self.alpha)
        delta = check_alpha(self.delta, name="delta")
        arr, rel = relevant_scores(scores, relevant)
        s = np.sort(arr[rel])
        n = s.size
        self.n_required_ = math.ceil(math.log(delta) / math.log(1 - alpha) - 1e-9)
        rank = conformal_rank(n, alpha)  # PAC never needs a smaller rank than the marginal one
        while rank <= n and binomial_sf(rank, n, 1 - alpha) > delta:
            rank += 1
        self.rank_ = rank
        self._set_fitted(float(s[rank - 1]) if rank <= n else math.inf, n)
        if self.infinite_:
            logger.warning("pac: n=%d relevant calibration snippets are too few for alpha=%g, "
                           "delta=%g (need n >= %d); threshold is +inf.", n, alpha, delta,
                           self.n_required_)
        return self

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        a, d = check_alpha(self.alpha), check_alpha(self.delta, name="delta")
        self.n_required_ = math.ceil(math.log(d) / math.log(1 - a) - 1e-9)

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        nouns(unit)  # the statement names no unit; the unit is checked all the same
        a, d = float(self.alpha), float(self.delta)
        return Guarantee(
            mode=self.mode, metric=f"coverage_quantile_{d:g}", target=1 - a, alpha=a,
            statement=(f"with probability >= {1 - d:.3g} over the calibration draw, coverage >= "
                       f"{1 - a:.3g}"),
            n_calibration=self.n_calibration_, n_required=self.n_required_,
            infinite=self.infinite_, details={"delta": d},
        )
