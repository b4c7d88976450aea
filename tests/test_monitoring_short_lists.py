"""The exchangeability alarm on short lists (1-6 snippets): the separation and the best score,
combined by a union bound, stay quiet on exchangeable streams, fire on shifted ones (real
MiniLM scores of XQuAD-en), read separation-only artifacts as before, and are what the
served path observes (real uvicorn server)."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ragsieve import ConformalFilter
from ragsieve._monitor_reference import read_monitor_block
from ragsieve.artifact import Artifact
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.errors import ArtifactError
from ragsieve.monitoring import ExchangeabilityMonitor, reference_block


def _short_lists(rng: np.random.Generator, n: int, *, ties: bool = False) -> list[np.ndarray]:
    """Synthetic short lists: one relevant-like score and 0-5 others, lengths uniform in 1..6."""
    out = []
    for _ in range(n):
        size = int(rng.integers(1, 7))
        best = rng.normal(0.35, 0.08)
        rest = rng.normal(0.7, 0.1, size - 1)
        scores = np.concatenate([[best], rest])
        out.append(np.round(scores, 1) if ties else scores)  # ties: scores on a 0.1 grid
    return out


def _block(lists: list[np.ndarray], seed: int = 0) -> dict[str, Any]:
    qids = [j for j, s in enumerate(lists) for _ in range(s.size)]
    block = reference_block(np.concatenate(lists), qids, seed=seed)
    assert block is not None
    return block


def _fires_within(monitor: ExchangeabilityMonitor, requests: list[np.ndarray]) -> int | None:
    for i, scores in enumerate(requests, 1):
        if monitor.observe(scores).alarm:
            return i
    return None


def test_p_values_of_each_statistic_are_uniform_with_many_ties() -> None:
    """Scores on a 0.1 grid: the best score takes a handful of values, and theta breaks the
    ties so that each statistic's online p-values stay uniform on exchangeable traffic."""
    pooled: dict[str, list[float]] = {"separation": [], "best": []}
    for seed in range(4):
        rng = np.random.default_rng(seed)
        lists = _short_lists(rng, 700, ties=True)
        block = _block(lists[:200], seed)
        m = ExchangeabilityMonitor.from_artifact({"monitor": block}, seed=seed, delta=0.01)
        assert m is not None
        for scores in lists[200:]:
            m.observe(scores)
        rows = m.history()
        assert len(rows) == 500  # every request (1 snippet too) is observed
        for name in pooled:
            pooled[name] += [r["statistics"][name][1] for r in rows if name in r["statistics"]]
        assert len(np.unique([r["statistics"]["best"][0] for r in rows])) < 10  # many ties
    for name, ps in pooled.items():
        assert stats.kstest(ps, "uniform").pvalue > 1e-3, name
    # without theta (ties counted whole) the best score's p-values would not be uniform:
    assert len(pooled["best"]) > 1500


def test_false_alarms_stay_rare_on_exchangeable_short_lists() -> None:
    """60 seeded streams at delta = 0.1: the alarm may fire in each with probability at most
    0.1 (union bound over the two martingales); 14 or more of 60 would have probability
    below 0.01 under Binomial(60, 0.1)."""
    delta, n_streams = 0.1, 60
    fired = 0
    for seed in range(n_streams):
        rng = np.random.default_rng(1000 + seed)
        lists = _short_lists(rng, 300)
        m = ExchangeabilityMonitor.from_artifact({"monitor": _block(lists[:150], seed)},
                                                 seed=seed, delta=delta)
        assert m is not None
        fired += _fires_within(m, lists[150:]) is not None
    assert stats.binom.sf(13, n_streams, delta) < 0.01
    assert fired <= 13, fired


def _article_lists(pairs: list[Any], scores: np.ndarray) -> tuple[list[str], list[np.ndarray],
                                                                 list[np.ndarray]]:
    by_query: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_query.setdefault(p.query_id, []).append(i)
    groups = [pairs[idx[0]].group for idx in by_query.values()]
    return (groups, [scores[idx] for idx in by_query.values()],
            [np.array([pairs[i].relevant == 1 for i in idx]) for idx in by_query.values()])


