"""The calibration lists checked where a filter is applied: ``query --index``, a real served
index and ``/filter`` on a real uvicorn server, ``filter --json`` and ``/metrics``.

A real LanceDB index of XQuAD-en paragraphs; labelled queries (the paragraphs' questions and
gold answers) run through it by ``retrieve_pairs`` (what ``ragsieve retrieve`` writes); a
list-aware filter (the query-relative score of MiniLM's cosine) calibrated on those lists.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lancedb")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from servers import ThreadServer

from ragsieve import ConformalFilter
from ragsieve.cli import main
from ragsieve.retrieval import retrieve_pairs
from ragsieve.scoring import RelativeScorer
from ragsieve.server import create_app
from ragsieve.store import SnippetIndex

K = 5


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
             embedding_cache_dir: Path) -> dict[str, Any]:
    """An index of 6 articles (5 paragraphs each), its top-5 lists for every question, and a
    relative-score filter calibrated through it."""
    from ragsieve.data.xquad import xquad_file

    raw = json.loads(xquad_file("en", data_dir=shared_data_dir).read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("lists-surfaces")
    (root / "docs").mkdir()
    queries = []
    for article in raw["data"][:6]:
        paragraphs = article["paragraphs"][:5]
        (root / "docs" / f"{article['title']}.txt").write_text(
            "\n\n".join(p["context"] for p in paragraphs), encoding="utf-8")
        queries += [{"query_id": qa["id"], "query": qa["question"], "group": article["title"],
                     "answers": [a["text"] for a in qa["answers"]]}
                    for p in paragraphs for qa in p["qas"][:3]]
    index = SnippetIndex.open(root / "idx", create=True)
    index.index_directory(root / "docs")
    pairs = retrieve_pairs(index, queries, k=K)
    flt = ConformalFilter(RelativeScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(pairs)
    artifact = flt.save(root / "filter.json")
    return {"root": root, "index": root / "idx", "artifact": artifact, "queries": queries,
            "identity": index.retriever_identity(K)}


def test_the_artifact_records_the_index(deployed: dict[str, Any]) -> None:
    flt = ConformalFilter.load(deployed["artifact"])
    assert flt.lists.source == {"kind": "retriever", "retriever": deployed["identity"]}
    assert set(flt.lists.lengths) == {K} and flt.lists.list_dependent


def test_query_says_when_k_or_the_index_differ(deployed: dict[str, Any],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    question = deployed["queries"][0]["query"]
    args = ["query", "--index", str(deployed["index"]), "--filter", str(deployed["artifact"]),
            "--json", question]
    assert main([*args, "-k", str(K)]) == 0
    same = capsys.readouterr()
    assert "warning" not in same.err and json.loads(same.out)["lists_unlike"] is False
    assert main([*args, "-k", "12"]) == 0
    other = capsys.readouterr()
    assert "calibrated on the top 5 of its retriever, and this retrieves the top 12" in other.err
    assert f"ragsieve retrieve --index {deployed['index']} -k 12" in other.err
    out = json.loads(other.out)
    assert out["lists_unlike"] is True and "a list of 12 snippets" in out["lists_note"]


@pytest.fixture(scope="module")
def server(deployed: dict[str, Any], embedding_cache_dir: Path) -> Iterator[str]:
    app = create_app(deployed["artifact"], index_path=deployed["index"],
                     state_dir=deployed["root"] / "state",
                     scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv:
        yield srv.url


def test_served_query_and_filter_carry_the_flag(deployed: dict[str, Any], server: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    question = deployed["queries"][1]["query"]
    with httpx.Client(base_url=server, timeout=120) as client, \
            caplog.at_level(logging.WARNING):
        like = client.post("/query", json={"query": question, "k": K}).json()
        assert like["lists_unlike"] is False and like["lists_note"] is None
        longer = client.post("/query", json={"query": question, "k": 9}).json()
        assert longer["lists_unlike"] is True
        assert "this retrieves the top 9" in longer["lists_note"]
        assert "a list of 9 snippets, where every calibration list had 5" in longer["lists_note"]
        texts = [h["text"] for h in like["hits"]]
        two = client.post("/filter", json={"query": question, "snippets": texts[:2]}).json()
        assert two["lists_unlike"] is True and "a list of 2 snippets" in two["lists_note"]
        same = client.post("/filter", json={"query": question, "snippets": texts}).json()
        assert same["lists_unlike"] is False
        metrics = client.get("/metrics").text
        health = client.get("/healthz").json()
    assert 'ragsieve_unlike_lists_total{endpoint="/query"} 1.0' in metrics
    assert 'ragsieve_unlike_lists_total{endpoint="/filter"} 1.0' in metrics
    lists = health["lists"]
    assert lists["source"] == "retriever" and lists["list_dependent"] is True
    assert lists["n_seen"] == 4 and lists["n_outside"] == 2 and lists["alarm"] is False
    assert "index " in lists["calibration"] and "top 5" in lists["calibration"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "this retrieves the top 9" in logged and "a list of 9 snippets" in logged


def test_query_reports_a_list_length_issue_once(deployed: dict[str, Any],
                                                capsys: pytest.CaptureFixture[str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Issue 50 item 15: ``query -k 12`` on a filter calibrated on top-5 lists said it three
    times (a ``warning:`` line, a WARNING log line and a ``lists:`` line); now once."""
    question = deployed["queries"][0]["query"]
    with caplog.at_level(logging.WARNING):
        assert main(["query", "--index", str(deployed["index"]), "--filter",
                     str(deployed["artifact"]), "-k", "12", question]) == 0
    said = capsys.readouterr()
    assert said.err.count("warning:") == 1 and "the top 12" in said.err
    assert not [r for r in caplog.records if r.name.startswith("ragsieve.lists")]
    assert "lists:" not in said.out and "kept " in said.out
