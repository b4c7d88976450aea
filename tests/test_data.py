"""Tests of ragsieve.data: the JSONL format, paths/downloads, loaders, registry."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragsieve.data as rd
from ragsieve.chunking import Chunker
from ragsieve.data import (
    cache_dir,
    data_dir,
    describe_pairs,
    fingerprint_pairs,
    group_by_query,
    iter_pairs,
    load_dataset,
    load_selqa,
    load_xquad,
    read_pairs,
    resolve_dataset_file,
    write_pairs,
)
from ragsieve.data import paths as paths_mod
from ragsieve.data.selqa import SELQA_SHA256, is_relevant
from ragsieve.data.xquad import XQUAD_SHA256
from ragsieve.errors import DataError
from ragsieve.types import Pair, Snippet
from ragsieve.units import sentence_pairs


def _line(**kw: object) -> str:
    record: dict[str, object] = {
        "query_id": "q1",
        "query": "Who?",
        "snippet_id": "s1",
        "text": "Ada.",
    }
    record.update(kw)
    return json.dumps({k: v for k, v in record.items() if v is not _DROP})


_DROP = object()


def _write(tmp_path: Path, *lines: str, name: str = "pairs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ============================================================================ JSONL read


def test_read_valid_file_defaults_and_meta(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        _line(relevant=1, group="topic", extra={"a": [1, 2]}),
        "",
        "   ",
        _line(snippet_id="s2", text="Bob.", relevant=False),
        _line(snippet_id="s3", text="Cy.", relevant=None, group=""),
        _line(snippet_id="s4", text="Di.", relevant=_DROP, group=None),
        _line(query_id=7, query="Why?", snippet_id=8, relevant=True, group=3),
    )
    pairs = read_pairs(path)
    assert [p.relevant for p in pairs] == [1, 0, None, None, 1]
    assert [p.group for p in pairs] == ["topic", "q1", "q1", "q1", "3"]
    assert pairs[0].meta == {"extra": {"a": [1, 2]}}
    assert pairs[1].meta == {}
    assert (pairs[4].query_id, pairs[4].snippet_id) == ("7", "8")
    assert all(
        isinstance(p.relevant, (int, type(None))) and not isinstance(p.relevant, bool)
        for p in pairs
    )
    assert list(iter_pairs(path)) == pairs


def test_read_accepts_bom_crlf_and_streams(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + _line(relevant=1).encode() + b"\r\n" + _line(snippet_id="s2").encode()
    )
    assert [p.snippet_id for p in read_pairs(path)] == ["s1", "s2"]
    stream = io.StringIO(_line(text="Zoë – 東京", relevant=0))
    assert read_pairs(stream)[0].text == "Zoë – 東京"


BAD_LINES = {
    "malformed-json": ('{"query_id": "q1", "query": ', "malformed JSON"),
    "trailing-garbage": (_line() + " x", "malformed JSON"),
    "not-an-object-list": ("[1, 2]", "expected a JSON object"),
    "not-an-object-string": ('"q1"', "expected a JSON object"),
    "not-an-object-number": ("3", "expected a JSON object"),
    "missing-query_id": (_line(query_id=_DROP), "missing required key 'query_id'"),
    "missing-query": (_line(query=_DROP), "missing required key 'query'"),
    "missing-snippet_id": (_line(snippet_id=_DROP), "missing required key 'snippet_id'"),
    "missing-text": (_line(text=_DROP), "missing required key 'text'"),
    "null-text": (_line(text=None), "missing required key 'text'"),
    "empty-query_id": (_line(query_id=""), "query_id is empty"),
    "empty-query": (_line(query="  "), "query is empty"),
    "empty-snippet_id": (_line(snippet_id=""), "snippet_id is empty"),
    "empty-text": (_line(text=""), "text is empty"),
    "query-not-string": (_line(query=5), "query == 5 (int), must be a string"),
    "text-list": (_line(text=["a"]), "text == ['a'] (list), must be a string"),
    "id-float": (_line(query_id=1.5), "query_id == 1.5 (float), must be a string or an integer"),
    "id-bool": (_line(snippet_id=True), "snippet_id == True (bool)"),
    "relevant-yes": (_line(relevant="yes"), "relevant == 'yes' (str), must be one of 0, 1"),
    "relevant-0.7": (_line(relevant=0.7), "relevant == 0.7 (float)"),
    "relevant-1.0": (_line(relevant=1.0), "relevant == 1.0 (float)"),
    "relevant-2": (_line(relevant=2), "relevant == 2 (int)"),
    "relevant-minus-1": (_line(relevant=-1), "relevant == -1 (int)"),
    "relevant-string-1": (_line(relevant="1"), "relevant == '1' (str)"),
    "group-list": (_line(group=["t"]), "group == ['t'] (list)"),
    "nan-in-meta": (_line(score=float("nan")), "NaN is not valid JSON"),
    "duplicate-key": ('{"query_id": "q1", "query_id": "q2", "query": "a", "snippet_id": "s", "text": "t"}',
                      "duplicate key 'query_id'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_read_rejects_bad_line_with_file_and_line_number(tmp_path: Path, case: str) -> None:
    bad, message = BAD_LINES[case]
    path = _write(tmp_path, _line(snippet_id="ok", relevant=1), "", bad)
    with pytest.raises(DataError) as info:
        read_pairs(path)
    assert f"{path}:3:" in str(info.value)
    assert message in str(info.value)


def test_read_rejects_duplicate_pair(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(relevant=1), _line(snippet_id="s2"), _line(relevant=0))
    with pytest.raises(
        DataError, match=r":3: duplicate pair query_id='q1', snippet_id='s1' \(first seen at .*:1\)"
    ):
        read_pairs(path)


def test_read_duplicate_numeric_and_string_ids_collide(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(query_id=1, snippet_id=2), _line(query_id="1", snippet_id="2"))
    with pytest.raises(DataError, match=":2: duplicate pair"):
        read_pairs(path)


def test_read_same_snippet_for_two_queries_is_fine(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(), _line(query_id="q2", query="Where?"))
    assert [p.query_id for p in read_pairs(path)] == ["q1", "q2"]


def test_read_rejects_inconsistent_query_text(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(), _line(snippet_id="s2", query="Who else?"))
    with pytest.raises(
        DataError, match=r":2: query_id 'q1' has query text 'Who else\?', but .*:1 gave 'Who\?'"
    ):
        read_pairs(path)


def test_answers_and_nuggets_round_trip_through_export(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        _line(answers=["Ada Lovelace", "Lovelace"], nuggets=["Ada wrote the first program"]),
        _line(snippet_id="s2", text="Bob.", answers=["Ada Lovelace", "Lovelace"]),
        _line(query_id="q2", query="Where?", snippet_id="s3", text="Here."),
    )
    pairs = read_pairs(path)
    assert pairs[0].meta["answers"] == ["Ada Lovelace", "Lovelace"]
    assert pairs[0].meta["nuggets"] == ["Ada wrote the first program"]
    assert "answers" not in pairs[2].meta
    out = tmp_path / "out.jsonl"
    write_pairs(pairs, out)
    again = read_pairs(out)
    assert [p.meta.get("answers") for p in again] == [p.meta.get("answers") for p in pairs]
    assert again[0].meta["nuggets"] == ["Ada wrote the first program"]


@pytest.mark.parametrize("value", ["Ada", [], [""], ["  "], [1], {"a": 1}, [["Ada"]]])
@pytest.mark.parametrize("key", ["answers", "nuggets"])
def test_read_rejects_malformed_answers(tmp_path: Path, key: str, value: object) -> None:
    path = _write(tmp_path, _line(**{key: value}))
    with pytest.raises(DataError, match=rf":1: {key} == .*must be a non-empty list of non-empty strings"):
        read_pairs(path)


def test_read_rejects_two_answer_lists_for_one_query(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(answers=["Ada"]), _line(snippet_id="s2", answers=["Bob"]))
    with pytest.raises(DataError, match=r":2: query_id 'q1' has answers \['Bob'\], but .*:1 gave"):
        read_pairs(path)


def test_read_null_answers_is_absent(tmp_path: Path) -> None:
    path = _write(tmp_path, _line(answers=None), _line(snippet_id="s2", answers=["Ada"]))
    assert [p.meta.get("answers") for p in read_pairs(path)] == [None, ["Ada"]]


def test_read_rejects_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        _line().encode()
        + b"\n"
        + _line(snippet_id="s2", text="cafX").encode().replace(b"X", b"\xe9")
        + b"\n"
    )
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: bytes are not valid UTF-8"):
        read_pairs(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_read_rejects_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="empty.jsonl: contains no pairs"):
        read_pairs(path)


def test_read_rejects_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.jsonl: no such file"):
        read_pairs(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        read_pairs(tmp_path)


def test_read_rejects_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot be read"):  # ENAMETOOLONG, even for root
        read_pairs(tmp_path / ("x" * 300 + ".jsonl"))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read any file")
def test_read_rejects_file_without_permission(tmp_path: Path) -> None:
    path = _write(tmp_path, _line())
    path.chmod(0)
    with pytest.raises(DataError, match="cannot be read"):
        read_pairs(path)


def test_require_labels(tmp_path: Path) -> None:
    labelled = _write(
        tmp_path, _line(relevant=1), _line(snippet_id="s2", relevant=False), name="a.jsonl"
    )
    assert [p.relevant for p in read_pairs(labelled, require_labels=True)] == [1, 0]
    for value in (None, _DROP):
        path = _write(
            tmp_path, _line(relevant=1), _line(snippet_id="s2", relevant=value), name="b.jsonl"
        )
        assert read_pairs(path)[1].relevant is None
        with pytest.raises(
            DataError, match=r"b\.jsonl:2: 'relevant' is missing or null, but labels are required"
        ):
            read_pairs(path, require_labels=True)


# ============================================================================ JSONL write


def _pairs() -> list[Pair]:
    return [
        Pair("q1", "Who?", "s1", "Ada.", 1, "t", {"start": 0, "nested": {"x": [1, None]}}),
        Pair("q1", "Who?", "s2", "Bob — 東京", 0, "t"),
        Pair("q2", "Why?", "s1", "Ada.", None),
    ]


def test_write_read_round_trip_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    assert write_pairs(_pairs(), path) == 3
    back = read_pairs(path)
    assert back == _pairs()
    assert [p.meta for p in back] == [p.meta for p in _pairs()]
    assert back[2].group == "q2"
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert list(first)[:6] == ["query_id", "query", "snippet_id", "text", "relevant", "group"]
    assert "東京" in path.read_text(encoding="utf-8")  # stored as UTF-8, not \u escapes
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's 0600


def test_write_to_file_object_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    assert write_pairs(_pairs(), buffer) == 3
    assert read_pairs(io.StringIO(buffer.getvalue())) == _pairs()
    assert write_pairs(iter(_pairs()), "-") == 3
    assert capsys.readouterr().out == buffer.getvalue()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Pair("q1", "Who?", "s1", "Ada.", 2), "relevant == 2"),
        (Pair("q1", "Who?", "s1", "", 1), "text is empty"),
        (Pair("q1", "Who?", "s1", "Dup.", 0), "duplicate pair"),
        (Pair("q1", "Other?", "s9", "Ada.", 0), "has query text"),
        (Pair("q3", "?", "s1", "x", 0, meta={"group": "g"}), "clash with standard fields"),
        (Pair("q3", "?", "s1", "x", 0, meta={"f": {1, 2}}), "not JSON-serialisable"),
        (Pair("q3", "?", "s1", "x", 0, meta={"f": float("nan")}), "not JSON-serialisable"),
    ],
)
def test_write_rejects_what_would_not_read_back_and_is_atomic(
    tmp_path: Path, bad: Pair, message: str
) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("previous content\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        write_pairs([*_pairs(), bad], path)
    assert path.read_text(encoding="utf-8") == "previous content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_write_rejects_non_pairs_and_bad_destination(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="expects Pair objects, got dict"):
        write_pairs([{"query_id": "q"}], tmp_path / "x.jsonl")  # type: ignore[list-item]
    with pytest.raises(DataError, match="does not exist"):
        write_pairs(_pairs(), tmp_path / "missing" / "x.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        write_pairs(_pairs(), tmp_path)


_ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8).filter(
    lambda s: bool(s.strip())
)
_printable_ids = st.text(  # ids hold no control, bidi or zero-width characters (refused)
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp")),
    min_size=1, max_size=8,
).filter(lambda s: bool(s.strip()))
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _ids,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ids, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _pair_lists(draw: st.DrawFn) -> list[Pair]:
    n = draw(st.integers(1, 8))
    queries = {qid: draw(_ids)
               for qid in draw(st.lists(_printable_ids, min_size=1, max_size=3, unique=True))}
    out: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(n):
        qid = draw(st.sampled_from(sorted(queries)))
        sid = draw(_printable_ids)
        if (qid, sid) in seen:
            continue
        seen.add((qid, sid))
        meta = draw(
            st.dictionaries(
                _ids.filter(
                    lambda k: (
                        k not in ("query_id", "query", "snippet_id", "text", "relevant", "group",
                                  "doc_id")
                    )
                ),
                _json_values,
                max_size=3,
            )
        )
        out.append(
            Pair(
                qid,
                queries[qid],
                sid,
                draw(_ids),
                draw(st.sampled_from([0, 1, None])),
                draw(st.just("") | _printable_ids),
                meta,
            )
        )
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=_pair_lists())
def test_round_trip_property(tmp_path: Path, pairs: list[Pair]) -> None:
    path = tmp_path / "prop.jsonl"
    assert write_pairs(pairs, path) == len(pairs)
    back = read_pairs(path)
    assert back == pairs
    assert [dict(p.meta) for p in back] == [dict(p.meta) for p in pairs]
    assert fingerprint_pairs(back) == fingerprint_pairs(pairs)


# ============================================================================ helpers


def test_fingerprint_is_order_free_and_label_sensitive() -> None:
    pairs = _pairs()
    fp = fingerprint_pairs(pairs)
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert fingerprint_pairs(reversed(pairs)) == fp
    assert (
        fp
        == hashlib.sha256(
            "".join(
                sorted(
                    json.dumps(
                        [p.query_id, p.snippet_id, p.text, p.relevant],
                        ensure_ascii=False,
                        separators=(",", ":"),
                    )
                    + "\n"
                    for p in pairs
                )
            ).encode()
        ).hexdigest()
    )
    relabelled = [Pair("q1", "Who?", "s1", "Ada.", 0, "t"), *pairs[1:]]
    assert fingerprint_pairs(relabelled) != fp
    edited = [*pairs[:2], Pair("q2", "Why?", "s1", "Ada!", None)]
    assert fingerprint_pairs(edited) != fp
    regrouped = [
        Pair(p.query_id, p.query, p.snippet_id, p.text, p.relevant, "other", {"m": 1})
        for p in pairs
    ]
    assert fingerprint_pairs(regrouped) == fp
    assert fingerprint_pairs(pairs[:2]) != fp


def test_group_by_query_and_describe() -> None:
    pairs = [*_pairs(), Pair("q1", "Who?", "s3", "Cy.", 1)]
    assert group_by_query(pairs) == {"q1": [0, 1, 3], "q2": [2]}
    d = describe_pairs(pairs)
    assert d["n_queries"] == 2 and d["n_pairs"] == 4 and d["n_snippets"] == 3
    assert d["n_relevant"] == 2 and d["n_unlabelled"] == 1 and d["queries_without_relevant"] == 1
    assert d["snippets_per_query"] == 2.0 and d["relevant_per_query"] == 1.0


# ============================================================================ paths


def test_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    env.mkdir()
    shared = tmp_path / "shared" / "datasets"
    shared.mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("RAGSIEVE_DATA", str(env))
    assert data_dir(explicit) == explicit
    assert data_dir(str(explicit)) == explicit
    assert data_dir() == env
    monkeypatch.delenv("RAGSIEVE_DATA")
    assert data_dir() == shared.resolve()  # ../shared/datasets from the working directory
    monkeypatch.chdir(tmp_path)  # no ../shared/datasets here: falls back to the repo root
    root = paths_mod._repo_root()
    assert root is not None and (root / "pyproject.toml").is_file()
    expected = (root.parent / "shared" / "datasets").resolve()
    assert data_dir() == (expected if expected.is_dir() else None)


def test_data_dir_rejects_bad_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataError, match="is not a directory"):
        data_dir(tmp_path / "missing")
    monkeypatch.setenv("RAGSIEVE_DATA", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="RAGSIEVE_DATA == .* is not a directory"):
        data_dir()


def test_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("RAGSIEVE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ragsieve"


class _Server:
    """A real HTTP server on 127.0.0.1 serving files from a directory, counting requests."""

    def __init__(self, root: Path) -> None:
        outer = self
        self.requests: list[str] = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[_Server]:
    root = tmp_path / "served"
    root.mkdir()
    (root / "file.json").write_bytes(b'{"hello": "world"}\n')
    srv = _Server(root)
    yield srv
    srv.close()


@pytest.fixture()
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty data dir via RAGSIEVE_DATA and an empty cache via RAGSIEVE_CACHE."""
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("RAGSIEVE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    return tmp_path


GOOD = hashlib.sha256(b'{"hello": "world"}\n').hexdigest()


def test_download_good_checksum_is_cached(isolated: Path, server: _Server) -> None:
    url = f"{server.url}/file.json"
    path = resolve_dataset_file("demo/file.json", url=url, sha256=GOOD)
    assert path == isolated / "cache" / "datasets" / "demo" / "file.json"
    assert path.read_bytes() == b'{"hello": "world"}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.json"]
    again = resolve_dataset_file("demo/file.json", url=url, sha256=GOOD, download=False)
    assert again == path and server.requests == ["/file.json"]


def test_download_bad_checksum_raises_and_leaves_nothing(isolated: Path, server: _Server) -> None:
    bad = "0" * 64
    with pytest.raises(DataError) as info:
        resolve_dataset_file("demo/file.json", url=f"{server.url}/file.json", sha256=bad)
    assert GOOD in str(info.value) and bad in str(info.value)
    assert "RAGSIEVE_DATA" in str(info.value)
    folder = isolated / "cache" / "datasets" / "demo"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_download_without_pinned_checksum_warns(
    isolated: Path, server: _Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragsieve.data.paths"):
        path = resolve_dataset_file("demo/file.json", url=f"{server.url}/file.json", sha256=None)
    assert path.is_file()
    assert "no pinned checksum" in caplog.text and GOOD in caplog.text


def test_download_http_error_and_offline(isolated: Path, server: _Server) -> None:
    with pytest.raises(DataError, match=r"download of .*/missing\.json failed .*404"):
        resolve_dataset_file("demo/missing.json", url=f"{server.url}/missing.json", sha256=GOOD)
    with pytest.raises(DataError) as info:
        resolve_dataset_file(
            "demo/file.json", url=f"{server.url}/file.json", sha256=GOOD, download=False
        )
    message = str(info.value)
    assert "download=False" in message and "RAGSIEVE_DATA" in message
    assert str(isolated / "data" / "demo" / "file.json") in message
    assert str(isolated / "cache" / "datasets" / "demo" / "file.json") in message
    assert server.requests == ["/missing.json"]


def test_corrupt_cache_entry_is_replaced(isolated: Path, server: _Server) -> None:
    cached = isolated / "cache" / "datasets" / "demo" / "file.json"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"truncated")
    path = resolve_dataset_file("demo/file.json", url=f"{server.url}/file.json", sha256=GOOD)
    assert path == cached and sha256_hex(path) == GOOD and len(server.requests) == 1


def test_data_dir_file_wins_and_mismatch_only_warns(
    isolated: Path, server: _Server, caplog: pytest.LogCaptureFixture
) -> None:
    local = isolated / "data" / "demo" / "file.json"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"my newer version")
    with caplog.at_level(logging.WARNING, logger="ragsieve.data.paths"):
        path = resolve_dataset_file("demo/file.json", url=f"{server.url}/file.json", sha256=GOOD)
    assert path == local and "using it anyway" in caplog.text
    assert server.requests == []


