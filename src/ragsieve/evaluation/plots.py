"""Matplotlib figures of evaluation runs.

:func:`plot_report` and :func:`plot_answers` write one PNG holding all their panels side by
side (``evaluate --plot``, ``answers --plot``). :func:`report_panels` and
:func:`answers_panels` draw the same panels one figure each, at the size a page shows them
(:data:`PANEL_SIZE`, 96 CSS px an inch), for the HTML pages.

Point labels (the top-k and cut-off baselines, the alphas of the answers figure) are placed
where they touch no other label, no marker, no legend and stay inside their axes; points at
the same place share one label, and a label that finds no free place is left out. Every PNG
written here says in its text chunks what it holds: :data:`MIN_FONT_KEY` the size of its
smallest text and :data:`LAYOUT_KEY` the boxes of its labels and legends, in the image's
pixels (origin top left).
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._optional import require
from .answers import AnswerReport
from .sweep import EvaluationReport

__all__ = ["FILE_DPI", "LAYOUT_KEY", "MIN_FONT_KEY", "PANEL_DPI", "PANEL_SIZE", "Panel",
           "answers_panels", "plot_answers", "plot_report", "report_panels", "save_figure"]

logger = logging.getLogger(__name__)

_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:cyan")

PANEL_SIZE = (5.2, 3.9)
"""Width and height, in inches, of one panel of a page (shown at 96 CSS px an inch: 499 x
374 CSS px, two side by side on a report page)."""

PANEL_DPI = 144
"""Pixels an inch of a panel's PNG: 1.5 image pixels per CSS pixel, sharp on dense screens."""

FILE_DPI = 110
"""Pixels an inch of the PNG files of :func:`plot_report`, :func:`plot_answers` and
:func:`save_figure`."""

MIN_FONT_KEY = "ragsieve:min-font-px"
"""PNG text chunk: the size of the figure's smallest text, in the image's pixels."""

LAYOUT_KEY = "ragsieve:layout"
"""PNG text chunk: JSON ``{"labels": [[text, [x0, y0, x1, y1]], ...], "legends": [[x0, y0,
x1, y1], ...]}``, boxes in the image's pixels, origin top left."""

_PANEL_STYLE = {"font.size": 10.0, "axes.titlesize": 10.5, "axes.labelsize": 9.5,
                "xtick.labelsize": 9.0, "ytick.labelsize": 9.0, "legend.fontsize": 8.0}
"""The fonts of a page's panels, in points (8 pt is 10.7 CSS px at 96 CSS px an inch)."""

_LABEL_PT = {"panel": 8.0, "file": 7.0}
"""Point labels' size: on a page's panel, in a file of all panels."""

_LEGEND_PT = {"panel": 8.0, "file": 7.0}

_RADII = (6.0, 10.0, 15.0, 22.0, 30.0, 40.0)
"""Distances, in points, tried between a point and its label (a leader line from 10 on)."""

_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (0, 1), (-1, 0), (0, -1))


@dataclass(frozen=True)
class Panel:
    """One panel drawn alone, as a PNG for a page.

    Attributes
    ----------
    name : str
        What it plots: ``"coverage"``, ``"removal"``, ``"trade-off"``, or the metric of an
        answers panel.
    alt : str
        The panel in words (the image's ``alt`` text).
    png : bytes
        The image.
    size : tuple of float
        Width and height in inches (:data:`PANEL_SIZE`): a page shows it at 96 CSS px an inch.
    dpi : int
        Pixels an inch of ``png``.
    """

    name: str
    alt: str
    png: bytes
    size: tuple[float, float]
    dpi: int

    @property
    def css_size(self) -> tuple[int, int]:
        """Width and height in CSS pixels (96 an inch), the size a page shows it at."""
        return round(self.size[0] * 96), round(self.size[1] * 96)


@dataclass(frozen=True)
class _Label:
    """A label to place next to a data point."""

    x: float
    y: float
    text: str
    colour: str = "black"


