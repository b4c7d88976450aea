"""Scorers: the embedding nonconformity score, score_pairs, and alias resolution."""

from __future__ import annotations

import json
import os
import pickle
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ragsieve.errors import DataError, ScorerError
from ragsieve.scoring import EmbeddingScorer, Scorer, register_scorer, resolve_scorer
from ragsieve.types import Pair

QUERY = "Who won Super Bowl 50?"
RELATED = (
    "The American Football Conference champion Denver Broncos defeated the National "
    "Football Conference champion Carolina Panthers 24-10 to earn their third Super Bowl title."
)
UNRELATED = "Photosynthesis is the process by which plants turn light into chemical energy."

DATA_DIR = Path(
    os.environ.get("RAGSIEVE_DATA", Path(__file__).resolve().parents[2] / "shared" / "datasets")
)


@pytest.fixture(scope="module")
def minilm_scorer() -> EmbeddingScorer:
    return EmbeddingScorer()


@pytest.fixture(scope="module")
def use_scorer() -> EmbeddingScorer:
    return EmbeddingScorer(language="de")


class NaNScorer(Scorer):
    """Failure-injection double: NaN for every snippet containing 'bad'."""

    name = "nan-test"

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        return np.array([np.nan if "bad" in s else 0.5 for s in snippets])

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name}


def test_related_snippet_scores_lower(minilm_scorer: EmbeddingScorer) -> None:
    scores = minilm_scorer.score_batch(QUERY, [RELATED, UNRELATED, ""])
    assert scores.dtype == np.float64 and scores.shape == (3,)
    assert np.all((scores >= 0.0) & (scores <= 2.0))
    assert scores[0] < scores[1] - 0.3
    assert minilm_scorer.score_batch(QUERY, [QUERY])[0] == pytest.approx(0.0, abs=1e-5)


def test_empty_snippet_list_gives_empty_scores(minilm_scorer: EmbeddingScorer) -> None:
    out = minilm_scorer.score_batch(QUERY, [])
    assert out.shape == (0,) and out.dtype == np.float64
    assert minilm_scorer.score_pairs([]).shape == (0,)


@pytest.mark.parametrize(
    ("query", "related", "unrelated"),
    [
        (
            "Wer hat den Super Bowl 50 gewonnen?",
            "Die Denver Broncos besiegten die Carolina Panthers mit 24:10 und gewannen den Super Bowl 50.",
            "Die Photosynthese wandelt Lichtenergie in chemische Energie um.",
        ),
        (
            "谁赢得了第50届超级碗？",
            "丹佛野马队以24比10击败卡罗来纳黑豹队，赢得了第50届超级碗。",
            "光合作用是植物把光能转化为化学能的过程。",
        ),
        (
            "¿Quién ganó el Super Bowl 50?",
            "Los Denver Broncos vencieron a los Carolina Panthers 24-10 y ganaron el Super Bowl 50.",
            "La fotosíntesis convierte la energía de la luz en energía química.",
        ),
    ],
)
def test_multilingual_ranks_related_first(
    use_scorer: EmbeddingScorer, query: str, related: str, unrelated: str
) -> None:
    assert use_scorer.model.dim == 512
    scores = use_scorer.score_batch(query, [related, unrelated])
    assert np.all((scores >= 0.0) & (scores <= 2.0))
    assert scores[0] < scores[1]


def _xquad(lang: str) -> list[dict[str, Any]]:
    path = DATA_DIR / "xquad" / f"xquad.{lang}.json"
    if not path.is_file():
        pytest.skip(f"dataset not found at {path} (set RAGSIEVE_DATA)")
    return json.loads(path.read_text(encoding="utf-8"))["data"]


