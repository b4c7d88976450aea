"""Upper confidence bounds on the mean of losses in [0, 1], for risk control with confidence.

Both are valid at level ``1 - delta`` for i.i.d. losses in [0, 1] and are the two bounds
recommended for risk-controlling prediction sets (Bates, Angelopoulos, Lei, Malik & Jordan,
*Distribution-free, risk-controlling prediction sets*, JACM 2021):

* :func:`hb_upper` -- Hoeffding-Bentkus: the smaller of the Hoeffding (Chernoff, KL form)
  and the Bentkus (``e`` times a binomial tail) bounds; depends on the sample mean only.
* :func:`wsr_upper` -- Waudby-Smith & Ramdas' betting bound (hedged capital with the
  predictable plug-in bets of Bates et al., Prop. 5); adapts to the variance, so it is
  tighter when the losses are small and concentrated; it reads the observations in order
  and is valid for i.i.d. observations in random order (shuffle data that may be sorted).

:func:`upper_bound` picks one by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BOUNDS", "certifies", "hb_upper", "upper_bound", "wsr_upper"]

BOUNDS = ("hb", "wsr")


def _check(losses: Any, delta: float) -> np.ndarray:
    x = np.asarray(losses, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"losses must be a non-empty 1-d array, got shape {x.shape}.")
    if np.any(~np.isfinite(x)) or x.min() < 0 or x.max() > 1:
        raise ValueError("losses must be finite and in [0, 1].")
    if not 0 < delta < 1:
        raise ValueError(f"delta == {delta!r}, must be in (0, 1).")
    return x


def _kl(a: float, b: float) -> float:
    """Bernoulli KL divergence ``h1(a, b)`` (a <= b)."""
    out = 0.0
    if a > 0:
        out += a * math.log(a / b)
    if a < 1:
        out += (1 - a) * math.log((1 - a) / (1 - b))
    return out


def hb_upper(losses: Any, delta: float) -> float:
    """Hoeffding-Bentkus upper confidence bound on the mean loss.

    The largest ``R`` with ``min(exp(-n h1(mean, R)), e * P(Binomial(n, R) <= ceil(n mean)))
    >= delta`` (Bates et al. 2021, Prop. 3), found by bisection; 1 when no ``R < 1`` passes.

    Examples
    --------
    >>> round(hb_upper([0.0] * 22, 0.1), 4)  # 1 - 0.1 ** (1 / 22)
    0.0994
    """
    x = _check(losses, delta)
    mean = float(x.mean())

    def p_value(r: float) -> float:
        return _hb_pvalue(x, r)

    lo, hi = mean, 1.0 - 1e-12
    if p_value(hi) >= delta:
        return 1.0
    for _ in range(100):  # p_value decreases in r on [mean, 1)
        mid = 0.5 * (lo + hi)
        if p_value(mid) >= delta:
            lo = mid
        else:
            hi = mid
    return hi


def _hb_pvalue(x: np.ndarray, r: float) -> float:
    """Hoeffding-Bentkus p-value of "mean loss >= r" (decreasing in r above the mean)."""
    from scipy import stats

    n, mean = x.size, float(x.mean())
    hoeffding = math.exp(-n * _kl(min(mean, r), r))
    bentkus = math.e * float(stats.binom.cdf(math.ceil(n * mean - 1e-12), n, r))
    return min(hoeffding, bentkus)


def _wsr_rejects(x: np.ndarray, delta: float, r: float) -> bool:
    """Does the betting capital against "mean loss >= r" exceed 1/delta at some step?"""
    n = x.size
    i = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(x)) / (i + 1)
    s2 = (0.25 + np.cumsum((x - mu) ** 2)) / (i + 1)
    s2_prev = np.r_[0.25, s2[:-1]]
    nu = np.minimum(1.0, np.sqrt(2 * math.log(1 / delta) / (n * s2_prev)))
    factors = 1.0 - nu * (x - r)
    if np.any(factors <= 0):
        return False  # capital wiped out: no evidence against this r
    return bool(np.max(np.cumsum(np.log(factors))) > math.log(1 / delta))


def certifies(losses: Any, alpha: float, delta: float, *, bound: str = "wsr") -> bool:
    """True when the ``1 - delta`` upper bound on the mean loss is at most ``alpha``.

    One test at ``alpha`` instead of the bound itself (both bounds are monotone in R), so
    a scan over many thresholds stays cheap.
    """
    x = _check(losses, delta)
    if bound == "hb":
        return float(x.mean()) <= alpha and _hb_pvalue(x, alpha) < delta
    if bound == "wsr":
        return _wsr_rejects(x, delta, alpha)
    raise ValueError(f"bound == {bound!r}, must be one of {BOUNDS}.")


def wsr_upper(losses: Any, delta: float) -> float:
    """Waudby-Smith-Ramdas betting upper confidence bound on the mean loss.

    With ``mu_i = (1/2 + sum_{j<=i} L_j) / (i + 1)``, ``s2_i = (1/4 + sum_{j<=i}
    (L_j - mu_j)^2) / (i + 1)`` and bets ``nu_i = min(1, sqrt(2 log(1/delta) / (n s2_{i-1})))``,
    the capital ``K_i(R) = prod_{j<=i} (1 - nu_j (L_j - R))`` grows when the mean is below R;
    the bound is ``inf{R >= 0 : max_i K_i(R) > 1/delta}`` (Bates et al. 2021, Prop. 5).

    Examples
    --------
    >>> x = [0.02, 0.05, 0.0, 0.04, 0.01, 0.03] * 10  # small, concentrated losses
    >>> wsr_upper(x, 0.1) < hb_upper(x, 0.1)
    True
    """
    x = _check(losses, delta)

    def rejected(r: float) -> bool:
        return _wsr_rejects(x, delta, r)

    if not rejected(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    if rejected(lo):
        return 0.0
    for _ in range(60):  # the capital increases in R
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            hi = mid
        else:
            lo = mid
    return hi


def upper_bound(losses: Any, delta: float, *, bound: str = "wsr") -> float:
    """The ``1 - delta`` upper confidence bound named ``bound`` (``"hb"`` or ``"wsr"``)."""
    if bound == "hb":
        return hb_upper(losses, delta)
    if bound == "wsr":
        return wsr_upper(losses, delta)
    raise ValueError(f"bound == {bound!r}, must be one of {BOUNDS}.")
