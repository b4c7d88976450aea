"""Cost per query of each nonconformity score next to the context it removes (XQuAD en).

Side by side in one run, for a query of the dataset's mean list size (~12.6 snippets):

* time to score the list, given stored snippet embeddings (the query is embedded once;
  ``embedding`` = dot products, ``relative`` = + the per-list transform, ``fusion`` =
  + features and a dot product with the fitted weights), and the LLM scorer's measured
  time per list on the local model (``--llm-pairs`` pairs are scored live);
* removal and coverage at alpha = 0.1 over 20 topic-disjoint splits.

Usage::

    python benchmarks/bench_score_cost.py [--llm-pairs 24] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import numpy as np

from ragsieve.data import load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import EmbeddingScorer
from ragsieve.scoring.fusion import feature_matrix, fit_logistic
from ragsieve.scoring.relative import query_index_of, relative_scores


def _time(fn: Any, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm-pairs", type=int, default=24, help="pairs scored live by the LLM (0: skip)")
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    pairs = load_dataset("xquad-en")
    scorer = EmbeddingScorer(cache_dir=cache_dir() / "embeddings")
    scores = scorer.score_pairs(pairs)
    q = query_index_of(pairs)
    data = ScoredData.from_pairs(pairs, scores)
    list_size = float(np.bincount(q).mean())

    # one query's list with stored embeddings
    first = [p for p in pairs if p.query_id == pairs[0].query_id]
    snippet_vecs = scorer.cache.embed([p.text for p in first])
    model = scorer.model
    embed_query = _time(lambda: model.embed_batch([first[0].query]), 20)
    qvec = scorer.cache.embed([first[0].query])[0]
    dots = _time(lambda: EmbeddingScorer.scores_from_embeddings(qvec, snippet_vecs), 2000)
    base1 = EmbeddingScorer.scores_from_embeddings(qvec, snippet_vecs)
    zeros = np.zeros(base1.size, dtype=int)
    rel = _time(lambda: relative_scores(base1, zeros, "gap"), 2000)
    x_all = feature_matrix(scores, q)
    w, b, mu, sc = fit_logistic(x_all, data.relevant)
    fus = _time(lambda: -(((feature_matrix(base1, zeros) - mu) / sc) @ w + b), 2000)

    rows: list[dict[str, Any]] = []

    def removal_of(s: np.ndarray | None, fusion: bool = False) -> dict[str, float]:
        d = data if s is None else dataclasses.replace(data, scores=s)
        r = evaluate_scores(d, alphas=[0.1], top_k=[], thetas=[], n_splits=args.splits, seed=0,
                            calibrated_baselines=False, fusion_features=x_all if fusion else None)
        row = r.rows("conformal")[0]
        return {"coverage": row["coverage_mean"], "removal": row["removal_mean"]}

    rows.append({"score": "embedding (1 - cos)", "ms_per_query": 1e3 * (embed_query + dots), **removal_of(None)})
    for kind in ("gap", "z", "rank"):
        rows.append({"score": f"relative ({kind})", "ms_per_query": 1e3 * (embed_query + dots + rel),
                     **removal_of(relative_scores(scores, q, kind))})
    rows.append({"score": "fusion (best)", "ms_per_query": 1e3 * (embed_query + dots + fus),
                 **removal_of(None, fusion=True)})
    if args.llm_pairs:
        from ragsieve.llm import connect
        from ragsieve.scoring import LLMScorer

        sample = pairs[: args.llm_pairs]
        with connect(cache=False) as conn:
            llm = LLMScorer(conn, mode="logprob")
            t0 = time.perf_counter()
            llm.score_pairs(sample)
            per_pair = (time.perf_counter() - t0) / len(sample)
        rows.append({"score": "llm logprob (Gemma 3 270M, 1 thread)", "ms_per_query": 1e3 * per_pair * list_size,
                     "coverage": float("nan"), "removal": float("nan"),
                     "note": "removal on SelQA (README): 0.090 at alpha 0.1"})
    base_ms = rows[0]["ms_per_query"]
    for r in rows:
        r["cost_ratio_to_embedding"] = r["ms_per_query"] / base_ms
    out = {"list_size_mean": list_size, "embed_query_ms": 1e3 * embed_query, "rows": rows}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    print(f"XQuAD en, mean list {list_size:.1f} snippets; query embedding {1e3 * embed_query:.2f} ms "
          f"(stored snippet embeddings); alpha 0.1, {args.splits} topic splits")
    print(f"{'score':<40} {'ms/query':>9} {'x embed':>8} {'coverage':>9} {'removed':>8}")
    for r in rows:
        print(f"{r['score']:<40} {r['ms_per_query']:>9.2f} {r['cost_ratio_to_embedding']:>8.2f} "
              f"{r['coverage']:>9.3f} {r['removal']:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
