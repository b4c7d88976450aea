"""The unit a filter scores and keeps: a whole snippet, or each sentence of it.

With the sentence unit every snippet is cut by ragsieve's own splitter (the one the
chunker packs sentences with, :func:`ragsieve.chunking.sentence_spans`) and every sentence
becomes a pair of its own (:func:`sentence_pairs`), labelled so that the guarantee is on
*evidence sentences*:

* an unlabelled snippet gives unlabelled sentences (``relevant=None``);
* every sentence of an irrelevant snippet is irrelevant (0);
* in a relevant snippet, a sentence is evidence (1) when it overlaps one of the
  snippet's ``evidence`` spans (``meta["evidence"]``: ``[start, end]`` character offsets
  in the snippet text), or, for a snippet without evidence spans, when it contains one
  of the query's gold ``answers`` under SQuAD normalisation (token for token, see
  :func:`ragsieve.evaluation.answer_metrics.answer_in_context`). An answer that no
  single sentence contains (it crosses a sentence end) marks the shortest run of
  consecutive sentences that contains it. The other sentences are 0. A short answer
  ("Tesla", "5") may stand in several sentences of its snippet: each is marked, and
  :func:`sentence_pairs` logs how many snippets mark more than one (a warning: such marks
  keep more characters for the same guarantee, where spans mark the answer's own sentence).
* A relevant snippet with neither field is an error; a relevant snippet where no
  sentence can be marked (the answer only partly inside the snippet, spans in
  whitespace) keeps all its sentences as evidence (logged with a count), so the
  guarantee there is on the whole snippet, as at the snippet unit.

A sentence longer than the filter's window (:data:`MAX_SENTENCE_CHARS`, 600 characters, the
snippet unit's ``ConformalFilter.max_chars``) is cut into *pieces* of at most 500
characters (:func:`sentence_pieces`: the chunker's cut of an over-long sentence, at word
boundaries, between characters in scripts without spaces, no overlap), as the snippet unit
cuts a long snippet. Each piece is then a unit of its own, labelled, scored and kept like a
sentence: an embedding model reads only its first few hundred tokens, so evidence at the
end of a 3,700-character sentence would otherwise be scored by its beginning, and a short
relevant clause would carry 19,000 characters after it into the kept context. Calibration
(:func:`sentence_pairs`) and filtering cut with the same function, so the calibrated and
the served units are the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragsieve._spans import check_spans
from ragsieve._text import contains_run, language_key, normalized_tokens
from ragsieve._validation import check_int, check_str
from ragsieve.chunking import DEFAULT_SIZE, chunk_text, sentence_spans
from ragsieve.errors import DataError
from ragsieve.types import Pair

__all__ = [
    "MAX_SENTENCE_CHARS",
    "SENTENCE_META_KEYS",
    "UNITS",
    "Sentence",
    "check_unit",
    "sentence_pairs",
    "sentence_pieces",
    "split_sentences",
]

logger = logging.getLogger(__name__)

UNITS: tuple[str, ...] = ("snippet", "sentence")
"""The units a filter can score and keep."""

#: A sentence longer than this many characters is cut into pieces of at most
#: ``DEFAULT_SIZE`` (500): the filter's window (``ragsieve.filter.MAX_CHARS``).
MAX_SENTENCE_CHARS = int(1.2 * DEFAULT_SIZE)

#: Keys :func:`sentence_pairs` adds to each sentence pair's ``meta``.
SENTENCE_META_KEYS: tuple[str, ...] = (
    "parent_snippet_id", "sentence_start", "sentence_end", "parent_position",
)


def check_unit(unit: object) -> str:
    """``unit`` if it is one of :data:`UNITS`.

    Raises
    ------
    TypeError
        If ``unit`` is not a str.
    ValueError
        If it is another string.

    Examples
    --------
    >>> check_unit("sentence")
    'sentence'
    >>> check_unit("paragraph")
    Traceback (most recent call last):
    ...
    ValueError: unit == 'paragraph', must be one of 'snippet', 'sentence'.
    """
    choices = ", ".join(repr(u) for u in UNITS)
    value = check_str(unit, "unit", hint=f"one of {choices}")
    if value not in UNITS:
        raise ValueError(f"unit == {value!r}, must be one of {choices}.")
    return value


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence of a text: ``text[start:end] == sentence.text``.

    Attributes
    ----------
    start, end : int
        Character offsets in the text it was split from.
    text : str
        The sentence, without edge whitespace.
    cut : bool
        True for a piece of a sentence longer than the window (:func:`sentence_pieces`).
    """

    start: int
    end: int
    text: str
    cut: bool = False


