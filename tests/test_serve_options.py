"""``ServeOptions``: one definition of each serve default, checked values, and the same
options in the CLI, ``create_app`` and the worker processes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ragsieve.cli import build_parser
from ragsieve.cli.serving import serve_options as cli_serve_options
from ragsieve.filter import ConformalFilter
from ragsieve.scoring import resolve_scorer
from ragsieve.server import create_app, workers
from ragsieve.server.options import ServeOptions, serve_options
from ragsieve.types import Pair

#: ``serve``'s options named otherwise in ServeOptions.
RENAMED = {"index": "index_path", "feedback": "feedback_db", "api_key_env": "api_key"}
#: ``serve``'s options that are not the service's (the artifact, the scorer's cache, logging).
NOT_OPTIONS = {"filter", "cache_dir", "no_cache", "verbose", "quiet", "command", "func"}
#: ``(default ...)`` texts of ``serve --help`` that are not plain numbers.
SPOKEN = {"64 MiB": 64 * 2**20, "7 days": 7 * 24 * 3600.0}


def _same(text: str, default: Any) -> bool:
    """Whether a help text's ``default ...`` states ``default``."""
    if text in SPOKEN:
        return bool(SPOKEN[text] == default)
    try:
        return float(text) == default
    except ValueError:
        return text == str(default)


