"""LangChain and LlamaIndex components against real calibrated filter artifacts.

Three artifacts: a marginal filter on the embedding score, a ``group``-mode filter whose
group is each document's ``metadata["language"]``, and a filter on an outside score
(``metadata["rerank"]``). The components must keep exactly what the filter keeps.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.errors import DataError

CAL_GROUPS = ("Warsaw", "Normans", "Computational_complexity_theory")
TEST_GROUP = "Nikola_Tesla"


@pytest.fixture(scope="module")
def filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
                embedding_cache_dir: Path) -> Path:
    """A filter calibrated on three XQuAD articles (paragraph context), saved to disk."""
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer

    pairs = load_xquad("en", data_dir=shared_data_dir, context="paragraph")
    cal = [p for p in pairs if p.group in CAL_GROUPS]
    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    flt = ConformalFilter(scorer, alpha=0.2).calibrate(cal)
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
        Document(page_content=p.text, metadata={"sid": p.snippet_id, "tags": ["x"]},
                 id=p.snippet_id)
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
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_compressor_matches_filter_and_does_not_mutate(
    compressor: Any, flt: ConformalFilter, queries: list[tuple[str, list[Pair]]]
) -> None:
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
            assert d.metadata["ragsieve_mode"] == "marginal"
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


def test_compressor_in_retriever_pipeline(compressor: Any,
                                          queries: list[tuple[str, list[Pair]]]) -> None:
    """LangChain's own ContextualCompressionRetriever (langchain-classic) with our compressor."""
    classic = pytest.importorskip("langchain_classic.retrievers")
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class ListRetriever(BaseRetriever):
        docs: list[Document]

        def _get_relevant_documents(self, query: str, *,
                                    run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
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
            NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id, metadata={"title": "T"}),
                          score=1.0 - i / 100)
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
            assert n.node.metadata["ragsieve_mode"] == "marginal"
            llm_text = n.node.get_content(metadata_mode=MetadataMode.LLM)
            assert "ragsieve_score" not in llm_text and "ragsieve_mode" not in llm_text
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


# ------------------------------------------------------------------ every mode through metadata

LANGUAGES = ("en", "de")


@pytest.fixture(scope="module")
def group_filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
                      embedding_cache_dir: Path) -> Path:
    """A group-mode filter, one threshold per ``language``, on English and German XQuAD."""
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer

    cal = [p for lang in LANGUAGES
           for p in load_xquad(lang, data_dir=shared_data_dir, context="paragraph")
           if p.group in CAL_GROUPS]
    flt = ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), "group", alpha=0.2)
    flt.calibrate(cal, group_by="language")
    return flt.save(tmp_path_factory.mktemp("group-filter") / "filter.json")


@pytest.fixture(scope="module")
def group_flt(group_filter_path: Path, embedding_cache_dir: Path) -> ConformalFilter:
    flt = ConformalFilter.load(group_filter_path, scorer_options={"cache_dir": embedding_cache_dir})
    assert (flt.mode, flt.group_by) == ("group", "language")
    return flt


@pytest.fixture(scope="module")
def bilingual_queries(shared_data_dir: Path) -> list[tuple[str, str, list[Pair]]]:
    """Four held-out questions per language: (language, query, every snippet of its article)."""
    from ragsieve.data import load_xquad

    out = []
    for lang in LANGUAGES:
        by_q: dict[str, list[Pair]] = {}
        for p in load_xquad(lang, data_dir=shared_data_dir):
            if p.group == TEST_GROUP:
                by_q.setdefault(p.query_id, []).append(p)
        out += [(lang, ps[0].query, ps) for ps in list(by_q.values())[:4]]
    return out


def test_compressor_group_mode_reads_the_group_from_metadata(
    group_filter_path: Path, group_flt: ConformalFilter, embedding_cache_dir: Path,
    bilingual_queries: list[tuple[str, str, list[Pair]]],
) -> None:
    from langchain_core.documents import Document

    from ragsieve.integrations.langchain import ConformalCompressor

    comp = ConformalCompressor.from_file(group_filter_path, cache_dir=embedding_cache_dir)
    taus = {lang: group_flt.calibrator.threshold_for(lang) for lang in LANGUAGES}
    assert taus["en"] != taus["de"]  # one threshold per language: the group matters
    n_kept = n_dropped = 0
    for lang, query, ps in bilingual_queries:
        # a decoy "group" key must not stand in for the filter's group field
        docs = [Document(page_content=p.text, metadata={"language": lang, "group": "xx"})
                for p in ps]
        out = comp.compress_documents(docs, query)
        res = group_flt.filter(query, [p.text for p in ps], group=lang)
        assert [d.page_content for d in out] == [k.text for k in res.kept]
        for d, k in zip(out, res.kept, strict=True):
            assert d.metadata["ragsieve_mode"] == "group"
            assert d.metadata["ragsieve_threshold"] == pytest.approx(taus[lang])
            assert d.metadata["ragsieve_score"] == pytest.approx(k.score)
            assert k.score <= taus[lang]
        n_kept += len(out)
        n_dropped += len(ps) - len(out)
    assert n_kept > 0 and n_dropped > 0
    # without its group field a document cannot be filtered by group: the filter says so
    lang, query, ps = bilingual_queries[0]
    for meta in ({}, {"group": lang}):
        docs = [Document(page_content=p.text, metadata=dict(meta)) for p in ps]
        with pytest.raises(DataError, match="'language'"):
            comp.compress_documents(docs, query)


