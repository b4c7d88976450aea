"""``ragsieve recalibrate``: a new filter artifact from the labels the service collected.

The labels of :class:`~ragsieve.server.feedback.FeedbackStore` carry the scores the service
served (never a score a client sent). By default they are *merged* with the artifact's own
calibration scores (``--merge``): the modes that keep their relevant calibration scores in
the artifact, ``marginal`` (``scores``) and ``adaptive`` (its ``pool``, the last
``window`` ones), are refitted on those plus the labels. ``--replace`` fits on the labels
alone and works for every mode labels can feed; the other modes (``pac``,
``query-recall``, ``query-all``, ``group``) keep only thresholds, so they need it.
``budget``, ``topic`` and ``topic-pac`` are refused (labels carry no lengths or topics).

The refit itself is the library's (:func:`ragsieve.calibration.refit.refit`); this module
reads the labels from the feedback database and builds the new filter around it.

A database whose labels have a non-finite score, or whose adaptive state for the artifact
is outside the bounds the service keeps it in, is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._validation import check_int
from ..artifact import Artifact
from ..calibration.p_values import EvidenceScores
from ..calibration.refit import check_refittable, refit
from ..errors import ArtifactError, CalibrationError, DataError
from ..fitting import CalibrationInfo
from .feedback import FeedbackStore, build_adaptive, scorer_key

__all__ = ["Recalibration", "recalibrate"]

_Label = tuple[str, str, bool, float, "str | None"]


@dataclass(frozen=True)
class Recalibration:
    """The outcome of :func:`recalibrate`."""

    filter: Any
    mode: str
    n_labels: int
    n_used: int
    n_relevant: int
    n_queries: int
    n_merged: int
    old_threshold: float
    new_threshold: float
    notes: list[str] = field(default_factory=list)


def _evidence(calibrator: Any, old: EvidenceScores | None,
              usable: list[_Label]) -> EvidenceScores | None:
    """The relevant scores behind the new filter's p-values: the marginal calibrator's own,
    else the labels' relevant scores (with the artifact's, when they were merged); None when
    no label is relevant."""
    own = EvidenceScores.of_calibrator(calibrator)
    if own is not None:
        return own
    scores = [r[3] for r in usable if r[2]] + ([] if old is None else list(old.scores))
    return EvidenceScores.of(scores) if scores else None


def _read_labels(db: str | Path, key: str, checksum: str | None
                 ) -> tuple[list[_Label], dict[str, list[float]]]:
    """The labels and served lists under scorer ``key``; refuses out-of-bounds state."""
    store = FeedbackStore(db, create=False)
    try:
        rows = store.labelled(key)
        lists = store.served_lists(key)
        try:
            _version, mode, params, state = store.adaptive_state(checksum or "")
        except KeyError:
            pass
        else:
            _check_adaptive(db, mode, params, state)
    finally:
        store.close()
    bad = [r for r in rows if not math.isfinite(r[3])]
    if bad:
        raise DataError(f"feedback database {str(db)!r} holds {len(bad)} label(s) whose served "
                        f"score is not finite (first: query_id {bad[0][0]!r}, snippet_id "
                        f"{bad[0][1]!r}); it was not written by `ragsieve serve`.")
    return rows, lists


def _check_adaptive(db: str | Path, mode: str, params: dict[str, Any],
                    state: dict[str, Any]) -> None:
    try:
        build_adaptive(mode, params, state)
    except ArtifactError as exc:
        raise ArtifactError(f"feedback database {str(db)!r} holds an adaptive state for this "
                            f"artifact outside the bounds the service keeps: {exc}") from exc


def _monitor_reference(lists: Mapping[str, list[float]], query_ids: set[str],
                       notes: list[str]) -> dict[str, Any] | None:
    """The exchangeability monitor's reference of a recalibrated artifact: the statistic of
    each labelled query's whole served list (as ``calibrate`` records it for its queries)."""
    from ..monitoring import reference_block

    scores = [s for q in sorted(query_ids) for s in lists.get(q, [])]
    qids = [q for q in sorted(query_ids) for _ in lists.get(q, [])]
    block = reference_block(np.asarray(scores, dtype=np.float64), qids) if scores else None
    if block is None:
        notes.append("no labelled query was served with 2 or more snippets: the new artifact "
                     "has no exchangeability monitor reference")
    return block


