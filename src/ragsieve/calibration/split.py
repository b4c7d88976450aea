"""Split conformal calibration of the keep-threshold tau.

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

from ..errors import CalibrationError, NotFittedError

__all__ = [
    "SplitConformalCalibrator",
    "check_alpha",
    "check_scores",
    "conformal_rank",
]

logger = logging.getLogger(__name__)


def check_alpha(alpha: Any) -> float:
    """Validate a miscoverage level.

    Parameters
    ----------
    alpha : float
        Target miscoverage; the filter keeps a relevant snippet with probability
        at least ``1 - alpha``.

    Returns
    -------
    float
        ``alpha`` as a float.

    Raises
    ------
    TypeError
        If ``alpha`` is not a real number.
    ValueError
        If ``alpha`` is not in the open interval (0, 1).

    Examples
    --------
    >>> check_alpha(0.1)
    0.1
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__} ({alpha!r}).")
    value = float(alpha)
    if not (0.0 < value < 1.0) or math.isnan(value):
        raise ValueError(f"alpha == {alpha!r}, must be in (0, 1).")
    return value


def check_scores(scores: Any, *, name: str = "scores") -> np.ndarray:
    """Convert to a 1-d float array and reject NaN or infinite values.

    Parameters
    ----------
    scores : array-like of float
        Nonconformity scores.
    name : str
        Name used in error messages.

    Returns
    -------
    numpy.ndarray
        1-d float64 array (possibly empty).

    Raises
    ------
    TypeError
        If the input cannot be converted to floats.
    ValueError
        If it is not 1-d or holds NaN / infinite values.
    """
    try:
        arr = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}.")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{name} contains {idx.size} non-finite value(s) (NaN or inf), first at index "
            f"{int(idx[0])} ({arr[idx[0]]!r}); every score must be a finite number."
        )
    return arr


def conformal_rank(n: int, alpha: float) -> int:
    """The 1-based rank ``ceil((n + 1)(1 - alpha))`` of the conformal quantile.

    A rank above ``n`` means the calibration set is too small for ``alpha``: the
    threshold is then ``+inf``. A tiny epsilon guards against floating-point error
    (e.g. ``(99 + 1) * 0.9`` evaluating to ``90.00000000000001``).

    Examples
    --------
    >>> conformal_rank(9, 0.1)
    9
    >>> conformal_rank(8, 0.1)
    9
    """
    return math.ceil((n + 1) * (1.0 - alpha) - 1e-9)


