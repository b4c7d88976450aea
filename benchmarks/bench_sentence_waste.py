"""Where the kept characters go: the snippet unit and the sentence unit, side by side.

For each of the same topic-disjoint splits of a dataset (default XQuAD-en), a snippet
filter and a sentence filter with the same score are calibrated on the calibration topics'
snippet pairs and applied to each test query's list as deployed. Every character a filter
keeps is placed by where it sits in its passage (``Pair.meta``'s ``doc_id``, ``start``;
characters kept twice, by overlapping snippets, count once):

- **evidence**: inside an evidence sentence (:func:`ragsieve.units.sentence_pairs`: the
  answer's sentence);
- **answer's snippet**: inside a relevant snippet, not evidence (the evidence's neighbours);
- **answer's passage**: elsewhere in a passage that holds a relevant snippet;
- **other passages**: anywhere else.

Reported per alpha and unit: characters per test query in each place, their total, and
the evidence sentences' characters per query (what a perfect sentence filter keeps). One
markdown table, on stdout and with ``--out FILE``. It says which characters a better score
must drop: with the sentence unit most of what is kept beyond the evidence lies in the
answer's own passage.

Usage::

    python benchmarks/bench_sentence_waste.py [--data xquad-en] [--splits 3]
        [--alpha 0.1,0.2] [--scorer best] [--preset fast] [--out table.md]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve import ConformalFilter
from ragsieve.data import group_splits, load_dataset
from ragsieve.scoring import resolve_scorer
from ragsieve.types import Pair
from ragsieve.units import sentence_pairs

PLACES = ("evidence", "answer's snippet", "answer's passage", "other passages")
UNITS = ("snippet", "sentence")


def _where(pair: Pair) -> tuple[str, int]:
    """The passage a snippet was cut from and its offset there."""
    return str(pair.meta.get("doc_id", pair.snippet_id)), int(pair.meta.get("start", 0))


def _places(pairs: list[Pair], kept: list[tuple[int, int, int]]) -> dict[str, int]:
    """Characters of one query's kept ranges ``(pair index, start, end)`` (offsets in the
    snippet) by place; each passage character counted once."""
    relevant = [p for p in pairs if p.relevant == 1]
    gold = {_where(p)[0] for p in relevant}
    marks: dict[str, dict[int, int]] = defaultdict(dict)  # passage -> offset -> place rank
    for p in relevant:
        doc, start = _where(p)
        for i in range(start, start + len(p.text)):
            marks[doc][i] = 1
    for s in sentence_pairs(relevant, warn_unmarked=False) if relevant else []:
        if s.relevant == 1:
            doc, start = _where(s)
            for i in range(start + s.meta["sentence_start"], start + s.meta["sentence_end"]):
                marks[doc][i] = 0
    seen: set[tuple[str, int]] = set()
    out = dict.fromkeys(PLACES, 0)
    for index, a, b in kept:
        doc, start = _where(pairs[index])
        for i in range(start + a, start + b):
            if (doc, i) in seen:
                continue
            seen.add((doc, i))
            rank = marks[doc].get(i, 2 if doc in gold else 3)
            out[PLACES[rank]] += 1
    return out


def _evidence_chars(pairs: list[Pair]) -> int:
    relevant = [p for p in pairs if p.relevant == 1]
    spans = {(_where(s)[0], _where(s)[1] + s.meta["sentence_start"],
              _where(s)[1] + s.meta["sentence_end"])
             for s in (sentence_pairs(relevant, warn_unmarked=False) if relevant else [])
             if s.relevant == 1}
    return sum(b - a for _, a, b in spans)


def run_split(pairs: list[Pair], cal_idx: Any, test_idx: Any, alpha: float, seed: int,
              scorer: str, preset: str | None) -> dict[str, dict[str, float]]:
    cal = [pairs[i] for i in cal_idx]
    by_query: dict[str, list[Pair]] = defaultdict(list)
    for i in test_idx:
        by_query[pairs[i].query_id].append(pairs[i])
    out: dict[str, dict[str, float]] = {}
    for unit in UNITS:
        options = {"preset": preset} if preset else {}
        flt = ConformalFilter(resolve_scorer(scorer, **options), alpha=alpha, unit=unit)
        flt.calibrate(cal, seed=seed, monitor=False)
        totals = dict.fromkeys(PLACES, 0.0)
        for listed in by_query.values():
            result = flt.filter(listed[0].query, listed)
            kept = [(k.index, a, b) for k in result.kept
                    for a, b in (k.spans if unit == "sentence" else [(0, len(listed[k.index].text))])]
            for place, n in _places(listed, kept).items():
                totals[place] += n
        out[unit] = {k: v / len(by_query) for k, v in totals.items()}
    out["oracle"] = {"evidence": float(np.mean([_evidence_chars(v) for v in by_query.values()]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--data", default="xquad-en")
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--alpha", default="0.1,0.2")
    ap.add_argument("--scorer", default="best")
    ap.add_argument("--preset", default="fast", help="the best score's preset ('' for none)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pairs = load_dataset(args.data)
    alphas = [float(a) for a in args.alpha.split(",")]
    splits = group_splits([p.group for p in pairs], calibration_fraction=0.5,
                          n_splits=args.splits, seed=0)
    preset = args.preset if args.scorer == "best" and args.preset else None
    t0 = time.perf_counter()
    per: dict[float, list[dict[str, dict[str, float]]]] = defaultdict(list)
    for a in alphas:
        for s_no, (cal_idx, test_idx) in enumerate(splits):
            per[a].append(run_split(pairs, cal_idx, test_idx, a, s_no, args.scorer, preset))
    score = f"{args.scorer} ({preset})" if preset else args.scorer
    lines = [(f"{args.data}, score {score}, marginal mode, {len(splits)} topic-disjoint "
              f"splits (half the topics calibrate); characters kept per test query, each "
              f"passage character once; {time.perf_counter() - t0:.0f} s"), "",
             "| alpha | unit | " + " | ".join(PLACES) + " | total | sentence / snippet |",
             "|---|---|" + "---|" * (len(PLACES) + 2)]
    for a, runs in per.items():
        mean = {u: {p: float(np.mean([r[u][p] for r in runs])) for p in PLACES} for u in UNITS}
        total = {u: sum(mean[u].values()) for u in UNITS}
        for u in UNITS:
            share = f"{total['sentence'] / total['snippet']:.2f}" if u == "sentence" else ""
            lines.append(f"| {a:g} | {u} | " + " | ".join(f"{mean[u][p]:.0f}" for p in PLACES)
                         + f" | {total[u]:.0f} | {share} |")
        oracle = float(np.mean([r["oracle"]["evidence"] for r in runs]))
        lines.append(f"| {a:g} | evidence sentences (oracle) | {oracle:.0f} | | | | "
                     f"{oracle:.0f} | |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
