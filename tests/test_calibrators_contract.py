"""One contract suite for every calibrator (in the spirit of MAPIE's test_common.py).

Every guarantee mode is put through the same checks: ``fit`` returns ``self``; unfitted
use raises ``NotFittedError``; parameters and the fitted state survive a round trip
(through JSON, as in the artifact) with identical predictions; the same bad inputs give
the same errors; ``guarantee()`` describes itself; and a ``ConformalFilter`` of each mode
goes calibrate -> save -> load -> filter with the same keep decisions.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import (
    CALIBRATORS,
    MODES,
    BaseCalibrator,
    calibrator_from_state,
    make_calibrator,
)
from ragsieve.calibration.modes import mode_params
from ragsieve.errors import ArtifactError, CalibrationError, DataError, NotFittedError
from ragsieve.scoring import resolve_scorer

PARAMS = {"alpha": 0.2, "budget": 900, "delta": 0.2}


def _params(mode: str, **changes: object) -> dict:
    """``PARAMS`` (with ``changes``) as ``mode`` takes them: one set serves every mode."""
    return {k: v for k, v in {**PARAMS, **changes}.items() if k in mode_params(mode)}


def _data(seed: int = 0, n_queries: int = 60, per_query: int = 6) -> dict:
    rng = np.random.default_rng(seed)
    n = n_queries * per_query
    q = np.repeat(np.arange(n_queries), per_query)
    relevant = rng.random(n) < 0.35
    relevant[::per_query] = True  # every query has evidence
    scores = np.where(relevant, rng.normal(0.3, 0.15, n), rng.normal(0.7, 0.15, n))
    return {
        "scores": scores, "relevant": relevant, "query_ids": [f"q{i}" for i in q],
        "groups": [f"t{i % 12}" for i in q], "lengths": rng.integers(80, 500, n),
    }


def _inputs(d: dict) -> dict:
    return {k: d[k] for k in ("query_ids", "groups", "lengths")}


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_mode_is_registered_once() -> None:
    assert len(set(MODES)) == len(MODES) == len(CALIBRATORS)
    assert {"marginal", "query-recall", "query-all", "pac", "group", "topic", "budget",
            "adaptive"} <= set(MODES)
    for m, cls in CALIBRATORS.items():
        assert issubclass(cls, BaseCalibrator) and cls.mode == m


def test_fit_returns_self_and_learns_state(mode: str) -> None:
    d = _data()
    cal = make_calibrator(mode, **_params(mode))
    assert cal.fit(d["scores"], d["relevant"], **_inputs(d)) is cal
    assert isinstance(cal.threshold_, float) and isinstance(cal.infinite_, bool)
    assert cal.n_calibration_ >= 1
    keep = cal.predict(d["scores"], **_inputs(d))
    assert keep.dtype == bool and keep.shape == d["scores"].shape
    assert 0 < keep.mean() < 1  # the rule does something on this data


def test_unfitted_use_raises(mode: str) -> None:
    d = _data()
    cal = make_calibrator(mode, **_params(mode))
    for call in (lambda: cal.predict(d["scores"], **_inputs(d)), cal.guarantee, cal.to_state):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()


def test_capabilities_are_asked_not_peeked_at(mode: str) -> None:
    d = _data()
    cal = make_calibrator(mode, **_params(mode))
    assert not cal.is_fitted
    with pytest.raises(NotFittedError, match="not fitted"):
        cal.threshold_for("t0")
    cal.fit(d["scores"], d["relevant"], **_inputs(d))
    assert cal.is_fitted
    alpha = cal.miscoverage()
    target = cal.guarantee().target
    assert (alpha is None) == (target is None)  # a budget without a target promises a size
    if alpha is not None:
        assert alpha == pytest.approx(1 - target)
    for group in ("t0", "t5", "never-seen"):
        tau = cal.threshold_for(group)
        if mode == "group":  # one threshold per group; unseen groups get the pooled one
            assert tau == cal.thresholds_.get(group, cal.threshold_)
        else:
            assert tau == cal.threshold_


def test_tags_say_what_the_mode_can_do(mode: str) -> None:
    """The tags callers ask (serve --adaptive, the feedback store, make_calibrator) are bools
    that hold: ``online`` modes learn from a labelled live snippet, ``alpha_as_target``
    modes take a coverage target that make_calibrator reads from alpha."""
    cls = CALIBRATORS[mode]
    for tag in ("online", "alpha_as_target", "uses_irrelevant"):
        assert isinstance(getattr(cls, tag), bool), f"{mode}: {tag}"
    assert cls.online == (mode == "adaptive")
    assert cls.alpha_as_target == (mode == "budget")
    d = _data()
    cal = make_calibrator(mode, **_params(mode)).fit(d["scores"], d["relevant"], **_inputs(d))
    if cls.online:
        before = cal.threshold_
        for score in np.linspace(0.9, 1.5, 40):  # relevant snippets scored above tau: missed
            cal.update(float(score), True)  # type: ignore[attr-defined]
        assert cal.threshold_ > before  # it followed the feedback
    else:
        assert not callable(getattr(cal, "update", None))
    takes_alpha = "alpha" in cls._param_names()
    assert cls.alpha_as_target == ("alpha" in mode_params(mode) and not takes_alpha)
    if cls.alpha_as_target:
        assert cal.get_params()["target"] == pytest.approx(1 - PARAMS["alpha"])


def test_params_round_trip(mode: str) -> None:
    cal = make_calibrator(mode, **_params(mode))
    params = cal.get_params()
    assert type(cal)(**params).get_params() == params
    assert repr(cal).startswith(type(cal).__name__ + "(")
    key = next(iter(params))
    assert cal.set_params(**{key: params[key]}) is cal
    with pytest.raises(ValueError, match="invalid parameter 'no_such_param'"):
        cal.set_params(no_such_param=1)


def test_state_round_trip_through_json(mode: str) -> None:
    d, new = _data(0), _data(1)
    cal = make_calibrator(mode, **_params(mode)).fit(d["scores"], d["relevant"], **_inputs(d))
    params = json.loads(json.dumps({k: v for k, v in cal.get_params().items() if k != "tokenizer"}))
    state = json.loads(json.dumps(cal.to_state(), allow_nan=False))
    back = calibrator_from_state(mode, params, state)
    assert type(back) is type(cal)
    assert back.threshold_ == cal.threshold_ and back.n_calibration_ == cal.n_calibration_
    np.testing.assert_array_equal(back.predict(new["scores"], **_inputs(new)),
                                  cal.predict(new["scores"], **_inputs(new)))
    assert back.guarantee() == cal.guarantee()


def test_same_bad_inputs_same_errors(mode: str) -> None:
    d = _data()
    s, r, kw = d["scores"], d["relevant"], _inputs(d)
    with pytest.raises(ValueError, match=r"non-finite"):
        make_calibrator(mode, **_params(mode)).fit(np.r_[s[:-1], np.nan], r, **kw)
    with pytest.raises(ValueError, match=r"relevant has shape"):
        make_calibrator(mode, **_params(mode)).fit(s, r[:-1], **kw)
    with pytest.raises(DataError, match=r"relevant\[0\] == 2"):
        make_calibrator(mode, **_params(mode)).fit(s, np.r_[2, r[1:].astype(int)], **kw)
    with pytest.raises(CalibrationError, match="no relevant"):
        make_calibrator(mode, **_params(mode)).fit(s, np.zeros_like(r), **kw)
    cal = make_calibrator(mode, **_params(mode))
    for name in sorted(cal.fit_requires):
        with pytest.raises(ValueError, match=f"needs {name}"):
            cal.fit(s, r, **{**kw, name: None})
    if "alpha" in cal.get_params():
        with pytest.raises(ValueError, match=r"alpha == 1.3, must be in \(0, 1\)"):
            make_calibrator(mode, **_params(mode, alpha=1.3)).fit(s, r, **kw)


def test_guarantee_describes_the_promise(mode: str) -> None:
    d = _data()
    cal = make_calibrator(mode, **_params(mode)).fit(d["scores"], d["relevant"], **_inputs(d))
    g = cal.guarantee()
    assert g.mode == mode and isinstance(g.metric, str) and g.statement
    assert g.target == pytest.approx(1 - PARAMS["alpha"])
    json.dumps(g.to_dict(), allow_nan=False)


#: What the statement of a sentence-unit filter said of its units before each calibrator
#: worded it itself (the filter replaced the snippet nouns in the snippet statement).
_SENTENCE_WORDS = (("relevant live snippets", "live evidence sentences"),
                   ("relevant snippets", "evidence sentences"),
                   ("a relevant snippet", "an evidence sentence"),
                   ("relevant snippet", "evidence sentence"), ("snippets", "sentences"))


def test_guarantee_is_worded_for_the_unit(mode: str) -> None:
    """``guarantee(unit=...)`` words the statement for what was calibrated on: sentences
    and evidence sentences for unit ``"sentence"``, the same words as before for a
    snippet; every other field is the same for both units; another unit is refused."""
    d = _data()
    cal = make_calibrator(mode, **_params(mode)).fit(d["scores"], d["relevant"], **_inputs(d))
    snippet, sentence = cal.guarantee(unit="snippet"), cal.guarantee(unit="sentence")
    assert snippet == cal.guarantee()
    expected = snippet.statement
    for old, new in _SENTENCE_WORDS:
        expected = expected.replace(old, new)
    assert sentence.statement == expected
    assert "relevant snippet" not in sentence.statement
    assert {**sentence.to_dict(), "statement": None} == {**snippet.to_dict(), "statement": None}
    with pytest.raises(ValueError, match="unit == 'token'; expected one of snippet, sentence"):
        cal.guarantee(unit="token")


def test_too_little_data_keeps_everything_or_says_so(mode: str) -> None:
    cal = make_calibrator(mode, **_params(mode, alpha=0.01, delta=0.01))
    d = _data(n_queries=3)
    cal.fit(d["scores"], d["relevant"], **_inputs(d))
    if mode in ("budget", "adaptive"):  # no finite-sample rule to run out of data
        return
    assert cal.infinite_ and math.isinf(cal.threshold_) and cal.guarantee().infinite
    assert cal.predict(d["scores"], **_inputs(d)).all()


# ------------------------------------------------------------- through the filter


def _pairs(seed: int) -> list[Pair]:
    d = _data(seed)
    return [
        Pair(query_id=f"{seed}-{qid}", query=f"question {qid}", snippet_id=f"s{i}",
             text="x" * int(d["lengths"][i]), relevant=int(d["relevant"][i]),
             group=f"{seed}-{d['groups'][i]}",
             meta={"rerank": float(1 - d["scores"][i]), "lang": "en" if i % 3 else "de"})
        for i, qid in enumerate(d["query_ids"])
    ]


def test_filter_of_every_mode_survives_the_artifact(mode: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    scorer = resolve_scorer("field", field="rerank", higher_is_better=True)
    cal = make_calibrator(mode, **_params(mode))
    flt = ConformalFilter(scorer, cal).calibrate(_pairs(0), group_by="lang")
    assert flt.mode == mode
    path = flt.save(tmp_path / "f.json")
    payload = json.loads(path.read_text())
    assert payload["format_version"] == 3 and payload["calibration"]["mode"] == mode
    back = ConformalFilter.load(path)
    assert back.mode == mode and back.guarantee() == flt.guarantee()
    test = _pairs(1)
    a, b = flt.filter_pairs(test), back.filter_pairs(test)
    assert {q: r.kept_ids for q, r in a.items()} == {q: r.kept_ids for q, r in b.items()}
    # one query through filter() with mappings: the same decision as filter_pairs
    qid = next(iter(a))
    items = [{"snippet_id": p.snippet_id, "text": p.text, "rerank": p.meta["rerank"],
              "lang": p.meta["lang"]} for p in test if p.query_id == qid]
    assert back.filter(test[0].query, items).kept_ids == a[qid].kept_ids


def _resealed(payload: dict) -> dict:
    from ragsieve.artifact import seal_value as _checksum

    payload["checksum"]["value"] = _checksum(payload)
    return payload


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [("state", "threshold", 0.99), ("state", "threshold", -5), ("state", "threshold", "0.2"),
     ("params", "alpha", 0.5), ("state", "n_calibration", 0),
     ("block", "threshold_is_infinite", True), ("block", "threshold", 0.99)],
)
def test_edited_artifact_is_refused(where: str, key: str, value: object, tmp_path) -> None:  # type: ignore[no-untyped-def]
    scorer = resolve_scorer("field", field="rerank", higher_is_better=True)
    path = ConformalFilter(scorer, "marginal", alpha=0.2).calibrate(_pairs(0)).save(tmp_path / "f.json")
    payload = json.loads(path.read_text())
    block = payload["calibration"]
    assert ConformalFilter.from_dict(payload).threshold == block["state"]["threshold"]
    edited = json.loads(json.dumps(payload))
    # each value is stored once (format version 3): an edit of it, or an old copy beside it
    (edited["calibration"] if where == "block" else edited["calibration"][where])[key] = value
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        ConformalFilter.from_dict(edited)
    # a forger who also recomputes the checksum is still caught by the stored state or types
    with pytest.raises(ArtifactError):
        ConformalFilter.from_dict(_resealed(edited))


def test_every_sealed_block_is_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    scorer = resolve_scorer("field", field="rerank", higher_is_better=True)
    path = ConformalFilter(scorer, "query-all", alpha=0.2).calibrate(_pairs(0)).save(tmp_path / "f.json")
    payload = json.loads(path.read_text())
    for edit in (lambda p: p["policy"].update(min_keep=3),
                 lambda p: p["scorer"].update(higher_is_better=False),
                 lambda p: p["calibration"]["state"].update(threshold=0.0),
                 lambda p: p.pop("checksum")):
        edited = json.loads(json.dumps(payload))
        edit(edited)
        with pytest.raises(ArtifactError, match="checksum"):
            ConformalFilter.from_dict(edited)
    edited = json.loads(json.dumps(payload))
    edited["data"]["note"] = "free-form provenance is not sealed"
    assert ConformalFilter.from_dict(edited).mode == "query-all"


def test_v1_artifact_still_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    v1 = {
        "format": "ragsieve.filter", "format_version": 1, "library_version": "0.1.0",
        "scorer": {"scorer": "field", "field": "rerank", "higher_is_better": True},
        "calibration": {"mode": "marginal", "method": "split-conformal", "alpha": 0.1,
                        "threshold": -0.5, "threshold_is_infinite": False, "n_calibration": 50,
                        "rank": 46, "coverage_band": [0.9, 0.92]},
        "policy": {"min_keep": 0}, "data": {},
    }
    flt = ConformalFilter.from_dict(v1)
    assert flt.mode == "marginal" and flt.threshold == -0.5
    res = flt.filter("q", [{"rerank": 0.9}, {"rerank": 0.1}])
    assert res.kept_ids == ["0"]


def test_group_filter_needs_a_group() -> None:
    scorer = resolve_scorer("field", field="rerank", higher_is_better=True)
    flt = ConformalFilter(scorer, "group", alpha=0.2).calibrate(_pairs(0), group_by="lang")
    with pytest.raises(DataError, match="no group"):
        flt.filter("q", [{"rerank": 0.5}])
    assert flt.filter("q", [{"rerank": 0.5}], group="en").n_input == 1
    assert flt.filter("q", [{"rerank": 0.5, "lang": "de"}]).n_input == 1
    with pytest.raises(ValueError, match="needs group_by"):
        ConformalFilter(scorer, "group", alpha=0.2).calibrate(_pairs(0))
