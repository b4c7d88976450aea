"""The reader: a cross-encoder fine-tuned on the calibration data's own fit topics.

Every other score sees the question and the snippet apart (an embedding's cosine) or
counts words (BM25); the reader reads them together. No reading model ships in any
package, so ragsieve makes one: :meth:`ReaderScorer.fit_topics` fine-tunes a bundled
encoder (:mod:`ragsieve.embeddings.cross_encoder`: multilingual-e5-small by default, the
English MiniLM on request; its layers over the question and the snippet together, and a
cosine head) on the pairs of a seeded share of the calibration topics, the same draw
that fits the fused score (:func:`~ragsieve.scoring.fusion.fusion_fit_mask`), and the
threshold is calibrated on the other topics, which the reader never saw: the guarantee is
untouched. The score is ``1 - P(relevant)``, one pair at a time (no list statistics), so
it does not depend on the retriever's lists.

The fit reads every relevant pair of the fit share and up to ``negatives`` irrelevant
pairs for each (drawn with the seed), at most ``max_fit_pairs`` in all. Where the fit pairs
say which sentences are evidence (``meta["evidence"]`` spans, or the query's
``meta["answers"]``: what the sentence unit reads, :func:`ragsieve.units.sentence_pairs`),
it also reads every sentence of the chosen relevant snippets, labelled evidence or not:
the answer's sentence against its neighbours, which share its topic and words, is what a
score that reads must tell apart and a cosine cannot. The trained
tensors (float16) travel in the artifact's sealed ``weights`` block
(:mod:`ragsieve.scoring.weights`); the spec names them by sha256, and the base by the
sha256 of the bundled weights file, checked when the reader is loaded.

The default base, multilingual-e5-small, was trained on the ~100 languages of XLM-R,
queries and snippets in different languages included; the MiniLM base on English only
(:func:`reader_for` says which base reads a language pair).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._validation import check_int, check_str
from ..embeddings.cross_encoder import (
    DEFAULT_LAYERS,
    FineTuneSettings,
    ReaderWeights,
    fine_tune,
    load_reader,
)
from ..embeddings.languages import normalise_language
from ..embeddings.reader_bases import DEFAULT_BASE, READER_BASES, base_fingerprint
from ..errors import CalibrationError, DataError, ScorerError
from ..types import Pair
from ..units import sentence_pairs
from .base import ScoreFit, Scorer, StageFit
from .options import ScorerOption
from .shares import fusion_fit_mask, topic_codes
from .weights import register_weights, weights_blob

__all__ = ["READER_BASE_HELP", "ReaderScorer", "evidence_sentences", "reader_for",
           "reader_signal"]

logger = logging.getLogger(__name__)

#: Recent cross-fits' out-of-fold scores, by what they were computed from: ``auto``'s reader
#: check and the fused score's fit cross-fit the same fit share the same way, so the fit
#: reads the check's scores here instead of fine-tuning the two half-share readers again
#: (minutes on 2 cores). A few entries (arrays of one float per fit pair).
_OUT_OF_FOLD: OrderedDict[str, np.ndarray] = OrderedDict()
_OUT_OF_FOLD_KEEP = 4
_OUT_OF_FOLD_LOCK = threading.Lock()


#: The help of ``--reader-base``, which sets the base of ``--scorer reader``, of the reader
#: in the ``best`` score's reader presets and of the reader ``auto`` checks.
READER_BASE_HELP = ("scorer reader, the reader of --scorer best's *-reader presets and the one "
                    "--scorer auto checks: the bundled encoder it is fine-tuned from "
                    "(multilingual-e5-small: ~100 languages, the default; MiniLM: English, "
                    "half the layers to run)")


class ReaderScorer(Scorer):
    """``1 - P(relevant)`` of a cross-encoder fine-tuned on the calibration fit topics.

    Parameters
    ----------
    weights : str, optional
        The sha256 of the trained tensors, registered in this process
        (:mod:`ragsieve.scoring.weights`; loading an artifact registers its own). None: not
        fitted yet (``calibrate`` fits it).
    base_sha256 : str, optional
        The sha256 of the base weights file the reader was trained on (set by the fit).
    layers : int, default=6
        Top transformer layers trained (six: all of MiniLM's, the top half of e5's; at most
        the base's layers).
    max_length : int, default=256
        Tokens read of a (question, snippet) pair, at most what the base reads (512).
    max_fit_pairs : int, default=4000
        Most pairs the fit reads.
    negatives : int, default=3
        Irrelevant pairs drawn for each relevant one of the fit share.
    model : str, optional
        The base fine-tuned: ``"multilingual-e5-small-q4"`` (None: this default) or
        ``"all-MiniLM-L6-v2"`` (English; the base of readers saved by earlier versions).

    Examples
    --------
    >>> ReaderScorer().spec()["weights"] is None  # fitted by ConformalFilter.calibrate
    True
    """

    name = "reader"
    score_label = "1 - P(relevant) of the reader"
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("max_fit_pairs", int, 4000, "scorer reader: most pairs it is fine-tuned "
                     "on (every relevant pair of the fit topics, 3 irrelevant ones each)",
                     "--reader-fit-pairs"),
        ScorerOption("model", str, None, READER_BASE_HELP, "--reader-base",
                     choices=tuple(READER_BASES)),
    )

    def __init__(self, weights: str | None = None, *, base_sha256: str | None = None,
                 layers: int = DEFAULT_LAYERS, max_length: int = 256, max_fit_pairs: int = 4000,
                 negatives: int = 3, model: str | None = None) -> None:
        model = DEFAULT_BASE if model is None else model
        if model not in READER_BASES:
            raise ValueError(f"reader model == {model!r}, expected one of "
                             f"{', '.join(map(repr, READER_BASES))} (the bases a reader is "
                             "fine-tuned from).")
        self.model = model
        self.weights = check_str(weights, "weights", allow_none=True, non_blank=True,
                                 hint="the sha256 of the reader's trained tensors")
        self.base_sha256 = check_str(base_sha256, "base_sha256", allow_none=True,
                                     non_blank=True, hint="the sha256 of the base weights")
        base = READER_BASES[model]  # an artifact's settings must be ones the base can run
        self.layers = check_int(layers, "layers", min_value=1, max_value=base.n_layers,
                                hint=f"{model} has {base.n_layers} layers")
        self.max_length = check_int(max_length, "max_length", min_value=16,
                                    max_value=base.max_positions,
                                    hint=f"{model} reads at most {base.max_positions} tokens")
        self.max_fit_pairs = check_int(max_fit_pairs, "max_fit_pairs", min_value=2)
        self.negatives = check_int(negatives, "negatives", min_value=1)
        if self.weights is not None:
            weights_blob(self.weights)  # ScorerError now, not at the first score
        self.is_fitted = self.weights is not None
        #: Pairs the fit read (0: loaded, or not fitted).
        self.n_read = 0
        self._model: Any = None

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name, "model": self.model, "layers": self.layers,
                "max_length": self.max_length, "max_fit_pairs": self.max_fit_pairs,
                "negatives": self.negatives, "base_sha256": self.base_sha256,
                "weights": self.weights}

    # ------------------------------------------------------------------ fit
    def fit_topics(self, pairs: Sequence[Pair], *, seed: int = 0, progress: bool = False,
                   snippets: Sequence[Pair] | None = None,
                   fit_stage: StageFit | None = None) -> ScoreFit:
        """Fine-tune on the pairs of a seeded share of the topics (``fusion_fit_mask``'s
        draw, split 0 of ``seed``); the fitted reader and the other topics' pairs.

        Raises
        ------
        CalibrationError
            Fewer than two topics, or a fit share without a relevant or an irrelevant pair.
        """
        pairs = list(pairs)
        topics = topic_codes(pairs)
        fit = fusion_fit_mask(topics, seed=seed)
        share = [pairs[i] for i in np.flatnonzero(fit)]
        logger.info("fine-tuning the reader on the %d pairs of %d of %d topics", len(share),
                    len(set(topics[fit].tolist())), len(set(topics.tolist())))
        fitted = self.fitted_on(share, seed=seed)
        return ScoreFit(fitted, [pairs[i] for i in np.flatnonzero(~fit)], None,
                        min(len(share), fitted.n_read))

    def fitted_on(self, pairs: Sequence[Pair], *, seed: int = 0) -> ReaderScorer:
        """A reader fine-tuned on labelled ``pairs`` (every relevant one and ``negatives``
        irrelevant ones each, at most ``max_fit_pairs``; the draw and the training seeded).

        Raises
        ------
        CalibrationError
            ``pairs`` lack a relevant or an irrelevant pair.
        """
        pairs = list(pairs)
        rows = self._fit_rows(pairs, np.arange(len(pairs)), seed)
        read = [pairs[i] for i in rows]
        read += evidence_sentences([p for p in read if p.relevant == 1],
                                   budget=self.max_fit_pairs - len(read))
        settings = FineTuneSettings(base=self.model, seed=seed, layers=self.layers,
                                    max_length=self.max_length)
        weights, _ = fine_tune([p.query for p in read], [p.text for p in read],
                               [int(p.relevant or 0) for p in read], settings)
        register_weights({weights.sha256: weights.blob})
        fitted = ReaderScorer(weights.sha256, base_sha256=base_fingerprint(self.model),
                              layers=self.layers, max_length=self.max_length,
                              max_fit_pairs=self.max_fit_pairs, negatives=self.negatives,
                              model=self.model)
        fitted.n_read = len(read)
        return fitted

    def _fit_rows(self, pairs: list[Pair], share: np.ndarray, seed: int) -> np.ndarray:
        """Every relevant pair of the share and ``negatives`` irrelevant ones each, drawn
        with the seed, at most ``max_fit_pairs`` in all (in the share's order)."""
        rng = np.random.default_rng([seed, 11])
        relevant = np.array([i for i in share if pairs[i].relevant == 1], dtype=int)
        other = np.array([i for i in share if pairs[i].relevant != 1], dtype=int)
        if relevant.size == 0 or other.size == 0:
            raise CalibrationError(
                f"the reader's fit share ({share.size} pairs) has {relevant.size} relevant and "
                f"{other.size} irrelevant pairs; it needs both (more topics, or another score).")
        n_pos = min(relevant.size, max(1, self.max_fit_pairs // (1 + self.negatives)))
        n_neg = min(other.size, self.max_fit_pairs - n_pos, n_pos * self.negatives)
        chosen = np.concatenate([rng.choice(relevant, n_pos, replace=False),
                                 rng.choice(other, n_neg, replace=False)])
        return np.sort(chosen)

    # --------------------------------------------------------- in a fused score
    def fit_share(self, pairs: Sequence[Pair], *, corpus: Any = None) -> ReaderShareFit:
        """The pairs, to fit this reader as a signal of a fused score on any share of them
        (:meth:`ReaderShareFit.fitted`: cross-fitted, so the learner never sees the reader's
        scores of its own training pairs); ``corpus``, the frozen-corpus signals' shared
        tokens, plays no part."""
        return ReaderShareFit(self.unfitted_copy(), list(pairs))

    def fitted_on_texts(self, texts: Sequence[str]) -> Scorer:
        """Not for the reader: it learns from labels (:meth:`fitted_on`, :meth:`fit_share`).

        Raises
        ------
        TypeError
            Always.
        """
        raise TypeError("the reader is fine-tuned on labelled pairs, not on texts alone: "
                        "use fitted_on(pairs) or fit_share(pairs).")

    def unfitted_copy(self) -> ReaderScorer:
        """The reader before its fit (same settings)."""
        return ReaderScorer(layers=self.layers, max_length=self.max_length,
                            max_fit_pairs=self.max_fit_pairs, negatives=self.negatives,
                            model=self.model)

    def learned_weights(self) -> dict[str, bytes]:
        """The trained tensors by sha256 (none before the fit)."""
        return {} if self.weights is None else {self.weights: weights_blob(self.weights)}

    # ------------------------------------------------------------------ score
    def _reader(self) -> Any:
        if self._model is not None:
            return self._model
        if self.weights is None:
            raise ScorerError("the reader is not fine-tuned yet: calibrate a filter with it "
                              "(ConformalFilter('reader').calibrate(pairs)), which fits it on "
                              "a share of the calibration topics.")
        if self.base_sha256 is not None and self.base_sha256 != base_fingerprint(self.model):
            raise ScorerError(f"the installed base model ({self.model}) differs from the one "
                              "this reader was fine-tuned on (its weights file's sha256); "
                              "recalibrate with this install.")
        self._model = load_reader(ReaderWeights(weights_blob(self.weights)), base=self.model,
                                  layers=self.layers, max_length=self.max_length)
        return self._model

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        if not snippets:
            return np.zeros(0)
        return 1.0 - np.asarray(self._reader().probabilities([query] * len(snippets),
                                                             list(snippets)), dtype=float)

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score pairs of many queries in batches (the reader reads each pair on its own)."""
        if not pairs:
            return np.zeros(0)
        return 1.0 - np.asarray(self._reader().probabilities(
            [p.query for p in pairs], [p.text for p in pairs]), dtype=float)


class ReaderShareFit:
    """A reader to be fitted, as a signal of a fused score, on a share of ``pairs``.

    :meth:`fitted` cross-fits: the share's topics (its questions, when it spans one topic)
    are cut in two halves (a draw seeded by the share's size), a reader fine-tuned on each half scores the other half's pairs, so
    the learner of the fused score is fitted on scores the reader did not train on; a third
    reader, fine-tuned on the whole share, is the fitted signal and scores every other pair.
    """

    def __init__(self, scorer: ReaderScorer, pairs: list[Pair]) -> None:
        self.scorer = scorer
        self.pairs = pairs

    def out_of_fold(self, rows: np.ndarray | None = None, *, seed: int = 0,
                    ) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` (default: every pair) and their scores, each by a reader fine-tuned on
        the other half of their topics (of their questions, when they span one topic).

        Raises
        ------
        CalibrationError
            The rows span fewer than two questions, or a half lacks a class.
        """
        rows = np.arange(len(self.pairs)) if rows is None else np.asarray(rows, dtype=int)
        key = self._fold_key(rows, seed)
        with _OUT_OF_FOLD_LOCK:
            if key in _OUT_OF_FOLD:
                _OUT_OF_FOLD.move_to_end(key)
                logger.info("the reader's out-of-fold scores of these %d pairs were computed "
                            "already (the reader check): not fine-tuned again", rows.size)
                return rows, _OUT_OF_FOLD[key].copy()
        groups = np.array([str(self.pairs[i].group) for i in rows])
        if np.unique(groups).size < 2:  # one fit topic (few topics): halves of its questions
            groups = np.array([str(self.pairs[i].query_id) for i in rows])
        distinct = np.unique(groups)
        if distinct.size < 2:
            raise CalibrationError(f"the reader is cross-fitted on the fit share; it spans "
                                   f"{distinct.size} question(s), needs at least 2.")
        half = distinct[np.random.default_rng([rows.size, 13]).permutation(distinct.size)
                        [:distinct.size // 2]]
        first = np.isin(groups, half)
        scores = np.zeros(rows.size)
        for train, held in ((first, ~first), (~first, first)):
            reader = self.scorer.fitted_on([self.pairs[i] for i in rows[train]], seed=seed)
            scores[held] = reader.score_pairs([self.pairs[i] for i in rows[held]])
        with _OUT_OF_FOLD_LOCK:
            _OUT_OF_FOLD[key] = scores.copy()
            while len(_OUT_OF_FOLD) > _OUT_OF_FOLD_KEEP:
                _OUT_OF_FOLD.popitem(last=False)
        return rows, scores

    def _fold_key(self, rows: np.ndarray, seed: int) -> str:
        """What a cross-fit's scores follow from: the reader's settings, the seed and every
        row's question, text, label, topic and meta (a sentence's snippet, say), in order."""
        digest = hashlib.sha256(json.dumps([self.scorer.spec(), int(seed), int(rows.size)],
                                           sort_keys=True).encode())
        for i in rows:
            pair = self.pairs[i]
            digest.update(json.dumps([pair.query_id, pair.query, pair.text, pair.relevant,
                                      str(pair.group)], ensure_ascii=False).encode())
            digest.update(json.dumps(pair.meta, sort_keys=True, default=str,
                                     ensure_ascii=False).encode())
        return digest.hexdigest()

    def fitted(self, fit: np.ndarray) -> tuple[ReaderScorer, np.ndarray]:
        """The reader fitted on the pairs ``fit`` (a boolean mask over the pairs) and the
        score of every pair (out of fold on ``fit``).

        Raises
        ------
        ValueError
            ``fit`` is not one boolean per pair.
        CalibrationError
            The share spans fewer than two topics, or a half lacks a class.
        """
        fit = np.asarray(fit)
        if fit.dtype != bool or fit.shape != (len(self.pairs),):
            raise ValueError(f"fit is a {fit.dtype} array of shape {fit.shape}; expected one "
                             f"bool per pair ({len(self.pairs)}).")
        rows = np.flatnonzero(fit)
        scores = np.zeros(len(self.pairs))
        scores[rows] = self.out_of_fold(rows)[1]
        final = self.scorer.fitted_on([self.pairs[i] for i in rows])
        rest = np.flatnonzero(~fit)
        if rest.size:
            scores[rest] = final.score_pairs([self.pairs[i] for i in rest])
        return final, scores


def reader_for(language: str | None, query_language: str | None = None, *,
               base: str | None = None) -> ReaderScorer | None:
    """The reader for snippets in ``language`` and queries in ``query_language`` (default:
    the snippets'): one fine-tuned from ``base`` (default: the default base) where that base
    was trained on both languages, else None.

    Examples
    --------
    >>> reader_for("de", "en").spec()["model"]
    'multilingual-e5-small-q4'
    >>> reader_for("tlh") is None
    True
    >>> reader_for("de", base="all-MiniLM-L6-v2") is None
    True
    """
    if language is None:
        return None
    reader = ReaderScorer(model=base)  # a ValueError naming the bases for another name
    wanted = {normalise_language(language), normalise_language(query_language or language)}
    return reader if wanted <= READER_BASES[reader.model].languages else None


def evidence_sentences(relevant: Sequence[Pair], *, budget: int | None = None) -> list[Pair]:
    """Every sentence of ``relevant`` snippets, labelled evidence (1) or not (0), when their
    pairs say which sentences are evidence; none otherwise (logged).

    A snippet that is one sentence adds nothing (it is read already), and neither does one
    whose evidence is not inside a sentence (every sentence would count as evidence). At
    most ``budget`` sentences, whole snippets at a time, in the order of ``relevant``.

    Examples
    --------
    >>> snippet = Pair("q1", "Who built it?", "d:0-44", "It is tall. Gustave Eiffel built it in 1889.",
    ...                relevant=1, meta={"answers": ["Gustave Eiffel"]})
    >>> [(p.text, p.relevant) for p in evidence_sentences([snippet])]
    [('It is tall.', 0), ('Gustave Eiffel built it in 1889.', 1)]
    """
    marked = [p for p in relevant if p.meta.get("evidence") is not None
              or p.meta.get("answers") is not None]
    if len(marked) < len(relevant) or not marked:
        if relevant:
            logger.info("the reader reads snippets only: %d of %d relevant fit snippets say "
                        "which sentences are evidence (meta 'evidence' or 'answers')",
                        len(marked), len(relevant))
        return []
    try:  # a snippet with no sentence marked is dropped below, not read whole
        sentences = sentence_pairs(marked, warn_unmarked=False)
    except DataError as exc:
        logger.info("the reader reads snippets only: %s", exc)
        return []
    by_parent: dict[tuple[str, str], list[Pair]] = {}
    for sentence in sentences:
        by_parent.setdefault((sentence.query_id, sentence.meta["parent_snippet_id"]),
                             []).append(sentence)
    out: list[Pair] = []
    for group in by_parent.values():
        if not 0 < sum(int(s.relevant or 0) for s in group) < len(group):
            continue  # one sentence, or every sentence evidence: nothing to tell apart
        if budget is not None and len(out) + len(group) > budget:
            break
        out.extend(group)
    return out


def reader_signal(scorer: Scorer) -> ReaderScorer | None:
    """The reader among a fused score's signals (what its fit fine-tunes), or None: the
    score has no reader (any other score included)."""
    return next((s for s in getattr(scorer, "signals", ()) if isinstance(s, ReaderScorer)), None)
