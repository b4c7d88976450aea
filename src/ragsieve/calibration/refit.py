"""Refit a fitted calibrator on new labelled scores, merged with its own or alone.

``ragsieve recalibrate`` feeds it the labels a service collected
(:mod:`ragsieve.server.recalibrate`), but it needs no service: any labelled scores of the
calibrator's score will do. Merging (``merge=True``) refits the modes that keep their
relevant calibration scores, ``marginal`` (state key ``scores``) and ``adaptive`` (its
``pool``), on those plus the new labels; ``merge=False`` fits on the new labels alone and
works for every mode labels can feed. ``budget``, ``topic`` and ``topic-pac`` are refused:
labels carry no lengths or topics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import BaseCalibrator
from .modes import make_calibrator

__all__ = ["KEPT_SCORES", "check_refittable", "kept_scores", "refit"]

KEPT_SCORES: dict[str, str] = {"marginal": "scores", "adaptive": "pool"}
"""Modes whose state keeps the relevant calibration scores, and the state key."""


def check_refittable(cal: BaseCalibrator, *, merge: bool) -> None:
    """Refuse a calibrator that labels alone cannot refit (before any label is read).

    Raises
    ------
    ValueError
        The mode needs snippet lengths or calibration topics; or ``merge`` and the mode
        keeps no calibration scores (see :func:`kept_scores`).
    """
    if "lengths" in cal.fit_requires or cal.group_kind == "topic":
        needs = "snippet lengths" if "lengths" in cal.fit_requires else "calibration topics"
        raise ValueError(f"mode {cal.mode!r} needs {needs}, which feedback labels do not carry; "
                         "recalibrate it with `ragsieve calibrate` on labelled pairs.")
    if merge:
        kept_scores(cal)


def kept_scores(cal: BaseCalibrator) -> np.ndarray:
    """The relevant calibration scores ``cal`` keeps in its state (what ``merge`` adds).

    Raises
    ------
    ValueError
        The mode (or a v1 artifact's state) keeps only its threshold(s).
    """
    state = cal.to_state()
    key = KEPT_SCORES.get(cal.mode)
    if key is None or key not in state:
        kind = "a v1 artifact without its scores" if key else f"mode {cal.mode!r}"
        raise ValueError(f"{kind} keeps only its threshold(s), not its calibration scores, so "
                         "labels cannot be merged with them: use --replace (calibrate on the "
                         "labels alone), or `ragsieve calibrate` on the original pairs.")
    return np.asarray(state[key], dtype=np.float64)


def refit(cal: BaseCalibrator, scores: Sequence[float] | np.ndarray,
          relevant: Sequence[bool] | np.ndarray, *, query_ids: Sequence[str] | None = None,
          groups: Sequence[Any] | None = None, merge: bool = True) -> tuple[BaseCalibrator, int]:
    """A new calibrator of ``cal``'s mode and parameters, fitted on the labelled scores.

    Parameters
    ----------
    cal : BaseCalibrator
        The fitted calibrator to refit (left unchanged).
    scores : array-like of float
        New labelled scores, in the calibrator's score.
    relevant : array-like of bool
        Their labels.
    query_ids : sequence of str, optional
        Query of each score (the per-query modes need them; dropped when merged scores
        are added, as the merged modes fit on scores alone).
    groups : sequence, optional
        Group of each score (group mode).
    merge : bool, default=True
        Add the relevant calibration scores ``cal`` keeps (:func:`kept_scores`).

    Returns
    -------
    tuple of (BaseCalibrator, int)
        The fitted calibrator and how many kept calibration scores were merged in.

    Raises
    ------
    ValueError
        As :func:`check_refittable`, and the calibrator's own ``fit`` errors.

    Examples
    --------
    >>> from ragsieve.calibration import make_calibrator
    >>> old = make_calibrator("marginal", alpha=0.5).fit([0.1, 0.2, 0.3], [True, True, True])
    >>> new, n_merged = refit(old, [0.4, 0.9], [True, False])
    >>> n_merged, new.n_calibration_
    (3, 4)
    """
    check_refittable(cal, merge=merge)
    score_arr = np.asarray(scores, dtype=np.float64)
    relevant_arr = np.asarray(relevant, dtype=bool)
    ids = None if query_ids is None else list(query_ids)
    base = kept_scores(cal) if merge else np.empty(0)
    if base.size:
        score_arr = np.r_[base, score_arr]
        relevant_arr = np.r_[np.ones(base.size, dtype=bool), relevant_arr]
        ids = None  # the merged modes (marginal, adaptive) fit on scores alone
    params = {k: v for k, v in cal.get_params().items() if k != "tokenizer"}
    new = make_calibrator(cal.mode, **params)
    return new.fit(score_arr, relevant_arr, query_ids=ids, groups=groups), int(base.size)
