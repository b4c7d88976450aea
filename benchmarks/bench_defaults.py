"""The default score against the previous default (``1 - cos``) on the shared XQuAD languages.

For every language, ``ragsieve evaluate --data xquad-XX --alpha 0.1 --mode marginal`` runs
twice on the same topic-disjoint splits (same seed) and the default model of the language:
once with no ``--scorer`` (``auto``: on the data sets' own lists the list-free portable fused
score) and once with ``--scorer embedding``. Printed: a markdown table of the marginal mode's coverage
and removal side by side (means over the splits), and which score ``auto`` chose.

Usage: ``python benchmarks/bench_defaults.py [--languages en,de,es,zh,el,ro] [--splits 20]
[--json out.json]``. Embeddings are cached in ``~/.cache/ragsieve/embeddings`` (env
``RAGSIEVE_CACHE``), so a rerun only fits and calibrates.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from typing import Any

from ragsieve.cli import main as cli_main


def _evaluate(language: str, scorer: str | None, splits: int, seed: int) -> dict[str, Any]:
    argv = ["-q", "evaluate", "--data", f"xquad-{language}", "--alpha", "0.1", "--mode",
            "marginal", "--splits", str(splits), "--seed", str(seed), "--json"]
    if scorer:
        argv += ["--scorer", scorer]
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    if code != 0:
        raise SystemExit(f"evaluate {language} {scorer or 'auto'} failed ({code}): {err.getvalue()}")
    report = json.loads(out.getvalue())
    row = next(r for r in report["results"]
               if r["method"] == "conformal" and r.get("mode") == "marginal")
    return {"coverage": row["coverage_mean"], "removal": row["removal_mean"],
            "choice": report.get("choice"), "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default="en,de,es,zh,el,ro")
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print("| language | model | default score (auto) | coverage auto | coverage 1 - cos "
          "| removal auto | removal 1 - cos |")
    print("|---|---|---|---|---|---|---|")
    for language in [x.strip() for x in args.languages.split(",") if x.strip()]:
        auto = _evaluate(language, None, args.splits, args.seed)
        cos = _evaluate(language, "embedding", args.splits, args.seed)
        choice = auto["choice"] or {}
        row = {"language": language, "model": choice.get("model"),
               "auto_score": (choice.get("score") or {}).get("label"),
               "coverage_auto": auto["coverage"], "coverage_cos": cos["coverage"],
               "removal_auto": auto["removal"], "removal_cos": cos["removal"],
               "seconds": auto["seconds"] + cos["seconds"]}
        rows.append(row)
        print(f"| {language} | {row['model']} | {row['auto_score']} | {row['coverage_auto']:.3f} "
              f"| {row['coverage_cos']:.3f} | {row['removal_auto']:.3f} | {row['removal_cos']:.3f} |",
              flush=True)
    print(f"\nalpha 0.1 (target coverage 0.90), marginal mode, means over {args.splits} "
          f"topic-disjoint splits, seed {args.seed}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
