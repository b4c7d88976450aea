"""Every guarantee mode, measured twice on XQuAD-en: by `evaluate`, and as deployed.

For each of the same topic-disjoint splits, the deployed path is what a user runs:
``ConformalFilter(scorer, mode).calibrate(calibration pairs)`` -> ``save`` -> ``load`` ->
``filter_pairs(test pairs)``; the kept snippets are then measured exactly as `evaluate`
measures its own keep-masks. The two columns should agree within noise (they share the
splits; the fused score draws its fitting half of the topics differently).

Usage::

    python benchmarks/bench_modes.py [--splits 20] [--alpha 0.1] [--json out.json]

The group mode calibrates per question word (what / who / when / how / which / other),
a field this script adds to every pair, since XQuAD-en has one language.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve import ConformalFilter
from ragsieve.calibration import MODES, make_calibrator
from ragsieve.calibration.modes import mode_params
from ragsieve.data import group_splits, load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import ScoredData, evaluate, evaluate_scores
from ragsieve.evaluation.metrics import query_coverage
from ragsieve.scoring import resolve_scorer

WORDS = ("what", "who", "when", "how", "which")


def question_word(query: str) -> str:
    first = query.strip().split(" ", 1)[0].lower().strip("?,")
    return first if first in WORDS else "other"


def measure(kept: np.ndarray, data: ScoredData, test: np.ndarray, attribute: np.ndarray) -> dict[str, float]:
    """The metrics `evaluate` reports, on the test side of one split."""
    rel = data.relevant[test]
    k = kept[test]
    qc = query_coverage(k, rel, data.query_index[test])
    tc = query_coverage(k, rel, data.group_index[test])
    per_group = {g: float(k[rel & (attribute[test] == g)].mean()) for g in set(attribute[test][rel])}
    return {"coverage": float(k[rel].mean()), "query_coverage": float(qc.mean()),
            "query_all_kept": float((qc == 1).mean()), "topic_coverage": float(tc.mean()),
            "per_group": per_group, "removal": float(1 - k.mean())}


def summarise(metric: str, per_split: list[dict], delta: float) -> tuple[float, float]:
    """The guaranteed metric over splits, aggregated as `evaluate` does, and a standard error."""
    if metric == "group_coverage_min":  # per-group means over splits, then the worst group
        groups = {g for m in per_split for g in m["per_group"]}
        per = {g: np.array([m["per_group"][g] for m in per_split if g in m["per_group"]]) for g in groups}
        worst = min(per, key=lambda g: per[g].mean())
        return float(per[worst].mean()), float(per[worst].std(ddof=1) / math.sqrt(per[worst].size))
    base = metric.split("_quantile_")[0]  # the PAC modes bound a quantile of their metric
    v = np.array([m[METRIC_KEY[base]] for m in per_split])
    se = float(v.std(ddof=1) / math.sqrt(v.size))
    return (float(np.quantile(v, delta)) if "_quantile_" in metric else float(v.mean())), se


METRIC_KEY = {"coverage": "coverage", "query_coverage": "query_coverage", "miss_rate": "coverage",
              "query_all_kept": "query_all_kept", "topic_coverage": "topic_coverage",
              "group_coverage_min": "group_coverage_min"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--budget", type=int, default=1500)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cache = Path(os.environ.get("RAGSIEVE_CACHE") or cache_dir() / "embeddings")
    pairs = [dataclasses.replace(p, meta={**p.meta, "qword": question_word(p.query)})
             for p in load_dataset("xquad-en")]
    cos = resolve_scorer("embedding", model="minilm", cache_dir=cache)
    t0 = time.perf_counter()
    scores = cos.score_pairs(pairs)
    print(f"scored {len(pairs)} pairs in {time.perf_counter() - t0:.1f} s (cached embeddings are reused)")
    data = ScoredData.from_pairs(pairs, scores, group_by="qword")
    attribute = np.asarray(data.attribute).astype(str)
    modes = [m for m in MODES]
    rep = evaluate_scores(data, alphas=[args.alpha], top_k=[], thetas=[], n_splits=args.splits,
                          seed=0, modes=modes, delta=args.delta, budgets=[args.budget],
                          calibrated_baselines=False)
    rep_best = evaluate(pairs, resolve_scorer("best", model="minilm", cache_dir=cache),
                        alphas=[args.alpha], top_k=[], thetas=[], n_splits=args.splits, seed=0,
                        calibrated_baselines=False)
    splits = group_splits(data.group_index.tolist(), calibration_fraction=0.5,
                          n_splits=args.splits, seed=0)
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="ragsieve-bench-modes-"))
    for mode in modes + ["marginal (best)"]:
        base_mode = mode.split(" ")[0]
        per_split: list[dict[str, float]] = []
        t0 = time.perf_counter()
        for s_no, (cal_idx, test_idx) in enumerate(splits):
            scorer = resolve_scorer("best", model="minilm", cache_dir=cache) if "best" in mode else cos
            given = {"alpha": args.alpha, "delta": args.delta, "budget": args.budget}
            cal = make_calibrator(base_mode, **{k: v for k, v in given.items()
                                                if k in mode_params(base_mode)})
            flt = ConformalFilter(scorer, cal).calibrate([pairs[i] for i in cal_idx], group_by="qword",
                                                         seed=s_no)
            path = flt.save(tmp / f"{base_mode}-{s_no}.json")
            loaded = ConformalFilter.load(path, scorer_options={"cache_dir": cache})
            test_pairs = [pairs[i] for i in test_idx]
            results = loaded.filter_pairs(test_pairs)
            kept = np.zeros(len(pairs), dtype=bool)
            pos = {(p.query_id, p.snippet_id): i for i, p in zip(test_idx, test_pairs, strict=True)}
            for qid, res in results.items():
                for s in res.kept:
                    kept[pos[(qid, s.snippet_id)]] = True
            test = np.zeros(len(pairs), dtype=bool)
            test[test_idx] = True
            per_split.append(measure(kept, data, test, attribute))
        metric = loaded.guarantee()["metric"]
        dep_value, dep_se = summarise(metric, per_split, args.delta)
        ev = next(r for r in (rep_best if "best" in mode else rep).rows("conformal")
                  if r["mode"] == base_mode)
        rows.append({
            "mode": mode, "metric": metric, "target": 1 - args.alpha,
            "evaluate_value": None if ev is None else ev["guaranteed_value"],
            "deployed_value": dep_value,
            "deployed_se": dep_se,
            "evaluate_removal": None if ev is None else ev["removal_mean"],
            "deployed_removal": float(np.mean([m["removal"] for m in per_split])),
            "seconds": round(time.perf_counter() - t0, 1),
        })
        r = rows[-1]
        ev_text = "   -   " if r["evaluate_value"] is None else f"{r['evaluate_value']:.4f}"
        ev_rm = "  -  " if r["evaluate_removal"] is None else f"{r['evaluate_removal']:.3f}"
        print(f"{mode:<16} {metric:<22} evaluate {ev_text} deployed {r['deployed_value']:.4f} "
              f"(se {r['deployed_se']:.4f}) | removal evaluate {ev_rm} deployed "
              f"{r['deployed_removal']:.3f} | {r['seconds']} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"alpha": args.alpha, "splits": args.splits,
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
