"""What a first run costs on this machine: model load and cold embedding rate per bundled
model, and a cold ``ragsieve calibrate`` against a warm one, side by side in one run.

Each model is measured in a fresh Python process (imports and weights from disk, nothing
cached), on ``--texts`` XQuAD-en snippets with an empty embedding cache: the seconds to the
first vector (import + load + one text) and the texts per second after it. Then ``ragsieve
calibrate --data xquad-en --scorer embedding`` runs twice with one fresh cache directory:
cold (every text embedded) and warm (every vector cached). The load average at the start
is printed: a loaded machine reads slower. MiniLM is loaded twice more with a fresh
``RAGSIEVE_CACHE`` holding only its ONNX graph: while its tokenizer is loaded by
``transformers`` and saved beside the graph (the first load on a machine), and once saved
(``tokenizers`` alone, every later load).

The retrieve -> calibrate path (``--part retrieve``): XQuAD-en exported as documents and
labelled queries (``ragsieve export``), indexed (``ragsieve index``), retrieved
(``ragsieve retrieve -k``), then ``ragsieve calibrate`` on those pairs, each run with a
fresh cache (``RAGSIEVE_CACHE`` a new directory holding only the model's one-time ONNX
export, which the models part measures): with the index present (the snippet
vectors are taken from it, the model embeds the queries) and with the index moved away
(every snippet embedded again), for each ``--scorer`` given; the ratio present / gone; and
once more on a copy of ``retrieve``'s cache, which holds the queries' vectors (a user who
keeps one ``RAGSIEVE_CACHE``: nothing is embedded again).

Usage::

    python benchmarks/bench_first_run.py [--texts 200] [--e5-texts 30] [--json out.json]
    python benchmarks/bench_first_run.py --part retrieve [--k 20] [--scorers auto embedding]
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

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from ragsieve.data import load_dataset
from ragsieve.scoring import EmbeddingScorer
texts = list(dict.fromkeys(p.text for p in load_dataset("xquad-en")))[: int(sys.argv[2])]
scorer = EmbeddingScorer(model=sys.argv[1], cache_dir=sys.argv[3])
t1 = time.perf_counter()
scorer.score_batch("Who?", texts[:1])
t2 = time.perf_counter()
scorer.score_batch("Who?", texts[1:])
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_vector_s": t2 - t0,
                  "texts_per_s": (len(texts) - 1) / (t3 - t2), "texts": len(texts)}))
"""


def model_costs(model: str, n_texts: int) -> dict[str, Any]:
    """Load and cold embedding rate of ``model`` in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", _CHILD, model, str(n_texts), cache],
                             check=True, capture_output=True, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def minilm_load_before_and_after_tokenizer_saved(n_texts: int) -> dict[str, Any]:
    """MiniLM's load in a fresh process twice, with one fresh ``RAGSIEVE_CACHE`` holding only
    its exported ONNX graph: first the tokenizer is loaded through ``transformers`` and saved
    beside the graph (as every load did before it was saved), then it is run by
    ``tokenizers`` alone (every later load)."""
    from ragsieve.embeddings.onnx import onnx_path

    graph = onnx_path("all-MiniLM-L6-v2")
    if not graph.is_file():  # export it once (the models part measures that cost)
        model_costs("all-MiniLM-L6-v2", 2)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "onnx").mkdir()
        shutil.copy(graph, Path(tmp) / "onnx" / graph.name)
        for name in ("tokenizer_saved_now", "tokenizer_saved"):
            done = subprocess.run([sys.executable, "-c", _CHILD, "all-MiniLM-L6-v2",
                                   str(n_texts), str(Path(tmp) / "emb")],
                                  check=True, capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "RAGSIEVE_CACHE": tmp})
            out[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def calibrate_seconds(cache: str, out: Path) -> float:
    """Wall seconds of ``ragsieve -q calibrate --data xquad-en --scorer embedding``."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ragsieve.cli", "-q", "calibrate", "--data", "xquad-en",
                    "--scorer", "embedding", "--cache-dir", cache, "--no-expected",
                    "--out", str(out)], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - t0


