"""Haystack ``ConformalRanker`` inside real ``haystack.Pipeline`` runs, on real filter artifacts.

A marginal filter calibrated with the real MiniLM model on three XQuAD-en articles, and a
filter on an outside score (``meta["rerank"]``); the documents come from an
``InMemoryDocumentStore`` (three held-out articles) through an ``InMemoryBM25Retriever``. The ranker must keep
exactly what ``ConformalFilter.filter`` keeps for the same query and texts.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# conftest.py sets this too; repeated so that the module never imports haystack with it on
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

haystack = pytest.importorskip(
    "haystack", reason="needs Haystack: pip install 'ragsieve[haystack]'")

from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.core.errors import DeserializationError, SerializationError
from haystack.document_stores.in_memory import InMemoryDocumentStore

from ragsieve import ConformalFilter, Pair
from ragsieve.errors import ArtifactError, DataError
from ragsieve.integrations.haystack import ConformalRanker

CAL_GROUPS = ("Warsaw", "Normans", "Computational_complexity_theory")
TEST_GROUPS = ("Nikola_Tesla", "Rhine", "Oxygen")
MODULE = "ragsieve.integrations.haystack"
TOL = 1e-9
#: Haystack 3 deserialises only classes from allowlisted modules; 2.x has no allowlist
ALLOWLIST = "allowed_modules" in inspect.signature(Pipeline.loads).parameters


def _load_kwargs() -> dict[str, Any]:
    return {"allowed_modules": [MODULE]} if ALLOWLIST else {}


@pytest.fixture(scope="module")
def filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
                minilm_scorer: Any) -> Path:
    """A marginal filter (alpha 0.2) calibrated on three XQuAD-en articles, saved to disk."""
    from ragsieve.data import load_xquad

    pairs = load_xquad("en", data_dir=shared_data_dir, context="paragraph")
    cal = [p for p in pairs if p.group in CAL_GROUPS]
    flt = ConformalFilter(minilm_scorer, alpha=0.2).calibrate(cal)
    return flt.save(tmp_path_factory.mktemp("filter") / "filter.json")


@pytest.fixture(scope="module")
def flt(filter_path: Path, embedding_cache_dir: Path) -> ConformalFilter:
    return ConformalFilter.load(filter_path, scorer_options={"cache_dir": embedding_cache_dir})


@pytest.fixture(scope="module")
def ranker(filter_path: Path, embedding_cache_dir: Path) -> ConformalRanker:
    return ConformalRanker.from_file(filter_path, cache_dir=embedding_cache_dir)


@pytest.fixture(scope="module")
def make_ranker(filter_path: Path, embedding_cache_dir: Path) -> Any:
    """A new ranker on the same artifact (a component belongs to one pipeline)."""
    return lambda: ConformalRanker.from_file(filter_path, cache_dir=embedding_cache_dir)


@pytest.fixture(scope="module")
def held_out(xquad_en: list[Pair]) -> tuple[list[Document], list[str]]:
    """Three held-out articles' snippets as Documents, and two questions on each."""
    docs: dict[str, Document] = {}
    questions: dict[str, dict[str, str]] = {}
    for p in xquad_en:
        if p.group in TEST_GROUPS:
            docs.setdefault(p.snippet_id, Document(
                id=p.snippet_id, content=p.text, meta={"article": p.group, "tags": ["x"]}))
            questions.setdefault(p.group, {}).setdefault(p.query_id, p.query)
    return list(docs.values()), [q for g in TEST_GROUPS for q in list(questions[g].values())[:2]]


def _pipeline(ranker: ConformalRanker, docs: list[Document], top_k: int = 8) -> Pipeline:
    store = InMemoryDocumentStore()
    store.write_documents(docs)
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=top_k))
    pipe.add_component("ranker", ranker)
    pipe.connect("retriever.documents", "ranker.documents")
    return pipe


def _run(pipe: Pipeline, query: str) -> tuple[list[Document], list[Document]]:
    out = pipe.run({"retriever": {"query": query}, "ranker": {"query": query}},
                   include_outputs_from={"retriever"})
    return out["retriever"]["documents"], out["ranker"]["documents"]


