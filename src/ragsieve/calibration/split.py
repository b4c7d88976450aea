"""Marginal mode: split conformal calibration of the keep-threshold tau.

Given the nonconformity scores of the *relevant* snippets of a calibration set,
``SplitConformalCalibrator`` learns the threshold

    tau = the ceil((n + 1)(1 - alpha))-th smallest of the n calibration scores,

so that, when calibration and test relevant snippets are exchangeable, a new relevant
snippet is kept (score <= tau) with probability in ``[1 - alpha, 1 - alpha + 1/(n + 1))``
(the upper end needs continuous scores without ties).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .._validation import (
    check_alpha,
    check_codes,
    check_int,
    check_real,
    check_relevant,
    check_scores,
)
from ..errors import ArtifactError, CalibrationError
from .base import Guarantee, ThresholdCalibrator, _json_float
from .stats import conformal_rank, min_calibration_size, units_with_evidence

__all__ = ["SplitConformalCalibrator", "relevant_scores"]

logger = logging.getLogger(__name__)


def relevant_scores(scores: Any, relevant: Any, *, what: str = "calibration snippet") -> tuple[np.ndarray, np.ndarray]:
    """Validated scores and relevance mask; ``CalibrationError`` when nothing is relevant."""
    arr = check_scores(scores)
    rel = check_relevant(relevant, arr.size)
    if not rel.any():
        raise CalibrationError(
            f"no relevant {what}: got {arr.size} score(s) and none with relevant == 1; need at "
            "least one (and enough for a finite threshold). Check the calibration labels."
        )
    return arr, rel


def relevant_by_unit(scores: Any, relevant: Any, ids: Any, *, name: str, mode: str,
                     unit: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The relevant calibration scores, the unit (query, topic) of each and how many units
    have no relevant snippet: what a mode that weighs units equally calibrates on.

    Parameters
    ----------
    scores, relevant : array-like
        As :func:`relevant_scores` takes them.
    ids : array-like
        The unit of every snippet (``query_ids``, ``groups``), of the length of ``scores``.
    name : str
        How errors name ``ids`` (``"groups (topics)"``).
    mode, unit : str
        Named in errors and in the warning on units left out (``"topic"``, ``"topic"``).

    Returns
    -------
    (ndarray, ndarray, int)
        The relevant scores, their units renumbered 0..K-1 over the units that have one
        (:func:`~ragsieve.calibration.stats.units_with_evidence`), and the units left out.

    Raises
    ------
    ValueError, TypeError
        ``ids`` missing, not one id per score, or not hashable.
    CalibrationError
        No relevant snippet.
    """
    arr, rel = relevant_scores(scores, relevant)
    codes = check_codes(ids, arr.size, name, mode=mode)
    units, left_out = units_with_evidence(codes, rel, mode=mode, unit=unit)
    return arr[rel], units, left_out


