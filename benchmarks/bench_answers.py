"""What the filtered context buys at the generator: prompt tokens and answer latency per method.

On one topic-disjoint split of XQuAD-en (fused score, the given alphas), answers are
generated with the reply cache off, so every request is timed, for the same test queries
under ``all``, ``conformal`` and the equal-size top-k. Printed side by side per method:
mean prompt tokens reported by the server, mean latency per answer, the ratio of both to
``all``, EM and token F1. With ``--base-url`` / ``--llm-model`` any OpenAI-compatible
server is measured instead of the local Gemma 3 270M.

Usage: ``python benchmarks/bench_answers.py [--queries 30] [--alpha 0.1] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ragsieve.data import load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import AnswerConfig, evaluate_answers
from ragsieve.evaluation.answers import LOCAL_N_CTX
from ragsieve.llm import connect
from ragsieve.scoring import resolve_scorer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--alpha", default="0.1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--llm-model", default=None)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the local model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cache = Path(os.environ.get("RAGSIEVE_CACHE") or cache_dir() / "embeddings")
    pairs = load_dataset("xquad-en")
    scorer = resolve_scorer("best", model="minilm", cache_dir=cache)
    config = AnswerConfig(alphas=tuple(float(a) for a in args.alpha.split(",")), n_splits=1,
                          limit_queries=args.queries, seed=args.seed, judge=False)
    t0 = time.perf_counter()
    with connect(base_url=args.base_url, model=args.llm_model, cache=False, threads=args.threads,
                 n_ctx=LOCAL_N_CTX) as conn:
        report = evaluate_answers(pairs, scorer, config, connection=conn, progress=True)
    seconds = time.perf_counter() - t0
    base = report.row("all")
    print(f"{report.info['n_queries_evaluated']} test queries, generator {report.info['generator']['model']}, "
          f"{report.info['llm_requests']} requests in {seconds:.0f} s (cache off)")
    print(f"{'method':<20} {'alpha':>5} {'chars':>6} {'prompt tok':>10} {'× all':>6} "
          f"{'latency s':>9} {'× all':>6} {'EM':>6} {'F1':>6}")
    rows = []
    for r in report.results:
        tok, lat = r["prompt_tokens_mean"], r["latency_s_mean"]
        row = {"method": r["method"], "alpha": r.get("alpha"), "context_chars": r["context_chars_mean"],
               "prompt_tokens": tok, "prompt_tokens_ratio": tok / base["prompt_tokens_mean"] if tok else None,
               "latency_s": lat, "latency_ratio": lat / base["latency_s_mean"] if lat else None,
               "em": r["em_mean"], "f1": r["f1_mean"]}
        rows.append(row)
        alpha = "-" if row["alpha"] is None else f"{row['alpha']:g}"
        print(f"{r['method']:<20} {alpha:>5} {row['context_chars']:>6.0f} {tok or 0:>10.0f} "
              f"{row['prompt_tokens_ratio'] or 0:>6.2f} {lat or 0:>9.2f} {row['latency_ratio'] or 0:>6.2f} "
              f"{row['em']:>6.3f} {row['f1']:>6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "info": report.info, "rows": rows},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
