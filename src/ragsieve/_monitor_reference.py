"""The per-request statistic of the exchangeability monitor and its artifact block.

Shared by :mod:`ragsieve.filter` (which records the calibration side in the artifact),
:mod:`ragsieve.artifact` (whose reader checks the block) and :mod:`ragsieve.monitoring`
(which ranks live requests against it). It stays a layer-0 helper instead of moving into
``monitoring.py``: the filter, which computes the block, is monitoring's sibling and may not
import it, and the artifact reader, which checks it, sits below both. Why this statistic is
chosen is explained in :mod:`ragsieve.monitoring`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._validation import MAX_COUNT
from .errors import ArtifactError
from .types import Pair

__all__ = [
    "MAX_REFERENCE",
    "STATISTIC",
    "STATISTIC_VERSION",
    "TOP_K",
    "best_score",
    "calibration_reference",
    "read_monitor_block",
    "reference_block",
    "separation",
]

logger = logging.getLogger(__name__)

#: Name and version of the per-request statistic written into artifacts.
STATISTIC = "separation"
STATISTIC_VERSION = 1
#: The statistic reads a request's ``TOP_K`` best (lowest) scores.
TOP_K = 5
#: At most this many calibration queries are kept in the reference (a seeded random subsample).
MAX_REFERENCE = 20_000

_KEYS = frozenset({"statistic", "version", "k", "reference", "n_queries", "seed"})
#: Optional keys: ``"best"``, the best score of every calibration query with 1 or more
#: snippets (the second statistic; blocks written without it hold the separation alone).
_OPTIONAL = frozenset({"best"})


def separation(scores: Any, k: int = TOP_K) -> float | None:
    """How far a request's best score stands out: ``mean(best m) - best`` with ``m = min(n, k)``.

    Parameters
    ----------
    scores : array-like of float
        One request's (or calibration query's) snippet scores, lower = more relevant;
        finite values (checked by the callers).
    k : int
        How many of the best scores are read.

    Returns
    -------
    float or None
        ``>= 0``; None for fewer than 2 scores (nothing to separate: such a request is
        not a monitored observation, on either side).

    Examples
    --------
    >>> round(separation([0.9, 0.2, 0.5, 0.6, 0.7, 0.8]), 6)  # best 5: 0.2 0.5 0.6 0.7 0.8
    0.36
    >>> separation([0.4]) is None
    True
    """
    arr = np.asarray(scores, dtype=np.float64).ravel()
    if arr.size < 2:
        return None
    best = np.sort(arr)[: min(arr.size, k)]
    return max(0.0, float(best.mean() - best[0]))  # equal scores: no rounding below 0


def best_score(scores: Any) -> float | None:
    """A request's best (lowest) score; None for an empty list.

    Examples
    --------
    >>> best_score([0.9, 0.2, 0.5])
    0.2
    >>> best_score([]) is None
    True
    """
    arr = np.asarray(scores, dtype=np.float64).ravel()
    return float(arr.min()) if arr.size else None


def _subsample(values: list[float], seed: int, max_size: int) -> list[float]:
    if len(values) <= max_size:
        return values
    rng = np.random.default_rng(seed)
    return [values[i] for i in np.sort(rng.choice(len(values), size=max_size, replace=False))]


def reference_block(scores: Any, query_ids: Sequence[Any], *, seed: int = 0,
                    max_size: int = MAX_REFERENCE, k: int = TOP_K) -> dict[str, Any] | None:
    """The artifact's ``"monitor"`` block: the statistic of every calibration query.

    Parameters
    ----------
    scores : array-like of float
        Scores of *all* calibration snippets (relevant or not: served traffic is
        unlabelled), aligned with ``query_ids``.
    query_ids : sequence
        The query of each score.
    seed : int
        Seed of the random subsample when there are more than ``max_size`` queries (a
        random subsample of an exchangeable sequence stays exchangeable with new requests).
    max_size : int
        Most queries kept.
    k : int
        Best scores read per query.

    Returns
    -------
    dict or None
        ``{"statistic", "version", "k", "reference", "n_queries", "seed", "best"}``:
        ``reference`` holds the separation of every query with 2 or more snippets, ``best``
        the best score of every query (each a seeded subsample of at most ``max_size``);
        None when no query has 2 or more snippets.
    """
    arr = np.asarray(scores, dtype=np.float64)
    if arr.shape != (len(query_ids),):
        raise ValueError(f"got {arr.size} scores for {len(query_ids)} query ids; they must align.")
    by_query: dict[Any, list[float]] = {}
    for qid, s in zip(query_ids, arr.tolist(), strict=True):
        by_query.setdefault(qid, []).append(s)
    stats = [v for v in (separation(s, k) for s in by_query.values()) if v is not None]
    if not stats:
        return None
    best = [float(min(s)) for s in by_query.values()]
    return {"statistic": STATISTIC, "version": STATISTIC_VERSION, "k": k,
            "reference": _subsample(stats, seed, max_size), "n_queries": len(by_query),
            "seed": seed, "best": _subsample(best, seed, max_size)}


def calibration_reference(pairs: Sequence[Pair], used: Sequence[Pair], scores: np.ndarray,
                          score: Callable[[list[Pair]], np.ndarray], *,
                          seed: int = 0) -> dict[str, Any] | None:
    """The monitor block of calibration pairs (:func:`reference_block`), from the scores of
    every calibration snippet, per query.

    ``scores`` are those of ``used``; when ``used`` is not ``pairs`` (only the relevant
    pairs were scored) the others are scored with ``score`` too: served traffic is
    unlabelled. None (and a warning) when no query has 2 or more snippets.
    """
    qids = [p.query_id for p in used]
    if used is not pairs:  # only the relevant pairs were scored: score the others too
        rest = [p for p in pairs if p.relevant != 1]
        if rest:
            scores = np.concatenate([scores, score(rest)])
            qids += [p.query_id for p in rest]
    block = reference_block(scores, qids, seed=seed)
    if block is None:
        logger.warning("no calibration query has 2 or more snippets: the artifact gets no "
                       "exchangeability monitor reference")
    return block


def _count(block: Mapping[str, Any], key: str, low: int) -> int:
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low \
            or (key != "seed" and value > MAX_COUNT):
        raise ArtifactError(f"artifact monitor {key!r} == {value!r:.30}, expected an int >= "
                            f"{low}" + ("." if key == "seed" else f" and <= {MAX_COUNT}."))
    return value


def read_monitor_block(block: Any) -> dict[str, Any]:
    """Check an artifact's ``"monitor"`` block strictly; return it with a float ``reference``.

    The optional ``"best"`` (blocks written before it are the separation alone, and are
    returned without it) must be a non-empty list of finite numbers, at most one per
    calibration query.

    Raises
    ------
    ArtifactError
        Not an object, missing or unknown keys, a statistic or version this ragsieve does
        not compute, a reference that is not a non-empty list of finite numbers >= 0, or a
        malformed ``"best"``.
    """
    if not isinstance(block, Mapping):
        raise ArtifactError(f"artifact 'monitor' is a {type(block).__name__}, expected an object "
                            f"with keys {sorted(_KEYS)}.")
    if not _KEYS <= set(block) <= _KEYS | _OPTIONAL:
        raise ArtifactError(f"artifact 'monitor' has keys {sorted(block)}, expected {sorted(_KEYS)} "
                            f"and optionally {sorted(_OPTIONAL)}.")
    if block["statistic"] != STATISTIC or block["version"] != STATISTIC_VERSION \
            or isinstance(block["version"], bool):
        raise ArtifactError(
            f"artifact monitor statistic {block['statistic']!r} version {block['version']!r} is not "
            f"one this ragsieve computes ({STATISTIC!r} version {STATISTIC_VERSION}); recalibrate.")
    k = _count(block, "k", 2)
    n_queries = _count(block, "n_queries", 1)
    seed = _count(block, "seed", 0)
    ref = _per_query(block, "reference", n_queries, "numbers >= 0 (one statistic per "
                     "calibration query)", nonnegative=True)
    out = {"statistic": STATISTIC, "version": STATISTIC_VERSION, "k": k,
           "reference": ref, "n_queries": n_queries, "seed": seed}
    if "best" in block:
        out["best"] = _per_query(block, "best", n_queries, "numbers (the best score of each "
                                 "calibration query)", nonnegative=False)
    return out


def _per_query(block: Mapping[str, Any], key: str, n_queries: int, what: str, *,
               nonnegative: bool) -> list[float]:
    """``block[key]``: a non-empty list of finite numbers (>= 0 when ``nonnegative``), at
    most one per calibration query; ``ArtifactError`` naming ``key`` and ``what`` else."""
    values = block[key]
    if not isinstance(values, list) or not values or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or (nonnegative and v < 0) for v in values):
        raise ArtifactError(f"artifact monitor {key!r} must be a non-empty list of finite "
                            f"{what}.")
    if len(values) > n_queries:
        noun = "reference" if key == "reference" else repr(key)
        raise ArtifactError(f"artifact monitor holds {len(values)} {noun} values for "
                            f"{n_queries} calibration queries; expected at most one per query.")
    return [float(v) for v in values]
