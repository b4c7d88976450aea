"""Sentence-preserving chunking of documents into overlapping snippets with offsets.

A document is split into sentences, and whole sentences are packed greedily into
snippets of at most ``size`` characters. Consecutive snippets share whole sentences:
the next snippet starts at the earliest sentence of the previous one (not its first)
such that the shared sentences take at most ``overlap`` characters and the sentence
after the previous snippet still fits; when even the last sentence alone is longer
than ``overlap`` (or the next sentence would not fit), the next snippet starts after
the previous one, without overlap. Every snippet records its document id and its
character offsets, so ``source[s.start:s.end] == s.text`` always holds.

The only exception is a sentence longer than ``size``: it becomes a snippet run of its
own, cut into pieces of at most ``size`` characters at word boundaries (between any two
characters in scripts without spaces), neighbouring pieces sharing about ``overlap``
characters, snapped to whole words. A piece never reaches outside its sentence, and
no other snippet overlaps it.

Guarantees (for a text that is not whitespace-only)
---------------------------------------------------
* No slack: every snippet has ``len(s.text) <= size``, for every script.
* Every snippet starts at a sentence start and ends at a sentence end, unless it lies
  inside one sentence longer than ``size``.
* Consecutive snippets overlap by at most ``overlap`` characters, in whole sentences
  (or whole words inside an over-long sentence); with ``overlap=0`` they do not overlap.
* Starts and ends are strictly increasing; no snippet is empty or starts or ends
  with whitespace; every non-whitespace character lies in at least one snippet.
* A text whose stripped length is ``<= size`` is exactly one snippet.
* Deterministic, linear time in the length of the text.

Where a sentence ends
---------------------
* Latin ``. ! ? …`` followed by optional closing quotes/brackets and then whitespace
  (not followed by a lowercase ASCII letter, which skips most ``e.g. the``
  abbreviations) or the end of the text, unless the punctuation follows an initial
  (``John C. Smith``, ``U.S. Army``), ``Mr Mrs Ms Dr Prof St Mt Jr Sr`` or a number of
  one or two digits (the ordinal of ``am 28. Mai``);
* CJK ``。 ！ ？ ； ．`` with optional closing brackets (no space needed);
* any line break.

Text with none of these (Thai, which separates phrases by spaces but has no sentence
punctuation, or CJK without punctuation) is one sentence; when it is longer than
``size`` it is cut at spaces, or between characters where there are none, keeping a
base character with up to 16 combining marks.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ragsieve._validation import check_int, check_str
from ragsieve.errors import DataError
from ragsieve.types import Snippet

__all__ = [
    "DEFAULT_OVERLAP",
    "DEFAULT_SIZE",
    "Chunker",
    "chunk_documents",
    "chunk_text",
    "sentence_spans",
]

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 500
DEFAULT_OVERLAP = 100

_CLOSERS = "\"'”’»)\\]}」』）》〉】〕］｝"
# Latin sentence end: punctuation, optional closers, then whitespace that is not
# followed by a lowercase ASCII letter, or the end of the text; not after an initial
# ("John C. Smith", "U.S. Army"), a title ("Mr. Smith") or a one- or two-digit number
# (the German, Nordic, ... ordinal "am 28. Mai").
# Possessive quantifiers and the first look-behind keep long punctuation runs linear.
_NOT_AFTER = r"(?<!\b[A-Z\d])(?<!\b(?:\d\d|Mr|Ms|Dr|St|Mt|Jr|Sr))(?<!\bMrs)(?<!\bProf)"
_LATIN_END = re.compile(  # the leading look-ahead skips the look-behinds off punctuation
    rf"(?=[.!?…])(?<![.!?…]){_NOT_AFTER}[.!?…]++[{_CLOSERS}]*+(?=\s+[^\sa-z]|\s*$)"
)
# CJK sentence end: full-width punctuation, optional closers; no space needed.
_CJK_END = re.compile(rf"[。！？；．｡]+[{_CLOSERS}]*")
_NEWLINE = re.compile(r"[\n\r\u2028\u2029\x0b\x0c\x85]")
_WS_RUN = re.compile(r"\s+")
_WS = re.compile(r"\s")
_FIRST_MARK = "\u0300"  # no combining mark (category M*) comes before U+0300
_NON_WS = re.compile(r"\S")


def _check_sizes(size: object, overlap: object) -> tuple[int, int]:
    """Validate ``size`` and ``overlap`` and return them as plain ints."""
    size_i, overlap_i = check_int(size, "size"), check_int(overlap, "overlap")
    if size_i <= 0:
        raise ValueError(f"size == {size_i}, must be > 0.")
    if not 0 <= overlap_i < size_i:
        raise ValueError(
            f"overlap == {overlap_i}, must satisfy 0 <= overlap < size (size == {size_i})."
        )
    return size_i, overlap_i


def _check_doc_id(doc_id: object) -> str:
    doc_id = check_str(doc_id, "doc_id")
    if not doc_id:  # only '' is refused: ids taken from data may be any other string
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


def _sentences(text: str, first: int, last: int) -> list[tuple[int, int]]:
    """Sentences ``(start, end)`` of ``text[first:last]``, in order, without edge whitespace.

    They cover every non-whitespace character of the range exactly once. A sentence
    ends at a Latin or CJK sentence end or before a line break (see the module
    docstring), never just before a combining mark.
    """
    cuts = sorted(
        {m.end() for m in _LATIN_END.finditer(text, first, last)}
        | {m.end() for m in _CJK_END.finditer(text, first, last)}
        | {m.start() for m in _NEWLINE.finditer(text, first, last)}
    )
    if not cuts or cuts[-1] != last:
        cuts.append(last)
    sentences: list[tuple[int, int]] = []
    pos = first
    for cut in cuts:
        if cut < last and text[cut] >= _FIRST_MARK and _is_mark(text[cut]):
            continue  # a combining mark stays with its base character
        start = pos
        if text[start].isspace():
            m = _NON_WS.search(text, pos, cut)
            start = cut if m is None else m.start()
        if start < cut:
            end = cut
            while text[end - 1].isspace():  # terminates: text[start] is not whitespace
                end -= 1
            sentences.append((start, end))
        pos = cut
    return sentences


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as ``(start, end)`` offsets: the ones the chunker packs.

    Sentences end where the module docstring says; each is trimmed of edge whitespace,
    they are in order and cover every non-whitespace character exactly once. A text
    without a sentence end is one sentence; an empty or whitespace-only text has none.

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    list of (int, int)
        ``text[start:end]`` is each sentence.

    Raises
    ------
    TypeError
        If ``text`` is not a str (bytes are not decoded here: decode them first).

    Examples
    --------
    >>> text = "The cat sat. It ran!  北京很大。很美"
    >>> [text[s:e] for s, e in sentence_spans(text)]
    ['The cat sat.', 'It ran!', '北京很大。', '很美']
    """
    text = check_str(text, "text")
    first_m = _NON_WS.search(text)
    if first_m is None:
        return []
    return _sentences(text, first_m.start(), len(text.rstrip()))


