"""The HTTP service against a real uvicorn server on a free loopback port."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from servers import ThreadServer

from ragsieve import ConformalFilter, Pair
from ragsieve.scoring import EmbeddingScorer
from ragsieve.server import create_app, is_loopback_host, run_server, uvicorn_config

API_KEY = "s3cret-key"
MAX_BODY = 200_000
MAX_SNIPPETS = 50


@pytest.fixture(scope="module")
def artifact(
    tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair], embedding_cache_dir: Path
) -> Path:
    path = tmp_path_factory.mktemp("server") / "filter.json"
    ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(
        xquad_en[:300]
    ).save(path)
    return path


@pytest.fixture(scope="module")
def reference(artifact: Path, embedding_cache_dir: Path) -> ConformalFilter:
    return ConformalFilter.load(artifact, scorer_options={"cache_dir": embedding_cache_dir})


@pytest.fixture(scope="module")
def base_url(artifact: Path, embedding_cache_dir: Path) -> Iterator[str]:
    app = create_app(
        artifact,
        api_key=API_KEY,
        max_body_bytes=MAX_BODY,
        max_snippets=MAX_SNIPPETS,
        scorer_options={"cache_dir": embedding_cache_dir},
    )
    with ThreadServer(app) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
    ) as c:
        yield c


def _query_and_snippets(xquad_en, start: int, n: int = 8) -> tuple[str, list[Any]]:
    pairs = xquad_en[start : start + n]
    snippets: list[Any] = [
        {"text": p.text, "snippet_id": f"s{i}"} if i % 2 else p.text for i, p in enumerate(pairs)
    ]
    return pairs[0].query, snippets


def _expected(
    reference: ConformalFilter, query: str, snippets: list[Any], min_keep: int | None = None
) -> dict[str, Any]:
    flt = (
        reference
        if min_keep is None
        else ConformalFilter(reference.scorer, reference.calibrator, min_keep=min_keep)
    )
    res = flt.filter(query, snippets)
    return {
        "kept": [(s.index, s.snippet_id, s.text) for s in res.kept],
        "scores": res.scores,
        "threshold": res.threshold,
        "removal": res.removal,
        "note": res.note,
    }


def _got(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "kept": [(s["index"], s["snippet_id"], s["text"]) for s in body["kept"]],
        "scores": tuple(body["scores"]),
        "threshold": body["threshold"],
        "removal": body["removal"],
        "note": body["note"],
    }


def _assert_same(got: dict[str, Any], exp: dict[str, Any]) -> None:
    assert got["kept"] == exp["kept"]
    assert got["scores"] == pytest.approx(exp["scores"], abs=1e-6)
    assert got["threshold"] == pytest.approx(exp["threshold"])
    assert got["removal"] == pytest.approx(exp["removal"])
    assert got["note"] == exp["note"]


def test_healthz(client: httpx.Client, reference: ConformalFilter, artifact: Path) -> None:
    r = httpx.get(str(client.base_url) + "/healthz")  # no key needed
    assert r.status_code == 200
    body = r.json()
    saved = json.loads(artifact.read_text())
    assert body["status"] == "ok"
    assert body["artifact"]["alpha"] == pytest.approx(0.2)
    assert body["artifact"]["threshold"] == pytest.approx(reference.threshold)
    assert body["artifact"]["scorer"] == saved["scorer"]
    assert body["artifact"]["library_version"] == saved["library_version"]
    assert body["artifact"]["format_version"] == saved["format_version"]
    assert body["artifact"]["mode"] == "marginal"
    assert body["artifact"]["guaranteed_metric"] == reference.guarantee()["metric"]
    assert body["artifact"]["guarantee"]["alpha"] == pytest.approx(0.2)
    assert body["artifact"]["group_by"] is None


def test_missing_extra_names_it() -> None:
    code = "import sys; sys.modules['fastapi'] = None; import ragsieve.server"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "ragsieve[server]" in proc.stderr


def test_openapi_is_typed(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    assert "/filter" in schema["paths"]
    assert {"FilterRequest", "FilterResponse", "Health"} <= set(schema["components"]["schemas"])


def _resolve(schema: dict[str, Any], ref_or_schema: dict[str, Any]) -> dict[str, Any]:
    ref = ref_or_schema.get("$ref")
    if ref is None:
        return ref_or_schema
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_openapi_lists_errors_and_security(base_url: str, index_url: str) -> None:
    """Every status the routes answer is in the schema with a JSON error model, and the
    API key's two schemes are declared and required on the protected routes."""
    schema = httpx.get(base_url + "/openapi.json", headers={"X-API-Key": API_KEY}).json()
    schemes = schema["components"]["securitySchemes"]
    bearer = [v for v in schemes.values() if v["type"] == "http"]
    header = [v for v in schemes.values() if v["type"] == "apiKey"]
    assert [b["scheme"].lower() for b in bearer] == ["bearer"]
    assert [(h["in"], h["name"]) for h in header] == [("header", "X-API-Key")]
    expected = {
        "/filter": {"200", "401", "413", "422"},
        "/query": {"200", "401", "404", "413", "422"},
    }
    for path, codes in expected.items():
        op = schema["paths"][path]["post"]
        assert codes <= set(op["responses"]), (path, sorted(op["responses"]))
        for code in codes - {"200"}:
            content = op["responses"][code]["content"]["application/json"]["schema"]
            model = _resolve(schema, content)
            assert "detail" in model["properties"], (path, code, model)
        # either scheme is enough: two alternative requirements
        assert sorted(next(iter(req)) for req in op["security"]) == sorted(schemes)
    assert "security" not in schema["paths"]["/healthz"]["get"]  # liveness needs no key
    # the answers really have that shape
    r = httpx.post(base_url + "/filter", json={"query": "q", "snippets": ["a"]})
    assert r.status_code == 401 and isinstance(r.json()["detail"], str)
    r = httpx.post(base_url + "/query", json={"query": "q"}, headers={"X-API-Key": API_KEY})
    assert r.status_code == 404 and isinstance(r.json()["detail"], str)
    assert httpx.get(index_url + "/openapi.json", headers={"X-API-Key": API_KEY}).json()[
        "paths"].keys() == schema["paths"].keys()


