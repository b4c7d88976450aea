"""A scorer whose ``score_pairs`` runs on an engine: the scoring phase of ``evaluate``.

Evaluation needs every score in memory anyway (a sweep over splits), but computing them
is the expensive part; :class:`EngineScorer` hands that part to an engine (a Ray
cluster) and reads the scores back in the pairs' order. Its spec is the wrapped scorer's,
so reports and artifacts are unchanged.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._validation import check_instance
from ..data.jsonl import group_by_query, write_pairs
from ..data.shards import expand_inputs
from ..scoring import KeepRule, Scorer, ScorerTags
from ..types import Pair
from .base import DEFAULT_BATCH_PAIRS, run_job
from .tasks import ScoreTask

__all__ = ["EngineScorer", "on_engine"]

_SCORE = "_ragsieve_score"


class EngineScorer(Scorer):
    """Score pairs with ``engine``; identical scores to ``scorer`` (same spec).

    Parameters
    ----------
    scorer : Scorer
        The score to compute (its ``spec()`` is rebuilt in every worker).
    engine : Engine
        Where to compute it (e.g. :class:`~ragsieve.engines.ray_engine.RayEngine`).
    scorer_options : mapping, optional
        Options that do not change scores (embedding cache, LLM endpoint) for the workers.
    shard_bytes : int, optional
        Input bytes per shard (default: about 16 shards per worker-free run, at least
        64 KiB), so that small evaluations still spread over the workers.
    """

    name = "engine"

    def __init__(self, scorer: Scorer, engine: Any, *,
                 scorer_options: Mapping[str, Any] | None = None,
                 shard_bytes: int | None = None) -> None:
        self.scorer = check_instance(scorer, Scorer, "scorer", expected="a ragsieve Scorer")
        self.engine = engine
        self.scorer_options = dict(scorer_options or {})
        self.shard_bytes = shard_bytes
        # the wrapped scorer's list dependence and text reading; the other tags the defaults
        self.tags = ScorerTags(list_dependent=scorer.tags.list_dependent,
                               reads_text=scorer.tags.reads_text)

    def spec(self) -> dict[str, Any]:
        return self.scorer.spec()

    def keep_rule(self, threshold: float) -> KeepRule:
        """The wrapped scorer's keep rule (the engine changes where, not what, is scored)."""
        return self.scorer.keep_rule(threshold)

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        return self.scorer.score_batch(query, snippets)

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score on the engine; pairs of one query need not be together in ``pairs``."""
        pairs = list(pairs)
        if not pairs:
            return np.zeros(0)
        order = [i for idx in group_by_query(pairs).values() for i in idx]  # queries whole
        with tempfile.TemporaryDirectory(prefix="ragsieve-engine-") as tmp:
            source = Path(tmp) / "pairs.jsonl"
            write_pairs((pairs[i] for i in order), source)
            size = source.stat().st_size
            shard_bytes = self.shard_bytes or max(64 * 1024, size // 16 + 1)
            task = ScoreTask(self.scorer.spec(), scorer_options=self.scorer_options,
                             score_name=_SCORE)
            run_job(task, [source], Path(tmp) / "scores", self.engine, shard_bytes=shard_bytes,
                    batch_pairs=DEFAULT_BATCH_PAIRS, progress=progress)
            sorted_scores = np.array([
                json.loads(line)[_SCORE]
                for part in expand_inputs([Path(tmp) / "scores"])
                for line in part.open(encoding="utf-8")
            ], dtype=float)
        if sorted_scores.shape != (len(pairs),):
            raise RuntimeError(f"the engine returned {sorted_scores.size} scores for "
                               f"{len(pairs)} pairs.")
        scores = np.empty(len(pairs))
        scores[order] = sorted_scores
        return scores

    def __repr__(self) -> str:
        return f"EngineScorer({self.scorer!r}, engine={getattr(self.engine, 'name', '?')})"


def on_engine(scorer: Scorer, engine: Any, **options: Any) -> Scorer:
    """``scorer`` with its expensive part on ``engine``: an unfitted fused score keeps
    being fitted in-process (per split) on base scores the engine computes -- on every
    signal's scores, for a fused score of several signals (each signal on the engine, with
    the ``runtime`` options of ``scorer_options`` it declares)."""
    base = scorer.base_scorer()
    if scorer.is_fitted or base is None:
        return EngineScorer(scorer, engine, **options)
    try:
        return scorer.with_base(EngineScorer(base, engine, **options))
    except TypeError:  # several signals: they cannot come from the base's scores alone
        return scorer.map_signals(  # type: ignore[attr-defined]
            lambda signal: EngineScorer(signal, engine, **_options_for(signal, options)))


def _options_for(signal: Scorer, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with only the ``scorer_options`` the signal declares as runtime ones."""
    from ..scoring import scorer_options

    runtime = {o.name for o in scorer_options(str(signal.spec()["scorer"])) if o.runtime}
    given = options.get("scorer_options") or {}
    return {**options, "scorer_options": {k: v for k, v in given.items() if k in runtime}}
