"""``choose_alpha`` / ``ragsieve choose-alpha``: the alpha that reaches a removal or coverage
target on held-out topics (real MiniLM scores, real XQuAD)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragsieve import Pair
from ragsieve.cli import main as cli_main
from ragsieve.data import sample_queries
from ragsieve.evaluation import AlphaTarget, choose_alpha


@pytest.fixture(scope="module")
def pairs(xquad_en: list[Pair]) -> list[Pair]:
    return sample_queries(xquad_en, 200, seed=0)


def test_removal_target_picks_the_smallest_alpha_that_reaches_it(pairs: list[Pair],
                                                                 minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    choice = choose_alpha(pairs, minilm_scorer, AlphaTarget(removal=0.5), n_splits=4)
    assert choice.reached and choice.alpha is not None and choice.removal is not None
    assert choice.removal >= 0.5
    smaller = [r for r in choice.grid if r["alpha"] < choice.alpha]
    assert smaller and all(r["removal"] < 0.5 for r in smaller)
    removals = [r["removal"] for r in choice.grid]
    assert removals == sorted(removals)  # a larger alpha never keeps more
    assert f"alpha {choice.alpha:g}" in choice.statement and "probability >=" in choice.statement


def test_coverage_target_is_the_guarantee_and_unreachable_targets_say_so(
        pairs: list[Pair], minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    choice = choose_alpha(pairs, minilm_scorer, AlphaTarget(coverage=0.85), n_splits=4)
    assert choice.alpha == 0.15 and choice.reached  # largest alpha with 1 - alpha >= 0.85
    none = choose_alpha(pairs, minilm_scorer, AlphaTarget(removal=0.999), n_splits=4,
                        alphas=[0.05, 0.1])
    assert not none.reached and none.alpha is None and "no alpha" in none.statement
    with pytest.raises(ValueError, match="exactly one target"):
        choose_alpha(pairs, minilm_scorer, AlphaTarget(removal=0.5, coverage=0.9))
    with pytest.raises(ValueError, match=r"removal == 1\.5"):
        choose_alpha(pairs, minilm_scorer, AlphaTarget(removal=1.5))


def test_cli_choose_alpha(shared_data_dir: Path, embedding_cache_dir: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    base = ["-q", "choose-alpha", "--data", "xquad-en", "--data-dir", str(shared_data_dir),
            "--cache-dir", str(embedding_cache_dir), "--splits", "3"]
    assert cli_main([*base, "--removal", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reached"] and out["removal"] >= 0.5 and out["target"] == "removal"
    assert cli_main([*base, "--removal", "0.999", "--alphas", "0.05"]) == 1
    assert "no alpha" in capsys.readouterr().out
    assert cli_main([*base, "--removal", "0.5", "--mode", "budget"]) == 2
    assert "choose-alpha picks alpha" in capsys.readouterr().err
