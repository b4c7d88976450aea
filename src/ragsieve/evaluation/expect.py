"""What a calibration is expected to do on new topics, by cross-validation over its topics.

The calibration pairs are scored once; their topics (the pairs' ``group``, which defaults
to the query id) are cut into at most :data:`MAX_FOLDS` topic-disjoint folds, and the split
sweep of :func:`~ragsieve.evaluation.evaluate_scores` runs once per fold: it calibrates
the same mode and alpha on the other folds' topics and measures coverage and removal on
the held-out fold (a fused ``best`` score is refitted inside each fold, as ``evaluate``
does). The estimate is the mean over folds, the interval the lowest and the highest fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_int
from ..errors import DataError
from ..scoring import resolve_scorer
from ..types import DEFAULT_ALPHA, Pair
from .sweep import EvaluationConfig, ScoredData, evaluate_scores, score_for_evaluation

__all__ = ["MAX_FOLDS", "MIN_TOPICS", "Expectation", "TopicFolds", "expected_on_new_topics",
           "topic_folds"]

#: At most this many folds (each costs one calibration; the scores are computed once).
MAX_FOLDS = 5
#: Fewer topics than this give no estimate (a held-out fold needs at least two topics).
MIN_TOPICS = 10

_INTERVAL = "lowest fold, highest fold"


@dataclass(frozen=True)
class Expectation:
    """Coverage and removal a calibration is expected to reach on new topics.

    Attributes
    ----------
    mode : str
        The guarantee mode calibrated in every fold.
    alpha : float
        Its alpha.
    n_topics : int
        Distinct topics (``group`` values) of the calibration pairs.
    n_folds : int
        Topic-disjoint folds used (0 when nothing was estimated).
    coverage, removal : float or None
        Mean over folds of the held-out fold's share of relevant snippets kept and of
        snippets removed; None when nothing was estimated.
    coverage_interval, removal_interval : tuple of float or None
        The lowest and the highest fold's value.
    reason : str or None
        Why nothing was estimated (too few topics, or no fold with relevant snippets on
        both sides).
    """

    mode: str
    alpha: float
    n_topics: int
    n_folds: int = 0
    coverage: float | None = None
    coverage_interval: tuple[float, float] | None = None
    removal: float | None = None
    removal_interval: tuple[float, float] | None = None
    reason: str | None = None

    @property
    def estimated(self) -> bool:
        """Whether the folds gave numbers (else ``reason`` says why not)."""
        return self.coverage is not None

    def __str__(self) -> str:
        c, r = self.coverage_interval, self.removal_interval
        if self.coverage is None or self.removal is None or c is None or r is None:
            return f"expected on new topics: not estimated, {self.reason}"
        return (f"expected on new topics ({self.n_folds}-fold over {self.n_topics} topics): "
                f"coverage {self.coverage:.2f} [{c[0]:.2f}, {c[1]:.2f}], removal "
                f"{self.removal:.2f} [{r[0]:.2f}, {r[1]:.2f}]: mean over the folds "
                f"[{_INTERVAL}]")

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: the numbers, the folds, and how the interval was made."""
        return {"mode": self.mode, "alpha": self.alpha, "n_topics": self.n_topics,
                "n_folds": self.n_folds, "coverage": self.coverage,
                "coverage_interval": None if self.coverage_interval is None
                else list(self.coverage_interval),
                "removal": self.removal,
                "removal_interval": None if self.removal_interval is None
                else list(self.removal_interval),
                "interval": _INTERVAL, "reason": self.reason}


