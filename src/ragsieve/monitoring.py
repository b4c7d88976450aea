"""Is live traffic still exchangeable with the calibration data?

* :class:`ExchangeabilityMonitor` -- watches every served request and raises an alarm
  (latched, logged once) when one of its conformal test martingales (one per statistic,
  ``K`` of them) reaches ``K/delta``. By Ville's inequality and a union bound it ever fires
  on exchangeable traffic with probability at most ``delta``, however long it runs.
* :func:`drift_check` -- a two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``)
  of calibration against live relevant scores; a small p-value says the static
  threshold's guarantee no longer applies (recalibrate, or use the ``adaptive`` mode).

The exchangeability monitor
---------------------------
**Unit: the request.** The snippets of one query are correlated (one query, one article),
so p-values of single snippets are not independent even on perfectly exchangeable query
traffic, and a martingale over them would fire on traffic that is fine. The monitor
therefore takes one number per request, and the artifact holds the same number for each
calibration query (computed from the scores of *all* its snippets, relevant or not, since
served traffic is unlabelled).

**Statistics: the separation and the best score.** The separation,
``mean(best m scores) - best score`` with ``m = min(n, 5)``:
how far the best snippet of a request stands out from the next ones. Served traffic
that the calibration no longer describes shows first as a score that stops separating:
on snippets from unrelated documents nothing stands out, and an English model reading
another language tells snippets apart less well (docs/monitoring.md has the shifts tried
and how soon each was detected). Scores can move either way, hence the two-sided
default. Reading only the best five scores makes it the
same for any list that holds the same five best snippets: a retriever's top-k for any
``k >= 5``, or a longer list with worse snippets appended.

*Assumption*: served lists are built like the calibration lists, with at least
``min(5, calibration list length)`` snippets. A list shorter than the calibration ones
(say top-3 against articles of 10 snippets) separates less by construction and will be
flagged (that traffic is indeed not exchangeable with the calibration queries). A request
with fewer than 2 scores carries no separation: the separation's martingale skips it
(skipping by a fixed rule on the request itself keeps that statistic's stream
exchangeable; its reference skips such calibration queries too).

Short lists (1 to 6 snippets, as retrieved for CLAPNQ-like data) are where the separation
is weakest: with one or two neighbours it moves little, a request of one snippet has none,
and a list of the retriever's best few stands out little from junk of the same kind. The
second statistic is therefore the request's **best score** itself (lowest score, every
request with at least one score): off-topic or unrelated text raises it on every list,
however short. The empty-result indicator (the threshold filter kept nothing) is
``best > tau``, a fixed monotone function of the best score, so the best score's ranks
carry it at full resolution and need no threshold on either side; the kept count is not
watched; together the two fire on short lists sooner than the separation alone
(docs/monitoring.md). *Blind spot*: a shift that moves every score by a
small amount leaves the separation unchanged and the best score's ranks nearly so.

**Combination: a union bound.** The monitor runs one conformal test martingale ``M^i``
per statistic, each on its own statistic's p-values (below), and reports
``M_t = max_i M^i_t / K``; the alarm fires at ``M_t >= 1/delta``, i.e. some
``M^i_t >= K/delta``. Each ``M^i`` is a test martingale on exchangeable traffic (its
statistic is a fixed function of one request, computed the same way on calibration
queries, so its values are exchangeable), hence ``P(sup_t M^i_t >= K/delta) <= delta/K``
and ``P(alarm) <= K * delta/K = delta``. The union bound needs no independence between the
statistics (the separation and the best score of one request are dependent); the price
is ``log K`` more evidence before the alarm. ``M_t`` starts at ``1/K``. An artifact whose
monitor block holds the separation alone (``"best"`` absent) gets ``K = 1``, the monitor
as it was.

**p-values: online, smoothed.** For each statistic, request ``t``'s value ``a_t`` (``t``
counts the requests that statistic observed) is ranked against its reference *and every
earlier live request* (Vovk, Gammerman and Shafer, *Algorithmic Learning in a Random
World*, ch. 7)::

    p_t = (#{j : a_j > a_t} + theta_t * #{j : a_j = a_t}) / (n_ref + t)

over the ``n_ref + t`` values so far (``a_t`` itself included in the ties), with
``theta_t`` uniform in (0, 1) (a hash of ``seed``, the reset epoch, ``t`` and the
statistic, so a replay reproduces it). Under exchangeability these p-values are
independent and uniform, ties included (the best score of lists on a coarse grid takes a
handful of values; ``theta`` spreads each tie over its share of (0, 1)), which
is what makes the martingale below a true test martingale; ranking against the fixed
reference alone would make them dependent (they share the reference) and void the bound.
The reference is a seeded random subsample of at most 20,000 calibration queries (a random
subsample of exchangeable data stays exchangeable with new requests). Statistics are
compared at a relative precision of 2**-10 (a fixed monotone rounding of the float: equal
rounded values are ties, which ``theta`` breaks exactly), so the live counts fit a bounded
table however long the service runs.

**Martingale (one per statistic): power bets mixed over epsilon and over the start.** With
betting functions
``f_eps(p) = eps * p**(eps - 1)`` (evidence from small p: the statistic larger than
at calibration) and ``f_eps(1 - p)`` (smaller), ``eps`` in {0.05, 0.15, ..., 0.95},
the monitor runs a test martingale that starts betting at step ``s`` for every ``s`` and
mixes them with prior weights ``pi_0 = 1/2``, ``pi_s = (g(s) - g(s + 1)) / 2`` where
``g(s) = ln 2 / ln(s + 1)``::

    M_t = sum_eps w_eps * A_eps(t) + R_t,   A_eps(t) = (A_eps(t-1) + pi_{t-1}) * f_eps(p_t),

with ``R_t`` the prior mass not started yet. A mixture of test martingales with fixed
weights is a test martingale (``M_0 = 1``), so ``P(sup_t M_t >= 1/delta) <= delta``. The
heavy-tailed prior over the start keeps detection fast after long stable periods: the
extra evidence needed for a shift at request ``tau``, ``log(1/pi_tau)``, grows only like
``log tau + 2 log log tau``, whereas a jumper with a fixed jump rate (Vovk's Simple
Jumper) keeps losing capital at a steady rate while traffic is stable and a plain mixture
started at 0 loses it all. ``alternative="less"`` or ``"greater"`` keeps one side of the bets
(a shift that makes the separation smaller, say); two-sided is the default. The
state is kept in log space; the alarm latches at the first ``M_t >= 1/delta`` with at
least ``min_requests`` requests observed (by any statistic) since the last reset (default 10: fewer requests
cannot latch it, whoever sends them) until :meth:`~ExchangeabilityMonitor.reset`, while
``M_t`` keeps moving. The service resets it with an authenticated ``POST
/admin/monitor/reset``.

**Store.** ``store=None`` keeps the state in memory; a path keeps it in an SQLite file
(WAL, one ``BEGIN IMMEDIATE`` transaction per request, queued on an ``flock`` of a
``.lock`` file beside it so that waiting workers take turns instead of SQLite's sleeping
retries), so the worker processes of one server update *one* sequential martingale over
their merged stream: the live statistics
(a table of counts per rounded value per statistic, indexed for the rank counts), the
martingale row (every statistic's state) and a log of the last 100,000 requests in the
order they were processed. The store's fingerprint covers the statistic set and every
reference, so workers agree on them; a store of another set is started afresh.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: SQLite's own busy wait alone
    fcntl = None  # type: ignore[assignment]

from ._closing import Closing
from ._martingale import EPSILONS, log_unstarted, logsumexp, power_bet
from ._monitor_reference import (
    STATISTIC,
    STATISTIC_VERSION,
    TOP_K,
    best_score,
    read_monitor_block,
    reference_block,
    separation,
)
from ._sqlite import connect_shared
from ._validation import check_alpha, check_instance, check_int, check_path, check_scores
from .artifact import Artifact

__all__ = [
    "ALTERNATIVES", "BatchAlarm", "DriftResult", "ExchangeabilityMonitor", "MonitorState",
    "alarm_message", "drift_check", "reference_block", "separation", "watch_batch",
]

logger = logging.getLogger(__name__)

#: Accepted ``alternative`` values: the direction in which the separation may move.
ALTERNATIVES = ("two-sided", "less", "greater")
#: Mantissa bits kept when statistics are compared (relative precision 2**-10).
KEY_BITS = 10
#: Fewest requests observed (since the last reset) before the alarm may fire.
DEFAULT_MIN_REQUESTS = 10
#: Requests kept in the store's ordered log.
HISTORY = 100_000
_SCHEMA = 2
#: The live-count table of each statistic in the store.
_LIVE = {"separation": "monitor_live", "best": "monitor_live_best"}
_MAX_LOG10 = math.log10(np.finfo(np.float64).max)

_TABLES = {
    "monitor_state": (
        ("CREATE TABLE IF NOT EXISTS monitor_state (id INTEGER PRIMARY KEY CHECK (id = 1), "
         "fingerprint TEXT NOT NULL, epoch INTEGER NOT NULL, n_observed INTEGER NOT NULL, "
         "log_a TEXT NOT NULL, log_m REAL NOT NULL, fired_at INTEGER, fired_time TEXT)"),
        ["id", "fingerprint", "epoch", "n_observed", "log_a", "log_m", "fired_at", "fired_time"]),
    **{table: (f"CREATE TABLE IF NOT EXISTS {table} (key INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
               ["key", "n"]) for table in _LIVE.values()},
    "monitor_log": (
        ("CREATE TABLE IF NOT EXISTS monitor_log (seq INTEGER PRIMARY KEY, statistic REAL, "
         "p_value REAL, log10_martingale REAL NOT NULL, detail TEXT NOT NULL)"),
        ["seq", "statistic", "p_value", "log10_martingale", "detail"]),
}
#: Columns of an earlier store's log (a log, nothing to keep: replaced on open).
_OLD_LOG = ["seq", "statistic", "p_value", "log10_martingale"]


@dataclass(frozen=True)
class MonitorState:
    """The exchangeability monitor's state after a request.

    Attributes
    ----------
    martingale : float
        Current value ``max_i M^i / K`` of the statistics' conformal test martingales
        (``>= 0``; ``1/K`` at the start, 1 for the separation alone; capped
        at the largest float).
    log10_martingale : float
        Its base-10 logarithm (never capped).
    alarm : bool
        True once the martingale reached ``1/delta``; stays True until ``reset``.
    n_observed : int
        Requests observed since the (re)start or reset.
    fired_at : int or None
        Request number at which the alarm fired.
    fired_time : str or None
        ISO-8601 UTC time at which it fired.
    delta : float
        False-alarm bound: ``P(ever fires | exchangeable traffic) <= delta``.
    """

    martingale: float
    log10_martingale: float
    alarm: bool
    n_observed: int
    fired_at: int | None
    fired_time: str | None
    delta: float

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def alarm_message(state: MonitorState, statistic: str, *, where: str = "request %d",
                  what: str = "served requests",
                  advice: str = "check the traffic and recalibrate") -> str:
    """The exchangeability alarm in words, with its numbers: the one wording of the event.

    Parameters
    ----------
    state : MonitorState
        The state after the request that fired (``martingale``, ``fired_at``, ``delta``).
    statistic : str
        The statistic whose martingale fired (``"separation"``, ``"best"``).
    where : str
        Where it fired, with ``%d`` for ``fired_at`` (``"query %d of 40 (q7)"``).
    what, advice : str
        What stopped looking exchangeable, and what to do.
    """
    at = where % state.fired_at if "%d" in where else where
    return (f"exchangeability alarm: the conformal test martingale reached "
            f"{state.martingale:.3g} >= 1/delta = {1.0 / state.delta:.3g} at {at}; {what} no "
            f"longer look exchangeable with the calibration data (the {statistic} statistic "
            f"moved; false-alarm probability <= {state.delta:g}), so the filter's guarantee may "
            f"not hold for them: {advice}.")


@dataclass(frozen=True)
class BatchAlarm:
    """Where the exchangeability monitor fired over a batch of queries (:func:`watch_batch`).

    Attributes
    ----------
    fired_at : int
        Position (from 1) of the query that made it fire.
    query_id : str
        That query's id.
    n_queries : int
        Queries observed (the batch's queries with two scores or more).
    martingale : float
        The martingale when it fired (``max_i M^i / K``).
    threshold : float
        ``1/delta``: the alarm fires when the martingale reaches it.
    statistic : str
        The statistic whose martingale fired.
    delta : float
        False-alarm bound: on exchangeable queries it fires with probability at most delta.
    message : str
        The alarm in words (:func:`alarm_message`), with what to do.
    """

    fired_at: int
    query_id: str
    n_queries: int
    martingale: float
    threshold: float
    statistic: str
    delta: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def watch_batch(monitor: ExchangeabilityMonitor,
                batch: Iterable[tuple[str, Any]]) -> BatchAlarm | None:
    """Run the service's exchangeability monitor over a batch of queries, in order.

    Each query is one request: its scores (every snippet's, kept or not; each sentence's
    for a sentence filter, ``FilterResult.unit_scores``) are observed as ``serve`` observes
    a request's, so a batch says what the service would have said of the same traffic.

    Parameters
    ----------
    monitor : ExchangeabilityMonitor
        A fresh monitor (e.g. ``ExchangeabilityMonitor.from_artifact(artifact,
        log_alarm=False)``); this function says the alarm, the monitor need not log it.
    batch : iterable of (str, array-like of float)
        ``(query_id, scores)`` in the order the queries were given.

    Returns
    -------
    BatchAlarm or None
        Where it fired; None when the queries look exchangeable with the calibration data.
    """
    n, alarm = 0, None
    for query_id, scores in batch:
        before = monitor.state.n_observed
        state = monitor.observe(np.asarray(scores, dtype=np.float64))
        if state.n_observed == before:
            continue  # fewer than two scores: not observed
        n += 1
        if alarm is None and state.alarm and state.fired_at == state.n_observed:
            stat = monitor.fired_statistic or "separation"
            alarm = (n, str(query_id), state, stat)
    if alarm is None:
        return None
    at, query_id, state, stat = alarm
    message = alarm_message(
        state, stat, where=f"query {at} of {n} ({query_id})", what="these queries",
        advice="recalibrate on data like these queries (labelled pairs of this collection) "
               "before trusting the filter on them; see docs/monitoring.md")
    return BatchAlarm(at, query_id, n, state.martingale, 1.0 / state.delta, stat, state.delta,
                      message)


def _keys(values: np.ndarray) -> np.ndarray:
    """Round floats to ``KEY_BITS`` mantissa bits as int64 keys that sort like the floats."""
    bits = (np.asarray(values, dtype=np.float64) + 0.0).view(np.int64)  # + 0.0: -0.0 -> 0.0
    bits = np.where(bits < 0, bits ^ np.int64(0x7FFFFFFFFFFFFFFF), bits)
    return bits >> np.int64(52 - KEY_BITS)


def _key(value: float) -> int:
    """:func:`_keys` of one float."""
    return int(_keys(np.array([value]))[0])


class _Row(NamedTuple):
    fingerprint: str
    epoch: int
    n_observed: int
    log_a: dict[str, Any]  # {"t": [requests seen per statistic], "a": [log A_eps per statistic]}
    log_m: float
    fired_at: int | None
    fired_time: str | None


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


class ExchangeabilityMonitor(Closing):
    """Alarm when served requests stop looking exchangeable with the calibration queries.

    Each :meth:`observe` turns one request's served scores into its statistics (the
    separation, and the best score when a ``best`` reference is given), a smoothed online
    conformal p-value for each and one step of each statistic's conformal test martingale
    (see the module docstring); the alarm fires, once and latched, when
    ``max_i M^i / K`` reaches ``1/delta``.

    Parameters
    ----------
    reference : array-like of float
        The separation of each calibration query (the artifact's ``"monitor"`` block; use
        :meth:`from_artifact`). Finite, at least one value.
    best : array-like of float, optional
        The best (lowest) score of each calibration query (the artifact's monitor
        ``"best"``); None watches the separation alone (``K = 1``).
    delta : float, default=0.01
        False-alarm bound in (0, 1): on exchangeable traffic the alarm ever fires with
        probability at most ``delta``.
    store : path-like, optional
        None keeps the state in memory (one process). A path keeps it in an SQLite file
        shared by every worker process of one server: one sequential martingale over the
        merged stream, one transaction per request. A store last used with another
        reference, ``delta``, ``alternative`` or ``seed`` is taken over (reset) when the
        monitor is built; a monitor whose store was since taken over by another stops
        writing to it (logged once) and reports the store's state.
    seed : int, default=0
        Seed of the tie-breaking ``theta`` of the p-values.
    alternative : {"two-sided", "less", "greater"}, default="two-sided"
        Direction of the change to detect in the separation: "less" for traffic whose
        best snippet stands out less than at calibration (unrelated documents, another
        language), "greater" for the opposite.
    k : int, default=5
        Best scores read per request; must equal the reference's (the artifact's ``k``).
    min_requests : int, default=10
        The alarm never fires before this many requests have been observed since the last
        reset, so a handful of requests (a single client's, say) cannot latch it: two
        requests of extreme separation already take the martingale past 1/delta = 100. The
        martingale itself is unchanged, and firing only when ``M_t >= 1/delta`` *and*
        ``t >= min_requests`` is a sub-event of ``sup_t M_t >= 1/delta``, so the bound on
        false alarms still holds.

    Attributes
    ----------
    log_alarm : bool
        Log the alarm (one WARNING, :func:`alarm_message`) in the process whose request
        fired it (True when built); False when the caller says it itself
        (:func:`watch_batch`; ``from_artifact(..., log_alarm=False)``).

    Raises
    ------
    ValueError
        Empty or non-finite reference, ``delta`` outside (0, 1), an unknown
        ``alternative``, or a store file that is not a monitor store.

    Examples
    --------
    >>> m = ExchangeabilityMonitor([0.1, 0.2, 0.3, 0.15, 0.25] * 20, delta=0.01)
    >>> for _ in range(30):  # requests whose best snippet no longer stands out
    ...     state = m.observe([0.80, 0.81, 0.81, 0.82, 0.83])
    >>> state.alarm, state.fired_at is not None, state.n_observed
    (True, True, 30)
    >>> m.reset(); m.state.alarm, m.state.martingale
    (False, 1.0)
    """

    def __init__(self, reference: Any, *, delta: float = 0.01,
                 store: str | os.PathLike[str] | None = None, seed: int = 0,
                 alternative: str = "two-sided", k: int = TOP_K,
                 min_requests: int = DEFAULT_MIN_REQUESTS, best: Any = None) -> None:
        ref = check_scores(reference, name="reference")
        if ref.size == 0:
            raise ValueError("reference is empty; expected the separation of at least one "
                             "calibration query (the artifact's 'monitor' block).")
        refs = {"separation": np.sort(_keys(ref))}
        if best is not None:
            best_ref = check_scores(best, name="best")
            if best_ref.size == 0:
                raise ValueError("best is empty; expected the best score of at least one "
                                 "calibration query (the artifact's monitor 'best'), or None.")
            refs["best"] = np.sort(_keys(best_ref))
        self.delta = check_alpha(delta, name="delta")
        seed = check_int(seed, "seed", min_value=0)
        if alternative not in ALTERNATIVES:
            raise ValueError(f"alternative == {alternative!r}, must be one of {', '.join(ALTERNATIVES)}.")
        k = check_int(k, "k", min_value=2, hint="best scores read per request")
        self.min_requests = check_int(min_requests, "min_requests", min_value=1)
        store = check_path(store, "store", allow_none=True)
        self.seed, self.alternative, self.k = seed, alternative, k
        self.log_alarm = True
        #: The statistic whose martingale made the alarm fire in this process (None before).
        self.fired_statistic: str | None = None
        self.store = None if store is None else Path(store)
        self._ref = refs["separation"]
        #: The watched statistics and their sorted reference keys, in a fixed order.
        self._refs = refs
        self._log_k = math.log(len(refs))
        sides = {"two-sided": (1.0, -1.0), "greater": (1.0,), "less": (-1.0,)}[alternative]
        self._side = np.repeat(np.array(sides), len(EPSILONS))  # +1: bet on p, -1: on 1 - p
        self._eps = np.tile(np.array(EPSILONS), len(sides))
        self._log_w = -math.log(self._eps.size)
        self._log_alarm = math.log(1.0 / self.delta)
        self._fingerprint = self._make_fingerprint()
        self._lock = threading.Lock()
        self._warned_stale = False
        self._db_conn: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._lock_fd: int | None = None
        self._db_conn = self._open()

    @classmethod
    def from_artifact(cls, payload: Artifact | Mapping[str, Any], *, log_alarm: bool = True,
                      **kwargs: Any) -> ExchangeabilityMonitor | None:
        """The monitor of a filter artifact (``Artifact.read(path)`` or
        ``ConformalFilter.to_artifact()``).

        Parameters
        ----------
        payload : Artifact or Mapping
            The artifact; a dict of a whole artifact (one with a ``"format"``) is read by
            :meth:`Artifact.from_dict <ragsieve.artifact.Artifact.from_dict>` (every field,
            the seal), a bare ``{"monitor": block}`` by the block check alone.
        log_alarm : bool, default=True
            Whether the monitor logs its alarm (the attribute ``log_alarm``); False when
            the caller says it itself (:func:`watch_batch`).
        **kwargs
            ``delta``, ``store``, ``seed``, ``alternative``, ``min_requests`` (``k`` comes
            from the artifact).

        Returns
        -------
        ExchangeabilityMonitor or None
            None when the artifact has no ``"monitor"`` block (written before the monitor
            existed, or calibrated with ``monitor=False``): the caller says so.

        Raises
        ------
        ArtifactError
            A malformed ``"monitor"`` block, one of a statistic this ragsieve does not
            compute, or (for a whole artifact, one with a ``"format"``) a field or seal
            the artifact reader refuses.
        """
        check_instance(payload, (Artifact, Mapping), "payload", expected="the artifact dict or "
                       "an Artifact (ragsieve.artifact.Artifact.read(path))")
        if "k" in kwargs:
            raise TypeError("k is fixed by the artifact's monitor block; do not pass it.")
        raw = payload.monitor if isinstance(payload, Artifact) else payload.get("monitor")
        if raw is None:
            return None
        if isinstance(payload, Mapping) and "format" in payload:  # a whole artifact: checked
            Artifact.from_dict(payload)
        if "best" in kwargs:
            raise TypeError("best is fixed by the artifact's monitor block; do not pass it.")
        block = read_monitor_block(raw)
        monitor = cls(block["reference"], k=block["k"], best=block.get("best"), **kwargs)
        monitor.log_alarm = bool(log_alarm)
        return monitor

    # ------------------------------------------------------------------ public
    def observe(self, scores: Any) -> MonitorState:
        """Observe one request's served snippet scores; return the state after it.

        Parameters
        ----------
        scores : array-like of float
            The scores of every snippet served for the request (kept or not), finite.

        Returns
        -------
        MonitorState
            Unchanged (nothing observed) for a request with fewer than 2 scores.

        Raises
        ------
        TypeError, ValueError
            Scores that are not a 1-d array of finite numbers.
        """
        arr = check_scores(scores, name="scores")
        values = {"separation": separation(arr, self.k), "best": best_score(arr)}
        if all(values[name] is None for name in self._refs):
            logger.debug("request with %d score(s) not observed: no watched statistic", arr.size)
            return self.state
        fired = None
        with self._writing() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = self._read(db)
                if row.fingerprint != self._fingerprint:
                    db.execute("ROLLBACK")
                    self._warn_stale()
                    return self._as_state(row)
                t = row.n_observed + 1
                counts, log_as = list(row.log_a["t"]), list(row.log_a["a"])
                detail: dict[str, list[float]] = {}
                log_ms = []
                for i, (name, ref) in enumerate(self._refs.items()):
                    stat = values[name]
                    if stat is not None:
                        counts[i] += 1
                        p = self._p_value(db, name, ref, stat, row.epoch, counts[i])
                        log_as[i] = self._bet(np.array(log_as[i], dtype=np.float64), counts[i],
                                              p).tolist()
                        detail[name] = [stat, p]
                    log_ms.append(float(np.logaddexp(
                        logsumexp(np.array(log_as[i], dtype=np.float64)) + self._log_w,
                        log_unstarted(counts[i]))))
                log_m = max(log_ms) - self._log_k  # union bound: max_i M_i / K
                fired_at, fired_time = row.fired_at, row.fired_time
                if fired_at is None and t >= self.min_requests and log_m >= self._log_alarm:
                    fired_at = t
                    fired_time = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
                    fired = list(self._refs)[int(np.argmax(log_ms))]
                db.execute("UPDATE monitor_state SET n_observed = ?, log_a = ?, log_m = ?, "
                           "fired_at = ?, fired_time = ? WHERE id = 1",
                           (t, json.dumps({"t": counts, "a": log_as}), log_m, fired_at,
                            fired_time))
                sep = detail.get("separation", [None, None])
                db.execute("INSERT INTO monitor_log VALUES (?, ?, ?, ?, ?)",
                           (t, sep[0], sep[1], log_m / math.log(10.0), json.dumps(detail)))
                if t % 1000 == 0:
                    db.execute("DELETE FROM monitor_log WHERE seq <= ?", (t - HISTORY,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        state = self._as_state(_Row(row.fingerprint, row.epoch, t, {}, log_m, fired_at, fired_time))
        if fired is not None:
            self.fired_statistic = fired
            if self.log_alarm:
                logger.warning("%s", alarm_message(state, fired))
        return state

    @property
    def state(self) -> MonitorState:
        """The current state (of the shared store, with ``store``)."""
        with self._lock:
            return self._as_state(self._read(self._db()))

    def reset(self) -> None:
        """Start afresh: martingales 1, alarm off, no live requests (e.g. after a recalibration).

        With a shared store this resets it for every worker (and takes it over for this
        monitor's reference).
        """
        with self._writing() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = self._read(db)
                self._write_fresh(db, row.epoch + 1)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self._warned_stale = False
        logger.info("exchangeability monitor reset%s", f" ({self.store})" if self.store else "")

    def history(self) -> list[dict[str, Any]]:
        """The logged requests since the reset (the last 100,000), in the order processed.

        Returns
        -------
        list of dict
            ``{"seq", "statistic", "p_value", "log10_martingale", "statistics"}`` per request:
            ``statistic`` and ``p_value`` are the separation's (None for a request of one
            score), ``statistics`` maps every statistic observed on the request to its
            ``[value, p_value]``.
        """
        with self._lock:
            rows = self._db().execute(
                "SELECT seq, statistic, p_value, log10_martingale, detail FROM monitor_log "
                "ORDER BY seq").fetchall()
        return [{"seq": r[0], "statistic": r[1], "p_value": r[2], "log10_martingale": r[3],
                 "statistics": json.loads(r[4])} for r in rows]

    def close(self) -> None:
        """Close the store connection (an in-memory monitor loses its state)."""
        with self._lock:
            if self._db_conn is not None:
                self._db_conn.close()
                self._db_conn = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __repr__(self) -> str:
        return (f"ExchangeabilityMonitor(n_reference={self._ref.size}, "
                f"statistics={list(self._refs)}, delta={self.delta}, "
                f"alternative={self.alternative!r}, store={None if self.store is None else str(self.store)!r})")

    # ------------------------------------------------------------------ internals
    def _make_fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"schema": _SCHEMA, "statistic": STATISTIC, "version": STATISTIC_VERSION,
                             "k": self.k, "key_bits": KEY_BITS, "delta": self.delta,
                             "alternative": self.alternative, "seed": self.seed,
                             "epsilons": EPSILONS, "statistics": list(self._refs)},
                            sort_keys=True).encode())
        for ref in self._refs.values():
            h.update(ref.astype("<i8").tobytes())
            h.update(b"|")
        return h.hexdigest()

    def _theta(self, epoch: int, t: int, name: str = "separation") -> float:
        """Tie-breaking uniform in (0, 1), a hash of (seed, epoch, t, statistic): the same in
        every worker."""
        tail = "" if name == "separation" else f":{name}"
        digest = hashlib.blake2b(f"{self.seed}:{epoch}:{t}{tail}".encode(), digest_size=8).digest()
        return ((int.from_bytes(digest, "little") >> 11) + 0.5) / 2.0**53

    def _p_value(self, db: sqlite3.Connection, name: str, ref: np.ndarray, stat: float,
                 epoch: int, t: int) -> float:
        """The smoothed online p-value of the ``t``-th observation of statistic ``name``
        (ranked against its reference and earlier requests), counted into the live table."""
        key = _key(stat)
        table = _LIVE[name]
        gt_live, eq_live = db.execute(
            f"SELECT COALESCE(SUM(CASE WHEN key > ?1 THEN n END), 0), "  # fixed table names
            f"COALESCE(SUM(CASE WHEN key = ?1 THEN n END), 0) FROM {table} "
            "WHERE key >= ?1", (key,)).fetchone()
        lo = int(np.searchsorted(ref, key, "left"))
        hi = int(np.searchsorted(ref, key, "right"))
        gt = ref.size - hi + gt_live
        ties = hi - lo + eq_live + 1  # itself included
        db.execute(f"INSERT INTO {table} (key, n) VALUES (?, 1) "
                   "ON CONFLICT(key) DO UPDATE SET n = n + 1", (key,))
        return (gt + self._theta(epoch, t, name) * ties) / (ref.size + t)

    def _bet(self, log_a: np.ndarray, t: int, p: float) -> np.ndarray:
        """One step: start the martingale of prior weight pi_{t-1}, then every one bets on p."""
        return power_bet(log_a, t, p, self._side, self._eps)

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The connection, held by this thread and (file store) by this process's flock."""
        with self._lock:
            db = self._db()
            if self._lock_fd is None:
                yield db
                return
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield db
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _db(self) -> sqlite3.Connection:
        if self._db_conn is None:
            raise ValueError("this ExchangeabilityMonitor is closed.")
        if self.store is not None and os.getpid() != self._pid:
            # a forked worker: SQLite connections must not cross a fork; the parent's stays
            # referenced (closing it here could release the parent's locks)
            self._inherited.append(self._db_conn)
            self._pid = os.getpid()
            if self._lock_fd is not None:  # the parent's flock is on a shared file description
                os.close(self._lock_fd)
            self._db_conn = self._open()
        return self._db_conn

    def _open(self) -> sqlite3.Connection:
        if self.store is not None:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            if fcntl is not None:
                self._lock_fd = os.open(f"{self.store}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        db: sqlite3.Connection | None = None
        try:
            if self.store is None:
                db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            else:  # WAL: one sequential martingale written by every worker process
                db = connect_shared(self.store, timeout=60.0)
            db.execute("BEGIN IMMEDIATE")
            for table, (create, columns) in _TABLES.items():
                db.execute(create)
                found = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
                if table == "monitor_log" and found == _OLD_LOG:  # an earlier store's log
                    db.execute("DROP TABLE monitor_log")
                    db.execute(create)
                    found = columns
                if found != columns:
                    raise ValueError(f"{self.store}: table {table!r} has columns {found}, expected "
                                     f"{columns}; not an exchangeability monitor store.")
            row = db.execute("SELECT fingerprint, epoch FROM monitor_state WHERE id = 1").fetchone()
            if row is None:
                self._write_fresh(db, 0)
            elif row[0] != self._fingerprint:
                logger.warning("exchangeability monitor store %s was used with another reference "
                               "or settings; starting a fresh martingale in it", self.store)
                self._write_fresh(db, int(row[1]) + 1)
            db.execute("COMMIT")
        except BaseException as exc:
            if db is not None:
                db.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            if isinstance(exc, sqlite3.DatabaseError):  # a bad file, not a bad type
                message = f"cannot use {self.store} as an exchangeability monitor store: {exc}"
                raise ValueError(message) from exc  # noqa: TRY004
            raise
        return db

    def _write_fresh(self, db: sqlite3.Connection, epoch: int) -> None:
        for table in _LIVE.values():
            db.execute(f"DELETE FROM {table}")  # fixed table names
        db.execute("DELETE FROM monitor_log")
        fresh = {"t": [0] * len(self._refs), "a": [[-math.inf] * self._eps.size] * len(self._refs)}
        db.execute("INSERT OR REPLACE INTO monitor_state VALUES (1, ?, ?, 0, ?, ?, NULL, NULL)",
                   (self._fingerprint, epoch, json.dumps(fresh), -self._log_k))

    def _read(self, db: sqlite3.Connection) -> _Row:
        row = db.execute("SELECT fingerprint, epoch, n_observed, log_a, log_m, fired_at, fired_time "
                         "FROM monitor_state WHERE id = 1").fetchone()
        if row is None:
            raise ValueError(f"exchangeability monitor store {self.store} lost its state row.")
        return _Row(row[0], int(row[1]), int(row[2]), json.loads(row[3]), float(row[4]), row[5], row[6])

    def _as_state(self, row: _Row) -> MonitorState:
        log10 = row.log_m / math.log(10.0)
        return MonitorState(
            martingale=10.0**log10 if log10 < _MAX_LOG10 else float(np.finfo(np.float64).max),
            log10_martingale=log10, alarm=row.fired_at is not None, n_observed=row.n_observed,
            fired_at=row.fired_at, fired_time=row.fired_time, delta=self.delta)

    def _warn_stale(self) -> None:
        if not self._warned_stale:
            self._warned_stale = True
            logger.warning("exchangeability monitor store %s is now used by another reference or "
                           "settings (a newer artifact?); this monitor no longer writes to it",
                           self.store)
