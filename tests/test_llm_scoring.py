"""LLMScorer on the real local model (Gemma 3 270M over HTTP); failure injection on a double."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from llm_doubles import FakeLLMServer

from ragsieve import ConformalFilter, LLMScorer, ScorerError, SplitConformalCalibrator
from ragsieve.data import load_selqa, sample_queries
from ragsieve.llm import connect
from ragsieve.scoring.llm import TIE_JITTER, _jitter


@pytest.fixture(scope="module")
def selqa_small(shared_data_dir):  # type: ignore[no-untyped-def]
    return sample_queries(load_selqa("dev", data_dir=shared_data_dir), 4, seed=3)


def test_logprob_scores_are_continuous_and_cached(llm_connection, selqa_small) -> None:  # type: ignore[no-untyped-def]
    scorer = LLMScorer(llm_connection, mode="logprob")
    scores = scorer.score_pairs(selqa_small)
    assert scores.shape == (len(selqa_small),)
    assert np.all((scores >= 0) & (scores <= 1))
    assert np.unique(scores).size > len(selqa_small) // 2  # continuous, not a few levels
    used = llm_connection.client.usage["n_requests"]
    assert used == len({(p.query, p.text) for p in selqa_small})
    q = selqa_small[0].query
    own = [p.text for p in selqa_small if p.query == q]
    np.testing.assert_allclose(scorer.score_batch(q, own), scores[: len(own)])
    assert llm_connection.client.usage["n_requests"] == used  # all from the cache
    spec = scorer.spec()
    assert spec["scorer"] == "llm" and spec["mode"] == "logprob"
    assert spec["model"] == "gemma3-270m" and spec["prompt_version"] == "judge-completion-v2"


def test_logprob_prefers_the_answer_sentence(llm_connection) -> None:  # type: ignore[no-untyped-def]
    scorer = LLMScorer(llm_connection, mode="logprob")
    s = scorer.score_batch(
        "How many moons does Jupiter have?",
        ["Jupiter has 95 officially recognised moons, the largest being Ganymede.",
         "The Eiffel Tower was completed in 1889 for the World's Fair in Paris."],
    )
    assert s[0] < s[1]


def test_rating_mode_never_invents_a_score(llm_connection, selqa_small) -> None:  # type: ignore[no-untyped-def]
    """Each pair either has a parsed rating (A = 1 - rating) or is reported as an error."""
    from ragsieve.llm.prompts import parse_rating

    scorer = LLMScorer(llm_connection, mode="rating")
    pairs = selqa_small[:6]
    try:
        scores = scorer.score_pairs(pairs)
        errors: list[dict] = []
    except ScorerError as exc:
        scores, errors = exc.scores, exc.errors  # type: ignore[attr-defined]
    failed = {e["index"] for e in errors}
    for i, s in enumerate(scores):
        if i in failed:
            assert math.isnan(s)
        else:
            assert 0.0 <= s <= 1.0
    for e in errors:
        assert parse_rating(e["answer"]) is None and e["error"]


def test_garbage_replies_raise_and_keep_partial_results(tmp_path: Path) -> None:
    """A server whose replies are neither ratings nor yes/no: no score is ever produced."""
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="completion",
                                          cache=tmp_path / "c.sqlite") as conn:
        for mode in ("rating", "logprob"):
            scorer = LLMScorer(conn, mode=mode)
            with pytest.raises(ScorerError, match="could not be used") as info:
                scorer.score_batch("q", ["a", "b"])
            assert np.isnan(info.value.scores).all()  # type: ignore[attr-defined]
            assert len(info.value.errors) == 2  # type: ignore[attr-defined]
        # rating: the reply was asked again once (repair), then recorded as an error
        assert fake.n_requests == 2 * 2 + 2


def test_http_failures_are_per_pair_errors(tmp_path: Path) -> None:
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="chat",
                                          cache=False) as conn:
        conn.client.max_retries = 0
        fake.script = [("status", 400, "bad request")]
        scorer = LLMScorer(conn, mode="rating")
        with pytest.raises(ScorerError) as info:
            scorer.score_batch("q", ["a"])
        assert "request failed" in info.value.errors[0]["error"]  # type: ignore[attr-defined]


def test_random_tie_breaking_makes_discrete_coverage_exact() -> None:
    """Verbal ratings on a 0.1 grid: the plain rule over-covers, random tie-breaking does not.

    400 random calibration/test splits of exchangeable discrete scores; tolerance 4 standard
    errors of the mean coverage.
    """
    rng = np.random.default_rng(0)
    alpha, n_cal, n_test = 0.2, 100, 500
    plain, jittered = [], []
    for r in range(400):
        ratings = rng.choice(np.round(np.arange(0, 1.01, 0.1), 1), size=n_cal + n_test,
                             p=np.r_[1, 1, 2, 3, 5, 8, 12, 18, 22, 16, 12] / 100)
        a = 1.0 - ratings
        j = a + np.array([_jitter(r, f"q{i}", "s") for i in range(a.size)])
        for scores, out in ((a, plain), (j, jittered)):
            tau = SplitConformalCalibrator(alpha=alpha).fit(scores[:n_cal]).threshold_
            out.append(np.mean(scores[n_cal:] <= tau))
    se = lambda x: np.std(x, ddof=1) / np.sqrt(len(x))
    band_high = 1 - alpha + 1 / (n_cal + 1)
    assert np.mean(plain) > band_high + 4 * se(plain)  # conservative: over-covers
    assert 1 - alpha - 4 * se(jittered) <= np.mean(jittered) <= band_high + 4 * se(jittered)
    assert TIE_JITTER < 0.01  # never reorders different ratings on a 0.01 grid


def test_jitter_is_deterministic_per_pair() -> None:
    assert _jitter(0, "q", "s") == _jitter(0, "q", "s") != _jitter(1, "q", "s")
    assert 0 <= _jitter(0, "q", "s") < TIE_JITTER


def test_artifact_round_trip_with_llm_scorer(local_llm, selqa_small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "c.sqlite"
    options = {"base_url": local_llm.base_url, "style": "completion", "cache": cache, "concurrency": 1}
    scorer = LLMScorer(mode="logprob", model=local_llm.model_name, **options)
    flt = ConformalFilter(scorer, alpha=0.5).calibrate(selqa_small)
    path = flt.save(tmp_path / "llm-filter.json")
    payload = json.loads(path.read_text())
    assert payload["scorer"]["prompt_version"] == "judge-completion-v2"
    loaded = ConformalFilter.load(path, scorer_options=options)
    assert loaded.threshold == flt.threshold
    q = selqa_small[0].query
    texts = [p.text for p in selqa_small if p.query == q]
    assert loaded.filter(q, texts).kept_ids == flt.filter(q, texts).kept_ids
    payload["scorer"]["prompt_version"] = "judge-completion-v0"  # as an older ragsieve wrote it
    from ragsieve.artifact import seal_value as _checksum

    payload["checksum"]["value"] = _checksum(payload)  # a genuine, sealed older artifact
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="recalibrate with the current prompt"):
        ConformalFilter.load(path, scorer_options=options)
    scorer.close()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        LLMScorer(mode="verbal")
    with pytest.raises(ValueError, match="tie_breaking"):
        LLMScorer(tie_breaking="sometimes")