def test_openapi_without_key_has_no_security(field_url: str) -> None:
    """A service started without an API key declares no security and no 401."""
    schema = httpx.get(field_url + "/openapi.json").json()
    op = schema["paths"]["/filter"]["post"]
    assert "security" not in op and "401" not in op["responses"]
    assert {"413", "422"} <= set(op["responses"])


def test_filter_matches_library(
    client: httpx.Client, reference: ConformalFilter, xquad_en: list[Pair]
) -> None:
    query, snippets = _query_and_snippets(xquad_en, 400, 10)
    r = client.post("/filter", json={"query": query, "snippets": snippets})
    assert r.status_code == 200, r.text
    body = r.json()
    _assert_same(_got(body), _expected(reference, query, snippets))
    assert body["guarantee"]["alpha"] == pytest.approx(0.2)
    assert 0 < len(body["kept"]) < len(snippets)  # the filter does something on this input


def test_min_keep_and_empty(client: httpx.Client, reference: ConformalFilter) -> None:
    snippets = ["zebra migration patterns in the serengeti", "the boiling point of tungsten"]
    query = "Which team won Super Bowl 50?"
    r = client.post("/filter", json={"query": query, "snippets": snippets, "min_keep": 1})
    assert r.status_code == 200, r.text
    _assert_same(_got(r.json()), _expected(reference, query, snippets, min_keep=1))
    assert len(r.json()["kept"]) >= 1
    r = client.post("/filter", json={"query": query, "snippets": []})
    assert r.status_code == 200
    assert r.json()["kept"] == [] and r.json()["scores"] == [] and r.json()["removal"] == 0.0


def test_auth(base_url: str) -> None:
    payload = {"query": "q", "snippets": ["a"]}
    assert httpx.post(base_url + "/filter", json=payload).status_code == 401
    assert (
        httpx.post(
            base_url + "/filter", json=payload, headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 401
    )
    assert (
        httpx.post(
            base_url + "/filter", json=payload, headers={"X-API-Key": API_KEY + "x"}
        ).status_code
        == 401
    )
    assert (
        httpx.post(base_url + "/filter", json=payload, headers={"X-API-Key": API_KEY}).status_code
        == 200
    )
    assert (
        httpx.post(
            base_url + "/filter", json=payload, headers={"Authorization": f"Bearer {API_KEY}"}
        ).status_code
        == 200
    )


def test_oversized_body(client: httpx.Client) -> None:
    big = {"query": "q", "snippets": ["x" * (MAX_BODY + 10)]}
    r = client.post("/filter", json=big)  # Content-Length path
    assert r.status_code == 413
    assert str(MAX_BODY) in r.json()["detail"]
    data = json.dumps(big).encode()

    def chunks() -> Iterator[bytes]:  # chunked upload: no Content-Length
        for i in range(0, len(data), 16_384):
            yield data[i : i + 16_384]

    r = client.post("/filter", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b'{"query": "q", "snippets": [', "json"),
        (b'{"query": "", "snippets": ["a"]}', "query"),
        (b'{"query": "   ", "snippets": ["a"]}', "blank"),
        (b'{"snippets": ["a"]}', "query"),
        (b'{"query": "q", "snippets": "abc"}', "snippets"),
        (b'{"query": "q", "snippets": [1, 2]}', "snippets"),
        (b'{"query": 5, "snippets": ["a"]}', "query"),
        (b'{"query": "q", "snippets": [{"snippet_id": "x"}]}', "text"),
        (b'{"query": "q", "snippets": ["a"], "min_keep": -1}', "min_keep"),
        (b'{"query": "q", "snippets": [{"group": "en"}]}', "text"),
        (b'{"query": "q", "snippets": [{"score": "0.5"}]}', "score"),
        (b'{"query": "q", "snippets": [{"score": true}]}', "score"),
        (b'{"query": "q", "snippets": [{"score": NaN}]}', "finite"),
        (b'{"query": "q", "snippets": [{"text": "a", "vector": []}]}', "vector"),
        (b'{"query": "q", "query_vector": [1.0, Infinity], "snippets": []}', "finite"),
        (b'{"query": "q", "snippets": ["a"], "group": 3}', "group"),
    ],
)
def test_malformed_requests(client: httpx.Client, payload: bytes, needle: str) -> None:
    r = client.post("/filter", content=payload, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert needle in r.text.lower()


def test_too_many_snippets(client: httpx.Client) -> None:
    r = client.post("/filter", json={"query": "q", "snippets": ["a"] * (MAX_SNIPPETS + 1)})
    assert r.status_code == 413
    assert str(MAX_SNIPPETS) in r.json()["detail"]


def test_concurrent_requests(
    client: httpx.Client, reference: ConformalFilter, xquad_en: list[Pair]
) -> None:
    jobs = [_query_and_snippets(xquad_en, 500 + 7 * i, 6) for i in range(20)]
    expected = [_expected(reference, q, s) for q, s in jobs]

    def call(job: tuple[str, list[Any]]) -> httpx.Response:
        return client.post("/filter", json={"query": job[0], "snippets": job[1]})

    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(call, jobs))
    assert [r.status_code for r in responses] == [200] * 20
    for r, exp in zip(responses, expected):
        _assert_same(_got(r.json()), exp)


