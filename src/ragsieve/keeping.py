"""What a filter keeps: the calibrated rule applied to the pieces' scores, mapped back to
the snippets, with the empty-result policy and the list check's verdict.

The rule reads the filter's :class:`~ragsieve.keep_policy.KeepPolicy` (its unit, empty-result
policy, group field and cut size); :func:`check_policy` is re-exported from there.

:func:`apply_rule` asks the calibrator which pieces (snippets, windows of long snippets,
or sentences) it keeps, keeps a snippet when any of its pieces is kept, and builds the
:class:`~ragsieve.types.FilterResult` (kept and removed snippets in input order, each
snippet's best score, the spans of its kept pieces, a note for unusual results). When the
rule keeps nothing, the default (``min_keep=0``) is an empty context, said so in the
note; ``min_keep=k`` keeps the ``k`` best units instead, outside the guarantee.

:func:`promise` is what a filter promises, as a dict. :func:`see_list` and :func:`see_lists` show the lists a filter is given to its
:class:`~ragsieve.lists.ListWatch` (the check against the calibration lists).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._validation import check_scores
from .calibration import BaseCalibrator
from .calibration.p_values import EvidenceScores
from .errors import DataError
from .keep_policy import KeepPolicy, check_policy
from .lists import ListCheck, ListWatch
from .pieces import Pieces
from .types import FilterResult, Scored

__all__ = ["apply_rule", "check_policy", "p_value_rule", "promise", "see_list", "see_lists",
           "wants_root"]

logger = logging.getLogger(__name__)


def promise(calibrator: BaseCalibrator, *, unit: str, group_by: str | None) -> dict[str, Any]:
    """What a filter promises: the calibrator's :class:`~ragsieve.calibration.Guarantee`
    for ``unit`` as a dict (mode, metric, target, statement, alpha, n_calibration,
    n_required, infinite, details), plus ``coverage_band`` for the marginal mode,
    ``group_by`` for the group mode and ``unit`` for the sentence unit (whose statement the
    calibrator words of evidence sentences)."""
    out = calibrator.guarantee(unit=unit).to_dict()
    if "coverage_band" in out["details"]:
        out["coverage_band"] = list(out["details"]["coverage_band"])
    if group_by is not None:
        out["group_by"] = group_by
    if unit == "sentence":  # the calibrated units are sentences, the relevant ones evidence
        out["unit"] = unit
    return out


def apply_rule(calibrator: BaseCalibrator, scores: Any, pieces: Pieces, *, query: str,
               policy: KeepPolicy, group: Any, see: Callable[[], ListCheck],
               evidence: EvidenceScores | None = None) -> FilterResult:
    """Apply the fitted ``calibrator``'s rule to the pieces' scores; map it back to the items.

    ``policy``: the filter's unit, empty-result policy, group field and cut size;
    ``group``: the group of snippets that carry none of their own (``group`` mode);
    ``see``: the list check, made once the result is known; ``evidence``: the relevant
    calibration scores each snippet's (and sentence's) p-value is computed against.

    Raises
    ------
    ValueError
        Scores not finite, or not one per piece.
    DataError
        A snippet without a group in the ``group`` mode.
    """
    arr = check_scores(scores, name="snippet scores")
    n = len(pieces.items)
    if len(pieces.pieces) != arr.size:
        raise ValueError(f"got {arr.size} scores for {len(pieces.pieces)} snippets; they must "
                         "align.")
    unit, min_keep = policy.unit, policy.min_keep
    keep_piece, groups = _predict(calibrator, arr, pieces.pieces, policy.group_by, group)
    item_scores = np.full(n, np.inf)
    np.minimum.at(item_scores, pieces.owner, arr)
    tau = float(calibrator.threshold_)
    if groups and len(set(map(str, groups))) == 1:  # one group: the threshold it meets
        tau = calibrator.threshold_for(groups[0])
    sentences = unit == "sentence"
    notes = []
    rule_kept_none = bool(n and not keep_piece.any())
    if rule_kept_none and sentences:  # the policy keeps the best sentences
        notes.append(_empty_policy(keep_piece, arr, tau, "sentence", min_keep, calibrator.mode))
    keep = np.zeros(n, dtype=bool)
    np.logical_or.at(keep, pieces.owner, keep_piece)
    n_cut, n_pieces = pieces.cut_summary()
    if n_cut:
        notes.insert(0, _cut_note(n_cut, n_pieces, policy.max_chars, sentences))
    if rule_kept_none and not sentences:
        notes.append(_empty_policy(keep, item_scores, tau, "snippet", min_keep, calibrator.mode))
    if rule_kept_none:
        logger.info("query %r: %s", query[:80], notes[-1])
    item_p = None if evidence is None else evidence.p_values(item_scores)
    kept, removed = _scored(pieces, item_scores, keep, pieces.kept_spans(keep_piece), item_p)
    spanned = [sp is not None for sp in pieces.spans] if sentences else []
    scored_sentences = tuple(
        (int(o), int(sp[0]), int(sp[1]), float(a), bool(k))
        for o, sp, a, k in zip(pieces.owner, pieces.spans, arr, keep_piece, strict=True)
        if sp is not None
    ) if sentences else ()
    sentence_p = (tuple(float(x) for x in evidence.p_values(arr[np.asarray(spanned, bool)]))
                  if sentences and evidence is not None and arr.size else ())
    check = see()
    return FilterResult(query=query, kept=kept, scores=tuple(float(x) for x in item_scores),
                        threshold=tau, n_input=n, note="; ".join(notes) or None, n_cut=n_cut,
                        removed=removed, rule_kept_none=rule_kept_none, unit=unit,
                        sentences=scored_sentences, lists_unlike=check.unlike,
                        lists_note=check.note,
                        p_values=() if item_p is None else tuple(float(x) for x in item_p),
                        sentence_p_values=sentence_p)


def _predict(calibrator: BaseCalibrator, arr: np.ndarray, pieces: list[dict[str, Any]],
             group_by: str | None, group: Any) -> tuple[np.ndarray, list[Any] | None]:
    """The calibrator's keep-mask of the pieces, and their groups when the mode reads them."""
    if not pieces:
        return np.zeros(0, dtype=bool), None
    needs = calibrator.predict_requires
    groups = _groups_of(pieces, group, group_by) if "groups" in needs else None
    keep = calibrator.predict(
        arr,
        query_ids=np.zeros(arr.size, dtype=int) if "query_ids" in needs else None,
        groups=groups,
        lengths=[str(it.get("text") or "") for it in pieces] if "lengths" in needs else None,
    )
    return keep, groups