_Draw = Callable[[Any, str], list[_Label]]
"""Draws one panel on an axes in a style (``"panel"`` or ``"file"``); returns its labels."""


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


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (``ImportError`` naming the extra)."""
    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg", force=False)
    return require("matplotlib.pyplot", "plot")


def _report_draws(reports: EvaluationReport | Mapping[str, EvaluationReport]
                  ) -> list[tuple[str, str, _Draw]]:
    """The three panels of an evaluation: (name, alt text, drawer)."""
    named = _as_reports(reports)
    series = _series(named)
    return [
        ("coverage", "coverage of relevant test snippets against the target 1 - alpha",
         lambda ax, style: _draw_coverage(ax, series, style)),
        ("removal", "fraction of context removed against the target 1 - alpha",
         lambda ax, style: _draw_removal(ax, series, style)),
        ("trade-off", "coverage against removal, conformal and the baselines",
         lambda ax, style: _draw_tradeoff(ax, series, named, style)),
    ]


def plot_report(
    reports: EvaluationReport | Mapping[str, EvaluationReport],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Plot coverage vs target (valid band shaded), removal vs target, and the trade-off.

    With several reports (one per score, evaluated on the same splits) every panel shows
    one conformal curve per report; the top-k and fixed-threshold baselines of the
    trade-off panel come from the first report. The three panels are side by side in one
    file; :func:`report_panels` draws them one figure each.

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
    draws = _report_draws(reports)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    labels = [(ax, draw(ax, "file")) for ax, (_, _, draw) in zip(axes, draws, strict=True)]
    return _write(fig, path, title=title, labels=labels, label_pt=_LABEL_PT["file"])


def report_panels(reports: EvaluationReport | Mapping[str, EvaluationReport]) -> list[Panel]:
    """The panels of :func:`plot_report` (coverage, removal, trade-off), one figure each.

    Each is :data:`PANEL_SIZE` inches with fonts of at least 8 pt, rendered at
    :data:`PANEL_DPI`, so that a page showing it at 96 CSS px an inch shows no text
    smaller than 10.7 CSS px.

    Parameters
    ----------
    reports : EvaluationReport or Mapping[str, EvaluationReport]
        As for :func:`plot_report`.

    Returns
    -------
    list of Panel

    Raises
    ------
    TypeError, ValueError, ImportError
        As :func:`plot_report`.
    """
    return _panels(_report_draws(reports))


def _panels(draws: Sequence[tuple[str, str, _Draw]]) -> list[Panel]:
    """Each drawer on its own figure of a page's size and fonts, rendered to PNG."""
    plt = _pyplot()
    matplotlib = require("matplotlib", "plot")
    out = []
    with matplotlib.rc_context(_PANEL_STYLE):  # ticks are made at draw time: render inside
        for name, alt, draw in draws:
            fig, ax = plt.subplots(figsize=PANEL_SIZE, dpi=PANEL_DPI)
            try:
                labels = draw(ax, "panel")
                png = _render(fig, "png", labels=[(ax, labels)], label_pt=_LABEL_PT["panel"])
            finally:
                plt.close(fig)
            out.append(Panel(name, alt, png, PANEL_SIZE, PANEL_DPI))
    return out


def _draw_coverage(ax: Any, series: list[tuple[str, list[dict[str, Any]]]],
                   style: str) -> list[_Label]:
    """Coverage against the target, each curve with its per-query coverage; the valid band
    of the first marginal curve; the diagonal."""
    banded = False
    for j, (name, rows) in enumerate(series):
        colour = _COLOURS[j % len(_COLOURS)]
        target = [r["target"] for r in rows]
        if not banded and all(r.get("mode", "marginal") == "marginal" for r in rows):
            ax.fill_between(target, [r["band_low"] for r in rows],
                            [r["band_high"] for r in rows], color="tab:green", alpha=0.3,
                            edgecolor="tab:green", linewidth=1.5,
                            label="valid band [1-α, 1-α+1/(n+1)]")
            banded = True
        ax.errorbar(target, [r["coverage_mean"] for r in rows],
                    yerr=[r["coverage_std"] for r in rows], fmt="o-", color=colour,
                    capsize=3, label=f"{name}: coverage (±1 sd over splits)")
        ax.plot(target, [r["query_coverage_mean"] for r in rows], "s:", color=colour,
                alpha=0.7, label=f"{name}: mean per-query coverage")
    lo = min(r["target"] for _, rows in series for r in rows)
    hi = max(r["target"] for _, rows in series for r in rows)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="target 1-α")
    ax.set_xlabel("target coverage 1-α")
    ax.set_ylabel("coverage of relevant test snippets")
    ax.set_title("coverage vs target")
    ax.legend(fontsize=_LEGEND_PT[style])
    return []


