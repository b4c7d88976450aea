"""The default score (``"auto"``): the strongest score the calibration data allows.

:func:`choose_score` is the one rule, used by the CLI (``--scorer auto``, the default of
every command that fits a filter) and by :class:`~ragsieve.ConformalFilter` (scorer
``"auto"``, resolved when it is calibrated). A fused score (``"best"``,
:mod:`ragsieve.scoring.fusion`) needs pairs it can be fitted on: both relevant and irrelevant
snippets, and at least ``MIN_FUSION_TOPICS`` topics (``Pair.group``; a quarter of them fit
it, the rest calibrate the threshold). Which fused score depends on where the calibration
lists come from, because a list-aware score is calibrated for lists like its calibration
lists only (the same retriever, the same k):

* the **list-aware** fused score (preset ``fast``) when the lists are the deployed
  retriever's (``deployed_lists=True``: e.g. made by ``ragsieve retrieve`` through it) and
  the pairs give whole lists: at least half of the queries have >= 2 snippets;
* otherwise the **list-free** fused score (preset ``portable``): a snippet's score does not
  depend on its list, so the threshold holds behind any retriever; it needs no whole lists
  (single-snippet queries are fine);
* ``1 - cos`` (``"embedding"``) when no fused score can be fitted, with the reason logged
  as a warning.

:class:`AutoScorer` stands for the choice until then: it also picks the embedding model,
from the languages given or detected in the calibration texts (:func:`choose_languages`:
the queries' and the snippets' apart, :func:`~ragsieve.embeddings.detection.detect_languages`),
a model trained on both (:func:`~ragsieve.embeddings.languages.choose_model`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..embeddings.reader_bases import READER_BASES
from ..embeddings.reader_bases import reader_base as get_reader_base  # the name's check
from ..errors import ScorerError
from ..types import Pair
from .base import Resolution, Scorer
from .embedding import EMBEDDING_OPTIONS
from .options import ScorerOption, pack_options
from .presets import Preset, get_preset
from .reader import READER_BASE_HELP
from .registry import resolve_scorer
from .rerank import RERANK_SIGNAL_OPTIONS, RerankScorer
from .signal_check import RERANK_CHECKS
from .tags import ScorerTags

__all__ = ["MIN_FUSION_TOPICS", "AutoScorer", "LanguageChoice", "ScoreChoice", "choose_language",
           "choose_languages", "choose_score"]

logger = logging.getLogger(__name__)

#: Fewest topics the fused score is chosen for (one fits the weights, three calibrate).
MIN_FUSION_TOPICS = 4
#: Share of queries that must have a list of >= 2 snippets for the list-aware fused score.
MIN_LIST_SHARE = 0.5
#: A language given alone is taken for the queries too unless at least this share of the
#: sampled queries is detected in one other language (:func:`choose_languages`).
QUERY_SWITCH_SHARE = 0.8
#: ... and at least this many queries were classified.
QUERY_SWITCH_MIN_QUERIES = 10


@dataclass(frozen=True)
class ScoreChoice:
    """The score :func:`choose_score` picked and why.

    Attributes
    ----------
    alias : str
        ``"best"`` (a fused score) or ``"embedding"`` (``1 - cos``).
    reason : str
        Why, in the user's terms: ``"whole lists of 3-6 snippets per query from the deployed
        retriever (16 queries, 8 topics)"``.
    fused : Preset or None
        The fused score's preset (:mod:`ragsieve.scoring.presets`): ``fast`` (list-aware)
        or ``portable`` (list-free), the same with the reader (:meth:`Preset.with_reader
        <ragsieve.scoring.presets.Preset.with_reader>`: ``reader``, ``portable-reader``)
        when the reader check fused the reader; None for ``1 - cos``.
    reader : str or None
        Whether the reader was fused and why
        (:func:`~ragsieve.scoring.reader_check.check_reader`); None: not asked.
    rerank : Mapping or None
        Whether the user's reranker was fused, why and the numbers
        (:meth:`SignalCheck.to_dict <ragsieve.scoring.signal_check.SignalCheck.to_dict>`:
        ``fused``, ``reason``, ``without_auc``, ``with_auc``, ...); None: no reranker given.
    """

    alias: str
    reason: str
    fused: Preset | None = None
    reader: str | None = None
    rerank: Mapping[str, Any] | None = None

    @property
    def preset(self) -> str | None:
        """The name of the fused score's preset (None for ``1 - cos``)."""
        return None if self.fused is None else self.fused.name

    @property
    def rerank_fused(self) -> bool:
        """True when the user's reranker is a signal of the chosen score."""
        return bool(self.rerank and self.rerank.get("fused"))

    @property
    def label(self) -> str:
        """``"fused (best, list-aware)"``, ``"fused, portable (list-free)"`` or
        ``"1 - cos (embedding)"``."""
        if self.alias != "best":
            return "1 - cos (embedding)"
        with_reader = " with the reader" if self.fused and self.fused.reader else ""
        if self.rerank_fused:
            with_reader += " and the reranker" if with_reader else " with the reranker"
        if self.fused and self.fused.list_free:
            return f"fused, portable{with_reader} (list-free)"
        return f"fused (best{with_reader}, list-aware)"

    def to_dict(self) -> dict[str, Any]:
        """``{"scorer": alias, "preset": ..., "label": ..., "reason": ...}`` and, when the
        reader was asked about, ``"reader"``, when a reranker was given, ``"rerank"`` (the
        artifact's ``data.score_choice``)."""
        return {"scorer": self.alias, "preset": self.preset, "label": self.label,
                "reason": self.reason, **({"reader": self.reader} if self.reader else {}),
                **({"rerank": dict(self.rerank)} if self.rerank else {})}


