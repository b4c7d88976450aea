"""Gradient-boosted trees for the fused score, fitted by scikit-learn, kept and applied as JSON.

:meth:`BoostedTrees.fit` fits scikit-learn's ``HistGradientBoostingClassifier`` with every
feature constrained to lower P(relevant) as it grows (``monotonic_cst = -1``: each feature is
a nonconformity-like quantity, higher = less relevant), then exports the fitted trees to
plain arrays: per tree ``feature``, ``threshold``, ``left``, ``right``, ``is_leaf``,
``value`` and ``missing_go_to_left``, plus the ``baseline`` logit. A saved filter stores
them as JSON (:meth:`BoostedTrees.to_dict`) and scores with the small vectorised walker of
:meth:`BoostedTrees.decision`: nothing is ever unpickled, and scoring needs numpy alone.

The model is kept small on principle, not tuned on the shared data: the fit set is a quarter
of the calibration topics (a few hundred relevant pairs; on SelQA one topic), too few to hold
topics out for early stopping, so a fixed 100 trees of at most 15 leaves, each leaf at least
20 pairs, learning rate 0.1, L2 penalty 1 on the leaf values, ``random_state=0``
(:data:`BOOSTING_PARAMS`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._optional import require
from ..errors import CalibrationError

__all__ = ["BOOSTING_PARAMS", "BoostedTrees", "Tree"]

#: The parameters of ``HistGradientBoostingClassifier`` (``monotonic_cst`` is added per fit).
BOOSTING_PARAMS: dict[str, Any] = {
    "max_iter": 100, "learning_rate": 0.1, "max_leaf_nodes": 15, "min_samples_leaf": 20,
    "l2_regularization": 1.0, "early_stopping": False, "random_state": 0,
}

_TREE_FIELDS = ("feature", "threshold", "left", "right", "is_leaf", "value", "missing_go_to_left")


@dataclass(frozen=True, eq=False)  # numpy fields
class Tree:
    """One regression tree as flat node arrays (node 0 is the root; children come after
    their parent). An internal node sends a row left when ``x[feature] <= threshold`` (a
    missing value where ``missing_go_to_left``); a leaf adds ``value`` to the logit."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    is_leaf: np.ndarray
    value: np.ndarray
    missing_go_to_left: np.ndarray

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any], n_features: int, where: str) -> Tree:
        """Read one tree of :meth:`BoostedTrees.to_dict`, checking every array.

        Raises
        ------
        ValueError
            A missing or extra field, arrays of different lengths, non-finite numbers, a
            feature out of range, or a child that does not come after its parent.
        """
        if not isinstance(tree, Mapping) or set(tree) != set(_TREE_FIELDS):
            got = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
            raise ValueError(f"{where} has fields {got}, expected {sorted(_TREE_FIELDS)}.")
        try:
            arrays = {
                "feature": np.asarray(tree["feature"], dtype=np.int64),
                "threshold": np.asarray(tree["threshold"], dtype=np.float64),
                "left": np.asarray(tree["left"], dtype=np.int64),
                "right": np.asarray(tree["right"], dtype=np.int64),
                "is_leaf": _bools(tree["is_leaf"]),
                "value": np.asarray(tree["value"], dtype=np.float64),
                "missing_go_to_left": _bools(tree["missing_go_to_left"]),
            }
        except (TypeError, ValueError, OverflowError) as exc:  # Overflow: beyond an int64
            raise ValueError(f"{where}: {exc}") from exc
        n = arrays["feature"].shape
        if len(n) != 1 or not n[0] or any(a.shape != n for a in arrays.values()):
            raise ValueError(f"{where}: the node arrays must be non-empty lists of one length, "
                             f"got lengths {[np.shape(a) for a in arrays.values()]}.")
        if not (np.isfinite(arrays["threshold"]).all() and np.isfinite(arrays["value"]).all()):
            raise ValueError(f"{where}: thresholds and values must be finite numbers.")
        inner = ~arrays["is_leaf"]
        nodes = np.arange(n[0])
        f, lo, hi = arrays["feature"][inner], arrays["left"][inner], arrays["right"][inner]
        if ((f < 0) | (f >= n_features)).any():
            raise ValueError(f"{where}: a split feature is outside 0..{n_features - 1}.")
        if ((lo <= nodes[inner]) | (hi <= nodes[inner]) | (lo >= n[0]) | (hi >= n[0])).any():
            raise ValueError(f"{where}: every child must be a later node of the tree.")
        return cls(**arrays)

    def to_dict(self) -> dict[str, list[Any]]:
        """The node arrays as JSON lists."""
        return {"feature": [int(v) for v in self.feature],
                "threshold": [float(v) for v in self.threshold],
                "left": [int(v) for v in self.left], "right": [int(v) for v in self.right],
                "is_leaf": [bool(v) for v in self.is_leaf], "value": [float(v) for v in self.value],
                "missing_go_to_left": [bool(v) for v in self.missing_go_to_left]}


