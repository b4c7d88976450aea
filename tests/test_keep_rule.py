"""Thresholds in the score's own units: ``calibrate`` says ``keep bm25 >= 0.655`` for a
higher-is-better outside score, and ``--json`` carries ``threshold`` / ``keep_if`` so."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from ragsieve import Pair
from ragsieve.cli import main as cli_main
from ragsieve.data import write_pairs
from ragsieve.scoring import EmbeddingScorer, FieldScorer, KeepRule


def _overlap(p: Pair) -> float:
    """A lexical outside score: the share of the question's words found in the snippet."""
    words = set(re.findall(r"\w+", p.query.lower()))
    return len(words & set(re.findall(r"\w+", p.text.lower()))) / max(len(words), 1)


@pytest.fixture(scope="module")
def overlap_jsonl(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair]) -> Path:
    path = tmp_path_factory.mktemp("keep-rule") / "overlap.jsonl"
    pairs = [dataclasses.replace(p, meta={**p.meta, "overlap": _overlap(p)})
             for p in xquad_en[:600]]
    write_pairs(pairs, path)
    return path


def test_keep_rule_of_each_score() -> None:
    assert str(FieldScorer("bm25", higher_is_better=True).keep_rule(-0.655)) == \
        "keep bm25 >= 0.655"
    assert FieldScorer("dist").keep_rule(1.5) == KeepRule("dist", "<=", 1.5)
    assert EmbeddingScorer.score_label == "1 - cos"
    assert KeepRule("x", "<=", float("inf")).to_dict()["threshold"] is None


def test_calibrate_reports_an_outside_score_in_its_own_units(
        overlap_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-q", "calibrate", "--data", str(overlap_jsonl), "--scorer", "field",
            "--score-field", "overlap", "--higher-is-better", "--alpha", "0.2"]
    assert cli_main([*args, "--out", str(tmp_path / "a.json")]) == 0
    human = capsys.readouterr().out
    assert cli_main([*args, "--out", str(tmp_path / "b.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tau = out["calibration"]["state"]["threshold"]  # the internal, negated nonconformity threshold
    assert out["keep_if"] == ">=" and out["score"] == "overlap"
    assert out["threshold"] == pytest.approx(-tau) and 0 < out["threshold"] <= 1
    assert f"keep overlap >= {-tau:.4g}" in human
