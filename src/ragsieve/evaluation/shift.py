"""Distribution-shift demonstration: a static threshold vs adaptive recalibration.

A labelled stream of query batches switches source midway (e.g. English XQuAD, then
German XQuAD scored by the same English model). A static split-conformal threshold
calibrated on held-out topics of the first source keeps its coverage in phase 1 and
loses it after the switch; :class:`~ragsieve.calibration.AdaptiveCalibrator`, fed the
same labelled feedback, recovers the target. :func:`~ragsieve.monitoring.drift_check`
flags the switch. :func:`run_shift_demo` writes ``shift.png`` and ``shift.json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._io import atomic_write_text
from .._optional import require
from .._validation import check_alpha, check_int, check_scores
from ..calibration import AdaptiveCalibrator, SplitConformalCalibrator
from ..errors import DataError
from ..monitoring import drift_check
from ..types import DEFAULT_ALPHA, Pair
from .plots import save_figure

__all__ = ["ShiftDemoConfig", "StreamSettings", "plot_shift", "rolling_coverage", "run_shift_demo",
           "run_stream"]

logger = logging.getLogger(__name__)


def rolling_coverage(kept_relevant: Any, window: int) -> np.ndarray:
    """Trailing mean of kept flags of relevant snippets (NaN until ``window`` are seen)."""
    k = np.asarray(kept_relevant, dtype=np.float64)
    window = check_int(window, "window", min_value=1)
    out = np.full(k.size, np.nan)
    if k.size >= window:
        c = np.concatenate([[0.0], np.cumsum(k)])
        out[window - 1:] = (c[window:] - c[:-window]) / window
    return out


def _phase_metrics(kept: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    n_rel = int(relevant.sum())
    return {
        "coverage": float(kept[relevant].mean()) if n_rel else math.nan,
        "removal": float(1.0 - kept.mean()) if kept.size else math.nan,
        "n_snippets": int(kept.size),
        "n_relevant": n_rel,
    }


@dataclass(frozen=True)
class StreamSettings:
    """How :func:`run_stream` filters and measures a stream.

    Attributes
    ----------
    alpha, gamma, window
        Target miscoverage and the :class:`AdaptiveConformalFilter` parameters.
    rolling : int
        Window (in relevant snippets) of the rolling coverage.
    drift_alpha : float
        Level of the drift check.
    """

    alpha: float = DEFAULT_ALPHA
    gamma: float = 0.005
    window: int | None = 500
    rolling: int = 200
    drift_alpha: float = 0.01


def run_stream(
    calibration_scores: Any,
    scores: Any,
    relevant: Any,
    phase: Any,
    settings: StreamSettings = StreamSettings(),
) -> dict[str, Any]:
    """Feed a labelled two-phase stream to a static and an adaptive filter.

    Parameters
    ----------
    calibration_scores : array-like of float
        Scores of relevant calibration snippets (both filters start from them).
    scores, relevant, phase : array-like
        The stream in order: score, relevance label and phase (1 or 2) of each snippet.
    settings : StreamSettings
        Target miscoverage, the adaptive filter's parameters, the rolling window and the
        drift check's level.

    Returns
    -------
    dict
        ``summary`` (per-phase coverage/removal for ``static`` and ``adaptive``, drift
        checks, ACI error bound) and ``series`` (rolling coverages and thresholds, for
        plotting).
    """
    gamma, window, rolling, drift_alpha = (settings.gamma, settings.window, settings.rolling,
                                           settings.drift_alpha)
    alpha = check_alpha(settings.alpha)
    cal, s, rel, ph = _checked_stream(calibration_scores, scores, relevant, phase)
    static = SplitConformalCalibrator(alpha=alpha).fit(cal)
    kept_static = s <= static.threshold_
    aci = AdaptiveCalibrator(alpha=alpha, gamma=gamma, window=window).fit(cal)
    kept_aci = aci.update_batch(s, rel)

    summary: dict[str, Any] = {
        "alpha": alpha, "target_coverage": 1.0 - alpha, "gamma": gamma, "window": window,
        "rolling": rolling, "n_calibration": int(cal.size),
        "static_threshold": static.threshold_,
    }
    for p in (1, 2):
        summary[f"phase{p}"] = _phase_summary(ph == p, cal, s, rel, kept_static, kept_aci,
                                              drift_alpha)
    err = np.asarray(aci.history_["err"])
    err = err[~np.isnan(err)]
    summary["adaptive_overall_miss_rate"] = float(err.mean()) if err.size else math.nan
    summary["adaptive_error_bound"] = aci.error_bound()
    summary["drift_alpha"] = drift_alpha

    thr = np.asarray(aci.history_["threshold"])
    series = {
        "phase_relevant": ph[rel].tolist(),
        "rolling_static": rolling_coverage(kept_static[rel], rolling).tolist(),
        "rolling_adaptive": rolling_coverage(kept_aci[rel], rolling).tolist(),
        "threshold_adaptive": thr[rel].tolist(),  # tau_t in force at each relevant snippet
        "alpha_t": np.asarray(aci.history_["alpha_t"])[rel].tolist(),
    }
    return {"summary": summary, "series": series}


def _checked_stream(calibration_scores: Any, scores: Any, relevant: Any,
                    phase: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The calibration scores and the stream's scores, relevance and phases, checked.

    Raises
    ------
    ValueError
        The stream's arrays do not align, or a phase is neither 1 nor 2.
    """
    cal = check_scores(calibration_scores, name="calibration_scores")
    s = check_scores(scores)
    rel = np.asarray(relevant).astype(bool)
    ph = np.asarray(phase).astype(int)
    if rel.shape != s.shape or ph.shape != s.shape:
        raise ValueError(f"scores {s.shape}, relevant {rel.shape} and phase {ph.shape} must align.")
    if not set(np.unique(ph).tolist()) <= {1, 2}:
        raise ValueError(f"phase must hold only 1 and 2, got {sorted(set(ph.tolist()))}.")
    return cal, s, rel, ph


