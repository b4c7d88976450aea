"""Paired bootstrap intervals: statistical coverage, edge cases, validation."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ragsieve.evaluation.bootstrap import PairedInterval, paired_bootstrap

# ------------------------------------------------------------------ coverage

N_QUERIES = 60
REPETITIONS = 1000
LEVEL = 0.95
# 99.9 % two-sided binomial band of the observed coverage when the true rate is LEVEL
BAND = stats.binom.interval(0.999, REPETITIONS, LEVEL)


def _skewed_pairs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-query values of two methods: a shared, skewed query difficulty, and a skewed
    gain of ``a`` over ``b`` (exponential, skewness 2) with mean exactly 1."""
    difficulty = rng.gamma(2.0, 1.0, N_QUERIES)
    return difficulty + rng.exponential(1.0, N_QUERIES), difficulty


def test_coverage_of_the_true_difference() -> None:
    """Over many synthetic evaluations the default interval covers the true mean
    difference (1.0) at a rate inside the 99.9 % binomial band around 0.95, and a wrong
    value (the truth shifted by two standard errors) is covered far less often."""
    rng = np.random.default_rng(20240613)
    shift = 2.0 * 1.0 / math.sqrt(N_QUERIES)  # two standard errors of the mean gain
    covered = covered_shifted = 0
    start = time.perf_counter()
    for rep in range(REPETITIONS):
        a, b = _skewed_pairs(rng)
        ci = paired_bootstrap(a, b, confidence=LEVEL, seed=rep)
        covered += ci.low <= 1.0 <= ci.high
        covered_shifted += ci.low <= 1.0 + shift <= ci.high
    elapsed = time.perf_counter() - start
    low, high = BAND[0] / REPETITIONS, BAND[1] / REPETITIONS
    rate = covered / REPETITIONS
    assert low <= rate <= high, f"coverage {rate:.3f}, expected in [{low:.3f}, {high:.3f}]"
    # P(|Z + 2| < 1.96) is about 0.48 for a correct interval
    assert covered_shifted / REPETITIONS < 0.65, covered_shifted / REPETITIONS
    assert elapsed < 30.0, f"{elapsed:.1f} s"


def test_expansion_widens_the_plain_interval() -> None:
    rng = np.random.default_rng(1)
    a, b = _skewed_pairs(rng)
    plain = paired_bootstrap(a, b, expand=False)
    expanded = paired_bootstrap(a, b)
    assert expanded.low < plain.low and plain.high < expanded.high
    assert (plain.method, expanded.method) == ("BCa", "expanded BCa")
    assert plain.estimate == expanded.estimate


def test_plain_interval_is_scipys() -> None:
    rng = np.random.default_rng(2)
    a, b = _skewed_pairs(rng)
    for method in ("BCa", "percentile", "basic"):
        ours = paired_bootstrap(a, b, confidence=0.9, n_resamples=500, seed=5, method=method,
                                expand=False)
        ref = stats.bootstrap((a - b,), np.mean, confidence_level=0.9, n_resamples=500,
                              method=method, rng=np.random.default_rng(5)).confidence_interval
        assert (ours.low, ours.high) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_higher_confidence_is_wider() -> None:
    rng = np.random.default_rng(3)
    a, b = _skewed_pairs(rng)
    narrow = paired_bootstrap(a, b, confidence=0.8)
    wide = paired_bootstrap(a, b, confidence=0.99)
    assert wide.low < narrow.low < narrow.estimate < narrow.high < wide.high
    assert (narrow.confidence, wide.confidence) == (0.8, 0.99)


# ------------------------------------------------------------------ results


def test_estimate_pairs_and_nan() -> None:
    a = [1.0, 0.0, float("nan"), 1.0, 0.5, 1.0]
    b = [0.0, 0.0, 1.0, float("nan"), 0.5, 0.0]
    ci = paired_bootstrap(a, b)
    assert ci.n == 4  # pairs 2 and 3 dropped
    assert ci.estimate == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert ci.low <= ci.estimate <= ci.high


def test_fewer_than_two_pairs() -> None:
    one = paired_bootstrap([0.7, float("nan")], [0.2, 0.1])
    assert one.n == 1 and one.estimate == pytest.approx(0.5)
    assert math.isnan(one.low) and math.isnan(one.high)
    none = paired_bootstrap([float("nan")], [1.0])
    assert none.n == 0 and math.isnan(none.estimate) and math.isnan(none.low)
    empty = paired_bootstrap([], [])
    assert empty.n == 0 and math.isnan(empty.high)


