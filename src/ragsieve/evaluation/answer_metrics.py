"""Answer metrics of extractive QA: SQuAD normalisation, exact match, token F1.

The normalisation is the one of the official SQuAD v1.1 script (lower case, punctuation
and articles removed, whitespace collapsed), extended as in the MLQA script to other
languages: every Unicode punctuation character (categories ``P*``) is removed, the
articles of the answer's language are removed (:data:`ARTICLES`), and scripts written
without spaces between words (Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar, Tibetan)
are split into one token per character ("mixed segmentation"), so Chinese answers get a
character-level F1. Two small additions, which change nothing on ordinary text: the text
is put in Unicode NFC first (a composed and a decomposed "é" compare equal), and invisible
format characters (soft hyphen, zero-width joiners, direction marks) are dropped, the
zero-width space counting as a space.

For ASCII English text the tokens are exactly those of the SQuAD script, and for Chinese
those of the MLQA script; the tests check both against independent restatements of the
two scripts' rules.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "ARTICLES",
    "answer_in_context",
    "answer_tokens",
    "count_tokens",
    "exact_match",
    "normalize_answer",
    "token_f1",
]

#: Articles removed by :func:`normalize_answer`, per language code (lower case, primary
#: subtag: ``"de-AT"`` uses ``"de"``). ``en``: the SQuAD script; ``es``, ``de``, ``vi``,
#: ``ar``: the MLQA script; ``el``: the Greek definite and indefinite articles; ``ro``: the
#: Romanian indefinite articles (the definite ones are suffixes and stay). A language
#: without an entry keeps every word. The dict may be extended by the user.
ARTICLES: dict[str, frozenset[str]] = {
    "en": frozenset({"a", "an", "the"}),
    "es": frozenset({"un", "una", "unos", "unas", "el", "la", "los", "las"}),
    "de": frozenset({"ein", "eine", "einen", "einem", "eines", "einer",
                     "der", "die", "das", "den", "dem", "des"}),
    "vi": frozenset({"của", "là", "cái", "chiếc", "những"}),
    # Arabic: the prefix al-; as in the MLQA script it is replaced by a space wherever it
    # occurs, also inside words (kept for comparability with MLQA's published scores).
    "ar": frozenset({"ال"}),
    "el": frozenset({"ο", "η", "το", "οι", "τα", "του", "της", "των", "τον", "την", "τη",
                     "τους", "τις", "ένας", "μια", "μία", "ένα", "ενός", "μιας", "έναν"}),
    "ro": frozenset({"un", "o", "unui", "unei", "unor", "niște", "nişte"}),
}

#: Languages whose articles are removed wherever they occur, not only as whole words.
_ANYWHERE = frozenset({"ar"})

#: Blocks of the scripts written without spaces between words; each character of them is
#: a token of its own (with the combining marks that follow it).
_NO_SPACE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3005, 0x3007),  # ideographic iteration mark, closing mark, number zero
    (0x3021, 0x3029),  # Hangzhou numerals
    (0x3038, 0x303B),
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA9E0, 0xA9FF),  # Myanmar extended B
    (0xAA60, 0xAA7F),  # Myanmar extended A
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x1B000, 0x1B16F),  # Kana supplement and extensions
    (0x20000, 0x323AF),  # CJK extensions B-H, compatibility supplement
)

_ZERO_WIDTH_SPACE = 0x200B


def _in_no_space_script(code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in _NO_SPACE_RANGES)


class _PunctuationTable(dict[int, Any]):
    """``str.translate`` table, filled on first sight of a character: punctuation
    (``P*`` or ASCII ``string.punctuation``) and format characters are deleted, the
    zero-width space becomes a space, everything else maps to itself."""

    def __missing__(self, code: int) -> Any:
        ch = chr(code)
        category = unicodedata.category(ch)
        value: Any
        if code == _ZERO_WIDTH_SPACE:
            value = " "
        elif category[0] == "P" or ch in string.punctuation or category == "Cf":
            value = None
        else:
            value = code
        self[code] = value
        return value


class _ClassTable(dict[int, str]):
    """``str.translate`` table mapping each character to its class letter: ``S`` space,
    ``P`` punctuation or symbol, ``M`` combining mark, ``N`` no-space script, ``C`` other
    control or format character, ``W`` any other (word) character."""

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        category = unicodedata.category(ch)
        if ch.isspace() or code == _ZERO_WIDTH_SPACE:
            value = "S"
        elif category[0] in "PS":
            value = "P"
        elif category[0] == "M":
            value = "M"
        elif _in_no_space_script(code):
            value = "N"
        elif category[0] == "C":
            value = "C"
        else:
            value = "W"
        self[code] = value
        return value


_PUNCTUATION = _PunctuationTable()
_CLASSES = _ClassTable()
# A token of normalised text: a no-space-script character with its marks, or a run of
# anything else that is not a space (SQuAD splits on whitespace only).
_ANSWER_TOKEN = re.compile(r"NM*|[^SN]+")
# A token of raw text for count_tokens: also each punctuation mark or symbol on its own.
_WORD_TOKEN = re.compile(r"NM*|P|[WM]+")


@lru_cache(maxsize=64)
def _article_pattern(articles: frozenset[str], anywhere: bool) -> re.Pattern[str]:
    words = "|".join(re.escape(w) for w in sorted(articles, key=lambda w: (-len(w), w)))
    return re.compile(f"(?:{words})" if anywhere else rf"\b(?:{words})\b")


def _language_key(language: str | None) -> str:
    if language is None:
        return "en"
    if not isinstance(language, str):
        raise TypeError(
            f"language must be a str (a language code such as 'en') or None, "
            f"got {type(language).__name__} ({language!r})."
        )
    return language.strip().lower().replace("_", "-").split("-")[0]


def _check_text(text: Any, name: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__} ({text!r}).")
    return text


def _tokens(text: str, key: str) -> list[str]:
    text = unicodedata.normalize("NFC", text).lower().translate(_PUNCTUATION)
    articles = ARTICLES.get(key)
    if articles:
        text = _article_pattern(articles, key in _ANYWHERE).sub(" ", text)
    classes = text.translate(_CLASSES)
    return [text[m.start():m.end()] for m in _ANSWER_TOKEN.finditer(classes)]


def answer_tokens(text: str, language: str | None = None) -> list[str]:
    """Tokens of the normalised text (see :func:`normalize_answer`).

    Words are separated by whitespace; each character of a script written without spaces
    (Han, Kana, Thai, ...) is a token of its own.

    Parameters
    ----------
    text : str
        The text.
    language : str or None
        Language code whose :data:`ARTICLES` are removed; ``None`` means English (the
        SQuAD script).

    Returns
    -------
    list of str

    Raises
    ------
    TypeError
        If ``text`` or ``language`` is not a str.

    Examples
    --------
    >>> answer_tokens("The Denver Broncos!")
    ['denver', 'broncos']
    >>> answer_tokens("北京大学（PKU）")
    ['北', '京', '大', '学', 'pku']
    """
    return _tokens(_check_text(text, "text"), _language_key(language))


def normalize_answer(text: str, language: str | None = None) -> str:
    """SQuAD normalisation of an answer: lower case, no punctuation, no articles.

    The text is lower-cased, every punctuation character is removed (Unicode categories
    ``P*`` and ASCII ``string.punctuation``), the articles of ``language`` are removed
    (:data:`ARTICLES`; ``None`` means English, as in the SQuAD script; a language without
    an entry keeps every word), and the tokens (:func:`answer_tokens`) are joined with
    single spaces.

    Parameters
    ----------
    text : str
        The answer (or any text).
    language : str or None
        Language code, e.g. ``"de"`` or ``"zh"``.

    Returns
    -------
    str

    Raises
    ------
    TypeError
        If ``text`` or ``language`` is not a str.

    Examples
    --------
    >>> normalize_answer("  The  Eiffel Tower. ")
    'eiffel tower'
    >>> normalize_answer("Die Deutsche Bahn", "de")
    'deutsche bahn'
    >>> normalize_answer("《红楼梦》。", "zh")
    '红 楼 梦'
    """
    return " ".join(answer_tokens(text, language))


def _gold_tokens(golds: Any, key: str, language: str | None) -> list[list[str]]:
    """Tokens of every gold answer that is not empty after normalisation."""
    if isinstance(golds, str):
        raise TypeError(
            f"golds must be a sequence of gold answers, got a single str {golds!r}; "
            f"pass [{golds!r}]."
        )
    if not isinstance(golds, Sequence):
        raise TypeError(
            f"golds must be a sequence of str (the gold answers), got {type(golds).__name__}."
        )
    if len(golds) == 0:
        raise ValueError("golds is empty, expected at least one gold answer.")
    out = []
    for i, gold in enumerate(golds):
        tokens = _tokens(_check_text(gold, f"golds[{i}]"), key)
        if tokens:
            out.append(tokens)
    if not out:
        raise ValueError(
            f"golds == {list(golds)!r}: every gold answer is empty after normalisation "
            f"(lower case, punctuation and the articles of language {language!r} removed); "
            f"expected at least one gold answer with a word left."
        )
    return out


def exact_match(prediction: str, golds: Sequence[str], language: str | None = None) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer, else 0.0.

    Gold answers that are empty after normalisation are ignored; an empty prediction
    scores 0.0.

    Parameters
    ----------
    prediction : str
        The predicted answer.
    golds : sequence of str
        The gold answers (at least one not empty after normalisation).
    language : str or None
        Language code (see :func:`normalize_answer`).

    Returns
    -------
    float

    Raises
    ------
    TypeError
        If ``prediction`` or a gold is not a str, or ``golds`` is a single str.
    ValueError
        If ``golds`` is empty or every gold is empty after normalisation.

    Examples
    --------
    >>> exact_match("the Broncos", ["Denver Broncos", "Broncos"])
    1.0
    >>> exact_match("Denver", ["Denver Broncos"])
    0.0
    """
    key = _language_key(language)
    gold_tokens = _gold_tokens(golds, key, language)
    pred = _tokens(_check_text(prediction, "prediction"), key)
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
    golds : sequence of str
        The gold answers; those empty after normalisation are ignored.
    language : str or None
        Language code (see :func:`normalize_answer`).

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    TypeError
        If ``prediction`` or a gold is not a str, or ``golds`` is a single str.
    ValueError
        If ``golds`` is empty or every gold is empty after normalisation.

    Examples
    --------
    >>> token_f1("Broncos", ["Denver Broncos"])  # precision 1, recall 1/2
    0.6666666666666666
    >>> token_f1("北京大学", ["北京"], "zh")  # precision 2/4, recall 2/2
    0.6666666666666666
    """
    key = _language_key(language)
    gold_tokens = _gold_tokens(golds, key, language)
    pred = _tokens(_check_text(prediction, "prediction"), key)
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
    golds : sequence of str
        The gold answers; those empty after normalisation are ignored.
    language : str or None
        Language code (see :func:`normalize_answer`).

    Returns
    -------
    bool

    Raises
    ------
    TypeError
        If ``context`` or a gold is not a str, or ``golds`` is a single str.
    ValueError
        If ``golds`` is empty or every gold is empty after normalisation.

    Examples
    --------
    >>> answer_in_context("Built in 1889, the Eiffel Tower is...", ["Eiffel Tower"])
    True
    >>> answer_in_context("What a party!", ["art"])
    False
    >>> answer_in_context("北京大学位于北京。", ["大学"], "zh")
    True
    """
    key = _language_key(language)
    gold_tokens = _gold_tokens(golds, key, language)
    # tokens hold no whitespace, so " a b " in " x a b y " is a contiguous run of tokens
    haystack = " " + " ".join(_tokens(_check_text(context, "context"), key)) + " "
    return any(" " + " ".join(gold) + " " in haystack for gold in gold_tokens)


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
        If ``text`` is not a str.

    Examples
    --------
    >>> count_tokens("The Eiffel Tower (1889).")
    7
    >>> count_tokens("北京大学。")
    5
    """
    classes = unicodedata.normalize("NFC", _check_text(text, "text")).translate(_CLASSES)
    return sum(1 for _ in _WORD_TOKEN.finditer(classes))
