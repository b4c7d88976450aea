"""Hardening IV, the service: reloads that cannot score, the list check across reloads,
restarts and resets, keyless uploads beside keyed requests, and the page's list note.

Real components throughout: real MiniLM (and reader base) models, a real uvicorn server on
127.0.0.1 (in a thread, or the CLI's ``serve`` as a child process where a process must be
killed), real sockets for the uploads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from browser import chrome  # noqa: F401  (the session's headless Chromium)
from servers import free_port, serving, wait_until

from ragsieve import ConformalFilter, Pair
from ragsieve.artifact import covers, seal_value
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.scoring import ReaderScorer, RelativeScorer
from ragsieve.server.reload import Generations

KEY = "h4-key"
XSS = '<img src=x onerror="window.__pwned = 1"> <script>window.__pwned = 2</script>'
AUTH = {"X-API-Key": KEY}


# ---------------------------------------------------------------------- fixtures, helpers
@pytest.fixture(scope="module")
def minilm_artifact(served_artifact: Any) -> Path:
    return Path(served_artifact(SplitConformalCalibrator(alpha=0.2)))


@pytest.fixture(scope="module")
def lists_artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair],
                   embedding_cache_dir: Path) -> Path:
    """A list-aware filter (MiniLM's query-relative score) on XQuAD-en's own lists (3 to 9
    snippets), with a monitor reference."""
    root = tmp_path_factory.mktemp("h4-lists")
    flt = ConformalFilter(RelativeScorer(cache_dir=embedding_cache_dir), alpha=0.2)
    return Path(flt.calibrate(xquad_en[:300]).save(root / "relative.json"))


def _reader_twin(path: Path, out: Path, blob: bytes) -> Path:
    """``path`` resealed as a reader whose sealed weights are ``blob`` (hashing to its name:
    only the seal's recomputation, no reader fit, made it)."""
    payload = json.loads(path.read_text())
    sha = hashlib.sha256(blob).hexdigest()
    payload["scorer"] = {**ReaderScorer().spec(), "weights": sha}
    payload["weights"] = {sha: base64.b64encode(blob).decode("ascii")}
    payload["checksum"]["covers"] = covers(payload)
    payload["checksum"]["value"] = seal_value(payload)
    out.write_text(json.dumps(payload))
    return out


def _safetensors(header: dict[str, Any], data: bytes = b"", *, size: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if size is None else size) + text + data


#: Weights that are no safetensors file, a header that declares 2**40 bytes, one tensor of
#: another name and shape.
BAD_WEIGHTS = {
    "junk": b"not weights at all " * 64,
    "header-bomb": _safetensors({"x": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}},
                                b"\0\0", size=2**40),
    "wrong-tensor": _safetensors({"x": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}},
                                 b"\0\0\0\0"),
}




def _short_list(i: int) -> dict[str, Any]:
    """A list of 2 snippets, where every calibration list had 3 to 9."""
    return {"query": f"Which river flows through city {i}?",
            "snippets": [f"The river Zq{i} flows through the city.", "Cities have streets."]}


# ---------------------------------------------------------------------- item 3
def test_a_reload_whose_scorer_cannot_score_is_refused_and_never_published(
        minilm_artifact: Path, tmp_path: Path, embedding_cache_dir: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    served = tmp_path / "served.json"
    shutil.copy(minilm_artifact, served)
    state = tmp_path / "state"
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY,
               "state_dir": state}
    body = {"query": "Where is the river?", "snippets": ["The river is in the north."]}
    caplog.set_level(logging.INFO, logger="ragsieve")
    with serving(served, **options) as srv:
        before = httpx.get(srv.url + "/healthz").json()
        for name, blob in BAD_WEIGHTS.items():
            _reader_twin(minilm_artifact, served, blob)
            caplog.clear()
            reply = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=300)
            assert reply.status_code == 422, (name, reply.status_code, reply.text)
            detail = reply.json()["detail"]
            assert "\n" not in detail and "cannot score with its scorer" in detail, detail
            time.sleep(1.5)  # three polls of the reload thread: nothing more is logged
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1 and "refused" in errors[0].getMessage(), (
                name, [r.getMessage()[:200] for r in errors])
            assert not any(r.exc_info for r in caplog.records), name  # no traceback
            health = httpx.get(srv.url + "/healthz").json()
            assert health["generation"] == before["generation"], name
            assert health["published_generation"] == before["generation"], name
            assert health["degraded"] is None
            assert httpx.post(srv.url + "/filter", json=body, headers=AUTH,
                              timeout=60).status_code == 200
        control = Generations(state / "control.sqlite")
        try:
            assert control.latest_number() == before["generation"]  # nothing published
        finally:
            control.close()
        shutil.copy(minilm_artifact, served)  # the good file back: served as before
        again = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=300)
        assert again.status_code == 200 and again.json()["changed"] is False


