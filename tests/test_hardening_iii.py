"""Hardening III (issue 31, items 4, 5 and 7).

4. Every writer of a finished file (the report, ``evaluate`` / ``answers --html``, the
   plots) goes through the one writer of :mod:`ragsieve._io`: a FIFO or a character device
   given as the output is written in place and stays what it is; a socket is refused.
5. The batch shard reader finds a shard's edges in one pass (backwards once, chunk by
   chunk, and only the query_id of the line before is read): the same pairs and shards as
   ever on files with lines of megabytes, each byte read a few times at most, no read
   larger than a chunk outside the lines a shard parses.
7. A hot reload builds the scorer from the new artifact's own spec: scorer options the new
   scorer does not declare (``cache_dir`` for an outside score) are not passed to it.

Real components throughout: the real CLI on real XQuAD-en pairs (an outside score, word
overlap, so no model is loaded per command), real files, FIFOs and a Unix socket, and the
real service (MiniLM artifact) in a real uvicorn server on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from topics import first_topics

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main
from ragsieve.data import shards as shards_module
from ragsieve.data import write_pairs
from ragsieve.data.shards import plan_shards, read_shard
from ragsieve.scoring import FieldScorer

FIELD = ["--scorer", "field", "--score-field", "ov", "--higher-is-better"]
HTML = b"<!DOCTYPE html>"
PNG = b"\x89PNG\r\n\x1a\n"


def _overlap(p: Pair) -> float:
    words = set(re.findall(r"\w+", p.query.lower()))
    return len(words & set(re.findall(r"\w+", p.text.lower()))) / max(len(words), 1)


# ====================================================================== 4: special files
@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair]) -> dict[str, Path]:
    """60 labelled XQuAD-en queries of 12 topics with an outside score ``ov`` (the share of
    the question's words in the snippet), and a filter calibrated on it."""
    root = tmp_path_factory.mktemp("pages")
    pairs = [dataclasses.replace(p, meta={**p.meta, "ov": _overlap(p)})
             for p in first_topics(xquad_en, 12, 5)]
    write_pairs(pairs, root / "data.jsonl")
    assert main(["-q", "calibrate", "--data", str(root / "data.jsonl"), *FIELD,
                 "--out", str(root / "filter.json")]) == 0
    return {"data": root / "data.jsonl", "filter": root / "filter.json"}


def _argv(writer: str, pages: dict[str, Path], out: Path | str) -> list[str]:
    data = str(pages["data"])
    runs = {
        "report --out": ["report", "--data", data, "--filter", str(pages["filter"]), "--splits",
                         "3", "--out", str(out)],
        "evaluate --html": ["evaluate", "--data", data, *FIELD, "--splits", "3", "--html",
                            str(out)],
        "answers --html": ["answers", "--data", data, *FIELD, "--no-generate", "--splits", "3",
                           "--bootstrap-resamples", "50", "--html", str(out)],
        "evaluate --plot": ["evaluate", "--data", data, *FIELD, "--splits", "3", "--plot",
                            str(out)],
        "answers --plot": ["answers", "--data", data, *FIELD, "--no-generate", "--splits", "3",
                           "--bootstrap-resamples", "50", "--plot", str(out)],
    }
    return ["-q", *runs[writer]]


def _read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """A thread reading the FIFO ``path`` to its end. A second name of the FIFO is kept
    beside its directory so that :func:`_finish` can release the reader even after a
    writer replaced ``path`` (then nothing ever opens the FIFO for writing)."""
    keep = path.parent.parent / "keep"
    keep.mkdir(exist_ok=True)
    os.link(path, keep / path.name)
    got: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as handle:
            got.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, got


def _finish(thread: threading.Thread, fifo: Path) -> None:
    """Wait for the reader; a FIFO nothing wrote to is opened (and closed) for writing to
    release it."""
    keep = fifo.parent.parent / "keep" / fifo.name
    thread.join(30 if stat.S_ISFIFO(os.stat(fifo).st_mode) else 0)
    if thread.is_alive():
        os.close(os.open(keep, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    keep.unlink()


@pytest.fixture()
def dev_null() -> Iterator[Path]:
    """``/dev/null``, checked after the test: if a writer replaced it (possible as root), it
    is put back at once and the test fails. The tests below write a FIFO first, so a writer
    that replaces special files fails there and never reaches ``/dev/null``."""
    path = Path("/dev/null")
    before = os.stat(path)
    yield path
    after = os.stat(path)
    if (after.st_mode, after.st_rdev) != (before.st_mode, before.st_rdev):
        path.unlink()
        os.mknod(path, before.st_mode, before.st_rdev)
        os.chmod(path, 0o666)
        pytest.fail("/dev/null was replaced by a regular file (the device was put back)")


@pytest.mark.parametrize(("writer", "magic"), [
    ("report --out", HTML), ("evaluate --html", HTML), ("answers --html", HTML),
    ("evaluate --plot", PNG), ("answers --plot", PNG)])
def test_pages_and_plots_are_written_into_a_fifo_and_dev_null(
        writer: str, magic: bytes, pages: dict[str, Path], tmp_path: Path, dev_null: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Item 4: ``report --out`` and ``evaluate --html`` replaced a FIFO or a character
    device by a regular file (as root, ``/dev/full`` itself)."""
    fifo = tmp_path / "out" / ("page.png" if magic == PNG else "page.html")
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    thread, got = _read_fifo(fifo)
    code = main(_argv(writer, pages, fifo))
    _finish(thread, fifo)
    err = capsys.readouterr().err
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), f"{writer} replaced the FIFO"
    assert got and got[0].startswith(magic), got[0][:40] if got else "nothing read"
    assert [p.name for p in fifo.parent.iterdir()] == [fifo.name]  # no temporary file

    null = os.stat(dev_null)
    leftovers = {p.name for p in dev_null.parent.iterdir() if p.name.startswith(".null.")}
    assert main(_argv(writer, pages, dev_null)) == 0
    after = os.stat(dev_null)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == null.st_rdev
    assert {p.name for p in dev_null.parent.iterdir() if p.name.startswith(".null.")} == leftovers
    printed = capsys.readouterr()
    assert "written to /dev/null" in printed.out + printed.err


def test_report_json_counts_the_page_written_into_a_fifo(
        pages: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "out" / "report.html"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    thread, got = _read_fifo(fifo)
    code = main([*_argv("report --out", pages, fifo), "--json"])
    _finish(thread, fifo)
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"out": str(fifo), "bytes": len(got[0])} and len(got[0]) > 10_000


@pytest.mark.parametrize("writer", ["report --out", "evaluate --plot"])
def test_a_socket_given_as_a_page_or_plot_is_refused(
        writer: str, pages: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ("s.png" if "plot" in writer else "s.html")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        code = main(_argv(writer, pages, path))
        err = capsys.readouterr().err
        assert code == 2, err
        assert "is a socket; expected a regular file path" in err
        assert len(err.strip().splitlines()) == 1, err
        assert stat.S_ISSOCK(os.stat(path).st_mode)


# ====================================================================== 5: long lines
class _Counting:
    """A binary file that counts the bytes its reads return (instrumentation, not a
    double: every call goes to the real file)."""

    def __init__(self, handle: Any, log: dict[str, int]) -> None:
        self._handle = handle
        self._log = log

    def _count(self, data: bytes, kind: str) -> bytes:
        self._log["bytes"] += len(data)
        self._log[f"largest {kind}"] = max(self._log[f"largest {kind}"], len(data))
        return data

    def read(self, *args: Any) -> bytes:
        return self._count(self._handle.read(*args), "read")

    def readline(self, *args: Any) -> bytes:
        return self._count(self._handle.readline(*args), "line")

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> bytes:
        return self._count(next(self._handle), "line")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __getattr__(self, name: str) -> Any:  # seek, tell, close
        return getattr(self._handle, name)


@pytest.fixture()
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The bytes the shard reader reads (every file it opens is wrapped in ``_Counting``)."""
    log = {"bytes": 0, "largest read": 0, "largest line": 0}

    def counting_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return _Counting(open(path, mode, *args, **kwargs), log)

    monkeypatch.setattr(shards_module, "open", counting_open, raising=False)
    return log


def _record(qid: str, sid: str, text: str, *, key_last: bool = False, **extra: Any) -> bytes:
    rest = {"query": f"What about {qid}?", "snippet_id": sid, "text": text, "relevant": 0,
            **extra}
    record = {**rest, "query_id": qid} if key_last else {"query_id": qid, **rest}
    return json.dumps(record, ensure_ascii=False).encode()


def _write(path: Path, lines: list[bytes], *, prefix: bytes = b"") -> list[int]:
    """Write ``lines`` (each with its own line ending); the offset where each starts."""
    offsets, at = [], len(prefix)
    for line in lines:
        offsets.append(at)
        at += len(line)
    path.write_bytes(prefix + b"".join(lines))
    return offsets


def _expected(lines: list[bytes], offsets: list[int], shards: list[Any]) -> list[list[tuple[str, str]]]:
    """Per shard, the (query_id, snippet_id) it must give: the lines of the queries whose
    first line starts inside it, in file order (blank lines belong to no query)."""
    first: dict[str, int] = {}
    rows = []
    for line, offset in zip(lines, offsets, strict=True):
        if not line.strip():
            continue
        record = json.loads(line.decode("utf-8-sig"))
        first.setdefault(record["query_id"], offset)
        rows.append((record["query_id"], record["snippet_id"]))
    return [[(q, s) for q, s in rows if shard.start <= first[q] < shard.end] for shard in shards]


def _read(shards: list[Any]) -> list[list[tuple[str, str]]]:
    return [[(p.query_id, p.snippet_id) for p in read_shard(s)] for s in shards]


MiB = 1 << 20


def test_lines_of_megabytes_give_the_same_shards_and_pairs_reading_each_byte_a_few_times(
        tmp_path: Path, counted_reads: dict[str, int]) -> None:
    """Item 5: a shard starting inside a long line re-read the line backwards with a chunk
    growing from the same end (quadratic: 64 MB took over 200 s). A 6 MB line in the middle
    of a query (query_id first, as ``export`` writes it) and a 5 MB line ending a query
    (query_id last, after a text full of quotes and backslashes), blank lines and CRLF."""
    tricky = ('She said "no" \\ twice \\\\ and left; ' * 8 + "\n") * 16
    lines: list[bytes] = []
    for q in range(30):
        for s in range(4):
            if (q, s) == (10, 2):
                text, last = "A long paragraph of prose.\n" * 240_000, False  # 6.5 MB
            elif (q, s) == (20, 3):
                text, last = tricky * (5 * MiB // len(tricky)), True
            else:
                text, last = f"snippet {s} of query {q}. " * 12, q % 2 == 1
            end = b"\r\n" if q % 7 == 3 else b"\n"
            lines.append(_record(f"q{q}", f"q{q}-s{s}", text, key_last=last) + end)
        if q == 20:
            lines += [b"   \n", b"\n", b" \t \r\n"]
    path = tmp_path / "long.jsonl"
    offsets = _write(path, lines)
    size = path.stat().st_size
    assert size > 11 * MiB

    shards = plan_shards([path], shard_bytes=MiB)
    assert [(s.start, s.end) for s in shards] == [(a, min(a + MiB, size))
                                                   for a in range(0, size, MiB)]
    counted_reads.update(bytes=0, **{"largest read": 0})
    assert _read(shards) == _expected(lines, offsets, shards)
    # every byte: parsed by its shard, scanned for the edges of the shards inside its line,
    # read backwards once and forwards once to the query_id by the shard after, and read by
    # the shard before when it ends that shard's last query
    assert counted_reads["bytes"] <= 5 * size, counted_reads
    assert counted_reads["largest read"] <= 64 * 1024, counted_reads  # memory: one chunk


@pytest.mark.parametrize("shape", ["query_id first", "query_id last", "nested values",
                                   "escaped key", "byte-order mark, CRLF, blank lines"])
def test_the_line_before_a_shard_is_read_whatever_its_shape(shape: str, tmp_path: Path) -> None:
    """The query_id of a long line before a shard is found wherever it is on the line (the
    reader walks the JSON, never holding the line): the next line, of the same query, is
    left to the shard before, at every shard size."""
    text = 'quote " backslash \\ run \\\\\\ brace } bracket ] ' * 4000  # ~200 kB
    extra: dict[str, Any] = {}
    if shape == "nested values":
        extra = {"meta": {"a": ['x"}]', 1.5e3, {"b": "{["}], "c": None}, "v": [0.25] * 5000}
    first = _record("q1", "s1", text, key_last=shape != "query_id first", **extra)
    if shape == "escaped key":
        first = first.replace(b'"query_id"', b'"query\\u005fid"')
    end = b"\r\n" if shape.startswith("byte-order") else b"\n"
    lines = [first + end]
    if shape.startswith("byte-order"):
        lines += [b"  \r\n", b"\r\n"]
    lines += [_record("q1", "s2", "short") + end, _record("q2", "s1", "other") + end,
              _record("q2", "s2", "other " * 50) + end]
    prefix = b"\xef\xbb\xbf" if shape.startswith("byte-order") else b""
    path = tmp_path / "shape.jsonl"
    offsets = _write(path, lines, prefix=prefix)
    if prefix:
        lines[0] = prefix + lines[0]
    for shard_bytes in (997, 65_536, 65_537, len(lines[0]) - 1, len(lines[0]) + 1,
                        len(lines[0]) + 3):
        shards = plan_shards([path], shard_bytes=shard_bytes)
        got = _read(shards)
        assert got == _expected(lines, offsets, shards), shard_bytes
        assert sorted(p for shard in got for p in shard) == [
            ("q1", "s1"), ("q1", "s2"), ("q2", "s1"), ("q2", "s2")]


# ====================================================================== 7: reload kinds
KEY = "hardening-iii-key"
AUTH = {"X-API-Key": KEY}


@pytest.fixture(scope="module")
def field_artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair]) -> Path:
    """A filter on an outside score under the field name ``bm25`` (higher is better)."""
    pairs = [dataclasses.replace(p, meta={**p.meta, "bm25": _overlap(p)}) for p in xquad_en[:300]]
    path = tmp_path_factory.mktemp("field") / "bm25.json"
    ConformalFilter(FieldScorer("bm25", higher_is_better=True), alpha=0.2).calibrate(
        pairs, monitor=False).save(path)
    return path


def test_reload_between_scorer_kinds(served_artifact: Callable[..., Path], field_artifact: Path,
                                     embedding_cache_dir: Path, tmp_path: Path) -> None:
    """Item 7: serving a MiniLM artifact with ``scorer_options={"cache_dir": ...}``, a field
    artifact put in its place was refused on ``POST /admin/reload`` (422 "FieldScorer.__init__()
    got an unexpected keyword argument 'cache_dir'"): the first artifact's options were
    passed to the new scorer. Now each scorer gets the options it declares, and back again."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from servers import serving

    embedding = served_artifact(SplitConformalCalibrator(alpha=0.2))
    served = tmp_path / "served.json"
    shutil.copy(embedding, served)
    text = {"query": "Where does the river rise?",
            "snippets": [{"text": "The river rises in the northern hills."},
                         {"text": "A recipe for bread."}]}
    values = [0.9, 0.05, 0.5]
    outside = {"query": "q", "snippets": [{"bm25": v} for v in values]}
    with serving(served, state_dir=tmp_path / "state", api_key=KEY,
                 scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        def post(route: str, body: Any = None) -> Any:
            return httpx.post(srv.url + route, json=body, headers=AUTH, timeout=120)

        first = post("/filter", text)
        assert first.status_code == 200, first.text

        shutil.copy(field_artifact, served)
        reload = post("/admin/reload")
        assert reload.status_code == 200, reload.text
        assert reload.json()["generation"] == 2 and reload.json()["changed"]
        scored = post("/filter", outside)
        assert scored.status_code == 200, scored.text
        assert scored.json()["scores"] == [-v for v in values]
        tau = ConformalFilter.load(field_artifact).threshold
        assert [k["index"] for k in scored.json()["kept"]] == [
            i for i, v in enumerate(values) if -v <= tau]
        assert post("/filter", text).status_code == 422  # a field filter needs its score

        shutil.copy(embedding, served)
        back = post("/admin/reload")
        assert back.status_code == 200, back.text
        assert back.json()["generation"] == 3
        again = post("/filter", text)
        assert again.status_code == 200, again.text
        assert again.json()["scores"] == pytest.approx(first.json()["scores"], abs=1e-6)
        refused = post("/filter", {"query": "q", "snippets": [{"text": "a", "score": 0.1}]})
        assert refused.status_code == 422 and "reads no outside score" in refused.json()["detail"]
