"""The LLM commands of the CLI against the real local model: evaluate --scorer llm, injection, serve."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ragsieve.cli import main
from ragsieve.data import load_selqa, sample_queries, write_pairs

EXE = str(Path(sys.executable).parent / "ragsieve")


@pytest.fixture(scope="module")
def selqa_jsonl(shared_data_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("llmcli") / "selqa12.jsonl"
    write_pairs(sample_queries(load_selqa("dev", data_dir=shared_data_dir), 12, seed=2), path)
    return path


def _llm_args(server, tmp_path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--base-url", server.base_url, "--llm-model", server.model_name, "--llm-style", "completion"]


@pytest.mark.slow  # a whole evaluate on the local model: make test-all
def test_evaluate_with_llm_scorer(local_llm, selqa_jsonl: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    code = main(["-q", "evaluate", "--data", str(selqa_jsonl), "--scorer", "llm", "--limit-queries", "8",
                 "--splits", "3", "--alpha", "0.2", "--json", *_llm_args(local_llm, tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["n_queries"] == 8 and report["scorer"]["scorer"] == "llm"
    assert report["scorer"]["mode"] == "logprob" and report["n_dropped_errors"] == 0
    assert report["pairs_per_second"] > 0
    assert {r["method"] for r in report["results"]} == {"conformal", "top-k", "threshold", "top-k (calibrated)", "threshold (calibrated)"}


def test_injection_command(local_llm, selqa_jsonl: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                           capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    code = main(["-q", "llm", "injection", "--data", str(selqa_jsonl), "--n-pairs", "2", "--json",
                 *_llm_args(local_llm, tmp_path)])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_pairs"] == 2
    n_attacks = sum(i["set"] != "control" for i in result["injections"])
    assert result["defended"]["all"]["n_judged"] == 2 * n_attacks
    assert "undefended" in result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_llm_serve_command() -> None:
    port = _free_port()
    proc = subprocess.Popen([EXE, "llm", "serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        body = None
        while time.monotonic() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    body = json.loads(r.read())
            except OSError:
                time.sleep(0.3)
        assert body is not None, "server did not come up"
        assert body["data"][0]["id"] == "gemma3-270m"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 0
