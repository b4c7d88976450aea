"""The rerank API's cost, side by side in one run: ``/v1/rerank`` against ``/filter``, the
gateway against the reranker it calls, and the reranker calls a calibration costs.

Three measurements on XQuAD-en (a MiniLM ``1 - cos`` filter calibrated on the first 300
pairs, alpha 0.1, served by uvicorn on a free 127.0.0.1 port in this process):

1. **The API's overhead.** The same lists of ``--sizes`` documents (10 and 50; ``--distinct``
   lists each, embedded once before timing so that both routes read the same cache) sent
   ``--requests`` times from ``--clients`` clients to ``POST /filter`` and to
   ``POST /v1/rerank``, alternately per size: requests/s, p50 and p99 latency, and the
   ratio.
2. **The reranker calls of a calibration.** A stand-in reranker answers ``/v1/rerank`` for
   every document (ragsieve's own ``/all/v1/rerank`` of the filter above: relevance = the
   p-value of ``1 - cos``; or an outside reranker given with ``--reranker-url`` and
   ``--reranker-model``, e.g. infinity-emb). ``ConformalFilter(RerankScorer(...))`` is
   calibrated on 300 XQuAD-en pairs through it with an empty on-disk cache, then again
   with the same cache: seconds, requests and pairs sent each time (the marginal mode
   reads the relevant pairs' scores only, and a costly score skips the monitor's
   reference, so only the relevant pairs are sent).
3. **The gateway's added latency.** The rerank filter of step 2 served by a second app (the
   gateway, its reranker answers kept in memory only), and ``--gateway-requests`` fresh
   lists (distinct queries, none seen by the gateway, so every request calls the reranker)
   sent one client at a time to the reranker directly and then to the gateway, the
   reranker's embeddings warmed first: p50 / p99 of both and the difference (what the
   gateway adds: its parsing, the call, the cut).

Usage: ``python benchmarks/bench_rerank.py [--requests 200] [--clients 4] [--sizes 10,50]
[--distinct 20] [--gateway-requests 100] [--reranker-url URL --reranker-model NAME]
[--json]``
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import _serve, load_test

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _lists(pairs: list[Any], size: int, n: int, *, skip: int = 0) -> list[tuple[str, list[str]]]:
    """``n`` lists of ``size`` documents for ``n`` distinct held-out queries (from the
    ``skip``-th on): each query's own passages first, then other passages of the data set
    (seeded), so no (query, document) pair repeats across lists."""
    rng = np.random.default_rng(size + skip)
    texts = list(dict.fromkeys(p.text for p in pairs))
    by_query: dict[str, list[str]] = {}
    for p in pairs:
        by_query.setdefault(p.query, []).append(p.text)
    queries = list(by_query)[skip: skip + n]
    out = []
    for q in queries:
        own = list(dict.fromkeys(by_query[q]))[:size]
        others = [texts[i] for i in rng.permutation(len(texts)) if texts[i] not in own]
        out.append((q, own + others[: size - len(own)]))
    return out


def _sequential(url: str, bodies: list[dict[str, Any]], n: int) -> dict[str, float]:
    """p50 / p99 of ``n`` requests sent one after the other."""
    import httpx

    lat = []
    with httpx.Client(timeout=120) as client:
        for i in range(n):
            t0 = time.perf_counter()
            client.post(url, json=bodies[i % len(bodies)]).raise_for_status()
            lat.append(time.perf_counter() - t0)
    arr = np.array(lat)
    return {"p50_ms": round(float(np.percentile(arr, 50)) * 1e3, 1),
            "p99_ms": round(float(np.percentile(arr, 99)) * 1e3, 1)}


def _api_overhead(base: str, flt: Any, test: list[Any], args: argparse.Namespace
                  ) -> list[dict[str, Any]]:
    rows = []
    for size in args.sizes:
        lists = _lists(test, size, args.distinct)
        for query, docs in lists:  # both routes then read the same cached vectors
            flt.filter(query, docs)
        filter_body = [{"query": q, "snippets": d} for q, d in lists]
        rerank_body = [{"model": "ragsieve", "query": q, "documents": d} for q, d in lists]
        for route, bodies in (("/filter", filter_body), ("/v1/rerank", rerank_body)):
            row = {"size": size, "route": route,
                   **load_test(base + route, bodies, args.requests, args.clients)}
            rows.append(row)
    return rows


def _calibration_calls(reranker: str, model: str, pairs: list[Any], cache: Path,
                       out: Path) -> list[dict[str, Any]]:
    from ragsieve import ConformalFilter
    from ragsieve.scoring import RerankScorer

    rows = []
    for run in ("first", "again"):
        scorer = RerankScorer(url=reranker, model=model, cache=str(cache))
        t0 = time.perf_counter()
        flt = ConformalFilter(scorer, alpha=0.1).calibrate(pairs, monitor=False)
        seconds = time.perf_counter() - t0
        usage = scorer.usage
        rows.append({"run": run, "pairs": len(pairs), "seconds": round(seconds, 2),
                     "requests": int(usage["n_requests"]),
                     "pairs_sent": int(usage["n_pairs_sent"]),
                     "cache_hits": int(usage["n_cache_hits"]),
                     "threshold": round(float(flt.threshold), 4)})
        if run == "first":
            flt.save(out)
        scorer.close()
    return rows


def _gateway(reranker: str, artifact: Path, test: list[Any],
             args: argparse.Namespace) -> list[dict[str, Any]]:
    from ragsieve.server import create_app

    app = create_app(artifact, scorer_options={"url": reranker, "cache": False}, warmup=False)
    rows = []
    with _serve(app) as gateway:
        for size in args.sizes:
            # fresh lists: the gateway's scorer has seen none of them (no answer cached), so
            # every gateway request calls the reranker; the reranker's embeddings are warmed
            # first, so both timed passes read the same cached vectors
            lists = _lists(test, size, args.gateway_requests, skip=200 + size)
            bodies = [{"model": "ragsieve", "query": q, "documents": d} for q, d in lists]
            _sequential(reranker, bodies, len(bodies))
            direct = _sequential(reranker, bodies, len(bodies))
            via = _sequential(gateway + "/v1/rerank", bodies, len(bodies))
            rows.append({"size": size, "reranker_p50_ms": direct["p50_ms"],
                         "reranker_p99_ms": direct["p99_ms"], "gateway_p50_ms": via["p50_ms"],
                         "gateway_p99_ms": via["p99_ms"],
                         "added_p50_ms": round(via["p50_ms"] - direct["p50_ms"], 1)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sizes", default="10,50", help="documents per list, comma-separated")
    ap.add_argument("--distinct", type=int, default=20, help="distinct lists per size")
    ap.add_argument("--gateway-requests", type=int, default=100,
                    help="sequential requests per size to the reranker and to the gateway")
    ap.add_argument("--reranker-url", default=None,
                    help="an outside reranker's /v1/rerank URL (default: ragsieve's own "
                         "/all/v1/rerank of the 1 - cos filter)")
    ap.add_argument("--reranker-model", default="ragsieve-stand-in")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir())
                                               / "ragsieve-bench-cache"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer
    from ragsieve.server import create_app

    pairs = load_xquad("en")
    test = pairs[300:]
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "filter.json"
        # no monitor: the benchmark's lists are slices of the data set, not retrieved lists
        ConformalFilter(EmbeddingScorer(cache_dir=args.cache_dir), alpha=0.1).calibrate(
            pairs[:300], monitor=False).save(path)
        app = create_app(path, scorer_options={"cache_dir": args.cache_dir})
        with _serve(app) as base:
            api = _api_overhead(base, app.state.filter, test, args)
            reranker = args.reranker_url or base + "/all/v1/rerank"
            calibration = _calibration_calls(reranker, args.reranker_model, pairs[:300],
                                             Path(tmp) / "rerank-cache.sqlite",
                                             Path(tmp) / "rerank-filter.json")
            gateway = _gateway(reranker, Path(tmp) / "rerank-filter.json", test, args)
    out = {"load_start": round(load_start, 2), "load_end": round(os.getloadavg()[0], 2),
           "clients": args.clients, "requests": args.requests, "api": api,
           "calibration": calibration, "gateway": gateway,
           "reranker": "outside: " + args.reranker_url if args.reranker_url
           else "ragsieve /all/v1/rerank of a 1 - cos filter"}
    if args.json:
        print(json.dumps(out))
        return
    _print(out)


def _print(out: dict[str, Any]) -> None:
    print(f"load {out['load_start']} -> {out['load_end']}; {out['requests']} requests from "
          f"{out['clients']} clients per row")
    print("size  route        req/s   p50 ms  p99 ms")
    by = {(r["size"], r["route"]): r for r in out["api"]}
    for (size, route), r in by.items():
        print(f"{size:>4}  {route:<11} {r['requests_per_s']:>6} {r['p50_ms']:>8} "
              f"{r['p99_ms']:>7}")
        if route == "/v1/rerank":
            f = by[(size, "/filter")]
            print(f"      rerank / filter: p50 x{r['p50_ms'] / f['p50_ms']:.2f}, "
                  f"throughput x{r['requests_per_s'] / f['requests_per_s']:.2f}")
    print(f"calibration through the reranker ({out['reranker']}):")
    for r in out["calibration"]:
        print(f"  {r['run']:<6} {r['pairs']} pairs: {r['seconds']} s, {r['requests']} requests, "
              f"{r['pairs_sent']} pairs sent, {r['cache_hits']} cache hits")
    print("gateway (one client): reranker p50/p99 -> gateway p50/p99 (added p50)")
    for r in out["gateway"]:
        print(f"  {r['size']:>3} docs: {r['reranker_p50_ms']}/{r['reranker_p99_ms']} ms -> "
              f"{r['gateway_p50_ms']}/{r['gateway_p99_ms']} ms (+{r['added_p50_ms']} ms)")


if __name__ == "__main__":
    main()