@pytest.mark.parametrize(
    ("lang", "fixture"), [("en", "minilm_scorer"), ("de", "use_scorer"), ("zh", "use_scorer")]
)
def test_gold_paragraph_beats_other_article_on_xquad(
    lang: str, fixture: str, request: pytest.FixtureRequest
) -> None:
    """On real XQuAD questions the paragraph holding the answer scores below a paragraph
    of another article for nearly every question."""
    scorer: EmbeddingScorer = request.getfixturevalue(fixture)
    articles = _xquad(lang)
    rng = random.Random(0)
    pairs: list[Pair] = []
    for a_idx, article in enumerate(articles[:24]):
        para = article["paragraphs"][0]
        other_article = articles[(a_idx + 1 + rng.randrange(len(articles) - 1)) % len(articles)]
        other = rng.choice(other_article["paragraphs"])["context"]
        qa = para["qas"][0]
        pairs.append(Pair(qa["id"], qa["question"], "gold", para["context"], 1))
        pairs.append(Pair(qa["id"], qa["question"], "other", other, 0))
    scores = scorer.score_pairs(pairs).reshape(-1, 2)
    wins = float(np.mean(scores[:, 0] < scores[:, 1]))
    assert wins >= 0.85, f"gold paragraph ranked first for only {wins:.0%} of questions"


def test_score_pairs_aligns_with_pairs_and_score_batch(minilm_scorer: EmbeddingScorer) -> None:
    q2 = "What do plants use sunlight for?"
    pairs = [
        Pair("q1", QUERY, "s1", RELATED),
        Pair("q2", q2, "s2", UNRELATED),
        Pair("q1", QUERY, "s3", UNRELATED),
        Pair("q2", q2, "s4", RELATED),
        Pair("q1", QUERY, "s5", RELATED),  # same text twice in one query
    ]
    scores = minilm_scorer.score_pairs(pairs, progress=True)
    assert scores.shape == (5,) and scores.dtype == np.float64
    b1 = minilm_scorer.score_batch(QUERY, [RELATED, UNRELATED, RELATED])
    b2 = minilm_scorer.score_batch(q2, [UNRELATED, RELATED])
    np.testing.assert_allclose(scores[[0, 2, 4]], b1, atol=1e-7)
    np.testing.assert_allclose(scores[[1, 3]], b2, atol=1e-7)
    assert scores[1] < scores[3]  # the plant snippet is relevant for q2
    # the base-class implementation (one score_batch per query) agrees
    np.testing.assert_allclose(Scorer.score_pairs(minilm_scorer, pairs), scores, atol=1e-7)


def test_score_pairs_embeds_each_text_once(tmp_path) -> None:
    scorer = EmbeddingScorer("minilm", cache_dir=tmp_path)
    pairs = [
        Pair(f"q{i}", f"question {i % 3}", f"s{j}", f"snippet {j}")
        for i in range(6)
        for j in range(4)
    ]
    scorer.score_pairs(pairs)
    assert scorer.cache.n_computed == 3 + 4  # unique queries + unique snippets
    scorer.score_pairs(pairs)
    scorer.score_batch("question 1", ["snippet 2"])
    assert scorer.cache.n_computed == 7
    # a fresh scorer on the same cache_dir reuses the persisted vectors
    fresh = EmbeddingScorer("minilm", cache_dir=tmp_path)
    fresh.score_pairs(pairs)
    assert fresh.cache.n_computed == 0


def test_score_pairs_rejects_inconsistent_query_text(minilm_scorer: EmbeddingScorer) -> None:
    pairs = [Pair("q1", "first text", "a", "x"), Pair("q1", "second text", "b", "y")]
    with pytest.raises(DataError, match="q1"):
        minilm_scorer.score_pairs(pairs)
    with pytest.raises(TypeError, match=r"pairs\[0\] is dict"):
        minilm_scorer.score_pairs([{"query_id": "q1"}])  # type: ignore[list-item]


def test_nan_scores_raise_scorer_error_naming_query() -> None:
    pairs = [
        Pair("q1", "Q", "a", "good"),
        Pair("q2", "Q2", "b", "bad one"),
        Pair("q2", "Q2", "c", "good"),
        Pair("q2", "Q2", "d", "bad two"),
    ]
    with pytest.raises(ScorerError, match=r"2 non-finite .* of 3 scores for query_id 'q2'"):
        NaNScorer().score_pairs(pairs)
    np.testing.assert_array_equal(NaNScorer().score_pairs(pairs[:1]), [0.5])


