"""LangChain, LlamaIndex and Haystack components with a sentence-unit filter: they return
pruned documents, as context pruners do.

Each kept document's text becomes its kept sentences joined with ``" "`` (the filter's
``Scored.pruned_text``), its metadata holds the kept sentences' spans in the original text
(``ragsieve_spans``) and the original length (``ragsieve_original_length``); the caller's
documents are never changed. Real framework objects, a real sentence-in-context filter.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.integrations import ORIGINAL_LENGTH_KEY, SPANS_KEY


def _articles(xquad_en: list[Pair], first: int, last: int) -> list[Pair]:
    chosen = set(sorted({p.group for p in xquad_en})[first:last])
    return [p for p in xquad_en if p.group in chosen]


@pytest.fixture(scope="module")
def sentence_path(sentence_artifact: Path) -> Path:
    """The session's sentence-in-context filter (conftest ``sentence_artifact``: alpha 0.2,
    eight XQuAD-en articles)."""
    return sentence_artifact


@pytest.fixture(scope="module")
def flt(sentence_path: Path, embedding_cache_dir: Path) -> ConformalFilter:
    return ConformalFilter.load(sentence_path, scorer_options={"cache_dir": embedding_cache_dir})


@pytest.fixture(scope="module")
def questions(xquad_en: list[Pair]) -> list[tuple[str, list[Pair]]]:
    """Three held-out questions with every snippet of their article."""
    by_q: dict[str, list[Pair]] = {}
    for p in _articles(xquad_en, 8, 20):
        by_q.setdefault(p.query_id, []).append(p)
    return [(ps[0].query, ps) for ps in list(by_q.values())[::40][:3]]


def _check_pruned(flt: ConformalFilter, query: str, texts: list[str], got_texts: list[str],
                  got_meta: list[dict[str, Any]]) -> int:
    """``got`` is what the filter keeps of ``texts``, pruned; returns the characters pruned."""
    res = flt.filter(query, texts)
    assert 0 < len(res.kept) < len(texts)
    assert got_texts == [k.pruned_text for k in res.kept]
    for meta, k in zip(got_meta, res.kept, strict=True):
        assert meta[SPANS_KEY] == [list(span) for span in k.spans]
        assert meta[ORIGINAL_LENGTH_KEY] == len(texts[k.index])
        assert " ".join(texts[k.index][a:b] for a, b in meta[SPANS_KEY]) == k.pruned_text
    pruned = sum(len(texts[k.index]) for k in res.kept) - sum(map(len, got_texts))
    assert pruned >= 0
    return pruned


def test_langchain_compressor_returns_pruned_documents(sentence_path: Path, flt: ConformalFilter,  # type: ignore[no-untyped-def]
                                                       questions, embedding_cache_dir: Path) -> None:
    classic = pytest.importorskip("langchain_classic.retrievers")
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from ragsieve.integrations.langchain import ConformalCompressor

    class ListRetriever(BaseRetriever):
        docs: list[Document]

        def _get_relevant_documents(self, query: str, *,
                                    run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            return [d.model_copy(deep=True) for d in self.docs]

    compressor = ConformalCompressor.from_file(sentence_path, cache_dir=embedding_cache_dir)
    pruned = 0
    for query, ps in questions:
        docs = [Document(page_content=p.text, metadata={"sid": p.snippet_id}, id=p.snippet_id)
                for p in ps]
        before = copy.deepcopy(docs)
        got = classic.ContextualCompressionRetriever(
            base_compressor=compressor, base_retriever=ListRetriever(docs=docs)).invoke(query)
        pruned += _check_pruned(flt, query, [d.page_content for d in docs],
                                [d.page_content for d in got], [d.metadata for d in got])
        assert [d.metadata["sid"] for d in got] == [d.id for d in got]
        assert docs == before  # the caller's documents are untouched
    assert pruned > 0


def test_llamaindex_postprocessor_returns_pruned_nodes(sentence_path: Path, flt: ConformalFilter,  # type: ignore[no-untyped-def]
                                                       questions, embedding_cache_dir: Path) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    post = ConformalPostprocessor.from_file(sentence_path, cache_dir=embedding_cache_dir)
    pruned = 0
    for query, ps in questions:
        nodes = [NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id), score=0.5)
                 for p in ps]
        before = copy.deepcopy(nodes)
        got = post.postprocess_nodes(nodes, query_str=query)
        pruned += _check_pruned(flt, query, [p.text for p in ps],
                                [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in got],
                                [n.node.metadata for n in got])
        for n in got:  # the filter's keys never reach the LLM's view of the node
            assert SPANS_KEY not in n.node.get_content(metadata_mode=MetadataMode.LLM)
            assert ORIGINAL_LENGTH_KEY in n.node.excluded_llm_metadata_keys
        assert [n.node.get_content() for n in nodes] == [n.node.get_content() for n in before]
    assert pruned > 0


def test_haystack_ranker_returns_pruned_documents(sentence_path: Path, flt: ConformalFilter,  # type: ignore[no-untyped-def]
                                                  questions, embedding_cache_dir: Path) -> None:
    pytest.importorskip("haystack")
    from haystack import Document, Pipeline

    from ragsieve.integrations.haystack import ConformalRanker

    pruned = 0
    for query, ps in questions:
        pipe = Pipeline()
        pipe.add_component("ranker", ConformalRanker.from_file(sentence_path,
                                                               cache_dir=embedding_cache_dir))
        docs = [Document(id=p.snippet_id, content=p.text, meta={"a": 1}) for p in ps]
        out = pipe.run({"ranker": {"query": query, "documents": docs}})["ranker"]
        got = out["documents"]
        pruned += _check_pruned(flt, query, [d.content for d in docs], [d.content for d in got],
                                [d.meta for d in got])
        assert [d.id for d in got] == [ps[k.index].snippet_id
                                       for k in flt.filter(query, [p.text for p in ps]).kept]
        removed = out["removed"]  # removed documents keep their text, and carry no spans
        assert all(d.content == ps[[p.snippet_id for p in ps].index(d.id)].text for d in removed)
        assert all(SPANS_KEY not in d.meta for d in removed)
        assert [d.content for d in docs] == [p.text for p in ps]
    assert pruned > 0