#: Why the list-free score, when the lists are the data set's own.
_NOT_DEPLOYED = ("the calibration lists are the data set's own, not the deployed retriever's, "
                 "so the list-free score; calibrate through your retriever (`ragsieve "
                 "retrieve`, or --lists deployed) for the list-aware fused score")


def choose_score(pairs: Sequence[Pair], *, deployed_lists: bool = False) -> ScoreChoice:
    """The strongest score the labelled pairs allow where their lists come from (see the
    module docstring for the rule).

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled calibration pairs.
    deployed_lists : bool
        True when each query's pairs are the list the deployed retriever gives it (the
        list-aware fused score is then calibrated for the lists it will meet); False (the
        default) when the lists are the data set's own, or not known.

    Returns
    -------
    ScoreChoice

    Examples
    --------
    >>> from ragsieve.types import Pair
    >>> single = [Pair(str(i), "q", f"s{i}", "t", 1, group=str(i)) for i in range(8)]
    >>> choose_score(single).alias
    'embedding'
    >>> one_each = [Pair(str(i), "q", f"s{i}", "t", i % 2, group=str(i)) for i in range(8)]
    >>> choose_score(one_each).label
    'fused, portable (list-free)'
    >>> choose_score(one_each, deployed_lists=True).reason.startswith("8 of 8 queries have a single")
    True
    """
    pairs = list(pairs)
    sizes = Counter(p.query_id for p in pairs)
    n_queries = len(sizes)
    topics = {p.group for p in pairs}
    labels = {p.relevant for p in pairs}
    if not n_queries:
        return ScoreChoice("embedding", "no calibration pairs; a fused score is fitted on them")
    if labels != {0, 1}:
        kind = "irrelevant" if 1 in labels else "relevant"
        return ScoreChoice("embedding", f"no {kind} snippet in the calibration pairs; a fused "
                           "score is fitted on both")
    if len(topics) < MIN_FUSION_TOPICS:
        return ScoreChoice("embedding", f"{len(topics)} topic(s); a fused score needs >= "
                           f"{MIN_FUSION_TOPICS} (a quarter fit it, the rest calibrate)")
    counts = f"{n_queries} queries, {len(topics)} topics"
    if not deployed_lists:
        return ScoreChoice("best", f"{counts}; {_NOT_DEPLOYED}", get_preset("portable"))
    lists = sum(1 for n in sizes.values() if n >= 2)
    if lists < MIN_LIST_SHARE * n_queries:
        return ScoreChoice("best", f"{n_queries - lists} of {n_queries} queries have a single "
                           "snippet; the list-aware fused score needs whole retrieved lists, "
                           f"so the list-free score ({counts})", get_preset("portable"))
    lo, hi = min(sizes.values()), max(sizes.values())
    span = str(lo) if lo == hi else f"{lo}-{hi}"
    return ScoreChoice("best", f"whole lists of {span} snippets per query from the deployed "
                       f"retriever ({counts})", get_preset("fast"))