def test_postprocessor_group_mode_reads_the_group_from_metadata(
    group_filter_path: Path, group_flt: ConformalFilter, embedding_cache_dir: Path,
    bilingual_queries: list[tuple[str, str, list[Pair]]],
) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    post = ConformalPostprocessor.from_file(group_filter_path, cache_dir=embedding_cache_dir)
    for lang, query, ps in bilingual_queries:
        nodes = [NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id,
                                             metadata={"language": lang}), score=0.5)
                 for p in ps]
        out = post.postprocess_nodes(nodes, query_str=query)
        res = group_flt.filter(query, [p.text for p in ps], group=lang)
        assert [n.node.node_id for n in out] == [ps[k.index].snippet_id for k in res.kept]
        assert all(n.node.metadata["ragsieve_mode"] == "group" for n in out)
        assert all(n.node.metadata["ragsieve_threshold"] == pytest.approx(res.threshold)
                   for n in out)
    nodes = [NodeWithScore(node=TextNode(text=p.text), score=0.5) for p in ps]
    with pytest.raises(DataError, match="'language'"):
        post.postprocess_nodes(nodes, query_str=query)


@pytest.fixture(scope="module")
def rerank_filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
                       embedding_cache_dir: Path) -> Path:
    """A filter on an outside score: ``meta["rerank"]`` (a cosine; higher is better)."""
    from ragsieve.data import load_xquad
    from ragsieve.scoring import EmbeddingScorer, FieldScorer

    pairs = load_xquad("en", data_dir=shared_data_dir, context="paragraph")
    cal = [p for p in pairs if p.group in CAL_GROUPS]
    cos = 1.0 - EmbeddingScorer(cache_dir=embedding_cache_dir).score_pairs(cal)
    cal = [dataclasses.replace(p, meta={**p.meta, "rerank": float(c)})
           for p, c in zip(cal, cos, strict=True)]
    flt = ConformalFilter(FieldScorer(field="rerank", higher_is_better=True), alpha=0.2)
    return flt.calibrate(cal).save(tmp_path_factory.mktemp("rerank-filter") / "filter.json")


def test_components_filter_on_an_outside_score_from_metadata(
    rerank_filter_path: Path, embedding_cache_dir: Path,
    queries: list[tuple[str, list[Pair]]],
) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor
    from ragsieve.scoring import EmbeddingScorer

    flt = ConformalFilter.load(rerank_filter_path)
    comp = ConformalCompressor.from_file(rerank_filter_path)
    post = ConformalPostprocessor.from_file(rerank_filter_path)
    embed = EmbeddingScorer(cache_dir=embedding_cache_dir)
    n_kept = n_dropped = 0
    for query, ps in queries:
        rerank = [float(c) for c in 1.0 - embed.score_batch(query, [p.text for p in ps])]
        res = flt.filter(query, [{"text": p.text, "rerank": r} for p, r in zip(ps, rerank)])
        metas = [{"rerank": r} for r in rerank]
        docs = [Document(page_content=p.text, metadata=m) for p, m in zip(ps, metas)]
        out = comp.compress_documents(docs, query)
        assert [d.page_content for d in out] == [k.text for k in res.kept]
        # "score" is the alias of the field name: the same documents kept
        aliased = [Document(page_content=p.text, metadata={"score": r}) for p, r in zip(ps, rerank)]
        assert [d.page_content for d in comp.compress_documents(aliased, query)] == \
            [d.page_content for d in out]
        for d, k in zip(out, res.kept, strict=True):  # in the score's own units: keep rerank >= t
            assert d.metadata["ragsieve_score"] == pytest.approx(rerank[k.index])
            assert d.metadata["ragsieve_threshold"] == pytest.approx(-res.threshold)
            assert d.metadata["ragsieve_keep_if"] == ">="
            assert d.metadata["ragsieve_score"] >= d.metadata["ragsieve_threshold"]
            assert d.metadata["ragsieve_mode"] == "marginal"
        nodes = [NodeWithScore(node=TextNode(text=p.text, id_=p.snippet_id, metadata=m),
                               score=0.5) for p, m in zip(ps, metas)]
        got = post.postprocess_nodes(nodes, query_str=query)
        assert [n.node.node_id for n in got] == [ps[k.index].snippet_id for k in res.kept]
        n_kept += len(out)
        n_dropped += len(ps) - len(out)
    assert n_kept > 0 and n_dropped > 0
    docs = [Document(page_content=p.text, metadata={"other": 0.9}) for p in ps]
    with pytest.raises(DataError, match="'rerank'"):
        comp.compress_documents(docs, query)
    # a decoy "score" (say, the retriever's) beside the field: refused, never one preferred
    decoy = [Document(page_content=p.text, metadata={"rerank": 0.5, "score": -1e9}) for p in ps]
    with pytest.raises(DataError, match=r"document 0 has both 'score' \(-1000000000.0\) and "
                                        r"'rerank' \(0.5\); they name the same outside score"):
        comp.compress_documents(decoy, query)
    nodes = [NodeWithScore(node=TextNode(text=d.page_content, metadata=d.metadata), score=0.5)
             for d in decoy]
    with pytest.raises(DataError, match="both 'score'"):
        post.postprocess_nodes(nodes, query_str=query)


