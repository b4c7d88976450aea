"""Benchmark the engines: pairs per second local vs Ray (1 and 2 workers), and memory.

Measured side by side in one run, each in a fresh process:

* **Throughput** of ``ragsieve score``: MiniLM ``1 - cos`` on ``--embed-pairs`` XQuAD-en
  pairs whose texts are made unique (so every pair costs one embedding; no cache on disk),
  and the ``field`` scorer on all 14,148 XQuAD-en pairs (reading, validating and writing
  only, so the engines' own overhead shows): the local engine (one process, torch on every
  core) against the Ray engine with 1 and 2 actors (1 CPU each). Each engine's wall time
  includes its start-up (Ray's runtime and the actors' model loads).
* **Driver memory**: the peak RSS (``VmHWM``, polled every 20 ms) of the ``ragsieve``
  process itself (for Ray: the driver, not its workers).
* **Calibration cost**: fitting the marginal and query-all calibrators on 1 and 10 million
  scored pairs in one process (a quantile: it does not need a cluster).
* **Memory against input size**: ``score --engine local`` with the ``field`` scorer over
  synthetic inputs of growing size (up to ``--max-pairs``, 5 million by default): the
  streaming engine's peak RSS stays flat, while reading the whole input into memory
  (``read_pairs`` + score, what every command did before the engines) grows with it (this
  baseline is measured up to ``--max-in-memory`` pairs).

Usage::

    python benchmarks/bench_scale.py [--max-pairs 5000000] [--max-in-memory 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RAGSIEVE = str(Path(sys.executable).parent / "ragsieve")
_MEASURE = r"""
import subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
peak = 0
while proc.poll() is None:  # VmHWM: this process's own peak RSS (not its children's)
    try:
        with open(f"/proc/{proc.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
    except OSError:
        pass
    time.sleep(0.02)
seconds = time.perf_counter() - t0
err = proc.stderr.read()
print(f"{proc.returncode} {seconds} {peak}")
sys.stderr.write(err[-3000:] if proc.returncode else "")
"""
_IN_MEMORY = r"""
import sys
from ragsieve.data import read_pairs
from ragsieve.scoring import resolve_scorer
pairs = read_pairs(sys.argv[1])
scores = resolve_scorer("field", field="bm25").score_pairs(pairs)
print(len(pairs), float(scores.sum()))
"""


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def measure(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` in a child process; its wall time and peak RSS (MiB)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True,
                         check=False)
    code, seconds, rss = out.stdout.split()
    if int(code) != 0:
        raise RuntimeError(f"{argv[:4]} failed: {out.stderr}")
    return {"seconds": round(float(seconds), 2), "peak_rss_mib": round(int(rss) / 1024, 1)}


def synthetic(path: Path, n_pairs: int, *, per_query: int = 10, seed: int = 0) -> int:
    """Write ``n_pairs`` unlabelled pairs with a ``bm25`` field (about 200 bytes a line)."""
    rng = random.Random(seed)
    words = ["the", "of", "and", "relevance", "snippet", "query", "retrieval", "context", "answer", "document"]
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n_pairs):
            q = i // per_query
            text = " ".join(rng.choice(words) for _ in range(16))
            handle.write(json.dumps({"query_id": f"q{q}", "query": f"question number {q}?",
                                     "snippet_id": f"d{i}", "text": text,
                                     "bm25": round(rng.random() * 20, 4)}) + "\n")
    return path.stat().st_size


def throughput(tmp: Path, embed_source: Path, n_embed: int, field_source: Path,
               n_field: int) -> list[dict[str, Any]]:
    rows = []
    configs = [("local", []), ("ray, 1 worker", ["--engine", "ray", "--workers", "1"]),
               ("ray, 2 workers", ["--engine", "ray", "--workers", "2"])]
    scorers = [("1 - cos (MiniLM)", embed_source, n_embed,
                ["--scorer", "embedding", "--no-cache", "--shard-bytes", "200000"]),
               ("field (I/O only)", field_source, n_field,
                ["--scorer", "field", "--score-field", "bm25", "--shard-bytes", "1000000"])]
    for scorer, source, n_pairs, scorer_args in scorers:
        for engine, engine_args in configs:
            out = tmp / f"out-{len(rows)}"
            result = measure([RAGSIEVE, "-q", "score", "--data", str(source), "--out", str(out),
                              *scorer_args, *engine_args])
            result.update(scorer=scorer, engine=engine, pairs=n_pairs,
                          pairs_per_second=round(n_pairs / result["seconds"], 1))
            rows.append(result)
            print(f"  {scorer:<18} {engine:<15} {n_pairs:>6} pairs {result['seconds']:>7.1f} s "
                  f"{result['pairs_per_second']:>9.1f} pairs/s  driver peak RSS "
                  f"{result['peak_rss_mib']:>7.1f} MiB", flush=True)
    return rows


def memory(tmp: Path, sizes: list[int], max_in_memory: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        source = tmp / f"synthetic-{n}.jsonl"
        size = synthetic(source, n)
        row: dict[str, Any] = {"pairs": n, "input_mib": round(size / 2**20, 1)}
        streamed = measure([RAGSIEVE, "-q", "score", "--data", str(source), "--out",
                            str(tmp / f"scores-{n}"), "--scorer", "field", "--score-field",
                            "bm25"])
        row["streaming"] = streamed
        if n <= max_in_memory:
            row["in_memory"] = measure([sys.executable, "-c", _IN_MEMORY, str(source)])
        rows.append(row)
        mem = row.get("in_memory", {}).get("peak_rss_mib")
        print(f"  {n:>9,} pairs ({row['input_mib']:>7.1f} MiB): streaming peak RSS "
              f"{streamed['peak_rss_mib']:>7.1f} MiB in {streamed['seconds']:>6.1f} s"
              + (f"; whole input in memory {mem:>7.1f} MiB" if mem else ""), flush=True)
        source.unlink()
        subprocess.run(["rm", "-rf", str(tmp / f"scores-{n}")], check=False)
    return rows


def calibration_cost(sizes: list[int]) -> list[dict[str, Any]]:
    """Seconds to calibrate (marginal and query-all modes) on n scored calibration pairs:
    calibration is a quantile of the calibration scores and runs on one machine."""
    import numpy as np

    from ragsieve.calibration import make_calibrator

    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        scores = rng.random(n)
        relevant = (rng.random(n) < 0.1).astype(int)
        query_ids = np.arange(n) // 10
        row: dict[str, Any] = {"pairs": n}
        for mode in ("marginal", "query-all"):
            calibrator = make_calibrator(mode, alpha=0.1)
            t0 = time.perf_counter()
            calibrator.fit(scores, relevant, query_ids=query_ids)
            row[f"{mode}_seconds"] = round(time.perf_counter() - t0, 3)
        rows.append(row)
        print(f"  {n:>10,} calibration pairs: marginal {row['marginal_seconds']:.3f} s, "
              f"query-all {row['query-all_seconds']:.3f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-pairs", type=int, default=5_000_000)
    parser.add_argument("--max-in-memory", type=int, default=1_000_000)
    parser.add_argument("--embed-pairs", type=int, default=4000,
                        help="pairs scored with MiniLM per engine (unique texts)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "platform": platform.platform()}}
    with tempfile.TemporaryDirectory(prefix="ragsieve-bench-scale-") as name:
        tmp = Path(name)
        if not args.skip_throughput:
            field_source = tmp / "xquad-en.jsonl"
            subprocess.run([RAGSIEVE, "-q", "export", "--data", "xquad-en", "--out",
                            str(field_source)], check=True, capture_output=True)
            records = [json.loads(line) for line in
                       field_source.read_text(encoding="utf-8").splitlines()]
            rng = random.Random(0)
            for record in records:  # bm25 stands in for an outside score (field scorer)
                record["bm25"] = round(rng.random() * 20, 4)
            write_jsonl(field_source, records)
            # every text made unique, so that each pair costs one embedding (XQuAD repeats
            # an article's snippets for each of its questions, which the cache would absorb)
            embed_source = tmp / "unique.jsonl"
            unique = [dict(r, text=f"{r['text']} [{i}]")
                      for i, r in enumerate(records[: args.embed_pairs])]
            write_jsonl(embed_source, unique)
            print(f"throughput ({os.cpu_count()} CPUs): MiniLM on {len(unique)} XQuAD-en pairs "
                  f"with unique texts; field on all {len(records)} pairs", flush=True)
            report["throughput"] = throughput(tmp, embed_source, len(unique), field_source,
                                              len(records))
        sizes = [s for s in (250_000, 500_000, 1_000_000, 2_000_000, 5_000_000)
                 if s <= args.max_pairs]
        print("peak memory of score --engine local against input size (field scorer):",
              flush=True)
        t0 = time.perf_counter()
        report["memory"] = memory(tmp, sizes, args.max_in_memory)
        report["memory_seconds"] = round(time.perf_counter() - t0, 1)
    print("calibration on one machine (what does not need to scale):", flush=True)
    report["calibration"] = calibration_cost([1_000_000, 10_000_000])
    if args.json:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