def _ragsieve(argv: list[str], cache: str) -> float:
    """Wall seconds of ``ragsieve -q ARGV`` in a fresh process with ``RAGSIEVE_CACHE=cache``."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ragsieve.cli", "-q", *argv],
                          check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "RAGSIEVE_CACHE": cache})
    if done.returncode:
        raise SystemExit(f"ragsieve {' '.join(argv)} failed: {done.stderr.strip()}")
    return time.perf_counter() - t0


def _fresh_cache(root: Path, name: str) -> str:
    """A ``RAGSIEVE_CACHE`` with no embedding and no reply cached, holding only the model's
    one-time ONNX export the ``index`` run made (done once per machine, measured by the
    models part), so both calibrations pay for embedding and nothing else."""
    cache = root / f"cache-{name}"
    exported = root / "cache-index" / "onnx"
    if exported.is_dir():
        shutil.copytree(exported, cache / "onnx")
    return str(cache)


def retrieve_then_calibrate(k: int, scorers: list[str]) -> dict[str, Any]:
    """``calibrate`` on ``retrieve`` pairs, fresh cache, index present vs moved away."""
    rows: dict[str, Any] = {"k": k}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        docs, queries, index, pairs = root / "docs", root / "q.jsonl", root / "idx", root / "p.jsonl"
        _ragsieve(["export", "--data", "xquad-en", "--docs", str(docs), "--queries",
                   str(queries)], tmp)
        rows["index_s"] = _ragsieve(["index", str(docs), "--index", str(index)],
                                    str(root / "cache-index"))
        rows["retrieve_s"] = _ragsieve(["retrieve", "--index", str(index), "--queries",
                                        str(queries), "-k", str(k), "--out", str(pairs)],
                                       str(root / "cache-retrieve"))
        rows["pairs"] = sum(1 for _ in pairs.open(encoding="utf-8"))
        print(f"indexed xquad-en in {rows['index_s']:.0f} s, retrieved {rows['pairs']} pairs "
              f"(k={k}) in {rows['retrieve_s']:.0f} s")
        for scorer in scorers:
            argv = ["calibrate", "--data", str(pairs), "--scorer", scorer, "--no-expected"]
            present = _ragsieve([*argv, "--out", str(root / f"{scorer}-a.json")],
                                _fresh_cache(root, f"{scorer}-present"))
            index.rename(root / "moved")
            try:
                gone = _ragsieve([*argv, "--out", str(root / f"{scorer}-b.json")],
                                 _fresh_cache(root, f"{scorer}-gone"))
            finally:
                (root / "moved").rename(index)
            shared = root / f"cache-{scorer}-shared"  # what retrieve left: the query vectors
            shutil.copytree(root / "cache-retrieve", shared)
            same = _ragsieve([*argv, "--out", str(root / f"{scorer}-c.json")], str(shared))
            rows[scorer] = {"present_s": present, "gone_s": gone, "ratio": present / gone,
                            "retrieve_cache_s": same}
            print(f"calibrate --scorer {scorer} on those pairs, fresh cache: index present "
                  f"{present:.1f} s, index gone {gone:.1f} s (ratio {present / gone:.2f}); "
                  f"on (a copy of) retrieve's cache, which holds the query vectors: {same:.1f} s")
    return rows


def main() -> None:
    from ragsieve.embeddings.languages import E5_ID, MINILM_ID, USE_ID

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=200, help="snippets per model (MiniLM, USE)")
    ap.add_argument("--e5-texts", type=int, default=30,
                    help="snippets for multilingual-e5-small (about 5 per second)")
    ap.add_argument("--part", choices=("all", "models", "retrieve"), default="all",
                    help="the models and calibrate (models), retrieve -> calibrate, or both")
    ap.add_argument("--k", type=int, default=20, help="hits per query of the retrieve path")
    ap.add_argument("--scorers", nargs="+", default=["auto", "embedding"],
                    help="--scorer of each calibrate of the retrieve path")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.2f} at the start")
    rows: dict[str, Any] = {"cores": os.cpu_count(), "load_average": load, "models": {}}
    if args.part in ("all", "retrieve"):
        rows["retrieve_calibrate"] = retrieve_then_calibrate(args.k, args.scorers)
    if args.part == "retrieve":
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    for model, n in ((MINILM_ID, args.texts), (USE_ID, args.texts), (E5_ID, args.e5_texts)):
        got = model_costs(model, n)
        rows["models"][model] = got
        print(f"{model}: first vector after {got['first_vector_s']:.1f} s (imports "
              f"{got['import_s']:.1f} s), then {got['texts_per_s']:.1f} snippets/s cold "
              f"({got['texts']} snippets)")
    loads = minilm_load_before_and_after_tokenizer_saved(args.texts)
    rows["minilm_tokenizer"] = loads
    print(f"{MINILM_ID}, ONNX graph exported already: first vector after "
          f"{loads['tokenizer_saved_now']['first_vector_s']:.1f} s while its tokenizer is loaded "
          f"by transformers and saved, {loads['tokenizer_saved']['first_vector_s']:.1f} s once "
          "saved (tokenizers alone)")
    with tempfile.TemporaryDirectory() as tmp:
        cold = calibrate_seconds(tmp, Path(tmp) / "f.json")
        warm = calibrate_seconds(tmp, Path(tmp) / "g.json")
    rows["calibrate_xquad_en"] = {"cold_s": cold, "warm_s": warm}
    print(f"ragsieve calibrate --data xquad-en --scorer embedding: cold {cold:.0f} s, "
          f"warm {warm:.0f} s ({cold / warm:.1f}x)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
