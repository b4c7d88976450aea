"""The language of a set of texts, detected with py3langid (its model ships in the wheel).

py3langid (BSD licence, pure Python and numpy, a 4.5 MB wheel holding its model) classifies
one text at a time. :func:`detect_language` classifies a bounded,
evenly spaced sample of the texts and takes the majority; when no language holds at least
``min_share`` of the sample, or two tie, it gives no language and says why, and the caller
falls back (to English, the default of :func:`~ragsieve.embeddings.languages.choose_model`).
:func:`detect_languages` does so for the queries and for the snippets of labelled pairs
apart (each a majority over its half of the sample), as queries may be asked in another
language than the snippets are written in.

docs/scores.md compares the detectors considered (accuracy per language, model size,
licence).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._validation import check_int, check_unit_interval
from .languages import normalise_language

__all__ = ["DETECTOR", "LanguageGuess", "LanguageWatch", "TextLanguages", "detect_language",
           "detect_languages", "language_samples", "language_texts", "traffic_language_note"]

logger = logging.getLogger(__name__)

DETECTOR = "py3langid"
#: Texts classified at most (evenly spaced over the input).
MAX_TEXTS = 200
#: Share of the sample the majority language needs.
MIN_SHARE = 0.6


@dataclass(frozen=True)
class LanguageGuess:
    """What :func:`detect_language` found.

    Attributes
    ----------
    code : str or None
        The majority language (ISO 639-1), or None when the sample decides nothing.
    share : float
        Share of the classified texts in that language (the top language's, when ``code``
        is None).
    n_texts : int
        Texts classified.
    reason : str
        Why ``code`` is None (empty otherwise).
    """

    code: str | None
    share: float
    n_texts: int
    reason: str = ""

    def describe(self) -> str:
        """``"ru (py3langid, 0.97 of 200 texts)"``, or the reason nothing was detected."""
        if self.code is None:
            return f"not detected ({self.reason})"
        return f"{self.code} ({DETECTOR}, {self.share:.2f} of {self.n_texts} texts)"

    def to_dict(self) -> dict[str, Any]:
        """The guess as plain JSON values."""
        return {"code": self.code, "share": round(self.share, 4), "n_texts": self.n_texts,
                "detector": DETECTOR, **({"reason": self.reason} if self.reason else {})}


def _sample(texts: Sequence[str], limit: int) -> list[str]:
    kept = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(kept) <= limit:
        return kept
    step = len(kept) / limit
    return [kept[int(i * step)] for i in range(limit)]


def _classifier() -> Any:
    from .._optional import require

    return require("py3langid", extra="embed")


def detect_language(texts: Iterable[str], *, max_texts: int = MAX_TEXTS,
                    min_share: float = MIN_SHARE) -> LanguageGuess:
    """The majority language of ``texts`` (a bounded sample of them).

    Parameters
    ----------
    texts : iterable of str
        Queries and snippets; empty and non-string items are skipped.
    max_texts : int
        At most this many texts are classified, evenly spaced over the input.
    min_share : float
        The majority language must hold at least this share of the classified texts.

    Returns
    -------
    LanguageGuess
        ``code`` None, with the reason, for no text, a tie, or a majority below
        ``min_share``.

    Raises
    ------
    ImportError
        py3langid is not installed (it comes with ``pip install 'ragsieve[embed]'``) and
        the sample holds a text to classify.

    Examples
    --------
    >>> detect_language(["Москва является столицей России.", "Где находится Москва?"]).code
    'ru'
    >>> detect_language([]).reason
    'no text to detect the language of'
    """
    max_texts = check_int(max_texts, "max_texts", min_value=1)
    check_unit_interval(min_share, "min_share", closed_right=True)
    sample = _sample(list(texts), max_texts)
    if not sample:
        return LanguageGuess(None, 0.0, 0, "no text to detect the language of")
    langid = _classifier()
    votes = Counter(normalise_language(langid.classify(text)[0]) for text in sample)
    (top, n_top), *rest = votes.most_common(2) + [("", 0)]
    share = n_top / len(sample)
    if rest and rest[0][1] == n_top:
        return LanguageGuess(None, share, len(sample),
                             f"tie between {top} and {rest[0][0]} ({n_top} of {len(sample)} "
                             "texts each)")
    if share < min_share:
        return LanguageGuess(None, share, len(sample),
                             f"the most frequent language, {top}, holds {share:.2f} of "
                             f"{len(sample)} texts, below {min_share:.2f}")
    return LanguageGuess(top, share, len(sample))


@dataclass(frozen=True)
class TextLanguages:
    """What :func:`detect_languages` found in the queries and in the snippets of pairs.

    Attributes
    ----------
    queries, snippets : LanguageGuess
        The majority language of each half of the sample.
    """

    queries: LanguageGuess
    snippets: LanguageGuess


def language_samples(pairs: Sequence[Any], *, max_texts: int = MAX_TEXTS,
                     ) -> tuple[list[str], list[str]]:
    """Bounded, even samples of the query texts (each once) and of the snippet texts of
    ``pairs``: half of ``max_texts`` queries, the rest snippets."""
    queries = list(dict.fromkeys(p.query for p in pairs))
    snippets = [p.text for p in pairs]
    half = max(1, max_texts // 2)
    picked_q = _sample(queries, half)
    return picked_q, _sample(snippets, max(1, max_texts - len(picked_q)))


def language_texts(pairs: Sequence[Any], *, max_texts: int = MAX_TEXTS) -> list[str]:
    """A bounded, even sample of the query and snippet texts of ``pairs``: half queries
    (each once), half snippets (see :func:`language_samples`)."""
    queries, snippets = language_samples(pairs, max_texts=max_texts)
    return queries + snippets


def detect_languages(pairs: Sequence[Any], *, max_texts: int = MAX_TEXTS,
                     min_share: float = MIN_SHARE) -> TextLanguages:
    """The majority language of the queries and, apart, of the snippets of ``pairs``.

    Each half of a sample of at most ``max_texts`` texts (:func:`language_samples`) is
    classified by :func:`detect_language` with ``min_share``.

    Raises
    ------
    ImportError
        As :func:`detect_language`: py3langid is missing and ``pairs`` is not empty.

    Examples
    --------
    >>> from ragsieve.types import Pair
    >>> pairs = [Pair("q1", "Where is the Hermitage museum?", "s1",
    ...               "Государственный Эрмитаж находится в Санкт-Петербурге.", 1)]
    >>> found = detect_languages(pairs)
    >>> found.queries.code, found.snippets.code
    ('en', 'ru')
    """
    queries, snippets = language_samples(pairs, max_texts=max_texts)
    return TextLanguages(detect_language(queries, max_texts=max_texts, min_share=min_share),
                         detect_language(snippets, max_texts=max_texts, min_share=min_share))


def traffic_language_note(expected: str, texts: Sequence[str], *, model: str | None = None,
                          max_texts: int = 50, snippets: str | None = None) -> str | None:
    """A one-line note when ``texts`` (traffic: the queries sent to a filter) are in another
    language than ``expected`` (the language of the queries the filter was calibrated on),
    else None.

    At most ``max_texts`` texts are classified; an undetected language or a missing
    py3langid gives None (nothing is known to differ). ``snippets``, the language of the
    filter's snippets when known, is named beside the queries' when it differs from
    ``expected`` (a cross-language filter), and the note then also points at the
    cross-language calibration (``--query-language``) for the detected queries' language.

    Examples
    --------
    >>> traffic_language_note("en", ["Где находится Москва?", "Кто написал эту книгу?"])
    'the queries are in ru (py3langid, 1.00 of 2 texts) but the filter was calibrated on en: its threshold holds for en data; calibrate a filter on ru data'
    >>> print(traffic_language_note("de", ["Where is Moscow?", "Who wrote this book?"],
    ...                             snippets="de"))  # doctest: +NORMALIZE_WHITESPACE
    the queries are in en (py3langid, 1.00 of 2 texts) but the filter was calibrated on de:
    its threshold holds for de data; calibrate a filter on en data, or on queries in en over
    de snippets (--query-language en) if the snippets stay in de
    """
    try:
        guess = detect_language(texts, max_texts=max_texts)
    except ImportError:  # said, not swallowed: the check is skipped, the filter still runs
        logger.warning("the language of the queries is not checked against the filter's "
                       "(%s): %s is not installed (pip install 'ragsieve[embed]')", expected,
                       DETECTOR)
        return None
    expected = normalise_language(expected)
    if guess.code is None or guess.code == expected:
        return None
    snippets = None if snippets is None else normalise_language(snippets)
    cross = snippets is not None and snippets != expected
    what = f"queries {expected} over snippets {snippets}" if cross else expected
    on = f"{what} ({model})" if model else what
    holds = f"queries in {expected}" if cross else f"{expected} data"
    fix = f"calibrate a filter on {guess.code} data"
    if snippets is not None and snippets != guess.code:
        fix += (f", or on queries in {guess.code} over {snippets} snippets (--query-language "
                f"{guess.code}) if the snippets stay in {snippets}")
    return (f"the queries are in {guess.describe()} but the filter was calibrated on {on}: "
            f"its threshold holds for {holds}; {fix}")


class LanguageWatch:
    """Warn once when a stream of queries is in another language than a filter's.

    :meth:`see` keeps the first ``n`` queries (a lock and an append on the request path);
    the ``n``-th starts one short thread that detects their language and logs a warning
    when it differs from ``expected``. Later queries cost one attribute read.

    Parameters
    ----------
    expected : str or None
        The language of the queries the filter was calibrated on; None watches nothing.
    model : str, optional
        The filter's embedding model, named in the warning.
    n : int
        Queries the detection reads.
    snippets : str, optional
        The language of the filter's snippets (see :func:`traffic_language_note`).
    """

    def __init__(self, expected: str | None, *, model: str | None = None, n: int = 20,
                 snippets: str | None = None) -> None:
        self.expected = expected
        self.model = model
        self.snippets = snippets
        self.n = n
        self.note: str | None = None
        self._texts: list[str] = []
        self._done = expected is None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def see(self, query: str) -> None:
        """Take one query into the sample (the first ``n`` only)."""
        if self._done:
            return
        with self._lock:
            if self._done:
                return
            self._texts.append(str(query)[:1000])
            if len(self._texts) < self.n:
                return
            self._done, texts, self._texts = True, self._texts, []
        self._thread = threading.Thread(target=self._check, args=(texts,), daemon=True,
                                        name="ragsieve-language-watch")
        self._thread.start()

    def _check(self, texts: list[str]) -> None:
        try:
            self.note = traffic_language_note(str(self.expected), texts, model=self.model,
                                              snippets=self.snippets)
        except Exception:  # pragma: no cover - a note must never break serving
            logger.exception("detecting the language of the traffic failed")
            return
        if self.note:
            logger.warning("%s", self.note)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the detection thread (if started) to finish."""
        if self._thread is not None:
            self._thread.join(timeout)
