"""Every bundled signal in the fused score: ablation, learners, presets and their cost.

For each dataset (XQuAD en, de, es, zh, el, ro and SelQA dev), side by side in one run:

* every signal of the ``quality`` preset is scored once on all pairs (the base: the
  language's default embedder's ``1 - cos``; the other bundled embedders of the language;
  the in-list BM25; the best sentence's ``1 - cos`` of the base model), through the
  embedding cache;
* for each signal set (base only = the fused score before the presets; + the other
  embedders; + BM25 = the ``fast`` preset's signals; + best sentence; all = the ``quality``
  preset's signals) and each learner (logistic regression, monotone boosted trees), the
  fused score is fitted per split on a quarter of the calibration topics and conformalized
  on the rest (``evaluate``'s own path: ``evaluate_scores(fusion_features=...)``), marginal
  mode, alpha 0.1 and 0.2, the same topic-disjoint splits for every row;
* the oracle's removal (keeping exactly the relevant snippets: the share of irrelevant
  snippets on the test topics, averaged over the same splits), and each row's removal as a
  share of it;
* the cost per snippet of the ``fast`` and ``quality`` presets (a fitted scorer's
  ``score_pairs``) on a fixed sample (one query of each of the first 20 topics), with a
  cold embedding cache (models loaded, nothing embedded) and warm (everything cached).

Usage::

    python benchmarks/bench_signals.py [--datasets xquad-en,...,selqa-dev] [--splits 20]
        [--sample-topics 20] [--out FILE] [--json FILE]

The markdown tables go to stdout and to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve._paths import cache_dir
from ragsieve.data import group_splits, load_dataset
from ragsieve.evaluation import TOLERANCE_SE, ScoredData, evaluate_scores
from ragsieve.scoring import EmbeddingScorer, FusedScorer, ListBM25Scorer, SentenceCosineScorer
from ragsieve.scoring.fusion import FusionFeatures, fit_learner, signals_feature_matrix
from ragsieve.scoring.relative import query_index_of
from ragsieve.scoring.signals import PRESET_LEARNERS, preset_signals
from ragsieve.types import Pair

DATASETS = ("xquad-en", "xquad-de", "xquad-es", "xquad-zh", "xquad-el", "xquad-ro", "selqa-dev")
ALPHAS = (0.1, 0.2)
LEARNERS = ("logistic", "boosted")
SETS = ("base", "+embedders", "+bm25", "+sentence", "all")


def _language(name: str) -> str:
    return name.split("-", 1)[1] if name.startswith("xquad-") else "en"


def _signals(base: EmbeddingScorer) -> dict[str, list[Any]]:
    """The quality preset's signals, by kind."""
    quality = preset_signals(base, "quality")
    return {"embedders": [s for s in quality if isinstance(s, EmbeddingScorer)],
            "bm25": [s for s in quality if isinstance(s, ListBM25Scorer)],
            "sentence": [s for s in quality if isinstance(s, SentenceCosineScorer)]}


