"""LangChain and LlamaIndex components against a real calibrated filter artifact."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ragsieve import ConformalFilter, Pair

CAL_GROUPS = ("Warsaw", "Normans", "Computational_complexity_theory")
TEST_GROUP = "Nikola_Tesla"


@pytest.fixture(scope="module")
def filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path, embedding_cache_dir: Path) -> Path:
    """A filter calibrated on three XQuAD articles (paragraph context), saved to disk."""
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer

    pairs = load_xquad("en", data_dir=shared_data_dir, context="paragraph")
    cal = [p for p in pairs if p.group in CAL_GROUPS]
    flt = ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(cal)
    return flt.save(tmp_path_factory.mktemp("filter") / "filter.json")


@pytest.fixture(scope="module")
def flt(filter_path: Path, embedding_cache_dir: Path) -> ConformalFilter:
    return ConformalFilter.load(filter_path, scorer_options={"cache_dir": embedding_cache_dir})


@pytest.fixture(scope="module")
def queries(shared_data_dir: Path) -> list[tuple[str, list[Pair]]]:
    """Three held-out questions, each with every snippet of its article (about 15)."""
    from ragsieve.data import load_xquad

    pairs = load_xquad("en", data_dir=shared_data_dir)
    by_q: dict[str, list[Pair]] = {}
    for p in pairs:
        if p.group == TEST_GROUP:
            by_q.setdefault(p.query_id, []).append(p)
    return [(ps[0].query, ps) for ps in list(by_q.values())[:3]]


@pytest.fixture(scope="module")
def compressor(filter_path: Path, embedding_cache_dir: Path) -> Any:
    from ragsieve.integrations.langchain import ConformalCompressor

    return ConformalCompressor.from_file(filter_path, cache_dir=embedding_cache_dir)


@pytest.fixture(scope="module")
def postprocessor(filter_path: Path, embedding_cache_dir: Path) -> Any:
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    return ConformalPostprocessor.from_file(filter_path, cache_dir=embedding_cache_dir)


def _documents(ps: list[Pair]) -> list[Any]:
    from langchain_core.documents import Document

    return [
        Document(page_content=p.text, metadata={"sid": p.snippet_id, "tags": ["x"]}, id=p.snippet_id)
        for p in ps
    ]


def test_package_imports_without_frameworks() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('langchain_core', 'llama_index'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ragsieve.integrations\n"
        "for mod, extra in (('langchain', 'langchain'), ('llamaindex', 'llamaindex')):\n"
        "    try:\n"
        "        __import__('ragsieve.integrations.' + mod)\n"
        "    except ImportError as e:\n"
        "        assert f\"pip install 'ragsieve[{extra}]'\" in str(e), str(e)\n"
        "    else:\n"
        "        raise SystemExit('imported ' + mod)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_compressor_matches_filter_and_does_not_mutate(compressor: Any, flt: ConformalFilter,
                                                        queries: list[tuple[str, list[Pair]]]) -> None:
    n_kept = n_dropped = 0
    for query, ps in queries:
        docs = _documents(ps)
        before = copy.deepcopy(docs)
        out = compressor.compress_documents(docs, query)
        res = flt.filter(query, [p.text for p in ps])
        assert [d.page_content for d in out] == [k.text for k in res.kept]
        assert [d.metadata["sid"] for d in out] == [ps[k.index].snippet_id for k in res.kept]
        assert [d.id for d in out] == [ps[k.index].snippet_id for k in res.kept]
        for d, k in zip(out, res.kept, strict=True):
            assert d.metadata["ragsieve_score"] == pytest.approx(k.score)
            assert d.metadata["ragsieve_score"] <= d.metadata["ragsieve_threshold"]
            assert d.metadata["ragsieve_threshold"] == pytest.approx(res.threshold)
        assert docs == before  # caller's documents unchanged, metadata included
        assert all("ragsieve_score" not in d.metadata for d in docs)
        assert not any(o is d or o.metadata is d.metadata for o in out for d in docs)
        for d in out:
            d.metadata["tags"].append("y")
        assert docs == before  # metadata deep-copied: nested values not shared
        n_kept += len(out)
        n_dropped += len(ps) - len(out)
    assert n_kept > 0 and n_dropped > 0, "test data should exercise both keeping and dropping"


def test_compressor_empty_and_bad_input(compressor: Any) -> None:
    assert compressor.compress_documents([], "q") == []
    with pytest.raises(TypeError, match="Document"):
        compressor.compress_documents(["plain string"], "q")


def test_compressor_async(compressor: Any, queries: list[tuple[str, list[Pair]]]) -> None:
    query, ps = queries[0]
    sync = compressor.compress_documents(_documents(ps), query)
    got = asyncio.run(compressor.acompress_documents(_documents(ps), query))
    assert got == sync


def test_compressor_in_retriever_pipeline(compressor: Any, queries: list[tuple[str, list[Pair]]]) -> None:
    """LangChain's own ContextualCompressionRetriever (langchain-classic) with our compressor."""
    classic = pytest.importorskip("langchain_classic.retrievers")
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class ListRetriever(BaseRetriever):
        docs: list[Document]

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            return [d.model_copy(deep=True) for d in self.docs]

    # a held-out question on which the filter removes something
    query, ps = next((q, ps) for q, ps in queries
                     if 0 < len(compressor.compress_documents(_documents(ps), q)) < len(ps))
    docs = _documents(ps)
    retriever = classic.ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=ListRetriever(docs=docs)
    )
    got = retriever.invoke(query)
    expected = compressor.compress_documents(docs, query)
    assert got == expected and 0 < len(got) < len(docs)
    assert all("ragsieve_score" in d.metadata for d in got)
    assert asyncio.run(retriever.ainvoke(query)) == got
    assert docs == _documents(ps)  # the caller's documents are untouched


