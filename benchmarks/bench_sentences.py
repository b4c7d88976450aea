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
less at full recall) as a share of snippet-level conformal's. The aim: the sentence unit
keeps at most 0.8 of the snippet unit's characters at alpha 0.1 (the same alpha).

The two units are also compared **at the same answer in context**: the sentence unit's
guarantee counts evidence sentences and the snippet unit's relevant snippets, so at one alpha
they keep the answer in different shares of the queries. For each sentence row, the snippet
unit's characters at that row's answer in context are read off the snippet rows (answer in
context against characters, linear between the measured alphas; none outside their range),
and ``share_at_same_answer`` is the sentence row's characters over them. Give several alphas
(e.g. ``--alpha 0.1,0.15,0.2,0.25``) for a curve to read.

``--scorer`` / ``--preset`` pass the score (default: the CLI's ``auto``); ``--report FILE``
tabulates a report ``ragsieve answers ... --unit sentence --json`` already wrote (one
language) instead of running it.

Usage: ``python benchmarks/bench_sentences.py [--languages en,de,es,zh,el,ro]
[--alpha 0.1,0.2] [--splits 1] [--scorer best --preset reader] [--report answers.json]
[--out table.md] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ragsieve.cli import main as ragsieve_main

AIM_SHARE, AIM_ALPHA = 0.8, 0.1


def run_language(language: str, alphas: str, splits: int, seed: int,
                 score: list[str] | None = None) -> dict[str, Any]:
    """One ``ragsieve answers ... --unit sentence --json`` run (``score``: its score flags);
    its JSON report."""
    argv = ["-q", "answers", "--data", f"xquad-{language}", "--no-generate", "--unit", "sentence",
            "--alpha", alphas, "--splits", str(splits), "--seed", str(seed), "--json",
            *(score or [])]
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


def snippet_chars_at(report: dict[str, Any], alphas: list[float],
                     in_context: float) -> float | None:
    """The snippet unit's characters at answer in context ``in_context``: linear between the
    snippet rows' (answer in context, characters) at ``alphas``; None outside their range."""
    points = sorted((_row(report, "conformal", a)["answer_in_context_mean"],
                     _row(report, "conformal", a)["context_chars_mean"]) for a in alphas)
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= in_context <= x1:
            return y0 if x1 == x0 else y0 + (in_context - x0) / (x1 - x0) * (y1 - y0)
    if len(points) == 1 and points[0][0] == in_context:
        return points[0][1]
    return None


def _score_name(report: dict[str, Any]) -> str:
    scorer = report.get("scorer", {})
    return str(scorer.get("preset") or scorer.get("scorer", "?")) if isinstance(scorer, dict) else "?"


def rows(language: str, report: dict[str, Any], alphas: list[float]) -> list[dict[str, Any]]:
    """The measured numbers of one language, one entry per alpha."""
    everything = _row(report, "all")
    oracle = _row(report, "oracle (sentence)")
    out = []
    for a in alphas:
        snippet, sentence = _row(report, "conformal", a), _row(report, "conformal (sentence)", a)
        share = sentence["context_chars_mean"] / snippet["context_chars_mean"]
        matched = snippet_chars_at(report, alphas, sentence["answer_in_context_mean"])
        out.append({
            "language": language, "alpha": a, "model": _model(report),
            "score": _score_name(report),
            "n_queries": sentence["n_queries"],
            "all_chars": everything["context_chars_mean"],
            "all_in_context": everything["answer_in_context_mean"],
            "snippet_chars": snippet["context_chars_mean"],
            "snippet_in_context": snippet["answer_in_context_mean"],
            "sentence_chars": sentence["context_chars_mean"],
            "sentence_snippets": sentence["context_snippets_mean"],
            "sentence_in_context": sentence["answer_in_context_mean"],
            "share_of_snippet": share,
            "snippet_chars_at_same_answer": matched,
            "share_at_same_answer": None if matched is None
            else sentence["context_chars_mean"] / matched,
            "share_of_all": sentence["context_chars_mean"] / everything["context_chars_mean"],
            "oracle_chars": oracle["context_chars_mean"],
            "oracle_in_context": oracle["answer_in_context_mean"],
            "oracle_share_of_snippet": oracle["context_chars_mean"] / snippet["context_chars_mean"],
            "aim_met": share <= AIM_SHARE if a == AIM_ALPHA else None,
            "seconds": report["bench_seconds"],
        })
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("| language | score | model | alpha | queries | `all` chars | snippet conformal chars | "
            "sentence conformal chars | share of snippet conformal | share of `all` | "
            "in context: all / snippet / sentence | share at the same answer in context | "
            "evidence-only oracle: chars, share of snippet conformal | aim: <= 0.8 at alpha 0.1 |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in table:
        aim = "-" if r["aim_met"] is None else ("met" if r["aim_met"] else "not met")
        same = ("-" if r["share_at_same_answer"] is None else
                f"{r['share_at_same_answer']:.2f} (of {r['snippet_chars_at_same_answer']:,.0f})")
        lines.append(
            f"| {r['language']} | {r['score']} | {r['model']} | {r['alpha']:g} | {r['n_queries']} | "
            f"{r['all_chars']:,.0f} | {r['snippet_chars']:,.0f} | {r['sentence_chars']:,.0f} | "
            f"{r['share_of_snippet']:.2f} | {r['share_of_all']:.3f} | "
            f"{r['all_in_context']:.3f} / {r['snippet_in_context']:.3f} / "
            f"{r['sentence_in_context']:.3f} | {same} | {r['oracle_chars']:,.0f}, "
            f"{r['oracle_share_of_snippet']:.2f} | {aim} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--languages", default="en,de,es,zh,el,ro")
    ap.add_argument("--alpha", default="0.1,0.2")
    ap.add_argument("--splits", type=int, default=1, help="topic-disjoint splits per language")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scorer", default=None, help="--scorer of the runs (default: the CLI's)")
    ap.add_argument("--preset", default=None, help="--preset of --scorer best")
    ap.add_argument("--report", default=None,
                    help="tabulate this `ragsieve answers --unit sentence --json` report of the "
                         "one language in --languages instead of running it")
    ap.add_argument("--out", default=None, help="also write the markdown table to this file")
    ap.add_argument("--json", default=None, help="also write every number as JSON")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    alphas = [float(a) for a in args.alpha.split(",")]
    score = ([*(["--scorer", args.scorer] if args.scorer else []),
              *(["--preset", args.preset] if args.preset else [])])
    languages = args.languages.split(",")
    if args.report and len(languages) != 1:
        raise SystemExit(f"--report holds one language's report; got --languages {args.languages}")
    t0 = time.perf_counter()
    table: list[dict[str, Any]] = []
    for language in languages:
        if args.report:
            report = json.loads(Path(args.report).read_text(encoding="utf-8"))
            report["bench_seconds"] = None
        else:
            print(f"xquad-{language} ...", file=sys.stderr, flush=True)
            report = run_language(language, args.alpha, args.splits, args.seed, score)
        table.extend(rows(language, report, alphas))
    seconds = time.perf_counter() - t0
    text = markdown(table)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    footer = (f"\n\n{args.splits} topic-disjoint split(s) per language, seed {args.seed}; "
              f"{seconds:.0f} s in all (1-minute load average {load:.2f} at the end)."
              if not args.report else f"\n\nTabulated from {args.report}.")
    print(text + footer)
    if args.out:
        Path(args.out).write_text(text + footer + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "rows": table}, indent=1),
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
