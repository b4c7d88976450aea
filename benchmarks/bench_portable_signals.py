"""List-free signals for a cheaper ``portable`` score: what each adds, measured side by side.

Issue 52, item 1 (measure list-free signals, keep what helps) and item 2 (a default that costs
what ``1 - cos`` costs). For each dataset (XQuAD en, de, es, zh, el, ro and SelQA dev), with
the language's default embedder (as ``auto`` picks it: ``EmbeddingScorer(language=...)``):

* every pair gets, once, through the embedding cache: the base ``1 - cos``; the best
  sentence's ``1 - cos`` of the base model (``sentence-cos``: embeds every sentence, about
  doubling the model work of a snippet); and candidate lexical signals, each a function of
  (query, snippet[, the snippet's offset in its document]) only, so the score stays
  list-free (equal texts get equal scores in any list). Tokens are the product's
  (:func:`ragsieve.scoring.lexical.tokenize`: words, CJK character uni- and bigrams; the
  positional signals read the same words and CJK characters in order):

  ``idf-cov``   share of the query's IDF mass (distinct tokens) found in the snippet;
  ``cov``       share of the query's distinct tokens found in the snippet (no statistics);
  ``rare``      the largest IDF of a query token found, over the query's largest IDF;
  ``bigram``    share of the query's adjacent token pairs found adjacent in the snippet;
  ``phrase``    the longest run of consecutive query tokens found in the snippet, over the
                query's length (exact phrase match);
  ``proximity`` the most distinct query tokens inside one window of the snippet (twice the
                query's distinct tokens wide, at least 6), over the query's distinct tokens;
  ``length``    ``log(1 + tokens)`` of the snippet;
  ``position``  ``log(1 + start)`` and ``start == 0`` (character offset in its document);
  ``sent-lex``  the best sentence's ``idf-cov`` (sentences of :mod:`ragsieve.chunking`);
  ``sent-bm25`` the best sentence's frozen-corpus BM25 share.

  Every statistic learned from texts (the IDF of ``idf-cov``, ``rare``, ``sent-lex``; the
  BM25 corpus statistics of ``bm25-corpus`` and ``sent-bm25``) is fitted per split on the
  texts of the fit share of the calibration topics only (the product's ``CorpusStatistics``
  of those texts, as ``portable``'s BM25 is), never on the topics calibrated or tested on.
* per split (topic-disjoint, the same splits for every row; alpha 0.1, marginal mode) the
  fused score (logistic regression, as ``portable``) is fitted on a quarter of the
  calibration topics and calibrated on the rest, on ``evaluate``'s own path
  (``evaluate_scores(fusion_features=..., splits=[split])``, one call per split so that the
  paired split-to-split standard error of each row's difference to a reference row can be
  given; split ``i``'s fit share is drawn with seed ``seed + i``);
* rows: ``1 - cos``; ``portable`` (cos + corpus BM25 + best-sentence cos); ``P0`` =
  ``portable`` without the best-sentence cos; ``P0 + X`` for every candidate ``X``; ``cos +
  idf-cov + length`` (an earlier side check's set); then, from every dataset's ``P0 + X``,
  the *kept* candidates (removal above ``P0``'s by more than 2 paired standard errors on most
  datasets and below it by no more than 2 on any) and the rows ``P0 + kept``, ``portable + kept``,
  ``P0 + all``, and a greedy forward selection on the mean share of the oracle over the
  datasets (``P0 + greedy``: chosen on the data it is measured on, so optimistic);
* the cost per snippet, on one query of each of the first ``--sample-topics`` topics, of
  the model work (cold: models loaded, an in-memory cache, nothing embedded) of the base
  and of the sentences, and of the lexical signals (tokenize and compute, warm).

A row counts only if its mean coverage lies within 0.02 of 0.90.

Usage::

    python benchmarks/bench_portable_signals.py [--datasets xquad-en,...,selqa-dev]
        [--splits 20] [--seed 0] [--sample-topics 20] [--no-cost] [--no-greedy]
        [--max-topics [NAME=]N,...] [--sets-from EARLIER.json] [--out FILE] [--json FILE]

Prints the markdown tables (per dataset: coverage, removal ± split standard error, share
of the oracle's removal, difference to ``P0`` ± paired standard error; the keep decision;
the costs) to stdout and to ``--out``; ``--json`` holds every number.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragsieve.data import group_splits, load_dataset
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import EmbeddingScorer, SentenceCosineScorer
from ragsieve.scoring.corpus_bm25 import CorpusBM25Scorer, CorpusStatistics, PairTerms, _idf
from ragsieve.scoring.corpus_lexical import IDFCoverageScorer, SentenceBM25Scorer, SentenceTerms
from ragsieve.scoring.fusion import FusionFeatures, TextFittedSignals
from ragsieve.scoring.lexical import token_sequence as sequence
from ragsieve.scoring.sentence_cosine import _split, sentence_texts
from ragsieve.types import Pair

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_signals import _sample, signal_bench_parser, write_outputs

ALPHA = 0.1
COVERAGE_BAND = 0.02
CANDIDATES = ("idf-cov", "cov", "rare", "bigram", "phrase", "proximity", "length", "position",
              "sent-lex", "sent-bm25")
FITTED = frozenset({"bm25-corpus", "idf-cov", "rare", "sent-lex", "sent-bm25"})


def _language(name: str) -> str:
    return name.split("-", 1)[1] if name.startswith("xquad-") else "en"


# ---------------------------------------------------------------------- lexical signals
def _positional(query: list[str], text: list[str]) -> tuple[float, float, float]:
    """``1 - `` bigram share, phrase share and proximity share of one pair (1: no match)."""
    if not query:
        return 1.0, 1.0, 1.0
    qbig = set(itertools.pairwise(query))
    bigram = (len(qbig & set(itertools.pairwise(text))) / len(qbig)) if qbig else 0.0
    where: dict[str, list[int]] = {}
    for i, tok in enumerate(text):
        where.setdefault(tok, []).append(i)
    longest = 0
    for i, tok in enumerate(query):
        for p in where.get(tok, ()):
            n = 1
            while i + n < len(query) and p + n < len(text) and query[i + n] == text[p + n]:
                n += 1
            longest = max(longest, n)
    wanted = set(query)
    width = max(6, 2 * len(wanted))
    hits = [(i, tok) for i, tok in enumerate(text) if tok in wanted]
    best, counts, lo = 0, Counter[str](), 0
    for i, tok in hits:  # two pointers over the matched positions
        counts[tok] += 1
        while hits[lo][0] <= i - width:
            old = hits[lo][1]
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
            lo += 1
        best = max(best, len(counts))
    return 1.0 - bigram, 1.0 - longest / len(query), 1.0 - best / len(wanted)


@dataclass
class Lexical:
    """Every pair's lexical inputs, tokenized once; the IDF-based signals of any fit share."""

    terms: PairTerms  # (query, snippet) entries: the product's corpus-BM25 tokenization
    sentence_terms: PairTerms  # (query, sentence) entries
    sentence_owner: np.ndarray  # the pair of each sentence entry row
    fixed: dict[str, np.ndarray]  # the signals needing no statistics (one or more columns)
    bm25: Any  # the product's CorpusFit
    _memo: dict[bytes, CorpusStatistics] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Sequence[Pair]) -> Lexical:
        bm25 = CorpusBM25Scorer().fit_share(pairs)
        owner, queries, sentences = [], [], []
        for i, p in enumerate(pairs):
            for s in sentence_texts(p.text):
                owner.append(i)
                queries.append(p.query)
                sentences.append(s)
        seqs: dict[str, list[str]] = {}

        def seq(text: str) -> list[str]:
            got = seqs.get(text)
            if got is None:
                got = seqs[text] = sequence(text)
            return got

        pos = np.array([_positional(seq(p.query), seq(p.text)) for p in pairs]).reshape(-1, 3)
        terms = bm25.terms
        n = len(pairs)
        found = np.bincount(terms.entry_pair, (terms.entry_tf > 0).astype(float), minlength=n)
        distinct = np.bincount(terms.entry_pair, minlength=n).astype(float)
        start = np.array([float(p.meta.get("start", 0) or 0) for p in pairs])
        fixed = {
            "cov": np.where(distinct > 0, 1.0 - found / np.maximum(distinct, 1.0), 1.0)[:, None],
            "bigram": pos[:, [0]], "phrase": pos[:, [1]], "proximity": pos[:, [2]],
            "length": np.log1p(terms.texts.lengths[terms.pair_text].astype(float))[:, None],
            "position": np.column_stack([np.log1p(start), (start == 0).astype(float)]),
        }
        return cls(terms, PairTerms.of(queries, sentences), np.array(owner, dtype=np.int64),
                   fixed, bm25)

    def statistics(self, fit: np.ndarray) -> CorpusStatistics:
        """The corpus statistics of the snippet texts of the pairs ``fit`` (memoized)."""
        key = np.packbits(fit).tobytes()
        if key not in self._memo:
            self._memo.clear()
            self._memo[key] = CorpusStatistics.of_terms(
                self.terms.texts, self.terms.pair_text[fit], max_vocabulary=self.bm25.scorer.max_vocabulary)
        return self._memo[key]

    def fitted(self, name: str, fit: np.ndarray) -> np.ndarray:
        """Signal ``name`` of every pair under the statistics of the fit share ``fit``."""
        if name == "bm25-corpus":
            return np.asarray(self.bm25.fitted(fit)[1])
        stats = self.statistics(fit)
        if name == "sent-bm25":  # the product's signal
            sentences = SentenceTerms(self.terms.texts, self.terms.pair_text, self.sentence_terms,
                                      self.sentence_owner)
            return SentenceBM25Scorer(k1=self.bm25.scorer.k1, b=self.bm25.scorer.b
                                      ).scores_of_prepared(sentences, stats)
        if name == "idf-cov":  # the product's signal
            return IDFCoverageScorer().scores_of_prepared(self.terms, stats)
        if name == "sent-lex":  # the best sentence's idf-cov
            per = IDFCoverageScorer().scores_of_prepared(self.sentence_terms, stats)
            out = np.full(self.terms.pair_text.size, np.inf)
            np.minimum.at(out, self.sentence_owner, per)
            return out
        terms = self.terms  # rare
        n = terms.pair_text.size
        df = np.array([stats.df.get(tok, 0) for tok in terms.query_vocabulary], dtype=np.float64)
        idf = _idf(df, stats.n_docs)[terms.entry_token]
        hit = terms.entry_tf > 0
        top = np.zeros(n)
        np.maximum.at(top, terms.entry_pair, idf)
        got = np.zeros(n)
        np.maximum.at(got, terms.entry_pair[hit], idf[hit])
        return np.where(top > 0, 1.0 - got / np.where(top > 0, top, 1.0), 1.0)


