"""Which guarantee holds for one deployment? marginal, pac, topic and topic-pac over many splits.

Each topic-disjoint split is one calibration, as a user deploys it. For every mode the
script reports, on the test topics: the mode's mean coverage, its 10 % quantile over the
splits (what the unluckiest tenth of deployments get), the share of splits at or above the
target, and the removal. ``topic-pac`` is run with its default bound (``auto``: betting
when there are enough topics, Hoeffding-Bentkus otherwise) and with each bound forced.
Scores: MiniLM ``1 - cos``.

Usage: ``python benchmarks/bench_topic_pac.py [--splits 200] [--data xquad-en,selqa-dev]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ragsieve.data import load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import resolve_scorer

MODES = ("marginal", "pac", "topic", "topic-pac")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--data", default="xquad-en,selqa-dev")
    ap.add_argument("--alpha", default="0.1,0.2")
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cache = Path(os.environ.get("RAGSIEVE_CACHE") or cache_dir() / "embeddings")
    scorer = resolve_scorer("embedding", model="minilm", cache_dir=cache)
    alphas = [float(a) for a in args.alpha.split(",")]
    out = []
    print(f"{'data':<10} {'mode':<16} {'target':>6} {'mean':>6} {'q10':>6} {'at tgt':>6} "
          f"{'removed':>7} {'tau inf':>7}")
    for name in args.data.split(","):
        pairs = load_dataset(name)
        data = ScoredData.from_pairs(pairs, scorer.score_pairs(pairs))
        for bound in ("auto", "hb", "wsr"):
            modes = MODES if bound == "auto" else ("topic-pac",)
            rep = evaluate_scores(data, alphas=alphas, top_k=[], thetas=[], n_splits=args.splits,
                                  seed=0, modes=modes, delta=args.delta, bound=bound,
                                  calibrated_baselines=False)
            for r in rep.rows("conformal"):
                label = r["mode"] + (f" ({bound})" if r["mode"] == "topic-pac" else "")
                row = {"data": name, "mode": label, "target": r["target"],
                       "metric": r["guaranteed_metric"],
                       "mean": r["topic_coverage_mean"] if "topic" in r["mode"] else r["coverage_mean"],
                       "q": r["coverage_q"], "share_at_target": r["share_at_target"],
                       "removal": r["removal_mean"],
                       "infinite_share": r["infinite_threshold_fraction"],
                       "n_required": r["n_required"]}
                out.append(row)
                print(f"{name:<10} {label:<16} {row['target']:>6.2f} {row['mean']:>6.3f} "
                      f"{row['q']:>6.3f} {row['share_at_target']:>6.2f} {row['removal']:>7.3f} "
                      f"{row['infinite_share']:>7.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
