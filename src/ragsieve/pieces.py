"""What a filter scores: the accepted snippet forms as items, and the items cut into pieces.

A snippet is a ``str``, a :class:`~ragsieve.types.Snippet`, a :class:`~ragsieve.types.Pair`
or a mapping (``"text"``, an outside ``"score"``, ``"snippet_id"`` / ``"id"``, a group);
:func:`as_items` turns a sequence of them into one form, dicts with a ``snippet_id``, and
refuses anything else with the list of accepted forms.

:func:`cut` then gives what is scored (:class:`Pieces`): for unit ``"snippet"`` the items,
a text longer than ``max_chars`` cut into sentence-aware windows of the size the filter
was calibrated on; for unit ``"sentence"`` every item's sentences
(:func:`ragsieve.units.sentence_pieces`), each knowing its snippet (the context the
sentence-in-context score reads). :meth:`Pieces.kept_spans` maps kept pieces back to spans
of their items.

Examples
--------
>>> cut(as_items(["short", "x" * 700]), unit="snippet", max_chars=600).cut_summary()
(1, 2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import check_str
from .chunking import DEFAULT_SIZE, chunk_text
from .errors import DataError
from .keep_policy import MAX_CHARS
from .scoring import Scorer
from .scoring.sentence_context import PARENT_POSITION, PARENT_TEXT
from .types import Pair, Snippet
from .units import sentence_pieces

__all__ = ["ACCEPTED", "MAX_CHARS", "PairBatch", "Pieces", "SnippetLike", "as_item", "as_items",
           "check_snippet_unit", "cut", "cut_pairs", "model_texts", "snippet_list",
           "vector_scores"]

SnippetLike = str | Snippet | Pair | Mapping[str, Any]
#: The accepted snippet forms, as error messages list them.
ACCEPTED = (
    "str, ragsieve.Snippet, ragsieve.Pair, or a mapping with 'text' (or an outside 'score')"
)

#: Single values that iterate into pieces of themselves (characters, keys, fields): refused
#: where a sequence of snippets is expected.
_NOT_A_SEQUENCE = (str, bytes, bytearray, Mapping, Snippet, Pair)


# ----------------------------------------------------------------------------- input forms
def snippet_list(snippets: Any, name: str = "snippets") -> list[Any]:
    """``snippets`` as a list; ``TypeError`` for one snippet given where a sequence is expected.

    A bare ``str`` would otherwise be read as one snippet per character (and a mapping as
    one per key).

    Examples
    --------
    >>> snippet_list("a string")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: snippets is a str ('a string'); expected a sequence of snippets, e.g. ['a string'] ...
    """
    if isinstance(snippets, _NOT_A_SEQUENCE):
        shown = f"{snippets!r:.60}"
        raise TypeError(
            f"{name} is a {type(snippets).__name__} ({shown}); expected a sequence of snippets, "
            f"e.g. [{shown}] (each a {ACCEPTED})."
        )
    return list(snippets)


def as_item(item: Any, index: int) -> dict[str, Any]:
    """One accepted snippet form as a dict with ``snippet_id`` and, where known, ``text``.

    A mapping names its id ``snippet_id`` or ``id``, not both (``DataError``), the same rule
    as the service's snippet objects.
    """
    if isinstance(item, str):
        return {"text": item, "snippet_id": str(index)}
    if isinstance(item, Snippet):
        return {"text": item.text, "snippet_id": item.snippet_id}
    if isinstance(item, Pair):
        return {**item.meta, "text": item.text, "snippet_id": item.snippet_id}
    if isinstance(item, Mapping):
        out = dict(item)
        text = out.get("text")
        check_str(text, f"snippet {index}: 'text'", allow_none=True)
        if "snippet_id" in out and "id" in out:
            raise DataError(f"snippet {index} has both 'snippet_id' ({out['snippet_id']!r}) and "
                            f"'id' ({out['id']!r}); 'id' is another name of 'snippet_id': give one.")
        out["snippet_id"] = str(out.get("snippet_id", out.get("id", index)))
        return out
    raise TypeError(f"snippet {index} has type {type(item).__name__}; expected {ACCEPTED}.")


def as_items(snippets: Any) -> list[dict[str, Any]]:
    """A sequence of accepted snippet forms as items (:func:`snippet_list`, :func:`as_item`)."""
    return [as_item(s, i) for i, s in enumerate(snippet_list(snippets))]


# ----------------------------------------------------------------------------- pieces
@dataclass(frozen=True)
class Pieces:
    """Input snippets and what is scored: the snippets, or pieces of the long ones."""

    items: list[dict[str, Any]]
    pieces: list[dict[str, Any]]
    owner: np.ndarray  # item of each piece
    spans: list[tuple[int, int] | None]  # span of each piece in its item (None: whole)
    merge: bool = True  # merge overlapping kept spans (windows); False: one per piece (sentences)
    cut: tuple[bool, ...] = ()  # per piece: cut from a text longer than the window ((): none)

    @classmethod
    def whole(cls, items: list[dict[str, Any]]) -> Pieces:
        """Every item scored whole, as it is."""
        return cls(items, items, np.arange(len(items)), [None] * len(items))

    def cut_summary(self) -> tuple[int, int]:
        """How many items hold a cut text (a snippet, or a sentence, longer than the
        window), and how many pieces were cut from them."""
        owners = {int(o) for o, c in zip(self.owner, self.cut, strict=False) if c}
        return len(owners), sum(self.cut)

    def kept_spans(self, keep_piece: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
        """Per item, the spans of its kept pieces, merged where they overlap unless
        ``merge`` is False (empty when it was scored whole).

        One pass over the pieces; the pieces of an item come in text order.
        """
        out: list[list[tuple[int, int]]] = [[] for _ in self.items]
        for sp, o, k in zip(self.spans, self.owner, keep_piece, strict=True):
            if not k or sp is None:
                continue
            merged = out[int(o)]
            if self.merge and merged and sp[0] <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(sp[1], merged[-1][1]))
            else:
                merged.append(sp)
        return [tuple(m) for m in out]


def cut(items: Sequence[dict[str, Any]], *, unit: str, max_chars: int,
        reads_text: bool = True) -> Pieces:
    """Cut the texts longer than ``max_chars`` into calibration-sized pieces (unit
    ``"sentence"``: every text into its sentences, the long ones into pieces).

    ``reads_text``: the score reads the texts (False for an outside score: nothing is cut).
    """
    if unit == "sentence":
        return _sentences(items, max_chars)
    pieces: list[dict[str, Any]] = []
    owner: list[int] = []
    spans: list[tuple[int, int] | None] = []
    for i, item in enumerate(items):
        text = item.get("text")
        if reads_text and isinstance(text, str) and len(text) > max_chars:
            # pieces overlap by up to half a window (whole sentences), so evidence at a
            # piece edge is also scored together with what follows it
            for sn in chunk_text(text, str(item["snippet_id"]), overlap=DEFAULT_SIZE // 2):
                pieces.append({**item, "text": sn.text})
                owner.append(i)
                spans.append((sn.start, sn.end))
        else:
            pieces.append(item)
            owner.append(i)
            spans.append(None)
    return Pieces(items=list(items), pieces=pieces, owner=np.asarray(owner, dtype=int),
                  spans=spans, cut=tuple(sp is not None for sp in spans))


def _sentences(items: Sequence[dict[str, Any]], max_chars: int) -> Pieces:
    """Every snippet's sentences as pieces, a sentence longer than ``max_chars`` cut
    into pieces of at most 500 characters (:func:`~ragsieve.units.sentence_pieces`, the
    cut calibration makes), each knowing its snippet (its text and position, for a
    score that reads the snippet as context); a snippet without a sentence (blank
    text) has no piece."""
    pieces: list[dict[str, Any]] = []
    owner: list[int] = []
    spans: list[tuple[int, int] | None] = []
    cut_: list[bool] = []
    for i, item in enumerate(items):
        text = item.get("text")
        if not isinstance(text, str):
            raise DataError(f"snippet {i} has no text (got {type(text).__name__}); a filter "
                            "of unit 'sentence' scores the sentences of each snippet's text.")
        for sentence in sentence_pieces(text, max_chars=max_chars):
            pieces.append({**item, "text": sentence.text, PARENT_TEXT: text,
                           PARENT_POSITION: i})
            owner.append(i)
            spans.append((sentence.start, sentence.end))
            cut_.append(sentence.cut)
    return Pieces(items=list(items), pieces=pieces, owner=np.asarray(owner, dtype=int),
                  spans=spans, merge=False, cut=tuple(cut_))


def model_texts(pieces: Pieces, unit: str) -> list[str]:
    """The texts scoring ``pieces`` hands the model: every piece with a text and, for unit
    ``"sentence"``, each snippet with a sentence once more, whole, as its sentences' context.

    These are the model work a ``filter`` call may cause (the service's budget counts their
    characters); snippets without text (an outside score) are left out.

    Examples
    --------
    >>> len(model_texts(cut(as_items(["short", "Long sentence here. " * 100]),
    ...                     unit="snippet", max_chars=600), "snippet"))  # 1 + 7 pieces
    8
    >>> # 2 sentences, 2 pieces of the 1,000-character one, then each snippet whole
    >>> sentences = cut(as_items(["One. Two.", "x" * 1000]), unit="sentence", max_chars=600)
    >>> [len(t) for t in model_texts(sentences, "sentence")]
    [4, 4, 500, 500, 9, 1000]
    """
    texts = [p["text"] for p in pieces.pieces if isinstance(p.get("text"), str)]
    if unit == "sentence":
        texts.extend(str(pieces.items[o]["text"]) for o in dict.fromkeys(pieces.owner.tolist()))
    return texts


def check_snippet_unit(unit: str, what: str) -> None:
    """Refuse a whole-snippet input (``what``) for a filter of unit ``"sentence"``.

    Raises
    ------
    TypeError
        ``unit`` is not ``"snippet"``.
    """
    if unit != "snippet":
        raise TypeError(f"this filter's unit is {unit!r}: it scores each snippet's "
                        f"sentences, so it cannot filter from {what}; call filter() with "
                        "the snippets' texts.")


def vector_scores(scorer: Scorer, query_vector: Any, snippet_vectors: Any, n_snippets: int, *,
                  root: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The scores of ``n_snippets`` snippets from the caller's own embeddings (a dot
    product, no model call), and their root scores when ``root`` (for the list check).

    For the embedding score (``1 - cos``) and the relative / fused scores built on it; the
    vectors must come from the scorer's model (``scorer.spec()``) and are normalised here.

    Raises
    ------
    TypeError
        The score cannot be computed from vectors (an LLM, an outside score).
    ValueError
        Vectors that are not finite, zero, or of mismatched dimension or count.
    """
    if not n_snippets:
        return np.zeros(0), None
    sv = np.asarray(snippet_vectors, dtype=float)
    if sv.ndim != 2 or sv.shape[0] != n_snippets:
        raise ValueError(f"got snippet_vectors of shape {sv.shape} for {n_snippets} snippets; "
                         "expected one vector per snippet.")
    scores = scorer.scores_from_vectors(query_vector, sv)
    return scores, scorer.root_scorer().scores_from_vectors(query_vector, sv) if root else None