@dataclass(frozen=True)
class LanguageChoice:
    """The languages of the calibration texts and how they were found (:func:`choose_languages`).

    Attributes
    ----------
    code : str or None
        The snippets' language (``data.language`` of the artifact); None: not known.
    query_code : str or None
        The queries' language (the same as ``code`` unless the queries are asked in another).
    source : str
        ``"given"``, ``"py3langid, 0.97 of 200 texts"``, ``"py3langid: queries 0.99 of 100
        texts, snippets 1.00 of 100 texts"``, ``"py3langid: queries 0.98 of 100 texts (not
        the given de), snippets given"`` (a language given alone, the queries detected in
        another), or the fallback and its reason.
    """

    code: str | None
    query_code: str | None
    source: str

    @property
    def cross(self) -> bool:
        """True when the queries are in another language than the snippets."""
        return self.query_code is not None and self.query_code != self.code

    def info(self) -> dict[str, Any]:
        """The artifact's ``data`` entries: ``language``, ``language_source`` and, when it
        differs, ``query_language``; empty when no language is known."""
        if self.code is None:
            return {}
        return {"language": self.code, "language_source": self.source,
                **({"query_language": self.query_code} if self.cross else {})}

    def describe(self) -> str:
        """``"language de (given)"`` or ``"queries en, snippets de (py3langid, ...)"``."""
        if self.code is None:
            return f"language {self.source}"
        said = f"queries {self.query_code}, snippets {self.code}" if self.cross else \
            f"language {self.code}"
        return f"{said} ({self.source})"


def _share(guess: Any) -> str:
    return f"{guess.share:.2f} of {guess.n_texts} texts"


def _detected(pairs: Sequence[Pair], language: str | None, query_language: str | None,
              ) -> tuple[str | None, str | None, str]:
    """The languages detected where not given (None: not detected), and how."""
    from ..embeddings.detection import DETECTOR, detect_languages

    try:
        found = detect_languages(pairs)
    except ImportError:
        return (language, query_language,
                f"{DETECTOR} is not installed (pip install 'ragsieve[embed]')")
    queries = query_language or found.queries.code
    snippets = language or found.snippets.code
    if language is None and query_language is None and snippets is not None \
            and queries == snippets:  # one language: the share of the whole sample
        n = found.queries.n_texts + found.snippets.n_texts
        votes = found.queries.share * found.queries.n_texts + \
            found.snippets.share * found.snippets.n_texts
        return snippets, queries, f"{DETECTOR}, {votes / n:.2f} of {n} texts"
    parts = []
    for side, given, guess in (("queries", query_language, found.queries),
                               ("snippets", language, found.snippets)):
        if given is not None:
            parts.append(f"{side} given")
        elif guess.code is not None:
            parts.append(f"{side} {_share(guess)}")
        else:
            parts.append(f"{side} not detected ({guess.reason})")
    return snippets, queries, f"{DETECTOR}: {', '.join(parts)}"


def _queries_elsewhere(found: Any, language: str) -> str | None:
    """The language the queries of ``found`` (a ``TextLanguages``) are confidently detected
    in when it is not ``language`` (the one given) nor the snippets' detected language (a
    detector that puts both sides in one other language, e.g. Norwegian read as Danish,
    is overruled by the user); else None."""
    queries, snippets = found.queries, found.snippets
    if queries.code is None or queries.code == language:
        return None
    if queries.share < QUERY_SWITCH_SHARE or queries.n_texts < QUERY_SWITCH_MIN_QUERIES:
        logger.info("queries taken to be in the given %s: the detection is not confident "
                    "(%s; a switch needs >= %.2f of >= %d queries)", language,
                    queries.describe(), QUERY_SWITCH_SHARE, QUERY_SWITCH_MIN_QUERIES)
        return None
    if snippets.code == queries.code:
        logger.info("queries taken to be in the given %s: the queries and the snippets are "
                    "both detected in %s", language, queries.code)
        return None
    return str(queries.code)


def _query_switch_note(language: str, queries: Any, snippets: Any) -> str:
    """The one-line warning of :func:`choose_languages` when it takes the queries to be in
    another language than the one given: what was detected, what was chosen, how to
    override. ``queries`` and ``snippets`` are the ``LanguageGuess`` of each side."""
    from ..embeddings.detection import DETECTOR

    seen = snippets.code or "not detected"
    return (f"--language {language} was given without --query-language, but the queries "
            f"are detected in {queries.code} ({DETECTOR}, {_share(queries)}; snippets: "
            f"{seen}): chose queries in {queries.code} over snippets in {language} "
            f"(cross-language); override with --query-language X (the auto score's "
            f"query_language=X in Python), --query-language {language} for queries in "
            f"{language}")