# ---------------------------------------------------------------------- item 6
def test_an_unchanged_reload_keeps_the_list_alarm_and_only_a_reset_clears_it(
        lists_artifact: Path, tmp_path: Path, embedding_cache_dir: Path) -> None:
    served = tmp_path / "served.json"
    shutil.copy(lists_artifact, served)
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY,
               "state_dir": tmp_path / "state"}
    with serving(served, **options) as srv:
        for i in range(15):
            reply = httpx.post(srv.url + "/filter", json=_short_list(i), headers=AUTH,
                               timeout=60)
            assert reply.status_code == 200 and reply.json()["lists_unlike"] is True
        lists = httpx.get(srv.url + "/healthz").json()["lists"]
        assert lists["alarm"] is True and lists["n_seen"] == 15
        reload = httpx.post(srv.url + "/admin/reload", headers=AUTH, timeout=120).json()
        assert reload["changed"] is False and reload["lists_reset"] is False
        lists = httpx.get(srv.url + "/healthz").json()["lists"]
        assert lists["alarm"] is True and lists["n_seen"] == 15  # the same artifact: kept
        reset = httpx.post(srv.url + "/admin/monitor/reset", headers=AUTH, timeout=60)
        assert reset.status_code == 200, reset.text
        assert reset.json()["lists_reset"] is True and reset.json()["monitor_reset"] is True
        lists = httpx.get(srv.url + "/healthz").json()["lists"]
        assert lists["alarm"] is False and lists["n_seen"] == 0


# ---------------------------------------------------------------------- item 7