def _signal_sets(kinds: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {"base": [], "+embedders": kinds["embedders"], "+bm25": kinds["bm25"],
            "+sentence": kinds["sentence"],
            "all": [*kinds["embedders"], *kinds["bm25"], *kinds["sentence"]]}


def _oracle(data: ScoredData, splits: int, seed: int) -> float:
    """Mean share of irrelevant snippets on the test topics of ``evaluate``'s splits."""
    shares = []
    for _, test in group_splits(data.group_index.tolist(), calibration_fraction=0.5,
                                n_splits=splits, seed=seed):
        shares.append(1.0 - float(data.relevant[test].mean()))
    return float(np.mean(shares))


def _ablation(name: str, pairs: list[Pair], args: argparse.Namespace) -> dict[str, Any]:
    language = _language(name)
    base = EmbeddingScorer(language=language, cache_dir=args.cache_dir)
    kinds = _signals(base)
    t0 = time.perf_counter()
    scores = {id(s): s.score_pairs(pairs, progress=not args.quiet)
              for s in [base, *kinds["embedders"], *kinds["bm25"], *kinds["sentence"]]}
    scoring_s = time.perf_counter() - t0
    qidx = query_index_of(pairs)
    data = ScoredData.from_pairs(pairs, scores[id(base)])
    oracle = _oracle(data, args.splits, args.seed)
    rows = []
    for set_name, extra in _signal_sets(kinds).items():
        if set_name == "+embedders" and not extra:
            continue  # no other bundled embedder covers the language
        matrix = signals_feature_matrix([scores[id(base)], *(scores[id(s)] for s in extra)], qidx)
        for learner in LEARNERS:
            t1 = time.perf_counter()
            report = evaluate_scores(
                data, alphas=ALPHAS, top_k=(), thetas=(), n_splits=args.splits, seed=args.seed,
                calibrated_baselines=False, fusion_features=FusionFeatures(matrix, learner))
            row: dict[str, Any] = {"dataset": name, "signals": set_name, "learner": learner,
                                   "n_features": matrix.shape[1],
                                   "seconds": round(time.perf_counter() - t1, 1)}
            for r in report.rows("conformal"):
                a = r["alpha"]
                row[f"coverage@{a}"] = r["coverage_mean"]
                row[f"coverage_se@{a}"] = r["coverage_se"]
                row[f"removal@{a}"] = r["removal_mean"]
                row[f"of_oracle@{a}"] = r["removal_mean"] / oracle
            rows.append(row)
            if not args.quiet:
                print(f"{name} {set_name} {learner}: " + ", ".join(
                    f"{k}={v:.3f}" for k, v in row.items() if "@" in k and "se" not in k),
                    file=sys.stderr, flush=True)
    return {"dataset": name, "language": language, "model": base.model_id,
            "signals": [s.spec() for s in [base, *_signal_sets(kinds)["all"]]],
            "n_pairs": len(pairs), "n_queries": int(qidx.max()) + 1, "oracle": oracle,
            "scoring_seconds": round(scoring_s, 1), "rows": rows}


def _sample(pairs: list[Pair], n_topics: int) -> list[Pair]:
    """The pairs of the first query of each of the first ``n_topics`` topics (sorted)."""
    first: dict[str, str] = {}
    for p in pairs:
        first.setdefault(str(p.group), p.query_id)
    chosen = {first[t] for t in sorted(first)[:n_topics]}
    return [p for p in pairs if p.query_id in chosen]


def _cost(name: str, pairs: list[Pair], args: argparse.Namespace) -> list[dict[str, Any]]:
    """ms per snippet of each preset's fitted score on a fixed sample, cold and warm cache."""
    language = _language(name)
    sample = _sample(pairs, args.sample_topics)
    out = []
    for preset in ("fast", "quality"):
        # the learner fitted on every pair (timing only: the parameters do not change the cost)
        warm_base = EmbeddingScorer(language=language, cache_dir=args.cache_dir)
        fitting = FusedScorer.unfitted(warm_base, preset=preset)
        x, _ = fitting.features_of_pairs(pairs)
        fitted = fit_learner(PRESET_LEARNERS[preset], x, np.array([p.relevant for p in pairs]))
        cold_base = EmbeddingScorer(language=language)  # in-memory cache, empty
        scorer = FusedScorer.unfitted(cold_base, preset=preset).with_weights(fitted)
        for signal in scorer.signal_scorers:  # load every model before the clock starts
            signal.score_batch("warm-up", ["warm-up"])
        t0 = time.perf_counter()
        scorer.score_pairs(sample)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        scorer.score_pairs(sample)
        warm = time.perf_counter() - t0
        out.append({"dataset": name, "preset": preset, "n_snippets": len(sample),
                    "n_queries": len({p.query_id for p in sample}),
                    "signals": [s.spec()["scorer"] + (f"[{s.spec()['model']}]" if "model" in s.spec() else "")
                                for s in scorer.signal_scorers],
                    "cold_ms": 1e3 * cold / len(sample), "warm_ms": 1e3 * warm / len(sample)})
        if not args.quiet:
            print(f"cost {name} {preset}: cold {out[-1]['cold_ms']:.2f} ms, warm "
                  f"{out[-1]['warm_ms']:.3f} ms per snippet", file=sys.stderr, flush=True)
    return out


def _tables(results: list[dict[str, Any]], costs: list[dict[str, Any]], args: argparse.Namespace,
            load: tuple[float, float]) -> str:
    lines = [] if not results else ["### Removal at the guarantee, per signal set and learner", "",
             (f"Marginal mode, means over {args.splits} topic-disjoint splits (seed {args.seed}); "
              "each row's fused score fitted per split on a quarter of the calibration topics, "
              "calibrated on the rest. `of oracle` = removal / the oracle's removal (keeping "
              "exactly the relevant snippets). **fast** = `+bm25` logistic, **quality** = `all` "
              "boosted."), "",
             ("| dataset | model | oracle | signals | learner | coverage 0.1 | removed 0.1 | of "
              "oracle 0.1 | coverage 0.2 | removed 0.2 | of oracle 0.2 |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            preset = ("fast" if (r["signals"], r["learner"]) == ("+bm25", "logistic") else
                      "quality" if (r["signals"], r["learner"]) == ("all", "boosted") else "")
            label = f"{r['signals']} **({preset})**" if preset else r["signals"]
            lines.append(
                f"| {res['dataset']} | {res['model']} | {res['oracle']:.3f} | {label} | "
                f"{r['learner']} | {r['coverage@0.1']:.3f} | {r['removal@0.1']:.3f} | "
                f"{100 * r['of_oracle@0.1']:.1f} % | {r['coverage@0.2']:.3f} | "
                f"{r['removal@0.2']:.3f} | {100 * r['of_oracle@0.2']:.1f} % |")
    if results:
        lines += ["", "### Summary at alpha 0.1: removal as a share of the oracle's", "",
                  "| dataset | oracle | base only, logistic (`base`) | fast | quality | best row |",
                  "|---|---|---|---|---|---|"]
    for res in results:
        by = {(r["signals"], r["learner"]): r for r in res["rows"]}
        best = max(res["rows"], key=lambda r: r["removal@0.1"])

        def cell(r: dict[str, Any]) -> str:
            on = r["coverage@0.1"] >= 0.9 - TOLERANCE_SE * r["coverage_se@0.1"]
            return (f"{r['removal@0.1']:.3f} ({100 * r['of_oracle@0.1']:.1f} %, cov "
                    f"{r['coverage@0.1']:.3f}{'' if on else ' below target'})")

        lines.append(f"| {res['dataset']} | {res['oracle']:.3f} | {cell(by[('base', 'logistic')])} | "
                     f"{cell(by[('+bm25', 'logistic')])} | {cell(by[('all', 'boosted')])} | "
                     f"{best['signals']} {best['learner']}: {cell(best)} |")
    if costs:
        lines += ["", "### Cost per snippet of the presets", "",
                  (f"A fitted preset's `score_pairs` on one query of each of the first "
                   f"{args.sample_topics} topics; cold = models loaded, embedding cache empty; "
                   "warm = the same call again (every text cached). 1-minute load average "
                   f"{load[0]:.2f} at the start, {load[1]:.2f} at the end (2 shared cores)."), "",
                  "| dataset | preset | signals | snippets | cold ms / snippet | warm ms / snippet |",
                  "|---|---|---|---|---|---|"]
        for c in costs:
            lines.append(f"| {c['dataset']} | {c['preset']} | {', '.join(c['signals'])} | "
                         f"{c['n_snippets']} | {c['cold_ms']:.1f} | {c['warm_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def signal_bench_parser(description: str) -> argparse.ArgumentParser:
    """The options the signal benchmarks share (this one and ``bench_portable_signals.py``):
    the data sets, splits, seed, the cost sample, the embedding cache and the outputs."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-topics", type=int, default=20)
    parser.add_argument("--no-cost", action="store_true", help="skip the cost measurement")
    parser.add_argument("--cache-dir", default=str(cache_dir() / "embeddings"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quiet", action="store_true")
    return parser


def write_outputs(text: str, args: argparse.Namespace, payload: dict[str, Any]) -> None:
    """Print the tables; write them to ``--out`` and ``payload`` to ``--json`` when given."""
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2, default=float), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = signal_bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--cost-only", action="store_true", help="only the cost measurement")
    parser.add_argument("--tables-from", type=Path, default=None,
                        help="print the tables of an earlier run's --json file (no measurement)")
    args = parser.parse_args(argv)
    if args.tables_from:
        saved = json.loads(args.tables_from.read_text(encoding="utf-8"))
        print(_tables(saved["results"], saved["costs"], args, tuple(saved.get("load", (0, 0)))))
        return 0
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    load0 = os.getloadavg()[0]
    results, costs = [], []
    for name in names:
        pairs = load_dataset(name)
        if not args.cost_only:
            results.append(_ablation(name, pairs, args))
        if not args.no_cost:
            costs.extend(_cost(name, pairs, args))
    load = (load0, os.getloadavg()[0])
    write_outputs(_tables(results, costs, args, load), args,
                  {"results": results, "costs": costs, "load": load, "splits": args.splits,
                   "seed": args.seed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
