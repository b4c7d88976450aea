"""The real clients of the rerank API, pointed at a real ``ragsieve serve`` on 127.0.0.1:
the ``cohere`` SDK (``ClientV2`` and ``Client`` with ``base_url``), LangChain's
``CohereRerank`` in a ``ContextualCompressionRetriever``, LlamaIndex's ``CohereRerank``
postprocessor and Haystack's ``CohereRanker``, each compared with ``POST /filter`` on the
same held-out lists (the snippets docs/rerank.md shows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
cohere = pytest.importorskip("cohere")

from servers import ThreadServer

from ragsieve import Pair
from ragsieve.calibration import make_calibrator
from ragsieve.server import create_app

API_KEY = "client-key"
ALPHA = 0.2
MODEL = "ragsieve"


@pytest.fixture(scope="module")
def url(served_artifact: Any, embedding_cache_dir: Path) -> Iterator[str]:
    app = create_app(served_artifact(make_calibrator("marginal", alpha=ALPHA)),
                     api_key=API_KEY, scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def lists(xquad_en: list[Pair]) -> list[tuple[str, list[str]]]:
    """Held-out lists of ten: a query's passage among others (past the calibration pairs)."""
    pool = xquad_en[500:]
    out = []
    for i in range(4):
        head = pool[i * 41]
        out.append((head.query, [head.text, *[p.text for p in pool[i * 41 + 3: i * 41 + 48: 5]]]))
    return out


def _kept(url: str, query: str, docs: list[str]) -> list[tuple[int, float]]:
    """``/filter``'s kept documents, most relevant first, with their p-values."""
    body = httpx.post(url + "/filter", json={"query": query, "snippets": docs},
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60).json()
    kept = sorted((s["index"] for s in body["kept"]),
                  key=lambda i: (-body["p_values"][i], body["scores"][i], i))
    return [(i, body["p_values"][i]) for i in kept]


def test_cohere_client_v2_and_v1_get_exactly_the_kept_documents(
        url: str, lists: list[tuple[str, list[str]]]) -> None:
    v2 = cohere.ClientV2(api_key=API_KEY, base_url=url)
    v1 = cohere.Client(api_key=API_KEY, base_url=url)
    seen_removal = False
    for query, docs in lists:
        expected = _kept(url, query, docs)
        for client in (v2, v1):
            res = client.rerank(model=MODEL, query=query, documents=docs)
            got = [(r.index, r.relevance_score) for r in res.results]
            assert [i for i, _ in got] == [i for i, _ in expected]
            assert [s for _, s in got] == pytest.approx([s for _, s in expected])
            assert all(ALPHA < s <= 1.0 for _, s in got)
        seen_removal |= len(expected) < len(docs)
        if len(expected) >= 2:
            capped = v2.rerank(model=MODEL, query=query, documents=docs, top_n=1)
            assert [r.index for r in capped.results] == [expected[0][0]]
    assert seen_removal


def test_cohere_sdk_everything_ranked_under_all_and_a_wrong_key_is_401(
        url: str, lists: list[tuple[str, list[str]]]) -> None:
    query, docs = lists[0]
    res = cohere.ClientV2(api_key=API_KEY, base_url=url + "/all").rerank(
        model=MODEL, query=query, documents=docs)
    assert sorted(r.index for r in res.results) == list(range(len(docs)))
    with pytest.raises(cohere.core.ApiError) as err:
        cohere.ClientV2(api_key="wrong", base_url=url).rerank(model=MODEL, query=query,
                                                              documents=docs)
    assert err.value.status_code == 401


def test_langchain_cohere_rerank_in_a_compression_retriever(
        url: str, lists: list[tuple[str, list[str]]]) -> None:
    pytest.importorskip("langchain_cohere")
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_cohere import CohereRerank
    from langchain_community.retrievers import BM25Retriever

    for query, docs in lists[:2]:
        retriever = BM25Retriever.from_texts(docs, k=len(docs))
        listed = [d.page_content for d in retriever.invoke(query)]  # the retriever's order
        compressor = CohereRerank(model=MODEL, cohere_api_key=API_KEY, base_url=url, top_n=None)
        pipeline = ContextualCompressionRetriever(base_compressor=compressor,
                                                  base_retriever=retriever)
        got = pipeline.invoke(query)
        expected = _kept(url, query, listed)
        assert [d.page_content for d in got] == [listed[i] for i, _ in expected]
        assert [d.metadata["relevance_score"] for d in got] == pytest.approx(
            [s for _, s in expected])


def test_llamaindex_cohere_rerank_postprocessor(url: str,
                                                lists: list[tuple[str, list[str]]]) -> None:
    pytest.importorskip("llama_index.postprocessor.cohere_rerank")
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    query, docs = lists[1]
    nodes = [NodeWithScore(node=TextNode(text=d, id_=f"n{i}"), score=0.0)
             for i, d in enumerate(docs)]
    post = CohereRerank(api_key=API_KEY, base_url=url, model=MODEL, top_n=len(docs))
    got = post.postprocess_nodes(nodes, query_str=query)
    expected = _kept(url, query, docs)
    assert [n.node.get_content() for n in got] == [docs[i] for i, _ in expected]
    assert [n.score for n in got] == pytest.approx([s for _, s in expected])


def test_haystack_cohere_ranker(url: str, lists: list[tuple[str, list[str]]]) -> None:
    pytest.importorskip("haystack_integrations.components.rankers.cohere")
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.rankers.cohere import CohereRanker

    query, docs = lists[2]
    ranker = CohereRanker(model=MODEL, api_key=Secret.from_token(API_KEY), api_base_url=url,
                          top_k=len(docs))
    got = ranker.run(query=query, documents=[Document(content=d) for d in docs])["documents"]
    expected = _kept(url, query, docs)
    assert [d.content for d in got] == [docs[i] for i, _ in expected]
    assert [d.score for d in got] == pytest.approx([s for _, s in expected])
