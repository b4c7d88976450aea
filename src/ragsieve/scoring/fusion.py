"""Fused score: a learned combination of signals and (list-aware presets) their list-relative variants.

``FusedScorer`` computes, for every snippet, the scores of its *signals* -- its base score
(``1 - cos`` of the language's embedder by default) and those its preset adds
(:mod:`ragsieve.scoring.signals`) -- and, unless ``list_features=False``, for each the
query-relative scores of :mod:`ragsieve.scoring.relative` (gap to the best snippet, z-score
in the list, log rank with ties sharing a rank, gap ratio). A learner maps these features
to ``A = -logit P(relevant)``: logistic regression (:func:`fit_logistic`) or monotone
gradient-boosted trees (:mod:`ragsieve.scoring.boosting`). Lower = more relevant, as every
nonconformity score.

The presets (:data:`~ragsieve.scoring.presets.PRESET_TABLE`):

* ``fast`` (the ``"best"`` alias's default), ``base`` and ``quality`` are *list-aware*: the
  list features (and the in-list BM25, whose IDF is the list's) make a snippet's score
  depend on the rest of its list, so the conformal threshold holds for lists like the
  calibration lists -- the same retriever, the same k. Deployed behind another retriever
  they keep less evidence than promised.
* ``portable`` is *list-free* (``list_features=False``): the base cosine, the frozen-corpus
  BM25 (:mod:`ragsieve.scoring.corpus_bm25`) and, on its statistics, the share of the
  query's IDF found and the best sentence's BM25 (:mod:`ragsieve.scoring.corpus_lexical`),
  each signal's own score only. A snippet's score depends on the query and the snippet alone, so the
  threshold holds for lists of any retriever. ``FusedScorer(...).tags.list_dependent``
  (:class:`~ragsieve.scoring.tags.ScorerTags`) says which a fused score is (per instance).

The guarantee survives because the score is fitted on a *separate* fold: the calibration
topics are divided in two by :func:`fusion_fit_mask`, the learner -- and every signal that
is fitted on texts (the frozen-corpus statistics) -- is fitted on the texts and
labels of one part, and the conformal threshold calibrated on the other, so the score is
fixed before the calibration data it is calibrated on is seen; every other signal is a fixed
function of the query and its list, never of labels. :func:`fit_fused_scorer` (on a
:class:`FusedScorer`) and :func:`fit_fusion` (on the :class:`FusionFeatures` that
:meth:`FusedScorer.features_for_evaluation` computes once) are that one fit:
``ConformalFilter.calibrate`` calls the first, every split of ``evaluate`` the second, and
the first is the second on the calibration pairs, so the filter a user deploys is the one a
split measures (``calibrate(seed=s)`` on a split's calibration pairs is split 0 of
``evaluate(seed=s)``). The fitted parameters (and the text-fitted signals' statistics) are
part of the scorer's ``spec()`` and hence of the saved filter artifact (JSON; the trees as
node arrays, never a pickle).

A fused score of its base alone with the logistic learner is the fused score of earlier
ragsieve versions: its spec has their format (``features`` = :data:`FEATURES`, ``weights``,
``bias``, ``mean``, ``scale``), so their artifacts load and score as before; a spec records
``list_features`` only when it is False, so the specs of the list-aware presets are
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple, Protocol, cast, runtime_checkable

import numpy as np

from ..embeddings.reader_bases import READER_BASES
from ..errors import ScorerError
from ..types import Pair
from .base import ListTransform, ScoreFit, Scorer, StageFit, check_score_array
from .boosting import BoostedTrees
from .corpus_bm25 import SharedCorpus, share_statistics
from .embedding import EMBEDDING_OPTIONS
from .fusion_setup import FEATURES, OWN_FEATURES, FusionSetup, feature_names_of, read_fused_setup
from .learners import (
    LEARNER_TYPES,
    LEARNERS,
    FittedFusion,
    FusionWeights,
    check_learner,
    fit_learner,
    fit_logistic,
    read_fitted,
)
from .options import ScorerOption, pack_options
from .presets import DEFAULT_PRESET, PRESETS, Preset, preset_help
from .reader import READER_BASE_HELP
from .relative import query_index_of, relative_scores
from .rerank import RERANK_SIGNAL_OPTIONS
from .shares import FUSION_FIT_FRACTION, fit_topic_count, fusion_fit_mask, topic_codes

__all__ = [
    "FEATURES", "FUSION_FIT_FRACTION", "LEARNERS", "FittedFusion", "FusedScoreFit", "FusedScorer",
    "FusionFeatures", "FusionFit", "FusionWeights", "TextFitted", "TextFittedSignals",
    "as_fusion_features", "feature_matrix", "fit_fused", "fit_fused_scorer", "fit_fusion",
    "fit_learner", "fit_logistic", "fit_topic_count", "fusion_fit_mask", "pair_features",
    "signals_feature_matrix",
]


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


def signals_feature_matrix(signal_scores: Sequence[np.ndarray], query_index: np.ndarray, *,
                           list_features: bool = True) -> np.ndarray:
    """The :func:`feature_matrix` of each signal's scores side by side (``5 x signals``
    columns); with ``list_features=False`` each signal's scores alone (one column each)."""
    if not list_features:
        return np.column_stack([np.asarray(s, dtype=float) for s in signal_scores])
    return np.column_stack([feature_matrix(s, query_index) for s in signal_scores])


