"""The exchangeability monitor: conformal p-values, the test martingale, its store, real traffic.

Unit tests run on synthetic requests (lists of scores); the real-data tests calibrate a
filter with the real MiniLM model on XQuAD-en (half of the questions of every article)
and replay simulated streams on scores computed once: held-back questions of the same
articles (exchangeable: the alarm must stay off in >= 95 of 100 streams) and shifted
traffic (snippets of unrelated articles, XQuAD in German): the alarm must fire.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing as mp
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ragsieve import ConformalFilter
from ragsieve.artifact import Artifact
from ragsieve.errors import ArtifactError
from ragsieve.monitoring import ExchangeabilityMonitor, MonitorState, reference_block, separation
from ragsieve.scoring import Scorer
from ragsieve.types import Pair

LOGGER = "ragsieve.monitoring"


def _lists(seed: int, n: int, *, loc: float = 0.6, spread: float = 0.1,
           size: tuple[int, int] = (6, 15)) -> list[np.ndarray]:
    """``n`` synthetic requests: lists of 6-14 scores around ``loc``."""
    rng = np.random.default_rng(seed)
    return [rng.normal(loc, spread, size=rng.integers(*size)) for _ in range(n)]


def _reference(seed: int = 0, n: int = 400) -> list[float]:
    return [s for s in (separation(v) for v in _lists(seed, n)) if s is not None]


def _run(monitor: ExchangeabilityMonitor, requests: list[np.ndarray]) -> MonitorState:
    state = monitor.state
    for scores in requests:
        state = monitor.observe(scores)
    return state


# ------------------------------------------------------------------ p-values, martingale
def test_p_values_are_uniform_and_independent_under_exchangeability() -> None:
    """Reference and live requests from one distribution: p-values ~ U(0, 1), independent."""
    ps, lag = [], []
    for seed in range(40):
        lists = _lists(seed, 150)
        ref = [separation(v) for v in lists[:50]]
        with ExchangeabilityMonitor(ref, seed=seed) as m:
            _run(m, lists[50:])
            p = np.array([row["p_value"] for row in m.history()])
        assert p.size == 100
        ps.append(p)
        lag.append(np.corrcoef(p[:-1], p[1:])[0, 1])
    allp = np.concatenate(ps)
    assert stats.kstest(allp, "uniform").pvalue > 0.001
    # stream means vary as for independent p-values (var 1/12/100); p-values ranked against
    # a fixed reference alone would share its noise and vary several times more
    ratio = np.var([p.mean() for p in ps], ddof=1) / (1 / 12 / 100)
    assert 0.4 < ratio < 2.0
    # lag-1 correlation averages 0 (independent), within 4 standard errors
    assert abs(np.mean(lag)) < 4 * np.std(lag, ddof=1) / np.sqrt(len(lag))


def test_p_values_stay_uniform_with_ties() -> None:
    """Scores on a coarse grid give many tied statistics; random tie-breaking keeps p uniform."""
    ps = []
    for seed in range(30):
        lists = [np.round(v, 1) for v in _lists(seed, 120)]
        with ExchangeabilityMonitor([separation(v) for v in lists[:40]], seed=seed) as m:
            _run(m, lists[40:])
            ps.append([row["p_value"] for row in m.history()])
    allp = np.concatenate(ps)
    assert len({round(float(s), 9) for s in (separation(v) for v in lists)}) < 40  # ties indeed
    assert stats.kstest(allp, "uniform").pvalue > 0.001


def test_alarm_stays_off_on_exchangeable_streams() -> None:
    """Ville: P(ever fires) <= delta = 0.01; allow 5 of 100 streams (binomial tail ~ 3e-3)."""
    fired = 0
    for seed in range(100):
        lists = _lists(1000 + seed, 500)
        with ExchangeabilityMonitor([separation(v) for v in lists[:200]], seed=seed) as m:
            fired += _run(m, lists[200:]).alarm
    assert fired <= 5


def test_fires_on_shifted_input_and_latches(caplog: pytest.LogCaptureFixture) -> None:
    m = ExchangeabilityMonitor(_reference(), delta=0.01)
    assert m.state == MonitorState(1.0, 0.0, False, 0, None, None, 0.01)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # the best snippet no longer stands out: separation drops
        state = _run(m, _lists(7, 60, spread=0.02))
    assert state.alarm and state.fired_at is not None and state.fired_at <= 20
    assert state.fired_time is not None and state.fired_time.endswith("+00:00")
    assert state.martingale >= 100 and state.log10_martingale >= 2
    fired_at = state.fired_at
    # back to calibration-like traffic: the martingale falls, the alarm stays latched
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        later = _run(m, _lists(8, 300))
    assert later.alarm and later.fired_at == fired_at and later.n_observed == 360
    assert later.log10_martingale < state.log10_martingale
    warnings = [r for r in caplog.records if "exchangeability alarm" in r.getMessage()]
    assert len(warnings) == 1 and f"at request {fired_at}" in warnings[0].getMessage()
    assert json.loads(json.dumps(later.to_dict()))["fired_at"] == fired_at


def test_one_sided_alternatives() -> None:
    wider = _lists(9, 100, spread=0.3)  # the best snippet stands out more than at calibration
    less = ExchangeabilityMonitor(_reference(), alternative="less")
    greater = ExchangeabilityMonitor(_reference(), alternative="greater")
    both = ExchangeabilityMonitor(_reference())
    assert not _run(less, wider).alarm
    g, b = _run(greater, wider), _run(both, wider)
    assert g.alarm and b.alarm and g.fired_at <= b.fired_at  # two-sided pays a little


def test_reset_starts_afresh() -> None:
    m = ExchangeabilityMonitor(_reference())
    _run(m, _lists(7, 40, spread=0.02))
    assert m.state.alarm
    first = [row["p_value"] for row in m.history()]
    m.reset()
    assert m.state == MonitorState(1.0, 0.0, False, 0, None, None, 0.01)
    assert m.history() == []
    state = _run(m, _lists(8, 50))
    assert not state.alarm and state.n_observed == 50
    assert [row["seq"] for row in m.history()] == list(range(1, 51))
    assert first[:5] != [row["p_value"] for row in m.history()][:5]


def test_requests_with_fewer_than_two_scores_are_not_observed() -> None:
    m = ExchangeabilityMonitor(_reference())
    assert m.observe([0.3]).n_observed == 0
    assert m.observe([]).n_observed == 0
    assert m.observe([0.3, 0.5]).n_observed == 1


def test_statistic_reads_the_best_five() -> None:
    """A retriever's top-k (k >= 5) of a list has the same statistic as the whole list."""
    v = np.random.default_rng(0).random(20)
    assert separation(v) == separation(np.sort(v)[:5]) == separation(np.sort(v)[:9])
    assert separation(v) == pytest.approx(np.sort(v)[:5].mean() - v.min())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="reference is empty"):
        ExchangeabilityMonitor([])
    with pytest.raises(ValueError, match="non-finite"):
        ExchangeabilityMonitor([0.1, float("nan")])
    with pytest.raises(ValueError, match="delta == 1.5"):
        ExchangeabilityMonitor([0.1], delta=1.5)
    with pytest.raises(ValueError, match="alternative == 'up'"):
        ExchangeabilityMonitor([0.1], alternative="up")
    with pytest.raises(ValueError, match="seed == -1"):
        ExchangeabilityMonitor([0.1], seed=-1)
    with pytest.raises(TypeError, match=r"store must be a path \(str or os.PathLike\) or None, got int"):
        ExchangeabilityMonitor([0.1], store=3)  # type: ignore[arg-type]
    m = ExchangeabilityMonitor([0.1])
    with pytest.raises(ValueError, match="non-finite"):
        m.observe([0.1, float("inf")])
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.observe([0.1, 0.2])