class SplitConformalCalibrator(ThresholdCalibrator):
    """Split conformal threshold on the scores of relevant calibration snippets (marginal).

    ``fit`` sorts the n relevant scores and sets ``threshold_`` to the
    ``ceil((n + 1)(1 - alpha))``-th smallest. Where that rank exceeds n the
    threshold is ``+inf`` (keep every snippet), a warning is logged and
    ``infinite_`` is True. Under exchangeability of calibration and test relevant
    snippets, ``P(score <= threshold_) >= 1 - alpha``, and below
    ``1 - alpha + 1/(n + 1)`` when scores have no ties.

    Parameters
    ----------
    alpha : float, default=0.1
        Target miscoverage in (0, 1).

    Attributes
    ----------
    threshold_ : float
        Calibrated threshold tau.
    n_calibration_ : int
        Number n of relevant calibration scores.
    rank_ : int
        The rank ``ceil((n + 1)(1 - alpha))``.
    infinite_ : bool
        True when ``rank_ > n`` and the threshold is ``+inf``.
    scores_ : numpy.ndarray
        The sorted relevant calibration scores (kept in the artifact, so that a loaded
        threshold is recomputed and checked, and for drift monitoring).

    Examples
    --------
    >>> cal = SplitConformalCalibrator(alpha=0.2).fit([0.5, 0.1, 0.4, 0.3])
    >>> cal.rank_, cal.threshold_
    (4, 0.5)
    >>> cal.coverage_band()
    (0.8, 1.0)
    """

    mode = "marginal"

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> SplitConformalCalibrator:
        """Learn the threshold from the relevant scores (``relevant=None``: all are relevant).

        Raises
        ------
        ValueError
            Bad alpha, non-finite scores, or misaligned labels.
        CalibrationError
            No relevant calibration snippet (n == 0).
        """
        alpha = check_alpha(self.alpha)
        arr, rel = relevant_scores(scores, relevant)
        self._fit_sorted(np.sort(arr[rel]), alpha)
        return self

    def _fit_sorted(self, s: np.ndarray, alpha: float) -> None:
        n = int(s.size)
        rank = conformal_rank(n, alpha)
        self.rank_ = rank
        self.scores_ = s
        if rank > n:
            logger.warning(
                "calibration set too small for alpha=%g: rank ceil((n+1)(1-alpha)) = %d "
                "exceeds n = %d, so the threshold is +inf and every snippet is kept; "
                "need n >= %d relevant calibration snippets for a finite threshold.",
                alpha, rank, n, min_calibration_size(alpha),
            )
        self._set_fitted(math.inf if rank > n else float(s[rank - 1]), n)

    @classmethod
    def from_threshold(cls, *, alpha: float, threshold: float, n_calibration: int) -> SplitConformalCalibrator:
        """Rebuild a fitted calibrator from a v1 artifact's threshold (no scores stored)."""
        check_alpha(alpha)
        n_calibration = check_int(n_calibration, "n_calibration", min_value=1)
        threshold = check_real(threshold, "threshold", hint="inf keeps every snippet")
        self = cls(alpha=alpha)
        self.rank_ = conformal_rank(n_calibration, float(alpha))
        self._set_fitted(threshold, n_calibration)
        return self

    def coverage_band(self) -> tuple[float, float]:
        """Theoretical coverage band ``[1 - alpha, 1 - alpha + 1/(n + 1)]`` (capped at 1)."""
        self._check_fitted()
        alpha = float(self.alpha)
        if self.infinite_:
            return (1.0, 1.0)
        return (1.0 - alpha, min(1.0, 1.0 - alpha + 1.0 / (self.n_calibration_ + 1)))

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        return self._promise(
            "coverage", "{a_relevant} exchangeable with the calibration data is kept with "
            "probability >= {target}", unit=unit,
            n_required=min_calibration_size(float(self.alpha)),
            details={"coverage_band": list(self.coverage_band())})

    def _state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"threshold": _json_float(self.threshold_),
                               "n_calibration": self.n_calibration_}
        if hasattr(self, "scores_"):
            out["scores"] = [float(x) for x in self.scores_]
        return out

    def _set_state(self, state: dict[str, Any]) -> None:
        alpha = check_alpha(self.alpha)
        if "scores" not in state:  # thresholds only (v1 artifacts)
            super()._set_state(state)
            self.rank_ = conformal_rank(self.n_calibration_, alpha)
            return
        s = check_scores(state["scores"], name="calibration state scores")
        if s.size == 0 or np.any(np.diff(s) < 0):
            raise ArtifactError("calibration state scores must be a non-empty sorted list.")
        self._fit_sorted(s, alpha)
        _check_same(self, state)


def _check_same(cal: ThresholdCalibrator, state: dict[str, Any]) -> None:
    """Refuse a state whose stored threshold / n disagree with the recomputed ones."""
    from .base import _read_float

    stored = _read_float(state, "threshold")
    if stored != cal.threshold_ or state.get("n_calibration") != cal.n_calibration_:
        raise ArtifactError(
            f"{cal.mode} calibration state is inconsistent: stored threshold {stored!r} with "
            f"n_calibration {state.get('n_calibration')!r}, but its scores give "
            f"{cal.threshold_!r} with n {cal.n_calibration_}; the artifact was edited or corrupted."
        )