class TextShareFit(Protocol):
    """Pairs prepared for fitting a text-fitted signal on any share of them (e.g.
    :class:`~ragsieve.scoring.corpus_bm25.CorpusFit`)."""

    def fitted(self, fit: np.ndarray) -> tuple[Scorer, np.ndarray]:
        """The signal fitted on the texts of the pairs ``fit`` (a mask), and its scores of
        every pair."""
        ...


@runtime_checkable
class TextFitted(Protocol):
    """A signal whose statistics are fitted on texts, never on labels (the frozen-corpus
    BM25, :class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`). Unfitted in an unfitted
    fused score, it is fitted on the texts of the fused score's fit share."""

    is_fitted: bool

    def fit_share(self, pairs: Sequence[Pair], *, corpus: SharedCorpus | None = None) -> TextShareFit:
        """The pairs prepared for fitting on any share of them; ``corpus`` holds the
        pairs' snippets tokenized once for every frozen-corpus signal of the fused score."""
        ...

    def fitted_on_texts(self, texts: Sequence[str]) -> Scorer:
        """A fitted copy with the statistics of ``texts``."""
        ...


def _signal_columns(scores: np.ndarray, query_index: np.ndarray, list_features: bool) -> np.ndarray:
    """The feature columns of one signal's scores."""
    return feature_matrix(scores, query_index) if list_features else \
        np.asarray(scores, dtype=float)[:, None]


@dataclass(frozen=True, eq=False)  # a numpy field
class TextFittedSignals:
    """The signals of an unfitted fused score that are fitted on texts, ready to be fitted
    on any share of the pairs (the pairs tokenized once; per share, only the statistics and
    the scores are computed).

    Attributes
    ----------
    positions : tuple of int
        Each signal's place among the fused score's signals (0 is the base).
    fits : tuple of TextShareFit
        Each signal's prepared pairs (:meth:`TextFitted.fit_share`).
    query_index : numpy.ndarray
        Query of every pair (for the list features).
    list_features : bool
        Whether each signal's columns hold its list features too.
    """

    positions: tuple[int, ...]
    fits: tuple[TextShareFit, ...]
    query_index: np.ndarray
    list_features: bool

    def fitted(self, matrix: np.ndarray, fit: np.ndarray) -> tuple[np.ndarray, dict[int, Scorer]]:
        """``matrix`` with these signals' columns from the signals fitted on the texts of the
        pairs ``fit`` (a mask over every pair), and the fitted signals by position."""
        width = len(FEATURES) if self.list_features else len(OWN_FEATURES)
        out = np.array(matrix, dtype=float, copy=True)
        signals: dict[int, Scorer] = {}
        for position, share in zip(self.positions, self.fits, strict=True):
            signals[position], scores = share.fitted(fit)
            out[:, position * width:(position + 1) * width] = _signal_columns(
                scores, self.query_index, self.list_features)
        return out, signals