def _given_alone(pairs: Sequence[Pair], language: str, *, quiet: bool = False,
                 ) -> LanguageChoice:
    """``language`` given without the queries': of both sides, unless a sample of the
    queries of ``pairs`` is confidently in another language (:func:`_queries_elsewhere`):
    then queries in that one over snippets in ``language``, with a warning (``quiet``: an
    info line, for a caller that records the languages and chooses nothing by them)."""
    if not pairs:
        return LanguageChoice(language, language, "given")
    from ..embeddings.detection import DETECTOR, detect_languages

    level = logging.INFO if quiet else logging.WARNING
    try:
        found = detect_languages(pairs)
    except ImportError:  # said, not swallowed: the given language stands for both sides
        logger.log(level, "the queries' language is not checked against --language %s: %s "
                   "is not installed (pip install 'ragsieve[embed]'); give --query-language "
                   "when the queries are in another language", language, DETECTOR)
        return LanguageChoice(language, language, "given")
    query_code = _queries_elsewhere(found, language)
    if query_code is None:
        return LanguageChoice(language, language, "given")
    logger.log(level, "%s", _query_switch_note(language, found.queries, found.snippets))
    return LanguageChoice(language, query_code, f"{DETECTOR}: queries {_share(found.queries)} "
                          f"(not the given {language}), snippets given")


def choose_languages(pairs: Sequence[Pair], language: str | None, *,
                     query_language: str | None = None,
                     fallback: str | None = "en") -> LanguageChoice:
    """The languages of the calibration snippets and queries, and how they were found.

    Parameters
    ----------
    pairs : sequence of Pair
        The calibration pairs (a sample of their queries and, apart, of their snippets is
        classified).
    language : str or None
        The language given by the user: of the snippets, and of the queries too unless
        ``query_language`` is given or the queries are detected in another one (below).
    query_language : str or None
        The queries' language given by the user (never overridden by a detection; equal to
        ``language``, it keeps both sides in it).
    fallback : str or None
        The language when none is detected on either side (logged as a warning); None:
        give None and log the reason at info level, and log a switch of the queries'
        language at info level too (the caller records the languages of a score already
        chosen; the caller that chose it has said so).

    Returns
    -------
    LanguageChoice
        Both languages given: as given (``source`` ``"given"``). ``language`` alone: of
        both sides, unless a sample of the queries (the half of the sample
        :func:`~ragsieve.embeddings.detection.detect_languages` classifies) is
        confidently in another language, one the snippets are not detected in (at least
        ``QUERY_SWITCH_SHARE`` of at least ``QUERY_SWITCH_MIN_QUERIES`` queries): then
        queries in it over snippets in ``language`` (the cross-language setting), logged
        as a one-line warning naming both and how to override. Neither given: the language
        :func:`~ragsieve.embeddings.detection.detect_languages` finds in each half of a
        sample (a side not detected takes the other side's language, and the source says
        so); else ``fallback`` with the reason.

    Examples
    --------
    >>> choose_languages([], "de", query_language="en-US")
    LanguageChoice(code='de', query_code='en', source='given')
    >>> choose_languages([], "ro").describe()
    'language ro (given)'
    >>> choose_languages([], "de", query_language="de").cross  # forced: no detection
    False
    """
    from ..embeddings.languages import normalise_language

    language = None if language is None else normalise_language(language)
    query_language = None if query_language is None else normalise_language(query_language)
    if language is not None and query_language is not None:
        return LanguageChoice(language, query_language, "given")
    if language is not None:  # of both sides, unless the queries are detected in another
        return _given_alone(list(pairs), language, quiet=fallback is None)
    snippets, queries, source = _detected(pairs, language, query_language)
    if snippets is not None or queries is not None:
        if snippets is None or queries is None:
            side = "snippets" if snippets is None else "queries"
            source += f"; the {side} taken to be in the other side's language"
        return LanguageChoice(snippets or queries, queries or snippets, source)
    if fallback is None:
        logger.info("language of the calibration texts not detected: %s", source)
        return LanguageChoice(None, None, f"not detected: {source}")
    logger.warning("language of the calibration texts not detected: %s; using %s (give the "
                   "language to choose another model)", source, fallback)
    return LanguageChoice(fallback, fallback, f"default; not detected: {source}")


