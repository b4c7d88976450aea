"""Tests for ragsieve.chunking: invariants (hypothesis), examples, real XQuAD data."""

from __future__ import annotations

import bisect
import dataclasses
import doctest
import itertools
import json
import logging
import math
import os
import random
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve import chunking
from ragsieve.chunking import (
    DEFAULT_OVERLAP,
    DEFAULT_SIZE,
    Chunker,
    chunk_documents,
    chunk_text,
)
from ragsieve.errors import DataError
from ragsieve.types import Snippet

# --------------------------------------------------------------------------- helpers

_DATA = Path(
    os.environ.get("RAGSIEVE_DATA", Path(__file__).resolve().parents[2] / "shared" / "datasets")
)
_XQUAD = _DATA / "xquad"


def _xquad(lang: str) -> list[dict]:
    path = _XQUAD / f"xquad.{lang}.json"
    if not path.exists():
        pytest.skip(f"XQuAD not found at {path} (set RAGSIEVE_DATA).")
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)["data"]


def _paragraphs(lang: str) -> dict[str, str]:
    return {
        f"{art['title']}#{i}": par["context"]
        for art in _xquad(lang)
        for i, par in enumerate(art["paragraphs"])
    }


def check_invariants(
    text: str, doc_id: str, snippets: list[Snippet], size: int, overlap: int
) -> None:
    """Invariants 1-5 of the chunker contract; raises AssertionError with context."""
    assert snippets, "a non-blank text must give at least one snippet"
    for s in snippets:
        assert s.doc_id == doc_id
        assert text[s.start : s.end] == s.text
        assert s.text, s
        assert not s.text[0].isspace() and not s.text[-1].isspace(), s
        assert len(s.text) <= size, (len(s.text), size)
    for a, b in itertools.pairwise(snippets):
        assert a.start < b.start and a.end < b.end, (a, b)
        shared = max(0, a.end - b.start)
        assert shared <= overlap, (shared, overlap, a, b)
    covered = bytearray(len(text))
    for s in snippets:
        covered[s.start : s.end] = b"\x01" * (s.end - s.start)
    for i, ch in enumerate(text):
        if not ch.isspace():
            assert covered[i], f"character {i} ({ch!r}) is in no snippet"
    stripped = len(text.strip())
    if stripped <= size:
        assert len(snippets) == 1
    # No runaway fragmentation: every two consecutive cores advance by > step // 3.
    step = size - overlap
    assert len(snippets) <= 2 * math.ceil(stripped / max(1, step // 3)) + 1


def check_sentence_edges(text: str, snippets: list[Snippet], size: int, overlap: int) -> None:
    """The sentence contract, with the chunker's own splitter as the oracle.

    Every snippet is whole sentences, or lies inside one sentence longer than ``size``
    (a *piece*); pieces share nothing with other sentences' snippets; shared text is
    whole sentences; windows are packed greedily and their overlap is the longest run
    of whole sentences allowed.
    """
    first = len(text) - len(text.lstrip())
    sentences = chunking._sentences(text, first, len(text.rstrip()))
    starts = {s: k for k, (s, _) in enumerate(sentences)}
    ends = {e: k for k, (_, e) in enumerate(sentences)}
    sorted_starts = [s for s, _ in sentences]
    # Sentences cover every non-whitespace character exactly once, in order.
    for (_, e0), (s1, _) in itertools.pairwise(sentences):
        assert e0 <= s1 and not text[e0:s1].strip(), (e0, s1)

    def owner(s: Snippet) -> int | None:
        """Index of the over-long sentence holding a piece, None for whole sentences."""
        if s.start in starts and s.end in ends:
            return None
        k = bisect.bisect_right(sorted_starts, s.start) - 1
        a, b = sentences[k]
        assert b - a > size and a <= s.start and s.end <= b, (
            f"snippet {s.start}-{s.end} is not whole sentences and not inside one "
            f"over-long sentence: {s.text[:40]!r} ... {s.text[-40:]!r}"
        )
        return k

    owners = [owner(s) for s in snippets]
    for (a, oa), (b, ob) in itertools.pairwise(zip(snippets, owners, strict=True)):
        if oa is not None or ob is not None:
            if oa != ob:  # a piece shares nothing with a neighbouring sentence
                assert a.end <= b.start, (a, b)
            continue
        # Two windows of whole sentences: greedy packing and the longest allowed overlap.
        first_of_a, last_of_a = starts[a.start], ends[a.end]
        following = sentences[last_of_a + 1]
        if following[1] - following[0] <= size:
            assert following[1] - a.start > size, ("not packed greedily", a, following)
        if b.start < a.end:
            assert b.start in starts and a.end in ends  # shared text is whole sentences
        # The sentence before b's first one (inside a, not a's first) was not allowed.
        before = starts[b.start] - 1
        if first_of_a < before <= last_of_a:
            p = sentences[before][0]
            assert a.end - p > overlap or following[1] - p > size, ("overlap too short", a, b)


# --------------------------------------------------------------------------- strategies

_CJK = "".join(chr(c) for c in range(0x4E00, 0x4E40))
_THAI = "".join(chr(c) for c in range(0x0E01, 0x0E3A))  # consonants + combining vowels
_WS = " \t\n\r\u3000\xa0\u2028"

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", min_size=1, max_size=12)
_latin_sentence = st.builds(
    lambda words, end: " ".join(words).capitalize() + end,
    st.lists(_word, min_size=1, max_size=20),
    st.sampled_from([".", "!", "?", '."', ".)", "…", "?!", ""]),
)
_cjk_sentence = st.builds(
    lambda body, end: body + end,
    st.text(alphabet=_CJK, min_size=1, max_size=60),
    st.sampled_from(["。", "！", "？", "；", "。」", "", "．"]),
)
_no_space = st.text(alphabet=_CJK + _THAI, min_size=1, max_size=1200)
_long_token = st.builds(lambda ch, n: ch * n, st.sampled_from("x-.。a"), st.integers(1, 900))
_whitespace = st.text(alphabet=_WS, min_size=1, max_size=40)
_anything = st.text(max_size=60)
_piece = st.one_of(_latin_sentence, _cjk_sentence, _no_space, _long_token, _whitespace, _anything)
_sep = st.sampled_from(["", " ", "  ", "\n", "\n\n", "\t", " \n "])
texts = st.lists(st.tuples(_piece, _sep), min_size=1, max_size=25).map(
    lambda parts: "".join(p + s for p, s in parts)
)


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(st.integers(1, 400))
    overlap = draw(st.integers(0, size - 1))
    return size, overlap


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(text=texts, sz=sizes())
def test_invariants_hold_for_random_text(text: str, sz: tuple[int, int]) -> None:
    size, overlap = sz
    if not text.strip():
        with pytest.raises(DataError):
            chunk_text(text, "doc", size=size, overlap=overlap)
        return
    snippets = chunk_text(text, "doc", size=size, overlap=overlap)
    check_invariants(text, "doc", snippets, size, overlap)
    check_sentence_edges(text, snippets, size, overlap)
    # Deterministic, and the Chunker object is the same function.
    assert chunk_text(text, "doc", size=size, overlap=overlap) == snippets
    assert Chunker(size, overlap)(text, "doc") == snippets


@settings(max_examples=150, deadline=None)
@given(text=texts.filter(str.strip), size=st.integers(1, 300))
def test_zero_overlap_gives_disjoint_snippets(text: str, size: int) -> None:
    snippets = chunk_text(text, "doc", size=size, overlap=0)
    check_invariants(text, "doc", snippets, size, 0)
    check_sentence_edges(text, snippets, size, 0)
    for a, b in itertools.pairwise(snippets):
        assert a.end <= b.start


# Sentences whose ends are known by construction (an oracle independent of the splitter):
# Latin ones end in a lowercase word and a sentence mark and are followed by whitespace;
# CJK ones end in a full-width mark; Thai ones (phrases separated by spaces, no sentence
# mark) end at a line break. Some are longer than any window.
_lower = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12)
_known_latin = st.builds(
    lambda words, end, sep: (" ".join([*words, "done"]).capitalize() + end, sep),
    st.lists(_lower, min_size=0, max_size=90),
    st.sampled_from([".", "!", "?", '."', ".)", "…", "?!", "。"]),
    st.sampled_from([" ", "  ", "\n", " \n ", "\u3000"]),
)
_known_cjk = st.builds(
    lambda body, end, sep: (body + end, sep),
    st.text(alphabet=_CJK, min_size=1, max_size=300),
    st.sampled_from(["。", "！", "？", "；", "。」", "．"]),
    st.sampled_from(["", " ", "\n"]),
)
_THAI_BASE = "".join(chr(c) for c in range(0x0E01, 0x0E2F))  # consonants only
_known_thai = st.builds(
    lambda phrases: (" ".join(phrases), "\n"),
    st.lists(
        st.text(alphabet=_THAI_BASE + "\u0e34\u0e48", min_size=1, max_size=40),
        min_size=1,
        max_size=15,
    ).map(lambda ps: [p if p[0] in _THAI_BASE else "ก" + p for p in ps]),
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.one_of(_known_latin, _known_cjk, _known_thai), min_size=1, max_size=30),
    sz=sizes(),
)
def test_snippets_are_whole_known_sentences(
    parts: list[tuple[str, str]], sz: tuple[int, int]
) -> None:
    size, overlap = sz
    text, spans, pos = "", [], 0
    for sentence, sep in parts:
        spans.append((pos, pos + len(sentence)))
        text += sentence + sep
        pos = len(text)
    snippets = chunk_text(text, "doc", size=size, overlap=overlap)
    check_invariants(text, "doc", snippets, size, overlap)
    check_sentence_edges(text, snippets, size, overlap)
    assert chunking._sentences(text, 0, len(text.rstrip())) == spans
    starts = {a for a, _ in spans}
    ends = {b for _, b in spans}
    for s in snippets:
        if s.start in starts and s.end in ends:
            continue
        # The exception: a piece inside one sentence longer than size.
        assert any(b - a > size and a <= s.start and s.end <= b for a, b in spans), s
    for a, b in itertools.pairwise(snippets):
        if a.end > b.start:
            shared = text[b.start : a.end]
            whole = b.start in starts and a.end in ends
            inside_long = any(y - x > size and x <= b.start and a.end <= y for x, y in spans)
            assert whole or inside_long, shared


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(alphabet=_CJK, min_size=1, max_size=3000),
    sz=sizes(),
)
def test_script_without_spaces_has_exact_overlap(text: str, sz: tuple[int, int]) -> None:
    """With no spaces or punctuation nothing is snapped: overlaps are exact."""
    size, overlap = sz
    snippets = chunk_text(text, "zh", size=size, overlap=overlap)
    check_invariants(text, "zh", snippets, size, overlap)
    for a, b in itertools.pairwise(snippets):
        assert a.end - b.start == overlap
    for s in snippets[1:-1]:
        assert len(s.text) == size


