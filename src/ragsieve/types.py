"""Frozen records that flow along ragsieve's one data path.

``Snippet`` (chunking) -> ``Pair`` (a labelled or unlabelled query/snippet pair)
-> ``Scored`` (a snippet with its nonconformity score) -> ``FilterResult``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_ALPHA", "RETRIEVER_KEY", "FilterResult", "Pair", "Scored", "Snippet", "fingerprint_pairs"]

#: The ``Pair.meta`` key (a JSONL key of the pairs) holding the identity of the retriever that
#: returned the pair's list: written by ``ragsieve retrieve`` and the framework components'
#: ``calibrate``, read by ``calibrate`` into the artifact's ``lists`` block
#: (:func:`ragsieve.lists.retriever_of`).
RETRIEVER_KEY = "retriever"

#: The target miscoverage when none is given (filters, calibrators, the one-alpha commands).
DEFAULT_ALPHA = 0.1


@dataclass(frozen=True, slots=True)
class Snippet:
    """A window of a source document.

    Attributes
    ----------
    doc_id : str
        Identifier of the source document.
    start, end : int
        Character offsets in the source: ``source[start:end] == text``.
    text : str
        The snippet text.
    """

    doc_id: str
    start: int
    end: int
    text: str

    @property
    def snippet_id(self) -> str:
        """Stable identifier ``"{doc_id}:{start}-{end}"``."""
        return f"{self.doc_id}:{self.start}-{self.end}"


@dataclass(frozen=True, slots=True)
class Pair:
    """One (query, snippet) pair: a line of the generic JSONL format.

    Attributes
    ----------
    query_id : str
        Identifier of the query; all pairs of one query form its retrieved list.
    query : str
        The query text.
    snippet_id : str
        Identifier of the snippet, unique within the query.
    text : str
        The snippet text.
    relevant : int or None
        1 if the snippet is relevant evidence for the query, 0 if not, ``None``
        if unlabelled (allowed when filtering, not when calibrating).
    group : str
        Topic used for disjoint calibration/test splits (defaults to ``query_id``).
    meta : Mapping[str, Any]
        Any further keys of the JSONL line, kept so that a round trip loses nothing.
    """

    query_id: str
    query: str
    snippet_id: str
    text: str
    relevant: int | None = None
    group: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.group:
            object.__setattr__(self, "group", self.query_id)


@dataclass(frozen=True, slots=True)
class Scored:
    """A snippet with its nonconformity score (lower = more relevant).

    Attributes
    ----------
    index : int
        Position of the snippet in the input list.
    snippet_id : str
        Identifier of the snippet (the position as a string when none was given).
    text : str
        The snippet text.
    score : float
        Nonconformity score (for a snippet cut into pieces, its best piece's score).
    spans : tuple of (int, int)
        The character spans ``(start, end)`` of ``text`` that were kept: for a filter of
        unit ``"sentence"``, one span per kept sentence, in order; for a snippet longer
        than the filter's window, cut into pieces, the spans of its kept pieces (merged
        where they overlap); empty when the snippet was kept whole.
    p_value : float or None
        The conformal p-value of ``score`` (:mod:`ragsieve.calibration.p_values`): the
        share of the relevant calibration snippets that scored no better, in (0, 1], the
        same unit for every score and mode (marginal mode: kept exactly when it exceeds
        alpha); None for a filter whose artifact stores no calibration evidence.
    """

    index: int
    snippet_id: str
    text: str
    score: float
    spans: tuple[tuple[int, int], ...] = ()
    p_value: float | None = None

    @property
    def pruned_text(self) -> str:
        """The kept spans' texts joined with ``" "`` (the whole text when ``spans`` is empty).

        Examples
        --------
        >>> Scored(0, "s", "Ada wrote. Bob ate. Cy ran.", 0.1, ((0, 10), (20, 27))).pruned_text
        'Ada wrote. Cy ran.'
        >>> Scored(0, "s", "Kept whole.", 0.1).pruned_text
        'Kept whole.'
        """
        if not self.spans:
            return self.text
        return " ".join(self.text[start:end] for start, end in self.spans)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """What a calibrated filter kept for one query.

    Attributes
    ----------
    query : str
        The query.
    kept : tuple of Scored
        Kept snippets in their original order.
    scores : tuple of float
        Scores of *all* input snippets, in input order.
    threshold : float
        The calibrated threshold tau (``inf`` keeps everything).
    n_input : int
        Number of snippets given.
    note : str or None
        Why the result is unusual (empty result, ``min_keep`` applied, long snippets cut),
        else ``None``.
    n_cut : int
        Input snippets longer than the filter's window, cut into pieces and scored piece
        by piece (kept when any piece is kept).
    removed : tuple of Scored
        The snippets not kept, in their original order, each with its score (above
        ``threshold``, the threshold it missed).
    rule_kept_none : bool
        The mode's rule kept none of the ``n_input`` snippets (of their sentences, for unit
        ``"sentence"``): ``kept`` is then empty, or holds the ``min_keep`` best, outside the
        calibrated guarantee (``note`` says which).
    unit : {"snippet", "sentence"}
        What the filter scored and kept: whole snippets, or the sentences of each snippet
        (then ``kept`` holds the snippets with at least one kept sentence, their ``spans``
        the kept sentences, ``score`` and ``scores`` each snippet's best sentence's score).
    sentences : tuple of (int, int, int, float, bool)
        Unit ``"sentence"``: every sentence scored, as ``(snippet index, start, end, score,
        kept)`` with ``start``/``end`` character offsets in that snippet's text, in input
        order; empty for unit ``"snippet"``.
    lists_unlike : bool
        The list is unlike the filter's calibration lists, for a score that reads the whole
        list (:mod:`ragsieve.lists`): its length is outside the calibration lengths, or the
        sequential test over the lists seen so far has fired; the guarantee then may not
        hold. Always False for a list-free score.
    lists_note : str or None
        What differs, in the user's terms (None when ``lists_unlike`` is False).
    p_values : tuple of float
        The conformal p-value of each input snippet's score, in input order (``Scored.p_value``;
        empty when the filter stores no calibration evidence).
    sentence_p_values : tuple of float
        Unit ``"sentence"``: the p-value of each record of ``sentences``, aligned with it.
    """

    query: str
    kept: tuple[Scored, ...]
    scores: tuple[float, ...]
    threshold: float
    n_input: int
    note: str | None = None
    n_cut: int = 0
    removed: tuple[Scored, ...] = ()
    rule_kept_none: bool = False
    unit: str = "snippet"
    sentences: tuple[tuple[int, int, int, float, bool], ...] = ()
    lists_unlike: bool = False
    lists_note: str | None = None
    p_values: tuple[float, ...] = ()
    sentence_p_values: tuple[float, ...] = ()

    @property
    def kept_ids(self) -> list[str]:
        """Identifiers of the kept snippets."""
        return [s.snippet_id for s in self.kept]

    @property
    def removed_ids(self) -> list[str]:
        """Identifiers of the removed snippets."""
        return [s.snippet_id for s in self.removed]

    @property
    def removal(self) -> float:
        """Fraction of input snippets removed (0 when the input was empty)."""
        if self.n_input == 0:
            return 0.0
        return 1.0 - len(self.kept) / self.n_input

    @property
    def keeps_all(self) -> bool:
        """True when the threshold is infinite."""
        return math.isinf(self.threshold)

    @property
    def unit_scores(self) -> list[float]:
        """The scores of what the filter scored, kept or not: each sentence's (unit
        ``"sentence"``) or each snippet's -- what an exchangeability monitor's calibration
        reference holds for a calibration query."""
        if self.unit == "sentence":
            return [s[3] for s in self.sentences]
        return list(self.scores)


def fingerprint_pairs(pairs: Iterable[Pair]) -> str:
    """SHA-256 of the labelled content of ``pairs``, independent of their order.

    Each pair is serialised canonically as the compact JSON array
    ``[query_id, snippet_id, text, relevant]``; the sorted lines are hashed. Query
    text, group and meta are not part of the fingerprint.

    Parameters
    ----------
    pairs : iterable of Pair

    Returns
    -------
    str
        64 hexadecimal characters.

    Examples
    --------
    >>> a = Pair("q", "Who?", "s1", "Ada.", 1)
    >>> b = Pair("q", "Who?", "s2", "Bob.", 0)
    >>> fingerprint_pairs([a, b]) == fingerprint_pairs([b, a])
    True
    """
    lines = sorted(
        json.dumps(
            [p.query_id, p.snippet_id, p.text, p.relevant],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for p in pairs
    )
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()
