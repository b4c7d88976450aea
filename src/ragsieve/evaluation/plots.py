"""Matplotlib figures of evaluation runs (one PNG per figure)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._optional import require
from .answers import AnswerReport
from .sweep import EvaluationReport

__all__ = ["plot_answers", "plot_report", "save_figure"]

_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:cyan")


def _as_reports(
    reports: EvaluationReport | Mapping[str, EvaluationReport],
) -> dict[str, EvaluationReport]:
    if isinstance(reports, EvaluationReport):
        return {"conformal": reports}
    if isinstance(reports, Mapping) and reports:
        bad = [k for k, v in reports.items() if not isinstance(v, EvaluationReport)]
        if not bad:
            return {str(k): v for k, v in reports.items()}
        raise TypeError(f"reports[{bad[0]!r}] is {type(reports[bad[0]]).__name__}, "
                        "expected an EvaluationReport.")
    raise TypeError(f"reports is {type(reports).__name__}; expected an EvaluationReport or a "
                    "non-empty mapping label -> EvaluationReport.")


def _series(reports: dict[str, EvaluationReport]) -> list[tuple[str, list[dict[str, Any]]]]:
    """One (label, conformal rows sorted by target) series per report and guarantee mode."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for label, report in reports.items():
        by_mode: dict[str, list[dict[str, Any]]] = {}
        for row in report.rows("conformal"):
            by_mode.setdefault(row.get("mode", "marginal"), []).append(row)
        for mode, rows in by_mode.items():
            name = label if len(by_mode) == 1 and mode == "marginal" else f"{label}, {mode}"
            out.append((name, sorted(rows, key=lambda r: r["target"])))
    if not out:
        raise ValueError("the report has no conformal rows to plot.")
    return out


def plot_report(
    reports: EvaluationReport | Mapping[str, EvaluationReport],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Plot coverage vs target (valid band shaded), removal vs target, and the trade-off.

    With several reports (one per score, evaluated on the same splits) every panel shows
    one conformal curve per report; the top-k and fixed-threshold baselines of the
    trade-off panel come from the first report.

    Parameters
    ----------
    reports : EvaluationReport or Mapping[str, EvaluationReport]
        Output of :func:`ragsieve.evaluation.evaluate`, or several keyed by the label
        to show in the legend (e.g. ``{"1 - cos": r1, "fused": r2}``).
    path : path-like
        PNG file to write.
    title : str, optional
        Figure title.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    TypeError
        ``reports`` is neither a report nor a non-empty mapping of reports.
    ValueError
        No report has conformal rows.
    ImportError
        matplotlib is missing (``pip install 'ragsieve[plot]'``).
    """
    named = _as_reports(reports)
    series = _series(named)
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg", force=False)
    plt = require("matplotlib.pyplot", "plot")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    cov_ax, rm_ax, trade_ax = axes
    _plot_conformal(cov_ax, rm_ax, trade_ax, series)
    _plot_baselines(trade_ax, named)
    return save_figure(fig, path, title=title)


def _plot_conformal(cov_ax: Any, rm_ax: Any, trade_ax: Any,
                    series: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Each conformal curve on the three panels; the coverage and removal panels' axes."""
    banded = False
    for j, (name, rows) in enumerate(series):
        colour = _COLOURS[j % len(_COLOURS)]
        target = [r["target"] for r in rows]
        if not banded and all(r.get("mode", "marginal") == "marginal" for r in rows):
            cov_ax.fill_between(target, [r["band_low"] for r in rows],
                                [r["band_high"] for r in rows], color="tab:green", alpha=0.3,
                                edgecolor="tab:green", linewidth=1.5,
                                label="valid band [1-α, 1-α+1/(n+1)]")
            banded = True
        cov_ax.errorbar(target, [r["coverage_mean"] for r in rows],
                        yerr=[r["coverage_std"] for r in rows], fmt="o-", color=colour,
                        capsize=3, label=f"{name}: coverage (±1 sd over splits)")
        cov_ax.plot(target, [r["query_coverage_mean"] for r in rows], "s:", color=colour,
                    alpha=0.7, label=f"{name}: mean per-query coverage")
        rm_ax.plot(target, [r["removal_mean"] for r in rows], "o-", color=colour,
                   label=f"{name}: snippets removed")
        rm_ax.plot(target, [r["removal_chars_mean"] for r in rows], "s--", color=colour,
                   alpha=0.7, label=f"{name}: characters removed")
        trade_ax.plot([r["removal_mean"] for r in rows], [r["coverage_mean"] for r in rows],
                      "o-", color=colour, label=f"conformal, {name} (α sweep)")
    lo = min(r["target"] for _, rows in series for r in rows)
    hi = max(r["target"] for _, rows in series for r in rows)
    cov_ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="target 1-α")
    cov_ax.set_xlabel("target coverage 1-α")
    cov_ax.set_ylabel("coverage of relevant test snippets")
    cov_ax.set_title("coverage vs target")
    cov_ax.legend(fontsize=7, loc="upper left")
    rm_ax.set_xlabel("target coverage 1-α")
    rm_ax.set_ylabel("fraction of context removed")
    rm_ax.set_ylim(0, 1)
    rm_ax.set_title("removal vs target")
    rm_ax.legend(fontsize=7)


