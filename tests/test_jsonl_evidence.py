"""The generic JSONL ``evidence`` field: character spans of the snippet text, read, checked, written back."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ragsieve.data.jsonl import EVIDENCE_KEY, read_pairs, write_pairs
from ragsieve.errors import DataError
from ragsieve.types import Pair


def _line(**extra: object) -> str:
    record = {"query_id": "q1", "query": "Who?", "snippet_id": "s1",
              "text": "Ada wrote it. Then she left.", "relevant": 1, **extra}
    return json.dumps(record)


def _read(*lines: str) -> list[Pair]:
    return read_pairs(io.StringIO("\n".join(lines) + "\n"))


def test_evidence_is_kept_in_meta() -> None:
    (pair,) = _read(_line(evidence=[[0, 3], [14, 28]]))
    assert EVIDENCE_KEY == "evidence"
    assert pair.meta["evidence"] == [[0, 3], [14, 28]]
    assert pair.text[0:3] == "Ada"


@pytest.mark.parametrize("evidence", [None, []])
def test_null_or_empty_evidence_is_accepted(evidence: object) -> None:
    (pair,) = _read(_line(evidence=evidence))
    assert pair.meta["evidence"] == evidence


def test_round_trip(tmp_path: Path) -> None:
    pairs = [Pair("q1", "Who?", "s1", "Ada wrote it.", relevant=1, meta={"evidence": [[0, 3]]}),
             Pair("q1", "Who?", "s2", "Bob did not.", relevant=0, meta={"evidence": []}),
             Pair("q1", "Who?", "s3", "Nothing here.", relevant=0)]
    path = tmp_path / "pairs.jsonl"
    assert write_pairs(pairs, path) == 3
    back = read_pairs(path)
    assert back == pairs
    assert [p.meta for p in back] == [p.meta for p in pairs]
    # tuples from Python are written as JSON lists
    write_pairs([Pair("q", "Q?", "s", "Abc.", relevant=1, meta={"evidence": ((0, 3),)})], path)
    assert read_pairs(path)[0].meta["evidence"] == [[0, 3]]


@pytest.mark.parametrize(("evidence", "shown"), [
    ([[5, 2]], "evidence[0] == [5, 2]"),
    ([[0, 29]], "evidence[0] == [0, 29]"),  # the text has 28 characters
    ([[-1, 3]], "evidence[0] == [-1, 3]"),
    ([[0, 3], [1.5, 4]], "evidence[1] == [1.5, 4]"),
    ([[0, 1, 2]], "evidence[0] == [0, 1, 2]"),
    ([[True, 3]], "evidence[0] == [true, 3]"),
    ([3, 4], "evidence[0] == 3"),
    ("0-3", 'evidence == "0-3" (str)'),
    ({"start": 0}, "evidence == {\"start\": 0} (dict)"),
])
def test_malformed_evidence_is_a_one_line_error_with_the_line_number(evidence: object, shown: str) -> None:
    with pytest.raises(DataError) as info:
        _read(_line(snippet_id="s0"), _line(evidence=evidence))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("<stream>:2: evidence"), message  # the line number
    assert shown in message, message
    assert "[start, end] integer pairs with 0 <= start < end <= 28 (len(text))" in message


def test_writer_refuses_malformed_evidence(tmp_path: Path) -> None:
    bad = Pair("q1", "Who?", "s1", "Ada.", relevant=1, meta={"evidence": [[2, 9]]})
    with pytest.raises(DataError, match=r"pair #1: evidence\[0\] == \[2, 9\]"):
        write_pairs([bad], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
