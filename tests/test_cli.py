"""The ragsieve command line on a small real JSONL file (exported from XQuAD English)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_jsonl(xquad_en,  # type: ignore[no-untyped-def]
                tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--alpha", "0.1,0.2",
                        "--splits", "3", "--cache-dir", str(embedding_cache_dir), "--json",
                        "--plot", str(plot)], capsys)
    assert code == 0
    report = json.loads(out)
    pairs = read_pairs(small_jsonl)
    assert report["n_snippets"] == len(pairs)
    assert report["n_queries"] == len({p.query_id for p in pairs})
    assert report["n_relevant"] == sum(p.relevant for p in pairs)
    methods = {r["method"] for r in report["results"]}
    assert methods == {"conformal", "top-k", "threshold", "top-k (calibrated)",
                       "threshold (calibrated)"}
    conf = [r for r in report["results"] if r["method"] == "conformal"]
    assert [r["alpha"] for r in conf] == [0.1, 0.2] and conf[0]["target"] == pytest.approx(0.9)
    for r in report["results"]:
        assert 0.0 <= r["coverage_mean"] <= 1.0 and 0.0 <= r["removal_mean"] <= 1.0
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_evaluate_table(small_jsonl: Path, embedding_cache_dir: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--alpha", "0.2",
                        "--splits", "2", "--top-k", "2", "--thresholds", "0.6",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    assert "alpha=0.2" in out and "k=2" in out and "keep 1 - cos <= 0.6" in out


def test_calibrate_then_filter(small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "filter.json"
    # 1 - cos: every relevant pair calibrates (the fused default spends a quarter of the
    # topics on fitting its weights, so its in-sample coverage is not bounded below)
    code, out, _ = run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "0.1",
                        "--scorer", "embedding", "--out", str(out_path),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "tau=" in out
    artifact = json.loads(out_path.read_text())
    tau = artifact["calibration"]["state"]["threshold"]
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--json", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    pairs = read_pairs(small_jsonl)
    assert len(lines) == len({p.query_id for p in pairs})
    for line in lines:
        assert all(s <= tau for s in line["scores"]) and len(line["kept"]) == len(line["scores"])
    kept = {(line["query_id"], sid) for line in lines for sid in line["kept"]}
    rel = [(p.query_id, p.snippet_id) for p in pairs if p.relevant]
    # calibrated on these very pairs: in-sample coverage of relevant snippets is >= 1 - alpha,
    # up to the one snippet whose calibration score IS tau: `filter` rescores it in another
    # batch, and the float rounding of a different batch may put it one ulp above tau
    assert sum(r in kept for r in rel) >= math.ceil(0.9 * (len(rel) + 1)) - 1


def test_export_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           shared_data_dir: Path) -> None:
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
        (["filter", "--filter", "/nonexistent/filter.json", "--data", "x.jsonl"],
         "cannot read filter artifact"),
    ],
)
def test_errors_are_one_line(argv: list[str], message: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_alpha_is_a_clean_error(small_jsonl: Path, embedding_cache_dir: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "1.5",
                        "--out", "/tmp/x.json", "--cache-dir", str(embedding_cache_dir)], capsys)
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
    code, _, _ = run(["-q", "calibrate", "--data", str(small_jsonl), "--scorer", "best",
                      "--alpha", "0.2", "--out", str(out_path),
                      "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    artifact = json.loads(out_path.read_text())
    spec = artifact["scorer"]
    # five features (the score and its four list transforms) per signal: the base and the
    # default preset's others
    assert spec["scorer"] == "fusion" and spec["preset"] == "fast"
    assert len(spec["weights"]) == 5 * (1 + len(spec["signals"])) == len(spec["features"])
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--json", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    tau = artifact["calibration"]["state"]["threshold"]
    assert lines and all(s <= tau for line in lines for s in line["scores"])


def test_evaluate_best_reports_calibrated_baselines(small_jsonl: Path, embedding_cache_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "evaluate", "--data", str(small_jsonl), "--scorer", "best",
                        "--alpha", "0.2", "--splits", "3", "--json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
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
    assert run(["-q", "calibrate", "--scorer", "embedding", "--data", str(small_jsonl),
                "--alpha", "0.2", "--out", str(filt), "--cache-dir", str(embedding_cache_dir)],
               capsys)[0] == 0
    code, out, _ = run(["-q", "query", "Which planet is the largest?",
                        "--index", str(tmp_path / "idx"), "--filter", str(filt), "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["hits"][0]["path"].endswith("jupiter.txt") and result["hits"][0]["kept"] is True
    assert all(h["kept"] == (h["score"] <= result["threshold"]) for h in result["hits"])


def test_query_with_best_artifact_and_serve_index(tmp_path: Path, embedding_cache_dir: Path,
                                                  small_jsonl: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`query` with a fused (`best`) artifact, and `serve --index` answering POST /query."""
    import socket
    import time

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")

    docs = _docs(tmp_path,
                 **{"rome.txt": "Rome was founded, according to legend, in 753 BC by Romulus."})
    idx = str(tmp_path / "idx")
    assert run(["-q", "index", str(docs), "--index", idx], capsys)[0] == 0
    best = tmp_path / "best.json"
    assert run(["-q", "calibrate", "--data", str(small_jsonl), "--scorer", "best", "--alpha", "0.2",
                "--out", str(best), "--cache-dir", str(embedding_cache_dir)], capsys)[0] == 0
    code, out, _ = run(["-q", "query", "Which planet is the largest?", "--index", idx,
                        "--filter", str(best),
                        "--json", "-k", "3"], capsys)
    assert code == 0
    result = json.loads(out)
    hits = result["hits"]
    # fused, not 1 - cos
    assert len(hits) == 3 and all(h["filter_score"] != h["score"] for h in hits)
    assert all(h["kept"] == (h["filter_score"] <= result["threshold"]) for h in hits)
    # the index ranks by 1 - cos; whether the fused score keeps a hit of a 3-document toy
    # list is the calibrated rule's business (checked above), not a property of the index
    assert hits[0]["path"].endswith("jupiter.txt")

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
        no_key = httpx.post(url + "/query", json={"query": "Which planet is the largest?"})
        assert no_key.status_code == 401
        r = httpx.post(url + "/query", json={"query": "Which planet is the largest?", "k": 3},
                       headers={"X-API-Key": "k3y"}, timeout=60)
        assert r.status_code == 200, r.text
        served = r.json()
        assert [(h["snippet_id"], h["kept"]) for h in served["hits"]] == [
            (h["snippet_id"], h["kept"]) for h in hits]
        assert [h["score"] for h in served["hits"]] == pytest.approx(
            [h["filter_score"] for h in hits], abs=1e-5)
        assert httpx.post(url + "/query", json={"query": "q", "k": 6},
                          headers={"X-API-Key": "k3y"}).status_code == 413
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ------------------------------------------------------------ parser, modes, outside scores
def test_mode_is_never_read_as_model(capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import build_parser

    args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                      "--mode", "query-all"])
    assert args.mode == "query-all" and args.model is None
    for abbreviated in (["--mod", "query-all"], ["--mode", "query"], ["--cache", "/tmp"]):
        with pytest.raises(SystemExit) as exc:
            main(["calibrate", "--data", "x.jsonl", "--out", "f.json", *abbreviated])
        assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:  # the top parser takes no abbreviation either
        main(["--verb", "export", "--data", "selqa-dev", "--out", "x.jsonl"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --mod" in err and "invalid choice: 'query'" in err


def test_calibrate_query_all_then_filter(small_jsonl: Path, embedding_cache_dir: Path,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "query-all.json"
    code, out, _ = run(["-q", "calibrate", "--data", str(small_jsonl), "--mode", "query-all",
                        "--alpha", "0.2", "--out", str(out_path),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "mode query-all:" in out and "tau=" in out and "n=" in out
    artifact = json.loads(out_path.read_text())
    assert artifact["calibration"]["mode"] == "query-all"
    tau = artifact["calibration"]["state"]["threshold"]
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "mode query-all:" in out.splitlines()[-1]
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--json", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len({p.query_id for p in read_pairs(small_jsonl)})
    assert all(s <= tau for line in lines for s in line["scores"])


def test_calibrate_budget_mode_then_filter(small_jsonl: Path, embedding_cache_dir: Path,
                                           tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "budget.json"
    code, out, _ = run(["-q", "calibrate", "--data", str(small_jsonl), "--mode", "budget",
                        "--budget", "800", "--out", str(out_path),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "mode budget:" in out
    assert json.loads(out_path.read_text())["calibration"]["mode"] == "budget"
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--json", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    text = {(p.query_id, p.snippet_id): p.text for p in read_pairs(small_jsonl)}
    lines = [json.loads(line) for line in out.splitlines()]
    assert any(line["kept"] for line in lines)
    for line in lines:  # the best snippets that fit in 800 characters
        assert sum(len(text[(line["query_id"], sid)]) for sid in line["kept"]) <= 800


def test_calibrate_group_mode_then_filter(small_jsonl: Path, embedding_cache_dir: Path,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Group mode: the group of every pair comes from its ``half`` meta field."""
    pairs = read_pairs(small_jsonl)
    topics = sorted({p.group for p in pairs})
    data = tmp_path / "halves.jsonl"
    write_pairs([replace(p, meta={**p.meta, "half": "a" if topics.index(p.group) % 2 else "b"})
                 for p in pairs], data)
    out_path = tmp_path / "group.json"
    code, out, _ = run(["-q", "calibrate", "--data", str(data), "--mode", "group",
                        "--group-by", "half", "--alpha", "0.2", "--out", str(out_path),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "mode group:" in out
    artifact = json.loads(out_path.read_text())
    assert artifact["calibration"]["mode"] == "group"
    assert artifact["calibration"]["group_by"] == "half"
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(data), "--json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and len(out.splitlines()) == len({p.query_id for p in pairs})
    # the data without the group field: a one-line error naming the field
    code, _, err = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 2 and "half" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "group"], "--group-by"),
        (["--mode", "budget"], "--budget"),
        (["--score-field", "rerank"], "--scorer field"),
        (["--higher-is-better"], "--scorer field"),
        (["--scorer", "field"], "--score-field"),
        # a scorer's own flag given to a scorer that would ignore it
        (["--preset", "reader"], "--preset reader applies to --scorer best (got --scorer auto"),
        (["--scorer", "best", "--preset", "reader", "--reader-fit-pairs", "100"],
         "--reader-fit-pairs 100 applies to --scorer reader (got --scorer best"),
        (["--scorer", "embedding", "--reader-base", "all-MiniLM-L6-v2"],
         "--reader-base all-MiniLM-L6-v2 applies to --scorer best or auto or reader"),
        (["--scorer", "best", "--relative-kind", "z"], "applies to --scorer relative"),
        (["--scorer", "embedding", "--reader-check", "never"], "applies to --scorer auto"),
        (["--scorer", "embedding", "--llm-mode", "rating"], "applies to --scorer llm"),
    ],
)
def test_option_combinations_are_checked(extra: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["calibrate", "--data", str(tmp_path / "absent.jsonl"),
                        "--out", str(tmp_path / "f.json"), *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "f.json").exists()


def test_a_scorers_own_flags_pass_where_they_apply(small_jsonl: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The check refuses only what would be ignored: each scorer's own flag, and any flag at
    its default, reaches the data (here: a missing file, the next error)."""
    for extra in (["--scorer", "best", "--preset", "portable", "--reader-check", "auto"],
                  ["--scorer", "reader", "--reader-fit-pairs", "100"],
                  ["--scorer", "relative", "--relative-kind", "z"],
                  ["--reader-check", "never"], ["--reader-base", "all-MiniLM-L6-v2"]):
        code, _, err = run(["calibrate", "--data", str(tmp_path / "absent.jsonl"),
                            "--out", str(tmp_path / "f.json"), *extra], capsys)
        assert code == 2 and "absent.jsonl" in err and "applies to" not in err, (extra, err)
    code, _, err = run(["evaluate", "--data", str(small_jsonl), "--preset", "portable"], capsys)
    assert code == 2 and "--preset portable applies to --scorer best" in err
    # auto's reader check takes the base given; with no check, there is no reader to set
    from ragsieve.cli import build_parser
    from ragsieve.cli.scorers import ScorerRequest, scorer_choice

    args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                      "--reader-base", "all-MiniLM-L6-v2"])
    auto = scorer_choice(ScorerRequest.from_args(args), resolve_auto=False).scorer
    assert auto.name == "auto" and auto.reader_base == "all-MiniLM-L6-v2"
    code, _, err = run(["calibrate", "--data", str(small_jsonl), "--out", str(tmp_path / "f.json"),
                        "--reader-check", "never", "--reader-base", "all-MiniLM-L6-v2"], capsys)
    assert code == 2 and "reader_check='never'" in err and len(err.strip().splitlines()) == 1
    # evaluate chooses auto's score without the reader check: its flags would be ignored
    for extra in (["--reader-check", "always"], ["--reader-base", "all-MiniLM-L6-v2"]):
        code, _, err = run(["evaluate", "--data", str(small_jsonl), *extra], capsys)
        assert code == 2 and "without the reader check" in err and "--preset reader" in err, err
        assert len(err.strip().splitlines()) == 1


def test_score_field_needs_field_scorer_in_evaluate(small_jsonl: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["evaluate", "--data", str(small_jsonl), "--score-field", "rerank"], capsys)
    assert code == 2 and "--scorer field" in err


@pytest.fixture()
def rerank_jsonl(small_jsonl: Path, tmp_path: Path) -> Path:
    """The small file with an outside ``rerank`` score (higher = more relevant)."""
    import numpy as np

    rng = np.random.default_rng(0)
    pairs = read_pairs(small_jsonl)
    noise = rng.uniform(size=len(pairs))
    path = tmp_path / "rerank.jsonl"
    write_pairs([replace(p, meta={**p.meta, "rerank": round(float(0.5 * u + 0.5 * p.relevant), 4)})
                 for p, u in zip(pairs, noise)], path)
    return path


def test_field_scorer_calibrate_filter_evaluate(rerank_jsonl: Path, small_jsonl: Path,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    field = ["--scorer", "field", "--score-field", "rerank", "--higher-is-better"]
    out_path = tmp_path / "field.json"
    code, out, _ = run(["-q", "calibrate", "--data", str(rerank_jsonl), *field, "--alpha", "0.1",
                        "--out", str(out_path)], capsys)
    assert code == 0 and "mode marginal:" in out
    artifact = json.loads(out_path.read_text())
    assert artifact["scorer"] == {"scorer": "field", "field": "rerank", "higher_is_better": True}
    tau = artifact["calibration"]["state"]["threshold"]
    code, out, _ = run(["-q", "filter", "--filter", str(out_path), "--data", str(rerank_jsonl),
                        "--json"], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    pairs = {(p.query_id, p.snippet_id): p for p in read_pairs(rerank_jsonl)}
    for line in lines:  # higher is better: stored negated, printed in the field's own units
        assert line["keep_if"] == ">=" and line["score_name"] == "rerank"
        assert line["threshold"] is None or line["threshold"] == pytest.approx(-tau)
        assert all(s >= -tau for s in line["scores"])
        assert [pairs[(line["query_id"], sid)].meta["rerank"] for sid in line["kept"]] == \
            pytest.approx(line["scores"])
    kept = {(line["query_id"], sid) for line in lines for sid in line["kept"]}
    relevant = [key for key, p in pairs.items() if p.relevant]
    assert sum(key in kept for key in relevant) / len(relevant) >= 0.9  # in-sample
    # relevant pairs have rerank >= 0.5 > every other pair's, so tau <= -0.5 drops the rest
    assert all(pairs[key].relevant for key in kept)

    code, out, _ = run(["-q", "evaluate", "--data", str(rerank_jsonl), *field, "--alpha", "0.2",
                        "--splits", "2", "--json"], capsys)
    assert code == 0 and json.loads(out)["scorer"]["scorer"] == "field"

    # the artifact reads `rerank`: data without it is a one-line error naming the field
    code, _, err = run(["-q", "filter", "--filter", str(out_path), "--data", str(small_jsonl)],
                       capsys)
    assert code == 2 and "rerank" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [(None, "rerank"), ("high", "rerank"), (float("nan"), "NaN")],  # NaN: not valid JSON
    ids=["missing", "text", "nan"],
)
def test_field_scorer_bad_value_names_file_and_line(rerank_jsonl: Path, tmp_path: Path,
                                                    bad: object, message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = rerank_jsonl.read_text().splitlines()
    record = json.loads(lines[2])
    if bad is None:
        del record["rerank"]
    else:
        record["rerank"] = bad
    lines[2] = json.dumps(record)  # NaN is written as the (non-standard) token NaN
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out_path = tmp_path / "f.json"
    code, _, err = run(["-q", "calibrate", "--data", str(path), "--scorer", "field",
                        "--score-field", "rerank", "--out", str(out_path)], capsys)
    assert code == 2 and f"{path.name}:3: " in err and message in err
    assert len(err.strip().splitlines()) == 1 and not out_path.exists()


def test_type_error_is_a_bug_not_a_clean_error(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    from ragsieve.cli import indexing

    def broken(args: object) -> int:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(indexing, "cmd_export", broken)
    with pytest.raises(TypeError, match="unsupported operand"):
        main(["export", "--data", "selqa-dev", "--out", str(tmp_path / "x.jsonl")])


# ------------------------------------------------------------ hardening (issue 11)
@pytest.mark.parametrize("with_filter", [False, True])
def test_query_refuses_a_missing_index(tmp_path: Path, with_filter: bool,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped index path is a one-line error (exit 2), and no directory is created."""
    missing = tmp_path / "no-such-dir"
    extra = ["--filter", str(tmp_path / "f.json")] if with_filter else []
    code, out, err = run(["-q", "query", "Who?", "--index", str(missing), *extra], capsys)
    assert code == 2 and out == ""
    assert f"index {str(missing)!r} does not exist" in err and "ragsieve index" in err
    assert len(err.strip().splitlines()) == 1 and not missing.exists()


def test_serve_refuses_a_directory_that_is_not_an_index(tmp_path: Path, small_jsonl: Path,
                                                        embedding_cache_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn")
    filt = tmp_path / "f.json"
    assert run(["-q", "calibrate", "--data", str(small_jsonl), "--alpha", "0.2", "--out", str(filt),
                "--cache-dir", str(embedding_cache_dir)], capsys)[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(  # a process: were the index accepted, it would serve until killed
        [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(filt), "--index",
         str(empty), "--port", str(port), "--cache-dir", str(embedding_cache_dir)],
        capture_output=True, text=True, timeout=120, check=False)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "not a ragsieve index" in err, err
    assert len(err.splitlines()) == 1 and list(empty.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["evaluate", "--data", "x.jsonl", "--thresholds", "nan"], "--thresholds: expected finite numbers"),
        (["evaluate", "--data", "x.jsonl", "--thresholds", "0.2,inf"], "expected finite numbers"),
        (["evaluate", "--data", "x.jsonl", "--alpha", "nan"], "expected finite numbers"),
        (["evaluate", "--data", "x.jsonl", "--thresholds", ","], "expected at least one number"),
        (["evaluate", "--data", "x.jsonl", "--limit-queries", "0"],
         "--limit-queries: expected an integer >= 1, got '0'"),
        (["evaluate", "--data", "x.jsonl", "--limit-queries", "-3"], "integer >= 1"),
        (["evaluate", "--data", "x.jsonl", "--splits", "0"], "--splits: expected an integer >= 1"),
        (["evaluate", "--data", "x.jsonl", "--top-k", "2,0"], "--top-k: expected integers >= 1"),
        (["evaluate", "--data", "x.jsonl", "--calibration-fraction", "1"],
         "--calibration-fraction: expected a number in (0, 1), got '1'"),
        (["evaluate", "--data", "x.jsonl", "--budget", "800,-1"], "--budget"),
        (["evaluate", "--data", "x.jsonl", "--delta", "nan"], "--delta"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--alpha", "nan"], "--alpha"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--min-keep", "-1"],
         "--min-keep: expected an integer >= 0"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--budget", "0"], "--budget"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--gamma", "inf"], "--gamma"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--window", "0"], "--window"),
        (["calibrate", "--data", "x.jsonl", "--out", "f.json", "--min-group-size", "0"],
         "--min-group-size"),
        (["label", "--data", "x.jsonl", "--out", "o.jsonl", "--limit-queries", "0"],
         "--limit-queries"),
        (["label", "--data", "x.jsonl", "--out", "o.jsonl", "--threshold", "nan"], "--threshold"),
        (["label", "--data", "x.jsonl", "--out", "o.jsonl", "--price-per-million-tokens", "-1"],
         "--price-per-million-tokens"),
        (["label", "--data", "x.jsonl", "--out", "o.jsonl", "--llm-concurrency", "0"],
         "--llm-concurrency"),
        (["query", "q", "--index", "idx", "-k", "0"], "-k"),
        (["index", "docs", "--index", "idx", "--batch-size", "0"], "--batch-size"),
        (["serve", "--filter", "f.json", "--port", "70000"],
         "--port: expected a port number in [0, 65535]"),
        (["serve", "--filter", "f.json", "--max-k", "0"], "--max-k"),
        (["serve", "--filter", "f.json", "--max-body-bytes", "0"], "--max-body-bytes"),
        (["rag-demo", "--alpha", "inf"], "--alpha"),
        (["shift-demo", "--gamma", "nan"], "--gamma"),
        (["demo", "--splits", "0"], "--splits"),
        (["llm", "serve", "--n-ctx", "0"], "--n-ctx"),
        (["llm", "injection", "--data", "x.jsonl", "--n-pairs", "0"], "--n-pairs"),
    ],
)
def test_numeric_options_are_checked(argv: list[str], message: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """NaN / inf and out-of-range counts are usage errors (exit 2) before any work."""
    monkeypatch.chdir(tmp_path)  # were a value accepted, a demo would write its folder here
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_filter_json_reports_the_kept_spans_of_a_cut_snippet(
        small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A snippet longer than the filter's window is cut; ``--json`` says which parts were kept."""
    filt = tmp_path / "f.json"
    assert run(["-q", "calibrate", "--scorer", "embedding", "--data", str(small_jsonl),
                "--alpha", "0.2", "--out", str(filt), "--cache-dir", str(embedding_cache_dir)],
               capsys)[0] == 0
    filler = " ".join(f"The committee met on day {i} to discuss the annual budget of the town "
                      "library and its opening hours." for i in range(40))
    answer = "Jupiter is the largest planet in the Solar System."
    long_text = f"{filler} {answer} {filler}"
    data = tmp_path / "long.jsonl"
    write_pairs([replace(p, query_id="q", query="Which planet is the largest?", snippet_id=sid,
                         text=text, relevant=None)
                 for p, (sid, text) in zip(read_pairs(small_jsonl)[:2],
                                           [("long", long_text), ("short", answer)])], data)
    code, out, _ = run(["-q", "filter", "--filter", str(filt), "--data", str(data), "--json",
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    line = json.loads(out)
    assert line["kept"] == ["long", "short"] and line["n_cut"] == 1
    assert len(line["spans"]) == len(line["kept"]) and line["spans"][1] == []
    spans = line["spans"][0]
    assert spans and all(0 <= a < b <= len(long_text) for a, b in spans)
    start = long_text.index(answer)
    assert any(a <= start and start + len(answer) <= b for a, b in spans)
    assert sum(b - a for a, b in spans) < len(long_text) / 2  # the filler far away is not kept
    code, out, _ = run(["-q", "filter", "--filter", str(filt), "--data", str(data),
                        "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "kept characters " in out


@pytest.mark.slow
def test_rag_demo_writes_only_under_out(tmp_path: Path, embedding_cache_dir: Path,
                                        shared_data_dir: Path) -> None:
    """``rag-demo`` run from a checkout-like folder leaves nothing there: everything goes
    under ``--out`` (and the embedding cache under ``--cache-dir``)."""
    cwd, out = tmp_path / "checkout", tmp_path / "elsewhere" / "rag"
    cwd.mkdir()
    env = {**os.environ, "RAGSIEVE_DATA": str(shared_data_dir)}
    before = set(tmp_path.rglob("*"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ragsieve"), "-q", "rag-demo", "--out", str(out),
         "--cache-dir", str(tmp_path / "cache"), "--question", "Which planet is the largest?"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "kept " in proc.stdout and (out / "filter.json").is_file()
    assert list(cwd.iterdir()) == []
    new = set(tmp_path.rglob("*")) - before
    outside = [p for p in new if not (p.is_relative_to(out) or p.is_relative_to(tmp_path / "cache")
                                      or p in (out.parent, tmp_path / "cache"))]
    assert outside == []


@pytest.mark.parametrize("command", ["calibrate", "evaluate", "choose-alpha"])
def test_data_help_names_every_selqa_split(command: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``--data``'s help lists every SelQA split the loader takes, not dev only (issue 34)."""
    from ragsieve.data.registry import available_datasets

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # wrapped at hyphens
    for name in available_datasets():
        if name.startswith("selqa-"):
            assert name in text, (command, name)
