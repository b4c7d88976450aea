"""Operating the service: /metrics, /feedback, --adaptive, recalibrate, hot reload, monitor.

Every test runs the real app (real MiniLM scorer, real exchangeability monitor) in a real
uvicorn server on a free 127.0.0.1 port; only the monitor-failure test injects a double.
The process-level behaviour (SIGHUP, ``--workers``) is in ``test_server_ops_processes.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families
from servers import ThreadServer, serving

from ragsieve import ConformalFilter, Pair
from ragsieve._monitor_reference import separation
from ragsieve.calibration import AdaptiveCalibrator, SplitConformalCalibrator
from ragsieve.cli import main as cli_main
from ragsieve.errors import ArtifactError
from ragsieve.monitoring import ExchangeabilityMonitor
from ragsieve.scoring import EmbeddingScorer
from ragsieve.server import create_app
from ragsieve.server.app import _create_app
from ragsieve.server.feedback import FeedbackStore, scorer_key
from ragsieve.server.options import ServeOptions

KEY = "ops-key"
AUTH = {"X-API-Key": KEY}
#: What a program sends to a bodiless admin route without a key (no JSON body).
CLIENT = {"X-Ragsieve": "1"}


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def artifacts(served_artifact: Any) -> dict[str, Path]:
    """Three real artifacts: marginal alpha 0.2 and 0.1, and adaptive (gamma 0.05)."""
    return {"a": served_artifact(SplitConformalCalibrator(alpha=0.2)),
            "b": served_artifact(SplitConformalCalibrator(alpha=0.1)),
            "adaptive": served_artifact(AdaptiveCalibrator(alpha=0.2, gamma=0.05, window=200))}


@pytest.fixture(scope="module")
def options(embedding_cache_dir: Path) -> dict[str, Any]:
    return {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY}


def _payload(pairs: list[Pair], start: int, n: int = 6, **extra: Any) -> dict[str, Any]:
    chunk = pairs[start:start + n]
    return {"query": chunk[0].query,
            "snippets": [{"text": p.text, "snippet_id": p.snippet_id} for p in chunk], **extra}


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", headers=AUTH).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _m(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


# ---------------------------------------------------------------------- /metrics
def test_metrics_count_requests_snippets_and_scores(artifacts: dict[str, Path],
                                                    options: dict[str, Any],
                                                    xquad_en: list[Pair]) -> None:
    with serving(artifacts["a"], **options) as srv:
        kept = scored = 0
        all_scores: list[float] = []
        for i in range(3):
            body = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300 + 10 * i),
                              headers=AUTH).json()
            kept += len(body["kept"])
            scored += len(body["scores"])
            all_scores += body["scores"]
        assert httpx.post(srv.url + "/filter", json={"query": " ", "snippets": ["x"]},
                          headers=AUTH).status_code == 422
        assert httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300)).status_code == 401
        assert httpx.get(srv.url + "/metrics").status_code == 401  # behind the key
        assert httpx.get(srv.url + "/metrics", headers={"X-API-Key": "wrong"}).status_code == 401
        r = httpx.get(srv.url + "/metrics", headers=AUTH)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        m = _metrics(srv.url)
        health = httpx.get(srv.url + "/healthz").json()
    assert _m(m, "ragsieve_requests_total", endpoint="/filter", status="200") == 3
    assert _m(m, "ragsieve_requests_total", endpoint="/filter", status="422") == 1
    assert _m(m, "ragsieve_requests_total", endpoint="/filter", status="401") == 1
    assert _m(m, "ragsieve_request_errors_total", endpoint="/filter", status="401") == 1
    assert _m(m, "ragsieve_request_errors_total", endpoint="/filter", status="200") == 0
    assert _m(m, "ragsieve_requests_total", endpoint="/metrics", status="401") == 2
    assert _m(m, "ragsieve_request_duration_seconds_count", endpoint="/filter") == 5
    assert _m(m, "ragsieve_snippets_scored_total", endpoint="/filter") == scored == 18
    assert _m(m, "ragsieve_snippets_kept_total", endpoint="/filter") == kept
    assert _m(m, "ragsieve_served_score_count") == scored
    assert _m(m, "ragsieve_served_score_sum") == pytest.approx(sum(all_scores))
    below = sum(s <= 0.5 for s in all_scores)
    assert _m(m, "ragsieve_served_score_bucket", le="0.5") == below
    art = health["artifact"]
    assert _m(m, "ragsieve_threshold") == pytest.approx(art["threshold"])
    assert _m(m, "ragsieve_artifact_info", format_version="3", library_version=art[
        "library_version"], mode="marginal", alpha="0.2", checksum=art["checksum"]) == 1
    assert _m(m, "ragsieve_artifact_generation") == 1
    assert _m(m, "ragsieve_drift_alarm") == 0
    assert health["monitor"] is not None and health["monitor"]["n_observed"] == 3
    assert _m(m, "ragsieve_exchangeability_martingale") == pytest.approx(
        health["monitor"]["martingale"])


def test_each_app_has_its_own_registry(artifacts: dict[str, Path], options: dict[str, Any],
                                       xquad_en: list[Pair]) -> None:
    with serving(artifacts["a"], **options) as one, serving(artifacts["a"], **options) as two:
        httpx.post(one.url + "/filter", json=_payload(xquad_en, 320), headers=AUTH)
        assert _m(_metrics(one.url), "ragsieve_requests_total", endpoint="/filter",
                  status="200") == 1
        assert _m(_metrics(two.url), "ragsieve_requests_total", endpoint="/filter",
                  status="200") == 0


def test_unknown_paths_share_one_label(artifacts: dict[str, Path], options: dict[str, Any]) -> None:
    with serving(artifacts["a"], **options) as srv:
        for i in range(3):
            assert httpx.get(srv.url + f"/nope/{i}", headers=AUTH).status_code == 404
        m = _metrics(srv.url)
    assert _m(m, "ragsieve_requests_total", endpoint="other", status="404") == 3
    assert not any("/nope" in str(k) for k in m)


# ---------------------------------------------------------------------- query ids, feedback
def test_query_id_echoed_generated_and_recorded(artifacts: dict[str, Path],
                                                options: dict[str, Any], xquad_en: list[Pair],
                                                tmp_path: Path) -> None:
    db = tmp_path / "fb.sqlite"
    with serving(artifacts["a"], feedback_db=db, **options) as srv:
        mine = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 330, query_id="q-1"),
                          headers=AUTH).json()
        generated = [httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a", "b"]},
                                headers=AUTH).json()["query_id"] for _ in range(2)]
        assert httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a"],
                                                     "query_id": ""}, headers=AUTH).status_code == 422
        assert httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a"],
                                                     "query_id": 7}, headers=AUTH).status_code == 422
    assert mine["query_id"] == "q-1"
    assert len(set(generated)) == 2 and all(len(g) == 32 for g in generated)
    store = FeedbackStore(db, create=False)
    try:
        assert store.count_served() == 6 + 2 + 2
        key = scorer_key(json.loads(artifacts["a"].read_text())["scorer"])
        sid = xquad_en[331].snippet_id
        assert store.served_score("q-1", sid, key) == pytest.approx(mine["scores"][1])
        assert store.served_score(generated[0], "1", key) is not None  # position as the id
    finally:
        store.close()


BAD_FEEDBACK = [
    (b'{"items": []}', "at least 1 item"),
    (b'{"query_id": "q", "snippet_id": "s", "relevant": 1}', "items"),  # a bare item
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": 2}]}', "must be true, false, 1 or 0"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": "yes"}]}', "relevant"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": 1.0}]}', "relevant"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s"}]}', "relevant"),
    (b'{"items": [{"query_id": "", "snippet_id": "s", "relevant": 1}]}', "query_id"),
    (b'{"items": [{"query_id": "q", "snippet_id": 3, "relevant": 1}]}', "snippet_id"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": 1, "score": NaN}]}', "NaN"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": 1, "score": "0.3"}]}', "score"),
    (b'{"items": [{"query_id": "q", "snippet_id": "s", "relevant": 1, "label": 1}]}', "label"),
    (b'{"items": {"query_id": "q"}}', "items"),
    (b'[1, 2]', "dict"),
]


@pytest.mark.parametrize(("body", "needle"), BAD_FEEDBACK)
def test_feedback_refuses_bad_bodies(artifacts: dict[str, Path], options: dict[str, Any],
                                     body: bytes, needle: str, feedback_url: str) -> None:
    r = httpx.post(feedback_url + "/feedback", content=body,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert needle.lower() in r.text.lower()


@pytest.fixture(scope="module")
def feedback_url(artifacts: dict[str, Path], options: dict[str, Any]) -> Iterator[str]:
    with serving(artifacts["a"], max_snippets=5, **options) as srv:
        yield srv.url


def test_feedback_limits_and_key(feedback_url: str) -> None:
    items = [{"query_id": "q", "snippet_id": str(i), "relevant": 1} for i in range(6)]
    r = httpx.post(feedback_url + "/feedback", json={"items": items}, headers=AUTH)
    assert r.status_code == 413 and "limit is 5" in r.text
    assert httpx.post(feedback_url + "/feedback", json={"items": items[:1]}).status_code == 401


def test_feedback_joins_the_served_score(artifacts: dict[str, Path], options: dict[str, Any],
                                         xquad_en: list[Pair], tmp_path: Path) -> None:
    with serving(artifacts["a"], feedback_db=tmp_path / "fb.sqlite", **options) as srv:
        served = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 340, query_id="Q"),
                            headers=AUTH).json()
        ids = [p.snippet_id for p in xquad_en[340:346]]
        items = [{"query_id": "Q", "snippet_id": ids[0], "relevant": True},
                 {"query_id": "Q", "snippet_id": ids[1], "relevant": 0},
                 {"query_id": "other", "snippet_id": "x", "relevant": 1},
                 {"query_id": "Q", "snippet_id": "never-served", "relevant": 1}]
        r = httpx.post(srv.url + "/feedback", json={"items": items}, headers=AUTH)
        assert r.status_code == 200, r.text
        first = r.json()
        again = httpx.post(srv.url + "/feedback", json={"items": items[:1]}, headers=AUTH).json()
        m = _metrics(srv.url)
    assert first == {"accepted": 2, "new": 2, "unknown": 2, "over_limit": 0,
                     "adaptive_updates": 0, "adaptive": None}
    assert again["new"] == 0 and again["accepted"] == 1
    assert _m(m, "ragsieve_feedback_labels_total", relevant="1") == 4
    assert _m(m, "ragsieve_feedback_labels_total", relevant="0") == 1
    store = FeedbackStore(tmp_path / "fb.sqlite", create=False)
    try:
        key = scorer_key(json.loads(artifacts["a"].read_text())["scorer"])
        rows = {(q, s): (r, score) for q, s, r, score, _ in store.labelled(key)}
    finally:
        store.close()
    assert rows == {("Q", ids[0]): (True, pytest.approx(served["scores"][0])),
                    ("Q", ids[1]): (False, pytest.approx(served["scores"][1]))}


# ---------------------------------------------------------------------- --adaptive
def test_adaptive_threshold_follows_feedback_and_survives_restart(
        artifacts: dict[str, Path], options: dict[str, Any], xquad_en: list[Pair],
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    replay = ConformalFilter.load(artifacts["adaptive"],
                                  scorer_options=options["scorer_options"]).calibrator
    start = replay.threshold_
    irrelevant = list({p.snippet_id: p for p in xquad_en[300:4000] if p.relevant == 0}.values())[:40]
    with serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options) as srv:
        h0 = httpx.get(srv.url + "/healthz").json()
        assert h0["adaptive"]["threshold"] == pytest.approx(start)
        body = httpx.post(srv.url + "/filter", headers=AUTH, json={
            "query": irrelevant[0].query, "query_id": "live",
            "snippets": [{"text": p.text, "snippet_id": p.snippet_id} for p in irrelevant]}).json()
        # the client says all of them were relevant: misses above tau push the threshold up
        items = [{"query_id": "live", "snippet_id": p.snippet_id, "relevant": 1}
                 for p in irrelevant]
        r = httpx.post(srv.url + "/feedback", json={"items": items}, headers=AUTH).json()
        for s in body["scores"]:
            replay.update(s, True)
        assert r["adaptive_updates"] == 40
        assert r["adaptive"]["threshold"] == pytest.approx(replay.threshold_)
        assert r["adaptive"]["n_updates"] == 40 and r["adaptive"]["n_errors"] == replay.n_errors_
        assert replay.threshold_ > start and replay.n_errors_ > 0
        h1 = httpx.get(srv.url + "/healthz").json()
        assert h1["artifact"]["threshold"] == pytest.approx(replay.threshold_)
        after = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300),
                           headers=AUTH).json()
        assert after["threshold"] == pytest.approx(replay.threshold_)
        assert _m(_metrics(srv.url), "ragsieve_threshold") == pytest.approx(replay.threshold_)
        # a repeated label is stored again but not applied twice
        again = httpx.post(srv.url + "/feedback", json={"items": items[:3]}, headers=AUTH).json()
        assert again["adaptive_updates"] == 0 and again["adaptive"]["n_updates"] == 40
    with serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options) as srv:
        h2 = httpx.get(srv.url + "/healthz").json()
    assert h2["adaptive"]["threshold"] == pytest.approx(replay.threshold_)
    assert h2["adaptive"]["n_updates"] == 40  # the restart continues where it stopped


def test_adaptive_needs_an_adaptive_artifact(artifacts: dict[str, Path], options: dict[str, Any],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ArtifactError, match="--adaptive needs an artifact of mode 'adaptive'"):
        create_app(artifacts["a"], adaptive=True, **options)
    code = cli_main(["serve", "--filter", str(artifacts["a"]), "--adaptive", "--port", "0",
                     "--state-dir", str(artifacts["a"].parent / "refused-state")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1  # the error is the only line
    assert err[0].startswith("ragsieve serve: error: serve --adaptive needs an artifact of "
                             "mode 'adaptive'")


# ---------------------------------------------------------------------- recalibrate
def test_recalibrate_from_served_labels(artifacts: dict[str, Path], options: dict[str, Any],
                                        xquad_en: list[Pair], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "labels.sqlite"
    live = xquad_en[300:540]
    by_query: dict[str, list[Pair]] = {}
    for p in live:
        by_query.setdefault(p.query_id, []).append(p)
    relevant_scores: list[float] = []
    served_lists: dict[str, list[float]] = {}
    with serving(artifacts["a"], feedback_db=db, **options) as srv:
        for qid, group in by_query.items():
            body = httpx.post(srv.url + "/filter", headers=AUTH, json={
                "query": group[0].query, "query_id": qid,
                "snippets": [{"text": p.text, "snippet_id": p.snippet_id} for p in group]}).json()
            items = [{"query_id": qid, "snippet_id": p.snippet_id, "relevant": p.relevant}
                     for p in group]
            assert httpx.post(srv.url + "/feedback", json={"items": items},
                              headers=AUTH).status_code == 200
            relevant_scores += [s for s, p in zip(body["scores"], group) if p.relevant]
            served_lists[qid] = body["scores"]
    out = tmp_path / "recal.json"
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["a"]),
                     "--out", str(out), "--min-labels", "10", "--replace"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    expected = SplitConformalCalibrator(alpha=0.2).fit(relevant_scores).threshold_
    new = ConformalFilter.load(out, scorer_options=options["scorer_options"])
    assert new.mode == "marginal" and new.alpha == pytest.approx(0.2)
    assert new.threshold == pytest.approx(expected)
    assert new.calibration_info["source"] == "feedback"
    # the monitor's reference: the statistic of each labelled query's whole served list
    block = json.loads(out.read_text())["monitor"]
    stats = [separation(served_lists[q]) for q in sorted(served_lists)]
    assert block["n_queries"] == len(served_lists)
    assert block["reference"] == pytest.approx([v for v in stats if v is not None])
    assert ExchangeabilityMonitor.from_artifact(json.loads(out.read_text())) is not None
    assert f"recalibrated on {len(live)} labels ({len(relevant_scores)} relevant" in printed
    assert f"tau={expected:.4f}" in printed
    # the default merges the labels with the artifact's own calibration scores
    merged = tmp_path / "merged.json"
    assert cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["a"]),
                     "--out", str(merged), "--min-labels", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    old = ConformalFilter.load(artifacts["a"], scorer_options=options["scorer_options"])
    kept = list(old.calibrator.scores_)
    assert report["merged_calibration_scores"] == len(kept) > 0
    both = SplitConformalCalibrator(alpha=0.2).fit(kept + relevant_scores).threshold_
    assert ConformalFilter.load(merged, scorer_options=options["scorer_options"]).threshold \
        == pytest.approx(both)
    # too few labels: one line, exit 2, nothing written
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["a"]),
                     "--out", str(tmp_path / "no.json"), "--min-labels", "100000"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "min_labels is 100000" in err[0]
    assert not (tmp_path / "no.json").exists()
    code = cli_main(["recalibrate", "--feedback", str(tmp_path / "missing.sqlite"), "--filter",
                     str(artifacts["a"]), "--out", str(tmp_path / "no.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not exist" in err[0]
    not_db = tmp_path / "not.sqlite"
    not_db.write_text("hello")
    code = cli_main(["recalibrate", "--feedback", str(not_db), "--filter", str(artifacts["a"]),
                     "--out", str(tmp_path / "no.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a ragsieve feedback database" in err[0]


def test_recalibrate_refuses_modes_labels_cannot_feed(tmp_path: Path, xquad_en: list[Pair],
                                                      embedding_cache_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.calibration import make_calibrator

    art = ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir),
                          make_calibrator("topic", alpha=0.2)).calibrate(xquad_en[:300])
    art.save(tmp_path / "topic.json")
    FeedbackStore(tmp_path / "fb.sqlite").close()
    code = cli_main(["recalibrate", "--feedback", str(tmp_path / "fb.sqlite"), "--filter",
                     str(tmp_path / "topic.json"), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs calibration topics" in err[0]


# ---------------------------------------------------------------------- hot reload
def test_admin_reload_swaps_refuses_and_needs_the_key(artifacts: dict[str, Path],
                                                      options: dict[str, Any],
                                                      xquad_en: list[Pair], tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    tau_b = json.loads(artifacts["b"].read_text())["calibration"]["state"]["threshold"]
    with serving(served, **options) as srv:
        for _ in range(3):
            httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300), headers=AUTH)
        assert httpx.post(srv.url + "/admin/reload", headers=CLIENT).status_code == 401
        same = httpx.post(srv.url + "/admin/reload", headers=AUTH).json()
        assert same["generation"] == 2 and not same["changed"] and not same["monitor_reset"]
        assert httpx.get(srv.url + "/healthz").json()["monitor"]["n_observed"] == 3  # kept
        shutil.copy(artifacts["b"], served)
        r = httpx.post(srv.url + "/admin/reload", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["changed"] and r.json()["monitor_reset"] and r.json()["generation"] == 3
        health = httpx.get(srv.url + "/healthz").json()
        assert health["generation"] == 3 and health["artifact"]["alpha"] == pytest.approx(0.1)
        assert health["artifact"]["threshold"] == pytest.approx(tau_b)
        assert health["monitor"]["n_observed"] == 0  # another artifact: the monitor restarts
        body = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300), headers=AUTH).json()
        assert body["threshold"] == pytest.approx(tau_b)
        with caplog.at_level(logging.ERROR, logger="ragsieve"):
            for broken in ("{not json", json.dumps({"format": "ragsieve.filter"}),
                           _tampered(artifacts["a"])):
                served.write_text(broken)
                r = httpx.post(srv.url + "/admin/reload", headers=AUTH)
                assert r.status_code == 422, r.text
                assert r.json()["detail"].startswith("artifact refused, still serving generation 3")
        assert sum("refused" in rec.message for rec in caplog.records) == 3
        health = httpx.get(srv.url + "/healthz").json()
        assert health["generation"] == 3 and health["artifact"]["alpha"] == pytest.approx(0.1)
        m = _metrics(srv.url)
    assert _m(m, "ragsieve_reloads_total", outcome="loaded") == 2
    assert _m(m, "ragsieve_reloads_total", outcome="refused") == 3
    assert _m(m, "ragsieve_artifact_generation") == 3
    checksum_b = json.loads(artifacts["b"].read_text())["checksum"]["value"]
    info = [k for k in m if k[0] == "ragsieve_artifact_info"]
    assert [dict(k[1])["checksum"] for k in info] == [checksum_b]  # the old series is gone


def _tampered(path: Path) -> str:
    payload = json.loads(path.read_text())
    payload["calibration"]["state"]["threshold"] = 0.99  # breaks the checksum
    return json.dumps(payload)


def test_admin_reload_without_a_key_from_loopback(artifacts: dict[str, Path],
                                                  embedding_cache_dir: Path) -> None:
    with serving(artifacts["a"], scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        r = httpx.post(srv.url + "/admin/reload", headers=CLIENT)
        assert r.status_code == 200 and r.json()["generation"] == 2
        assert httpx.get(srv.url + "/metrics").status_code == 200  # no key set: open


def test_reload_during_traffic_drops_nothing(artifacts: dict[str, Path], options: dict[str, Any],
                                             xquad_en: list[Pair], tmp_path: Path) -> None:
    """Four clients send /filter non-stop while the artifact is swapped six times: every
    request succeeds and is answered entirely by one of the two artifacts."""
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    taus = {json.loads(artifacts[n].read_text())["calibration"]["state"]["threshold"] for n in "ab"}
    payloads = [_payload(xquad_en, 300 + 7 * i) for i in range(8)]
    stop = threading.Event()
    with serving(served, **options) as srv:
        for p in payloads:  # embeddings cached: requests are fast and many overlap a swap
            httpx.post(srv.url + "/filter", json=p, headers=AUTH)

        def client(i: int) -> list[tuple[int, float | None]]:
            seen = []
            with httpx.Client(base_url=srv.url, headers=AUTH, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/filter", json=payloads[len(seen) % len(payloads)])
                    seen.append((r.status_code, r.json().get("threshold")))
            return seen

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client, i) for i in range(4)]
            reloads = []
            for name in "babab" + "a":
                time.sleep(0.3)
                shutil.copy(artifacts[name], served)
                reloads.append(httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=60))
            time.sleep(0.3)
            stop.set()
            results = [x for f in futures for x in f.result()]
        final = httpx.get(srv.url + "/healthz").json()
    assert [r.status_code for r in reloads] == [200] * 6
    assert len(results) > 40
    assert {status for status, _ in results} == {200}
    assert all(any(math.isclose(tau, t, rel_tol=1e-9) for t in taus) for _, tau in results)
    assert len({round(tau, 12) for _, tau in results}) == 2  # both artifacts answered
    assert final["generation"] == 7


def test_watch_reloads_a_changed_file(artifacts: dict[str, Path], options: dict[str, Any],
                                      tmp_path: Path) -> None:
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)

    def generation_becomes(url: str, number: int, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            health = httpx.get(url + "/healthz").json()
            if health["generation"] == number or time.monotonic() > deadline:
                return health
            time.sleep(0.1)

    with serving(served, watch=True, **options) as srv:
        tmp = tmp_path / "next.json"
        shutil.copy(artifacts["b"], tmp)
        os.replace(tmp, served)  # an atomic replace, as `calibrate --out` writes
        health = generation_becomes(srv.url, 2)
        assert health["generation"] == 2 and health["artifact"]["alpha"] == pytest.approx(0.1)
        served.write_text("{broken")
        time.sleep(1.5)  # several polls: the broken file is refused once, not published
        health = httpx.get(srv.url + "/healthz").json()
        assert health["generation"] == 2 and health["artifact"]["alpha"] == pytest.approx(0.1)
        shutil.copy(artifacts["a"], served)
        health = generation_becomes(srv.url, 3)
        assert health["generation"] == 3 and health["artifact"]["alpha"] == pytest.approx(0.2)


# ---------------------------------------------------------------------- monitor wiring
def test_monitor_counts_filter_and_query_requests(artifacts: dict[str, Path],
                                                  options: dict[str, Any], xquad_en: list[Pair],
                                                  small_index: Path) -> None:
    with serving(artifacts["a"], index_path=small_index, **options) as srv:
        for i in range(3):
            httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300 + i), headers=AUTH)
        q = httpx.post(srv.url + "/query", json={"query": "Who won Super Bowl 50?", "k": 5,
                                                 "query_id": "qq"}, headers=AUTH).json()
        httpx.post(srv.url + "/filter", json={"query": " ", "snippets": ["x"]}, headers=AUTH)
        health = httpx.get(srv.url + "/healthz").json()
        fb = httpx.post(srv.url + "/feedback", headers=AUTH, json={"items": [
            {"query_id": "qq", "snippet_id": q["hits"][0]["snippet_id"], "relevant": 1}]}).json()
    assert q["query_id"] == "qq"
    assert fb["accepted"] == 1  # /query answers are recorded too
    monitor = health["monitor"]
    assert monitor["n_observed"] == 4  # refused requests are not observed
    assert monitor["alarm"] is False and monitor["fired_at"] is None
    assert monitor["delta"] == pytest.approx(0.01)
    assert monitor["martingale"] >= 0


class _BrokenMonitor:
    """Failure injection: a monitor whose observe always raises."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def observe(self, scores: Any) -> Any:
        raise RuntimeError("injected monitor failure")

    @property
    def state(self) -> Any:
        return self.real.state

    def reset(self) -> None:
        self.real.reset()


