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

``--long`` measures memory instead: the filter is served by ``run_server`` in a child
process (so only the server is measured), started with an empty embedding cache, which
gets ``--long-rounds`` (2) rounds of ``--long-clients`` (4) concurrent ``/filter``
requests, each with one snippet of ``--long-chars`` (~1 MB) characters built from XQuAD
paragraphs (no snippet sent twice), with ``max_pieces`` raised so that they are served
(a 1 MB snippet is ~2,400 pieces; the default budget refuses it with 413). Reported: the child's RSS before, its peak RSS during
each round (``VmHWM`` of ``/proc/PID/status``, reset before each round where the kernel
allows; psutil's RSS where ``/proc`` is missing) and after it, the latencies and what the
answers say (``n_cut``, kept spans). A second round that peaks no higher than the first
shows the memory is bounded per request, not growing with what was sent.

``--compare-default`` measures what the default score costs per request beside ``1 - cos``:
two filters calibrated on the same pairs (the first ``--compare-topics`` XQuAD-en topics,
alpha 0.2, seed 0): ``auto`` (the default; on these pairs it picks the list-free
``portable`` fused score) and ``embedding`` (MiniLM ``1 - cos``). Both are served at once,
each with an empty embedding cache, and get one untimed request (other texts: loads the
models), then the same ``/filter`` requests of ``--snippets`` snippets: one question of each other
topic (at most ``--distinct``) with its article's first paragraphs, each sent once (a
topic's questions share its paragraphs: no text is embedded before), one at a time,
alternating which server is asked first, so both run under the same load. Reported: p50 / p99 latency of each and
the default's over ``1 - cos``'s.

``--fairness`` measures how one client's small requests fare beside a large one. It
first measures the model's throughput in this process (pieces/s of fresh ~410-character
pieces, for the default MiniLM ``EmbeddingScorer`` and the fused ``best`` score: the
numbers behind ``DEFAULT_MAX_PIECES``), then serves the filter with ``run_server`` in a
child process, once per source tree given (``--before-src DIR``, e.g. a worktree of the
code before the fair queue, run with ``PYTHONPATH=DIR``; then this tree), and in each:
one client sends cached 3-snippet ``/filter`` requests back to back (alone, then while
``--fair-rounds`` large requests of ``--large-snippets`` (100) fresh 550-character
snippets (111 pieces of work, within the default budget of 128; the 2026-12-01 runs sent
120, then counted as 120 pieces) are in flight one after the other, then while one request of
``--huge-snippets`` fresh snippets (above it: 413 on the budgeted service) is sent).
Reported per phase: the small requests' count, p50, p99 and max latency, and the large
requests' status and latency.

``--fairness --unit sentence`` does the same for a *sentence-unit* artifact (the
sentence-in-context score over MiniLM, calibrated on eight XQuAD-en articles, as
``tests/test_sentence_serve.py`` makes one): the small client's requests (3 cached
snippets) alone, then while ``--hostile`` (4) concurrent hostile requests are in flight,
each one *sentence* of ``--hostile-chars`` (990,000) characters (``"a. "`` repeated, a
fresh tag every 50 repeats: no sentence end, nothing cached), sent together once per
round (``--fair-rounds``). ``--max-pieces N`` serves with that budget instead of the
default (e.g. one large enough to serve the hostile requests in steps).

Usage: ``python benchmarks/bench_server.py [--requests 200] [--clients 4] [--snippets 10]
[--k 20] [--endpoints filter,query] [--warm] [--json]``, ``python
benchmarks/bench_server.py --long [--long-chars 1000000] [--long-clients 4]
[--long-rounds 2] [--json]`` or ``python benchmarks/bench_server.py --fairness
[--before-src /work/orig/src] [--large-snippets 100] [--huge-snippets 1000]
[--fair-rounds 3] [--json]`` or ``python benchmarks/bench_server.py --compare-default
[--distinct 50] [--snippets 10] [--compare-topics 12] [--json]`` or ``python
benchmarks/bench_server.py --fairness --unit sentence
[--before-src DIR] [--hostile 4] [--hostile-chars 990000] [--max-pieces N] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
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

    # IPPROTO_TCP: asyncio then sets TCP_NODELAY (else keep-alive answers wait ~40 ms)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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


