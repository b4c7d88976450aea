"""Hostile numbers, nesting, strings and ids: a 4xx (never a 500) over HTTP, the same one-line
refusal in files (issue 31, items 6, 8 and 9).

The inputs: an integer of 401 digits (beyond a double: ``math.isfinite`` raised
``OverflowError``), JSON nested 100,000 deep, a lone surrogate (``"\\ud800"``, which no
UTF-8 encoder takes) and ids holding bidirectional-control or zero-width characters
(U+202E shows ``abc\\u202edef`` as ``abcfed``). Over HTTP every one is a 422 naming the
field, and the keep-alive connection it came on answers the next request; in JSONL files
(``file:line``), Parquet files (``file:row N``) and the labelled-queries reader it is a
``DataError`` / one line on stderr with exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from servers import serving

from ragsieve import ConformalFilter, Pair
from ragsieve._validation import check_alpha, check_scores
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs
from ragsieve.data.jsonl import pair_to_record
from ragsieve.data.queries import read_queries
from ragsieve.errors import DataError
from ragsieve.scoring import FieldScorer

BIG = 10**400  # 401 digits: beyond the largest double (1.8e308)
BIG_TEXT = str(BIG)
DEEP = 100_000
NESTED = "[" * DEEP + "]" * DEEP


def _overlap(p: Pair) -> float:
    words = set(re.findall(r"\w+", p.query.lower()))
    return len(words & set(re.findall(r"\w+", p.text.lower()))) / max(len(words), 1)


@pytest.fixture(scope="module")
def bm25_pairs(xquad_en: list[Pair]) -> list[Pair]:
    """XQuAD-en pairs carrying an outside score ``bm25`` (word overlap)."""
    return [dataclasses.replace(p, meta={**p.meta, "bm25": _overlap(p)}) for p in xquad_en[:300]]


@pytest.fixture(scope="module")
def bm25_artifact(tmp_path_factory: pytest.TempPathFactory, bm25_pairs: list[Pair]) -> Path:
    """A filter calibrated on the outside score ``bm25`` (a field-scored artifact)."""
    path = tmp_path_factory.mktemp("no500") / "bm25.json"
    ConformalFilter(FieldScorer("bm25", higher_is_better=True), alpha=0.2).calibrate(
        bm25_pairs, monitor=False).save(path)
    return path


# ============================================================================ HTTP
@pytest.fixture(scope="module")
def field_url(bm25_artifact: Path) -> Iterator[str]:
    with serving(bm25_artifact) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def embedding_url(served_artifact: Any, embedding_cache_dir: Path) -> Iterator[str]:
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    with serving(artifact, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        yield srv.url


#: A snippet each served filter answers 200 for (the field filter reads ``bm25``).
NORMAL_SNIPPET = {"field": {"text": "a river", "bm25": 0.5}, "embedding": {"text": "a river"}}


def _with(snippet: dict[str, Any], **extra: Any) -> str:
    """A /filter body (JSON text) of one snippet ``snippet | extra`` and the query ``q``."""
    return json.dumps({"query": "q", "snippets": [{**snippet, **extra}]})


#: (case, endpoint, body from the served filter's normal snippet, field path, words the
#: refusal must hold). Bodies are JSON text: json.dumps writes a lone surrogate as the
#: escape "\ud800" and a 401-digit integer as its digits.
HTTP_CASES: list[tuple[str, str, Callable[[dict[str, Any]], str], str, str]] = [
    ("401-digit outside score", "/filter",
     lambda s: '{"query": "q", "snippets": [{"text": "a", "bm25": ' + BIG_TEXT + "}]}",
     "snippets[0].bm25", "401 digits"),
    ("401-digit score", "/filter", lambda s: _with(s, score=BIG), "snippets[0].score",
     "401 digits"),
    ("401-digit min_keep", "/filter",
     lambda s: json.dumps({"query": "q", "snippets": [s], "min_keep": BIG}), "min_keep",
     "401 digits"),
    ("401-digit relevant", "/feedback",
     lambda s: json.dumps({"items": [{"query_id": "q", "snippet_id": "0", "relevant": BIG}]}),
     "items[0].relevant", "401 digits"),
    ("100,000-deep nesting", "/filter",
     lambda s: '{"query": "q", "snippets": [{"text": "a", "bm25": ' + NESTED + "}]}",
     "snippets[0].bm25", "more than 64 deep"),
    ("lone surrogate in text", "/filter", lambda s: _with(s, text="a\ud800"),
     "snippets[0].text", "surrogate U+D800 at position 1"),
    ("lone surrogate in snippet_id", "/filter", lambda s: _with(s, snippet_id="s\udc00"),
     "snippets[0].snippet_id", "surrogate U+DC00 at position 1"),
    ("U+202E in query_id", "/filter",
     lambda s: json.dumps({"query": "q", "query_id": "abc\u202edef", "snippets": [s]}),
     "query_id", "U+202E (RIGHT-TO-LEFT OVERRIDE) at position 3"),
    ("U+202E in snippet_id", "/filter", lambda s: _with(s, snippet_id="abc\u202edef"),
     "snippets[0].snippet_id", "U+202E (RIGHT-TO-LEFT OVERRIDE) at position 3"),
    ("U+200B in group", "/filter",
     lambda s: json.dumps({"query": "q", "group": "g\u200b", "snippets": [s]}),
     "group", "U+200B (ZERO WIDTH SPACE) at position 1"),
    ("U+202E in feedback query_id", "/feedback",
     lambda s: json.dumps({"items": [{"query_id": "q\u202e", "snippet_id": "0", "relevant": 1}]}),
     "items[0].query_id", "U+202E"),
    ("U+2066 in feedback snippet_id", "/feedback",
     lambda s: json.dumps({"items": [{"query_id": "q", "snippet_id": "\u20660", "relevant": 0}]}),
     "items[0].snippet_id", "U+2066 (LEFT-TO-RIGHT ISOLATE) at position 0"),
]


def _path(loc: list[Any]) -> str:
    """``snippets[0].snippet_id`` of a validation error's ``loc`` (without ``body`` and
    pydantic's union / validator steps)."""
    out = ""
    for part in loc[1:]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "str" and "SnippetIn" not in part:
            out += f".{part}" if out else part
    return out