def test_fires_on_short_list_shifts_of_real_scores(xquad_en: list[Any],
                                                   xquad_en_scores: np.ndarray) -> None:
    """XQuAD-en, MiniLM: calibrate on short lists (the relevant paragraph and 0-5 others of its
    article) of half the questions; serve other articles' paragraphs to the other half."""
    groups, lists, relevant = _article_lists(xquad_en, np.asarray(xquad_en_scores))
    rng = np.random.default_rng(7)
    order = rng.permutation(len(lists))
    cal, held = order[: len(order) // 2], order[len(order) // 2:]

    def short(i: int) -> np.ndarray:
        n = int(rng.integers(1, 7))
        rel, other = np.flatnonzero(relevant[i]), np.flatnonzero(~relevant[i])
        pick = np.concatenate([rng.choice(rel, 1), rng.permutation(other)[: n - 1]])
        return lists[i][pick.astype(int)]

    block = _block([short(int(i)) for i in cal])
    by_article: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_article.setdefault(g, []).append(i)
    articles = sorted(by_article)

    def unrelated(i: int, n: int) -> np.ndarray:
        """Question i served n paragraphs of another article: its scores against them."""
        own = groups[i]
        other = articles[(articles.index(own) + 1 + int(rng.integers(len(articles) - 1)))
                         % len(articles)]
        # question i's scores of the other article are not in xquad_en: take another question
        # of that article and the paragraphs it did not ask about (irrelevant to i as well)
        j = int(rng.choice(by_article[other]))
        return rng.permutation(lists[j][~relevant[j]])[:n]

    shifted = [unrelated(int(i), int(rng.integers(1, 7))) for i in held[:150]]
    combined = ExchangeabilityMonitor.from_artifact({"monitor": block})
    assert combined is not None
    assert _fires_within(combined, shifted) is not None
    # one-snippet junk: the separation alone never sees it, the best score does
    ones = [unrelated(int(i), 1) for i in held[:150]]
    alone = ExchangeabilityMonitor(block["reference"])
    assert _fires_within(alone, ones) is None and alone.state.n_observed == 0
    combined = ExchangeabilityMonitor.from_artifact({"monitor": block})
    assert combined is not None
    assert _fires_within(combined, ones) is not None


def test_separation_only_blocks_are_monitored_as_before(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(3)
    lists = _short_lists(rng, 400)
    block = _block(lists[:200])
    old = {k: v for k, v in block.items() if k != "best"}
    assert read_monitor_block(old) == old
    m_old = ExchangeabilityMonitor.from_artifact({"monitor": old})
    m_sep = ExchangeabilityMonitor(block["reference"])
    assert m_old is not None and m_old.state.martingale == 1.0
    for scores in lists[200:]:
        a, b = m_old.observe(scores), m_sep.observe(scores)
        assert a == b
    assert m_old.observe([0.3]) == m_old.state  # one score: no separation, not observed
    assert "statistics=['separation']" in repr(m_old)
    # the shared store's fingerprint changes with the statistic set: a combined monitor
    # takes a separation-only store over (fresh martingale), and the other way round
    store = tmp_path / "m.sqlite"
    with ExchangeabilityMonitor.from_artifact({"monitor": old}, store=store) as first:
        for scores in lists[200:230]:
            first.observe(scores)
        with caplog.at_level(logging.WARNING, logger="ragsieve.monitoring"), \
                ExchangeabilityMonitor.from_artifact({"monitor": block}, store=store) as second:
            assert "used with another reference" in caplog.text
            assert second.state.n_observed == 0 and math.isclose(second.state.martingale, 0.5)
            second.observe([0.3])
            assert second.state.n_observed == 1
        assert first.observe(lists[231]).n_observed == 1  # stale: reports the store, writes not


def test_an_earlier_store_log_is_replaced(tmp_path: Path) -> None:
    store = tmp_path / "old.sqlite"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE monitor_log (seq INTEGER PRIMARY KEY, statistic REAL NOT NULL, "
                   "p_value REAL NOT NULL, log10_martingale REAL NOT NULL)")
        db.execute("INSERT INTO monitor_log VALUES (1, 0.1, 0.5, 0.0)")
    db.close()
    with ExchangeabilityMonitor([0.1, 0.2, 0.3], best=[0.2, 0.3], store=store) as m:
        assert m.history() == []
        m.observe([0.2])
        assert m.history()[0]["statistic"] is None and "best" in m.history()[0]["statistics"]


@pytest.mark.parametrize(("best", "message"), [
    ([], "non-empty list"),
    ([0.1, True], "non-empty list"),
    ([0.1, math.inf], "non-empty list"),
    ("0.1", "non-empty list"),
    ([0.1] * 500, "at most one per query"),
])
def test_read_monitor_block_checks_best(best: Any, message: str) -> None:
    block = {"statistic": "separation", "version": 1, "k": 5, "reference": [0.1, 0.2],
             "n_queries": 300, "seed": 0, "best": best}
    with pytest.raises(ArtifactError, match=message):
        read_monitor_block(block)
    with pytest.raises(ArtifactError, match="optionally"):
        read_monitor_block({**block, "best": [0.1], "kept": [1]})


def test_the_seal_covers_the_best_scores(served_artifact: Any, tmp_path: Path) -> None:
    path = served_artifact(SplitConformalCalibrator(alpha=0.2))
    payload = Artifact.read(path).to_dict()
    assert len(payload["monitor"]["best"]) == payload["monitor"]["n_queries"]
    assert ExchangeabilityMonitor.from_artifact(payload) is not None
    payload["monitor"]["best"][0] += 0.01
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(payload))
    with pytest.raises(ArtifactError):
        ConformalFilter.load(tampered)
    with pytest.raises(ArtifactError):
        ExchangeabilityMonitor.from_artifact(payload)


def test_the_served_path_observes_one_snippet_requests(served_artifact: Any,
                                                       embedding_cache_dir: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from servers import serving

    path = served_artifact(SplitConformalCalibrator(alpha=0.2))
    with serving(path, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        before = httpx.get(srv.url + "/healthz").json()["monitor"]
        assert before["n_observed"] == 0 and math.isclose(before["martingale"], 0.5)
        r = httpx.post(srv.url + "/filter", timeout=60, json={
            "query": "Which river flows through Paris?",
            "snippets": ["Chop the onions and fry them in butter until golden."]})
        assert r.status_code == 200, r.text
        after = httpx.get(srv.url + "/healthz").json()["monitor"]
        assert after["n_observed"] == 1, after  # the best score of a one-snippet request


def test_separation_of_equal_scores_is_never_negative() -> None:
    """Equal scores whose mean rounds below the first (a float sum) give 0, not -1e-17: the
    artifact reader refuses negative reference values."""
    from ragsieve._monitor_reference import separation

    assert sum([0.7] * 3) / 3 < 0.7  # the rounding this guards against
    assert separation([0.7] * 3) == 0.0
    assert separation([0.123456789] * 5 + [0.9]) == 0.0
