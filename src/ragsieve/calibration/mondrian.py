"""Group mode (Mondrian): coverage >= 1 - alpha within every group (language, source, ...)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from .._validation import MAX_COUNT, check_aligned, check_alpha, check_positive_int, check_scores
from ..errors import ArtifactError
from ..types import DEFAULT_ALPHA
from .base import Guarantee, ThresholdCalibrator, _json_float, _read_float
from .split import SplitConformalCalibrator, relevant_scores
from .stats import min_calibration_size

__all__ = ["MondrianCalibrator"]

logger = logging.getLogger(__name__)


def _key(value: Any) -> str:
    """Groups are compared as strings, so a JSON round trip keeps them."""
    return str(value)


class MondrianCalibrator(ThresholdCalibrator):
    """Per-group (Mondrian) split conformal: coverage >= 1 - alpha within every group.

    Each group with at least ``min_group_size`` relevant calibration snippets gets its own
    threshold. Smaller groups, and groups unseen at calibration, fall back to the pooled
    (marginal) threshold: logged, and listed in ``fallback_groups_``; for them only the
    marginal guarantee holds. Group values are compared as strings.

    Parameters
    ----------
    alpha : float
    min_group_size : int, optional
        Defaults to the smallest n with a finite threshold, ``min_calibration_size(alpha)``.
    """

    mode = "group"
    fit_requires: ClassVar[frozenset[str]] = frozenset({"groups"})
    group_kind: ClassVar[str | None] = "attribute"
    predict_requires: ClassVar[frozenset[str]] = frozenset({"groups"})

    def __init__(self, *, alpha: float = DEFAULT_ALPHA, min_group_size: int | None = None) -> None:
        self.alpha = alpha
        self.min_group_size = min_group_size

    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> MondrianCalibrator:
        alpha = check_alpha(self.alpha)
        arr, rel = relevant_scores(scores, relevant)
        g = np.array([_key(x) for x in check_aligned(groups, arr.size, "groups", mode=self.mode)[rel]],
                     dtype=object)
        s = arr[rel]
        minimum = check_positive_int(self.min_group_size, "min_group_size", allow_none=True)
        minimum = minimum if minimum is not None else min_calibration_size(alpha)
        pooled = SplitConformalCalibrator(alpha=alpha).fit(s)
        self.thresholds_: dict[str, float] = {}
        self.group_sizes_: dict[str, int] = {}
        self.fallback_groups_: list[str] = []
        for key in sorted(set(g.tolist())):
            gs = s[g == key]
            self.group_sizes_[key] = int(gs.size)
            if gs.size >= minimum:
                self.thresholds_[key] = SplitConformalCalibrator(alpha=alpha).fit(gs).threshold_
            else:
                self.fallback_groups_.append(key)
        if self.fallback_groups_:
            logger.warning("group: %d group(s) below min_group_size=%d use the pooled threshold "
                           "(marginal guarantee only): %s", len(self.fallback_groups_), minimum,
                           self.fallback_groups_[:10])
        self._set_fitted(pooled.threshold_, int(s.size))
        return self

    def threshold_for(self, group: Any) -> float:
        """The threshold applied to a snippet of ``group`` (pooled for small/unseen groups)."""
        self._check_fitted()
        return self.thresholds_.get(_key(group), self.threshold_)

    def predict(self, scores: Any, *, query_ids: Any = None, groups: Any = None,
                lengths: Any = None) -> np.ndarray:
        """Keep-mask ``score <= threshold of the snippet's group``; groups are required."""
        self._check_fitted()
        arr = check_scores(scores)
        g = check_aligned(groups, arr.size, "groups", mode=self.mode).tolist()
        unseen = sorted({_key(x) for x in g} - set(self.group_sizes_))
        if unseen:
            logger.info("group: unseen group(s) %s use the pooled threshold", unseen[:10])
        taus = np.array([self.threshold_for(x) for x in g], dtype=float)
        return arr <= taus

    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        self._check_fitted()
        return self._promise(
            "group_coverage_min", "within each calibrated group, P({relevant} kept) >= {target}; "
            "small or unseen groups get the pooled (marginal) threshold", unit=unit,
            n_required=min_calibration_size(float(self.alpha)),
            details={"groups": dict(self.group_sizes_), "fallback_groups": list(self.fallback_groups_),
                     "thresholds": {k: _json_float(v) for k, v in self.thresholds_.items()}})

    def _state(self) -> dict[str, Any]:
        return {**super()._state(),
                "thresholds": {k: _json_float(v) for k, v in self.thresholds_.items()},
                "group_sizes": dict(self.group_sizes_),
                "fallback_groups": list(self.fallback_groups_)}

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        thresholds, sizes = state["thresholds"], state["group_sizes"]
        if not isinstance(thresholds, dict) or not isinstance(sizes, dict):
            raise ArtifactError("group calibration state needs 'thresholds' and 'group_sizes' objects.")
        self.thresholds_ = {str(k): _read_float(thresholds, k) for k in thresholds}
        self.group_sizes_ = {}
        for k, v in sizes.items():
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT:
                raise ArtifactError(f"group size of {k!r:.60} == {v!r:.30}, expected an int in "
                                    f"[1, {MAX_COUNT}].")
            self.group_sizes_[str(k)] = v
        self.fallback_groups_ = [str(x) for x in state.get("fallback_groups", [])]
