"""Fused score: a logistic regression on a base score and its query-relative variants.

``FusedScorer`` combines, for every snippet, the base score (``1 - cos`` by default) and
the query-relative scores of :mod:`ragsieve.scoring.relative` (gap to the best snippet,
z-score in the list, log rank, gap ratio) into ``A = -(w . x + b)``, the negative logit
of P(relevant). Lower = more relevant, as every nonconformity score.

The guarantee survives because the weights are fitted on a *separate* fold: the
calibration topics are divided in two by :func:`fusion_fit_mask`, the regression is
fitted on one part and the conformal threshold calibrated on the other, so the score is
fixed before the calibration data it is calibrated on is seen. :func:`fit_fused` is that
one fit: ``ConformalFilter.calibrate`` and every split of ``evaluate`` call it, so the
filter a user deploys is the one a split measures (``calibrate(seed=s)`` on a split's
calibration pairs is split 0 of ``evaluate(seed=s)``). The fitted weights are part of the
scorer's ``spec()`` and hence of the saved filter artifact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import CalibrationError, ScorerError
from ..types import Pair
from .base import ListTransform, Scorer
from .relative import query_index_of, relative_scores

__all__ = [
    "FEATURES", "FUSION_FIT_FRACTION", "FusedScorer", "FusionWeights", "feature_matrix",
    "fit_fused", "fit_logistic", "fit_topic_count", "fusion_fit_mask", "pair_features",
]

FEATURES = ("score", "gap", "z", "log_rank", "ratio")
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


def feature_matrix(base: np.ndarray, query_index: np.ndarray) -> np.ndarray:
    """Features of every pair, one column per name in ``FEATURES``."""
    base = np.asarray(base, dtype=float)
    return np.column_stack([
        base,
        relative_scores(base, query_index, "gap"),
        relative_scores(base, query_index, "z"),
        np.log1p(relative_scores(base, query_index, "rank")),
        relative_scores(base, query_index, "ratio"),
    ])


def pair_features(base: np.ndarray, pairs: Sequence[Pair]) -> np.ndarray:
    """:func:`feature_matrix` of pairs from their base scores, each query's pairs one list."""
    return feature_matrix(base, query_index_of(pairs))


def fit_logistic(x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, iters: int = 100) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """L2-regularised logistic regression by Newton's method on standardised features.

    Returns
    -------
    weights, bias, mean, scale
        ``logit = ((x - mean) / scale) @ weights + bias``.

    Raises
    ------
    CalibrationError
        When ``y`` holds only one class.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if y.min() == y.max():
        raise CalibrationError(
            f"the fusion fold has only {'relevant' if y.min() == 1 else 'non-relevant'} pairs; "
            "it needs both to fit the weights."
        )
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    z = np.column_stack([(x - mean) / scale, np.ones(len(x))])
    w = np.zeros(z.shape[1])
    reg = np.full(z.shape[1], l2 * len(x))
    reg[-1] = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
        grad = z.T @ (p - y) + reg * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w[:-1], float(w[-1]), mean, scale


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


@dataclass(frozen=True, eq=False)  # numpy fields: compare the arrays, not the records
class FusionWeights:
    """Fitted parameters of the fused score: ``A = -(((x - mean) / scale) @ weights + bias)``.

    Attributes
    ----------
    weights, mean, scale : numpy.ndarray
        One value per feature in ``FEATURES``.
    bias : float
    """

    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> FusionWeights:
        """Fit on a feature matrix (see :func:`feature_matrix`) and 0/1 labels (:func:`fit_logistic`)."""
        w, b, mean, scale = fit_logistic(x, y)
        return cls(weights=w, bias=b, mean=mean, scale=scale)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Fused nonconformity scores of a feature matrix (lower = more relevant)."""
        return -(((np.asarray(x, dtype=float) - self.mean) / self.scale) @ self.weights + self.bias)


def fit_fused(features: np.ndarray, relevant: Any, topics: Any, *, seed: int = 0, split: int = 0,
              fraction: float = FUSION_FIT_FRACTION) -> tuple[FusionWeights, np.ndarray]:
    """The one fit of the fused score, shared by ``calibrate`` and ``evaluate``.

    Parameters
    ----------
    features : numpy.ndarray
        Feature matrix of the calibration pairs (:func:`feature_matrix`).
    relevant : array-like of bool or 0/1
        Their labels.
    topics : array-like
        Their topics; :func:`fusion_fit_mask` draws the fitting ones.
    seed, split, fraction
        As :func:`fusion_fit_mask` takes them.

    Returns
    -------
    weights : FusionWeights
        Fitted on the pairs of the drawn topics.
    fit : numpy.ndarray of bool
        True for the pairs that fitted them; the others calibrate the threshold.

    Raises
    ------
    CalibrationError
        Fewer than two topics, or the fitting pairs hold one class only.
    """
    fit = fusion_fit_mask(topics, seed=seed, split=split, fraction=fraction)
    features = np.asarray(features, dtype=float)
    return FusionWeights.fit(features[fit], np.asarray(relevant)[fit]), fit


