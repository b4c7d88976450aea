"""Fused score: a learned combination of signals and their query-relative variants.

``FusedScorer`` computes, for every snippet, the scores of its *signals* -- its base score
(``1 - cos`` of the language's embedder by default) and those its preset adds
(:mod:`ragsieve.scoring.signals`: the in-list BM25, the other embedders of the language,
the best sentence's cosine) -- and for each the query-relative scores of
:mod:`ragsieve.scoring.relative` (gap to the best snippet, z-score in the list, log rank,
gap ratio). A learner maps these features to ``A = -logit P(relevant)``: logistic
regression (:func:`fit_logistic`) or monotone gradient-boosted trees
(:mod:`ragsieve.scoring.boosting`). Lower = more relevant, as every nonconformity score.

The guarantee survives because the learner is fitted on a *separate* fold: the
calibration topics are divided in two by :func:`fusion_fit_mask`, the learner is fitted on
one part and the conformal threshold calibrated on the other, so the score is fixed before
the calibration data it is calibrated on is seen; every signal is a fixed function of the
query and its list, never of labels. :func:`fit_fused` is that one fit:
``ConformalFilter.calibrate`` and every split of ``evaluate`` call it, on the features
:meth:`FusedScorer.features_of_pairs` computes, so the filter a user deploys is the one a
split measures (``calibrate(seed=s)`` on a split's calibration pairs is split 0 of
``evaluate(seed=s)``). The fitted parameters are part of the scorer's ``spec()`` and hence
of the saved filter artifact (JSON; the trees as node arrays, never a pickle).

A fused score of its base alone with the logistic learner is the fused score of earlier
ragsieve versions: its spec has their format (``features`` = :data:`FEATURES`, ``weights``,
``bias``, ``mean``, ``scale``), so their artifacts load and score as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._validation import check_str
from ..errors import CalibrationError, ScorerError
from ..types import Pair
from .base import ListTransform, Scorer, check_score_array
from .boosting import BoostedTrees
from .embedding import EMBEDDING_OPTIONS
from .options import ScorerOption
from .relative import query_index_of, relative_scores
from .signals import (
    DEFAULT_PRESET,
    PRESET_LEARNERS,
    PRESETS,
    check_preset,
    preset_signals,
    signal_label,
)

__all__ = [
    "FEATURES", "FUSION_FIT_FRACTION", "LEARNERS", "FittedFusion", "FusedScorer", "FusionFeatures",
    "FusionWeights", "as_fusion_features", "feature_matrix", "fit_fused", "fit_learner",
    "fit_logistic", "fit_topic_count", "fusion_fit_mask", "pair_features", "signals_feature_matrix",
]

#: The features of one signal (its score and its four list-relative transforms); the
#: feature names of a fused score of its base alone.
FEATURES = ("score", "gap", "z", "log_rank", "ratio")
#: The learners of the fused score: logistic regression, monotone boosted trees.
LEARNERS = ("logistic", "boosted")
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


def signals_feature_matrix(signal_scores: Sequence[np.ndarray], query_index: np.ndarray) -> np.ndarray:
    """The :func:`feature_matrix` of each signal's scores side by side (``5 x signals`` columns)."""
    return np.column_stack([feature_matrix(s, query_index) for s in signal_scores])


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


FittedFusion = FusionWeights | BoostedTrees
"""A fitted learner of the fused score: anything with ``scores(features)``."""