def _draw_removal(ax: Any, series: list[tuple[str, list[dict[str, Any]]]],
                  style: str) -> list[_Label]:
    """Snippets and characters removed against the target, per curve."""
    for j, (name, rows) in enumerate(series):
        colour = _COLOURS[j % len(_COLOURS)]
        target = [r["target"] for r in rows]
        ax.plot(target, [r["removal_mean"] for r in rows], "o-", color=colour,
                label=f"{name}: snippets removed")
        ax.plot(target, [r["removal_chars_mean"] for r in rows], "s--", color=colour,
                alpha=0.7, label=f"{name}: characters removed")
    ax.set_xlabel("target coverage 1-α")
    ax.set_ylabel("fraction of context removed")
    ax.set_ylim(0, 1)
    ax.set_title("removal vs target")
    ax.legend(fontsize=_LEGEND_PT[style])
    return []


def _draw_tradeoff(ax: Any, series: list[tuple[str, list[dict[str, Any]]]],
                   named: Mapping[str, EvaluationReport], style: str) -> list[_Label]:
    """Coverage against removal: each conformal curve, and the first report's top-k and
    fixed-threshold baselines (returned as labels to place)."""
    for j, (name, rows) in enumerate(series):
        ax.plot([r["removal_mean"] for r in rows], [r["coverage_mean"] for r in rows],
                "o-", color=_COLOURS[j % len(_COLOURS)], label=f"conformal, {name} (α sweep)")
    first_label, first = next(iter(named.items()))
    suffix = f" ({first_label})" if len(named) > 1 else ""
    labels = []
    for method, marker, colour in (("top-k", "^", "tab:gray"), ("threshold", "v", "tab:brown")):
        rows = first.rows(method)
        if not rows:
            continue
        ax.scatter([r["removal_mean"] for r in rows], [r["coverage_mean"] for r in rows],
                   marker=marker, color=colour, label=method + suffix)
        labels += [_Label(r["removal_mean"], r["coverage_mean"], _baseline_label(r))
                   for r in rows]
    ax.set_xlabel("fraction of snippets removed")
    ax.set_ylabel("coverage")
    ax.set_title("trade-off on the same test splits")
    ax.legend(fontsize=_LEGEND_PT[style])
    return labels


def _baseline_label(row: dict[str, Any]) -> str:
    """``k=2``; a fixed cut-off by its quantile of the score, or its value in the score's units."""
    if "k" in row:
        return f"k={row['k']}"
    if row.get("quantile") is not None:
        return f"q={row['quantile']:g}"
    return f"{row.get('keep_rule', {}).get('keep_if', '<=')} {row.get('theta'):g}"


def _answers_draws(report: AnswerReport) -> list[tuple[str, str, _Draw]]:
    """The panels of an answers run: (metric, alt text, drawer)."""
    panels = [("answer_in_context_mean", "gold answer in kept context")]
    if report.info.get("generated"):
        panels.append(("f1_mean", "answer token F1"))
    if report.info.get("judged"):
        panels.append(("nugget_f1_mean", "nugget F1 (LLM judge)"))
    methods: dict[str, list[dict[str, Any]]] = {}
    for row in report.results:
        label = (row["method"] if row.get("mode") in (None, "marginal")
                 else f"{row['method']} [{row['mode']}]")
        methods.setdefault(label, []).append(row)

    def drawer(key: str, name: str) -> _Draw:
        return lambda ax, style: _draw_answers(ax, key, name, methods, style)

    return [(key, f"{name} against the context characters per query", drawer(key, name))
            for key, name in panels]