def test_store_that_is_not_a_monitor_store(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE monitor_live (a TEXT)")
    db.close()
    with pytest.raises(ValueError, match="not an exchangeability monitor store"):
        ExchangeabilityMonitor([0.1], store=other)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match="cannot use .* as an exchangeability monitor store"):
        ExchangeabilityMonitor([0.1], store=garbage)


# ------------------------------------------------------------------ artifact block
def _payload(**monitor: Any) -> dict[str, Any]:
    block = {"statistic": "separation", "version": 1, "k": 5, "reference": [0.1, 0.2, 0.3],
             "n_queries": 3, "seed": 0}
    return {"monitor": {**block, **monitor}}


def test_from_artifact() -> None:
    assert ExchangeabilityMonitor.from_artifact({"format": "ragsieve.filter"}) is None
    m = ExchangeabilityMonitor.from_artifact(_payload(), delta=0.05)
    assert m is not None and m.delta == 0.05 and m.k == 5
    with pytest.raises(TypeError, match="k is fixed"):
        ExchangeabilityMonitor.from_artifact(_payload(), k=3)
    with pytest.raises(TypeError, match="payload must be the artifact dict"):
        ExchangeabilityMonitor.from_artifact([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "match"), [
    ({"statistic": "mean"}, "statistic 'mean' version 1 is not one"),
    ({"version": 2}, "version 2 is not one"),
    ({"reference": []}, "non-empty list"),
    ({"reference": [0.1, "x"]}, "non-empty list"),
    ({"reference": [0.1, -0.2]}, "finite numbers >= 0"),
    ({"reference": [0.1, 0.2, 0.3, 0.4]}, "at most one per query"),
    ({"k": 1}, "'k' == 1"),
    ({"seed": True}, "'seed' == True"),
    ({"extra": 1}, "has keys"),
])
def test_malformed_monitor_block(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ArtifactError, match=match):
        ExchangeabilityMonitor.from_artifact(_payload(**change))
    with pytest.raises(ArtifactError, match="'monitor' is a list"):
        ExchangeabilityMonitor.from_artifact({"monitor": [0.1]})