def choose_language(pairs: Sequence[Pair], language: str | None, *,
                    fallback: str | None = "en") -> tuple[Any, str]:
    """The snippets' language and how it was found: ``(code, source)`` of
    :func:`choose_languages` (which also gives the queries' language)."""
    found = choose_languages(pairs, language, fallback=fallback)
    return found.code, found.source


#: The embedding model's settings ``auto`` takes besides ``model`` (EmbeddingScorer's defaults).
_EMBEDDING_DEFAULTS: Mapping[str, Any] = {"backend": "auto", "cache_dir": None, "batch_size": 32}


def _embedding_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The embedding model's settings of ``options`` over their defaults.

    Raises
    ------
    TypeError
        A keyword that is none of them, as Python says it of a keyword a function lacks.
    """
    for name in options:
        if name not in _EMBEDDING_DEFAULTS:
            raise TypeError(f"AutoScorer.__init__() got an unexpected keyword argument {name!r}")
    return {**_EMBEDDING_DEFAULTS, **options}


class AutoScorer(Scorer):
    """Stands for the default score until :meth:`resolve` sees the calibration pairs.

    ``ConformalFilter("auto").calibrate(pairs)`` resolves it: the list-aware or the list-free
    fused score or ``1 - cos`` (:func:`choose_score`) over the embedding model of the given or detected languages of
    the snippets and the queries (:func:`choose_languages`; a model trained on both,
    :func:`~ragsieve.embeddings.languages.choose_model`). Scoring with it before then raises
    ``ScorerError``.

    Parameters
    ----------
    model : str or None
        Embedding model (alias, sentence-transformers name or path); None picks the model
        of the languages.
    language : str or None
        Language of the texts (of the snippets, and of the queries unless
        ``query_language`` is given); None detects it from the calibration texts.
    query_language : str or None
        Language of the queries, when they are asked in another language than the
        snippets are written in; None: ``language``'s, or detected with it.
    reader_check : {"auto", "always", "never"}
        Whether a fused choice may take the reader
        (:func:`~ragsieve.scoring.reader_check.check_reader`, run by :meth:`resolve_for`).
    reader_base : str or None
        The base that reader is fine-tuned from (None: the default base, which knows about
        100 languages; ``"all-MiniLM-L6-v2"``: English only, half the layers to run). Not
        with ``reader_check="never"``.
    rerank : RerankScorer, optional
        The user's reranker: a fused choice takes it as one more signal where
        :func:`~ragsieve.scoring.signal_check.check_rerank` finds it adding to the preset's
        signals on held-back fit topics (run by :meth:`resolve_for`). The ``rerank_*``
        options (``rerank_url``, ``rerank_model``, ``rerank_api``, ...; the CLI's
        ``--rerank-url`` and so on) name one instead.
    rerank_check : {"auto", "always", "never"}
        ``auto``: fused when the check finds it adding
        :data:`~ragsieve.scoring.signal_check.MIN_RERANK_GAIN` of ROC-AUC; ``always``:
        fused whatever the check finds (still measured and recorded); ``never``: not fused.
    **options
        ``backend``, ``cache_dir``, ``batch_size``: the embedding model's, as for
        :class:`~ragsieve.scoring.EmbeddingScorer` (defaults ``"auto"``, None, 32); and the
        ``rerank_*`` options, packed into the one reranker they name
        (:func:`~ragsieve.scoring.options.pack_options`).
    """

    name: ClassVar[str] = "auto"
    score_label: ClassVar[str] = "auto (resolved by calibrate)"
    tags = ScorerTags(resolved_at_calibration=True)
    # the embedding scorer's, but the language defaults to the one detected in the pairs,
    # and the queries may be in another language
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (*(
        replace(o, default=None, help="language of the texts (default: detected)")
        if o.name == "language" else o for o in EMBEDDING_OPTIONS), ScorerOption(
        "query_language", str, None, "language of the queries, when not the texts' "
        "(default: --language's, else detected)", "--query-language"), ScorerOption(
        "reader_check", str, "auto", "scorer auto: whether it may fuse the reader fine-tuned on the fit "
        "topics: auto (checked where the reader's base knows the languages and >= 500 relevant "
        "fit pairs), always (checked on data of any language the base knows), never", "--reader-check", choices=("auto", "always", "never")),
        ScorerOption("reader_base", str, None, READER_BASE_HELP, "--reader-base",
                     choices=tuple(READER_BASES)),
        ScorerOption("rerank_check", str, "auto", "scorer auto, with --rerank-url: whether it "
                     "may fuse your reranker as a signal: auto (when it adds >= 0.005 of "
                     "ROC-AUC to the fused score on held-back fit topics), always, never",
                     "--rerank-check", choices=RERANK_CHECKS),
        *RERANK_SIGNAL_OPTIONS)

    def __init__(self, model: str | os.PathLike[str] | None = None, *, language: str | None = None,
                 query_language: str | None = None, reader_check: str = "auto",
                 reader_base: str | None = None, rerank: RerankScorer | None = None,
                 rerank_check: str = "auto", **options: Any) -> None:
        from .reader_check import READER_CHECKS

        packed = pack_options(self.declared_options, {"rerank": rerank, **options})
        given = packed.pop("rerank")
        self.options: dict[str, Any] = {"model": model, **_embedding_options(packed)}
        if rerank_check not in RERANK_CHECKS:
            raise ValueError(f"rerank_check == {rerank_check!r}, expected one of "
                             f"{', '.join(RERANK_CHECKS)}.")
        self.rerank = given
        if self.rerank is None and rerank_check != "auto":
            raise ValueError(f"rerank_check == {rerank_check!r} (--rerank-check) says what to do "
                             "with your reranker; none was given (--rerank-url, --rerank-model).")
        self.rerank_check = rerank_check
        if reader_check not in READER_CHECKS:
            raise ValueError(f"reader_check == {reader_check!r}, expected one of "
                             f"{', '.join(READER_CHECKS)}.")
        if reader_base is not None:
            get_reader_base(reader_base)  # a ValueError naming the bases for another name
        if reader_base is not None and reader_check == "never":
            raise ValueError(f"reader_base == {reader_base!r} names the base of a reader "
                             "the check may fuse; with reader_check='never' no reader is "
                             "tried (drop one of them).")
        self.reader_check = reader_check
        self.reader_base = reader_base
        self.language = language
        self.query_language = query_language

    def languages(self, pairs: Sequence[Pair], *, language: str | None = None) -> LanguageChoice:
        """The languages the model is chosen for (:func:`choose_languages`): the ones given
        (``language`` overrides the one given at construction), else detected in ``pairs``."""
        return choose_languages(list(pairs), language or self.language,
                                query_language=self.query_language)

    def resolve(self, pairs: Sequence[Pair], *, language: str | None = None,
                languages: LanguageChoice | None = None, deployed_lists: bool | None = None,
                seed: int | None = None) -> tuple[Scorer, ScoreChoice, tuple[str, str]]:
        """The scorer the pairs call for, the score choice, and ``(language, source)`` (of
        the snippets; :meth:`languages` gives both sides).

        ``language`` (when not None) overrides the one given at construction; ``languages``
        (from :meth:`languages`) is taken as it is, without detecting again;
        ``deployed_lists`` says whether the pairs' lists are the deployed retriever's
        (:func:`choose_score`); None reads it from the pairs: lists that all carry one
        retriever identity (``ragsieve retrieve``, a component's ``calibrate``:
        :func:`ragsieve.lists.retriever_of`) are. ``seed`` (the calibration seed) runs the
        reader check on the fit share it draws; None (``evaluate``'s choice over every
        split) does not.

        Raises
        ------
        ValueError
            ``seed`` None with ``reader_check="always"`` or a ``reader_base``: the check
            these ask for would not run (``evaluate``, ``choose-alpha``, ``answers``).
        """
        from ..embeddings.languages import choose_model
        from ..lists import retriever_of

        if seed is None and self.rerank is not None and self.rerank_check != "never":
            raise ValueError(
                f"a reranker ({self.rerank.spec()}): this command chooses auto's score without "
                "the rerank check (calibrate runs it on its fit topics), so it would be "
                "ignored; to measure it here use --scorer best --preset PRESET --rerank-url URL.")
        if seed is None and (self.reader_check == "always" or self.reader_base is not None):
            given = " and ".join(f for f, on in (  # the library's name and the CLI flag
                ("reader_check='always' (--reader-check always)", self.reader_check == "always"),
                (f"reader_base={self.reader_base!r} (--reader-base {self.reader_base})",
                 self.reader_base is not None)) if on)
            raise ValueError(
                f"{given}: this command chooses auto's score without the reader check "
                "(calibrate runs it on its fit topics), so it would be ignored; to measure "
                "the reader here use --scorer best --preset reader (or portable-reader).")
        pairs = list(pairs)
        found = languages or self.languages(pairs, language=language)
        if deployed_lists is None:
            deployed_lists = retriever_of(pairs) is not None
        choice = choose_score(pairs, deployed_lists=deployed_lists)
        if choice.alias != "best":
            logger.warning("score: 1 - cos (embedding), not a fused score: %s", choice.reason)
        else:
            logger.info("score: %s: %s", choice.label, choice.reason)
        options = dict(self.options)
        if options["model"] is None and found.cross:  # a model trained on both languages
            options["model"] = choose_model(str(found.code), found.query_code)
        base = resolve_scorer("embedding", language=found.code, **options)
        # across languages the preset's signals are those for queries in another language
        cross = {"query_language": found.query_code} if found.cross else {}
        if choice.alias == "best" and seed is not None:
            choice = self._with_reader(choice, pairs, base, found, seed)
            if self.rerank is not None:
                choice = self._with_rerank(choice, pairs, base, cross, seed)
        if self.reader_base is not None and choice.fused is not None and choice.fused.reader:
            cross["reader_base"] = self.reader_base
        rerank = {"rerank": self.rerank} if choice.rerank_fused else {}
        scorer = (resolve_scorer("best", base=base, preset=choice.fused, **cross, **rerank)
                  if choice.fused is not None else base)
        return scorer, choice, (str(found.code), found.source)

    def _with_reader(self, choice: ScoreChoice, pairs: list[Pair], base: Scorer,
                     found: LanguageChoice, seed: int) -> ScoreChoice:
        """The fused choice with the reader where :func:`check_reader` finds it helping."""
        from .reader_check import check_reader

        check = check_reader(pairs, base, seed=seed, language=found.code,
                             query_language=found.query_code, mode=self.reader_check,
                             reader_base=self.reader_base)
        fused = choice.fused.with_reader() if check.helps and choice.fused else choice.fused
        logger.info("reader: %s", check.reason)
        return replace(choice, fused=fused, reader=check.reason)

    def _with_rerank(self, choice: ScoreChoice, pairs: list[Pair], base: Scorer,
                     cross: Mapping[str, Any], seed: int) -> ScoreChoice:
        """The fused choice with the user's reranker where :func:`check_rerank` finds it
        adding to the preset's signals (a reader preset's without the reader: the check
        fine-tunes nothing)."""
        from .fusion import FusedScorer
        from .signal_check import check_rerank

        fused = (FusedScorer.unfitted(base, preset=get_preset(choice.fused).without_reader(),
                                      rerank=self.rerank, **cross)
                 if self.rerank_check != "never" else None)
        check = check_rerank(pairs, fused, seed=seed, mode=self.rerank_check)
        logger.info("reranker: %s", check.reason)
        return replace(choice, rerank=check.to_dict())

    def resolve_for(self, pairs: Sequence[Pair], *, language: str | None = None,
                    deployed_lists: bool = False, seed: int = 0) -> Resolution:
        """:meth:`resolve` for ``ConformalFilter.calibrate``: the chosen score (with the
        reader check on the fit share of ``seed``), and the languages and the score choice
        the artifact records."""
        found = self.languages(pairs, language=language)
        scorer, choice, _ = self.resolve(pairs, languages=found, deployed_lists=deployed_lists,
                                         seed=seed)
        return Resolution(scorer, {**found.info(), "score_choice": choice.to_dict()})

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        raise ScorerError("the 'auto' score is chosen when the filter is calibrated "
                          "(ConformalFilter.calibrate); calibrate it first.")

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name,
                **{k: str(v) for k, v in (("model", self.options["model"]),
                                          ("language", self.language),
                                          ("query_language", self.query_language),
                                          ("reader_check", None if self.reader_check == "auto"
                                           else self.reader_check),
                                          ("reader_base", self.reader_base),
                                          ("rerank_check", None if self.rerank_check == "auto"
                                           else self.rerank_check))
                   if v is not None},
                **({"rerank": self.rerank.spec()} if self.rerank is not None else {})}
