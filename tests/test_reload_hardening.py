"""Reloads, artifacts and state files under honest mistakes and hostile edits.

Reload validates by building (a field of the wrong type is refused before it is
published), workers walk back to a generation they can build, ``--watch`` picks up a good
file put back, artifacts over the size cap are refused unread (413), corrupt state files
stop ``serve`` with one line, and every reader of an artifact checks its seal.

In-process tests run the real app (real MiniLM scorer, real monitor) in a real uvicorn
server on 127.0.0.1; worker apps are built with ``_create_app(role="worker")`` on a state
directory prepared like ``serve --workers`` prepares it. The last test (slow) runs
``ragsieve serve --workers 2 --watch`` as real processes and counts worker deaths.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from servers import ThreadServer, serving

from ragsieve import ConformalFilter
from ragsieve.artifact import Artifact
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main as cli_main
from ragsieve.errors import ArtifactError
from ragsieve.monitoring import ExchangeabilityMonitor
from ragsieve.server import create_app
from ragsieve.server.app import _create_app
from ragsieve.server.options import ServeOptions
from ragsieve.server.reload import Generations
from ragsieve.server.workers import CONFIG_ENV, app_from_env

KEY = "reload-key"
AUTH = {"X-API-Key": KEY}


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, served_artifact: Any) -> dict[str, Path]:
    """Two real artifacts (marginal alpha 0.2 and 0.1) and their bad twins."""
    root = tmp_path_factory.mktemp("reload-artifacts")
    out = {name: served_artifact(SplitConformalCalibrator(alpha=alpha))
           for name, alpha in [("a", 0.2), ("b", 0.1)]}
    out["bad"] = root / "bad.json"  # same seal as "a": only the unsealed 'created' differs
    out["bad"].write_text(_edited(out["a"], created={"by": "hand"}))
    out["bad_b"] = root / "bad_b.json"  # another seal: a watch of the old code published it
    out["bad_b"].write_text(_edited(out["b"], created={"by": "hand"}))
    return out


@pytest.fixture(scope="module")
def options(embedding_cache_dir: Path) -> dict[str, Any]:
    return {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY}


def _edited(path: Path, **fields: Any) -> str:
    payload = json.loads(path.read_text())
    payload.update(fields)
    return json.dumps(payload)


def _health(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/healthz", timeout=30).json())


def _until(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _padded(path: Path, out: Path, size: int) -> Path:
    """A valid artifact padded with trailing whitespace to ``size`` bytes."""
    text = path.read_text()
    out.write_text(text + " " * (size - len(text.encode())))
    return out


# ---------------------------------------------------------------------- the one reader
@pytest.mark.parametrize(("field", "value", "match"), [
    ("created", {"by": "hand"}, "'created' is a dict"),
    ("created", "yesterday", "ISO-8601"),
    ("library_version", 3, "'library_version' is a int"),
    ("data", [1, 2], "'data' is a list"),
    ("policy", "none", "'policy' is a str"),
    ("format_version", "2", "format_version == '2'"),
    ("padding", "x" * 10, "unknown field"),
    ("checksum", {"algorithm": "sha256", "covers": ["scorer", "calibration", "policy",
                                                    "monitor", "lists"], "value": "0" * 64},
     "checksum mismatch"),
])
def test_every_field_is_type_checked_by_the_one_reader(artifacts: dict[str, Path],
                                                       field: str, value: Any,
                                                       match: str) -> None:
    """Defect 2 (and 9): unsealed fields were read unchecked and broke the service later."""

    text = _edited(artifacts["a"], **{field: value})
    with pytest.raises(ArtifactError, match=match):
        Artifact.parse(text, "edited.json").to_dict()
    with pytest.raises(ArtifactError, match=match):
        ConformalFilter.from_dict(json.loads(text))


def test_seal_checked_by_every_reader(artifacts: dict[str, Path], tmp_path: Path,
                                      embedding_cache_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 9: ``score --filter`` scored with an edited scorer or an all-zero checksum."""
    payload = json.loads(artifacts["a"].read_text())
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"query_id": "q", "query": "who", "snippet_id": f"s{i}",
                                        "text": f"snippet {i}"}) + "\n" for i in range(4)))
    edited_model = json.loads(json.dumps(payload))
    edited_model["scorer"]["model"] = "minilm"  # loads the same model: only the seal tells
    zeroed = json.loads(json.dumps(payload))
    zeroed["checksum"]["value"] = "0" * 64
    for name, bad in [("model", edited_model), ("zero", zeroed)]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad))
        out = tmp_path / f"{name}-scores.jsonl"
        code = cli_main(["-q", "score", "--filter", str(path), "--data", str(data), "--out",
                         str(out), "--cache-dir", str(embedding_cache_dir)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "checksum mismatch" in err[0], err
        assert not out.exists()
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            Artifact.read(path).to_dict()
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            ExchangeabilityMonitor.from_artifact(bad)


def test_artifact_size_cap_in_the_reader(artifacts: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 6: the batch commands read an artifact of any size."""
    from ragsieve.errors import ArtifactTooLargeError

    padded = _padded(artifacts["a"], tmp_path / "padded.json", 300_000)
    assert Artifact.read(padded).to_dict()["format"] == "ragsieve.filter"
    with pytest.raises(ArtifactTooLargeError, match="300000 bytes, more than the limit of 200000"):
        Artifact.read(padded, max_bytes=200_000).to_dict()
    sparse = tmp_path / "sparse.json"  # 65 MiB of holes: no disk used, never read
    with open(sparse, "wb") as fh:
        fh.truncate(65 * 2**20)
    code = cli_main(["-q", "filter", "--filter", str(sparse), "--data", str(padded)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "more than the limit of 67108864" in err[0], err


# ---------------------------------------------------------------------- validate by building
def test_reload_refuses_an_artifact_the_service_cannot_build(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path) -> None:
    """Defect 2: an unsealed field of the wrong type passed the reload check and was
    published (then no worker could build it)."""
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    with serving(served, state_dir=tmp_path / "state", **options) as srv:
        for bad in (_edited(artifacts["a"], created={"by": "hand"}),
                    _edited(artifacts["a"], library_version=["0.1"]),
                    _edited(artifacts["a"], data="notes")):
            served.write_text(bad)
            r = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=60)
            assert r.status_code == 422, r.text
            assert "still serving generation 1" in r.json()["detail"]
        health = _health(srv.url)
        assert health["generation"] == 1 and health["published_generation"] == 1
        assert health["degraded"] is None
        generations = Generations(tmp_path / "state" / "control.sqlite")
        try:
            assert generations.latest_number() == 1  # nothing bad was published
        finally:
            generations.close()


def _worker_state(tmp_path: Path, texts: list[str]) -> Path:
    """A state directory whose control file holds ``texts`` as generations 1, 2, ..."""
    state = tmp_path / "state"
    generations = Generations(state / "control.sqlite")
    try:
        for text in texts:
            payload = json.loads(text)
            generations.publish(text, payload["checksum"]["value"], "test")
    finally:
        generations.close()
    return state


def _worker_app(path: Path, state: Path, options: dict[str, Any]) -> Any:
    settings = ServeOptions(api_key=KEY, state_dir=state,
                            scorer_options=options["scorer_options"])
    return _create_app(path, settings, role="worker")


def test_worker_walks_back_to_a_generation_it_can_build(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path) -> None:
    """Defect 2: a worker started after a bad generation was published died at start
    (and so did every replacement)."""
    good, bad = artifacts["a"].read_text(), artifacts["bad"].read_text()
    state = _worker_state(tmp_path, [good, bad])
    with ThreadServer(_worker_app(artifacts["a"], state, options)) as srv:
        health = _health(srv.url)
        assert health["generation"] == 1 and health["published_generation"] == 2
        assert "generation 2" in health["degraded"] and "created" in health["degraded"]
        r = httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a b"]},
                       headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        generations = Generations(state / "control.sqlite")  # the parent publishes a good one
        try:
            b = artifacts["b"].read_text()
            generations.publish(b, json.loads(b)["checksum"]["value"], "test")
        finally:
            generations.close()
        health = _until("generation 3", lambda: (h := _health(srv.url))["generation"] == 3 and h)
        assert health["published_generation"] == 3 and health["degraded"] is None


def test_the_served_generation_and_the_published_one_change_together(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path) -> None:
    """At the moment a new generation is served, ``/healthz``'s published generation and
    ``degraded`` are already its own (they were written after the swap, and a health
    request in between read generation 3 with the published generation 2)."""
    good, bad = artifacts["a"].read_text(), artifacts["bad"].read_text()
    state = _worker_state(tmp_path, [good, bad])
    app = _worker_app(artifacts["a"], state, options)
    runtime = app.state.runtime
    assert (runtime.current.generation, runtime.published[0]) == (1, 2)
    assert "generation 2" in runtime.published[1]  # walked back, and says so
    seen: list[tuple[int, tuple[int | None, str | None]]] = []
    real = runtime.metrics.set_artifact

    def record(*args: Any, **kwargs: Any) -> Any:  # called right after the swap's write
        seen.append((runtime.current.generation, runtime.published))
        return real(*args, **kwargs)

    runtime.metrics.set_artifact = record
    generations = Generations(state / "control.sqlite")
    try:
        b = artifacts["b"].read_text()
        generations.publish(b, json.loads(b)["checksum"]["value"], "test")
    finally:
        generations.close()
    runtime.sync()
    assert seen == [(3, (3, None))]


def test_worker_that_can_build_nothing_stops_the_supervisor(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 2: the factory's exception made uvicorn restart the worker in a loop; the
    start-up failure code makes its supervisor stop instead."""
    state = _worker_state(tmp_path, [artifacts["bad"].read_text()])
    settings = {"state_dir": str(state),
                "scorer_options": {"cache_dir": str(options["scorer_options"]["cache_dir"])}}
    monkeypatch.setenv(CONFIG_ENV, json.dumps({"filter_path": str(artifacts["a"]),
                                               "app": settings}))
    with pytest.raises(SystemExit) as info:
        app_from_env()
    assert info.value.code == 3  # uvicorn.config.STARTUP_FAILURE


def test_watch_picks_up_the_good_file_after_a_bad_generation(
        artifacts: dict[str, Path], options: dict[str, Any], tmp_path: Path) -> None:
    """Defect 2: with a bad generation published, putting the good file back did nothing
    under --watch (its checksum equals the bad one's); the watch compares with what is
    served."""
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    state = tmp_path / "state"
    with serving(served, state_dir=state, watch=True, **options) as srv:
        generations = Generations(state / "control.sqlite")  # as an older parent published it
        try:
            bad = artifacts["bad"].read_text()
            generations.publish(bad, json.loads(bad)["checksum"]["value"], "older parent")
        finally:
            generations.close()
        health = _until("the bad generation refused", lambda: (h := _health(srv.url))[
            "published_generation"] == 2 and h)
        assert health["generation"] == 1 and "created" in health["degraded"]
        tmp = tmp_path / "next.json"
        shutil.copy(artifacts["a"], tmp)  # the good file again (a new inode and mtime)
        os.replace(tmp, served)
        health = _until("generation 3", lambda: (h := _health(srv.url))["generation"] == 3 and h)
        assert health["published_generation"] == 3 and health["degraded"] is None


# ---------------------------------------------------------------------- size cap
def test_oversize_artifact_refused_unread(artifacts: dict[str, Path], options: dict[str, Any],
                                          tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """Defect 6: a padded artifact was read, parsed and published whatever its size."""
    from ragsieve.errors import ArtifactTooLargeError

    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    cap = 200_000
    with pytest.raises(ArtifactTooLargeError):
        create_app(_padded(artifacts["a"], tmp_path / "big.json", 300_000),
                   max_artifact_bytes=cap, **options)
    with caplog.at_level(logging.ERROR, logger="ragsieve"), \
            serving(served, watch=True, max_artifact_bytes=cap, **options) as srv:
        _padded(artifacts["b"], served, 300_000)
        r = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=60)
        assert r.status_code == 413, r.text
        assert "has 300000 bytes, more than the limit" in r.json()["detail"]
        time.sleep(1.5)  # three polls of the watch: the refused file is not read again
        health = _health(srv.url)
        assert health["generation"] == 1 and health["artifact"]["alpha"] == pytest.approx(0.2)
        assert sum("more than the limit" in rec.message for rec in caplog.records) == 1
        shutil.copy(artifacts["b"], served)
        _until("generation 2", lambda: _health(srv.url)["generation"] == 2)


def test_serve_refuses_an_oversize_artifact_at_start(artifacts: dict[str, Path],
                                                     tmp_path: Path,
                                                     embedding_cache_dir: Path) -> None:
    """Defect 6: ``serve`` started with any artifact size."""
    big = _padded(artifacts["a"], tmp_path / "big.json", 300_000)
    for workers in ("1", "2"):
        err = _serve_error(["--filter", str(big), "--max-artifact-bytes", "200000",
                            "--workers", workers, "--cache-dir", str(embedding_cache_dir),
                            "--state-dir", str(tmp_path / "state")])
        assert "more than the limit of 200000" in err


# ---------------------------------------------------------------------- state files
def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _wrong_table(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE generations (x INTEGER)")


def _wrong_rows(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE generations (number INTEGER PRIMARY KEY, checksum TEXT NOT "
                   "NULL, text TEXT NOT NULL, source TEXT NOT NULL, time TEXT NOT NULL)")
        db.execute("INSERT INTO generations VALUES (1, 'x', X'00ff', 's', 't')")


@pytest.mark.parametrize(("spoil", "workers"), [(_random_bytes, "1"), (_wrong_table, "1"),
                                              (_wrong_rows, "1"), (_random_bytes, "2")])
def test_corrupt_control_file_at_start(artifacts: dict[str, Path], tmp_path: Path,
                                       embedding_cache_dir: Path,
                                       spoil: Callable[[Path], None], workers: str) -> None:
    """Defect 8b: a corrupt or wrong-schema control.sqlite gave a traceback and exit 1."""
    state = tmp_path / "state"
    state.mkdir()
    spoil(state / "control.sqlite")
    err = _serve_error(["--filter", str(artifacts["a"]), "--state-dir", str(state),
                        "--workers", workers, "--cache-dir", str(embedding_cache_dir)])
    assert f"state file {str(state / 'control.sqlite')!r} is not a ragsieve control file" in err
    assert "--state-dir" in err


def _serve_error(args: list[str]) -> str:
    """The one stderr line of a ``serve`` that must stop at start with exit 2."""
    proc = subprocess.run([sys.executable, "-m", "ragsieve.cli", "serve", "--port",
                           str(_free_port()), *args],
                          check=False, capture_output=True, text=True, timeout=90)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
    return err[0]


def test_unremovable_monitor_store_at_start(artifacts: dict[str, Path], tmp_path: Path,
                                            embedding_cache_dir: Path) -> None:
    """Defect 8b: a monitor store that cannot be replaced stops start-up with one line."""
    state = tmp_path / "state"
    (state / "monitor-0123456789abcdef.sqlite").mkdir(parents=True)
    err = _serve_error(["--filter", str(artifacts["a"]), "--state-dir", str(state),
                        "--workers", "2", "--cache-dir", str(embedding_cache_dir)])
    assert "monitor-0123456789abcdef.sqlite" in err and "--state-dir" in err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_no_crash_loop_with_two_workers_and_watch(artifacts: dict[str, Path], tmp_path: Path,
                                                  embedding_cache_dir: Path) -> None:
    """Defect 2 with real processes: a bad file under ``--watch``, then a worker killed.

    Before: the bad file was published, and every replacement worker died at start.
    After: the bad file is refused; a bad generation put in the control file directly (as
    an older parent published it) makes the replacement walk back, not die; the good
    file put back is published and served by every worker.
    """
    served = tmp_path / "served.json"
    shutil.copy(artifacts["a"], served)
    state = tmp_path / "state"
    log_path = tmp_path / "serve.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(served), "--port",
             str(port), "--workers", "2", "--watch", "--state-dir", str(state), "--cache-dir",
             str(embedding_cache_dir), "--api-key-env", "RELOAD_TEST_KEY"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RELOAD_TEST_KEY": KEY})
    text = lambda: log_path.read_text(encoding="utf-8", errors="replace")
    try:
        _until("2 workers", lambda: text().count("Application startup complete") >= 2, 300)
        workers = sorted(set(re.findall(r"Started server process \[(\d+)\]", text())))
        served.write_text(artifacts["bad_b"].read_text())
        time.sleep(3)  # several polls of the watch
        os.kill(int(workers[0]), signal.SIGKILL)
        time.sleep(60)  # the window in which replacements are counted
        deaths = len(re.findall(r"Child process \[\d+\] died", text()))
        print(f"worker deaths in 60 s after one kill: {deaths}")
        assert proc.poll() is None, text()[-3000:]
        assert deaths == 1, text()[-3000:]  # the one killed: its replacement started
        generations = Generations(state / "control.sqlite")
        try:
            assert generations.latest_number() == 1  # the bad file was never published
            bad = artifacts["bad"].read_text()
            generations.publish(bad, json.loads(bad)["checksum"]["value"], "older parent")
        finally:
            generations.close()
        alive = sorted(set(re.findall(r"Started server process \[(\d+)\]", text())) - {workers[0]})
        os.kill(int(alive[0]), signal.SIGKILL)
        _until("a replacement", lambda: text().count("Application startup complete") >= 4, 300)
        assert {(_health(url)["generation"], _health(url)["published_generation"])
                for _ in range(10)} == {(1, 2)}
        shutil.copy(artifacts["a"], served)  # the good file back: published and served
        _until("generation 3 everywhere", lambda: {
            _health(url)["generation"] for _ in range(10)} == {3}, 60)
        assert {_health(url)["degraded"] for _ in range(10)} == {None}
        assert len(re.findall(r"Child process \[\d+\] died", text())) == 2  # the two killed
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_long_error_detail_keeps_its_reason() -> None:
    """The service's own error text comes back whole up to 2,000 characters: a deep artifact
    path before the reason once pushed the reason past the 200-character echo of client
    input (``safe_echo``), and the admin saw ``...`` where the size should be."""
    import asyncio

    from starlette.exceptions import HTTPException

    from ragsieve.server.parsing import http_error_handler

    path = "/srv/" + "deep/" * 60 + "filter.json"
    detail = f"filter artifact '{path}' has 300000 bytes, more than the limit of 200000"
    assert len(detail) > 300
    shown = asyncio.run(http_error_handler(None, HTTPException(413, detail)))  # type: ignore[arg-type]
    assert shown.status_code == 413 and json.loads(shown.body)["detail"] == detail
    huge = asyncio.run(http_error_handler(None, HTTPException(422, "x" * 10_000)))  # type: ignore[arg-type]
    assert json.loads(huge.body)["detail"] == "x" * 2000 + "..."  # still bounded
