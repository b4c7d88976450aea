"""Does the list check stay silent on lists like the calibration lists and fire on others?

A list-aware filter records its calibration lists (``ragsieve.lists.ListRecord``: lengths and
the spread of the root score, ``mean - best`` of ``1 - cos``, per list, with floors from the
calibration topics) and checks the lists it is given (``ListWatch``: a length outside the
calibration range at once; a sequential test, conformal test martingales on the length and
the spread with a union bound, false-alarm probability ``delta``, that fires when the mean of
the last 50 lists also differs from the calibration mean by more than twice the calibration
topics' spread).

Here the calibration lists are a retriever's: XQuAD's snippets pooled over the calibration
topics (a seeded half of the articles) and each calibration question's dense top ``k`` by
MiniLM (what ``ragsieve retrieve`` does on an index). The same retriever over the held-out
topics gives lists *like* the calibration lists; the other retrievers give lists of another
shape. Per kind, ``--streams`` streams of ``--length`` lists:

* ``random``: lists drawn at random (exchangeable with the calibration lists, up to the
  topic shift between two halves of the articles): the share of streams whose alarm fires
  is the false-alarm rate (at most ``delta`` under exchangeability);
* ``topic runs``: whole topics in a row (a topic drawn at random, all its questions in
  random order, then the next): the arrival order a stream of one user's questions has,
  which a sequential test of exchangeability is not promised to accept;
* shifted: BM25 top ``k`` of the same pool, dense top ``k/2`` and ``2k``, the held-out
  topics' own article lists; the share of streams that fire and the lists it takes (median).

Usage: ``python benchmarks/bench_list_watch.py [--data xquad-en] [--k 10] [--streams 100]
[--length 200] [--seed 11] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from ragsieve.data import load_dataset
from ragsieve.lists import ListRecord, ListWatch
from ragsieve.scoring import EmbeddingScorer
from ragsieve.scoring.lexical import bm25_scores, tokenize

Lists = dict[str, np.ndarray]  # query id -> the root scores (1 - cos) of its list


def _pool(name: str, seed: int) -> dict[str, Any]:
    pairs = load_dataset(name)
    snippets: dict[str, tuple[str, str]] = {}
    queries: dict[str, tuple[str, str]] = {}
    own: dict[str, list[str]] = defaultdict(list)
    for p in pairs:
        snippets[p.snippet_id] = (p.text, p.group)
        queries[p.query_id] = (p.query, p.group)
        own[p.query_id].append(p.snippet_id)
    sids, qids = sorted(snippets), sorted(queries)
    scorer = EmbeddingScorer(language=str(pairs[0].meta.get("language") or "en"))
    sims = (scorer.cache.embed([queries[q][0] for q in qids], kind="query")
            @ scorer.cache.embed([snippets[s][0] for s in sids]).T)
    topics = sorted({t for _, t in queries.values()})
    order = np.random.default_rng(seed).permutation(len(topics))
    half = len(topics) // 2
    return {"sids": sids, "qids": qids, "snippets": snippets, "queries": queries, "own": own,
            "sims": sims, "cal": {topics[i] for i in order[:half]},
            "test": {topics[i] for i in order[half:]}}


def _dense(pool: dict[str, Any], topics: set[str], k: int) -> Lists:
    cols = np.array([i for i, s in enumerate(pool["sids"]) if pool["snippets"][s][1] in topics])
    out = {}
    for qi, q in enumerate(pool["qids"]):
        if pool["queries"][q][1] in topics:
            sims = pool["sims"][qi, cols]
            out[q] = 1.0 - np.sort(sims)[::-1][:k]
    return out


def _bm25(pool: dict[str, Any], topics: set[str], k: int) -> Lists:
    cols = [i for i, s in enumerate(pool["sids"]) if pool["snippets"][s][1] in topics]
    docs = [tokenize(pool["snippets"][pool["sids"][c]][0]) for c in cols]
    out = {}
    for qi, q in enumerate(pool["qids"]):
        text, topic = pool["queries"][q]
        if topic in topics:
            scores, _ = bm25_scores(tokenize(text), docs)
            top = [cols[j] for j in np.argsort(-scores, kind="stable")[:k]]
            out[q] = 1.0 - pool["sims"][qi, top]
    return out


def _own(pool: dict[str, Any], topics: set[str]) -> Lists:
    index = {s: i for i, s in enumerate(pool["sids"])}
    return {q: 1.0 - pool["sims"][qi, [index[s] for s in pool["own"][q]]]
            for qi, q in enumerate(pool["qids"]) if pool["queries"][q][1] in topics}


def _orders(pool: dict[str, Any], lists: Lists, runs: bool, streams: int,
            length: int) -> list[list[str]]:
    by_topic: dict[str, list[str]] = defaultdict(list)
    for q in sorted(lists):
        by_topic[pool["queries"][q][1]].append(q)
    topics = sorted(by_topic)
    out = []
    for i in range(streams):
        rng = np.random.default_rng(1000 + i)
        if not runs:
            out.append(list(rng.choice(sorted(lists), size=length)))
            continue
        order: list[str] = []
        while len(order) < length:
            run = list(by_topic[topics[int(rng.integers(len(topics)))]])
            rng.shuffle(run)
            order += run
        out.append(order[:length])
    return out


def _replay(record: ListRecord, lists: Lists, orders: list[list[str]]) -> dict[str, Any]:
    fired, flagged = [], 0
    for i, order in enumerate(orders):
        watch = ListWatch(record, seed=i)
        for q in order:
            watch.see(len(lists[q]), lists[q])
        fired.append(watch.fired_at)
        flagged += watch.state()["n_outside"]
    hits = [f for f in fired if f is not None]
    return {"streams": len(orders), "fired": len(hits),
            "median_lists_to_fire": float(np.median(hits)) if hits else None,
            "share_outside": flagged / sum(len(o) for o in orders)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--data", default="xquad-en")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--length", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the watch warns once per stream
    start = time.time()
    pool = _pool(args.data, args.seed)
    cal = _dense(pool, pool["cal"], args.k)
    ids = [q for q in cal for _ in cal[q]]
    record = ListRecord.from_lists(ids, np.concatenate([cal[q] for q in cal]),
                                   source={"kind": "deployed"}, list_dependent=True,
                                   topics=[pool["queries"][q][1] for q in ids])
    kinds: dict[str, Callable[[], Lists]] = {
        f"dense-{args.k} (the calibration retriever)": lambda: _dense(pool, pool["test"], args.k),
        f"bm25-{args.k}": lambda: _bm25(pool, pool["test"], args.k),
        f"dense-{args.k // 2}": lambda: _dense(pool, pool["test"], args.k // 2),
        f"dense-{2 * args.k}": lambda: _dense(pool, pool["test"], 2 * args.k),
        "own (the article's snippets)": lambda: _own(pool, pool["test"]),
    }
    rows = []
    for kind, build in kinds.items():
        lists = build()
        for runs in (False, True):
            result = _replay(record, lists, _orders(pool, lists, runs, args.streams, args.length))
            rows.append({"lists": kind, "order": "topic runs" if runs else "random", **result})
    print(f"python benchmarks/bench_list_watch.py --data {args.data} --k {args.k} --streams "
          f"{args.streams} --length {args.length} --seed {args.seed}  ({time.time() - start:.0f} s)")
    print(f"calibration: {record.describe()}; floors {record.floors}\n")
    print("| lists | order | streams fired | median lists to fire | lists outside the lengths |")
    print("|---|---|---|---|---|")
    for r in rows:
        med = "-" if r["median_lists_to_fire"] is None else f"{r['median_lists_to_fire']:.0f}"
        print(f"| {r['lists']} | {r['order']} | {r['fired']} / {r['streams']} | {med} | "
              f"{r['share_outside']:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "floors": record.floors, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
