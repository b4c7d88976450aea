"""The sentence unit: the splitter's offsets, and sentence pairs labelled on evidence sentences."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve.chunking import chunk_text, sentence_spans
from ragsieve.errors import DataError
from ragsieve.types import Pair
from ragsieve.units import (
    SENTENCE_META_KEYS,
    UNITS,
    Sentence,
    check_unit,
    sentence_pairs,
    split_sentences,
)

TEXT = "The tower is tall. Gustave Eiffel built it in 1889! It was painted red. 北京很大。很美"


def _pair(text: str = TEXT, relevant: int | None = 1, *, qid: str = "q1", sid: str = "s1",
          **meta: object) -> Pair:
    return Pair(qid, "Who built the tower?", sid, text, relevant=relevant, group="g", meta=meta)


# ------------------------------------------------------------------------------ unit names


def test_check_unit_accepts_the_units_and_names_them_otherwise() -> None:
    assert UNITS == ("snippet", "sentence")
    for unit in UNITS:
        assert check_unit(unit) == unit
    with pytest.raises(ValueError, match=r"unit == 'chars', must be one of 'snippet', 'sentence'"):
        check_unit("chars")
    with pytest.raises(TypeError, match="unit must be a str"):
        check_unit(None)


# -------------------------------------------------------------------------------- splitter


def test_offsets_are_exact_and_edges_trimmed() -> None:
    text = "  The tower is tall.  Gustave Eiffel built it in 1889!\nIt was red. 北京很大。很美  "
    sentences = split_sentences(text)
    assert [s.text for s in sentences] == [
        "The tower is tall.", "Gustave Eiffel built it in 1889!", "It was red.", "北京很大。", "很美"]
    for s in sentences:
        assert isinstance(s, Sentence)
        assert text[s.start:s.end] == s.text
        assert s.text == s.text.strip()


def test_no_sentence_end_is_one_sentence_and_blank_text_none() -> None:
    assert split_sentences("no end here, just words") == [Sentence(0, 23, "no end here, just words")]
    assert split_sentences(" \n\t ") == []
    assert split_sentences("") == []
    with pytest.raises(TypeError, match="text must be a str"):
        split_sentences(b"bytes")  # type: ignore[arg-type]


def test_abbreviations_do_not_end_a_sentence() -> None:
    # the chunker's own rules: an initial, a title and "e.g. the" keep the sentence whole
    text = "Dr. Smith met John C. Smith, e.g. the other one. Then they left."
    assert [s.text for s in split_sentences(text)] == [
        "Dr. Smith met John C. Smith, e.g. the other one.", "Then they left."]


def test_the_splitter_is_the_chunkers() -> None:
    # a snippet of the chunker ends at a sentence end of the same splitter
    doc = " ".join(f"Sentence number {i} is here." for i in range(30))
    ends = {e for _, e in sentence_spans(doc)}
    starts = {s for s, _ in sentence_spans(doc)}
    for snip in chunk_text(doc, "d", size=120, overlap=30):
        assert snip.start in starts and snip.end in ends


_ALPHABET = st.sampled_from(list("ab Z.!?。；\n\t”)") + ["Mr.", "U.S.", " e.g. ", "1.", "é", "\u0301"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=60).map("".join))
def test_sentences_cover_every_non_space_character_in_order(text: str) -> None:
    sentences = split_sentences(text)
    covered = []
    last_end = 0
    for s in sentences:
        assert last_end <= s.start < s.end
        assert text[s.start:s.end] == s.text and s.text.strip() == s.text
        covered.extend(range(s.start, s.end))
        last_end = s.end
    non_space = [i for i, ch in enumerate(text) if not ch.isspace()]
    assert set(non_space) <= set(covered)
    # and nothing between two sentences but whitespace
    gaps = set(range(len(text))) - set(covered)
    assert all(text[i].isspace() for i in gaps)


# ------------------------------------------------------------------------- sentence pairs


def test_ids_text_and_meta_of_sentence_pairs() -> None:
    parents = [_pair(relevant=0, sid="a", language="en", answers=["Gustave Eiffel"]),
               _pair("Second one. Here.", relevant=None, sid="b"),
               _pair("Other query.", relevant=0, qid="q2", sid="c")]
    out = sentence_pairs(parents)
    first = split_sentences(TEXT)
    assert [p.snippet_id for p in out[:len(first)]] == [f"a#{s.start}-{s.end}" for s in first]
    assert [p.text for p in out[:len(first)]] == [s.text for s in first]
    assert [p.query_id for p in out] == ["q1"] * (len(first) + 2) + ["q2"]
    assert {p.group for p in out} == {"g"}
    assert all(p.query == "Who built the tower?" for p in out)
    p = out[1]
    assert p.meta["parent_snippet_id"] == "a"
    assert (p.meta["sentence_start"], p.meta["sentence_end"]) == (first[1].start, first[1].end)
    assert TEXT[p.meta["sentence_start"]:p.meta["sentence_end"]] == p.text
    assert p.meta["language"] == "en" and p.meta["answers"] == ["Gustave Eiffel"]  # parent's meta
    assert set(SENTENCE_META_KEYS) <= set(p.meta)
    assert [q.meta["parent_position"] for q in out] == [0] * len(first) + [1, 1, 0]


def test_irrelevant_snippet_gives_only_zeros_and_unlabelled_only_none() -> None:
    out = sentence_pairs([_pair(relevant=0, answers=["Gustave Eiffel"]),
                          _pair(relevant=None, sid="s2", evidence=[[0, 5]])])
    n = len(split_sentences(TEXT))
    assert [p.relevant for p in out] == [0] * n + [None] * n


def test_answers_mark_the_sentences_containing_them() -> None:
    out = sentence_pairs([_pair(answers=["gustave EIFFEL"])])
    assert [p.relevant for p in out] == [0, 1, 0, 0, 0]
    # SQuAD normalisation: punctuation and articles do not matter; every containing sentence
    out = sentence_pairs([_pair("The red tower stood. A tower, red! Blue.", answers=["the Tower red"])])
    assert [p.relevant for p in out] == [0, 1, 0]
    out = sentence_pairs([_pair("Red tower here. The red tower there. None.", answers=["red tower"])])
    assert [p.relevant for p in out] == [1, 1, 0]


def test_answers_are_whole_tokens_not_substrings() -> None:
    out = sentence_pairs([_pair("What a party. The art is fine.", answers=["art"])])
    assert [p.relevant for p in out] == [0, 1]


def test_answer_crossing_a_sentence_end_marks_the_shortest_run() -> None:
    # the gold answer runs over the end of sentence 2 into sentence 3
    text = "Intro here. He said stop. Go now please. Tail end."
    out = sentence_pairs([_pair(text, answers=["stop. Go now"])])
    assert [p.relevant for p in out] == [0, 1, 1, 0]
    # over three sentences: only those three
    out = sentence_pairs([_pair("A b. C d. E f. G h.", answers=["d E f G"])])
    assert [p.relevant for p in out] == [0, 1, 1, 1]


def test_cjk_answers_use_character_tokens() -> None:
    out = sentence_pairs([_pair("北京很大。上海很美。", answers=["上海"], language="zh")])
    assert [p.relevant for p in out] == [0, 1]


def test_answers_come_from_any_line_of_the_query_and_the_language_applies() -> None:
    # the first line has no answers; the query's answers are on another line
    out = sentence_pairs([_pair("Der Rhein fließt. Die Elbe auch.", sid="a"),
                          _pair("x.", relevant=0, sid="b", answers=["Die Elbe"])], language="de")
    assert [p.relevant for p in out] == [0, 1, 0]


def test_evidence_spans_take_precedence_over_answers() -> None:
    first, second, third = split_sentences(TEXT)[:3]
    evidence = [[third.start + 2, third.start + 5]]  # inside sentence 3 only
    out = sentence_pairs([_pair(evidence=evidence, answers=["Gustave Eiffel"])])
    assert [p.relevant for p in out] == [0, 0, 1, 0, 0]
    # a span over a sentence end marks both sentences it overlaps
    out = sentence_pairs([_pair(evidence=[(first.end - 3, second.start + 1)])])
    assert [p.relevant for p in out] == [1, 1, 0, 0, 0]
    # an empty list counts as no spans: the answers decide
    out = sentence_pairs([_pair(evidence=[], answers=["Gustave Eiffel"])])
    assert [p.relevant for p in out] == [0, 1, 0, 0, 0]


def test_relevant_snippet_with_neither_field_is_a_data_error() -> None:
    with pytest.raises(DataError, match=r"snippet 's1' of query 'q1'.*'evidence'.*'answers'"):
        sentence_pairs([_pair()])
    # irrelevant and unlabelled snippets need neither
    assert len(sentence_pairs([_pair(relevant=0), _pair(relevant=None, sid="s2")])) == 10


@pytest.mark.parametrize("evidence", [[[5, 2]], [[0, 10_000]], [[-1, 3]], [[0, 2, 3]], [["0", 3]],
                                      [[True, 3]], "0-3", [3]])
def test_malformed_evidence_is_a_one_line_data_error(evidence: object) -> None:
    with pytest.raises(DataError) as info:
        sentence_pairs([_pair(evidence=evidence)])
    message = str(info.value)
    assert "\n" not in message and "'s1'" in message and "evidence" in message
    assert f"<= {len(TEXT)}" in message


def test_malformed_answers_is_a_data_error() -> None:
    with pytest.raises(DataError, match="answers == 'Eiffel'.*list of str"):
        sentence_pairs([_pair(answers="Eiffel")])


def test_unmarkable_relevant_snippet_keeps_all_sentences_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    # the answer is only partly in this snippet (XQuAD marks a snippet that overlaps it)
    with caplog.at_level(logging.WARNING, logger="ragsieve.units"):
        out = sentence_pairs([_pair("One here. Two there.", answers=["there Three"]),
                              _pair("Fine. Gustave Eiffel.", sid="s2", evidence=[[6, 13]])])
    assert [p.relevant for p in out] == [1, 1, 0, 1]
    assert "1 relevant snippet(s)" in caplog.text and "'s1'" in caplog.text


def test_answers_marking_several_sentences_are_counted_in_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A short answer standing in two sentences marks both (the rule), and the count of such
    snippets is logged once, saying that spans mark the answer's own sentence; spans, one
    marked sentence and an irrelevant snippet are not counted."""
    with caplog.at_level(logging.WARNING, logger="ragsieve.units"):
        out = sentence_pairs([
            _pair("Tesla left. Lane paid Tesla.", answers=["Tesla"]),
            _pair("Tesla left. Lane paid Tesla.", qid="q2", evidence=[[22, 27]]),
            _pair("Fine. Gustave Eiffel.", qid="q3", answers=["Gustave Eiffel"]),
            _pair("Tesla left. Tesla.", qid="q4", answers=["Tesla"], relevant=0)])
    assert [p.relevant for p in out] == [1, 1, 0, 1, 0, 1, 0, 0]
    counted = [r.getMessage() for r in caplog.records if "more than one" in r.getMessage()]
    assert len(counted) == 1 and counted[0].startswith("1 of 2 relevant snippet(s)")
    assert "'evidence' spans" in counted[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragsieve.units"):
        sentence_pairs([_pair("Tesla left. Lane paid Tesla.", answers=["Tesla"])],
                       warn_unmarked=False)
    assert "more than one" not in caplog.text


def test_relevant_blank_snippet_is_a_data_error_and_others_give_no_sentence() -> None:
    with pytest.raises(DataError, match="has no sentence"):
        sentence_pairs([_pair("   ", answers=["x"])])
    assert sentence_pairs([_pair("   ", relevant=0)]) == []


def test_wrong_input_types() -> None:
    with pytest.raises(TypeError, match="pairs must be a sequence of Pair"):
        sentence_pairs("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pairs\[0\] must be a Pair"):
        sentence_pairs([{"query_id": "q"}])  # type: ignore[list-item]


def test_sentence_pairs_carry_their_own_evidence_offsets_and_write_as_jsonl(tmp_path) -> None:
    from ragsieve.data.jsonl import read_pairs, write_pairs

    first, second = split_sentences(TEXT)[:2]
    span = [first.end - 3, second.start + 7]  # "ll. Gustave"
    out = sentence_pairs([_pair(evidence=[span])])
    assert out[0].meta["evidence"] == [[first.end - 3 - first.start, first.end - first.start]]
    assert out[1].meta["evidence"] == [[0, 7]] and out[1].text[:7] == "Gustave"
    assert out[2].meta["evidence"] == []
    path = tmp_path / "sentences.jsonl"
    write_pairs(out, path)
    back = read_pairs(path)
    assert [(p.snippet_id, p.relevant, p.meta["evidence"]) for p in back] == [
        (p.snippet_id, p.relevant, p.meta["evidence"]) for p in out]


def test_malformed_evidence_of_an_irrelevant_snippet_is_an_error_too() -> None:
    with pytest.raises(DataError, match="evidence"):
        sentence_pairs([_pair(relevant=0, evidence=[[3, 1]])])