def _refusal_names(response: Any, field: str, words: str) -> bool:
    """The 422 names ``field`` (in its one-line detail, or as an error's location) with
    ``words`` in the same message."""
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return detail.startswith(field + " ") and words in detail
    return any(_path(e["loc"]) == field and words in e["msg"] for e in detail)


@pytest.mark.parametrize("served", ["field", "embedding"])
@pytest.mark.parametrize(("case", "endpoint", "body", "field", "words"), HTTP_CASES,
                         ids=[c[0] for c in HTTP_CASES])
def test_hostile_request_is_a_422_naming_the_field_and_the_connection_answers_on(
        request: pytest.FixtureRequest, served: str, case: str, endpoint: str,
        body: Callable[[dict[str, Any]], str], field: str, words: str) -> None:
    url = request.getfixturevalue(f"{served}_url")
    snippet = NORMAL_SNIPPET[served]
    with httpx.Client(base_url=url, timeout=120) as client:
        refused = client.post(endpoint, content=body(snippet).encode("utf-8"),
                              headers={"Content-Type": "application/json"})
        first = refused.extensions["network_stream"].get_extra_info("client_addr")
        assert refused.status_code == 422, (refused.status_code, refused.text[:300])
        assert _refusal_names(refused, field, words), refused.text[:600]
        answered = client.post("/filter", json={"query": "q", "snippets": [snippet]})
        assert answered.status_code == 200, answered.text[:300]
        # the same keep-alive connection (same client port): the refusal did not close it
        assert answered.extensions["network_stream"].get_extra_info("client_addr") == first


