"""The reader against the embedding presets: removal at the same coverage, side by side in
one run, and what fine-tuning and scoring cost (issue 33, "A score that reads").

For each dataset (default XQuAD en and SelQA dev) and each of ``--splits`` random
topic-disjoint halves (``group_splits``, seed ``--seed``: calibration topics / test
topics), every score is fitted once on the calibration half exactly as
``ConformalFilter.calibrate`` fits it (:meth:`Scorer.fit_topics`: a seeded quarter of the
calibration topics, draw ``seed = split``; the rest calibrate), then the split conformal
threshold of each alpha is taken from the relevant scores of the calibration share
(``SplitConformalCalibrator``) and applied to the test half's lists:

``fast``
    the list-aware fused preset (``FusedScorer.unfitted(preset="fast")``);
``portable``
    the list-free fused preset (corpus BM25 frozen from the fit share, sentence cosine);
``reader``
    ``1 - P(relevant)`` of the cross-encoder fine-tuned from the bundled MiniLM on the fit
    share (:class:`~ragsieve.scoring.reader.ReaderScorer`, its defaults), alone;
``fused-reader``
    the ``reader`` preset of the fused score: ``fast``'s signals and the reader, cross-fitted
    within the fit share (list-aware);
``portable-reader``
    the ``portable-reader`` preset: ``portable``'s signals and the reader (list-free).

Not in the default run (they embed with every bundled English embedder): ``quality`` (the
``quality`` preset) and ``quality-reader`` (its signals and the reader, boosted trees).

Per (dataset, score, alpha): coverage (kept relevant / relevant test pairs) and removal
(removed / all test pairs), mean over the splits with their min-max, and the oracle's
removal at the same coverage (keeping exactly the covered relevant pairs); in ``--json``
each row also holds the score's ROC-AUC on the test half (``auc``). Costs, per
split: the reader's fine-tuning seconds per 1,000 fit pairs and its scoring pairs per
second (torch, fp32, the machine's threads), measured on the test half.

``--backends`` measures instead what ONNX Runtime would give the reader: a reader
fine-tuned on 60 relevant and 180 irrelevant XQuAD-en pairs scores 512 pairs with torch
fp32, then exported (TorchScript exporter, opset 17) and run with ONNX Runtime fp32 and
int8 (``quantize_dynamic``, per-channel QInt8), batches of 32 sorted by length, 2
threads: pairs per second and the largest logit difference to torch.

Usage::

    python benchmarks/bench_reader.py [--data xquad-en,selqa-dev] [--splits 2]
        [--first-split 0] [--alpha 0.1,0.2] [--scores fast,portable,reader,fused-reader,portable-reader]
        [--scores quality,quality-reader]
        [--seed 0] [--cache-dir DIR]
        [--out table.md] [--json rows.json]
    python benchmarks/bench_reader.py --backends
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from ragsieve._paths import cache_dir
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.data import group_splits, load_dataset
from ragsieve.embeddings.cross_encoder import DEFAULT_BASE, READER_BASES
from ragsieve.embeddings.detection import detect_language
from ragsieve.scoring import EmbeddingScorer, FusedScorer, ReaderScorer, Scorer
from ragsieve.scoring.reader import _OUT_OF_FOLD
from ragsieve.scoring.signals import PRESETS, READER_PRESETS
from ragsieve.types import Pair

DATASETS = ("xquad-en", "selqa-dev")
ALPHAS = (0.1, 0.2)
SCORES = ("fast", "portable", "reader", "fused-reader", "portable-reader")
#: Every score ``--scores`` takes (the default runs ``SCORES``).
KNOWN_SCORES = (*SCORES, "quality", "quality-reader")


def make_scorer(score: str, base: EmbeddingScorer, reader_base: str = DEFAULT_BASE) -> Scorer:
    """A fresh, unfitted scorer of ``score`` (its reader fine-tuned from ``reader_base``)."""
    if score == "reader":
        return ReaderScorer(model=reader_base)
    preset = "reader" if score == "fused-reader" else score
    if preset not in PRESETS:
        raise ValueError(f"score == {score!r}, expected one of {', '.join(KNOWN_SCORES)}.")
    return FusedScorer.unfitted(base, preset=preset,
                                reader_base=reader_base if preset in READER_PRESETS else None)


def run_score(score: str, base: EmbeddingScorer, cal: list[Pair], test: list[Pair],
              alphas: Sequence[float], split: int,
              reader_base: str = DEFAULT_BASE) -> list[dict[str, Any]]:
    """Fit ``score`` on the calibration half, calibrate each alpha, measure on the test half."""
    _OUT_OF_FOLD.clear()  # each score's own fine-tunes: not another reader preset's of this share
    t0 = time.perf_counter()
    done = make_scorer(score, base, reader_base).fit_topics(cal, seed=split)
    fit_seconds = time.perf_counter() - t0
    share = done.pairs
    if done.scores is not None:
        cal_scores = np.asarray(done.scores)[[p.relevant == 1 for p in share]]
    else:
        cal_scores = done.scorer.score_pairs([p for p in share if p.relevant == 1])
    t1 = time.perf_counter()
    test_scores = done.scorer.score_pairs(test)
    score_seconds = time.perf_counter() - t1
    relevant = np.array([p.relevant == 1 for p in test])
    auc = float(roc_auc_score(relevant, -test_scores))
    rows = []
    for alpha in alphas:
        tau = SplitConformalCalibrator(alpha=alpha).fit(cal_scores).threshold_
        keep = test_scores <= tau
        coverage = float(keep[relevant].mean())
        rows.append({"score": score, "split": split, "alpha": alpha, "threshold": float(tau),
                     "coverage": coverage, "removal": float(1.0 - keep.mean()), "auc": auc,
                     "oracle_removal": float(1.0 - coverage * relevant.sum() / relevant.size),
                     "n_fit": int(done.n_fit), "fit_seconds": round(fit_seconds, 1),
                     "test_pairs": int(relevant.size),
                     "score_pairs_per_s": round(relevant.size / max(score_seconds, 1e-9), 1)})
    return rows


def measure(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every split's rows of one dataset."""
    pairs = load_dataset(name)
    language = detect_language([p.text for p in pairs[:400]]).code or "en"
    base = EmbeddingScorer(language=language, cache_dir=args.cache_dir)
    topics = sorted({p.group for p in pairs}, key=str)
    splits = group_splits(topics, calibration_fraction=0.5,
                          n_splits=args.first_split + args.splits, seed=args.seed)
    rows = []
    for split, (cal_idx, test_idx) in enumerate(splits):
        if split < args.first_split:  # measured by an earlier run (same draws)
            continue
        cal_topics = {topics[i] for i in cal_idx}
        test_topics = {topics[i] for i in test_idx}
        cal = [p for p in pairs if p.group in cal_topics]
        test = [p for p in pairs if p.group in test_topics]
        for score in args.scores:
            t0 = time.perf_counter()
            for row in run_score(score, base, cal, test, args.alpha, split, args.reader_base):
                rows.append({"dataset": name, "reader_base": args.reader_base, **row})
            print(f"{name} split {split} {score}: {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], scores: Sequence[str], alphas: Sequence[float]) -> str:
    """Markdown: per dataset and alpha, each score's coverage / removal (min-max)."""
    out = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        out.append(f"\n**{name}** (coverage / removal, mean over splits [min, max]; oracle "
                   "removal at the same coverage)\n")
        out.append("| alpha | " + " | ".join(scores) + " | oracle |")
        out.append("|---|" + "---|" * (len(scores) + 1))
        for alpha in alphas:
            cells, oracle = [], []
            for score in scores:
                rs = [r for r in rows if r["dataset"] == name and r["score"] == score
                      and r["alpha"] == alpha]
                if not rs:
                    cells.append("-")
                    continue
                cov = np.array([r["coverage"] for r in rs])
                rem = np.array([r["removal"] for r in rs])
                oracle.extend(r["oracle_removal"] for r in rs)
                cells.append(f"{cov.mean():.3f} / {rem.mean():.3f} [{rem.min():.3f}, "
                             f"{rem.max():.3f}]")
            tail = f" | {np.mean(oracle):.3f} |" if oracle else " | - |"
            out.append(f"| {alpha} | " + " | ".join(cells) + tail)
    costs = [r for r in rows if r["score"] == "reader" and r["alpha"] == alphas[0]]
    fused = [r for r in rows if r["score"] != "reader" and "reader" in r["score"]
             and r["alpha"] == alphas[0]]
    out.extend(_costs(
        costs, "reader costs** (per split: fit pairs, fine-tuning seconds per 1,000 fit pairs, "
        "scoring pairs per second, torch fp32)", ("fit pairs", "s / 1,000 fit pairs"),
        lambda r: (r["n_fit"], f"{1000 * r['fit_seconds'] / max(r['n_fit'], 1):.0f}")))
    out.extend(_costs(
        fused, "fused reader presets** (per split: seconds to fit on the calibration half, "
        "three fine-tunes and the features; test pairs scored per second)", ("score", "fit s"),
        lambda r: (r["score"], r["fit_seconds"])))
    return "\n".join(out) + "\n"


def _costs(rows: list[dict[str, Any]], title: str, names: tuple[str, str],
           cells: Any) -> list[str]:
    """A markdown table of per-split costs: dataset, split, two cells, scored pairs / s."""
    if not rows:
        return []
    out = [f"\n**{title}\n", f"| dataset | split | {names[0]} | {names[1]} | scored pairs / s |",
           "|---|---|---|---|---|"]
    for r in rows:
        one, two = cells(r)
        out.append(f"| {r['dataset']} | {r['split']} | {one} | {two} | {r['score_pairs_per_s']} |")
    return out


def backends(reader_base: str = DEFAULT_BASE) -> str:
    """Reader scoring speed and agreement: torch fp32, ONNX Runtime fp32 and int8."""
    import tempfile
    import warnings

    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pairs = load_dataset("xquad-en")
    fit = ([p for p in pairs if p.relevant == 1][:60]
           + [p for p in pairs if p.relevant == 0][:180])
    model = ReaderScorer(max_fit_pairs=240, model=reader_base).fitted_on(fit, seed=0)._reader()
    ev = pairs[1000:1512]
    queries, texts = [p.query for p in ev], [p.text for p in ev]
    t0 = time.perf_counter()
    ref = model.logits(queries, texts)
    speed = len(ev) / (time.perf_counter() - t0)
    lines = [f"{reader_base} reader, torch fp32: {speed:.1f} pairs/s"]
    folder = tempfile.mkdtemp()
    fp32, int8 = os.path.join(folder, "reader.onnx"), os.path.join(folder, "reader-int8.onnx")
    example = model.encode(["hello world"], ["a longer example sentence"], 256)
    names = list(example)  # the token ids, masks and types, the question's and text's masks

    class Logit(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model.model

        def forward(self, *inputs: Any) -> Any:
            return self.m(**dict(zip(names, inputs, strict=True)))[:, None]

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logit().eval(), tuple(example[n] for n in names), fp32, dynamo=False,
                          input_names=names, output_names=["logits"],
                          dynamic_axes={n: {0: "b", 1: "s"} for n in names} | {"logits": {0: "b"}},
                          opset_version=17, do_constant_folding=True)
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True)
    order = np.argsort([len(q) + len(t) for q, t in zip(queries, texts, strict=True)], kind="stable")
    for name, path in (("onnx fp32", fp32), ("onnx int8", int8)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        out = np.zeros(len(ev))
        t0 = time.perf_counter()
        for i in range(0, len(ev), 32):
            rows = order[i:i + 32]
            enc = model.encode([queries[j] for j in rows], [texts[j] for j in rows], 256)
            out[rows] = session.run(None, {n: enc[n].numpy() for n in names})[0][:, 0]
        seconds = time.perf_counter() - t0
        lines.append(f"{name}: {len(ev) / seconds:.1f} pairs/s, max |logit - torch| "
                     f"{np.max(np.abs(out - ref)):.2e}, file {os.path.getsize(path) / 1e6:.1f} MB")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=",".join(DATASETS))
    parser.add_argument("--splits", type=int, default=2)
    parser.add_argument("--first-split", type=int, default=0,
                        help="skip the splits before this one (a run that adds splits to an "
                        "earlier run's: the draws are the same)")
    parser.add_argument("--alpha", default=",".join(map(str, ALPHAS)))
    parser.add_argument("--scores", default=",".join(SCORES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reader-base", default=DEFAULT_BASE, choices=tuple(READER_BASES),
                        help="the base every reader score fine-tunes (default: the product's)")
    parser.add_argument("--cache-dir", default=str(cache_dir() / "embeddings"))
    parser.add_argument("--out", help="write the markdown table here too")
    parser.add_argument("--json", help="write the per-split rows here")
    parser.add_argument("--backends", action="store_true",
                        help="measure the reader's scoring with torch and ONNX Runtime instead")
    args = parser.parse_args(argv)
    if args.backends:
        print(backends(args.reader_base))
        return 0
    args.alpha = [float(a) for a in args.alpha.split(",")]
    args.scores = [s.strip() for s in args.scores.split(",") if s.strip()]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in args.data.split(","):
        rows.extend(measure(name.strip(), args))
    text = (f"bench_reader: {dt.datetime.now(dt.UTC):%Y-%m-%d}, {platform.machine()}, "
            f"{os.cpu_count()} cores, {args.splits} splits from split {args.first_split}, "
            f"seed {args.seed}, "
            f"{time.perf_counter() - t0:.0f} s\n" + table(rows, args.scores, args.alpha))
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
