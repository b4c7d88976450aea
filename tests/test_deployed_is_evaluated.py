"""Deployed = evaluated, by construction: ``ConformalFilter.calibrate`` and a split of
``evaluate`` turn pairs into calibrator inputs with one translation
(:class:`ragsieve.calibration.inputs.CalibrationInputs`) and fit the fused score in one
room (:mod:`ragsieve.fitting`, on :func:`ragsieve.scoring.fusion.fit_fusion`).

For a fixed seed, the filter ``calibrate(seed=s)`` builds on the calibration pairs of
``evaluate(seed=s)``'s split 0 is the filter that split measures: the same fused weights,
the same calibration half, the same calibrator state and threshold, compared exactly -- for the
fused score of its base alone and for one of several signals, under either learner, and for
the list-free ``portable`` preset, whose frozen-corpus BM25 takes its statistics from the
same fit share in both.
A second copy of either path (a re-typed formula, another topic draw, other inputs) fails.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_baseline_grid import with_bm25

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import make_calibrator
from ragsieve.data import group_splits
from ragsieve.evaluation import EvaluationConfig, ScoredData, evaluate
from ragsieve.evaluation.sweep import _calibrate_split, score_for_evaluation
from ragsieve.fitting import fit_split
from ragsieve.scoring import CorpusBM25Scorer, FieldScorer, FusedScorer
from ragsieve.scoring.fusion import FUSION_FIT_FRACTION
from ragsieve.types import fingerprint_pairs

BM25 = FieldScorer("bm25", higher_is_better=True)
SEED = 3


@pytest.fixture(scope="module")
def bm25_pairs(xquad_en: list[Pair]) -> list[Pair]:
    return with_bm25(xquad_en)


def _split0(pairs: list[Pair], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split 0 of ``evaluate(n_splits=1, seed=seed)`` (its documented group-disjoint split)."""
    topics = ScoredData.from_pairs(pairs, np.zeros(len(pairs))).group_index.tolist()
    return group_splits(topics, calibration_fraction=0.5, n_splits=1, seed=seed)[0]


def _fit_split0(data: ScoredData, features: object, cal_idx: np.ndarray,
                ) -> tuple[ScoredData, np.ndarray]:
    """The sweep's fused fit of split 0 (:func:`ragsieve.fitting.fit_split`): the data
    with fused scores and the calibration rows left for conformal."""
    scores, conf_idx = fit_split(features, data.relevant, data.group_index, cal_idx, seed=SEED,
                                 split=0, fraction=FUSION_FIT_FRACTION)
    return dataclasses.replace(data, scores=scores), conf_idx


def _one_split(pairs: list[Pair], scorer: object, mode: str, **config: object) -> dict:
    report = evaluate(pairs, scorer, modes=(mode,), alphas=(0.1,), n_splits=1, seed=SEED,
                      top_k=(), thetas=(), calibrated_baselines=False, **config)
    return report.rows("conformal")[0]


@pytest.mark.parametrize("mode", ["marginal", "topic", "query-recall"])
def test_calibrate_is_split_zero_of_evaluate_for_the_fused_score(bm25_pairs: list[Pair],
                                                                 mode: str) -> None:
    cal_idx, _ = _split0(bm25_pairs, SEED)
    flt = ConformalFilter(FusedScorer.unfitted(BM25), mode, alpha=0.1).calibrate(
        [bm25_pairs[i] for i in cal_idx], seed=SEED, monitor=False)
    # the sweep's own fused fit of that split: the same weights, the same calibration half
    pairs, base, features, _, _ = score_for_evaluation(bm25_pairs, FusedScorer.unfitted(BM25))
    data = ScoredData.from_pairs(pairs, base)
    fused, conf_idx = _fit_split0(data, features, cal_idx)
    np.testing.assert_array_equal(flt.scorer_.score_pairs(bm25_pairs), fused.scores)
    assert flt.calibration_info["fingerprint"] == fingerprint_pairs([bm25_pairs[i] for i in conf_idx])
    assert flt.calibration_info["fusion_fit_pairs"] == len(cal_idx) - len(conf_idx)
    # the same calibrator state, and the threshold evaluate measures
    cal = EvaluationConfig(modes=(mode,)).calibrator(mode, 0.1)
    _calibrate_split(fused, cal, conf_idx)
    assert cal.to_state() == flt.calibrator_.to_state()
    row = _one_split(bm25_pairs, FusedScorer.unfitted(BM25), mode)
    assert row["threshold_mean"] == flt.threshold
    assert row["n_calibration_mean"] == flt.guarantee()["n_calibration"]