def _draw_answers(ax: Any, key: str, name: str, methods: Mapping[str, list[dict[str, Any]]],
                  style: str) -> list[_Label]:
    """One answer metric against the context size, a line per method (``all`` a star); the
    conformal line's alphas as labels to place."""
    labels = []
    for label, rows in methods.items():
        rows = sorted((r for r in rows if r.get(key) is not None),
                      key=lambda r: r["context_chars_mean"])
        xs = [r["context_chars_mean"] for r in rows]
        ys = [r[key] for r in rows]
        if label == "all":
            ax.plot(xs, ys, "*", markersize=12, color="black", label="all snippets")
            continue
        (line,) = ax.plot(xs, ys, "o-", label=label)
        if label == "conformal":
            labels += [_Label(r["context_chars_mean"], r[key], f"α={r['alpha']:g}",
                              line.get_color()) for r in rows]
    ax.set_xlabel("context characters per query (mean)")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=_LEGEND_PT[style])
    return labels


def plot_answers(report: AnswerReport, path: str | os.PathLike[str], *,
                 title: str | None = None) -> Path:
    """Answer quality against context size across alpha, one line per method.

    Left: share of queries whose kept context holds a gold answer; right (when answers
    were generated): token F1 of the generated answers, and nugget F1 when judged. The
    x axis is the mean number of context characters per query; ``all`` is a star.
    :func:`answers_panels` draws the panels one figure each.

    Returns
    -------
    pathlib.Path
        The written PNG.
    """
    draws = _answers_draws(report)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(draws), figsize=(5.2 * len(draws), 4.2), squeeze=False)
    labels = [(ax, draw(ax, "file")) for ax, (_, _, draw) in zip(axes[0], draws, strict=True)]
    return _write(fig, path, title=title, labels=labels, label_pt=_LABEL_PT["file"])


def answers_panels(report: AnswerReport) -> list[Panel]:
    """The panels of :func:`plot_answers`, one figure each (see :func:`report_panels`).

    Returns
    -------
    list of Panel
    """
    return _panels(_answers_draws(report))


def save_figure(fig: Any, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Title, lay out, write (creating the directory) and close a figure.

    Returns the file written, :func:`ragsieve._paths.figure_path` of ``path``: a path
    without a suffix gets ``.png``; a character device or a FIFO is written in place as
    PNG; otherwise the suffix names the format. The figure is rendered in memory and
    written by the one writer of finished files (:func:`ragsieve._io.atomic_write_bytes`):
    a regular file is replaced whole or not at all, a special file is never replaced, a
    block device or a socket is refused.
    """
    return _write(fig, path, title=title)


def _write(fig: Any, path: str | os.PathLike[str], *, title: str | None = None,
           labels: Sequence[tuple[Any, list[_Label]]] = (), label_pt: float = 7.0) -> Path:
    """:func:`save_figure` with labels placed on their axes once the figure is laid out."""
    from .._io import atomic_write_bytes
    from .._paths import figure_path

    plt = _pyplot()
    target = figure_path(path)
    try:
        fig.set_dpi(FILE_DPI)
        if title:
            fig.suptitle(title)
        data = _render(fig, target.suffix[1:].lower() or "png", labels=labels,
                       label_pt=label_pt)
    finally:
        plt.close(fig)
    return atomic_write_bytes(target, data)


def _render(fig: Any, fmt: str, *, labels: Sequence[tuple[Any, list[_Label]]] = (),
            label_pt: float) -> bytes:
    """Lay the figure out, place the labels (the layout stays as it is after that) and
    render it at its own dpi; a PNG carries its smallest font and its labels' boxes."""
    fig.tight_layout()
    placed = [box for ax, todo in labels for box in _place_labels(ax, todo, fontsize=label_pt)]
    metadata = None
    if fmt == "png":
        metadata = {MIN_FONT_KEY: f"{_min_font_px(fig):.2f}",
                    LAYOUT_KEY: json.dumps(_layout(fig, placed), ensure_ascii=True)}
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=fig.dpi, format=fmt, metadata=metadata)
    return buffer.getvalue()


