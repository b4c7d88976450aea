"""A sentence's score in its context: its own list score and its snippet's.

With the sentence unit (``ConformalFilter(unit="sentence")``) every sentence of a query's
snippets is scored and kept on its own. A sentence's text alone says little about
whether it is evidence; the snippet it comes from says more. :class:`SentenceContextScorer`
composes two scorers of the suite:

* the **sentence** score, over the query's whole list of sentences (for the fused score:
  its list-relative features over the sentence list), and
* the **snippet** score of the sentence's snippet, over the query's list of snippets,

into the probability ``P = sigmoid(((x - mean) / scale) @ weights + bias)`` that the sentence
is evidence, with ``x = (sentence score, snippet score)``, a logistic regression
(scikit-learn) of the sentence's evidence label on the two stage scores, and scores

    ``A = -log P + log(characters)``

(lower = more relevant, as every nonconformity score): the sentences are kept in order of
evidence per character. The guarantee counts evidence sentences, each once whatever its
length, while what a kept sentence costs the generator is its length; among the sets of
sentences that keep a given share of the evidence, the one with the fewest characters takes
the sentences of highest ``P / characters`` first (the Neyman-Pearson rule for a cost per
character), which the threshold on ``A`` does. A score fitted before the length term
existed (``per_char`` false) scores ``A = -logit P`` as then.

The guarantee survives as for the fused score: :func:`fit_sentence_context` fits both
stages and the two weights on the same share of the calibration *topics*
(``FUSION_FIT_FRACTION``, the fused score's own fit), and the conformal threshold is
calibrated on the other topics' sentences only, so the score is a fixed function of (query,
list of snippets) before the data it is calibrated on is seen.

A sentence knows its snippet through two keys of its item (or ``Pair.meta``):
:data:`PARENT_TEXT` (the snippet's text) and ``"parent_position"`` (the snippet's index in
its query's list, :func:`ragsieve.units.sentence_pairs`). A text given without them is its
own snippet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from .._optional import require
from ..errors import CalibrationError, ScorerError
from ..types import Pair
from .base import ScoreFit, Scorer, StageFit, group_pairs
from .embedding import EMBEDDING_OPTIONS
from .registry import resolve_scorer
from .tags import ScorerTags

__all__ = [
    "PARENT_POSITION", "PARENT_TEXT", "SentenceContextScorer", "fit_sentence_context",
    "with_parent_text",
]

logger = logging.getLogger(__name__)

#: Item / ``Pair.meta`` key: the text of the snippet a sentence was cut from.
PARENT_TEXT = "parent_text"
#: Item / ``Pair.meta`` key: the index of that snippet in its query's list
#: (:func:`ragsieve.units.sentence_pairs` writes it).
PARENT_POSITION = "parent_position"
#: The two stage scores, in the order of the weights.
STAGES = ("sentence", "snippet")


def with_parent_text(sentences: Sequence[Pair], snippets: Sequence[Pair]) -> list[Pair]:
    """Each sentence pair with its snippet's text under :data:`PARENT_TEXT` in its meta.

    Parameters
    ----------
    sentences : sequence of Pair
        :func:`ragsieve.units.sentence_pairs` of ``snippets`` (``meta["parent_position"]``).
    snippets : sequence of Pair
        The snippet pairs they were cut from.

    Returns
    -------
    list of Pair
        The same pairs, their meta extended (the text is shared, not copied).

    Raises
    ------
    CalibrationError
        A sentence whose query and ``parent_position`` name no snippet of ``snippets``.
    """
    texts: dict[tuple[str, int], str] = {}
    positions: dict[str, int] = {}
    for pair in snippets:
        position = positions.get(pair.query_id, 0)
        positions[pair.query_id] = position + 1
        texts[(pair.query_id, position)] = pair.text
    out = []
    for pair in sentences:
        key = (pair.query_id, int(pair.meta.get(PARENT_POSITION, -1)))
        if key not in texts:
            raise CalibrationError(f"sentence {pair.snippet_id!r} of query {pair.query_id!r} "
                                   f"names snippet position {key[1]}, which its query does not "
                                   "have; expected sentence_pairs() of these snippets.")
        out.append(Pair(pair.query_id, pair.query, pair.snippet_id, pair.text, pair.relevant,
                        pair.group, meta={**pair.meta, PARENT_TEXT: texts[key]}))
    return out


def _stage_array(name: str, value: Sequence[float] | None, default: float) -> np.ndarray:
    """One finite float per stage score (``default`` each when None)."""
    arr = np.full(len(STAGES), default) if value is None else np.asarray(value, dtype=float)
    if arr.shape != (len(STAGES),) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} == {value!r}, must be {len(STAGES)} finite numbers (one per "
                         f"stage score: {', '.join(STAGES)}).")
    return arr


def _share_base(sentence: Scorer, snippet: Scorer) -> Scorer:
    """``snippet`` over ``sentence``'s base scorer when both are built on the same one (one
    loaded model, one embedding cache for the two stages); else ``snippet`` as it is."""
    mine, theirs = snippet.base_scorer(), sentence.base_scorer()
    if snippet is sentence or mine is None or theirs is None or mine is theirs \
            or mine.spec() != theirs.spec():
        return snippet
    try:
        return snippet.with_base(theirs)
    except TypeError:  # a score that cannot be rebuilt over another base: keep its own
        return snippet


def _parents(items: Sequence[Mapping[str, Any]]) -> tuple[list[str], np.ndarray]:
    """The distinct snippets of a list of sentence items (first-seen order) and the index
    of each sentence's snippet among them; an item without a parent is its own."""
    keys: dict[Any, int] = {}
    texts: list[str] = []
    owner = np.empty(len(items), dtype=int)
    for i, item in enumerate(items):
        text = item.get(PARENT_TEXT)
        if not isinstance(text, str):
            key: Any = ("own", i)
            text = item.get("text")
        else:
            key = ("parent", item.get(PARENT_POSITION, text))
        if key not in keys:
            keys[key] = len(texts)
            texts.append(str(text))
        owner[i] = keys[key]
    return texts, owner


