"""Engines: query-whole shards, partitioned resumable output, the local engine, the CLI.

The Ray engine has its own module (tests/test_engines_ray.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragsieve.data import read_pairs, write_pairs
from ragsieve.data.partitioned import MANIFEST, PartitionedOutput, finished_parts
from ragsieve.data.shards import iter_input_pairs, plan_shards, query_batches, read_shard
from ragsieve.engines import FilterTask, JobOutput, LocalEngine, ScoreTask, run_job
from ragsieve.errors import DataError
from ragsieve.types import Pair

RAGSIEVE = str(Path(sys.executable).parent / "ragsieve")
FIELD = {"scorer": "field", "field": "bm25", "higher_is_better": True}


def _pairs(sizes: list[int], *, text_len: int = 40, score: bool = True) -> list[Pair]:
    out = []
    for q, n in enumerate(sizes):
        for k in range(n):
            meta = {"bm25": float((q * 7 + k * 3) % 11)} if score else {}
            out.append(Pair(f"q{q}", f"Question {q}?", f"s{k}", f"text {q}/{k} " + "x" * text_len,
                            relevant=int(k == 0), group=f"g{q % 3}", meta=meta))
    return out


def _owned(path: Path, shard_bytes: int) -> list[list[Pair]]:
    return [list(read_shard(s)) for s in plan_shards([path], shard_bytes=shard_bytes)]


# ----------------------------------------------------------------------------- shards


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
       text_len=st.integers(1, 300), shard_bytes=st.integers(1, 4000))
def test_shards_read_every_line_once_and_keep_queries_whole(
        tmp_path: Path, sizes: list[int], text_len: int, shard_bytes: int) -> None:
    pairs = _pairs(sizes, text_len=text_len)
    path = tmp_path / f"p{len(sizes)}-{text_len}-{shard_bytes}.jsonl"
    write_pairs(pairs, path)
    owned = _owned(path, shard_bytes)
    flat = [p for part in owned for p in part]
    assert [(p.query_id, p.snippet_id) for p in flat] == [(p.query_id, p.snippet_id) for p in pairs]
    owners = [{p.query_id for p in part} for part in owned]
    for i, a in enumerate(owners):  # no query is split between two shards
        for b in owners[i + 1:]:
            assert not a & b


def test_shards_handle_blank_lines_bom_and_lines_longer_than_the_back_scan(tmp_path: Path) -> None:
    pairs = _pairs([2, 3, 1, 4], text_len=70_000)  # lines longer than the 64 KiB back chunk
    path = tmp_path / "long.jsonl"
    lines = [json.dumps({"query_id": p.query_id, "query": p.query, "snippet_id": p.snippet_id,
                         "text": p.text, "relevant": p.relevant}) for p in pairs]
    body = "\n\n".join(lines) + "\n\n"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    for shard_bytes in (1_000, 5_000, 70_000, 150_000, 10**7):
        flat = [p for part in _owned(path, shard_bytes) for p in part]
        assert [(p.query_id, p.snippet_id) for p in flat] == [
            (p.query_id, p.snippet_id) for p in pairs], shard_bytes


def test_parquet_shards_match_jsonl(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from ragsieve.data.parquet import pairs_table

    pairs = _pairs([3, 1, 5, 2, 2, 4, 1])
    path = tmp_path / "p.parquet"
    pq.write_table(pairs_table(pairs), path, row_group_size=2)  # groups split queries
    for shard_bytes in (1, 300, 10**7):
        owned = _owned(path, shard_bytes)
        flat = [p for part in owned for p in part]
        assert flat == pairs  # Pair equality: ids, texts, labels, groups
        assert [p.meta for p in flat] == [p.meta for p in pairs]
        owners = [{p.query_id for p in part} for part in owned]
        assert sum(len(o) for o in owners) == len({p.query_id for p in pairs})


def test_a_query_whose_lines_are_apart_is_an_error(tmp_path: Path) -> None:
    pairs = _pairs([2, 2])
    path = tmp_path / "apart.jsonl"
    write_pairs([pairs[0], pairs[2], pairs[1], pairs[3]], path)
    with pytest.raises(DataError, match=r"apart.jsonl:byte \d+: query_id 'q0' reappears"):
        list(iter_input_pairs([path]))


def test_a_query_split_between_two_shards_fails_the_run(tmp_path: Path) -> None:
    """Within a shard a reappearing query is caught as it is read; across shards, by the
    run's check of every part's query ids before the output is marked complete."""
    pairs = _pairs([2] * 20)
    path = tmp_path / "far.jsonl"
    write_pairs(pairs[1:] + pairs[:1], path)  # q0's second line moved to the end
    with pytest.raises(DataError, match=r"a query's lines are in two places of the input "
                                        r"\(queries of part-00000.jsonl and part-\d+.jsonl"):
        _run(tmp_path, path, "o", shard_bytes=300)
    with pytest.raises(DataError, match="unfinished run"):
        finished_parts(tmp_path / "o")  # nothing reads a wrong output


def test_shard_errors_name_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"query_id": "q", "query": "Q?", "snippet_id": "a", "text": "t"})
    path.write_text(good + "\n{not json\n")
    with pytest.raises(DataError, match=rf"bad.jsonl:byte {len(good) + 1}: malformed JSON"):
        list(iter_input_pairs([path]))
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(DataError, match="expected a .jsonl or .parquet file"):
        plan_shards([tmp_path / "x.csv"])


def test_query_batches_never_split_a_query() -> None:
    pairs = _pairs([3, 5, 1, 2, 7, 1])
    batches = list(query_batches(iter(pairs), 4))
    assert [p for b in batches for p in b] == pairs
    for b in batches:
        ids = [p.query_id for p in b]
        assert len(b) <= 4 or len(set(ids)) == 1


# ----------------------------------------------------------------------------- output


def test_partitioned_output_refuses_another_job_and_overwrites_on_request(tmp_path: Path) -> None:
    out = PartitionedOutput(tmp_path / "o", {"task": "a"})
    (tmp_path / "o" / "part-00000.jsonl").write_text("{}\n")
    out.record(0, {"rows": 1, "pairs": 1})
    with pytest.raises(DataError, match="holds the output of another run .*differs in task"):
        PartitionedOutput(tmp_path / "o", {"task": "b"})
    again = PartitionedOutput(tmp_path / "o", {"task": "a"})  # the same job resumes
    assert set(again.done) == {0}
    fresh = PartitionedOutput(tmp_path / "o", {"task": "b"}, overwrite=True)
    assert fresh.done == {} and not (tmp_path / "o" / "part-00000.jsonl").exists()


def test_reading_an_unfinished_output_is_refused(tmp_path: Path) -> None:
    out = PartitionedOutput(tmp_path / "o", {"task": "a"})
    out.start(3)
    with pytest.raises(DataError, match=r"an unfinished run \(0 of 3 parts\); rerun"):
        finished_parts(tmp_path / "o")


# ----------------------------------------------------------------------------- local engine


def _run(tmp_path: Path, src: Path, name: str, task: Any = None, fmt: str | None = None,
         **kw: Any) -> Any:
    return run_job(task or ScoreTask(FIELD), [src], JobOutput(tmp_path / name, fmt), LocalEngine(),
                   **kw)


def test_score_output_equals_in_memory_scores_in_every_format(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from ragsieve.scoring import resolve_scorer

    pairs = _pairs([3, 1, 4, 2, 6, 1, 1, 5])
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    expected = resolve_scorer(FIELD).score_pairs(pairs)
    for out, fmt in (("o.jsonl", None), ("o.parquet", None), ("dir", "parquet"), ("dir2", None)):
        report = _run(tmp_path, src, out, fmt=fmt, shard_bytes=700, batch_pairs=3)
        back = read_pairs(tmp_path / out) if out.endswith(".jsonl") else list(
            iter_input_pairs([tmp_path / out]))
        assert [(p.query_id, p.snippet_id, p.relevant, p.group) for p in back] == [
            (p.query_id, p.snippet_id, p.relevant, p.group) for p in pairs]
        assert np.array_equal([p.meta["score"] for p in back], expected)
        assert [p.meta["bm25"] for p in back] == [p.meta["bm25"] for p in pairs]
        assert report.rows == report.pairs == len(pairs) and report.n_shards > 3
    assert not (tmp_path / "o.jsonl.parts").exists()  # merged, then removed


class _FailOn:
    """Failure injection: a score task that raises on one shard's batch."""

    def __init__(self, fail_query: str) -> None:
        self.inner, self.fail_query = ScoreTask(FIELD), fail_query
        for name in ("kind", "require_labels", "score_field", "columns"):
            setattr(self, name, getattr(self.inner, name))

    def spec(self) -> dict[str, Any]:
        return self.inner.spec()

    def setup(self) -> None:
        self.inner.setup()

    def process(self, pairs: list[Pair]) -> Any:
        if any(p.query_id == self.fail_query for p in pairs):
            raise RuntimeError("injected failure")
        return self.inner.process(pairs)

    def arrow(self, records: list[dict[str, Any]]) -> Any:
        return self.inner.arrow(records)

    def close(self) -> None:
        self.inner.close()