def _min_font_px(fig: Any) -> float:
    """The size, in the figure's pixels, of its smallest visible non-empty text."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    return min(sizes, default=0.0) * fig.dpi / 72.0


def _layout(fig: Any, placed: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The labels' and legends' boxes in image pixels, origin top left."""
    renderer = fig.canvas.get_renderer()
    height = fig.bbox.height

    def box(b: Any) -> list[float]:
        return [round(b.x0, 1), round(height - b.y1, 1), round(b.x1, 1), round(height - b.y0, 1)]

    legends = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes
               if ax.get_legend() is not None]
    return {"labels": [[text, box(b)] for text, b in placed], "legends": [box(b) for b in legends]}


def _place_labels(ax: Any, labels: Sequence[_Label], *, fontsize: float) -> list[tuple[str, Any]]:
    """Annotate ``labels`` on ``ax`` where each touches no other label, marker or legend and
    stays inside the axes; points at the same place share a label. Returns each placed
    label's text and box (display pixels); a label with no free place is left out."""
    if not labels:
        return []
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = _marker_boxes(ax)
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent(renderer))
    pad = fontsize * ax.figure.dpi / 72.0 * 0.2
    placed = []
    for label in _merged(labels):
        box = _place_one(ax, label, frame, taken, renderer, fontsize, pad)
        if box is None:
            logger.debug("no free place for the label %r: left out", label.text)
            continue
        taken.append(box)
        placed.append((label.text, box))
    return placed


def _merged(labels: Sequence[_Label]) -> list[_Label]:
    """One label per place and colour (``k=3, k=5`` for two baselines at one point)."""
    groups: dict[tuple[float, float, str], list[str]] = {}
    for label in labels:
        groups.setdefault((round(label.x, 9), round(label.y, 9), label.colour), []).append(
            label.text)
    return [_Label(x, y, ", ".join(texts), colour) for (x, y, colour), texts in groups.items()]


def _place_one(ax: Any, label: _Label, frame: Any, taken: list[Any], renderer: Any,
               fontsize: float, pad: float) -> Any:
    """The first offset (nearest first) at which the label fits; its box, or None."""
    from matplotlib.text import Text

    for radius in _RADII:
        for dx, dy in _DIRECTIONS:
            arrow = ({"arrowstyle": "-", "color": label.colour, "lw": 0.6, "alpha": 0.6,
                      "shrinkA": 0, "shrinkB": 3} if radius >= 10 else None)
            ann = ax.annotate(label.text, (label.x, label.y), xytext=(dx * radius, dy * radius),
                              textcoords="offset points", fontsize=fontsize, color=label.colour,
                              ha="left" if dx > 0 else "right" if dx < 0 else "center",
                              va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                              arrowprops=arrow)
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                      and box.y1 <= frame.y1)
            if inside and not any(box.padded(pad).overlaps(other) for other in taken):
                return box
            ann.remove()
    return None


def _marker_boxes(ax: Any) -> list[Any]:
    """A box around every drawn marker of the axes (lines with markers, scatter points)."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    scale = ax.figure.dpi / 72.0
    boxes: list[Any] = []

    def around(points: Any, half: float) -> None:
        boxes.extend(Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in points)

    for line in ax.get_lines():
        if line.get_marker() not in (None, "None", "", " "):
            around(line.get_transform().transform(line.get_xydata()),
                   line.get_markersize() * scale / 2 + 1)
    for collection in ax.collections:
        if not isinstance(collection, PathCollection):
            continue
        offsets = np.asarray(collection.get_offsets())
        if offsets.size:
            sizes = collection.get_sizes()
            half = (float(sizes.max()) ** 0.5 if len(sizes) else 6.0) * scale / 2 + 1
            around(collection.get_offset_transform().transform(offsets), half)
    return boxes
