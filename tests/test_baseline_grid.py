"""Fixed-threshold baselines cut at quantiles of the score itself (chosen on each split's
calibration topics) and say their cut-off in the score's own units: on a higher-is-better
BM25 field the rows differ and read ``keep bm25 >= 3.6``; on ``1 - cos`` they stay sensible;
an explicit grid is read in the score's units."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ragsieve import Pair
from ragsieve.cli import main as cli_main
from ragsieve.data import write_pairs
from ragsieve.data.splits import group_splits
from ragsieve.evaluation import (
    DEFAULT_THRESHOLD_QUANTILES,
    ScoredData,
    coverage,
    evaluate,
    removal,
)
from ragsieve.scoring import FieldScorer


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def with_bm25(pairs: list[Pair]) -> list[Pair]:
    """Each pair with ``meta["bm25"]``: the real Okapi BM25 of its query over its query's list."""
    rank_bm25 = pytest.importorskip("rank_bm25")
    by_query: dict[str, list[Pair]] = {}
    for p in pairs:
        by_query.setdefault(p.query_id, []).append(p)
    out: list[Pair] = []
    for ps in by_query.values():
        scores = rank_bm25.BM25Okapi([_words(p.text) for p in ps]).get_scores(_words(ps[0].query))
        out += [dataclasses.replace(p, meta={**p.meta, "bm25": float(s)})
                for p, s in zip(ps, scores, strict=True)]
    return out


@pytest.fixture(scope="module")
def bm25_pairs(xquad_en: list[Pair]) -> list[Pair]:
    return with_bm25(xquad_en)


def _monotone(rows: list[dict]) -> None:
    """Higher quantile: keeps more, so coverage never falls and removal falls."""
    cov = [r["coverage_mean"] for r in rows]
    rm = [r["removal_mean"] for r in rows]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(cov)), cov
    assert all(a > b for a, b in itertools.pairwise(rm)), rm


def test_bm25_baselines_differ_and_read_in_bm25_units(bm25_pairs: list[Pair]) -> None:
    rep = evaluate(bm25_pairs, FieldScorer("bm25", higher_is_better=True), alphas=[0.1],
                   top_k=[], n_splits=5)
    rows = rep.rows("threshold")
    assert [r["quantile"] for r in rows] == list(DEFAULT_THRESHOLD_QUANTILES)
    # the rows no longer collapse to coverage 1.000 / removal 0.000
    assert min(r["coverage_mean"] for r in rows) < 0.9
    assert max(r["removal_mean"] for r in rows) > 0.8
    _monotone(rows)
    for r in rows:  # each cut-off keeps about its quantile's share of the snippets
        assert r["removal_mean"] == pytest.approx(1 - r["quantile"], abs=0.1)
        assert r["keep_rule"]["keep_if"] == ">=" and r["keep_rule"]["score"] == "bm25"
        assert r["keep"] == f"keep bm25 >= {-r['threshold_mean']:.4g}"
    cutoffs = [r["keep_rule"]["threshold"] for r in rows]
    assert all(a > b for a, b in itertools.pairwise(cutoffs)) and cutoffs[0] > 0


def test_explicit_thresholds_are_read_in_the_scores_units(bm25_pairs: list[Pair]) -> None:
    rep = evaluate(bm25_pairs, FieldScorer("bm25", higher_is_better=True), alphas=[0.1],
                   top_k=[], thetas=[3.0], n_splits=1)
    row = rep.rows("threshold")[0]
    assert row["theta"] == 3.0 and row["keep"] == "keep bm25 >= 3"
    topics = ScoredData.from_pairs(bm25_pairs, np.zeros(len(bm25_pairs))).group_index
    _, test = group_splits(topics.tolist(), n_splits=1, seed=0)[0]  # the split evaluate drew
    kept = np.array([bm25_pairs[i].meta["bm25"] >= 3.0 for i in test])
    relevant = np.array([bm25_pairs[i].relevant == 1 for i in test])
    assert row["coverage_mean"] == pytest.approx(coverage(kept, relevant))
    assert row["removal_mean"] == pytest.approx(removal(kept))


def test_cosine_baselines_stay_sensible(xquad_en: list[Pair], minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    groups = sorted({p.group for p in xquad_en})[:8]  # the eight articles test_cli uses
    pairs = [p for p in xquad_en if p.group in groups]
    rows = evaluate(pairs, minilm_scorer, alphas=[0.1], top_k=[], n_splits=4).rows("threshold")
    _monotone(rows)
    for r in rows:
        assert r["keep"].startswith("keep 1 - cos <= ")
        assert 0 < r["keep_rule"]["threshold"] < 1
        assert r["removal_mean"] == pytest.approx(1 - r["quantile"], abs=0.12)
    assert rows[0]["coverage_mean"] < rows[-1]["coverage_mean"]


def test_cli_prints_the_cutoffs_in_bm25_units(bm25_pairs: list[Pair], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bm25.jsonl"
    write_pairs(bm25_pairs, path)
    base = ["-q", "evaluate", "--data", str(path), "--scorer", "field", "--score-field", "bm25",
            "--higher-is-better", "--alpha", "0.1", "--splits", "3", "--top-k", "1"]
    assert cli_main(base) == 0
    table = capsys.readouterr().out
    assert "q=0.1: keep bm25 >= " in table and "q=0.9: keep bm25 >= " in table
    assert cli_main([*base, "--thresholds", "2,4", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["results"] if r["method"] == "threshold"]
    assert [r["keep"] for r in rows] == ["keep bm25 >= 2", "keep bm25 >= 4"]
    assert rows[0]["removal_mean"] < rows[1]["removal_mean"]
    assert cli_main([*base, "--threshold-quantiles", "0.5,1.5"]) == 2
    assert "threshold_quantiles must lie in (0, 1)" in capsys.readouterr().err