def test_resolve_scorer_round_trip_via_spec(use_scorer: EmbeddingScorer) -> None:
    scorer = resolve_scorer("embedding")
    assert isinstance(scorer, EmbeddingScorer)
    spec = scorer.spec()
    assert spec == {"scorer": "embedding", "model": "all-MiniLM-L6-v2"}
    assert json.loads(json.dumps(spec)) == spec
    rebuilt = resolve_scorer(json.loads(json.dumps(spec)))
    assert rebuilt.spec() == spec
    np.testing.assert_allclose(
        rebuilt.score_batch(QUERY, [RELATED]), scorer.score_batch(QUERY, [RELATED])
    )
    assert resolve_scorer(use_scorer.spec()).spec() == use_scorer.spec()
    assert resolve_scorer("Embedding", language="zh").spec()["model"] == "usem3-multilingual"
    assert resolve_scorer(use_scorer) is use_scorer


def test_resolve_scorer_errors() -> None:
    with pytest.raises(
        ValueError, match=r"unknown scorer alias 'cross-encoderz'; accepted aliases: .*'embedding'"
    ):
        resolve_scorer("cross-encoderz")
    with pytest.raises(ValueError, match="no 'scorer' key"):
        resolve_scorer({"model": "all-MiniLM-L6-v2"})
    with pytest.raises(ValueError, match="contradict"):
        resolve_scorer({"scorer": "embedding", "model": "all-MiniLM-L6-v2"}, model="use")
    with pytest.raises(TypeError, match="expected an alias str"):
        resolve_scorer(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keyword"):
        resolve_scorer(NaNScorer(), model="x")


def test_register_scorer_plugs_in_a_new_alias() -> None:
    register_scorer("nan-test", NaNScorer)
    try:
        scorer = resolve_scorer({"scorer": "nan-test"})
        assert isinstance(scorer, NaNScorer)
        with pytest.raises(ValueError, match="already registered"):
            register_scorer("nan-test", lambda: NaNScorer())
    finally:
        from ragsieve.scoring import registry

        registry._REGISTRY.pop("nan-test", None)


unit_rows = arrays(
    np.float64,
    st.tuples(st.integers(0, 12), st.just(8)),
    elements=st.floats(-1, 1, allow_nan=False, width=32),
)


@settings(max_examples=100, deadline=None)
@given(unit_rows, arrays(np.float64, 8, elements=st.floats(-1, 1, allow_nan=False, width=32)))
def test_scores_from_embeddings_is_one_minus_cosine(snips: np.ndarray, query: np.ndarray) -> None:
    q_norm = np.linalg.norm(query)
    s_norm = np.linalg.norm(snips, axis=1)
    if q_norm < 1e-3 or (s_norm < 1e-3).any():
        return
    q, s = query / q_norm, snips / s_norm[:, None]
    scores = EmbeddingScorer.scores_from_embeddings(q, s)
    assert scores.shape == (len(snips),) and scores.dtype == np.float64
    assert np.all((scores >= 0.0) & (scores <= 2.0))
    for i in range(len(snips)):
        cos = float(np.dot(q, s[i]))
        assert scores[i] == pytest.approx(1.0 - cos, abs=1e-9)
    # a (1, dim) query and float32 input give the same answer
    np.testing.assert_allclose(
        EmbeddingScorer.scores_from_embeddings(q[None, :].astype(np.float32), s.astype(np.float32)),
        scores,
        atol=1e-5,
    )


def test_scores_from_embeddings_shape_errors() -> None:
    with pytest.raises(ValueError, match="expected \\(n, 3\\)"):
        EmbeddingScorer.scores_from_embeddings(np.ones(3), np.ones((2, 4)))
    with pytest.raises(ValueError, match="query_vec has shape"):
        EmbeddingScorer.scores_from_embeddings(np.ones((2, 3)), np.ones((2, 3)))


def test_scorer_pickles_without_model_or_cache(minilm_scorer: EmbeddingScorer) -> None:
    before = minilm_scorer.score_batch(QUERY, [RELATED, UNRELATED])
    blob = pickle.dumps(minilm_scorer)
    assert len(blob) < 10_000  # no weights, no cached vectors
    clone = pickle.loads(blob)
    assert clone.spec() == minilm_scorer.spec()
    np.testing.assert_allclose(clone.score_batch(QUERY, [RELATED, UNRELATED]), before)
    with pytest.raises(ValueError, match="batch_size == 0"):
        EmbeddingScorer(batch_size=0)
