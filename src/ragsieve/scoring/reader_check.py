"""Whether the reader earns its place: the check ``auto`` runs before it fuses the reader.

The reader (:mod:`ragsieve.scoring.reader`) adds to the bi-encoder's cosine on some
collections and not on others, and it costs minutes of fine-tuning. So the default score
(``auto``) fuses it only where :func:`check_reader` finds it helping ``1 - cos`` on the
calibration data itself, without touching the topics the threshold is calibrated on:

1. the reader's base was trained on the texts' languages (multilingual-e5-small: the ~100
   languages of XLM-R, queries and snippets in different ones included;
   :func:`~ragsieve.scoring.reader.reader_for`);
2. the fit share (:func:`~ragsieve.scoring.shares.pairs_fit_mask`: the topics that fit the
   fused score, never the calibration topics) holds at least ``MIN_READER_RELEVANT``
   relevant pairs (``reader_check="auto"``; ``"always"`` skips this gate);
3. cross-fitted within the fit share (two halves of its topics: a reader fine-tuned on
   each scores the other), ``1 - cos`` and the reader together (a logistic regression
   fitted on one half's held-back scores, measured on the other half, and the other way
   round) rank the held-back pairs better than ``1 - cos`` alone, by at least
   ``MIN_READER_GAIN`` of ROC-AUC. The reader is a signal of the fused score, so the
   question is what it adds to the cosine, not whether it beats it alone: a reader that
   ranks worse alone can still add.

:class:`ReaderCheck` says what was found, in the user's terms; ``auto`` records it in the
artifact's ``data.score_choice.reader``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._optional import require
from ..embeddings.reader_bases import DEFAULT_BASE
from ..errors import CalibrationError
from ..types import Pair
from .base import Scorer
from .shares import pairs_fit_mask
from .signal_check import held_back_halves
from .signal_check import roc_auc as _auc

__all__ = ["MIN_READER_GAIN", "MIN_READER_RELEVANT", "READER_CHECKS", "ReaderCheck",
           "check_reader"]

logger = logging.getLogger(__name__)

#: Fewest relevant pairs in the fit share for ``reader_check="auto"`` to fine-tune. The check
#: costs two fine-tunes of half the fit share and the fused reader one more, which on small
#: fit shares is minutes of fitting for little removal (docs/scores.md has
#: ``benchmarks/bench_reader.py``'s runs): not worth a default's first run.
MIN_READER_RELEVANT = 500
#: ROC-AUC the reader must add to ``1 - cos`` on the held-back fit pairs to be fused (it costs
#: minutes of fine-tuning; a smaller gain is within what a few hundred pairs can show).
MIN_READER_GAIN = 0.005
#: ``"auto"``: check when the gates pass; ``"always"``: check on data of any language the
#: reader's base was trained on;
#: ``"never"``: do not fine-tune (the reader is not used).
READER_CHECKS = ("auto", "always", "never")


@dataclass(frozen=True)
class ReaderCheck:
    """What :func:`check_reader` found.

    Attributes
    ----------
    helps : bool
        True: with the reader, ``1 - cos`` ranked held-back fit topics better by at least
        ``MIN_READER_GAIN`` of ROC-AUC (``auto`` fuses it).
    reason : str
        Why, in the user's terms (the artifact's ``data.score_choice.reader``).
    reader_auc, base_auc, fused_auc : float or None
        ROC-AUC on the held-back fit pairs of the reader alone, of ``1 - cos`` and of the
        two together (cross-fitted over the two halves; None: the check did not
        fine-tune).
    n_pairs : int
        Fit-share pairs the AUCs were measured on (0: not measured).
    """

    helps: bool
    reason: str
    reader_auc: float | None = None
    base_auc: float | None = None
    n_pairs: int = 0
    fused_auc: float | None = None


def check_reader(pairs: Sequence[Pair], base: Scorer, *, seed: int = 0,
                 language: str | None = "en", query_language: str | None = None,
                 mode: str = "auto", min_relevant: int = MIN_READER_RELEVANT,
                 reader_base: str | None = None) -> ReaderCheck:
    """Whether the reader, with ``base``, ranks the fit share's held-back topics better than
    ``base`` alone.

    Parameters
    ----------
    pairs : sequence of Pair
        The labelled calibration pairs (only the fit share's are read: the pairs of the
        topics ``pairs_fit_mask(pairs, seed=seed)`` draws, the ones that fit the fused
        score).
    base : Scorer
        The fused score's base (``1 - cos``), the score the reader must beat.
    seed : int
        The calibration seed (the fit share's draw). The fine-tunes are seeded as the fused
        score's fit seeds its own, so a fused reader's fit reuses the check's out-of-fold
        scores (:class:`~ragsieve.scoring.reader.ReaderShareFit`).
    language, query_language : str or None
        The snippets' and the queries' languages (None: not known; the queries' default to
        the snippets').
    mode : {"auto", "always", "never"}
        See ``READER_CHECKS``.
    min_relevant : int
        The gate of ``mode="auto"``.
    reader_base : str, optional
        The base the reader is fine-tuned from (None: the default base).

    Returns
    -------
    ReaderCheck

    Raises
    ------
    ValueError
        ``mode`` is not one of ``READER_CHECKS``, or ``reader_base`` names no base.

    Examples
    --------
    >>> check_reader([], None, language="tlh").reason
    'not tried: the reader is fine-tuned from multilingual-e5-small-q4, not trained on tlh'
    """
    if mode not in READER_CHECKS:
        raise ValueError(f"reader_check == {mode!r}, expected one of {', '.join(READER_CHECKS)}.")
    if mode == "never":
        return ReaderCheck(False, "not tried (--reader-check never)")
    from .reader import reader_for

    queries = query_language or language
    reader = reader_for(language, query_language, base=reader_base)
    if reader is None:
        said = language if queries == language else f"queries {queries}, snippets {language}"
        return ReaderCheck(False, f"not tried: the reader is fine-tuned from "
                           f"{reader_base or DEFAULT_BASE}, "
                           f"not trained on {said or 'texts of an unknown language'}")
    pairs = list(pairs)
    share = [pairs[i] for i in np.flatnonzero(pairs_fit_mask(pairs, seed=seed))]
    n_relevant = sum(p.relevant == 1 for p in share)
    if mode == "auto" and n_relevant < min_relevant:
        return ReaderCheck(False, f"not tried: the fit share holds {n_relevant} relevant pairs "
                           f"and the default checks the reader from {min_relevant} (the check and "
                           "the fused reader cost minutes of fine-tuning); --reader-check always "
                           "tries it")
    try:
        # the fine-tunes seeded as the fused score's fit seeds its own (0): when the reader
        # is fused, that fit reads these out-of-fold scores instead of fine-tuning again
        rows, reader_scores = reader.fit_share(share).out_of_fold()
    except CalibrationError as exc:
        return ReaderCheck(False, f"not tried: {exc}")
    held = [share[i] for i in rows]
    labels = np.array([int(p.relevant == 1) for p in held])
    if labels.min() == labels.max():
        return ReaderCheck(False, "not tried: the held-back fit pairs hold one class only")
    base_scores = np.asarray(base.score_pairs(held), dtype=float)
    reader_auc = _auc(labels, reader_scores)
    cross = _cross_fitted(labels, base_scores, reader_scores, held)
    if cross is None:
        return ReaderCheck(False, f"not fused: no half of the {len(held)} held-back fit pairs' "
                           "topics holds both relevant and irrelevant pairs, so what the reader "
                           "adds to 1 - cos could not be measured", _auc(labels, reader_scores),
                           _auc(labels, base_scores), len(held), None)
    base_auc, fused_auc = cross
    helps = fused_auc >= base_auc + MIN_READER_GAIN
    verdict = "fused" if helps else "not fused"
    reason = (f"{verdict}: on the fit share's held-back halves ({len(held)} pairs, each scored "
              f"by a reader fine-tuned on the other half) 1 - cos with the reader ranked them "
              f"at ROC-AUC {fused_auc:.3f} against {base_auc:.3f} for 1 - cos alone (the reader "
              f"alone {reader_auc:.3f}; it must add {MIN_READER_GAIN})")
    logger.info("reader check: %s", reason)
    return ReaderCheck(helps, reason, reader_auc, base_auc, len(held), fused_auc)


def _cross_fitted(labels: np.ndarray, base: np.ndarray, reader: np.ndarray,
                  held: Sequence[Pair]) -> tuple[float, float] | None:
    """ROC-AUC of ``base`` and of a logistic regression on (base, reader), each the mean
    over two topic-disjoint halves of the held-back pairs (the regression fitted on one
    half, measured on the other; :func:`~ragsieve.scoring.signal_check.held_back_halves`).
    None when neither way round has both classes on both sides."""
    linear = require("sklearn.linear_model", "embed")
    pipeline = require("sklearn.pipeline", "embed")
    preprocessing = require("sklearn.preprocessing", "embed")
    x = np.column_stack([base, reader])
    base_aucs, fused_aucs = [], []
    for train, test in held_back_halves(labels, held):
        model = pipeline.make_pipeline(preprocessing.StandardScaler(),
                                       linear.LogisticRegression())
        model.fit(x[train], labels[train])
        fused_aucs.append(_auc(labels[test], -model.decision_function(x[test])))
        base_aucs.append(_auc(labels[test], base[test]))
    if not fused_aucs:
        return None
    return float(np.mean(base_aucs)), float(np.mean(fused_aucs))
