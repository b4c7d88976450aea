"""HTML reports you can look at: one self-contained page per run.

:func:`build_report` shows what a saved filter does to a data file (``ragsieve report``):
the guarantee in plain words, the keep rule in the score's own units, coverage and removal
with bootstrap intervals when the data has labels, the trade-off figure (one image per
panel, each at a size whose text reads without zooming), and per query the kept and removed
snippets with their scores against the threshold (the queries that lost a relevant snippet
first; the first few open, the others one line each). For a filter of unit
``"sentence"`` the measures are of evidence sentences, sentences and characters (beside the
snippet view), and each listed snippet shows its sentences, kept or removed.
:func:`evaluation_page` and :func:`answers_page` are the pages of ``evaluate --html`` and
``answers --html``. All pages share the skeleton of :mod:`ragsieve.evaluation._html`: no
network, no script, every text escaped.

The DOM carries stable hooks for tests and users: ``<p class="threshold"
data-threshold=...>``, ``<section class="query" data-query-id=... data-threshold=...
data-missed=...>`` (class ``query miss`` when the filter removed a relevant snippet, unit
sentence an evidence sentence; ``data-missed`` says how many) holding a ``<details>``
with ``<ul class="kept">`` and ``<ul class="removed">`` of ``<li data-snippet-id=...
data-score=... data-label=...>`` (``data-score`` is the filter's score, lower = keep, as
``FilterResult`` gives it; ``data-value`` the same in the score's own units). Unit
``"sentence"``: each such ``<li class="sentences">`` (its score the best sentence's) holds
``<span class="sentence kept|removed" data-start=... data-end=... data-score=... data-value=...
data-label=...>`` per sentence, offsets in the snippet text, label ``evidence``, ``not
evidence`` or ``unknown``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_text
from .._validation import check_int, first_appearance_codes
from ..artifact import spec_model
from ..errors import DataError
from ..keeping import p_value_rule
from ..types import FilterResult, Pair, Scored
from ..units import sentence_pairs
from ._html import esc, fmt, page, panel_figures, table
from .table import answer_header

__all__ = [
    "DEFAULT_MAX_QUERIES",
    "DEFAULT_OPEN_QUERIES",
    "DEFAULT_REPORT_ALPHAS",
    "Interval",
    "ReportSettings",
    "answers_page",
    "build_report",
    "cluster_interval",
    "evaluation_page",
    "write_report",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUERIES = 50
"""Queries listed one by one on a report page (the figures use every query)."""

DEFAULT_OPEN_QUERIES = 3
"""Queries of a report page's list shown open (the misses come first); every other query is
one line that opens with a click."""

DEFAULT_REPORT_ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.4)
"""Alphas of the report's trade-off figure (the filter's own alpha is added)."""

_NEEDS = ("It needs the new queries and snippets to be exchangeable with the calibration "
          "data: drawn from the same kind of queries, documents and retriever. Under a shift "
          "(another language, domain or retriever) it no longer holds; recalibrate on "
          "labelled pairs of the new traffic.")


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval of a pooled share, resampling whole clusters (topics or queries).

    Attributes
    ----------
    estimate, low, high : float
        The share on the data and the interval's ends (NaN when it cannot be computed).
    unit : str
        What was resampled: ``"topics"`` or ``"queries"``.
    n_units : int
        How many of them the data holds.
    confidence : float
        Nominal level, e.g. 0.95.
    """

    estimate: float
    low: float
    high: float
    unit: str
    n_units: int
    confidence: float

    def __str__(self) -> str:
        if not math.isfinite(self.low):
            return f"{self.estimate:.3f}"
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