def test_non_loopback_bind_needs_key(artifact: Path) -> None:
    assert (
        is_loopback_host("127.0.0.1") and is_loopback_host("localhost") and is_loopback_host("::1")
    )
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("example.com")
    with pytest.raises(ValueError, match="0.0.0.0.*API key"):
        run_server(artifact, host="0.0.0.0", port=1)


def test_bad_limits(artifact: Path) -> None:
    with pytest.raises(ValueError, match="max_snippets == 0"):
        create_app(artifact, max_snippets=0)


# ---------------------------------------------------------------- POST /query (index)
MAX_K = 8


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Path:
    """A real LanceDB index of three XQuAD English articles (one file each)."""
    from ragsieve.data.xquad import xquad_file
    from ragsieve.store import SnippetIndex

    root = tmp_path_factory.mktemp("served-index")
    raw = json.loads(xquad_file("en", data_dir=shared_data_dir).read_text(encoding="utf-8"))
    for article in raw["data"][:3]:
        text = "\n\n".join(p["context"] for p in article["paragraphs"][:6])
        (root / "docs").mkdir(exist_ok=True)
        (root / "docs" / f"{article['title']}.txt").write_text(text, encoding="utf-8")
    SnippetIndex.open(root / "idx", create=True).index_directory(root / "docs")
    return root / "idx"


@pytest.fixture(scope="module")
def index_url(artifact: Path, index_dir: Path, embedding_cache_dir: Path) -> Iterator[str]:
    app = create_app(
        artifact,
        api_key=API_KEY,
        index_path=index_dir,
        max_k=MAX_K,
        scorer_options={"cache_dir": embedding_cache_dir},
    )
    with ThreadServer(app) as srv:
        yield srv.url


def _expected_query(
    reference: ConformalFilter, index_dir: Path, query: str, k: int
) -> dict[str, Any]:
    from ragsieve.filtered_search import query_with_filter
    from ragsieve.store import SnippetIndex

    hits, res = query_with_filter(SnippetIndex.open(index_dir), query, reference, k=k)
    kept = {s.index for s in res.kept}
    return {
        "hits": [(h.snippet_id, h.text, i in kept) for i, h in enumerate(hits)],
        "distance": [h.score for h in hits],
        "threshold": res.threshold,
        "removal": res.removal,
    }


def _got_query(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "hits": [(h["snippet_id"], h["text"], h["kept"]) for h in body["hits"]],
        "distance": [h["distance"] for h in body["hits"]],
        "threshold": body["threshold"],
        "removal": body["removal"],
    }


def _assert_same_query(got: dict[str, Any], exp: dict[str, Any]) -> None:
    assert got["hits"] == exp["hits"]
    assert got["distance"] == pytest.approx(exp["distance"], abs=1e-5)
    assert got["threshold"] == pytest.approx(exp["threshold"])
    assert got["removal"] == pytest.approx(exp["removal"])


QUESTIONS = [
    "Which NFL team represented the AFC at Super Bowl 50?",
    "What is the name of the stadium where Super Bowl 50 was played?",
    "Who won Super Bowl 50?",
    "Which network broadcast the game in the United States?",
    "Who was the Most Valuable Player of the game?",
    "How many yards did the Broncos gain?",
]


