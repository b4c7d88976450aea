"""The fused score's presets: one table of frozen records (:data:`PRESET_TABLE`).

A preset of the fused score (:class:`~ragsieve.scoring.FusedScorer`, the ``"best"`` alias)
says which signals it learns from besides its base score, whether it learns their list
features, and which learner it fits. Four signal sets, each with or without the reader:

``fast``
    the base (the language's default embedder: ``1 - cos``) and the in-list BM25
    (:class:`~ragsieve.scoring.lexical.ListBM25Scorer`); logistic regression. One model
    call per snippet, as ``1 - cos`` alone (within one language). List-aware.
``base``
    the base alone (its score and the four list transforms of
    :mod:`ragsieve.scoring.relative`), logistic regression: the fused score of earlier
    versions, and the only one computed from the caller's vectors or an index's stored ones
    (``filter_vectors``, ``query --index``), since it needs no text. List-aware.
``quality``
    the base, the cosine of every other bundled embedder trained on the base's language
    (:data:`~ragsieve.embeddings.languages.MODEL_LANGUAGES`), the in-list BM25 and the best
    sentence's cosine of the base's model
    (:class:`~ragsieve.scoring.sentence_cosine.SentenceCosineScorer`); boosted trees
    (:mod:`ragsieve.scoring.boosting`). Costs every embedder once per snippet, and the
    base's once per sentence. List-aware.
``portable``
    the base, the frozen-corpus BM25 (:class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`,
    its statistics fitted on the texts of the fit share of the calibration topics), and on
    the same statistics the share of the query's IDF found in the snippet and the best
    sentence's BM25 (:mod:`ragsieve.scoring.corpus_lexical`), each signal's own score only
    (no gap, z, rank or ratio); one model call per snippet, as ``1 - cos`` (the best
    sentence's cosine, which embeds every sentence, left it for the lexical pair: a saved
    filter keeps the signals it was fitted with). *List-free*: a snippet's score depends on the query and the snippet
    alone, so the threshold holds for lists of any retriever and any length
    (``tags.list_dependent`` False). The default ``auto`` score takes it unless the
    calibration lists are the deployed retriever's (:func:`~ragsieve.scoring.auto.choose_score`).
``reader``, ``portable-reader``, ``quality-reader``
    ``fast``, ``portable`` and ``quality`` and the reader
    (:class:`~ragsieve.scoring.reader.ReaderScorer`: a cross-encoder fine-tuned from the
    bundled multilingual-e5-small on the fit share of the calibration topics, cross-fitted
    so the learner sees only scores of pairs the reader did not train on), with the learner
    and list features of the preset they add it to. Costs fine-tunes at calibration
    (minutes on 2 cores) and a cross-encoder pass per snippet.

The learners: logistic regression (few features, few knobs) everywhere but ``quality``;
``portable``'s was compared with boosted trees on the same features and splits
(docs/scores.md, "The portable score").

The names (:data:`PRESETS`), the ``--preset`` help (:func:`preset_help`) and the choices of
the default ``auto`` score (:meth:`Preset.with_reader`) derive from the table; a new preset
is one row. What each signal of a row is, and how it is built from the base, is
:mod:`ragsieve.scoring.signals`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_PRESET", "LIST_FREE_PRESETS", "PRESETS", "PRESET_LEARNERS", "PRESET_TABLE",
           "READER_PRESETS", "Preset", "check_preset", "get_preset", "preset_help",
           "without_reader"]

#: The signal that makes a preset a reader preset (:attr:`Preset.reader`).
READER_SIGNAL = "reader"


@dataclass(frozen=True)
class Preset:
    """One preset of the fused score: its signals, list features and learner.

    Attributes
    ----------
    name : str
        The preset's name (``--preset``, the spec's ``"preset"``).
    signals : tuple of str
        The kinds of signal it adds to the base, in order
        (:data:`~ragsieve.scoring.signals.SIGNAL_KINDS` builds each): ``"embedders"`` (every
        other bundled embedder of the languages), ``"embedders-across"`` (those, for
        queries in another language only), ``"bm25-list"``, ``"bm25-corpus"``,
        ``"idf-cov"``, ``"sent-bm25"``, ``"sentence-cos"``, ``"reader"``.
    list_free : bool
        True: each signal's own score only, so a snippet's score does not depend on its list.
    learner : {"logistic", "boosted"}
        The learner it fits.
    help : str
        What it is, for the ``--preset`` help (a reader preset is said with the preset it
        adds the reader to: empty).
    """

    name: str
    signals: tuple[str, ...]
    list_free: bool
    learner: str
    help: str = ""

    @property
    def reader(self) -> bool:
        """True when the reader is among its signals (fine-tuned at calibration)."""
        return READER_SIGNAL in self.signals

    def without_reader(self) -> Preset:
        """The preset this one adds the reader to (a preset without the reader: itself)."""
        if not self.reader:
            return self
        return _row_of(tuple(s for s in self.signals if s != READER_SIGNAL), self.list_free)

    def with_reader(self) -> Preset:
        """The preset of these signals and the reader (a reader preset: itself).

        Raises
        ------
        ValueError
            No row of :data:`PRESET_TABLE` adds the reader to this preset.

        Examples
        --------
        >>> get_preset("portable").with_reader().name
        'portable-reader'
        """
        return self if self.reader else _row_of((*self.signals, READER_SIGNAL), self.list_free)


#: Every preset, in the order of :data:`PRESETS` (the ``--preset`` choices).
PRESET_TABLE: tuple[Preset, ...] = (
    Preset("base", (), False, "logistic",
           "the embedder alone, which scores from vectors"),
    Preset("fast", ("embedders-across", "bm25-list"), False, "logistic",
           "the embedder and in-list BM25, and across languages every other embedder "
           "trained on both"),
    Preset("quality", ("embedders", "bm25-list", "sentence-cos"), False, "boosted",
           "every bundled embedder of the language(s), BM25 and the best sentence's cosine"),
    Preset("portable", ("embedders-across", "bm25-corpus", "idf-cov", "sent-bm25"), True,
           "logistic", "list-free, the embedder and, on frozen corpus statistics, BM25, the "
           "share of the query's IDF found and the best sentence's BM25: one model call per "
           "snippet, valid behind any retriever"),
    Preset("reader", ("embedders-across", "bm25-list", "reader"), False, "logistic"),
    Preset("portable-reader", ("embedders-across", "bm25-corpus", "idf-cov", "sent-bm25",
                               "reader"), True, "logistic"),
    Preset("quality-reader", ("embedders", "bm25-list", "sentence-cos", "reader"), False,
           "boosted"),
)

_BY_NAME: Mapping[str, Preset] = {p.name: p for p in PRESET_TABLE}

PRESETS: tuple[str, ...] = tuple(_BY_NAME)
#: The presets whose fused score learns each signal's own score only (no list features).
LIST_FREE_PRESETS = frozenset(p.name for p in PRESET_TABLE if p.list_free)
#: The presets with the reader among their signals (fine-tuned at calibration).
READER_PRESETS = frozenset(p.name for p in PRESET_TABLE if p.reader)
#: The learner each preset fits.
PRESET_LEARNERS: Mapping[str, str] = {p.name: p.learner for p in PRESET_TABLE}
#: The preset of the ``"best"`` alias (and so of the default ``auto`` score): ``fast``, which
#: removes more than the fused score of the base alone for the base embedder's cost;
#: ``quality`` adds a little more for every other embedder's cost and the sentences'
#: (docs/scores.md, "The fused score: every bundled signal", has the figures).
DEFAULT_PRESET = "fast"


def _row_of(signals: tuple[str, ...], list_free: bool) -> Preset:
    """The row of these signals and list features."""
    for row in PRESET_TABLE:
        if row.signals == signals and row.list_free == list_free:
            return row
    raise ValueError(f"no preset has the signals {list(signals)} "
                     f"({'list-free' if list_free else 'list-aware'}).")


def check_preset(preset: Any) -> str:
    """``preset`` if it names a preset, else ``ValueError`` listing them."""
    return get_preset(preset).name


def get_preset(preset: Any) -> Preset:
    """The row of the preset named ``preset`` (a :class:`Preset`: itself).

    Raises
    ------
    ValueError
        ``preset`` names no preset (the message lists them).

    Examples
    --------
    >>> get_preset("portable").list_free, get_preset("quality").learner
    (True, 'boosted')
    """
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str) or preset not in _BY_NAME:
        raise ValueError(f"preset == {preset!r}, must be one of {', '.join(map(repr, PRESETS))}.")
    return _BY_NAME[preset]


def without_reader(preset: str) -> str:
    """The preset a reader preset adds the reader to (any other: itself).

    Examples
    --------
    >>> without_reader("portable-reader"), without_reader("fast")
    ('portable', 'fast')
    """
    return get_preset(preset).without_reader().name


def preset_help() -> str:
    """The ``--preset`` help: the default preset first, then the list-aware presets from
    the most signals to the fewest, then the list-free ones, then the reader presets
    together, each said with the preset it adds the reader to."""
    own = sorted((p for p in PRESET_TABLE if not p.reader),
                 key=lambda p: (p.name != DEFAULT_PRESET, p.list_free, -len(p.signals)))
    readers = [p for p in PRESET_TABLE if p.reader]
    said = [f"{p.name}: {p.help}" for p in own]
    said.append(f"{', '.join(p.name for p in readers)}: "
                f"{', '.join(p.without_reader().name for p in readers)} and a cross-encoder "
                "fine-tuned on the calibration fit topics, tens of minutes to fit on 2 cores")
    return f"scorer best: which signals the fused score learns from ({'; '.join(said)})"
