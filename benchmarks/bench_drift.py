"""Does the exchangeability alarm stay off on exchangeable traffic and fire on shifted traffic?

Every stream is one deployment: the questions of each XQuAD-en article are split at random
(seeded per stream) into a calibration half, whose separation statistics are the monitor's
reference (built as ``ConformalFilter.calibrate`` builds it: from the scores of all
snippets of each question), and a held-back half. The script then replays, on MiniLM
``1 - cos`` scores computed once:

* **held-back**: every held-back question once, in random order (about 600 requests,
  exchangeable with the calibration half): the share of streams in which the alarm fires
  (at most ``delta`` = 0.01 by Ville's inequality);
* **shifts**: requests drawn at random from a shifted collection, up to ``--max-requests``:
  the requests it takes to fire (median, 90 % quantile) and the share of streams that fired;
  the same again after the held-back stream (a change after ~600 stable requests).

Shifts: the English questions served the snippets of another, random article
("unrelated"); XQuAD in German, Spanish, Chinese, Greek and Romanian (questions and
snippets of the other language through the English filter); SelQA (another collection,
Wikipedia sentences). With ``--compare`` the held-back and shift streams are replayed with
two other per-request statistics in place of the separation, the best (lowest) score and
the mean score (``--compare-streams`` streams).

Usage: ``python benchmarks/bench_drift.py [--streams 100] [--compare] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragsieve.data import load_dataset
from ragsieve.data.paths import cache_dir
from ragsieve.monitoring import ExchangeabilityMonitor, reference_block, separation
from ragsieve.scoring import resolve_scorer
from ragsieve.types import Pair

SHIFTS = ("unrelated", "xquad-de", "xquad-es", "xquad-zh", "xquad-el", "xquad-ro", "selqa-dev")


def lists_of(pairs: list[Pair], scores: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Each query's scores in file order, with the query's group (article / topic)."""
    by_query: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_query.setdefault(p.query_id, []).append(i)
    groups = [pairs[idx[0]].group for idx in by_query.values()]
    return groups, [scores[idx] for idx in by_query.values()]


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


# Other statistics, replayed through the same monitor: a request [0, 2v] has separation v.
STATISTICS: dict[str, Callable[[np.ndarray], float | None]] = {
    "separation": separation,
    "best score": lambda v: float(np.min(v)),
    "mean score": lambda v: float(np.mean(v)),
}


def as_request(statistic: str, scores: np.ndarray) -> np.ndarray:
    if statistic == "separation":
        return scores
    return np.array([0.0, 2.0 * STATISTICS[statistic](scores)])  # type: ignore[operator]


def run(statistic: str, en: list[np.ndarray], groups: list[str],
        shifted: dict[str, list[np.ndarray]], n_streams: int, max_requests: int) -> dict:
    false_alarms = 0
    to_fire: dict[str, list[float]] = {k: [] for k in shifted}
    after: dict[str, list[float]] = {k: [] for k in shifted}
    stat = STATISTICS[statistic]
    for s in range(n_streams):
        rng = np.random.default_rng(s)
        cal, held = split(groups, rng)
        if statistic == "separation":
            qids = np.concatenate([np.full(en[i].size, j) for j, i in enumerate(cal)])
            block = reference_block(np.concatenate([en[i] for i in cal]), qids.tolist(), seed=s)
            assert block is not None
            ref = block["reference"]
        else:
            ref = [stat(en[i]) for i in cal]
        held_requests = [as_request(statistic, en[i]) for i in rng.permutation(held)]
        m = ExchangeabilityMonitor(ref, seed=s)
        false_alarms += fire_at(m, held_requests) is not None
        for name, lists in shifted.items():
            stream = [as_request(statistic, lists[i])
                      for i in rng.integers(len(lists), size=max_requests)]
            fresh = ExchangeabilityMonitor(ref, seed=s)
            f = fire_at(fresh, stream)
            to_fire[name].append(np.inf if f is None else f)
            if m.state.alarm:  # this stream's held-back part already fired: no delay to measure
                continue
            m2 = ExchangeabilityMonitor(ref, seed=s)
            fire_at(m2, held_requests)
            f2 = fire_at(m2, stream)
            after[name].append(np.inf if f2 is None else f2)
    out = {"statistic": statistic, "streams": n_streams, "false_alarms": false_alarms,
           "held_back_requests": int(np.mean([len(split(groups, np.random.default_rng(s))[1])
                                              for s in range(min(n_streams, 5))])),
           "shifts": {}}
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
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, store in (("memory", None), ("sqlite", Path(tmp) / "m.sqlite")):
            with ExchangeabilityMonitor(ref, store=store) as m:
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
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--compare", action="store_true",
                    help="also replay the streams with the best score and the mean score")
    ap.add_argument("--compare-streams", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.getLogger("ragsieve.monitoring").setLevel(logging.ERROR)  # thousands of alarms
    cache = Path(os.environ.get("RAGSIEVE_CACHE") or cache_dir() / "embeddings")
    scorer = resolve_scorer("embedding", model="minilm", cache_dir=cache)
    t0 = time.perf_counter()
    en_pairs = load_dataset("xquad-en")
    groups, en = lists_of(en_pairs, scorer.score_pairs(en_pairs))
    shifted: dict[str, list[np.ndarray]] = {}
    for name in SHIFTS:
        pairs = unrelated_pairs(en_pairs) if name == "unrelated" else load_dataset(name)
        shifted[name] = lists_of(pairs, scorer.score_pairs(pairs))[1]
    print(f"scored {sum(len(v) for v in shifted.values()) + len(en)} requests in "
          f"{time.perf_counter() - t0:.0f} s; XQuAD-en {len(en)} questions, "
          f"{len(set(groups))} articles, median list {np.median([v.size for v in en]):.0f} snippets")
    results = []
    statistics = ["separation"] + (["best score", "mean score"] if args.compare else [])
    for statistic in statistics:
        n = args.streams if statistic == "separation" else args.compare_streams
        t = time.perf_counter()
        r = run(statistic, en, groups, shifted, n, args.max_requests)
        results.append(r)
        print(f"\n[{statistic}] {n} streams, delta = 0.01, two-sided ({time.perf_counter() - t:.0f} s)")
        print(f"held-back streams (~{r['held_back_requests']} requests each): alarm fired in "
              f"{r['false_alarms']}/{n}")
        print(f"{'shift':<12} {'fired':>6} {'median':>7} {'p90':>7} | after ~600 stable: "
              f"{'fired':>6} {'median':>7}")
        for name, v in r["shifts"].items():
            after = "-" if v["fired_after_stable"] is None else f"{v['fired_after_stable']:.2f}"
            print(f"{name:<12} {v['fired']:>6.2f} {fmt(v['median']):>7} {fmt(v['p90']):>7} | "
                  f"{'':<19}{after:>6} {fmt(v['median_after_stable']):>7}", flush=True)
    cost = cost_per_request(en)
    print(f"\ncost of observe: {cost['memory']:.0f} us in memory, {cost['sqlite']:.0f} us with "
          "an SQLite store (one transaction per request)")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "observe_us": cost}, indent=1)
                                   + "\n")


if __name__ == "__main__":
    main()