@pytest.mark.parametrize("relpath", ["", "/etc/passwd", "../x.json", "a/../../x.json"])
def test_resolve_rejects_paths_outside_data_dir(isolated: Path, relpath: str) -> None:
    with pytest.raises(DataError, match="must be a relative path"):
        resolve_dataset_file(relpath, url="http://127.0.0.1:9/x", sha256=None, download=False)


def sha256_hex(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ============================================================================ real datasets


@pytest.fixture(scope="module")
def shared() -> Path:
    root = data_dir()
    if root is None:
        pytest.skip(
            "no data directory: set RAGSIEVE_DATA or provide ../shared/datasets next to the "
            "working directory or the repository"
        )
    return root


def _require(root: Path, relpath: str) -> Path:
    path = root / relpath
    if not path.is_file():
        pytest.skip(f"{path} is not in the data directory")
    return path


def test_pinned_checksums_match_local_files(shared: Path) -> None:
    for lang, digest in XQUAD_SHA256.items():
        assert paths_mod.sha256_file(_require(shared, f"xquad/xquad.{lang}.json")) == digest
    for split, digest in SELQA_SHA256.items():
        assert paths_mod.sha256_file(_require(shared, f"selqa/selqa-ass-{split}.json")) == digest


def _xquad_raw(shared: Path, lang: str) -> dict[str, tuple[str, str, dict[str, str], list[dict]]]:
    """qa id -> (title, own doc id, {doc id: paragraph} of the article, answers)."""
    raw = json.loads(_require(shared, f"xquad/xquad.{lang}.json").read_text(encoding="utf-8"))
    out = {}
    for article in raw["data"]:
        docs = {
            f"{article['title']}/{i}": p["context"] for i, p in enumerate(article["paragraphs"])
        }
        for i, p in enumerate(article["paragraphs"]):
            for qa in p["qas"]:
                out[qa["id"]] = (article["title"], f"{article['title']}/{i}", docs, qa["answers"])
    return out


@pytest.fixture(scope="module")
def xquad_en(shared: Path) -> list[Pair]:
    _require(shared, "xquad/xquad.en.json")
    return load_xquad("en", data_dir=shared, download=False)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_xquad_labels_offsets_and_lists(shared: Path, xquad_en: list[Pair], lang: str) -> None:
    pairs = xquad_en if lang == "en" else load_xquad(lang, data_dir=shared, download=False)
    raw = _xquad_raw(shared, lang)
    by_query = group_by_query(pairs)
    assert len(by_query) == len(raw) == 1190
    assert len({p.group for p in pairs}) == 48
    for qid, idx in by_query.items():
        assert qid.startswith(f"xquad-{lang}-")
        title, own, docs, answers = raw[qid.removeprefix(f"xquad-{lang}-")]
        group = [pairs[i] for i in idx]
        # Article context: the list is every snippet of every paragraph of the article.
        assert {p.meta["doc_id"] for p in group} == set(docs)
        assert len({p.snippet_id for p in group}) == len(group)
        spans = [(a["answer_start"], a["answer_start"] + len(a["text"])) for a in answers]
        for p in group:
            m = p.meta
            assert p.group == title and m["language"] == lang
            assert docs[m["doc_id"]][m["start"] : m["end"]] == p.text
            assert p.snippet_id == f"{m['doc_id']}:{m['start']}-{m['end']}"
            overlaps = m["doc_id"] == own and any(m["start"] < e and s < m["end"] for s, e in spans)
            assert p.relevant == int(overlaps)
            # Evidence: where the answer stands in a relevant snippet, in its offsets.
            assert ("evidence" in m) == bool(p.relevant)
            for a, b in m.get("evidence", []):
                assert 0 <= a < b <= len(p.text)
                assert any(p.text[a:b] in t["text"] for t in answers)
        relevant = [p for p in group if p.relevant == 1]
        assert relevant, f"{qid} has no relevant snippet"
        # The answer text itself lies inside a relevant snippet.
        assert any(a["text"] in p.text for a in answers for p in relevant)
    d = describe_pairs(pairs)
    assert d["queries_without_relevant"] == 0 and d["n_unlabelled"] == 0


def test_xquad_evidence_is_the_answers_sentence_not_every_sentence_with_its_words(
        xquad_en: list[Pair], caplog: pytest.LogCaptureFixture) -> None:
    """The answer's span is the evidence: in a snippet whose two sentences both name the
    answer, only the sentence the data set's answer offset points into (the one that says
    who was suspended) is the evidence sentence; by the answer's words both would be. Over
    the data set the spans mark fewer sentences than the words, and always one (no snippet
    falls back to counting all its sentences)."""
    pair = next(p for p in xquad_en
                if p.query == "Which team was suspended from the MLS?" and p.relevant)
    assert pair.meta["answers"] == ["Chivas"] and pair.text.count("Chivas") == 2
    sentences = sentence_pairs([pair])
    assert [s.relevant for s in sentences] == [0, 1]
    assert "Chivas were suspended" in sentences[1].text

    def by_words(p: Pair) -> Pair:
        return dataclasses.replace(p, meta={k: v for k, v in p.meta.items() if k != "evidence"})

    assert [s.relevant for s in sentence_pairs([by_words(pair)])] == [1, 1]
    relevant = [p for p in xquad_en if p.relevant == 1]
    with caplog.at_level(logging.WARNING, logger="ragsieve.units"):
        spans = [[s.relevant for s in sentence_pairs([p])] for p in relevant]
    assert not [r for r in caplog.records if "no sentence marked" in r.getMessage()]
    words = [[s.relevant for s in sentence_pairs([by_words(p)], warn_unmarked=False)]
             for p in relevant]
    assert sum(map(sum, spans)) < sum(map(sum, words))


def test_xquad_paragraph_context_and_chunker(shared: Path, xquad_en: list[Pair]) -> None:
    para = load_xquad("en", data_dir=shared, context="paragraph", download=False)
    raw = _xquad_raw(shared, "en")
    for qid, idx in group_by_query(para).items():
        own = raw[qid.removeprefix("xquad-en-")][1]
        assert {para[i].meta["doc_id"] for i in idx} == {own}
    # Same labels on the own paragraph as in article context.
    article_relevant = {(p.query_id, p.snippet_id) for p in xquad_en if p.relevant}
    assert {(p.query_id, p.snippet_id) for p in para if p.relevant} == article_relevant
    assert len(para) < len(xquad_en)

    small = load_xquad("en", data_dir=shared, chunker=Chunker(size=200, overlap=40), download=False)
    assert max(len(p.text) for p in small) <= 200
    assert len({p.snippet_id for p in small}) > len({p.snippet_id for p in xquad_en})
    assert describe_pairs(small)["queries_without_relevant"] == 0


def test_xquad_languages_have_distinct_query_ids(shared: Path, xquad_en: list[Pair]) -> None:
    _require(shared, "xquad/xquad.de.json")
    de = load_xquad("de", data_dir=shared, download=False)
    assert not {p.query_id for p in de} & {p.query_id for p in xquad_en}
    assert {p.group for p in de} == {p.group for p in xquad_en}  # titles are shared


def test_xquad_round_trip_through_jsonl(tmp_path: Path, xquad_en: list[Pair]) -> None:
    path = tmp_path / "xquad-en.jsonl"
    assert write_pairs(xquad_en, path) == len(xquad_en)
    back = read_pairs(path, require_labels=True)
    assert back == xquad_en
    assert [dict(p.meta) for p in back] == [dict(p.meta) for p in xquad_en]
    assert fingerprint_pairs(back) == fingerprint_pairs(xquad_en)
    assert load_dataset(path) == xquad_en and load_dataset(str(path)) == xquad_en


def test_xquad_argument_errors(shared: Path) -> None:
    with pytest.raises(ValueError, match="language == 'fr', must be one of ar, de"):
        load_xquad("fr", data_dir=shared)
    with pytest.raises(ValueError, match="context == 'doc', must be one of article, paragraph"):
        load_xquad("en", data_dir=shared, context="doc")


def test_xquad_misaligned_answers_are_fixed_or_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    context = "Alpha beta gamma. Delta epsilon zeta. " * 20
    squad = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [
        {"id": "ok", "question": "q1?", "answers": [{"answer_start": 6, "text": "beta"}]},
        {"id": "moved", "question": "q2?", "answers": [{"answer_start": 700, "text": "epsilon"}]},
        {"id": "absent", "question": "q3?", "answers": [{"answer_start": 0, "text": "omega"}]},
    ]}]}]}  # fmt: skip
    (tmp_path / "xquad").mkdir()
    (tmp_path / "xquad" / "xquad.en.json").write_text(json.dumps(squad), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="ragsieve.data"):
        pairs = load_xquad(
            "en", data_dir=tmp_path, chunker=Chunker(size=120, overlap=20), download=False
        )
    assert "using it anyway" in caplog.text  # not the pinned file
    assert "1 answer spans re-located" in caplog.text
    assert (
        "1 answers not found" in caplog.text
        and "1 questions left without any answer" in caplog.text
    )
    by_query = group_by_query(pairs)
    assert list(by_query) == ["xquad-en-ok", "xquad-en-moved"]
    nearest = min(
        (i for i in range(len(context)) if context.startswith("epsilon", i)),
        key=lambda i: abs(i - 700),
    )
    moved = [pairs[i] for i in by_query["xquad-en-moved"] if pairs[i].relevant]
    assert moved and all(p.meta["start"] < nearest + 7 and nearest < p.meta["end"] for p in moved)
    ok = [pairs[i] for i in by_query["xquad-en-ok"] if pairs[i].relevant]
    assert [p.meta["start"] for p in ok] == [0]