class FusedScorer(ListTransform):
    """``A = -logit P(relevant | features)`` with fitted weights.

    Parameters
    ----------
    base : Scorer, str or Mapping
        Base score (``"embedding"`` by default).
    weights, mean, scale : sequence of float
        Fitted parameters (one per feature in ``FEATURES``); use :meth:`fit` to get them.
    bias : float
    **base_options
        Passed to the base scorer when it is built from an alias or spec.
    """

    name: ClassVar[str] = "fusion"
    score_label: ClassVar[str] = "fused score"
    list_dependent: ClassVar[bool] = True

    def __init__(self, base: Any = "embedding", *, weights: Sequence[float] | np.ndarray | None = None,
                 bias: float = 0.0, mean: Sequence[float] | np.ndarray | None = None,
                 scale: Sequence[float] | np.ndarray | None = None, features: Sequence[str] = FEATURES,
                 **base_options: Any) -> None:
        from . import resolve_scorer

        if tuple(features) != FEATURES:
            raise ValueError(f"features == {list(features)!r}; this ragsieve computes {list(FEATURES)}.")
        self.base = resolve_scorer(base, **base_options) if base_options or not isinstance(base, Scorer) else base
        k = len(FEATURES)
        self.weights = np.zeros(k) if weights is None else np.asarray(weights, dtype=float)
        self.mean = np.zeros(k) if mean is None else np.asarray(mean, dtype=float)
        self.scale = np.ones(k) if scale is None else np.asarray(scale, dtype=float)
        for name, arr in (("weights", self.weights), ("mean", self.mean), ("scale", self.scale)):
            if arr.shape != (k,) or not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} must be {k} finite numbers, got {arr.tolist()!r}.")
        self.bias = float(bias)
        self.is_fitted = weights is not None

    @classmethod
    def unfitted(cls, base: Any = "embedding", **base_options: Any) -> FusedScorer:
        """The fused score before its weights are learned (the ``"best"`` alias).

        ``evaluate`` fits it in every split on ``FUSION_FIT_FRACTION`` of the calibration
        topics and ``ConformalFilter.calibrate`` on as many of its topics, calibrating on
        the rest; scoring with it before then raises ``ScorerError``.
        """
        return cls(base, **base_options)

    def unfitted_copy(self) -> FusedScorer:
        """The fused score on the same base without its weights (refitted where it is used)."""
        return type(self).unfitted(self.base) if self.is_fitted else self

    @classmethod
    def fit(cls, pairs: Sequence[Pair], base: Any = "embedding", *, base_scores: np.ndarray | None = None,
            **base_options: Any) -> FusedScorer:
        """Fit the weights on labelled pairs (use a fold *not* used for calibration)."""
        return cls(base, **base_options).fitted_on(pairs, base_scores=base_scores)

    def fitted_on(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None) -> FusedScorer:
        """A fitted copy sharing this scorer's base (and its loaded model)."""
        pairs = list(pairs)
        scores = self.base.score_pairs(pairs) if base_scores is None else np.asarray(base_scores, float)
        y = np.array([p.relevant == 1 for p in pairs], dtype=float)
        return self.fitted_on_features(pair_features(scores, pairs), y)

    def fitted_on_features(self, x: np.ndarray, y: np.ndarray) -> FusedScorer:
        """A fitted copy from a feature matrix (see :func:`feature_matrix`) and 0/1 labels."""
        return self.with_weights(FusionWeights.fit(x, y))

    def with_weights(self, fitted: FusionWeights) -> FusedScorer:
        """A copy with these fitted weights, sharing this scorer's base (and its loaded model)."""
        return type(self)(self.base, weights=fitted.weights, bias=fitted.bias,
                          mean=fitted.mean, scale=fitted.scale)

    @property
    def fusion_weights(self) -> FusionWeights:
        """The fitted parameters as one value (``ScorerError`` before they are fitted)."""
        self._check_fitted()
        return FusionWeights(weights=self.weights, bias=self.bias, mean=self.mean, scale=self.scale)

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ScorerError(
                "the fused ('best') score has no weights yet; calibrate it first "
                "(ConformalFilter.calibrate or `ragsieve calibrate --scorer best` fit it on "
                "a quarter of the calibration topics)."
            )

    def scores_from_features(self, x: np.ndarray) -> np.ndarray:
        return self.fusion_weights.scores(x)

    def spec(self) -> dict[str, Any]:
        if not self.is_fitted:
            return {"scorer": "best", "base": self.base.spec()}
        return {"scorer": self.name, "base": self.base.spec(), "features": list(FEATURES),
                "weights": [float(v) for v in self.weights], "bias": self.bias,
                "mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale]}

    def scores_from_base(self, base: np.ndarray) -> np.ndarray:
        """Fused scores of one query's list from its base scores (e.g. stored ``1 - cos``)."""
        base = np.asarray(base, dtype=float)
        return self.scores_from_features(feature_matrix(base, np.zeros(len(base), dtype=int)))

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's whole retrieved list (the features need the list)."""
        self._check_fitted()
        return self.scores_from_base(self.base.score_batch(query, snippets))

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        self._check_fitted()
        pairs = list(pairs)
        base = self.base.score_pairs(pairs, progress=progress)
        return self.scores_from_features(pair_features(base, pairs))

