"""Sentence-level pruning against snippet-level conformal and ``all``, per shared XQuAD language.

For every language, one ``ragsieve answers --data xquad-XX --no-generate --unit sentence``
(the CLI itself, its default score and model for the language, the embedding cache under
``~/.cache/ragsieve/embeddings``): on the same topic-disjoint held-out queries, the context
of ``all`` (every retrieved snippet), of snippet-level ``conformal`` and of
``conformal (sentence)`` (each kept snippet reduced to its kept sentences by a
``ConformalFilter(unit="sentence")`` calibrated on the split's calibration topics). Per
language and alpha: context characters per query, the sentence rows' share of the
snippet-level conformal's characters, and answer in context (a SQuAD-normalised gold
answer occurs in the kept context); beside them the ``oracle (sentence)`` row's characters
(the evidence sentences of the relevant snippets alone, chosen by the labels: no score keeps
less at full recall) as a share of snippet-level conformal's. The issue's aim: a share
<= 0.5 with answer in context >= 0.88 at alpha 0.1.

Usage: ``python benchmarks/bench_sentences.py [--languages en,de,es,zh,el,ro]
[--alpha 0.1,0.2] [--splits 1] [--out table.md] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ragsieve.cli import main as ragsieve_main

AIM_SHARE, AIM_IN_CONTEXT, AIM_ALPHA = 0.5, 0.88, 0.1


def run_language(language: str, alphas: str, splits: int, seed: int) -> dict[str, Any]:
    """One ``ragsieve answers ... --unit sentence --json`` run; its JSON report."""
    argv = ["-q", "answers", "--data", f"xquad-{language}", "--no-generate", "--unit", "sentence",
            "--alpha", alphas, "--splits", str(splits), "--seed", str(seed), "--json"]
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = ragsieve_main(argv)
    if code != 0:
        raise SystemExit(f"ragsieve {' '.join(argv)} exited with {code}")
    report = json.loads(out.getvalue())
    report["bench_seconds"] = round(time.perf_counter() - t0, 1)
    return report


def _row(report: dict[str, Any], method: str, alpha: float | None = None) -> dict[str, Any]:
    for r in report["results"]:
        if r["method"] == method and (alpha is None or r.get("alpha") == alpha):
            return r
    raise KeyError(f"no row {method!r} at alpha {alpha!r}")


def _model(report: dict[str, Any]) -> str:
    scorer = report.get("scorer", {})
    base = scorer.get("base", scorer)
    while isinstance(base, dict) and "base" in base:
        base = base["base"]
    return str(base.get("model", "?")) if isinstance(base, dict) else "?"


def rows(language: str, report: dict[str, Any], alphas: list[float]) -> list[dict[str, Any]]:
    """The measured numbers of one language, one entry per alpha."""
    everything = _row(report, "all")
    oracle = _row(report, "oracle (sentence)")
    out = []
    for a in alphas:
        snippet, sentence = _row(report, "conformal", a), _row(report, "conformal (sentence)", a)
        share = sentence["context_chars_mean"] / snippet["context_chars_mean"]
        out.append({
            "language": language, "alpha": a, "model": _model(report),
            "n_queries": sentence["n_queries"],
            "all_chars": everything["context_chars_mean"],
            "all_in_context": everything["answer_in_context_mean"],
            "snippet_chars": snippet["context_chars_mean"],
            "snippet_in_context": snippet["answer_in_context_mean"],
            "sentence_chars": sentence["context_chars_mean"],
            "sentence_snippets": sentence["context_snippets_mean"],
            "sentence_in_context": sentence["answer_in_context_mean"],
            "share_of_snippet": share,
            "share_of_all": sentence["context_chars_mean"] / everything["context_chars_mean"],
            "oracle_chars": oracle["context_chars_mean"],
            "oracle_in_context": oracle["answer_in_context_mean"],
            "oracle_share_of_snippet": oracle["context_chars_mean"] / snippet["context_chars_mean"],
            "aim_met": (share <= AIM_SHARE and sentence["answer_in_context_mean"] >= AIM_IN_CONTEXT)
            if a == AIM_ALPHA else None,
            "seconds": report["bench_seconds"],
        })
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("| language | model | alpha | queries | `all` chars | snippet conformal chars | "
            "sentence conformal chars | share of snippet conformal | share of `all` | "
            "in context: all / snippet / sentence | evidence-only oracle: chars, share of "
            "snippet conformal | aim (alpha 0.1) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in table:
        aim = "-" if r["aim_met"] is None else ("met" if r["aim_met"] else "not met")
        lines.append(
            f"| {r['language']} | {r['model']} | {r['alpha']:g} | {r['n_queries']} | "
            f"{r['all_chars']:,.0f} | {r['snippet_chars']:,.0f} | {r['sentence_chars']:,.0f} | "
            f"{r['share_of_snippet']:.2f} | {r['share_of_all']:.3f} | "
            f"{r['all_in_context']:.3f} / {r['snippet_in_context']:.3f} / "
            f"{r['sentence_in_context']:.3f} | {r['oracle_chars']:,.0f}, "
            f"{r['oracle_share_of_snippet']:.2f} | {aim} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default="en,de,es,zh,el,ro")
    ap.add_argument("--alpha", default="0.1,0.2")
    ap.add_argument("--splits", type=int, default=1, help="topic-disjoint splits per language")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    ap.add_argument("--json", default=None, help="also write every number as JSON")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    alphas = [float(a) for a in args.alpha.split(",")]
    t0 = time.perf_counter()
    table: list[dict[str, Any]] = []
    for language in args.languages.split(","):
        print(f"xquad-{language} ...", file=sys.stderr, flush=True)
        table.extend(rows(language, run_language(language, args.alpha, args.splits, args.seed),
                          alphas))
    seconds = time.perf_counter() - t0
    text = markdown(table)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    footer = (f"\n\n{args.splits} topic-disjoint split(s) per language, seed {args.seed}; "
              f"{seconds:.0f} s in all (1-minute load average {load:.2f} at the end).")
    print(text + footer)
    if args.out:
        Path(args.out).write_text(text + footer + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "rows": table}, indent=1),
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
