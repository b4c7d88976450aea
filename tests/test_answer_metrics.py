"""Answer metrics: SQuAD/MLQA normalisation, exact match, token F1, answer in context.

The SQuAD and MLQA rules are restated independently below (``_squad_*``, ``_mlqa_*``) and
the library must agree with them on every input the scripts were written for (ASCII
English; Spanish, German, Vietnamese words; Chinese with ASCII and CJK punctuation).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve.evaluation.answer_metrics import (
    ARTICLES,
    answer_in_context,
    answer_tokens,
    count_tokens,
    exact_match,
    normalize_answer,
    token_f1,
)

# ------------------------------------------------------------------ reference rules


def _squad_normalize(text: str) -> str:
    """The SQuAD v1.1 rules: lower, drop ASCII punctuation, drop a/an/the, collapse spaces."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _squad_f1(prediction: str, gold: str) -> float:
    pred, ref = _squad_normalize(prediction).split(), _squad_normalize(gold).split()
    shared = sum((Counter(pred) & Counter(ref)).values())
    if shared == 0:
        return 0.0
    p, r = shared / len(pred), shared / len(ref)
    return 2 * p * r / (p + r)


_MLQA_ARTICLES = {
    "es": r"\b(un|una|unos|unas|el|la|los|las)\b",
    "de": r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b",
    "vi": r"\b(của|là|cái|chiếc|những)\b",
}


def _mlqa_normalize(text: str, lang: str) -> str:
    """The MLQA rules: every P* character and ASCII punctuation dropped, the language's
    articles dropped, and for Chinese each character of U+4E00..U+9FA5 a token."""
    text = "".join(c for c in text.lower()
                   if not unicodedata.category(c).startswith("P") and c not in string.punctuation)
    if lang in _MLQA_ARTICLES:
        text = re.sub(_MLQA_ARTICLES[lang], " ", text)
    if lang == "zh":
        return " ".join(re.findall(r"[\u4e00-\u9fa5]|[^\s\u4e00-\u9fa5]+", text))
    return " ".join(text.split())


ascii_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=40)


# ------------------------------------------------------------------ agreement with the scripts


@settings(max_examples=300)
@given(ascii_text)
def test_normalize_matches_squad_rules_on_ascii(text: str) -> None:
    assert normalize_answer(text) == _squad_normalize(text)
    assert normalize_answer(text, "en") == _squad_normalize(text)


@settings(max_examples=300)
@given(ascii_text, ascii_text)
def test_f1_and_em_match_squad_rules_on_ascii(prediction: str, gold: str) -> None:
    if not _squad_normalize(gold):
        with pytest.raises(ValueError):
            token_f1(prediction, [gold])
        return
    assert token_f1(prediction, [gold]) == pytest.approx(_squad_f1(prediction, gold))
    expected_em = float(_squad_normalize(prediction) == _squad_normalize(gold))
    assert exact_match(prediction, [gold]) == expected_em


_zh_alphabet = (string.ascii_letters + string.digits + " .,!?'\"-()" + "。，、《》“”！？（）：；·"
                + "北京大学红楼梦中国人的是了在有我他这")


@settings(max_examples=300)
@given(st.text(alphabet=_zh_alphabet, max_size=30))
def test_chinese_matches_mlqa_mixed_segmentation(text: str) -> None:
    assert normalize_answer(text, "zh") == _mlqa_normalize(text, "zh")


@pytest.mark.parametrize("lang", ["es", "de", "vi"])
@settings(max_examples=150)
@given(data=st.data())
def test_articles_match_mlqa(lang: str, data: st.DataObject) -> None:
    words = {"es": ["El", "la", "LOS", "unas", "casa", "blanca", "elefante", "unanime"],
             "de": ["Die", "der", "EIN", "einer", "Bahn", "dieser", "Deutsche", "dasein"],
             "vi": ["của", "là", "Cái", "chiếc", "những", "nhà", "sông", "lá"]}[lang]
    parts = data.draw(st.lists(st.sampled_from(words + [",", ".", "!", "«", "»"]), max_size=8))
    seps = data.draw(st.lists(st.sampled_from([" ", "", "  ", "\n"]), min_size=len(parts),
                              max_size=len(parts)))
    text = "".join(p + s for p, s in zip(parts, seps))
    assert normalize_answer(text, lang) == _mlqa_normalize(text, lang)


# ------------------------------------------------------------------ SQuAD examples