@dataclass(frozen=True, eq=False)  # a numpy field
class FusionFeatures:
    """The features of labelled pairs and the learner to fit on them (what ``evaluate``
    passes from :func:`~ragsieve.evaluation.sweep.score_for_evaluation` to each split).

    Attributes
    ----------
    matrix : numpy.ndarray
        One row per pair, one column per name in ``names`` (the columns of the signals in
        ``text_fitted`` are placeholders until :meth:`fitted_on` fills them).
    learner : {"logistic", "boosted"}
    names : tuple of str
    text_fitted : TextFittedSignals or None
        The signals still to be fitted on the texts of each split's fit share.
    """

    matrix: np.ndarray
    learner: str = "logistic"
    names: tuple[str, ...] = FEATURES
    text_fitted: TextFittedSignals | None = None

    def fitted_on(self, fit: np.ndarray) -> tuple[np.ndarray, dict[int, Scorer]]:
        """The matrix with the text-fitted signals fitted on the texts of the pairs ``fit``
        (a mask over every pair), and those signals by position (none: the matrix as it is)."""
        if self.text_fitted is None:
            return self.matrix, {}
        return self.text_fitted.fitted(self.matrix, fit)


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


class FusionFit(NamedTuple):
    """What :func:`fit_fusion` fitted.

    Attributes
    ----------
    fitted : FusionWeights or BoostedTrees
        The learner, fitted on the fit share.
    fit : numpy.ndarray of bool
        Over the calibration pairs (``rows``): True for the fit share; the others calibrate
        the threshold.
    matrix : numpy.ndarray
        The features of every pair, the text-fitted signals fitted on the fit share's texts.
    signals : dict of int to Scorer
        The text-fitted signals, fitted, by position among the signals (0 is the base).
    """

    fitted: FittedFusion
    fit: np.ndarray
    matrix: np.ndarray
    signals: dict[int, Scorer]

    @property
    def scores(self) -> np.ndarray:
        """The fused scores of every pair."""
        return self.fitted.scores(self.matrix)


def fit_fusion(features: np.ndarray | FusionFeatures, relevant: Any, topics: Any, *,
               rows: np.ndarray | None = None, seed: int = 0, split: int = 0,
               fraction: float = FUSION_FIT_FRACTION) -> FusionFit:
    """The one fit of the fused score, shared by ``calibrate`` and every split of ``evaluate``.

    :func:`fusion_fit_mask` draws the fit share of the calibration topics; the text-fitted
    signals (:attr:`FusionFeatures.text_fitted`) are fitted on the texts of its pairs, then
    the learner on its features and labels.

    Parameters
    ----------
    features : FusionFeatures or numpy.ndarray
        The features of every pair (:meth:`FusedScorer.features_for_evaluation`); a bare
        matrix is fitted by logistic regression.
    relevant : array-like of bool or 0/1
        The labels of every pair.
    topics : array-like
        The topic of every pair.
    rows : numpy.ndarray of int, optional
        The calibration pairs, among which the fit share is drawn (a split's calibration
        side); default: every pair. The others (a split's test side) are only scored.
    seed, split, fraction
        As :func:`fusion_fit_mask` takes them.

    Returns
    -------
    FusionFit

    Raises
    ------
    ValueError
        ``relevant`` or ``topics`` not one per pair.
    CalibrationError
        Fewer than two topics, the fit share holds one class only, or its texts no token.
    """
    given = as_fusion_features(features)
    n = given.matrix.shape[0]
    relevant = np.asarray(relevant, dtype=float)
    topics = np.asarray(topics)
    if relevant.shape != (n,) or topics.shape != (n,):
        raise ValueError(f"relevant has shape {relevant.shape} and topics {topics.shape}; "
                         f"expected one per pair ({n}).")
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    fit = fusion_fit_mask(topics[rows], seed=seed, split=split, fraction=fraction)
    chosen = np.zeros(n, dtype=bool)
    chosen[rows[fit]] = True
    matrix, signals = given.fitted_on(chosen)
    fitted = fit_learner(given.learner, matrix[rows[fit]], relevant[rows[fit]])
    return FusionFit(fitted, fit, matrix, signals)


def fit_fused(features: np.ndarray | FusionFeatures, relevant: Any, topics: Any, *, seed: int = 0,
              split: int = 0, fraction: float = FUSION_FIT_FRACTION, learner: str = "logistic",
              ) -> tuple[FittedFusion, np.ndarray]:
    """:func:`fit_fusion` of a feature matrix of signals that need no fitting on texts.

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
    ValueError
        ``features`` hold signals still to be fitted on texts (use :func:`fit_fusion`).
    CalibrationError
        Fewer than two topics, or the fitting pairs hold one class only.
    """
    given = as_fusion_features(features)
    if given.text_fitted is not None:
        raise ValueError("these features hold signals still to be fitted on texts; fit them "
                         "with fit_fusion, which fits those signals too.")
    matrix = given.matrix
    done = fit_fusion(FusionFeatures(matrix, check_learner(learner), tuple(
        f"x{i}" for i in range(matrix.shape[1]))), relevant, topics, seed=seed, split=split,
        fraction=fraction)
    return done.fitted, done.fit


