"""Group-disjoint random calibration/test splits."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from ragsieve._validation import check_int, check_sequence, check_unit_interval
from ragsieve.errors import DataError
from ragsieve.types import Pair

__all__ = ["MAX_SPLITS", "group_splits", "sample_queries"]

MAX_SPLITS = 10_000
"""Most splits :func:`group_splits` makes (each holds index arrays over every item; a
mistyped count must fail at once, not allocate until the process is killed)."""


def group_splits(
    groups: Sequence[str | int],
    *,
    calibration_fraction: float = 0.5,
    n_splits: int = 20,
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random calibration/test splits in which every group lies wholly on one side.

    Each split draws a fresh random permutation of the distinct groups (taken in
    sorted order, so the result does not depend on the order of the input) and puts
    the first ``round(n_groups * calibration_fraction)`` of them -- clipped to
    ``[1, n_groups - 1]`` -- into calibration, the rest into test.

    Parameters
    ----------
    groups : sequence of str or int
        The group of each item, e.g. ``[p.group for p in pairs]``. Integers are
        accepted and compared as strings.
    calibration_fraction : float, default 0.5
        Fraction of the groups used for calibration, in (0, 1).
    n_splits : int, default 20
        Number of splits.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``; the same inputs and seed give the same
        splits.

    Returns
    -------
    list of (ndarray, ndarray)
        ``(calibration_indices, test_indices)`` into ``groups``, each sorted
        ascending, ``int64``; together they cover every index exactly once.

    Raises
    ------
    TypeError
        If an element of ``groups`` is not a str or int, or ``n_splits``/``seed`` is
        not an int.
    ValueError
        If ``calibration_fraction`` is outside (0, 1) or ``n_splits`` outside
        ``[1, MAX_SPLITS]``.
    DataError
        If there are fewer than 2 distinct groups.

    Examples
    --------
    >>> cal, test = group_splits(["a", "a", "b", "c"], n_splits=1, seed=0)[0]
    >>> sorted(set(cal.tolist()) | set(test.tolist()))
    [0, 1, 2, 3]
    """
    calibration_fraction = check_unit_interval(calibration_fraction, "calibration_fraction",
                                               closed_right=False)
    n_splits = check_int(n_splits, "n_splits", min_value=1, max_value=MAX_SPLITS)
    seed = check_int(seed, "seed")
    groups = check_sequence(groups, "groups", expected="a sequence of group names", iterable=True)

    keys: list[str] = []
    for i, g in enumerate(groups):
        if isinstance(g, str):
            keys.append(g)
        elif isinstance(g, numbers.Integral) and not isinstance(g, bool):
            keys.append(str(g))
        else:
            raise TypeError(
                f"groups[{i}] is {type(g).__name__} ({g!r:.60}), must be a str or int; pass "
                "e.g. [p.group for p in pairs]."
            )
    unique = sorted(set(keys))
    n_groups = len(unique)
    if n_groups < 2:
        raise DataError(
            f"group_splits needs at least 2 distinct groups, got {n_groups} "
            f"({len(keys)} items); a group-disjoint split is impossible."
        )
    code = {g: j for j, g in enumerate(unique)}
    inverse = np.fromiter((code[k] for k in keys), dtype=np.int64, count=len(keys))
    n_cal = min(max(round(n_groups * float(calibration_fraction)), 1), n_groups - 1)

    rng = np.random.default_rng(int(seed))
    splits: list[tuple[np.ndarray, np.ndarray]] = []
    for _ in range(int(n_splits)):
        in_cal = np.zeros(n_groups, dtype=bool)
        in_cal[rng.permutation(n_groups)[:n_cal]] = True
        mask = in_cal[inverse]
        splits.append(
            (np.flatnonzero(mask).astype(np.int64), np.flatnonzero(~mask).astype(np.int64))
        )
    return splits


def sample_queries(pairs: Sequence[Pair], n_queries: int, *, seed: int = 0) -> list[Pair]:
    """Keep the pairs of ``n_queries`` queries drawn at random, spread over the groups.

    Queries are shuffled within each group (seeded) and taken round-robin over the
    groups in random order, so every topic is represented as far as ``n_queries``
    allows. Pair order is preserved. Used to bound the cost of expensive scorers.

    Parameters
    ----------
    pairs : sequence of Pair
    n_queries : int
        Number of queries to keep (all when it exceeds the number available).
    seed : int

    Returns
    -------
    list of Pair
    """
    n_queries = check_int(n_queries, "n_queries", min_value=1)
    rng = np.random.default_rng(seed)
    by_group: dict[str, list[str]] = {}
    for p in pairs:
        queries = by_group.setdefault(p.group, [])
        if p.query_id not in queries:
            queries.append(p.query_id)
    groups = sorted(by_group)
    order = [groups[i] for i in rng.permutation(len(groups))]
    queues = {g: [by_group[g][i] for i in rng.permutation(len(by_group[g]))] for g in order}
    chosen: set[str] = set()
    while len(chosen) < n_queries and any(queues.values()):
        for g in order:
            if queues[g] and len(chosen) < n_queries:
                chosen.add(queues[g].pop())
    return [p for p in pairs if p.query_id in chosen]
