"""The conformal p-value: how a snippet's score ranks among the calibration evidence's.

A score's units differ from score to score (``1 - cos``, a fused log-odds, a BM25 count,
an outside score) and from mode to mode; the p-value does not. For a new snippet with
nonconformity score ``s`` (lower = more relevant) and the ``n`` relevant calibration
snippets' scores ``s_1 .. s_n``,

    p(s) = (1 + #{i : s_i >= s}) / (n + 1),

the share of the calibration evidence (counting the new snippet itself) that scored no
better than it. Under exchangeability a relevant snippet's p-value is super-uniform:
``P(p <= alpha) <= alpha``. So the marginal mode's rule *keep when s <= tau* is exactly
*keep when p > alpha* (tau is the ``ceil((n + 1)(1 - alpha))``-th smallest relevant
score; :func:`marginal_keeps` checks it), and in every other mode the p-value reads as the
snippet's *evidence percentile* next to that mode's own rule. A score whose user-facing
direction is higher-is-better (BM25, an outside score) is negated inside the product, so
the same formula covers both directions.

:class:`EvidenceScores` holds the sorted relevant calibration scores: the marginal
calibrator's own (``SplitConformalCalibrator.scores_``), else the ``"evidence"`` block
the artifact stores beside the calibration block (at most :data:`MAX_EVIDENCE`, a seeded
random subsample beyond; a p-value against a random subsample of exchangeable scores is
still a conformal p-value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import MAX_COUNT, check_scores
from ..errors import ArtifactError

__all__ = ["MAX_EVIDENCE", "EvidenceScores", "marginal_keeps"]

#: At most this many relevant calibration scores are stored in the ``"evidence"`` block.
MAX_EVIDENCE = 20_000
_KEYS = frozenset({"scores", "n_relevant", "seed"})


@dataclass(frozen=True, eq=False)
class EvidenceScores:
    """The sorted relevant calibration scores a p-value is computed against.

    Attributes
    ----------
    scores : numpy.ndarray
        Sorted, finite nonconformity scores of relevant calibration snippets (or evidence
        sentences, for the sentence unit).
    n_relevant : int
        The relevant calibration snippets there were (``>= len(scores)``: more when the
        stored scores are a subsample).
    seed : int
        Seed of the subsample (unused when every score is stored).

    Examples
    --------
    >>> ev = EvidenceScores.of([0.1, 0.3, 0.5, 0.7])
    >>> ev.p_values([0.05, 0.3, 0.9]).round(2).tolist()  # (1 + 4)/5, (1 + 3)/5, (1 + 0)/5
    [1.0, 0.8, 0.2]
    """

    scores: np.ndarray
    n_relevant: int
    seed: int = 0

    @classmethod
    def of(cls, scores: Any, relevant: Any = None, *, seed: int = 0,
           max_scores: int = MAX_EVIDENCE) -> EvidenceScores:
        """The relevant ones of ``scores`` (``relevant`` None: all), sorted; a seeded random
        subsample of ``max_scores`` when there are more.

        Raises
        ------
        ValueError
            Scores not finite, labels misaligned, or no relevant score.
        """
        arr = check_scores(scores, name="calibration scores")
        if relevant is not None:
            rel = np.asarray(relevant).astype(bool).ravel()
            if rel.size != arr.size:
                raise ValueError(f"got {rel.size} labels for {arr.size} calibration scores; "
                                 "they must align.")
            arr = arr[rel]
        if arr.size == 0:
            raise ValueError("no relevant calibration score: a p-value needs at least one.")
        n = int(arr.size)
        if n > max_scores:
            arr = np.random.default_rng(seed).choice(arr, size=max_scores, replace=False)
        return cls(np.sort(arr), n, seed)

    @property
    def n(self) -> int:
        """How many scores the p-values are computed against."""
        return int(self.scores.size)

    def p_values(self, scores: Any) -> np.ndarray:
        """``(1 + #{calibration scores >= s}) / (n + 1)`` for each ``s`` (``+inf`` -> ``1/(n+1)``).

        Parameters
        ----------
        scores : array-like of float
            Nonconformity scores (lower = more relevant); ``+inf`` (a blank snippet's) is
            allowed.
        """
        s = np.asarray(scores, dtype=np.float64).ravel()
        if np.isnan(s).any():
            raise ValueError("a p-value needs scores that are numbers; got NaN.")
        at_least = self.n - np.searchsorted(self.scores, s, side="left")
        return (1.0 + at_least) / (self.n + 1.0)

    def p_value(self, score: float) -> float:
        """The p-value of one score (:meth:`p_values`)."""
        return float(self.p_values([score])[0])

    def to_dict(self) -> dict[str, Any]:
        """The artifact's ``"evidence"`` block."""
        return {"scores": [float(x) for x in self.scores], "n_relevant": self.n_relevant,
                "seed": self.seed}

    @classmethod
    def from_dict(cls, block: Any) -> EvidenceScores:
        """The checked ``"evidence"`` block.

        Raises
        ------
        ArtifactError
            Not a mapping of ``scores`` (a non-empty sorted list of finite numbers, at most
            :data:`MAX_EVIDENCE`), ``n_relevant`` (an int, at least as many) and ``seed``.
        """
        if not isinstance(block, Mapping) or set(block) != _KEYS:
            got = sorted(block) if isinstance(block, Mapping) else type(block).__name__
            raise ArtifactError(f"artifact evidence block has {got}; expected the keys "
                                f"{sorted(_KEYS)}.")
        try:
            scores = check_scores(block["scores"], name="evidence scores")
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"artifact evidence block: {exc}") from None
        n, seed = block["n_relevant"], block["seed"]
        if not 0 < scores.size <= MAX_EVIDENCE or np.any(np.diff(scores) < 0):
            raise ArtifactError(f"artifact evidence scores: {scores.size} values, expected "
                                f"1 to {MAX_EVIDENCE} sorted ones.")
        for key, value, low, high in (("n_relevant", n, scores.size, MAX_COUNT),
                                      ("seed", seed, 0, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low \
                    or (high is not None and value > high):
                raise ArtifactError(f"artifact evidence {key} == {value!r:.30}, expected an int "
                                    f">= {low}" + ("." if high is None else f" and <= {high}."))
        return cls(scores, int(n), int(seed))

    @classmethod
    def of_calibrator(cls, calibrator: Any) -> EvidenceScores | None:
        """The marginal calibrator's own relevant scores (``scores_``), else None."""
        own = getattr(calibrator, "scores_", None)
        if own is None or not np.size(own):
            return None
        return cls(np.asarray(own, dtype=np.float64), int(np.size(own)))


def marginal_keeps(p_values: Any, alpha: float, n: int) -> np.ndarray:
    """The marginal rule in p-values: keep when ``p > alpha``.

    Exact against ``s <= tau`` for ``tau`` the ``ceil((n + 1)(1 - alpha))``-th smallest
    of the same ``n`` scores (``+inf`` when that rank exceeds ``n``), with the rounding
    guard :func:`~ragsieve.calibration.stats.conformal_rank` uses: ``alpha`` is raised by
    ``1e-9 / (n + 1)`` before the comparison.

    Examples
    --------
    >>> ev = EvidenceScores.of([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    >>> marginal_keeps(ev.p_values([0.9, 0.95]), 0.1, ev.n).tolist()  # tau = 0.9 (rank 9 of 9)
    [True, False]
    """
    p = np.asarray(p_values, dtype=np.float64)
    return p > float(alpha) + 1e-9 / (int(n) + 1)
