"""``ragsieve serve`` as real processes: SIGHUP reloads, and ``--workers 2`` sharing state.

Each test starts the CLI (``python -m ragsieve.cli serve``) on a free loopback port with
the real MiniLM scorer and the real monitor, and talks HTTP to it. Both are slow (each
process loads the model).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, wait_until

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import AdaptiveCalibrator
from ragsieve.scoring import EmbeddingScorer

pytestmark = pytest.mark.slow

KEY = "proc-key"
AUTH = {"X-API-Key": KEY}
START_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def adaptive_artifacts(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair],
                       embedding_cache_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("proc-artifacts")
    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    return {
        name: ConformalFilter(scorer, AdaptiveCalibrator(alpha=alpha, gamma=0.05, window=200))
        .calibrate(xquad_en[:300]).save(root / f"{name}.json")
        for name, alpha in [("a", 0.2), ("b", 0.1)]
    }






class _Serve:
    """The CLI's ``serve`` in a child process, its stderr in a file."""

    def __init__(self, args: list[str], tmp: Path, cache: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"serve-{self.port}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115
        env = {**os.environ, "OPS_TEST_KEY": KEY}
        cmd = [sys.executable, "-m", "ragsieve.cli", "serve", "--port", str(self.port),
               "--api-key-env", "OPS_TEST_KEY", "--cache-dir", str(cache), *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def started(self, n: int) -> None:
        wait_until(f"{n} started worker(s)", lambda: self._alive() and self.log().count(
            "Application startup complete") >= n, START_TIMEOUT)

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return True

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


@contextmanager
def serve(args: list[str], tmp: Path, cache: Path) -> Iterator[_Serve]:
    server = _Serve(args, tmp, cache)
    try:
        yield server
    finally:
        server.stop()


def _health(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/healthz", timeout=30).json())


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_sighup_reloads_the_artifact(adaptive_artifacts: dict[str, Path], tmp_path: Path,
                                     embedding_cache_dir: Path) -> None:
    served = tmp_path / "served.json"
    shutil.copy(adaptive_artifacts["a"], served)
    with serve(["--filter", str(served), "--state-dir", str(tmp_path / "state")], tmp_path,
               embedding_cache_dir) as srv:
        srv.started(1)
        assert f"state dir {tmp_path / 'state'}" in srv.log()
        assert _health(srv.url)["generation"] == 1
        shutil.copy(adaptive_artifacts["b"], served)
        srv.proc.send_signal(signal.SIGHUP)
        health = wait_until("generation 2", lambda: (h := _health(srv.url))["generation"] == 2 and h)
        assert health["artifact"]["alpha"] == pytest.approx(0.1)
        served.write_text('{"format": "ragsieve.filter", "format_version": 2}')
        srv.proc.send_signal(signal.SIGHUP)
        wait_until("the refusal in the log", lambda: "reload (SIGHUP) refused" in srv.log())
        assert srv.proc.poll() is None  # SIGHUP never kills the service
        health = _health(srv.url)
        assert health["generation"] == 2 and health["artifact"]["alpha"] == pytest.approx(0.1)
        assert httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a b"]},
                          headers=AUTH, timeout=60).status_code == 200
    assert srv.proc.returncode in (0, 130)  # Ctrl-C: `ragsieve` exits 130 ("interrupted")


def test_two_workers_share_metrics_monitor_feedback_and_reloads(
        adaptive_artifacts: dict[str, Path], tmp_path: Path, embedding_cache_dir: Path,
        xquad_en: list[Pair]) -> None:
    served = tmp_path / "served.json"
    shutil.copy(adaptive_artifacts["a"], served)
    state = tmp_path / "state"
    test = list({p.snippet_id: p for p in xquad_en[300:6000]}.values())
    temp = Path(tempfile.gettempdir())
    metrics_dirs_before = set(temp.glob("ragsieve-metrics-*"))
    with serve(["--filter", str(served), "--workers", "2", "--adaptive", "--state-dir",
                str(state), "--watch"], tmp_path, embedding_cache_dir) as srv:
        srv.started(2)
        workers = sorted(set(re.findall(r"Started server process \[(\d+)\]", srv.log())))
        assert len(workers) == 2
        # requests on fresh connections land on both workers
        n_requests, n_snippets = 30, 5
        for i in range(n_requests):
            chunk = test[i * n_snippets:(i + 1) * n_snippets]
            r = httpx.post(srv.url + "/filter", headers=AUTH, timeout=60, json={
                "query": chunk[0].query, "query_id": f"q{i}",
                "snippets": [{"text": p.text, "snippet_id": p.snippet_id} for p in chunk]})
            assert r.status_code == 200, r.text
        # /metrics on any worker: the sum over both
        for _ in range(4):
            assert _metric(srv.url, "ragsieve_requests_total", endpoint="/filter",
                           status="200") == n_requests
            assert _metric(srv.url, "ragsieve_snippets_scored_total",
                           endpoint="/filter") == n_requests * n_snippets
        # one martingale over the merged stream
        assert _health(srv.url)["monitor"]["n_observed"] == n_requests
        # feedback through one worker moves the threshold both serve
        before = _health(srv.url)["adaptive"]["threshold"]
        items = [{"query_id": f"q{i}", "snippet_id": p.snippet_id, "relevant": 1}
                 for i in range(n_requests)
                 for p in test[i * n_snippets:(i + 1) * n_snippets] if p.relevant == 0]
        fb = httpx.post(srv.url + "/feedback", json={"items": items}, headers=AUTH,
                        timeout=60).json()
        assert fb["adaptive_updates"] == len(items) > 0
        assert fb["adaptive"]["threshold"] > before
        thresholds = {_health(srv.url)["adaptive"]["threshold"] for _ in range(20)}
        assert thresholds == {fb["adaptive"]["threshold"]}
        # POST /admin/reload on one worker reaches the other
        shutil.copy(adaptive_artifacts["b"], served)
        r = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=120)
        assert r.status_code == 200 and r.json()["changed"], r.text
        number = r.json()["generation"]

        def both_swapped() -> bool:
            served_by = re.findall(r"pid (\d+) now serves generation (\d+)", srv.log())
            return all(any(p == w and int(g) >= number for p, g in served_by) for w in workers)

        wait_until("both workers on the new generation", both_swapped, 30)
        healths = [_health(srv.url) for _ in range(20)]
        assert [h["artifact"]["alpha"] for h in healths] == pytest.approx([0.1] * 20)
        assert {h["monitor"]["n_observed"] for h in healths} == {0}  # reset: another artifact
        # a malformed file (seen by --watch in the parent) is refused; nobody moves
        generation = healths[0]["generation"]
        served.write_text("{truncated")
        wait_until("the refusal in the log", lambda: "reload (file change) refused" in srv.log())
        srv.proc.send_signal(signal.SIGHUP)
        wait_until("the SIGHUP refusal", lambda: "reload (SIGHUP) refused" in srv.log())
        assert {_health(srv.url)["generation"] for _ in range(10)} == {generation}
        # a worker that dies is replaced and starts from the last good artifact
        os.kill(int(workers[0]), signal.SIGKILL)
        wait_until("a replacement worker", lambda: srv.log().count(
            "Application startup complete") >= 3, START_TIMEOUT)
        assert {_health(srv.url)["generation"] for _ in range(20)} == {generation}
        assert [_health(srv.url)["artifact"]["alpha"] for _ in range(10)] == pytest.approx([0.1] * 10)
        assert _metric(srv.url, "ragsieve_requests_total", endpoint="/filter",
                       status="200") == n_requests  # the dead worker's counts are kept
        assert set(temp.glob("ragsieve-metrics-*")) - metrics_dirs_before  # in use
    assert srv.proc.returncode == 0
    assert set(temp.glob("ragsieve-metrics-*")) == metrics_dirs_before  # removed at exit
