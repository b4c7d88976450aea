"""Query-relative and fused scores: exact values, validity over many splits, artifact round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragsieve import ConformalFilter
from ragsieve.data import group_splits
from ragsieve.evaluation import TOLERANCE_SE, ScoredData, evaluate_scores
from ragsieve.scoring import FusedScorer, RelativeScorer, resolve_scorer
from ragsieve.scoring.fusion import FEATURES, feature_matrix, fit_logistic
from ragsieve.scoring.relative import query_index_of, relative_scores


def test_relative_scores_hand_made() -> None:
    base = np.array([0.3, 0.1, 0.6, 0.5, 0.5])  # query 0: first three, query 1: last two
    q = np.array([0, 0, 0, 1, 1])
    np.testing.assert_allclose(relative_scores(base, q, "gap"), [0.2, 0.0, 0.5, 0.0, 0.0])
    # equal scores share the lower rank (equal texts of one list get one score)
    np.testing.assert_allclose(relative_scores(base, q, "rank"), [1, 0, 2, 0, 0])
    z = relative_scores(base, q, "z")
    assert z[1] < z[0] < z[2] and z[3] == z[4] == 0.0
    np.testing.assert_allclose(relative_scores(base, q, "ratio")[:3], np.array([0.2, 0.0, 0.5]) / 0.9)
    with pytest.raises(ValueError, match="kind"):
        relative_scores(base, q, "softmax")


def test_logistic_recovers_a_separating_direction() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3))
    y = (x[:, 0] - 2 * x[:, 1] + rng.normal(scale=0.5, size=2000) > 0).astype(float)
    w, _b, _mu, _sc = fit_logistic(x, y)
    assert w[0] > 0 > w[1] and abs(w[2]) < 0.3 * abs(w[1])
    with pytest.raises(ValueError, match="both"):
        fit_logistic(x, np.ones(2000))


@pytest.mark.parametrize("kind", ["gap", "z", "rank", "ratio", "fusion"])
def test_validity_of_new_scores_on_xquad(kind: str, xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    """Over 100 query-level splits (whole retrieved lists are the exchangeable units, which
    is what a relative score needs; topic-level effects are the ``topic`` mode's business),
    coverage of each new score is at the target (3 SE) and it removes more than the plain
    cosine score at the same alpha."""
    topic_split = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    base = ScoredData(topic_split.relevant, topic_split.query_index, topic_split.query_index,
                      topic_split.lengths, scores=topic_split.scores)
    q = query_index_of(xquad_en)
    plain = evaluate_scores(base, alphas=[0.1], top_k=[], thetas=[], n_splits=100, seed=4,
                            calibrated_baselines=False).rows("conformal")[0]
    if kind == "fusion":
        rep = evaluate_scores(base, alphas=[0.1], top_k=[], thetas=[], n_splits=100, seed=4,
                              calibrated_baselines=False,
                              fusion_features=feature_matrix(np.asarray(xquad_en_scores), q))
    else:
        data = ScoredData(base.relevant, base.query_index, base.group_index, base.lengths,
                          scores=relative_scores(np.asarray(xquad_en_scores), q, kind))
        rep = evaluate_scores(data, alphas=[0.1], top_k=[], thetas=[], n_splits=100, seed=4,
                              calibrated_baselines=False)
    row = rep.rows("conformal")[0]
    assert row["coverage_mean"] >= 0.9 - TOLERANCE_SE * row["coverage_se"], row
    if kind != "rank":  # rank is discrete: ties at tau over-cover (conservative), checked below
        assert row["coverage_mean"] <= row["band_high"] + TOLERANCE_SE * row["coverage_se"] + 0.02
    assert row["removal_mean"] > plain["removal_mean"] + 0.05


def test_fused_scorer_artifact_round_trip(xquad_en, minilm_scorer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fit_idx, cal_idx = group_splits([p.group for p in xquad_en], n_splits=1, seed=0)[0]
    fused = FusedScorer.fit([xquad_en[i] for i in fit_idx], minilm_scorer)
    assert fused.spec()["features"] == list(FEATURES) and len(fused.spec()["weights"]) == len(FEATURES)
    flt = ConformalFilter(fused, alpha=0.1).calibrate([xquad_en[i] for i in cal_idx[:3000]])
    path = flt.save(tmp_path / "fused.json")
    assert json.loads(path.read_text())["scorer"]["scorer"] == "fusion"
    loaded = ConformalFilter.load(path, scorer_options={"cache_dir": minilm_scorer.cache_dir})
    assert loaded.threshold == flt.threshold
    qid = xquad_en[int(cal_idx[-1])].query_id
    pairs = [p for p in xquad_en if p.query_id == qid]
    np.testing.assert_allclose(loaded.filter(pairs[0].query, pairs).scores,
                               flt.filter(pairs[0].query, pairs).scores, rtol=1e-9)
    other = FusedScorer(minilm_scorer, weights=[0.0] * len(FEATURES))
    with pytest.raises(ValueError, match="calibrated with scorer"):
        ConformalFilter.load(path, scorer=other)


def test_relative_scorer_spec_round_trip(minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    scorer = RelativeScorer(minilm_scorer, kind="z")
    rebuilt = resolve_scorer(scorer.spec())
    assert rebuilt.spec() == scorer.spec() == {"scorer": "relative", "kind": "z", "base": minilm_scorer.spec()}
    texts = ["Denver won Super Bowl 50.", "Photosynthesis happens in leaves.", "The Panthers lost."]
    s = scorer.score_batch("Who won Super Bowl 50?", texts)
    assert s.shape == (3,) and s[0] == s.min()


@pytest.mark.parametrize("kind", ["relative", "fusion"])
def test_calibrate_scores_whole_lists_for_list_dependent_scores(kind: str, xquad_en, minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    """A relative / fused score is calibrated in each query's whole list, not among relevant pairs only."""
    from ragsieve.calibration import SplitConformalCalibrator

    fit_idx, cal_idx = group_splits([p.group for p in xquad_en], n_splits=1, seed=1)[0]
    scorer = (RelativeScorer(minilm_scorer, kind="gap") if kind == "relative"
              else FusedScorer.fit([xquad_en[i] for i in fit_idx], minilm_scorer))
    assert scorer.tags.list_dependent and not minilm_scorer.tags.list_dependent
    cal = [xquad_en[i] for i in cal_idx]
    flt = ConformalFilter(scorer, alpha=0.1).calibrate(cal)
    relevant = np.array([p.relevant == 1 for p in cal])
    expected = SplitConformalCalibrator(alpha=0.1).fit(scorer.score_pairs(cal)[relevant]).threshold_
    assert flt.threshold == pytest.approx(expected, abs=1e-12)
    # scoring the relevant pairs alone puts each in a list of its own: another, wrong threshold
    alone = SplitConformalCalibrator(alpha=0.1).fit(scorer.score_pairs([p for p in cal if p.relevant == 1]))
    assert abs(alone.threshold_ - flt.threshold) > 0.01
