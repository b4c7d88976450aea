"""Topic mode: coverage for a relevant snippet of a *new topic* (topics weighted equally)."""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import numpy as np

from .._validation import MAX_COUNT, check_alpha
from ..errors import ArtifactError
from .base import Guarantee, ThresholdCalibrator
from .split import relevant_by_unit
from .stats import left_out_details, left_out_of, pooled_cdf

__all__ = ["TopicCalibrator"]

logger = logging.getLogger(__name__)


class TopicCalibrator(ThresholdCalibrator):
    """Coverage for a *new topic*: the two-layer pooled-CDF rule.

    Pooled snippet-level conformal assumes snippets are exchangeable; when topics are
    the exchangeable units (calibrate on some topics, deploy on others) the number that
    matters is K, the number of calibration topics. With ``F_k`` the empirical CDF of
    topic k's relevant scores, ``threshold_`` is the smallest score t with

        (1/K) * sum_k F_k(t) >= (1 - alpha) * (K + 1) / K,

    the pooled-CDF method of Dunn, Wasserman & Ramdas (2022, *Distribution-free
    prediction sets for two-layer hierarchical models*): each topic weighs the same
    however many snippets it has, and the (K+1)/K inflation is the finite-sample
    correction at the topic level. The level exceeds 1 — threshold ``+inf`` with a
    warning — unless ``K >= (1 - alpha) / alpha`` (9 topics at alpha = 0.1, 4 at 0.2):
    ``topics_required_``. ``groups`` passed to ``fit`` are the topics; a topic without a
    relevant snippet has no CDF and is left out (logged, ``n_topics_left_out_``, a note
    in the guarantee).
    """

    mode = "topic"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"groups"})
    group_kind: ClassVar[str | None] = "topic"

    def topics_needed(self) -> tuple[int, str]:
        """``ceil((1 - alpha) / alpha)`` topics: fewer cannot reach the ``(1 - alpha)(K + 1) / K``
        level of the pooled per-topic coverage.

        Examples
        --------
        >>> TopicCalibrator(alpha=0.1).topics_needed()[0]
        9
        """
        alpha = check_alpha(self.alpha)
        k = math.ceil((1 - alpha) / alpha - 1e-9)
        return k, (f"mode topic at alpha {alpha:g} needs at least {k} calibration topics with "
                   f"evidence: with K topics the threshold is the (1 - alpha)(K + 1)/K level "
                   "of their pooled coverage, which is above 1 for fewer")

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> TopicCalibrator:
        alpha = check_alpha(self.alpha)
        relevant_s, g, self.n_topics_left_out_ = relevant_by_unit(
            scores, relevant, groups, name="groups (topics)", mode=self.mode, unit="topic")
        cand, cdf, k = pooled_cdf(relevant_s, g)
        self.n_topics_ = int(k)
        self.topics_required_ = math.ceil((1 - alpha) / alpha - 1e-9)
        level = (1 - alpha) * (k + 1) / k
        ok = np.flatnonzero(cdf >= level - 1e-12)
        self._set_fitted(float(cand[ok[0]]) if ok.size else math.inf, int(relevant_s.size))
        if self.infinite_:
            logger.warning("topic: %d calibration topics are too few for alpha=%g (need >= %d); "
                           "threshold is +inf (keep everything).", k, alpha, self.topics_required_)
        return self

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "n_topics": self.n_topics_,
                "n_topics_left_out": self.n_topics_left_out_}

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        k = state["n_topics"]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_COUNT:
            raise ArtifactError(f"topic calibration state n_topics == {k!r:.30}, expected an int "
                                f"in [1, {MAX_COUNT}].")
        self.n_topics_ = k
        self.n_topics_left_out_ = left_out_of(state, "topic", self.mode)
        self.topics_required_ = math.ceil((1 - check_alpha(self.alpha)) / self.alpha - 1e-9)

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        return self._promise(
            "topic_coverage", "{a_relevant} of a new topic (topics weighted equally) is kept "
            "with probability >= {target}", unit=unit, n_calibration=self.n_topics_,
            n_required=self.topics_required_,
            details={"unit": "topic", "n_relevant": self.n_calibration_,
                     **left_out_details(self.n_topics_left_out_, "topic")})
