"""No embedding twice: ``calibrate``, ``evaluate``, ``filter`` and ``query --index`` take the
vectors of the index's snippets from the index, on the real MiniLM model and a real LanceDB
index (the small XQuAD-en index and the ``retrieve`` pairs of tests/test_retrieve.py).

What the model embeds is counted with a wrapper on the real, per-process model's
``embed_batch`` (the model still computes every vector it is asked for).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lancedb")

from test_retrieve import Corpus, Retrieved, corpus, labelled, run  # noqa: F401

from ragsieve.data import read_pairs
from ragsieve.embeddings import EmbeddingCache, load_embedding_model
from ragsieve.filter import ConformalFilter
from ragsieve.filtered_search import query_with_filter
from ragsieve.index_vectors import reuse_index_vectors
from ragsieve.scoring import EmbeddingScorer
from ragsieve.store import SnippetIndex


@pytest.fixture
def embedded(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:  # noqa: F811
    """Every text the index's (real, shared) model is asked to embed, in order."""
    model = SnippetIndex.open(corpus.index).model
    assert model is load_embedding_model(model.model_id)  # the one instance every score uses
    seen: list[str] = []
    real = model.embed_batch

    def counting(texts: Any) -> np.ndarray:
        seen.extend(texts)
        return real(texts)

    monkeypatch.setattr(model, "embed_batch", counting)
    yield seen


