"""``score_source="native"``: each framework's own score, from a REAL BM25 retriever, as the
calibrated score; one outside-score name everywhere; empty results where users look.

The corpus is every XQuAD-en paragraph snippet (566); each framework's own BM25 retriever
(Haystack ``InMemoryBM25Retriever``, LlamaIndex ``BM25Retriever`` from
llama-index-retrievers-bm25, LangChain community ``BM25Retriever`` over rank-bm25 with
:func:`~ragsieve.integrations.langchain.bm25_relevance`) returns the top 10 for each
question. Components are calibrated on the questions of some articles and applied to
questions of the others: kept documents carry the native score and the threshold in BM25
units (``keep score >= t``), and relevant documents are kept.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # before haystack is imported

from ragsieve import ConformalFilter, Pair
from ragsieve.errors import DataError

TOP_K = 10
ALPHA = 0.2
N_CAL, N_TEST = 300, 60
OFF_TOPIC = "How long should sourdough bread dough proof before baking?"


@pytest.fixture(scope="module")
def corpus(xquad_en: list[Pair]) -> dict[str, str]:
    """Every XQuAD-en snippet: id -> text."""
    return {p.snippet_id: p.text for p in xquad_en}


Labelled = list[tuple[str, set[str]]]


def split_questions(pairs: list[Pair]) -> tuple[Labelled, Labelled]:
    """(calibration, test) questions with their relevant snippet ids: every fourth article
    (sorted by name) is held out for the test."""
    by_q: dict[str, tuple[str, str, set[str]]] = {}
    for p in pairs:
        entry = by_q.setdefault(p.query_id, (p.group, p.query, set()))
        if p.relevant:
            entry[2].add(p.snippet_id)
    held_out = set(sorted({g for g, _, _ in by_q.values()})[::4])
    cal = [(q, rel) for g, q, rel in by_q.values() if g not in held_out]
    test = [(q, rel) for g, q, rel in by_q.values() if g in held_out]
    return cal, test


@pytest.fixture(scope="module")
def questions(xquad_en: list[Pair]) -> tuple[Labelled, Labelled]:
    """A slice of the calibration and of the test questions (disjoint articles)."""
    cal, test = split_questions(xquad_en)
    return cal[:N_CAL], test[:N_TEST]


def _check_native(run: Callable[[str], tuple[list[Any], list[Any]]], threshold: float,
                  test: list[tuple[str, set[str]]], doc_id: Callable[[Any], str],
                  native: Callable[[Any], float], meta: Callable[[Any], dict[str, Any]]) -> None:
    """Over the test questions: kept documents carry the native score and the threshold in
    its units (kept >= t > removed); relevant retrieved documents are mostly kept."""
    n_relevant = n_relevant_kept = n_kept = n_retrieved = 0
    for query, relevant in test:
        retrieved, kept = run(query)
        scores = {doc_id(d): native(d) for d in retrieved}
        kept_ids = [doc_id(d) for d in kept]
        assert kept_ids == [doc_id(d) for d in retrieved if scores[doc_id(d)] >= threshold]
        for d in kept:
            m = meta(d)
            assert native(d) == pytest.approx(scores[doc_id(d)])  # never negated
            assert m["ragsieve_score"] == pytest.approx(scores[doc_id(d)])
            assert m["ragsieve_threshold"] == pytest.approx(threshold)
            assert m["ragsieve_keep_if"] == ">="
            assert m["ragsieve_score"] >= m["ragsieve_threshold"] > 0
        n_relevant += len(relevant & set(scores))
        n_relevant_kept += len(relevant & set(kept_ids))
        n_kept += len(kept)
        n_retrieved += len(retrieved)
    assert n_relevant >= 30
    assert n_relevant_kept / n_relevant >= 0.6  # alpha 0.2: about 0.8 of retrieved evidence
    assert n_kept < 0.6 * n_retrieved  # and most of the top 10 goes


# ----------------------------------------------------------------------------- Haystack
@pytest.fixture(scope="module")
def haystack_retriever(corpus: dict[str, str]) -> Any:
    from haystack import Document
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    store = InMemoryDocumentStore()
    store.write_documents([Document(id=i, content=t, meta={"kind": "xquad"})
                           for i, t in corpus.items()])
    return InMemoryBM25Retriever(document_store=store, top_k=TOP_K)


def test_haystack_native_bm25_end_to_end(haystack_retriever: Any, questions: Any,
                                         tmp_path: Path) -> None:
    from haystack import Pipeline

    from ragsieve.integrations.haystack import ConformalRanker

    cal, test = questions
    examples = [(q, haystack_retriever.run(query=q)["documents"], rel) for q, rel in cal]
    ranker = ConformalRanker.calibrate_native(examples, alpha=ALPHA)
    rule = ranker.filter.scorer.keep_rule(ranker.filter.threshold)
    assert (rule.score, rule.keep_if) == ("score", ">=") and rule.threshold > 0
    path = ranker.filter.save(tmp_path / "native.json")
    loaded = ConformalRanker.from_file(path, score_source="native")
    assert loaded.to_dict()["init_parameters"]["score_source"] == "native"

    pipe = Pipeline()
    pipe.add_component("retriever", haystack_retriever)
    pipe.add_component("ranker", loaded)
    pipe.connect("retriever.documents", "ranker.documents")

    def run(query: str) -> tuple[list[Any], list[Any]]:
        out = pipe.run({"retriever": {"query": query}, "ranker": {"query": query}},
                       include_outputs_from={"retriever"})
        ranked = out["ranker"]
        assert ranked["ragsieve"]["kept"] == len(ranked["documents"])
        assert ranked["ragsieve"]["removed"] == len(ranked["removed"])
        assert ranked["ragsieve"]["threshold"] == pytest.approx(rule.threshold)
        assert all(d.score < rule.threshold for d in ranked["removed"])
        return out["retriever"]["documents"], ranked["documents"]

    _check_native(run, rule.threshold, test, lambda d: d.id, lambda d: d.score,
                  lambda d: d.meta)
    # the pipeline file keeps score_source (Haystack 3 loads allowlisted modules only)
    allow = ({"allowed_modules": ["ragsieve.integrations.haystack"]}
             if "allowed_modules" in inspect.signature(Pipeline.loads).parameters else {})
    same = Pipeline.loads(pipe.dumps(), **allow)
    assert same.get_component("ranker").score_source == "native"


def test_haystack_empty_result_is_an_output_and_a_warning(
    haystack_retriever: Any, questions: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ragsieve.integrations.haystack import ConformalRanker

    cal, _ = questions
    examples = [(q, haystack_retriever.run(query=q)["documents"], rel) for q, rel in cal]
    ranker = ConformalRanker.calibrate_native(examples, alpha=ALPHA)
    tau = ranker.filter.scorer.keep_rule(ranker.filter.threshold).threshold
    docs = haystack_retriever.run(query=OFF_TOPIC)["documents"]
    assert docs and max(d.score for d in docs) < tau  # BM25 finds only weak matches
    with caplog.at_level(logging.WARNING, logger="ragsieve.integrations.haystack"):
        out = ranker.run(query=OFF_TOPIC, documents=docs)
    info = out["ragsieve"]
    assert out["documents"] == [] and info["kept"] == 0 and info["removed"] == len(docs)
    assert [d.id for d in out["removed"]] == [d.id for d in docs]
    assert [d.score for d in out["removed"]] == [d.score for d in docs]
    best = max(d.score for d in docs)
    assert "every score is below the threshold" in info["reason"]
    assert f"keep score >= {tau:.4g}" in info["reason"]
    assert f"the best is {best:.4g}" in info["reason"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and info["reason"] in warned[0].getMessage()
    # min_keep: the best is kept anyway, and says why
    fallback = ConformalRanker(filter=ConformalFilter.from_dict(ranker.filter.to_dict()),
                               score_source="native")
    fallback.filter.min_keep = 1
    got = fallback.run(query=OFF_TOPIC, documents=docs)
    assert [d.score for d in got["documents"]] == [best]
    assert "kept the 1 best by min_keep=1" in got["documents"][0].meta["ragsieve_note"]
    assert got["ragsieve"]["reason"] == got["documents"][0].meta["ragsieve_note"]


# ---------------------------------------------------------------------------- LlamaIndex
@pytest.fixture(scope="module")
def llama_retriever(corpus: dict[str, str]) -> Any:
    from llama_index.core.schema import TextNode
    from llama_index.retrievers.bm25 import BM25Retriever

    nodes = [TextNode(text=t, id_=i) for i, t in corpus.items()]
    return BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=TOP_K)


def test_llamaindex_native_bm25_end_to_end(llama_retriever: Any, questions: Any,
                                           caplog: pytest.LogCaptureFixture) -> None:
    from llama_index.core.schema import QueryBundle

    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    cal, test = questions
    examples = [(q, llama_retriever.retrieve(q), rel) for q, rel in cal]
    post = ConformalPostprocessor.calibrate_native(examples, alpha=ALPHA)
    again = ConformalPostprocessor.from_json(post.to_json())  # the artifact travels with it
    assert again.score_source == "native"
    threshold = again.filter.scorer.keep_rule(again.filter.threshold).threshold

    def run(query: str) -> tuple[list[Any], list[Any]]:
        retrieved = llama_retriever.retrieve(query)
        return retrieved, again.postprocess_nodes(retrieved, QueryBundle(query))

    _check_native(run, threshold, test, lambda n: n.node.node_id, lambda n: n.score,
                  lambda n: n.node.metadata)
    nodes = llama_retriever.retrieve(OFF_TOPIC)
    with caplog.at_level(logging.WARNING, logger="ragsieve.integrations.llamaindex"):
        assert again.postprocess_nodes(nodes, query_str=OFF_TOPIC) == []
    assert f"kept 0 of {len(nodes)} nodes" in caplog.text
    assert f"every score is below the threshold (keep score >= {threshold:.4g}" in caplog.text

    seen: list[tuple[list[Any], list[Any]]] = []  # the removed nodes, where a user can see them
    watched = ConformalPostprocessor(filter=again.filter, score_source="native",
                                     on_result=lambda kept, removed: seen.append((kept, removed)))
    retrieved = llama_retriever.retrieve(test[0][0])
    kept = watched.postprocess_nodes(retrieved, query_str=test[0][0])
    assert len(seen) == 1 and [n.node.node_id for n in seen[0][0]] == [n.node.node_id for n in kept]
    removed = seen[0][1]
    assert sorted(n.node.node_id for n in kept + removed) == sorted(n.node.node_id for n in retrieved)
    assert all(n.node.metadata["ragsieve_score"] == n.score < threshold for n in removed)
    assert "on_result" not in watched.to_json()


# ----------------------------------------------------------------------------- LangChain
@pytest.fixture(scope="module")
def langchain_retriever(corpus: dict[str, str]) -> Any:
    import rank_bm25  # noqa: F401  (the test extra: missing is a failure, not a skip)
    with warnings.catch_warnings():  # langchain-community's sunset notice
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.retrievers import BM25Retriever

    return BM25Retriever.from_texts(list(corpus.values()), ids=list(corpus), k=TOP_K)


def test_langchain_native_bm25_end_to_end(langchain_retriever: Any, questions: Any,
                                          tmp_path: Path) -> None:
    from ragsieve.integrations.langchain import ConformalCompressor, bm25_relevance

    def retrieve(query: str) -> list[Any]:
        return bm25_relevance(langchain_retriever, query, langchain_retriever.invoke(query))

    cal, test = questions
    first = retrieve(cal[0][0])
    scores = [d.metadata["relevance_score"] for d in first]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0  # the retriever's order
    comp = ConformalCompressor.calibrate_native([(q, retrieve(q), rel) for q, rel in cal],
                                                alpha=ALPHA)
    rule = comp.filter.scorer.keep_rule(comp.filter.threshold)
    assert str(rule).startswith("keep relevance_score >= ")
    loaded = ConformalCompressor.from_file(comp.filter.save(tmp_path / "lc.json"),
                                           score_source="native")

    def run(query: str) -> tuple[list[Any], list[Any]]:
        retrieved = retrieve(query)
        return retrieved, loaded.compress_documents(retrieved, query)

    _check_native(run, rule.threshold, test, lambda d: d.id,
                  lambda d: d.metadata["relevance_score"], lambda d: d.metadata)
    with pytest.raises(ValueError, match="not one of the retriever's documents"):
        bm25_relevance(langchain_retriever, "q", [first[0]])

    seen: list[tuple[list[Any], list[Any]]] = []  # the removed documents, where a user can see them
    watched = ConformalCompressor(filter=loaded.filter, score_source="native",
                                  on_result=lambda kept, removed: seen.append((kept, removed)))
    retrieved = retrieve(test[0][0])
    kept = watched.compress_documents(retrieved, test[0][0])
    assert len(seen) == 1 and [d.id for d in seen[0][0]] == [d.id for d in kept]
    removed = seen[0][1]
    assert sorted(d.id for d in kept + removed) == sorted(d.id for d in retrieved)
    assert all(d.metadata["ragsieve_score"] == d.metadata["relevance_score"] < rule.threshold
               and d.metadata["ragsieve_threshold"] == rule.threshold for d in removed)


# --------------------------------------------------------------- one name, clear errors
def test_native_needs_a_filter_on_a_higher_is_better_outside_score(
    haystack_retriever: Any, questions: Any, served_artifact: Any
) -> None:
    from haystack import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.calibration import SplitConformalCalibrator
    from ragsieve.integrations.haystack import ConformalRanker
    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor
    from ragsieve.scoring import FieldScorer

    # the embedding score (1 - cos) and a lower-is-better outside score: both kept when low
    path = served_artifact(SplitConformalCalibrator(alpha=0.2))
    cal, _ = questions
    examples = [(q, haystack_retriever.run(query=q)["documents"], rel) for q, rel in cal[:40]]
    low = ConformalFilter(FieldScorer("rank"), alpha=0.5).calibrate(
        [dataclasses.replace(p, meta={"rank": -p.meta["score"]})
         for p in ConformalRanker.native_pairs(examples)])
    for make in (ConformalRanker.from_file, ConformalCompressor.from_file,
                 ConformalPostprocessor.from_file):
        with pytest.raises(ValueError, match=r"score_source='native' filters on .*keeps "
                                             r"1 - cos <= tau"):
            make(path, score_source="native")
        with pytest.raises(ValueError, match=r"keeps rank <= tau"):
            make.__self__(filter=low, score_source="native")
        with pytest.raises(ValueError, match=r"score_source == 'bm25', must be one of"):
            make(path, score_source="bm25")
    ranker = ConformalRanker.calibrate_native(examples, alpha=0.5)
    with pytest.raises(DataError, match=r"document 1 has no score \(Document.score is None\)"):
        ranker.run(query="q", documents=[Document(content="a", score=1.0),
                                         Document(content="b")])
    with pytest.raises(DataError, match=r"'score' \(2.0\) in its metadata and Document.score "
                                        r"1.0"):
        ranker.run(query="q", documents=[Document(content="a", score=1.0, meta={"score": 2.0})])
    post = ConformalPostprocessor(filter=ranker.filter, score_source="native")
    with pytest.raises(DataError, match=r"NodeWithScore.score is None"):
        post.postprocess_nodes([NodeWithScore(node=TextNode(text="a"))], query_str="q")
    with pytest.raises(DataError, match=r"examples\[0\] documents\[0\] has no native score"):
        ConformalRanker.native_pairs([("q", [Document(content="a")], [])])
    with pytest.raises(TypeError, match=r"relevant_ids is 'doc-1'"):
        ConformalRanker.native_pairs([("q", [Document(content="a", score=1.0)], "doc-1")])


def test_one_field_name_in_every_framework(haystack_retriever: Any, questions: Any) -> None:
    """A filter calibrated on ``bm25`` reads ``bm25`` (or ``score``) from every framework's
    metadata, and the framework's native score with ``score_source="native"``."""
    from haystack import Document
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.haystack import ConformalRanker
    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor
    from ragsieve.scoring import FieldScorer

    cal, test = questions
    examples = [(q, haystack_retriever.run(query=q)["documents"], rel) for q, rel in cal]
    pairs = ConformalRanker.native_pairs(examples, field="bm25")
    assert {p.meta["bm25"] for p in pairs[:10]} == {d.score for d in examples[0][1]}
    flt = ConformalFilter(FieldScorer("bm25", higher_is_better=True), alpha=ALPHA).calibrate(pairs)
    tau = flt.scorer_.keep_rule(flt.threshold).threshold
    query = test[0][0]
    docs = haystack_retriever.run(query=query)["documents"]
    expect = [d.id for d in docs if d.score >= tau]
    by_meta = [Document(id=d.id, content=d.content, meta={"bm25": d.score}) for d in docs]
    by_alias = [Document(id=d.id, content=d.content, meta={"score": d.score}) for d in docs]
    hay = ConformalRanker(filter=flt)
    assert [d.id for d in hay.run(query=query, documents=by_meta)["documents"]] == expect
    assert [d.id for d in hay.run(query=query, documents=by_alias)["documents"]] == expect
    native = ConformalRanker(filter=flt, score_source="native")
    assert [d.id for d in native.run(query=query, documents=docs)["documents"]] == expect
    lc = ConformalCompressor(filter=flt)
    lc_docs = [LCDocument(page_content=d.content, metadata={"bm25": d.score}, id=d.id)
               for d in docs]
    assert [d.id for d in lc.compress_documents(lc_docs, query)] == expect
    li = ConformalPostprocessor(filter=flt)
    nodes = [NodeWithScore(node=TextNode(text=d.content, id_=d.id, metadata={"bm25": d.score}),
                           score=0.0) for d in docs]
    assert [n.node.node_id for n in li.postprocess_nodes(nodes, query_str=query)] == expect
    li_native = ConformalPostprocessor(filter=flt, score_source="native")
    nodes = [NodeWithScore(node=TextNode(text=d.content, id_=d.id), score=d.score) for d in docs]
    assert [n.node.node_id for n in li_native.postprocess_nodes(nodes, query_str=query)] == expect
    # both names with different values: refused, never one silently preferred
    clash = [LCDocument(page_content="a", metadata={"bm25": 3.0, "score": 4.0})]
    with pytest.raises(DataError, match=r"document 0 has both 'score' \(4.0\) and 'bm25' "
                                        r"\(3.0\); they name the same outside score"):
        lc.compress_documents(clash, query)