def cluster_interval(numerator: np.ndarray, denominator: np.ndarray, cluster: np.ndarray, *,
                     unit: str, confidence: float = 0.95, n_resamples: int = 2000,
                     seed: int = 0) -> Interval:
    """Percentile bootstrap interval of ``sum(numerator) / sum(denominator)`` over clusters.

    Whole clusters are drawn with replacement, so pairs of one topic (or query), which are
    not independent of each other, stay together.

    Parameters
    ----------
    numerator, denominator : numpy.ndarray
        Per-pair counts, e.g. kept-and-relevant and relevant for coverage.
    cluster : numpy.ndarray of int
        Cluster index of each pair.
    unit : str
        Name of the clusters for the page (``"topics"``, ``"queries"``).
    confidence : float
        Level of the interval.
    n_resamples : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling.
    """
    ids, inverse = np.unique(cluster, return_inverse=True)
    num = np.bincount(inverse, weights=numerator.astype(float), minlength=ids.size)
    den = np.bincount(inverse, weights=denominator.astype(float), minlength=ids.size)
    total = den.sum()
    estimate = float(num.sum() / total) if total else float("nan")
    if ids.size < 2 or not total:
        return Interval(estimate, float("nan"), float("nan"), unit, int(ids.size), confidence)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, ids.size, size=(n_resamples, ids.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = num[draws].sum(axis=1) / den[draws].sum(axis=1)
    shares = shares[np.isfinite(shares)]
    if not shares.size:
        return Interval(estimate, float("nan"), float("nan"), unit, int(ids.size), confidence)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(shares, [tail, 1.0 - tail])
    return Interval(estimate, float(low), float(high), unit, int(ids.size), confidence)


def _number(x: float) -> str:
    """A score or threshold for the page: 4 significant digits, ``inf`` spelled out."""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def _in_units(scorer: Any, x: float) -> float:
    """A score of the filter (lower = keep) in the score's own units (see ``keep_rule``)."""
    return float(scorer.keep_rule(x).threshold)


_MISSED = {"<=": ">", ">=": "<", "<": ">=", ">": "<="}


def _facts(rows: Sequence[tuple[str, Any]]) -> str:
    return "<dl class=\"facts\">" + "".join(
        f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows) + "</dl>"


def _guarantee_block(flt: Any) -> str:
    g = flt.guarantee()
    parts = [(f"<p class=\"guarantee\" data-mode=\"{esc(flt.mode)}\"><strong>Guarantee "
              f"({esc(flt.mode)}):</strong> {esc(g['statement'])}.</p>")]
    extra = []
    if g.get("unit") == "sentence":
        extra.append("The calibrated units are the sentences of the snippets, the relevant ones "
                     "the evidence sentences of relevant snippets: each sentence is scored and "
                     "kept on its own, and a snippet is passed on as its kept sentences.")
    if g.get("infinite"):
        extra.append(f"The calibration set was too small for this alpha ({g.get('n_calibration')} "
                     f"points, {g.get('n_required')} needed): the filter keeps everything.")
    band = g.get("coverage_band")
    if band:
        extra.append(f"With {g.get('n_calibration')} calibration points the coverage over new "
                     f"data lies in [{band[0]:.3f}, {band[1]:.3f}] on average over calibration "
                     "sets.")
    note = (g.get("details") or {}).get("note")
    if note:
        extra.append(str(note))
    extra.append(_NEEDS)
    parts.append("<p class=\"needs\">" + esc(" ".join(extra)) + "</p>")
    return "\n".join(parts)


def _label(pair: Pair | None) -> str:
    if pair is None or pair.relevant is None:
        return "unknown"
    return "relevant" if pair.relevant == 1 else "not relevant"


_SENTENCE_LABELS = {1: "evidence", 0: "not evidence", None: "unknown"}
"""A sentence's label on the page (``sentence_pairs``' 1, 0 and None)."""


def _compare(flt: Any, rule_op: str, score: float, threshold: float,
             kept: bool) -> tuple[float, str]:
    """A filter score in the score's own units and, as the page shows it, against the threshold
    (``0.422 <= 0.527`` when kept, ``0.648 > 0.527`` when not)."""
    value = _in_units(flt.scorer_, score)
    tau = _in_units(flt.scorer_, threshold)
    op = rule_op if kept else _MISSED.get(rule_op, "vs")
    return value, f"{_number(value)} {op} {_number(tau)}"


def _score_cell(score: float, value: float, compare: str,
                p_value: float | None = None) -> tuple[str, str]:
    """A snippet's (or a sentence's) score on the page: the attributes of its element (the
    filter's score, lower = keep, the same in the score's units, its p-value) and its
    visible cells (the score against the threshold; ``p 0.412``, the share of the
    calibration evidence that scored no better)."""
    attributes = f" data-score=\"{esc(repr(score))}\" data-value=\"{esc(repr(value))}\""
    cell = f"<span class=\"score\">{esc(compare)}</span>"
    if p_value is not None:
        attributes += f" data-p-value=\"{esc(repr(p_value))}\""
        cell += (f"<span class=\"p-value\" title=\"conformal p-value: the share of the "
                 f"calibration evidence that scored no better\">p {p_value:.3f}</span>")
    return attributes, cell


def _snippet_li(scored: Scored, flt: Any, rule_op: str, threshold: float, kept: bool,
                pair: Pair | None, sentences: str | None = None) -> str:
    """One snippet of a kept or removed list: its score against the threshold, its label, its
    id and its text, or (unit sentence) ``sentences``, its sentences' HTML, with the score
    of its best sentence."""
    value, compare = _compare(flt, rule_op, scored.score, threshold, kept)
    label = _label(pair)
    if sentences is None:
        klass, content = "", f"<span class=\"text\">{esc(scored.text)}</span>"
    else:
        klass, compare, content = " class=\"sentences\"", f"best sentence {compare}", sentences
    attributes, cell = _score_cell(scored.score, value, compare, scored.p_value)
    return (f"<li{klass} data-snippet-id=\"{esc(scored.snippet_id)}\"{attributes} "
            f"data-label=\"{esc(label)}\">{cell}"
            f"<span class=\"label\">{esc(label)}</span>"
            f"<span class=\"id muted\">{esc(scored.snippet_id)}</span> {content}</li>")


def _sentence_span(text: str, sentence: tuple[int, int, int, float, bool], label: int | None,
                   flt: Any, rule_op: str, threshold: float,
                   p_value: float | None = None) -> str:
    """One sentence of a snippet (a ``FilterResult.sentences`` record): kept or removed, its
    score against the threshold, its evidence label, its text."""
    _, start, end, score, kept = sentence
    value, compare = _compare(flt, rule_op, score, threshold, kept)
    name = _SENTENCE_LABELS[label]
    attributes, cell = _score_cell(score, value, compare, p_value)
    return (f"<span class=\"sentence {'kept' if kept else 'removed'}\" data-start=\"{start}\" "
            f"data-end=\"{end}\"{attributes} data-label=\"{esc(name)}\">{cell}"
            f"<span class=\"label\">{esc(name)}</span>"
            f"<span class=\"text\">{esc(text[start:end])}</span></span>")


@dataclass(frozen=True)
class _Labels:
    """The data's labels as the per-query list reads them.

    Attributes
    ----------
    snippets : mapping
        ``(query id, snippet id) -> Pair``.
    sentences : mapping
        Unit sentence: ``(query id, snippet position, sentence start) -> 1, 0 or None``
        (empty when the data's evidence sentences cannot be told apart).
    """

    snippets: Mapping[tuple[str, str], Pair]
    sentences: Mapping[tuple[str, int, int], int | None]

    def missed(self, qid: str, result: FilterResult) -> int:
        """How many relevant units the filter removed from the query: evidence sentences
        (unit sentence, when the data tells them apart), else relevant snippets."""
        if result.unit == "sentence" and self.sentences:
            return sum(1 for i, start, _, _, kept in result.sentences
                       if not kept and self.sentences.get((qid, i, start)) == 1)
        pairs = (self.snippets.get((qid, s.snippet_id)) for s in result.removed)
        return sum(1 for p in pairs if p is not None and p.relevant == 1)


def _query_lists(qid: str, result: FilterResult, flt: Any, rule_op: str,
                 labels: _Labels) -> tuple[str, str]:
    """A query's kept and removed ``<li>`` items; unit sentence: each with its sentences."""
    by_snippet: dict[int, list[tuple[int, int, int, float, bool]]] = {}
    for sentence in result.sentences:
        by_snippet.setdefault(sentence[0], []).append(sentence)
    sentence_p = {(x[0], x[1]): p for x, p in zip(result.sentences, result.sentence_p_values,
                                                   strict=False)}

    def li(s: Scored, kept: bool) -> str:
        pair = labels.snippets.get((qid, s.snippet_id))
        if result.unit != "sentence":
            return _snippet_li(s, flt, rule_op, result.threshold, kept, pair)
        spans = "".join(_sentence_span(s.text, x, labels.sentences.get((qid, s.index, x[1])),
                                       flt, rule_op, result.threshold,
                                       sentence_p.get((x[0], x[1])))
                        for x in by_snippet.get(s.index, ()))
        return _snippet_li(s, flt, rule_op, result.threshold, kept, pair,
                           spans or "<span class=\"muted\">no sentence (blank text)</span>")

    def items(scored: Sequence[Scored], kept: bool) -> str:
        return "".join(li(s, kept) for s in scored) or "<li class=\"none muted\">none</li>"

    return items(result.kept, True), items(result.removed, False)


def _query_section(qid: str, result: FilterResult, flt: Any, rule_op: str, labels: _Labels,
                   *, missed: int, opened: bool) -> str:
    """A query as a ``<details>``: one line (the query, what the filter missed, the counts)
    that opens onto its kept and removed snippets."""
    kept, removed = _query_lists(qid, result, flt, rule_op, labels)
    note = f"<p class=\"note\">{esc(result.note)}</p>" if result.note else ""
    counts = f"kept {len(result.kept)} of {result.n_input} (removed {result.removal:.0%})"
    heads = ("kept", "removed")
    what = "relevant snippet"
    if result.unit == "sentence":
        n_kept = sum(s[4] for s in result.sentences)
        n_all = len(result.sentences)
        counts = (f"snippets {counts}; sentences kept {n_kept} of {n_all} (removed "
                  f"{1 - n_kept / n_all if n_all else 0.0:.0%})")
        heads = ("kept (snippets with a kept sentence)", "removed (no sentence kept)")
        what = "evidence sentence" if labels.sentences else what
    flag = (f"<span class=\"missed\">{missed} {what}{'s' if missed > 1 else ''} removed</span>"
            if missed else "")
    return (f"<section class=\"query{' miss' if missed else ''}\" data-query-id=\"{esc(qid)}\" "
            f"data-threshold=\"{esc(repr(result.threshold))}\" data-missed=\"{missed}\">"
            f"<details{' open' if opened else ''}><summary><h3>{esc(result.query)}</h3>{flag}"
            f"<span class=\"muted\">{esc(qid)}: {counts}</span></summary>{note}"
            f"<h4>{heads[0]}</h4><ul class=\"kept\">{kept}</ul>"
            f"<h4>{heads[1]}</h4><ul class=\"removed\">{removed}</ul></details></section>")


def _positions(pairs: Sequence[Pair]) -> list[int]:
    """Each pair's position in its query's list (the ``Scored.index`` the filter gives it)."""
    by_query: dict[str, int] = {}
    out = []
    for p in pairs:
        k = by_query.get(p.query_id, 0)
        out.append(k)
        by_query[p.query_id] = k + 1
    return out


def _aligned(pairs: Sequence[Pair], results: Mapping[str, FilterResult]) -> np.ndarray:
    """Each pair's score as the filter gave it (the lowest of its pieces' scores)."""
    return np.array([results[p.query_id].scores[k] for p, k in zip(pairs, _positions(pairs),
                                                                    strict=True)], dtype=float)


def _kept_mask(pairs: Sequence[Pair], results: Mapping[str, FilterResult]) -> np.ndarray:
    kept_index = {qid: {s.index for s in r.kept} for qid, r in results.items()}
    return np.array([k in kept_index[p.query_id] for p, k in zip(pairs, _positions(pairs),
                                                                  strict=True)], dtype=bool)


@dataclass(frozen=True)
class _Sentences:
    """Every sentence a filter of unit ``"sentence"`` scored on the data, with its label.

    Attributes
    ----------
    parent : numpy.ndarray of int
        Index in the pairs of each sentence's snippet.
    kept : numpy.ndarray of bool
        Kept by the filter.
    label : numpy.ndarray of int
        Each sentence's evidence label: 1, 0, or -1 when it has none (an unlabelled
        snippet, or ``error``).
    chars : numpy.ndarray of int
        Characters of each sentence.
    labels : mapping
        ``(query id, snippet position, sentence start) -> 1, 0 or None``.
    error : str or None
        Why the data's evidence sentences cannot be told apart (then every label is None).
    """

    parent: np.ndarray
    kept: np.ndarray
    label: np.ndarray
    chars: np.ndarray
    labels: Mapping[tuple[str, int, int], int | None]
    error: str | None

    @property
    def labelled(self) -> np.ndarray:
        """The sentences with a label."""
        return self.label >= 0

    @property
    def evidence(self) -> np.ndarray:
        """The evidence sentences (label 1)."""
        return self.label == 1


def _sentence_labels(pairs: Sequence[Pair], max_chars: int
                     ) -> tuple[dict[tuple[str, int, int], int | None], str | None]:
    """Evidence labels of every sentence (:func:`ragsieve.units.sentence_pairs`, cut at the
    filter's ``max_chars`` as the filter cuts), or none and the reason when the data cannot
    give them."""
    try:
        found = sentence_pairs(pairs, max_chars=max_chars)
    except DataError as exc:
        return {}, str(exc)
    return {(p.query_id, p.meta["parent_position"], p.meta["sentence_start"]): p.relevant
            for p in found}, None


def _sentences(pairs: Sequence[Pair], results: Mapping[str, FilterResult],
               max_chars: int) -> _Sentences:
    """The sentences of ``results`` (unit ``"sentence"``) aligned with ``pairs``."""
    labels, error = _sentence_labels(pairs, max_chars)
    index = {(p.query_id, k): i for i, (p, k) in enumerate(zip(pairs, _positions(pairs),
                                                              strict=True))}

    def label_of(qid: str, snippet: int, start: int) -> int:
        if error is not None:
            return -1
        try:
            found = labels[(qid, snippet, start)]
        except KeyError:  # the same splitter cut both: only results of other pairs get here
            raise ValueError(f"query {qid!r}: the filter's sentence at {start} of snippet "
                             f"{snippet} is none of the data's sentences; the results are "
                             "not those of these pairs.") from None
        return -1 if found is None else int(found)

    rows = [(index[(qid, s[0])], s[2] - s[1], s[4], label_of(qid, s[0], s[1]))
            for qid, r in results.items() for s in r.sentences]
    return _Sentences(parent=np.array([row[0] for row in rows], dtype=int),
                      kept=np.array([row[2] for row in rows], dtype=bool),
                      label=np.array([row[3] for row in rows], dtype=int),
                      chars=np.array([row[1] for row in rows], dtype=int),
                      labels=labels, error=error)



@dataclass(frozen=True)
class _Resampling:
    """The bootstrap of a page's intervals (see :func:`cluster_interval`)."""

    confidence: float
    n_resamples: int
    seed: int

    def interval(self, numerator: np.ndarray, denominator: np.ndarray, cluster: np.ndarray,
                 unit: str) -> Interval:
        return cluster_interval(numerator, denominator, cluster, unit=unit,
                                confidence=self.confidence, n_resamples=self.n_resamples,
                                seed=self.seed)


def _clusters(pairs: Sequence[Pair], rel: np.ndarray) -> tuple[str, np.ndarray]:
    """What the intervals resample: topics when at least two hold a relevant snippet, else
    queries; and each pair's cluster."""
    groups = first_appearance_codes([p.group for p in pairs])
    if np.unique(groups[rel]).size >= 2:
        return "topics", groups
    return "queries", first_appearance_codes([p.query_id for p in pairs])


def _measures(rows: Sequence[tuple[str, Interval]], resampling: _Resampling) -> str:
    """The table of measures with their intervals."""
    return table(["measure", "on this data", f"{resampling.confidence:.0%} interval"],
                 [(name, f"{iv.estimate:.3f}",
                   "-" if not math.isfinite(iv.low) else f"[{iv.low:.3f}, {iv.high:.3f}]")
                  for name, iv in rows], cls="metrics")


def _intervals_note(unit: str, n_units: int, holding: str, counts: str,
                    resampling: _Resampling) -> str:
    """The line under the table: what the intervals resample, and the labels they rest on."""
    return (f"<p class=\"muted interval-unit\" data-unit=\"{unit}\">Intervals: percentile "
            f"bootstrap over {unit} ({n_units} {unit} hold {holding}; "
            f"{resampling.n_resamples} resamples of whole {unit}, seed {resampling.seed}). "
            f"{counts}. If this data is the calibration data, these figures are in-sample.</p>")


def _metrics_block(pairs: Sequence[Pair], keep: np.ndarray, resampling: _Resampling) -> str:
    """Coverage of relevant snippets and removal, unit snippet."""
    labelled = np.array([p.relevant is not None for p in pairs], dtype=bool)
    if not labelled.any():
        return ("<h2>Coverage and removal</h2><p class=\"metrics none\">The data has no labels "
                "(no <code>relevant</code> field): coverage cannot be measured. Removal on "
                f"this data: {1 - keep.mean():.3f} of the snippets.</p>") if keep.size else ""
    rel = np.array([p.relevant == 1 for p in pairs], dtype=bool)
    unit, cluster = _clusters(pairs, rel)
    cov = resampling.interval((keep & rel)[labelled], rel[labelled], cluster[labelled], unit)
    rem = resampling.interval(~keep, np.ones(keep.size), cluster, unit)
    chars = np.array([len(p.text) for p in pairs], dtype=float)
    rem_chars = resampling.interval(np.where(keep, 0.0, chars), chars, cluster, unit)
    rows = [("coverage (relevant snippets kept)", cov), ("removal (snippets removed)", rem),
            ("removal of characters", rem_chars)]
    unlabelled = int((~labelled).sum())
    counts = (f"{int(rel.sum())} relevant of {int(labelled.sum())} labelled snippets"
              + (f"; {unlabelled} unlabelled snippets count for removal only" if unlabelled else ""))
    return ("<h2>Coverage and removal</h2>" + _measures(rows, resampling)
            + _intervals_note(unit, cov.n_units, "relevant snippets", counts, resampling))


_CHARS = ("characters removed = 1 - (characters of the kept sentences) / (characters of all "
          "snippets): the whitespace between sentences counts as removed")


def _sentence_metrics_block(pairs: Sequence[Pair], keep: np.ndarray, sentences: _Sentences,
                            resampling: _Resampling) -> str:
    """Coverage of evidence sentences and removal of sentences and characters, unit sentence;
    the snippet view beside them."""
    head = "<h2>Coverage and removal (unit sentence)</h2>"
    chars = np.array([len(p.text) for p in pairs], dtype=float)
    kept_chars = np.bincount(sentences.parent, weights=sentences.chars * sentences.kept,
                             minlength=len(pairs))
    labelled = np.array([p.relevant is not None for p in pairs], dtype=bool)
    if not labelled.any():
        removed = 1 - sentences.kept.mean() if sentences.kept.size else 0.0
        chars_removed = 1 - kept_chars.sum() / chars.sum() if chars.sum() else 0.0
        return head + ("<p class=\"metrics none\">The data has no labels (no <code>relevant"
                       "</code> field): coverage cannot be measured. Removal on this data: "
                       f"{removed:.3f} of the sentences and {chars_removed:.3f} "
                       f"of the characters ({_CHARS}); {1 - keep.mean():.3f} of the snippets "
                       "have no kept sentence.</p>")
    rel = np.array([p.relevant == 1 for p in pairs], dtype=bool)
    unit, cluster = _clusters(pairs, rel)
    s_cluster, s_lab, ev = cluster[sentences.parent], sentences.labelled, sentences.evidence
    rows = [] if sentences.error else [("coverage of evidence sentences (evidence sentences kept)",
                                        resampling.interval((sentences.kept & ev)[s_lab], ev[s_lab],
                                                            s_cluster[s_lab], unit))]
    rows += [
        ("removal (sentences removed)",
         resampling.interval(~sentences.kept, np.ones(sentences.kept.size), s_cluster, unit)),
        ("removal of characters (kept sentences against all snippet characters)",
         resampling.interval(chars - kept_chars, chars, cluster, unit)),
        ("snippet view: relevant snippets with at least one kept sentence",
         resampling.interval((keep & rel)[labelled], rel[labelled], cluster[labelled], unit)),
        ("snippet view: snippets with no kept sentence",
         resampling.interval(~keep, np.ones(keep.size), cluster, unit)),
    ]
    unlabelled = int((~labelled).sum())
    counts = ((f"{int(ev.sum())} evidence sentences of {int(s_lab.sum())} labelled sentences, "
               if not sentences.error else "")
              + f"in {int(rel.sum())} relevant of {int(labelled.sum())} labelled snippets"
              + (f"; {unlabelled} unlabelled snippets ({int((~s_lab).sum())} sentences) count "
                 "for removal only" if unlabelled else "") + f"; {_CHARS}")
    missing = ("" if not sentences.error else "<p class=\"metrics note\">Coverage of evidence "
               f"sentences not measured: {esc(sentences.error)}</p>")
    holding = "relevant snippets" + ("" if sentences.error else " and evidence sentences")
    return (head + _measures(rows, resampling) + missing
            + _intervals_note(unit, int(np.unique(cluster[rel]).size), holding, counts,
                              resampling))


_SENTENCE_TRADEOFF = (
    "<p class=\"figure none\" data-reason=\"unit\">Not drawn for a filter of unit sentence: "
    "the figure recalibrates the score on this data's snippets and their labels, which is not "
    "what this filter does (it scores and keeps sentences, calibrated on evidence sentences), "
    "and its axes speak of snippets. <code>ragsieve evaluate --data DATA --unit sentence</code> "
    "measures coverage of evidence sentences and removal against alpha on held-out topics.</p>")


def _tradeoff_block(flt: Any, pairs: Sequence[Pair], results: Mapping[str, FilterResult], *,
                    alphas: Sequence[float], n_splits: int, seed: int) -> str:
    """Coverage and removal against alpha for the filter's score, on topic-disjoint splits
    of this data (its scores are computed once, by the filter; no model call here).
    Unit sentence: a line that says why it is not drawn."""
    from .._optional import require
    from ..calibration.modes import CALIBRATORS
    from .plots import report_panels
    from .sweep import ScoredData, evaluate_scores

    head = "<h2>Trade-off: coverage and removal against alpha</h2>"
    if flt.unit == "sentence":
        return head + _SENTENCE_TRADEOFF
    scores = _aligned(pairs, results)
    labelled = [i for i, p in enumerate(pairs) if p.relevant is not None]
    lab_pairs = [pairs[i] for i in labelled]
    n_groups = len({p.group for p in lab_pairs if p.relevant == 1})
    if n_groups < 2:
        return head + ("<p class=\"figure none\">Not drawn: it needs labelled data of at least "
                       f"two topics (groups); this data has {n_groups}.</p>")
    mode = flt.mode
    kind = CALIBRATORS[mode]
    if mode in ("budget", "adaptive") or kind.group_kind == "attribute":
        mode = "marginal"
    grid = sorted({*(float(a) for a in alphas), *([flt.alpha] if flt.alpha else [])})
    try:
        require("matplotlib", "plot")
        report = evaluate_scores(ScoredData.from_pairs(lab_pairs, scores[labelled]),
                                 alphas=tuple(grid), thetas=(), modes=(mode,), n_splits=n_splits,
                                 seed=seed, calibrated_baselines=False)
        panels = report_panels({flt.scorer_.name: report})
    except ImportError as exc:
        return head + f"<p class=\"figure none\">Not drawn: {esc(exc)}</p>"
    except ValueError as exc:  # e.g. too few topics for the splits asked for
        return head + f"<p class=\"figure none\">Not drawn: {esc(exc)}</p>"
    caption = (f"Mode {mode}, the filter's score ({flt.scorer_.name}), alphas "
               f"{', '.join(f'{a:g}' for a in grid)}: each of {report.n_splits} topic-disjoint "
               f"splits of this data calibrates on half of its {report.n_groups} topics and "
               "measures on the other half (the scores are the filter's own, computed once; "
               "top-k baselines for comparison).")
    return head + panel_figures(panels, caption)


def _fact_rows(flt: Any, rule: Any, pairs: Sequence[Pair], results: Mapping[str, FilterResult],
               keep: np.ndarray, sentences: _Sentences | None, data_name: str,
               filter_name: str) -> list[tuple[str, Any]]:
    """The page's facts: keep rule, mode, alpha, score, model, files, what was kept, the
    calibration lists and how many of these lists are unlike them."""
    direction = "higher" if rule.keep_if == ">=" else "lower"
    n_kept = int(keep.sum())
    data = f"{data_name or '-'}: {len(results)} queries, {len(pairs)} snippets"
    kept = f"{n_kept} of {len(pairs)} snippets (removed {1 - n_kept / len(pairs):.1%})"
    unit: list[tuple[str, Any]] = []
    if sentences is not None:
        n_sent, s_kept = sentences.kept.size, int(sentences.kept.sum())
        unit = [("unit", "sentence (each snippet's sentences scored and kept on their own)")]
        data += f", {n_sent} sentences"
        kept = (f"{s_kept} of {n_sent} sentences (removed "
                f"{1 - s_kept / n_sent if n_sent else 0.0:.1%}), in {n_kept} of {len(pairs)} "
                "snippets")
    return [
        ("keep rule", str(rule) if math.isfinite(flt.threshold) else "keep everything (threshold +inf)"),
        *([("p-value", p_value_rule(flt.calibrator_))] if flt.evidence is not None else []),
        ("mode", flt.mode),
        *unit,
        ("alpha", fmt(flt.alpha, 3) if flt.alpha is not None else "-"),
        ("score", f"{flt.scorer_.name} ({rule.score}; {direction} is more relevant)"),
        ("model", spec_model(flt.scorer_.spec()) or "-"),
        ("filter", filter_name or "-"),
        ("data", data),
        ("kept on this data", kept),
        *_lists_rows(flt, results),
    ]


def _lists_rows(flt: Any, results: Mapping[str, FilterResult]) -> list[tuple[str, Any]]:
    """The calibration lists and, for a list-aware score, how many of these lists are unlike
    them (docs/deploy.md); nothing for an artifact without the record."""
    if flt.lists is None:
        return []
    rows: list[tuple[str, Any]] = [("calibration lists", flt.lists.describe())]
    if flt.lists.list_dependent:
        unlike = [r for r in results.values() if r.lists_unlike]
        note = f": {unlike[0].lists_note}" if unlike else ""
        rows.append(("lists unlike them", f"{len(unlike)} of {len(results)}{note}"))
    return rows


def _threshold_line(flt: Any, rule: Any) -> str:
    what = "each sentence's" if flt.unit == "sentence" else "each snippet's"
    return (f"<p class=\"threshold\" data-threshold=\"{esc(repr(flt.threshold))}\" "
            f"data-value=\"{esc(repr(_in_units(flt.scorer_, flt.threshold)))}\" "
            f"data-keep-if=\"{esc(rule.keep_if)}\">"
            f"<strong>{esc(rule if math.isfinite(flt.threshold) else 'keep everything')}</strong> "
            f"({what} score against the calibrated threshold)</p>")


_LEGEND = {
    "snippet": ("Kept snippets are green, removed ones red; each shows its score against the "
                "threshold in the score's units and its label when the data has one."),
    "sentence": ("Snippets with at least one kept sentence are under kept, the others under "
                 "removed, each with its label and its best sentence's score; within each "
                 "snippet every sentence shows its score against the threshold in the score's "
                 "units and its evidence label when the data has one, kept sentences green and "
                 "removed ones red."),
}


def _per_query(flt: Any, rule: Any, pairs: Sequence[Pair], results: Mapping[str, FilterResult],
               max_queries: int, open_queries: int, sentences: _Sentences | None) -> list[str]:
    """The list of queries, one section each: those the filter missed a relevant unit of
    first, the rest in data order; the first ``max_queries`` of them, the first
    ``open_queries`` open."""
    labels = _Labels({(p.query_id, p.snippet_id): p for p in pairs},
                     sentences.labels if sentences is not None else {})
    missed = {qid: labels.missed(qid, r) for qid, r in results.items()}
    shown = sorted(results, key=lambda qid: missed[qid] == 0)[:max_queries]  # stable
    left = len(results) - len(shown)
    n_missed = sum(1 for n in missed.values() if n)
    intro = (f"<h2>Per query</h2><p class=\"queries-shown\" data-shown=\"{len(shown)}\" "
             f"data-left-out=\"{left}\" data-missed=\"{n_missed}\" "
             f"data-open=\"{min(open_queries, len(shown))}\">{len(shown)} of {len(results)} "
             "queries shown" + (f"; {left} left out (raise --max-queries to see them)" if left else "")
             + f". {_order_line(flt, pairs, n_missed, open_queries)} {_LEGEND[flt.unit]}</p>")
    return [intro, *(_query_section(qid, results[qid], flt, rule.keep_if, labels,
                                    missed=missed[qid], opened=i < open_queries)
                     for i, qid in enumerate(shown))]


def _order_line(flt: Any, pairs: Sequence[Pair], n_missed: int, open_queries: int) -> str:
    """How the list is ordered and which of its queries are open, in words."""
    what = "an evidence sentence" if flt.unit == "sentence" else "a relevant snippet"
    if not any(p.relevant is not None for p in pairs):
        order = "The data has no labels: the queries are in data order."
    elif not n_missed:
        order = f"No query lost {what} to the filter: the queries are in data order."
    else:
        order = (f"{n_missed} lost {what} to the filter: they come first, marked in red; the "
                 "others follow in data order.")
    opened = (f"The first {open_queries} are open; click a query to open or close it."
              if open_queries else "Click a query to open it.")
    return f"{order} {opened}"


@dataclass(frozen=True)
class ReportSettings:
    """What a report page names, lists and measures (``ragsieve report``'s options).

    Attributes
    ----------
    data_name, filter_name : str
        Shown as where the data and the filter came from.
    max_queries : int
        Queries listed one by one: those the filter removed a relevant snippet of (unit
        sentence: an evidence sentence) first, the others in data order; a line says how
        many are left out.
    open_queries : int
        Queries of the list shown open; the others are one line each (the query, what
        was missed, the counts) that opens with a click.
    alphas : sequence of float
        Alphas of the trade-off figure.
    n_splits : int
        Topic-disjoint splits of the trade-off figure.
    confidence, n_resamples, seed : float, int, int
        The bootstrap intervals of coverage and removal (``seed`` also seeds the splits).
    """

    data_name: str = ""
    filter_name: str = ""
    max_queries: int = DEFAULT_MAX_QUERIES
    open_queries: int = DEFAULT_OPEN_QUERIES
    alphas: Sequence[float] = DEFAULT_REPORT_ALPHAS
    n_splits: int = 10
    confidence: float = 0.95
    n_resamples: int = 2000
    seed: int = 0


def build_report(
    flt: Any,
    pairs: Sequence[Pair],
    settings: ReportSettings = ReportSettings(),
    *,
    progress: bool = False,
    results: Mapping[str, FilterResult] | None = None,
) -> str:
    """The HTML page of what a calibrated filter does to ``pairs``.

    For a filter of unit ``"sentence"`` the measures are of sentences (coverage of evidence
    sentences, labelled by :func:`ragsieve.units.sentence_pairs`, and removal of sentences
    and characters) beside the snippet view, and every listed snippet shows its sentences.

    Parameters
    ----------
    flt : ConformalFilter
        A calibrated filter.
    pairs : sequence of Pair
        The data; labels (``relevant``) are optional and enable coverage and the figure
        (unit ``"sentence"``: ``meta["evidence"]`` spans or the query's ``answers`` tell
        the evidence sentences of a relevant snippet apart).
    settings : ReportSettings
        The names shown, the queries listed and opened, the trade-off figure's alphas
        and splits, and the bootstrap of the intervals.
    progress : bool
        Progress bar while scoring.
    results : mapping, optional
        ``flt.filter_pairs(pairs)`` when the caller has it already.

    Returns
    -------
    str
        The whole page.

    Raises
    ------
    ValueError
        ``pairs`` is empty, ``max_queries`` is not a positive int or ``open_queries`` a
        negative one.
    """
    pairs = list(pairs)
    if not pairs:
        raise ValueError("no pairs to report on: the data is empty.")
    max_queries = check_int(settings.max_queries, "max_queries", min_value=1)
    open_queries = check_int(settings.open_queries, "open_queries", min_value=0)
    data_name, filter_name, seed = settings.data_name, settings.filter_name, settings.seed
    if results is None:
        results = flt.filter_pairs(pairs, progress=progress)
    rule = flt.scorer_.keep_rule(flt.threshold)
    keep = _kept_mask(pairs, results)
    sentences = _sentences(pairs, results, flt.max_chars) if flt.unit == "sentence" else None
    resampling = _Resampling(settings.confidence, settings.n_resamples, seed)
    body = [
        _guarantee_block(flt),
        _threshold_line(flt, rule),
        _facts(_fact_rows(flt, rule, pairs, results, keep, sentences, data_name, filter_name)),
        (_metrics_block(pairs, keep, resampling) if sentences is None
         else _sentence_metrics_block(pairs, keep, sentences, resampling)),
        _tradeoff_block(flt, pairs, results, alphas=settings.alphas, n_splits=settings.n_splits,
                        seed=seed),
        *_per_query(flt, rule, pairs, results, max_queries, open_queries, sentences),
    ]
    title = "ragsieve report" + (f": {data_name}" if data_name else "")
    return page(title, "\n".join(body))


def write_report(text: str, path: str | os.PathLike[str]) -> Path:
    """Write a page with the one writer of finished files
    (:func:`ragsieve._io.atomic_write_text`); returns the path.

    A regular file is replaced atomically (a temporary file, then renamed); a character
    device (``/dev/null``) or a FIFO is written in place and stays what it is.

    Raises
    ------
    ValueError
        ``path`` is a block device or a socket.
    """
    return atomic_write_text(path, text)


def _evaluation_rows(report: Any) -> tuple[list[str], list[list[Any]]]:
    header = ["method", "param", "target", "coverage", "± sd", "q-cov", "q-all", "removed",
              "chars rm", "tau", "guaranteed", "value", "ok"]
    rows = []
    for r in report.results:
        method = r["method"]
        guaranteed, value, ok = "", None, ""
        if method == "conformal":
            param = f"alpha={r['alpha']:g}"
            ok = "yes" if r.get("within_tolerance") else "NO"
            method = "conformal" if r.get("mode", "marginal") == "marginal" else r["mode"]
            guaranteed, value = r.get("guaranteed_metric", ""), r.get("guaranteed_value")
        elif method == "top-k":
            param = f"k={r.get('k')}"
        elif "alpha" in r:  # a baseline chosen on the calibration topics
            param = f"alpha={r['alpha']:g}" + (f" k~{r['k_mean']:.1f}" if "k_mean" in r else "")
        elif method == "budget":
            param, guaranteed = f"chars={r.get('budget')}", "predicted lower"
            value = r.get("predicted_coverage_lower_mean")
        else:  # a fixed cut-off: its keep rule in the score's units, after its quantile
            keep = r.get("keep") or (f"theta={r['theta']:g}" if "theta" in r else "")
            param = keep if r.get("quantile") is None else f"q={r['quantile']:g}: {keep}"
        rows.append([method, param, r.get("target"), r.get("coverage_mean"), r.get("coverage_std"),
                     r.get("query_coverage_mean"), r.get("query_all_kept_mean"),
                     r.get("removal_mean"), r.get("removal_chars_mean"), r.get("threshold_mean"),
                     guaranteed, value, ok])
    return header, rows


def evaluation_page(report: Any, *, title: str = "ragsieve evaluate", label: str = "score",
                    text_table: str | None = None, guarantee: str | None = None) -> str:
    """The page of ``ragsieve evaluate --html``: the figure, the results table, the run.

    Parameters
    ----------
    report : EvaluationReport
        The evaluation.
    title : str
        Page title.
    label : str
        The score's name in the figure's legend.
    text_table : str, optional
        The table as the command printed it (shown as text too).
    guarantee : str, optional
        What the conformal rows promise, in words.
    """
    from .plots import report_panels

    header, rows = _evaluation_rows(report)
    info = report.info
    facts = [("data", info.get("dataset", "-")), ("score", _spec_text(info.get("scorer"))),
             ("queries", report.n_queries), ("snippets", report.n_snippets),
             ("relevant", report.n_relevant), ("topics (groups)", report.n_groups),
             ("splits", (f"{report.n_splits} topic-disjoint, {report.calibration_fraction:g} of "
                         "the topics calibrate, the rest measure"))]
    body = [f"<p class=\"guarantee\">{esc(guarantee or _EVAL_GUARANTEE)}</p>", _facts(facts)]
    body.append(_figure(lambda: report_panels({label: report}),
                        "Coverage and removal of every conformal row against its target, "
                        "and the trade-off beside the baselines, on the same test splits."))
    body.append("<h2>Results</h2>" + table(header, rows, cls="results"))
    body.append(f"<p class=\"muted\">Means over {report.n_splits} splits. ok = the mode's "
                f"guaranteed value >= target - {info.get('tolerance_se', 3):g} standard "
                "errors.</p>")
    return _page(title, body, text_table)


_EVAL_GUARANTEE = ("Each conformal row is a guarantee calibrated on one half of the topics and "
                   "measured on the other: at target 1 - alpha, a relevant snippet of a new "
                   "topic exchangeable with the calibration topics is kept with probability at "
                   "least 1 - alpha (marginal mode; other modes state their own metric in "
                   "'guaranteed').")


def _spec_text(spec: Any) -> str:
    if isinstance(spec, Mapping):
        return ", ".join(f"{k} {v}" for k, v in spec.items() if not isinstance(v, (dict, list)))
    return "-" if spec is None else str(spec)


def _ci_text(row: Mapping[str, Any], name: str) -> str:
    ci = (row.get("ci") or {}).get(name)
    if not ci:
        return "-"
    low, high = ci.get("low"), ci.get("high")
    if ci.get("n", 0) < 2 or low is None or not math.isfinite(low):
        return f"{ci['estimate']:+.3f}"
    return f"{ci['estimate']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _figure(panels: Callable[[], Any], caption: str) -> str:
    """The figure of a page's panels (drawn by ``panels``), or a note saying why it was not
    drawn (matplotlib missing, nothing to plot)."""
    try:
        return panel_figures(panels(), caption)
    except (ImportError, ValueError) as exc:
        return f"<p class=\"figure none\">Figure not drawn: {esc(exc)}</p>"


def _page(title: str, body: list[str], text_table: str | None) -> str:
    """The page of ``body``, with the table as printed folded under it when given."""
    if text_table:
        body.append(f"<details><summary>as printed</summary><pre>{esc(text_table)}</pre></details>")
    return page(title, "\n".join(body))


def answers_page(report: Any, *, title: str = "ragsieve answers", text_table: str | None = None) -> str:
    """The page of ``ragsieve answers --html``: the answer metrics of every method with
    their paired bootstrap intervals against ``all``, the figure, the run."""
    from .plots import answers_panels

    info = report.info
    generated, judged = info.get("generated"), info.get("judged")
    header = answer_header(generated, judged)
    rows = []
    for r in report.results:
        method = r["method"] + ("" if r.get("mode") in (None, "marginal") else f" [{r['mode']}]")
        param = ("" if "alpha" not in r else f"alpha={r['alpha']:g}") + (
            f" k~{r['k']:.1f}" if "k" in r else "")
        row: list[Any] = [method, param.strip(), r.get("n_queries"),
                          fmt(r.get("context_snippets_mean"), 1),
                          fmt(r.get("context_chars_mean"), 0), r.get("answer_in_context_mean"),
                          _ci_text(r, "answer_in_context")]
        if generated:
            row += [r.get("em_mean"), r.get("f1_mean"), _ci_text(r, "f1"), r.get("abstained_mean")]
        if judged:
            row += [r.get("nugget_f1_mean"), _ci_text(r, "nugget_f1")]
        rows.append(row)
    gen = info.get("generator") or {}
    facts = [("data", info.get("dataset", "-")), ("score", _spec_text(info.get("scorer"))),
             ("test queries", info.get("n_queries_evaluated", "-")),
             ("splits", info.get("n_splits", "-")),
             ("generator", gen.get("model", "none (answer in context only)") if generated
              else "none (answer in context only)")]
    conf = float(info.get("confidence", 0.95))
    body = [(f"<p class=\"guarantee\">{esc(_EVAL_GUARANTEE)} Here each method's kept context "
             "is handed to the generator; the table says what the answers get from it.</p>"),
            _facts(facts)]
    body.append(_figure(lambda: answers_panels(report),
                        "Answer quality against the context characters per query, one line "
                        "per method across alpha; 'all' is the whole retrieved list."))
    body.append("<h2>Answers per method</h2>" + table(header, rows, cls="results"))
    body.append(f"<p class=\"muted\">'vs all' = paired bootstrap {conf:.0%} interval of the "
                "difference from 'all' (resampling test queries).</p>")
    return _page(title, body, text_table)
