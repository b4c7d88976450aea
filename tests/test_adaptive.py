"""Adaptive conformal recalibration (ACI), the KS drift check, and the shift demo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve.calibration import AdaptiveConformalFilter, SplitConformalCalibrator
from ragsieve.errors import ArtifactError, CalibrationError, NotFittedError
from ragsieve.evaluation.shift import StreamSettings, rolling_coverage, run_stream
from ragsieve.monitoring import drift_check

ALPHA = 0.1


def _shift_stream(seed: int, n_per_phase: int = 3000, shift: float = 1.5):
    """Relevant scores N(0, 1) then N(shift, 1); non-relevant N(2, 1) interleaved."""
    rng = np.random.default_rng(seed)
    cal = rng.normal(0.0, 1.0, 500)
    rel_scores = np.r_[rng.normal(0.0, 1.0, n_per_phase), rng.normal(shift, 1.0, n_per_phase)]
    non = rng.normal(2.0, 1.0, rel_scores.size)
    scores = np.empty(2 * rel_scores.size)
    scores[0::2], scores[1::2] = rel_scores, non
    relevant = np.zeros(scores.size, dtype=bool)
    relevant[0::2] = True
    phase = np.r_[np.ones(rel_scores.size, dtype=int), np.full(rel_scores.size, 2)]
    return cal, scores, relevant, phase


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aci_holds_coverage_where_static_breaks(seed: int) -> None:
    cal, scores, relevant, phase = _shift_stream(seed)
    static = SplitConformalCalibrator(alpha=ALPHA).fit(cal)
    aci = AdaptiveConformalFilter(alpha=ALPHA, gamma=0.005, window=500).fit(cal)
    kept = aci.update_batch(scores, relevant)
    p2 = (phase == 2) & relevant
    static_cov2 = float(np.mean(scores[p2] <= static.threshold_))
    # N(1.5, 1) under the N(0, 1) 90% quantile (1.28): about 0.41
    assert static_cov2 < 1 - ALPHA - 0.3
    # Gibbs & Candès, deterministic: |mean err - alpha| <= (max(a, 1-a) + gamma) / (gamma T)
    err = 1.0 - kept[relevant]
    T = int(relevant.sum())
    assert aci.n_updates_ == T and aci.n_errors_ == int(err.sum())
    assert aci.clipped_ == 0.0  # alpha_t never reached the pool's bounds: plain ACI
    bound = max(ALPHA, 1 - ALPHA) / (0.005 * T)
    assert aci.error_bound() == pytest.approx(bound)
    assert abs(err.mean() - ALPHA) <= bound
    # practical: the second half of phase 2 (after adapting) is within 0.03 of the target
    idx = np.flatnonzero(p2)
    late = idx[idx.size // 2:]
    assert abs(kept[late].mean() - (1 - ALPHA)) <= 0.03
    # whole phase 2, transient included, still far closer to target than static
    assert abs(kept[p2].mean() - (1 - ALPHA)) < abs(static_cov2 - (1 - ALPHA)) / 4


@settings(max_examples=40, deadline=None)
@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=300),
    alpha=st.floats(0.01, 0.99),
    gamma=st.floats(0.001, 1.0),
    window=st.one_of(st.none(), st.integers(1, 50)),
)
@pytest.mark.parametrize("bounded", [True, False])
def test_aci_bound_holds_for_any_sequence(scores, alpha, gamma, window, bounded) -> None:
    f = AdaptiveConformalFilter(alpha=alpha, gamma=gamma, window=window,
                                bounded=bounded).fit([0.0])
    kept = f.update_batch(scores, np.ones(len(scores), dtype=bool))
    err = 1.0 - kept.astype(float)
    assert abs(err.mean() - alpha) <= f.error_bound() + 1e-12
    assert -gamma - 1e-12 <= min(f.history_["alpha_t"] + [f.alpha_t_])
    assert max(f.history_["alpha_t"] + [f.alpha_t_]) <= 1 + gamma + 1e-12
    if bounded:  # never keep-nothing; keep-all only while the pool is too small for alpha
        assert min(f.history_["threshold"] + [f.threshold_]) > -math.inf
        m = min(window or len(scores) + 1, len(scores) + 1)
        assert math.isfinite(f.threshold_) or alpha < 1 / (m + 1)


def test_bounded_threshold_stays_within_the_pool() -> None:
    f = AdaptiveConformalFilter(alpha=0.5, gamma=1.0, window=None).fit([0.1, 0.2, 0.3])
    assert f.update(0.9, True) is False  # miss: alpha_t would be 0, clipped to 1/(m+1)
    assert f.alpha_t_ == pytest.approx(1 / 5) and f.threshold_ == 0.9  # the pool's max
    assert f.clipped_ == pytest.approx(0.2)
    for _ in range(5):
        f.update(-100.0, True)  # kept every time: alpha_t rises, clipped to m/(m+1)
    assert f.alpha_t_ == pytest.approx(9 / 10) and f.threshold_ == -100.0  # the pool's min
    assert f.alpha_bounds() == pytest.approx((1 / 10, 9 / 10))
    state = f.to_state()
    again = AdaptiveConformalFilter.from_state(f.get_params(), state)
    assert (again.threshold_, again.clipped_) == (f.threshold_, f.clipped_)
    with pytest.raises(ArtifactError, match=r"alpha_t == 1.5 is outside \[0.1, 0.9\]"):
        AdaptiveConformalFilter.from_state(f.get_params(), {**state, "alpha_t": 1.5})
    unbounded = {**f.get_params(), "bounded": False}
    assert AdaptiveConformalFilter.from_state(unbounded, {**state, "alpha_t": 1.5}).threshold_ \
        == -math.inf


def test_threshold_clipping_of_alpha_t() -> None:
    f = AdaptiveConformalFilter(alpha=0.5, gamma=1.0, window=None, bounded=False).fit(
        [0.1, 0.2, 0.3])
    assert f.update(0.9, True) is False  # miss: alpha_t = 0.5 + (0.5 - 1) = 0
    assert f.alpha_t_ == 0.0 and f.threshold_ == math.inf  # keep everything
    assert f.update(100.0, True) is True  # kept: alpha_t = 0.5
    assert f.update(-100.0, True) is True  # kept: alpha_t = 1.0
    assert f.alpha_t_ == 1.0 and f.threshold_ == -math.inf  # keep nothing
    assert not f.predict([-1e9, 0.0]).any()
    assert f.update(-1e9, True) is False


def test_non_relevant_feedback_changes_nothing() -> None:
    f = AdaptiveConformalFilter(alpha=0.2, gamma=0.1).fit([0.1, 0.2, 0.3, 0.4, 0.5])
    tau, a = f.threshold_, f.alpha_t_
    assert f.update(0.05, False) is True and f.update(0.9, 0) is False
    assert (f.threshold_, f.alpha_t_, f.n_updates_) == (tau, a, 0)
    assert f.history_["relevant"] == [0.0, 0.0] and all(math.isnan(e) for e in f.history_["err"])


def test_window_pool_follows_the_shift() -> None:
    rng = np.random.default_rng(0)
    cal = rng.normal(0, 1, 1000)
    f = AdaptiveConformalFilter(alpha=0.1, gamma=1e-6, window=300).fit(cal)
    # only the last 300 calibration scores are in the pool: rank ceil(301 * 0.9) = 271
    assert f.threshold_ == np.sort(cal[-300:])[270]
    new = rng.normal(5, 1, 300)
    f.update_batch(new, np.ones(300, dtype=bool))
    # alpha_t barely moved; the pool now holds only the new scores
    assert f.threshold_ == np.sort(new)[math.ceil(301 * (1 - f.alpha_t_)) - 1]


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match=r"alpha == 1.3, must be in \(0, 1\)"):
        AdaptiveConformalFilter(alpha=1.3).fit([0.1])
    with pytest.raises(ValueError, match=r"gamma == 0, must be a real number in \(0, inf\)"):
        AdaptiveConformalFilter(gamma=0).fit([0.1])
    with pytest.raises(TypeError, match="gamma must be a real number"):
        AdaptiveConformalFilter(gamma="fast").fit([0.1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"window == 0, must be an int >= 1 or None \(None keeps every score\)"):
        AdaptiveConformalFilter(window=0).fit([0.1])
    with pytest.raises(CalibrationError, match="got 0 score"):
        AdaptiveConformalFilter().fit([])
    with pytest.raises(ValueError, match="non-finite"):
        AdaptiveConformalFilter().fit([0.1, float("nan")])
    f = AdaptiveConformalFilter().fit([0.1, 0.2])
    with pytest.raises(ValueError, match=r"score == inf, must be a finite number"):
        f.update(float("inf"), True)
    with pytest.raises(ValueError, match=r"relevant == 2, must be a bool or 0/1"):
        f.update(0.1, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"relevant has shape \(1,\), expected \(2,\)"):
        f.update_batch([0.1, 0.2], [True])
    with pytest.raises(ValueError, match=r"must be 0/1"):
        f.update_batch([0.1, 0.2], [0, 3])


def test_not_fitted() -> None:
    f = AdaptiveConformalFilter()
    for call in (lambda: f.update(0.1, True), lambda: f.update_batch([0.1], [1]),
                 lambda: f.predict([0.1]), f.error_bound):
        with pytest.raises(NotFittedError):
            call()
    with pytest.raises(NotFittedError, match=r"call fit\(scores"):
        f.update(0.1, True)
    with pytest.raises(AttributeError):  # learned attributes do not exist before fit
        f.threshold_  # noqa: B018


# ------------------------------------------------------------------------ drift check


def test_drift_check_no_drift_and_false_alarm_rate() -> None:
    level = 0.1
    rng = np.random.default_rng(0)
    ps = np.array([drift_check(rng.normal(size=300), rng.normal(size=400), alpha=level).p_value
                   for _ in range(300)])
    rate = float(np.mean(ps < level))
    # binomial sd at 300 draws is 0.017; asymptotic KS is slightly conservative
    assert 0.04 <= rate <= 0.16
    assert np.median(ps) > 0.3


def test_drift_check_detects_a_shift() -> None:
    rng = np.random.default_rng(1)
    r = drift_check(rng.normal(size=500), rng.normal(0.4, 1, size=500))
    assert r.drifted and r.p_value < 1e-6 and (r.n_cal, r.n_live) == (500, 500)
    same = drift_check(rng.normal(size=500), rng.normal(size=500))
    assert not same.drifted


def test_drift_check_false_alarm_rate_under_exchangeability() -> None:
    """On exchangeable scores the alarm rate stays at its level (3 standard errors)."""
    rng = np.random.default_rng(5)
    level, n_sim = 0.05, 400
    alarms = [drift_check(rng.normal(size=120), rng.normal(size=80), alpha=level).drifted
              for _ in range(n_sim)]
    rate = float(np.mean(alarms))
    assert rate <= level + 3 * np.sqrt(level * (1 - level) / n_sim)


def test_drift_check_validation() -> None:
    with pytest.raises(ValueError, match="at least 1 score on each side"):
        drift_check([], [0.1])
    with pytest.raises(ValueError, match=r"alpha == 0, must be in \(0, 1\)"):
        drift_check([0.1], [0.2], alpha=0)


# ------------------------------------------------------------------------ stream experiment


def test_run_stream_synthetic_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ragsieve.evaluation.shift import plot_shift

    cal, scores, relevant, phase = _shift_stream(0, n_per_phase=1000)
    res = run_stream(cal, scores, relevant, phase,
                     StreamSettings(alpha=ALPHA, gamma=0.01, rolling=100))
    s = res["summary"]
    assert abs(s["phase1"]["static"]["coverage"] - 0.9) < 0.04
    assert not s["phase1"]["drift"]["drifted"] and s["phase2"]["drift"]["drifted"]
    assert s["phase2"]["static"]["coverage"] < 0.6
    assert s["phase2"]["adaptive"]["coverage"] > s["phase2"]["static"]["coverage"] + 0.2
    assert len(res["series"]["rolling_static"]) == int(relevant.sum())
    png = plot_shift(res, tmp_path / "s.png")
    assert png.stat().st_size > 10_000


def test_rolling_coverage() -> None:
    np.testing.assert_allclose(rolling_coverage([1, 0, 1, 1], 2), [np.nan, 0.5, 0.5, 1.0])
    with pytest.raises(ValueError, match="window == 0"):
        rolling_coverage([1], 0)


@pytest.mark.slow
def test_shift_demo_on_real_data(tmp_path: Path, shared_data_dir: Path) -> None:
    """xquad-en -> xquad-de under MiniLM (fast with a warm embedding cache, minutes cold)."""
    pytest.importorskip("matplotlib")
    from ragsieve.evaluation.shift import run_shift_demo

    summary = run_shift_demo(tmp_path, seed=0, data_dir=shared_data_dir)
    saved = json.loads((tmp_path / "shift.json").read_text())
    assert (tmp_path / "shift.png").stat().st_size > 10_000
    target = saved["target_coverage"]
    p1, p2 = saved["phase1"], saved["phase2"]
    assert abs(p1["static"]["coverage"] - target) < 0.05 and not p1["drift"]["drifted"]
    assert p2["static"]["coverage"] < target - 0.1
    assert abs(p2["adaptive"]["coverage"] - target) < abs(p2["static"]["coverage"] - target) / 2
    assert p2["drift"]["drifted"] and p2["drift"]["p_value"] < 1e-6
    assert summary["phase2"]["adaptive"]["coverage"] == p2["adaptive"]["coverage"]
