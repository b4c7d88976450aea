"""Does the exchangeability alarm stay off on exchangeable traffic and fire on shifted traffic?

Every stream is one deployment: the questions of each XQuAD-en article are split at random
(seeded per stream) into a calibration half, whose statistics are the monitor's reference
(the artifact's monitor block, built by ``reference_block`` as ``ConformalFilter.calibrate``
builds it: from the scores of all snippets of each question), and a held-back half. The
monitor is the one an artifact gets (``ExchangeabilityMonitor.from_artifact``: the
separation and the best score, union bound) and, for comparison, the separation alone
(the monitor of artifacts written before the best score was recorded). The script then
replays, on MiniLM ``1 - cos`` scores computed once:

* **held-back**: every held-back question once, in random order (about 600 requests,
  exchangeable with the calibration half): the share of streams in which the alarm fires
  (at most ``delta`` = 0.01 by Ville's inequality);
* **shifts**: requests drawn at random from a shifted collection, up to ``--max-requests``:
  the requests it takes to fire (median, 90 % quantile) and the share of streams that fired;
  the same again after the held-back stream (a change after ~600 stable requests).

Shifts: the English questions served the snippets of another, random article
("unrelated"); the English questions served sentences of SelQA, unrelated Wikipedia
articles of other topics ("off-topic", the stand-in for the issue's cooking text: every
context should be emptied); XQuAD in German, Spanish, Chinese, Greek and Romanian
(questions and snippets of the other language through the English filter); SelQA
(another collection, Wikipedia sentences, its own questions).

**Long lists** are XQuAD's own: every paragraph of the question's article (median 10).
**Short lists** (``--short``, CLAPNQ-like lists of 1 to 6 snippets): per question a length
``n`` drawn uniformly in 1..6, then either ("random") the relevant snippet plus ``n - 1``
other snippets of its list drawn at random ("unrelated" and "off-topic" lists have no
relevant snippet: ``n`` random ones), or ("top") the ``n`` best-scored snippets of its
list, as a retriever's top-n gives (neighbours that compete with the best, the harder case
for the separation). The same rule builds calibration, held-back and every shifted
request. ``--short`` measures long and both kinds of short lists in one run.

False alarms are counted over ``--null-streams`` held-back streams, requests-to-fire over
the first ``--streams``. With ``--compare`` the held-back and shift streams (long lists)
are replayed with the best score or the mean score as the single statistic of a one-
statistic monitor (``--compare-streams`` streams).

Usage: ``python benchmarks/bench_drift.py [--short] [--streams 20] [--null-streams 200]
[--compare] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ragsieve.data import load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.monitoring import ExchangeabilityMonitor, reference_block, separation
from ragsieve.scoring import resolve_scorer
from ragsieve.types import Pair

SHIFTS = ("unrelated", "off-topic", "xquad-de", "xquad-es", "xquad-zh", "xquad-el", "xquad-ro",
          "selqa-dev")
#: Lengths of the short lists: uniform in 1..SHORT_MAX.
SHORT_MAX = 6


class Lists:
    """Each query's scores in file order, which of them are relevant, and the query's group."""

    def __init__(self, pairs: list[Pair], scores: np.ndarray) -> None:
        by_query: dict[str, list[int]] = {}
        for i, p in enumerate(pairs):
            by_query.setdefault(p.query_id, []).append(i)
        self.groups = [pairs[idx[0]].group for idx in by_query.values()]
        self.scores = [scores[idx] for idx in by_query.values()]
        self.relevant = [np.array([pairs[i].relevant == 1 for i in idx]) for idx in by_query.values()]

    def __len__(self) -> int:
        return len(self.scores)

    def request(self, i: int, rng: np.random.Generator | None, kind: str = "random") -> np.ndarray:
        """Query ``i``'s whole list (``rng`` None) or a short list drawn from it: the
        relevant snippet and random others (``kind="random"``) or the best of the list
        (``"top"``, what a retriever's top-n would give)."""
        scores = self.scores[i]
        if rng is None:
            return scores
        n = int(rng.integers(1, SHORT_MAX + 1))
        if kind == "top":
            return np.sort(scores)[:n]
        rel = np.flatnonzero(self.relevant[i])
        if rel.size == 0:
            return scores[rng.permutation(scores.size)[:n]]
        others = np.flatnonzero(~self.relevant[i])
        pick = np.concatenate([[rng.choice(rel)], rng.permutation(others)[: n - 1]])
        return scores[pick.astype(int)]


def lists_of(pairs: list[Pair], scores: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Each query's scores in file order, with the query's group (article / topic)."""
    lists = Lists(pairs, scores)
    return lists.groups, lists.scores


def unrelated_pairs(pairs: list[Pair], seed: int = 0) -> list[Pair]:
    """Every question served all snippets of another, random article."""
    rng = np.random.default_rng(seed)
    snippets: dict[str, dict[str, str]] = {}
    questions: dict[str, tuple[str, str]] = {}
    for p in pairs:
        snippets.setdefault(p.group, {})[p.snippet_id] = p.text
        questions[p.query_id] = (p.query, p.group)
    names = sorted(snippets)
    out = []
    for qid, (query, group) in questions.items():
        other = names[rng.choice([i for i, a in enumerate(names) if a != group])]
        out += [Pair(qid, query, sid, text, relevant=0, group=other)
                for sid, text in snippets[other].items()]
    return out


def off_topic_pairs(pairs: list[Pair], other: list[Pair], n: int = SHORT_MAX,
                    per_article: int = 10, seed: int = 0) -> list[Pair]:
    """Every question served text of another collection: ``per_article`` random snippets of
    ``other`` per article for the long lists (as many as an article has), ``n`` for short."""
    rng = np.random.default_rng(seed)
    texts = sorted({p.text for p in other})
    questions: dict[str, str] = {}
    for p in pairs:
        questions.setdefault(p.query_id, p.query)
    out = []
    for qid, query in questions.items():
        for j in rng.choice(len(texts), size=max(n, per_article), replace=False):
            out.append(Pair(qid, query, f"off-{j}", texts[j], relevant=0, group="off-topic"))
    return out


def split(groups: list[str], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Half of the questions of every article (rounded down) calibrate; the rest are held back."""
    cal, held = [], []
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    for g in sorted(by_group):
        idx = rng.permutation(by_group[g])
        cal += idx[: len(idx) // 2].tolist()
        held += idx[len(idx) // 2:].tolist()
    return np.array(cal), np.array(held)


def fire_at(monitor: ExchangeabilityMonitor, requests: list[np.ndarray]) -> int | None:
    """Position (1-based, counting every served request) at which the alarm fired."""
    for i, scores in enumerate(requests, 1):
        if monitor.observe(scores).alarm:
            return i
    return None


def monitor_of(statistic: str, requests: list[np.ndarray], seed: int) -> ExchangeabilityMonitor:
    """The monitor calibrated on ``requests``: the artifact's ("combined": separation and
    best score), the separation alone, or the best or the mean score alone."""
    qids = np.concatenate([np.full(r.size, j) for j, r in enumerate(requests)])
    block = reference_block(np.concatenate(requests), qids.tolist(), seed=seed)
    assert block is not None
    if statistic == "combined":
        m = ExchangeabilityMonitor.from_artifact({"monitor": block}, seed=seed)
        assert m is not None
        return m
    if statistic == "separation":
        return ExchangeabilityMonitor(block["reference"], seed=seed)
    single = np.min if statistic == "best score" else np.mean
    return ExchangeabilityMonitor([float(single(r)) for r in requests], seed=seed)


def as_request(statistic: str, scores: np.ndarray) -> np.ndarray:
    """The request the monitor sees; a single statistic v is replayed as [0, 2v] (separation v)."""
    if statistic not in ("best score", "mean score"):
        return scores
    single = np.min if statistic == "best score" else np.mean
    return np.array([0.0, 2.0 * float(single(scores))])


def run(statistic: str, en: Lists, shifted: dict[str, Lists], n_streams: int, n_null: int,
        max_requests: int, short: str | None) -> dict:
    false_alarms = 0
    to_fire: dict[str, list[float]] = {k: [] for k in shifted}
    after: dict[str, list[float]] = {k: [] for k in shifted}
    held_sizes = []
    for s in range(max(n_streams, n_null)):
        rng = np.random.default_rng(s)
        cal, held = split(en.groups, rng)
        draw = rng if short else None
        kind = short or "random"
        cal_requests = [en.request(i, draw, kind) for i in cal]
        held_requests = [as_request(statistic, en.request(i, draw, kind))
                         for i in rng.permutation(held)]
        held_sizes.append(len(held_requests))
        m = monitor_of(statistic, cal_requests, s)
        false_alarms += fire_at(m, held_requests) is not None if s < n_null else 0
        if s >= n_streams:
            continue
        for name, lists in shifted.items():
            stream = [as_request(statistic, lists.request(int(i), draw, kind))
                      for i in rng.integers(len(lists), size=max_requests)]
            f = fire_at(monitor_of(statistic, cal_requests, s), stream)
            to_fire[name].append(np.inf if f is None else f)
            if m.state.alarm:  # this stream's held-back part already fired: no delay to measure
                continue
            m2 = monitor_of(statistic, cal_requests, s)
            fire_at(m2, held_requests)
            f2 = fire_at(m2, stream)
            after[name].append(np.inf if f2 is None else f2)
    out = {"statistic": statistic, "lists": f"short (1-6, {short})" if short else "long",
           "streams": n_streams, "null_streams": n_null, "false_alarms": false_alarms,
           "held_back_requests": int(np.mean(held_sizes)), "shifts": {}}
    for name in shifted:
        v, w = np.array(to_fire[name]), np.array(after[name])
        out["shifts"][name] = {
            "fired": float(np.isfinite(v).mean()), "median": float(np.median(v)),
            "p90": quantile(v, 0.9),
            "fired_after_stable": float(np.isfinite(w).mean()) if w.size else None,
            "median_after_stable": float(np.median(w)) if w.size else None,
        }
    return out


def quantile(v: np.ndarray, q: float) -> float:
    """The ``ceil(q n)``-th smallest value (``inf`` for streams that never fired sorts last)."""
    return float(np.sort(v)[max(0, min(v.size - 1, math.ceil(q * v.size) - 1))])


def cost_per_request(en: list[np.ndarray], n: int = 2000) -> dict[str, float]:
    """Microseconds per ``observe`` with the state in memory and in an SQLite file."""
    ref = [v for v in (separation(x) for x in en[:500]) if v is not None]
    best = [float(np.min(x)) for x in en[:500]]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, store in (("memory", None), ("sqlite", Path(tmp) / "m.sqlite")):
            with ExchangeabilityMonitor(ref, best=best, store=store) as m:
                t = time.perf_counter()
                for i in range(n):
                    m.observe(en[i % len(en)])
                out[label] = (time.perf_counter() - t) / n * 1e6
    return out


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "never" if not np.isfinite(x) else f"{x:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--null-streams", type=int, default=200)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--short", action="store_true",
                    help="also measure short lists (1-6 snippets) in the same run")
    ap.add_argument("--compare", action="store_true",
                    help="also replay the long-list streams with the best or the mean score alone")
    ap.add_argument("--compare-streams", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.getLogger("ragsieve.monitoring").setLevel(logging.ERROR)  # thousands of alarms
    cache = Path(os.environ.get("RAGSIEVE_CACHE") or cache_dir() / "embeddings")
    scorer = resolve_scorer("embedding", model="minilm", cache_dir=cache)
    t0 = time.perf_counter()
    en_pairs = load_dataset("xquad-en")
    en = Lists(en_pairs, scorer.score_pairs(en_pairs))
    shifted: dict[str, Lists] = {}
    for name in SHIFTS:
        if name == "unrelated":
            pairs = unrelated_pairs(en_pairs)
        elif name == "off-topic":
            pairs = off_topic_pairs(en_pairs, load_dataset("selqa-dev"))
        else:
            pairs = load_dataset(name)
        shifted[name] = Lists(pairs, scorer.score_pairs(pairs))
    print(f"scored {sum(len(v) for v in shifted.values()) + len(en)} requests in "
          f"{time.perf_counter() - t0:.0f} s; XQuAD-en {len(en)} questions, "
          f"{len(set(en.groups))} articles, median list "
          f"{np.median([v.size for v in en.scores]):.0f} snippets")
    plan: list[tuple[str, str | None, int]] = [("combined", None, args.streams),
                                               ("separation", None, args.streams)]
    if args.short:
        plan += [(stat, kind, args.streams) for kind in ("random", "top")
                 for stat in ("combined", "separation")]
    if args.compare:
        plan += [(stat, None, args.compare_streams) for stat in ("best score", "mean score")]
    results = []
    for statistic, short, n in plan:
        t = time.perf_counter()
        n_null = n if statistic in ("best score", "mean score") else args.null_streams
        r = run(statistic, en, shifted, n, n_null, args.max_requests, short)
        results.append(r)
        print(f"\n[{statistic}, {r['lists']} lists] {n} streams, delta = 0.01, two-sided "
              f"({time.perf_counter() - t:.0f} s)")
        print(f"held-back streams (~{r['held_back_requests']} requests each): alarm fired in "
              f"{r['false_alarms']}/{n_null}")
        print(f"{'shift':<12} {'fired':>6} {'median':>7} {'p90':>7} | after ~600 stable: "
              f"{'fired':>6} {'median':>7}")
        for name, v in r["shifts"].items():
            after = "-" if v["fired_after_stable"] is None else f"{v['fired_after_stable']:.2f}"
            print(f"{name:<12} {v['fired']:>6.2f} {fmt(v['median']):>7} {fmt(v['p90']):>7} | "
                  f"{'':<19}{after:>6} {fmt(v['median_after_stable']):>7}", flush=True)
    cost = cost_per_request(en.scores)
    print(f"\ncost of observe (separation and best score): {cost['memory']:.0f} us in memory, "
          f"{cost['sqlite']:.0f} us with an SQLite store (one transaction per request)")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "observe_us": cost}, indent=1)
                                   + "\n")


if __name__ == "__main__":
    main()