def test_identical_differences_give_a_point_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = paired_bootstrap([1.0, 0.0, 1.0, 0.5], [0.0, -1.0, 0.0, -0.5])
        zero = paired_bootstrap([1, 0, 1], [1, 0, 1])  # ints and identical methods
    assert (same.estimate, same.low, same.high, same.n) == (1.0, 1.0, 1.0, 4)
    assert (zero.estimate, zero.low, zero.high) == (0.0, 0.0, 0.0)


def test_sparse_binary_differences() -> None:
    """Exact-match style differences: mostly 0, a few +1/-1."""
    a = np.zeros(80)
    b = np.zeros(80)
    a[:6] = 1.0
    b[6:8] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci = paired_bootstrap(a, b)
    assert ci.estimate == pytest.approx(4 / 80)
    assert ci.low < ci.estimate < ci.high
    assert -0.1 < ci.low and ci.high < 0.2


def test_falls_back_to_percentile_when_bca_is_undefined() -> None:
    """With one resample BCa is often undefined; the percentile interval is returned
    instead, its method says so, and no warning escapes."""
    fallbacks = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(20):
            ci = paired_bootstrap([0, 0, 0, 0, 1], [0, 0, 0, 0, 0], n_resamples=1, seed=seed)
            assert math.isfinite(ci.low) and math.isfinite(ci.high)
            assert ci.method in ("expanded BCa", "expanded percentile")
            fallbacks += ci.method == "expanded percentile"
    assert fallbacks > 0


def test_seed_reproducibility() -> None:
    rng = np.random.default_rng(4)
    a, b = _skewed_pairs(rng)
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)
    assert paired_bootstrap(a, b, seed=7) != paired_bootstrap(a, b, seed=8)
    gen = paired_bootstrap(a, b, seed=np.random.default_rng(7))
    assert gen == paired_bootstrap(a, b, seed=7)
    assert math.isfinite(paired_bootstrap(a, b, seed=None).low)


def test_method_names() -> None:
    a, b = [0.1, 0.5, 0.9, 0.3], [0.0, 0.2, 0.4, 0.4]
    assert paired_bootstrap(a, b, method="bca").method == "expanded BCa"
    assert paired_bootstrap(a, b, method="Percentile").method == "expanded percentile"
    assert paired_bootstrap(a, b, method="basic", expand=False).method == "basic"


def test_to_dict_is_json_ready() -> None:
    ci = paired_bootstrap([0.1, 0.5, 0.9], [0.0, 0.2, 0.4], n_resamples=200)
    d = ci.to_dict()
    assert list(d) == ["estimate", "low", "high", "n", "confidence", "method"]
    assert json.loads(json.dumps(d)) == d
    assert all(type(d[k]) is float for k in ("estimate", "low", "high", "confidence"))
    assert type(d["n"]) is int
    nan = paired_bootstrap([1.0], [0.0]).to_dict()
    assert math.isnan(json.loads(json.dumps(nan))["low"])
    assert isinstance(ci, PairedInterval)
    with pytest.raises(AttributeError):
        ci.low = 0.0  # type: ignore[misc]


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"a": [1.0, 2.0], "b": [1.0]}, ValueError, "a has 2 values and b has 1"),
        ({"a": [[1.0, 2.0]], "b": [[1.0, 2.0]]}, ValueError, r"shape \(1, 2\), expected a 1-D"),
        ({"a": [1.0, float("inf")], "b": [1.0, 2.0]}, ValueError, r"a\[1\] == inf"),
        ({"a": ["1", "2"], "b": [1.0, 2.0]}, TypeError, "real numbers.*dtype <U1"),
        ({"a": [1.0, None], "b": [1.0, 2.0]}, TypeError, "NaN for a missing value"),
        ({"confidence": 1.0}, ValueError, r"confidence == 1.0, must be in \(0, 1\)"),
        ({"confidence": 95}, ValueError, r"confidence == 95"),
        ({"confidence": "0.9"}, TypeError, "confidence must be a real number"),
        ({"n_resamples": 0}, ValueError, "n_resamples == 0, must be an int >= 1"),
        ({"method": "student"}, ValueError, "method == 'student', must be one of 'BCa'"),
        ({"seed": -1}, ValueError, "seed == -1, must be an int >= 0"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"expand": "yes"}, TypeError, "expand must be a bool"),
    ],
)
def test_validation(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    args = {"a": [0.1, 0.5, 0.9], "b": [0.0, 0.2, 0.4], **kwargs}
    with pytest.raises(error, match=match):
        paired_bootstrap(args.pop("a"), args.pop("b"), **args)


def test_import_does_not_load_scipy() -> None:
    code = ("import sys, ragsieve.evaluation.bootstrap, ragsieve.evaluation.answer_metrics; "
            "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
