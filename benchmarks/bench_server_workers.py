"""Throughput of ``ragsieve serve --workers N``: requests/s and p50/p99 latency, N = 1 and 2.

Calibrates a filter on 300 XQuAD-en pairs (embedding scorer) and builds a LanceDB index
of the 48 XQuAD English articles in a temporary directory, then for each ``--workers``
value starts the real service as a child process (``python -m ragsieve.cli serve
--workers N``, its own embedding cache and state directory) and drives it from a
*separate* load-generator process (this script with ``--load``: httpx clients in
``--clients`` threads), side by side in one run:

* ``POST /filter`` with ``--snippets`` XQuAD snippets per request, cycling over
  ``--distinct`` payloads that were sent once before timing (embeddings cached on disk:
  measures the service, filter, served-score record and monitor, not the model);
* ``POST /query`` (``k = --k``) with a different question per request (never sent
  before to that service): every request embeds its question, searches the index and
  filters the hits.

Every worker loads its own model. The figures include the per-request work the service
does besides filtering (served-score record in SQLite, exchangeability monitor; with
several workers both are shared SQLite files).

Usage: ``python benchmarks/bench_server_workers.py [--workers 1,2] [--requests 2000]
[--query-requests 500] [--clients 8] [--snippets 10] [--k 20] [--endpoints filter,query]
[--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_server import load_test  # the same load generator, in its own process

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------- load generator
def _run_load_process(url: str, payloads: list[dict[str, Any]], n_requests: int,
                      n_clients: int, tmp: Path) -> dict[str, Any]:
    """Run :func:`bench_server.load_test` in a separate Python process (the load generator)."""
    spec = tmp / f"load-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"url": url, "payloads": payloads, "requests": n_requests,
                                "clients": n_clients}), encoding="utf-8")
    proc = subprocess.run([sys.executable, __file__, "--load", str(spec)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------- the served service
class _Service:
    """``ragsieve serve --workers N`` as a child process, ready when every worker started."""

    def __init__(self, artifact: Path, index: Path, workers: int, tmp: Path) -> None:
        self.port = _free_port()
        self.workers = workers
        self.log = tmp / f"serve-{workers}.log"
        cmd = [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(artifact),
               "--index", str(index), "--port", str(self.port), "--workers", str(workers),
               "--state-dir", str(tmp / f"state-{workers}"),
               "--cache-dir", str(tmp / f"cache-{workers}"), "--max-k", "50"]
        self._log_file = open(self.log, "w", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            if self.log.read_text().count("Application startup complete") >= self.workers:
                return
            time.sleep(0.5)
        raise RuntimeError(f"serve --workers {self.workers} not ready in {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


def _build(tmp: Path) -> tuple[Path, Path, list[Any]]:
    """The artifact, the index of the 48 XQuAD-en articles, and the test pairs."""
    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.data.xquad import xquad_file
    from ragsieve.scoring import EmbeddingScorer
    from ragsieve.store import SnippetIndex

    pairs = load_xquad("en")
    artifact = tmp / "filter.json"
    ConformalFilter(EmbeddingScorer(cache_dir=tmp / "build-cache"), alpha=0.2).calibrate(
        pairs[:300]).save(artifact)
    docs = tmp / "docs"
    docs.mkdir()
    raw = json.loads(xquad_file("en").read_text(encoding="utf-8"))
    for article in raw["data"]:
        text = "\n\n".join(p["context"] for p in article["paragraphs"])
        (docs / f"{article['title']}.txt").write_text(text + "\n", encoding="utf-8")
    index = tmp / "idx"
    SnippetIndex.open(index, create=True).index_directory(docs)
    return artifact, index, pairs[300:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--requests", type=int, default=2000, help="timed /filter requests")
    ap.add_argument("--query-requests", type=int, default=500,
                    help="timed /query requests (each a new question: at most 1190 / runs)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument("--snippets", type=int, default=10, help="snippets per /filter request")
    ap.add_argument("--k", type=int, default=20, help="hits per /query request")
    ap.add_argument("--distinct", type=int, default=50, help="distinct /filter payloads")
    ap.add_argument("--endpoints", default="filter,query")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--load", default=None, help=argparse.SUPPRESS)  # load-generator mode
    args = ap.parse_args()
    if args.load:
        spec = json.loads(Path(args.load).read_text(encoding="utf-8"))
        print(json.dumps(load_test(spec["url"], spec["payloads"], spec["requests"],
                                   spec["clients"], timeout=300)))
        return
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not counts or min(counts) < 1 or not endpoints or set(endpoints) - {"filter", "query"}:
        ap.error("--workers takes integers >= 1; --endpoints a subset of filter,query.")
    rows: list[dict[str, Any]] = []
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        artifact, index, test = _build(tmp)
        filter_payloads = [
            {"query": test[i * 13].query,
             "snippets": [p.text for p in test[i * 13: i * 13 + args.snippets]]}
            for i in range(args.distinct)
        ]
        questions = list(dict.fromkeys(p.query for p in test))
        need = args.query_requests * len(counts)
        if "query" in endpoints and len(questions) < need:
            ap.error(f"{len(questions)} distinct questions; --query-requests x runs needs {need}.")
        for run, workers in enumerate(counts):
            service = _Service(artifact, index, workers, tmp)
            try:
                service.wait_ready()
                if "filter" in endpoints:
                    _run_load_process(service.url + "/filter", filter_payloads,
                                      len(filter_payloads), 1, tmp)  # embeds them once
                    rows.append({"workers": workers, "endpoint": "/filter",
                                 "per_request": f"{args.snippets} snippets, cached",
                                 **_run_load_process(service.url + "/filter", filter_payloads,
                                                     args.requests, args.clients, tmp)})
                if "query" in endpoints:
                    n = args.query_requests
                    payloads = [{"query": q, "k": args.k} for q in questions[run * n:(run + 1) * n]]
                    rows.append({"workers": workers, "endpoint": "/query",
                                 "per_request": f"k={args.k}, new question",
                                 **_run_load_process(service.url + "/query", payloads, n,
                                                     args.clients, tmp)})
            finally:
                service.stop()
    out = {"requests": args.requests, "query_requests": args.query_requests,
           "clients": args.clients, "cpus": os.cpu_count(),
           "rows": rows, "load_avg_1m_start": round(load_start, 2),
           "load_avg_1m_end": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.requests} /filter and {args.query_requests} /query timed requests per worker "
          f"count, {args.clients} concurrent clients in a separate process, {out['cpus']} CPUs; "
          "load average "
          f"{out['load_avg_1m_start']} -> {out['load_avg_1m_end']}")
    header = ("workers", "endpoint", "per request", "req/s", "p50 ms", "p99 ms")
    print("{:>7} {:<9} {:<24} {:>7} {:>8} {:>8}".format(*header))
    for r in sorted(rows, key=lambda r: (r["endpoint"], r["workers"])):
        print(f"{r['workers']:>7} {r['endpoint']:<9} {r['per_request']:<24} "
              f"{r['requests_per_s']:>7} {r['p50_ms']:>8} {r['p99_ms']:>8}")


if __name__ == "__main__":
    main()
