"""Caller-supplied vectors of any finite size score their true ``1 - cos`` (Hardening IV
item 9): identical vectors with components of 1e155 scored 1.0 (the squared norm overflowed
to inf) and components of 1e-200 were refused as zero vectors (it underflowed to 0).

Library level through the real MiniLM scorer, and through ``POST /filter`` of a real
service (real uvicorn on 127.0.0.1, real artifact).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.scoring import EmbeddingScorer


@pytest.mark.parametrize("size", [1e150, 1e155, 1e300, 1.7e308, 1e-160, 1e-200, 5e-324])
def test_huge_and_tiny_vectors_score_their_cosine(minilm_scorer: EmbeddingScorer,
                                                   size: float) -> None:
    """Same direction: 0; opposite: 2; orthogonal: 1, at every scale, with no overflow."""
    q = np.full(4, size)
    ortho = np.array([size, -size, size, -size])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning of overflow fails the test
        scores = minilm_scorer.scores_from_vectors(q, [q, -q, ortho])
    np.testing.assert_allclose(scores, [0.0, 2.0, 1.0], atol=1e-12)


def test_a_vector_scaled_by_1e155_scores_as_itself(minilm_scorer: EmbeddingScorer) -> None:
    """A real embedding and the same embedding times 1e155 give the same scores."""
    vecs = minilm_scorer.cache.embed(["Where is the Eiffel tower?", "The tower is in Paris.",
                                      "Bananas are yellow."]).astype(np.float64)
    plain = minilm_scorer.scores_from_vectors(vecs[0], vecs[1:])
    huge = minilm_scorer.scores_from_vectors(vecs[0] * 1e155, vecs[1:] * 1e155)
    np.testing.assert_allclose(huge, plain, atol=1e-6)


def test_a_zero_vector_is_still_refused(minilm_scorer: EmbeddingScorer) -> None:
    with pytest.raises(ValueError, match=r"snippet_vectors\[1\] is a zero vector"):
        minilm_scorer.scores_from_vectors(np.ones(4), [np.ones(4), np.zeros(4)])


def test_filter_endpoint_keeps_an_identical_vector_of_1e155(
        tmp_path: Path, xquad_en: list[Pair], embedding_cache_dir: Path) -> None:
    """Through a real server: the query's own vector times 1e155 as the snippet's vector
    scores 0 and is kept (was 1.0 and removed); a zero vector is a 422, never a 500."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from servers import serving

    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    artifact = ConformalFilter(scorer, alpha=0.2).calibrate(xquad_en[:100]).save(
        tmp_path / "f.json")
    qvec = scorer.cache.embed(["Where is the Eiffel tower?"])[0].astype(np.float64)
    huge = (qvec * 1e155).tolist()
    with serving(artifact, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        same = httpx.post(srv.url + "/filter", json={
            "query": "q", "query_vector": huge,
            "snippets": [{"snippet_id": "same", "vector": huge}]}, timeout=120)
        zero = httpx.post(srv.url + "/filter", json={
            "query": "q", "query_vector": huge,
            "snippets": [{"vector": [0.0] * len(huge)}]}, timeout=120)
    assert same.status_code == 200, same.text
    body = same.json()
    assert body["scores"][0] == pytest.approx(0.0, abs=1e-6)
    assert [k["snippet_id"] for k in body["kept"]] == ["same"]
    assert zero.status_code == 422, zero.text
    assert "zero vector" in zero.json()["detail"]
