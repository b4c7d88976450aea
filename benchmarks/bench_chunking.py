"""The chunker of the last commit against the working tree's, side by side on XQuAD-en.

Both build the XQuAD-en pairs (``load_xquad("en", chunker=...)``, article context), the
real all-MiniLM-L6-v2 ``EmbeddingScorer`` scores them, and ``evaluate_scores`` runs the
conformal filter (marginal mode) at each alpha over topic-disjoint splits. Printed for
each chunker: coverage of relevant snippets, removal of snippets and of characters, the
share of test questions with an answer whole in a kept snippet, the number of distinct
snippets, their mean length, the share of snippets that start / end at a sentence
boundary (sentences as the working tree's splitter finds them), the share of consecutive
snippets that overlap and by how much, and the share of questions whose answer lies
whole inside one of their relevant snippets; then, over a range of alphas, removal
against that answer share, to compare the chunkers at equal removal.

The old chunker is ``src/ragsieve/chunking.py`` at ``--rev`` (default ``HEAD``), read with
``git show`` and executed into a module object at run time; no copy is written.

Usage::

    python benchmarks/bench_chunking.py [--splits 20] [--alphas 0.1 0.2] [--rev HEAD]
                                        [--cache-dir DIR] [--json out.json]

Embeddings are cached in ``--cache-dir``, by default ``$RAGSIEVE_CACHE/embeddings`` when
``RAGSIEVE_CACHE`` is set, else a temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve import chunking
from ragsieve._paths import cache_dir
from ragsieve.calibration import make_calibrator
from ragsieve.data import group_splits, load_xquad
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import EmbeddingScorer
from ragsieve.types import Pair, Snippet

REPO = Path(__file__).resolve().parents[1]
ChunkFn = Callable[[str, str], list[Snippet]]


def old_chunker(rev: str) -> types.ModuleType:
    """``ragsieve.chunking`` as it was at ``rev``, as a module object (nothing written)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:src/ragsieve/chunking.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType(f"ragsieve_chunking_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    # Our own source at a named revision, run to compare with; nothing foreign is executed.
    exec(compile(source, f"{rev}:src/ragsieve/chunking.py", "exec"), module.__dict__)  # noqa: S102
    return module


def paragraphs(pairs: Sequence[Pair]) -> dict[str, str]:
    """Paragraph text by doc id, rebuilt from the XQuAD file the pairs came from."""
    from ragsieve.data.xquad import xquad_file

    with xquad_file("en", download=False).open(encoding="utf-8") as handle:
        raw = json.load(handle)["data"]
    return {
        f"{art['title']}/{i}": par["context"]
        for art in raw
        for i, par in enumerate(art["paragraphs"])
    }


def shape(chunk: ChunkFn, docs: dict[str, str], pairs: Sequence[Pair]) -> dict[str, float]:
    """Snippet counts, lengths, sentence-boundary shares and overlaps of one chunker."""
    n = starts_ok = ends_ok = overlapping = 0
    lengths: list[int] = []
    shared: list[int] = []
    for doc_id, text in docs.items():
        snippets = chunk(text, doc_id)
        last = len(text.rstrip())
        first = len(text) - len(text.lstrip())
        sentences = chunking._sentences(text, first, last)
        sentence_starts = {s for s, _ in sentences}
        sentence_ends = {e for _, e in sentences}
        n += len(snippets)
        lengths += [len(s.text) for s in snippets]
        starts_ok += sum(s.start in sentence_starts for s in snippets)
        ends_ok += sum(s.end in sentence_ends for s in snippets)
        for a, b in itertools.pairwise(snippets):
            shared.append(max(0, a.end - b.start))
            overlapping += a.end > b.start
    # Questions with an answer text lying whole inside one of their relevant snippets.
    whole = {
        p.query_id
        for p in pairs
        if p.relevant and any(answer in p.text for answer in p.meta["answers"])
    }
    n_queries = len({p.query_id for p in pairs})
    return {
        "snippets": n,
        "mean_length": float(np.mean(lengths)),
        "max_length": int(max(lengths)),
        "start_at_sentence": starts_ok / n,
        "end_at_sentence": ends_ok / n,
        "neighbours_overlapping": overlapping / max(1, len(shared)),
        "mean_overlap_chars": float(np.mean(shared)) if shared else 0.0,
        "queries_answer_whole_in_a_snippet": len(whole) / n_queries,
        "relevant_pairs": sum(p.relevant == 1 for p in pairs),
        "pairs": len(pairs),
    }


CURVE_ALPHAS = (0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25)


def answers_kept(
    pairs: Sequence[Pair], data: ScoredData, alphas: Sequence[float], splits: int
) -> dict[float, tuple[float, float]]:
    """Per alpha: snippet removal, and the share of test questions keeping an answer whole.

    The same splits and marginal calibration as ``evaluate_scores`` (half of the topics,
    seed 0). Unlike snippet coverage, the answer share does not depend on how many
    snippets overlap an answer, so two chunkers can be compared at equal removal.
    """
    whole = np.array(
        [bool(p.relevant) and any(a in p.text for a in p.meta["answers"]) for p in pairs]
    )
    draws = group_splits(
        data.group_index.tolist(), calibration_fraction=0.5, n_splits=splits, seed=0
    )
    out: dict[float, tuple[float, float]] = {}
    for alpha in alphas:
        removal, shares = [], []
        for cal, test in draws:
            calibrator = make_calibrator("marginal", alpha=alpha)
            calibrator.fit(data.scores[cal], data.relevant[cal])
            kept = calibrator.predict(data.scores[test])
            queries = data.query_index[test]
            hit = np.zeros(int(data.query_index.max()) + 1, dtype=bool)
            hit[queries[kept & whole[test]]] = True
            shares.append(hit[np.unique(queries)].mean())
            removal.append(1 - kept.mean())
        out[alpha] = (float(np.mean(removal)), float(np.mean(shares)))
    return out


def measure(
    name: str, chunk: ChunkFn, scorer: EmbeddingScorer, alphas: list[float], splits: int
) -> dict[str, Any]:
    """Pairs, scores and the conformal sweep of one chunker."""
    t0 = time.perf_counter()
    pairs = load_xquad("en", chunker=chunk, download=False)
    scores = scorer.score_pairs(pairs)
    print(f"{name}: {len(pairs)} pairs scored in {time.perf_counter() - t0:.1f} s", flush=True)
    data = ScoredData.from_pairs(pairs, scores)
    report = evaluate_scores(
        data,
        alphas=alphas,
        top_k=[],
        thetas=[],
        n_splits=splits,
        seed=0,
        calibrated_baselines=False,
    )
    rows = {
        r["alpha"]: {
            k: r[k]
            for k in (
                "coverage_mean",
                "coverage_se",
                "query_coverage_mean",
                "removal_mean",
                "removal_chars_mean",
            )
        }
        for r in report.rows("conformal")
    }
    curve = answers_kept(pairs, data, sorted({*alphas, *CURVE_ALPHAS}), splits)
    for alpha in alphas:
        rows[alpha]["questions_answer_kept_whole"] = curve[alpha][1]
    return {
        "shape": shape(chunk, paragraphs(pairs), pairs),
        "alphas": rows,
        "curve": {str(a): {"removal": r, "answer_kept": k} for a, (r, k) in curve.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.2])
    ap.add_argument("--rev", default="HEAD", help="git revision of the old chunker")
    ap.add_argument("--cache-dir", default=None, help="embedding cache directory")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()

    tmp: str | None = None
    if args.cache_dir:
        cache = Path(args.cache_dir)
    elif os.environ.get("RAGSIEVE_CACHE"):
        cache = cache_dir() / "embeddings"
    else:
        tmp = tempfile.mkdtemp(prefix="ragsieve-bench-chunking-")
        cache = Path(tmp)
    scorer = EmbeddingScorer("all-MiniLM-L6-v2", cache_dir=cache)
    try:
        old = old_chunker(args.rev)
        results = {
            f"old ({args.rev})": measure("old", old.Chunker(), scorer, args.alphas, args.splits),
            "new (working tree)": measure(
                "new", chunking.Chunker(), scorer, args.alphas, args.splits
            ),
        }
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    names = list(results)
    print(f"\nXQuAD-en, Chunker() defaults (500 / 100), {args.splits} topic-disjoint splits")
    print(f"{'':<38}" + "".join(f"{n:>22}" for n in names))
    for key in results[names[0]]["shape"]:
        vals = [results[n]["shape"][key] for n in names]
        cells = "".join(f"{v:>22.3f}" if isinstance(v, float) else f"{v:>22}" for v in vals)
        print(f"{key:<38}{cells}")
    for alpha in args.alphas:
        for key in results[names[0]]["alphas"][alpha]:
            label = f"alpha {alpha}: {key}"
            cells = "".join(f"{results[n]['alphas'][alpha][key]:>22.4f}" for n in names)
            print(f"{label:<38}{cells}")
    print("\nTrade-off (marginal mode): snippet removal / questions keeping an answer whole")
    print(f"{'alpha':<8}" + "".join(f"{n:>30}" for n in names))
    for alpha in results[names[0]]["curve"]:
        cells = "".join(
            f"{results[n]['curve'][alpha]['removal']:>20.3f} / "
            f"{results[n]['curve'][alpha]['answer_kept']:.3f}"
            for n in names
        )
        print(f"{alpha:<8}{cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