def test_malformed_dataset_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "xquad").mkdir()
    (tmp_path / "selqa").mkdir()
    (tmp_path / "xquad" / "xquad.en.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(DataError, match="expected SQuAD v1.1 JSON"):
        load_xquad("en", data_dir=tmp_path, download=False)
    (tmp_path / "xquad" / "xquad.en.json").write_text("{oops", encoding="utf-8")
    with pytest.raises(DataError, match="cannot be read as UTF-8 JSON"):
        load_xquad("en", data_dir=tmp_path, download=False)
    item = {
        "question": "Q?",
        "topic": "ART",
        "article": "A",
        "section": "S",
        "candidates": ["One."],
        "answers": [3],
    }
    (tmp_path / "selqa" / "selqa-ass-dev.json").write_text(json.dumps([item]), encoding="utf-8")
    with pytest.raises(DataError, match=r"question #0: 'answers' == \[3\], must be indices"):
        load_selqa("dev", data_dir=tmp_path, download=False)
    del item["topic"]
    (tmp_path / "selqa" / "selqa-ass-dev.json").write_text(json.dumps([item]), encoding="utf-8")
    with pytest.raises(DataError, match="missing key 'topic'"):
        load_selqa("dev", data_dir=tmp_path, download=False)


def test_missing_dataset_offline_names_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError, match=r"'selqa/selqa-ass-test.json' not found .*RAGSIEVE_DATA"):
        load_selqa("test", data_dir=tmp_path, download=False)
    with pytest.raises(ValueError, match="split == 'val', must be one of train, dev, test"):
        load_selqa("val", data_dir=tmp_path)


