"""The figures of ``evaluate --plot`` and of the HTML pages: one panel per image at a size
whose text reads, and point labels that never collide (read back from the boxes each PNG
records in its text chunks), on a real sweep whose baselines crowd into one corner."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_report import png_text

from ragsieve import Pair
from ragsieve.evaluation.plots import (
    LAYOUT_KEY,
    MIN_FONT_KEY,
    PANEL_SIZE,
    plot_report,
    report_panels,
)
from ragsieve.evaluation.sweep import EvaluationReport, ScoredData, evaluate_scores

pytest.importorskip("matplotlib")

TOP_K = (1, 2, 3, 5, 10)
QUANTILES = (0.5, 0.51, 0.52, 0.53, 0.9)


@pytest.fixture(scope="module")
def crowded() -> EvaluationReport:
    """A sweep of 150 queries of three snippets (one relevant) in 15 topics: k = 3, 5 and 10
    keep every snippet (one point), and the cut-offs at the 0.50 to 0.53 quantiles of the
    score land a hair apart."""
    rng = random.Random(0)
    pairs, scores = [], []
    for q in range(150):
        for j in range(3):
            pairs.append(Pair(f"q{q}", "a question", f"s{j}", "a snippet", relevant=int(j == 0),
                              group=f"topic-{q % 15}"))
            scores.append(rng.gauss(0.3 if j == 0 else 0.6, 0.15))
    return evaluate_scores(ScoredData.from_pairs(pairs, scores), alphas=(0.05, 0.1, 0.2, 0.3),
                           top_k=TOP_K, threshold_quantiles=QUANTILES, n_splits=3)


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _check_labels(png: bytes) -> list[str]:
    """The labels' texts, once every box is checked: inside the image, touching no other
    label and no legend."""
    width, height = _png_size(png)
    layout = json.loads(png_text(png)[LAYOUT_KEY])
    boxes = [box for _, box in layout["labels"]]
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
        for a0, b0, a1, b1 in boxes[i + 1:] + layout["legends"]:
            assert not (x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1), (boxes, layout["legends"])
    return [part.strip() for text, _ in layout["labels"] for part in text.split(",")]


def _expected() -> list[str]:
    return sorted([f"k={k}" for k in TOP_K] + [f"q={q:g}" for q in QUANTILES])


def test_crowded_baselines_are_all_labelled_apart(crowded: EvaluationReport) -> None:
    rows = {(r["removal_mean"], r["coverage_mean"]) for r in crowded.rows("top-k")
            if r["k"] >= 3}
    assert len(rows) == 1  # the crowd the figure has to handle
    panels = report_panels({"synthetic": crowded})
    assert [p.name for p in panels] == ["coverage", "removal", "trade-off"]
    assert sorted(_check_labels(panels[2].png)) == _expected()


def test_panels_read_at_their_page_size(crowded: EvaluationReport) -> None:
    """Shown at 96 CSS px an inch (``Panel.css_size``), no text of a panel is under 10 CSS px."""
    for panel in report_panels(crowded):
        width, height = _png_size(panel.png)
        assert panel.css_size == (round(PANEL_SIZE[0] * 96), round(PANEL_SIZE[1] * 96))
        assert (width, height) == (int(PANEL_SIZE[0] * panel.dpi), int(PANEL_SIZE[1] * panel.dpi))
        smallest = float(png_text(panel.png)[MIN_FONT_KEY]) * panel.css_size[0] / width
        assert smallest >= 10.0, (panel.name, smallest)


def test_plot_file_labels_apart(crowded: EvaluationReport, tmp_path: Path) -> None:
    """``evaluate --plot``'s file of all three panels places its labels the same way."""
    written = plot_report({"synthetic": crowded}, tmp_path / "figure")
    png = written.read_bytes()
    assert written.suffix == ".png" and _png_size(png) == (1650, 528)
    assert sorted(_check_labels(png)) == _expected()
