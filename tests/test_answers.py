"""Downstream answer evaluation (``evaluate_answers``, ``ragsieve answers``) on real XQuAD-en.

Model-free rows run on the real MiniLM scores; the generated-answer path runs the real
local model on a few queries; failure injection uses the loopback double.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from llm_doubles import FakeLLMServer

from ragsieve.cli import main
from ragsieve.errors import DataError
from ragsieve.evaluation import AnswerConfig, evaluate_answers, format_answer_table
from ragsieve.evaluation.answers import write_per_query

METHODS = {"all", "conformal", "top-k (equal size)", "top-k (calibrated)"}


@pytest.fixture(scope="module")
def model_free(xquad_en, minilm_scorer, xquad_en_scores):  # type: ignore[no-untyped-def]
    """One split, model-free metrics on every test query (the scores come from the cache)."""
    return evaluate_answers(xquad_en, minilm_scorer, AnswerConfig(alphas=(0.05, 0.2, 0.4),
                                                                  generate=False, seed=3))


def test_every_method_has_a_row_with_intervals(model_free) -> None:  # type: ignore[no-untyped-def]
    rows = model_free.results
    assert {r["method"] for r in rows} == METHODS
    assert len(rows) == 1 + 3 * 3
    for r in rows:
        assert r["n_queries"] == model_free.info["n_queries_evaluated"] > 200
        for key in ("answer_in_context_mean", "context_chars_mean", "context_tokens_mean"):
            assert r[key] is not None and math.isfinite(r[key])
        if r["method"] == "all":
            assert r["ci"] == {}
            continue
        ci = r["ci"]["answer_in_context"]
        assert ci["low"] <= ci["estimate"] <= ci["high"]
        assert ci["estimate"] == pytest.approx(r["answer_in_context_mean"] - rows[0]["answer_in_context_mean"])
    assert "em_mean" not in rows[0] and model_free.info["generated"] is False


def test_all_holds_the_answer_and_filters_shrink_the_context(model_free) -> None:  # type: ignore[no-untyped-def]
    everything = model_free.row("all")
    # every XQuAD question's answer lies in its article, which is the retrieved list
    assert everything["answer_in_context_mean"] > 0.97
    conformal = [model_free.row("conformal", a) for a in (0.05, 0.2, 0.4)]
    sizes = [r["context_chars_mean"] for r in conformal]
    assert sizes[0] > sizes[1] > sizes[2]  # a larger alpha keeps less
    assert sizes[0] < everything["context_chars_mean"]
    for r in conformal:
        assert r["answer_in_context_mean"] <= everything["answer_in_context_mean"] + 1e-12
        assert r["ci"]["context_chars"]["high"] < 0  # significantly shorter than all
    # the relevant snippet holds the answer: keeping ~1 - alpha of the relevant snippets
    # keeps the answer for at least about that share of queries
    assert conformal[0]["answer_in_context_mean"] > 0.9


def test_equal_size_topk_matches_the_conformal_context_size(model_free) -> None:  # type: ignore[no-untyped-def]
    for a in (0.05, 0.2, 0.4):
        conformal, equal = model_free.row("conformal", a), model_free.row("top-k (equal size)", a)
        assert equal["context_snippets_mean"] == pytest.approx(conformal["context_snippets_mean"], abs=1e-9)
        assert equal["k"] == pytest.approx(conformal["context_snippets_mean"], abs=1e-9)
        calibrated = model_free.row("top-k (calibrated)", a)
        assert float(calibrated["k"]).is_integer()


def test_queries_are_averaged_over_splits_and_limited(xquad_en, minilm_scorer, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    report = evaluate_answers(xquad_en, minilm_scorer, alphas=(0.2,), generate=False, n_splits=3,
                              limit_queries=40, seed=1)
    assert report.info["n_queries_evaluated"] == 40
    assert all(r["n_queries"] == 40 for r in report.results)
    values = report.per_query["all"]
    assert len(values) == 40
    assert all(0.0 <= v["answer_in_context"] <= 1.0 for v in values.values())


def test_queries_without_answers_only_calibrate(xquad_en, minilm_scorer, xquad_en_scores, caplog) -> None:  # type: ignore[no-untyped-def]
    groups = sorted({p.group for p in xquad_en})
    unanswered = set(groups[::2])
    pairs = [p if p.group not in unanswered else dataclasses.replace(
        p, meta={k: v for k, v in p.meta.items() if k != "answers"}) for p in xquad_en]
    report = evaluate_answers(pairs, minilm_scorer, alphas=(0.2,), generate=False)
    assert "have no gold answers" in caplog.text
    evaluated = set(report.per_query["all"])
    assert evaluated and not any(p.query_id in evaluated for p in pairs if p.group in unanswered)
    stripped = [dataclasses.replace(p, meta={}) for p in xquad_en]
    with pytest.raises(DataError, match="no query carries gold answers"):
        evaluate_answers(stripped, minilm_scorer, alphas=(0.2,), generate=False)


def test_any_mode_gives_conformal_rows(xquad_en, minilm_scorer, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    report = evaluate_answers(xquad_en, minilm_scorer, alphas=(0.2,), generate=False,
                              modes=("query-all", "group"), limit_queries=60)
    modes = {(r["method"], r.get("mode")) for r in report.results}
    assert {("conformal", "query-all"), ("conformal", "group"), ("top-k (equal size)", "query-all"),
            ("top-k (equal size)", "group")} <= modes
    query_all = next(r for r in report.results if r["method"] == "conformal" and r["mode"] == "query-all")
    group = next(r for r in report.results if r["method"] == "conformal" and r["mode"] == "group")
    # keeping all of a query's evidence never keeps less than the group (here: one language,
    # so marginal) row; on XQuAD 96 % of queries have one relevant snippet, so they often tie
    assert query_all["context_chars_mean"] >= group["context_chars_mean"]
    assert query_all["answer_in_context_mean"] >= group["answer_in_context_mean"]


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="limit_queries == 0"):
        AnswerConfig(limit_queries=0)
    with pytest.raises(ValueError, match="alpha"):
        AnswerConfig(alphas=(1.5,))
    with pytest.raises(ValueError, match="confidence == 1.0"):
        AnswerConfig(confidence=1.0)


def test_per_query_file_and_table(model_free, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    n = write_per_query(model_free, tmp_path / "pq.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "pq.jsonl").read_text().splitlines()]
    assert len(lines) == n == sum(len(v) for v in model_free.per_query.values())
    assert {x["method"] for x in lines} == METHODS
    table = format_answer_table(model_free)
    assert "top-k (equal size)" in table and "in ctx vs all" in table


def _subset(xquad_en, n_topics: int) -> list:  # type: ignore[no-untyped-def]
    groups = sorted({p.group for p in xquad_en})[:n_topics]
    return [p for p in xquad_en if p.group in groups]


def test_cli_json_schema_without_generation(xquad_en, tmp_path: Path, capsys, embedding_cache_dir) -> None:  # type: ignore[no-untyped-def]
    from ragsieve.data import write_pairs

    data = tmp_path / "x.jsonl"
    write_pairs(_subset(xquad_en, 8), data)
    code = main(["-q", "answers", "--data", str(data), "--no-generate", "--alpha", "0.1,0.3",
                 "--cache-dir", str(embedding_cache_dir), "--json", "--plot", str(tmp_path / "a.png")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    row = next(r for r in out["results"] if r["method"] == "conformal" and r["alpha"] == 0.1)
    for key in ("answer_in_context_mean", "context_chars_mean", "context_tokens_mean", "ci"):
        assert key in row
    assert set(row["ci"]["answer_in_context"]) >= {"estimate", "low", "high", "n"}
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_cli_refuses_data_without_answers(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "x.jsonl"
    lines = [{"query_id": f"q{q}", "query": f"question {q}?", "snippet_id": f"s{s}", "text": f"text {q} {s}",
              "relevant": int(s == 0), "group": f"g{q % 4}", "bm25": float(s)} for q in range(8) for s in range(3)]
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code = main(["-q", "answers", "--data", str(data), "--scorer", "field", "--score-field", "bm25",
                 "--no-generate"])
    assert code == 2
    assert "no query carries gold answers" in capsys.readouterr().err


@pytest.mark.slow  # minutes of local-model work: make test-all
def test_generated_answers_with_the_local_model_resume_from_the_cache(xquad_en, minilm_scorer, xquad_en_scores,
                                                                      llm_connection) -> None:  # type: ignore[no-untyped-def]
    config = AnswerConfig(alphas=(0.2,), limit_queries=3, seed=5, judge=True)
    first = evaluate_answers(xquad_en, minilm_scorer, config, connection=llm_connection)
    assert first.info["generated"] and first.info["judged"]
    assert first.info["llm_requests"] > 0
    everything = first.row("all")
    for key in ("em_mean", "f1_mean", "nugget_f1_mean", "answer_chars_mean", "abstained_mean"):
        assert key in everything
    assert 0.0 <= everything["f1_mean"] <= 1.0
    assert everything["em_mean"] <= everything["f1_mean"] + 1e-12
    second = evaluate_answers(xquad_en, minilm_scorer, config, connection=llm_connection)
    assert second.info["llm_requests"] == 0  # every generation and judgement came from the cache
    assert second.info["llm_cache_hits"] > 0
    assert "latency_s_mean" in first.row("all")  # measured on fresh requests only
    assert second.row("all")["latency_s_mean"] is None

    def without_latency(rows):  # type: ignore[no-untyped-def]
        return [{k: v for k, v in r.items() if k != "latency_s_mean"} for r in rows]

    assert without_latency(second.results) == without_latency(first.results)


def test_failed_generations_are_missing_not_wrong(xquad_en, minilm_scorer, xquad_en_scores, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ragsieve.llm import connect

    with FakeLLMServer() as fake:
        fake.script = [("status", 400, '{"error": {"message": "bad request"}}')] * 500
        with connect(base_url=fake.base_url, model="m", style="chat", cache=False, concurrency=1) as conn:
            report = evaluate_answers(xquad_en, minilm_scorer, alphas=(0.2,), limit_queries=2,
                                      connection=conn, judge=False)
    assert report.info["generation_errors"] > 0
    everything = report.row("all")
    assert everything["em_mean"] is None and everything["f1_mean"] is None  # no zero invented
    assert "latency_s_mean" in everything and everything["latency_s_mean"] is None
    assert np.isfinite(everything["answer_in_context_mean"])