def _pack(sentences: list[tuple[int, int]], size: int, overlap: int) -> list[tuple[int, int]]:
    """Pack sentences (each at most ``size`` long) greedily into overlapping windows.

    A window is the longest run of whole sentences from its first one that fits in
    ``size``. The next window starts at the earliest later sentence of the current
    window such that the shared sentences take at most ``overlap`` characters and the
    sentence after the current window still fits; failing that, right after it.
    Both indices only move forward, so this is linear in the number of sentences.
    """
    windows: list[tuple[int, int]] = []
    n = len(sentences)
    i = j = 0
    while True:
        start = sentences[i][0]
        while j + 1 < n and sentences[j + 1][1] - start <= size:
            j += 1
        windows.append((start, sentences[j][1]))
        if j == n - 1:
            return windows
        end, following = sentences[j][1], sentences[j + 1][1]
        i += 1
        while i <= j and (end - sentences[i][0] > overlap or following - sentences[i][0] > size):
            i += 1
        j = max(j, i)


def _cores(
    text: str, first: int, last: int, step: int, left: int, right: int, spaces: list[int]
) -> list[tuple[int, int]]:
    """Cut ``text[first:last]`` into consecutive trimmed cores ``(start, end)``.

    ``spaces`` holds the starts of the whitespace runs inside the range.
    """
    cores: list[tuple[int, int]] = []
    pos = first
    while True:
        # The first core needs no left extension, the last no right extension:
        # they may use that room themselves, so no piece exceeds ``size``.
        budget = step + (left if not cores else 0)
        if last - pos <= budget + right:
            cores.append((pos, last))
            return cores
        hi = pos + budget
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


def _extend_left(text: str, core_start: int, left: int, lo: int) -> int:
    """Start of a piece whose core starts at ``core_start``, not before ``lo``."""
    start = max(lo, core_start - left)
    if lo < start < core_start and not text[start - 1].isspace() and not text[start].isspace():
        # Mid-word: drop the partial word if there is a word boundary to move to.
        ws = _WS.search(text, start, core_start)
        if ws is not None:
            start = ws.start()
    while start < core_start and (text[start].isspace() or _is_mark(text[start])):
        start += 1
    return start


