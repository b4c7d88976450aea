"""Matplotlib figures of an evaluation run (one PNG per run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._optional import require
from .sweep import EvaluationReport

__all__ = ["plot_report", "save_figure"]


def plot_report(report: EvaluationReport, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Plot coverage vs target (valid band shaded), removal vs target, and the trade-off.

    Parameters
    ----------
    report : EvaluationReport
        Output of :func:`ragsieve.evaluation.evaluate`.
    path : path-like
        PNG file to write.
    title : str, optional
        Figure title.

    Returns
    -------
    pathlib.Path
        The written file.
    """
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg", force=False)
    plt = require("matplotlib.pyplot", "plot")

    conf = sorted(report.rows("conformal"), key=lambda r: r["target"])
    if not conf:
        raise ValueError("the report has no conformal rows to plot.")
    target = [r["target"] for r in conf]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ax = axes[0]
    ax.fill_between(target, [r["band_low"] for r in conf], [r["band_high"] for r in conf],
                    color="tab:green", alpha=0.35, edgecolor="tab:green", linewidth=1.5, label="valid band [1-α, 1-α+1/(n+1)]")
    ax.plot(target, target, "k--", lw=1, label="target 1-α")
    ax.errorbar(target, [r["coverage_mean"] for r in conf], yerr=[r["coverage_std"] for r in conf],
                fmt="o-", color="tab:blue", capsize=3, label="conformal: coverage (±1 sd over splits)")
    ax.plot(target, [r["query_coverage_mean"] for r in conf], "s:", color="tab:purple",
            label="conformal: mean per-query coverage")
    ax.set_xlabel("target coverage 1-α")
    ax.set_ylabel("coverage of relevant test snippets")
    ax.set_title("coverage vs target")
    ax.legend(fontsize=7, loc="upper left")

    ax = axes[1]
    ax.plot(target, [r["removal_mean"] for r in conf], "o-", color="tab:orange", label="snippets removed")
    ax.plot(target, [r["removal_chars_mean"] for r in conf], "s--", color="tab:red", label="characters removed")
    ax.set_xlabel("target coverage 1-α")
    ax.set_ylabel("fraction of context removed")
    ax.set_ylim(0, 1)
    ax.set_title("removal vs target")
    ax.legend(fontsize=7)

    ax = axes[2]
    ax.plot([r["removal_mean"] for r in conf], [r["coverage_mean"] for r in conf], "o-",
            color="tab:blue", label="conformal (α sweep)")
    for method, key, marker, color in (("top-k", "k", "^", "tab:gray"), ("threshold", "theta", "v", "tab:brown")):
        rows = report.rows(method)
        if rows:
            ax.scatter([r["removal_mean"] for r in rows], [r["coverage_mean"] for r in rows],
                       marker=marker, color=color, label=method)
            for r in rows:
                ax.annotate(f"{key}={r[key]}", (r["removal_mean"], r["coverage_mean"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("fraction of snippets removed")
    ax.set_ylabel("coverage")
    ax.set_title("trade-off on the same test splits")
    ax.legend(fontsize=7)
    return save_figure(fig, path, title=title)


def save_figure(fig: Any, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Title, lay out, write as PNG (creating the directory) and close a figure."""
    plt = require("matplotlib.pyplot", "plot")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
