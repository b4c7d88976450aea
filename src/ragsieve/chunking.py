"""Sentence-aware chunking of documents into overlapping snippets with offsets.

A document is first cut into consecutive, non-overlapping *cores* of at most
``size - overlap`` characters (the *window*; the first and the last core may also
use the extension they lack at the document edge), each ending at the last sentence
boundary in its window where possible. Each core is then widened by ``overlap // 2`` characters on
the left and ``overlap - overlap // 2`` on the right, so neighbouring snippets share
about ``overlap`` characters in total. Every snippet records its document id and its
character offsets, so ``source[s.start:s.end] == s.text`` always holds.

Guarantees (for a text that is not whitespace-only)
---------------------------------------------------
* No slack: every snippet has ``len(s.text) <= size``, for every script.
* Consecutive snippets overlap by at most ``overlap`` characters; with
  ``overlap=0`` they do not overlap.
* Starts and ends are strictly increasing; no snippet is empty or starts or ends
  with whitespace; every non-whitespace character lies in at least one snippet.
* A text whose stripped length is ``<= size`` is exactly one snippet.
* Deterministic, linear time in the length of the text.

How a core is cut (first rule that applies, searching right to left)
--------------------------------------------------------------------
1. A sentence boundary in the last two thirds of the window: Latin ``. ! ? …`` followed
   by optional closing quotes/brackets and then whitespace (not followed by a
   lowercase ASCII letter, which skips most ``e.g. the`` abbreviations) or the end
   of the text; CJK ``。 ！ ？ ； ．`` (with optional closing brackets, no space
   needed); any line break.
2. The last whitespace in the window.
3. A hard cut at the window size (moved back so that a base character keeps up to
   16 combining marks that follow it), so scripts without spaces or punctuation are
   still cut.

The overlap extensions are snapped to word boundaries: a partial word at the outer
edge of an extension is dropped when the extension contains whitespace, so actual
overlaps are often a little below ``overlap``. Text without spaces (CJK) is cut
between any two characters.
"""

from __future__ import annotations

import logging
import numbers
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ragsieve.errors import DataError
from ragsieve.types import Snippet

__all__ = [
    "DEFAULT_OVERLAP",
    "DEFAULT_SIZE",
    "Chunker",
    "chunk_documents",
    "chunk_text",
]

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 500
DEFAULT_OVERLAP = 100

_CLOSERS = "\"'”’»)\\]}」』）》〉】〕］｝"
# Latin sentence end: punctuation, optional closers, then whitespace that is not
# followed by a lowercase ASCII letter, or the end of the text.
# Possessive quantifiers and the look-behind keep long punctuation runs linear.
_LATIN_END = re.compile(rf"(?<![.!?…])[.!?…]++[{_CLOSERS}]*+(?=\s+[^\sa-z]|\s*$)")
# CJK sentence end: full-width punctuation, optional closers; no space needed.
_CJK_END = re.compile(rf"[。！？；．｡]+[{_CLOSERS}]*")
_NEWLINE = re.compile(r"[\n\r\u2028\u2029\x0b\x0c\x85]")
_WS_RUN = re.compile(r"\s+")
_WS = re.compile(r"\s")
_NON_WS = re.compile(r"\S")