def _usable(cal: Any, rows: list[_Label], notes: list[str]) -> tuple[list[_Label], list[Any] | None]:
    """The labels a mode can fit on, and their groups (group mode)."""
    if cal.group_kind != "attribute":
        return rows, None
    missing = sum(1 for r in rows if r[4] is None)
    if missing:
        notes.append(f"{missing} label(s) without a served group skipped")
    usable = [r for r in rows if r[4] is not None]
    return usable, [r[4] for r in usable]


def _check_enough(db: str | Path, rows: list[_Label], min_labels: int) -> None:
    n_relevant = sum(1 for r in rows if r[2])
    if n_relevant < min_labels:
        raise CalibrationError(
            f"feedback database {str(db)!r} holds {n_relevant} relevant label(s) of served "
            f"snippets ({len(rows)} label(s)); min_labels is {min_labels}: collect more labels "
            "or lower --min-labels.")


def recalibrate(payload: Artifact | Mapping[str, Any], feedback_db: str | Path, *,
                min_labels: int = 50,
                merge: bool = True,
                scorer_options: Mapping[str, Any] | None = None) -> Recalibration:
    """Rebuild a filter artifact from the labels stored by the service.

    The labelled snippets' served scores become calibration scores of the artifact's own
    mode and parameters, merged with the artifact's calibration scores (``merge=True``)
    or alone; scorer, policy and group field are kept.

    Parameters
    ----------
    payload : Artifact or Mapping
        The current artifact (:meth:`Artifact.read <ragsieve.artifact.Artifact.read>`; a
        dict is read by :meth:`Artifact.from_dict <ragsieve.artifact.Artifact.from_dict>`).
    feedback_db : str or Path
        The service's feedback database (``serve --feedback``).
    min_labels : int, default=50
        Fewest relevant labels to recalibrate on.
    merge : bool, default=True
        Fit on the artifact's kept calibration scores plus the labels (modes marginal and
        adaptive); False fits on the labels alone.
    scorer_options : Mapping, optional
        Passed to :meth:`ConformalFilter.from_artifact` (nothing is scored here).

    Returns
    -------
    Recalibration
        The new filter (save it with ``.save``) and what was used.

    Raises
    ------
    CalibrationError
        Fewer than ``min_labels`` relevant labels.
    ValueError
        The mode cannot be recalibrated from labels (or merged: it keeps no calibration
        scores), the filter's unit is ``"sentence"`` (labels name snippets), or
        ``min_labels`` < 1.
    DataError, ArtifactError
        Missing, foreign or out-of-bounds database (non-finite scores, an adaptive state
        outside its bounds); malformed artifact.
    FileNotFoundError
        No such database.
    """
    from ..filter import ConformalFilter

    min_labels = check_int(min_labels, "min_labels", min_value=1)
    artifact = payload if isinstance(payload, Artifact) else Artifact.from_dict(payload)
    old = ConformalFilter.from_artifact(artifact, scorer_options=scorer_options)
    if old.unit != "snippet":
        raise ValueError(
            f"cannot recalibrate a filter of unit {old.unit!r} from feedback: the labels name "
            "snippets, its threshold is over evidence sentences, and a label does not say which "
            "of a snippet's sentences is the evidence; recalibrate with `ragsieve calibrate "
            "--unit sentence` on labelled pairs (evidence spans or answers).")
    cal = old.calibrator_
    check_refittable(cal, merge=merge)  # refuse before reading the database
    checksum = artifact.checksum
    rows, lists = _read_labels(feedback_db, scorer_key(old.scorer_.spec()), checksum)
    _check_enough(feedback_db, rows, min_labels)
    notes: list[str] = []
    usable, groups = _usable(cal, rows, notes)
    new_cal, n_merged = refit(cal, [r[3] for r in usable], [r[2] for r in usable],
                              query_ids=[r[0] for r in usable], groups=groups, merge=merge)
    flt = ConformalFilter(old.scorer_, new_cal, **old.policy_.keywords())
    queries = {r[0] for r in usable}
    flt.monitor_reference = _monitor_reference(lists, queries, notes)
    flt.evidence = _evidence(new_cal, old.evidence if n_merged else None, usable)
    n_relevant = sum(1 for r in usable if r[2])
    flt.calibration_info = CalibrationInfo(
        source="feedback", n_labels=len(usable), n_relevant=n_relevant,
        n_queries=len(queries), merged_calibration_scores=n_merged, previous_checksum=checksum)
    return Recalibration(
        filter=flt, mode=cal.mode, n_labels=len(rows), n_used=len(usable), n_relevant=n_relevant,
        n_queries=len(queries), n_merged=n_merged, old_threshold=old.threshold,
        new_threshold=flt.threshold, notes=notes)