def _write_pairs(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _records(labelled: Retrieved) -> list[dict[str, Any]]:  # noqa: F811
    return [json.loads(line) for line in labelled.out.read_text(encoding="utf-8").splitlines()]


def _calibrate(pairs: Path, out: Path, cache: Path, *extra: str) -> tuple[dict[str, Any], str]:
    code, stdout, err = run(["calibrate", "--data", str(pairs), "--out", str(out),
                             "--cache-dir", str(cache), "--json", "--no-expected", *extra])
    assert code == 0, err
    return json.loads(stdout), err


def test_calibrate_takes_the_snippet_vectors_from_the_index(
        corpus: Corpus, labelled: Retrieved, embedded: list[str],  # noqa: F811
        tmp_path: Path) -> None:
    """Only the queries are embedded; the threshold is the one of embedding everything."""
    pairs = read_pairs(labelled.out)
    queries = {p.query for p in pairs}
    reused, err = _calibrate(labelled.out, tmp_path / "a.json", tmp_path / "fresh-a",
                             "--scorer", "embedding")
    assert set(embedded) <= queries, set(embedded) - queries
    n_snippets = len({p.snippet_id for p in pairs})
    assert reused["index_vectors"] == [
        f"took {n_snippets} snippet vector(s) from the index at {corpus.index.resolve()}"]
    assert f"index: took {n_snippets} snippet vector(s)" in err

    # the index gone: every snippet embedded, with the note, and the same threshold
    records = _records(labelled)
    for r in records:
        r["retriever"]["path"] = str(tmp_path / "moved")
    gone = _write_pairs(tmp_path / "gone.jsonl", records)
    embedded.clear()
    again, _ = _calibrate(gone, tmp_path / "b.json", tmp_path / "fresh-b", "--scorer", "embedding")
    assert {p.text for p in pairs} <= set(embedded)
    assert again["index_vectors"] == [
        f"the index at {tmp_path / 'moved'} is gone: embedding its {n_snippets} snippet(s) again"]
    # stored vectors and vectors computed now differ by float rounding at most (batches)
    assert again["threshold"] == pytest.approx(reused["threshold"], abs=1e-5)


def test_stored_vectors_equal_the_models(corpus: Corpus, labelled: Retrieved) -> None:  # noqa: F811
    """What is put into the cache is what the model computes for the same texts."""
    pairs = read_pairs(labelled.out)[:20]
    scorer = EmbeddingScorer(SnippetIndex.open(corpus.index).model)
    reuse_index_vectors(pairs, scorer)
    texts = list(dict.fromkeys(p.text for p in pairs))
    fresh = EmbeddingCache(scorer.model).embed(texts)
    assert scorer.cache.n_computed == 0
    np.testing.assert_allclose(scorer.cache.embed(texts), fresh, atol=1e-5)
    assert scorer.cache.n_computed == 0


def test_a_changed_index_another_text_or_no_index_is_embedded(
        corpus: Corpus, labelled: Retrieved, tmp_path: Path) -> None:  # noqa: F811
    """Never trust the file: the fingerprint and each text are checked; pairs of two
    indexes, pairs naming none and an id the index lacks are each said."""
    records = _records(labelled)
    changed = tmp_path / "changed"
    shutil.copytree(corpus.index, changed)
    docs = tmp_path / "docs"
    shutil.copytree(corpus.docs, docs)
    (docs / "extra.txt").write_text("A new document changes the fingerprint.", encoding="utf-8")
    SnippetIndex.open(changed).index_directory(docs)
    first = [r for r in records if r["query_id"] == records[0]["query_id"]]
    for r in first:  # pairs of another (since changed) copy of the index
        r["retriever"] = {**r["retriever"], "path": str(changed)}
    records[-1]["text"] += " (edited)"
    records[-2]["snippet_id"] = "not-in-the-index"
    del records[-3]["retriever"]
    pairs = read_pairs(_write_pairs(tmp_path / "mixed.jsonl", records))
    scorer = EmbeddingScorer(SnippetIndex.open(corpus.index).model)
    notes = reuse_index_vectors(pairs, scorer)
    fingerprint = records[0]["retriever"]["index"]
    now = SnippetIndex.open(changed).fingerprint
    original = {r["snippet_id"]: r["text"] for r in _records(labelled)}
    taken = {r["text"] for r in records[len(first):]
             if "retriever" in r and original.get(r["snippet_id"]) == r["text"]}
    assert notes == [
        (f"the index at {changed} changed (fingerprint {now[:12]}, the pairs say "
        f"{fingerprint[:12]}): embedding its {len(first)} snippet(s) again"),
        (f"took {len(taken)} snippet vector(s) from the index at {corpus.index.resolve()}; "
        "embedding 2 again (1 not in the index, 1 with another text there)"),
        "1 pair(s) name no index: their snippets are embedded",
    ]
    before = scorer.cache.n_computed
    scorer.score_pairs(pairs)
    assert scorer.cache.n_computed - before == len({p.text for p in pairs} - taken
                                                    | {p.query for p in pairs})


def test_filter_and_evaluate_say_what_they_took(
        corpus: Corpus, labelled: Retrieved, embedded: list[str],  # noqa: F811
        tmp_path: Path) -> None:
    """``filter --data`` (printed or written by an engine with ``--out``) and ``evaluate``
    on ``retrieve`` pairs embed only the queries."""
    queries = {p.query for p in read_pairs(labelled.out)}
    _calibrate(labelled.out, tmp_path / "f.json", tmp_path / "fresh-c", "--scorer", "embedding")
    embedded.clear()
    code, _, err = run(["filter", "--filter", str(tmp_path / "f.json"), "--data",
                        str(labelled.out), "--cache-dir", str(tmp_path / "fresh-d")])
    assert code == 0, err
    assert "index: took " in err and set(embedded) <= queries
    # --out: the engine's job reads the vectors the index stored, too
    embedded.clear()
    code, _, err = run(["filter", "--filter", str(tmp_path / "f.json"), "--data",
                        str(labelled.out), "--cache-dir", str(tmp_path / "fresh-f"),
                        "--out", str(tmp_path / "filtered.jsonl")])
    assert code == 0, err
    assert "index: took " in err and embedded and set(embedded) <= queries
    written = [json.loads(line) for line in
               (tmp_path / "filtered.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(written) == len(queries)
    embedded.clear()
    code, stdout, err = run(["-q", "evaluate", "--data", str(labelled.out), "--scorer",
                             "embedding", "--splits", "2", "--cache-dir",
                             str(tmp_path / "fresh-e"), "--json"])
    assert code == 0, err
    assert json.loads(stdout)["index_vectors"][0].startswith("took ")
    assert set(embedded) <= queries


def test_query_with_a_fused_filter_embeds_only_the_query(
        corpus: Corpus, labelled: Retrieved, embedded: list[str],  # noqa: F811
        tmp_path: Path) -> None:
    """``query --index`` / ``serve --index`` with a fused score on the index's model: its
    cosine comes from the hits' stored vectors, the model embeds the query alone."""
    _calibrate(labelled.out, tmp_path / "best.json", tmp_path / "fresh-f", "--scorer", "best")
    flt = ConformalFilter.load(tmp_path / "best.json")
    index = SnippetIndex.open(corpus.index)
    assert flt.scorer_.root_scorer().spec() == {"scorer": "embedding", "model": index.model_id}
    embedded.clear()
    hits, result = query_with_filter(index, "Who founded the city?", flt, k=5)
    assert embedded == ["Who founded the city?"] and len(hits) == 5  # once, no hit text
    assert [h.snippet_id for h in hits] == [h.snippet_id for h in
                                            index.search("Who founded the city?", k=5)]
    assert result.n_input == 5


def test_retrieve_then_calibrate_on_one_cache_embeds_nothing_again(
        corpus: Corpus, labelled: Retrieved, embedded: list[str],  # noqa: F811
        tmp_path: Path) -> None:
    """``retrieve`` keeps the queries' vectors in the embedding cache; ``calibrate`` on the
    same cache then embeds no text at all (the snippets come from the index), and the
    pairs are those a retrieve without the cache writes."""
    cache, out = tmp_path / "one-cache", tmp_path / "pairs.jsonl"
    code, _, err = run(["-q", "retrieve", "--index", str(corpus.index), "--queries",
                        str(labelled.queries), "-k", "5", "--out", str(out), "--cache-dir",
                        str(cache)])
    assert code == 0, err
    queries = {p.query for p in read_pairs(out)}
    assert set(embedded) == queries  # retrieve embeds the queries, and only them
    embedded.clear()
    _calibrate(out, tmp_path / "f.json", cache, "--scorer", "embedding")
    assert embedded == []
    plain = tmp_path / "plain.jsonl"
    code, _, err = run(["-q", "retrieve", "--index", str(corpus.index), "--queries",
                        str(labelled.queries), "-k", "5", "--out", str(plain), "--no-cache"])
    assert code == 0, err
    assert [(p.query_id, p.snippet_id) for p in read_pairs(plain)] == \
        [(p.query_id, p.snippet_id) for p in read_pairs(out)]