class SentenceContextScorer(Scorer):
    """A sentence's score from its list score and its snippet's list score (module docstring).

    Parameters
    ----------
    sentence : Scorer, str or Mapping, default="best"
        The sentence score over the query's sentence list (an unfitted fused score, the
        default, is fitted by :func:`fit_sentence_context`).
    snippet : Scorer, str or Mapping, optional
        The snippet score over the query's snippet list; default: the same score as
        ``sentence`` (fitted apart, on snippet labels).
    weights, mean, scale : sequence of two floats, optional
        Fitted combination (see :meth:`fitted_on`); None: not fitted yet.
    bias : float
    per_char : bool, optional
        Score ``-log P + log(characters)`` (True) or ``-logit P`` (False, the score before
        the length term). Default: True for a score to be fitted; a fitted combination
        given without it (a spec saved before the length term) is False, so an artifact
        scores as it was calibrated.
    **base_options
        Passed to both stage scorers when they are built from an alias or spec (the
        embedding options: ``model``, ``language``, ``cache_dir``, ...).

    Examples
    --------
    >>> ctx = SentenceContextScorer("embedding", weights=[1.0, 1.0], mean=[0.5, 0.5],
    ...                             scale=[0.1, 0.1])
    >>> ctx.spec()["scorer"], ctx.tags.list_dependent
    ('sentence_context', False)
    >>> SentenceContextScorer("relative").tags.list_dependent
    True

    ``tags.list_dependent`` follows the stages: a sentence's score depends on its list when
    either stage's does (the sentence stage over the sentence list, the snippet stage over
    the snippet list).
    """

    name: ClassVar[str] = "sentence_context"
    score_label: ClassVar[str] = "sentence-in-context score"
    tags = ScorerTags(sentence_in_context=True)  # list_dependent per instance: the stages'
    declared_options = EMBEDDING_OPTIONS

    def __init__(self, sentence: Any = "best", snippet: Any = None, *,
                 weights: Sequence[float] | None = None, bias: float = 0.0,
                 mean: Sequence[float] | None = None, scale: Sequence[float] | None = None,
                 per_char: bool | None = None, **base_options: Any) -> None:
        def build(spec: Any) -> Scorer:
            if isinstance(spec, Scorer) and not base_options:
                return spec
            return resolve_scorer(spec, **base_options)

        self.sentence = build(sentence)
        self.snippet = self.sentence if snippet is None else _share_base(self.sentence,
                                                                         build(snippet))
        self.tags = replace(SentenceContextScorer.tags, list_dependent=(  # the stages'
            self.sentence.tags.list_dependent or self.snippet.tags.list_dependent))
        if weights is None and (mean is not None or scale is not None):
            raise ValueError("mean and scale are fitted with the weights: give all three or none.")
        self.weights = _stage_array("weights", weights, 0.0)
        self.mean = _stage_array("mean", mean, 0.0)
        self.scale = _stage_array("scale", scale, 1.0)
        if np.any(self.scale <= 0):
            raise ValueError(f"scale == {self.scale.tolist()!r}, must be {len(STAGES)} numbers > 0.")
        self.bias = float(bias)
        if per_char is not None and not isinstance(per_char, bool):
            raise ValueError(f"per_char == {per_char!r}, must be true, false or None.")
        self._per_char_default = weights is None
        self.per_char = self._per_char_default if per_char is None else per_char
        self.is_fitted = bool(weights is not None and self.sentence.is_fitted
                              and self.snippet.is_fitted)

    # ------------------------------------------------------------------ identity
    def learned_weights(self) -> dict[str, bytes]:
        """The learned tensors of both stages (a reader's, say), by sha256."""
        return {**self.sentence.learned_weights(), **self.snippet.learned_weights()}

    def spec(self) -> dict[str, Any]:
        """The stages' specs and, once fitted, the combination (saved in the artifact)."""
        out: dict[str, Any] = {"scorer": self.name, "sentence": self.sentence.spec(),
                               "snippet": self.snippet.spec()}
        if self.per_char != self._per_char_default:  # said only where the default differs,
            out["per_char"] = self.per_char          # so a spec saved before it reads as then
        if self.is_fitted:
            out.update(weights=[float(v) for v in self.weights], bias=self.bias,
                       mean=[float(v) for v in self.mean], scale=[float(v) for v in self.scale])
        return out

    def stages(self) -> tuple[Scorer, Scorer]:
        """The sentence and the snippet scorer."""
        return self.sentence, self.snippet

    def with_stages(self, sentence: Scorer, snippet: Scorer) -> SentenceContextScorer:
        """The context score over other stage scorers, not fitted yet."""
        return type(self)(sentence, snippet, per_char=self.per_char)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """The sentence stage's model work for ``snippets`` (sentences)."""
        self.sentence.prepare(query, snippets)

    # ------------------------------------------------------------------ fitting
    def stage_scores(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """``(n, 2)``: every pair's sentence score over its query's sentence list and its
        snippet's score over its query's snippet list."""
        pairs = list(pairs)
        sentence = self.sentence.score_pairs(pairs, progress=progress)
        parents, owner = self._parent_pairs(pairs)
        snippet = self.snippet.score_pairs(parents, progress=progress)
        return np.column_stack([sentence, snippet[owner]]) if pairs else np.zeros((0, 2))

    def fitted_on(self, pairs: Sequence[Pair], *, progress: bool = False) -> SentenceContextScorer:
        """A fitted copy: the two weights learned on labelled sentence pairs (with their
        snippets' text, :func:`with_parent_text`), by scikit-learn's logistic regression
        on the standardised stage scores. Fit it on topics the threshold is not
        calibrated on.

        Raises
        ------
        ScorerError
            A stage is not fitted.
        CalibrationError
            The pairs hold one class only.
        """
        if not (self.sentence.is_fitted and self.snippet.is_fitted):
            raise ScorerError("fit the sentence and snippet scores before their combination "
                              "(fit_sentence_context does both).")
        x = self.stage_scores(pairs, progress=progress)
        y = np.array([p.relevant == 1 for p in pairs], dtype=int)
        if np.unique(y).size < 2:
            raise CalibrationError("the sentence-context fit has only one class of sentences; "
                                   "it needs evidence and other sentences.")
        linear_model = require("sklearn.linear_model", "embed")
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        model = linear_model.LogisticRegression(C=1.0).fit((x - mean) / scale, y)
        return type(self)(self.sentence, self.snippet, weights=model.coef_[0].tolist(),
                          bias=float(model.intercept_[0]), mean=mean.tolist(),
                          scale=scale.tolist(), per_char=self.per_char)

    def fit_topics(self, pairs: Sequence[Pair], *, seed: int = 0, progress: bool = False,
                   snippets: Sequence[Pair] | None = None,
                   fit_stage: StageFit | None = None) -> ScoreFit:
        """Fit the stages and their combination on one seeded share of the topics
        (:func:`fit_sentence_context`); ``pairs`` are the sentences (with their snippets'
        text), ``snippets`` the snippet pairs they were cut from, ``fit_stage`` fits each
        unfitted stage (default: its own ``fit_topics`` with ``seed``)."""
        if snippets is None:
            raise ValueError("the sentence-in-context score is fitted on sentences and on the "
                             "snippets they were cut from: pass snippets=.")

        def stage_fit(stage: Scorer, stage_pairs: list[Pair]) -> tuple[Scorer, list[Pair]]:
            done = (stage.fit_topics(stage_pairs, seed=seed, progress=progress)
                    if fit_stage is None else fit_stage(stage, stage_pairs))
            return done.scorer, done.pairs

        fitted, cal = fit_sentence_context(self, snippets, pairs, stage_fit, progress=progress)
        return ScoreFit(fitted, cal)

    # ------------------------------------------------------------------ scoring
    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ScorerError(
                "the sentence-context score has no weights yet; calibrate it first "
                "(ConformalFilter(unit='sentence').calibrate or `ragsieve calibrate --unit "
                "sentence` fit it on a share of the calibration topics)."
            )

    def _combine(self, x: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """The score of stage scores ``x`` (one row per sentence) and the sentences' texts."""
        logit = ((np.asarray(x, dtype=float) - self.mean) / self.scale) @ self.weights + self.bias
        if not self.per_char:
            return -logit
        chars = np.array([max(len(t), 1) for t in texts], dtype=float)
        return np.logaddexp(0.0, -logit) + np.log(chars)  # -log sigmoid(logit) + log chars

    def score_items(self, query: str, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Score one query's whole list of sentences (each with its snippet's text under
        :data:`PARENT_TEXT` and position under ``"parent_position"``)."""
        self._check_fitted()
        if not items:
            return np.zeros(0)
        texts, owner = _parents(items)
        sentence = np.asarray(self.sentence.score_items(query, items), dtype=float)
        snippet = np.asarray(self.snippet.score_items(query, [{"text": t} for t in texts]),
                             dtype=float)
        return self._combine(np.column_stack([sentence, snippet[owner]]),
                             [str(item["text"]) for item in items])

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's texts, each its own snippet (no parent known)."""
        return self.score_items(query, [{"text": t} for t in snippets])

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many queries' sentences (each stage batched across queries)."""
        self._check_fitted()
        pairs = list(pairs)
        return self._combine(self.stage_scores(pairs, progress=progress), [p.text for p in pairs])

    @staticmethod
    def _parent_pairs(pairs: Sequence[Pair]) -> tuple[list[Pair], np.ndarray]:
        """The distinct snippets of every query's sentences, as pairs, and the index of
        each sentence's snippet among them."""
        parents: list[Pair] = []
        owner = np.empty(len(pairs), dtype=int)
        for qid, (query, idx) in group_pairs(pairs).items():
            texts, own = _parents([{**pairs[i].meta, "text": pairs[i].text} for i in idx])
            owner[idx] = own + len(parents)
            parents.extend(Pair(qid, query, f"snippet-{k}", t) for k, t in enumerate(texts))
        return parents, owner


def fit_sentence_context(
    scorer: SentenceContextScorer, snippets: Sequence[Pair], sentences: Sequence[Pair],
    fit_stage: Callable[[Scorer, list[Pair]], tuple[Scorer, list[Pair]]], *,
    progress: bool = False,
) -> tuple[Scorer, list[Pair]]:
    """Fit the two stages and their combination on the same share of the topics.

    Parameters
    ----------
    scorer : SentenceContextScorer
        Unfitted (its unfitted stages are fitted here; a fitted stage is kept as it is).
    snippets : sequence of Pair
        The labelled snippet pairs.
    sentences : sequence of Pair
        Their :func:`~ragsieve.units.sentence_pairs`, with :func:`with_parent_text`.
    fit_stage : callable
        ``fit_stage(stage, pairs) -> (fitted stage, calibration share of pairs)``: the
        fit of an unfitted fused score (:meth:`~ragsieve.scoring.Scorer.fit_topics`), which
        fits on a seeded share of the topics and hands back the pairs of the others. A
        stage it could not fit comes back as another, fitted score (the fused score's
        fallback, ``1 - cos``) with every pair.

    Returns
    -------
    scorer, calibration sentences
        The fitted context score and the sentences of the topics neither stage nor the
        combination was fitted on; or, when the sentence stage could not be fitted, that
        stage's fallback score alone and every sentence.

    Raises
    ------
    CalibrationError
        The two stages were fitted on different topics (the calibration share would then
        hold topics one of them saw), or the combination cannot be fitted.
    """
    snippets, sentences = list(snippets), list(sentences)
    if scorer.sentence.is_fitted:
        raise ValueError(
            f"the sentence stage {scorer.sentence.spec()!r} is fitted already, so no share of "
            "the topics is drawn to fit the combination on; give unfitted stages (the default "
            "'best') and calibrate fits both and their weights on the same topics.")
    snippet, cal_snippets = _fit_one(scorer.snippet, snippets, fit_stage)
    sentence, cal = fit_stage(scorer.sentence, sentences)
    fit_topics = {p.group for p in sentences} - {p.group for p in cal}
    if not fit_topics:  # the sentence stage fell back to a score fitted on nothing
        logger.warning("sentence unit: no snippet context (the sentence score could not be "
                       "fitted); scoring sentences with %s alone", sentence.spec().get("scorer"))
        return sentence, sentences
    snippet_fit = {p.group for p in snippets} - {p.group for p in cal_snippets}
    leak = snippet_fit & {p.group for p in cal}
    if leak:
        raise CalibrationError(
            f"the snippet score was fitted on {len(leak)} topic(s) the sentences are calibrated "
            f"on (e.g. {min(leak)!r}); both stages must be fitted on the same topics.")
    fitted = scorer.with_stages(sentence, snippet).fitted_on(
        [p for p in sentences if p.group in fit_topics], progress=progress)
    logger.info("sentence-context score fitted on %d topics: weights sentence %.3g, snippet "
                "%.3g", len(fit_topics), *fitted.weights)
    return fitted, cal


def _fit_one(stage: Scorer, pairs: list[Pair],
             fit_stage: Callable[[Scorer, list[Pair]], tuple[Scorer, list[Pair]]]
             ) -> tuple[Scorer, list[Pair]]:
    return (stage, pairs) if stage.is_fitted else fit_stage(stage, pairs)
