"""The statistics the calibrators share: conformal ranks, binomial tails, pooled CDFs.

Binomial and Beta tails come from :mod:`scipy.stats` (they replaced hand-written
log-space sums and a bisection; ``tests/test_calibration.py`` checks that they agree
with the exact definitions).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from .._validation import MAX_COUNT, check_alpha
from ..errors import ArtifactError

logger = logging.getLogger(__name__)

__all__ = [
    "binomial_sf",
    "clopper_pearson_lower",
    "conformal_rank",
    "left_out_details",
    "left_out_of",
    "min_calibration_size",
    "pooled_cdf",
    "units_with_evidence",
]


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


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) >= k)`` (``scipy.stats.binom.sf(k - 1, n, p)``).

    Examples
    --------
    >>> round(binomial_sf(2, 3, 0.5), 6)
    0.5
    """
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    from scipy import stats  # imported here: scipy.stats is slow to import

    return float(stats.binom.sf(k - 1, n, p))


def clopper_pearson_lower(k: int, n: int, delta: float) -> float:
    """One-sided Clopper-Pearson lower bound at level ``1 - delta`` for a proportion.

    The ``delta`` quantile of ``Beta(k, n - k + 1)`` (``scipy.stats.beta.ppf``), i.e. the
    ``p`` with ``P(Binomial(n, p) >= k) == delta``; 0 when ``k == 0``.

    Examples
    --------
    >>> round(clopper_pearson_lower(10, 10, 0.05), 4)  # 0.05 ** (1 / 10)
    0.7411
    >>> clopper_pearson_lower(0, 10, 0.05)
    0.0
    """
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k == {k}, n == {n}.")
    if k == 0:
        return 0.0
    from scipy import stats

    return float(stats.beta.ppf(delta, k, n - k + 1))


def pooled_cdf(scores: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
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


_SAID: set[tuple[str, int, int]] = set()


def units_with_evidence(codes: np.ndarray, rel: np.ndarray, *, mode: str,
                        unit: str) -> tuple[np.ndarray, int]:
    """The unit (query, topic) of every relevant snippet, renumbered 0..K-1 over the units
    that have one, and how many units have none.

    A unit without a relevant snippet has no miss rate (0/0): it is left out of the
    calibration, with a logged warning naming how many (once per mode and counts in a
    process: a sweep refits the same case many times); the caller reports the count in
    its guarantee.

    Parameters
    ----------
    codes : ndarray of int
        The unit of every calibration snippet (relevant or not).
    rel : ndarray of bool
        Which snippets are relevant.
    mode, unit : str
        Named in the warning (``"topic-pac"``, ``"topic"``).

    Returns
    -------
    (ndarray, int)
        Codes of the relevant snippets, and the number of units left out.
    """
    kept, inverse = np.unique(codes[rel], return_inverse=True)
    left_out = int(np.unique(codes).size - kept.size)
    said = (mode, left_out, int(kept.size))
    if left_out and said not in _SAID:  # once per case: a sweep fits the same case often
        _SAID.add(said)
        logger.warning(
            "%s: %d of %d calibration %s have no relevant snippet and are left out (no miss "
            "rate without evidence); the guarantee rests on the other %d.", mode, left_out,
            kept.size + left_out, _plural(unit), kept.size)
    return inverse.astype(np.int64).reshape(-1), left_out


def _plural(unit: str) -> str:
    return unit[:-1] + "ies" if unit.endswith("y") else unit + "s"


def left_out_details(n_left_out: int, unit: str) -> dict[str, Any]:
    """Guarantee details for ``n_left_out`` units without evidence: their count under
    ``n_<units>_left_out`` (``n_topics_left_out``, ``n_queries_left_out``) and, when
    there are any, a ``note`` saying so."""
    details: dict[str, Any] = {f"n_{_plural(unit)}_left_out": int(n_left_out)}
    if n_left_out:
        plural = unit if n_left_out == 1 else _plural(unit)
        details["note"] = (f"{n_left_out} calibration {plural} without a relevant snippet "
                           "left out (no miss rate)")
    return details


def left_out_of(state: dict[str, Any], unit: str, mode: str) -> int:
    """The ``n_<units>_left_out`` count of a saved state (0 when absent).

    Raises
    ------
    ArtifactError
        The count is not an int >= 0.
    """
    key = f"n_{_plural(unit)}_left_out"
    value = state.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ArtifactError(f"{mode} state {key} == {value!r:.30}, expected an int in "
                            f"[0, {MAX_COUNT}].")
    return value
