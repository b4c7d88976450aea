"""Bounded loopback load on the HTTP service: requests/s and p50/p99 latency.

Calibrates a filter on 300 XQuAD-en pairs (embedding scorer, cached on disk), serves
it with uvicorn on a free 127.0.0.1 port in a background thread and sends
``--requests`` calls from ``--clients`` concurrent clients to each endpoint, side by side
in one run:

* ``POST /filter`` with ``--snippets`` XQuAD snippets per request. Requests cycle over
  ``--distinct`` (query, snippets) sets; ``--warm`` embeds them all once before timing
  (cached embeddings: measures the server + filter overhead), otherwise the first pass
  pays for embedding.
* ``POST /query`` (``k = --k``) against a LanceDB index of the 48 XQuAD English articles
  built in a temporary directory: every request embeds its question once, searches the
  stored vectors and filters them (nothing else is embedded).

Usage: ``python benchmarks/bench_server.py [--requests 200] [--clients 4] [--snippets 10]
[--k 20] [--endpoints filter,query] [--warm] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextmanager
def _serve(app: Any) -> Iterator[str]:
    """uvicorn in a background thread on a free loopback port; yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _load(url: str, payloads: list[dict[str, Any]], n_requests: int, n_clients: int) -> dict[str, float]:
    """Send ``n_requests`` POSTs cycling over ``payloads`` from ``n_clients`` threads."""
    import httpx

    clients = [httpx.Client(timeout=120) for _ in range(n_clients)]

    def call(i: int) -> float:
        t0 = time.perf_counter()
        r = clients[i % n_clients].post(url, json=payloads[i % len(payloads)])
        r.raise_for_status()
        return time.perf_counter() - t0

    try:
        t_start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n_clients) as pool:
            lat = np.array(list(pool.map(call, range(n_requests))))
        wall = time.perf_counter() - t_start
    finally:
        for c in clients:
            c.close()
    return {
        "requests_per_s": round(n_requests / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 1),
        "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--snippets", type=int, default=10)
    ap.add_argument("--k", type=int, default=20, help="hits retrieved per /query request")
    ap.add_argument("--distinct", type=int, default=50, help="distinct request payloads")
    ap.add_argument("--endpoints", default="filter,query", help="comma-separated: filter, query")
    ap.add_argument("--warm", action="store_true", help="embed all /filter payloads before timing")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "ragsieve-bench-cache"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not endpoints or set(endpoints) - {"filter", "query"}:
        ap.error(f"--endpoints == {args.endpoints!r}; expected a comma-separated subset of filter,query.")

    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.data.xquad import xquad_file
    from ragsieve.scoring import EmbeddingScorer
    from ragsieve.server import create_app
    from ragsieve.store import SnippetIndex

    pairs = load_xquad("en")
    test = pairs[300:]
    questions = list(dict.fromkeys(p.query for p in test))[: args.distinct]
    load_start = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "filter.json"
        ConformalFilter(EmbeddingScorer(cache_dir=args.cache_dir), alpha=0.2).calibrate(pairs[:300]).save(path)
        index_path = None
        if "query" in endpoints:
            docs = Path(tmp) / "docs"
            docs.mkdir()
            raw = json.loads(xquad_file("en").read_text(encoding="utf-8"))
            for article in raw["data"]:
                text = "\n\n".join(p["context"] for p in article["paragraphs"])
                (docs / f"{article['title']}.txt").write_text(text + "\n", encoding="utf-8")
            index_path = Path(tmp) / "idx"
            SnippetIndex.open(index_path).index_directory(docs)
        app = create_app(path, scorer_options={"cache_dir": args.cache_dir}, index_path=index_path)
        with _serve(app) as base:
            if "filter" in endpoints:
                payloads = [
                    {"query": test[i * 13].query,
                     "snippets": [p.text for p in test[i * 13 : i * 13 + args.snippets]]}
                    for i in range(args.distinct)
                ]
                if args.warm:
                    for p in payloads:
                        app.state.filter.filter(p["query"], p["snippets"])
                rows.append({"endpoint": "/filter", "per_request": f"{args.snippets} snippets",
                             "warm_cache": args.warm,
                             **_load(base + "/filter", payloads, args.requests, args.clients)})
            if "query" in endpoints:
                payloads = [{"query": q, "k": args.k} for q in questions]
                rows.append({"endpoint": "/query", "per_request": f"k={args.k} of {app.state.index.count()}",
                             "warm_cache": False,
                             **_load(base + "/query", payloads, args.requests, args.clients)})
    out = {"requests": args.requests, "clients": args.clients, "distinct_payloads": args.distinct,
           "rows": rows, "load_avg_1m_start": round(load_start, 2),
           "load_avg_1m_end": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.requests} requests per endpoint, {args.clients} concurrent clients, "
          f"{args.distinct} distinct payloads; load average {out['load_avg_1m_start']} -> {out['load_avg_1m_end']}")
    print(f"{'endpoint':<9} {'per request':<16} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r['endpoint']:<9} {r['per_request']:<16} {r['requests_per_s']:>7} {r['p50_ms']:>8} "
              f"{r['p99_ms']:>8} {r['wall_s']:>7}")


if __name__ == "__main__":
    main()