def _phase_summary(m: np.ndarray, cal: np.ndarray, s: np.ndarray, rel: np.ndarray,
                   kept_static: np.ndarray, kept_aci: np.ndarray,
                   drift_alpha: float) -> dict[str, Any]:
    """Both filters' metrics over the phase ``m`` and over its second half, and the drift
    check of its relevant scores against the calibration scores."""
    out: dict[str, Any] = {
        "static": _phase_metrics(kept_static[m], rel[m]),
        "adaptive": _phase_metrics(kept_aci[m], rel[m]),
    }
    live = s[m & rel]
    if live.size:
        d = drift_check(cal, live, alpha=drift_alpha)
        out["drift"] = d._asdict()
    # second half of the phase (after the adaptive filter had time to react)
    idx = np.flatnonzero(m)
    late = np.zeros_like(m)
    late[idx[idx.size // 2:]] = True
    out["late_half"] = {
        "static": _phase_metrics(kept_static[late], rel[late]),
        "adaptive": _phase_metrics(kept_aci[late], rel[late]),
    }
    return out


def plot_shift(result: dict[str, Any], path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Two panels: rolling coverage (static, adaptive, target) and thresholds over time."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg", force=False)
    plt = require("matplotlib.pyplot", "plot")
    summ, ser = result["summary"], result["series"]
    phase = np.asarray(ser["phase_relevant"])
    t = np.arange(1, phase.size + 1)
    switch = int(np.argmax(phase == 2)) + 0.5 if (phase == 2).any() else None
    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    ax = axes[0]
    ax.plot(t, ser["rolling_static"], color="tab:red", label="static split-conformal τ")
    ax.plot(t, ser["rolling_adaptive"], color="tab:blue", label=f"adaptive (ACI, γ={summ['gamma']})")
    ax.axhline(summ["target_coverage"], color="k", ls="--", lw=1,
               label=f"target 1-α = {summ['target_coverage']:.2f}")
    ax.set_ylabel(f"rolling coverage\n(last {summ['rolling']} relevant snippets)")
    ax.set_ylim(max(0.0, min(0.5, np.nanmin(np.r_[ser["rolling_static"], ser["rolling_adaptive"], 1.0]) - 0.05)), 1.01)
    ax.legend(fontsize=8, loc="lower left")
    ax = axes[1]
    ax.plot(t, ser["threshold_adaptive"], color="tab:blue", label="adaptive τ_t")
    ax.axhline(summ["static_threshold"], color="tab:red", label="static τ")
    ax.set_ylabel("threshold τ (keep score ≤ τ)")
    ax.set_xlabel("relevant snippets in the stream (time →)")
    ax.legend(fontsize=8, loc="upper left")
    for ax in axes:
        if switch is not None:
            ax.axvline(switch, color="gray", ls=":", lw=1.5)
    if switch is not None:
        axes[0].annotate("source switch", (switch, 1.0), xytext=(4, -12), textcoords="offset points",
                         fontsize=8, color="gray")
    return save_figure(fig, path, title=title)


def _query_batches(pairs: Sequence[Pair], rng: np.random.Generator) -> list[list[int]]:
    """Indices of pairs grouped by query, queries in random order."""
    by_q: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_q.setdefault(p.query_id, []).append(i)
    batches = list(by_q.values())
    order = rng.permutation(len(batches))
    return [batches[j] for j in order]


@dataclass(frozen=True)
class ShiftDemoConfig:
    """What :func:`run_shift_demo` streams.

    Attributes
    ----------
    seed : int
        Seed of the topic split and the query order.
    phase1, phase2 : str
        Dataset names before and after the switch (see ``ragsieve.data.load_dataset``).
    model : str
        Embedding model of the scorer used for every phase.
    alpha, gamma, window, rolling, drift_alpha
        See :class:`StreamSettings` (:attr:`stream`).
    calibration_fraction : float
        Share of ``phase1``'s topics used for calibration, in (0, 1).
    cache_dir : path-like, optional
        Embedding cache; default ``ragsieve.data.paths.cache_dir() / "embeddings"``.
    data_dir : path-like, optional
        Dataset directory (``RAGSIEVE_DATA`` by default).
    """

    seed: int = 0
    phase1: str = "xquad-en"
    phase2: str = "xquad-de"
    model: str = "minilm"
    alpha: float = DEFAULT_ALPHA
    gamma: float = 0.005
    window: int | None = 500
    rolling: int = 200
    calibration_fraction: float = 0.5
    drift_alpha: float = 0.01
    cache_dir: str | os.PathLike[str] | None = None
    data_dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        check_alpha(self.drift_alpha, name="drift_alpha")
        check_alpha(self.calibration_fraction, name="calibration_fraction")

    @property
    def stream(self) -> StreamSettings:
        """The settings :func:`run_stream` reads."""
        return StreamSettings(alpha=self.alpha, gamma=self.gamma, window=self.window,
                              rolling=self.rolling, drift_alpha=self.drift_alpha)


def run_shift_demo(
    out_dir: str | os.PathLike[str], config: ShiftDemoConfig | None = None, **config_kwargs: Any
) -> dict[str, Any]:
    """Run the shift stream on real data; write ``shift.png`` and ``shift.json``.

    The topics (groups) of ``phase1`` are split at random: ``calibration_fraction`` of
    them calibrate both filters, the rest form phase 1 of the stream (query batches in
    random order); every query of ``phase2`` follows, in random order. All pairs are scored by
    one ``EmbeddingScorer(model)``, as a deployed filter would be.

    Parameters
    ----------
    out_dir : path-like
        Directory for ``shift.png`` and ``shift.json`` (created).
    config : ShiftDemoConfig, optional
        The stream's settings; or pass its fields as keyword arguments.

    Returns
    -------
    dict
        The summary written to ``shift.json`` (without the plotted series), plus
        ``runtime_s``, ``png`` and ``json`` paths.
    """
    from ..data import load_dataset
    from ..data.paths import cache_dir as default_cache_dir
    from ..scoring import EmbeddingScorer

    if config is None:
        config = ShiftDemoConfig(**config_kwargs)
    elif config_kwargs:
        raise TypeError(f"pass either config or its fields, not both (got {sorted(config_kwargs)}).")
    c = config
    seed, phase1, phase2, model, alpha = c.seed, c.phase1, c.phase2, c.model, c.alpha
    calibration_fraction, cache_dir, data_dir = c.calibration_fraction, c.cache_dir, c.data_dir
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = {} if data_dir is None else {"data_dir": data_dir}
    src_pairs = load_dataset(phase1, **kw)
    tgt_pairs = load_dataset(phase2, **kw)
    if not src_pairs or not tgt_pairs:
        raise DataError(f"empty dataset: {phase1} has {len(src_pairs)} pairs, {phase2} {len(tgt_pairs)}.")
    scorer = EmbeddingScorer(model=model, cache_dir=cache_dir if cache_dir is not None
                             else default_cache_dir() / "embeddings")
    src_scores = scorer.score_pairs(src_pairs)
    tgt_scores = scorer.score_pairs(tgt_pairs)
    t_scored = time.perf_counter()

    stream = _build_stream(src_pairs, src_scores, tgt_pairs, tgt_scores, calibration_fraction,
                           np.random.default_rng(seed))
    result = run_stream(stream.calibration_scores, stream.scores, stream.relevant, stream.phase,
                        c.stream)
    summary = result["summary"]
    summary.update({
        "phase1_dataset": phase1, "phase2_dataset": phase2, "scorer": scorer.spec(), "seed": seed,
        "calibration_fraction": calibration_fraction,
        "n_calibration_groups": stream.n_calibration_groups,
        "n_stream_groups_phase1": stream.n_groups - stream.n_calibration_groups,
        "scoring_s": round(t_scored - t0, 2),
    })
    png = plot_shift(result, out / "shift.png",
                     title=f"{phase1} → {phase2} (stream scored by {model}), α = {alpha}")
    summary["runtime_s"] = round(time.perf_counter() - t0, 2)
    summary["png"] = str(png)
    summary["json"] = str(out / "shift.json")
    atomic_write_text(out / "shift.json", json.dumps({**summary, "series": result["series"]},
                                                     indent=1, default=_json_default) + "\n")
    return summary


class _Stream(NamedTuple):
    """The demo's stream and how its source topics were divided."""

    calibration_scores: np.ndarray
    scores: np.ndarray
    relevant: np.ndarray
    phase: np.ndarray
    n_groups: int  # source topics
    n_calibration_groups: int


def _build_stream(src_pairs: list[Pair], src_scores: np.ndarray, tgt_pairs: list[Pair],
                  tgt_scores: np.ndarray, calibration_fraction: float,
                  rng: np.random.Generator) -> _Stream:
    """The relevant calibration scores (a random ``calibration_fraction`` of the source
    topics) and the stream: the other source topics' queries (phase 1), then every target
    query (phase 2), each phase in random query order."""
    groups = sorted({p.group for p in src_pairs})
    perm = rng.permutation(len(groups))
    n_cal = max(1, min(len(groups) - 1, round(calibration_fraction * len(groups))))
    cal_groups = {groups[i] for i in perm[:n_cal]}
    src_rel = np.array([p.relevant == 1 for p in src_pairs])
    in_cal = np.array([p.group in cal_groups for p in src_pairs])
    cal_scores = src_scores[in_cal & src_rel]
    stream_src = [i for i, p in enumerate(src_pairs) if p.group not in cal_groups]
    sub = [src_pairs[i] for i in stream_src]
    idx1 = [stream_src[i] for b in _query_batches(sub, rng) for i in b]
    idx2 = [i for b in _query_batches(tgt_pairs, rng) for i in b]
    scores = np.concatenate([src_scores[idx1], tgt_scores[idx2]])
    relevant = np.concatenate([src_rel[idx1], np.array([tgt_pairs[i].relevant == 1 for i in idx2])])
    phase = np.r_[np.ones(len(idx1), dtype=int), np.full(len(idx2), 2)]
    return _Stream(cal_scores, scores, relevant, phase, len(groups), len(cal_groups))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
