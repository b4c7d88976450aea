"""Lists the keep rule empties: why (in the score's units), and how a component reports them.

When the rule keeps nothing (or ``min_keep`` keeps the best anyway), the component's first
such list gets a WARNING log line with the reason (:func:`empty_reason`) and the fix; the
next ones are counted, not repeated (:class:`EmptyListLog`): a DEBUG line each and one
WARNING summary line at the 10th, 100th, 1000th, ... emptied list, the count in the
component's ``empty_stats``. Documents kept by ``min_keep`` carry the reason under
:data:`~ragsieve.integrations.metadata.NOTE_KEY`.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragsieve.integrations.metadata import user_score

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter
    from ragsieve.types import FilterResult

__all__ = ["EmptyListLog", "EmptyListStats", "empty_reason", "report_result"]


def empty_reason(flt: ConformalFilter, result: FilterResult, kind: str = "documents") -> str | None:
    """Why the rule kept none of ``result``'s documents, in the score's units; None when it
    kept some.

    Examples
    --------
    ``no documents passed the marginal rule: every score is below the threshold (keep
    bm25 >= 7.2; the best is 5.1); the context is empty (set min_keep to keep the best
    ones anyway)``
    """
    if not result.rule_kept_none:
        return None
    rule = flt.scorer_.keep_rule(result.threshold)
    best = min(result.scores)
    reason = f"no {kind} passed the {flt.mode} rule: "
    if math.isfinite(result.threshold) and best > result.threshold:
        side = "below" if rule.keep_if == ">=" else "above"
        reason += f"every score is {side} the threshold "
    reason += f"({rule}; the best is {user_score(flt, best):.4g}); "
    if result.kept:
        return reason + (f"kept the {len(result.kept)} best by min_keep={flt.min_keep}, "
                         "outside the calibrated guarantee")
    return reason + "the context is empty (set min_keep to keep the best ones anyway)"


def report_result(log: logging.Logger, flt: ConformalFilter, result: FilterResult,
                  kind: str = "documents", empties: EmptyListLog | None = None) -> str | None:
    """Log what a component kept: when the rule kept nothing, a WARNING with the reason
    (:func:`empty_reason`), or with ``empties`` what :meth:`EmptyListLog.see` logs; else a
    DEBUG line. Returns the reason (None: kept some)."""
    reason = empty_reason(flt, result, kind)
    if empties is not None:
        empties.see(log, result, reason, kind)
    elif reason:
        log.warning("kept %d of %d %s for query %r: %s", len(result.kept), result.n_input,
                    kind, result.query[:80], reason)
    if not reason:
        log.debug("kept %d of %d %s (%s)", len(result.kept), result.n_input, kind,
                  flt.scorer_.keep_rule(result.threshold))
    return reason


@dataclass(frozen=True)
class EmptyListStats:
    """What a component's rule emptied so far (:attr:`EmptyListLog.stats`).

    Attributes
    ----------
    lists : int
        Lists the component filtered.
    emptied : int
        Lists of which the rule kept nothing (``min_keep`` may have kept the best anyway).
    """

    lists: int = 0
    emptied: int = 0


def _summary_due(n: int) -> bool:
    """The counts of emptied lists that :class:`EmptyListLog` summarises in a WARNING:
    1, 10, 100, 1000, ... (a power of ten)."""
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class EmptyListLog:
    """How a framework component reports the lists its rule empties, one call per query:
    as the CLI prints one summary rather than a line per query.

    The first emptied list is a WARNING with its reason and the fix (:func:`empty_reason`);
    every later one is a DEBUG line and counted, and at the 10th, 100th, 1000th, ... a
    WARNING summary line gives the count so far. :attr:`stats` is the count (each
    component's ``empty_stats``). Thread-safe: a component may serve several threads.

    Parameters
    ----------
    component : str
        The component's class name, for the log lines.
    """

    def __init__(self, component: str) -> None:
        self.component = component
        self._lock = threading.Lock()
        self._stats = EmptyListStats()

    @property
    def stats(self) -> EmptyListStats:
        """The lists seen and emptied so far."""
        return self._stats

    def see(self, log: logging.Logger, result: FilterResult, reason: str | None,
            kind: str = "documents") -> None:
        """Count one filtered list; log it as the class says when ``reason`` (it was
        emptied) is given."""
        with self._lock:
            lists, emptied = self._stats.lists + 1, self._stats.emptied + bool(reason)
            self._stats = EmptyListStats(lists, emptied)
        if not reason:
            return
        where = f"{self.component}.empty_stats"
        if emptied == 1:
            log.warning("kept %d of %d %s for query %r: %s (the next lists the rule empties "
                        "are counted in %s and summarised at the 10th, 100th, ...)",
                        len(result.kept), result.n_input, kind, result.query[:80], reason,
                        where)
        elif _summary_due(emptied):
            log.warning("the rule emptied %d of the %d lists of %s %s has filtered so far "
                        "(the count is in %s); the last: %s", emptied, lists, kind,
                        self.component, where, reason)
        else:
            log.debug("kept %d of %d %s for query %r: %s", len(result.kept), result.n_input,
                      kind, result.query[:80], reason)
