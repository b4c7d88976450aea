"""Reading a pair file with one very long line: the batch shard reader against the print path.

``filter --out`` / ``score`` / ``label`` read their input shard by shard
(:mod:`ragsieve.data.shards`: 16 MiB byte ranges, each query's list whole). A shard that
starts inside a long line finds the line before its first line to tell whether that line
continues a query of the shard before. Each file here holds 2,000 ordinary pairs (200
queries of 10, 4 kB each) and, in query 100, one pair whose text is ``--sizes`` MB (paragraphs of
prose, so the JSON line holds ``\\n`` escapes); ``query_id`` comes first on the line, as
``ragsieve export`` writes it, or last with ``--query-id-last``.

Every measurement runs in its own process (peak RSS is per process), stopped after
``--timeout`` seconds:

* ``print path`` -- :func:`ragsieve.data.read_pairs`, one pass over the file (what
  ``filter`` without ``--out`` reads);
* ``shards`` -- every shard of :func:`~ragsieve.data.shards.plan_shards` read with
  :func:`~ragsieve.data.shards.read_shard` (what the engines read), with the working
  tree's reader and, with ``--baseline REV``, the reader of git revision ``REV`` (loaded
  from ``git show REV:src/ragsieve/data/shards.py`` in place of the working tree's);
* ``filter --out`` (with ``--cli``) -- ``ragsieve filter --out`` end to end with a filter
  on an outside score (``--scorer field``: no model), for both readers.

Usage: ``python benchmarks/bench_shards.py [--sizes 16,32,64,200] [--baseline REV]
[--timeout 300] [--cli] [--query-id-last] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib.util, json, resource, subprocess, sys, time
what, path, rev, root = sys.argv[1:5]
if rev != "-":  # the reader of another revision in place of the working tree's
    import ragsieve.data
    source = subprocess.run(["git", "show", f"{rev}:src/ragsieve/data/shards.py"], cwd=root,
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("ragsieve.data.shards", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "ragsieve.data"
    sys.modules["ragsieve.data.shards"] = module
    exec(compile(source, f"{rev}:shards.py", "exec"), module.__dict__)
t0 = time.perf_counter()
if what == "print":
    from ragsieve.data import read_pairs
    n = len(read_pairs(path))
elif what == "shards":
    from ragsieve.data.shards import plan_shards, read_shard
    n = sum(1 for shard in plan_shards([path]) for _ in read_shard(shard))
else:
    from ragsieve.cli import main
    out, artifact = sys.argv[5:7]
    code = main(["-q", "filter", "--filter", artifact, "--data", path, "--out", out])
    assert code == 0, code
    n = None
print(json.dumps({"seconds": round(time.perf_counter() - t0, 2), "pairs": n,
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""

_PARAGRAPH = ("The river rises in the hills north of the town and runs south through the "
              "valley, where it is joined by two streams before it reaches the sea. ")


def _record(qid: int, sid: int, text: str, *, last: bool) -> str:
    rest = {"query": f"What is said about topic {qid}?", "snippet_id": f"s{qid}-{sid}",
            "text": text, "relevant": int(sid == 0), "score": round(0.1 * (sid % 10), 2)}
    record = {**rest, "query_id": f"q{qid}"} if last else {"query_id": f"q{qid}", **rest}
    return json.dumps(record, ensure_ascii=False)


def write_data(path: Path, mb: float, *, last: bool = False) -> int:
    """A pair file with one line of about ``mb`` MB; returns its size in bytes."""
    paragraph = (_PARAGRAPH * 6).strip() + "\n\n"
    long_text = paragraph * max(1, int(mb * 1e6 / len(paragraph)))
    short = _PARAGRAPH * 25  # 4 kB: 4 MB of pairs before the long line, which so crosses
    # the first shard boundary (16 MiB) for every size measured
    with open(path, "w", encoding="utf-8") as out:
        for q in range(200):
            for s in range(10):
                text = long_text if (q, s) == (100, 3) else f"Snippet {s} of topic {q}. {short}"
                out.write(_record(q, s, text, last=last) + "\n")
    return path.stat().st_size


def _artifact(path: Path) -> Path:
    from ragsieve import ConformalFilter, Pair
    from ragsieve.scoring import FieldScorer

    pairs = [Pair(f"c{q}", "Q?", f"c{q}-{s}", "t", relevant=int(s == 0),
                  meta={"score": 0.1 * s + 0.01 * (q % 7)}) for q in range(60) for s in range(6)]
    ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(pairs, monitor=False).save(path)
    return path


def _run(argv: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "stopped_after": timeout}
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _cell(row: dict[str, Any]) -> str:
    if row["seconds"] is None:
        return f"> {row['stopped_after']:.0f} s (stopped)"
    return f"{row['seconds']:.2f} s ({row['peak_rss_mb']} MB)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--sizes", default="16,32,64,200", help="long line sizes in MB")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also measure the shard reader of this git revision")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    ap.add_argument("--cli", action="store_true", help="also run `ragsieve filter --out`")
    ap.add_argument("--query-id-last", action="store_true",
                    help="write query_id as the last key of every line")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    readers = [("working tree", "-")] + ([(args.baseline, args.baseline)] if args.baseline else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        artifact = _artifact(Path(tmp) / "field.json") if args.cli else None
        for mb in (float(s) for s in args.sizes.split(",")):
            data = Path(tmp) / "pairs.jsonl"
            size = write_data(data, mb, last=args.query_id_last)
            row: dict[str, Any] = {"line_mb": mb, "file_bytes": size,
                                   "print": _run(["print", str(data), "-", str(ROOT)], args.timeout)}
            for name, rev in readers:
                row[f"shards {name}"] = _run(["shards", str(data), rev, str(ROOT)], args.timeout)
                if artifact is not None:
                    out = Path(tmp) / f"out-{rev}"
                    row[f"filter --out {name}"] = _run(
                        ["filter", str(data), rev, str(ROOT), str(out), str(artifact)],
                        args.timeout)
                    shutil.rmtree(out, ignore_errors=True)
            print(json.dumps(row), flush=True)
            rows.append(row)
            data.unlink()
    keys = [k for k in rows[0] if k not in ("line_mb", "file_bytes")]
    print("\n| long line | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for row in rows:
        print(f"| {row['line_mb']:g} MB | " + " | ".join(_cell(row[k]) for k in keys) + " |")
    print(f"\ncores: {os.cpu_count()}, load average at end: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
