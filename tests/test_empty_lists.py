"""The framework components summarise the lists their rule empties (Hardening IV item 16):
Haystack's ranker logged one WARNING per emptied list (22 lines for 22 queries); now all
three components (Haystack, LangChain, LlamaIndex) log the first with its reason and fix,
then count (``empty_stats``) with a WARNING summary at the
10th, 100th, ... emptied list, through one helper (``EmptyListLog``).

Real frameworks (haystack-ai, langchain-core, llama-index-core) and a real filter on an
outside score (``meta["rerank"]``, higher is better), so no model is loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

from ragsieve import ConformalFilter, Pair
from ragsieve.integrations import EmptyListLog, EmptyListStats
from ragsieve.scoring import FieldScorer

N_QUERIES = 22


@pytest.fixture(scope="module")
def flt() -> ConformalFilter:
    """A marginal filter (alpha 0.2) on ``rerank``: relevant snippets score 1 to 2, the
    others -1 to 0; a list of scores of -5 is emptied."""
    pairs = [Pair(query_id=f"q{i}", query=f"question {i}", snippet_id=f"q{i}-{j}",
                  text=f"snippet {j} of {i}", relevant=int(j == 0),
                  meta={"rerank": (1.0 if j == 0 else -1.0) + (i * 4 + j) / 200})
             for i in range(50) for j in range(4)]
    return ConformalFilter(FieldScorer(field="rerank", higher_is_better=True),
                           alpha=0.2).calibrate(pairs)


def _haystack(flt: ConformalFilter) -> tuple[Any, Callable[[Any, float], dict[str, Any]]]:
    pytest.importorskip("haystack", reason="needs Haystack: pip install 'ragsieve[haystack]'")
    from haystack import Document

    from ragsieve.integrations.haystack import ConformalRanker

    ranker = ConformalRanker(filter=flt)

    def run(i: int, score: float) -> dict[str, Any]:
        docs = [Document(content=f"doc {j}", meta={"rerank": score}) for j in range(3)]
        out: dict[str, Any] = ranker.run(query=f"query {i}", documents=docs)
        return out
    return ranker, run


def _langchain(flt: ConformalFilter) -> tuple[Any, Callable[[Any, float], Any]]:
    pytest.importorskip("langchain_core", reason="needs pip install 'ragsieve[langchain]'")
    from langchain_core.documents import Document

    from ragsieve.integrations.langchain import ConformalCompressor

    comp = ConformalCompressor(filter=flt)
    return comp, lambda i, score: comp.compress_documents(
        [Document(page_content=f"doc {j}", metadata={"rerank": score}) for j in range(3)],
        f"query {i}")


def _llamaindex(flt: ConformalFilter) -> tuple[Any, Callable[[Any, float], Any]]:
    pytest.importorskip("llama_index.core", reason="needs pip install 'ragsieve[llamaindex]'")
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    post = ConformalPostprocessor(filter=flt)
    return post, lambda i, score: post.postprocess_nodes(
        [NodeWithScore(node=TextNode(text=f"doc {j}", metadata={"rerank": score}), score=score)
         for j in range(3)], query_str=f"query {i}")


@pytest.mark.parametrize(("make", "logger", "kind"),
                         [(_haystack, "haystack", "documents"),
                          (_langchain, "langchain", "documents"),
                          (_llamaindex, "llamaindex", "nodes")],
                         ids=["haystack", "langchain", "llamaindex"])
def test_emptied_lists_are_summarised_not_logged_each(
        flt: ConformalFilter, caplog: pytest.LogCaptureFixture, make: Any, logger: str,
        kind: str) -> None:
    component, run = make(flt)
    name = type(component).__name__
    with caplog.at_level(logging.DEBUG, logger=f"ragsieve.integrations.{logger}"):
        outs = [run(i, -5.0) for i in range(N_QUERIES)]
        kept = run(N_QUERIES, 5.0)  # a list the rule keeps: counted, not warned about
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned  # was one per emptied list: 22
    assert warned[0].startswith(f"kept 0 of 3 {kind} for query 'query 0': no {kind} passed "
                                "the marginal rule: every score is below the threshold")
    assert "set min_keep to keep the best ones anyway" in warned[0]
    assert f"counted in {name}.empty_stats" in warned[0]
    assert warned[1].startswith(f"the rule emptied 10 of the 10 lists of {kind} {name} has "
                                f"filtered so far (the count is in {name}.empty_stats)")
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG
             and "passed the marginal rule" in r.getMessage()]
    assert len(debug) == N_QUERIES - 2  # every other emptied list, at DEBUG
    assert component.empty_stats == EmptyListStats(lists=N_QUERIES + 1, emptied=N_QUERIES)
    if logger == "haystack":
        assert all(o["documents"] == [] for o in outs)
        assert outs[-1]["ragsieve"]["reason"] and kept["ragsieve"]["reason"] is None
        assert outs[0]["ragsieve"] == outs[-1]["ragsieve"]  # no running count in the output
    else:
        assert all(o == [] for o in outs) and len(kept) == 3


def test_summary_lines_come_at_powers_of_ten(flt: ConformalFilter,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """1,000 emptied lists: four WARNING lines (the 1st, 10th, 100th and 1000th)."""
    log = logging.getLogger("ragsieve.test_empty_lists")
    empties = EmptyListLog("Component")
    result = flt.filter("q", [{"text": "a", "rerank": -5.0}])
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(1000):
            empties.see(log, result, "no documents passed the marginal rule", "documents")
    counts = [r.getMessage().split()[3] for r in caplog.records[1:]]
    assert len(caplog.records) == 4 and counts == ["10", "100", "1000"]
    assert empties.stats == EmptyListStats(1000, 1000)
