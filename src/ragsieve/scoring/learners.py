"""The learners of the fused score: logistic regression and monotone boosted trees.

A learner maps the features of a fused score's signals (:mod:`ragsieve.scoring.fusion`)
to ``-logit P(relevant)``. :func:`fit_learner` fits one by name; :func:`read_fitted` reads a
fitted one back from the parameters a saved spec records (the logistic weights as lists,
the trees as node arrays: :mod:`ragsieve.scoring.boosting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CalibrationError
from .boosting import BoostedTrees

__all__ = ["LEARNERS", "LEARNER_TYPES", "FittedFusion", "FusionWeights", "check_learner",
           "fit_learner", "fit_logistic", "read_fitted"]

#: The learners of the fused score: logistic regression, monotone boosted trees.
LEARNERS = ("logistic", "boosted")


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
        """Fused nonconformity scores of a feature matrix (lower = more relevant), rounded to
        12 decimals: a matrix product may give two equal rows results a last bit apart
        (its vectorised loops differ by the row's memory alignment), and equal texts of one
        list must get one score."""
        return np.round(-(((np.asarray(x, dtype=float) - self.mean) / self.scale)
                          @ self.weights + self.bias), 12)


FittedFusion = FusionWeights | BoostedTrees
"""A fitted learner of the fused score: anything with ``scores(features)``."""

LEARNER_TYPES: dict[str, type[FusionWeights | BoostedTrees]] = {
    "logistic": FusionWeights, "boosted": BoostedTrees}


def check_learner(learner: Any) -> str:
    """``learner`` if it names a learner, else ``ValueError`` listing them."""
    if learner not in LEARNERS:
        raise ValueError(f"learner == {learner!r}, must be one of {', '.join(map(repr, LEARNERS))}.")
    return str(learner)


def fit_learner(learner: str, x: np.ndarray, y: np.ndarray) -> FittedFusion:
    """Fit ``learner`` (``"logistic"`` or ``"boosted"``) on a feature matrix and 0/1 labels.

    Raises
    ------
    CalibrationError
        ``y`` holds one class only.
    """
    return LEARNER_TYPES[check_learner(learner)].fit(x, y)


def read_fitted(learner: str, k: int, params: Mapping[str, Any]) -> FittedFusion | None:
    """The fitted learner from a spec's parameters (``weights``, ``bias``, ``mean``,
    ``scale`` or ``trees``) for ``k`` features; None: not fitted yet.

    Raises
    ------
    ValueError
        The other learner's parameters, or arrays not ``k`` finite numbers.
    """
    weights, trees = params.get("weights"), params.get("trees")
    if learner == "boosted":
        if weights is not None:
            raise ValueError("weights are the logistic learner's; the boosted learner takes trees.")
        return None if trees is None else BoostedTrees.from_dict(trees, k)
    if trees is not None:
        raise ValueError("trees are the boosted learner's; pass learner='boosted'.")
    arrays = {name: np.full(k, fill) if params.get(name) is None else
              np.asarray(params[name], dtype=float)
              for name, fill in (("weights", 0.0), ("mean", 0.0), ("scale", 1.0))}
    for name, arr in arrays.items():
        if arr.shape != (k,) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be {k} finite numbers, got {arr.tolist()!r}.")
    if weights is None:
        return None
    return FusionWeights(weights=arrays["weights"], bias=float(params.get("bias", 0.0)),
                         mean=arrays["mean"], scale=arrays["scale"])