def _groups_of(items: Sequence[Mapping[str, Any]], group: Any, group_by: str | None) -> list[Any]:
    keys = [k for k in (group_by, "group") if k]
    out = []
    for i, item in enumerate(items):
        value = next((item[k] for k in keys if item.get(k) is not None), group)
        if value is None:
            raise DataError(
                f"snippet {i} has no group: mode 'group' needs a {' or '.join(map(repr, keys))} "
                "value on each snippet, or a per-query group."
            )
        out.append(value)
    return out


def _cut_note(n_cut: int, n_pieces: int, max_chars: int, sentences: bool) -> str:
    if sentences:
        return (f"{n_cut} snippet(s) held a sentence longer than {max_chars} characters, cut "
                f"into {n_pieces} pieces and scored piece by piece (each piece kept or removed "
                "like a sentence; see spans)")
    return (f"{n_cut} snippet(s) longer than {max_chars} characters were cut into {n_pieces} "
            "pieces and scored piece by piece (kept when any piece is kept; see spans)")


def _empty_policy(keep: np.ndarray, scores: np.ndarray, tau: float, unit: str, min_keep: int,
                  mode: str) -> str:
    """Nothing passed the rule: keep the ``min_keep`` best units (in place) and say why."""
    if not scores.size:
        return (f"no {unit} to keep: every snippet's text is blank; returning an empty "
                "context")
    if min_keep:
        order = np.argsort(scores, kind="stable")[:min_keep]
        keep[order] = True
        return (f"no {unit} kept by the {mode} rule (tau={tau:.4g}, best score "
                f"{scores.min():.4g}); kept the {int(keep.sum())} best by the "
                f"min_keep={min_keep} policy, outside the calibrated guarantee")
    return (f"no {unit} kept by the {mode} rule (tau={tau:.4g}, best score "
            f"{scores.min():.4g}); returning an empty context (set min_keep to keep the "
            "best ones anyway)")