def test_a_failed_run_resumes_without_duplicates(tmp_path: Path) -> None:
    pairs = _pairs([2] * 30)
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    with pytest.raises(RuntimeError, match="injected"):
        _run(tmp_path, src, "o", task=_FailOn("q20"), shard_bytes=400)
    directory = tmp_path / "o"
    manifest = json.loads((directory / MANIFEST).read_text())
    n_before = len(manifest["parts"])
    assert 0 < n_before < manifest["n_shards"]
    assert not list(directory.glob(".part-*.tmp"))  # the failed part's temp file is gone
    # a part renamed into place but never recorded (killed between the two) is redone
    stray = directory / f"part-{n_before:05d}.jsonl"
    stray.write_text('{"stray": true}\n')
    report = _run(tmp_path, src, "o", shard_bytes=400)
    assert report.n_resumed == n_before
    back = list(iter_input_pairs([directory]))
    assert [(p.query_id, p.snippet_id) for p in back] == [(p.query_id, p.snippet_id) for p in pairs]
    assert report.new_stats["pairs"] == len(pairs) - sum(
        e["pairs"] for e in manifest["parts"].values())
    with pytest.raises(DataError, match="differs in shard_bytes"):
        _run(tmp_path, src, "o", shard_bytes=401)


def test_changed_input_is_not_resumed(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_pairs(_pairs([2, 2]), src)
    _run(tmp_path, src, "o")
    write_pairs(_pairs([2, 3]), src)
    with pytest.raises(DataError, match="differs in inputs"):
        _run(tmp_path, src, "o")


def test_filter_task_keeps_what_the_filter_keeps(tmp_path: Path) -> None:
    from ragsieve.calibration import make_calibrator
    from ragsieve.filter import ConformalFilter
    from ragsieve.scoring import resolve_scorer

    pairs = _pairs([4, 3, 5, 2] * 10)
    flt = ConformalFilter(resolve_scorer(FIELD), make_calibrator("marginal", alpha=0.2))
    flt.calibrate(pairs)
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    report = _run(tmp_path, src, "f.jsonl", task=FilterTask(flt.to_dict()), shard_bytes=500)
    lines = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    expected = flt.filter_pairs(pairs)
    assert [x["query_id"] for x in lines] == list(expected)
    assert all(x["kept"] == expected[x["query_id"]].kept_ids for x in lines)
    assert report.stats["kept"] == sum(len(r.kept) for r in expected.values())
    other = ConformalFilter(resolve_scorer(FIELD), make_calibrator("marginal", alpha=0.3))
    other.calibrate(pairs)  # another artifact into the same parts: refused, not mixed
    _run(tmp_path, src, "fdir", task=FilterTask(flt.to_dict()), shard_bytes=500)
    with pytest.raises(DataError, match="differs in task"):
        _run(tmp_path, src, "fdir", task=FilterTask(other.to_dict()), shard_bytes=500)


# ----------------------------------------------------------------------------- CLI


def _cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> Any:
    proc = subprocess.run([RAGSIEVE, "-q", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_score_then_calibrate_on_the_outside_score(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_pairs(_pairs([4, 3, 5, 2] * 10), src)
    out = tmp_path / "scores"
    proc = _cli("score", "--data", str(src), "--out", str(out), "--scorer", "field",
                "--score-field", "bm25", "--higher-is-better", "--shard-bytes", "900", "--json")
    info = json.loads(proc.stdout)
    assert info["pairs"] == 140 and info["n_shards"] > 5 and info["engine"]["engine"] == "local"
    art = tmp_path / "f.json"
    _cli("calibrate", "--data", str(out), "--scorer", "field", "--score-field", "score",
         "--out", str(art))
    assert json.loads(art.read_text())["scorer"]["field"] == "score"


def test_cli_engine_errors_are_one_line(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_pairs(_pairs([2, 2]), src)
    cases = [
        (["score", "--data", str(src), "--out", str(tmp_path / "o"), "--scorer", "best"],
         "--scorer best is fitted when a filter is calibrated"),
        (["score", "--data", str(src), "--out", str(tmp_path / "o1"), "--scorer", "auto"],
         "--scorer auto is chosen and fitted when a filter is calibrated"),
        (["score", "--data", str(src), "--out", str(tmp_path / "o2"), "--workers", "2"],
         "--ray-address and --workers apply to --engine ray only"),
        (["score", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o3")],
         "none.jsonl"),
    ]
    for argv, message in cases:
        proc = _cli(*argv, check=False)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_engine_ray_without_ray_names_the_extra(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_pairs(_pairs([2, 2]), src)
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('No module named ray (test)')\n")
    proc = _cli("score", "--data", str(src), "--out", str(tmp_path / "o"), "--scorer", "field",
                "--score-field", "bm25", "--engine", "ray",
                env={"PYTHONPATH": str(blocker)}, check=False)
    assert proc.returncode == 2
    assert "pip install 'ragsieve[ray]'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_killed_score_run_resumes_to_the_same_output(tmp_path: Path, minilm_scorer: Any,
                                                     xquad_en: list[Pair],
                                                     embedding_cache_dir: Path) -> None:
    """SIGKILL a real `ragsieve score` (MiniLM) after its first parts, rerun: the output
    equals an uninterrupted run's, each pair once."""
    pairs = [p for p in xquad_en if p.group in {p.group for p in xquad_en[:1]}][:600]
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    out = tmp_path / "o"
    argv = [RAGSIEVE, "-q", "score", "--data", str(src), "--out", str(out), "--shard-bytes",
            "20000", "--no-cache"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline:
        manifest = out / MANIFEST
        if manifest.exists() and len(json.loads(manifest.read_text())["parts"]) >= 2:
            break
        if proc.poll() is not None:
            pytest.fail(f"finished before it could be killed: {proc.stderr.read()!r}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = json.loads((out / MANIFEST).read_text())
    assert not first["complete"] and len(first["parts"]) < first["n_shards"]
    done = _cli(*argv[2:], "--json")
    info = json.loads(done.stdout)
    assert info["n_resumed"] >= 2 and info["pairs"] == len(pairs)
    back = list(iter_input_pairs([out]))
    assert [(p.query_id, p.snippet_id) for p in back] == [(p.query_id, p.snippet_id) for p in pairs]
    expected = minilm_scorer.score_pairs(pairs)
    assert np.allclose([p.meta["score"] for p in back], expected, atol=1e-6)
