"""ragsieve's Haystack ``ConformalRanker`` against Haystack's own knob, ``top_k`` (XQuAD en).

Haystack 3's core has no score cut-off for retrieved documents (the similarity rankers
with ``score_threshold`` moved to separate integration packages); what a Haystack user sets
by hand is the retriever's ``top_k``. Both sides run in real ``haystack.Pipeline`` objects
over one ``InMemoryDocumentStore`` holding every XQuAD-en snippet with its all-MiniLM-L6-v2
embedding; each question's candidate list is its article's snippets (11.9 on average),
selected with a metadata filter on the retriever:

* ``InMemoryEmbeddingRetriever(top_k=n) -> ConformalRanker``: the retriever returns the
  whole list, the ranker (calibrated at alpha on the calibration topics, loaded with
  ``ConformalRanker.from_file``) keeps what the conformal filter keeps; once with the
  ``1 - cos`` score, once with the fused score (``best``: fitted on a random half of the
  calibration topics, conformalized on the other half, as ``ragsieve evaluate`` does);
* ``InMemoryEmbeddingRetriever(top_k=k)`` alone, for every ``k``: the first ``k`` of the
  retriever's ranking (checked against a real ``top_k=k`` run on a few queries).

Measured over topic-disjoint splits (the same splits as ``ragsieve evaluate``): coverage
(share of the relevant test snippets kept) and removal (share of test snippets dropped) of
each conformal ranker and of ``top_k`` = 1, 2, 3, 5, 10 (3, 5 and the default 10 are the
values in Haystack's docs), and per split the smallest ``top_k`` whose coverage reaches
each ranker's (picked in hindsight on the test topics, which a user cannot do). Plus the
time per query of the pipelines (embeddings cached; the retriever gets the query
embedding) and a sanity check that the ranker's ``Document.score = 1 - s`` equals the
retriever's dot product of unit vectors.

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_haystack.py [--splits 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # before haystack is imported

import numpy as np
from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from ragsieve.data import group_splits, load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import ScoredData
from ragsieve.filter import ConformalFilter
from ragsieve.integrations.haystack import ConformalRanker
from ragsieve.scoring import EmbeddingScorer, FusedScorer

TOP_K = (1, 2, 3, 5, 10)  # 3, 5 and the default 10 are the values in Haystack's docs


def _mean_sd(vals: list[float]) -> tuple[float, float]:
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=20, help="topic-disjoint splits")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing-queries", type=int, default=60, help="test queries timed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    pairs = load_dataset("xquad-en")
    emb_cache = cache_dir() / "embeddings"
    scorer = EmbeddingScorer(cache_dir=emb_cache)
    scores = scorer.score_pairs(pairs)  # from the cache after the first run
    data = ScoredData.from_pairs(pairs, scores)
    qidx, relevant = data.query_index, data.relevant
    lists = [np.flatnonzero(qidx == q) for q in range(data.n_queries)]
    queries = [pairs[idx[0]].query for idx in lists]
    articles = [pairs[idx[0]].group for idx in lists]
    # relevant snippet ids of each question, and each pair's position in its list by id
    relevant_ids = [{pairs[i].snippet_id for i in idx if relevant[i]} for idx in lists]

    log("embedding snippets and questions (cached after the first run)...")
    snippet_ids = sorted({p.snippet_id for p in pairs})
    by_id = {p.snippet_id: p for p in pairs}
    vecs = scorer.cache.embed([by_id[s].text for s in snippet_ids])
    qvecs = scorer.cache.embed(queries, kind="query")
    store = InMemoryDocumentStore()
    store.write_documents([
        Document(id=s, content=by_id[s].text, embedding=v.astype(float).tolist(),
                 meta={"article": by_id[s].group})
        for s, v in zip(snippet_ids, vecs, strict=True)
    ])
    list_size = {g: sum(1 for s in snippet_ids if by_id[s].group == g) for g in set(articles)}

    def retriever_input(q: int, top_k: int) -> dict[str, Any]:
        return {"query_embedding": qvecs[q].astype(float).tolist(), "top_k": top_k,
                "filters": {"field": "meta.article", "operator": "==", "value": articles[q]}}

    splits = group_splits(data.group_index.tolist(), n_splits=args.splits, seed=args.seed)
    rows: dict[str, dict[str, list[float]]] = {}
    k_equal: dict[str, list[int]] = {}
    max_diff = 0.0
    topk_checked = 0
    timing: dict[str, list[float]] = {}

    def add(key: str, cov: float, rem: float) -> None:
        r = rows.setdefault(key, {"coverage": [], "removal": []})
        r["coverage"].append(cov)
        r["removal"].append(rem)

    def pipeline(path: Path) -> Pipeline:
        pipe = Pipeline()
        pipe.add_component("retriever", InMemoryEmbeddingRetriever(document_store=store))
        pipe.add_component("ranker", ConformalRanker.from_file(path, cache_dir=emb_cache))
        pipe.connect("retriever.documents", "ranker.documents")
        return pipe

    with tempfile.TemporaryDirectory() as tmp:
        for split_no, (cal_idx, test_idx) in enumerate(splits):
            f_cos = ConformalFilter(scorer, alpha=args.alpha).calibrate([pairs[i] for i in cal_idx])
            # fused score: the same draw of fitting topics as `ragsieve evaluate --scorer best`
            topics = np.unique(data.group_index[cal_idx])
            frng = np.random.default_rng([args.seed, split_no])
            fit_topics = frng.permutation(topics)[: max(1, topics.size // 2)]
            in_fit = np.isin(data.group_index[cal_idx], fit_topics)
            fit_idx, conf_idx = cal_idx[in_fit], cal_idx[~in_fit]
            fused = FusedScorer.fit([pairs[i] for i in fit_idx], scorer, base_scores=scores[fit_idx])
            f_best = ConformalFilter(fused, alpha=args.alpha).calibrate([pairs[i] for i in conf_idx])
            pipes = {
                f"ConformalRanker, 1 - cos (alpha {args.alpha:g})":
                    pipeline(f_cos.save(Path(tmp) / f"cos-{split_no}.json")),
                f"ConformalRanker, fused best (alpha {args.alpha:g})":
                    pipeline(f_best.save(Path(tmp) / f"best-{split_no}.json")),
            }
            test_q = np.unique(qidx[test_idx])
            n_rel = n_all = 0
            kept_rel = dict.fromkeys(pipes, 0)
            kept_all = dict.fromkeys(pipes, 0)
            max_k = max(list_size[articles[q]] for q in test_q)
            topk_rel = np.zeros(max_k + 1)
            topk_all = np.zeros(max_k + 1)
            for q in test_q:
                n = list_size[articles[q]]
                rel = relevant_ids[q]
                n_rel += len(rel)
                n_all += n
                for name, pipe in pipes.items():
                    out = pipe.run({"retriever": retriever_input(q, n),
                                    "ranker": {"query": queries[q]}},
                                   include_outputs_from={"retriever"})
                    ranked = [d.id for d in out["retriever"]["documents"]]
                    kept = out["ranker"]["documents"]
                    assert len(ranked) == n
                    if name.startswith("ConformalRanker, 1 - cos"):
                        for d in kept:
                            max_diff = max(max_diff, abs(d.score - d.meta["ragsieve_original_score"]))
                    kept_rel[name] += sum(d.id in rel for d in kept)
                    kept_all[name] += len(kept)
                hits = np.array([s in rel for s in ranked], dtype=float)
                for k in range(1, max_k + 1):
                    topk_rel[k] += hits[:k].sum()
                    topk_all[k] += min(k, n)
                if topk_checked < 5:  # the prefix is what a real top_k=k run returns
                    real = Pipeline()
                    real.add_component("retriever", InMemoryEmbeddingRetriever(document_store=store))
                    got = real.run({"retriever": retriever_input(q, 3)})["retriever"]["documents"]
                    assert [d.id for d in got] == ranked[:3], "top_k prefix mismatch"
                    topk_checked += 1
            topk_cov = topk_rel / n_rel
            covs = []
            for name in pipes:
                cov = kept_rel[name] / n_rel
                covs.append(cov)
                add(name, cov, 1.0 - kept_all[name] / n_all)
                reached = topk_cov >= cov - 1e-12
                k_eq = int(np.argmax(reached)) if reached.any() else max_k
                k_equal.setdefault(name, []).append(k_eq)
            for k in TOP_K:
                add(f"retriever top_k={k}", float(topk_cov[k]), 1.0 - topk_all[k] / n_all)
            if split_no == 0:  # time the pipelines, interleaved, on test queries
                only = Pipeline()
                only.add_component("retriever", InMemoryEmbeddingRetriever(document_store=store))
                rng = np.random.default_rng(args.seed)
                chosen = rng.choice(test_q, size=min(args.timing_queries, test_q.size), replace=False)
                k_t = k_equal[next(iter(pipes))][0]
                for j, q in enumerate(chosen):
                    n = list_size[articles[q]]
                    runs = [(f"retriever top_k={k_t} (Haystack)",
                             lambda q=q, only=only, k_t=k_t: only.run(
                                 {"retriever": retriever_input(q, k_t)}))]
                    runs += [(f"retriever -> {name.split(' (')[0]}",
                              lambda q=q, n=n, pipe=pipe: pipe.run(
                                  {"retriever": retriever_input(q, n),
                                   "ranker": {"query": queries[q]}}))
                             for name, pipe in pipes.items()]
                    for name, fn in runs[j % 3:] + runs[: j % 3]:
                        t0 = time.perf_counter()
                        fn()
                        timing.setdefault(name, []).append(time.perf_counter() - t0)
            log(f"split {split_no + 1}/{len(splits)}: coverage "
                + ", ".join(f"{c:.3f}" for c in covs) + "; equal-coverage k "
                + ", ".join(str(v[-1]) for v in k_equal.values()))

    table = []
    for key, r in rows.items():
        c, c_sd = _mean_sd(r["coverage"])
        m, m_sd = _mean_sd(r["removal"])
        table.append({"method": key, "coverage_mean": c, "coverage_sd": c_sd,
                      "removal_mean": m, "removal_sd": m_sd})
    timing_rows = [{"pipeline": k, "ms_per_query_mean": 1e3 * float(np.mean(v)),
                    "ms_per_query_median": 1e3 * float(np.median(v))} for k, v in timing.items()]
    load_end = os.getloadavg()
    import haystack

    out: dict[str, Any] = {
        "dataset": "xquad-en", "n_queries": data.n_queries, "n_snippets": len(snippet_ids),
        "list_size_mean": len(pairs) / data.n_queries, "model": scorer.model_id,
        "haystack": getattr(haystack, "__version__", "?"), "alpha": args.alpha,
        "n_splits": len(splits), "loadavg_start": list(load_start), "loadavg_end": list(load_end),
        "equal_coverage_k": k_equal, "score_vs_retriever_max_abs_diff": max_diff,
        "top_k_prefix_checked_queries": topk_checked, "coverage": table,
        "timing": {"n_queries": min(map(len, timing.values())), "rows": timing_rows},
    }
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    print(f"XQuAD en, {scorer.model_id}, haystack-ai {out['haystack']}; load average "
          f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    print(f"sanity: |Document.score - retriever dot product| <= {max_diff:.2e}; top_k prefix "
          f"checked on {topk_checked} queries")
    print(f"\ncoverage and removal on the test topics, {len(splits)} topic-disjoint splits "
          "(mean ± sd); top_k reaching each ranker's coverage, per split:")
    for name, ks in k_equal.items():
        print(f"  {name}: {ks}")
    print(f"{'method':<60} {'coverage':>15} {'removed':>15}")
    for row in table:
        print(f"{row['method']:<60} {row['coverage_mean']:>7.3f} ± {row['coverage_sd']:.3f} "
              f"{row['removal_mean']:>7.3f} ± {row['removal_sd']:.3f}")
    print(f"\ntime per query ({out['timing']['n_queries']} test queries, interleaved, "
          "embeddings cached)")
    for row in timing_rows:
        print(f"{row['pipeline']:<60} mean {row['ms_per_query_mean']:.2f} ms, "
              f"median {row['ms_per_query_median']:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
