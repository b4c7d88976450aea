"""The ragsieve command line on a small real JSONL file (exported from XQuAD English)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_jsonl(xquad_en, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """Eight XQuAD articles in the generic JSONL format."""
    groups = sorted({p.group for p in xquad_en})[:8]
    path = tmp_path_factory.mktemp("cli") / "small.jsonl"
    write_pairs([p for p in xquad_en if p.group in groups], path)
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_evaluate_json_schema(small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "plot.png"
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--alpha", "0.1,0.2", "--splits", "3",
                        "--cache-dir", str(embedding_cache_dir), "--json", "--plot", str(plot)], capsys)
    assert code == 0
    report = json.loads(out)
    pairs = read_pairs(small_jsonl)
    assert report["n_snippets"] == len(pairs)
    assert report["n_queries"] == len({p.query_id for p in pairs})
    assert report["n_relevant"] == sum(p.relevant for p in pairs)
    methods = {r["method"] for r in report["results"]}
    assert methods == {"conformal", "top-k", "threshold", "top-k (calibrated)", "threshold (calibrated)"}
    conf = [r for r in report["results"] if r["method"] == "conformal"]
    assert [r["alpha"] for r in conf] == [0.1, 0.2] and conf[0]["target"] == pytest.approx(0.9)
    for r in report["results"]:
        assert 0.0 <= r["coverage_mean"] <= 1.0 and 0.0 <= r["removal_mean"] <= 1.0
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_evaluate_table(small_jsonl: Path, embedding_cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--alpha", "0.2", "--splits", "2",
                        "--top-k", "2", "--theta", "0.4", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    assert "alpha=0.2" in out and "k=2" in out and "theta=0.4" in out


def test_calibrate_then_filter(small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "filter.json"
    code, out, _ = run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "0.1", "--out", str(out_path),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "tau=" in out
    artifact = json.loads(out_path.read_text())
    tau = artifact["calibration"]["threshold"]
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl), "--json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    pairs = read_pairs(small_jsonl)
    assert len(lines) == len({p.query_id for p in pairs})
    for line in lines:
        assert all(s <= tau for s in line["scores"]) and len(line["kept"]) == len(line["scores"])
    kept = {(line["query_id"], sid) for line in lines for sid in line["kept"]}
    rel = [(p.query_id, p.snippet_id) for p in pairs if p.relevant]
    # calibrated on these very pairs: in-sample coverage of relevant snippets is >= 1 - alpha
    assert sum(r in kept for r in rel) / len(rel) >= 0.9


def test_export_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_data_dir: Path) -> None:
    out_path = tmp_path / "selqa.jsonl"
    code, _, err = run(["export", "--data", "selqa-dev", "--out", str(out_path)], capsys)
    assert code == 0 and "wrote" in err
    pairs = read_pairs(out_path, require_labels=True)
    assert len({p.group for p in pairs}) == 10


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["evaluate", "--data", "/nonexistent/file.jsonl"], "error"),
        (["evaluate", "--data", "no-such-dataset"], "error"),
        (["filter", "--filter", "/nonexistent/filter.json", "--data", "x.jsonl"], "cannot read filter artifact"),
    ],
)
def test_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_alpha_is_a_clean_error(small_jsonl: Path, embedding_cache_dir: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "1.5", "--out", "/tmp/x.json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 2 and "alpha == 1.5, must be in (0, 1)" in err


def test_console_script_entry_point() -> None:
    exe = Path(sys.executable).parent / "ragsieve"
    proc = subprocess.run(
        [str(exe), "--version"], capture_output=True, text=True, env=os.environ.copy(), check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ragsieve ")


def test_calibrate_best_then_filter(small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "best.json"
    code, _, err = run(["-q", "calibrate", "--data", str(small_jsonl), "--scorer", "best", "--alpha", "0.2",
                        "--out", str(out_path), "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "fusion fitted on" in err
    artifact = json.loads(out_path.read_text())
    assert artifact["scorer"]["scorer"] == "fusion" and len(artifact["scorer"]["weights"]) == 5
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl), "--json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    tau = artifact["calibration"]["threshold"]
    assert lines and all(s <= tau for line in lines for s in line["scores"])


def test_evaluate_best_reports_calibrated_baselines(small_jsonl: Path, embedding_cache_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--scorer", "best", "--alpha", "0.2",
                        "--splits", "3", "--json", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["scorer"]["scorer"] == "fusion"
    methods = {r["method"] for r in report["results"]}
    assert {"top-k (calibrated)", "threshold (calibrated)"} <= methods


def _docs(root: Path, **extra: str | bytes) -> Path:
    """A small document folder: two readable files plus ``extra`` (name -> content)."""
    docs = root / "docs"
    docs.mkdir()
    files: dict[str, str | bytes] = {
        "jupiter.txt": "Jupiter is the largest planet in the Solar System. It has 95 moons.",
        "tesla.md": "Nikola Tesla was an inventor known for alternating current systems.", **extra}
    for name, content in files.items():
        if isinstance(content, bytes):
            (docs / name).write_bytes(content)
        else:
            (docs / name).write_text(content)
    return docs


def test_index_and_query_commands(tmp_path: Path, embedding_cache_dir: Path, small_jsonl: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(tmp_path, **{"bad.txt": b"\xff\xfe not utf-8 \xff"})
    code, out, _ = run(["-q", "index", str(docs), "--index", str(tmp_path / "idx")], capsys)
    assert code == 0 and "2 file(s) added" in out and "skipped" in out and "bad.txt" in out
    code, out, _ = run(["-q", "index", str(docs), "--index", str(tmp_path / "idx")], capsys)
    assert code == 0 and "0 snippet(s) embedded" in out  # unchanged: nothing re-embedded
    filt = tmp_path / "f.json"
    assert run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "0.2", "--out", str(filt),
                "--cache-dir", str(embedding_cache_dir)], capsys)[0] == 0
    code, out, _ = run(["-q", "query", "Which planet is the largest?", "--index", str(tmp_path / "idx"),
                        "--filter", str(filt), "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["hits"][0]["path"].endswith("jupiter.txt") and result["hits"][0]["kept"] is True
    assert all(h["kept"] == (h["score"] <= result["threshold"]) for h in result["hits"])


def test_query_with_best_artifact_and_serve_index(tmp_path: Path, embedding_cache_dir: Path, small_jsonl: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`query` with a fused (`best`) artifact, and `serve --index` answering POST /query."""
    import socket
    import time

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")

    docs = _docs(tmp_path, **{"rome.txt": "Rome was founded, according to legend, in 753 BC by Romulus."})
    idx = str(tmp_path / "idx")
    assert run(["-q", "index", str(docs), "--index", idx], capsys)[0] == 0
    best = tmp_path / "best.json"
    assert run(["-q", "calibrate", "--data", str(small_jsonl), "--scorer", "best", "--alpha", "0.2",
                "--out", str(best), "--cache-dir", str(embedding_cache_dir)], capsys)[0] == 0
    code, out, _ = run(["-q", "query", "Which planet is the largest?", "--index", idx, "--filter", str(best),
                        "--json", "-k", "3"], capsys)
    assert code == 0
    result = json.loads(out)
    hits = result["hits"]
    assert len(hits) == 3 and all(h["filter_score"] != h["score"] for h in hits)  # fused, not 1 - cos
    assert all(h["kept"] == (h["filter_score"] <= result["threshold"]) for h in hits)
    assert hits[0]["path"].endswith("jupiter.txt") and hits[0]["kept"] is True

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAGSIEVE_TEST_KEY": "k3y", "RAGSIEVE_CACHE": str(embedding_cache_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(best), "--index", idx,
         "--port", str(port), "--api-key-env", "RAGSIEVE_TEST_KEY", "--max-k", "5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not come up in 120 s"
            time.sleep(0.3)
        assert httpx.get(url + "/healthz").json()["index"]["n_snippets"] == 3
        assert httpx.post(url + "/query", json={"query": "Which planet is the largest?"}).status_code == 401
        r = httpx.post(url + "/query", json={"query": "Which planet is the largest?", "k": 3},
                       headers={"X-API-Key": "k3y"}, timeout=60)
        assert r.status_code == 200, r.text
        served = r.json()
        assert [(h["snippet_id"], h["kept"]) for h in served["hits"]] == [
            (h["snippet_id"], h["kept"]) for h in hits]
        assert [h["score"] for h in served["hits"]] == pytest.approx([h["filter_score"] for h in hits], abs=1e-5)
        assert httpx.post(url + "/query", json={"query": "q", "k": 6},
                          headers={"X-API-Key": "k3y"}).status_code == 413
    finally:
        proc.terminate()
        proc.wait(timeout=30)