def _plot_baselines(trade_ax: Any, named: Mapping[str, EvaluationReport]) -> None:
    """The first report's top-k and fixed-threshold baselines on the trade-off panel, and
    its axes."""
    first_label, first = next(iter(named.items()))
    suffix = f" ({first_label})" if len(named) > 1 else ""
    for method, marker, colour in (("top-k", "^", "tab:gray"), ("threshold", "v", "tab:brown")):
        rows = first.rows(method)
        if not rows:
            continue
        trade_ax.scatter([r["removal_mean"] for r in rows], [r["coverage_mean"] for r in rows],
                         marker=marker, color=colour, label=method + suffix)
        for r in rows:
            trade_ax.annotate(_baseline_label(r), (r["removal_mean"], r["coverage_mean"]),
                              fontsize=6, xytext=(3, 3), textcoords="offset points")
    trade_ax.set_xlabel("fraction of snippets removed")
    trade_ax.set_ylabel("coverage")
    trade_ax.set_title("trade-off on the same test splits")
    trade_ax.legend(fontsize=7)


def _baseline_label(row: dict[str, Any]) -> str:
    """``k=2``; a fixed cut-off by its quantile of the score, or its value in the score's units."""
    if "k" in row:
        return f"k={row['k']}"
    if row.get("quantile") is not None:
        return f"q={row['quantile']:g}"
    return f"{row.get('keep_rule', {}).get('keep_if', '<=')} {row.get('theta'):g}"


def plot_answers(report: AnswerReport, path: str | os.PathLike[str], *,
                 title: str | None = None) -> Path:
    """Answer quality against context size across alpha, one line per method.

    Left: share of queries whose kept context holds a gold answer; right (when answers
    were generated): token F1 of the generated answers, and nugget F1 when judged. The
    x axis is the mean number of context characters per query; ``all`` is a star.

    Returns
    -------
    pathlib.Path
        The written PNG.
    """
    plt = require("matplotlib.pyplot", "plot")
    panels = [("answer_in_context_mean", "gold answer in kept context")]
    if report.info.get("generated"):
        panels.append(("f1_mean", "answer token F1"))
    if report.info.get("judged"):
        panels.append(("nugget_f1_mean", "nugget F1 (LLM judge)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    methods: dict[str, list[dict[str, Any]]] = {}
    for row in report.results:
        label = row["method"] if row.get("mode") in (None, "marginal") else f"{row['method']} [{row['mode']}]"
        methods.setdefault(label, []).append(row)
    for ax, (key, name) in zip(axes[0], panels):
        for label, rows in methods.items():
            rows = sorted((r for r in rows if r.get(key) is not None), key=lambda r: r["context_chars_mean"])
            xs = [r["context_chars_mean"] for r in rows]
            ys = [r[key] for r in rows]
            if label == "all":
                ax.plot(xs, ys, "*", markersize=12, color="black", label="all snippets")
                continue
            (line,) = ax.plot(xs, ys, "o-", label=label)
            if label == "conformal":
                for r in rows:
                    ax.annotate(f"α={r['alpha']:g}", (r["context_chars_mean"], r[key]),
                                textcoords="offset points", xytext=(4, -10), fontsize=7,
                                color=line.get_color())
        ax.set_xlabel("context characters per query (mean)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path, title=title)


def save_figure(fig: Any, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Title, lay out, write (creating the directory) and close a figure.

    Returns the file written, :func:`ragsieve._paths.figure_path` of ``path``: a path
    without a suffix gets ``.png``; a character device or a FIFO is written in place as
    PNG; otherwise the suffix names the format. The figure is rendered in memory and
    written by the one writer of finished files (:func:`ragsieve._io.atomic_write_bytes`):
    a regular file is replaced whole or not at all, a special file is never replaced, a
    block device or a socket is refused.
    """
    import io

    from .._io import atomic_write_bytes
    from .._paths import figure_path

    plt = require("matplotlib.pyplot", "plot")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    target = figure_path(path)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=110, format=target.suffix[1:].lower() or "png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(target, buffer.getvalue())
