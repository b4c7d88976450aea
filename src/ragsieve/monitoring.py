"""Is live traffic still exchangeable with the calibration data?

* :func:`drift_check` -- a two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``)
  of calibration against live relevant scores; a small p-value says the static
  threshold's guarantee no longer applies (recalibrate, or use the ``adaptive`` mode).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._validation import check_alpha, check_scores

__all__ = ["DriftResult", "drift_check"]


class DriftResult(NamedTuple):
    """Outcome of :func:`drift_check`.

    Attributes
    ----------
    statistic : float
        KS statistic ``D = sup |F_cal - F_live|``.
    p_value : float
        Two-sided p-value of "same distribution".
    drifted : bool
        ``p_value < alpha``.
    n_cal, n_live : int
        Sample sizes.
    """

    statistic: float
    p_value: float
    drifted: bool
    n_cal: int
    n_live: int


def drift_check(calibration_scores: Any, live_scores: Any, *, alpha: float = 0.01) -> DriftResult:
    """Test whether live relevant scores are still exchangeable with the calibration ones.

    Parameters
    ----------
    calibration_scores : array-like of float
        Scores of relevant calibration snippets (at least 1).
    live_scores : array-like of float
        Scores of relevant live snippets (at least 1).
    alpha : float, default=0.01
        False-alarm level in (0, 1): ``drifted = p_value < alpha``.

    Returns
    -------
    DriftResult

    Examples
    --------
    >>> r = drift_check([0.1, 0.2, 0.3, 0.4] * 10, [0.6, 0.7, 0.8, 0.9] * 10)
    >>> r.statistic, r.drifted
    (1.0, True)
    """
    alpha = check_alpha(alpha)
    cal = check_scores(calibration_scores, name="calibration_scores")
    live = check_scores(live_scores, name="live_scores")
    if cal.size == 0 or live.size == 0:
        raise ValueError(
            f"drift_check needs at least 1 score on each side, got n_cal={cal.size}, n_live={live.size}."
        )
    from scipy import stats  # imported here: scipy.stats is slow to import

    res = stats.ks_2samp(cal, live)
    p = float(res.pvalue)
    return DriftResult(statistic=float(res.statistic), p_value=p, drifted=bool(p < alpha),
                       n_cal=int(cal.size), n_live=int(live.size))
