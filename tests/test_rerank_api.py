"""The rerank API served by ``ragsieve serve`` (``/v1/rerank``, ``/v2/rerank``, TEI's
``/rerank``, each also under ``/all``), against a real uvicorn server on 127.0.0.1 and
compared with ``/filter`` on the same requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from servers import ThreadServer

from ragsieve import Pair
from ragsieve.calibration import make_calibrator
from ragsieve.server import create_app

API_KEY = "rerank-key"
MAX_SNIPPETS = 40
ALPHA = 0.2


@pytest.fixture(scope="module")
def artifact(served_artifact: Any) -> Path:
    path: Path = served_artifact(make_calibrator("marginal", alpha=ALPHA))
    return path


@pytest.fixture(scope="module")
def client(artifact: Path, embedding_cache_dir: Path) -> Iterator[httpx.Client]:
    app = create_app(artifact, api_key=API_KEY, max_snippets=MAX_SNIPPETS,
                     scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv, httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60) as c:
        yield c


def _lists(xquad_en: list[Pair], n_lists: int = 6, size: int = 10) -> list[tuple[str, list[str]]]:
    """Held-out lists: each query with its own passages and others' (past the 300 pairs the
    artifact was calibrated on)."""
    pool = xquad_en[400:]
    out = []
    for i in range(n_lists):
        head = pool[i * 37]
        others = [p.text for p in pool[i * 37 + 1: i * 37 + size * 5: 5]][: size - 1]
        out.append((head.query, [head.text, *others]))
    return out


def _filter(client: httpx.Client, query: str, docs: list[str]) -> dict[str, Any]:
    r = client.post("/filter", json={"query": query, "snippets": docs})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _best_first(body: dict[str, Any], indices: list[int]) -> list[int]:
    return sorted(indices, key=lambda i: (-body["p_values"][i], body["scores"][i], i))


@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_the_kept_documents_are_filters_kept_best_first_with_p_values(
        client: httpx.Client, xquad_en: list[Pair], route: str) -> None:
    n_some = 0
    for query, docs in _lists(xquad_en):
        expected = _filter(client, query, docs)
        kept = [s["index"] for s in expected["kept"]]
        r = client.post(route, json={"model": "any-name", "query": query, "documents": docs})
        assert r.status_code == 200, r.text
        body = r.json()
        got = [x["index"] for x in body["results"]]
        assert got == _best_first(expected, kept)
        for x in body["results"]:
            assert ALPHA < x["relevance_score"] <= 1.0
            assert x["relevance_score"] == pytest.approx(expected["p_values"][x["index"]])
            assert "document" not in x
        meta = body["meta"]["ragsieve"]
        assert (meta["kept"], meta["removed"], meta["total"]) == (
            len(kept), len(docs) - len(kept), len(docs))
        assert meta["threshold"] == pytest.approx(expected["threshold"])
        assert meta["alpha"] == pytest.approx(ALPHA) and meta["returned"] == "kept"
        assert body["model"] == "any-name" and body["id"]
        assert r.headers["X-Ragsieve-Kept"] == str(len(kept))
        n_some += bool(kept) and len(kept) < len(docs)
    assert n_some >= 1  # the filter removes something on these lists


def test_top_n_caps_and_return_documents_gives_the_texts(client: httpx.Client,
                                                         xquad_en: list[Pair]) -> None:
    query, docs = _lists(xquad_en)[0]
    full = client.post("/all/v1/rerank", json={"query": query, "documents": docs}).json()
    r = client.post("/all/v1/rerank", json={"query": query, "documents": [
        {"text": d, "title": "ignored"} for d in docs], "top_n": 3, "return_documents": True})
    body = r.json()
    assert [x["index"] for x in body["results"]] == [x["index"] for x in full["results"][:3]]
    assert [x["document"]["text"] for x in body["results"]] == [
        docs[x["index"]] for x in body["results"]]
    assert body["meta"]["ragsieve"]["answered"] == 3


@pytest.mark.parametrize("how", ["/all/v1/rerank", "/v1/rerank?return=all", "/all/rerank"])
def test_everything_ranked_for_clients_that_cut_themselves(client: httpx.Client,
                                                           xquad_en: list[Pair],
                                                           how: str) -> None:
    query, docs = _lists(xquad_en)[1]
    expected = _filter(client, query, docs)
    body = client.post(how, json={"query": query, "documents": docs}).json()
    assert [x["index"] for x in body["results"]] == _best_first(expected, list(range(len(docs))))
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    # a client threshold at alpha cuts exactly what the filter keeps (marginal mode)
    assert {x["index"] for x in body["results"] if x["relevance_score"] > ALPHA} == {
        s["index"] for s in expected["kept"]}
    assert body["meta"]["ragsieve"]["returned"] == "all"


def test_tei_body_answers_teis_bare_list_with_headers(client: httpx.Client,
                                                      xquad_en: list[Pair]) -> None:
    query, docs = _lists(xquad_en)[2]
    expected = _filter(client, query, docs)
    r = client.post("/all/rerank", json={"query": query, "texts": docs, "return_text": True,
                                         "raw_scores": False, "truncate": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and len(body) == len(docs)
    assert [x["index"] for x in body] == _best_first(expected, list(range(len(docs))))
    assert all(x["text"] == docs[x["index"]] for x in body)
    assert r.headers["X-Ragsieve-Alpha"] == "0.2"
    assert int(r.headers["X-Ragsieve-Kept"]) == len(expected["kept"])
    kept = client.post("/rerank", json={"query": query, "texts": docs}).json()
    assert [x["index"] for x in kept] == _best_first(expected, [s["index"] for s in
                                                                 expected["kept"]])
    assert all(set(x) == {"index", "score"} for x in kept)


def test_a_long_document_is_kept_by_its_best_piece(client: httpx.Client,
                                                   xquad_en: list[Pair]) -> None:
    query, docs = _lists(xquad_en)[3]
    filler = " ".join(p.text for p in xquad_en[900:905])  # another article's text first
    long_doc = filler + " " + docs[0]
    docs = [long_doc, *docs[1:]]
    expected = _filter(client, query, docs)
    body = client.post("/all/v1/rerank", json={"query": query, "documents": docs}).json()
    assert body["meta"]["ragsieve"]["n_cut"] >= 1
    by_index = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert by_index[0] == pytest.approx(expected["p_values"][0])
    kept = client.post("/v1/rerank", json={"query": query, "documents": docs}).json()
    assert [x["index"] for x in kept["results"]] == _best_first(
        expected, [s["index"] for s in expected["kept"]])


def test_ignored_fields_are_accepted_and_named(client: httpx.Client) -> None:
    r = client.post("/v2/rerank", json={
        "model": "rerank-v3.5", "query": "Who?", "documents": ["Tesla was born in 1856."],
        "max_tokens_per_doc": 4096, "rank_fields": ["text"], "priority": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["ragsieve"]["ignored"] == ["max_tokens_per_doc", "priority",
                                                   "rank_fields"]
    assert body["meta"]["api_version"] == {"version": "2"}


@pytest.mark.parametrize(("route", "body", "status", "names"), [
    ("/v1/rerank", {"query": "q", "documents": [1, "a"]}, 422, "documents"),
    ("/v1/rerank", {"query": "q", "documents": [{"image": "x"}]}, 422, "documents"),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, 422, "query"),
    ("/v1/rerank", {"query": "   ", "documents": ["a"]}, 422, "query"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "3"}, 422, "top_n"),
    ("/v1/rerank", {"query": "q"}, 422, "documents"),
    ("/v1/rerank", {"query": "q", "texts": ["a"]}, 422, "texts"),
    ("/rerank", {"query": "q", "texts": ["a"], "documents": ["a"]}, 422, "texts"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * (MAX_SNIPPETS + 1)}, 413, "limit"),
    ("/all/v1/rerank?return=kept", {"query": "q", "documents": ["a"]}, 422, "return"),
    ("/v1/rerank?return=some", {"query": "q", "documents": ["a"]}, 422, "return"),
])
def test_bad_requests_get_the_filters_4xx_naming_the_field(
        client: httpx.Client, route: str, body: dict[str, Any], status: int,
        names: str) -> None:
    r = client.post(route, json=body)
    assert r.status_code == status, r.text
    assert names in r.text


def test_the_key_is_required_and_bearer_is_accepted(client: httpx.Client) -> None:
    body = {"query": "q", "documents": ["a"]}
    url = str(client.base_url)
    assert httpx.post(url + "/v1/rerank", json=body).status_code == 401
    wrong = httpx.post(url + "/v1/rerank", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.post(url + "/v1/rerank", json=body, headers={"X-API-Key": API_KEY})
    assert ok.status_code == 200


def test_served_record_metrics_and_monitor_count_rerank(client: httpx.Client,
                                                        xquad_en: list[Pair]) -> None:
    query, docs = _lists(xquad_en)[4]
    before = client.get("/healthz").json()["monitor"]["n_observed"]
    body = client.post("/all/v1/rerank", json={"query": query, "documents": docs}).json()
    assert client.get("/healthz").json()["monitor"]["n_observed"] > before
    metrics = client.get("/metrics").text
    assert 'ragsieve_requests_total{endpoint="/all/v1/rerank",status="200"}' in metrics
    assert 'ragsieve_snippets_scored_total{endpoint="/all/v1/rerank"}' in metrics
    # the answer's id and a document's index label the document it names
    best = body["results"][0]["index"]
    r = client.post("/feedback", json={"items": [
        {"query_id": body["id"], "snippet_id": str(best), "relevant": True}]})
    assert r.status_code == 200, r.text
    assert r.json()["new"] == 1 and r.json()["unknown"] == 0


def test_rerank_return_all_as_the_service_default(artifact: Path, embedding_cache_dir: Path,
                                                  xquad_en: list[Pair]) -> None:
    app = create_app(artifact, rerank_return="all",
                     scorer_options={"cache_dir": embedding_cache_dir})
    query, docs = _lists(xquad_en)[5]
    with ThreadServer(app) as srv:
        every = httpx.post(srv.url + "/v1/rerank", json={"query": query, "documents": docs},
                           timeout=60).json()
        kept = httpx.post(srv.url + "/v1/rerank?return=kept",
                          json={"query": query, "documents": docs}, timeout=60).json()
    assert len(every["results"]) == len(docs)
    assert len(kept["results"]) == kept["meta"]["ragsieve"]["kept"] < len(docs)
    with pytest.raises(ValueError, match="rerank_return"):
        create_app(artifact, rerank_return="everything")


#: Hostile bodies the strict reader refuses on every route: (case, body text, words).
HOSTILE = [
    ("deep nesting in an ignored field",
     '{"query": "q", "documents": ["a"], "extra": ' + "[" * 5000 + "]" * 5000 + "}",
     "deep"),
    ("duplicate key", '{"query": "q", "query": "r", "documents": ["a"]}', "query"),
    ("NaN in an ignored field", '{"query": "q", "documents": ["a"], "x": NaN}', "NaN"),
    ("401-digit top_n", '{"query": "q", "documents": ["a"], "top_n": ' + "9" * 401 + "}",
     "401 digits"),
    ("lone surrogate in a document", '{"query": "q", "documents": ["a\\ud800"]}',
     "surrogate"),
]


@pytest.mark.parametrize(("case", "text", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_are_422_and_the_service_answers_on(client: httpx.Client, case: str,
                                                           text: str, words: str) -> None:
    r = client.post("/v1/rerank", content=text.encode("utf-8", "surrogatepass"),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 422, (case, r.text)
    assert words in r.text
    ok = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert ok.status_code == 200


def test_a_filter_without_calibration_evidence_is_refused_in_one_line(
        tmp_path: Path, xquad_en: list[Pair], embedding_cache_dir: Path) -> None:
    """A filter joined from an already fitted calibrator of a mode that keeps no scores has
    no p-value to answer as relevance_score: 422 naming the fix, before anything is scored."""
    from ragsieve import ConformalFilter
    from ragsieve.scoring import EmbeddingScorer

    scorer = EmbeddingScorer(cache_dir=embedding_cache_dir)
    pairs = xquad_en[:300]  # scored by the module's artifact already: cached
    calibrator = make_calibrator("pac", alpha=ALPHA, delta=0.1).fit(
        scorer.score_pairs(pairs), [p.relevant for p in pairs])
    flt = ConformalFilter(scorer, calibrator)
    assert flt.evidence is None
    path = flt.save(tmp_path / "no-evidence.json")
    app = create_app(path, scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv:
        r = httpx.post(srv.url + "/v1/rerank", json={"query": "q", "documents": ["a"]},
                       timeout=60)
        assert r.status_code == 422
        assert "no calibration evidence" in r.json()["detail"]
        assert httpx.post(srv.url + "/filter", json={"query": "q", "snippets": ["a"]},
                          timeout=60).status_code == 200


def test_a_jina_style_body_is_answered_the_jina_way(client: httpx.Client,
                                                    xquad_en: list[Pair]) -> None:
    """Jina's body (``return_documents`` true, its model name, objects with ``text``) gets the
    fields Jina's clients read: ``model``, ``usage.total_tokens`` and ``results`` each with
    ``index``, ``relevance_score`` and ``document.text``."""
    query, docs = _lists(xquad_en)[0]
    expected = _filter(client, query, docs)
    r = client.post("/v1/rerank", json={
        "model": "jina-reranker-v2-base-multilingual", "query": query,
        "documents": [{"text": d} for d in docs], "top_n": len(docs),
        "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "jina-reranker-v2-base-multilingual"
    assert body["usage"] == {"total_tokens": 0}
    assert [x["index"] for x in body["results"]] == _best_first(
        expected, [s["index"] for s in expected["kept"]])
    assert all(x["document"] == {"text": docs[x["index"]]} for x in body["results"])