def _extend_right(text: str, core_end: int, right: int, hi: int, spaces: list[int]) -> int:
    """End of a piece whose core ends at ``core_end``, not after ``hi``."""
    end = min(hi, core_end + right)
    if core_end < end < hi and not text[end - 1].isspace() and not text[end].isspace():
        # Mid-word: drop the partial word if there is a word boundary to move to.
        i = bisect_left(spaces, end) - 1
        if i >= 0 and spaces[i] >= core_end:
            end = spaces[i]
    while end > core_end and (text[end - 1].isspace() or (end < len(text) and _is_mark(text[end]))):
        end -= 1
    return end


def _pieces(text: str, first: int, last: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """Cut one sentence longer than ``size`` into overlapping pieces at word boundaries.

    The sentence is cut into consecutive cores of at most ``size - overlap`` characters
    (the first and the last may also use the extension they lack at the sentence
    edges), each ending at the last whitespace in its window, or hard-cut where there
    is none. Each core is then widened by ``overlap // 2`` characters on the left and
    the rest on the right, inside the sentence, dropping a partial word at the outer
    edge when the extension contains whitespace.
    """
    left = overlap // 2
    right = overlap - left
    spaces = [m.start() for m in _WS_RUN.finditer(text, first, last)]
    cores = _cores(text, first, last, size - overlap, left, right, spaces)
    starts = [
        cs if k == 0 else _extend_left(text, cs, left, first) for k, (cs, _) in enumerate(cores)
    ]
    ends = [
        ce if k == len(cores) - 1 else _extend_right(text, ce, right, last, spaces)
        for k, (_, ce) in enumerate(cores)
    ]
    # Snapping to word boundaries may reorder neighbours when cores are tiny:
    # restore strictly increasing starts and ends by shrinking (never past a core).
    for k in range(1, len(cores)):
        if starts[k] <= starts[k - 1]:
            s = starts[k - 1] + 1
            while s < cores[k][0] and (text[s].isspace() or _is_mark(text[s])):
                s += 1
            starts[k] = s
    for k in range(len(cores) - 2, -1, -1):
        if ends[k] >= ends[k + 1]:
            e = ends[k + 1] - 1
            while e > cores[k][1] and (text[e - 1].isspace() or _is_mark(text[e])):
                e -= 1
            ends[k] = e
    return list(zip(starts, ends, strict=True))


def chunk_text(
    text: str,
    doc_id: str,
    *,
    size: int = DEFAULT_SIZE,
    overlap: int = DEFAULT_OVERLAP,
) -> list[Snippet]:
    """Split one document into overlapping snippets of whole sentences.

    Parameters
    ----------
    text : str
        The document.
    doc_id : str
        Non-empty identifier stored in every snippet.
    size : int, default 500
        Maximum snippet length in characters (a hard bound: no slack).
    overlap : int, default 100
        Most characters two consecutive snippets share: the longest run of whole
        sentences that fits (none when the last sentence alone is longer); inside a
        sentence longer than ``size``, about this many characters of whole words.
        ``0 <= overlap < size``.

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
    >>> doc = "The cat sat. It ran. A bird sang. The end."
    >>> snippets = chunk_text(doc, "d1", size=30, overlap=10)
    >>> [s.text for s in snippets]
    ['The cat sat. It ran.', 'It ran. A bird sang. The end.']
    >>> s = snippets[1]
    >>> (s.snippet_id, doc[s.start:s.end] == s.text)
    ('d1:13-42', True)
    """
    size, overlap = _check_sizes(size, overlap)
    doc_id = _check_doc_id(doc_id)
    text = check_str(text, f"text (doc_id {doc_id!r})")
    first_m = _NON_WS.search(text)
    if first_m is None:
        raise DataError(
            f"Document {doc_id!r} is empty or whitespace-only ({len(text)} characters); "
            "expected some text. chunk_documents skips such documents instead."
        )
    spans: list[tuple[int, int]] = []
    run: list[tuple[int, int]] = []  # consecutive sentences that fit in a snippet
    for start, end in _sentences(text, first_m.start(), len(text.rstrip())):
        if end - start <= size:
            run.append((start, end))
            continue
        if run:
            spans.extend(_pack(run, size, overlap))
            run = []
        spans.extend(_pieces(text, start, end, size, overlap))
    if run:
        spans.extend(_pack(run, size, overlap))
    return [Snippet(doc_id, s, e, text[s:e]) for s, e in spans]


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
        text = check_str(text, f"text (doc_id {doc_id!r})")
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
        Most characters two consecutive snippets share (whole sentences, see
        :func:`chunk_text`), ``0 <= overlap < size``.

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