def test_query_matches_library(index_url: str, reference: ConformalFilter, index_dir: Path) -> None:
    headers = {"X-API-Key": API_KEY}
    question = "Who won Super Bowl 50?"  # the answer's snippet is kept, the others are not
    r = httpx.post(
        index_url + "/query", json={"query": question, "k": 6}, headers=headers, timeout=60
    )
    assert r.status_code == 200, r.text
    body = r.json()
    _assert_same_query(_got_query(body), _expected_query(reference, index_dir, question, 6))
    assert len(body["hits"]) == 6 and body["n_kept"] == sum(h["kept"] for h in body["hits"])
    assert all(h["kept"] == (h["score"] <= body["threshold"]) for h in body["hits"])
    assert 0 < body["n_kept"] < 6  # the filter does something on this query
    assert body["guarantee"]["alpha"] == pytest.approx(0.2)
    health = httpx.get(index_url + "/healthz").json()
    assert health["index"]["n_snippets"] > 6 and health["index"]["model"].endswith(
        "all-MiniLM-L6-v2"
    )


def test_healthz_shows_index_name_only(index_url: str, index_dir: Path) -> None:
    """``/healthz`` names the index directory without its path (no filesystem layout)."""
    r = httpx.get(index_url + "/healthz")
    assert r.status_code == 200
    assert r.json()["index"]["name"] == index_dir.name == "idx"
    assert str(index_dir.parent) not in r.text and "path" not in r.json()["index"]


def test_query_min_keep(index_url: str) -> None:
    r = httpx.post(
        index_url + "/query",
        headers={"X-API-Key": API_KEY},
        timeout=60,
        json={"query": "zebra migration patterns in the serengeti", "k": 3, "min_keep": 2},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["n_kept"] >= 2
    assert (
        body["note"] is not None and "min_keep=2" in body["note"]
    )  # kept by the policy, not by tau


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        ({"query": "q", "k": MAX_K + 1}, 413, str(MAX_K)),
        ({"query": "q", "k": 0}, 422, "k"),
        ({"query": "   "}, 422, "blank"),
        ({"query": "q", "top": 3}, 422, "top"),
        ({"k": 3}, 422, "query"),
    ],
)
def test_query_bad_requests(
    index_url: str, payload: dict[str, Any], status: int, needle: str
) -> None:
    r = httpx.post(index_url + "/query", json=payload, headers={"X-API-Key": API_KEY}, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.text.lower()


def test_query_needs_key_and_index(index_url: str, base_url: str) -> None:
    assert httpx.post(index_url + "/query", json={"query": "q"}, timeout=60).status_code == 401
    r = httpx.post(
        base_url + "/query", json={"query": "q"}, headers={"X-API-Key": API_KEY}, timeout=60
    )
    assert r.status_code == 404 and "--index" in r.json()["detail"]
    assert httpx.get(base_url + "/healthz").json()["index"] is None


def test_query_concurrent(index_url: str, reference: ConformalFilter, index_dir: Path) -> None:
    expected = [_expected_query(reference, index_dir, q, 5) for q in QUESTIONS]
    with (
        httpx.Client(base_url=index_url, headers={"X-API-Key": API_KEY}, timeout=60) as c,
        ThreadPoolExecutor(max_workers=6) as pool,
    ):
        responses = list(pool.map(lambda q: c.post("/query", json={"query": q, "k": 5}), QUESTIONS))
    assert [r.status_code for r in responses] == [200] * len(QUESTIONS)
    for r, exp in zip(responses, expected):
        _assert_same_query(_got_query(r.json()), exp)


def test_index_and_filter_must_match(
    tmp_path: Path, reference: ConformalFilter, index_dir: Path
) -> None:
    from ragsieve.errors import ScorerMismatchError

    other = tmp_path / "usem3.json"
    ConformalFilter(EmbeddingScorer("usem3-multilingual"), reference.calibrator).save(other)
    with pytest.raises(ScorerMismatchError, match="usem3"):
        create_app(other, index_path=index_dir, warmup=False)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        create_app(other, index_path=tmp_path / "missing", warmup=False)


# ---------------------------------------------------------------- vectors instead of text
def _vectors(
    reference: ConformalFilter, query: str, texts: list[str]
) -> tuple[list[float], list[list[float]]]:
    """Unit-norm embeddings of the query and texts, as the embedding scorer computes them."""
    vecs = reference.scorer.cache.embed([query, *texts])
    return vecs[0].tolist(), [v.tolist() for v in vecs[1:]]


def test_vectors_match_text_path(
    client: httpx.Client, reference: ConformalFilter, xquad_en
) -> None:
    pairs = xquad_en[400:410]
    query, texts = pairs[0].query, [p.text for p in pairs]
    qvec, svecs = _vectors(reference, query, texts)
    by_text = client.post("/filter", json={"query": query, "snippets": texts})
    with_text = [{"text": t, "vector": v} for t, v in zip(texts, svecs)]
    by_vector = client.post(
        "/filter", json={"query": query, "query_vector": qvec, "snippets": with_text}
    )
    assert by_text.status_code == 200 and by_vector.status_code == 200, by_vector.text
    a, b = _got(by_text.json()), _got(by_vector.json())
    assert b["kept"] == a["kept"] and 0 < len(a["kept"]) < len(texts)
    assert b["scores"] == pytest.approx(a["scores"], abs=1e-5)
    assert b["threshold"] == pytest.approx(a["threshold"])
    # vectors alone (no text): same kept positions and scores
    only = [{"vector": v, "snippet_id": f"v{i}"} for i, v in enumerate(svecs)]
    r = client.post("/filter", json={"query": query, "query_vector": qvec, "snippets": only})
    assert r.status_code == 200, r.text
    assert [s["index"] for s in r.json()["kept"]] == [k[0] for k in a["kept"]]
    assert [s["snippet_id"] for s in r.json()["kept"]] == [f"v{k[0]}" for k in a["kept"]]
    assert r.json()["scores"] == pytest.approx(a["scores"], abs=1e-5)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("string snippet", "vector"),
        ("short vector", "length 3"),
        ("missing vector", "vector"),
        ("no query_vector", "query_vector"),
    ],
)
def test_vector_requests_refused(client: httpx.Client, case: str, needle: str) -> None:
    qvec = [0.6, 0.8, 0.0, 0.0]
    payload: dict[str, Any] = {
        "string snippet": {"query": "q", "query_vector": qvec, "snippets": ["a"]},
        "short vector": {
            "query": "q",
            "query_vector": qvec,
            "snippets": [{"vector": [1.0, 0.0, 0.0]}],
        },
        "missing vector": {
            "query": "q",
            "query_vector": qvec,
            "snippets": [{"vector": qvec}, {"text": "b"}],
        },
        "no query_vector": {"query": "q", "snippets": [{"text": "a", "vector": qvec}]},
    }[case]
    r = client.post("/filter", json=payload)
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]