def test_a_failing_monitor_never_fails_a_request(artifacts: dict[str, Path],
                                                 options: dict[str, Any], xquad_en: list[Pair],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    from ragsieve.server.service import monitor_from_artifact

    def factory(payload: Any, **kw: Any) -> Any:
        return _BrokenMonitor(monitor_from_artifact(payload, **kw))

    settings = {**options, "max_snippets": 100, "max_k": 10, "max_served_rows": 1000}
    app = _create_app(artifacts["a"], ServeOptions(**settings), role="single",
                      monitor_factory=factory)
    with caplog.at_level(logging.ERROR, logger="ragsieve"), ThreadServer(app) as srv:
        r = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300), headers=AUTH)
        health = httpx.get(srv.url + "/healthz").json()
    assert r.status_code == 200 and r.json()["scores"]
    assert health["monitor"]["n_observed"] == 0
    assert any("exchangeability monitor failed" in rec.message for rec in caplog.records)


def test_artifact_without_monitor_reference(options: dict[str, Any], xquad_en: list[Pair],
                                            tmp_path: Path, embedding_cache_dir: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    old = tmp_path / "old.json"  # like an artifact written before the monitor existed
    ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(
        xquad_en[:300], monitor=False).save(old)
    assert "monitor" not in json.loads(old.read_text())
    with caplog.at_level(logging.WARNING, logger="ragsieve"), serving(old, **options) as srv:
        r = httpx.post(srv.url + "/filter", json=_payload(xquad_en, 300), headers=AUTH)
        health = httpx.get(srv.url + "/healthz").json()
        m = _metrics(srv.url)
    assert r.status_code == 200
    assert health["monitor"] is None
    assert math.isnan(_m(m, "ragsieve_exchangeability_martingale"))
    assert _m(m, "ragsieve_drift_alarm") == 0
    notes = [rec.message for rec in caplog.records if "no monitor reference" in rec.message]
    assert len(notes) == 1 and "recalibrate to enable the alarm" in notes[0]


# ---------------------------------------------------------------------- state, options, schema
def test_state_dir_is_locked_and_options_checked(artifacts: dict[str, Path],
                                                 options: dict[str, Any], tmp_path: Path) -> None:
    with (serving(artifacts["a"], state_dir=tmp_path / "s", **options),
          pytest.raises(ValueError, match="is in use by another ragsieve serve")):
        create_app(artifacts["a"], state_dir=tmp_path / "s", **options)
    with serving(artifacts["a"], state_dir=tmp_path / "s", **options):
        pass  # released at shutdown
    with pytest.raises(ValueError, match="monitor_delta == 1.5"):
        create_app(artifacts["a"], monitor_delta=1.5, **options)


def test_openapi_lists_the_operation_routes(artifacts: dict[str, Path],
                                            options: dict[str, Any]) -> None:
    with serving(artifacts["a"], **options) as srv:
        schema = httpx.get(srv.url + "/openapi.json", headers=AUTH).json()
    paths = schema["paths"]
    assert {"401", "413", "422"} <= set(paths["/feedback"]["post"]["responses"])
    assert {"401", "403", "422"} <= set(paths["/admin/reload"]["post"]["responses"])
    assert "401" in paths["/metrics"]["get"]["responses"]
    for path, method in [("/feedback", "post"), ("/metrics", "get"), ("/admin/reload", "post")]:
        assert paths[path][method].get("security"), path
    assert {"FeedbackRequest", "FeedbackResponse", "ReloadResponse", "MonitorInfo"} <= set(
        schema["components"]["schemas"])


def test_scores_histogram_matches_numpy(artifacts: dict[str, Path], options: dict[str, Any],
                                        xquad_en: list[Pair]) -> None:
    """The served-score histogram's buckets are cumulative counts of the served scores."""
    with serving(artifacts["a"], **options) as srv:
        scores = []
        for i in range(4):
            scores += httpx.post(srv.url + "/filter", json=_payload(xquad_en, 400 + 9 * i),
                                 headers=AUTH).json()["scores"]
        m = _metrics(srv.url)
    for le in ("0.3", "0.6", "0.9", "+Inf"):
        bound = math.inf if le == "+Inf" else float(le)
        assert _m(m, "ragsieve_served_score_bucket", le=le) == int(np.sum(np.array(scores) <= bound))


def test_alarm_fires_on_unrelated_snippets_and_is_reported(
        artifacts: dict[str, Path], options: dict[str, Any], xquad_en: list[Pair],
        caplog: pytest.LogCaptureFixture) -> None:
    """Questions about one article served with paragraphs of other articles: nothing stands
    out, the martingale grows, the alarm fires, and /healthz, /metrics and the log say so."""
    articles: dict[str, list[Pair]] = {}
    for p in xquad_en:
        articles.setdefault(p.snippet_id.split("/")[0], []).append(p)
    names = sorted(articles)
    paragraphs = {n: list({p.snippet_id: p.text for p in articles[n]}.values()) for n in names}
    questions = [(n, q) for n in names for q in list(dict.fromkeys(p.query for p in articles[n]))[:6]]
    rng = np.random.default_rng(0)
    rng.shuffle(questions)
    with caplog.at_level(logging.WARNING, logger="ragsieve"), \
            serving(artifacts["a"], **options) as srv:
        state = None
        for i in range(len(questions)):
            article, question = questions[i]
            other = names[(names.index(article) + 1 + i % 7) % len(names)]  # never its own
            body = {"query": question, "snippets": paragraphs[other][:6]}
            assert httpx.post(srv.url + "/filter", json=body, headers=AUTH).status_code == 200
            if i % 10 == 9:
                state = httpx.get(srv.url + "/healthz").json()["monitor"]
                if state["alarm"]:
                    break
        m = _metrics(srv.url)
    assert state is not None and state["alarm"], state
    assert state["fired_at"] <= state["n_observed"] and state["fired_time"]
    assert state["martingale"] >= 1 / state["delta"] or state["log10_martingale"] >= 2
    assert _m(m, "ragsieve_drift_alarm") == 1
    fired = [r.getMessage() for r in caplog.records if "exchangeability alarm" in r.getMessage()]
    assert len(fired) == 1 and f"at request {state['fired_at']};" in fired[0]


def test_worker_socket_gets_tcp_nodelay() -> None:
    """The workers' listening socket is marked TCP, so asyncio sets TCP_NODELAY on every
    connection (a socket bound with proto 0, as some uvicorn releases bind it, would make
    each keep-alive response wait ~40 ms for the client's delayed ACK)."""
    import asyncio

    from ragsieve.server.workers import _tcp

    # whatever this uvicorn release binds, the socket the workers get is marked TCP
    config = uvicorn.Config("ragsieve.server.workers:app_from_env", host="127.0.0.1", port=0)
    bound = _tcp(config.bind_socket())
    bound.close()
    assert bound.proto == socket.IPPROTO_TCP
    # and a proto-0 socket (asyncio would skip TCP_NODELAY on it) is re-marked in place
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    raw.bind(("127.0.0.1", 0))
    raw.listen()
    assert raw.proto == 0
    port = raw.getsockname()[1]
    sock = _tcp(raw)
    assert sock.proto == socket.IPPROTO_TCP and sock.getsockname()[1] == port
    assert _tcp(sock) is sock  # already TCP: kept as it is
    seen: list[int] = []

    async def main() -> None:
        def accepted(reader: Any, writer: Any) -> None:
            conn = writer.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert seen and seen[0] != 0