class FusedScoreFit(NamedTuple):
    """What :func:`fit_fused_scorer` gives.

    Attributes
    ----------
    scorer : FusedScorer
        Fitted: its text-fitted signals on the fit share's texts, its learner on the fit
        share's features and labels.
    fit : numpy.ndarray of bool
        True for the pairs of the fit share; the others calibrate the threshold.
    scores : numpy.ndarray
        The fitted score of every pair.
    """

    scorer: FusedScorer
    fit: np.ndarray
    scores: np.ndarray


def fit_fused_scorer(scorer: FusedScorer, pairs: Sequence[Pair], topics: Any, *, seed: int = 0,
                     split: int = 0, fraction: float = FUSION_FIT_FRACTION,
                     progress: bool = False) -> FusedScoreFit:
    """Fit an unfitted fused score on the fit share of labelled pairs (``calibrate``'s fit).

    The features of every pair (:meth:`FusedScorer.features_for_evaluation`), then
    :func:`fit_fusion`: the same draw, the same statistics and the same learner as the
    split ``split`` of ``evaluate(seed=seed)`` fits on these pairs.

    Parameters
    ----------
    scorer : FusedScorer
        Unfitted (its learner; its text-fitted signals may be unfitted too).
    pairs : sequence of Pair
        Labelled calibration pairs.
    topics : array-like
        The topic of every pair (``CalibrationInputs.group_index``: codes numbered by first
        appearance, in the order ``evaluate`` numbers them).
    seed, split, fraction
        As :func:`fusion_fit_mask` takes them.
    progress : bool
        Progress bars while the signals score.

    Returns
    -------
    FusedScoreFit
        The fitted scorer, the fit mask and the scores of every pair.

    Raises
    ------
    CalibrationError
        Fewer than two topics, or the fit share holds one class only (or no token).
    """
    pairs = list(pairs)
    features = scorer.features_for_evaluation(pairs, progress=progress)
    relevant = np.array([p.relevant == 1 for p in pairs], dtype=float)
    done = fit_fusion(features, relevant, topics, seed=seed, split=split, fraction=fraction)
    fitted = scorer.with_signals_fitted(done.signals).with_weights(done.fitted)
    return FusedScoreFit(fitted, done.fit, done.scores)