@pytest.mark.parametrize(
    ("prediction", "golds", "em", "f1"),
    [
        ("Denver Broncos", ["Denver Broncos", "The Denver Broncos"], 1.0, 1.0),
        ("the Denver Broncos.", ["Denver Broncos"], 1.0, 1.0),
        ("Broncos", ["Denver Broncos"], 0.0, 2 / 3),
        ("Carolina Panthers", ["Denver Broncos"], 0.0, 0.0),
        ("Santa Clara, California", ["Santa Clara", "Levi's Stadium"], 0.0, 0.8),
        ("Levis Stadium", ["Santa Clara", "Levi's Stadium"], 1.0, 1.0),
        ("cat cat dog", ["cat dog"], 0.0, 0.8),  # multiset: one "cat" is shared
        ("U.S.", ["US"], 1.0, 1.0),
        ("", ["Denver Broncos"], 0.0, 0.0),
        ("an apple", ["", "apple", "!!"], 1.0, 1.0),  # empty golds are ignored
    ],
)
def test_squad_examples(prediction: str, golds: list[str], em: float, f1: float) -> None:
    assert exact_match(prediction, golds) == em
    assert token_f1(prediction, golds) == pytest.approx(f1)


def test_best_gold_counts() -> None:
    golds = ["the Eiffel Tower in Paris", "Eiffel Tower"]
    assert token_f1("Eiffel Tower", golds) == 1.0
    assert token_f1("Paris", golds) == pytest.approx(2 * (1 * 0.25) / 1.25)


# ------------------------------------------------------------------ languages


def test_chinese_character_f1() -> None:
    assert answer_tokens("北京大学", "zh") == ["北", "京", "大", "学"]
    assert token_f1("北京大学", ["北京"], "zh") == pytest.approx(2 / 3)
    assert token_f1("北京", ["北京大学"], "zh") == pytest.approx(2 / 3)
    assert exact_match("《红楼梦》", ["红楼梦"], "zh") == 1.0
    assert token_f1("上海", ["北京"], "zh") == 0.0
    # mixed script: the Latin run stays one token, punctuation goes
    assert answer_tokens("iPhone手机，2007年。", "zh") == ["iphone", "手", "机", "2007", "年"]


def test_no_space_scripts_split_per_character_whatever_the_language() -> None:
    assert answer_tokens("東京タワー") == ["東", "京", "タ", "ワ", "ー"]
    assert answer_tokens("ひらがな", "ja") == ["ひ", "ら", "が", "な"]
    # Thai: combining vowel and tone marks stay on their consonant
    assert answer_tokens("กินข้าว", "th") == ["กิ", "น", "ข้", "า", "ว"]
    assert token_f1("กินข้าว", ["ข้าว"], "th") == pytest.approx(2 * (3 / 5) / (3 / 5 + 1))


def test_scripts_with_spaces_keep_words() -> None:
    # Devanagari vowel signs are combining marks inside the word
    assert answer_tokens("हिन्दी भाषा", "hi") == ["हिन्दी", "भाषा"]
    assert answer_tokens("Русский язык!", "ru") == ["русский", "язык"]


def test_german_articles() -> None:
    assert normalize_answer("Die Deutsche Bahn", "de") == "deutsche bahn"
    assert exact_match("Die Deutsche Bahn", ["Deutsche Bahn"], "de") == 1.0
    # English rules keep German articles
    assert exact_match("Die Deutsche Bahn", ["Deutsche Bahn"]) == 0.0
    # whole words only
    assert normalize_answer("Dieser Dampfer", "de") == "dieser dampfer"


def test_spanish_articles() -> None:
    assert exact_match("La Casa Blanca", ["casa blanca"], "es") == 1.0
    assert normalize_answer("Los elefantes y unas lamas", "es") == "elefantes y lamas"


def test_greek() -> None:
    assert normalize_answer("Η Ακρόπολη των Αθηνών", "el") == "ακρόπολη αθηνών"
    assert exact_match("ΤΗΣ ΑΘΗΝΑΣ", ["της Αθηνας"], "el") == 1.0  # final sigma
    assert exact_match("ένας σεισμός", ["σεισμός"], "el") == 1.0
    assert exact_match("ένας σεισμός", ["σεισμός"]) == 0.0


def test_romanian_and_arabic() -> None:
    assert exact_match("o carte", ["carte"], "ro") == 1.0
    assert exact_match("unei case", ["case"], "ro") == 1.0
    assert exact_match("الكتاب", ["كتاب"], "ar") == 1.0
    assert exact_match("الكتاب", ["كتاب"]) == 0.0


def test_language_codes_and_unknown_languages() -> None:
    for code in ("de", "DE", "de-AT", "de_DE", " de "):
        assert normalize_answer("Der Rhein", code) == "rhein"
    assert normalize_answer("The cat", "fr") == "the cat"  # no entry: nothing removed
    assert normalize_answer("The cat", "zh") == "the cat"


