"""Queries across languages: English questions over another language's XQuAD articles,
beside the monolingual set of the same articles, measured in one run.

For each target language (default de, es, zh, el, ro) this evaluates ``xquad-en2{L}``
(English questions, the L articles and labels) and ``xquad-{L}`` (the L questions over the
same snippets with the same labels) with the model :func:`ragsieve.embeddings.choose_model`
picks for the two languages (a model trained on both), on three scores: the fused score
that ``--scorer auto`` resolves to on these lists (``best`` with its default preset,
:data:`ragsieve.scoring.signals.DEFAULT_PRESET`, whose signals across languages are the
in-list BM25 and every other bundled embedder trained on both languages; the script refuses
to run if auto resolves to anything else), the fused score of the ``base`` preset (the
embedder's ``1 - cos`` and its list-relative transforms only; ``--no-base-preset`` leaves it
out) and ``1 - cos``. ``--presets`` adds fused scores: ``quality`` (the preset across
languages: the other embedders trained on both languages, the in-list BM25 and the base
model's best-sentence cosine, boosted trees) and ``bm25`` (the ``fast`` preset of queries in
the snippets' language, the in-list BM25 alone beside the base, logistic regression: what
the both-language embedders add; a pair with no such embedder has no such row, its deployed
score being that one). A fused score is fitted on a quarter of each split's calibration
topics. It reports the
marginal conformal row at ``--alpha`` over ``--splits`` topic-disjoint splits: coverage of
the relevant snippets (target ``1 - alpha``), the share of snippets removed, the oracle's
removal (the share of irrelevant snippets in the same test splits: keeping exactly the
relevant ones) and the removal as a share of the oracle's. A second table sets each
cross-language set beside its monolingual set (deployed fused score): whether English
questions reach the monolingual removal, i.e. fall short of its share of the oracle by at
most ``--reach-tolerance`` points; with ``--presets``, a third table sets each added fused
score with English questions beside the monolingual deployed score.

``--cost-queries K`` (default 0: off) times, per cross-language dataset and fused score,
the model work of the whole lists of K queries (one per topic) on an empty in-memory cache:
seconds per snippet seen, cold, models loaded, the fastest of ``--cost-repeats`` runs (the
vector counts say what each score embeds).

Vectors go through the persistent embedding cache (``--cache-dir``, default ragsieve's
``embeddings`` cache directory), so a rerun embeds nothing. multilingual-e5-small embeds
~19 snippets/s on 2 cores: the el and ro rows cost most on a cold cache.

Usage::

    python benchmarks/bench_crosslingual.py [--languages de,es,zh,el,ro] [--splits 20]
        [--alpha 0.1] [--reach-tolerance 1.0] [--no-base-preset]
        [--presets fast,base,quality,bm25] [--cost-queries 8] [--cost-repeats 3]
        [--cache-dir DIR]
        [--out table.md] [--json rows.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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
from ragsieve.scoring import AutoScorer, EmbeddingScorer, FusedScorer
from ragsieve.scoring.lexical import ListBM25Scorer
from ragsieve.scoring.signals import DEFAULT_PRESET, preset_signals

TARGETS = ("de", "es", "zh", "el", "ro")
SHORT = {MINILM_ID: "MiniLM", USE_ID: "USE", E5_ID: "e5-small-q4"}
REPO = Path(__file__).resolve().parents[1]
DEPLOYED = f"fused (best: {DEFAULT_PRESET})"
BASE_PRESET = "fused (base preset)"
QUALITY = "fused (quality preset)"
BM25_ONLY = "fused (base + in-list BM25)"
#: ``--presets`` names and the rows they add; the deployed one is always measured.
PRESET_ROWS = {DEFAULT_PRESET: DEPLOYED, "base": BASE_PRESET, "quality": QUALITY,
               "bm25": BM25_ONLY}
ADDED = (QUALITY, BM25_ONLY)


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


def added_scores(cosine: EmbeddingScorer, query_language: str,
                 presets: list[str]) -> list[tuple[str, Any]]:
    """The fused scores ``--presets`` adds over ``cosine`` (the deployed score's base), named:
    the ``quality`` preset for these languages, and the base with the in-list BM25 alone
    (only where the deployed score has more: another embedder covers both languages)."""
    named: list[tuple[str, Any]] = []
    if "quality" in presets:
        named.append((QUALITY, FusedScorer.unfitted(cosine, preset="quality",
                                                    query_language=query_language)))
    deployed = preset_signals(cosine, DEFAULT_PRESET, query_language)
    if "bm25" in presets and any(isinstance(s, EmbeddingScorer) for s in deployed):
        named.append((BM25_ONLY, FusedScorer(cosine, signals=[ListBM25Scorer()],
                                             learner="logistic")))
    return named


def scores(name: str, pairs: list[Any], language: str, query_language: str,
           args: argparse.Namespace) -> tuple[list[tuple[str, Any]], str]:
    """The scores to measure on one dataset, named, and the model they share.

    The fused score is the one ``auto`` deploys on these pairs (``best`` at the default
    preset); the base-preset fused score, those ``--presets`` adds and ``1 - cos`` use the
    same embedding scorer.
    """
    model = choose_model(language, query_language)
    auto = AutoScorer(language=language, query_language=query_language,
                      cache_dir=args.cache_dir)
    fused, choice, _ = auto.resolve(pairs)
    if choice.alias != "best":
        raise RuntimeError(f"{name}: auto resolved to {choice.alias} ({choice.reason})")
    spec = fused.spec()
    if spec.get("scorer") != "best" or spec.get("preset") != DEFAULT_PRESET:
        raise RuntimeError(f"{name}: auto resolved to {spec}, not the fused score "
                           f"of preset {DEFAULT_PRESET!r}")
    cosine = fused.base_scorer()
    if cosine.spec().get("model") != model:
        raise RuntimeError(f"{name}: auto chose {cosine.spec()}, choose_model gives {model}")
    named: list[tuple[str, Any]] = [(DEPLOYED, fused)]
    if "base" in args.presets:
        named.append((BASE_PRESET, FusedScorer.unfitted(cosine, preset="base")))
    named.extend(added_scores(cosine, query_language, args.presets))
    named.append(("1 - cos", cosine))
    return named, model


def cost_sample(pairs: list[Any], n_queries: int) -> list[Any]:
    """The whole lists of the first query of each of the first ``n_queries`` topics."""
    chosen: dict[Any, str] = {}
    for p in pairs:
        if len(chosen) == n_queries and p.group not in chosen:
            continue
        chosen.setdefault(p.group, p.query_id)
    wanted = set(chosen.values())
    return [p for p in pairs if p.query_id in wanted]


def embedders_of(scorer: Any) -> list[EmbeddingScorer]:
    """The distinct embedding scorers whose caches a score fills (a best-sentence signal
    shares its base's)."""
    signals = scorer.signal_scorers if isinstance(scorer, FusedScorer) else (scorer,)
    found: dict[int, EmbeddingScorer] = {}
    for signal in signals:
        embedder = (signal if isinstance(signal, EmbeddingScorer)
                    else getattr(signal, "embedder", None))
        if isinstance(embedder, EmbeddingScorer):
            found.setdefault(id(embedder), embedder)
    return list(found.values())


def cold_copy(score_name: str, scorer: Any, query_language: str) -> Any:
    """``scorer`` (named ``score_name``) rebuilt over a fresh base on an empty in-memory cache."""
    base = scorer.base if isinstance(scorer, FusedScorer) else scorer
    cold_base = EmbeddingScorer(base.model_id, language=base.language, cache_dir=None,
                                batch_size=base.batch_size)
    if score_name == "1 - cos":
        cold: Any = cold_base
    elif score_name == DEPLOYED:
        cold = FusedScorer.unfitted(cold_base, preset=DEFAULT_PRESET, query_language=query_language)
    elif score_name == BASE_PRESET:
        cold = FusedScorer.unfitted(cold_base, preset="base")
    else:
        cold = dict(added_scores(cold_base, query_language, [*PRESET_ROWS]))[score_name]
    if cold.spec() != scorer.spec():
        raise RuntimeError(f"{score_name}: the cold copy {cold.spec()} is not {scorer.spec()}")
    return cold


def cold_cost(score_name: str, scorer: Any, sample: list[Any], query_language: str,
              repeats: int) -> dict[str, Any]:
    """Seconds of model work per snippet seen for one score on an empty in-memory cache:
    the fastest of ``repeats`` runs, each computing every signal of the sample's lists once
    on a fresh copy of the score (models loaded and warmed up before)."""
    times, vectors = [], 0
    for _ in range(repeats):
        cold = cold_copy(score_name, scorer, query_language)
        embedders = embedders_of(cold)
        for embedder in embedders:  # load and warm up: not counted
            embedder.model.embed_batch(["warm-up text."])
        t0 = time.perf_counter()
        if isinstance(cold, FusedScorer):
            cold.features_of_pairs(sample)
        else:
            cold.score_pairs(sample)
        times.append(time.perf_counter() - t0)
        vectors = sum(e.cache.n_computed for e in embedders)
    return {"cost_pairs": len(sample), "cost_queries": len({p.query_id for p in sample}),
            "cost_distinct_snippets": len({p.text for p in sample}),
            "cost_seconds": [round(t, 2) for t in times],
            "seconds_per_snippet": min(times) / len(sample),
            "vectors_per_snippet": vectors / len(sample)}


def measure(name: str, language: str, query_language: str,
            args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one dataset (one per score) and the deployed fused scorer's spec."""
    pairs = load_dataset(name)
    named, model = scores(name, pairs, language, query_language, args)
    oracle = oracle_removal(pairs, args.splits, args.seed, 0.5)
    costed = args.cost_queries > 0 and query_language != language
    sample = cost_sample(pairs, args.cost_queries) if costed else []
    rows = []
    for score_name, scorer in named:
        t0 = time.perf_counter()
        report = evaluate(pairs, scorer, alphas=(args.alpha,), n_splits=args.splits,
                          seed=args.seed, calibration_fraction=0.5, top_k=(),
                          calibrated_baselines=False, progress=args.progress)
        row = conformal_row(report, args.alpha)
        rows.append({
            "dataset": name, "queries": query_language, "snippets": language,
            "model": model, "score": score_name, "spec": scorer.spec(), "alpha": args.alpha,
            "coverage": row["coverage_mean"], "coverage_se": row["coverage_se"],
            "within_tolerance": row["within_tolerance"], "removal": row["removal_mean"],
            "removal_se": row["removal_std"] / np.sqrt(max(report.n_splits - 1, 1)),
            "oracle_removal": oracle, "of_oracle": row["removal_mean"] / oracle,
            "n_queries": report.n_queries, "n_pairs": len(pairs), "n_splits": report.n_splits,
            "seconds": round(time.perf_counter() - t0, 1),
            **(cold_cost(score_name, scorer, sample, query_language, args.cost_repeats)
               if costed and score_name != "1 - cos" else {}),
        })
    return rows, named[0][1].spec()


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as markdown; SE is the standard error of the removal over the splits, in
    points of the oracle's removal (the splits share topics, so it is a rough guide)."""
    lines = [("| dataset | queries → snippets | model | score | coverage | removal | "
              "oracle removal | % of oracle | SE (points) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "" if r["within_tolerance"] else " (below target)"
        lines.append(
            f"| `{r['dataset']}` | {r['queries']} → {r['snippets']} | "
            f"{SHORT.get(r['model'], r['model'])} | {r['score']} | {r['coverage']:.3f}{ok} | "
            f"{r['removal']:.3f} | {r['oracle_removal']:.3f} | {100 * r['of_oracle']:.1f} % | "
            f"{100 * r['removal_se'] / r['oracle_removal']:.1f} |")
    return "\n".join(lines)


def comparison(rows: list[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """Per target language: the deployed fused score's share of the oracle with English
    questions and with the language's own, the gap in points, and whether it is reached
    (the gap is at most ``tolerance`` points)."""
    fused = {r["dataset"]: r for r in rows if r["score"] == DEPLOYED}
    base = {r["dataset"]: r for r in rows if r["score"] == BASE_PRESET}
    out = []
    for name, cross in fused.items():
        if not name.startswith("xquad-en2"):
            continue
        mono = fused.get(f"xquad-{cross['snippets']}")
        if mono is None:
            continue
        gap = 100 * (mono["of_oracle"] - cross["of_oracle"])
        out.append({
            "pair": f"en → {cross['snippets']}", "cross": cross["of_oracle"],
            "mono": mono["of_oracle"], "gap_points": gap, "reached": gap <= tolerance,
            "cross_gain_over_base": (100 * (cross["of_oracle"] - base[name]["of_oracle"])
                                     if name in base else None),
            "mono_gain_over_base": (100 * (mono["of_oracle"] - base[mono["dataset"]]["of_oracle"])
                                    if mono["dataset"] in base else None),
        })
    return out


def comparison_table(found: list[dict[str, Any]], tolerance: float) -> str:
    """Markdown: each pair's share of the oracle's removal with English questions and with
    the language's own (the deployed fused score), and what the preset's signals add over
    the base preset on each (when measured)."""
    with_base = all(c["cross_gain_over_base"] is not None for c in found)
    head = (f"| pair | {DEPLOYED}, % of oracle: English questions | the language's own | "
            f"gap (points) | reached (gap ≤ {tolerance:g} point) |")
    rule = "|---|---|---|---|---|"
    if with_base:
        head += (f" {DEFAULT_PRESET} − base preset, English (points) | "
                 f"{DEFAULT_PRESET} − base preset, own (points) |")
        rule += "---|---|"
    lines = [head, rule]
    for c in found:
        line = (f"| {c['pair']} | {100 * c['cross']:.1f} % | {100 * c['mono']:.1f} % | "
                f"{c['gap_points']:+.1f} | {'yes' if c['reached'] else 'no'} |")
        if with_base:
            line += f" {c['cross_gain_over_base']:+.1f} | {c['mono_gain_over_base']:+.1f} |"
        lines.append(line)
    return "\n".join(lines)


def added_table(rows: list[dict[str, Any]], presets: list[str]) -> str:
    """Markdown: with English questions, the deployed fused score and each added one (share
    of the oracle, coverage, what it adds over the deployed one) beside the monolingual
    deployed score, and the cold cost per snippet seen where measured (milliseconds, and
    vectors embedded: snippets, sentences and the queries' share)."""
    by = {(r["dataset"], r["score"]): r for r in rows}
    costed = any("seconds_per_snippet" in r for r in rows)
    head = ("| pair | score (English questions) | coverage | % of oracle | gain over "
            f"{DEFAULT_PRESET} (points) | gap to the language's own, {DEFAULT_PRESET} (points) |")
    rule = "|---|---|---|---|---|---|"
    if costed:
        head += " cold ms / snippet seen | vectors / snippet seen |"
        rule += "---|---|"
    lines = [head, rule]
    for r in rows:
        if not r["dataset"].startswith("xquad-en2") or r["score"] not in (DEPLOYED, *ADDED):
            continue
        mono = by.get((f"xquad-{r['snippets']}", DEPLOYED))
        fast = by[(r["dataset"], DEPLOYED)]
        ok = "" if r["within_tolerance"] else " (below target)"
        gap = f"{100 * (mono['of_oracle'] - r['of_oracle']):+.1f}" if mono else "—"
        line = (f"| en → {r['snippets']} | {r['score']} | {r['coverage']:.3f}{ok} | "
                f"{100 * r['of_oracle']:.1f} % | "
                f"{100 * (r['of_oracle'] - fast['of_oracle']):+.1f} | "
                f"{gap} |")
        if costed:
            line += (f" {1000 * r['seconds_per_snippet']:.0f} | {r['vectors_per_snippet']:.2f} |"
                     if "seconds_per_snippet" in r else " — | — |")
        lines.append(line)
    if "bm25" in presets:
        pairs = sorted({r["snippets"] for r in rows if r["dataset"].startswith("xquad-en2")} -
                       {r["snippets"] for r in rows if r["score"] == BM25_ONLY
                        and r["dataset"].startswith("xquad-en2")})
        if pairs:
            lines.append(f"\nNo `{BM25_ONLY}` row for en → {', '.join(pairs)}: no bundled "
                         "embedder besides the base's was trained on both languages, so the "
                         "deployed score is that one.")
    return "\n".join(lines)


def parse_presets(text: str, base_preset: bool) -> list[str]:
    """The fused rows ``--presets`` names (the deployed one always), ``base`` dropped by
    ``--no-base-preset``."""
    presets = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(presets) - set(PRESET_ROWS))
    if unknown:
        raise SystemExit(f"--presets {text!r}: unknown {unknown}; "
                         f"choose from {', '.join(PRESET_ROWS)}")
    if DEFAULT_PRESET not in presets:
        presets.insert(0, DEFAULT_PRESET)
    return [p for p in presets if base_preset or p != "base"]


def main() -> None:
    from ragsieve._paths import cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default=",".join(TARGETS),
                    help="target languages (the articles'), comma-separated")
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reach-tolerance", type=float, default=1.0,
                    help="points of the oracle's removal by which English questions may fall "
                         "short of the monolingual set and still count as reaching it")
    ap.add_argument("--no-base-preset", dest="base_preset", action="store_false",
                    help="leave out the base-preset fused score (1 - cos and its transforms)")
    ap.add_argument("--presets", default=f"{DEFAULT_PRESET},base",
                    help=f"fused scores to measure, comma-separated, from {', '.join(PRESET_ROWS)} "
                         f"({DEFAULT_PRESET}, the deployed one, always)")
    ap.add_argument("--cost-queries", type=int, default=0,
                    help="time the cold model work of this many queries' lists per "
                         "cross-language dataset and fused score (0: not timed)")
    ap.add_argument("--cost-repeats", type=int, default=3,
                    help="cold runs per timed score; the fastest counts")
    ap.add_argument("--cache-dir", default=str(cache_dir() / "embeddings"),
                    help="persistent embedding cache directory")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default=None, help="also write the markdown tables here")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    args.presets = parse_presets(args.presets, args.base_preset)

    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    state = f"{git_state()}, scoring code sha256 {scoring_digest()}"
    rows: list[dict[str, Any]] = []
    specs: dict[str, Any] = {}
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    for language in (lang.strip() for lang in args.languages.split(",")):
        for name, query_language in ((f"xquad-en2{language}", "en"),
                                     (f"xquad-{language}", language)):
            found, spec = measure(name, language, query_language, args)
            rows.extend(found)
            specs[name] = spec
            for r in found:
                print(f"{r['dataset']:<13} {r['score']:<19} coverage {r['coverage']:.3f} "
                      f"removal {r['removal']:.3f} ({100 * r['of_oracle']:.1f} % of oracle) "
                      f"{r['seconds']:.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    fused_specs = sorted({json.dumps(s, sort_keys=True) for s in specs.values()})
    header = (f"Measured {started} in one run ({seconds / 60:.1f} min, {platform.node()}), "
              f"ragsieve at `{state}`; alpha {args.alpha}, marginal mode, "
              f"{args.splits} topic-disjoint splits (seed {args.seed}, half the topics "
              f"calibrate); deployed fused score spec(s) before fitting: "
              + "; ".join(f"`{s}`" for s in fused_specs))
    added = sorted({json.dumps(r["spec"], sort_keys=True) for r in rows if r["score"] in ADDED})
    if added:
        header += "; added fused score specs before fitting: " + "; ".join(f"`{s}`" for s in added)
    if args.cost_queries > 0:
        header += (f". Cold cost: the whole lists of {args.cost_queries} queries (one per topic) "
                   "of each cross-language dataset, every signal on an empty in-memory cache "
                   f"after the models are loaded, fastest of {args.cost_repeats} runs; "
                   f"load average {load_before:.2f} at the start "
                   f"on {os.cpu_count()} cores")
    compared = comparison(rows, args.reach_tolerance)
    text = f"{header}\n\n{table(rows)}\n"
    if compared:
        text += f"\n{comparison_table(compared, args.reach_tolerance)}\n"
    if any(p in args.presets for p in ("quality", "bm25")) or args.cost_queries > 0:
        text += f"\n{added_table(rows, args.presets)}\n"
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows,
                                               "comparison": compared}, indent=1),
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