def _check_sizes(size: object, overlap: object) -> tuple[int, int]:
    """Validate ``size`` and ``overlap`` and return them as plain ints."""
    for name, value in (("size", size), ("overlap", overlap)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    size_i, overlap_i = int(size), int(overlap)  # type: ignore[call-overload]
    if size_i <= 0:
        raise ValueError(f"size == {size_i}, must be > 0.")
    if not 0 <= overlap_i < size_i:
        raise ValueError(
            f"overlap == {overlap_i}, must satisfy 0 <= overlap < size (size == {size_i})."
        )
    return size_i, overlap_i


def _check_doc_id(doc_id: object) -> str:
    if not isinstance(doc_id, str):
        raise TypeError(f"doc_id must be a str, got {type(doc_id).__name__} ({doc_id!r}).")
    if not doc_id:
        raise ValueError("doc_id == '', must be a non-empty string.")
    return doc_id


def _is_mark(ch: str) -> bool:
    """True for combining marks, which must stay with the preceding character."""
    return unicodedata.category(ch).startswith("M")


def _last_in(sorted_positions: list[int], lo: int, hi: int) -> int | None:
    """Largest position ``p`` with ``lo <= p <= hi``, or ``None``."""
    i = bisect_right(sorted_positions, hi) - 1
    if i >= 0 and sorted_positions[i] >= lo:
        return sorted_positions[i]
    return None


def _cores(
    text: str, first: int, last: int, step: int, left: int, right: int
) -> list[tuple[int, int]]:
    """Cut ``text[first:last]`` into consecutive trimmed cores ``(start, end)``."""
    # Candidate cut positions p: a core ending at p is text[pos:p] (right-trimmed).
    sentence = sorted(
        {m.end() for m in _LATIN_END.finditer(text, first, last)}
        | {m.end() for m in _CJK_END.finditer(text, first, last)}
        | {m.start() for m in _NEWLINE.finditer(text, first, last)}
    )
    spaces = [m.start() for m in _WS_RUN.finditer(text, first, last)]

    cores: list[tuple[int, int]] = []
    pos = first
    while True:
        # The first core needs no left extension, the last no right extension:
        # they may use that room themselves, so no snippet exceeds ``size``.
        budget = step + (left if not cores else 0)
        if last - pos <= budget + right:
            cores.append((pos, last))
            return cores
        hi = pos + budget
        cut = _last_in(sentence, pos + max(1, budget // 3), hi)
        if cut is None:
            cut = _last_in(spaces, pos + 1, hi)
        if cut is None:
            # Keep a base character with its combining marks (up to 16 of them).
            cut = hi
            floor = max(pos + 1, pos + budget // 2, hi - 16)
            while cut > floor and _is_mark(text[cut]):
                cut -= 1
            if _is_mark(text[cut]):
                cut = hi
        end = cut
        while text[end - 1].isspace():  # terminates: text[pos] is not whitespace
            end -= 1
        cores.append((pos, end))
        nxt = _NON_WS.search(text, cut, last)
        assert nxt is not None  # last - pos > budget >= cut - pos, text[last - 1] is not space
        pos = nxt.start()


def _extend_left(text: str, core_start: int, left: int) -> int:
    """Start of a snippet whose core starts at ``core_start``."""
    start = max(0, core_start - left)
    if 0 < start < core_start and not text[start - 1].isspace() and not text[start].isspace():
        # Mid-word: drop the partial word if there is a word boundary to move to.
        ws = _WS.search(text, start, core_start)
        if ws is not None:
            start = ws.start()
    while start < core_start and (text[start].isspace() or _is_mark(text[start])):
        start += 1
    return start


def _extend_right(text: str, core_end: int, right: int, spaces: list[int]) -> int:
    """End of a snippet whose core ends at ``core_end``."""
    end = min(len(text), core_end + right)
    if core_end < end < len(text) and not text[end - 1].isspace() and not text[end].isspace():
        # Mid-word: drop the partial word if there is a word boundary to move to.
        i = bisect_left(spaces, end) - 1
        if i >= 0 and spaces[i] >= core_end:
            end = spaces[i]
    while end > core_end and (text[end - 1].isspace() or (end < len(text) and _is_mark(text[end]))):
        end -= 1
    return end


def chunk_text(
    text: str,
    doc_id: str,
    *,
    size: int = DEFAULT_SIZE,
    overlap: int = DEFAULT_OVERLAP,
) -> list[Snippet]:
    """Split one document into overlapping, sentence-aware snippets.

    Parameters
    ----------
    text : str
        The document.
    doc_id : str
        Non-empty identifier stored in every snippet.
    size : int, default 500
        Maximum snippet length in characters (a hard bound: no slack).
    overlap : int, default 100
        Characters shared by consecutive snippets in total (``overlap // 2`` taken
        from before each core, the rest from after it); ``0 <= overlap < size``.

    Returns
    -------
    list of Snippet
        In document order, with ``text[s.start:s.end] == s.text``.

    Raises
    ------
    TypeError
        If ``text`` or ``doc_id`` is not a str, or ``size``/``overlap`` not an int.
    ValueError
        If ``size <= 0``, ``overlap`` is outside ``[0, size)``, or ``doc_id`` is empty.
    DataError
        If ``text`` is empty or whitespace-only.

    Examples
    --------
    >>> doc = "The cat sat. The dog ran off. A bird sang."
    >>> snippets = chunk_text(doc, "d1", size=30, overlap=10)
    >>> [s.text for s in snippets]
    ['The cat sat. The', 'sat. The dog ran off. A', 'off. A bird sang.']
    >>> s = snippets[1]
    >>> (s.snippet_id, doc[s.start:s.end] == s.text)
    ('d1:8-31', True)
    """
    size, overlap = _check_sizes(size, overlap)
    doc_id = _check_doc_id(doc_id)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__} (doc_id {doc_id!r}).")
    first_m = _NON_WS.search(text)
    if first_m is None:
        raise DataError(
            f"Document {doc_id!r} is empty or whitespace-only ({len(text)} characters); "
            "expected some text. chunk_documents skips such documents instead."
        )
    first = first_m.start()
    last = len(text.rstrip())

    left = overlap // 2
    right = overlap - left
    cores = _cores(text, first, last, size - overlap, left, right)
    spaces = [m.start() for m in _WS_RUN.finditer(text)] if right else []

    starts = [cs if i == 0 else _extend_left(text, cs, left) for i, (cs, _) in enumerate(cores)]
    ends = [
        ce if i == len(cores) - 1 else _extend_right(text, ce, right, spaces)
        for i, (_, ce) in enumerate(cores)
    ]
    # Snapping to word boundaries may reorder neighbours when cores are tiny:
    # restore strictly increasing starts and ends by shrinking (never past a core).
    for i in range(1, len(cores)):
        if starts[i] <= starts[i - 1]:
            s = starts[i - 1] + 1
            while s < cores[i][0] and (text[s].isspace() or _is_mark(text[s])):
                s += 1
            starts[i] = s
    for i in range(len(cores) - 2, -1, -1):
        if ends[i] >= ends[i + 1]:
            e = ends[i + 1] - 1
            while e > cores[i][1] and (text[e - 1].isspace() or _is_mark(text[e])):
                e -= 1
            ends[i] = e
    return [Snippet(doc_id, s, e, text[s:e]) for s, e in zip(starts, ends)]


def chunk_documents(
    docs: Iterable[tuple[str, str]] | Mapping[str, str],
    *,
    size: int = DEFAULT_SIZE,
    overlap: int = DEFAULT_OVERLAP,
) -> tuple[list[Snippet], list[str]]:
    """Chunk many documents, skipping empty ones.

    Parameters
    ----------
    docs : mapping of doc_id to text, or iterable of (doc_id, text) pairs
        The documents; ids must be unique non-empty strings.
    size, overlap : int
        As in :func:`chunk_text`.

    Returns
    -------
    snippets : list of Snippet
        All snippets, documents in input order.
    skipped : list of str
        Ids of empty or whitespace-only documents, which are skipped with a
        logged warning rather than raising.

    Raises
    ------
    TypeError
        If ``docs`` is not one of the accepted forms, or an id/text is not a str.
    DataError
        If a doc_id occurs twice (snippet ids would collide).
    """
    size, overlap = _check_sizes(size, overlap)
    if isinstance(docs, (str, bytes)) or not isinstance(docs, (Mapping, Iterable)):
        raise TypeError(
            f"docs must be a mapping {{doc_id: text}} or an iterable of (doc_id, text) "
            f"pairs, got {type(docs).__name__}."
        )
    items = docs.items() if isinstance(docs, Mapping) else docs
    snippets: list[Snippet] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(
                "docs must be a mapping {doc_id: text} or an iterable of (doc_id, text) "
                f"pairs; got an item of type {type(item).__name__} ({item!r:.80})."
            )
        doc_id, text = item
        doc_id = _check_doc_id(doc_id)
        if doc_id in seen:
            raise DataError(f"doc_id {doc_id!r} occurs more than once; ids must be unique.")
        seen.add(doc_id)
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__} (doc_id {doc_id!r}).")
        if not text.strip():
            skipped.append(doc_id)
            continue
        snippets.extend(chunk_text(text, doc_id, size=size, overlap=overlap))
    if skipped:
        logger.warning(
            "Skipped %d empty or whitespace-only document(s): %s",
            len(skipped),
            ", ".join(repr(d) for d in skipped[:10]) + (" ..." if len(skipped) > 10 else ""),
        )
    return snippets, skipped


@dataclass(frozen=True)
class Chunker:
    """A reusable chunking configuration (validated on construction).

    Parameters
    ----------
    size : int, default 500
        Maximum snippet length in characters.
    overlap : int, default 100
        Total overlap of consecutive snippets, ``0 <= overlap < size``.

    Examples
    --------
    >>> chunker = Chunker(size=200, overlap=40)
    >>> chunker.spec()
    {'size': 200, 'overlap': 40}
    >>> [s.text for s in chunker("One. Two.", "doc")]
    ['One. Two.']
    """

    size: int = DEFAULT_SIZE
    overlap: int = DEFAULT_OVERLAP

    def __post_init__(self) -> None:
        size, overlap = _check_sizes(self.size, self.overlap)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "overlap", overlap)

    def __call__(self, text: str, doc_id: str) -> list[Snippet]:
        """Chunk one document; see :func:`chunk_text`."""
        return chunk_text(text, doc_id, size=self.size, overlap=self.overlap)

    def spec(self) -> dict[str, int]:
        """Parameters as a JSON-ready dict, ``Chunker(**spec)`` rebuilds it."""
        return {"size": self.size, "overlap": self.overlap}
