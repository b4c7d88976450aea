"""Conformal test martingales: the betting machinery the two watches share.

:mod:`ragsieve.monitoring` (the service's exchangeability monitor, state in SQLite shared
by worker processes) and :mod:`ragsieve.lists` (the check of the deployment lists' shape
against the calibration lists', in memory) both turn a stream of per-request statistics
into smoothed conformal p-values and bet on them with the same test martingale: power
bets ``f_eps(p) = eps * p**(eps - 1)`` on small p (the statistic larger than at
calibration) and on small ``1 - p`` (smaller), ``eps`` in :data:`EPSILONS`, each started
at every step ``s`` with the heavy-tailed prior weight ``pi_s`` (:func:`log_prior`) and
mixed. A mixture of test martingales with fixed weights is a test martingale, so by
Ville's inequality it ever reaches ``1/delta`` on exchangeable data with probability at
most ``delta``. The derivation is in :mod:`ragsieve.monitoring`.

:class:`OnlineConformalTest` is the in-memory form for one statistic: its p-values rank
each new value against the reference *and every earlier value* (ties spread by a uniform
``theta``), which makes them independent and uniform under exchangeability.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["EPSILONS", "OnlineConformalTest", "log_prior", "log_unstarted", "logsumexp",
           "power_bet"]

#: Betting exponents of the power martingales.
EPSILONS = tuple(round(0.05 + 0.1 * i, 2) for i in range(10))
_LN2 = math.log(2.0)


def log_prior(s: int) -> float:
    """log pi_s: prior weight of the martingale that starts betting after step ``s``.

    ``pi_0 = 1/2``, ``pi_s = (g(s) - g(s + 1)) / 2`` with ``g(s) = ln 2 / ln(s + 1)``; the
    weights sum to 1.
    """
    if s == 0:
        return -_LN2
    a, b = math.log(s + 1.0), math.log(s + 2.0)
    return math.log(0.5 * _LN2 * math.log1p(1.0 / (s + 1.0)) / (a * b))


def log_unstarted(t: int) -> float:
    """log R_t: prior mass of the martingales not started after ``t`` steps."""
    return 0.0 if t == 0 else math.log(0.5 * _LN2 / math.log(t + 1.0))


def logsumexp(values: np.ndarray) -> float:
    """``log(sum(exp(values)))``, stable (``-inf`` for all ``-inf``)."""
    top = float(np.max(values))
    if top == -math.inf:
        return top
    return top + math.log(float(np.sum(np.exp(values - top))))


def power_bet(log_a: np.ndarray, t: int, p: float, side: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """One step of the mixed power martingales: start the one of prior weight
    ``pi_{t-1}``, then every one bets on ``p`` (``side > 0``) or on ``1 - p`` (``side < 0``).

    Parameters
    ----------
    log_a : numpy.ndarray
        log capital of each (side, eps) bettor before the step (``-inf``: nothing yet).
    t : int
        The step's number (1 for the first observation).
    p : float
        The step's p-value, in (0, 1].
    side, eps : numpy.ndarray
        The side and exponent of each bettor.
    """
    q = np.where(side > 0, p, 1.0 - p)
    log_f = np.log(eps) + (eps - 1.0) * np.log(q)
    return np.logaddexp(log_a, log_prior(t - 1)) + log_f


class OnlineConformalTest:
    """A two-sided conformal test martingale over one statistic's stream, in memory.

    Parameters
    ----------
    reference : array-like of float
        The statistic on the calibration units (at least one value).
    seed : int
        Seed of the tie-breaking ``theta`` of the p-values.
    decimals : int
        Values are compared after rounding to this many decimals (equal rounded values
        are ties, which ``theta`` breaks), so the live counts stay a bounded table.

    Examples
    --------
    >>> test = OnlineConformalTest([4.0] * 50 + [5.0] * 50)
    >>> [round(test.observe(10.0), 1) for _ in range(3)][-1] > 2.0  # log M grows fast
    True
    """

    def __init__(self, reference: object, *, seed: int = 0, decimals: int = 3) -> None:
        ref = np.sort(np.round(np.asarray(reference, dtype=np.float64).ravel(), decimals))
        if ref.size == 0 or not np.all(np.isfinite(ref)):
            raise ValueError(f"reference holds {ref.size} values, expected at least one, all "
                             "finite.")
        self.reference = ref
        self.decimals = decimals
        self._live: Counter[float] = Counter()
        self._rng = np.random.default_rng(seed)
        self._side = np.repeat(np.array([1.0, -1.0]), len(EPSILONS))
        self._eps = np.tile(np.array(EPSILONS), 2)
        self._log_w = -math.log(self._eps.size)
        self._log_a = np.full(self._eps.size, -math.inf)
        #: Values observed so far.
        self.t = 0

    def to_state(self) -> dict[str, Any]:
        """What the test has seen, as plain JSON (the reference is not included: it is the
        calibration's, rebuilt from the artifact)."""
        return {"t": self.t, "live": [[k, n] for k, n in sorted(self._live.items())],
                "rng": self._rng.bit_generator.state,
                "log_a": [None if not math.isfinite(v) else float(v) for v in self._log_a]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`to_state`'s output.

        Raises
        ------
        ValueError, TypeError, KeyError
            A state of another shape (e.g. an edited file).
        """
        t, live, log_a = state["t"], state["live"], state["log_a"]
        if not isinstance(t, int) or not isinstance(live, list) or not isinstance(log_a, list) \
                or len(log_a) != self._log_a.size:
            raise ValueError(f"a test state needs an int t, a live list and {self._log_a.size} "
                             "log capitals.")
        counts: Counter[float] = Counter()
        for key, n in live:
            counts[float(key)] = int(n)
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self._live, self._rng, self.t = counts, rng, t
        self._log_a = np.array([-math.inf if v is None else float(v) for v in log_a])

    def p_value(self, value: float) -> float:
        """The smoothed p-value of ``value`` against the reference and the live values,
        counting it in (call once per observation: :meth:`observe` does)."""
        key = round(float(value), self.decimals)
        gt = self.reference.size - int(np.searchsorted(self.reference, key, "right"))
        eq = int(np.searchsorted(self.reference, key, "right")
                 - np.searchsorted(self.reference, key, "left"))
        gt += sum(n for v, n in self._live.items() if v > key)
        eq += self._live.get(key, 0) + 1  # itself among the ties
        self._live[key] += 1
        self.t += 1
        theta = float(self._rng.uniform(0.0, 1.0))
        return max((gt + theta * eq) / (self.reference.size + self.t), 1e-300)

    def observe(self, value: float) -> float:
        """Take one value; the log of the mixed martingale after it (0 at the start)."""
        p = self.p_value(value)
        self._log_a = power_bet(self._log_a, self.t, p, self._side, self._eps)
        return float(np.logaddexp(logsumexp(self._log_a) + self._log_w, log_unstarted(self.t)))
