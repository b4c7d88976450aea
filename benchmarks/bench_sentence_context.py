"""Does the snippet context help the sentence unit, and the cost per character? Side by side.

For each of the same topic-disjoint splits of a dataset (default XQuAD-en), three sentence
filters are calibrated on the calibration topics' snippet pairs and applied to the test
topics' snippets, the fused score fitted on the same seeded quarter of the calibration
topics in both:

- **sentence list only**: the fused score over each query's list of sentences
  (``ConformalFilter("best")`` calibrated on :func:`ragsieve.units.sentence_pairs`, each
  sentence filtered as a snippet of its own: no sentence sees its snippet);
- **+ snippet context**: that score combined with the fused score of the sentence's snippet
  over the query's snippet list by a logistic regression
  (:class:`~ragsieve.scoring.sentence_context.SentenceContextScorer` with ``per_char=False``:
  the score is ``-logit P(evidence)``);
- **+ per character** (what ``ConformalFilter(unit="sentence")`` deploys): the same fit,
  scored ``-log P(evidence) + log(characters)``: sentences kept in order of evidence per
  character.

Reported per alpha: coverage of evidence sentences (the guarantee), share of sentences
removed, share of the input's sentence characters removed, and the oracle's removal
(every non-evidence sentence); then each variant against the one before it, paired over
the splits. One markdown table, on stdout and with ``--out FILE``.

Usage::

    python benchmarks/bench_sentence_context.py [--data xquad-en] [--splits 10]
        [--alpha 0.1,0.2] [--out table.md]
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve import ConformalFilter
from ragsieve.data import group_splits, load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.scoring import SentenceContextScorer, resolve_scorer
from ragsieve.types import Pair
from ragsieve.units import sentence_pairs

VARIANTS = ("sentence list only", "+ snippet context", "+ per character")


def _kept(flt: ConformalFilter, test: list[Pair], variant: str) -> dict[tuple[str, str, int], bool]:
    """(query, snippet id, sentence start) -> kept, for every sentence of the test pairs."""
    out: dict[tuple[str, str, int], bool] = {}
    if variant == VARIANTS[0]:  # each sentence a snippet of its own
        sentences = sentence_pairs(test)
        results = flt.filter_pairs(sentences)
        kept = {(qid, s.snippet_id) for qid, r in results.items() for s in r.kept}
        for p in sentences:
            key = (p.query_id, p.meta["parent_snippet_id"], p.meta["sentence_start"])
            out[key] = (p.query_id, p.snippet_id) in kept
        return out
    ids: dict[str, list[str]] = {}
    for p in test:
        ids.setdefault(p.query_id, []).append(p.snippet_id)
    for qid, r in flt.filter_pairs(test).items():
        for index, start, _end, _score, keep in r.sentences:
            out[(qid, ids[qid][index], start)] = keep
    return out


def run_split(pairs: list[Pair], cal_idx: Any, test_idx: Any, alpha: float, seed: int,
              cache: Path) -> dict[str, dict[str, float]]:
    cal = [pairs[i] for i in cal_idx]
    test = [pairs[i] for i in test_idx]
    truth = {(p.query_id, p.meta["parent_snippet_id"], p.meta["sentence_start"]):
             (p.relevant == 1, len(p.text)) for p in sentence_pairs(test)}
    out = {}
    for variant in VARIANTS:
        best = resolve_scorer("best", model="minilm", cache_dir=cache)
        if variant == VARIANTS[0]:
            flt = ConformalFilter(best, alpha=alpha).calibrate(sentence_pairs(cal), seed=seed)
        else:
            context = SentenceContextScorer(best, per_char=variant == VARIANTS[2])
            flt = ConformalFilter(context, alpha=alpha, unit="sentence").calibrate(cal, seed=seed)
        kept = _kept(flt, test, variant)
        rel = np.array([truth[k][0] for k in kept])
        length = np.array([truth[k][1] for k in kept], dtype=float)
        keep = np.array(list(kept.values()))
        out[variant] = {"coverage": float(keep[rel].mean()), "removal": float(1 - keep.mean()),
                        "removal_chars": float(1 - length[keep].sum() / length.sum()),
                        "oracle": float(1 - rel.mean())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--data", default="xquad-en")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--alpha", default="0.1,0.2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache = cache_dir() / "embeddings"
    pairs = load_dataset(args.data)
    alphas = [float(a) for a in args.alpha.split(",")]
    splits = group_splits([p.group for p in pairs], calibration_fraction=0.5,
                          n_splits=args.splits, seed=0)
    t0 = time.perf_counter()
    per: dict[tuple[float, str], list[dict[str, float]]] = {}
    for a in alphas:
        for s_no, (cal_idx, test_idx) in enumerate(splits):
            for variant, m in run_split(pairs, cal_idx, test_idx, a, s_no, cache).items():
                per.setdefault((a, variant), []).append(m)
    lines = [(f"{args.data}, MiniLM, marginal mode, {len(splits)} topic-disjoint splits "
              f"(half the topics calibrate), fused score fitted on a quarter of the calibration "
              f"topics; {time.perf_counter() - t0:.0f} s"), "",
             ("| alpha | score | evidence-sentence coverage | sentences removed | "
              "sentence characters removed | oracle removal |"),
             "|---|---|---|---|---|---|"]
    for (a, variant), ms in per.items():
        def mean(key: str, ms: list[dict[str, float]] = ms) -> float:
            return float(np.mean([m[key] for m in ms]))

        def se(key: str, ms: list[dict[str, float]] = ms) -> float:
            return float(np.std([m[key] for m in ms], ddof=1) / np.sqrt(len(ms)))

        lines.append(f"| {a:g} | {variant} | {mean('coverage'):.3f} ± {se('coverage'):.3f} | "
                     f"{mean('removal'):.3f} | {mean('removal_chars'):.3f} | "
                     f"{mean('oracle'):.3f} |")
    for before, after in itertools.pairwise(VARIANTS):
        lines += ["", f"Paired over the splits ({after} minus {before}):", ""]
        for a in alphas:
            pair = list(zip(per[(a, before)], per[(a, after)], strict=True))
            diff = {k: np.array([m[k] - b[k] for b, m in pair])
                    for k in ("removal", "removal_chars", "coverage")}

            def se(d: np.ndarray) -> float:
                return float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")

            lines.append(f"- alpha {a:g}: sentences removed {diff['removal'].mean():+.3f} "
                         f"(se {se(diff['removal']):.3f}), characters removed "
                         f"{diff['removal_chars'].mean():+.3f} (se {se(diff['removal_chars']):.3f}, "
                         f"higher in {int((diff['removal_chars'] > 0).sum())} of "
                         f"{diff['removal_chars'].size} splits); coverage "
                         f"{diff['coverage'].mean():+.3f} (se {se(diff['coverage']):.3f})")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
