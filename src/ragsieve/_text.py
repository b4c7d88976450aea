"""SQuAD normalisation of answers and text: the one definition every layer uses.

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

It lives at the lowest layer because two layers need it: the answer metrics
(:mod:`ragsieve.evaluation.answer_metrics`, which re-exports the public names) and the
sentence labels of :mod:`ragsieve.units` (a sentence is evidence when it contains a gold
answer).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ._validation import check_str

__all__ = [
    "ARTICLES",
    "answer_tokens",
    "char_classes",
    "contains_run",
    "language_key",
    "normalize_answer",
    "normalized_tokens",
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


@lru_cache(maxsize=64)
def _article_pattern(articles: frozenset[str], anywhere: bool) -> re.Pattern[str]:
    words = "|".join(re.escape(w) for w in sorted(articles, key=lambda w: (-len(w), w)))
    return re.compile(f"(?:{words})" if anywhere else rf"\b(?:{words})\b")


def char_classes(text: str) -> str:
    """One class letter per character of ``text`` (see ``_ClassTable``): ``S`` space,
    ``P`` punctuation or symbol, ``M`` combining mark, ``N`` no-space script, ``C`` other
    control or format character, ``W`` any other (word) character.

    Examples
    --------
    >>> char_classes("Hi, 北京")
    'WWPSNN'
    """
    return text.translate(_CLASSES)


def language_key(language: str | None) -> str:
    """The :data:`ARTICLES` key of a language code: ``None`` -> ``"en"``, ``"de-AT"`` -> ``"de"``.

    Raises
    ------
    TypeError
        If ``language`` is neither a str nor None.

    Examples
    --------
    >>> language_key("pt_BR"), language_key(None)
    ('pt', 'en')
    """
    check_str(language, "language", allow_none=True, hint="a language code such as 'en'")
    if language is None:
        return "en"
    return language.strip().lower().replace("_", "-").split("-")[0]


def normalized_tokens(text: str, key: str) -> list[str]:
    """Tokens of the normalised ``text`` for the :data:`ARTICLES` key ``key`` (unchecked).

    Examples
    --------
    >>> normalized_tokens("The Eiffel Tower.", "en")
    ['eiffel', 'tower']
    """
    text = unicodedata.normalize("NFC", text).lower().translate(_PUNCTUATION)
    articles = ARTICLES.get(key)
    if articles:
        text = _article_pattern(articles, key in _ANYWHERE).sub(" ", text)
    classes = char_classes(text)
    return [text[m.start():m.end()] for m in _ANSWER_TOKEN.finditer(classes)]


def contains_run(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    """Whether the tokens ``needle`` are a contiguous run of the tokens ``haystack``.

    An empty ``needle`` is never contained (an answer with no word left is no evidence).

    Examples
    --------
    >>> contains_run(["near", "eiffel", "tower", "in"], ["eiffel", "tower"])
    True
    >>> contains_run(["party"], ["art"])
    False
    """
    if not needle:
        return False
    # tokens hold no whitespace, so " a b " in " x a b y " is a contiguous run of tokens
    return f" {' '.join(needle)} " in f" {' '.join(haystack)} "


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
        If ``text`` is not a str, or ``language`` is neither a str nor None.

    Examples
    --------
    >>> answer_tokens("The Denver Broncos!")
    ['denver', 'broncos']
    >>> answer_tokens("北京大学（PKU）")
    ['北', '京', '大', '学', 'pku']
    """
    return normalized_tokens(check_str(text, "text"), language_key(language))


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
        As :func:`answer_tokens`, which gives the tokens.

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
