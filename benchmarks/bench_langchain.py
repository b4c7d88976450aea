"""ragsieve with stored embeddings against LangChain's ``EmbeddingsFilter`` (XQuAD en).

Both sides use the same model (all-MiniLM-L6-v2, one loaded instance) and the same
documents: each query's candidate list of XQuAD-en snippets (12.6 on average). LangChain's
``EmbeddingsFilter`` (``langchain_classic.retrievers.document_compressors``) embeds every
document with ``embed_documents`` and the query with ``embed_query`` on every call and
keeps the documents with cosine ``> similarity_threshold``; here ``k=None``, so only the
threshold decides. ragsieve embeds snippets once (as an index stores them) and per query
embeds the query, computes ``1 - cos`` and applies a calibrated threshold.

Measured in one run:

* **time per query**, interleaved query by query (the order of the methods rotates) on
  the same test queries after a warm-up: ragsieve with stored snippet embeddings (embed
  the query + ``EmbeddingScorer.scores_from_embeddings`` + ``ConformalFilter.filter_scores``),
  ragsieve's own LangChain compressor (``ConformalCompressor``, snippet embeddings in its
  cache, the query embedded on the call), and ``EmbeddingsFilter.compress_documents``
  with a LangChain ``Embeddings`` wrapper that calls the model directly (no cache);
* a **sanity check** that ``EmbeddingsFilter``'s similarity equals ``1 -`` ragsieve's
  score for the same snippets;
* **coverage at the same removal** over topic-disjoint splits (alpha 0.1, marginal):
  ragsieve's conformal filter on ``1 - cos`` and on the fused score (``--scorer best``,
  fitted on half of the calibration topics and conformalized on the other half), and
  ``EmbeddingsFilter`` run for real (``compress_documents`` decides what is kept) at the
  threshold that gives the same removal on the test snippets (picked in hindsight from
  the test similarities), and at hand-set thresholds from docs and tutorials. In this
  part the LangChain wrapper reads embeddings from ragsieve's embedding cache, so the
  20 splits take seconds; the timing part never uses that cache for LangChain.

Usage::

    python benchmarks/bench_langchain.py [--splits 20] [--timing-queries 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ragsieve.data import group_splits, load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.evaluation import ScoredData
from ragsieve.filter import ConformalFilter
from ragsieve.scoring import EmbeddingScorer, FusedScorer
from ragsieve.scoring.fusion import feature_matrix

with warnings.catch_warnings():  # langchain-community announces its sunset on import
    warnings.simplefilter("ignore", DeprecationWarning)
    import langchain_community  # noqa: F401
    from langchain_classic.retrievers.document_compressors import EmbeddingsFilter
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from ragsieve.integrations.langchain import ConformalCompressor

HAND_THRESHOLDS = (0.5, 0.6, 0.76)  # 0.76 is the example in LangChain's docs


class ArrayEmbeddings(Embeddings):
    """LangChain ``Embeddings`` over a function that embeds a batch of texts.

    Parameters
    ----------
    embed : callable
        ``list[str] -> (n, dim)`` array of unit rows, e.g. ``model.embed_batch`` (no
        cache) or ``EmbeddingCache.embed``.
    """

    def __init__(self, embed: Callable[[list[str]], np.ndarray]) -> None:
        self._embed = embed

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (one batch)."""
        return self._embed(list(texts)).tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self._embed([text])[0].tolist()  # type: ignore[no-any-return]


def _embeddings_filter(embeddings: Embeddings, threshold: float) -> EmbeddingsFilter:
    """``EmbeddingsFilter`` deciding by ``similarity_threshold`` alone (no top-k).

    ``EmbeddingsFilter(k=None, ...)`` is not enough: LangChain's ``pre_init`` replaces a
    None field by its default, so the constructor silently sets ``k=20`` (checked in
    langchain-classic 1.0.8); ``k`` is therefore cleared on the instance.
    """
    flt = EmbeddingsFilter(embeddings=embeddings, k=None, similarity_threshold=threshold)
    flt.k = None
    return flt