@pytest.mark.parametrize(("preset", "learner"), [("fast", "logistic"), ("fast", "boosted"),
                                                  ("portable", "logistic")])
def test_calibrate_is_split_zero_of_evaluate_for_a_multi_signal_fused_score(
        xquad_en: list[Pair], minilm_scorer: object, preset: str, learner: str) -> None:
    """The same for the fused score of several signals (MiniLM's cosine and the in-list
    BM25) under either learner, and for the portable one (the cosine, the frozen-corpus
    BM25 fitted on the fit share's texts, the best sentence's cosine): one feature matrix,
    one fit, the same scores exactly."""
    pairs = [p for p in xquad_en if p.group in sorted({q.group for q in xquad_en})[:12]]
    cal_idx, _ = _split0(pairs, SEED)
    unfitted = FusedScorer.unfitted(minilm_scorer, preset=preset, learner=learner)
    flt = ConformalFilter(unfitted, "marginal", alpha=0.1).calibrate(
        [pairs[i] for i in cal_idx], seed=SEED, monitor=False)
    assert flt.scorer_.spec()["learner"] == learner and flt.scorer_.spec()["signals"]
    _, base, features, info, _ = score_for_evaluation(pairs, unfitted)
    assert features.learner == learner and info["features"] == list(flt.scorer_.feature_names)
    data = ScoredData.from_pairs(pairs, base)
    fused, conf_idx = _fit_split0(data, features, cal_idx)
    np.testing.assert_array_equal(flt.scorer_.score_pairs(pairs), fused.scores)
    assert flt.calibration_info["fingerprint"] == fingerprint_pairs([pairs[i] for i in conf_idx])
    assert flt.scorer_.tags.list_dependent == (preset == "fast")
    if preset == "portable":  # the frozen statistics: the texts of the split's fit share only
        fit_share = sorted(set(cal_idx) - set(conf_idx))
        assert flt.scorer_.signals[0].spec() == CorpusBM25Scorer().fitted_on_texts(
            [pairs[i].text for i in fit_share]).spec()
    cal = EvaluationConfig(modes=("marginal",)).calibrator("marginal", 0.1)
    _calibrate_split(fused, cal, conf_idx)
    assert cal.to_state() == flt.calibrator_.to_state()
    assert _one_split(pairs, unfitted, "marginal")["threshold_mean"] == flt.threshold


def test_a_budget_filter_is_calibrated_on_the_inputs_evaluate_gives_it(bm25_pairs: list[Pair]) -> None:
    """Lengths measured in the mode's own unit (tokens here) and the topics (the budget's
    topic-bootstrap bound) reach the calibrator the same way in both."""
    cal_idx, _ = _split0(bm25_pairs, SEED)
    params = {"budget": 400, "unit": "tokens", "delta": 0.1}
    flt = ConformalFilter(BM25, make_calibrator("budget", alpha=0.1, **params)).calibrate(
        [bm25_pairs[i] for i in cal_idx], seed=SEED, monitor=False)
    data = ScoredData.from_pairs(bm25_pairs, BM25.score_pairs(bm25_pairs))
    cal = EvaluationConfig(modes=("budget",), budgets=(400,),
                           calibrator_params={"unit": "tokens"}).calibrator("budget", 0.1)
    _calibrate_split(data, cal, cal_idx)
    assert cal.to_state() == flt.calibrator_.to_state()
    assert cal.report_ == flt.calibrator_.report_
    assert flt.calibrator_.report_.unit == "tokens"
    assert flt.calibrator_.report_.bound == "min(clopper-pearson, group-bootstrap)"