def test_reference_block_subsamples_queries() -> None:
    rng = np.random.default_rng(0)
    qids = np.repeat(np.arange(300), 4)
    block = reference_block(rng.random(qids.size), qids.tolist(), max_size=100, seed=1)
    assert block is not None and len(block["reference"]) == 100 and block["n_queries"] == 300
    again = reference_block(rng.random(qids.size), qids.tolist(), max_size=100, seed=1)
    assert again is not None and again["seed"] == 1
    assert reference_block([0.1, 0.2], ["a", "b"]) is None  # no query with 2 snippets


# ------------------------------------------------------------------ the filter artifact
class _Length(Scorer):
    """Toy score: longer text = less relevant (no model)."""

    name = "length"

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        return np.array([len(s) / 100 for s in snippets], dtype=float)

    def spec(self) -> dict[str, Any]:
        return {"scorer": "length"}


def _toy_pairs(n_queries: int = 40) -> list[Pair]:
    rng = np.random.default_rng(0)
    pairs = []
    for q in range(n_queries):
        for s in range(int(rng.integers(3, 9))):
            pairs.append(Pair(f"q{q}", "question?", f"s{s}", "x" * int(rng.integers(5, 80)),
                              relevant=int(s == 0), group=f"t{q % 5}"))
    return pairs


