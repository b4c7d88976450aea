"""Whether a signal earns its place in the fused score, measured on held-back fit topics.

A signal the user brings at a cost -- a reranker (:class:`~ragsieve.scoring.rerank.RerankScorer`)
answers one HTTP call per pair, at calibration and for every served pair -- is fused by the
default score (``auto``) only where it adds to the signals the fused score already has, on
the calibration data itself and without touching the topics the threshold is calibrated on:

1. only the fit share is read (:func:`~ragsieve.scoring.shares.pairs_fit_mask`: the topics
   that fit the fused score, never the calibration topics);
2. it is cut into two halves of its topics (:func:`held_back_halves`; halves of the questions
   when it spans one topic), and the fused score is fitted on one half -- its learner and its
   text-fitted signals (the frozen-corpus BM25), exactly as the fused score is fitted -- and
   measured on the other, and the other way round, once with the signal and once without;
3. the signal is fused when with it the held-back pairs are ranked better by at least the
   stated minimum of ROC-AUC (:data:`MIN_RERANK_GAIN` for a reranker). The question is what
   it adds to the other signals, not whether it beats them alone.

The reader's check (:mod:`ragsieve.scoring.reader_check`) cuts its held-back pairs and
measures them with :func:`held_back_halves` and :func:`roc_auc` too; it differs in that the
reader must first be fine-tuned (cross-fitted), so it compares ``1 - cos`` with and without
the reader's out-of-fold scores.

:class:`SignalCheck` says what was found, in the user's terms; ``auto`` records it in the
artifact's ``data.score_choice.rerank``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._optional import require
from ..errors import CalibrationError
from ..types import Pair
from .shares import pairs_fit_mask

if TYPE_CHECKING:
    from .fusion import FusedScorer

__all__ = ["MIN_RERANK_GAIN", "RERANK_CHECKS", "SignalCheck", "check_rerank", "check_signal",
           "held_back_halves", "roc_auc"]

logger = logging.getLogger(__name__)

#: ROC-AUC a reranker must add to the fused preset's signals on the held-back fit pairs to
#: be fused: every pair scored then costs a call to it, and a smaller gain is within what a
#: few hundred pairs can show (the reader's minimum, :data:`~ragsieve.scoring.reader_check.MIN_READER_GAIN`).
MIN_RERANK_GAIN = 0.005
#: ``"auto"``: checked, fused when it adds ``MIN_RERANK_GAIN``; ``"always"``: fused whatever
#: the check finds (still measured and recorded); ``"never"``: not fused, not called.
RERANK_CHECKS = ("auto", "always", "never")


@dataclass(frozen=True)
class SignalCheck:
    """What :func:`check_signal` found.

    Attributes
    ----------
    helps : bool
        True: the signal is fused (it added at least ``min_gain`` of ROC-AUC, or the mode
        fuses it whatever was found).
    reason : str
        Why, in the user's terms.
    without_auc, with_auc : float or None
        ROC-AUC on the held-back fit pairs of the fused score without and with the signal
        (each the mean over the two halves; None: not measured).
    signal_auc : float or None
        ROC-AUC of the signal alone on the same pairs.
    n_pairs, n_topics : int
        Fit-share pairs and topics the AUCs were measured on (0: not measured).
    min_gain : float
        The gain asked for.
    """

    helps: bool
    reason: str
    without_auc: float | None = None
    with_auc: float | None = None
    signal_auc: float | None = None
    n_pairs: int = 0
    n_topics: int = 0
    min_gain: float = MIN_RERANK_GAIN

    def to_dict(self) -> dict[str, Any]:
        """``{"fused", "reason", "without_auc", "with_auc", "signal_auc", "n_pairs",
        "n_topics", "min_gain"}``: the artifact's ``data.score_choice.rerank``."""
        return {"fused": self.helps, "reason": self.reason, "without_auc": self.without_auc,
                "with_auc": self.with_auc, "signal_auc": self.signal_auc,
                "n_pairs": self.n_pairs, "n_topics": self.n_topics, "min_gain": self.min_gain}


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC-AUC of relevance against a nonconformity score (lower score = more relevant)."""
    metrics = require("sklearn.metrics", "embed")
    return float(metrics.roc_auc_score(labels, -np.asarray(scores, dtype=float)))


def held_back_halves(labels: np.ndarray, held: Sequence[Pair]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two topic-disjoint halves of ``held`` (``Pair.group``; of the questions when they span
    one topic), as ``(fit, measure)`` index arrays both ways round; a way round where either
    side holds one class only is left out (none left: nothing can be measured)."""
    model_selection = require("sklearn.model_selection", "embed")
    groups = np.array([str(p.group) for p in held])
    if np.unique(groups).size < 2:
        groups = np.array([str(p.query_id) for p in held])
    if np.unique(groups).size < 2:
        return []
    labels = np.asarray(labels)
    return [(train, test) for train, test in model_selection.GroupKFold(n_splits=2).split(
        labels, labels, groups)
        if np.unique(labels[train]).size == 2 and np.unique(labels[test]).size == 2]


