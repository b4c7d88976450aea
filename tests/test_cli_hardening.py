"""The batch commands under honest mistakes: outputs that would destroy inputs, special
files, absurd counts, topics without evidence, unreachable Ray, plots, empty inputs,
skipped directory entries and control characters in ids.

Most commands here read a small real file of XQuAD English pairs whose MiniLM scores
are stored under ``rr``, and score with ``--scorer field --score-field rr`` (an outside
score): the real scoring and calibration path without loading the model in every test.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs
from ragsieve.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
FIELD = ["--scorer", "field", "--score-field", "rr"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def scored_pairs(xquad_en, minilm_scorer):  # type: ignore[no-untyped-def]
    """60 XQuAD English queries (9 snippets each), with their real MiniLM score in ``rr``
    and each query its own topic (as in CLAPNQ-like files)."""
    first: dict[str, str] = {}
    for p in xquad_en:
        first.setdefault(p.query_id, p.group)
    queries = list(first)[::20][:60]
    chosen = set(queries)
    pairs = [p for p in xquad_en if p.query_id in chosen]
    scores = minilm_scorer.score_pairs(pairs)
    return [replace(p, group=p.query_id, meta={**p.meta, "rr": float(s)})
            for p, s in zip(pairs, scores, strict=True)]


@pytest.fixture(scope="module")
def data(scored_pairs, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("hardening") / "pairs.jsonl"
    write_pairs(scored_pairs, path)
    return path


@pytest.fixture(scope="module")
def artifact(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifact") / "filter.json"
    assert main(["-q", "calibrate", "--data", str(data), *FIELD, "--out", str(out)]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


# ------------------------------------------------------------ 4: never destroy the input
def test_overlap_cases(tmp_path: Path) -> None:
    from ragsieve._paths import check_outputs_apart, overlap

    f = tmp_path / "pairs.jsonl"
    f.write_text("x\n")
    os.link(f, tmp_path / "hard.jsonl")
    (tmp_path / "sym.jsonl").symlink_to(f)
    d = tmp_path / "dir"
    d.mkdir()
    assert overlap(f, f) == "is the same file as"
    assert overlap(tmp_path / "hard.jsonl", f) == "is the same file as"
    assert overlap(tmp_path / "sym.jsonl", f) == "is the same file as"
    assert overlap(d, d) == "is the same directory as"
    assert overlap(d / "new" / "out.jsonl", d) == "is inside"
    assert overlap(tmp_path, f) == "contains"
    assert overlap(tmp_path / "other.jsonl", f) is None
    assert overlap(f, "xquad-en") is None and overlap(f, "-") is None
    with pytest.raises(ValueError, match=r"--out .* is the same file as --data .*choose another"):
        check_outputs_apart({"--out": str(tmp_path / "hard.jsonl")}, {"--data": str(f)})
    check_outputs_apart({"--out": str(tmp_path / "o.json"), "--plot": None}, {"--data": str(f)})


def _cases(tmp: Path, data: Path, artifact: Path) -> list[tuple[list[str], Path, str]]:
    """(argv, the input that must survive, the error's wording) per writing command."""
    x = _copy(data, tmp / "x.jsonl")
    d = tmp / "d"
    d.mkdir()
    _copy(data, d / "a.jsonl")
    hard = tmp / "hard.jsonl"
    os.link(x, hard)
    link = tmp / "link.jsonl"
    link.symlink_to(x)
    db = tmp / "feedback.sqlite"
    db.write_bytes(b"SQLite format 3\x00" + bytes(100))
    flt = _copy(artifact, tmp / "filter.json")
    return [
        (["calibrate", "--data", str(x), *FIELD, "--out", str(x)], x, "--out"),
        (["calibrate", "--data", str(x), *FIELD, "--out", str(hard)], x, "same file"),
        (["filter", "--filter", str(flt), "--data", str(x), "--out", str(link)], x, "--data"),
        (["filter", "--filter", str(flt), "--data", str(x), "--out", str(flt)], flt, "--filter"),
        (["score", "--data", str(x), *FIELD, "--out", str(x)], x, "same file"),
        (["score", "--data", str(d), *FIELD, "--out", str(d)], d / "a.jsonl", "same directory"),
        (["score", "--data", str(d), *FIELD, "--out", str(d / "scores")], d / "a.jsonl",
         "is inside --data"),
        (["score", "--data", str(d / "a.jsonl"), *FIELD, "--out", str(d)], d / "a.jsonl",
         "contains --data"),
        (["answers", "--data", str(x), *FIELD, "--no-generate", "--per-query", str(x)], x,
         "--per-query"),
        (["evaluate", "--data", str(d), *FIELD, "--splits", "1", "--plot", str(d / "fig")],
         d / "a.jsonl", "--plot"),
        (["export", "--data", str(x), "--out", str(hard)], x, "same file"),
        (["recalibrate", "--feedback", str(db), "--filter", str(flt), "--out", str(db)], db,
         "--feedback"),
    ]


def test_outputs_that_would_destroy_an_input_are_refused(
        data: Path, artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 4: every writing command refuses, before any work, an output that is an input
    (path, symlink, hard link), lies inside an input directory or holds an input."""
    for argv, kept, wording in _cases(tmp_path, data, artifact):
        before = kept.read_bytes()
        code, _, err = run(["-q", *argv], capsys)
        assert code == 2, argv
        assert wording in err and "choose another" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert kept.read_bytes() == before, argv
    assert not (tmp_path / "d" / "scores").exists()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a.jsonl"]


# ------------------------------------------------------------ 5: special files
def _read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as handle:
            got.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, got


def _finish(thread: threading.Thread, fifo: Path) -> None:
    thread.join(60)
    if thread.is_alive():  # nothing opened the FIFO for writing: release the reader
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)


def test_special_file_kinds(tmp_path: Path) -> None:
    from ragsieve._io import direct_target, special_kind
    from ragsieve._paths import figure_path

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert special_kind(fifo) == "FIFO" and special_kind("/dev/null") == "character device"
    assert special_kind(tmp_path) is None and special_kind(tmp_path / "none") is None
    assert direct_target(fifo) and not direct_target(tmp_path / "f.json")
    with pytest.raises(ValueError, match="is a FIFO; expected a regular file path"):
        direct_target(fifo, stream=False)
    assert figure_path(tmp_path / "plot") == tmp_path / "plot.png"
    assert figure_path(fifo) == fifo and figure_path("/dev/null") == Path("/dev/null")


def test_writes_go_into_special_files_instead_of_replacing_them(
        data: Path, artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 5: a FIFO or a device given as output is written to in place and stays what
    it is; a Parquet output or a directory of parts on a special file is refused."""
    null_mode = os.stat("/dev/null").st_mode
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    thread, got = _read_fifo(fifo)
    code, _, err = run(["-q", "export", "--data", str(data), "--out", str(fifo)], capsys)
    _finish(thread, fifo)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and got[0] == data.read_bytes()

    thread, got = _read_fifo(fifo)  # an engine's JSONL file output: parts merged into it
    code, _, err = run(["-q", "score", "--data", str(data), *FIELD, "--out", str(fifo)], capsys)
    _finish(thread, fifo)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(got[0].splitlines()) == len(read_pairs(data))

    thread, got = _read_fifo(fifo)  # atomic_write_text (the artifact writer)
    code, _, err = run(["-q", "calibrate", "--data", str(data), *FIELD, "--out", str(fifo)],
                       capsys)
    _finish(thread, fifo)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and json.loads(got[0])["calibration"]["mode"] == "marginal"

    for argv in (["export", "--data", str(data), "--out", "/dev/null"],
                 ["calibrate", "--data", str(data), *FIELD, "--out", "/dev/null"]):
        assert main(["-q", *argv]) == 0
        assert os.stat("/dev/null").st_mode == null_mode
    capsys.readouterr()

    parquet = tmp_path / "out.parquet"
    os.mkfifo(parquet)
    for out, wording in ((parquet, "is a FIFO"), ("/dev/null", "expected an output directory")):
        code, _, err = run(["-q", "score", "--data", str(data), *FIELD, "--out", str(out)],
                           capsys)
        assert code == 2 and wording in err, err
    assert stat.S_ISFIFO(os.stat(parquet).st_mode)
    assert os.stat("/dev/null").st_mode == null_mode


def test_atomic_write_text_refuses_a_socket(tmp_path: Path) -> None:
    import socket

    from ragsieve._io import atomic_write_text

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(ValueError, match="is a socket"):
            atomic_write_text(path, "{}")
        assert stat.S_ISSOCK(os.stat(path).st_mode)


# ------------------------------------------------------------ 10: bounded counts
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["evaluate", "--data", "x.jsonl", "--splits", "1000000000"],
         "--splits: 1000000000: must be <= 10000"),
        (["evaluate", "--data", "x.jsonl", "--top-k", "1,20000"], "--top-k: 20000: must be <="),
        (["evaluate", "--data", "x.jsonl", "--limit-queries", "99999999999"], "--limit-queries"),
        (["answers", "--data", "x.jsonl", "--bootstrap-resamples", "1000000000"],
         "--bootstrap-resamples: 1000000000: must be <= 100000"),
        (["answers", "--data", "x.jsonl", "--splits", "20000"], "--splits"),
        (["answers", "--data", "x.jsonl", "--max-tokens", "10000000"], "--max-tokens"),
        (["demo", "--splits", "1000000000"], "--splits"),
        (["score", "--data", "x.jsonl", "--out", "o", "--shard-bytes", str(2**40)],
         "--shard-bytes"),
        (["score", "--data", "x.jsonl", "--out", "o", "--engine", "ray", "--workers", "100000"],
         "--workers"),
        (["label", "--data", "x.jsonl", "--out", "o.jsonl", "--llm-concurrency", "100000"],
         "--llm-concurrency"),
        (["llm", "serve", "--n-ctx", "100000000"], "--n-ctx"),
        (["llm", "serve", "--parallel", "100000"], "--parallel"),
        (["llm", "injection", "--data", "x.jsonl", "--n-pairs", "100000000"], "--n-pairs"),
        (["index", "docs", "--index", "idx", "--batch-size", "1000000"], "--batch-size"),
        (["query", "q", "--index", "idx", "-k", "1000000"], "-k"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--window", "10000000000"],
         "--window"),
        (["shift-demo", "--window", "10000000000"], "--window"),
    ],
)
def test_counts_have_upper_bounds(argv: list[str], message: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 10: a count far beyond any real use is a usage error naming the bound (only
    parsed here: where a value were accepted, nothing runs)."""
    from ragsieve.cli import build_parser

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "must be <=" in err and "Traceback" not in err


def test_library_bounds_the_splits() -> None:
    from ragsieve.data.splits import group_splits
    from ragsieve.evaluation import EvaluationConfig

    with pytest.raises(ValueError, match=r"n_splits == 10001, must be an int in \[1, 10000\]"):
        group_splits(["a", "b"], n_splits=10_001)
    with pytest.raises(ValueError, match="n_splits"):
        EvaluationConfig(n_splits=10_001)


# ------------------------------------------------------------ 14: topics without evidence
def _without_evidence(scored_pairs, path: Path) -> str:  # type: ignore[no-untyped-def]
    """Write the pairs with the relevant snippets of one query dropped; return its id."""
    victim = scored_pairs[0].query_id
    write_pairs([p for p in scored_pairs if not (p.query_id == victim and p.relevant)], path)
    return victim


def test_topic_modes_leave_out_a_topic_without_relevant_snippets() -> None:
    """Defect 14 in the library: the topic without evidence is left out and counted."""
    from ragsieve.calibration import make_calibrator

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 5)
    scores = rng.random(groups.size)
    relevant = (np.arange(groups.size) % 5 < 2).astype(int)
    relevant[groups == 7] = 0  # topic 7: no relevant snippet
    for mode, unit in (("topic-pac", "topic"), ("topic", "topic"), ("query-recall", "query")):
        kw = {"query_ids": groups} if unit == "query" else {"groups": groups}
        cal = make_calibrator(mode, alpha=0.3).fit(scores, relevant, **kw)
        details = cal.guarantee().details
        assert np.isfinite(cal.threshold_), mode
        key = "n_queries_left_out" if unit == "query" else "n_topics_left_out"
        assert details[key] == 1 and "left out" in details["note"], mode
        again = type(cal).from_state(cal.get_params(), cal.to_state())
        assert again.guarantee().details == details, mode


def test_topic_pac_cli_with_a_query_without_relevant_snippets(
        scored_pairs, embedding_cache_dir: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 14: `calibrate` and `evaluate --mode topic-pac` (and topic, query-recall) on
    data where one calibration query has no relevant snippet: the query's topic is left
    out, said in a warning and in the guarantee. (`calibrate` fits on every pair with a
    list-dependent scorer such as relative; other scorers fit on the relevant pairs only,
    where the topic does not appear at all.)"""
    path = tmp_path / "one-without.jsonl"
    _without_evidence(scored_pairs, path)
    caplog.set_level(logging.WARNING)
    relative = ["--scorer", "relative", "--cache-dir", str(embedding_cache_dir)]
    code, out, err = run(["-q", "calibrate", "--data", str(path), *relative, "--mode",
                          "topic-pac", "--alpha", "0.2", "--delta", "0.2", "--out",
                          str(tmp_path / "f.json"), "--json"], capsys)
    assert code == 0, err
    details = json.loads(out)["guarantee"]["details"]
    assert details["n_topics_left_out"] == 1 and "left out" in details["note"]
    assert any("1 of 60 calibration topics have no relevant snippet" in r.getMessage()
               for r in caplog.records)
    code, out, err = run(["-q", "calibrate", "--data", str(path), *relative, "--mode",
                          "topic-pac", "--alpha", "0.2", "--delta", "0.2", "--out",
                          str(tmp_path / "f.json")], capsys)
    assert code == 0 and "note: 1 calibration topic without a relevant snippet left out" in out
    code, out, err = run(["-q", "evaluate", "--data", str(path), *FIELD, "--mode",
                          "topic-pac,topic,query-recall", "--alpha", "0.2", "--delta", "0.2",
                          "--splits", "2", "--json"], capsys)
    assert code == 0, err
    rows = [r for r in json.loads(out)["results"] if r["method"] == "conformal"]
    assert {r["mode"] for r in rows} == {"topic-pac", "topic", "query-recall"}
    # the query without evidence is in the calibration half of at least one of the splits
    assert all(r["n_left_out_mean"] > 0 and "left out" in r["note"] for r in rows), rows


# ------------------------------------------------------------ smaller: unreachable Ray
@pytest.fixture()
def not_ray() -> Iterator[int]:
    """A loopback HTTP/1 server: something listens, but not Ray."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_unreachable_ray_address_is_a_quick_clean_error(
        data: Path, artifact: Path, tmp_path: Path, not_ray: int) -> None:
    """`--ray-address` where no cluster is: exit 2 with one line (before, a hang of
    minutes); each run is bounded by the subprocess timeout, not a timed assertion."""
    pytest.importorskip("ray", reason="needs pip install 'ragsieve[ray]'")
    runs = [
        ["score", "--data", str(data), *FIELD, "--out", str(tmp_path / "s"),
         "--ray-address", "127.0.0.1:1"],
        ["filter", "--filter", str(artifact), "--data", str(data), "--out",
         str(tmp_path / "f"), "--ray-address", "127.0.0.1:1"],
        ["evaluate", "--data", str(data), *FIELD, "--splits", "1", "--ray-address",
         f"127.0.0.1:{not_ray}"],
        ["label", "--data", str(data), "--out", str(tmp_path / "l.jsonl"), "--base-url",
         "http://127.0.0.1:9/v1", "--ray-address", f"127.0.0.1:{not_ray}"],
    ]
    for argv in runs:
        done = subprocess.run([sys.executable, "-m", "ragsieve.cli", "-q", *argv[:1],
                               "--engine", "ray", *argv[1:]], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, check=False)
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "no Ray cluster at 127.0.0.1:" in lines[0], lines


# ------------------------------------------------------------ smaller: the plot path said
def test_plot_reports_the_path_written(data: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "figures"
    target.mkdir()
    code, _, err = run(["-q", "evaluate", "--data", str(data), *FIELD, "--splits", "1",
                        "--alpha", "0.2", "--plot", str(target)], capsys)
    assert code == 0, err
    assert f"plot written to {target}.png" in err
    assert (tmp_path / "figures.png").read_bytes()[:4] == b"\x89PNG"
    code, _, err = run(["-q", "answers", "--data", str(data), *FIELD, "--no-generate",
                        "--alpha", "0.2", "--bootstrap-resamples", "100", "--plot",
                        str(tmp_path / "answers")], capsys)
    assert code == 0, err
    assert f"plot written to {tmp_path / 'answers.png'}" in err
    assert (tmp_path / "answers.png").is_file()


# ------------------------------------------------------------ smaller: empty input
def test_empty_input_is_exit_2_for_every_command(artifact: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    out = tmp_path / "out"
    for argv in (
        ["score", "--data", str(empty), *FIELD, "--out", str(out)],
        ["filter", "--filter", str(artifact), "--data", str(empty), "--out", str(out)],
        ["filter", "--filter", str(artifact), "--data", str(empty)],
        ["label", "--data", str(empty), "--out", str(tmp_path / "l.jsonl"), "--base-url",
         "http://127.0.0.1:9/v1"],
        ["calibrate", "--data", str(empty), *FIELD, "--out", str(tmp_path / "f.json")],
        ["evaluate", "--data", str(empty), *FIELD],
        ["export", "--data", str(empty), "--out", str(tmp_path / "e.jsonl")],
    ):
        code, _, err = run(["-q", *argv], capsys)
        assert code == 2 and "contains no pairs" in err, (argv, err)
    assert not out.exists()


# ------------------------------------------------------------ smaller: skipped entries
def test_skipped_directory_entries_are_listed(data: Path, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "in"
    d.mkdir()
    _copy(data, d / "a.jsonl")
    (d / "sub").mkdir()
    _copy(data, d / "sub" / "b.jsonl")
    (d / "c.json").write_text("[]")
    caplog.set_level(logging.WARNING, logger="ragsieve.data.shards")
    code, _, err = run(["-q", "export", "--data", str(d), "--out", str(tmp_path / "o.jsonl")],
                       capsys)
    assert code == 0, err
    messages = [r.getMessage() for r in caplog.records]
    assert any("skipped sub: a subdirectory" in m for m in messages), messages
    assert any("skipped c.json: suffix '.json', not .jsonl or .parquet" in m for m in messages)
    assert len(read_pairs(tmp_path / "o.jsonl")) == len(read_pairs(data))


# ------------------------------------------------------------ smaller: control characters
@pytest.mark.parametrize("key", ["query_id", "snippet_id", "group", "doc_id"])
@pytest.mark.parametrize("char", ["\x00", "\n", "\x1b", "\u2028"])
def test_control_characters_in_ids_are_refused(key: str, char: str, tmp_path: Path) -> None:
    good = {"query_id": "q1", "query": "Who?", "snippet_id": "s1", "text": "Ada.",
            "relevant": 1, "group": "g", "doc_id": "d"}
    path = tmp_path / "ids.jsonl"
    lines = [good, {**good, "snippet_id": "s2", key: f"x{char}y"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(DataError, match=rf"ids.jsonl:2: {key} == .* control character"):
        read_pairs(path)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.table({k: [str(r[k]) if k != "relevant" else r[k] for r in lines] for k in good})
    pq.write_table(table, tmp_path / "ids.parquet")
    from ragsieve.data import load_dataset

    with pytest.raises(DataError, match=rf"ids.parquet:row 2: {key} == .* control character"):
        load_dataset(str(tmp_path / "ids.parquet"))


def test_control_character_in_an_id_is_a_cli_error(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nul.jsonl"
    path.write_text(json.dumps({"query_id": "q\u0000", "query": "Who?", "snippet_id": "s",
                                "text": "Ada."}) + "\n", encoding="utf-8")
    code, _, err = run(["export", "--data", str(path), "--out", str(tmp_path / "o.jsonl")],
                       capsys)
    assert code == 2 and "nul.jsonl:1: query_id" in err and "control character" in err
