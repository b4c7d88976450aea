"""Brute-force top-k search: LanceDB (no ANN index, cosine) vs numpy dot products.

One run, side by side, on ``n`` random unit vectors of dimension ``dim``
(default 10,000 x 384, the MiniLM size). Reports the median over ``--repeats``
queries of the time for one top-k search (k=20), and checks that both return the same
ids. LanceDB time includes building the query and materialising the rows as Python
dicts without the vector column; numpy time is ``V @ q`` plus ``argpartition``.

Usage::

    python benchmarks/bench_store.py [--n 10000] [--dim 384] [--k 20] [--repeats 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import lancedb
    import pyarrow as pa

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    queries = rng.standard_normal((args.repeats, args.dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    with tempfile.TemporaryDirectory() as tmp:
        db = lancedb.connect(tmp)
        t0 = time.perf_counter()
        table = db.create_table("bench", pa.table({
            "id": pa.array(np.arange(args.n)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), args.dim),
        }))
        build_s = time.perf_counter() - t0

        def lance_topk(q: np.ndarray) -> list[int]:
            rows = table.search(q).distance_type("cosine").select(["id", "_distance"]).limit(args.k).to_list()
            return [int(r["id"]) for r in rows]

        def numpy_topk(q: np.ndarray) -> list[int]:
            sims = vecs @ q
            top = np.argpartition(-sims, args.k)[: args.k]
            return [int(i) for i in top[np.argsort(-sims[top], kind="stable")]]

        lance_topk(queries[0])  # warm-up (file open, caches)
        numpy_topk(queries[0])
        # Two separate loops (numpy first), so neither one's thread pool disturbs the other.
        times: dict[str, list[float]] = {"lancedb": [], "numpy": []}
        found: dict[str, list[set[int]]] = {"lancedb": [], "numpy": []}
        for name, fn in (("numpy", numpy_topk), ("lancedb", lance_topk)):
            for q in queries:
                t0 = time.perf_counter()
                ids = fn(q)
                times[name].append(time.perf_counter() - t0)
                found[name].append(set(ids))
        agree = sum(a == b for a, b in zip(found["lancedb"], found["numpy"], strict=True))

    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    out: dict[str, Any] = {
        "n": args.n, "dim": args.dim, "k": args.k, "repeats": args.repeats,
        "lancedb_version": lancedb.__version__, "numpy_version": np.__version__,
        "machine": platform.processor() or platform.machine(),
        "lancedb_build_s": round(build_s, 3),
        "median_ms": {k: round(v, 3) for k, v in med.items()},
        "ratio_lancedb_over_numpy": round(med["lancedb"] / med["numpy"], 1),
        "same_top_k": f"{agree}/{args.repeats}",
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"brute-force top-{args.k} over {args.n} x {args.dim} unit vectors "
          f"(median of {args.repeats} queries)")
    print(f"  lancedb {lancedb.__version__}: {med['lancedb']:8.3f} ms   (table build {build_s:.2f} s)")
    print(f"  numpy   {np.__version__}:  {med['numpy']:8.3f} ms")
    print(f"  ratio lancedb/numpy: {out['ratio_lancedb_over_numpy']}x; same top-k: {out['same_top_k']}")


if __name__ == "__main__":
    main()
