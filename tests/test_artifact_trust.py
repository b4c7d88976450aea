"""Trusting an artifact (Hardening IV): a resealed artifact -- edited, then sealed again,
which anyone can do -- is read by the strict JSON reader, its counts are bounded before
anything is allocated from them, and a signed artifact is checked against a key.

Real components: a filter calibrated on an outside score (no model needed) is saved, then
edited and resealed by :func:`resealed`; the CLI runs in-process (``ragsieve.cli.main``).
"""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter, FieldScorer, Pair
from ragsieve.artifact import Artifact, seal_value
from ragsieve.calibration import BudgetCalibrator, calibrator_from_state
from ragsieve.cli import main
from ragsieve.errors import ArtifactError


def _pairs() -> list[Pair]:
    rng = np.random.default_rng(0)
    return [Pair(f"q{q}", f"question {q}", f"s{s}", f"snippet {s}", int(s == 0),
                 group=f"t{q % 8}",
                 meta={"score": float(rng.uniform(0.0, 0.5) if s == 0 else rng.uniform(0.3, 1.0))})
            for q in range(40) for s in range(4)]


@pytest.fixture(scope="module")
def payload() -> dict[str, Any]:
    """A real artifact as a dict (40 calibration queries of 4 snippets)."""
    flt = ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(_pairs())
    return flt.to_artifact().to_dict()


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query_id": "q1", "query": "what", "snippet_id": f"s{i}",
                                        "text": "a snippet", "score": 0.1 * i}) + "\n"
                            for i in range(3)))
    return path


def resealed(payload: dict[str, Any], edit: Any) -> dict[str, Any]:
    """``payload`` edited by ``edit(copy)`` and sealed again (what anyone can do)."""
    out = copy.deepcopy(payload)
    edit(out)
    out["checksum"]["value"] = seal_value(out)
    return out


def _filter(path: Path, pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["-q", "filter", "--filter", str(path), "--data", str(pairs_file)])
    return code, capsys.readouterr().err


def _lengths(rows: list[list[int]], n_lists: int | None = None) -> Any:
    def edit(p: dict[str, Any]) -> None:
        p["lists"]["lengths"] = rows
        if n_lists is not None:
            p["lists"]["n_lists"] = n_lists
    return edit


# ------------------------------------------------------------------ item 2: counts bounded
@pytest.mark.parametrize(("rows", "n_lists", "match"), [
    ([[1, 100_000_000]], 100_000_000, ("counts 100000000 calibration lists, more than its "
                                      "calibration can hold \\(40\\)")),
    ([[1, 100_000_000]], None, "counts 100000000 calibration lists"),
    ([[10**18, 10**18]], None, "a list of 1000000000000000000 snippets, expected at most"),
])
def test_a_lists_block_counting_more_than_the_artifact_holds_is_refused_unallocated(
        payload: dict[str, Any], rows: list[list[int]], n_lists: int | None, match: str,
        tmp_path: Path, pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forged = resealed(payload, _lengths(rows, n_lists))
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match=match):
            Artifact.from_dict(forged)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # before: 800 MB (1e8 lists) or a numpy ArrayMemoryError
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    code, err = _filter(path, pairs_file, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "the artifact was edited: recalibrate." in err


def test_without_the_data_counts_the_lists_are_capped_at_max_lists(
        payload: dict[str, Any]) -> None:
    from ragsieve.lists import MAX_LISTS

    def edit(p: dict[str, Any]) -> None:
        del p["data"]["n_pairs"]
        p["lists"].update(lengths=[[1, MAX_LISTS + 1]], n_lists=MAX_LISTS + 1)
    with pytest.raises(ArtifactError, match=f"more than its calibration can hold \\({MAX_LISTS}\\)"):
        Artifact.from_dict(resealed(payload, edit))


def test_the_data_counts_are_range_checked(payload: dict[str, Any]) -> None:
    for value, match in ((10**300, "an integer of 301 digits, expected an int in"),
                         (-1, "n_relevant == -1"), (161, "exceeds its n_pairs \\(160\\)")):
        with pytest.raises(ArtifactError, match=match):
            Artifact.from_dict(resealed(payload, lambda p, v=value: p["data"].update(n_relevant=v)))


def test_a_budget_report_counting_more_than_its_calibration_is_refused() -> None:
    cal = BudgetCalibrator(budget=100).fit([0.1, 0.2, 0.3, 0.4], [1, 0, 1, 0],
                                           query_ids=["a", "a", "b", "b"],
                                           lengths=[60, 50, 40, 70])
    state = cal.to_state()
    state["report"]["n_relevant"] = 10**18  # budget_for(lower=True) looped over it
    with pytest.raises(ArtifactError, match="n_relevant == 1000000000000000000, expected an int "
                                            "in \\[0, 4\\]"):
        calibrator_from_state("budget", cal.get_params(), state)


# ------------------------------------------------------------------ item 4: the strict reader
def _text_with_duplicate(payload: dict[str, Any]) -> str:
    """The sealed policy holds ``min_keep`` twice; the last (the sealed value) would win."""
    text = json.dumps(payload)
    assert '"min_keep": 0' in text
    return text.replace('"min_keep": 0', '"min_keep": 5, "min_keep": 0')


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: json.dumps(resealed(p, lambda q: q["data"].update(
        nest=json.loads("[" * 900 + "]" * 900)))), "data.nest nests arrays and objects more than 64"),
    (_text_with_duplicate, "duplicate key 'min_keep'"),
    (lambda p: json.dumps(p).replace('"n_pairs": 160', '"n_pairs": ' + "9" * 4000),
     "data.n_pairs == an integer of 4000 digits"),
    (lambda p: json.dumps(p).replace('"n_relevant": 40', '"n_relevant": 1' + "0" * 400),
     "data.n_relevant == an integer of 401 digits"),
])
def test_the_artifact_reader_is_the_strict_reader(
        payload: dict[str, Any], make: Any, match: str, tmp_path: Path, pairs_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = make(payload)
    with pytest.raises(ArtifactError, match=match):
        Artifact.parse(text, "forged.json")
    path = tmp_path / "forged.json"
    path.write_text(text)
    code, err = _filter(path, pairs_file, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "not strict JSON" in err
