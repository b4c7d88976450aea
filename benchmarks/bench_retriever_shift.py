"""Calibrate on one kind of list, deploy on others: coverage, removal and the list check of
every score, per deployment list, side by side in one run (issue 30, "Calibrate what you
deploy").

For each dataset (default XQuAD en and SelQA dev; any :func:`ragsieve.data.load_dataset`
name) and each of ``--splits`` random topic-disjoint halves (``group_splits``, seed
``--seed``: calibration topics / test topics), the script builds the lists a filter meets
after a retriever, each over one half's topics only (a snippet is relevant for a query iff
it is one of the query's relevant snippets in the data set, same ``snippet_id``):

``own``
    the data set's own lists (XQuAD: the snippets of the question's article; SelQA: the
    packed candidate sentences of one section);
``bm25-5``, ``bm25-10``, ``bm25-20``
    the BM25 top k (``ragsieve.scoring.lexical.tokenize``, a sparse Lucene-style BM25,
    k1 1.5, b 0.75) of the pooled corpus of the half's unique snippets;
``dense-10``
    the dense top 10 of the same pool with the language's bundled embedder;
``own+6``
    the own list plus 6 random snippets of the half's other topics;
``top-3``
    the own list cut to its 3 best by the embedder's cosine.

Scores (``--scores``; ``reader`` and ``portable-reader``, the presets with the fine-tuned
reader, on request only): ``embedding`` (``1 - cos``), ``relative`` (gap), the fused presets
``fast``, ``base``, ``quality`` (list-aware) and ``portable`` (list-free), the default
``auto`` and ``field``: an outside score, the BM25 of the snippet against the pooled corpus
of its half (``Pair.meta["bm25"]``, higher is better). Each is calibrated with
``ConformalFilter(scorer, alpha=a).calibrate(pairs, lists=..., seed=split)`` on the
calibration topics twice:

(A) on their own lists (``lists="data"``: a labelled data set as it comes), then applied
    with ``filter_pairs`` to every deployment list set of the test topics;
(B) through the retriever: on the calibration topics' ``bm25-10`` / ``dense-10`` lists
    (the pairs carry ``meta["retriever"]``, so ``calibrate`` records them as the deployed
    retriever's), applied to the same retriever's lists of the test topics.

Per (dataset, score, calibration, deployment, alpha), means over the splits and their
min-max: coverage (kept relevant / relevant pairs of the test lists), removal (removed /
all), the share of test lists flagged ``lists_unlike`` and the splits in which the
sequential alarm fired (``list_watch.state()``; each deployment starts a fresh watch,
``ConformalFilter.watch_lists()``), and the share of lists the filter emptied. A cell is
marked ``*`` where the filter warned in every split (half or more of the lists flagged, or
the alarm fired) and ``(*)`` where it warned in some. Verdict lines per (dataset, alpha):
does ``auto`` keep coverage within ``--tolerance`` of ``1 - alpha`` on every deployment
list, or warn where it does not; does each list-aware fused score calibrated through the
retriever hold coverage and remove at least what ``1 - cos`` (calibrated the same way)
removes on the same lists; every cell whose mean coverage falls short without a warning;
the cells that emptied a quarter of the lists or more; and the single splits whose
coverage fell short without a warning, counted apart for shifted lists and for lists like
the calibration lists (whose shortfalls are the spread of topic-disjoint splits).

Every score shares one persistent embedding cache (``--cache-dir``), so a text is embedded
once per model. A filter is calibrated per alpha; its deployment lists are filtered once
(by the first alpha's filter) and the other alphas' keep-masks come from their
calibrator's rule on the same scores when their fitted score and calibration lists are the
same (checked; otherwise they are filtered again).

Usage::

    python benchmarks/bench_retriever_shift.py [--data xquad-en,selqa-dev] [--splits 5]
        [--alpha 0.1,0.2] [--scores embedding,relative,fast,base,quality,portable,auto,field]
        [--tolerance 0.03] [--seed 0] [--cache-dir DIR] [--quiet]
        [--out table.md] [--json rows.json] [--tables-from rows.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from ragsieve import ConformalFilter
from ragsieve._paths import cache_dir
from ragsieve.data import group_splits, load_dataset
from ragsieve.scoring import AutoScorer, EmbeddingScorer, FusedScorer, RelativeScorer
from ragsieve.scoring.field import FieldScorer
from ragsieve.scoring.lexical import tokenize
from ragsieve.types import RETRIEVER_KEY, Pair

DATASETS = ("xquad-en", "selqa-dev")
ALPHAS = (0.1, 0.2)
SCORES = ("embedding", "relative", "fast", "base", "quality", "portable", "auto", "field")
#: Scores measured on request only (``--scores``): the presets with the fine-tuned reader.
READER_SCORES = ("reader", "portable-reader", "quality-reader")
LABELS = {"embedding": "1 - cos", "relative": "relative (gap)", "fast": "fused fast",
          "base": "fused base", "quality": "fused quality", "portable": "portable",
          "auto": "auto", "field": "field (BM25)", "reader": "fused reader",
          "portable-reader": "portable reader"}
#: The list-aware fused presets (the issue's bar is set for them).
LIST_AWARE_FUSED = ("fast", "base", "quality")
DEPLOYMENTS = ("own", "bm25-5", "bm25-10", "bm25-20", "dense-10", "own+6", "top-3")
#: The deployment lists also calibrated through their own retriever (B).
THROUGH = ("bm25-10", "dense-10")
EXTRA = 6  # own+6: snippets of other topics added to each own list
CUT = 3  # top-3: the own list cut to its best by cosine
FIELD = "bm25"
#: The verdicts name the cells whose filter emptied at least this share of the lists.
EMPTIED = 0.25


# ---------------------------------------------------------------------------- the corpus
@dataclass(frozen=True)
class Query:
    qid: str
    text: str
    topic: str
    relevant: frozenset[str]
    own: tuple[str, ...]  # the data set's list, in its order


@dataclass
class Corpus:
    """One dataset: its queries, its snippets (text, topic), their unit vectors and tokens."""

    name: str
    language: str
    model: str
    queries: dict[str, Query]
    texts: dict[str, str]
    topic_of: dict[str, str]
    qvec: dict[str, np.ndarray]
    svec: dict[str, np.ndarray]
    qtok: dict[str, list[str]]
    stok: dict[str, list[str]]

    def topics(self) -> list[str]:
        return sorted({q.topic for q in self.queries.values()})


def language_of(name: str, pairs: Sequence[Pair]) -> str:
    """The dataset's language: ``meta["language"]`` of its pairs, else ``xquad-XX``'s, else en."""
    found = pairs[0].meta.get("language") if pairs else None
    if isinstance(found, str) and found:
        return found
    return name.split("-", 1)[1] if name.startswith("xquad-") else "en"


def load_corpus(name: str, embedder: EmbeddingScorer, language: str,
                pairs: Sequence[Pair]) -> Corpus:
    """Queries, snippets, vectors (through ``embedder``'s cache) and BM25 tokens of ``pairs``."""
    own: dict[str, list[str]] = {}
    meta: dict[str, tuple[str, str]] = {}
    relevant: dict[str, set[str]] = {}
    texts: dict[str, str] = {}
    topic_of: dict[str, str] = {}
    for p in pairs:
        own.setdefault(p.query_id, []).append(p.snippet_id)
        meta.setdefault(p.query_id, (p.query, str(p.group)))
        relevant.setdefault(p.query_id, set())
        if p.relevant == 1:
            relevant[p.query_id].add(p.snippet_id)
        texts[p.snippet_id] = p.text
        topic_of[p.snippet_id] = str(p.group)
    queries = {q: Query(q, meta[q][0], meta[q][1], frozenset(relevant[q]), tuple(ids))
               for q, ids in own.items()}
    sids, qids = list(texts), list(queries)
    svecs = embedder.cache.embed([texts[s] for s in sids])
    qvecs = embedder.cache.embed([queries[q].text for q in qids], kind="query")
    return Corpus(name, language, embedder.model_id, queries, texts, topic_of,
                  dict(zip(qids, _unit(qvecs), strict=True)),
                  dict(zip(sids, _unit(svecs), strict=True)),
                  {q: tokenize(queries[q].text) for q in qids},
                  {s: tokenize(texts[s]) for s in sids})


def _unit(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


# ------------------------------------------------------------------------------ retrievers
def bm25_matrix(query_tokens: Sequence[Sequence[str]], doc_tokens: Sequence[Sequence[str]], *,
                k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 (Lucene's idf, as :func:`ragsieve.scoring.lexical.bm25_scores`) of every
    query against every document, the documents being the corpus: ``(queries, docs)``."""
    vocab: dict[str, int] = {}
    rows, cols, tfs = [], [], []
    for i, doc in enumerate(doc_tokens):
        for term, tf in Counter(doc).items():
            rows.append(i)
            cols.append(vocab.setdefault(term, len(vocab)))
            tfs.append(tf)
    n = len(doc_tokens)
    r, c, tf = np.array(rows), np.array(cols), np.array(tfs, dtype=np.float64)
    lengths = np.array([len(d) for d in doc_tokens], dtype=np.float64)
    norm = k1 * (1.0 - b + b * lengths / max(lengths.mean(), 1e-12))
    df = np.bincount(c, minlength=len(vocab))
    idf = np.log1p((n - df + 0.5) / (df + 0.5))
    weights = sparse.csr_matrix((idf[c] * tf / (tf + norm[r]), (r, c)), shape=(n, len(vocab)))
    q_rows, q_cols, q_counts = [], [], []
    for i, query in enumerate(query_tokens):
        for term, times in Counter(query).items():
            if term in vocab:
                q_rows.append(i)
                q_cols.append(vocab[term])
                q_counts.append(times)
    q = sparse.csr_matrix((np.array(q_counts, dtype=np.float64), (q_rows, q_cols)),
                          shape=(len(query_tokens), len(vocab)))
    return np.asarray((q @ weights.T).todense())


@dataclass
class Half:
    """One half of a split: its queries, its pool, the lists of every deployment and the
    outside score (BM25 against the pool) of every (query, pool snippet)."""

    qids: list[str]
    lists: dict[str, dict[str, list[str]]]
    bm25: dict[str, dict[str, float]]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties by position)."""
    k = min(k, scores.size)
    return np.argsort(-scores, kind="stable")[:k]


def build_half(corpus: Corpus, topics: Iterable[str], seed: int) -> Half:
    topics = set(topics)
    qids = [q for q, query in corpus.queries.items() if query.topic in topics]
    pool = [s for s, t in corpus.topic_of.items() if t in topics]
    bm = bm25_matrix([corpus.qtok[q] for q in qids], [corpus.stok[s] for s in pool])
    svecs = np.stack([corpus.svec[s] for s in pool])
    dense = np.stack([corpus.qvec[q] for q in qids]) @ svecs.T
    rng = np.random.default_rng(seed)
    lists: dict[str, dict[str, list[str]]] = {d: {} for d in DEPLOYMENTS}
    for i, qid in enumerate(qids):
        query = corpus.queries[qid]
        lists["own"][qid] = list(query.own)
        for k in (5, 10, 20):
            lists[f"bm25-{k}"][qid] = [pool[j] for j in top_k(bm[i], k)]
        lists["dense-10"][qid] = [pool[j] for j in top_k(dense[i], 10)]
        others = [s for s in pool if corpus.topic_of[s] != query.topic]
        extra = rng.choice(len(others), size=min(EXTRA, len(others)), replace=False)
        lists["own+6"][qid] = [*query.own, *(others[j] for j in sorted(extra))]
        cos = np.array([corpus.qvec[qid] @ corpus.svec[s] for s in query.own])
        lists["top-3"][qid] = [query.own[j] for j in sorted(top_k(cos, CUT))]
    bm25 = {qid: dict(zip(pool, bm[i].tolist(), strict=True)) for i, qid in enumerate(qids)}
    return Half(qids, lists, bm25)


def retriever_identity(deployment: str, model: str) -> dict[str, Any] | None:
    """The identity the pairs of a retriever's list carry (None for the data set's lists)."""
    if deployment.startswith("bm25-"):
        return {"kind": "benchmark", "retriever": "bm25-pooled", "k": int(deployment[5:])}
    if deployment.startswith("dense-"):
        return {"kind": "benchmark", "retriever": "dense-pooled", "model": model,
                "k": int(deployment[6:])}
    return None


def list_pairs(corpus: Corpus, half: Half, deployment: str) -> list[Pair]:
    """The labelled pairs of one deployment's lists of ``half``, in query order."""
    identity = retriever_identity(deployment, corpus.model)
    out = []
    for qid, sids in half.lists[deployment].items():
        query = corpus.queries[qid]
        for sid in sids:
            meta: dict[str, Any] = {FIELD: half.bm25[qid][sid]}
            if identity is not None:
                meta[RETRIEVER_KEY] = identity
            out.append(Pair(qid, query.text, sid, corpus.texts[sid],
                            int(sid in query.relevant), group=query.topic, meta=meta))
    return out


# ------------------------------------------------------------------------------- scores
def make_scorer(score: str, base: EmbeddingScorer, language: str, cache: str) -> Any:
    """A fresh (unfitted where it fits) scorer of ``score`` over the shared base embedder."""
    if score == "embedding":
        return base
    if score == "relative":
        return RelativeScorer(base, kind="gap")
    if score in ("fast", "base", "quality", "portable", *READER_SCORES):
        return FusedScorer.unfitted(base, preset=score)
    if score == "auto":
        return AutoScorer(language=language, cache_dir=cache, batch_size=base.batch_size)
    if score == "field":
        return FieldScorer(field=FIELD, higher_is_better=True)
    raise ValueError(f"score == {score!r}, must be one of {', '.join(SCORES + READER_SCORES)}.")


def calibrate(score: str, base: EmbeddingScorer, corpus: Corpus, pairs: list[Pair],
              alphas: Sequence[float], lists: str | None, split: int,
              cache: str) -> dict[float, ConformalFilter]:
    """One filter per alpha, each calibrated on ``pairs`` (``lists`` says where they come
    from: ``"data"``, or None to read the retriever identity they carry)."""
    return {a: ConformalFilter(make_scorer(score, base, corpus.language, cache), alpha=a)
            .calibrate(pairs, lists=lists, seed=split, language=corpus.language)
            for a in alphas}


def _same(one: ConformalFilter, other: ConformalFilter) -> bool:
    """The two filters score alike and hold the same calibration lists."""
    lists = [f.lists.to_dict() if f.lists is not None else None for f in (one, other)]
    return one.scorer_.spec() == other.scorer_.spec() and lists[0] == lists[1]


def _watch(flt: ConformalFilter, results: Mapping[str, Any]) -> dict[str, Any]:
    state = flt.list_watch.state() if flt.list_watch is not None else {}
    flagged = float(np.mean([r.lists_unlike for r in results.values()])) if results else 0.0
    return {"flagged": flagged, "alarm": bool(state.get("alarm", False)),
            "fired_at": state.get("fired_at"), "watch_active": bool(state.get("active", False)),
            "n_outside": state.get("n_outside", 0)}


def _keeps(flt: ConformalFilter, pairs: list[Pair], seed: int) -> tuple[np.ndarray, dict[str, Any],
                                                                         list[np.ndarray]]:
    """Filter ``pairs`` with a fresh list watch: the keep-mask (in pair order), the list
    check, and each query's scores (in pair order)."""
    flt.watch_lists()
    results = flt.filter_pairs(pairs, seed=seed)
    keep = np.zeros(len(pairs), dtype=bool)
    scores, start = [], 0
    for result in results.values():  # filter_pairs keys the queries in pair order
        for kept in result.kept:
            keep[start + kept.index] = True
        scores.append(np.asarray(result.scores, dtype=np.float64))
        start += result.n_input
    if start != len(pairs):
        raise RuntimeError(f"filter_pairs returned {start} snippets for {len(pairs)} pairs")
    return keep, _watch(flt, results), scores


def deploy(filters: Mapping[float, ConformalFilter], pairs: list[Pair],
           seed: int) -> dict[float, dict[str, Any]]:
    """Coverage, removal and the list check of each alpha's filter on ``pairs``."""
    relevant = np.array([p.relevant == 1 for p in pairs])
    alphas = list(filters)
    first = filters[alphas[0]]
    keep, watch, scores = _keeps(first, pairs, seed)
    out = {}
    for a in alphas:
        flt = filters[a]
        if a == alphas[0]:
            mask, check = keep, watch
        elif _same(first, flt):  # the same scores; this alpha's rule
            mask = np.concatenate([flt.calibrator_.predict(s) for s in scores])
            check = watch
        else:
            mask, check, _ = _keeps(flt, pairs, seed)
        starts = np.cumsum([0] + [s.size for s in scores[:-1]])
        emptied = float(np.mean(np.logical_or.reduceat(mask, starts) == 0)) if scores else 0.0
        out[a] = {"coverage": float(mask[relevant].mean()) if relevant.any() else float("nan"),
                  "removal": float(1.0 - mask.mean()), "threshold": flt.threshold,
                  "n_pairs": len(pairs), "n_relevant": int(relevant.sum()),
                  "n_lists": len(scores), "emptied": emptied, **check,
                  "warned": bool(check["flagged"] >= 0.5 or check["alarm"]),
                  "score_spec_shared": flt is first or _same(first, flt)}
    return out


def _check_rule(filters: Mapping[float, ConformalFilter], pairs: list[Pair], seed: int) -> None:
    """The first alpha's rule on its scores keeps what its ``filter_pairs`` keeps (the
    shortcut the other alphas take)."""
    first = next(iter(filters.values()))
    keep, _, scores = _keeps(first, pairs, seed)
    again = np.concatenate([first.calibrator_.predict(s) for s in scores])
    if not np.array_equal(keep, again):
        raise RuntimeError("the calibrator's rule on filter_pairs' scores disagrees with "
                           "filter_pairs; the alpha shortcut is not valid")


# ------------------------------------------------------------------------------ measuring
def run_split(corpus: Corpus, base: EmbeddingScorer, split: int, cal_topics: list[str],
              test_topics: list[str], args: argparse.Namespace,
              seconds: dict[str, float]) -> list[dict[str, Any]]:
    """Every (score, calibration, deployment, alpha) of one split."""
    cal = build_half(corpus, cal_topics, seed=args.seed * 1000 + 2 * split)
    test = build_half(corpus, test_topics, seed=args.seed * 1000 + 2 * split + 1)
    deployed = {d: list_pairs(corpus, test, d) for d in DEPLOYMENTS}
    calibrations: dict[str, tuple[list[Pair], str | None, tuple[str, ...]]] = {
        "own": (list_pairs(corpus, cal, "own"), "data", DEPLOYMENTS),
        **{d: (list_pairs(corpus, cal, d), None, (d,)) for d in THROUGH}}
    rows = []
    for score in args.scores:
        t0 = time.perf_counter()
        for cal_name, (cal_pairs, lists, targets) in calibrations.items():
            filters = calibrate(score, base, corpus, cal_pairs, args.alphas, lists, split,
                                args.cache_dir)
            first = next(iter(filters.values()))
            if split == 0 and cal_name == "own":
                _check_rule(filters, deployed["own"], seed=split)
            for d in targets:
                for a, m in deploy(filters, deployed[d], seed=split).items():
                    rows.append({"dataset": corpus.name, "score": score, "calibration": cal_name,
                                 "deployment": d, "alpha": a, "split": split,
                                 "spec": first.scorer_.spec()["scorer"],
                                 "choice": first.calibration_info.get("score_choice"),
                                 "cal_list_dependent": first.scorer_.tags.list_dependent, **m})
        seconds[score] = seconds.get(score, 0.0) + time.perf_counter() - t0
        if not args.quiet:
            print(f"{corpus.name} split {split} {score}: {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    return rows


def measure(name: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-split rows of one dataset and what it was run on."""
    t0 = time.perf_counter()
    pairs = load_dataset(name)
    language = language_of(name, pairs)
    base = EmbeddingScorer(language=language, cache_dir=args.cache_dir)
    corpus = load_corpus(name, base, language, pairs)
    topics = corpus.topics()
    splits = group_splits(topics, calibration_fraction=0.5, n_splits=args.splits, seed=args.seed)
    info = {"dataset": name, "language": language, "model": base.model_id,
            "n_queries": len(corpus.queries), "n_topics": len(topics),
            "n_snippets": len(corpus.texts), "prepare_seconds": round(time.perf_counter() - t0, 1),
            "score_seconds": {}}
    rows = []
    for split, (cal, test) in enumerate(splits):
        rows.extend(run_split(corpus, base, split, [topics[i] for i in cal],
                              [topics[i] for i in test], args, info["score_seconds"]))
    info["score_seconds"] = {k: round(v, 1) for k, v in info["score_seconds"].items()}
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return rows, info


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means over the splits (and min / max) per (dataset, score, calibration, deployment, alpha)."""
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["dataset"], r["score"], r["calibration"], r["deployment"], r["alpha"])
        cells.setdefault(key, []).append(r)
    out = []
    for (dataset, score, calibration, deployment, alpha), rs in cells.items():
        cov = np.array([r["coverage"] for r in rs])
        rem = np.array([r["removal"] for r in rs])
        out.append({
            "dataset": dataset, "score": score, "calibration": calibration,
            "deployment": deployment, "alpha": alpha, "n_splits": len(rs),
            "coverage": float(np.nanmean(cov)), "coverage_min": float(np.nanmin(cov)),
            "coverage_max": float(np.nanmax(cov)), "removal": float(rem.mean()),
            "removal_min": float(rem.min()), "removal_max": float(rem.max()),
            "flagged": float(np.mean([r["flagged"] for r in rs])),
            "emptied": float(np.mean([r["emptied"] for r in rs])),
            "alarms": sum(r["alarm"] for r in rs), "warned": sum(r["warned"] for r in rs),
            "watch_active": sum(r["watch_active"] for r in rs),
            "specs": sorted({r["spec"] for r in rs}),
            "n_pairs": float(np.mean([r["n_pairs"] for r in rs])),
            "n_relevant": float(np.mean([r["n_relevant"] for r in rs])),
            "n_lists": float(np.mean([r["n_lists"] for r in rs]))})
    return out


# ------------------------------------------------------------------------------- reporting
def _key(cell: Mapping[str, Any]) -> tuple[str, str]:
    return cell["calibration"], cell["deployment"]


ROWS = [("own", d) for d in DEPLOYMENTS] + [(d, d) for d in THROUGH]


def row_label(calibration: str, deployment: str) -> str:
    if calibration == "own":
        return f"`{deployment}`"
    return f"`{deployment}`, **calibrated through {calibration}**"


def mark(cell: Mapping[str, Any]) -> str:
    if cell["warned"] == cell["n_splits"]:
        return "*"
    return "(*)" if cell["warned"] else ""


def table(summary: list[dict[str, Any]], dataset: str, alpha: float,
          scores: Sequence[str]) -> str:
    """Rows = deployment lists (calibrated on the own lists, then through the retriever),
    columns = scores, cells ``coverage / removal``."""
    by = {(c["score"], *_key(c)): c for c in summary
          if c["dataset"] == dataset and c["alpha"] == alpha}
    lines = ["| lists (calibrated on own lists unless said) | " +
             " | ".join(LABELS[s] for s in scores) + " |",
             "|---|" + "---|" * len(scores)]
    for cal, dep in ROWS:
        cells = []
        for s in scores:
            c = by.get((s, cal, dep))
            cells.append("—" if c is None else
                         f"{c['coverage']:.3f} / {c['removal']:.3f}{mark(c)}")
        lines.append(f"| {row_label(cal, dep)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_table(summary: list[dict[str, Any]], dataset: str, alpha: float,
                 scores: Sequence[str]) -> str:
    """Coverage, lowest and highest split, per row and score."""
    by = {(c["score"], *_key(c)): c for c in summary
          if c["dataset"] == dataset and c["alpha"] == alpha}
    lines = ["| lists | " + " | ".join(LABELS[s] for s in scores) + " |",
             "|---|" + "---|" * len(scores)]
    for cal, dep in ROWS:
        cells = []
        for s in scores:
            c = by.get((s, cal, dep))
            cells.append("—" if c is None else f"{c['coverage_min']:.3f}-{c['coverage_max']:.3f}")
        lines.append(f"| {row_label(cal, dep)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def watch_table(summary: list[dict[str, Any]], dataset: str, alpha: float,
                scores: Sequence[str]) -> str:
    """Share of test lists flagged ``lists_unlike`` and splits whose alarm fired, for the
    scores whose watch is active (list-aware) in some split."""
    active = [s for s in scores if any(c["score"] == s and c["watch_active"] for c in summary
                                       if c["dataset"] == dataset)]
    if not active:
        return ""
    by = {(c["score"], *_key(c)): c for c in summary
          if c["dataset"] == dataset and c["alpha"] == alpha}
    lines = ["| lists | " + " | ".join(f"{LABELS[s]}: flagged, alarms" for s in active) + " |",
             "|---|" + "---|" * len(active)]
    for cal, dep in ROWS:
        cells = []
        for s in active:
            c = by.get((s, cal, dep))
            cells.append("—" if c is None else f"{c['flagged']:.2f}, {c['alarms']}/{c['n_splits']}"
                         if c["watch_active"] else "list-free")
        lines.append(f"| {row_label(cal, dep)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(summary: list[dict[str, Any]], dataset: str, alpha: float,
             tolerance: float) -> list[str]:
    """The verdict lines of one (dataset, alpha)."""
    by = {(c["score"], *_key(c)): c for c in summary
          if c["dataset"] == dataset and c["alpha"] == alpha}
    floor = 1 - alpha - tolerance
    out = []
    auto = [(k, c) for k, c in by.items() if k[0] == "auto"]
    if auto:
        short = [c for _, c in auto if c["coverage"] < floor]
        silent = [c for c in short if c["warned"] < c["n_splits"]]
        ok = not silent
        detail = "; ".join(f"{_where(c)} {c['coverage']:.3f}{mark(c)}" for c in short) or "none"
        ref = [f"{LABELS[s]} {by[(s, 'own', 'own')]['coverage']:.3f}"
               for s in ("auto", "embedding") if (s, "own", "own") in by]
        out.append(f"{dataset}, alpha {alpha}: default `auto` keeps coverage >= {floor:.2f} on "
                   f"every deployment list or warns where it does not: **{'yes' if ok else 'NO'}** "
                   f"(short: {detail}; on the own lists it was calibrated on: {', '.join(ref)})")
    for preset in LIST_AWARE_FUSED:
        for d in THROUGH:
            c, cos = by.get((preset, d, d)), by.get(("embedding", d, d))
            if c is None or cos is None:
                continue
            holds = c["coverage"] >= floor
            removes = c["removal"] >= cos["removal"]
            out.append(f"{dataset}, alpha {alpha}: fused {preset} calibrated through {d}: "
                       f"coverage {c['coverage']:.3f} (>= {floor:.2f}: "
                       f"{'yes' if holds else 'NO'}), removal {c['removal']:.3f} vs 1 - cos "
                       f"{cos['removal']:.3f} (>=: {'yes' if removes else 'NO'}): "
                       f"**{'meets the bar' if holds and removes else 'MISSES the bar'}**")
    out.extend(_shortfalls(by, dataset, alpha, floor))
    emptied = [f"{LABELS[k[0]]} on {_where(c)} {c['emptied']:.2f}{mark(c)}"
               for k, c in sorted(by.items()) if c.get("emptied", 0.0) >= EMPTIED]
    if emptied:
        out.append(f"{dataset}, alpha {alpha}: share of the lists the filter emptied (kept "
                   f"nothing), where {EMPTIED:.0%} or more: " + "; ".join(emptied))
    return out


def _shortfalls(by: Mapping[tuple[str, str, str], Mapping[str, Any]], dataset: str,
                alpha: float, floor: float) -> list[str]:
    """Per score, the cells whose mean coverage is below ``floor`` with no warning in any
    split, beside the score's coverage where its calibration lists are exchangeable with
    the deployment (the ``own`` row; through the retriever, the row itself)."""
    out = []
    for score in SCORES:
        cells = [c for k, c in by.items() if k[0] == score]
        silent = [c for c in cells if c["coverage"] < floor and not c["warned"]]
        if not silent:
            continue
        aware = any(c["watch_active"] for c in cells if c["calibration"] == "own")
        same = [c for c in silent if c["calibration"] != "own" or c["deployment"] == "own"]
        shifted = [c for c in silent if c not in same]
        ref = by.get((score, "own", "own"))
        parts = []
        if shifted:
            parts.append("on shifted lists " + ", ".join(
                f"{_where(c)} {c['coverage']:.3f}" for c in shifted))
        if same:
            parts.append("on lists like its calibration lists " + ", ".join(
                f"{_where(c)} {c['coverage']:.3f}" for c in same))
        kind = "list-aware" if aware else "list-free"
        out.append(f"{dataset}, alpha {alpha}: coverage < {floor:.2f} without a warning, "
                   f"{LABELS[score]} ({kind}): " + "; ".join(parts) +
                   (f" (own lists, calibrated on own lists: {ref['coverage']:.3f})"
                    if ref is not None and shifted else ""))
    return out


def split_shortfalls(rows: list[dict[str, Any]], dataset: str, alpha: float,
                     floor: float) -> str:
    """One line: the splits whose coverage fell below ``floor`` with no warning, counted
    for list-aware and list-free scores (as calibrated), on shifted lists (calibrated on
    the own lists, deployed on others) and on lists like the calibration lists (own on own,
    through the retriever), the list-aware shifted ones named."""
    found: dict[tuple[bool, bool], list[dict[str, Any]]] = {}
    totals: Counter[tuple[bool, bool]] = Counter()
    for r in rows:
        if r["dataset"] != dataset or r["alpha"] != alpha:
            continue
        key = (bool(r["watch_active"]), r["calibration"] == "own" and r["deployment"] != "own")
        totals[key] += 1
        if r["coverage"] < floor and not r["warned"]:
            found.setdefault(key, []).append(r)
    parts = []
    for aware in (True, False):
        for shifted in (True, False):
            hits = found.get((aware, shifted), [])
            part = (f"{'list-aware' if aware else 'list-free'} scores on "
                    f"{'shifted lists' if shifted else 'lists like their calibration lists'} "
                    f"{len(hits)} of {totals[(aware, shifted)]}")
            if aware and shifted and hits:
                part += " (" + ", ".join(f"{LABELS[r['score']]} {r['deployment']} split "
                                         f"{r['split']} {r['coverage']:.3f}" for r in hits) + ")"
            parts.append(part)
    return (f"{dataset}, alpha {alpha}: single splits with coverage < {floor:.2f} and no "
            "warning: " + "; ".join(parts))


def _where(c: Mapping[str, Any]) -> str:
    if c["calibration"] == "own":
        return c["deployment"]
    return f"{c['deployment']} (through {c['calibration']})"


def dataset_tables(summary: list[dict[str, Any]], info: Mapping[str, Any],
                   args: argparse.Namespace, scores: Sequence[str]) -> list[str]:
    """The Markdown parts of one dataset: timing, per alpha the main and the spread table,
    and the list-check table (once when it is the same at every alpha)."""
    name = info["dataset"]
    timing = ", ".join(f"{LABELS[s]} {info['score_seconds'].get(s, 0):.0f} s" for s in scores)
    parts = [(f"### `{name}` ({info['language']}, {info['model']}; {info['n_queries']} "
              f"queries, {info['n_topics']} topics, {info['n_snippets']} snippets)\n\n"
              f"Seconds per score (calibrations and deployments, all splits and alphas): "
              f"{timing}; data and vectors {info['prepare_seconds']:.0f} s.")]
    first = watch_table(summary, name, args.alphas[0], scores)
    for alpha in args.alphas:
        parts.append(f"**{name}, alpha {alpha}** (target coverage {1 - alpha:.2f}; "
                     "`coverage / removal`, means over the splits; `*` warned in every "
                     "split, `(*)` in some)\n\n" + table(summary, name, alpha, scores))
        if args.splits > 1:
            parts.append(f"Coverage range over the {args.splits} splits, {name}, alpha "
                         f"{alpha}\n\n" + spread_table(summary, name, alpha, scores))
        found = watch_table(summary, name, alpha, scores)
        if found and found != first:
            parts.append(f"List check, {name}, alpha {alpha}: share of the test lists "
                         "flagged `lists_unlike`, splits whose sequential alarm fired\n\n"
                         + found)
    if first:
        parts.append(f"List check, {name} (every alpha unless shown above): share of the "
                     "test lists flagged `lists_unlike`, splits whose sequential alarm "
                     "fired\n\n" + first)
    return parts


def report(rows: list[dict[str, Any]], summary: list[dict[str, Any]],
           infos: list[dict[str, Any]], args: argparse.Namespace) -> tuple[str, list[str]]:
    """The Markdown tables of every dataset and the verdict lines."""
    scores = [s for s in SCORES + READER_SCORES if s in args.scores]
    parts, lines = [], []
    for info in infos:
        parts.extend(dataset_tables(summary, info, args, scores))
        for alpha in args.alphas:
            lines.extend(verdicts(summary, info["dataset"], alpha, args.tolerance))
            lines.append(split_shortfalls(rows, info["dataset"], alpha,
                                          1 - alpha - args.tolerance))
    return "\n\n".join(parts), lines


def git_state() -> str:
    """``git describe --always --dirty`` of the repository, or ``unknown``."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--tags"],
                              cwd=Path(__file__).resolve().parents[1], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_list(text: str, allowed: Sequence[str] | None, flag: str) -> list[str]:
    found = [x.strip() for x in text.split(",") if x.strip()]
    if not found:
        raise SystemExit(f"{flag} {text!r}: give at least one")
    if allowed is not None:
        unknown = sorted(set(found) - set(allowed))
        if unknown:
            raise SystemExit(f"{flag} {text!r}: unknown {unknown}; choose from {', '.join(allowed)}")
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--data", default=",".join(DATASETS),
                    help="datasets (load_dataset names), comma-separated")
    ap.add_argument("--splits", type=int, default=5, help="topic-disjoint halves")
    ap.add_argument("--alpha", default=",".join(map(str, ALPHAS)),
                    help="target miscoverage(s), comma-separated")
    ap.add_argument("--scores", default=",".join(SCORES),
                    help=f"scores, comma-separated, from {', '.join(SCORES)}")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="coverage may fall this far below 1 - alpha in the verdicts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=str(cache_dir() / "embeddings"),
                    help="persistent embedding cache directory (shared by every score)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables here")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    ap.add_argument("--tables-from", type=Path, default=None,
                    help="print the tables of an earlier run's --json file (no measurement)")
    args = ap.parse_args(argv)
    args.names = parse_list(args.data, None, "--data")
    args.scores = parse_list(args.scores, SCORES + READER_SCORES, "--scores")
    try:
        args.alphas = [float(a) for a in parse_list(args.alpha, None, "--alpha")]
    except ValueError as exc:
        raise SystemExit(f"--alpha {args.alpha!r}: {exc}") from exc
    if any(not 0 < a < 1 for a in args.alphas) or not 1 <= args.splits <= 10_000:
        raise SystemExit("--alpha must lie in (0, 1) and --splits in [1, 10000]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the list watch's warnings are counted, not shown
    if args.tables_from:
        saved = json.loads(args.tables_from.read_text(encoding="utf-8"))
        args.scores, args.alphas = saved["scores"], saved["alphas"]
        args.splits, args.tolerance = saved["splits"], saved["tolerance"]
        text, lines = report(saved["rows"], saved["summary"], saved["datasets"], args)
        print(f"{saved['header']}\n\n{text}\n\n" + "\n".join(f"- {v}" for v in lines))
        return 0
    command = "python benchmarks/bench_retriever_shift.py " + shlex.join(sys.argv[1:])
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    state = git_state()
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    rows, infos = [], []
    for name in args.names:
        found, info = measure(name, args)
        rows.extend(found)
        infos.append(info)
    seconds = time.perf_counter() - t0
    load.append(os.getloadavg()[0])
    summary = summarise(rows)
    header = (f"`{command}`: measured {started} in one run (ragsieve at `{state}`), "
              f"{seconds / 60:.1f} min wall time "
              f"on {platform.node()} ({os.cpu_count()} cores, 1-minute load average "
              f"{load[0]:.2f} at the start, {load[1]:.2f} at the end); {args.splits} "
              f"split(s) into topic-disjoint halves (seed {args.seed}), marginal mode, alpha "
              f"{', '.join(map(str, args.alphas))}.")
    text, lines = report(rows, summary, infos, args)
    out = f"{header}\n\n{text}\n\n" + "\n".join(f"- {v}" for v in lines)
    print(out)
    if args.out:
        args.out.write_text(out + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(
            {"header": header, "command": command, "started": started, "seconds": seconds,
             "load": load, "scores": args.scores, "alphas": args.alphas, "splits": args.splits,
             "seed": args.seed, "tolerance": args.tolerance, "datasets": infos,
             "summary": summary, "verdicts": lines, "rows": rows}, indent=1, default=str),
            encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