# ------------------------------------------------------------ the figures in the docs
def measure() -> None:
    """``python tests/test_native_scores.py``: every question of the split, each framework's
    BM25 retriever and native score (the table of docs/integrations.md)."""
    from haystack import Document
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from langchain_community.retrievers import BM25Retriever as LangChainBM25
    from llama_index.core.schema import TextNode
    from llama_index.retrievers.bm25 import BM25Retriever as LlamaBM25

    from ragsieve.data import data_dir, load_xquad
    from ragsieve.integrations.haystack import ConformalRanker
    from ragsieve.integrations.langchain import ConformalCompressor, bm25_relevance
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    logging.disable(logging.WARNING)  # one empty-result line per question otherwise
    pairs = load_xquad("en", data_dir=data_dir())
    corpus = {p.snippet_id: p.text for p in pairs}
    cal, test = split_questions(pairs)
    print(f"{len(corpus)} snippets; calibration {len(cal)} questions, test {len(test)}")
    store = InMemoryDocumentStore()
    store.write_documents([Document(id=i, content=t) for i, t in corpus.items()])
    hay = InMemoryBM25Retriever(document_store=store, top_k=TOP_K)
    llama = LlamaBM25.from_defaults(nodes=[TextNode(text=t, id_=i) for i, t in corpus.items()],
                                    similarity_top_k=TOP_K)
    lc = LangChainBM25.from_texts(list(corpus.values()), ids=list(corpus), k=TOP_K)
    runs: list[tuple[str, Any, Any, Any, Any]] = [
        ("haystack", lambda q: hay.run(query=q)["documents"], ConformalRanker,
         lambda c, q, d: c.run(query=q, documents=d)["documents"], lambda d: d.id),
        ("llamaindex", llama.retrieve, ConformalPostprocessor,
         lambda c, q, d: c.postprocess_nodes(d, query_str=q), lambda n: n.node.node_id),
        ("langchain", lambda q: bm25_relevance(lc, q, lc.invoke(q)), ConformalCompressor,
         lambda c, q, d: c.compress_documents(d, q), lambda d: d.id),
    ]
    for name, retrieve, cls, run, doc_id in runs:
        comp = cls.calibrate_native([(q, retrieve(q), rel) for q, rel in cal], alpha=ALPHA)
        n_rel = n_rel_kept = n_kept = n_got = n_empty = 0
        for query, relevant in test:
            docs = retrieve(query)
            kept = {doc_id(d) for d in run(comp, query, docs)}
            n_rel += len(relevant & {doc_id(d) for d in docs})
            n_rel_kept += len(relevant & kept)
            n_kept, n_got, n_empty = n_kept + len(kept), n_got + len(docs), n_empty + (not kept)
        print(f"{name}: {comp.filter.scorer.keep_rule(comp.filter.threshold)}; retrieved "
              f"evidence kept {n_rel_kept}/{n_rel} = {n_rel_kept / n_rel:.3f}; removed "
              f"{1 - n_kept / n_got:.3f} of the top {TOP_K}; empty {n_empty}/{len(test)}")


if __name__ == "__main__":
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's notice
    measure()
