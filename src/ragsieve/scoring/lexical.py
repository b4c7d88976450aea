"""In-list BM25: a lexical nonconformity score computed from the query's own retrieved list.

``ListBM25Scorer`` (alias ``"bm25-list"``) scores each snippet of a list by Okapi BM25
(Lucene's variant: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, term frequency saturated
by ``k1`` and normalised by the snippet's length against the list's mean length with ``b``),
where ``N``, the document frequencies and the mean length are those of *this list only*.
The score is a fixed function of (query, list), never of labels, so it is a valid
nonconformity score for whole retrieved lists, like the relative scores
(:mod:`ragsieve.scoring.relative`); it is list-dependent.

Nonconformity = ``1 - BM25 / M``, with ``M`` the summed idf of the query's tokens found in
the list (each saturated term contributes less than its idf, so ``BM25 < M``): the share of
the query's matched idf mass a snippet does *not* cover, in (0, 1], 1 for a snippet sharing
no token with the query (or a list sharing none). Within a list it is a decreasing function
of BM25; across lists it does not grow with the list's size as raw BM25 does (idf grows
with ``N``), so lists of 5 and of 50 snippets give comparable values, and ``1 - score`` is a
similarity in [0, 1) like a cosine, which the relative transforms assume.

Tokens (:func:`tokenize`): the text is NFKC-normalised and case-folded; scripts written with
spaces give word tokens (letters, digits and their combining marks); scripts written without
(Han, kana, Thai, Lao, Khmer, Myanmar) give character unigrams and bigrams of each run (a
character keeps its combining marks), so no word segmenter is needed.

Why not a library: ``bm25s`` (the well-kept one) computes the same numbers (a test checks it),
but builds a sparse index per list, fails on an empty query or a list without tokens, and
would add a dependency for eight lines of numpy.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._validation import check_real
from .base import Scorer
from .options import ScorerOption
from .tags import ScorerTags

__all__ = ["ListBM25Scorer", "bm25_scores", "check_bm25_params", "token_sequence",
           "tokenize"]

#: Scripts written without spaces between words: their runs become character n-grams.
_UNSPACED = (
    "\u0e00-\u0e7f"  # Thai
    "\u0e80-\u0eff"  # Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff\u31f0-\u31ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han (BMP)
    "\U00020000-\U0003134f"  # Han (supplementary planes)
)
_UNSPACED_RUN = re.compile(f"[{_UNSPACED}]+")


@functools.cache
def _word_pattern() -> re.Pattern[str]:
    """Runs of word characters: ``\\w`` and every combining mark of the BMP (``\\w`` leaves
    marks out, which would cut Devanagari or Thai words apart). Built once, on first use."""
    marks: list[str] = []
    start = prev = -2
    for cp in range(0x300, 0x10000):
        if unicodedata.category(chr(cp)).startswith("M"):
            if cp != prev + 1:
                if start >= 0:
                    marks.append(_range(start, prev))
                start = cp
            prev = cp
    marks.append(_range(start, prev))
    return re.compile(f"[\\w{''.join(marks)}]+")


def _range(lo: int, hi: int) -> str:
    return re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}"


def _clusters(run: str) -> list[str]:
    """Characters of ``run``, each with the combining marks that follow it."""
    out: list[str] = []
    for ch in run:
        if out and unicodedata.category(ch).startswith("M"):
            out[-1] += ch
        else:
            out.append(ch)
    return out


def tokenize(text: str) -> list[str]:
    """BM25 tokens of ``text``: words of spaced scripts, character uni- and bigrams of the others.

    The tokens of the last 16,384 distinct texts are kept (lists from one index repeat
    the same snippets in many queries' lists); each call returns a new list.

    Examples
    --------
    >>> tokenize("Who won Super Bowl 50?")
    ['who', 'won', 'super', 'bowl', '50']
    >>> tokenize("黑豹队308分")
    ['黑', '豹', '队', '黑豹', '豹队', '308', '分']
    """
    if not isinstance(text, str):
        raise TypeError(f"text is {type(text).__name__}, expected str.")
    return list(_tokens(text))


@functools.lru_cache(maxsize=16_384)
def _tokens(text: str) -> tuple[str, ...]:
    tokens: list[str] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            tokens.append(piece)
        else:
            tokens.extend(piece)
            tokens.extend(a + b for a, b in itertools.pairwise(piece))
    return tuple(tokens)


def token_sequence(text: str) -> list[str]:
    """The tokens of ``text`` in order: :func:`tokenize`'s words, and each character (with
    its marks) of a script written without spaces (no bigrams).

    Examples
    --------
    >>> token_sequence("Who won 黑豹队?")
    ['who', 'won', '黑', '豹', '队']
    """
    out: list[str] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            out.append(piece)
        else:
            out.extend(piece)
    return out


def _pieces(text: str) -> list[str | list[str]]:
    """The words of spaced scripts (str) and the runs of unspaced ones (their character
    clusters, a list), in order, of ``text`` normalised (NFKC) and case-folded."""
    pieces: list[str | list[str]] = []
    for word in _word_pattern().findall(unicodedata.normalize("NFKC", text).casefold()):
        pos = 0
        for m in _UNSPACED_RUN.finditer(word):
            if m.start() > pos:
                pieces.append(word[pos:m.start()])
            pieces.append(_clusters(m.group()))
            pos = m.end()
        if pos < len(word):
            pieces.append(word[pos:])
    return pieces


def check_bm25_params(k1: Any, b: Any) -> tuple[float, float]:
    """``(k1, b)`` checked: ``k1 > 0`` finite, ``0 <= b <= 1`` (``TypeError`` / ``ValueError``
    otherwise); every BM25 of ragsieve takes them.

    Examples
    --------
    >>> check_bm25_params(1.5, 0.75)
    (1.5, 0.75)
    """
    return (check_real(k1, "k1", min_value=0.0, max_value=math.inf, include_boundaries="neither"),
            check_real(b, "b", min_value=0.0, max_value=1.0))


def bm25_scores(query_tokens: Sequence[str], docs: Sequence[Sequence[str]], *,
                k1: float = 1.5, b: float = 0.75) -> tuple[np.ndarray, float]:
    """Okapi BM25 (Lucene's variant) of each token list in ``docs``, with ``docs`` the corpus.

    A repeated query token counts as often as it occurs; a query or a corpus without tokens
    gives zeros.

    Returns
    -------
    scores : numpy.ndarray
        BM25 of each document.
    matched : float
        The summed idf of the query tokens found in some document (each counted as often
        as it occurs in the query): every score is below it.

    Examples
    --------
    >>> scores, matched = bm25_scores(["a"], [["a", "a", "b"], ["b"], []])
    >>> scores.round(4), round(matched, 4)
    (array([0.3998, 0.    , 0.    ]), 0.9808)
    """
    n = len(docs)
    out = np.zeros(n, dtype=np.float64)
    lengths = np.array([len(d) for d in docs], dtype=np.float64)
    if not n or not query_tokens or not lengths.any():
        return out, 0.0
    norm = k1 * (1.0 - b + b * lengths / lengths.mean())
    counts = [Counter(d) for d in docs]
    matched = 0.0
    for term, times in Counter(query_tokens).items():
        tf = np.array([c.get(term, 0) for c in counts], dtype=np.float64)
        df = np.count_nonzero(tf)
        if df:
            idf = float(np.log1p((n - df + 0.5) / (df + 0.5)))
            out += times * idf * tf / (tf + norm)
            matched += times * idf
    return out, matched


class ListBM25Scorer(Scorer):
    """``1 - BM25(query, snippet) / M`` with the statistics of the query's own list.

    Parameters
    ----------
    k1 : float
        Term-frequency saturation (> 0).
    b : float
        Length normalisation, in [0, 1].

    Examples
    --------
    >>> s = ListBM25Scorer().score_batch("Who won Super Bowl 50?",
    ...                                 ["Denver won Super Bowl 50.", "Leaves are green."])
    >>> bool(s[0] < s[1] == 1.0)
    True
    """

    name: ClassVar[str] = "bm25-list"
    score_label: ClassVar[str] = "1 - bm25 share (in list)"
    tags = ScorerTags(list_dependent=True)
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("k1", float, 1.5, "scorer bm25-list: term-frequency saturation"),
        ScorerOption("b", float, 0.75, "scorer bm25-list: length normalisation"),
    )

    def __init__(self, *, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = check_bm25_params(k1, b)

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "bm25-list", "k1": k1, "b": b}``."""
        return {"scorer": self.name, "k1": self.k1, "b": self.b}

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's whole list (the statistics are the list's)."""
        if not isinstance(query, str):
            raise TypeError(f"query is {type(query).__name__}, expected str.")
        if isinstance(snippets, (str, bytes)):
            raise TypeError("snippets is a single string; pass a list of str, e.g. [text].")
        docs = [tokenize(s) for s in snippets]
        scores, matched = bm25_scores(tokenize(query), docs, k1=self.k1, b=self.b)
        return 1.0 - scores / matched if matched > 0 else np.ones(len(docs))