@dataclass(frozen=True)
class _Share:
    """One text-fitted signal as :class:`TextFittedSignals` fits it (``fitted(mask)``)."""

    lexical: Lexical
    name: str

    def fitted(self, fit: np.ndarray) -> tuple[Any, np.ndarray]:
        return self.name, self.lexical.fitted(self.name, fit)


# ---------------------------------------------------------------------- the measurement
@dataclass
class Dataset:
    name: str
    model: str
    pairs: list[Pair]
    data: ScoredData
    base: np.ndarray
    sentence: np.ndarray
    lexical: Lexical
    splits: list[tuple[np.ndarray, np.ndarray]]
    oracle: np.ndarray  # per split
    scoring_seconds: float
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def features(self, signals: Sequence[str]) -> FusionFeatures:
        columns: list[np.ndarray] = []
        positions: list[int] = []
        fits: list[_Share] = []
        for s in signals:
            if s == "cos":
                columns.append(self.base[:, None])
            elif s == "sentence-cos":
                columns.append(self.sentence[:, None])
            elif s in FITTED:
                positions.append(sum(c.shape[1] for c in columns))
                fits.append(_Share(self.lexical, s))
                columns.append(np.zeros((self.base.size, 1)))
            else:
                columns.append(self.lexical.fixed[s])
        matrix = np.column_stack(columns)
        text = (TextFittedSignals(tuple(positions), tuple(fits), self.data.query_index, False)
                if fits else None)
        return FusionFeatures(matrix, "logistic", tuple(f"x{i}" for i in range(matrix.shape[1])), text)