class FusedScorer(ListTransform):
    """``A = -logit P(relevant | features)``: a fitted learner on the features of the signals.

    List-aware (``tags.list_dependent``) when it has list features or a list-dependent signal
    (the ``base``, ``fast`` and ``quality`` presets); list-free otherwise (``portable``).

    Two constructors build one: :meth:`unfitted` from a preset (the ``"best"`` alias), and
    this one from the keywords of a saved spec (the ``"fusion"`` alias: its signals, learner
    and fitted parameters), or from a :class:`FusionSetup` record (``setup=``).

    Parameters
    ----------
    base : Scorer, str or Mapping
        Base score (``"embedding"`` by default): the first signal, and the score the
        baselines of ``evaluate`` use.
    setup : FusionSetup, optional
        The parts, built already (then no other argument).
    **spec
        The keywords of a spec, read by :func:`~ragsieve.scoring.fusion_setup.read_fused_setup`: ``signals`` (the signals
        besides the base, a sequence of Scorer or spec Mapping; default: those of ``preset``,
        :func:`~ragsieve.scoring.signals.preset_signals`, none without one); ``preset`` (a
        name or a :class:`~ragsieve.scoring.presets.Preset`; None or ``"base"``: the base
        alone, fitted by logistic regression, the fused score of earlier versions);
        ``learner`` (``"logistic"`` or ``"boosted"``; default: the preset's);
        ``list_features`` (whether each signal brings its four list-relative transforms
        besides its score; default: the preset's; a spec records it only when False);
        ``reader_base`` (the base a reader preset's reader is fine-tuned from; only with a
        reader preset and no ``signals``); ``query_language`` (the queries' language when it
        is not the snippets': the preset's signals are then those for queries across
        languages, and a base built here from an alias without a model gets the bundled
        model trained on both languages, :func:`~ragsieve.embeddings.choose_model`);
        ``rerank`` (the user's reranker, one more signal after the preset's; only without
        ``signals``: a saved spec records it among its signals, its API kind and model,
        never its URL); ``weights``, ``bias``, ``mean``, ``scale`` (fitted logistic
        parameters, one per feature) or ``trees`` (fitted boosted trees,
        :meth:`BoostedTrees.to_dict <ragsieve.scoring.boosting.BoostedTrees.to_dict>`): a
        fitted score needs fitted signals (an unfitted text-fitted signal, the frozen-corpus
        BM25, is fitted with the learner: :func:`fit_fused_scorer`); ``features`` (the
        feature names a saved spec records; checked against those computed). Any other
        keyword is the base's when it is built from an alias or spec; the ``runtime`` ones
        (the embedding cache, a reranker's ``url``) also go to the signals built from specs
        that declare them. An option the base does not declare and such a signal does (a
        reranker's ``url``, ``api_key_env``, ``timeout``, ...) goes to the signals alone, so
        a saved fused score with a reranker signal loads with
        ``ConformalFilter.load(path, scorer_options={"url": ...})``, as a saved reranker does.
    """

    name: ClassVar[str] = "fusion"
    score_label: ClassVar[str] = "fused score"

    def __init__(self, base: Any = "embedding", *, setup: FusionSetup | None = None,
                 **spec: Any) -> None:
        if setup is None:
            setup = read_fused_setup(base, spec)
        elif spec or not (isinstance(base, str) and base == "embedding"):
            raise TypeError("setup= holds the whole fused score; give it alone.")
        self.setup = setup
        self.base, self.signals = setup.base, setup.signals
        self._check_signals()
        self.learner = check_learner(setup.preset.learner)
        self.list_features = not setup.preset.list_free
        # per instance: list-aware with list features or a signal that reads the list
        self.tags = replace(FusedScorer.tags, list_dependent=self.list_features or any(
            s.tags.list_dependent for s in self.signal_scorers))
        self.feature_names  # noqa: B018  (raises for a signal given twice)
        self._fitted = setup.fitted
        if self._fitted is not None and self.unfitted_signals:
            raise ValueError(
                f"the fused score has fitted weights but unfitted signal(s) "
                f"{[self.signal_scorers[i].spec()['scorer'] for i in self.unfitted_signals]}; a "
                "fitted spec records its signals fitted (fit_fused_scorer fits both).")
        self.is_fitted = self._fitted is not None

    @property
    def preset(self) -> str | None:
        """The preset's name (None for the base alone or signals given without a preset)."""
        return None if self.setup.preset.name == "base" else self.setup.preset.name

    @property
    def weights(self) -> np.ndarray:
        """The logistic learner's weights (zeros before it is fitted)."""
        return self._logistic().weights

    @property
    def bias(self) -> float:
        """The logistic learner's bias (0 before it is fitted)."""
        return self._logistic().bias

    @property
    def mean(self) -> np.ndarray:
        """The logistic learner's feature means (zeros before it is fitted)."""
        return self._logistic().mean

    @property
    def scale(self) -> np.ndarray:
        """The logistic learner's feature scales (ones before it is fitted)."""
        return self._logistic().scale

    def _logistic(self) -> FusionWeights:
        """The fitted logistic learner, or its neutral parameters before it is fitted.

        Raises
        ------
        AttributeError
            The learner is the boosted trees.
        """
        if self.learner != "logistic":
            raise AttributeError(f"the {self.learner} learner has no logistic parameters.")
        if isinstance(self._fitted, FusionWeights):
            return self._fitted
        k = len(self.feature_names)
        return FusionWeights(weights=np.zeros(k), bias=0.0, mean=np.zeros(k), scale=np.ones(k))

    def _check_signals(self) -> None:
        """The base is fitted; an unfitted signal is one fitted on texts (:class:`TextFitted`)."""
        if not self.base.is_fitted:
            raise ValueError(f"the base {self.base.spec()['scorer']!r} is not fitted; the base "
                             "must score as it is (give a score fitted on texts as a signal).")
        for signal in self.signals:
            if not signal.is_fitted and not isinstance(signal, TextFitted):
                raise TypeError(f"the signal {signal.spec()['scorer']!r} is not fitted and cannot "
                                "be fitted on texts; give it fitted.")

    @property
    def unfitted_signals(self) -> tuple[int, ...]:
        """The positions (0 is the base) of the signals still to be fitted on texts."""
        return tuple(i for i, s in enumerate(self.signal_scorers) if not s.is_fitted)

    @classmethod
    def restore(cls, base: Any = "embedding", **spec: Any) -> FusedScorer:
        """The fused score of a saved spec's keywords (the ``"fusion"`` alias; see the class
        parameters)."""
        return cls(base, **spec)

    @classmethod
    def unfitted(cls, base: Any = "embedding", *, preset: str | Preset | None = DEFAULT_PRESET,
                 query_language: str | None = None, reader_base: str | None = None,
                 rerank: Any = None, **options: Any) -> FusedScorer:
        """The fused score before it is fitted (the ``"best"`` alias): ``preset``'s signals,
        features and learner (:mod:`ragsieve.scoring.presets`), those for queries in
        ``query_language`` when it is not the snippets' language; a reader preset's reader
        fine-tuned from ``reader_base`` (None: the default base); the user's reranker
        ``rerank`` one more signal, or the one the ``rerank_*`` options name
        (:data:`~ragsieve.scoring.rerank.RERANK_SIGNAL_OPTIONS`: ``rerank_url``,
        ``rerank_model``, ``rerank_api``, ...; the CLI's ``--rerank-url`` and so on), packed
        into that one reranker (:func:`~ragsieve.scoring.options.pack_options`). The other
        ``options`` as the class takes them (``learner``, ``list_features``, the base's).
        Its keywords are the options the ``"best"`` alias declares (:data:`BEST_OPTIONS`), each
        one flat or packed into the value it declares, as the scorer contract asks of a
        factory.

        ``evaluate`` fits it in every split on ``FUSION_FIT_FRACTION`` of the calibration
        topics and ``ConformalFilter.calibrate`` on as many of its topics, calibrating on
        the rest (:func:`fit_fused_scorer`); scoring with it before then raises ``ScorerError``.

        Raises
        ------
        ValueError
            ``rerank`` and ``rerank_*`` options both, or ``rerank_*`` options naming no
            reranker (:func:`~ragsieve.scoring.rerank.reranker_from_options`).
        """
        packed = pack_options(BEST_OPTIONS, {"rerank": rerank, **options})
        return cls(base, preset=preset, query_language=query_language, reader_base=reader_base,
                   **packed)

    # ------------------------------------------------------------------ signals, features
    @property
    def signal_scorers(self) -> tuple[Scorer, ...]:
        """Every signal: the base first, then :attr:`signals`."""
        return (self.base, *self.signals)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """One name per feature: :data:`FEATURES` for the base alone with list features,
        else ``"<signal>.<feature>"`` for every signal (``"bm25-list.gap"``; without list
        features only ``"<signal>.score"``)."""
        return feature_names_of(self.signal_scorers, self.list_features)

    def _matrix(self, scores: Sequence[np.ndarray], query_index: np.ndarray) -> np.ndarray:
        """The feature matrix of the signals' scores (with or without list features)."""
        return signals_feature_matrix(scores, query_index, list_features=self.list_features)

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
        return self._matrix(scores, query_index_of(pairs)), base

    def features_of_list(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """The feature matrix of one query's whole list."""
        texts = list(snippets)
        scores = [check_score_array(s.score_batch(query, texts), len(texts))
                  for s in self.signal_scorers]
        return self._matrix(scores, np.zeros(len(texts), dtype=int))

    def features_for_evaluation(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None,
                                progress: bool = False) -> FusionFeatures:
        """:meth:`features_of_pairs` with this score's learner, as ``evaluate`` fits it per
        split; a signal still to be fitted on texts is prepared instead of scored
        (:attr:`FusionFeatures.text_fitted`: fitted on each split's fit share)."""
        pairs = list(pairs)
        base = (self.base.score_pairs(pairs, progress=progress) if base_scores is None
                else check_score_array(base_scores, len(pairs)))
        query_index = query_index_of(pairs)
        scores, fits = [base], []
        corpus = SharedCorpus([p.text for p in pairs])  # tokenized on first use, once
        for signal in self.signals:
            if signal.is_fitted:
                scores.append(signal.score_pairs(pairs, progress=progress))
            else:  # fitted per share: a placeholder until then
                scores.append(np.zeros(len(pairs)))
                fits.append(cast(TextFitted, signal).fit_share(pairs, corpus=corpus))
        unfitted = self.unfitted_signals
        text = (TextFittedSignals(unfitted, tuple(fits), query_index, self.list_features)
                if unfitted else None)
        return FusionFeatures(self._matrix(scores, query_index), self.learner,
                              self.feature_names, text)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Every signal's model work for ``snippets`` (the features come later)."""
        for signal in self.signal_scorers:
            signal.prepare(query, snippets)

    # ------------------------------------------------------------------ fitting
    def unfitted_copy(self) -> FusedScorer:
        """The fused score on the same signals without its fitted learner nor the statistics
        of its text-fitted signals (both refitted where it is used)."""
        if not self.is_fitted:
            return self
        return self._like(signals=[s.unfitted_copy() for s in self.signals])

    def _like(self, *, signals: Sequence[Scorer] | None = None, base: Scorer | None = None,
              fitted: FittedFusion | None = None) -> FusedScorer:
        """A fused score of this preset, learner and features; these signals (default: its
        own) and fitted learner (default: none)."""
        return type(self)(setup=replace(
            self.setup, base=self.base if base is None else base,
            signals=self.signals if signals is None else tuple(signals), fitted=fitted))

    def with_signals_fitted(self, fitted: Mapping[int, Scorer]) -> FusedScorer:
        """The unfitted fused score with the signals at these positions (0 is the base)
        replaced by their fitted copies (:attr:`FusionFit.signals`).

        Raises
        ------
        ValueError
            A position names the base or no signal.
        """
        if not fitted:
            return self
        if not set(fitted) <= set(range(1, len(self.signal_scorers))):
            raise ValueError(f"fitted signals at positions {sorted(fitted)}; this fused score has "
                             f"signals at 1..{len(self.signals)} (0 is the base).")
        return self._like(signals=[fitted.get(i, s) for i, s in enumerate(self.signals, start=1)])

    @classmethod
    def fit(cls, pairs: Sequence[Pair], base: Any = "embedding", *, base_scores: np.ndarray | None = None,
            **options: Any) -> FusedScorer:
        """Fit on labelled pairs (use a fold *not* used for calibration); ``options`` as the
        constructor takes them (``preset``, ``learner``, the base's)."""
        return cls(base, **options).fitted_on(pairs, base_scores=base_scores)

    def fitted_on(self, pairs: Sequence[Pair], *, base_scores: np.ndarray | None = None) -> FusedScorer:
        """A fitted copy sharing this scorer's signals (and their loaded models); a signal
        still to be fitted on texts is fitted on the texts of ``pairs``."""
        pairs = list(pairs)
        y = np.array([p.relevant == 1 for p in pairs], dtype=float)
        if not self.unfitted_signals:
            x, _ = self.features_of_pairs(pairs, base_scores=base_scores)
            return self.fitted_on_features(x, y)
        # every signal fitted on all of ``pairs`` (a reader cross-fitted for the features)
        features = self.features_for_evaluation(pairs, base_scores=base_scores)
        matrix, signals = features.fitted_on(np.ones(len(pairs), dtype=bool))
        return self.with_signals_fitted(signals).fitted_on_features(matrix, y)

    def learned_weights(self) -> dict[str, bytes]:
        """The learned tensors of every signal (a reader's, say), by sha256."""
        out: dict[str, bytes] = {}
        for signal in self.signal_scorers:
            out.update(signal.learned_weights())
        return out

    def fit_topics(self, pairs: Sequence[Pair], *, seed: int = 0, progress: bool = False,
                   snippets: Sequence[Pair] | None = None,
                   fit_stage: StageFit | None = None) -> ScoreFit:
        """Fit on a seeded share of the topics (:func:`fit_fused_scorer`: the fit split 0 of
        ``evaluate(seed=seed)`` makes); the calibration share of the pairs and their fused
        scores (:meth:`Scorer.fit_topics <ragsieve.scoring.Scorer.fit_topics>`)."""
        pairs = list(pairs)
        topics = topic_codes(pairs)  # numbered by first appearance, as evaluate does
        done = fit_fused_scorer(self, pairs, topics, seed=seed, progress=progress)
        cal = np.flatnonzero(~done.fit)
        return ScoreFit(done.scorer, [pairs[i] for i in cal], done.scores[cal], int(done.fit.sum()))

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
        if not isinstance(fitted, LEARNER_TYPES[self.learner]):
            raise TypeError(f"fitted is a {type(fitted).__name__}; the {self.learner} learner "
                            f"gives a {LEARNER_TYPES[self.learner].__name__}.")
        params: dict[str, Any] = (
            {"trees": fitted.to_dict()} if isinstance(fitted, BoostedTrees) else
            {"weights": fitted.weights, "bias": fitted.bias, "mean": fitted.mean, "scale": fitted.scale})
        return self._like(fitted=read_fitted(self.learner, len(self.feature_names), params))

    def map_signals(self, wrap: Callable[[Scorer], Scorer]) -> FusedScorer:
        """The same fused score (same spec, same fitted learner) with every signal replaced
        by ``wrap(signal)`` -- e.g. run on an engine; ``wrap`` must keep each signal's spec.

        Raises
        ------
        ValueError
            A wrapped signal has another spec.
        """
        # a signal still to be fitted on texts is fitted here, per share: it stays as it is
        wrapped = [wrap(s) if s.is_fitted else s for s in self.signal_scorers]
        for old, new in zip(self.signal_scorers, wrapped, strict=True):
            if new.spec() != old.spec():
                raise ValueError(f"wrap changed the signal {old.spec()!r} into {new.spec()!r}.")
        out = self._like(base=wrapped[0], signals=wrapped[1:])
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

        The base alone with logistic regression, list features and no preset gives the format
        of earlier versions: ``{"scorer": "fusion", "base", "features", "weights", "bias",
        "mean", "scale"}``. Unfitted, the spec is the ``"best"`` alias's and records the
        preset (None for the base alone) so that it rebuilds the same score. ``list_features``
        is recorded only when False (``portable``).
        """
        base = self.base.spec()
        legacy = (self.preset is None and not self.signals and self.learner == "logistic"
                  and self.list_features)
        about: dict[str, Any] = {} if legacy else {
            **({"preset": self.preset} if self.preset else {}),
            **self._signal_specs(), "learner": self.learner,
            **({} if self.list_features else {"list_features": False})}
        if not self.is_fitted:
            return {"scorer": "best", "base": base, **about, "preset": self.preset}
        fitted = self.fusion_weights
        params: dict[str, Any] = (
            {"trees": fitted.to_dict()} if isinstance(fitted, BoostedTrees) else
            {"weights": [float(v) for v in self.weights], "bias": self.bias,
             "mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale]})
        return {"scorer": self.name, "base": base, **about,
                "features": list(self.feature_names), **params}

    def _signal_specs(self) -> dict[str, Any]:
        """``{"signals": [...]}``, and ``"corpus_statistics"`` when two or more frozen-corpus
        signals hold the same statistics (saved once, :func:`share_statistics`)."""
        specs, shared = share_statistics([s.spec() for s in self.signals])
        return {"signals": specs, **({} if shared is None else {"corpus_statistics": shared})}

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
        return self.scores_from_features(self._matrix([base], np.zeros(len(base), dtype=int)))

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
        """Score one query's whole retrieved list (a list-aware score's features need the
        list; a list-free one scores each snippet on its own)."""
        self._check_fitted()
        return self.scores_from_features(self.features_of_list(query, snippets))

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        self._check_fitted()
        x, _ = self.features_of_pairs(pairs, progress=progress)
        return self.scores_from_features(x)


#: The options of the ``"best"`` alias: the base embedding scorer's, the preset and the
#: queries' language.
BEST_OPTIONS: tuple[ScorerOption, ...] = (
    ScorerOption("preset", str, DEFAULT_PRESET, preset_help(), "--preset", choices=PRESETS),
    *EMBEDDING_OPTIONS,
    ScorerOption("reader_base", str, None, READER_BASE_HELP, "--reader-base",
                 choices=tuple(READER_BASES)),
    ScorerOption("query_language", str, None, "scorer best: language of the queries, when "
                 "not the texts' (the model and the preset's embedders are then ones trained "
                 "on both)", "--query-language"),
    # the user's reranker, one more signal of any preset (--rerank-url, --rerank-model)
    *RERANK_SIGNAL_OPTIONS,
)