def split_sentences(text: str) -> list[Sentence]:
    """The sentences of ``text``, cut by ragsieve's own splitter, with their offsets.

    The splitter is the chunker's (:func:`ragsieve.chunking.sentence_spans`: Latin and
    CJK sentence ends, line breaks). Edge whitespace is trimmed, whitespace-only pieces
    are dropped, and a text without a sentence end is one sentence; together the
    sentences cover every non-whitespace character of ``text``, in order.

    Parameters
    ----------
    text : str
        A snippet's text (or any text).

    Returns
    -------
    list of Sentence
        In order; empty for an empty or whitespace-only text.

    Raises
    ------
    TypeError
        If ``text`` is not a str (:func:`ragsieve.chunking.sentence_spans` checks it).

    Examples
    --------
    >>> [(s.start, s.end, s.text) for s in split_sentences("It rained. Then it stopped.")]
    [(0, 10, 'It rained.'), (11, 27, 'Then it stopped.')]
    """
    return [Sentence(s, e, text[s:e]) for s, e in sentence_spans(text)]


def sentence_pieces(text: str, *, max_chars: int = MAX_SENTENCE_CHARS) -> list[Sentence]:
    """The units the sentence unit scores: the sentences of ``text``, each one longer than
    ``max_chars`` cut into pieces.

    A long sentence is cut as the chunker cuts a sentence longer than its window
    (:func:`ragsieve.chunking.chunk_text` with ``overlap=0``): pieces of at most
    ``DEFAULT_SIZE`` (500) characters at word boundaries (between characters where the
    script has no spaces), in order, without overlap, so the pieces of a text still cover
    every non-whitespace character once, like its sentences. A piece is marked
    ``cut=True``.

    Parameters
    ----------
    text : str
        A snippet's text.
    max_chars : int, default=MAX_SENTENCE_CHARS
        Longest sentence kept whole (600; the filter's ``max_chars``); at least 500.

    Returns
    -------
    list of Sentence
        In text order; empty for a blank text.

    Raises
    ------
    TypeError
        If ``text`` is not a str (or ``max_chars`` not an int).
    ValueError
        If ``max_chars`` is below 500.

    Examples
    --------
    >>> long = "A clause that matters, " + "and then words without a full stop " * 30
    >>> [(s.start, s.end, s.cut) for s in sentence_pieces("Short one. " + long)]
    [(0, 10, False), (11, 511, True), (512, 1008, True), (1009, 1083, True)]
    """
    max_chars = check_int(max_chars, "max_chars", min_value=DEFAULT_SIZE,
                          hint="the longest sentence kept whole")
    out: list[Sentence] = []
    for sentence in split_sentences(text):
        if len(sentence.text) <= max_chars:
            out.append(sentence)
            continue
        for piece in chunk_text(sentence.text, "sentence", overlap=0):
            out.append(Sentence(sentence.start + piece.start, sentence.start + piece.end,
                                piece.text, cut=True))
    return out


def _check_pairs(pairs: Any) -> Sequence[Pair]:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a sequence of Pair, got {type(pairs).__name__}.")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Pair):
            raise TypeError(f"pairs[{i}] must be a Pair, got {type(pair).__name__} ({pair!r:.80}).")
    return pairs


def _query_answers(pairs: Sequence[Pair]) -> dict[str, Any]:
    """The gold ``answers`` of each query: from the first of its pairs that carries them."""
    answers: dict[str, Any] = {}
    for pair in pairs:
        value = pair.meta.get("answers")
        if value is not None and pair.query_id not in answers:
            answers[pair.query_id] = value
    return answers