def topic_folds(group_index: Sequence[int] | np.ndarray, n_folds: int,
                seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Topic-disjoint folds: ``(calibration_indices, test_indices)`` with each fold's topics
    as the test side once and every other topic on the calibration side.

    The distinct topics (in sorted order) are permuted by ``numpy.random.default_rng(seed)``
    and cut into ``n_folds`` parts whose sizes differ by at most one.

    Raises
    ------
    ValueError
        ``n_folds`` below 2 or above the number of topics.
    """
    groups = np.asarray(group_index)
    topics = np.unique(groups)
    n_folds = check_int(n_folds, "n_folds", min_value=2, max_value=int(topics.size),
                        hint="the number of topics")
    parts = np.array_split(np.random.default_rng(seed).permutation(topics), n_folds)
    folds = []
    for part in parts:
        test = np.isin(groups, part)
        folds.append((np.flatnonzero(~test), np.flatnonzero(test)))
    return folds


@dataclass(frozen=True)
class TopicFolds:
    """The topic-disjoint folds :func:`expected_on_new_topics` asks for.

    Attributes
    ----------
    n_folds : int
        Folds wanted; at most :data:`MAX_FOLDS` and at most the number of topics are used.
    seed : int
        Seed of the fold assignment (and of a fused score's fit/calibration topics).
    """

    n_folds: int = MAX_FOLDS
    seed: int = 0


def expected_on_new_topics(
    pairs: Sequence[Pair],
    scorer: Any,
    *,
    mode: str = "marginal",
    alpha: float = DEFAULT_ALPHA,
    folds: TopicFolds = TopicFolds(),
    group_by: str | None = None,
    progress: bool = False,
    **calibrator_params: Any,
) -> Expectation:
    """Estimate, by topic-disjoint cross-validation, the coverage and removal of calibrating
    ``mode`` at ``alpha`` on these pairs, as measured on topics it did not see.

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled calibration pairs; their ``group`` is the topic.
    scorer : Scorer or str
        The score calibrated (an alias with options: ``resolve_scorer(alias, **options)``
        first). A fused score (``"best"``) is fitted afresh in every fold on part of that
        fold's calibration topics, also when it comes fitted (its weights were learnt on
        these pairs, held-out folds included).
    mode, alpha
        The guarantee mode and its alpha.
    folds : TopicFolds
        How many folds (at most :data:`MAX_FOLDS`) and their seed.
    group_by : str, optional
        ``Pair.meta`` key of the ``group`` mode's attribute.
    progress : bool
        Progress bar while scoring.
    **calibrator_params
        Further calibrator parameters (``delta``, ``min_group_size``, ``budget``, ``unit``,
        ``bound``, ...), as :func:`ragsieve.calibration.make_calibrator` takes them.

    Returns
    -------
    Expectation
        Mean over folds with the lowest and highest fold; with fewer than
        :data:`MIN_TOPICS` topics, no numbers and the reason.

    Raises
    ------
    DataError
        No pairs, or pairs without relevance labels.
    """
    pairs = list(pairs)
    if not pairs:
        raise DataError("no pairs: the expectation on new topics needs labelled pairs.")
    n_topics = len({p.group for p in pairs})
    if n_topics < MIN_TOPICS:
        return Expectation(mode, float(alpha), n_topics, reason=(
            f"{n_topics} topic(s) (the pairs' group field) is too few for a topic-disjoint "
            f"estimate: it needs at least {MIN_TOPICS} ({MAX_FOLDS} folds of at least "
            f"{MIN_TOPICS // MAX_FOLDS} topics); `ragsieve choose-alpha` and `evaluate` still "
            f"run random splits of these {n_topics} topics, whose held-out topics overlap"))
    k, seed = min(int(folds.n_folds), MAX_FOLDS, n_topics), folds.seed
    config = _config(mode, float(alpha), k, seed, calibrator_params)
    pairs, scores, features, _, _ = score_for_evaluation(
        pairs, _refittable(resolve_scorer(scorer)),
        progress=progress, fusion_fraction=config.fusion_fraction)
    data = ScoredData.from_pairs(pairs, scores, group_by=group_by)
    try:
        report = evaluate_scores(data, config, fusion_features=features,
                                 splits=topic_folds(data.group_index, k, seed))
    except DataError as exc:  # every fold lacked relevant snippets on one side
        return Expectation(mode, float(alpha), n_topics, reason=str(exc))
    row = report.rows("conformal")[0]
    return Expectation(
        mode=mode, alpha=float(alpha), n_topics=n_topics, n_folds=report.n_splits,
        coverage=row["coverage_mean"], removal=row["removal_mean"],
        coverage_interval=(row["coverage_min"], row["coverage_max"]),
        removal_interval=(row["removal_min"], row["removal_max"]))


def _refittable(scorer: Any) -> Any:
    """A fitted fused score as an unfitted one on the same base (refitted per fold)."""
    return scorer.unfitted_copy()


def _config(mode: str, alpha: float, k: int, seed: int,
            params: dict[str, Any]) -> EvaluationConfig:
    """The sweep of one conformal row (no baselines) with the calibrator's parameters."""
    named = {key: params.pop(key) for key in ("delta", "min_group_size", "bound")
             if params.get(key) is not None}
    budget = params.pop("budget", None) if mode == "budget" else None
    params.pop("budget", None)
    return EvaluationConfig(alphas=(alpha,), modes=(mode,), top_k=(), thetas=(),
                            calibrated_baselines=False, n_splits=k, seed=seed,
                            budgets=() if budget is None else (int(budget),),
                            calibrator_params={key: v for key, v in params.items()
                                               if v is not None and key != "alpha"},
                            **named)

