"""Tests of ragsieve.data.splits.group_splits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsieve.data import group_splits
from ragsieve.errors import DataError

GROUPS = [f"g{i % 7}" for i in range(50)] + ["solo"]


def _check_split(groups: list[str], cal: np.ndarray, test: np.ndarray, fraction: float) -> None:
    n_groups = len(set(groups))
    assert cal.dtype == np.int64 and test.dtype == np.int64
    assert np.all(np.diff(cal) > 0) and np.all(np.diff(test) > 0)  # sorted, no repeats
    assert sorted(cal.tolist() + test.tolist()) == list(range(len(groups)))  # every index once
    cal_groups = {groups[i] for i in cal}
    test_groups = {groups[i] for i in test}
    assert not cal_groups & test_groups  # group-disjoint
    expected = min(max(round(n_groups * fraction), 1), n_groups - 1)
    assert len(cal_groups) == expected and len(test_groups) == n_groups - expected


def test_splits_are_disjoint_and_cover_everything() -> None:
    splits = group_splits(GROUPS, calibration_fraction=0.5, n_splits=30, seed=3)
    assert len(splits) == 30
    for cal, test in splits:
        _check_split(GROUPS, cal, test, 0.5)
    # Splits are fresh permutations: they do not all pick the same calibration groups.
    assert len({frozenset(GROUPS[i] for i in cal) for cal, _ in splits}) > 5


def test_reproducible_and_seed_dependent() -> None:
    a = group_splits(GROUPS, n_splits=10, seed=1)
    b = group_splits(GROUPS, n_splits=10, seed=1)
    c = group_splits(GROUPS, n_splits=10, seed=2)
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))
    # The first splits do not depend on how many are requested.
    short = group_splits(GROUPS, n_splits=3, seed=1)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(short, a))


def test_independent_of_input_order() -> None:
    rng = np.random.default_rng(0)
    order = rng.permutation(len(GROUPS))
    shuffled = [GROUPS[i] for i in order]
    for (cal, _), (cal_s, _) in zip(group_splits(GROUPS, seed=5), group_splits(shuffled, seed=5)):
        assert {GROUPS[i] for i in cal} == {shuffled[i] for i in cal_s}


def test_fraction_controls_group_count_and_is_clipped() -> None:
    groups = [str(i) for i in range(10)]
    for fraction, n_cal in [(0.3, 3), (0.5, 5), (0.01, 1), (0.99, 9)]:
        for cal, test in group_splits(groups, calibration_fraction=fraction, n_splits=5):
            assert (cal.size, test.size) == (n_cal, 10 - n_cal)
    two = group_splits(["a", "b", "a"], n_splits=4)
    assert all({len(c), len(t)} <= {1, 2} for c, t in two)


def test_integer_groups() -> None:
    ints = [i % 4 for i in range(20)]
    for cal, test in group_splits(ints, n_splits=5):
        assert not {ints[i] for i in cal} & {ints[i] for i in test}
    strings = [str(g) for g in ints]
    for (c1, _), (c2, _) in zip(group_splits(ints, seed=9), group_splits(strings, seed=9)):
        assert np.array_equal(c1, c2)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"calibration_fraction": 0.0},
            ValueError,
            r"calibration_fraction == 0.0, must be in \(0, 1\)",
        ),
        (
            {"calibration_fraction": 1.0},
            ValueError,
            r"calibration_fraction == 1.0, must be in \(0, 1\)",
        ),
        ({"calibration_fraction": -0.2}, ValueError, "must be in"),
        ({"calibration_fraction": "0.5"}, TypeError, "calibration_fraction must be a real number"),
        ({"n_splits": 0}, ValueError, r"n_splits == 0, must be an int in \[1, 10000\]"),
        ({"n_splits": 2.0}, TypeError, "n_splits must be an int"),
        ({"seed": None}, TypeError, "seed must be an int"),
    ],
)
def test_parameter_validation(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        group_splits(GROUPS, **kwargs)


def test_group_validation() -> None:
    with pytest.raises(DataError, match="at least 2 distinct groups, got 1 "):
        group_splits(["a", "a", "a"])
    with pytest.raises(DataError, match="got 0"):
        group_splits([])
    with pytest.raises(TypeError, match=r"groups must be a sequence of group names, got a single str"):
        group_splits("abc")
    with pytest.raises(TypeError, match=r"groups\[1\] is float"):
        group_splits(["a", 1.5])  # type: ignore[list-item]


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.sampled_from("abcdefghijkl"), min_size=2, max_size=80).filter(
        lambda g: len(set(g)) >= 2
    ),
    fraction=st.floats(0.01, 0.99),
    n_splits=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_properties(groups: list[str], fraction: float, n_splits: int, seed: int) -> None:
    splits = group_splits(groups, calibration_fraction=fraction, n_splits=n_splits, seed=seed)
    assert len(splits) == n_splits
    for cal, test in splits:
        _check_split(groups, cal, test, fraction)
    again = group_splits(groups, calibration_fraction=fraction, n_splits=n_splits, seed=seed)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(splits, again))
