"""Context budgets next to the conformal guarantee.

A conformal filter promises "a relevant snippet is kept with probability >= 1 - alpha"
but says nothing about how much context it keeps. A *budget* (characters or tokens per
query) fixes the size instead and leaves the coverage open. This module keeps the best
snippets that fit a budget and reports what coverage that budget buys on labelled
calibration data, so the two can be read side by side::

    a 1,000-char budget keeps 83.0 % [lower bound 80.1 %] of relevant snippets
    on calibration data, below your 90.0 % target; you'd need 1,400 chars.

* :func:`select_within_budget` -- greedy selection for one query.
* :func:`approx_tokens` -- a cheap token estimate when no tokenizer is given.
* :class:`BudgetCalibrator` -- measures a budget on calibration data
  (:class:`BudgetReport`) and answers "what budget would I need" (``budget_for``).

Unlike the conformal threshold, the budget's coverage is an *estimate*, not a
finite-sample guarantee: ``coverage_lower`` is a confidence bound that assumes the
calibration relevant snippets are independent draws (see :class:`BudgetCalibrator`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._validation import (
    MAX_COUNT,
    check_codes,
    check_int,
    check_lengths,
    check_real,
    check_relevant,
    check_scores,
    check_unit_interval,
)
from ..errors import ArtifactError, CalibrationError
from .base import BaseCalibrator, Guarantee, _json_float, _read_float, nouns
from .stats import clopper_pearson_lower

__all__ = [
    "BudgetCalibrator",
    "BudgetReport",
    "approx_tokens",
    "clopper_pearson_lower",
    "select_within_budget",
]

logger = logging.getLogger(__name__)

UNITS: tuple[str, ...] = ("chars", "tokens")
#: Characters per token assumed by :func:`approx_tokens` (a common rule of thumb for
#: English text with BPE tokenizers; other languages and code differ).
CHARS_PER_TOKEN = 4
#: Resamples of the group bootstrap used when ``groups`` are given to ``fit``.
N_BOOTSTRAP = 2000


# --------------------------------------------------------------------------- validation


def _check_budget(budget: Any) -> int:
    return check_int(budget, "budget", min_value=0)


def _check_threshold(threshold: Any) -> float:
    return check_real(threshold, "threshold", hint="inf keeps every snippet that fits")


# --------------------------------------------------------------------------- selection


def _query_runs(scores: np.ndarray, query_codes: np.ndarray) -> list[np.ndarray]:
    """The pair indices of each query, in greedy order (score, then input position, which
    breaks ties): pairs sorted by query, then score, then position."""
    n = scores.size
    order = np.lexsort((np.arange(n), scores, query_codes))
    starts = np.r_[0, np.flatnonzero(np.diff(query_codes[order]) != 0) + 1, n]
    return [order[a:b] for a, b in itertools.pairwise(starts)]


def _greedy(
    order: np.ndarray, lengths: np.ndarray, eligible: np.ndarray, budget: int
) -> np.ndarray:
    """Skip-and-continue greedy over ``order`` (no validation)."""
    kept = np.zeros(lengths.size, dtype=bool)
    remaining = budget
    for i in order:
        if eligible[i] and lengths[i] <= remaining:
            kept[i] = True
            remaining -= int(lengths[i])
    return kept


def select_within_budget(
    scores: Any, lengths: Any, budget: int, *, threshold: float = math.inf
) -> np.ndarray:
    """Keep the best snippets of one query whose total length fits ``budget``.

    Snippets are visited by increasing score (ties by position). A snippet is taken
    if its score is ``<= threshold`` and its length fits in what is left of the
    budget; a snippet that does not fit is *skipped and the walk continues*, so a
    shorter, slightly worse snippet can still fill the remaining room. (The
    alternative, stopping at the first snippet that does not fit, gives a strict
    score prefix but wastes budget; skip-and-continue never keeps less context.)

    Passing a calibrated ``tau`` as ``threshold`` keeps only snippets that pass the
    conformal filter *and* fit the budget.

    Parameters
    ----------
    scores : array-like of float
        Nonconformity scores of the query's snippets (lower = more relevant), finite.
    lengths : array-like of int
        Size of each snippet, >= 0, in the unit of ``budget`` (characters or tokens;
        the unit is the caller's).
    budget : int
        Total size allowed, >= 0.
    threshold : float, default inf
        Snippets with a score above it are never kept.

    Returns
    -------
    numpy.ndarray of bool
        Keep-mask in input order.

    Raises
    ------
    TypeError
        If ``budget`` is not an int or ``lengths`` are not integers.
    ValueError
        If ``budget < 0``, a length is negative, the arrays do not align, or a score
        is not finite.

    Examples
    --------
    >>> select_within_budget([0.1, 0.2, 0.3], [60, 50, 30], 100).tolist()
    [True, False, True]
    >>> select_within_budget([0.1, 0.2, 0.3], [60, 50, 30], 100, threshold=0.25).tolist()
    [True, False, False]
    """
    b = _check_budget(budget)
    s = check_scores(scores)
    ln = check_lengths(lengths, s.size)
    t = _check_threshold(threshold)
    order = np.lexsort((np.arange(s.size), s))
    return _greedy(order, ln, s <= t, b)


def approx_tokens(text: str) -> int:
    """Cheap token estimate ``ceil(len(text) / 4)``.

    Four characters per token is a rule of thumb for English with BPE tokenizers
    (GPT, Llama, Gemma); it under-counts for most other languages, code and numbers.
    Pass a real tokenizer to :class:`BudgetCalibrator` when the budget is tight.

    Examples
    --------
    >>> approx_tokens("")
    0
    >>> approx_tokens("hello")
    2
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}.")
    return -(-len(text) // CHARS_PER_TOKEN)


# --------------------------------------------------------------------------- confidence bounds


def _group_bootstrap_lower(
    hits: np.ndarray, counts: np.ndarray, delta: float, *, n_boot: int = N_BOOTSTRAP, seed: int = 0
) -> float:
    """Percentile lower bound of micro coverage when whole groups are resampled."""
    rng = np.random.default_rng(seed)
    g = counts.size
    weights = rng.multinomial(g, np.full(g, 1.0 / g), size=n_boot).astype(np.float64)
    num = weights @ hits
    den = weights @ counts
    ok = den > 0
    return float(np.quantile(num[ok] / den[ok], delta)) if ok.any() else 0.0


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class BudgetReport:
    """What a fixed per-query budget buys on the calibration data.

    Attributes
    ----------
    budget : int
        Units allowed per query.
    unit : str
        ``"chars"`` or ``"tokens"``.
    coverage : float
        Share of relevant calibration snippets kept (micro).
    coverage_lower : float
        One-sided lower confidence bound at level ``1 - delta`` for the coverage on new
        data from the same distribution (see ``bound``).
    query_coverage : float
        Mean over queries (with a relevant snippet) of the share of their relevant
        snippets kept.
    target : float or None
        The user's coverage target, if given.
    meets_target : bool or None
        ``coverage_lower >= target`` (``None`` without a target).
    n_relevant : int
        Relevant calibration snippets.
    n_queries : int
        Calibration queries (all of them, with or without a relevant snippet).
    removal : float
        Share of the calibration context (in ``unit``) removed.
    delta : float
        Confidence level parameter of ``coverage_lower``.
    threshold : float
        Score threshold combined with the budget (``inf``: budget only).
    bound : str
        How ``coverage_lower`` was computed: ``"clopper-pearson"`` (relevant snippets
        treated as independent) or ``"min(clopper-pearson, group-bootstrap)"``.
    """

    budget: int
    unit: str
    coverage: float
    coverage_lower: float
    query_coverage: float
    target: float | None
    meets_target: bool | None
    n_relevant: int
    n_queries: int
    removal: float
    delta: float = 0.05
    threshold: float = math.inf
    bound: str = "clopper-pearson"

    def summary(self, unit: str = "snippet") -> str:
        """One human sentence, e.g. for a CLI (``unit``: what was calibrated on, see
        :func:`~ragsieve.calibration.base.nouns`).

        Examples
        --------
        >>> r = BudgetReport(1000, "chars", 0.83, 0.801, 0.85, 0.9, False, 200, 180, 0.6)
        >>> r.summary()
        'a 1,000-char budget keeps 83.0 % [lower bound 80.1 %] of 200 relevant snippets on calibration data, below your 90.0 % target.'
        """
        text = (
            f"a {self.budget:,}-{self.unit[:-1]} budget keeps {100 * self.coverage:.1f} % "
            f"[lower bound {100 * self.coverage_lower:.1f} %] of {self.n_relevant:,} "
            f"{nouns(unit).relevant_plural} on calibration data"
        )
        if self.target is not None:
            side = "meeting" if self.meets_target else "below"
            text += f", {side} your {100 * self.target:.1f} % target"
        return text + "."


# --------------------------------------------------------------------------- calibrator


class BudgetCalibrator(BaseCalibrator):
    """Budget mode: keep the best snippets that fit a per-query budget; measure what it buys.

    ``predict`` keeps, per query, the lowest-score snippets whose total length fits
    ``budget`` (see :func:`select_within_budget`), so it needs ``query_ids`` and ``lengths``.

    ``fit`` applies :func:`select_within_budget` to every calibration query and
    stores a :class:`BudgetReport` in ``report_``. Its ``coverage_lower`` is a
    one-sided Clopper-Pearson bound on the ``n_relevant`` relevant snippets, which
    treats them as independent draws; snippets of one query (or topic) are correlated,
    so the bound is approximate. When ``groups`` are passed to ``fit`` the smaller of
    that bound and a group-bootstrap percentile bound (whole groups resampled,
    ``N_BOOTSTRAP`` times, seeded) is reported -- still approximate with few groups.
    Either way it is an estimate for new data *from the same distribution*, not the
    finite-sample guarantee of a conformal threshold.

    Parameters
    ----------
    budget : int
        Units per query, >= 0.
    unit : {"chars", "tokens"}, default "chars"
        Unit of ``budget``; texts are measured with ``len`` or the tokenizer.
    delta : float, default 0.05
        ``coverage_lower`` holds at level ``1 - delta``.
    target : float or None
        Coverage the user wants, in (0, 1]. ``fit`` logs a warning, with the budget
        that would be needed, when ``coverage_lower < target``.
    tokenizer : callable str -> int, optional
        Token counter for ``unit="tokens"``; defaults to :func:`approx_tokens`.
    threshold : float or None, default None
        Score threshold combined with the budget (e.g. a calibrated ``tau``); None: no cap.

    Attributes
    ----------
    report_ : BudgetReport
    n_calibration_ : int
        Calibration pairs seen by ``fit``.

    Examples
    --------
    >>> cal = BudgetCalibrator(budget=10).fit(
    ...     [0.1, 0.5, 0.2, 0.3], [1, 0, 0, 1], query_ids=["q1", "q1", "q2", "q2"],
    ...     lengths=[8, 5, 6, 6])
    >>> cal.report_.coverage, cal.budget_for(1.0)
    (0.5, 12)
    """

    def __init__(
        self,
        *,
        budget: int,
        unit: str = "chars",
        delta: float = 0.05,
        target: float | None = None,
        tokenizer: Callable[[str], int] | None = None,
        threshold: float | None = None,
    ) -> None:
        self.budget = budget
        self.unit = unit
        self.delta = delta
        self.target = target
        self.tokenizer = tokenizer
        self.threshold = threshold

    def miscoverage(self) -> float | None:
        """``1 - target`` (None without a coverage target: the budget is the promise)."""
        return None if self.target is None else 1.0 - float(self.target)

    # ---- parameters and input forms

    def _check_params(self) -> None:
        _check_budget(self.budget)
        if self.unit not in UNITS:
            raise ValueError(f"unit == {self.unit!r}, must be one of {UNITS}.")
        check_unit_interval(self.delta, "delta", closed_right=False)
        if self.target is not None:
            check_unit_interval(self.target, "target", closed_right=True)
        if self.tokenizer is not None:
            if not callable(self.tokenizer):
                raise TypeError(
                    f"tokenizer must be a callable str -> int, got {type(self.tokenizer).__name__}."
                )
            if self.unit != "tokens":
                raise ValueError(
                    f"a tokenizer was given with unit == {self.unit!r}; use unit='tokens'."
                )
        self._cap()

    def _cap(self) -> float:
        """The score cap: ``threshold``, or ``inf`` when None."""
        return math.inf if self.threshold is None else _check_threshold(self.threshold)

    def _measure(self, text: str) -> int:
        if self.unit == "chars":
            return len(text)
        count = (self.tokenizer or approx_tokens)(text)
        return check_int(count, "tokenizer(text)", min_value=0, hint="the tokens of the text")

    def _lengths(self, lengths_or_texts: Any, n: int) -> np.ndarray:
        if lengths_or_texts is None:
            raise ValueError(f"mode {self.mode!r} needs lengths (texts or sizes in {self.unit}); got None.")
        """Accept a sequence of texts (measured in ``unit``) or of integer lengths."""
        if isinstance(lengths_or_texts, (str, bytes)):
            raise TypeError(
                "lengths_or_texts must be a sequence (one per snippet), got a single string."
            )
        items = (
            lengths_or_texts if isinstance(lengths_or_texts, np.ndarray) else list(lengths_or_texts)
        )
        if len(items) and all(isinstance(x, str) for x in items):
            if len(items) != n:
                raise ValueError(f"got {len(items)} texts for {n} scores; they must align.")
            return np.fromiter((self._measure(x) for x in items), dtype=np.int64, count=n)
        if any(isinstance(x, str) for x in items):
            raise TypeError(
                "lengths_or_texts mixes texts and numbers; pass either all texts (str) or all "
                "integer lengths."
            )
        return check_lengths(items, n, name="lengths_or_texts")

    # ---- estimator API

    mode = "budget"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"query_ids", "lengths"})
    predict_requires: ClassVar[frozenset[str]] = frozenset({"query_ids", "lengths"})
    uses_irrelevant: ClassVar[bool] = True
    alpha_as_target: ClassVar[bool] = True

    def fit(
        self,
        scores: Any,
        relevant: Any = None,
        *,
        query_ids: Any = None,
        groups: Any = None,
        lengths: Any = None,
    ) -> BudgetCalibrator:
        """Apply the budget to every calibration query and measure it.

        Parameters
        ----------
        scores : array-like of float
            Nonconformity scores, one per (query, snippet) pair, finite.
        relevant : array-like of 0/1 or bool
            Relevance labels, aligned with ``scores``.
        query_ids : sequence of str or int
            Query of each pair; the pairs of one query form its retrieved list, in
            input order (which breaks score ties).
        lengths : sequence of int or of str
            Sizes in ``unit``, or the snippet texts (measured with ``len`` for chars,
            the tokenizer or :func:`approx_tokens` for tokens).
        groups : sequence of str or int, optional
            Topic of each pair; adds a group-bootstrap bound (see class docstring).

        Returns
        -------
        BudgetCalibrator
            ``self``, with ``report_`` set.

        Raises
        ------
        CalibrationError
            If there is no relevant snippet.
        """
        s, rel, q, ln, g = self._fit_inputs(scores, relevant, query_ids, lengths, groups)
        threshold = self._cap()
        eligible = s <= threshold
        runs = _query_runs(s, q)
        kept = np.zeros(s.size, dtype=bool)
        for idx in runs:
            kept[idx] = _greedy(np.arange(idx.size), ln[idx], eligible[idx], int(self.budget))
        self.n_calibration_ = int(s.size)
        self.threshold_ = threshold
        self.infinite_ = False
        self._hits_curve(runs, ln, rel, eligible)
        self.report_ = self._report(kept, rel, q, ln, g, threshold)
        target = self.report_.target
        if target is not None and self.report_.coverage_lower < target:
            logger.warning(self._below_target_message(target))
        return self

    def _fit_inputs(self, scores: Any, relevant: Any, query_ids: Any, lengths: Any,
                    groups: Any,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The checked inputs of :meth:`fit`: scores, labels, query codes, sizes, topic codes
        (None when no groups are given)."""
        self._check_params()
        s = check_scores(scores)
        n = s.size
        rel = check_relevant(relevant, n)
        q = check_codes(query_ids, n, "query_ids", mode=self.mode)
        ln = self._lengths(lengths, n)
        g = check_codes(groups, n, "groups") if groups is not None else None
        if not rel.any():
            raise CalibrationError(
                f"no relevant snippet among {n} calibration pairs; a budget's coverage "
                "cannot be measured without relevant = 1 labels."
            )
        return s, rel, q, ln, g

    def _coverage_lower(self, kept: np.ndarray, rel: np.ndarray,
                        g: np.ndarray | None) -> tuple[float, str]:
        """The lower bound on the budget's coverage and its name: Clopper-Pearson, and with
        two or more topics the smaller of it and the group bootstrap."""
        hits, n_rel = int((kept & rel).sum()), int(rel.sum())
        lower = clopper_pearson_lower(hits, n_rel, float(self.delta))
        if g is None:
            return lower, "clopper-pearson"
        n_groups = int(g.max()) + 1
        if n_groups < 2:
            logger.info("only one group given; coverage_lower uses Clopper-Pearson alone.")
            return lower, "clopper-pearson"
        g_hits = np.bincount(g, weights=(kept & rel).astype(float), minlength=n_groups)
        g_counts = np.bincount(g, weights=rel.astype(float), minlength=n_groups)
        lower = min(lower, _group_bootstrap_lower(g_hits, g_counts, float(self.delta)))
        return lower, "min(clopper-pearson, group-bootstrap)"

    def _report(self, kept: np.ndarray, rel: np.ndarray, q: np.ndarray, ln: np.ndarray,
                g: np.ndarray | None, threshold: float) -> BudgetReport:
        """What the budget bought on the calibration queries."""
        n_rel = int(rel.sum())
        lower, bound = self._coverage_lower(kept, rel, g)
        q_hits = np.bincount(q, weights=(kept & rel).astype(float))
        q_counts = np.bincount(q, weights=rel.astype(float))
        has_rel = q_counts > 0
        total = float(ln.sum())
        target = None if self.target is None else float(self.target)
        return BudgetReport(
            budget=int(self.budget),
            unit=self.unit,
            coverage=int((kept & rel).sum()) / n_rel,
            coverage_lower=lower,
            query_coverage=float((q_hits[has_rel] / q_counts[has_rel]).mean()),
            target=target,
            meets_target=None if target is None else bool(lower >= target),
            n_relevant=n_rel,
            n_queries=int(q.max()) + 1,
            removal=0.0 if total == 0 else 1.0 - float(ln[kept].sum()) / total,
            delta=float(self.delta),
            threshold=threshold,
            bound=bound,
        )

    def _below_target_message(self, target: float) -> str:
        r = self.report_
        msg = (
            f"a {r.budget:,}-{r.unit[:-1]} budget keeps {100 * r.coverage:.1f} % "
            f"[{100 * (1 - r.delta):.0f} % lower bound {100 * r.coverage_lower:.1f} %] of "
            f"{r.n_relevant} relevant calibration snippets, below the {100 * target:.1f} % target"
        )
        try:
            needed = self.budget_for(target)
            msg += f"; measured coverage reaches it at {needed:,} {r.unit}"
        except CalibrationError:
            return msg + f"; no budget reaches it (threshold {r.threshold:g} caps coverage)."
        try:
            msg += f", the lower bound at {self.budget_for(target, lower=True):,} {r.unit}."
        except CalibrationError:
            msg += f"; the lower bound cannot reach it with {r.n_relevant} relevant snippets."
        return msg

    def _hits_curve(
        self, runs: list[np.ndarray], ln: np.ndarray, rel: np.ndarray, eligible: np.ndarray
    ) -> None:
        """Exact relevant-kept count as a step function of the budget.

        For one query the greedy's kept set stays constant while no skipped snippet
        starts to fit; the next change happens at ``min(length_i + taken_before_i)``
        over skipped eligible snippets ``i``. Walking these events per query and
        summing the jumps gives the calibration coverage at every integer budget.
        (Skip-and-continue is not monotone: a larger budget can take a long snippet
        that then crowds out a shorter relevant one, so jumps can be negative.)
        """
        events: dict[int, int] = {}
        for idx in runs:
            lengths = [int(x) for x in ln[idx]]
            elig = [bool(x) for x in eligible[idx]]
            rels = [bool(x) for x in rel[idx]]
            if not any(r and e for r, e in zip(rels, elig, strict=True)):
                continue
            budget, prev = 0, 0
            while True:
                remaining, taken_before, hits, nxt = budget, 0, 0, None
                for length, e, r in zip(lengths, elig, rels, strict=True):
                    if not e:
                        continue
                    if length <= remaining:
                        remaining -= length
                        taken_before += length
                        hits += r
                    else:
                        change = length + taken_before
                        nxt = change if nxt is None else min(nxt, change)
                if hits != prev:
                    events[budget] = events.get(budget, 0) + hits - prev
                    prev = hits
                if nxt is None:
                    break
                budget = nxt
        keys = np.array(sorted(events), dtype=np.int64)
        self._curve_budgets = keys
        self._curve_hits = np.cumsum([events[k] for k in keys]).astype(np.int64)

    def coverage_at(self, budget: int) -> float:
        """Calibration coverage (micro) of another budget, without refitting.

        Examples
        --------
        >>> cal = BudgetCalibrator(budget=10).fit([0.1, 0.2], [1, 1], query_ids=["q", "q"], lengths=[8, 5])
        >>> cal.coverage_at(12), cal.coverage_at(13)
        (0.5, 1.0)
        """
        self._check_fitted()
        b = _check_budget(budget)
        pos = int(np.searchsorted(self._curve_budgets, b, side="right")) - 1
        hits = 0 if pos < 0 else int(self._curve_hits[pos])
        return hits / self.report_.n_relevant

    def budget_for(self, target: float, *, lower: bool = False) -> int:
        """Smallest budget whose calibration coverage is at least ``target``.

        Searches all budgets exactly (see the event walk in the source), so the answer
        is minimal: every smaller budget measures below ``target``. It is monotone in
        ``target``. Because skip-and-continue is not monotone in the budget, a few
        slightly larger budgets may measure marginally lower; check with
        :meth:`coverage_at` when that matters.

        Parameters
        ----------
        target : float
            Coverage wanted, in (0, 1].
        lower : bool, default False
            If True, require the Clopper-Pearson lower bound (level ``1 - delta``) to
            reach ``target`` instead of the measured coverage.

        Returns
        -------
        int
            Budget in ``unit``.

        Raises
        ------
        CalibrationError
            If no budget reaches ``target`` (a finite ``threshold`` caps coverage, or the
            lower bound cannot reach it with this many relevant snippets).
        """
        self._check_fitted()
        t = check_unit_interval(target, "target", closed_right=True)
        n_rel = self.report_.n_relevant
        if lower:
            delta = self.report_.delta
            needed = next(
                (k for k in range(n_rel + 1) if clopper_pearson_lower(k, n_rel, delta) >= t), None
            )
            if needed is None:
                raise CalibrationError(
                    f"the {100 * (1 - delta):.0f} % lower bound cannot reach {t} with "
                    f"{n_rel} relevant snippets (at most {clopper_pearson_lower(n_rel, n_rel, delta):.4f})."
                )
        else:
            needed = math.ceil(t * n_rel - 1e-9)
        reach = np.flatnonzero(self._curve_hits >= needed)
        if reach.size == 0:
            best = int(self._curve_hits.max()) if self._curve_hits.size else 0
            raise CalibrationError(
                f"no budget reaches coverage {t} on calibration data: at most {best}/{n_rel} "
                f"relevant snippets pass threshold {self.report_.threshold:g}."
            )
        return int(self._curve_budgets[reach[0]])

    def select(
        self, scores: Any, lengths_or_texts: Any, *, threshold: float = math.inf
    ) -> np.ndarray:
        """Keep-mask for one query under this calibrator's budget and unit.

        Does not need ``fit``. ``lengths_or_texts`` are sizes in ``unit`` or the
        snippet texts; see :func:`select_within_budget`.
        """
        self._check_params()
        s = check_scores(scores)
        ln = self._lengths(lengths_or_texts, s.size)
        t = min(_check_threshold(threshold), self._cap())
        return select_within_budget(s, ln, int(self.budget), threshold=t)

    def predict(self, scores: Any, *, query_ids: Any = None, groups: Any = None,
                lengths: Any = None) -> np.ndarray:
        """Keep-mask: per query, the best snippets that fit the budget (and the threshold).

        The budget is a parameter, not learned, but ``fit`` is still required (as for every
        mode) so that a deployed budget always carries its measured coverage; use
        :meth:`select` or :func:`select_within_budget` for a budget without calibration data.
        """
        self._check_fitted()
        self._check_params()
        s = check_scores(scores)
        q = check_codes(query_ids, s.size, "query_ids", mode=self.mode)
        ln = self._lengths(lengths, s.size)
        eligible = s <= self._cap()
        order = np.lexsort((np.arange(s.size), s, q))
        starts = np.r_[0, np.flatnonzero(np.diff(q[order]) != 0) + 1, s.size]
        kept = np.zeros(s.size, dtype=bool)
        for a, b in itertools.pairwise(starts):
            idx = order[a:b]
            kept[idx] = _greedy(np.arange(idx.size), ln[idx], eligible[idx], int(self.budget))
        return kept

    def _check_fitted(self) -> None:
        if not hasattr(self, "report_"):
            from ..errors import NotFittedError

            raise NotFittedError(
                "this BudgetCalibrator is not fitted yet; call fit(scores, relevant, "
                "query_ids=..., lengths=...) first."
            )

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        n = nouns(unit)
        r = self.report_
        return Guarantee(
            mode=self.mode, metric="coverage", target=r.target,
            alpha=None if r.target is None else 1.0 - r.target,
            statement=(f"keeps the best {n.plural} within {r.budget:,} {r.unit} per query; an "
                       f"estimate, not a guarantee: {r.summary(unit)}"),
            n_calibration=r.n_relevant, n_required=None, infinite=False,
            details={"budget": r.budget, "unit": r.unit, "coverage": r.coverage,
                     "coverage_lower": r.coverage_lower, "delta": r.delta,
                     "meets_target": r.meets_target, "bound": r.bound},
        )

    def _state(self) -> dict[str, Any]:
        report = {k: _json_float(v) if isinstance(v, float) else v
                  for k, v in dataclasses.asdict(self.report_).items()}
        return {"report": report, "n_calibration": self.n_calibration_,
                "curve_budgets": self._curve_budgets.tolist(),
                "curve_hits": self._curve_hits.tolist()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._check_params()
        raw = dict(state["report"])
        for key in ("coverage", "coverage_lower", "query_coverage", "removal", "delta"):
            raw[key] = _read_float(raw, key, allow_inf=False)
        raw["threshold"] = _read_float(raw, "threshold")
        try:
            self.report_ = BudgetReport(**raw)
        except TypeError as exc:
            raise ArtifactError(f"malformed budget report in calibration state: {exc}") from exc
        if self.report_.budget != self.budget or self.report_.unit != self.unit:
            raise ArtifactError(
                f"budget calibration state is for {self.report_.budget} {self.report_.unit}, "
                f"but the params say {self.budget} {self.unit}."
            )
        n = state["n_calibration"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT:
            raise ArtifactError(f"budget calibration state n_calibration == {n!r:.30}, expected "
                                f"an int in [1, {MAX_COUNT}].")
        for key in ("n_relevant", "n_queries"):  # n_relevant sizes a loop of budget_for
            value = getattr(self.report_, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= n:
                raise ArtifactError(f"budget calibration report {key} == {value!r:.30}, expected "
                                    f"an int in [0, {n}] (its n_calibration).")
        self.n_calibration_ = n
        self._curve_budgets = np.asarray(state["curve_budgets"], dtype=np.int64)
        self._curve_hits = np.asarray(state["curve_hits"], dtype=np.int64)
        self.threshold_ = self._cap()
        self.infinite_ = False
