"""Feedback under hostile clients and honest mistakes: labels cannot steer the threshold,
the state stays bounded, a locked or corrupt state file is a clean error, an answered
request's served scores survive a SIGKILL, and ids with control characters are refused.

Every service test runs the real app (real MiniLM scorer) in a real uvicorn server on
127.0.0.1. Faults are injected with real means only: a second SQLite connection holding
the write lock, a file of garbage, a row edited in the database, a SIGKILL.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from servers import serving

from ragsieve import Pair
from ragsieve.calibration import AdaptiveCalibrator, PACCalibrator, SplitConformalCalibrator
from ragsieve.cli import main as cli_main
from ragsieve.errors import DataError
from ragsieve.server.feedback import FeedbackStore, ServedRow, scorer_key

KEY = "hardening-key"
AUTH = {"X-API-Key": KEY}


@pytest.fixture(scope="module")
def artifacts(served_artifact: Any) -> dict[str, Path]:
    """Real artifacts: marginal (alpha 0.2), adaptive (alpha 0.2, gamma 0.05, window 200), pac."""
    return {"marginal": served_artifact(SplitConformalCalibrator(alpha=0.2)),
            "adaptive": served_artifact(AdaptiveCalibrator(alpha=0.2, gamma=0.05, window=200)),
            "pac": served_artifact(PACCalibrator(alpha=0.2, delta=0.1))}


@pytest.fixture(scope="module")
def options(embedding_cache_dir: Path) -> dict[str, Any]:
    return {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY}


def _invented(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"query_id": f"q{i}", "snippet_id": f"s{i}", "relevant": 1, **extra} for i in range(n)]


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=AUTH, timeout=120)


def _filter(url: str, query: str, texts: list[str], query_id: str) -> dict[str, Any]:
    r = _post(url, "/filter", {"query": query, "query_id": query_id, "snippets": [
        {"text": t, "snippet_id": f"{query_id}-{i}"} for i, t in enumerate(texts)]})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _label_all(url: str, body: dict[str, Any]) -> dict[str, Any]:
    items = [{"query_id": body["query_id"], "snippet_id": f"{body['query_id']}-{i}",
              "relevant": 1} for i in range(len(body["scores"]))]
    r = _post(url, "/feedback", {"items": items})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _threshold(url: str) -> float | None:
    return httpx.get(url + "/healthz", timeout=30).json()["adaptive"]["threshold"]


# ---------------------------------------------------------------------- defect 1
def test_invented_labels_cannot_move_the_adaptive_threshold(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options) as srv:
        start = _threshold(srv.url)
        poison = _post(srv.url, "/feedback", {"items": _invented(1000, score=-1e9)})
        assert poison.status_code == 422, poison.text
        assert "'score' is not accepted" in poison.text
        assert poison.json()["detail"][0]["loc"][:3] == ["body", "items", 0]
        r = _post(srv.url, "/feedback", {"items": _invented(1000)})
        assert r.status_code == 200, r.text
        assert r.json() == {"accepted": 0, "new": 0, "unknown": 1000, "over_limit": 0,
                            "adaptive_updates": 0, "adaptive": r.json()["adaptive"]}
        assert _threshold(srv.url) == start
    with serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options) as srv:
        assert _threshold(srv.url) == start  # nothing poisoned survives a restart


def test_labels_of_served_snippets_keep_the_threshold_within_the_pool(
        artifacts: dict[str, Path], options: dict[str, Any], xquad_en: list[Pair],
        tmp_path: Path) -> None:
    pool = AdaptiveCalibrator.from_state(
        *_params_state(artifacts["adaptive"])).to_state()["pool"]
    query = xquad_en[0].query
    # 100 copies of the query itself, all "relevant" and all kept: alpha_t climbs by
    # gamma * alpha = 0.01 per label; unbounded it would pass 1 (threshold -inf, keep nothing)
    with serving(artifacts["adaptive"], state_dir=tmp_path / "up", adaptive=True,
                 **options) as srv:
        body = _filter(srv.url, query, [query] * 100, "self")
        up = _label_all(srv.url, body)
        assert up["adaptive_updates"] == 100
        low = up["adaptive"]["threshold"]
        assert low is not None and min(pool + body["scores"]) <= low <= max(pool)
        assert up["adaptive"]["alpha_t"] < 1
    # unrelated snippets claimed relevant: misses push alpha_t down by 0.04 per label;
    # unbounded it would pass 0 (threshold +inf, keep everything)
    unrelated = [p.text for p in xquad_en[1000:1400] if p.query != query][:60]
    with serving(artifacts["adaptive"], state_dir=tmp_path / "down", adaptive=True,
                 **options) as srv:
        body = _filter(srv.url, query, unrelated, "far")
        down = _label_all(srv.url, body)
        high = down["adaptive"]["threshold"]
        assert high is not None and high <= max(pool + body["scores"])
        assert down["adaptive"]["alpha_t"] > 0


def _params_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    calibration = json.loads(path.read_text())["calibration"]
    return calibration["params"], calibration["state"]


# ---------------------------------------------------------------------- defect 7
def test_invented_labels_are_never_stored(artifacts: dict[str, Path], options: dict[str, Any],
                                          tmp_path: Path) -> None:
    db = tmp_path / "fb.sqlite"
    with serving(artifacts["marginal"], feedback_db=db, **options) as srv:
        for i in range(5):
            items = [{"query_id": f"r{i}-{j}", "snippet_id": "x" * 200, "relevant": j % 2}
                     for j in range(1000)]
            r = _post(srv.url, "/feedback", {"items": items})
            assert r.status_code == 200 and r.json()["unknown"] == 1000, r.text
    store = FeedbackStore(db, create=False)
    try:
        assert store.count_labels() == 0
    finally:
        store.close()


def test_label_caps_per_query_and_per_client_minute(artifacts: dict[str, Path],
                                                    options: dict[str, Any],
                                                    xquad_en: list[Pair]) -> None:
    texts = [p.text for p in xquad_en[300:305]]
    with serving(artifacts["marginal"], max_labels_per_query=3, max_labels_per_minute=12,
                 **options) as srv:
        body = _filter(srv.url, xquad_en[300].query, texts, "capped")
        first = _label_all(srv.url, body)
        assert (first["accepted"], first["over_limit"]) == (3, 2)
        again = _label_all(srv.url, body)  # relabelling a pair is no new pair: 3 replaced
        assert (again["accepted"], again["new"], again["over_limit"]) == (3, 0, 2)
        r = _post(srv.url, "/feedback", {"items": _invented(5)})  # 15 > 12 this minute
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 60 and "12 per minute" in r.text
        r = _post(srv.url, "/feedback", {"items": _invented(13)})
        assert r.status_code == 413 and "limit is 12 per minute" in r.text


def test_pruned_served_rows_take_their_labels(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "fb.sqlite", max_served_rows=1500, retention_seconds=3600)
    try:
        for batch in range(3):
            rows = [ServedRow(f"q{batch}", str(i), 0.1, 0.5, True) for i in range(1000)]
            store.record_served(rows, key="k", checksum=None, endpoint="/filter")
            if batch == 0:
                labels = [("q0", str(i), True) for i in range(10)]
                assert store.add_labels(labels, key="k").accepted == 10
        # the cap pruned the first batch (and its labels) once 3,000 rows were written
        assert store.count_served() <= 2000 and store.count_labels() == 0
        assert store.add_labels([("q2", "7", True)], key="k").accepted == 1
        # a served row past the retention window is no longer labellable, then pruned
        with sqlite3.connect(store.path) as db:
            db.execute("UPDATE served SET time = '2000-01-01T00:00:00.000+00:00'")
        late = store.add_labels([("q2", "8", True)], key="k")
        assert (late.accepted, late.unknown) == (0, 1)
        assert store.prune() > 0 and store.count_served() == 0 and store.count_labels() == 0
    finally:
        store.close()


# ---------------------------------------------------------------------- defect 8
def test_locked_state_file_answers_503_and_acknowledges_only_stored_rows(
        artifacts: dict[str, Path], options: dict[str, Any], xquad_en: list[Pair],
        tmp_path: Path) -> None:
    db = tmp_path / "fb.sqlite"
    texts = [p.text for p in xquad_en[300:303]]
    with serving(artifacts["marginal"], feedback_db=db, **options) as srv:
        served = _filter(srv.url, xquad_en[300].query, texts, "before")
        holder = sqlite3.connect(db, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")  # another writer holds the file
            r = _post(srv.url, "/filter", {"query": xquad_en[300].query, "query_id": "locked",
                                           "snippets": texts})
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) >= 1 and "nothing was stored" in r.text
            fb = _post(srv.url, "/feedback", {"items": [
                {"query_id": "before", "snippet_id": "before-0", "relevant": 1}]})
            assert fb.status_code == 503 and int(fb.headers["Retry-After"]) >= 1, fb.text
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        after = _post(srv.url, "/filter", {"query": xquad_en[300].query, "query_id": "after",
                                           "snippets": texts})
        assert after.status_code == 200, after.text
    store = FeedbackStore(db, create=False)
    try:
        key = scorer_key(json.loads(artifacts["marginal"].read_text())["scorer"])
        assert store.served_score("before", "before-0", key) == pytest.approx(served["scores"][0])
        assert store.served_score("after", "2", key) == pytest.approx(after.json()["scores"][2])
        assert store.served_score("locked", "0", key) is None  # answered 503: not stored
    finally:
        store.close()


def test_corrupt_or_foreign_state_file_at_start_is_one_line(
        artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    older = tmp_path / "older"
    older.mkdir()
    with sqlite3.connect(older / "feedback.sqlite") as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "feedback.sqlite").write_bytes(b"\x00not a database" * 100)
    for state, needle in [(garbage, "file is not a database"),
                          (older, "schema version '1', expected 2")]:
        code = cli_main(["serve", "--filter", str(artifacts["marginal"]), "--port", "0",
                         "--state-dir", str(state)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert str(state / "feedback.sqlite") in err[0] and needle in err[0]
        assert "--state-dir" in err[0]
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE generations (n INTEGER)")
    with pytest.raises(DataError, match="holds other tables"):
        FeedbackStore(foreign)
    with sqlite3.connect(foreign) as db:  # nothing was added to it
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["generations"]


# ---------------------------------------------------------------------- defect 13
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigkill_after_an_answered_filter_keeps_its_served_rows(
        artifacts: dict[str, Path], embedding_cache_dir: Path, xquad_en: list[Pair],
        tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(artifacts["marginal"]),
         "--port", str(port), "--state-dir", str(state), "--cache-dir", str(embedding_cache_dir)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.2)
        texts = [p.text for p in xquad_en[300:306]]
        bodies = [httpx.post(url + "/filter", timeout=60, json={
            "query": xquad_en[300].query, "query_id": f"k{i}", "snippets": texts}).json()
            for i in range(3)]
        os.kill(proc.pid, signal.SIGKILL)  # right after the last answer
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    store = FeedbackStore(state / "feedback.sqlite", create=False)
    try:
        key = scorer_key(json.loads(artifacts["marginal"].read_text())["scorer"])
        for i, body in enumerate(bodies):
            got = [store.served_score(f"k{i}", str(j), key) for j in range(len(texts))]
            assert got == pytest.approx(body["scores"]), f"rows of k{i} lost"
    finally:
        store.close()


# ---------------------------------------------------------------------- ids
@pytest.fixture(scope="module")
def ids_url(artifacts: dict[str, Path], options: dict[str, Any]) -> Iterator[str]:
    with serving(artifacts["marginal"], **options) as srv:
        yield srv.url


BAD_IDS = ["a\x00b", "tab\there", "line\n", "\x1f", "del\x7f", "c1\x85"]
ID_BODIES = [
    ("/filter", lambda v: {"query": "q", "query_id": v, "snippets": ["a"]}, ["query_id"]),
    ("/filter", lambda v: {"query": "q", "snippets": [{"text": "a", "snippet_id": v}]},
     ["snippets", 0, "snippet_id"]),
    ("/query", lambda v: {"query": "q", "query_id": v}, ["query_id"]),
    ("/feedback", lambda v: {"items": [{"query_id": v, "snippet_id": "s", "relevant": 1}]},
     ["items", 0, "query_id"]),
    ("/feedback", lambda v: {"items": [{"query_id": "q", "snippet_id": v, "relevant": 1}]},
     ["items", 0, "snippet_id"]),
]


@pytest.mark.parametrize("value", BAD_IDS)
@pytest.mark.parametrize(("path", "make", "loc"), ID_BODIES)
def test_ids_with_control_characters_are_refused(ids_url: str, path: str, make: Any,
                                                 loc: list[Any], value: str) -> None:
    r = _post(ids_url, path, make(value))
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any([x for x in e["loc"][1:] if "SnippetIn" not in str(x)] == loc
               and "control character" in e["msg"] for e in errors), errors


def test_printable_unicode_ids_are_accepted(ids_url: str) -> None:
    r = _post(ids_url, "/filter", {"query": "q", "query_id": "q-é-東京 x",
                                   "snippets": [{"text": "a", "snippet_id": "s/1 ü"}]})
    assert r.status_code == 200, r.text
    assert r.json()["query_id"] == "q-é-東京 x"


# ---------------------------------------------------------------------- recalibrate
def test_recalibrate_merges_and_refuses_out_of_bounds_state(
        artifacts: dict[str, Path], options: dict[str, Any], xquad_en: list[Pair],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    texts = [p.text for p in xquad_en[300:330]]
    with serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options) as srv:
        assert _post(srv.url, "/feedback", {"items": _invented(1000)}).status_code == 200
        body = _filter(srv.url, xquad_en[300].query, texts, "live")
        _label_all(srv.url, body)
    db = state / "feedback.sqlite"
    out = tmp_path / "new.json"
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["adaptive"]),
                     "--out", str(out), "--min-labels", "10", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    pool = _params_state(artifacts["adaptive"])[1]["pool"]
    assert report["labels"] == 30 and report["merged_calibration_scores"] == len(pool)
    assert min(pool + body["scores"]) <= report["new_threshold"] <= max(pool + body["scores"])
    # a mode that keeps only its threshold cannot merge: --replace says how
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["pac"]),
                     "--out", str(tmp_path / "no.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "use --replace" in err[0]
    # an adaptive state outside its bounds (edited in the file) is refused
    checksum = json.loads(artifacts["adaptive"].read_text())["checksum"]["value"]
    with sqlite3.connect(db) as conn:
        saved = json.loads(conn.execute("SELECT state FROM adaptive WHERE checksum = ?",
                                        (checksum,)).fetchone()[0])
        conn.execute("UPDATE adaptive SET state = ? WHERE checksum = ?",
                     (json.dumps({**saved, "alpha_t": -3.0}), checksum))
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["adaptive"]),
                     "--out", str(tmp_path / "no.json"), "--min-labels", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "outside the bounds" in err[0], err
    # ... and so is the service's start on it
    with pytest.raises(Exception, match="adaptive state of artifact .* is refused"):
        serving(artifacts["adaptive"], state_dir=state, adaptive=True, **options).__enter__()
    # labels whose served score is not finite are refused
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE adaptive SET state = ? WHERE checksum = ?",
                     (json.dumps(saved), checksum))
        conn.execute("UPDATE labels SET score = 9e999 WHERE rowid = (SELECT min(rowid) "
                     "FROM labels)")
    code = cli_main(["recalibrate", "--feedback", str(db), "--filter", str(artifacts["adaptive"]),
                     "--out", str(tmp_path / "no.json"), "--min-labels", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not finite" in err[0], err
    assert not (tmp_path / "no.json").exists()
    assert math.isfinite(report["new_threshold"])


@pytest.mark.parametrize(("snippets", "where"), [
    ([{"text": "a", "snippet_id": "1"}, {"text": "b", "snippet_id": "1"}], "snippets[1]"),
    (["a", {"text": "b", "snippet_id": "0"}], "snippets[1]"),  # a position is an id too
    ([{"text": "a", "id": "x"}, "b", {"text": "c", "snippet_id": "x"}], "snippets[2]"),
])
def test_a_repeated_snippet_id_is_refused_so_feedback_labels_the_snippet_meant(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path,
        snippets: list[Any], where: str) -> None:
    """Two snippets of one ``/filter`` request sharing an id would let ``/feedback`` store
    the other one's score: refused with 422 naming the id, nothing served or recorded."""
    db = tmp_path / "fb.sqlite"
    with serving(artifacts["marginal"], feedback_db=db, **options) as srv:
        r = _post(srv.url, "/filter", {"query": "q", "query_id": "dup", "snippets": snippets})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith(f"{where}.snippet_id == ")
        assert "repeats" in r.json()["detail"]
        label = _post(srv.url, "/feedback", {"items": [
            {"query_id": "dup", "snippet_id": "0", "relevant": 1}]})
        assert label.status_code == 200 and label.json()["unknown"] == 1
        unique = _post(srv.url, "/filter", {"query": "q", "snippets": ["a", "b"]})
        assert unique.status_code == 200, unique.text