# ---------------------------------------------------------------------------- SelQA


def _snip(start: int, end: int) -> Snippet:
    return Snippet("d", start, end, "x" * (end - start))


def test_selqa_relevance_rule() -> None:
    sentence = [(100, 200)]  # a 100-character answer sentence
    assert is_relevant(_snip(0, 150), sentence)  # holds exactly half
    assert not is_relevant(_snip(0, 149), sentence)  # holds 49 characters
    assert not is_relevant(_snip(180, 600), sentence)  # neighbour sharing 20 characters
    assert is_relevant(_snip(90, 210), sentence)
    assert not is_relevant(_snip(200, 300), sentence)  # touching is not overlapping
    long_sentence = [(0, 1000)]  # longer than any snippet: windows inside it are relevant
    assert is_relevant(_snip(300, 700), long_sentence)
    assert is_relevant(_snip(800, 1200), long_sentence)  # 200 of 400 characters
    assert not is_relevant(_snip(900, 1300), long_sentence)  # 100 of 400 characters
    assert not is_relevant(_snip(0, 100), [])


def test_selqa_dev(shared: Path) -> None:
    raw = json.loads(_require(shared, "selqa/selqa-ass-dev.json").read_text(encoding="utf-8"))
    pairs = load_selqa("dev", data_dir=shared, download=False)
    by_query = group_by_query(pairs)
    assert list(by_query) == [f"selqa-dev-{i}" for i in range(len(raw))] and len(raw) == 785
    topics = {p.group for p in pairs}
    assert topics == {q["topic"] for q in raw} and len(topics) == 10
    for i, q in enumerate(raw):
        document = " ".join(q["candidates"])
        group = [pairs[j] for j in by_query[f"selqa-dev-{i}"]]
        spans, pos = [], 0
        for c in q["candidates"]:
            spans.append((pos, pos + len(c)))
            pos += len(c) + 1
        answer_spans = []
        for a in q["answers"]:
            s = spans[a][0]
            s += len(q["candidates"][a]) - len(q["candidates"][a].lstrip())
            answer_spans.append((s, s + len(q["candidates"][a].strip())))
        for p in group:
            m = p.meta
            assert (m["topic"], m["article"], m["section"]) == (
                q["topic"],
                q["article"],
                q["section"],
            )
            assert m["doc_id"] == f"{q['article']}/{q['section']}" and p.group == q["topic"]
            assert document[m["start"] : m["end"]] == p.text and p.query == q["question"]
            shared_chars = [max(0, min(e, m["end"]) - max(s, m["start"])) for s, e in answer_spans]
            expected = any(
                c > 0 and 2 * c >= min(e - s, m["end"] - m["start"])
                for c, (s, e) in zip(shared_chars, answer_spans)
            )
            assert p.relevant == int(expected)
        relevant = [p.text for p in group if p.relevant]
        assert relevant, f"question {i} has no relevant snippet"
        # Short answer sentences lie whole inside a relevant snippet.
        for a in q["answers"]:
            sentence = q["candidates"][a].strip()
            if 0 < len(sentence) <= 100:
                assert any(sentence in r for r in relevant), (i, sentence)
        # Snippets are shared across questions about the same section.
        assert [p.snippet_id for p in group] == [
            f"{m}:{s}-{e}"
            for m, s, e in ((p.meta["doc_id"], p.meta["start"], p.meta["end"]) for p in group)
        ]


