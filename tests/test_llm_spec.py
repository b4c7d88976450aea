"""``LLMScorer.spec()`` and ``repr()`` never start a server or open a connection.

The spec names the scorer in every saved artifact, so it is asked for often (CLI
messages, reports, ``ConformalFilter.load``); it comes from the constructor arguments.
Starting or connecting is made to fail loudly here (failure injection), and the derived
spec is checked against what a started local server would report.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, NoReturn

import pytest

from ragsieve.llm import LocalLLMServer
from ragsieve.scoring import LLMScorer, resolve_scorer


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("an LLM server was started or a connection opened")


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make starting the local model, connecting and sending a request fail."""
    connect_module = importlib.import_module("ragsieve.llm.connect")  # the name is shadowed
    client_module = importlib.import_module("ragsieve.llm.client")
    for env in ("RAGSIEVE_LLM_BASE_URL", "RAGSIEVE_LLM_MODEL"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setattr(LocalLLMServer, "__init__", _refuse)
    monkeypatch.setattr(LocalLLMServer, "start", _refuse)
    monkeypatch.setattr(connect_module, "connect", _refuse)
    monkeypatch.setattr(client_module.LLMClient, "__init__", _refuse)


@pytest.mark.usefixtures("nothing_starts")
@pytest.mark.parametrize(
    ("kwargs", "model", "version"),
    [
        ({}, "gemma3-270m", "judge-completion-v2"),
        ({"mode": "rating"}, "gemma3-270m", "rating-completion-v2"),
        ({"model": "smollm2-135m"}, "smollm2-135m", "judge-chat-v2"),
        ({"model": "smollm2-135m", "style": "completion"}, "smollm2-135m",
         "judge-completion-v2"),
        ({"model": "/models/tiny-q4.gguf"}, "tiny-q4", "judge-completion-v2"),
        ({"base_url": "http://127.0.0.1:9/v1", "model": "qwen"}, "qwen", "judge-chat-v2"),
    ],
)
def test_spec_and_repr_start_nothing(kwargs: dict[str, Any], model: str, version: str) -> None:
    scorer = LLMScorer(**kwargs, tie_breaking="random", seed=3)
    assert scorer.spec() == {
        "scorer": "llm", "mode": kwargs.get("mode", "logprob"), "model": model,
        "prompt_version": version, "tie_breaking": "random", "seed": 3,
    }
    assert repr(scorer).startswith("LLMScorer(")
    assert scorer._connection is None
    with pytest.raises(AssertionError, match="started or a connection opened"):
        _ = scorer.connection  # the injected failure is live: first real use would start one


@pytest.mark.usefixtures("nothing_starts")
def test_spec_reads_the_environment_like_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_LLM_MODEL", "smollm2-135m")
    assert LLMScorer().spec()["model"] == "smollm2-135m"
    monkeypatch.setenv("RAGSIEVE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RAGSIEVE_LLM_MODEL", "remote-model")
    assert LLMScorer().spec()["model"] == "remote-model"


@pytest.mark.usefixtures("nothing_starts")
def test_spec_round_trips_and_checks_the_prompt_version() -> None:
    spec = LLMScorer(mode="logprob").spec()
    assert resolve_scorer(spec).spec() == spec
    with pytest.raises(ValueError, match="recalibrate with the current prompt"):
        resolve_scorer({**spec, "prompt_version": "judge-completion-v0"})


@pytest.mark.usefixtures("nothing_starts")
def test_endpoint_without_model_is_a_clear_error() -> None:
    scorer = LLMScorer(base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="no model name"):
        scorer.spec()
    assert "LLMScorer(" in repr(scorer)


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m", "/models/tiny-q4.gguf"])
def test_derived_name_and_style_are_the_servers(model: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """What spec() derives is what the server, once started, answers to (no start here)."""
    monkeypatch.delenv("RAGSIEVE_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("RAGSIEVE_LLM_MODEL", raising=False)
    monkeypatch.setattr(LocalLLMServer, "start", _refuse)
    server = LocalLLMServer(model)  # constructing does not start it
    spec = LLMScorer(model=model).spec()
    assert spec["model"] == server.model_name
    assert spec["prompt_version"] == f"judge-{server.prompt_style}-v2"
    assert not server.is_running


def test_spec_of_an_open_connection_is_the_connections(tmp_path: Path) -> None:
    """With a connection given, spec() reads it (an endpoint: no server, no request)."""
    from ragsieve.llm import connect

    with connect(base_url="http://127.0.0.1:9/v1", model="m", style="completion",
                 cache=tmp_path / "c.sqlite") as conn:
        scorer = LLMScorer(conn, mode="rating")
        assert scorer.spec()["model"] == "m"
        assert scorer.spec()["prompt_version"] == "rating-completion-v2"
        assert conn.client.usage["n_requests"] == 0