_LEARNER_TYPES: dict[str, type[FusionWeights | BoostedTrees]] = {
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
    return _LEARNER_TYPES[check_learner(learner)].fit(x, y)


@dataclass(frozen=True, eq=False)  # a numpy field
class FusionFeatures:
    """The features of labelled pairs and the learner to fit on them (what ``evaluate``
    passes from :func:`~ragsieve.evaluation.sweep.score_for_evaluation` to each split).

    Attributes
    ----------
    matrix : numpy.ndarray
        One row per pair, one column per name in ``names``.
    learner : {"logistic", "boosted"}
    names : tuple of str
    """

    matrix: np.ndarray
    learner: str = "logistic"
    names: tuple[str, ...] = FEATURES


def as_fusion_features(features: np.ndarray | FusionFeatures) -> FusionFeatures:
    """``features`` as :class:`FusionFeatures`; a bare matrix (:func:`feature_matrix`) is
    fitted by logistic regression, as before the learners were several."""
    if isinstance(features, FusionFeatures):
        return features
    matrix = np.asarray(features, dtype=float)
    if matrix.ndim != 2:
        raise ValueError(f"fusion features have shape {matrix.shape}, expected (n_pairs, n_features).")
    names = FEATURES if matrix.shape[1] == len(FEATURES) else tuple(
        f"x{i}" for i in range(matrix.shape[1]))
    return FusionFeatures(matrix, "logistic", names)


def fit_fused(features: np.ndarray, relevant: Any, topics: Any, *, seed: int = 0, split: int = 0,
              fraction: float = FUSION_FIT_FRACTION, learner: str = "logistic",
              ) -> tuple[FittedFusion, np.ndarray]:
    """The one fit of the fused score, shared by ``calibrate`` and ``evaluate``.

    Parameters
    ----------
    features : numpy.ndarray
        Feature matrix of the calibration pairs (:meth:`FusedScorer.features_of_pairs`).
    relevant : array-like of bool or 0/1
        Their labels.
    topics : array-like
        Their topics; :func:`fusion_fit_mask` draws the fitting ones.
    seed, split, fraction
        As :func:`fusion_fit_mask` takes them.
    learner : {"logistic", "boosted"}
        What is fitted (:func:`fit_learner`).

    Returns
    -------
    fitted : FusionWeights or BoostedTrees
        Fitted on the pairs of the drawn topics.
    fit : numpy.ndarray of bool
        True for the pairs that fitted them; the others calibrate the threshold.

    Raises
    ------
    CalibrationError
        Fewer than two topics, or the fitting pairs hold one class only.
    """
    check_learner(learner)
    fit = fusion_fit_mask(topics, seed=seed, split=split, fraction=fraction)
    features = np.asarray(features, dtype=float)
    return fit_learner(learner, features[fit], np.asarray(relevant, dtype=float)[fit]), fit


class FusedScorer(ListTransform):
    """``A = -logit P(relevant | features)``: a fitted learner on the features of the signals.

    Parameters
    ----------
    base : Scorer, str or Mapping
        Base score (``"embedding"`` by default): the first signal, and the score the
        baselines of ``evaluate`` use.
    signals : sequence of Scorer or spec Mapping, optional
        The signals besides the base (a saved spec records them); default: those of
        ``preset`` (:func:`~ragsieve.scoring.signals.preset_signals`), none without one.
    preset : {"base", "fast", "quality"} or None
        Which signals and learner (see :mod:`ragsieve.scoring.signals`); None or ``"base"``:
        the base alone, fitted by logistic regression (the fused score of earlier versions).
    learner : {"logistic", "boosted"} or None
        The learner; default: the preset's (logistic without a preset).
    query_language : str or None
        The queries' language when they are asked in another language than the snippets
        are written in (the base's language): the preset's signals are then those for
        queries across languages (:func:`~ragsieve.scoring.signals.preset_signals`), and a
        base built here from an alias without a model gets the bundled model trained on
        both languages (:func:`~ragsieve.embeddings.choose_model`). A saved spec records the
        signals themselves, so it needs no language to rebuild.
    weights, bias, mean, scale
        Fitted logistic parameters (one per feature); use :meth:`fit` to get them.
    trees : Mapping, optional
        Fitted boosted trees (:meth:`BoostedTrees.to_dict
        <ragsieve.scoring.boosting.BoostedTrees.to_dict>`).
    features : sequence of str, optional
        The feature names a saved spec records; checked against those computed.
    **base_options
        Passed to the base scorer when it is built from an alias or spec; the ``runtime``
        ones (the embedding cache) also to signals built from specs.
    """

    name: ClassVar[str] = "fusion"
    score_label: ClassVar[str] = "fused score"
    list_dependent: ClassVar[bool] = True

    def __init__(self, base: Any = "embedding", *, signals: Sequence[Any] | None = None,
                 preset: str | None = None, learner: str | None = None,
                 query_language: str | None = None,
                 weights: Sequence[float] | np.ndarray | None = None, bias: float = 0.0,
                 mean: Sequence[float] | np.ndarray | None = None,
                 scale: Sequence[float] | np.ndarray | None = None,
                 trees: Mapping[str, Any] | None = None, features: Sequence[str] | None = None,
                 **base_options: Any) -> None:
        from . import resolve_scorer

        query_language = check_str(query_language, "query_language", non_blank=True, allow_none=True)
        if query_language is not None and base == "embedding" and base_options.get("model") is None:
            from ..embeddings.languages import choose_model

            base_options = {**base_options, "model": choose_model(
                str(base_options.get("language") or "en"), query_language)}
        self.base = resolve_scorer(base, **base_options) if base_options or not isinstance(base, Scorer) else base
        # "base": the base alone, the fused score of earlier versions (and their spec format)
        self.preset = None if preset is None or check_preset(preset) == "base" else preset
        if signals is None:
            signals = preset_signals(self.base, self.preset, query_language) if self.preset else []
        elif isinstance(signals, (str, bytes, Mapping, Scorer)):
            raise TypeError(f"signals is a {type(signals).__name__}, expected a list of scorers "
                            "or scorer specs.")
        self.signals: tuple[Scorer, ...] = tuple(_signal(s, base_options) for s in signals)
        self.learner = check_learner(
            learner if learner is not None else PRESET_LEARNERS[self.preset] if self.preset else "logistic")
        names = self.feature_names
        if features is not None and tuple(features) != names:
            raise ValueError(f"features == {list(features)!r}; this ragsieve computes {list(names)} "
                             "for these signals.")
        self._fitted = self._read_fitted(weights, bias, mean, scale, trees)
        self.is_fitted = self._fitted is not None

    def _read_fitted(self, weights: Any, bias: float, mean: Any, scale: Any,
                     trees: Mapping[str, Any] | None) -> FittedFusion | None:
        """The fitted learner from the constructor's parameters (None: not fitted yet)."""
        k = len(self.feature_names)
        if self.learner == "boosted":
            if weights is not None:
                raise ValueError("weights are the logistic learner's; the boosted learner takes trees.")
            return None if trees is None else BoostedTrees.from_dict(trees, k)
        if trees is not None:
            raise ValueError("trees are the boosted learner's; pass learner='boosted'.")
        arrays = {"weights": np.zeros(k) if weights is None else np.asarray(weights, dtype=float),
                  "mean": np.zeros(k) if mean is None else np.asarray(mean, dtype=float),
                  "scale": np.ones(k) if scale is None else np.asarray(scale, dtype=float)}
        for name, arr in arrays.items():
            if arr.shape != (k,) or not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} must be {k} finite numbers, got {arr.tolist()!r}.")
        self.weights, self.mean, self.scale = arrays["weights"], arrays["mean"], arrays["scale"]
        self.bias = float(bias)
        if weights is None:
            return None
        return FusionWeights(weights=self.weights, bias=self.bias, mean=self.mean, scale=self.scale)

    @classmethod
    def unfitted(cls, base: Any = "embedding", *, preset: str | None = DEFAULT_PRESET,
                 query_language: str | None = None, **options: Any) -> FusedScorer:
        """The fused score before it is fitted (the ``"best"`` alias): ``preset``'s signals
        and learner (:mod:`ragsieve.scoring.signals`), those for queries in
        ``query_language`` when it is not the snippets' language.

        ``evaluate`` fits it in every split on ``FUSION_FIT_FRACTION`` of the calibration
        topics and ``ConformalFilter.calibrate`` on as many of its topics, calibrating on
        the rest; scoring with it before then raises ``ScorerError``.
        """
        return cls(base, preset=preset, query_language=query_language, **options)

    # ------------------------------------------------------------------ signals, features
    @property
    def signal_scorers(self) -> tuple[Scorer, ...]:
        """Every signal: the base first, then :attr:`signals`."""
        return (self.base, *self.signals)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """One name per feature: :data:`FEATURES` for the base alone, else
        ``"<signal>.<feature>"`` for every signal (``"bm25-list.gap"``)."""
        if not self.signals:
            return FEATURES
        labels = [signal_label(s.spec()) for s in self.signal_scorers]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"the fused score has the signal(s) {twice} twice; give each once.")
        return tuple(f"{label}.{f}" for label in labels for f in FEATURES)

    def features_of_pairs(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None,
                          progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix of pairs (each query's pairs one list) from every signal.

        Each signal scores all pairs once (batched); ``base_scores``, when given, are the
        base's (e.g. already computed by an engine) and the base is not asked again.

        Returns
        -------
        features, base_scores : numpy.ndarray
            ``(len(pairs), len(feature_names))`` and the base's scores.
        """
        pairs = list(pairs)
        base = (self.base.score_pairs(pairs, progress=progress) if base_scores is None
                else check_score_array(base_scores, len(pairs)))
        scores = [base, *(s.score_pairs(pairs, progress=progress) for s in self.signals)]
        return signals_feature_matrix(scores, query_index_of(pairs)), base

    def features_of_list(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """The feature matrix of one query's whole list."""
        texts = list(snippets)
        scores = [check_score_array(s.score_batch(query, texts), len(texts))
                  for s in self.signal_scorers]
        return signals_feature_matrix(scores, np.zeros(len(texts), dtype=int))

    def features_for_evaluation(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None,
                                progress: bool = False) -> FusionFeatures:
        """:meth:`features_of_pairs` with this score's learner, as ``evaluate`` fits it per split."""
        x, _ = self.features_of_pairs(pairs, base_scores=base_scores, progress=progress)
        return FusionFeatures(x, self.learner, self.feature_names)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Every signal's model work for ``snippets`` (the features come later)."""
        for signal in self.signal_scorers:
            signal.prepare(query, snippets)

    # ------------------------------------------------------------------ fitting
    def unfitted_copy(self) -> FusedScorer:
        """The fused score on the same signals without its fitted learner (refitted where it is used)."""
        if not self.is_fitted:
            return self
        return type(self)(self.base, signals=self.signals, preset=self.preset, learner=self.learner)

    @classmethod
    def fit(cls, pairs: Sequence[Pair], base: Any = "embedding", *, base_scores: np.ndarray | None = None,
            **options: Any) -> FusedScorer:
        """Fit on labelled pairs (use a fold *not* used for calibration); ``options`` as the
        constructor takes them (``preset``, ``learner``, the base's)."""
        return cls(base, **options).fitted_on(pairs, base_scores=base_scores)

    def fitted_on(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None) -> FusedScorer:
        """A fitted copy sharing this scorer's signals (and their loaded models)."""
        pairs = list(pairs)
        x, _ = self.features_of_pairs(pairs, base_scores=base_scores)
        y = np.array([p.relevant == 1 for p in pairs], dtype=float)
        return self.fitted_on_features(x, y)

    def fitted_on_features(self, x: np.ndarray, y: np.ndarray) -> FusedScorer:
        """A fitted copy from a feature matrix (:meth:`features_of_pairs`) and 0/1 labels."""
        return self.with_weights(fit_learner(self.learner, x, y))

    def with_weights(self, fitted: FittedFusion) -> FusedScorer:
        """A copy with this fitted learner (:func:`fit_fused`'s), sharing the signals.

        Raises
        ------
        TypeError
            ``fitted`` is another learner's than this score's.
        """
        if not isinstance(fitted, _LEARNER_TYPES[self.learner]):
            raise TypeError(f"fitted is a {type(fitted).__name__}; the {self.learner} learner "
                            f"gives a {_LEARNER_TYPES[self.learner].__name__}.")
        params: dict[str, Any] = (
            {"trees": fitted.to_dict()} if isinstance(fitted, BoostedTrees) else
            {"weights": fitted.weights, "bias": fitted.bias, "mean": fitted.mean, "scale": fitted.scale})
        return type(self)(self.base, signals=self.signals, preset=self.preset,
                          learner=self.learner, **params)

    def map_signals(self, wrap: Callable[[Scorer], Scorer]) -> FusedScorer:
        """The same fused score (same spec, same fitted learner) with every signal replaced
        by ``wrap(signal)`` -- e.g. run on an engine; ``wrap`` must keep each signal's spec.

        Raises
        ------
        ValueError
            A wrapped signal has another spec.
        """
        wrapped = [wrap(s) for s in self.signal_scorers]
        for old, new in zip(self.signal_scorers, wrapped, strict=True):
            if new.spec() != old.spec():
                raise ValueError(f"wrap changed the signal {old.spec()!r} into {new.spec()!r}.")
        out = type(self)(wrapped[0], signals=wrapped[1:], preset=self.preset, learner=self.learner)
        return out.with_weights(self._fitted) if self._fitted is not None else out

    @property
    def fusion_weights(self) -> FittedFusion:
        """The fitted learner as one value (``ScorerError`` before it is fitted)."""
        return self._check_fitted()

    def _check_fitted(self) -> FittedFusion:
        if self._fitted is None:
            raise ScorerError(
                "the fused ('best') score has no weights yet; calibrate it first "
                "(ConformalFilter.calibrate or `ragsieve calibrate --scorer best` fit it on "
                "a quarter of the calibration topics)."
            )
        return self._fitted

    # ------------------------------------------------------------------ scoring
    def scores_from_features(self, x: np.ndarray) -> np.ndarray:
        """Fused scores of a feature matrix (:meth:`features_of_pairs`)."""
        return self.fusion_weights.scores(x)

    def spec(self) -> dict[str, Any]:
        """The signals, the learner and (once fitted) its parameters.

        The base alone with logistic regression and no preset gives the format of earlier
        versions: ``{"scorer": "fusion", "base", "features", "weights", "bias", "mean",
        "scale"}``. Unfitted, the spec is the ``"best"`` alias's and records the preset
        (None for the base alone) so that it rebuilds the same score.
        """
        base = self.base.spec()
        legacy = self.preset is None and not self.signals and self.learner == "logistic"
        about: dict[str, Any] = {} if legacy else {
            **({"preset": self.preset} if self.preset else {}),
            "signals": [s.spec() for s in self.signals], "learner": self.learner}
        if not self.is_fitted:
            return {"scorer": "best", "base": base, **about, "preset": self.preset}
        fitted = self.fusion_weights
        params: dict[str, Any] = (
            {"trees": fitted.to_dict()} if isinstance(fitted, BoostedTrees) else
            {"weights": [float(v) for v in self.weights], "bias": self.bias,
             "mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale]})
        return {"scorer": self.name, "base": base, **about,
                "features": list(self.feature_names), **params}

    def _several(self, what: str) -> TypeError:
        names = ", ".join(s.spec()["scorer"] for s in self.signals)
        return TypeError(f"the fused score of several signals (the base and {names}) cannot {what}: "
                         "only its base's score comes from there; score the snippet texts "
                         "(score_batch / filter), or calibrate a fused score of the base alone "
                         "(FusedScorer(base)).")

    def scores_from_base(self, base: np.ndarray) -> np.ndarray:
        """Fused scores of one query's list from its base scores (e.g. stored ``1 - cos``).

        Raises
        ------
        TypeError
            The score has signals besides its base (they need the texts).
        """
        if self.signals:
            raise self._several("be computed from its base's scores alone")
        base = np.asarray(base, dtype=float)
        return self.scores_from_features(feature_matrix(base, np.zeros(len(base), dtype=int)))

    def scores_from_vectors(self, query_vector: Any, snippet_vectors: Any) -> np.ndarray:
        """Fused scores from the caller's vectors (the base alone; see :meth:`scores_from_base`).

        Raises
        ------
        TypeError
            The score has signals besides its base, or the base takes no vectors.
        """
        if self.signals:
            raise self._several("score from vectors")
        return super().scores_from_vectors(query_vector, snippet_vectors)

    def vector_dim(self) -> int | None:
        """The base's vector dimension; None when other signals need the texts."""
        return None if self.signals else self.base.vector_dim()

    def embedding_model(self) -> Any:
        """The base's embedding model; None when the score is more than that model's cosine
        (no caller can compute it from that model's vectors)."""
        return None if self.signals else self.base.embedding_model()

    def with_base(self, base: Scorer) -> Scorer:
        """The same fused score over another base (the base alone only; see :meth:`map_signals`).

        Raises
        ------
        TypeError
            The score has signals besides its base.
        """
        if self.signals:
            raise self._several("take another base")
        return super().with_base(base)

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's whole retrieved list (the features need the list)."""
        self._check_fitted()
        return self.scores_from_features(self.features_of_list(query, snippets))

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        self._check_fitted()
        x, _ = self.features_of_pairs(pairs, progress=progress)
        return self.scores_from_features(x)


#: The options of the ``"best"`` alias: the base embedding scorer's, the preset and the
#: queries' language.
BEST_OPTIONS: tuple[ScorerOption, ...] = (
    ScorerOption("preset", str, DEFAULT_PRESET, "scorer best: which signals the fused score "
                 "learns from (fast: the embedder and in-list BM25, and across languages "
                 "every other embedder trained on both; quality: every bundled embedder of "
                 "the language(s), BM25 and the best sentence's cosine; base: the embedder "
                 "alone, which scores from vectors)", "--preset", choices=PRESETS),
    *EMBEDDING_OPTIONS,
    ScorerOption("query_language", str, None, "scorer best: language of the queries, when "
                 "not the texts' (the model and the preset's embedders are then ones trained "
                 "on both)", "--query-language"),
)


def _signal(signal: Any, base_options: Mapping[str, Any]) -> Scorer:
    """A signal from a scorer or a spec; a spec gets the ``runtime`` options it declares."""
    from . import resolve_scorer, scorer_options

    if isinstance(signal, Scorer):
        return signal
    if not isinstance(signal, Mapping) or not isinstance(signal.get("scorer"), str):
        raise TypeError(f"a signal is {signal!r}; expected a Scorer or a spec mapping with a "
                        "'scorer' key.")
    runtime = {o.name for o in scorer_options(signal["scorer"]) if o.runtime}
    return resolve_scorer(signal, **{k: v for k, v in base_options.items() if k in runtime})