def _per_split(ds: Dataset, signals: Sequence[str] | None, seed: int) -> dict[str, np.ndarray]:
    """Coverage and removal of each split (``signals`` None: ``1 - cos`` as it is)."""
    features = None if signals is None else ds.features(signals)
    cov, rem = [], []
    for i, split in enumerate(ds.splits):
        report = evaluate_scores(ds.data, alphas=(ALPHA,), top_k=(), thetas=(), splits=[split],
                                 seed=seed + i, modes=("marginal",), calibrated_baselines=False,
                                 fusion_features=features)
        (row,) = report.rows("conformal")
        cov.append(row["coverage_mean"])
        rem.append(row["removal_mean"])
    return {"coverage": np.array(cov), "removal": np.array(rem)}


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan


def _measure(ds: Dataset, label: str, signals: Sequence[str] | None, seed: int,
             quiet: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    got = _per_split(ds, signals, seed)
    row = {"label": label, "signals": None if signals is None else list(signals),
           "coverage": float(got["coverage"].mean()), "coverage_se": _se(got["coverage"]),
           "removal": float(got["removal"].mean()), "removal_se": _se(got["removal"]),
           "of_oracle": float((got["removal"] / ds.oracle).mean()),
           "per_split_coverage": got["coverage"].tolist(),
           "per_split_removal": got["removal"].tolist(),
           "seconds": round(time.perf_counter() - t0, 2)}
    row["counts"] = abs(row["coverage"] - (1 - ALPHA)) <= COVERAGE_BAND
    for ref in ("P0", "portable"):
        if ref in ds.rows:
            diff = got["removal"] - np.array(ds.rows[ref]["per_split_removal"])
            row[f"vs_{ref}"] = float(diff.mean())
            row[f"vs_{ref}_se"] = _se(diff)
    ds.rows[label] = row
    if not quiet:
        print(f"{ds.name} {label}: coverage {row['coverage']:.3f} removal {row['removal']:.3f} "
              f"({100 * row['of_oracle']:.1f} % of oracle) vs P0 {row.get('vs_P0', 0):+.3f} "
              f"[{row['seconds']} s]", file=sys.stderr, flush=True)
    return row


def _topic_limits(spec: str) -> dict[str, int]:
    """``"24"`` -> every dataset's first 24 topics; ``"xquad-el=24,xquad-ro=24"`` -> those."""
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, n = item.rpartition("=")
        out[name] = int(n)
    return out


def _load(name: str, args: argparse.Namespace) -> Dataset:
    pairs = load_dataset(name)
    limit = _topic_limits(args.max_topics).get(name, _topic_limits(args.max_topics).get("", 0))
    if limit:  # the pairs of the first topics (sorted) only
        first = set(sorted({p.group for p in pairs})[:limit])
        pairs = [p for p in pairs if p.group in first]
    base_scorer = EmbeddingScorer(language=_language(name), cache_dir=args.cache_dir)
    t0 = time.perf_counter()
    base = base_scorer.score_pairs(pairs)
    sentence = SentenceCosineScorer.sharing(base_scorer).score_pairs(pairs)
    lexical = Lexical.of(pairs)
    seconds = time.perf_counter() - t0
    data = ScoredData.from_pairs(pairs, base)
    splits = group_splits(data.group_index.tolist(), calibration_fraction=0.5,
                          n_splits=args.splits, seed=args.seed)
    oracle = np.array([1.0 - float(data.relevant[test].mean()) for _, test in splits])
    if not args.quiet:
        print(f"{name}: {len(pairs)} pairs, model {base_scorer.model_id}, signals in "
              f"{seconds:.1f} s", file=sys.stderr, flush=True)
    return Dataset(name, base_scorer.model_id, pairs, data, base, sentence, lexical, splits,
                   oracle, round(seconds, 1))


PORTABLE = ("cos", "bm25-corpus", "sentence-cos")
P0 = ("cos", "bm25-corpus")


def _first_rows(ds: Dataset, args: argparse.Namespace) -> None:
    _measure(ds, "1 - cos", None, args.seed, args.quiet)
    _measure(ds, "P0", P0, args.seed, args.quiet)
    _measure(ds, "portable", PORTABLE, args.seed, args.quiet)
    for c in CANDIDATES:
        _measure(ds, f"P0 + {c}", (*P0, c), args.seed, args.quiet)
    _measure(ds, "cos + idf-cov + length", ("cos", "idf-cov", "length"), args.seed, args.quiet)


def _keep(datasets: list[Dataset]) -> dict[str, dict[str, Any]]:
    """Per candidate: on how many datasets ``P0 + X`` removes more than ``P0`` (at all, and
    by more than 2 paired standard errors), the worst difference in paired standard errors,
    and whether it is kept: a clear lift on most datasets, no loss beyond 2 paired standard
    errors on any, coverage counting on all."""
    out = {}
    for c in CANDIDATES:
        rows = [ds.rows[f"P0 + {c}"] for ds in datasets]
        lifts = sum(r["vs_P0"] > 0 and r["counts"] for r in rows)
        clear = sum(r["vs_P0"] > 2 * r["vs_P0_se"] and r["counts"] for r in rows)
        worst = min(r["vs_P0"] / r["vs_P0_se"] if r["vs_P0_se"] > 0 else 0.0 for r in rows)
        kept = clear > len(rows) / 2 and worst >= -2.0 and all(r["counts"] for r in rows)
        out[c] = {"lifts": lifts, "clear_lifts": clear, "n": len(rows),
                  "worst_in_se": worst, "mean_vs_P0": float(np.mean([r["vs_P0"] for r in rows])),
                  "kept": kept}
    return out


def _greedy(datasets: list[Dataset], args: argparse.Namespace) -> list[str]:
    """Forward selection over the candidates on the mean share of the oracle (rows whose
    coverage counts only), from ``P0``; stops when a step adds under 0.2 points."""
    chosen: list[str] = []

    def score(label: str) -> float:
        rows = [ds.rows[label] for ds in datasets]
        return -1.0 if not all(r["counts"] for r in rows) else float(np.mean([r["of_oracle"] for r in rows]))

    current = score("P0")
    while True:
        best_c, best = None, current + 0.002
        for c in CANDIDATES:
            if c in chosen:
                continue
            label = "P0 + " + " + ".join([*chosen, c])
            for ds in datasets:
                if label not in ds.rows:
                    _measure(ds, label, (*P0, *chosen, c), args.seed, args.quiet)
            if score(label) > best:
                best_c, best = c, score(label)
        if best_c is None:
            return chosen
        chosen.append(best_c)
        current = best


# ---------------------------------------------------------------------- cost
def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cost(ds: Dataset, args: argparse.Namespace) -> dict[str, Any]:
    """ms per snippet: the base's and the sentences' model work with a cold in-memory cache,
    then the lexical signals (tokenizing and computing every candidate)."""
    sample = _sample(ds.pairs, args.sample_topics)
    base = EmbeddingScorer(language=_language(ds.name))  # in-memory cache, empty
    base.score_batch("warm-up", ["warm-up"])
    t0 = time.perf_counter()
    base.score_pairs(sample)
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    SentenceCosineScorer.sharing(base).score_pairs(sample)
    t_sent = time.perf_counter() - t0
    mask = np.ones(len(sample), dtype=bool)

    def lexical_all() -> None:
        _split.cache_clear()  # the sentence split is part of the cost
        lex = Lexical.of(sample)
        for name in FITTED:
            lex.fitted(name, mask)

    def bm25_alone() -> None:
        CorpusBM25Scorer().fit_share(sample).fitted(mask)

    t_lex = min(_timed(lexical_all) for _ in range(3))
    t_bm25 = min(_timed(bm25_alone) for _ in range(3))
    n = len(sample)
    out = {"dataset": ds.name, "model": ds.model, "n_snippets": n,
           "sentences": sum(len(sentence_texts(p.text)) for p in sample),
           "base_cold_ms": 1e3 * t_base / n, "sentences_cold_ms": 1e3 * t_sent / n,
           "lexical_all_ms": 1e3 * t_lex / n, "bm25_with_inputs_ms": 1e3 * t_bm25 / n,
           "model_ratio": (t_base + t_sent) / t_base}
    if not args.quiet:
        print(f"cost {ds.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()
                                             if k.endswith("ms")), file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------------- tables
def _cell(r: dict[str, Any]) -> str:
    flag = "" if r["counts"] else " (cov off)"
    return f"{r['coverage']:.3f} | {r['removal']:.3f} ± {r['removal_se']:.3f}{flag} | {100 * r['of_oracle']:.1f} %"


def _tables(results: list[dict[str, Any]], keep: dict[str, dict[str, Any]], costs: list[dict[str, Any]],
            meta: dict[str, Any]) -> str:
    lines = ["### List-free signals for the portable score", "",
             (f"Marginal mode, alpha {ALPHA}, {meta['splits']} topic-disjoint splits (seed "
              f"{meta['seed']}), the same for every row; fused rows: logistic regression fitted "
              "per split on a quarter of the calibration topics (IDF / BM25 statistics on that "
              "share's texts only), calibrated on the rest. removal ± its split standard error; "
              "`vs P0` / `vs portable` = removal minus that row's, ± the paired split standard "
              "error. `P0` = portable "
              "without the best sentence's cosine (cos + corpus BM25). A row counts when its "
              f"coverage is within {COVERAGE_BAND} of {1 - ALPHA:.2f}."), ""]
    for res in results:
        lines += [(f"#### {res['dataset']} ({res['model']}; {res['n_pairs']} pairs, {res['n_topics']} "
                   f"topics; oracle removes "
                  f"{res['oracle']:.3f})"), "",
                  "| row | coverage | removal | of oracle | vs P0 | vs portable |",
                  "|---|---|---|---|---|---|"]
        for r in res["rows"]:
            vs = [(f"{r[f'vs_{ref}']:+.3f} ± {r[f'vs_{ref}_se']:.3f}" if f"vs_{ref}" in r else "")
                  for ref in ("P0", "portable")]
            lines.append(f"| {r['label']} | {_cell(r)} | {vs[0]} | {vs[1]} |")
        lines.append("")
    if keep:
        lines += ["#### Keep or drop (P0 + X against P0)", "",
                  ("| candidate | sets where it lifts removal | clear lifts (> 2 SE) | worst "
                   "difference (in paired SE) | mean difference | kept |"), "|---|---|---|---|---|---|"]
        for c, k in keep.items():
            lines.append(f"| {c} | {k['lifts']} of {k['n']} | {k['clear_lifts']} | "
                         f"{k['worst_in_se']:+.1f} | {k['mean_vs_P0']:+.3f} | "
                         f"{'**kept**' if k['kept'] else 'dropped'} |")
        lines.append("")
    if results:
        labels = [r["label"] for r in results[0]["rows"]]
        lines += ["#### Summary: share of the oracle's removal at alpha 0.1", "",
                  "| row | " + " | ".join(r["dataset"] for r in results) + " | mean |",
                  "|---|" + "---|" * (len(results) + 1)]
        for label in labels:
            rows = [next((x for x in r["rows"] if x["label"] == label), None) for r in results]
            if any(x is None for x in rows):
                continue
            cells = [f"{100 * x['of_oracle']:.1f}{'' if x['counts'] else '*'}" for x in rows if x]
            mean = np.mean([x["of_oracle"] for x in rows if x])
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {100 * mean:.1f} |")
        lines += ["", "(* coverage more than 0.02 from 0.90)", ""]
    if costs:
        lines += ["#### Cost per snippet", "",
                  (f"One query of each of the first {meta['sample_topics']} topics; model work "
                   "cold (model loaded, in-memory cache empty); lexical = tokenizing and computing "
                   "the five text-fitted signals and the fixed candidates (statistics fitted on the sample; best of 3). "
                   f"Load average {meta['load'][0]:.1f} at the start, {meta['load'][1]:.1f} at the end."),
                  "", ("| dataset | model | snippets | sentences | 1 - cos (ms) | + sentences "
                       "(ms) | model work with sentences / without | corpus BM25 (ms) | all lexical (ms) |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in costs:
            lines.append(f"| {c['dataset']} | {c['model']} | {c['n_snippets']} | {c['sentences']} | "
                         f"{c['base_cold_ms']:.2f} | {c['sentences_cold_ms']:.2f} | {c['model_ratio']:.2f} | "
                         f"{c['bm25_with_inputs_ms']:.2f} | {c['lexical_all_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = signal_bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--no-greedy", action="store_true", help="skip the forward selection")
    parser.add_argument("--max-topics", default="",
                        help="only the first N topics (sorted): N for every dataset, or "
                             "NAME=N,... for some (default: all)")
    parser.add_argument("--sets-from", type=Path, default=None,
                        help="take the kept and greedy sets from an earlier run's --json file "
                             "(no keep decision, no forward selection)")
    args = parser.parse_args(argv)
    if args.splits < 5:
        parser.error("--splits: at least 5")
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    datasets = []
    for name in names:
        ds = _load(name, args)
        _first_rows(ds, args)
        datasets.append(ds)
    keep = _keep(datasets)
    kept = [c for c, k in keep.items() if k["kept"]]
    earlier = json.loads(args.sets_from.read_text(encoding="utf-8")) if args.sets_from else None
    if earlier is not None:
        kept = list(earlier["kept"])
    for ds in datasets:
        if kept:
            _measure(ds, "P0 + kept", (*P0, *kept), args.seed, args.quiet)
            _measure(ds, "portable + kept", (*PORTABLE, *kept), args.seed, args.quiet)
        _measure(ds, "P0 + all", (*P0, *CANDIDATES), args.seed, args.quiet)
    greedy = (list(earlier["greedy"]) if earlier is not None else
              [] if args.no_greedy else _greedy(datasets, args))
    if greedy:
        for ds in datasets:
            if "P0 + " + " + ".join(greedy) not in ds.rows:
                _measure(ds, "P0 + " + " + ".join(greedy), (*P0, *greedy), args.seed, args.quiet)
            ds.rows["P0 + greedy"] = {**ds.rows["P0 + " + " + ".join(greedy)],
                                      "label": "P0 + greedy: " + " + ".join(greedy)}
            _measure(ds, "portable + greedy", (*PORTABLE, *greedy), args.seed, args.quiet)
    costs = [] if args.no_cost else [_cost(ds, args) for ds in datasets]
    shown = ("1 - cos", "portable", "P0", *(f"P0 + {c}" for c in CANDIDATES),
             "cos + idf-cov + length", "P0 + kept", "portable + kept", "P0 + all", "P0 + greedy",
             "portable + greedy")
    results = [{"dataset": ds.name, "model": ds.model, "n_pairs": len(ds.pairs),
                "n_topics": len({p.group for p in ds.pairs}),
                "oracle": float(ds.oracle.mean()), "scoring_seconds": ds.scoring_seconds,
                "rows": [ds.rows[k] for k in shown if k in ds.rows],
                "greedy_steps": [r for k, r in ds.rows.items() if k not in shown]}
               for ds in datasets]
    meta = {"splits": args.splits, "seed": args.seed, "max_topics": args.max_topics,
            "sets_from": str(args.sets_from) if args.sets_from else None, "sample_topics": args.sample_topics,
            "load": (load0, os.getloadavg()[0]), "kept": kept, "greedy": greedy,
            "wall_seconds": round(time.perf_counter() - t_start, 1),
            "command": " ".join(sys.argv)}
    text = _tables(results, keep, costs, meta)
    source = f" (from {args.sets_from})" if args.sets_from else ""
    text += (f"\nKept{source}: {', '.join(kept) or 'none'}; greedy{source}: "
             f"{' + '.join(greedy) or 'none'}. Wall time {meta['wall_seconds']} s.\n")
    write_outputs(text, args, {"results": results, "keep": keep, "costs": costs, **meta})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