# ---------------------------------------------------------------- outside scores (field scorer)
def _with_rerank(pairs: list[Pair], scorer: EmbeddingScorer) -> list[Pair]:
    """The pairs with an outside score ``meta["rerank"]`` (cosine: higher = more relevant)."""
    cosine = 1.0 - scorer.score_pairs(pairs)
    return [
        dataclasses.replace(p, meta={**p.meta, "rerank": float(c)}) for p, c in zip(pairs, cosine)
    ]


@pytest.fixture(scope="module")
def field_filter(
    tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair], minilm_scorer: EmbeddingScorer
) -> tuple[Path, ConformalFilter]:
    from ragsieve.scoring import resolve_scorer

    flt = ConformalFilter(
        resolve_scorer("field", field="rerank", higher_is_better=True), "marginal", alpha=0.2
    )
    flt.calibrate(_with_rerank(xquad_en[:300], minilm_scorer))
    path = tmp_path_factory.mktemp("server-field") / "field.json"
    flt.save(path)
    return path, ConformalFilter.load(path)


@pytest.fixture(scope="module")
def field_url(field_filter: tuple[Path, ConformalFilter]) -> Iterator[str]:
    with ThreadServer(create_app(field_filter[0], max_snippets=MAX_SNIPPETS)) as srv:
        yield srv.url


def test_field_filter_takes_scores(
    field_url: str,
    field_filter: tuple[Path, ConformalFilter],
    xquad_en: list[Pair],
    minilm_scorer: EmbeddingScorer,
) -> None:
    flt = field_filter[1]
    health = httpx.get(field_url + "/healthz").json()["artifact"]
    assert health["scorer"]["scorer"] == "field" and health["mode"] == "marginal"
    assert health["guaranteed_metric"] == flt.guarantee()["metric"]
    pairs = _with_rerank(xquad_en[400:410], minilm_scorer)
    query = pairs[0].query
    snippets = [{"score": p.meta["rerank"], "snippet_id": f"s{i}"} for i, p in enumerate(pairs)]
    r = httpx.post(field_url + "/filter", json={"query": query, "snippets": snippets}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    exp = flt.filter(query, snippets)
    assert [s["snippet_id"] for s in body["kept"]] == exp.kept_ids
    assert body["scores"] == pytest.approx(exp.scores, abs=1e-9)
    assert body["threshold"] == pytest.approx(exp.threshold)
    assert body["guarantee"]["mode"] == "marginal"


@pytest.mark.parametrize(
    "payload",
    [
        {"query": "q", "snippets": [{"text": "no score here"}]},
        {"query": "q", "snippets": ["a plain string"]},
        {
            "query": "q",
            "query_vector": [1.0, 0.0],
            "snippets": [{"vector": [1.0, 0.0], "score": 0.3}],
        },
    ],
)
def test_field_filter_refuses_without_score(field_url: str, payload: dict[str, Any]) -> None:
    r = httpx.post(field_url + "/filter", json=payload, timeout=60)
    assert r.status_code == 422, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]