def _check_matches_filter(flt: ConformalFilter, query: str, given: list[Document],
                          got: list[Document]) -> int:
    """``got`` is what ``flt.filter`` keeps of ``given``'s texts; returns how many."""
    res = flt.filter(query, [d.content for d in given])
    assert [d.id for d in got] == [given[k.index].id for k in res.kept]
    assert [d.content for d in got] == [k.text for k in res.kept]
    for d, k in zip(got, res.kept, strict=True):
        src = given[k.index]
        assert abs(d.meta["ragsieve_score"] - k.score) <= TOL
        # a higher-is-better relevance: the conformal p-value, kept exactly when > alpha
        assert d.score == d.meta["ragsieve_p_value"] == k.p_value
        assert d.score > flt.alpha
        assert abs(d.meta["ragsieve_threshold"] - res.threshold) <= TOL
        assert d.meta["ragsieve_score"] <= d.meta["ragsieve_threshold"]
        assert d.meta["ragsieve_mode"] == "marginal"
        assert d.meta["ragsieve_original_score"] == src.score
        assert {k: v for k, v in d.meta.items() if not k.startswith("ragsieve_")} == src.meta
    return len(res.kept)


def test_telemetry_is_off() -> None:
    from haystack.telemetry import _telemetry

    assert _telemetry.telemetry is None


def test_ranker_in_pipeline_keeps_what_the_filter_keeps(
    make_ranker: Any, flt: ConformalFilter, held_out: tuple[list[Document], list[str]]
) -> None:
    docs, questions = held_out
    pipe = _pipeline(make_ranker(), docs)
    n_kept = n_dropped = 0
    for query in questions:
        retrieved, got = _run(pipe, query)
        assert len(retrieved) == 8 and all(d.score is not None for d in retrieved)
        kept = _check_matches_filter(flt, query, retrieved, got)
        n_kept += kept
        n_dropped += len(retrieved) - kept
    assert n_kept > 0 and n_dropped > 0, "test data should exercise both keeping and dropping"


def test_run_does_not_mutate_and_keeps_input_order(
    ranker: ConformalRanker, flt: ConformalFilter, held_out: tuple[list[Document], list[str]]
) -> None:
    docs, questions = held_out
    given = list(reversed(docs[:12]))  # not in retrieval order: the output follows the input
    before = copy.deepcopy(given)
    out = ranker.run(query=questions[0], documents=given)["documents"]
    assert 0 < _check_matches_filter(flt, questions[0], given, out)
    assert given == before
    assert all("ragsieve_score" not in d.meta for d in given)
    assert not any(o is d or o.meta is d.meta for o in out for d in given)
    for d in out:
        d.meta["tags"].append("y")  # nested metadata is copied, not shared
    assert given == before


def test_empty_inputs(ranker: ConformalRanker, make_ranker: Any, held_out: tuple[list[Document], list[str]]) -> None:
    out = ranker.run(query="anything", documents=[])
    assert out["documents"] == [] and out["removed"] == []
    assert out["ragsieve"] == {"kept": 0, "removed": 0, "dropped": 0, "score": "1 - cos",
                               "keep_if": "<=", "threshold": ranker.filter.threshold,
                               "mode": "marginal", "reason": None}
    # a pipeline whose retriever finds nothing: an empty store
    _, got = _run(_pipeline(make_ranker(), []), held_out[1][0])
    assert got == []