def _scored(pieces: Pieces, item_scores: np.ndarray, keep: np.ndarray,
            spans: list[tuple[tuple[int, int], ...]], p_values: np.ndarray | None,
            ) -> tuple[tuple[Scored, ...], tuple[Scored, ...]]:
    """The kept snippets (with their kept spans) and the removed ones, in input order, each
    with its p-value when ``p_values`` are given."""
    out: tuple[list[Scored], list[Scored]] = ([], [])
    for i, it in enumerate(pieces.items):
        out[0 if keep[i] else 1].append(Scored(
            index=i, snippet_id=str(it["snippet_id"]), text=str(it.get("text") or ""),
            score=float(item_scores[i]), spans=spans[i] if keep[i] else (),
            p_value=None if p_values is None else float(p_values[i])))
    return tuple(out[0]), tuple(out[1])


def p_value_rule(calibrator: BaseCalibrator) -> str:
    """How a p-value reads beside the mode's rule: the marginal rule in p-values
    (``kept exactly when p > 0.1``); for the other modes, the evidence percentile.

    Examples
    --------
    >>> from ragsieve.calibration import make_calibrator
    >>> p_value_rule(make_calibrator("marginal", alpha=0.1))
    'p-value: the share of calibration evidence that scored no better; kept exactly when p > 0.1'
    """
    share = "the share of calibration evidence that scored no better"
    if calibrator.mode == "marginal":
        return f"p-value: {share}; kept exactly when p > {calibrator.miscoverage():.3g}"
    return (f"evidence percentile (p-value): {share}; the {calibrator.mode} mode keeps by its "
            "own rule, not by p")


# ----------------------------------------------------------------------------- the list check
def wants_root(watch: ListWatch | None) -> bool:
    """Whether the list check reads the lists' root scores (a list-aware score whose
    calibration lists' statistics were recorded)."""
    return watch is not None and watch.active and watch.record.spread is not None


def see_list(watch: ListWatch | None, pieces: Pieces, root: np.ndarray | None) -> ListCheck:
    """Show one list to the watch: its length (the snippets given) and each snippet's
    best root score (over its pieces)."""
    if watch is None or not pieces.items:
        return ListCheck()
    per_item = None
    if root is not None and wants_root(watch):
        per_item = np.full(len(pieces.items), np.inf)
        np.minimum.at(per_item, pieces.owner, np.asarray(root, dtype=np.float64))
        per_item = per_item[np.isfinite(per_item)]
    return watch.see(len(pieces.items), per_item)


def see_lists(watch: ListWatch | None, cuts: Mapping[str, Pieces], offsets: Mapping[str, Any],
              roots: np.ndarray | None, seed: int) -> dict[str, ListCheck]:
    """The list checks of a batch: its lists shown to the watch in a seeded random order;
    every list flagged when the sequential test fired on the batch."""
    checks: dict[str, ListCheck] = {}
    order = list(cuts)
    np.random.default_rng(seed).shuffle(order)
    for qid in order:
        start, m = int(offsets[qid]), len(cuts[qid].pieces)
        checks[qid] = see_list(watch, cuts[qid], None if roots is None else roots[start:start + m])
    alarm = watch.alarm_check() if watch is not None else ListCheck()
    return {qid: c if c.outside or not alarm.unlike else alarm for qid, c in checks.items()}