def test_an_unexpected_error_is_a_500_that_keeps_the_connection(
        bm25_artifact: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A bug the routes do not handle (injected: the scorer raises) is a JSON 500 with the
    traceback in the log, and the keep-alive connection answers the next request
    (Starlette's last-resort handler re-raised after answering, and uvicorn then closed
    the connection)."""
    calls = {"n": 0}
    real = FieldScorer.score_items

    def failing_once(self: FieldScorer, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FieldScorer, "score_items", failing_once)
    snippet = NORMAL_SNIPPET["field"]
    with serving(bm25_artifact) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        failed = client.post("/filter", json={"query": "q", "snippets": [snippet]})
        first = failed.extensions["network_stream"].get_extra_info("client_addr")
        assert failed.status_code == 500, failed.text[:300]
        assert "internal server error" in failed.json()["detail"]
        assert "injected failure" not in failed.text  # the details go to the log only
        answered = client.post("/filter", json={"query": "q", "snippets": [snippet]})
        assert answered.status_code == 200, answered.text[:300]
        assert answered.extensions["network_stream"].get_extra_info("client_addr") == first
    assert calls["n"] == 2
    assert any("injected failure" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# ============================================================================ files
#: (case, the hostile line made from a good record's dict, the field the error names).
#: Lines are JSON text, as json.dumps writes them (a surrogate as "\ud800").
FILE_CASES: list[tuple[str, Callable[[dict[str, Any]], str], str]] = [
    ("401-digit bm25", lambda r: json.dumps({**r, "bm25": BIG}),
     "bm25 == an integer of 401 digits"),
    ("100,000-deep nesting", lambda r: json.dumps(r)[:-1] + ', "extra": ' + NESTED + "}",
     "extra nests arrays and objects more than 64 deep"),
    ("lone surrogate in text", lambda r: json.dumps({**r, "text": r["text"] + "\ud800"}),
     "text holds a lone UTF-16 surrogate U+D800"),
    ("lone surrogate in snippet_id", lambda r: json.dumps({**r, "snippet_id": "\udfff" + "s"}),
     "snippet_id holds a lone UTF-16 surrogate U+DFFF at position 0"),
    ("U+202E in query_id", lambda r: json.dumps({**r, "query_id": "qa\u202eb"}),
     "query_id == 'qa\\u202eb' holds the bidirectional control character U+202E"),
    ("U+202E in snippet_id", lambda r: json.dumps({**r, "snippet_id": "ab\u202ecd"}),
     "snippet_id == 'ab\\u202ecd' holds the bidirectional control character U+202E"),
]


@pytest.fixture(scope="module")
def good_lines(bm25_pairs: list[Pair]) -> list[dict[str, Any]]:
    """The records of the first 40 pairs (whole queries, labelled, with ``bm25``)."""
    return [pair_to_record(p) for p in bm25_pairs[:40]]


def _hostile_file(directory: Path, records: list[dict[str, Any]],
                  make: Callable[[dict[str, Any]], str]) -> Path:
    lines = [json.dumps(r) for r in records]
    lines[2] = make(records[2])
    path = directory / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _command(name: str, data: Path, out: Path, artifact: Path) -> list[str]:
    field = ["--scorer", "field", "--score-field", "bm25", "--higher-is-better"]
    return {
        "filter": ["-q", "filter", "--filter", str(artifact), "--data", str(data), "--json"],
        "calibrate": ["-q", "calibrate", "--data", str(data), *field, "--out", str(out / "f.json")],
        "export": ["-q", "export", "--data", str(data), "--out", str(out / "pairs.jsonl")],
        "score": ["-q", "score", "--data", str(data), *field, "--out", str(out / "scores")],
    }[name]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err[-500:])
    assert len(err.splitlines()) == 1, err[-1000:]
    return err


COMMANDS = ["filter", "calibrate", "export", "score"]


def _written(out: Path) -> list[Path]:
    """The files a command wrote under ``out`` (a resumable job's manifest aside: it
    records the job before any input is read)."""
    return [p for p in out.rglob("*") if p.is_file() and p.name != "_manifest.json"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("case", "make", "words"), FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_hostile_jsonl_line_is_one_line_exit_2_naming_file_and_line(
        tmp_path: Path, good_lines: list[dict[str, Any]], bm25_artifact: Path, command: str,
        case: str, make: Callable[[dict[str, Any]], str], words: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _hostile_file(tmp_path, good_lines, make)
    out = tmp_path / "out"
    out.mkdir()
    err = _one_line_error(_command(command, data, out, bm25_artifact), capsys)
    # score streams its input in shards, located by byte offset (the third line's)
    where = f"{data}:3: " if command != "score" else \
        f"{data}:byte {sum(len(json.dumps(r)) + 1 for r in good_lines[:2])}: "
    assert where + words in err, err
    assert not _written(out)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("relevant", BIG, "relevant == an integer of 401 digits"),
     ("evidence", [[0, BIG]], "evidence[0][1] == an integer of 401 digits"),
     ("start", BIG, "start == an integer of 401 digits"),
     ("meta", {"scores": [0.5, -BIG]}, "meta.scores[1] == an integer of 401 digits"),
     ("answers", ["ok", "\ud83d"], "answers[1] holds a lone UTF-16 surrogate U+D83D"),
     ("group", "g\ufeff", "group == 'g\\ufeff' holds the zero-width character U+FEFF"),
     ("doc_id", "d\u200f", "doc_id == 'd\\u200f' holds the bidirectional control character")],
    ids=["relevant", "evidence", "offset", "nested", "answers", "group", "doc_id"])
def test_every_field_is_read_alike(tmp_path: Path, good_lines: list[dict[str, Any]], key: str,
                                  value: Any, words: str) -> None:
    """A number beyond a double in any field, a lone surrogate in any string and a bidi /
    zero-width character in any id: the field and the rule, not the 401 digits."""
    data = _hostile_file(tmp_path, good_lines, lambda r: json.dumps({**r, key: value}))
    with pytest.raises(DataError) as info:
        read_pairs(data)
    assert str(info.value).startswith(f"{data}:3: {words}"), str(info.value)
    assert BIG_TEXT not in str(info.value)


def test_a_pair_that_would_not_read_back_is_not_written(tmp_path: Path) -> None:
    pair = Pair("q", "Who?", "s", "Ada.", 1, meta={"count": BIG})
    with pytest.raises(DataError, match=r"pair #1: count == an integer of 401 digits"):
        write_pairs([pair], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


# ---------------------------------------------------------------------------- Parquet
def _parquet(directory: Path, records: list[dict[str, Any]], column: str, value: Any) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    names = ["query_id", "query", "snippet_id", "text", "relevant", "group", "bm25", "meta"]
    data: dict[str, list[Any]] = {n: [r.get(n) for r in records] for n in names}
    data["meta"] = [None] * len(records)
    data[column][2] = value
    types = {"relevant": pa.int8(), "bm25": pa.float64()}
    arrays = {n: pa.array([v.encode("utf-8") if isinstance(v, str) else v for v in data[n]],
                          type=pa.binary()) if n != "relevant" and n != "bm25"
              else pa.array(data[n], type=types[n]) for n in names}
    # bytes as strings unchecked: a cell may hold what no Python str can (an encoded surrogate)
    columns = {n: pa.Array.from_buffers(pa.string(), len(a), a.buffers())
               if a.type == pa.binary() else a for n, a in arrays.items()}
    path = directory / "hostile.parquet"
    pq.write_table(pa.table(columns), path)
    return path


PARQUET_CASES = [
    ("U+202E in snippet_id", "snippet_id", "ab\u202ecd",
     "snippet_id == 'ab\\u202ecd' holds the bidirectional control character U+202E"),
    ("401-digit integer in meta", "meta", '{"bm25_raw": ' + BIG_TEXT + "}",
     "column 'meta': bm25_raw == an integer of 401 digits"),
    ("100,000-deep meta", "meta", '{"x": ' + NESTED + "}",
     "column 'meta': x nests arrays and objects more than 64 deep"),
    ("lone surrogate in meta", "meta", '{"note": "a\\ud800"}',
     "column 'meta': note holds a lone UTF-16 surrogate U+D800 at position 1"),
    ("encoded lone surrogate in text", "text", b"ab\xed\xa0\x80",
     "column 'text' is not valid UTF-8"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("case", "column", "value", "words"), PARQUET_CASES,
                         ids=[c[0] for c in PARQUET_CASES])
def test_hostile_parquet_row_is_one_line_exit_2_naming_file_and_row(
        tmp_path: Path, good_lines: list[dict[str, Any]], bm25_artifact: Path, command: str,
        case: str, column: str, value: Any, words: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _parquet(tmp_path, good_lines, column, value)
    out = tmp_path / "out"
    out.mkdir()
    err = _one_line_error(_command(command, data, out, bm25_artifact), capsys)
    assert f"{data}:row 3: {words}" in err, err
    assert not _written(out)


# ---------------------------------------------------------------------------- queries
@pytest.mark.parametrize(
    ("line", "words"),
    [('{"query_id": ' + BIG_TEXT + ', "query": "x"}', "query_id == an integer of 401 digits"),
     ('{"query_id": "q2", "query": "x", "m": ' + NESTED + "}", "m nests arrays and objects more"),
     ('{"query_id": "q2", "query": "who\\ud800?"}', "query holds a lone UTF-16 surrogate U+D800"),
     ('{"query_id": "q2", "query": "x", "answers": ["\\udc00"]}', "answers[0] holds a lone"),
     ('{"query_id": "q2\u202e", "query": "x"}', "query_id == 'q2\\u202e' holds the bidi"),
     ('{"query_id": "q2", "query": "x", "relevant_doc_ids": ["d\u200d"]}',
      "relevant_doc_ids[0] == 'd\\u200d' holds the zero-width character U+200D")],
    ids=["401-digit id", "deep", "surrogate query", "surrogate answer", "U+202E id",
         "U+200D doc id"])
def test_labelled_queries_refuse_the_same(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_text('{"query_id": "q1", "query": "Who?"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_queries(path)
    assert str(info.value).startswith(f"{path}:2: {words}"), str(info.value)


# ---------------------------------------------------------------------------- library
def test_numeric_checks_refuse_a_401_digit_integer_without_overflow() -> None:
    from ragsieve._validation import is_finite_number

    assert not is_finite_number(BIG) and is_finite_number(10**300)
    with pytest.raises(ValueError, match=r"alpha == an integer of 401 digits, must be in \(0, 1\)"):
        check_alpha(BIG)
    with pytest.raises(ValueError, match="beyond the range of a double"):
        check_scores([0.5, BIG])