def _lc_kept(flt: EmbeddingsFilter, docs: Sequence[Document], query: str) -> list[int]:
    """Pair indices of the documents ``EmbeddingsFilter`` keeps."""
    return [int(d.metadata["pair"]) for d in flt.compress_documents(docs, query)]


def _matched_threshold(sim: np.ndarray, n_keep: int) -> float:
    """A similarity threshold ``t`` with ``#(sim > t)`` as close to ``n_keep`` as possible."""
    s = np.sort(sim)[::-1]
    if n_keep <= 0:
        return float(s[0])
    if n_keep >= s.size:
        return float(np.nextafter(s[-1], -np.inf))
    return float((s[n_keep - 1] + s[n_keep]) / 2.0)


def _cov_rem(kept: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    return {"coverage": float(kept[relevant].mean()), "removal": float(1.0 - kept.mean())}


def _mean_sd(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    vals = np.array([r[key] for r in rows], dtype=float)
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=20, help="topic-disjoint splits (coverage)")
    parser.add_argument("--timing-queries", type=int, default=40, help="test queries timed")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up queries (not timed)")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    pairs = load_dataset("xquad-en")
    scorer = EmbeddingScorer(cache_dir=cache_dir() / "embeddings")
    model = scorer.model
    import torch

    threads = torch.get_num_threads()
    scores = scorer.score_pairs(pairs)  # from the cache after the first run
    data = ScoredData.from_pairs(pairs, scores)
    qidx, relevant = data.query_index, data.relevant
    lists = [np.flatnonzero(qidx == q) for q in range(data.n_queries)]
    queries = [pairs[idx[0]].query for idx in lists]
    docs = [[Document(page_content=pairs[i].text, metadata={"pair": int(i)}) for i in idx]
            for idx in lists]
    texts = [[pairs[i].text for i in idx] for idx in lists]
    # the same splits as `ragsieve evaluate --splits N` (it splits on the topic indices)
    splits = group_splits(data.group_index.tolist(), n_splits=args.splits, seed=args.seed)

    # ------------------------------------------------------------ time per query
    cal0, test0 = splits[0]
    flt = ConformalFilter(scorer, alpha=args.alpha).calibrate([pairs[i] for i in cal0])
    tau = flt.threshold
    test_queries = np.unique(qidx[test0])
    rng = np.random.default_rng(args.seed)
    chosen = rng.choice(test_queries, size=args.warmup + args.timing_queries, replace=False)
    warm, timed = chosen[: args.warmup], chosen[args.warmup:]
    # "Indexing": snippet embeddings computed once, in ragsieve's in-memory cache.
    fresh = EmbeddingScorer(model)
    log(f"embedding the {sum(len(lists[q]) for q in chosen)} snippets of "
        f"{len(chosen)} queries once (the stored embeddings)...")
    stored = {int(q): fresh.cache.embed(texts[q]) for q in chosen}
    compressor = ConformalCompressor(filter=ConformalFilter(fresh, flt.calibrator_))
    lc_raw = _embeddings_filter(ArrayEmbeddings(model.embed_batch), 1.0 - tau)

    def run_ragsieve(q: int) -> list[int]:
        qvec = model.embed_batch([queries[q]])[0]
        s = EmbeddingScorer.scores_from_embeddings(qvec, stored[q])
        res = flt.filter_scores(queries[q], s, texts[q])
        return [int(lists[q][k.index]) for k in res.kept]

    def run_compressor(q: int) -> list[int]:
        return [int(d.metadata["pair"]) for d in compressor.compress_documents(docs[q], queries[q])]

    def run_langchain(q: int) -> list[int]:
        return _lc_kept(lc_raw, docs[q], queries[q])

    methods: dict[str, Callable[[int], list[int]]] = {
        "ragsieve (stored embeddings)": run_ragsieve,
        "ragsieve ConformalCompressor (cached snippet embeddings)": run_compressor,
        "LangChain EmbeddingsFilter (re-embeds)": run_langchain,
    }
    names = list(methods)
    # Sanity check and warm-up: EmbeddingsFilter keeping everything, its similarity
    # against 1 - ragsieve's score from the stored vectors.
    keep_all = _embeddings_filter(ArrayEmbeddings(model.embed_batch), -2.0)
    max_diff = 0.0
    for q in warm:
        q = int(q)
        for fn in methods.values():
            fn(q)
        all_docs = keep_all.compress_documents(docs[q], queries[q])
        lc_sim = np.array([d.state["query_similarity_score"] for d in all_docs])  # type: ignore[attr-defined]
        ours = 1.0 - EmbeddingScorer.scores_from_embeddings(model.embed_batch([queries[q]])[0], stored[q])
        max_diff = max(max_diff, float(np.max(np.abs(lc_sim - ours))))
    log(f"timing {len(timed)} queries, methods interleaved...")
    times: dict[str, list[float]] = {n: [] for n in names}
    same_kept = 0
    for j, q in enumerate(timed):
        q = int(q)
        kept: dict[str, list[int]] = {}
        for n in names[j % 3:] + names[: j % 3]:
            t0 = time.perf_counter()
            kept[n] = methods[n](q)
            times[n].append(time.perf_counter() - t0)
        same_kept += len({tuple(sorted(k)) for k in kept.values()}) == 1
    base = float(np.mean(times[names[0]]))
    timing_rows = [{
        "method": n,
        "ms_per_query_mean": 1e3 * float(np.mean(times[n])),
        "ms_per_query_median": 1e3 * float(np.median(times[n])),
        "ratio_to_ragsieve": float(np.mean(times[n])) / base,
        "median_per_query_ratio": float(np.median(np.array(times[n]) / np.array(times[names[0]]))),
    } for n in names]

    # ---------------------------------------------- coverage at the same removal
    log(f"coverage: {len(splits)} topic-disjoint splits...")
    lc_cached = ArrayEmbeddings(scorer.cache.embed)

    def lc_mask(test_q: np.ndarray, threshold: float) -> np.ndarray:
        ef = _embeddings_filter(lc_cached, threshold)
        kept = np.zeros(len(pairs), dtype=bool)
        for q in test_q:
            kept[_lc_kept(ef, docs[q], queries[q])] = True
        return kept

    def rs_mask(f: ConformalFilter, s: np.ndarray, test_q: np.ndarray) -> np.ndarray:
        kept = np.zeros(len(pairs), dtype=bool)
        for q in test_q:
            idx = lists[q]
            res = f.filter_scores(queries[q], s[idx], texts[q])
            kept[idx[[k.index for k in res.kept]]] = True
        return kept

    feats = feature_matrix(scores, qidx)
    cov: dict[str, list[dict[str, float]]] = {}

    def add(key: str, kept: np.ndarray, test: np.ndarray, **extra: float) -> dict[str, float]:
        row = {**_cov_rem(kept[test], relevant[test]), **extra}
        cov.setdefault(key, []).append(row)
        return row

    for split_no, (cal_idx, test_idx) in enumerate(splits):
        test_q = np.unique(qidx[test_idx])
        sim_test = 1.0 - scores[test_idx]
        # conformal on 1 - cos
        f_emb = ConformalFilter(scorer, alpha=args.alpha).calibrate([pairs[i] for i in cal_idx])
        r = add("ragsieve conformal, 1 - cos", rs_mask(f_emb, scores, test_q), test_idx,
                similarity_threshold=1.0 - f_emb.threshold)
        n_keep = round((1.0 - r["removal"]) * test_idx.size)
        t = _matched_threshold(sim_test, n_keep)
        add("EmbeddingsFilter at the same removal", lc_mask(test_q, t), test_idx,
            similarity_threshold=t)
        # fused score: fitted on a random half of the calibration topics (the same draw as
        # `ragsieve evaluate --scorer best`), conformalized on the other half
        topics = np.unique(data.group_index[cal_idx])
        frng = np.random.default_rng([args.seed, split_no])
        fit_topics = frng.permutation(topics)[: max(1, topics.size // 2)]
        in_fit = np.isin(data.group_index[cal_idx], fit_topics)
        fit_idx, conf_idx = cal_idx[in_fit], cal_idx[~in_fit]
        fused_scorer = FusedScorer.fit([pairs[i] for i in fit_idx], scorer, base_scores=scores[fit_idx])
        fused = fused_scorer.scores_from_features(feats)  # whole lists, as deployed
        # calibrate() scores the whole calibration lists of a list-dependent score
        f_fused = ConformalFilter(fused_scorer, alpha=args.alpha).calibrate([pairs[i] for i in conf_idx])
        r = add("ragsieve conformal, fused score (best)", rs_mask(f_fused, fused, test_q), test_idx)
        n_keep = round((1.0 - r["removal"]) * test_idx.size)
        t = _matched_threshold(sim_test, n_keep)
        add("EmbeddingsFilter at the fused score's removal", lc_mask(test_q, t), test_idx,
            similarity_threshold=t)
        for h in HAND_THRESHOLDS:
            add(f"EmbeddingsFilter threshold {h:g} (hand-set)", lc_mask(test_q, h), test_idx,
                similarity_threshold=h)

    coverage_rows: list[dict[str, Any]] = []
    for key, rows in cov.items():
        c, c_sd = _mean_sd(rows, "coverage")
        m, m_sd = _mean_sd(rows, "removal")
        row: dict[str, Any] = {"method": key, "coverage_mean": c, "coverage_sd": c_sd,
                               "removal_mean": m, "removal_sd": m_sd}
        if "similarity_threshold" in rows[0]:
            row["similarity_threshold_mean"], row["similarity_threshold_sd"] = _mean_sd(
                rows, "similarity_threshold")
        coverage_rows.append(row)
    load_end = os.getloadavg()
    out: dict[str, Any] = {
        "dataset": "xquad-en",
        "n_queries": data.n_queries,
        "n_pairs": len(pairs),
        "list_size_mean": len(pairs) / data.n_queries,
        "model": model.model_id,
        "torch_threads": threads,
        "loadavg_start": list(load_start),
        "loadavg_end": list(load_end),
        "alpha": args.alpha,
        "n_splits": len(splits),
        "timing": {
            "n_queries": len(timed),
            "n_snippets": int(sum(len(lists[int(q)]) for q in timed)),
            "warmup_queries": len(warm),
            "same_kept_all_methods": int(same_kept),
            "similarity_max_abs_diff": max_diff,
            "rows": timing_rows,
        },
        "coverage": coverage_rows,
    }
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    tm = out["timing"]
    print(f"XQuAD en, {model.model_id}, torch threads {threads}; load average "
          f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    print(f"sanity: EmbeddingsFilter similarity vs 1 - ragsieve score, max |diff| = "
          f"{max_diff:.2e} ({len(warm)} queries)")
    print(f"\ntime per query, {tm['n_queries']} test queries ({tm['n_snippets']} snippets, "
          f"{tm['n_snippets'] / tm['n_queries']:.1f} per query), interleaved; the same "
          f"snippets kept by all three on {same_kept}/{tm['n_queries']} queries")
    print(f"{'method':<58} {'mean ms':>9} {'median ms':>10} {'x (means)':>10} "
          f"{'x (median per query)':>21}")
    for row in timing_rows:
        print(f"{row['method']:<58} {row['ms_per_query_mean']:>9.2f} "
              f"{row['ms_per_query_median']:>10.2f} {row['ratio_to_ragsieve']:>10.2f} "
              f"{row['median_per_query_ratio']:>21.2f}")
    print(f"\ncoverage and removal on the test topics, alpha {args.alpha:g}, {len(splits)} "
          "topic-disjoint splits (mean ± sd)")
    print(f"{'method':<46} {'coverage':>15} {'removed':>15} {'cos threshold':>15}")
    for row in coverage_rows:
        thr = (f"{row['similarity_threshold_mean']:.3f} ± {row['similarity_threshold_sd']:.3f}"
               if "similarity_threshold_mean" in row else "-")
        print(f"{row['method']:<46} {row['coverage_mean']:>7.3f} ± {row['coverage_sd']:.3f} "
              f"{row['removal_mean']:>7.3f} ± {row['removal_sd']:.3f} {thr:>15}")
    if not math.isfinite(max_diff) or max_diff > 1e-4:
        print(f"WARNING: similarities differ by {max_diff:.2e}; the two sides do not use the "
              "same embeddings", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