def _serve_parser() -> Any:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"]


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["serve", "--filter", "f.json", *argv])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real artifact of an outside score (no model to load)."""
    pairs = [Pair(query_id=f"q{i}", query=f"query {i}", snippet_id=f"s{j}", text=f"text {j}",
                  relevant=int(j == 0), group=f"t{i % 7}",
                  meta={"rerank": float(j + (i % 5) / 10)})
             for i in range(40) for j in range(4)]
    flt = ConformalFilter(resolve_scorer("field", field="rerank"), "marginal", alpha=0.2)
    flt.calibrate(pairs)
    path = tmp_path_factory.mktemp("serve-options") / "field.json"
    flt.save(path)
    return path


# ------------------------------------------------------------------ one definition
def test_every_serve_option_is_a_serve_options_field() -> None:
    dests = {a.dest for a in _serve_parser()._actions if a.dest != "help"}
    fields = set(ServeOptions.names())
    # a saved score's runtime flags (--rerank-url, ...) reach it as ServeOptions.scorer_options
    from ragsieve.scoring import registered_scorers, scorer_options

    runtime = {o.dest for alias in registered_scorers() for o in scorer_options(alias)
               if o.runtime and o.dest}
    assert "scorer_options" in fields
    for dest in dests - NOT_OPTIONS - runtime:
        assert RENAMED.get(dest, dest) in fields, f"serve --{dest} is no ServeOptions field"


def test_cli_defaults_are_serve_options_defaults(tmp_path: Path) -> None:
    """An option not given takes ServeOptions' default (the parser holds None, or the
    same value for the switches), and the help states that default."""
    defaults = ServeOptions()
    for action in _serve_parser()._actions:
        name = RENAMED.get(action.dest, action.dest)
        if action.dest in NOT_OPTIONS or name not in ServeOptions.names():
            continue
        assert action.default in (None, getattr(defaults, name)), action.dest
        stated = re.search(r"default (\d[\d.]*(?: MiB| days)?)\)", action.help or "")
        if stated:
            assert _same(stated.group(1), getattr(defaults, name)), action.dest
    built = cli_serve_options(_args("--state-dir", str(tmp_path)))
    assert built == ServeOptions(state_dir=tmp_path, feedback_db=tmp_path / "feedback.sqlite")


def test_every_serve_flag_reaches_its_option(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_TEST_KEY", "a-key")
    given = {
        "host": "0.0.0.0", "port": 8123, "max_k": 7, "max_body_bytes": 5000,
        "max_snippets": 9, "workers": 3, "state_dir": tmp_path, "index_path": tmp_path / "ix",
        "feedback_db": tmp_path / "fb.sqlite", "monitor_delta": 0.05,
        "max_artifact_bytes": 12345, "max_pieces": 11, "max_queue": 12,
        "feedback_retention": 60.0, "max_labels_per_query": 13, "max_labels_per_minute": 14,
        "api_key": "a-key", "adaptive": True, "watch": True,
    }
    flags = {v: k for k, v in RENAMED.items()}
    argv = ["--api-key-env", "RAGSIEVE_TEST_KEY", "--adaptive", "--watch"]
    for name, value in given.items():
        if name not in ("api_key", "adaptive", "watch"):
            argv += ["--" + flags.get(name, name).replace("_", "-"), str(value)]
    assert cli_serve_options(_args(*argv)) == ServeOptions(**given)


# ------------------------------------------------------------------ checked values
@pytest.mark.parametrize(("changes", "error", "message"), [
    ({"max_snippets": 0}, ValueError, "max_snippets == 0, must be an int >= 1."),
    ({"workers": True}, TypeError, "workers must be an int >= 1, got bool (True)."),
    ({"max_pieces": 1.5}, TypeError, "max_pieces must be an int >= 1, got float (1.5)."),
    ({"body_timeout": "x"}, TypeError,
     "body_timeout must be a real number > 0 (seconds), got str ('x')."),
    ({"feedback_retention": -1}, ValueError,
     "feedback_retention == -1, must be a real number > 0 (seconds)."),
    ({"monitor_delta": 1.5}, ValueError, "monitor_delta == 1.5, must be a real number in (0, 1)"),
    ({"port": 70000}, ValueError, "port == 70000, must be an int in [0, 65535]."),
    ({"api_key": ""}, ValueError, "api_key == '', must be a non-blank str or None."),
    ({"host": " "}, ValueError, "host == ' ', must be a non-blank str."),
    ({"watch": "yes"}, TypeError, "watch must be a bool, got str ('yes')."),
    ({"state_dir": 3}, TypeError, "state_dir must be a path (str or os.PathLike) or None, got int"),
    ({"state_dir": ""}, ValueError, "state_dir == '', must be a non-empty path"),
    ({"scorer_options": ["cache_dir"]}, TypeError, "scorer_options must be a mapping"),
    ({"max_kk": 3}, TypeError, "create_app() got unknown option(s) 'max_kk'; the options of ServeOptions are"),
])
def test_a_bad_value_is_a_one_line_error_naming_the_option(
        changes: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        serve_options(None, changes)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    if "max_kk" not in changes:
        with pytest.raises(error, match=re.escape(message)):
            ServeOptions(**changes)


def test_create_app_refuses_a_bad_option_before_reading_anything(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(TypeError, match="create_app\\(\\) got unknown option\\(s\\) 'max_kk'"):
        create_app(missing, max_kk=3)
    with pytest.raises(TypeError, match=r"create_app\(\): options must be a ServeOptions or None .*, got str \('fast'\)"):
        create_app(missing, "fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_k == 0"):
        create_app(missing, ServeOptions(), max_k=0)


def test_create_app_takes_the_record_or_its_keywords(artifact: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    record = ServeOptions(max_snippets=5, max_k=3, warmup=False, state_dir=tmp_path / "a")
    apps = {
        "record": (create_app(artifact, record), record),
        "keywords": (create_app(artifact, max_snippets=5, max_k=3, warmup=False,
                                state_dir=tmp_path / "b"),
                     record.replace(state_dir=tmp_path / "b")),
        "both": (create_app(artifact, record, state_dir=tmp_path / "c", max_k=4),
                 record.replace(state_dir=tmp_path / "c", max_k=4)),
    }
    for how, (app, expected) in apps.items():
        with TestClient(app) as client:  # its lifespan closes the state at the end
            assert app.state.runtime.options == expected, how
            r = client.post("/filter", json={"query": "q", "snippets": [
                {"text": "a", "rerank": 1.0}] * 6})
            assert r.status_code == 413 and "limit is 5" in r.json()["detail"], how


# ------------------------------------------------------------------ workers
def _non_defaults(tmp_path: Path) -> ServeOptions:
    return ServeOptions(
        api_key="worker-key", host="127.0.0.2", port=0, workers=2, log_level="warning",
        timeout_keep_alive=3, timeout_request_header=4.5, max_body_bytes=777,
        max_snippets=8, body_timeout=9.5, scorer_options={"cache_dir": str(tmp_path / "c")},
        warmup=False, index_path=tmp_path / "ix", max_k=6, state_dir=tmp_path / "s",
        feedback_db=tmp_path / "fb.sqlite", adaptive=True, monitor_delta=0.02, watch=True,
        max_served_rows=50, max_pieces=10, max_queue=11, max_artifact_bytes=5000,
        feedback_retention=120.0, max_labels_per_query=12, max_labels_per_minute=13)


def test_options_round_trip_through_json(tmp_path: Path) -> None:
    options = _non_defaults(tmp_path)
    data = json.loads(json.dumps(options.to_dict()))
    assert "api_key" not in data and "worker-key" not in repr(options)
    assert ServeOptions.from_dict(data, api_key="worker-key") == options
    assert ServeOptions.from_dict({}) == ServeOptions()
    with pytest.raises(TypeError, match="'api_key' is passed as the keyword"):
        ServeOptions.from_dict({"api_key": "k"})


def test_workers_get_the_same_options_as_the_parent(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent writes the options the workers read: the same record comes back."""
    for name in (workers.CONFIG_ENV, workers.API_KEY_ENV, "PROMETHEUS_MULTIPROC_DIR"):
        # set, then deleted: monkeypatch records the value before (unset included) and
        # restores it, so what _export_worker_config sets does not leak into later tests
        # (a delenv of an unset name records nothing)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    options = _non_defaults(tmp_path).replace(watch=False)  # the parent alone watches
    workers._export_worker_config(tmp_path / "a.json", options, str(tmp_path / "m"))
    config = json.loads(os.environ[workers.CONFIG_ENV])
    assert config["filter_path"] == str(tmp_path / "a.json")
    received = ServeOptions.from_dict(config["app"],
                                      api_key=os.environ.get(workers.API_KEY_ENV) or None)
    assert received == options
    protocol = workers.HeaderTimeoutProtocol  # built in a worker from the same options
    assert protocol is not None
