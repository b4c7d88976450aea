"""The service's page at ``GET /``: a real uvicorn server and the real headless Chromium.

The page is loaded, a query and snippets are typed and submitted, and the kept and removed
lists read from the DOM are checked against a direct ``POST /filter`` of the same input;
with an index served, a query typed in the index form is checked against a direct ``POST
/query``, and without one the form is absent. The key guards the page (Basic challenge)
and Basic credentials work on the API from the page's own origin only.
"""

from __future__ import annotations

import base64
import json
import random
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("selenium")
httpx = pytest.importorskip("httpx")

from browser import chrome, network_requests, screenshot, set_headers  # noqa: F401
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from servers import serving

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.scoring import resolve_scorer
from ragsieve.server.page import RecentRequests

KEY = "page-test-key"
BASIC = "Basic " + base64.b64encode(f"any-user:{KEY}".encode()).decode()
XSS = '<img src=x onerror="window.__pwned = 1"> <script>window.__pwned = 2</script>'


@pytest.fixture(scope="module")
def keyed(served_artifact: Any, embedding_cache_dir: Path) -> Iterator[str]:
    """One real server with an API key for the module (real MiniLM artifact)."""
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    with serving(artifact, api_key=KEY, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        yield srv.url


@pytest.fixture()
def browser(chrome: Any) -> Iterator[Any]:  # noqa: F811
    """The session's Chromium, its extra headers cleared after the test."""
    network_requests(chrome)
    try:
        yield chrome
    finally:
        set_headers(chrome, {})
        chrome.get("about:blank")
        network_requests(chrome)


def _input(xquad_en: list[Pair], url: str) -> tuple[str, list[str]]:
    """A held-out query and some of its list (cut short) that the filter splits: some
    snippets kept, some removed, plus the markup snippet."""
    by_query: dict[str, list[Pair]] = {}
    for p in xquad_en[300:]:
        by_query.setdefault(p.query_id, []).append(p)
    for pairs in by_query.values():
        texts = [" ".join(p.text.split())[:240] for p in pairs[:5]] + [XSS]
        res = _filter(url, pairs[0].query, texts)
        if res["kept"] and res["removed"]:
            return pairs[0].query, texts
    raise AssertionError("no held-out query whose list the filter splits")


def _filter(url: str, query: str, snippets: list[Any]) -> dict[str, Any]:
    r = httpx.post(url + "/filter", json={"query": query, "snippets": snippets},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _rows(driver: Any, table: str) -> list[tuple[str, float, str, str]]:
    """(id, raw score, shown score, text) of a result table's rows, read from the DOM."""
    out = []
    for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"):
        text = tr.find_element(By.CSS_SELECTOR, "td.text").get_property("textContent")
        shown = tr.find_element(By.CSS_SELECTOR, "td.score").get_property("textContent")
        out.append((tr.get_attribute("data-id"), float(tr.get_attribute("data-score")), shown,
                    text))
    return out


def _submit(driver: Any, query: str, snippets: str) -> None:
    driver.find_element(By.ID, "query").send_keys(query)
    driver.find_element(By.ID, "snippets").send_keys(snippets)
    _answer(driver, "submit")


def _answer(driver: Any, button: str) -> None:
    """Click ``button`` and wait for the answer (or an error)."""
    # None on a fresh page (no answer shown yet): compared as it is, not as "0", else the
    # wait below ends at once and the rows are read before the answer comes
    done = driver.find_element(By.ID, "result").get_attribute("data-done")
    driver.find_element(By.ID, button).click()
    WebDriverWait(driver, 120).until(
        lambda d: d.find_element(By.ID, "result").get_attribute("data-done") != done
        or d.find_element(By.ID, "error").text)
    assert driver.find_element(By.ID, "error").text == ""


def _load(driver: Any, url: str) -> None:
    driver.get(url + "/")
    WebDriverWait(driver, 60).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-status") == "loaded"
        or d.find_element(By.ID, "error").text)
    assert driver.find_element(By.ID, "error").text == ""


def _is_png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_page_filters_like_the_api(keyed: str, browser: Any, xquad_en: list[Pair],
                                   tmp_path: Path) -> None:
    """Typed in the page, filtered by POST /filter: the DOM lists what the API answers."""
    query, snippets = _input(xquad_en, keyed)
    expected = _filter(keyed, query, snippets)
    set_headers(browser, {"Authorization": BASIC})  # what a browser sends after the prompt
    _load(browser, keyed)
    # no index served: no /query form (the page asked /healthz)
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-index") == "none"
    assert browser.find_elements(By.ID, "query-form") == []
    status = httpx.get(keyed + "/status", headers={"X-API-Key": KEY}).json()
    assert status["statement"] and browser.find_element(By.ID, "statement").text == \
        status["statement"]
    assert "probability" in status["statement"]  # the guarantee in plain words
    rule = browser.find_element(By.ID, "keep-rule").text
    assert rule.startswith("keep 1 - cos <= ") and status["keep_rule"]["keep_if"] == "<="
    assert float(rule.rsplit(" ", 1)[1]) == pytest.approx(status["keep_rule"]["threshold"],
                                                          rel=1e-3)
    assert browser.find_element(By.ID, "drift-state").text == "no drift detected"
    assert f"after {status['monitor']['n_observed']} requests" in \
        browser.find_element(By.ID, "drift-detail").text

    _submit(browser, query, "\n".join(snippets))
    kept, removed = _rows(browser, "kept"), _rows(browser, "removed")
    assert [(r[0], r[3]) for r in kept] == [(s["snippet_id"], s["text"]) for s in expected["kept"]]
    assert [(r[0], r[3]) for r in removed] == [(s["snippet_id"], snippets[s["index"]])
                                               for s in expected["removed"]]
    assert [r[1] for r in kept + removed] == pytest.approx(
        [s["score"] for s in expected["kept"] + expected["removed"]], abs=1e-6)
    assert [float(r[2]) for r in kept] == pytest.approx([s["score"] for s in expected["kept"]],
                                                        rel=1e-3)
    assert kept and removed
    # each row's conformal p-value, as the API gave it; the rule in p-values said once
    shown_p = [float(td.get_property("textContent")) for table in ("kept", "removed")
               for td in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody td.p-value")]
    assert shown_p == pytest.approx(
        [s["p_value"] for s in expected["kept"] + expected["removed"]], abs=5e-4)
    alpha = expected["guarantee"]["alpha"]
    assert all(p > alpha for p in shown_p[:len(kept)])
    summary = browser.find_element(By.ID, "summary").text
    assert summary.startswith(f"Kept {len(kept)} of {len(snippets)} snippets")
    assert summary.endswith(expected["p_value_rule"] + ".")

    # the markup snippet is text: no element made of it, no script run
    assert XSS in [r[3] for r in kept + removed]
    assert browser.find_elements(By.CSS_SELECTOR, "#result img, #result td script") == []
    assert browser.execute_script("return window.__pwned === undefined")

    # the last requests: this one (the direct one before it too), counts only
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#recent tbody tr")) >= 2)
    newest = browser.find_element(By.CSS_SELECTOR, "#recent tbody tr td.counts").text
    assert newest == f"{len(kept)} / {len(snippets)}"
    assert browser.find_element(By.ID, "recent-summary").text.startswith("The last ")

    urls = network_requests(browser)
    assert urls and all(u.startswith(keyed + "/") for u in urls), urls
    assert {keyed + "/", keyed + "/status", keyed + "/healthz", keyed + "/filter"} <= set(urls)
    width, height = _is_png(screenshot(browser, tmp_path / "page.png"))
    assert width > 100 and height > 100


def test_page_works_on_the_browsers_own_basic_credentials(keyed: str, browser: Any) -> None:
    """No extra headers: the browser's Basic credentials (given in the URL, as after the
    prompt) load the page and its same-origin calls to /status and /filter."""
    with_credentials = keyed.replace("http://", f"http://any-user:{KEY}@")
    _load(browser, with_credentials)
    assert browser.find_element(By.ID, "keep-rule").text.startswith("keep 1 - cos <= ")
    _submit(browser, "Who led the Broncos?", "The Broncos were led by Peyton Manning.\nzqx")
    n = len(_rows(browser, "kept")) + len(_rows(browser, "removed"))
    assert n == 2


def test_page_is_behind_the_key(keyed: str) -> None:
    """No key: 401 with the Basic challenge; the key as Basic password or API header: the
    page, with its security headers; HEAD and other methods 405; the schema behind the key."""
    r = httpx.get(keyed + "/")
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Basic realm="ragsieve"'
    wrong = "Basic " + base64.b64encode(b"any-user:not-the-key").decode()
    assert httpx.get(keyed + "/", headers={"Authorization": wrong}).status_code == 401
    assert httpx.get(keyed + "/status").status_code == 401
    for headers in ({"Authorization": BASIC}, {"X-API-Key": KEY},
                    {"Authorization": f"Bearer {KEY}"}):
        r = httpx.get(keyed + "/", headers=headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)  # type: ignore[union-attr]
    assert f'<script nonce="{nonce}">' in r.text and "connect-src 'self'" in csp
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    assert "innerHTML" not in r.text and "http://" not in r.text and "https://" not in r.text
    again = httpx.get(keyed + "/", headers={"X-API-Key": KEY}).headers["content-security-policy"]
    assert again != csp  # a fresh nonce per answer
    assert httpx.head(keyed + "/", headers={"X-API-Key": KEY}).status_code == 405
    assert httpx.put(keyed + "/", headers={"X-API-Key": KEY}).status_code == 405
    schema = httpx.get(keyed + "/openapi.json", headers={"X-API-Key": KEY}).json()
    assert "/" not in schema["paths"] and "/status" in schema["paths"]
    assert httpx.get(keyed + "/docs", headers={"X-API-Key": KEY}).status_code == 404  # no CDN UI


def test_basic_credentials_work_from_the_page_only(keyed: str) -> None:
    """The browser's cached Basic credentials are refused unless the request is same-origin."""
    body = {"query": "Who wrote it?", "snippets": ["A short note."]}

    def post(**headers: str) -> httpx.Response:
        return httpx.post(keyed + "/filter", json=body, headers=headers, timeout=60)

    assert post(Authorization=BASIC, **{"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert post(Authorization=BASIC, **{"Sec-Fetch-Site": "same-site"}).status_code == 403
    assert post(Authorization=BASIC, Origin="http://evil.example").status_code == 403
    assert post(Authorization=BASIC).status_code == 403  # no proof of origin: use the headers
    assert post(Authorization=BASIC, **{"Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert post(Authorization=BASIC, Origin=keyed).status_code == 200
    # the API's own headers are never sent by a browser on its own: a read is answered from
    # anywhere; a state change from another site is refused even with the key
    assert httpx.get(keyed + "/status", headers={"X-API-Key": KEY,
                                                 "Sec-Fetch-Site": "cross-site"}).status_code == 200
    assert post(**{"X-API-Key": KEY, "Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert post(**{"X-API-Key": KEY}).status_code == 200
    r = httpx.get(keyed + "/status", headers={"Authorization": BASIC,
                                              "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and "same-origin" in r.json()["detail"]
    r = httpx.post(keyed + "/admin/reload", headers={"Authorization": BASIC,
                                                     "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403


@pytest.fixture(scope="module")
def open_field(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server without a key, of a filter calibrated on a higher-is-better outside score."""
    rng = random.Random(0)
    pairs = [Pair(query_id=f"q{q}", query=f"question {q}", snippet_id=f"s{j}", text=f"text {j}",
                  relevant=int(j == 0), meta={"rerank": rng.gauss(2.0 if j == 0 else 0.0, 1.0)})
             for q in range(60) for j in range(4)]
    flt = ConformalFilter(resolve_scorer("field", field="rerank", higher_is_better=True),
                          "marginal", alpha=0.2).calibrate(pairs)
    path = flt.save(tmp_path_factory.mktemp("page-field") / "field.json")
    with serving(path) as srv:
        yield srv.url


def test_open_page_reads_outside_scores_in_their_units(open_field: str, browser: Any) -> None:
    """Without a key the page is open; an outside score reads as the user's own 'rerank'."""
    assert httpx.get(open_field + "/").status_code == 200
    status = httpx.get(open_field + "/status").json()
    rule = status["keep_rule"]
    assert rule["score"] == "rerank" and rule["keep_if"] == ">=" and rule["score_sign"] == -1
    _load(browser, open_field)
    assert browser.find_element(By.ID, "keep-rule").text.startswith("keep rerank >= ")
    snippets = [{"text": "high", "rerank": 9.5}, {"text": "low", "rerank": -3.25}]
    _submit(browser, "question 1", json.dumps(snippets))
    kept, removed = _rows(browser, "kept"), _rows(browser, "removed")
    assert [(r[3], float(r[2])) for r in kept] == [("high", 9.5)]  # shown in rerank units
    assert [(r[3], float(r[2])) for r in removed] == [("low", -3.25)]
    against = browser.find_element(By.CSS_SELECTOR, "#removed td.against").text
    assert against.startswith("< ") and float(against[2:]) == pytest.approx(rule["threshold"],
                                                                             rel=1e-3)
    assert all(u.startswith(open_field + "/") for u in network_requests(browser))


@pytest.fixture(scope="module")
def indexed(served_artifact: Any, small_index: Path, embedding_cache_dir: Path) -> Iterator[str]:
    """A server without a key that serves the small XQuAD-en index (real MiniLM artifact)."""
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    with serving(artifact, index_path=small_index,
                 scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        yield srv.url


def test_page_queries_the_served_index(indexed: str, browser: Any) -> None:
    """With an index served, the page's index form lists what POST /query answers: the kept
    hits and the removed ones, each with its score and text, as for /filter."""
    query, k = "Who won Super Bowl 50?", 8
    expected = httpx.post(indexed + "/query", json={"query": query, "k": k}, timeout=120)
    assert expected.status_code == 200, expected.text
    hits = expected.json()["hits"]
    _load(browser, indexed)
    assert browser.find_element(By.ID, "query-form").is_displayed()
    index = httpx.get(indexed + "/healthz").json()["index"]
    assert browser.find_element(By.ID, "index-name").text.startswith(index["name"] + " (")
    browser.find_element(By.ID, "index-query").send_keys(query)
    browser.find_element(By.ID, "index-k").clear()
    browser.find_element(By.ID, "index-k").send_keys(str(k))
    _answer(browser, "index-submit")
    kept, removed = _rows(browser, "kept"), _rows(browser, "removed")
    assert kept and removed and len(kept) + len(removed) == k
    for rows, want in ((kept, [h for h in hits if h["kept"]]),
                       (removed, [h for h in hits if not h["kept"]])):
        assert [(r[0], r[3]) for r in rows] == [(h["snippet_id"], h["text"]) for h in want]
        assert [r[1] for r in rows] == pytest.approx([h["score"] for h in want], abs=1e-6)
        assert [float(r[2]) for r in rows] == pytest.approx([h["score"] for h in want], rel=1e-3)
    against = browser.find_element(By.CSS_SELECTOR, "#removed td.against").text
    assert against.startswith("> ")
    # /query's hits carry their p-values (marginal: kept exactly when p > alpha), shown per row
    body = expected.json()
    alpha = body["guarantee"]["alpha"]
    assert all((h["p_value"] > alpha) is h["kept"] for h in hits)
    shown_p = [float(td.get_property("textContent")) for table in ("kept", "removed")
               for td in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody td.p-value")]
    assert shown_p == pytest.approx([h["p_value"] for h in hits if h["kept"]]
                                    + [h["p_value"] for h in hits if not h["kept"]], abs=5e-4)
    summary = browser.find_element(By.ID, "summary").text
    assert summary.startswith(f"Kept {len(kept)} of {k} hits from the index {index['name']}")
    assert summary.endswith(body["p_value_rule"] + ".")
    urls = network_requests(browser)
    assert all(u.startswith(indexed + "/") for u in urls), urls
    assert {indexed + "/healthz", indexed + "/query"} <= set(urls)


def test_recent_requests_keep_counts_only_and_are_bounded() -> None:
    ring = RecentRequests(capacity=3)
    for i in range(5):
        ring.add("/filter", kept=i, total=5)
    items = ring.snapshot()
    assert [r.kept for r in items] == [2, 3, 4] and set(items[0].model_dump()) == {
        "time", "endpoint", "kept", "total"}
    with pytest.raises(ValueError, match="capacity == 0"):
        RecentRequests(capacity=0)
