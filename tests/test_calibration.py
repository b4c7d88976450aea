"""Split conformal calibrator: exact order statistic, validation, statistical validity."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve.calibration import (
    SplitConformalCalibrator,
    check_alpha,
    conformal_rank,
    min_calibration_size,
)
from ragsieve.errors import CalibrationError, NotFittedError


# ------------------------------------------------------------ exact order statistic
@pytest.mark.parametrize(
    ("n", "alpha", "rank"),
    [(9, 0.1, 9), (10, 0.1, 10), (19, 0.1, 18), (99, 0.1, 90), (100, 0.2, 81), (4, 0.2, 4), (1, 0.5, 1)],
)
def test_conformal_rank_hand_computed(n: int, alpha: float, rank: int) -> None:
    assert conformal_rank(n, alpha) == rank


def test_threshold_is_the_rank_th_smallest() -> None:
    scores = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 0.0]  # n = 10
    cal = SplitConformalCalibrator(alpha=0.2).fit(scores)
    # ceil(11 * 0.8) = ceil(8.8) = 9 -> 9th smallest of 0.0..0.9 is 0.8
    assert cal.rank_ == 9
    assert cal.threshold_ == pytest.approx(0.8)
    assert cal.n_calibration_ == 10
    assert not cal.infinite_
    assert cal.coverage_band() == pytest.approx((0.8, 0.8 + 1 / 11))


def test_relevant_mask_selects_scores() -> None:
    cal = SplitConformalCalibrator(alpha=0.5).fit([0.1, 5.0, 0.3, 9.0, 0.2], relevant=[1, 0, 1, 0, 1])
    # n = 3 relevant: ceil(4 * 0.5) = 2 -> 2nd smallest of (0.1, 0.2, 0.3)
    assert cal.n_calibration_ == 3
    assert cal.threshold_ == pytest.approx(0.2)


def test_too_small_for_alpha_gives_inf_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ragsieve.calibration"):
        cal = SplitConformalCalibrator(alpha=0.1).fit([0.1, 0.2, 0.3])
    assert math.isinf(cal.threshold_) and cal.infinite_
    assert cal.predict([100.0, -1.0]).all()
    assert "too small" in caplog.text and "n >= 9" in caplog.text
    assert cal.coverage_band() == (1.0, 1.0)


def test_min_calibration_size_is_the_boundary() -> None:
    for alpha in (0.05, 0.1, 0.2, 0.3, 0.37, 0.5):
        n = min_calibration_size(alpha)
        assert conformal_rank(n, alpha) <= n
        assert conformal_rank(n - 1, alpha) > n - 1 or n == 1


def test_predict_keeps_scores_at_most_threshold() -> None:
    cal = SplitConformalCalibrator(alpha=0.5).fit([0.1, 0.2, 0.3])
    assert cal.predict([0.2, 0.2000001, 0.0]).tolist() == [True, False, True]


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.3, float("nan")])
def test_alpha_outside_unit_interval(alpha: float) -> None:
    with pytest.raises(ValueError, match="must be in \\(0, 1\\)"):
        SplitConformalCalibrator(alpha=alpha).fit([0.1, 0.2])


@pytest.mark.parametrize("alpha", ["0.1", None, True])
def test_alpha_wrong_type(alpha: object) -> None:
    with pytest.raises(TypeError, match="alpha"):
        check_alpha(alpha)


def test_nan_scores_rejected() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        SplitConformalCalibrator(alpha=0.1).fit([0.1, float("nan"), 0.3])


def test_no_relevant_calibration_snippet() -> None:
    with pytest.raises(CalibrationError, match="no relevant calibration snippet"):
        SplitConformalCalibrator(alpha=0.1).fit([0.1, 0.2], relevant=[0, 0])
    with pytest.raises(CalibrationError):
        SplitConformalCalibrator(alpha=0.1).fit([])


def test_bad_relevance_labels() -> None:
    with pytest.raises(ValueError, match="0/1"):
        SplitConformalCalibrator(alpha=0.1).fit([0.1, 0.2], relevant=[1, 2])
    with pytest.raises(ValueError, match="shape"):
        SplitConformalCalibrator(alpha=0.1).fit([0.1, 0.2], relevant=[1])


def test_not_fitted() -> None:
    cal = SplitConformalCalibrator(alpha=0.1)
    with pytest.raises(NotFittedError, match="fit"):
        cal.predict([0.1])
    assert isinstance(NotFittedError("x"), (ValueError, AttributeError))


def test_init_does_no_validation() -> None:
    cal = SplitConformalCalibrator(alpha=7)  # estimator contract: validation happens in fit
    assert cal.get_params() == {"alpha": 7}


def test_from_threshold_round_trip() -> None:
    fitted = SplitConformalCalibrator(alpha=0.1).fit(np.linspace(0, 1, 50))
    rebuilt = SplitConformalCalibrator.from_threshold(
        alpha=0.1, threshold=fitted.threshold_, n_calibration=50
    )
    assert rebuilt.threshold_ == fitted.threshold_ and rebuilt.rank_ == fitted.rank_
    assert rebuilt.coverage_band() == fitted.coverage_band()


# ------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=200),
    alpha=st.floats(0.01, 0.99),
)
def test_property_threshold_is_a_calibration_score_or_inf(scores: list[float], alpha: float) -> None:
    cal = SplitConformalCalibrator(alpha=alpha).fit(scores)
    n = len(scores)
    rank = conformal_rank(n, alpha)
    assert rank >= (n + 1) * (1 - alpha) - 1e-6
    if rank > n:
        assert math.isinf(cal.threshold_)
    else:
        assert cal.threshold_ in scores
        # at least `rank` calibration scores are kept, and (without ties) no more
        assert int(np.sum(np.asarray(scores) <= cal.threshold_)) >= rank


@settings(max_examples=100, deadline=None)
@given(
    scores=st.lists(st.floats(0, 1, allow_nan=False), min_size=10, max_size=100),
    a1=st.floats(0.05, 0.5),
    a2=st.floats(0.05, 0.5),
)
def test_property_threshold_monotone_in_alpha(scores: list[float], a1: float, a2: float) -> None:
    lo, hi = sorted((a1, a2))
    assert SplitConformalCalibrator(alpha=lo).fit(scores).threshold_ >= SplitConformalCalibrator(
        alpha=hi
    ).fit(scores).threshold_


# --------------------------------------------------------- statistical validity
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.4])
@pytest.mark.parametrize("dist", ["continuous", "discrete"])
def test_coverage_validity_exchangeable(alpha: float, dist: str) -> None:
    """MAPIE-style: over many random splits, mean coverage lies in the band.

    Tolerance: 4 standard errors of the mean over R splits (measured from the splits).
    Continuous scores must fall inside [1-alpha, 1-alpha+1/(n+1)]; discrete scores
    (ties) must still cover at least 1-alpha (conservatively).
    """
    rng = np.random.default_rng(12345)
    n_cal, n_test, reps = 150, 1000, 400
    covs = []
    for _ in range(reps):
        if dist == "continuous":
            x = rng.gamma(2.0, 0.3, size=n_cal + n_test)
        else:
            x = rng.integers(0, 6, size=n_cal + n_test) / 5.0  # ratings 0, 0.2, ..., 1
        cal = SplitConformalCalibrator(alpha=alpha).fit(x[:n_cal])
        covs.append(float(np.mean(x[n_cal:] <= cal.threshold_)))
    covs_arr = np.array(covs)
    tol = 4 * covs_arr.std(ddof=1) / np.sqrt(reps)
    lo, hi = 1 - alpha, 1 - alpha + 1 / (n_cal + 1)
    assert covs_arr.mean() >= lo - tol
    if dist == "continuous":
        assert covs_arr.mean() <= hi + tol


def test_validity_test_can_fail() -> None:
    """The same check flags a miscalibrated rule (the plain (1-alpha) quantile of n)."""
    rng = np.random.default_rng(1)
    alpha, n_cal, reps = 0.1, 20, 400
    covs = []
    for _ in range(reps):
        x = rng.normal(size=n_cal + 1000)
        naive = np.sort(x[:n_cal])[int(np.floor(n_cal * (1 - alpha))) - 1]  # rank 18 instead of 19
        covs.append(float(np.mean(x[n_cal:] <= naive)))
    covs_arr = np.array(covs)
    tol = 4 * covs_arr.std(ddof=1) / np.sqrt(reps)
    assert covs_arr.mean() < 1 - alpha - tol
