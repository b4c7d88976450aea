"""``calibrate`` says what it expects on new topics: coverage and removal by topic-disjoint
cross-validation over the calibration topics (mean over folds, lowest and highest fold);
too few topics say so; ``--no-expected`` skips it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_baseline_grid import with_bm25

from ragsieve import Pair
from ragsieve.calibration import make_calibrator
from ragsieve.cli import main as cli_main
from ragsieve.data import write_pairs
from ragsieve.evaluation import ScoredData, expected_on_new_topics
from ragsieve.evaluation.expect import MIN_TOPICS
from ragsieve.scoring import FieldScorer, FusedScorer

BM25 = FieldScorer("bm25", higher_is_better=True)


@pytest.fixture(scope="module")
def bm25_pairs(xquad_en: list[Pair]) -> list[Pair]:
    return with_bm25(xquad_en)


@pytest.fixture(scope="module")
def bm25_jsonl(bm25_pairs: list[Pair], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("expected") / "bm25.jsonl"
    write_pairs(bm25_pairs, path)
    return path


def _by_hand(pairs: list[Pair], alpha: float, n_folds: int = 5, seed: int = 0) -> dict:
    """The documented folds, calibrated and measured without the sweep."""
    scores = BM25.score_pairs(pairs)
    data = ScoredData.from_pairs(pairs, scores)
    topics = np.random.default_rng(seed).permutation(np.unique(data.group_index))
    cov, rm = [], []
    for part in np.array_split(topics, n_folds):
        test = np.isin(data.group_index, part)
        cal = make_calibrator("marginal", alpha=alpha)
        cal.fit(scores[~test], data.relevant[~test])
        kept = cal.predict(scores[test])
        cov.append(kept[data.relevant[test]].mean())
        rm.append(1 - kept.mean())
    return {"coverage": (np.mean(cov), min(cov), max(cov)), "removal": (np.mean(rm), min(rm), max(rm))}


def test_expectation_matches_the_folds_by_hand(bm25_pairs: list[Pair]) -> None:
    e = expected_on_new_topics(bm25_pairs, BM25, alpha=0.1)
    assert e.estimated and e.n_folds == 5 and e.n_topics == 48
    hand = _by_hand(bm25_pairs, 0.1)
    assert (e.coverage, *e.coverage_interval) == pytest.approx(hand["coverage"])
    assert (e.removal, *e.removal_interval) == pytest.approx(hand["removal"])
    assert e.coverage == pytest.approx(0.9, abs=0.03)  # near 1 - alpha on real data
    assert e.coverage_interval[0] <= e.coverage <= e.coverage_interval[1]
    assert str(e).startswith("expected on new topics (5-fold over 48 topics): coverage 0.9")


def test_a_fitted_fused_score_is_refitted_in_every_fold(bm25_pairs: list[Pair]) -> None:
    unfitted = expected_on_new_topics(bm25_pairs, FusedScorer.unfitted(BM25), alpha=0.2)
    fitted = expected_on_new_topics(bm25_pairs, FusedScorer.unfitted(BM25).fitted_on(bm25_pairs),
                                    alpha=0.2)
    assert fitted == unfitted  # weights learnt on every topic would leak into the held-out folds
    assert unfitted.coverage == pytest.approx(0.8, abs=0.05)


def test_calibrate_prints_and_json_carries_the_expectation(
        bm25_jsonl: Path, bm25_pairs: list[Pair], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-q", "calibrate", "--data", str(bm25_jsonl), "--scorer", "field", "--score-field",
            "bm25", "--higher-is-better", "--alpha", "0.1"]
    assert cli_main([*args, "--out", str(tmp_path / "a.json")]) == 0
    human = capsys.readouterr().out
    expected = expected_on_new_topics(bm25_pairs, BM25, alpha=0.1)
    assert str(expected) in human.splitlines()
    assert re.search(r"coverage 0\.\d\d \[0\.\d\d, 0\.\d\d\], removal 0\.\d\d", human)
    assert cli_main([*args, "--out", str(tmp_path / "b.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["expected"]
    assert out["n_folds"] == 5 and out["interval"] == "lowest fold, highest fold"
    assert out["coverage"] == pytest.approx(expected.coverage)
    assert out["removal_interval"] == pytest.approx(list(expected.removal_interval))
    assert cli_main([*args, "--out", str(tmp_path / "c.json"), "--no-expected"]) == 0
    assert "expected on new topics" not in capsys.readouterr().out
    assert cli_main([*args, "--out", str(tmp_path / "d.json"), "--json", "--no-expected"]) == 0
    assert json.loads(capsys.readouterr().out)["expected"] is None


def test_too_few_topics_say_so(bm25_pairs: list[Pair], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    groups = sorted({p.group for p in bm25_pairs})[:MIN_TOPICS - 4]
    few = [p for p in bm25_pairs if p.group in groups]
    e = expected_on_new_topics(few, BM25, alpha=0.1)
    assert not e.estimated and e.coverage is None and e.n_folds == 0
    assert f"{len(groups)} topic(s)" in e.reason and f"at least {MIN_TOPICS}" in e.reason
    path = tmp_path / "few.jsonl"
    write_pairs(few, path)
    assert cli_main(["-q", "calibrate", "--data", str(path), "--scorer", "field", "--score-field",
                     "bm25", "--higher-is-better", "--out", str(tmp_path / "f.json")]) == 0
    assert (f"expected on new topics: not estimated, {len(groups)} topic(s)"
            in capsys.readouterr().out)