# --------------------------------------------------------------------------- examples


def _english_paragraph(n_sentences: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "river",
        "city",
        "museum",
        "old",
        "people",
        "built",
        "north",
        "long",
        "bridge",
        "after",
        "war",
    ]
    sentences = []
    for _ in range(n_sentences):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(5, 20)))
        sentences.append(body.capitalize() + ".")
    return " ".join(sentences)


def test_english_paragraph_is_cut_at_sentence_ends() -> None:
    text = _english_paragraph(60)
    cores = chunk_text(text, "en", overlap=0)
    assert len(cores) > 3
    for s in cores[:-1]:
        assert s.text.endswith("."), s.text[-30:]
        assert s.text[0].isupper(), s.text[:30]
    # With overlap every snippet still starts and ends at a sentence boundary, and the
    # shared text is whole sentences (these are 5 to 20 words, often under 100 characters).
    snippets = chunk_text(text, "en")
    check_invariants(text, "en", snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    check_sentence_edges(text, snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    for s in snippets:
        assert s.text.endswith("."), s.text[-30:]
        assert s.text[0].isupper() and (s.start == 0 or text[s.start - 2] == "."), s.text[:30]
    shared = [text[b.start : a.end] for a, b in itertools.pairwise(snippets) if a.end > b.start]
    assert len(shared) >= len(snippets) // 2
    for t in shared:
        assert t[0].isupper() and t.endswith(".") and len(t) <= DEFAULT_OVERLAP, t


def test_overlap_is_the_longest_run_of_whole_sentences_that_fits() -> None:
    text = " ".join(f"Sentence number {i:02d} is here." for i in range(40))  # 27 + 1 each
    snippets = chunk_text(text, "d", size=200, overlap=70)
    check_invariants(text, "d", snippets, 200, 70)
    check_sentence_edges(text, snippets, 200, 70)
    # 7 sentences (195 characters) per snippet, the last 2 (55 characters) shared.
    assert [len(s.text) for s in snippets[:-1]] == [195] * (len(snippets) - 1)
    assert {a.end - b.start for a, b in itertools.pairwise(snippets)} == {55}
    assert snippets[1].text.startswith("Sentence number 05 is here.")
    # When the last sentence alone is longer than the overlap, nothing is shared.
    none = chunk_text(text, "d", size=200, overlap=20)
    check_sentence_edges(text, none, 200, 20)
    assert all(a.end < b.start for a, b in itertools.pairwise(none))
    assert [len(s.text) for s in none] == [195] * 5 + [139]


def test_overlap_never_makes_a_window_that_adds_nothing() -> None:
    # [A B] is full; B alone fits in the overlap, but B + C does not fit in a snippet, so
    # the next one starts at C instead of repeating B alone.
    a, b, c = "Aa aa aa.", "Bb bb bb.", "C" + "c" * 30 + "."
    text = f"{a} {b} {c}"
    snippets = chunk_text(text, "d", size=40, overlap=20)
    check_sentence_edges(text, snippets, 40, 20)
    assert [s.text for s in snippets] == [f"{a} {b}", c]


def test_issue_example_no_snippet_starts_mid_sentence() -> None:
    # XQuAD-en Nikola_Tesla/0: the old word-snapped overlap gave "...fell into relative
    # obscurity after his" | "his retirement. Tesla died on 7 January 1943. ..."
    (context,) = [v for k, v in _paragraphs("en").items() if k == "Nikola_Tesla#0"]
    snippets = chunk_text(context, "Nikola_Tesla/0")
    check_sentence_edges(context, snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    assert [(s.start, s.end) for s in snippets] == [(0, 404), (375, 659)]
    assert snippets[0].text.endswith("through his retirement. Tesla died on 7 January 1943.")
    assert snippets[1].text.startswith("Tesla died on 7 January 1943. His work fell into")


def test_chinese_text_is_cut_at_full_stops() -> None:
    rng = random.Random(1)
    text = "".join(
        "".join(rng.choice(_CJK) for _ in range(rng.randint(8, 40))) + "。" for _ in range(80)
    )
    cores = chunk_text(text, "zh", overlap=0)
    assert len(cores) > 3
    for s in cores[:-1]:
        assert s.text.endswith("。")
    snippets = chunk_text(text, "zh")
    check_invariants(text, "zh", snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    check_sentence_edges(text, snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    for s in snippets:
        assert s.text.endswith("。") and (s.start == 0 or text[s.start - 1] == "。")
    # Sentences of 9 to 41 characters: most neighbours share one to a few of them.
    shared = [a.end - b.start for a, b in itertools.pairwise(snippets)]
    assert min(shared) > 0 and max(shared) <= DEFAULT_OVERLAP


def test_thai_is_cut_at_spaces_and_line_breaks() -> None:
    # Thai has no sentence mark: a paragraph is one sentence, cut at the spaces between
    # phrases; line breaks end sentences. Vowel and tone marks stay with their consonant.
    rng = random.Random(7)

    def phrase() -> str:
        return "".join(
            rng.choice(_THAI[:46]) + rng.choice(["", "\u0e34", "\u0e48", "\u0e34\u0e48"])
            for _ in range(rng.randint(3, 15))
        )

    paragraphs = [" ".join(phrase() for _ in range(rng.randint(2, 60))) for _ in range(12)]
    text = "\n".join(paragraphs)
    snippets = chunk_text(text, "th", size=200, overlap=40)
    check_invariants(text, "th", snippets, 200, 40)
    check_sentence_edges(text, snippets, 200, 40)
    words = set(text.split())
    for s in snippets:
        assert set(s.text.split()) <= words, "a phrase was cut in half"
        assert not unicodedata.category(s.text[0]).startswith("M")
    # A paragraph is cut only when it is longer than a snippet.
    assert any(len(p) > 200 for p in paragraphs) and any(len(p) <= 200 for p in paragraphs)
    for p in paragraphs:
        if len(p) <= 200:
            assert any(p in s.text for s in snippets)


def test_closing_quotes_and_abbreviations() -> None:
    text = ('He said "Stop." Then he left. ' * 3) + "See e.g. the notes on it."
    cores = chunk_text(text, "q", size=40, overlap=0)
    check_invariants(text, "q", cores, 40, 0)
    for s in cores[:-1]:
        assert re.search(r'[.!?]"?$', s.text), s.text
        assert not s.text.endswith("e.g.")


def test_chinese_without_punctuation_is_still_cut() -> None:
    text = "中" * 10_000
    snippets = chunk_text(text, "zh")
    assert 24 <= len(snippets) <= 26
    check_invariants(text, "zh", snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)


def test_sentence_longer_than_size_is_cut_between_words() -> None:
    long = " ".join(["Word"] + ["word"] * 399) + "."
    text = f"Before it. {long} After it. The end."
    snippets = chunk_text(text, "long")
    check_invariants(text, "long", snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    check_sentence_edges(text, snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
    assert snippets[0].text == "Before it."
    assert snippets[-1].text == "After it. The end."
    pieces = snippets[1:-1]
    assert len(pieces) >= 4
    for s in pieces:
        assert set(s.text.rstrip(".").split()) <= {"Word", "word"}, "a word was cut in half"
    # Pieces overlap one another by whole words, and nothing else.
    shared = [a.end - b.start for a, b in itertools.pairwise(pieces)]
    assert all(0 < n <= DEFAULT_OVERLAP for n in shared)
    assert snippets[0].end < pieces[0].start and pieces[-1].end < snippets[-1].start


def test_one_giant_token_is_hard_cut() -> None:
    text = "x" * 2_345
    snippets = chunk_text(text, "tok", size=300, overlap=60)
    check_invariants(text, "tok", snippets, 300, 60)
    assert len(snippets) == math.ceil((2_345 - 60) / 240)


@pytest.mark.parametrize("overlap", [0, 20])
def test_combining_marks_stay_with_their_base_character(overlap: int) -> None:
    text = "क्षत्रिय" * 800  # Devanagari, no spaces, many combining marks
    snippets = chunk_text(text, "hi", size=101, overlap=overlap)
    check_invariants(text, "hi", snippets, 101, overlap)
    for s in snippets:
        assert not unicodedata.category(s.text[0]).startswith("M")
        if s.end < len(text):
            assert not unicodedata.category(text[s.end]).startswith("M")


def test_short_document_is_one_snippet_with_trimmed_offsets() -> None:
    text = "\n\n  A short document. Two sentences.  \n"
    (s,) = chunk_text(text, "short")
    assert s == Snippet("short", 4, 36, "A short document. Two sentences.")
    assert s.snippet_id == "short:4-36"


def test_answer_span_can_be_located_in_a_snippet() -> None:
    answer = "Marie Curie won the Nobel Prize in Physics in 1903"
    text = (
        _english_paragraph(30, seed=2) + f" In the end {answer}. " + _english_paragraph(30, seed=3)
    )
    a = text.index(answer)
    b = a + len(answer)
    snippets = chunk_text(text, "doc")
    hits = [s for s in snippets if s.start <= a and b <= s.end]
    assert hits
    for s in hits:
        assert s.text[a - s.start : b - s.start] == answer
    # A short span near a core boundary may sit in both neighbours, never more.
    assert len(hits) <= 2


def test_sizes_are_configurable() -> None:
    text = _english_paragraph(80, seed=4)
    default = chunk_text(text, "doc")
    small = chunk_text(text, "doc", size=200, overlap=40)
    check_invariants(text, "doc", small, 200, 40)
    check_sentence_edges(text, small, 200, 40)
    assert len(small) > 2 * len(default)
    assert max(len(s.text) for s in small) <= 200 < max(len(s.text) for s in default)
    # Whole sentences only: of these (25 to 120 characters) few fit in 40 characters.
    shared = [a.end - b.start for a, b in itertools.pairwise(small)]
    assert max(shared) <= 40
    wide = chunk_text(text, "doc", size=200, overlap=150)
    check_sentence_edges(text, wide, 200, 150)
    assert sum(a.end > b.start for a, b in itertools.pairwise(wide)) > len(wide) // 2
    assert Chunker(size=200, overlap=40)(text, "doc") == small


# --------------------------------------------------------------------------- real data


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_xquad_answer_spans_fall_inside_snippets(lang: str) -> None:
    n_answers = located = 0
    for art in _xquad(lang):
        for i, par in enumerate(art["paragraphs"]):
            context = par["context"]
            snippets = chunk_text(context, f"{art['title']}#{i}")
            check_invariants(
                context, f"{art['title']}#{i}", snippets, DEFAULT_SIZE, DEFAULT_OVERLAP
            )
            check_sentence_edges(context, snippets, DEFAULT_SIZE, DEFAULT_OVERLAP)
            for qa in par["qas"]:
                ans = qa["answers"][0]
                a = ans["answer_start"]
                b = a + len(ans["text"])
                assert context[a:b] == ans["text"]
                n_answers += 1
                hits = [s for s in snippets if s.start <= a and b <= s.end]
                for s in hits:
                    assert s.text[a - s.start : b - s.start] == ans["text"]
                located += bool(hits)
    assert n_answers == 1190
    assert located == n_answers


@pytest.mark.parametrize("lang", ["en", "de"])
def test_xquad_snippets_start_and_end_at_sentences(lang: str) -> None:
    # Judged by a plain regex, not the chunker's splitter. The word-snapped overlap of
    # the previous chunker started and ended about 60% of these snippets mid-sentence.
    end = r"[.!?][\"')“”]*"
    n = starts_ok = ends_ok = 0
    for doc_id, context in _paragraphs(lang).items():
        first, last = len(context) - len(context.lstrip()), len(context.rstrip())
        for s in chunk_text(context, doc_id):
            n += 1
            starts_ok += s.start == first or bool(re.search(end + r"\s+$", context[: s.start]))
            ends_ok += s.end == last or bool(re.search(end + "$", s.text))
    assert n > 500
    assert starts_ok / n >= 0.97 and ends_ok / n >= 0.97, (starts_ok / n, ends_ok / n)


def test_xquad_chinese_concatenated_is_cut_at_punctuation() -> None:
    # Whole articles without separators: long texts with no spaces at all.
    cores = ends_ok = 0
    for art in _xquad("zh"):
        text = "".join(p["context"] for p in art["paragraphs"])
        snippets = chunk_text(text, art["title"], size=250, overlap=0)
        check_invariants(text, art["title"], snippets, 250, 0)
        for s in snippets[:-1]:
            cores += 1
            ends_ok += bool(re.search(r"[。！？；][」”）]*$", s.text))
    assert cores > 200
    assert ends_ok / cores >= 0.95


def test_xquad_all_languages_chunk() -> None:
    # Speed is measured in benchmarks/bench_scoring.py, not asserted here.
    docs = {
        f"{lang}:{k}": v for lang in ("en", "de", "es", "zh") for k, v in _paragraphs(lang).items()
    }
    snippets, skipped = chunk_documents(docs)
    assert skipped == []
    assert {s.doc_id for s in snippets} == set(docs)


@pytest.mark.parametrize(
    "text",
    [
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 18_000,
        "中文没有空格" * 170_000,
        "." * 1_000_000 + "x",
        ". " * 500_000,
        '."' * 500_000 + "x",
        "a" + " " * 1_000_000 + "b",
    ],
    ids=["latin", "cjk", "dots", "dot-space", "dot-quote", "huge-gap"],
)
def test_megabyte_document(text: str) -> None:
    # Runs in well under a second per MB when linear; a quadratic regression would make
    # this test take minutes (visible in `pytest --durations`), so no timed assertion.
    snippets = chunk_text(text, "big")
    assert max(len(s.text) for s in snippets) <= DEFAULT_SIZE
    assert all(a.start < b.start and a.end < b.end for a, b in itertools.pairwise(snippets))
    assert snippets[0].start == len(text) - len(text.lstrip())
    assert snippets[-1].end == len(text.rstrip())


# --------------------------------------------------------------------------- chunk_documents


def test_chunk_documents_accepts_mapping_pairs_and_generators() -> None:
    docs = {"a": _english_paragraph(20, seed=5), "b": "Kurz. Zwei Sätze.", "c": "中" * 900}
    by_map, skipped = chunk_documents(docs, size=200, overlap=40)
    assert skipped == []
    by_pairs, _ = chunk_documents(list(docs.items()), size=200, overlap=40)
    by_gen, _ = chunk_documents(((k, v) for k, v in docs.items()), size=200, overlap=40)
    assert by_map == by_pairs == by_gen
    expected = [s for k, v in docs.items() for s in chunk_text(v, k, size=200, overlap=40)]
    assert by_map == expected
    assert [s.doc_id for s in by_map] == sorted(s.doc_id for s in by_map)  # input order kept


def test_chunk_documents_skips_blank_documents_with_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    docs = [("empty", ""), ("full", "Some text."), ("blank", " \n\t\u3000")]
    with caplog.at_level(logging.WARNING, logger="ragsieve.chunking"):
        snippets, skipped = chunk_documents(docs)
    assert skipped == ["empty", "blank"]
    assert [s.doc_id for s in snippets] == ["full"]
    (record,) = [r for r in caplog.records if r.name == "ragsieve.chunking"]
    assert record.levelno == logging.WARNING
    assert "'empty'" in record.getMessage() and "'blank'" in record.getMessage()


def test_chunk_documents_without_blank_documents_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="ragsieve.chunking"):
        chunk_documents({"x": "Text."})
    assert not [r for r in caplog.records if r.name == "ragsieve.chunking"]


@pytest.mark.parametrize(
    ("docs", "error", "match"),
    [
        ("just a string", TypeError, "mapping"),
        (42, TypeError, "mapping"),
        ([("a", "x", "extra")], TypeError, r"\(doc_id, text\) pairs"),
        (["ab"], TypeError, r"\(doc_id, text\) pairs"),
        ([(1, "text")], TypeError, "doc_id must be a str"),
        ([("a", b"bytes")], TypeError, r"text \(doc_id 'a'\) must be a str"),
        ([("", "text")], ValueError, "non-empty"),
        ([("a", "x."), ("a", "y.")], DataError, "'a' occurs more than once"),
    ],
)
def test_chunk_documents_rejects_bad_input(docs: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        chunk_documents(docs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("size", "overlap", "error", "match"),
    [
        (0, 0, ValueError, r"size == 0, must be > 0"),
        (-5, 0, ValueError, r"size == -5"),
        (100, 100, ValueError, r"overlap == 100, must satisfy 0 <= overlap < size \(size == 100\)"),
        (100, -1, ValueError, r"overlap == -1"),
        (2.5, 0, TypeError, r"size must be an int, got float"),
        ("500", 100, TypeError, r"size must be an int, got str"),
        (True, 0, TypeError, r"size must be an int, got bool"),
        (500, None, TypeError, r"overlap must be an int, got NoneType"),
        (500, 10.0, TypeError, r"overlap must be an int, got float"),
    ],
)
def test_bad_sizes_raise(size: object, overlap: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        chunk_text("Some text.", "d", size=size, overlap=overlap)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        Chunker(size, overlap)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        chunk_documents({"d": "Some text."}, size=size, overlap=overlap)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "   ", "\n\t \u3000\n"])
def test_blank_text_raises_data_error_naming_the_document(text: str) -> None:
    with pytest.raises(DataError, match="'doc-7'.*empty or whitespace-only"):
        chunk_text(text, "doc-7")
    with pytest.raises(ValueError):  # DataError is also a ValueError
        chunk_text(text, "doc-7")


@pytest.mark.parametrize(
    ("text", "doc_id", "error", "match"),
    [
        (None, "d", TypeError, r"text \(doc_id 'd'\) must be a str, got NoneType"),
        (b"bytes", "d", TypeError, r"text \(doc_id 'd'\) must be a str, got bytes"),
        (["a list"], "d", TypeError, r"text \(doc_id 'd'\) must be a str, got list"),
        ("text", 7, TypeError, "doc_id must be a str, got int"),
        ("text", "", ValueError, "doc_id == '', must be a non-empty string"),
    ],
)
def test_bad_text_or_doc_id_raise(text: object, doc_id: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        chunk_text(text, doc_id)  # type: ignore[arg-type]


def test_numpy_style_integers_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    chunker = Chunker(np.int64(200), np.int32(40))
    assert chunker.spec() == {"size": 200, "overlap": 40}
    assert type(chunker.size) is int and type(chunker.overlap) is int
    assert chunk_text("Hello there.", "d", size=np.int64(200)) == chunk_text(
        "Hello there.", "d", size=200
    )


# --------------------------------------------------------------------------- Chunker


def test_chunker_defaults_spec_and_round_trip() -> None:
    chunker = Chunker()
    assert (chunker.size, chunker.overlap) == (DEFAULT_SIZE, DEFAULT_OVERLAP) == (500, 100)
    assert chunker.spec() == {"size": 500, "overlap": 100}
    assert Chunker(**Chunker(size=300, overlap=0).spec()) == Chunker(300, 0)
    assert json.loads(json.dumps(chunker.spec())) == chunker.spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunker.size = 10  # type: ignore[misc]
    text = _english_paragraph(40, seed=6)
    assert chunker(text, "d") == chunk_text(text, "d")


def test_docstring_examples_run() -> None:
    result = doctest.testmod(chunking, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5
    assert result.failed == 0