def _gold_tokens(answers: Any, where: str, key: str) -> list[list[str]]:
    """Normalised tokens of each gold answer; the ones with no word left are dropped."""
    if isinstance(answers, str) or not isinstance(answers, (list, tuple)) or not all(
        isinstance(a, str) for a in answers
    ):
        raise DataError(
            f"{where}: answers == {answers!r:.80} ({type(answers).__name__}), expected a list "
            "of str (the query's gold answers)."
        )
    return [t for t in (normalized_tokens(a, key) for a in answers) if t]


def _evidence_by_spans(sentences: list[Sentence], spans: list[tuple[int, int]]) -> list[int]:
    return [int(any(s.start < e and b < s.end for b, e in spans)) for s in sentences]


def _evidence_by_answers(text: str, sentences: list[Sentence], golds: list[list[str]],
                         key: str) -> list[int]:
    """1 for each sentence containing a gold answer; for an answer no sentence contains,
    the sentences of the shortest runs of consecutive sentences that contain it."""
    n = len(sentences)
    tokens = [normalized_tokens(s.text, key) for s in sentences]
    marks = [0] * n
    for gold in golds:
        hits = [i for i in range(n) if contains_run(tokens[i], gold)]
        for i in hits:
            marks[i] = 1
        length = 2
        while not hits and length <= n:
            for i in range(n - length + 1):
                run = text[sentences[i].start:sentences[i + length - 1].end]
                if contains_run(normalized_tokens(run, key), gold):
                    hits.append(i)
                    marks[i:i + length] = [1] * length
            length += 1
    return marks


def _where(pair: Pair) -> str:
    return f"snippet {pair.snippet_id!r} of query {pair.query_id!r}"


def _spans(pair: Pair) -> list[tuple[int, int]] | None:
    """The pair's checked ``evidence`` spans, ``None`` when it has none."""
    evidence = pair.meta.get("evidence")
    return None if evidence is None else check_spans(evidence, len(pair.text), _where(pair))


def _labels(pair: Pair, sentences: list[Sentence], spans: list[tuple[int, int]] | None,
            answers: Any, language: str | None) -> Sequence[int | None]:
    """The sentence labels of one snippet pair (module docstring)."""
    if pair.relevant is None:
        return [None] * len(sentences)
    if not pair.relevant:
        return [0] * len(sentences)
    where = _where(pair)
    if spans:
        return _evidence_by_spans(sentences, spans)
    if answers is None:
        raise DataError(
            f"{where} is relevant but has no 'evidence' spans and its query no 'answers'; "
            "expected one of the two fields to tell its evidence sentences apart "
            "(or use the snippet unit)."
        )
    key = language_key(pair.meta.get("language", language))
    golds = _gold_tokens(answers, where, key)
    return _evidence_by_answers(pair.text, sentences, golds, key)