class SplitConformalCalibrator:
    """Split conformal threshold on the scores of relevant calibration snippets.

    ``fit`` sorts the n scores and sets ``threshold_`` to the
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

    Examples
    --------
    >>> cal = SplitConformalCalibrator(alpha=0.2).fit([0.5, 0.1, 0.4, 0.3])
    >>> cal.rank_, cal.threshold_
    (4, 0.5)
    >>> cal.coverage_band()
    (0.8, 1.0)
    """

    def __init__(self, *, alpha: float = 0.1) -> None:
        self.alpha = alpha

    def fit(self, scores: Any, relevant: Any | None = None) -> SplitConformalCalibrator:
        """Learn the threshold.

        Parameters
        ----------
        scores : array-like of float
            Nonconformity scores. If ``relevant`` is None, all are taken as the
            scores of relevant calibration snippets.
        relevant : array-like of {0, 1} or bool, optional
            Relevance labels aligned with ``scores``; only relevant ones are used.

        Returns
        -------
        SplitConformalCalibrator
            ``self``, fitted.

        Raises
        ------
        ValueError
            Bad alpha, non-finite scores, or misaligned labels.
        CalibrationError
            No relevant calibration snippet (n == 0).
        """
        alpha = check_alpha(self.alpha)
        arr = check_scores(scores)
        if relevant is not None:
            mask = _relevance_mask(relevant, len(arr))
            arr = arr[mask]
        n = int(arr.size)
        if n == 0:
            raise CalibrationError(
                "no relevant calibration snippet: got 0 scores, need at least 1 "
                "(and at least ceil(1/alpha) - 1 for a finite threshold). "
                "Check that the calibration data has relevant == 1 labels."
            )
        rank = conformal_rank(n, alpha)
        self.n_calibration_ = n
        self.rank_ = rank
        self.scores_ = np.sort(arr)  # kept for diagnostics (plots, budgets)
        if rank > n:
            self.threshold_ = math.inf
            self.infinite_ = True
            logger.warning(
                "calibration set too small for alpha=%g: rank ceil((n+1)(1-alpha)) = %d "
                "exceeds n = %d, so the threshold is +inf and every snippet is kept; "
                "need n >= %d relevant calibration snippets for a finite threshold.",
                alpha, rank, n, min_calibration_size(alpha),
            )
        else:
            self.threshold_ = float(self.scores_[rank - 1])
            self.infinite_ = False
        return self

    @classmethod
    def from_threshold(
        cls, *, alpha: float, threshold: float, n_calibration: int
    ) -> SplitConformalCalibrator:
        """Rebuild a fitted calibrator from saved state (used when loading artifacts).

        Parameters
        ----------
        alpha : float
            Miscoverage the threshold was calibrated for.
        threshold : float
            The calibrated threshold (``inf`` allowed).
        n_calibration : int
            Number of relevant calibration scores it was computed from.

        Returns
        -------
        SplitConformalCalibrator
            A fitted calibrator (without the calibration scores).
        """
        check_alpha(alpha)
        if not isinstance(n_calibration, int) or n_calibration < 1:
            raise ValueError(f"n_calibration == {n_calibration!r}, must be an int >= 1.")
        threshold = float(threshold)
        if math.isnan(threshold):
            raise ValueError("threshold is NaN, must be a number or inf.")
        self = cls(alpha=alpha)
        self.n_calibration_ = n_calibration
        self.rank_ = conformal_rank(n_calibration, float(alpha))
        self.threshold_ = threshold
        self.infinite_ = math.isinf(threshold)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "threshold_"):
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet; call fit(scores) first."
            )

    def predict(self, scores: Any) -> np.ndarray:
        """Boolean keep-mask ``scores <= threshold_``.

        Parameters
        ----------
        scores : array-like of float
            Scores of the snippets to filter (must be finite).

        Returns
        -------
        numpy.ndarray of bool
        """
        self._check_fitted()
        arr = check_scores(scores)
        return arr <= self.threshold_

    def coverage_band(self) -> tuple[float, float]:
        """Theoretical coverage band ``[1 - alpha, 1 - alpha + 1/(n + 1)]``.

        The upper end is capped at 1; with an infinite threshold coverage is 1.
        """
        self._check_fitted()
        alpha = float(self.alpha)
        if self.infinite_:
            return (1.0, 1.0)
        return (1.0 - alpha, min(1.0, 1.0 - alpha + 1.0 / (self.n_calibration_ + 1)))

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters (scikit-learn convention)."""
        return {"alpha": self.alpha}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha!r})"


def min_calibration_size(alpha: float) -> int:
    """Smallest n with a finite threshold: ``ceil((n+1)(1-alpha)) <= n``.

    Examples
    --------
    >>> min_calibration_size(0.1)
    9
    >>> min_calibration_size(0.05)
    19
    """
    alpha = check_alpha(alpha)
    n = max(1, math.ceil(1.0 / alpha) - 1)
    while conformal_rank(n, alpha) > n:
        n += 1
    return n


def _relevance_mask(relevant: Any, n: int) -> np.ndarray:
    rel = np.asarray(relevant)
    if rel.shape != (n,):
        raise ValueError(f"relevant has shape {rel.shape}, expected ({n},) to match scores.")
    if rel.dtype == bool:
        return rel
    values = set(np.unique(rel).tolist())
    if not values <= {0, 1}:
        raise ValueError(f"relevant must hold only 0/1 or booleans, got values {sorted(values)!r}.")
    return rel.astype(bool)


__all__.append("min_calibration_size")