@dataclass(frozen=True)
class PairBatch:
    """Many queries' pairs cut into pieces, for one batched scoring call.

    Attributes
    ----------
    queries : dict of str to str
        Each query id's query text, in order of first appearance.
    cuts : dict of str to Pieces
        Each query's snippets and their pieces.
    pairs : list of Pair
        Every piece as a pair (``snippet_id#k``, the item as meta), the queries one after
        another: scored in one batch, so the scorer can batch across queries.
    offsets : dict of str to int
        Where each query's pieces start in ``pairs``.
    """

    queries: dict[str, str]
    cuts: dict[str, Pieces]
    pairs: list[Pair]
    offsets: dict[str, int]

    def rows(self, query_id: str) -> slice:
        """The rows of ``pairs`` (and of their scores) that are this query's pieces."""
        start = self.offsets[query_id]
        return slice(start, start + len(self.cuts[query_id].pieces))


def cut_pairs(pairs: Any, *, unit: str, max_chars: int, reads_text: bool = True) -> PairBatch:
    """Group pairs by query and cut each query's snippets (:func:`cut`).

    Raises
    ------
    TypeError
        ``pairs`` is one pair, or holds something else than a ``Pair``.
    """
    pairs = snippet_list(pairs, "pairs")
    for i, p in enumerate(pairs):
        if not isinstance(p, Pair):
            raise TypeError(f"pairs[{i}] is a {type(p).__name__}; expected a ragsieve.Pair "
                            "(filter() takes other snippet forms).")
    by_query: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_query.setdefault(p.query_id, []).append(i)
    cuts = {qid: cut([as_item(pairs[i], i) for i in idx], unit=unit, max_chars=max_chars,
                     reads_text=reads_text) for qid, idx in by_query.items()}
    piece_pairs = [
        Pair(qid, pairs[idx[0]].query, f"{it['snippet_id']}#{k}", str(it.get("text") or ""),
             meta=it)
        for qid, idx in by_query.items() for k, it in enumerate(cuts[qid].pieces)
    ]
    starts = np.cumsum([0] + [len(c.pieces) for c in cuts.values()])
    return PairBatch(queries={qid: pairs[idx[0]].query for qid, idx in by_query.items()},
                     cuts=cuts, pairs=piece_pairs,
                     offsets={qid: int(s) for qid, s in zip(by_query, starts, strict=False)})