def test_a_score_given_to_a_filter_that_reads_none_is_refused(
    compressor: Any, postprocessor: Any, queries: list[tuple[str, list[Pair]]]
) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    query, ps = queries[0]
    docs = [Document(page_content=p.text, metadata={"score": 0.8}) for p in ps]
    with pytest.raises(DataError, match=r"document 0 has 'score' \(0.8\), but this filter "
                                        r"scores 1 - cos and reads no outside score"):
        compressor.compress_documents(docs, query)
    nodes = [NodeWithScore(node=TextNode(text=p.text, metadata={"score": 0.8}), score=0.8)
             for p in ps]
    with pytest.raises(DataError, match="reads no outside score"):
        postprocessor.postprocess_nodes(nodes, query_str=query)


def test_empty_result_is_a_warning_with_the_reason_in_the_scores_units(
    filter_path: Path, embedding_cache_dir: Path, queries: list[tuple[str, list[Pair]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    query = "How long should sourdough bread dough proof before baking?"
    _, ps = queries[0]
    flt = ConformalFilter.load(filter_path, scorer_options={"cache_dir": embedding_cache_dir})
    res = flt.filter(query, [p.text for p in ps])
    assert not res.kept  # Tesla's biography holds no baking evidence
    best = min(res.scores)
    docs = [Document(page_content=p.text) for p in ps]
    nodes = [NodeWithScore(node=TextNode(text=p.text), score=1.0) for p in ps]
    comp = ConformalCompressor.from_file(filter_path, cache_dir=embedding_cache_dir)
    post = ConformalPostprocessor.from_file(filter_path, cache_dir=embedding_cache_dir)
    for name, run, kind in (("langchain", lambda: comp.compress_documents(docs, query), "documents"),
                            ("llamaindex", lambda: post.postprocess_nodes(nodes, query_str=query),
                             "nodes")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=f"ragsieve.integrations.{name}"):
            assert run() == []
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1, warned
        assert f"kept 0 of {len(ps)} {kind}" in warned[0]
        assert (f"every score is above the threshold (keep 1 - cos <= {res.threshold:.4g}; "
                f"the best is {best:.4g})") in warned[0]
    # min_keep keeps the best anyway and says so on the document
    comp1 = ConformalCompressor.from_file(filter_path, cache_dir=embedding_cache_dir, min_keep=1)
    out = comp1.compress_documents(docs, query)
    assert len(out) == 1 and out[0].metadata["ragsieve_score"] == pytest.approx(best)
    assert "kept the 1 best by min_keep=1, outside the calibrated guarantee" in \
        out[0].metadata["ragsieve_note"]


def test_components_cut_long_documents_and_report_spans(
    compressor: Any, postprocessor: Any, xquad_en: list[Pair]
) -> None:
    """A document longer than the window is scored piece by piece; kept spans are reported."""
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    evidence = next(p for p in xquad_en if p.group == "Super_Bowl_50" and p.relevant == 1)
    filler = " ".join(f"Recipe step {i}: stir the flour slowly until smooth." for i in range(70))
    long_doc = filler + " " + evidence.text
    docs = [Document(page_content=long_doc), Document(page_content="Gardening tools and seeds.")]
    out = compressor.compress_documents(docs, evidence.query)
    assert [d.page_content for d in out] == [long_doc]
    spans = out[0].metadata["ragsieve_spans"]
    assert any(a <= long_doc.index(evidence.text) + 50 < b for a, b in spans)
    nodes = [NodeWithScore(node=TextNode(text=d.page_content), score=1.0) for d in docs]
    got = postprocessor.postprocess_nodes(nodes, query_str=evidence.query)
    assert [n.node.get_content() for n in got] == [long_doc]
    assert got[0].node.metadata["ragsieve_spans"] == spans