def sentence_pairs(pairs: Sequence[Pair], *, language: str | None = None,
                   max_chars: int = MAX_SENTENCE_CHARS, warn_unmarked: bool = True) -> list[Pair]:
    """One pair per sentence of every snippet pair, labelled on evidence sentences.

    A sentence longer than ``max_chars`` gives one pair per piece (:func:`sentence_pieces`,
    the cut the filter makes), each labelled like a sentence.

    Parameters
    ----------
    pairs : sequence of Pair
        Snippet pairs (e.g. from :func:`ragsieve.data.jsonl.read_pairs`), with
        ``meta["evidence"]`` spans or the query's ``meta["answers"]`` where a relevant
        snippet's evidence sentences are to be told apart.
    language : str or None
        Language of the answer normalisation for pairs without ``meta["language"]``
        (``None``: English, the SQuAD script).
    max_chars : int, default=MAX_SENTENCE_CHARS
        Longest sentence kept whole (the filter's ``max_chars``).
    warn_unmarked : bool, default=True
        Log a warning naming the relevant snippets with no sentence marked as evidence
        (all their sentences then count as evidence), and one counting those the answers
        mark in more than one sentence; False for a caller that drops them.

    Returns
    -------
    list of Pair
        In input order, each snippet's sentences in text order: same ``query_id``,
        ``query`` and ``group``; ``snippet_id`` ``f"{snippet_id}#{start}-{end}"``; the
        sentence as ``text``; ``relevant`` as the module docstring says; ``meta`` the
        parent's plus ``parent_snippet_id``, ``sentence_start`` and ``sentence_end``
        (offsets in the parent's text) and ``parent_position`` (the parent's index among
        its query's pairs), with the parent's ``evidence`` spans (if any) clipped to the
        sentence and in its offsets, so the pairs can be written as JSONL. A
        whitespace-only snippet that is not relevant gives none.

    Raises
    ------
    TypeError
        If ``pairs`` is not a sequence of Pair.
    DataError
        For a relevant snippet with neither ``evidence`` nor ``answers``, malformed
        ``evidence`` spans or ``answers``, or a relevant snippet with no text.

    Examples
    --------
    >>> snippet = Pair("q1", "Who built it?", "d:0-44", "It is tall. Gustave Eiffel built it in 1889.",
    ...                relevant=1, meta={"answers": ["Gustave Eiffel"]})
    >>> [(p.snippet_id, p.text, p.relevant) for p in sentence_pairs([snippet])]
    [('d:0-44#0-11', 'It is tall.', 0), ('d:0-44#12-44', 'Gustave Eiffel built it in 1889.', 1)]
    """
    pairs = _check_pairs(pairs)
    answers = _query_answers(pairs)
    positions: dict[str, int] = {}
    out: list[Pair] = []
    unmarked: list[str] = []
    by_words = several = 0  # relevant snippets labelled by the answers; of them, >1 marked
    for pair in pairs:
        position = positions.get(pair.query_id, 0)
        positions[pair.query_id] = position + 1
        sentences = sentence_pieces(pair.text, max_chars=max_chars)
        if not sentences and pair.relevant:
            raise DataError(f"{_where(pair)} is relevant but its text {pair.text!r:.40} has no "
                            "sentence; expected some text.")
        spans = _spans(pair)
        labels = _labels(pair, sentences, spans, answers.get(pair.query_id), language)
        if pair.relevant and not any(labels):
            labels = [1] * len(sentences)
            unmarked.append(pair.snippet_id)
        elif pair.relevant and not spans:
            by_words += 1
            several += sum(1 for label in labels if label) > 1
        out.extend(_sentence_pair(pair, s, label, position, spans)
                   for s, label in zip(sentences, labels, strict=True))
    if unmarked and warn_unmarked:
        logger.warning(
            "%d relevant snippet(s) with no sentence marked as evidence (the answer not inside "
            "one sentence run, or evidence spans only in whitespace); all their sentences count "
            "as evidence: %s", len(unmarked),
            ", ".join(repr(s) for s in unmarked[:5]) + (" ..." if len(unmarked) > 5 else ""))
    if several and warn_unmarked:
        logger.warning(
            "%d of %d relevant snippet(s) marked by their query's answers mark more than one "
            "sentence as evidence (the answer's words stand in several, or the answer crosses a "
            "sentence end); every one counts, which keeps more characters for the same "
            "guarantee: 'evidence' spans (where the answer stands) mark the answer's own "
            "sentence", several, by_words)
    return out


def _sentence_pair(parent: Pair, sentence: Sentence, relevant: int | None, position: int,
                   spans: list[tuple[int, int]] | None) -> Pair:
    meta: dict[str, Any] = {
        **parent.meta,
        "parent_snippet_id": parent.snippet_id,
        "sentence_start": sentence.start,
        "sentence_end": sentence.end,
        "parent_position": position,
    }
    if spans is not None:  # the parent's spans, clipped to the sentence, in its own offsets
        meta["evidence"] = [[max(b, sentence.start) - sentence.start,
                             min(e, sentence.end) - sentence.start]
                            for b, e in spans if b < sentence.end and sentence.start < e]
    return Pair(
        query_id=parent.query_id,
        query=parent.query,
        snippet_id=f"{parent.snippet_id}#{sentence.start}-{sentence.end}",
        text=sentence.text,
        relevant=relevant,
        group=parent.group,
        meta=meta,
    )