@pytest.mark.parametrize("mode", ["marginal", "query-all"])
def test_calibrate_records_the_reference_from_every_snippet(mode: str) -> None:
    pairs = _toy_pairs()
    flt = ConformalFilter(_Length(), mode, alpha=0.2).calibrate(pairs)
    lengths: dict[str, list[float]] = {}
    for p in pairs:  # relevant or not: served traffic is unlabelled
        lengths.setdefault(p.query_id, []).append(len(p.text) / 100)
    block = flt.monitor_reference
    assert block is not None and block["n_queries"] == 40 and block["k"] == 5
    assert block["reference"] == pytest.approx([separation(v) for v in lengths.values()])
    payload = flt.to_dict()
    assert payload["monitor"] == block
    evidence = [] if mode == "marginal" else ["evidence"]  # marginal: its state holds them
    assert payload["checksum"]["covers"] == ["scorer", "calibration", "policy", "monitor", "lists",
                                             *evidence]
    again = ConformalFilter.from_dict(json.loads(json.dumps(payload)), scorer=_Length())
    assert again.monitor_reference == block and again.threshold == flt.threshold
    m = ExchangeabilityMonitor.from_artifact(payload)
    assert m is not None and m.state.n_observed == 0


def test_artifact_without_monitor_still_loads(tmp_path: Path) -> None:
    flt = ConformalFilter(_Length(), alpha=0.2).calibrate(_toy_pairs(), monitor=False)
    assert flt.monitor_reference is None
    path = flt.save(tmp_path / "f.json")
    payload = Artifact.read(path).to_dict()
    assert "monitor" not in payload and payload["checksum"]["covers"] == ["scorer", "calibration",
                                                                          "policy", "lists"]
    assert ConformalFilter.load(path, scorer=_Length()).monitor_reference is None
    assert ExchangeabilityMonitor.from_artifact(payload) is None


def test_monitor_block_is_sealed_and_checked() -> None:
    from ragsieve.artifact import seal_value as _checksum

    flt = ConformalFilter(_Length(), alpha=0.2).calibrate(_toy_pairs())
    edited = flt.to_dict()
    edited["monitor"]["reference"][0] += 0.01
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        ConformalFilter.from_dict(edited, scorer=_Length())
    bolted_on = ConformalFilter(_Length(), alpha=0.2).calibrate(_toy_pairs(), monitor=False).to_dict()
    bolted_on["monitor"] = flt.monitor_reference
    with pytest.raises(ArtifactError, match="'monitor' block is not sealed"):
        ConformalFilter.from_dict(bolted_on, scorer=_Length())
    dropped = flt.to_dict()
    del dropped["monitor"]
    with pytest.raises(ArtifactError, match="is not the sha256 over"):
        ConformalFilter.from_dict(dropped, scorer=_Length())
    malformed = flt.to_dict()
    malformed["monitor"]["reference"] = "0.1 0.2"
    malformed["checksum"]["value"] = _checksum(malformed)  # sealed, yet malformed
    with pytest.raises(ArtifactError, match="artifact monitor 'reference' must be"):
        ConformalFilter.from_dict(malformed, scorer=_Length())


# ------------------------------------------------------------------ the shared store
def _worker(store: str, seed: int, n: int, shifted: bool, barrier: Any) -> None:
    m = ExchangeabilityMonitor(_reference(), store=store)
    barrier.wait()
    for scores in _lists(seed, n, spread=0.02 if shifted else 0.1):
        m.observe(scores)
    m.close()