class _Serve:
    """The CLI's ``serve`` as a child process (its log in a file), up when it answers."""

    def __init__(self, artifact: Path, state: Path, cache: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "w", encoding="utf-8")  # noqa: SIM115 (closed in stop)
        cmd = [sys.executable, "-m", "ragsieve.cli", "serve", "--filter", str(artifact),
               "--port", str(self.port), "--state-dir", str(state), "--cache-dir", str(cache)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ))
        wait_until("serve to answer", self._up, timeout=300)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited with {self.proc.returncode}:\n"
                                 + self.log_path.read_text()[-3000:])
        return httpx.get(self.url + "/healthz", timeout=5).status_code == 200

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/healthz", timeout=30).json())

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def test_the_alarms_survive_kill_9_and_not_another_artifact(
        lists_artifact: Path, minilm_artifact: Path, tmp_path: Path,
        embedding_cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A real ``serve`` process fires both alarms and is killed (SIGKILL); a service started
    on its state directory with the same artifact has them on, another artifact not."""
    state = tmp_path / "state"
    first = _Serve(lists_artifact, state, embedding_cache_dir, tmp_path / "first.log")
    try:
        for i in range(40):  # the question itself and noise, 2 snippets: both alarms fire
            question = f"Which river flows through the city number {i}?"
            body = {"query": question, "snippets": [question, f"zq{i} xv kk pp"]}
            assert httpx.post(first.url + "/filter", json=body, headers={"X-Ragsieve": "1"},
                              timeout=60).status_code == 200
            fired = first.health()
            if fired["monitor"]["alarm"] and fired["lists"]["alarm"]:
                break
        assert fired["monitor"]["alarm"] and fired["lists"]["alarm"]
    finally:
        first.stop(signal.SIGKILL)
    assert first.proc.returncode == -signal.SIGKILL
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}, "state_dir": state}
    caplog.set_level(logging.INFO, logger="ragsieve")
    with serving(lists_artifact, **options) as again:  # the same state directory
        health = httpx.get(again.url + "/healthz").json()
    for name, n in (("monitor", "n_observed"), ("lists", "n_seen")):
        assert health[name]["alarm"] is True, (name, health[name])
        assert health[name][n] == fired[name][n]
        assert health[name]["fired_at"] == fired[name]["fired_at"]
    assert "go on from it" in caplog.text
    caplog.clear()
    with serving(minilm_artifact, **options) as other:  # another artifact: discarded
        assert httpx.get(other.url + "/healthz").json()["monitor"]["alarm"] is False
    assert "discarded" in caplog.text
    with serving(lists_artifact, **options) as back:  # its state is from before: not used
        health = httpx.get(back.url + "/healthz").json()
    assert health["monitor"]["alarm"] is False and health["monitor"]["n_observed"] == 0
    assert health["lists"]["alarm"] is False and health["lists"]["n_seen"] == 0


# ---------------------------------------------------------------------- item 1
def _idle_upload(port: int, *, key: str | None = None, source: str = "127.0.0.1",
                 size: int = 1_000_000) -> socket.socket:
    """A ``POST /filter`` that declares ``size`` bytes of body and sends none of them."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
    head = (f"POST /filter HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n")
    if key is not None:
        head += f"X-API-Key: {key}\r\n"
    sock.sendall((head + "\r\n").encode())
    return sock


def _answer(sock: socket.socket) -> tuple[int, str]:
    """The status and body of the one response on ``sock`` (then closed)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


def test_keyless_idle_uploads_cannot_block_keyed_requests(minilm_artifact: Path,
                                                         embedding_cache_dir: Path) -> None:
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY,
               "body_idle_timeout": 3.0}
    body = {"query": "Where is the river?", "snippets": ["The river is in the north."]}
    with serving(minilm_artifact, **options) as srv:
        keyless = [_idle_upload(srv.port) for _ in range(4)]  # 4 x 1 MB: the whole cap
        keyed = httpx.post(srv.url + "/filter", json=body, headers=AUTH, timeout=60)
        assert keyed.status_code == 200, keyed.text
        for sock in keyless:  # refused from their head, nothing reserved
            status, text = _answer(sock)
            assert status == 401 and "API key" in text
        # one address holds at most 2 x max_body_bytes of the receiving cap
        held = [_idle_upload(srv.port, key=KEY, source="127.0.0.2") for _ in range(2)]
        time.sleep(0.5)  # both heads read (order only: nothing is timed)
        status, text = _answer(_idle_upload(srv.port, key=KEY, source="127.0.0.2"))
        assert status == 429 and "--max-receiving-per-client" in text, text
        keyed = httpx.post(srv.url + "/filter", json=body, headers=AUTH, timeout=60)
        assert keyed.status_code == 200, keyed.text  # another address still gets in
        for sock in held:  # the idle bodies time out on the idle timeout, not the 60 s
            status, text = _answer(sock)
            assert status == 408 and "--body-idle-timeout" in text, text
        # the unknown and the admin paths want the key too; /healthz does not
        assert httpx.post(srv.url + "/nowhere", json={}).status_code == 401
        assert httpx.get(srv.url + "/healthz").status_code == 200


# ---------------------------------------------------------------------- item 12
def test_the_page_shows_the_list_check(lists_artifact: Path, embedding_cache_dir: Path,
                                       chrome: Any) -> None:  # noqa: F811
    """A list of 2 snippets to a filter calibrated on lists of 3 to 9: the page's result
    says so, as text (the note is set with textContent, never parsed as markup)."""
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serving(lists_artifact, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        query, snippets = "Which river flows through the city?", [
            "The river <b>Zq</b> flows through the city.", XSS]
        answer = httpx.post(srv.url + "/filter", json={"query": query, "snippets": snippets},
                            timeout=60).json()
        assert answer["lists_unlike"] is True and "a list of 2 snippets" in answer["lists_note"]
        chrome.get(srv.url + "/")
        WebDriverWait(chrome, 60).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-status")
            == "loaded")
        chrome.find_element(By.ID, "query").send_keys(query)
        chrome.find_element(By.ID, "snippets").send_keys("\n".join(snippets))
        chrome.find_element(By.ID, "submit").click()
        WebDriverWait(chrome, 120).until(
            lambda d: d.find_element(By.ID, "result").get_attribute("data-done")
            or d.find_element(By.ID, "error").text)
        assert chrome.find_element(By.ID, "error").text == ""
        note = chrome.find_element(By.ID, "lists-note")
        assert note.is_displayed()
        assert answer["lists_note"] in note.text and note.text.startswith("Unlike the calibration")
        assert note.find_elements(By.XPATH, "./*") == []  # text only, no markup
        assert chrome.execute_script("return window.__pwned") is None
        chrome.get("about:blank")
