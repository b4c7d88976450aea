"""The fit share of the calibration topics: which pairs fit a score that learns.

A score that learns (the fused score, the reader) is fitted on a seeded share of the
calibration topics and calibrated on the others, so the threshold is calibrated on topics
the score never saw. :func:`fusion_fit_mask` draws the share; ``calibrate(seed=s)`` draws
what split 0 of ``evaluate(seed=s)`` draws; :func:`pairs_fit_mask` draws it for labelled
pairs, their topics numbered as ``evaluate`` numbers them (:func:`topic_codes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._validation import first_appearance_codes
from ..errors import CalibrationError
from ..types import Pair

__all__ = ["FUSION_FIT_FRACTION", "fit_topic_count", "fusion_fit_mask", "pairs_fit_mask",
           "topic_codes"]

#: Share of the calibration topics that fit the fusion weights; the rest calibrate the
#: threshold. Five weights need few topics, and every topic left to calibration lowers the
#: finite-sample inflation of the topic-level modes ((K+1)/K with K calibration topics).
FUSION_FIT_FRACTION = 0.25


def fit_topic_count(n_topics: int, fraction: float = FUSION_FIT_FRACTION) -> int:
    """How many of ``n_topics`` calibration topics fit the weights (at least one is left).

    Examples
    --------
    >>> fit_topic_count(24), fit_topic_count(2)
    (6, 1)
    """
    return min(n_topics - 1, max(1, round(fraction * n_topics)))


def fusion_fit_mask(topics: Any, *, seed: int = 0, split: int = 0,
                    fraction: float = FUSION_FIT_FRACTION) -> np.ndarray:
    """Which pairs fit the fused score: those of a random ``fraction`` of the topics.

    The distinct topics, in sorted order, are drawn with
    ``numpy.random.default_rng([seed, split])``; ``fit_topic_count`` of them fit the
    weights and the rest calibrate the threshold.

    Parameters
    ----------
    topics : array-like
        Topic (``Pair.group``, or its code) of every calibration pair.
    seed, split : int
        The draw: ``evaluate`` uses its seed and the split's number, ``calibrate`` its seed
        and split 0.
    fraction : float
        Share of the topics that fit the weights.

    Returns
    -------
    numpy.ndarray of bool
        True for the pairs that fit the weights.

    Raises
    ------
    CalibrationError
        Fewer than two topics.

    Examples
    --------
    >>> fusion_fit_mask([0, 0, 1, 1, 2, 2, 3, 3]).tolist()
    [False, False, False, False, True, True, False, False]
    """
    topics = np.asarray(topics)
    distinct = np.unique(topics)
    if distinct.size < 2:
        raise CalibrationError(
            f"the fused ('best') score is fitted on some of the calibration topics and "
            f"calibrated on the others; got {distinct.size} topic(s), need at least 2."
        )
    order = np.random.default_rng([seed, split]).permutation(distinct.size)
    chosen = distinct[order[:fit_topic_count(distinct.size, fraction)]]
    return np.isin(topics, chosen)


def topic_codes(pairs: Sequence[Pair]) -> np.ndarray:
    """Each pair's topic (``Pair.group``) as an int, the topics numbered by first appearance
    (as ``evaluate`` numbers them, so the draw of :func:`fusion_fit_mask` is the same).

    Examples
    --------
    >>> topic_codes([Pair("q", "Q", f"s{i}", "t", group=g) for i, g in enumerate("bab")]).tolist()
    [0, 1, 0]
    """
    return first_appearance_codes([p.group for p in pairs])


def pairs_fit_mask(pairs: Sequence[Pair], *, seed: int = 0) -> np.ndarray:
    """Which of these calibration pairs fit a score that learns when ``calibrate(seed=seed)``
    fits it: :func:`fusion_fit_mask` of their :func:`topic_codes`. The pairs it leaves are
    the ones the threshold is calibrated on.

    Raises
    ------
    CalibrationError
        Fewer than two topics.
    """
    return fusion_fit_mask(topic_codes(pairs), seed=seed)