# ---------------------------------------------------------------- group-conditional filter
@pytest.fixture(scope="module")
def group_filter(
    tmp_path_factory: pytest.TempPathFactory,
    xquad_en: list[Pair],
    shared_data_dir: Path,
    minilm_scorer: EmbeddingScorer,
) -> tuple[Path, ConformalFilter]:
    from ragsieve.data import load_xquad

    xquad_de = load_xquad("de", data_dir=shared_data_dir)
    pairs = [*xquad_en[:300], *xquad_de[:300]]  # meta["language"] is "en" / "de"
    flt = ConformalFilter(minilm_scorer, "group", alpha=0.2).calibrate(pairs, group_by="language")
    path = tmp_path_factory.mktemp("server-group") / "group.json"
    flt.save(path)
    return path, ConformalFilter.load(path, scorer=minilm_scorer)


@pytest.fixture(scope="module")
def group_url(
    group_filter: tuple[Path, ConformalFilter], embedding_cache_dir: Path
) -> Iterator[str]:
    app = create_app(group_filter[0], scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv:
        yield srv.url


def test_group_filter_needs_a_group(
    group_url: str, group_filter: tuple[Path, ConformalFilter], xquad_en
) -> None:
    flt = group_filter[1]
    health = httpx.get(group_url + "/healthz").json()["artifact"]
    assert health["mode"] == "group" and health["group_by"] == "language"
    assert health["guaranteed_metric"] == flt.guarantee()["metric"]
    pairs = xquad_en[400:410]
    query, texts = pairs[0].query, [p.text for p in pairs]
    r = httpx.post(group_url + "/filter", json={"query": query, "snippets": texts}, timeout=60)
    assert r.status_code == 422, r.text
    assert "group" in r.json()["detail"] or "language" in r.json()["detail"]

    exp = flt.filter(query, texts, group="en")
    r = httpx.post(
        group_url + "/filter", json={"query": query, "snippets": texts, "group": "en"}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert [s["index"] for s in r.json()["kept"]] == [s.index for s in exp.kept]
    assert r.json()["scores"] == pytest.approx(exp.scores, abs=1e-6)
    assert r.json()["guarantee"]["mode"] == "group"

    per_snippet = [{"text": t, "group": "en"} for t in texts]
    r = httpx.post(
        group_url + "/filter", json={"query": query, "snippets": per_snippet}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert [s["index"] for s in r.json()["kept"]] == [s.index for s in exp.kept]
    assert r.json()["scores"] == pytest.approx(exp.scores, abs=1e-6)


def test_group_filter_per_snippet_groups(
    group_url: str, group_filter: tuple[Path, ConformalFilter], xquad_en
) -> None:
    """Snippets of two groups in one request: each kept by its own group's threshold."""
    pairs = xquad_en[400:410]
    query = pairs[0].query
    snippets = [{"text": p.text, "group": "en" if i % 2 else "de"} for i, p in enumerate(pairs)]
    r = httpx.post(group_url + "/filter", json={"query": query, "snippets": snippets}, timeout=60)
    assert r.status_code == 200, r.text
    exp = group_filter[1].filter(query, snippets)
    assert [s["index"] for s in r.json()["kept"]] == [s.index for s in exp.kept]


# ---------------------------------------------------------------- hostile bodies (issue 11)
_FILTER_REST = b'"snippets": ["a"]'
_QUERY_REST = b'"k": 2'
_DEEP = 10_000
#: (case, body template with %s for the endpoint's other fields, endpoints it applies to)
HOSTILE_BODIES: list[tuple[str, bytes, str]] = [
    ("NaN min_keep", b'{"query": "x", %s, "min_keep": NaN}', "filter,query"),
    ("Infinity min_keep", b'{"query": "x", %s, "min_keep": Infinity}', "filter,query"),
    ("-Infinity min_keep", b'{"query": "x", %s, "min_keep": -Infinity}', "filter,query"),
    ("NaN query", b'{"query": NaN, %s}', "filter,query"),
    ("Infinity group", b'{"query": "x", %s, "group": Infinity}', "filter,query"),
    ("1e400 min_keep", b'{"query": "x", %s, "min_keep": 1e400}', "filter,query"),
    ("NaN k", b'{"query": "x", "k": NaN}', "query"),
    ("-Infinity k", b'{"query": "x", "k": -Infinity}', "query"),
    ("NaN snippet", b'{"query": "x", "snippets": [NaN]}', "filter"),
    ("-Infinity score", b'{"query": "x", "snippets": [{"score": -Infinity}]}', "filter"),
    ("NaN score", b'{"query": "x", "snippets": [{"text": "a", "score": NaN}]}', "filter"),
    (
        "Infinity vector",
        b'{"query": "x", "query_vector": [1.0], "snippets": [{"vector": [Infinity]}]}',
        "filter",
    ),
    ("surrogate query", b'{"query": "\\ud800", %s}', "filter,query"),
    ("surrogate query tail", b'{"query": "who \\udfff?", %s}', "filter,query"),
    ("surrogate group", b'{"query": "x", %s, "group": "\\ud83d"}', "filter,query"),
    ("surrogate key", b'{"query": "x", %s, "\\ud800": 1}', "filter,query"),
    ("surrogate snippet", b'{"query": "x", "snippets": ["a \\ud800 b"]}', "filter"),
    ("surrogate text", b'{"query": "x", "snippets": [{"text": "\\udc00"}]}', "filter"),
    (
        "surrogate snippet_id",
        b'{"query": "x", "snippets": [{"text": "a", "snippet_id": "\\ud800"}]}',
        "filter",
    ),
    ("invalid UTF-8", b'{"query": "\xff\xfe", %s}', "filter,query"),
    ("UTF-8 encoded surrogate", b'{"query": "\xed\xa0\x80", %s}', "filter,query"),
    ("truncated", b'{"query": "x", %s', "filter,query"),
    ("truncated string", b'{"query": "x', "filter,query"),
    ("array body", b'["x", "a"]', "filter,query"),
    ("string body", b'"x"', "filter,query"),
    ("number body", b"42", "filter,query"),
    ("null body", b"null", "filter,query"),
    ("true body", b"true", "filter,query"),
    (
        "nested arrays",
        b'{"query": "x", "snippets": ' + b"[" * _DEEP + b"]" * _DEEP + b"}",
        "filter",
    ),
    (
        "nested objects",
        b'{"query": ' + b'{"a": ' * _DEEP + b"1" + b"}" * _DEEP + b"}",
        "filter,query",
    ),
    ("huge min_keep", b'{"query": "x", %s, "min_keep": 1' + b"0" * 400 + b"}", "filter,query"),
    ("huge k", b'{"query": "x", "k": 1' + b"0" * 400 + b"}", "query"),
    ("too many digits", b'{"query": "x", %s, "min_keep": 1' + b"0" * 5000 + b"}", "filter,query"),
    ("duplicate keys", b'{"query": "x", "query": "y", %s}', "filter,query"),
    (
        "duplicate snippet keys",
        b'{"query": "x", "snippets": [{"text": "a", "text": "b"}]}',
        "filter",
    ),
    ("extra field", b'{"query": "x", %s, "extra": 1}', "filter,query"),
    ("extra snippet field", b'{"query": "x", "snippets": [{"text": "a", "x": 1}]}', "filter"),
]
#: (case, content type) of valid JSON sent as something else (None: no header).
WRONG_CONTENT_TYPES: list[tuple[str, str | None]] = [
    ("text/plain", "text/plain"),
    ("no content type", None),
    ("form", "application/x-www-form-urlencoded"),
]


def _hostile_cases() -> list[Any]:
    cases = []
    for case, template, endpoints in HOSTILE_BODIES:
        for endpoint in endpoints.split(","):
            rest = _FILTER_REST if endpoint == "filter" else _QUERY_REST
            body = template % rest if b"%s" in template else template
            cases.append(pytest.param(endpoint, body, "application/json", id=f"{endpoint}-{case}"))
    for endpoint in ("filter", "query"):
        rest = _FILTER_REST if endpoint == "filter" else _QUERY_REST
        valid = b'{"query": "x", %s}' % rest
        for case, content_type in WRONG_CONTENT_TYPES:
            cases.append(pytest.param(endpoint, valid, content_type, id=f"{endpoint}-{case}"))
        cases.append(
            pytest.param(
                endpoint,
                b'{"query": "\xff", %s}' % rest,
                "text/plain",
                id=f"{endpoint}-text/plain invalid UTF-8",
            )
        )
        cases.append(pytest.param(endpoint, b"", "application/json", id=f"{endpoint}-empty body"))
    return cases


@pytest.fixture(scope="module")
def hostile_urls(base_url: str, index_url: str) -> dict[str, str]:
    """``/filter`` on the plain service, ``/query`` on the one with an index (so a body
    that passes validation is answered 200, not 404)."""
    return {"filter": base_url + "/filter", "query": index_url + "/query"}


@pytest.mark.parametrize("endpoint", ["filter", "query"])
def test_hostile_control_is_accepted(hostile_urls: dict[str, str], endpoint: str) -> None:
    """The valid body the hostile cases are built from is answered 200."""
    rest = _FILTER_REST if endpoint == "filter" else _QUERY_REST
    r = httpx.post(
        hostile_urls[endpoint],
        content=b'{"query": "x", %s}' % rest,
        headers={"Content-Type": "application/json", "X-API-Key": API_KEY},
        timeout=60,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("endpoint", "body", "content_type"), _hostile_cases())
def test_hostile_bodies_get_4xx_json(
    hostile_urls: dict[str, str],
    endpoint: str,
    body: bytes,
    content_type: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every malformed body gets a 4xx whose body is JSON with a ``detail``; never a 500.

    Nothing the server logs about it holds a lone surrogate (every record encodes).
    """
    caplog.set_level(logging.INFO, logger="ragsieve")
    headers = {"X-API-Key": API_KEY}
    if content_type is not None:
        headers["Content-Type"] = content_type
    r = httpx.post(hostile_urls[endpoint], content=body, headers=headers, timeout=60)
    assert 400 <= r.status_code <= 499, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json")
    payload = json.loads(r.content.decode("utf-8"))  # strict UTF-8: no lone surrogate echoed
    assert payload["detail"]
    # the server is still serving
    assert httpx.get(hostile_urls[endpoint].rsplit("/", 1)[0] + "/healthz").status_code == 200
    for record in caplog.records:
        record.getMessage().encode("utf-8")


# ---------------------------------------------------------------- idle and slow connections
#: The socket timeout of these tests: far above the server's timeouts, so a server that
#: closes idle connections is seen closing well before it, and one that never does fails.
_SOCKET_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def guarded_port(artifact: Path, embedding_cache_dir: Path) -> Iterator[int]:
    """A service with short connection timeouts (1 s keep-alive, 1 s head, 1 s body)."""
    app = create_app(
        artifact,
        warmup=False,
        body_timeout=1,
        scorer_options={"cache_dir": embedding_cache_dir},
    )
    server = ThreadServer(app, timeout_keep_alive=1, timeout_request_header=1)
    with server:
        yield server.port


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=_SOCKET_TIMEOUT)
    sock.settimeout(_SOCKET_TIMEOUT)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(v)
        for k, _, v in (h.partition(":") for h in lines[1:])
        if k.strip().lower() == "content-length"
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(lines[0].split()[1]), body


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes the connection (recv returns b'') before the timeout.

    Raises ``TimeoutError`` when the server keeps it open for the whole socket timeout.
    """
    with sock:
        return sock.recv(1024) == b""


_GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize(
    "first",
    [b"", b"POST /fil", b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"],
    ids=["silent connection", "partial request line", "partial headers"],
)
def test_idle_connection_is_closed(guarded_port: int, first: bytes) -> None:
    """A connection that never completes a request head is closed by the server."""
    sock = _connect(guarded_port)
    if first:
        sock.sendall(first)
    assert _closed_by_server(sock)


@pytest.mark.parametrize("then", [b"", b"GET /heal"], ids=["idle", "partial next request"])
def test_keep_alive_connection_is_closed(guarded_port: int, then: bytes) -> None:
    """After a response, an idle (or slowly writing) keep-alive connection is closed."""
    sock = _connect(guarded_port)
    sock.sendall(_GET_HEALTHZ)
    status, body = _read_response(sock)
    assert status == 200 and json.loads(body)["status"] == "ok"
    sock.sendall(_GET_HEALTHZ)  # the connection is reused while the client is active
    assert _read_response(sock)[0] == 200
    if then:
        sock.sendall(then)
    assert _closed_by_server(sock)


def test_slow_body_gets_408(guarded_port: int) -> None:
    """A body that does not arrive in time gets 408 with a JSON detail, then the close."""
    sock = _connect(guarded_port)
    sock.sendall(
        b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"query": "x", '
    )
    status, body = _read_response(sock)
    assert status == 408 and "body" in json.loads(body)["detail"]
    assert _closed_by_server(sock)


def test_connection_timeouts_validated(artifact: Path) -> None:
    with pytest.raises(ValueError, match="timeout_request_header == 0"):
        uvicorn_config(None, timeout_request_header=0)
    with pytest.raises(ValueError, match="timeout_keep_alive == -1"):
        uvicorn_config(None, timeout_keep_alive=-1)
    with pytest.raises(ValueError, match="timeout_request_header == nan"):
        run_server(artifact, timeout_request_header=float("nan"))  # refused before serving
    with pytest.raises(TypeError, match=r"body_timeout must be a real number > 0 \(seconds\), got str"):
        create_app(artifact, body_timeout="x", warmup=False)  # type: ignore[arg-type]


# ---------------------------------------------------------------- long snippets (issue 11)
def test_long_snippet_reports_spans(
    client: httpx.Client, reference: ConformalFilter, xquad_en: list[Pair]
) -> None:
    """A snippet longer than the filter's window is cut into pieces: the answer says how
    many were cut and which spans of a kept one were kept, as the library does."""
    target = xquad_en[400]
    filler = " ".join(p.text for p in xquad_en[600:603] if p.text != target.text)
    long_text = filler + " " + target.text  # the answer comes after ~2k characters
    snippets: list[Any] = [long_text, {"text": "zebra migration patterns", "snippet_id": "z"}]
    r = client.post("/filter", json={"query": target.query, "snippets": snippets})
    assert r.status_code == 200, r.text
    body = r.json()
    exp = reference.filter(target.query, snippets)
    assert exp.n_cut == 1 and body["n_cut"] == 1
    assert [(s["index"], s["spans"]) for s in body["kept"]] == [
        (s.index, [list(span) for span in s.spans]) for s in exp.kept
    ]
    kept = {s["index"]: s for s in body["kept"]}
    assert 0 in kept and kept[0]["spans"]  # kept for its answer, and the spans say where
    assert all(0 <= a < b <= len(long_text) for a, b in kept[0]["spans"])
    assert kept[0]["spans"][-1][1] == len(long_text)  # the answer is at the end
    assert "spans" in body["note"]
    short = client.post("/filter", json={"query": target.query, "snippets": [target.text[:300]]})
    assert short.json()["n_cut"] == 0 and all(s["spans"] == [] for s in short.json()["kept"])
