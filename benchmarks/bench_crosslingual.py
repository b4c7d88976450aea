"""Queries across languages: English questions over another language's XQuAD articles,
beside the monolingual set of the same articles, measured in one run.

For each target language (default de, es, zh, el, ro) this evaluates ``xquad-en2{L}``
(English questions, the L articles and labels) and ``xquad-{L}`` (the L questions over the
same snippets with the same labels) with the model :func:`ragsieve.embeddings.choose_model`
picks for the two languages (a model trained on both), on two scores: the fused score
(what ``--scorer auto`` resolves to on these lists, ``best``: fitted on a quarter of each
split's calibration topics) and ``1 - cos``. It reports the marginal conformal row at
``--alpha`` over ``--splits`` topic-disjoint splits: coverage of the relevant snippets
(target ``1 - alpha``), the share of snippets removed, the oracle's removal (the share of
irrelevant snippets in the same test splits: keeping exactly the relevant ones) and the
removal as a share of the oracle's.

Vectors go through the persistent embedding cache (``--cache-dir``, default ragsieve's
``embeddings`` cache directory), so a rerun embeds nothing. multilingual-e5-small embeds
~19 snippets/s on 2 cores: the el and ro rows cost most on a cold cache.

Usage::

    python benchmarks/bench_crosslingual.py [--languages de,es,zh,el,ro] [--splits 20]
        [--alpha 0.1] [--cache-dir DIR] [--out table.md] [--json rows.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve.calibration.inputs import CalibrationInputs
from ragsieve.data import load_dataset
from ragsieve.data.splits import group_splits
from ragsieve.embeddings import choose_model
from ragsieve.embeddings.languages import E5_ID, MINILM_ID, USE_ID
from ragsieve.evaluation import evaluate
from ragsieve.scoring import AutoScorer, resolve_scorer

TARGETS = ("de", "es", "zh", "el", "ro")
SHORT = {MINILM_ID: "MiniLM", USE_ID: "USE", E5_ID: "e5-small-q4"}
REPO = Path(__file__).resolve().parents[1]


def git_state() -> str:
    """``git describe --always --dirty`` of the repository, or ``unknown``."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def scoring_digest() -> str:
    """The first 12 hex digits of the SHA-256 of the scoring code (``src/ragsieve/scoring``),
    which tells apart two runs of a tree with uncommitted changes."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((REPO / "src" / "ragsieve" / "scoring").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def oracle_removal(pairs: list[Any], n_splits: int, seed: int, fraction: float) -> float:
    """Mean share of irrelevant snippets in the test topics of the splits ``evaluate``
    draws (the same ``group_splits`` call on the same topic codes)."""
    inputs = CalibrationInputs.from_pairs(pairs)
    relevant = np.array([p.relevant == 1 for p in pairs])
    splits = group_splits(inputs.group_index.tolist(), calibration_fraction=fraction,
                          n_splits=n_splits, seed=seed)
    return float(np.mean([1.0 - relevant[test].mean() for _, test in splits]))


def conformal_row(report: Any, alpha: float) -> dict[str, Any]:
    rows = [r for r in report.rows("conformal")
            if r["mode"] == "marginal" and abs(r["alpha"] - alpha) < 1e-12]
    if len(rows) != 1:
        raise RuntimeError(f"expected one marginal conformal row at alpha {alpha}, got {len(rows)}")
    return rows[0]


def measure(name: str, language: str, query_language: str,
            args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one dataset (fused, then ``1 - cos``) and the fused scorer's spec."""
    pairs = load_dataset(name)
    model = choose_model(language, query_language)
    auto = AutoScorer(language=language, query_language=query_language,
                      cache_dir=args.cache_dir)
    fused, choice, _ = auto.resolve(pairs)
    if choice.alias != "best":
        raise RuntimeError(f"{name}: auto resolved to {choice.alias} ({choice.reason})")
    cosine = resolve_scorer("embedding", model=model, language=language, cache_dir=args.cache_dir)
    oracle = oracle_removal(pairs, args.splits, args.seed, 0.5)
    rows = []
    for score_name, scorer in (("fused (best)", fused), ("1 - cos", cosine)):
        t0 = time.perf_counter()
        report = evaluate(pairs, scorer, alphas=(args.alpha,), n_splits=args.splits,
                          seed=args.seed, calibration_fraction=0.5, top_k=(),
                          calibrated_baselines=False, progress=args.progress)
        row = conformal_row(report, args.alpha)
        rows.append({
            "dataset": name, "queries": query_language, "snippets": language,
            "model": model, "score": score_name, "alpha": args.alpha,
            "coverage": row["coverage_mean"], "coverage_se": row["coverage_se"],
            "within_tolerance": row["within_tolerance"], "removal": row["removal_mean"],
            "oracle_removal": oracle, "of_oracle": row["removal_mean"] / oracle,
            "n_queries": report.n_queries, "n_pairs": len(pairs), "n_splits": report.n_splits,
            "seconds": round(time.perf_counter() - t0, 1),
        })
    return rows, fused.spec()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [("| dataset | queries → snippets | model | score | coverage | removal | "
              "oracle removal | % of oracle |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "" if r["within_tolerance"] else " (below target)"
        lines.append(
            f"| `{r['dataset']}` | {r['queries']} → {r['snippets']} | "
            f"{SHORT.get(r['model'], r['model'])} | {r['score']} | {r['coverage']:.3f}{ok} | "
            f"{r['removal']:.3f} | {r['oracle_removal']:.3f} | {100 * r['of_oracle']:.1f} % |")
    return "\n".join(lines)


def main() -> None:
    from ragsieve._paths import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default=",".join(TARGETS),
                    help="target languages (the articles'), comma-separated")
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=str(cache_dir() / "embeddings"),
                    help="persistent embedding cache directory")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()

    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    state = f"{git_state()}, scoring code sha256 {scoring_digest()}"
    rows: list[dict[str, Any]] = []
    specs: dict[str, Any] = {}
    t0 = time.perf_counter()
    for language in (lang.strip() for lang in args.languages.split(",")):
        for name, query_language in ((f"xquad-en2{language}", "en"),
                                     (f"xquad-{language}", language)):
            found, spec = measure(name, language, query_language, args)
            rows.extend(found)
            specs[name] = spec
            for r in found:
                print(f"{r['dataset']:<13} {r['score']:<13} coverage {r['coverage']:.3f} "
                      f"removal {r['removal']:.3f} ({100 * r['of_oracle']:.1f} % of oracle) "
                      f"{r['seconds']:.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    fused_specs = sorted({json.dumps(s, sort_keys=True) for s in specs.values()})
    header = (f"Measured {started} in one run ({seconds / 60:.1f} min, {platform.node()}), "
              f"ragsieve at `{state}`; alpha {args.alpha}, marginal mode, "
              f"{args.splits} topic-disjoint splits (seed {args.seed}, half the topics "
              f"calibrate); fused score spec(s) before fitting: "
              + "; ".join(f"`{s}`" for s in fused_specs))
    text = f"{header}\n\n{table(rows)}\n"
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1),
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
