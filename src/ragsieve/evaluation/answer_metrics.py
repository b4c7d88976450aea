"""Answer metrics of extractive QA: exact match, token F1, answer in context, token counts.

Every metric compares texts after the SQuAD normalisation, extended as in the MLQA script
to other languages (punctuation and the answer language's articles removed, one token per
character in scripts without spaces); it is defined once, in :mod:`ragsieve._text`, which
the sentence labels of :mod:`ragsieve.units` share, and :data:`ARTICLES`,
:func:`normalize_answer` and :func:`answer_tokens` are re-exported here.

For ASCII English text the tokens are exactly those of the SQuAD script, and for Chinese
those of the MLQA script; the tests check both against independent restatements of the
two scripts' rules.

:func:`exact_match`, :func:`token_f1` and :func:`answer_in_context` measure a text against
gold answers and share these parameters and errors:

``golds`` : sequence of str
    The gold answers; those empty after normalisation are ignored, and at least one must
    be left.
``language`` : str or None
    Language code (see :func:`normalize_answer`).
``TypeError``
    The text or a gold is not a str, or ``golds`` is a single str.
``ValueError``
    ``golds`` is empty, or every gold is empty after normalisation.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ragsieve._text import (
    ARTICLES,
    answer_tokens,
    char_classes,
    contains_run,
    language_key,
    normalize_answer,
    normalized_tokens,
)
from ragsieve._validation import check_str, check_str_sequence

__all__ = [
    "ARTICLES",
    "answer_in_context",
    "answer_tokens",
    "count_tokens",
    "exact_match",
    "normalize_answer",
    "token_f1",
]

# A token of raw text for count_tokens: also each punctuation mark or symbol on its own.
_WORD_TOKEN = re.compile(r"NM*|P|[WM]+")


def _gold_tokens(golds: Any, key: str, language: str | None) -> list[list[str]]:
    """Tokens of every gold answer that is not empty after normalisation."""
    golds = check_str_sequence(golds, "golds", hint="the gold answers")
    if len(golds) == 0:
        raise ValueError("golds is empty, expected at least one gold answer.")
    out = []
    for gold in golds:
        tokens = normalized_tokens(gold, key)
        if tokens:
            out.append(tokens)
    if not out:
        raise ValueError(
            f"golds == {list(golds)!r}: every gold answer is empty after normalisation "
            f"(lower case, punctuation and the articles of language {language!r} removed); "
            f"expected at least one gold answer with a word left."
        )
    return out


def _text_and_golds(text: Any, name: str, golds: Any,
                    language: str | None) -> tuple[list[str], list[list[str]]]:
    """The normalised tokens of ``text`` (the argument ``name``) and of every gold answer
    left after normalisation (:func:`_gold_tokens`; the golds are checked first)."""
    key = language_key(language)
    gold_tokens = _gold_tokens(golds, key, language)
    return normalized_tokens(check_str(text, name), key), gold_tokens


def exact_match(prediction: str, golds: Sequence[str], language: str | None = None) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer, else 0.0.

    Gold answers that are empty after normalisation are ignored; an empty prediction
    scores 0.0.

    Parameters
    ----------
    prediction : str
        The predicted answer.
    golds, language
        The gold answers and their language (module docstring; errors there too).

    Returns
    -------
    float
        1.0 or 0.0.

    Examples
    --------
    >>> exact_match("the Broncos", ["Denver Broncos", "Broncos"])
    1.0
    >>> exact_match("Denver", ["Denver Broncos"])
    0.0
    """
    pred, gold_tokens = _text_and_golds(prediction, "prediction", golds, language)
    return float(any(pred == gold for gold in gold_tokens))


def token_f1(prediction: str, golds: Sequence[str], language: str | None = None) -> float:
    """SQuAD token F1: the best over gold answers of the F1 of the shared tokens.

    For one gold, with ``common`` the multiset intersection of the prediction's and the
    gold's tokens (:func:`answer_tokens`), precision is ``|common| / |prediction|``,
    recall ``|common| / |gold|`` and F1 their harmonic mean (0 when nothing is shared).
    Characters of Chinese, Japanese, Thai, ... are tokens, so their F1 is per character.

    Parameters
    ----------
    prediction : str
        The predicted answer; an empty one scores 0.0.
    golds, language
        The gold answers and their language (module docstring; errors there too).

    Returns
    -------
    float
        In [0, 1].

    Examples
    --------
    >>> token_f1("Broncos", ["Denver Broncos"])  # precision 1, recall 1/2
    0.6666666666666666
    >>> token_f1("北京大学", ["北京"], "zh")  # precision 2/4, recall 2/2
    0.6666666666666666
    """
    pred, gold_tokens = _text_and_golds(prediction, "prediction", golds, language)
    if not pred:
        return 0.0
    pred_counts = Counter(pred)
    best = 0.0
    for gold in gold_tokens:
        shared = sum((pred_counts & Counter(gold)).values())
        if shared:
            precision, recall = shared / len(pred), shared / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def answer_in_context(context: str, golds: Sequence[str], language: str | None = None) -> bool:
    """Whether some gold answer occurs in the context, token for token.

    Both are normalised as in :func:`normalize_answer`; a gold occurs when its tokens are
    a contiguous run of the context's tokens. So ``"art"`` is not found in ``"party"``,
    while ``"the Eiffel Tower"`` is found in ``"...near the eiffel tower, ..."``. In
    scripts without spaces every character is a token, so there it is a substring test.

    Parameters
    ----------
    context : str
        The (kept) context, e.g. the snippets joined by newlines.
    golds, language
        The gold answers and their language (module docstring; errors there too).

    Returns
    -------
    bool

    Examples
    --------
    >>> answer_in_context("Built in 1889, the Eiffel Tower is...", ["Eiffel Tower"])
    True
    >>> answer_in_context("What a party!", ["art"])
    False
    >>> answer_in_context("北京大学位于北京。", ["大学"], "zh")
    True
    """
    haystack, gold_tokens = _text_and_golds(context, "context", golds, language)
    return any(contains_run(haystack, gold) for gold in gold_tokens)


def count_tokens(text: str) -> int:
    """Word tokens of a text: a rough, model-free stand-in for LLM tokens.

    Counts the runs of word characters (letters, digits and their combining marks), each
    punctuation mark or symbol, and each character of a script written without spaces
    (Han, Kana, Thai, ...). Sub-word tokenisers of LLMs give more tokens than this for
    rare words and fewer for CJK text; use it to compare context sizes, not to budget a
    model's window.

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    TypeError
        If ``text`` is not a str (None for a missing answer included: count ``""``).

    Examples
    --------
    >>> count_tokens("The Eiffel Tower (1889).")
    7
    >>> count_tokens("北京大学。")
    5
    """
    classes = char_classes(unicodedata.normalize("NFC", check_str(text, "text")))
    return sum(1 for _ in _WORD_TOKEN.finditer(classes))
