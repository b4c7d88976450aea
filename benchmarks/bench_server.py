"""Bounded loopback load on the HTTP service: requests/s and p50/p99 latency.

Calibrates a filter on 300 XQuAD-en pairs (embedding scorer, cached on disk), serves
it with uvicorn on a free 127.0.0.1 port in a background thread and sends
``--requests`` POST /filter calls from ``--clients`` concurrent clients, each with
``--snippets`` XQuAD snippets. Requests cycle over distinct (query, snippets) sets;
``--warm`` embeds them all once before timing (cached embeddings: measures the
server + filter overhead), otherwise the first pass pays for embedding.

Usage: ``python benchmarks/bench_server.py [--requests 200] [--clients 4] [--snippets 10] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--snippets", type=int, default=10)
    ap.add_argument("--distinct", type=int, default=50, help="distinct request payloads")
    ap.add_argument("--warm", action="store_true", help="embed all payloads before timing")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "ragsieve-bench-cache"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import httpx
    import uvicorn

    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer
    from ragsieve.server import create_app

    pairs = load_xquad("en")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "filter.json"
        ConformalFilter(EmbeddingScorer(cache_dir=args.cache_dir), alpha=0.2).calibrate(pairs[:300]).save(path)
        app = create_app(path, scorer_options={"cache_dir": args.cache_dir})
        test = pairs[300:]
        payloads = [
            {"query": test[i * 13].query,
             "snippets": [p.text for p in test[i * 13 : i * 13 + args.snippets]]}
            for i in range(args.distinct)
        ]
        if args.warm:
            flt = app.state.filter
            for p in payloads:
                flt.filter(p["query"], p["snippets"])

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)

        url = f"http://127.0.0.1:{port}/filter"
        clients = [httpx.Client(timeout=120) for _ in range(args.clients)]

        def call(i: int) -> float:
            t0 = time.perf_counter()
            r = clients[i % args.clients].post(url, json=payloads[i % args.distinct])
            r.raise_for_status()
            return time.perf_counter() - t0

        try:
            t_start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.clients) as pool:
                lat = np.array(list(pool.map(call, range(args.requests))))
            wall = time.perf_counter() - t_start
        finally:
            for c in clients:
                c.close()
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()

    out = {
        "requests": args.requests, "clients": args.clients, "snippets": args.snippets,
        "distinct_payloads": args.distinct, "warm_cache": args.warm,
        "requests_per_s": round(args.requests / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 1),
        "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 1),
        "wall_s": round(wall, 2), "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()