def load_test(
    url: str, payloads: list[dict[str, Any]], n_requests: int, n_clients: int, *,
    timeout: float = 120,
) -> dict[str, float]:
    """Send ``n_requests`` POSTs cycling over ``payloads`` from ``n_clients`` threads
    (also the load generator of ``bench_server_workers.py``)."""
    import httpx

    clients = [httpx.Client(timeout=timeout) for _ in range(n_clients)]

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


#: The child process of ``--long``: ``run_server`` on the artifact and port given.
_SERVER_CHILD = """
import sys
from ragsieve.server import run_server
run_server(sys.argv[1], port=int(sys.argv[2]), log_level="warning",
           max_body_bytes=int(sys.argv[3]), scorer_options={"cache_dir": sys.argv[4]},
           max_pieces=int(sys.argv[5]))
"""


#: The child process of ``--fairness``: ``run_server`` with the options given as JSON.
_FAIR_CHILD = """
import json, sys
from ragsieve.server import run_server
run_server(sys.argv[1], port=int(sys.argv[2]), log_level="warning", **json.loads(sys.argv[3]))
"""


def _memory_mb(pid: int) -> dict[str, float | None]:
    """Current and peak resident memory of process ``pid`` in MB (peak: Linux only)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)

        def kb(name: str) -> float | None:
            value = fields.get(name)
            return None if value is None else round(int(value.split()[0]) / 1024, 1)

        return {"rss_mb": kb("VmRSS"), "peak_rss_mb": kb("VmHWM")}
    import psutil  # no /proc: current RSS only

    return {"rss_mb": round(psutil.Process(pid).memory_info().rss / 2**20, 1), "peak_rss_mb": None}


def _reset_peak(pid: int) -> bool:
    """Reset the kernel's peak-RSS counter of ``pid`` (Linux >= 4.0); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _long_text(texts: list[str], n_chars: int, tag: str) -> str:
    """About ``n_chars`` characters of paragraphs, each numbered ``(tag.n)`` so no two
    requests (and no two repeats of a paragraph) share a piece: every piece is embedded."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        for t in texts:
            parts.append(f"({tag}.{len(parts)}) {t}")
            size += len(parts[-1]) + 1
            if size >= n_chars:
                break
    return " ".join(parts)[:n_chars]


def _run_long(args: argparse.Namespace) -> dict[str, Any]:
    """Serve the filter in a child process and send it concurrent ~1 MB snippets."""
    import httpx

    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer

    pairs = load_xquad("en")
    contexts = list(dict.fromkeys(p.text for p in pairs))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "filter.json"
        scorer = EmbeddingScorer(cache_dir=args.cache_dir)
        ConformalFilter(scorer, alpha=0.2).calibrate(pairs[:300]).save(path)
        port = _free_port()
        max_body = args.long_chars * 2 + 10_000
        cmd = [sys.executable, "-c", _SERVER_CHILD, str(path), str(port), str(max_body)]
        # a fresh embedding cache for the server: every piece is embedded, none read back
        child = subprocess.Popen([*cmd, str(Path(tmp) / "server-cache"),
                                  str(args.long_chars // 100)])  # above the pieces sent
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(base + "/healthz", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start (exit code {child.poll()})")
                time.sleep(0.5)
            before = _memory_mb(child.pid)
            rounds = [
                _long_round(base, child.pid, pairs, contexts, args, r)
                for r in range(args.long_rounds)
            ]
        finally:
            child.terminate()
            child.wait(timeout=60)
    return {
        "requests_per_round": args.long_clients,
        "chars_per_snippet": args.long_chars,
        "rss_before_mb": before["rss_mb"],
        "peak_rss_before_mb": before["peak_rss_mb"],
        "rounds": rounds,
    }


def _long_round(
    base: str, pid: int, pairs: list[Any], contexts: list[str], args: argparse.Namespace, r: int
) -> dict[str, Any]:
    """One round of concurrent long requests (snippets no earlier round sent)."""
    import httpx

    peak_reset = _reset_peak(pid)
    payloads = []
    for i in range(args.long_clients):
        j = r * args.long_clients + i  # a different text (and rotation) per request
        text = _long_text(contexts[37 * j :] + contexts[: 37 * j], args.long_chars, f"r{j}")
        payloads.append({"query": pairs[300 + 13 * j].query, "snippets": [text]})

    def call(payload: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        resp = httpx.post(base + "/filter", json=payload, timeout=3600)
        resp.raise_for_status()
        return time.perf_counter() - t0, resp.json()

    t_start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.long_clients) as pool:
        results = list(pool.map(call, payloads))
    wall = time.perf_counter() - t_start
    after = _memory_mb(pid)
    return {
        "body_bytes": len(json.dumps(payloads[0]).encode()),
        "peak_reset": peak_reset,
        "peak_rss_mb": after["peak_rss_mb"],
        "rss_after_mb": after["rss_mb"],
        "wall_s": round(wall, 1),
        "latency_s": [round(t, 1) for t, _ in results],
        "n_cut": [body.get("n_cut") for _, body in results],
        "kept_spans": [[len(s.get("spans", [])) for s in body["kept"]] for _, body in results],
    }


def _model_rate(pairs: list[Any], cache_dir: str, n: int = 128) -> list[dict[str, Any]]:
    """Pieces/s of fresh ~410-character pieces through ``filter`` (model warm), 3 repeats."""
    from ragsieve import ConformalFilter
    from ragsieve.chunking import chunk_text
    from ragsieve.scoring import EmbeddingScorer, resolve_scorer

    contexts = list(dict.fromkeys(p.text for p in pairs))
    text = " ".join(f"(r.{i}) {t}" for i, t in enumerate(contexts * 3))[:120_000]
    pieces = [s.text for s in chunk_text(text, "r", overlap=250)][:n]
    rows = []
    for name in ("embedding", "best"):
        scorer = EmbeddingScorer(cache_dir=cache_dir) if name == "embedding" else (
            resolve_scorer("best", cache_dir=cache_dir))
        flt = ConformalFilter(scorer, alpha=0.2).calibrate(pairs[::5][:400])
        rates = []
        for _ in range(3):
            tag = f"{name}-{time.time_ns()}"
            batch = [f"[{tag}.{i}] {p}" for i, p in enumerate(pieces)]
            t0 = time.perf_counter()
            flt.filter("Who won?", batch)
            rates.append(round(len(batch) / (time.perf_counter() - t0), 1))
        rows.append({"scorer": name, "pieces": len(pieces),
                     "mean_chars": round(float(np.mean([len(p) for p in pieces]))),
                     "pieces_per_s": rates})
    return rows


def _fresh_snippets(contexts: list[str], n: int, tag: str) -> list[str]:
    """``n`` snippets of 550 characters nobody sent before (one piece each)."""
    text = _long_text(contexts, 600 * n, tag)
    return [text[600 * i : 600 * i + 550] for i in range(n)]


def _small_while(base: str, small: dict[str, Any], large: list[dict[str, Any]], *,
                 together: int = 1) -> dict[str, Any]:
    """Small requests back to back from one client while ``large`` are sent, ``together``
    at a time (1: one after the other)."""
    import httpx

    done = threading.Event()
    big: list[tuple[int, float]] = []

    def post(body: dict[str, Any]) -> tuple[int, float]:
        t0 = time.perf_counter()
        r = httpx.post(base + "/filter", json=body, timeout=3600)
        return r.status_code, round(time.perf_counter() - t0, 2)

    def send_large() -> None:
        try:
            with ThreadPoolExecutor(max_workers=together) as pool:
                big.extend(pool.map(post, large))
        finally:
            done.set()

    lat: list[float] = []
    with httpx.Client(timeout=3600) as client:
        thread = threading.Thread(target=send_large)
        thread.start()
        while not done.is_set() or not lat:
            t0 = time.perf_counter()
            client.post(base + "/filter", json=small).raise_for_status()
            lat.append(time.perf_counter() - t0)
        thread.join()
    arr = np.asarray(lat) * 1e3
    return {"n_small": len(lat), "p50_ms": round(float(np.percentile(arr, 50)), 1),
            "p99_ms": round(float(np.percentile(arr, 99)), 1),
            "max_ms": round(float(arr.max()), 1),
            "large_status": [c for c, _ in big], "large_s": [t for _, t in big]}


def _hostile_sentence(n_chars: int, tag: str) -> str:
    """One *sentence* of about ``n_chars`` characters: ``"a. "`` repeated (no sentence end
    to the splitter: a full stop followed by a lowercase letter), a fresh ``t<tag>n<k>.``
    every 50 repeats so that no ~500-character piece of it is in any cache."""
    block = 3 * 49 + 16
    return "".join(f"t{tag}n{k}. " + "a. " * 49 for k in range(n_chars // block + 1)
                   )[:n_chars].rstrip()


def _fair_server(src: str | None, path: Path, cache_dir: str, pairs: list[Any],
                 contexts: list[str], args: argparse.Namespace, label: str,
                 tag: str) -> dict[str, Any]:
    """One server (code from ``src``, or this tree): small latency alone and beside large."""
    import httpx

    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    port = _free_port()
    options: dict[str, Any] = {"max_body_bytes": 16 * 2**20,
                               "scorer_options": {"cache_dir": cache_dir}}
    if args.max_pieces is not None:
        options["max_pieces"] = args.max_pieces
    child = subprocess.Popen([sys.executable, "-c", _FAIR_CHILD, str(path), str(port),
                              json.dumps(options)], env=env)
    base = f"http://127.0.0.1:{port}"
    small = {"query": pairs[400].query, "snippets": [p.text for p in pairs[400:403]]}
    try:
        _wait_healthy(base, child)
        httpx.post(base + "/filter", json=small, timeout=600).raise_for_status()  # cached now
        alone = load_test(base + "/filter", [small], 100, 1)
        if args.unit == "sentence":
            hostile = [{"query": pairs[350 + i].query,
                        "snippets": [_hostile_sentence(args.hostile_chars, f"{tag}r{r}h{i}")]}
                       for r in range(args.fair_rounds) for i in range(args.hostile)]
            return {"code": label, "alone": alone,
                    "hostile": _small_while(base, small, hostile, together=args.hostile)}
        within = [{"query": pairs[300 + r].query,
                   "snippets": _fresh_snippets(contexts, args.large_snippets, f"{tag}w{r}")}
                  for r in range(args.fair_rounds)]
        huge = [{"query": pairs[350].query,
                 "snippets": _fresh_snippets(contexts, args.huge_snippets, f"{tag}h")}]
        return {"code": label, "alone": alone, "within_budget": _small_while(base, small, within),
                "above_budget": _small_while(base, small, huge)}
    finally:
        child.terminate()
        child.wait(timeout=60)


def _fair_artifact(path: Path, pairs: list[Any], unit: str, cache_dir: str) -> Path:
    """The served filter: MiniLM 1 - cos on 300 pairs (unit snippet), or the
    sentence-in-context score calibrated on eight articles (unit sentence)."""
    from ragsieve import ConformalFilter
    from ragsieve.scoring import EmbeddingScorer, resolve_scorer

    scorer = EmbeddingScorer(cache_dir=cache_dir)
    if unit == "snippet":
        return ConformalFilter(scorer, alpha=0.2).calibrate(pairs[:300]).save(path)
    chosen = set(sorted({p.group for p in pairs})[:8])
    flt = ConformalFilter(resolve_scorer("best", base=scorer), alpha=0.2, unit="sentence")
    return flt.calibrate([p for p in pairs if p.group in chosen], seed=0).save(path)


def _wait_healthy(base: str, child: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if child.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start (exit code {child.poll()})")
        time.sleep(0.5)


def _run_fairness(args: argparse.Namespace) -> dict[str, Any]:
    """Model throughput, then small-request latency beside large ones, before and after."""
    from ragsieve.data import load_xquad

    pairs = load_xquad("en")
    contexts = list(dict.fromkeys(p.text for p in pairs))
    load_start = round(os.getloadavg()[0], 2)
    rate = _model_rate(pairs, args.cache_dir) if args.unit == "snippet" else []
    servers = []
    with tempfile.TemporaryDirectory() as tmp:
        path = _fair_artifact(Path(tmp) / "filter.json", pairs, args.unit, args.cache_dir)
        codes = ([("before", args.before_src)] if args.before_src else []) + [("after", None)]
        run = time.time_ns()  # in the snippets' tags: nothing is in the cache of earlier runs
        for label, src in codes:
            servers.append(_fair_server(src, path, args.cache_dir, pairs, contexts, args, label,
                                        f"{label}{run}"))
    return {"unit": args.unit, "model_rate": rate, "large_snippets": args.large_snippets,
            "huge_snippets": args.huge_snippets, "rounds": args.fair_rounds,
            "hostile": args.hostile, "hostile_chars": args.hostile_chars,
            "max_pieces": args.max_pieces, "load_avg_1m_start": load_start,
            "load_avg_1m_end": round(os.getloadavg()[0], 2), "servers": servers}


def _print_fairness(out: dict[str, Any]) -> None:
    for r in out["model_rate"]:
        print(f"model: {r['scorer']:<9} {r['pieces']} fresh pieces of ~{r['mean_chars']} "
              f"chars: {r['pieces_per_s']} pieces/s")
    load = f"load average {out['load_avg_1m_start']} -> {out['load_avg_1m_end']}"
    budget = "default" if out["max_pieces"] is None else out["max_pieces"]
    if out["unit"] == "sentence":
        print(f"unit sentence; small = cached 3-snippet /filter from one client; hostile = "
              f"{out['rounds']} round(s) of {out['hostile']} concurrent one-sentence requests "
              f"of {out['hostile_chars']:,} characters; max_pieces {budget}; {load}")
        phases: tuple[str, ...] = ("hostile",)
    else:
        print(f"small = cached 3-snippet /filter from one client; within = {out['rounds']} x "
              f"{out['large_snippets']} fresh snippets; above = 1 x {out['huge_snippets']}; "
              f"max_pieces {budget}; {load}")
        phases = ("within_budget", "above_budget")
    print("{:<7} {:<7} {:>7} {:>9} {:>9} {:>9}  {}".format(
        "code", "phase", "n", "p50 ms", "p99 ms", "max ms", "large requests (status, s)"))
    for srv in out["servers"]:
        a = srv["alone"]
        print(f"{srv['code']:<7} {'alone':<7} {100:>7} {a['p50_ms']:>9} {a['p99_ms']:>9} "
              f"{'':>9}")
        for phase in phases:
            r = srv[phase]
            print(f"{srv['code']:<7} {phase.split('_')[0]:<7} {r['n_small']:>7} {r['p50_ms']:>9} "
                  f"{r['p99_ms']:>9} {r['max_ms']:>9}  "
                  f"{list(zip(r['large_status'], r['large_s'], strict=True))}")


def _print_long(out: dict[str, Any]) -> None:
    print(
        f"{out['requests_per_round']} concurrent /filter requests per round, one snippet of "
        f"{out['chars_per_snippet']:,} characters each; server RSS before: "
        f"{out['rss_before_mb']} MB (peak since start {out['peak_rss_before_mb']} MB)"
    )
    for i, r in enumerate(out["rounds"], 1):
        peak = "peak during" if r["peak_reset"] else "peak since start"
        print(
            f"round {i}: {peak} {r['peak_rss_mb']} MB, {r['rss_after_mb']} MB after; wall "
            f"{r['wall_s']} s, latency {r['latency_s']} s; n_cut {r['n_cut']}; kept spans "
            f"per kept snippet {r['kept_spans']}"
        )


def _compare_default(args: argparse.Namespace) -> dict[str, Any]:
    """The default score (``auto``) and ``1 - cos`` side by side on the same ``/filter``
    requests, each served with a fresh embedding cache (see ``--compare-default``)."""
    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad
    from ragsieve.scoring import resolve_scorer
    from ragsieve.server import create_app

    pairs = load_xquad("en")
    topics = sorted({p.group for p in pairs})
    fit = [p for p in pairs if p.group in set(topics[:args.compare_topics])]
    rest = [p for p in pairs if p.group not in set(topics[:args.compare_topics])]
    lists: dict[str, dict[str, list[str]]] = {}  # topic -> query -> texts
    for p in rest:
        lists.setdefault(p.group, {}).setdefault(p.query, []).append(p.text)
    # one query per topic: a topic's queries share its paragraphs, so no text is sent twice
    by_query = [next((q, t[:args.snippets]) for q, t in queries.items())
                for queries in lists.values()]
    warmup, timed = by_query[0], by_query[1:args.distinct + 1]
    payloads = [{"query": q, "snippets": t} for q, t in timed]
    names = ("embedding", "auto")
    chosen, calibrate_s, latency = {}, {}, {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        bases = {}
        for name in names:
            path = Path(tmp) / f"{name}.json"
            flt = ConformalFilter(resolve_scorer(name, cache_dir=args.cache_dir), alpha=0.2)
            started = time.perf_counter()
            flt.calibrate(fit, seed=0).save(path)
            calibrate_s[name] = round(time.perf_counter() - started, 1)
            spec = flt.scorer_.spec()
            chosen[name] = str(spec.get("preset") or spec["scorer"])
            fresh = Path(tmp) / f"cache-{name}"  # nothing of the timed requests embedded yet
            bases[name] = stack.enter_context(
                _serve(create_app(path, scorer_options={"cache_dir": str(fresh)})))
        import httpx

        client = stack.enter_context(httpx.Client(timeout=600))
        for name in names:  # loads the models, not timed
            client.post(bases[name] + "/filter", json={"query": warmup[0], "snippets": warmup[1]}
                        ).raise_for_status()
        for i, payload in enumerate(payloads):  # both servers under the same load: alternate
            for name in (names if i % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                client.post(bases[name] + "/filter", json=payload).raise_for_status()
                latency[name].append(time.perf_counter() - t0)
    rows = [{"score": name, "chosen": chosen[name], "calibrate_s": calibrate_s[name],
             "p50_ms": round(float(np.percentile(latency[name], 50)) * 1e3, 1),
             "p99_ms": round(float(np.percentile(latency[name], 99)) * 1e3, 1),
             "wall_s": round(float(np.sum(latency[name])), 2)} for name in names]
    cos, auto = rows
    return {"requests": len(payloads), "snippets": args.snippets,
            "calibration_pairs": len(fit), "rows": rows,
            "p50_ratio": round(auto["p50_ms"] / cos["p50_ms"], 2),
            "p99_ratio": round(auto["p99_ms"] / cos["p99_ms"], 2)}


def _print_compare(out: dict[str, Any]) -> None:
    print(f"{out['requests']} /filter requests of {out['snippets']} snippets to each server, "
          "none embedded before (fresh cache per server), one at a time, alternating between "
          f"the servers; calibrated on {out['calibration_pairs']} pairs")
    print("{:<10} {:<9} {:>8} {:>8} {:>7}".format("score", "chosen", "p50 ms", "p99 ms", "sum s"))
    for r in out["rows"]:
        print(f"{r['score']:<10} {r['chosen']:<9} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['wall_s']:>7}")
    print(f"default / 1 - cos: p50 x{out['p50_ratio']}, p99 x{out['p99_ratio']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--snippets", type=int, default=10)
    ap.add_argument("--k", type=int, default=20, help="hits retrieved per /query request")
    ap.add_argument("--distinct", type=int, default=50, help="distinct request payloads")
    ap.add_argument("--endpoints", default="filter,query", help="comma-separated: filter, query")
    ap.add_argument("--warm", action="store_true", help="embed all /filter payloads before timing")
    ap.add_argument(
        "--cache-dir", default=str(Path(tempfile.gettempdir()) / "ragsieve-bench-cache")
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--long", action="store_true", help="measure the server's memory on ~1 MB snippets"
    )
    ap.add_argument("--long-chars", type=int, default=1_000_000, help="characters per snippet")
    ap.add_argument("--long-clients", type=int, default=4, help="concurrent long requests")
    ap.add_argument("--long-rounds", type=int, default=2, help="rounds of long requests")
    ap.add_argument("--fairness", action="store_true",
                    help="small-request latency beside large requests (before/after)")
    ap.add_argument("--before-src", default=None, metavar="DIR",
                    help="--fairness: also serve the code in DIR (put first on PYTHONPATH)")
    ap.add_argument("--large-snippets", type=int, default=100,
                    help="--fairness: fresh snippets per large request within the budget")
    ap.add_argument("--huge-snippets", type=int, default=1000,
                    help="--fairness: fresh snippets of the request above the budget")
    ap.add_argument("--fair-rounds", type=int, default=None,
                    help="--fairness: large requests within the budget, one after the other "
                         "(--unit sentence: rounds of --hostile requests; default 1)")
    ap.add_argument("--unit", choices=("snippet", "sentence"), default="snippet",
                    help="--fairness: the served artifact's unit; sentence: small requests "
                         "beside hostile long-sentence requests")
    ap.add_argument("--hostile", type=int, default=4,
                    help="--fairness --unit sentence: hostile requests in flight together")
    ap.add_argument("--hostile-chars", type=int, default=990_000,
                    help="--fairness --unit sentence: characters of each hostile sentence")
    ap.add_argument("--max-pieces", type=int, default=None,
                    help="--fairness: serve with this budget (default: the service's)")
    ap.add_argument("--compare-default", action="store_true",
                    help="the default score (auto) and 1 - cos on the same fresh /filter "
                         "requests (--distinct of --snippets snippets), p50/p99 and their ratio")
    ap.add_argument("--compare-topics", type=int, default=12,
                    help="--compare-default: XQuAD-en topics both filters are calibrated on")
    args = ap.parse_args()
    if args.compare_default:
        out_cmp = _compare_default(args)
        print(json.dumps(out_cmp)) if args.json else _print_compare(out_cmp)
        return
    if args.fair_rounds is None:
        args.fair_rounds = 3 if args.unit == "snippet" else 1
    if args.fairness:
        out_fair = _run_fairness(args)
        if args.json:
            print(json.dumps(out_fair))
        else:
            _print_fairness(out_fair)
        return
    if args.long:
        out_long = _run_long(args)
        if args.json:
            print(json.dumps(out_long))
        else:
            _print_long(out_long)
        return
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not endpoints or set(endpoints) - {"filter", "query"}:
        ap.error(
            f"--endpoints == {args.endpoints!r}; expected a comma-separated subset of filter,query."
        )

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
        ConformalFilter(EmbeddingScorer(cache_dir=args.cache_dir), alpha=0.2).calibrate(
            pairs[:300]
        ).save(path)
        index_path = None
        if "query" in endpoints:
            docs = Path(tmp) / "docs"
            docs.mkdir()
            raw = json.loads(xquad_file("en").read_text(encoding="utf-8"))
            for article in raw["data"]:
                text = "\n\n".join(p["context"] for p in article["paragraphs"])
                (docs / f"{article['title']}.txt").write_text(text + "\n", encoding="utf-8")
            index_path = Path(tmp) / "idx"
            SnippetIndex.open(index_path, create=True).index_directory(docs)
        app = create_app(path, scorer_options={"cache_dir": args.cache_dir}, index_path=index_path)
        with _serve(app) as base:
            if "filter" in endpoints:
                payloads = [
                    {
                        "query": test[i * 13].query,
                        "snippets": [p.text for p in test[i * 13 : i * 13 + args.snippets]],
                    }
                    for i in range(args.distinct)
                ]
                if args.warm:
                    for p in payloads:
                        app.state.filter.filter(p["query"], p["snippets"])
                rows.append(
                    {
                        "endpoint": "/filter",
                        "per_request": f"{args.snippets} snippets",
                        "warm_cache": args.warm,
                        **load_test(base + "/filter", payloads, args.requests, args.clients),
                    }
                )
            if "query" in endpoints:
                payloads = [{"query": q, "k": args.k} for q in questions]
                rows.append(
                    {
                        "endpoint": "/query",
                        "per_request": f"k={args.k} of {app.state.index.count()}",
                        "warm_cache": False,
                        **load_test(base + "/query", payloads, args.requests, args.clients),
                    }
                )
    out = {
        "requests": args.requests,
        "clients": args.clients,
        "distinct_payloads": args.distinct,
        "rows": rows,
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{args.requests} requests per endpoint, {args.clients} concurrent clients, "
        f"{args.distinct} distinct payloads; load average {out['load_avg_1m_start']} -> "
        f"{out['load_avg_1m_end']}"
    )
    header = ("endpoint", "per request", "req/s", "p50 ms", "p99 ms", "wall s")
    print("{:<9} {:<16} {:>7} {:>8} {:>8} {:>7}".format(*header))
    for r in rows:
        print(
            f"{r['endpoint']:<9} {r['per_request']:<16} {r['requests_per_s']:>7} {r['p50_ms']:>8} "
            f"{r['p99_ms']:>8} {r['wall_s']:>7}"
        )


if __name__ == "__main__":
    main()
