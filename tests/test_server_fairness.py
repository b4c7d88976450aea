"""Fair model work in the service: the per-request budget (413), the fair queue (a small
request is answered while a large one is in flight), the full queue (429 + Retry-After),
vector dimensions checked against the scorer's (422) and a removed index (503).

Every service test runs the real app (real MiniLM scorer) in a real uvicorn server on a
127.0.0.1 port. No timings are asserted: the fairness tests assert the order in which
requests complete, seen through the service's own queue gauge.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families
from servers import serving

from ragsieve import ConformalFilter, Pair
from ragsieve.scoring import EmbeddingScorer
from ragsieve.server.scheduling import PIECE_CHARS, least_work, work_pieces


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair],
             embedding_cache_dir: Path) -> Path:
    """A real marginal artifact (MiniLM embedding scorer, alpha 0.2)."""
    root = tmp_path_factory.mktemp("fair-artifact")
    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    return ConformalFilter(scorer, alpha=0.2).calibrate(xquad_en[:300]).save(root / "f.json")


@pytest.fixture(scope="module")
def options(embedding_cache_dir: Path) -> dict[str, Any]:
    return {"scorer_options": {"cache_dir": embedding_cache_dir}}


def _fresh_text(xquad_en: list[Pair], n_chars: int) -> str:
    """About ``n_chars`` of XQuAD paragraphs, each tagged uniquely: nothing of it is cached."""
    tag = uuid.uuid4().hex[:12]
    contexts = list(dict.fromkeys(p.text for p in xquad_en))
    parts: list[str] = []
    size = 0
    while size < n_chars:
        for text in contexts:
            parts.append(f"({tag}.{len(parts)}) {text}")
            size += len(parts[-1]) + 1
            if size >= n_chars:
                break
    return " ".join(parts)[:n_chars]


def _fresh_snippets(xquad_en: list[Pair], n: int) -> list[str]:
    """``n`` uncached snippets of 550 characters (one piece each)."""
    text = _fresh_text(xquad_en, 600 * n)
    return [text[600 * i:600 * i + 550] for i in range(n)]


def _small(xquad_en: list[Pair]) -> dict[str, Any]:
    """A 3-snippet request (sent once first, so its embeddings are cached)."""
    return {"query": xquad_en[400].query, "snippets": [p.text for p in xquad_en[400:403]]}


def _gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    return 0.0


def _refused(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "ragsieve_refused_requests_total"
                    and sample.labels.get("reason") == reason):
                return sample.value
    return 0.0


def _in_flight(url: str, large: Future[httpx.Response]) -> None:
    """Return once the large request holds the model queue (or has already finished)."""
    while not large.done():
        if _gauge(url, "ragsieve_model_queue_pieces") > 0:
            return
        time.sleep(0.02)


def _post_large(pool: ThreadPoolExecutor, url: str, body: dict[str, Any]
                ) -> Future[httpx.Response]:
    return pool.submit(httpx.post, url + "/filter", json=body, timeout=600)


# ---------------------------------------------------------------------- 413: the budget
def test_over_budget_request_gets_413_naming_the_limit(artifact: Path, options: dict[str, Any],
                                                      xquad_en: list[Pair]) -> None:
    """Defect 3: the work is counted before any model work (the characters the model reads,
    in pieces of 500: a long snippet's overlapping pieces, the query); over the budget is
    a 413. Here the count from below on the text as sent fits the budget of 16, the exact
    count of the pieces does not."""
    long_text = _fresh_text(xquad_en, 6_000)
    with serving(artifact, max_pieces=16, **options) as srv:
        over = httpx.post(srv.url + "/filter", json={"query": "q", "snippets": [long_text,
                                                                               "short"]},
                          timeout=120)
        fits = httpx.post(srv.url + "/filter", json=_small(xquad_en), timeout=120)
        refused = _refused(srv.url, "max_pieces")
    assert over.status_code == 413, over.text
    texts = ["q", *ConformalFilter.load(artifact).piece_texts([long_text, "short"])]
    n_pieces = work_pieces(texts)
    assert least_work("q", [long_text, "short"]) <= 16 < n_pieces
    detail = over.json()["detail"]
    assert detail.startswith(
        f"request needs {n_pieces} pieces of model work; the limit is 16 per request "
        "(--max-pieces).")
    assert (f"A piece is {PIECE_CHARS} characters the model reads, or 100 words and marks "
            f"where a text is denser: this request's query, "
            f"snippets and sentences come to {sum(map(len, texts)):,} characters") in detail
    assert fits.status_code == 200 and len(fits.json()["scores"]) == 3
    assert refused == 1


def test_a_long_query_is_within_the_budget(artifact: Path, options: dict[str, Any],
                                           small_index: Path, tmp_path: Path) -> None:
    """Issue 31: a 990 KB query cost seconds of model work outside the budget; now it counts
    as the ~2,000 pieces of 500 characters the model reads, on /filter and /query alike."""
    index = tmp_path / "idx"
    shutil.copytree(small_index, index)
    query = "who " * 247_500
    with serving(artifact, index_path=index, **options) as srv:
        on_filter = httpx.post(srv.url + "/filter", json={"query": query, "snippets": ["a"]},
                               timeout=600)
        on_query = httpx.post(srv.url + "/query", json={"query": query, "k": 3}, timeout=600)
        fits = httpx.post(srv.url + "/query", json={"query": "Who won Super Bowl 50?", "k": 3},
                          timeout=120)
        refused = _refused(srv.url, "max_pieces")
    assert on_filter.status_code == 413 and on_query.status_code == 413, on_query.text[:300]
    assert on_filter.json()["detail"].startswith(
        f"request needs {least_work(query, ['a'])} pieces of model work;")
    assert work_pieces([query]) >= 1980  # 990,000 characters (and 247,500 words)
    assert on_query.json()["detail"].startswith(
        f"request needs {work_pieces([query])} pieces of model work;")
    assert fits.status_code == 200 and len(fits.json()["hits"]) == 3
    assert refused == 2


def test_default_budget_refuses_a_huge_snippet(artifact: Path, options: dict[str, Any],
                                               xquad_en: list[Pair]) -> None:
    """Defect 3: with the default budget a ~100 KB snippet (~230 pieces) is refused at
    once (on unbounded code it held the model thread for its whole embedding)."""
    text = _fresh_text(xquad_en, 100_000)
    with serving(artifact, **options) as srv:
        r = httpx.post(srv.url + "/filter", json={"query": "q", "snippets": [text]},
                       timeout=600)
    assert r.status_code == 413, r.text
    from ragsieve.server.service import DEFAULT_MAX_PIECES

    assert f"the limit is {DEFAULT_MAX_PIECES} per request" in r.json()["detail"]


# ---------------------------------------------------------------------- fair queue
def test_small_request_answered_while_a_large_one_is_in_flight(
        artifact: Path, options: dict[str, Any], xquad_en: list[Pair]) -> None:
    """Defect 3: a cached 3-snippet request completes before a large request (100 fresh
    snippets of 550 characters, 111 pieces of work, within the default budget) that was in
    flight when it was sent (on one FIFO model thread it waited for the whole large one)."""
    large = {"query": xquad_en[300].query, "snippets": _fresh_snippets(xquad_en, 100)}
    with serving(artifact, **options) as srv, \
            ThreadPoolExecutor(max_workers=1) as pool:
        assert httpx.post(srv.url + "/filter", json=_small(xquad_en), timeout=120
                          ).status_code == 200  # cached from now on
        future = _post_large(pool, srv.url, large)
        _in_flight(srv.url, future)
        small = httpx.post(srv.url + "/filter", json=_small(xquad_en), timeout=600)
        large_done_first = future.done()
        big = future.result()
    assert small.status_code == 200 and len(small.json()["scores"]) == 3
    assert not large_done_first, "the small request waited for the large one"
    assert big.status_code == 200 and len(big.json()["scores"]) == 100


def test_full_queue_gets_429_with_retry_after(artifact: Path, options: dict[str, Any],
                                             xquad_en: list[Pair]) -> None:
    """Defect 3: with max_queue=1 a request sent while another holds the queue gets 429
    with Retry-After; after it, the same request is answered."""
    large = {"query": xquad_en[300].query, "snippets": [_fresh_text(xquad_en, 30_000)]}
    with serving(artifact, max_pieces=2000, max_queue=1, **options) as srv, \
            ThreadPoolExecutor(max_workers=1) as pool:
        future = _post_large(pool, srv.url, large)
        _in_flight(srv.url, future)
        busy = httpx.post(srv.url + "/filter", json=_small(xquad_en), timeout=600)
        big = future.result()
        after = httpx.post(srv.url + "/filter", json=_small(xquad_en), timeout=120)
        refused = _refused(srv.url, "max_queue")
        queued = _gauge(srv.url, "ragsieve_model_queue_requests")
    assert busy.status_code == 429, busy.text
    assert int(busy.headers["Retry-After"]) >= 1
    assert "the limit is 1 (--max-queue)" in busy.json()["detail"]
    assert big.status_code == 200 and after.status_code == 200
    assert refused == 1 and queued == 0


# ---------------------------------------------------------------------- vectors
def test_vectors_of_the_wrong_dimension_get_422(artifact: Path, options: dict[str, Any],
                                                embedding_cache_dir: Path) -> None:
    """Defect 11: 2-d vectors against a 384-d model were scored (up to 2.0); now 422
    naming both dimensions. Vectors of the model's dimension are still served."""
    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    qvec, svec = (v.tolist() for v in scorer.cache.embed(["a question", "a snippet"]))
    two_d = {"query": "q", "query_vector": [1.0, 0.0],
             "snippets": [{"vector": [-1.0, 0.0]}, {"vector": [0.0, 1.0]}]}
    with serving(artifact, **options) as srv:
        bad = httpx.post(srv.url + "/filter", json=two_d, timeout=120)
        good = httpx.post(srv.url + "/filter", json={
            "query": "q", "query_vector": qvec, "snippets": [{"vector": svec}]}, timeout=120)
    assert bad.status_code == 422, bad.text
    detail = bad.json()["detail"]
    assert "dimension 2" in detail and "dimension 384" in detail
    assert good.status_code == 200, good.text
    assert len(good.json()["scores"]) == 1


# ---------------------------------------------------------------------- removed index
def test_removed_index_is_a_503_and_logged(artifact: Path, options: dict[str, Any],
                                           small_index: Path, tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Defect 12: a served index directory removed while serving was recreated empty (200,
    zero hits); now 503, an error in the log, and nothing is created."""
    index = tmp_path / "idx"
    shutil.copytree(small_index, index)
    body = {"query": "Who won Super Bowl 50?", "k": 5}
    with serving(artifact, index_path=index, **options) as srv:
        before = httpx.post(srv.url + "/query", json=body, timeout=120)
        shutil.rmtree(index)
        with caplog.at_level(logging.ERROR, logger="ragsieve"):
            gone = httpx.post(srv.url + "/query", json=body, timeout=120)
    assert before.status_code == 200 and len(before.json()["hits"]) == 5
    assert gone.status_code == 503, gone.text
    assert "index" in gone.json()["detail"]
    assert any(rec.levelno == logging.ERROR and "is gone" in rec.getMessage()
               for rec in caplog.records)
    assert not index.exists()  # never recreated empty


def test_removed_index_raises_and_is_not_recreated(small_index: Path, tmp_path: Path) -> None:
    """Defect 12, in the library: every read of a removed index raises IndexMissingError."""
    from ragsieve.store import IndexMissingError, SnippetIndex

    index = tmp_path / "idx"
    shutil.copytree(small_index, index)
    opened = SnippetIndex.open(index)
    assert opened.count() > 0
    shutil.rmtree(index)
    with pytest.raises(IndexMissingError, match="is gone"):
        opened.count()
    with pytest.raises(IndexMissingError):
        opened.search("Who won Super Bowl 50?", k=3)
    assert not index.exists()


# ---------------------------------------------------------------------- the queue itself
def _recorder(log: list[str], name: str, gate: threading.Event | None = None
              ) -> Callable[[], str]:
    def step() -> str:
        if gate is not None:
            assert gate.wait(timeout=60)
        log.append(name)
        return name
    return step


def test_fair_queue_takes_one_step_per_job_in_turn() -> None:
    """A job queued behind a long one runs after one step of it, not after all of it."""
    from ragsieve.server.scheduling import FairQueue, QueueFull

    log: list[str] = []
    gate = threading.Event()
    queue = FairQueue(max_waiting=2)
    try:
        long_job = queue.submit([_recorder(log, "L1", gate), _recorder(log, "L2"),
                                 _recorder(log, "L3")], costs=[1, 1, 1])
        short_job = queue.submit([_recorder(log, "S1")], costs=[1])
        with pytest.raises(QueueFull):
            queue.submit([_recorder(log, "X")], costs=[1])
        assert queue.waiting == 2 and queue.pending_cost == 4
        gate.set()
        assert long_job.result(timeout=60) == "L3" and short_job.result(timeout=60) == "S1"
        assert log == ["L1", "S1", "L2", "L3"]

        def fails() -> None:
            raise ValueError("bad step")

        with pytest.raises(ValueError, match="bad step"):
            queue.run([fails, _recorder(log, "never")], costs=[1, 1])
        assert "never" not in log and queue.waiting == 0 and queue.pending_cost == 0
    finally:
        queue.close()