def test_documents_without_text_are_dropped_and_logged(
    ranker: ConformalRanker, flt: ConformalFilter, held_out: tuple[list[Document], list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from haystack.dataclasses import ByteStream

    docs, questions = held_out
    texts = docs[:10]
    blank = [Document(id="image", blob=ByteStream(b"\x89PNG", mime_type="image/png")),
             Document(id="empty", content=""), Document(id="spaces", content="  \n ")]
    mixed = [blank[0], *texts[:5], blank[1], *texts[5:], blank[2]]
    with caplog.at_level(logging.WARNING, logger="ragsieve.integrations.haystack"):
        out = ranker.run(query=questions[1], documents=mixed)["documents"]
    assert 0 < _check_matches_filter(flt, questions[1], texts, out)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert f"dropped 3 of {len(mixed)} documents without text" in warned[0]
    assert all(i in warned[0] for i in ("image", "empty", "spaces"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragsieve.integrations.haystack"):
        out = ranker.run(query=questions[1], documents=blank)
    assert out["documents"] == [] and out["ragsieve"]["dropped"] == 3
    assert "dropped 3 of 3" in caplog.text


def test_long_document_is_cut_and_spans_reported(ranker: ConformalRanker,
                                                 xquad_en: list[Pair]) -> None:
    evidence = next(p for p in xquad_en if p.group == "Super_Bowl_50" and p.relevant == 1)
    filler = " ".join(f"Recipe step {i}: stir the flour slowly until smooth." for i in range(70))
    long_doc = Document(content=filler + " " + evidence.text)
    out = ranker.run(query=evidence.query,
                     documents=[long_doc, Document(content="Gardening tools and seeds.")])
    assert [d.id for d in out["documents"]] == [long_doc.id]
    spans = out["documents"][0].meta["ragsieve_spans"]
    at = long_doc.content.index(evidence.text) + 50
    assert any(a <= at < b for a, b in spans)


def test_run_async_matches_run(ranker: ConformalRanker, make_ranker: Any,
                               held_out: tuple[list[Document], list[str]]) -> None:
    docs, questions = held_out
    sync = ranker.run(query=questions[2], documents=docs[:10])
    assert asyncio.run(ranker.run_async(query=questions[2], documents=docs[:10])) == sync
    pipe = _pipeline(make_ranker(), docs)
    if hasattr(pipe, "run_async"):
        data = {"retriever": {"query": questions[2]}, "ranker": {"query": questions[2]}}
        assert asyncio.run(pipe.run_async(data)) == pipe.run(data)


# ------------------------------------------------------------------------- serialisation


def test_pipeline_yaml_round_trip(make_ranker: Any, filter_path: Path,
                                  embedding_cache_dir: Path,
                                  held_out: tuple[list[Document], list[str]]) -> None:
    docs, questions = held_out
    ranker = make_ranker()
    pipe = _pipeline(ranker, docs)
    data = ranker.to_dict()
    assert data == {"type": f"{MODULE}.ConformalRanker",
                    "init_parameters": {"path": str(filter_path),
                                        "scorer_options": {"cache_dir": str(embedding_cache_dir)}}}
    text = pipe.dumps()
    assert str(filter_path) in text and f"{MODULE}.ConformalRanker" in text
    loaded = Pipeline.loads(text, **_load_kwargs())
    assert loaded.to_dict() == pipe.to_dict()
    again = loaded.get_component("ranker")
    assert isinstance(again, ConformalRanker) and again is not ranker
    assert again.filter.threshold == ranker.filter.threshold
    for query in questions[:3]:
        assert _run(loaded, query) == _run(pipe, query)
    # the dict form too (Pipeline.to_dict / from_dict)
    from_dict = Pipeline.from_dict(pipe.to_dict(), **_load_kwargs())
    assert _run(from_dict, questions[0]) == _run(pipe, questions[0])


@pytest.mark.skipif(not ALLOWLIST, reason="Haystack 2.x has no deserialisation allowlist")
def test_pipeline_load_needs_the_module_on_haystacks_allowlist(
    make_ranker: Any, held_out: tuple[list[Document], list[str]]
) -> None:
    text = _pipeline(make_ranker(), held_out[0]).dumps()
    with pytest.raises(DeserializationError, match=MODULE.replace(".", r"\.")):
        Pipeline.loads(text)


def test_serialisation_errors(flt: ConformalFilter, filter_path: Path, tmp_path: Path) -> None:
    in_memory = ConformalRanker(filter=flt)
    with pytest.raises(SerializationError, match=r"from_file\('filter.json'\)"):
        in_memory.to_dict()
    pipe = Pipeline()
    pipe.add_component("ranker", in_memory)
    with pytest.raises(SerializationError, match="in-memory filter"):
        pipe.dumps()
    # a pipeline file whose artifact has gone: the load fails and names the path
    moved = tmp_path / "moved.json"
    moved.write_bytes(filter_path.read_bytes())
    text = _pipeline(ConformalRanker.from_file(moved), []).dumps()
    moved.unlink()
    with pytest.raises(DeserializationError, match=str(moved)):
        Pipeline.loads(text, **_load_kwargs())


# ------------------------------------------------------------------------------ errors


def test_bad_artifact_path_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-filter.json"
    with pytest.raises(ArtifactError) as info:
        ConformalRanker.from_file(missing)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello", encoding="utf-8")
    with pytest.raises(ArtifactError, match="is not valid JSON") as info:
        ConformalRanker(not_json)
    assert str(not_json) in str(info.value)
    other = tmp_path / "other.json"
    other.write_text('{"format": "something-else"}', encoding="utf-8")
    with pytest.raises(ArtifactError, match="not a ragsieve filter artifact"):
        ConformalRanker.from_file(other)


def test_constructor_errors(flt: ConformalFilter, filter_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of path .* got neither"):
        ConformalRanker()
    with pytest.raises(ValueError, match="got both"):
        ConformalRanker(filter_path, filter=flt)
    with pytest.raises(TypeError, match="filter must be a ragsieve.ConformalFilter .*, got dict"):
        ConformalRanker(filter={"threshold": 0.5})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"path must be a path \(str or os.PathLike\) .*, got int \(42\)"):
        ConformalRanker(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scorer_options must be a mapping of keyword arguments or None, got list"):
        ConformalRanker(filter_path, scorer_options=["cache_dir"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scorer_options apply when loading from path"):
        ConformalRanker(filter=flt, scorer_options={"cache_dir": "x"})


def test_run_rejects_wrong_input_types(ranker: ConformalRanker) -> None:
    doc = Document(content="Tesla was born in Smiljan.")
    with pytest.raises(TypeError, match="query must be a str, got int"):
        ranker.run(query=3, documents=[doc])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="documents must be a list of haystack.Document, got str"):
        ranker.run(query="q", documents="Tesla")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="documents must be a list of haystack.Document, got Document"):
        ranker.run(query="q", documents=doc)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"documents\[1\] must be a haystack.Document, got str"):
        ranker.run(query="q", documents=[doc, "Tesla"])  # type: ignore[list-item]


# ------------------------------------------------------------------ an outside score in meta


@pytest.fixture(scope="module")
def rerank_filter_path(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
                       minilm_scorer: Any) -> Path:
    """A filter on an outside score, ``meta["rerank"]`` (a cosine: higher is better)."""
    from ragsieve.data import load_xquad
    from ragsieve.scoring import FieldScorer

    pairs = [p for p in load_xquad("en", data_dir=shared_data_dir, context="paragraph")
             if p.group in CAL_GROUPS]
    cos = 1.0 - minilm_scorer.score_pairs(pairs)
    cal = [dataclasses.replace(p, meta={**p.meta, "rerank": float(c)})
           for p, c in zip(pairs, cos, strict=True)]
    flt = ConformalFilter(FieldScorer(field="rerank", higher_is_better=True), alpha=0.2)
    return flt.calibrate(cal).save(tmp_path_factory.mktemp("rerank") / "filter.json")


def test_outside_score_filter_reads_meta_and_needs_no_text(
    rerank_filter_path: Path, minilm_scorer: Any, held_out: tuple[list[Document], list[str]]
) -> None:
    docs, questions = held_out
    flt = ConformalFilter.load(rerank_filter_path)
    ranker = ConformalRanker.from_file(rerank_filter_path)
    ranker.warm_up()  # no model to load for an outside score
    n_kept = n_dropped = 0
    for query in questions[:4]:
        rerank = [float(c) for c in 1.0 - minilm_scorer.score_batch(query, [d.content for d in docs])]
        # no text at all (content None): the score comes from meta
        given = [Document(id=d.id, meta={"rerank": r}, score=0.5)
                 for d, r in zip(docs, rerank, strict=True)]
        out = ranker.run(query=query, documents=given)["documents"]
        res = flt.filter(query, [{"rerank": r} for r in rerank])
        assert [d.id for d in out] == [given[k.index].id for k in res.kept]
        for d, k in zip(out, res.kept, strict=True):  # in its own units: keep rerank >= t
            assert abs(d.meta["ragsieve_score"] - rerank[k.index]) <= TOL
            assert abs(d.meta["ragsieve_threshold"] + res.threshold) <= TOL
            assert d.meta["ragsieve_keep_if"] == ">="
            assert abs(d.score - rerank[k.index]) <= TOL
            assert d.meta["ragsieve_p_value"] == k.p_value > flt.alpha
            assert d.meta["ragsieve_original_score"] == 0.5
        n_kept += len(out)
        n_dropped += len(given) - len(out)
    assert n_kept > 0 and n_dropped > 0
    with pytest.raises(DataError, match="'rerank'"):
        ranker.run(query=questions[0], documents=[Document(content="x", meta={"other": 0.9})])
    # "score" is the alias of the field name; both with different values are refused
    alias = ranker.run(query=questions[0], documents=[Document(content="x", meta={"score": 0.9})])
    assert alias["ragsieve"]["kept"] + alias["ragsieve"]["removed"] == 1
    with pytest.raises(DataError, match=r"both 'score' \(0.9\) and 'rerank' \(0.1\)"):
        ranker.run(query=questions[0],
                   documents=[Document(content="x", meta={"score": 0.9, "rerank": 0.1})])


def test_module_names_the_extra_when_haystack_is_missing() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'haystack':\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ragsieve.integrations\n"
        "try:\n"
        "    import ragsieve.integrations.haystack\n"
        "except ImportError as e:\n"
        "    assert \"pip install 'ragsieve[haystack]'\" in str(e), str(e)\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