def test_postprocessor_matches_filter(postprocessor: Any, flt: ConformalFilter,
                                      queries: list[tuple[str, list[Pair]]]) -> None:
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

    for query, ps in queries:
        nodes = [
            NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id, metadata={"title": "T"}), score=1.0 - i / 100)
            for i, p in enumerate(ps)
        ]
        before = copy.deepcopy(nodes)
        out = postprocessor.postprocess_nodes(nodes, query_str=query)
        res = flt.filter(query, [p.text for p in ps])
        assert [n.node.node_id for n in out] == [ps[k.index].snippet_id for k in res.kept]
        assert [n.node.get_content() for n in out] == [k.text for k in res.kept]
        for n, k in zip(out, res.kept, strict=True):
            assert n.score == pytest.approx(1.0 - k.index / 100)  # retriever score untouched
            assert n.node.metadata["ragsieve_original_score"] == n.score
            assert n.node.metadata["ragsieve_score"] == pytest.approx(k.score)
            assert n.node.metadata["ragsieve_threshold"] == pytest.approx(res.threshold)
            assert n.node.metadata["title"] == "T"
            assert "ragsieve_score" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert [n.model_dump() for n in nodes] == [n.model_dump() for n in before]
        via_bundle = postprocessor.postprocess_nodes(nodes, query_bundle=QueryBundle(query))
        assert [n.node.node_id for n in via_bundle] == [n.node.node_id for n in out]
    assert postprocessor.postprocess_nodes([], query_str="q") == []


def test_postprocessor_async(postprocessor: Any, queries: list[tuple[str, list[Pair]]]) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    query, ps = queries[1]
    nodes = [NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id), score=0.5) for p in ps]
    sync = postprocessor.postprocess_nodes(nodes, query_str=query)
    got = asyncio.run(postprocessor.apostprocess_nodes(nodes, query_str=query))
    assert [n.node.node_id for n in got] == [n.node.node_id for n in sync]


def test_postprocessor_requires_query(postprocessor: Any) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    nodes = [NodeWithScore(node=TextNode(text="some text"), score=0.5)]
    with pytest.raises(ValueError, match="query_str="):
        postprocessor.postprocess_nodes(nodes)