def check_signal(pairs: Sequence[Pair], fused: FusedScorer, *, seed: int = 0,
                 min_gain: float = MIN_RERANK_GAIN, what: str = "the signal",
                 fuse_anyway: bool = False) -> SignalCheck:
    """Whether the last signal of the unfitted fused score ``fused`` adds to its others on
    the held-back halves of the fit share's topics (see the module docstring).

    Parameters
    ----------
    pairs : sequence of Pair
        The labelled calibration pairs (only the fit share's are read and scored).
    fused : FusedScorer
        Unfitted; its last signal is the one checked (the fit of the others, their features
        and the learner are the fused score's own).
    seed : int
        The calibration seed (the fit share's draw).
    min_gain : float
        ROC-AUC the signal must add.
    what : str
        The signal in the reason (``"the reranker"``).
    fuse_anyway : bool
        Fuse it whatever is found (``--rerank-check always``); the numbers are still
        measured and recorded.

    Returns
    -------
    SignalCheck

    Raises
    ------
    ValueError
        ``fused`` is fitted or has no signal besides its base.
    """
    if fused.is_fitted or not fused.signals:
        raise ValueError("check_signal takes an unfitted fused score with the signal to check "
                         f"last among its signals; got {fused.spec()['scorer']!r} with "
                         f"{len(fused.signals)} signal(s).")
    verdict = "fused (always)" if fuse_anyway else "not fused"
    pairs = list(pairs)
    try:
        share = [pairs[i] for i in np.flatnonzero(pairs_fit_mask(pairs, seed=seed))]
    except CalibrationError as exc:
        return SignalCheck(fuse_anyway, f"{verdict}: not measured: {exc}", min_gain=min_gain)
    labels = np.array([int(p.relevant == 1) for p in share])
    halves = held_back_halves(labels, share)
    if not halves:
        return SignalCheck(fuse_anyway, f"{verdict}: not measured: no half of the fit share's "
                           f"{len(share)} pairs holds both relevant and irrelevant pairs, so "
                           f"what {what} adds could not be measured", min_gain=min_gain)
    without, with_, alone = _cross_fitted(fused, share, labels, halves)
    helps = fuse_anyway or with_ >= without + min_gain
    verdict = "fused (always)" if fuse_anyway else "fused" if helps else "not fused"
    n_topics = len({p.group for p in share})
    reason = (f"{verdict}: on the fit share's held-back halves ({len(share)} pairs of "
              f"{n_topics} topic(s), each half scored by the fused score fitted on the other) "
              f"the fused score with {what} ranked them at ROC-AUC {with_:.3f} against "
              f"{without:.3f} without ({what} alone {alone:.3f}; it must add {min_gain})")
    logger.info("%s check: %s", what, reason)
    return SignalCheck(helps, reason, without, with_, alone, len(share), n_topics, min_gain)


def _cross_fitted(fused: FusedScorer, share: list[Pair], labels: np.ndarray,
                  halves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    """ROC-AUC of the fused score without and with its last signal, and of that signal
    alone, each the mean over the halves (fitted on one, measured on the other)."""
    from .fusion import fit_learner

    features = fused.features_for_evaluation(share)
    width = len(fused.feature_names) // len(fused.signal_scorers)  # columns per signal
    without: list[float] = []
    with_: list[float] = []
    alone: list[float] = []
    for train, test in halves:
        mask = np.zeros(len(share), dtype=bool)
        mask[train] = True
        matrix, _ = features.fitted_on(mask)  # text-fitted signals on the fit half's texts
        for x, out in ((matrix[:, :-width], without), (matrix, with_)):
            learned = fit_learner(features.learner, x[train], labels[train])
            out.append(roc_auc(labels[test], learned.scores(x[test])))
        alone.append(roc_auc(labels[test], matrix[test, -width]))
    return float(np.mean(without)), float(np.mean(with_)), float(np.mean(alone))


def check_rerank(pairs: Sequence[Pair], fused: FusedScorer | None, *, seed: int = 0,
                 mode: str = "auto") -> SignalCheck:
    """Whether the reranker, the last signal of ``fused``, adds ``MIN_RERANK_GAIN`` of
    held-back ROC-AUC to the preset's signals (:func:`check_signal`).

    Parameters
    ----------
    pairs, fused, seed
        As :func:`check_signal` takes them (``fused`` None with ``mode="never"`` only).
    mode : {"auto", "always", "never"}
        See :data:`RERANK_CHECKS`.

    Raises
    ------
    ValueError
        ``mode`` is not one of ``RERANK_CHECKS``, or ``fused`` is None with another mode.

    Examples
    --------
    >>> check_rerank([], None, mode="never").reason
    'not fused, not called (--rerank-check never)'
    """
    if mode not in RERANK_CHECKS:
        raise ValueError(f"rerank_check == {mode!r}, expected one of {', '.join(RERANK_CHECKS)}.")
    if mode == "never":
        return SignalCheck(False, "not fused, not called (--rerank-check never)")
    if fused is None:
        raise ValueError(f"rerank_check == {mode!r} checks a fused score with the reranker; "
                         "got None.")
    return check_signal(pairs, fused, seed=seed, what="the reranker",
                        fuse_anyway=mode == "always")
