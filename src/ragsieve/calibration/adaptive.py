"""Adaptive mode: adaptive conformal inference (ACI, Gibbs & Candès 2021) on feedback.

After each relevant live snippet the working miscoverage ``alpha_t`` moves by
``gamma * (alpha - err_t)``, and the threshold is recomputed on a sliding window of the
most recent relevant scores. Whatever the score distribution does, the long-run miss
rate of relevant snippets stays close to ``alpha``.

By default (``bounded=True``) ``alpha_t`` is kept inside ``[1/(m+1), m/(m+1)]`` for a
pool of ``m`` scores, so the threshold is always one of the pool's scores (the
calibration scores and the labelled live ones): feedback can never make it ``+inf``
(keep all) or ``-inf`` (keep nothing). The amount clipped is recorded and enters the
error bound.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any

import numpy as np

from .._validation import (
    MAX_COUNT,
    check_alpha,
    check_bool,
    check_finite_real,
    check_int,
    check_real,
    check_relevant,
    check_scores,
)
from ..errors import ArtifactError
from ..types import DEFAULT_ALPHA
from .base import BaseCalibrator, Guarantee, _json_float, _read_float, nouns
from .split import relevant_scores
from .stats import conformal_rank

__all__ = ["AdaptiveCalibrator", "AdaptiveConformalFilter"]

logger = logging.getLogger(__name__)


def _check_gamma(gamma: Any) -> float:
    return check_real(gamma, "gamma", min_value=0, max_value=math.inf,  # finite and > 0
                      include_boundaries="neither", hint="e.g. 0.005")


def _check_window(window: Any) -> int | None:
    return check_int(window, "window", min_value=1, allow_none=True,
                     hint="None keeps every score")


def _check_relevant(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"relevant == {value!r}, must be a bool or 0/1.")


class AdaptiveCalibrator(BaseCalibrator):
    """Conformal keep-threshold that follows a shifting score distribution (ACI).

    ``fit`` starts from split-conformal calibration. Each labelled live snippet then goes
    through :meth:`update`: it is kept when ``score <= threshold_`` (the threshold *before*
    the update); a relevant one carries the error ``err_t = 1{score > tau_t}``, the working
    level moves to ``alpha_{t+1} = alpha_t + gamma * (alpha - err_t)``, and its score joins
    the pool (the most recent ``window`` relevant scores). Non-relevant snippets change
    nothing. The threshold is the ``ceil((m + 1)(1 - alpha_t))``-th smallest of the m pool
    scores; ``+inf`` (keep all) when that rank exceeds m or ``alpha_t <= 0``, and ``-inf``
    (keep nothing) when ``alpha_t >= 1``.

    With ``bounded=True`` each updated ``alpha_t`` is clipped into
    ``[min(alpha, 1/(m+1)), max(alpha, m/(m+1))]`` (m: the pool size after the update),
    so the threshold stays between the smallest and the largest pool score; it is
    ``+inf`` only in the fitted state of a calibration set too small for ``alpha``.

    Guarantee (Gibbs & Candès 2021, Prop. 4.1), deterministic for any sequence: after T
    relevant updates, ``|mean(err) - alpha| <= (max(alpha, 1 - alpha) + gamma) / (gamma T)``;
    bounded, ``|mean(err) - alpha| <= (max(alpha, 1 - alpha) + C) / (gamma T)`` with C the
    total amount clipped (``clipped_``, 0 until the pool's range is reached).

    Parameters
    ----------
    alpha : float, default=0.1
        Target long-run miss rate of relevant snippets, in (0, 1).
    gamma : float, default=0.005
        Step size (> 0). Larger adapts faster but makes the threshold noisier.
    window : int or None, default=500
        Pool size (most recent relevant scores, initial calibration scores included);
        None keeps every score.
    bounded : bool, default=True
        Keep ``alpha_t`` in ``[1/(m+1), m/(m+1)]`` (the threshold is always a pool score).
    keep_history : bool, default=True
        Record ``history_`` (grows by one entry per update; turn off in long deployments).

    Attributes
    ----------
    threshold_ : float
        Current threshold tau_t.
    alpha_t_ : float
        Current working miscoverage (unbounded it may leave [0, 1] and stays in
        [-gamma, 1 + gamma]; bounded see above).
    clipped_ : float
        Total amount ``alpha_t`` was clipped by (bounded only; 0 otherwise).
    n_updates_ : int
        Relevant feedback snippets seen since ``fit`` (T).
    n_errors_ : int
        How many of them were dropped.
    history_ : dict of list
        Per :meth:`update` call: ``threshold`` and ``alpha_t`` in force for that snippet,
        ``err`` (0/1 for relevant, NaN for non-relevant), ``kept`` and ``relevant``.

    Examples
    --------
    >>> f = AdaptiveCalibrator(alpha=0.2, gamma=0.05).fit([0.1, 0.2, 0.3, 0.4, 0.5])
    >>> f.threshold_
    0.5
    >>> f.update(0.9, relevant=True)  # a miss: alpha_t drops, the threshold will rise
    False
    >>> round(f.alpha_t_, 3)
    0.16
    """

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_ALPHA,
        gamma: float = 0.005,
        window: int | None = 500,
        bounded: bool = True,
        keep_history: bool = True,
    ) -> None:
        self.alpha = alpha
        self.gamma = gamma
        self.window = window
        self.bounded = bounded
        self.keep_history = keep_history

    mode = "adaptive"
    online = True

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> AdaptiveCalibrator:
        """Start from the scores of relevant calibration snippets.

        Parameters
        ----------
        scores : array-like of float
            Nonconformity scores of calibration snippets. With a finite ``window`` only
            the last ``window`` relevant ones enter the pool.
        relevant : array-like of {0, 1} or bool, optional
            Relevance labels; None means every score is relevant.

        Returns
        -------
        AdaptiveConformalFilter
            ``self``, fitted (``alpha_t_ = alpha``, history cleared).

        Raises
        ------
        ValueError
            Bad ``alpha``, ``gamma``, ``window`` or non-finite scores.
        CalibrationError
            No calibration score.
        """
        self._check_params()
        window = _check_window(self.window)
        arr, rel = relevant_scores(scores, relevant)
        self._pool: deque[float] = deque(arr[rel].tolist(), maxlen=window)
        self.alpha_t_ = self._alpha
        self.clipped_ = 0.0
        self.n_updates_ = 0
        self.n_errors_ = 0
        self.n_calibration_ = int(rel.sum())
        self.history_: dict[str, list[float]] = {
            "threshold": [], "alpha_t": [], "err": [], "kept": [], "relevant": []
        }
        self._refresh()
        return self

    def _check_params(self) -> None:
        self._alpha = check_alpha(self.alpha)
        self._gamma = _check_gamma(self.gamma)
        check_bool(self.bounded, "bounded")

    def alpha_bounds(self) -> tuple[float, float]:
        """The range ``alpha_t`` is kept in: ``[min(alpha, 1/(m+1)), max(alpha, m/(m+1))]``.

        Unbounded (``bounded=False``) it is ``(-inf, inf)``.
        """
        self._check_fitted()
        return self._bounds()

    def _bounds(self) -> tuple[float, float]:
        if not self.bounded:
            return -math.inf, math.inf
        m = len(self._pool)
        return min(self._alpha, 1.0 / (m + 1)), max(self._alpha, m / (m + 1))

    def _clip(self, value: float) -> float:
        lo, hi = self._bounds()
        clipped = min(max(value, lo), hi)
        self.clipped_ += abs(value - clipped)
        return clipped

    def _refresh(self) -> None:
        a = self.alpha_t_
        m = len(self._pool)
        if a >= 1.0:
            self.threshold_ = -math.inf
            return
        if a <= 0.0:
            self.threshold_ = math.inf
            return
        rank = conformal_rank(m, a)
        if rank > m:
            self.threshold_ = math.inf
        elif rank < 1:  # pragma: no cover - ceil of a positive number is >= 1
            self.threshold_ = -math.inf
        else:
            pool = np.fromiter(self._pool, dtype=np.float64, count=m)
            self.threshold_ = float(np.partition(pool, rank - 1)[rank - 1])
        self.infinite_ = math.isinf(self.threshold_) and self.threshold_ > 0

    def predict(self, scores: Any, *, query_ids: Any = None, groups: Any = None,
                lengths: Any = None) -> np.ndarray:
        """Keep-mask ``scores <= threshold_`` under the current threshold (no update)."""
        self._check_fitted()
        return check_scores(scores) <= self.threshold_

    def update(self, score: float, relevant: bool) -> bool:
        """Filter one live snippet with the current threshold, then learn from its label.

        Parameters
        ----------
        score : float
            The snippet's nonconformity score (finite).
        relevant : bool or {0, 1}
            Feedback label.

        Returns
        -------
        bool
            Whether the snippet was kept (``score <= threshold_`` before the update).
        """
        self._check_fitted()
        s = check_finite_real(score, "score")
        rel = _check_relevant(relevant)
        tau, a = self.threshold_, self.alpha_t_
        kept = s <= tau
        err = math.nan
        if rel:
            err = 0.0 if kept else 1.0
            self.n_updates_ += 1
            self.n_errors_ += int(err)
            self._pool.append(s)
            self.alpha_t_ = self._clip(a + self._gamma * (self._alpha - err))
            self._refresh()
        if self.keep_history:
            h = self.history_
            h["threshold"].append(tau)
            h["alpha_t"].append(a)
            h["err"].append(err)
            h["kept"].append(float(kept))
            h["relevant"].append(float(rel))
        return kept

    def update_batch(self, scores: Any, relevant: Any) -> np.ndarray:
        """Apply :meth:`update` to each snippet in order.

        Parameters
        ----------
        scores : array-like of float
        relevant : array-like of bool or {0, 1}
            Aligned with ``scores``.

        Returns
        -------
        numpy.ndarray of bool
            Kept flags, aligned with ``scores``.
        """
        self._check_fitted()
        arr = check_scores(scores)
        rel = check_relevant(relevant, arr.size)
        return np.fromiter(
            (self.update(float(s), bool(r)) for s, r in zip(arr, rel)), dtype=bool, count=arr.size
        )

    def error_bound(self) -> float:
        """Bound on ``|mean(err) - alpha|`` after the updates so far (inf if none).

        Gibbs & Candès: ``(max(alpha, 1 - alpha) + gamma) / (gamma T)``; bounded,
        ``(max(alpha, 1 - alpha) + clipped_) / (gamma T)`` (alpha_t then stays in [0, 1]).
        """
        self._check_fitted()
        if self.n_updates_ == 0:
            return math.inf
        a = self._alpha
        slack = self.clipped_ if self.bounded else self._gamma
        return (max(a, 1.0 - a) + slack) / (self._gamma * self.n_updates_)

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        n = nouns(unit)
        a = check_alpha(self.alpha)
        bound = self.error_bound()
        return Guarantee(
            mode=self.mode, metric="miss_rate", target=1 - a, alpha=a,
            statement=(f"long-run share of {n.live_relevant_plural} kept -> {1 - a:.3g} under any "
                       f"shift, within error_bound() after T labelled {n.relevant_plural} "
                       "(feedback via update())"
                       + ("; the threshold stays within the pool's scores" if self.bounded
                          else "")),
            n_calibration=self.n_calibration_, n_required=None, infinite=self.infinite_,
            details={"alpha_t": self.alpha_t_, "n_updates": self.n_updates_,
                     "n_errors": self.n_errors_, "clipped": self.clipped_,
                     "error_bound": _json_float(bound)},
        )

    def _state(self) -> dict[str, Any]:
        return {"pool": list(self._pool), "alpha_t": self.alpha_t_, "n_updates": self.n_updates_,
                "n_errors": self.n_errors_, "n_calibration": self.n_calibration_,
                "clipped": self.clipped_}

    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore a state; a bounded calibrator refuses an ``alpha_t`` outside its bounds."""
        self._check_params()
        pool = check_scores(state["pool"], name="adaptive state pool")
        if pool.size == 0:
            raise ArtifactError("adaptive calibration state has an empty pool.")
        self._pool = deque(pool.tolist(), maxlen=_check_window(self.window))
        self.alpha_t_ = _read_float(state, "alpha_t", allow_inf=False)
        self.clipped_ = _read_float(state, "clipped", allow_inf=False) if "clipped" in state else 0.0
        counts = [state[k] for k in ("n_updates", "n_errors", "n_calibration")]
        if any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_COUNT
               for c in counts):
            raise ArtifactError(f"adaptive state counts {counts!r:.80} must be ints in "
                                f"[0, {MAX_COUNT}].")
        if counts[1] > counts[0] or self.clipped_ < 0:
            raise ArtifactError(f"adaptive state n_errors == {counts[1]} > n_updates == "
                                f"{counts[0]} or clipped == {self.clipped_!r} < 0.")
        self.n_updates_, self.n_errors_, self.n_calibration_ = counts
        self.history_ = {"threshold": [], "alpha_t": [], "err": [], "kept": [], "relevant": []}
        self._check_alpha_t()
        self._refresh()

    def _check_alpha_t(self) -> None:
        lo, hi = self._bounds()
        if not lo - 1e-12 <= self.alpha_t_ <= hi + 1e-12:
            raise ArtifactError(
                f"adaptive state alpha_t == {self.alpha_t_!r} is outside [{lo:.6g}, {hi:.6g}], "
                f"the range a bounded calibrator keeps it in for a pool of {len(self._pool)} "
                "scores (its threshold must be one of them); the state was edited or written "
                "without bounds.")


#: The earlier name of :class:`AdaptiveCalibrator`.
AdaptiveConformalFilter = AdaptiveCalibrator