def _bools(values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype != np.bool_:
        raise ValueError(f"expected a list of true/false, got dtype {arr.dtype}")
    return arr


@dataclass(frozen=True, eq=False)
class BoostedTrees:
    """Fitted boosted trees: ``logit = baseline + sum of the trees' leaf values``.

    Attributes
    ----------
    baseline : float
        The initial logit (the log-odds of the fit set's relevant share).
    trees : tuple of Tree
    n_features : int
    """

    baseline: float
    trees: tuple[Tree, ...]
    n_features: int

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> BoostedTrees:
        """Fit ``HistGradientBoostingClassifier`` (:data:`BOOSTING_PARAMS`, every feature
        monotone decreasing) on a feature matrix and 0/1 labels and export its trees.

        Raises
        ------
        CalibrationError
            ``y`` holds one class only.
        ImportError
            scikit-learn is not installed (extra ``embed``).
        """
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if y.size == 0 or y.min() == y.max():
            kind = "no" if y.size == 0 else ("only relevant" if y.min() == 1 else "only non-relevant")
            raise CalibrationError(f"the fusion fold has {kind} pairs; it needs both to fit "
                                   "the boosted trees.")
        ensemble = require("sklearn.ensemble", "embed")
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # a scikit-learn dependency

        clf = ensemble.HistGradientBoostingClassifier(
            **BOOSTING_PARAMS, monotonic_cst=[-1] * x.shape[1])
        # one thread: on a fit set of a few thousand rows OpenMP threads cost more than
        # they save, and the result is the same
        with threadpool_limits(limits=1, user_api="openmp"):
            clf.fit(x, y.astype(int))
        return cls.from_classifier(clf)

    @classmethod
    def from_classifier(cls, clf: Any) -> BoostedTrees:
        """Export a fitted binary ``HistGradientBoostingClassifier`` (numeric features)."""
        trees = []
        for (predictor,) in clf._predictors:  # one tree per iteration for a binary model
            nodes = predictor.nodes
            if nodes["is_categorical"].any():
                raise ValueError("categorical splits cannot be exported; the fused score's "
                                 "features are numeric.")
            trees.append(Tree(
                feature=nodes["feature_idx"].astype(np.int64),
                threshold=nodes["num_threshold"].astype(np.float64),
                left=nodes["left"].astype(np.int64), right=nodes["right"].astype(np.int64),
                is_leaf=nodes["is_leaf"].astype(bool), value=nodes["value"].astype(np.float64),
                missing_go_to_left=nodes["missing_go_to_left"].astype(bool)))
        baseline = float(np.asarray(clf._baseline_prediction, dtype=np.float64).ravel()[0])
        return cls(baseline=baseline, trees=tuple(trees), n_features=int(clf.n_features_in_))

    def decision(self, x: np.ndarray) -> np.ndarray:
        """The logit of P(relevant) of each row (scikit-learn's ``decision_function``).

        Every row walks down every tree at once: the trees' nodes are laid end to end, so
        the walk takes as many numpy steps as the deepest tree has levels.
        """
        x = self._check(x)
        raw = np.zeros(len(x), dtype=np.float64)
        raw += self.baseline
        if not self.trees or not len(x):
            return raw
        forest, roots = self._forest
        n_trees = roots.size
        node = np.tile(roots, len(x))  # row i, tree j at i * n_trees + j
        row = np.repeat(np.arange(len(x)), n_trees)
        active = np.flatnonzero(~forest.is_leaf[node])
        while active.size:
            at = node[active]
            v = x[row[active], forest.feature[at]]
            left = np.where(np.isnan(v), forest.missing_go_to_left[at], v <= forest.threshold[at])
            node[active] = nxt = np.where(left, forest.left[at], forest.right[at])
            active = active[~forest.is_leaf[nxt]]
        leaves = forest.value[node].reshape(len(x), n_trees)
        for j in range(n_trees):  # tree by tree, as scikit-learn adds them up
            raw += leaves[:, j]
        return raw

    @functools.cached_property
    def _forest(self) -> tuple[Tree, np.ndarray]:
        """All trees as one node array (children offset to their tree), and each tree's root."""
        offsets = np.cumsum([0] + [t.feature.size for t in self.trees[:-1]])
        cat = {f: np.concatenate([getattr(t, f) + o if f in ("left", "right") else getattr(t, f)
                                  for t, o in zip(self.trees, offsets, strict=True)])
               for f in _TREE_FIELDS}
        return Tree(**cat), offsets.astype(np.int64)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Fused nonconformity scores: the negative logit (lower = more relevant)."""
        return -self.decision(x)

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"features of shape {x.shape}; these trees take "
                             f"(n, {self.n_features}).")
        return x

    def to_dict(self) -> dict[str, Any]:
        """``{"baseline", "trees": [{feature, threshold, left, right, is_leaf, value,
        missing_go_to_left}, ...]}`` (JSON-ready)."""
        return {"baseline": self.baseline, "trees": [t.to_dict() for t in self.trees]}

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any], n_features: int) -> BoostedTrees:
        """Read :meth:`to_dict`'s output for ``n_features`` features, checking every tree.

        Raises
        ------
        TypeError
            The baseline or the tree list of another type.
        ValueError
            A malformed payload (the message names the tree and the rule).
        """
        if not isinstance(payload, Mapping) or set(payload) != {"baseline", "trees"}:
            got = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
            raise ValueError(f"boosted trees have fields {got}, expected ['baseline', 'trees'].")
        baseline, trees = payload["baseline"], payload["trees"]
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float)):
            raise TypeError(f"boosted trees: baseline is {type(baseline).__name__}, expected a "
                            "number.")
        if not np.isfinite(baseline):
            raise ValueError(f"boosted trees: baseline == {baseline!r}, must be finite.")
        if not isinstance(trees, Sequence) or isinstance(trees, (str, bytes)):
            raise TypeError(f"boosted trees: trees is {type(trees).__name__}, expected a list.")
        return cls(baseline=float(baseline), n_features=n_features,
                   trees=tuple(Tree.from_dict(t, n_features, f"tree {i}")
                               for i, t in enumerate(trees)))