def test_store_two_processes_one_sequential_martingale(tmp_path: Path) -> None:
    """Two real processes hammer one store: no update lost, the result equals a replay."""
    store = tmp_path / "monitor.sqlite"
    ExchangeabilityMonitor(_reference(), store=store).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    jobs = [(store, 11, 200, False), (store, 12, 120, True)]
    procs = [ctx.Process(target=_worker, args=(str(s), seed, n, sh, barrier))
             for s, seed, n, sh in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    shared = ExchangeabilityMonitor(_reference(), store=store)
    state = shared.state
    assert state.n_observed == 320  # no lost update
    log = shared.history()
    assert [row["seq"] for row in log] == list(range(1, 321))
    # the processing order interleaved the two workers
    by_stat = {separation(v): v for v in _lists(11, 200) + _lists(12, 120, spread=0.02)}
    assert len(by_stat) == 320
    order = [by_stat[row["statistic"]] for row in log]
    shifted_ids = {separation(v) for v in _lists(12, 120, spread=0.02)}
    worker = [row["statistic"] in shifted_ids for row in log]
    assert sum(a != b for a, b in itertools.pairwise(worker)) >= 2  # the workers interleaved
    replay = ExchangeabilityMonitor(_reference())
    replayed = _run(replay, order)
    assert replayed.alarm and state.alarm  # the shifted worker set it off
    assert replayed.fired_at == state.fired_at
    assert replayed.log10_martingale == pytest.approx(state.log10_martingale, rel=1e-12)
    np.testing.assert_allclose([r["p_value"] for r in replay.history()],
                               [r["p_value"] for r in log], rtol=1e-12)


def _forked_worker(monitor: ExchangeabilityMonitor, seed: int) -> None:
    for scores in _lists(seed, 50):
        monitor.observe(scores)


def test_store_survives_fork_restart_and_takeover(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "m.sqlite"
    m = ExchangeabilityMonitor(_reference(), store=store)
    m.observe(_lists(0, 1)[0])
    child = mp.get_context("fork").Process(target=_forked_worker, args=(m, 21))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert m.state.n_observed == 51  # the forked child reopened its own connection
    m.close()
    again = ExchangeabilityMonitor(_reference(), store=store)  # a restart joins the store
    assert again.state.n_observed == 51
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        other = ExchangeabilityMonitor(_reference(), store=store, delta=0.05)  # other settings
    assert other.state.n_observed == 0 and "starting a fresh martingale" in caplog.text
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        stale = again.observe(_lists(1, 1)[0])  # `again` was overtaken: it no longer writes
    assert stale.n_observed == 0 and "no longer writes" in caplog.text
    assert other.observe(_lists(1, 1)[0]).n_observed == 1


# ------------------------------------------------------------------ real traffic (XQuAD)
def _by_query(pairs: list[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for p in pairs:
        out.setdefault(p.query_id, []).append(p)
    return out


@pytest.fixture(scope="module")
def xquad_split(xquad_en: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """Half of the questions of every article calibrate, the other half are held back."""
    rng = np.random.default_rng(0)
    queries = _by_query(xquad_en)
    by_article: dict[str, list[str]] = {}
    for qid, ps in queries.items():
        by_article.setdefault(ps[0].group, []).append(qid)
    cal: list[Pair] = []
    held: list[Pair] = []
    for qids in by_article.values():
        order = rng.permutation(len(qids))
        for rank, i in enumerate(order):
            (cal if rank < len(qids) // 2 else held).extend(queries[qids[i]])
    return cal, held


@pytest.fixture(scope="module")
def drift_filter(xquad_split, minilm_scorer, xquad_en_scores, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A filter calibrated on the calibration half, saved and read back as an artifact."""
    flt = ConformalFilter(minilm_scorer, alpha=0.1).calibrate(xquad_split[0])
    path = flt.save(tmp_path_factory.mktemp("drift") / "filter.json")
    return flt, Artifact.read(path).to_dict()


def _served(flt: ConformalFilter, pairs: list[Pair]) -> list[np.ndarray]:
    """Each query's served scores, as the service feeds them to the monitor."""
    return [np.array(r.scores) for r in flt.filter_pairs(pairs).values()]


def _streams_to_alarm(payload: dict[str, Any], lists: list[np.ndarray], n_streams: int,
                      length: int, *, replace: bool) -> list[int | None]:
    """Request number at which each simulated stream fired (None: it did not)."""
    out: list[int | None] = []
    for s in range(n_streams):
        rng = np.random.default_rng(s)
        order = rng.choice(len(lists), size=length, replace=replace)
        m = ExchangeabilityMonitor.from_artifact(payload, seed=s)
        assert m is not None
        for i in order:
            if m.observe(lists[i]).alarm:
                break
        out.append(m.state.fired_at)
        m.close()
    return out


def test_artifact_carries_the_reference(drift_filter, xquad_split) -> None:  # type: ignore[no-untyped-def]
    flt, payload = drift_filter
    n_cal = len(_by_query(xquad_split[0]))
    block = payload["monitor"]
    assert block["statistic"] == "separation" and block["n_queries"] == n_cal
    assert len(block["reference"]) == n_cal  # every XQuAD list has >= 2 snippets
    # the reference is the statistic of every calibration snippet's score, relevant or not
    cal_scores = _served(flt, xquad_split[0])
    assert sorted(block["reference"]) == pytest.approx(sorted(separation(v) for v in cal_scores))
    assert ConformalFilter.from_dict(payload).monitor_reference == block


def test_held_back_traffic_stays_quiet(drift_filter, xquad_split, record_property) -> None:  # type: ignore[no-untyped-def]
    """100 random orders of 250 held-back questions of the calibration articles."""
    flt, payload = drift_filter
    fired = _streams_to_alarm(payload, _served(flt, xquad_split[1]), 100, 250, replace=False)
    n_fired = sum(f is not None for f in fired)
    record_property("false_alarms_of_100", n_fired)
    assert n_fired <= 5


@pytest.mark.slow
def test_held_back_traffic_stays_quiet_full_streams(drift_filter, xquad_split) -> None:  # type: ignore[no-untyped-def]
    """100 random orders of every held-back question (about 600 requests each)."""
    flt, payload = drift_filter
    lists = _served(flt, xquad_split[1])
    fired = _streams_to_alarm(payload, lists, 100, len(lists), replace=False)
    assert sum(f is not None for f in fired) <= 5


def test_unrelated_documents_fire(drift_filter, xquad_split, record_property) -> None:  # type: ignore[no-untyped-def]
    """Held-back questions served the snippets of another, random article."""
    flt, payload = drift_filter
    rng = np.random.default_rng(1)
    articles: dict[str, list[Pair]] = {}
    for ps in _by_query(xquad_split[1]).values():
        articles.setdefault(ps[0].group, ps)
    names = sorted(articles)
    shifted = []
    for qid, ps in list(_by_query(xquad_split[1]).items())[:200]:
        other = names[rng.choice([i for i, a in enumerate(names) if a != ps[0].group])]
        shifted += [Pair(qid, ps[0].query, o.snippet_id, o.text, relevant=0)
                    for o in articles[other]]
    fired = _streams_to_alarm(payload, _served(flt, shifted), 20, 300, replace=True)
    assert all(f is not None for f in fired)
    median = float(np.median([f for f in fired if f is not None]))
    record_property("median_requests_to_alarm_unrelated", median)
    assert median <= 20


def _language_fires(flt: ConformalFilter, payload: dict[str, Any], pairs: list[Pair],
                    n_streams: int) -> list[int | None]:
    return _streams_to_alarm(payload, _served(flt, pairs), n_streams, 600, replace=True)


def test_another_language_fires(drift_filter, shared_data_dir, record_property) -> None:  # type: ignore[no-untyped-def]
    """German XQuAD (the questions of 6 articles and their snippets), scored by the English filter."""
    from ragsieve.data import load_dataset

    flt, payload = drift_filter
    de = load_dataset("xquad-de", data_dir=shared_data_dir)
    articles = sorted({p.group for p in de})[::8]
    fired = _language_fires(flt, payload, [p for p in de if p.group in articles], 20)
    assert all(f is not None for f in fired)
    median = float(np.median([f for f in fired if f is not None]))
    record_property("median_requests_to_alarm_de", median)
    assert median <= 150


@pytest.mark.slow
@pytest.mark.parametrize("language", ["de", "zh"])
def test_another_language_fires_all_questions(drift_filter, shared_data_dir, language) -> None:  # type: ignore[no-untyped-def]
    """Every German or Chinese XQuAD question with its article's snippets."""
    from ragsieve.data import load_dataset

    flt, payload = drift_filter
    fired = _language_fires(flt, payload, load_dataset(f"xquad-{language}", data_dir=shared_data_dir), 20)
    assert all(f is not None for f in fired)
    assert float(np.median([f for f in fired if f is not None])) <= 200