def test_articles_can_be_extended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ARTICLES, "fr", frozenset({"le", "la", "les"}))
    assert normalize_answer("Les Misérables", "fr") == "misérables"


# ------------------------------------------------------------------ punctuation and unicode


def test_unicode_punctuation_is_removed() -> None:
    assert normalize_answer("«Guerra y paz» — Tolstói…", "es") == "guerra y paz tolstói"
    assert normalize_answer("“Hello,” she said – ‘bye’!") == "hello she said bye"
    assert normalize_answer("don't stop") == "dont stop"
    assert normalize_answer("1,000") == "1000"
    # symbols are not punctuation and stay (as in the MLQA script), except ASCII ones
    assert normalize_answer("50 € / $5") == "50 € 5"


def test_unicode_forms_and_invisible_characters() -> None:
    composed, decomposed = "Caf\u00e9", "Cafe\u0301"
    assert exact_match(composed, [decomposed]) == 1.0
    assert normalize_answer("Wiki\u00adpedia") == "wikipedia"  # soft hyphen
    assert normalize_answer("\u200fبيروت\u200e") == "بيروت"  # direction marks
    assert answer_tokens("word\u200bbreak") == ["word", "break"]  # zero-width space
    assert normalize_answer("  New\tYork\n\u00a0City ") == "new york city"
    assert normalize_answer("") == ""
    assert normalize_answer("!!! ...") == ""


# ------------------------------------------------------------------ answer in context


def test_answer_in_context_token_runs() -> None:
    context = "Built in 1889, the Eiffel Tower is the tallest structure in Paris."
    assert answer_in_context(context, ["Eiffel Tower"])
    assert answer_in_context(context, ["the Eiffel tower"])
    assert answer_in_context(context, ["Paris"])  # last token
    assert answer_in_context(context, ["Built"])  # first token
    assert answer_in_context(context, ["Berlin", "1889"])  # any gold
    assert not answer_in_context(context, ["Tower Eiffel"])  # order matters
    assert not answer_in_context(context, ["Eiffel structure"])  # contiguous only
    assert not answer_in_context("What a party!", ["art"])  # tokens, not substrings
    assert not answer_in_context("", ["art"])


def test_answer_in_context_languages() -> None:
    assert answer_in_context("北京大学位于北京市海淀区。", ["海淀"], "zh")
    assert not answer_in_context("北京大学位于北京市海淀区。", ["上海"], "zh")
    assert answer_in_context("Sie fuhr mit der Deutschen Bahn.", ["die Deutschen Bahn"], "de")


def test_answer_in_context_requires_real_golds() -> None:
    with pytest.raises(ValueError, match="empty after normalisation"):
        answer_in_context("the a an", ["The", "a!"])


# ------------------------------------------------------------------ count_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("   \n", 0),
        ("The Eiffel Tower (1889).", 7),
        ("don't", 3),
        ("北京大学。", 5),
        ("iPhone手机", 3),
        ("हिन्दी भाषा", 2),  # vowel signs do not split words
        ("กินข้าว", 5),
        ("Cafe\u0301 au lait", 3),
    ],
)
def test_count_tokens(text: str, expected: int) -> None:
    assert count_tokens(text) == expected


def test_count_tokens_grows_with_text() -> None:
    assert count_tokens("one two three " * 10) == 30


# ------------------------------------------------------------------ errors


def test_golds_errors_name_what_was_received() -> None:
    with pytest.raises(TypeError, match=r"single str \('Paris'\).*\['Paris'\]"):
        exact_match("Paris", "Paris")  # a str is a Sequence[str] to the type checker
    with pytest.raises(ValueError, match="golds is empty"):
        token_f1("Paris", [])
    with pytest.raises(ValueError, match=r"golds == \['the', '\.\.\.'\].*'en'"):
        token_f1("Paris", ["the", "..."], "en")
    with pytest.raises(TypeError, match=r"golds\[1\] must be a str, got int"):
        exact_match("Paris", ["Paris", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="sequence of str"):
        exact_match("Paris", {"Paris"})  # type: ignore[arg-type]


def test_other_type_errors() -> None:
    with pytest.raises(TypeError, match="prediction must be a str, got NoneType"):
        token_f1(None, ["Paris"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="context must be a str"):
        answer_in_context(["Paris"], ["Paris"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="language must be a str"):
        normalize_answer("Paris", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        count_tokens(b"Paris")  # type: ignore[arg-type]
