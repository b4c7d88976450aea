"""Topic-PAC mode: the deployed filter meets its target on new topics, with confidence.

``topic`` holds on average over calibration draws; a single deployment can still fall
short of the target. ``topic-pac`` is risk control with confidence (RCPS: Bates, Angelopoulos,
Lei, Malik & Jordan 2021) with each calibration topic one observation.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import numpy as np

from .._validation import MAX_COUNT, check_alpha
from ..errors import ArtifactError
from ..types import DEFAULT_ALPHA
from .base import Guarantee, ThresholdCalibrator, nouns
from .bounds import BOUNDS, certifies, upper_bound
from .split import relevant_by_unit
from .stats import left_out_details, left_out_of

__all__ = ["TopicPACCalibrator", "topics_required"]

logger = logging.getLogger(__name__)

WEIGHTINGS = ("topic", "snippet")


def topics_required(alpha: float, delta: float, *, bound: str = "wsr", limit: int = 10_000) -> int:
    """Fewest calibration topics with which a perfect calibration (no miss) gives a finite tau.

    Examples
    --------
    >>> topics_required(0.1, 0.1, bound="hb")  # (1 - alpha) ** K <= delta
    22
    """
    k = 1
    while k <= limit and upper_bound(np.zeros(k), delta, bound=bound) > alpha:
        k = k * 2 if k < 8 else k + max(1, k // 8)
    lo = max(1, k // 2)
    for m in range(lo, min(k, limit) + 1):  # smallest in the last stride
        if upper_bound(np.zeros(m), delta, bound=bound) <= alpha:
            return m
    return limit + 1


class TopicPACCalibrator(ThresholdCalibrator):
    """Risk control with confidence on the per-topic miss rate (topics are the units).

    For calibration topic k with relevant scores ``s_k``, the miss rate at threshold t is
    ``L_k(t) = #{s_k > t} / n_k`` in [0, 1], non-increasing in t. With ``UCB(t)`` a
    ``1 - delta`` upper confidence bound on ``E[L(t)]`` computed from the K topics' losses,
    ``threshold_`` is the smallest candidate t such that ``UCB(t') <= alpha`` for every
    candidate ``t' >= t`` (candidates: the relevant scores, scanned from the top). Then,
    for topics exchangeable with the calibration ones,

        P_cal( E_new topic[ L(threshold_) ] <= alpha ) >= 1 - delta,

    i.e. with probability ``1 - delta`` over the calibration draw, a new topic keeps on
    average at least ``1 - alpha`` of its relevant snippets (Bates et al. 2021, Thm. 1;
    the losses are i.i.d. across topics because topics are drawn i.i.d.).

    The bound: ``"wsr"``, Waudby-Smith-Ramdas betting, adapts to the spread of the
    per-topic miss rates and is much the tighter once there are enough topics, but needs
    more of them to certify anything (25 at alpha = delta = 0.1); ``"hb"``,
    Hoeffding-Bentkus, depends on the mean only and needs fewer (22). ``"auto"`` (default)
    takes WSR when the number of calibration topics K is at least 1.5 times WSR's minimum
    and HB otherwise: the choice depends on K alone, never on the losses, so the guarantee
    is that of the bound chosen (``bound_used_``). ``benchmarks/bench_topic_pac.py``
    compares them. ``topics_required_`` is the fewest topics with which a calibration
    without a single miss gives a finite threshold; with fewer the threshold is ``+inf``,
    with a warning. A calibration topic without a relevant snippet has no miss rate: it
    is left out, with a logged warning, and counted in ``n_topics_left_out_`` and in the
    guarantee's details (a ``note``).

    ``weighting="snippet"`` controls the *snippet*-weighted miss rate
    ``E[n_k L_k] / E[n_k]`` instead (topics of unequal size count by size). It is at most
    alpha exactly when ``E[Y_k] <= alpha`` for ``Y_k = n_k (L_k - alpha) / n_max + alpha``,
    which lies in [0, 1] when every topic has at most ``n_max`` relevant snippets (the
    largest calibration topic: new topics are assumed no larger), so the same bound on the
    ``Y_k`` certifies it; ``bound_achieved_`` is then that bound on ``E[Y]``.

    Parameters
    ----------
    alpha : float, default=0.1
        Allowed mean miss rate on a new topic.
    delta : float, default=0.1
        Allowed probability that the calibration draw is unlucky.
    bound : {"auto", "wsr", "hb"}, default="auto"
    weighting : {"topic", "snippet"}, default="topic"
    """

    mode = "topic-pac"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"groups"})
    group_kind: ClassVar[str | None] = "topic"

    def __init__(self, *, alpha: float = DEFAULT_ALPHA, delta: float = 0.1, bound: str = "auto",
                 weighting: str = "topic") -> None:
        self.alpha = alpha
        self.delta = delta
        self.bound = bound
        self.weighting = weighting

    def _check_params(self) -> tuple[float, float]:
        alpha = check_alpha(self.alpha)
        delta = check_alpha(self.delta, name="delta")
        if self.bound not in (*BOUNDS, "auto"):
            raise ValueError(f"bound == {self.bound!r}, must be one of {('auto', *BOUNDS)}.")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting == {self.weighting!r}, must be one of {WEIGHTINGS}.")
        return alpha, delta

    def topics_needed(self) -> tuple[int, str]:
        """The fewest topics with which a calibration without a single miss certifies
        ``alpha`` at confidence ``1 - delta`` (:func:`topics_required`; the bound ``auto``
        takes with that few topics); with K topics and no miss the smallest miss rate the
        Hoeffding-Bentkus bound certifies is ``1 - delta ** (1 / K)``.

        Examples
        --------
        >>> TopicPACCalibrator(alpha=0.1, delta=0.1).topics_needed()[0]
        22
        """
        alpha, delta = self._check_params()
        bound = "hb" if self.bound == "auto" else str(self.bound)
        k = topics_required(alpha, delta, bound=bound)
        return k, (f"mode topic-pac at alpha {alpha:g}, delta {delta:g} needs at least {k} "
                   f"calibration topics with evidence: with K topics and no miss at all, the "
                   f"smallest miss rate it can certify is 1 - delta^(1/K) "
                   f"({1 - delta ** (1 / k):.3f} at K = {k})")

    def _bound_for(self, k: int, alpha: float, delta: float) -> str:
        """The bound used with k topics (``auto``: a function of k alone)."""
        if self.bound != "auto":
            return str(self.bound)
        return "wsr" if k >= 1.5 * topics_required(alpha, delta, bound="wsr") else "hb"

    def _losses(self, misses: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """The per-topic losses whose mean is bounded."""
        if self.weighting == "topic":
            return misses / sizes
        # E[n L] / E[n] <= alpha  <=>  E[Y] <= alpha with Y = (n L - alpha n) / cap + alpha
        # in [0, 1] (n <= cap): one bound, no union
        alpha, cap = float(self.alpha), float(sizes.max())
        return np.clip((misses - alpha * sizes) / cap + alpha, 0.0, 1.0)

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> TopicPACCalibrator:
        alpha, delta = self._check_params()
        s, g, self.n_topics_left_out_ = relevant_by_unit(
            scores, relevant, groups, name="groups (topics)", mode=self.mode, unit="topic")
        k = int(g.max()) + 1
        # the betting bound reads the topics in order and is valid for i.i.d. topics in
        # random order: shuffle with a fixed seed, so that a file sorted by difficulty
        # cannot break it and the same data always gives the same threshold
        g = np.random.default_rng(0).permutation(k)[g]
        sizes = np.bincount(g, minlength=k).astype(float)
        self.n_topics_ = k
        self.bound_used_ = self._bound_for(k, alpha, delta)
        self.topics_required_ = topics_required(alpha, delta, bound=self.bound_used_)
        cands = np.unique(s)[::-1]  # from the top: the loss grows as t falls
        tau, best = math.inf, None
        for t in cands:
            losses = self._losses(np.bincount(g, weights=(s > t).astype(float), minlength=k), sizes)
            if not certifies(losses, alpha, delta, bound=self.bound_used_):
                break
            tau, best = float(t), losses
        self.bound_achieved_ = (math.nan if best is None
                                else upper_bound(best, delta, bound=self.bound_used_))
        self._set_fitted(tau, int(s.size))
        if self.infinite_:
            logger.warning(
                "topic-pac: %d calibration topics cannot certify a mean miss rate <= %g with "
                "confidence %g (%s bound; at least %d topics are needed, and more when topics "
                "miss evidence); threshold is +inf (keep everything).", k, alpha, 1 - delta,
                self.bound_used_, self.topics_required_)
        return self

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "n_topics": self.n_topics_,
                "n_topics_left_out": self.n_topics_left_out_,
                "bound_achieved": None if math.isnan(self.bound_achieved_) else self.bound_achieved_}

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        alpha, delta = self._check_params()
        k, achieved = state["n_topics"], state.get("bound_achieved")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_COUNT:
            raise ArtifactError(f"topic-pac state n_topics == {k!r:.30}, expected an int in "
                                f"[1, {MAX_COUNT}].")
        if achieved is not None and (isinstance(achieved, bool) or not isinstance(achieved, float)):
            raise ArtifactError(f"topic-pac state bound_achieved == {achieved!r}, expected a number.")
        self.n_topics_ = k
        self.n_topics_left_out_ = left_out_of(state, "topic", self.mode)
        self.bound_achieved_ = math.nan if achieved is None else achieved
        self.bound_used_ = self._bound_for(k, alpha, delta)
        self.topics_required_ = topics_required(alpha, delta, bound=self.bound_used_)

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        n = nouns(unit)
        a, d = float(self.alpha), float(self.delta)
        per = "topic" if self.weighting == "topic" else "snippet (topics weighted by size)"
        return Guarantee(
            mode=self.mode, metric=f"topic_coverage_quantile_{d:g}", target=1 - a, alpha=a,
            statement=(f"with probability >= {1 - d:.3g} over the calibration topics, a new topic "
                       f"keeps on average >= {1 - a:.3g} of its {n.relevant_plural} (per {per})"),
            n_calibration=self.n_topics_, n_required=self.topics_required_,
            infinite=self.infinite_,
            details={"delta": d, "bound": self.bound_used_, "weighting": self.weighting,
                     "bound_achieved": None if math.isnan(self.bound_achieved_)
                     else self.bound_achieved_, "n_relevant": self.n_calibration_,
                     **left_out_details(self.n_topics_left_out_, "topic")},
        )