# ============================================================================ registry


def test_load_dataset_names(shared: Path, xquad_en: list[Pair]) -> None:
    _require(shared, "selqa/selqa-ass-dev.json")
    assert load_dataset("xquad", data_dir=shared, download=False) == xquad_en
    assert load_dataset("XQuAD-en", data_dir=shared, download=False) == xquad_en
    sel = load_dataset("selqa", data_dir=shared, download=False)
    assert sel == load_dataset("selqa-dev", data_dir=shared)
    assert "xquad-zh" in rd.available_datasets() and "selqa-test" in rd.available_datasets()


def test_load_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"dataset == 'squad', must be one of xquad, xquad-ar, .*selqa-dev.*JSONL file",
    ):
        load_dataset("squad")
    with pytest.raises(DataError, match="no such file"):
        load_dataset(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="no such file"):
        load_dataset(tmp_path / "missing.txt")
    with pytest.raises(TypeError, match="fixes the language"):
        load_dataset("xquad-en", language="de")
    path = _write(tmp_path, _line(relevant=None), name="pairs.txt")  # any existing file is JSONL
    assert load_dataset(str(path))[0].relevant is None
    with pytest.raises(DataError, match="labels are required"):
        load_dataset(str(path), require_labels=True)


def test_public_api_is_complete() -> None:
    for name in rd.__all__:
        assert getattr(rd, name) is not None
    public = {
        n
        for n in dir(rd)
        if not n.startswith("_")
        and callable(getattr(rd, n))
        and getattr(getattr(rd, n), "__module__", "").startswith("ragsieve.data")
    }
    assert public <= set(rd.__all__)
