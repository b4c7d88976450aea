"""Cross-site requests, foreign Host names, the API docs and the receiving cap of the service.

A real uvicorn server on 127.0.0.1 and the real headless Chromium: a page of another
loopback origin (a second server) fires ``fetch(..., {method: "POST", mode: "no-cors"})``
at a keyless service whose drift alarm has fired, and nothing changes; a ``Host`` that
does not name the service gets 400 (DNS rebinding); ``/docs`` loads nothing from outside
(it is off); the ``Origin`` check compares the scheme; slow bodies cannot hold more than
``max_receiving_bytes`` (raw sockets, ``Expect: 100-continue`` tells when the server has
started reading a body).
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("selenium")
httpx = pytest.importorskip("httpx")

from browser import chrome, network_requests  # noqa: F401
from servers import ThreadServer, serving
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from ragsieve import ConformalFilter, Pair
from ragsieve.cli import build_parser
from ragsieve.cli.serving import serve_options as cli_serve_options
from ragsieve.scoring import resolve_scorer
from ragsieve.server.options import ServeOptions
from ragsieve.server.security import same_origin, split_host

KEY = "cross-site-key"
BASIC = "Basic " + base64.b64encode(f"any-user:{KEY}".encode()).decode()
#: What a program (not a browser page) sends to a bodiless route.
CLIENT = {"X-Ragsieve": "1"}


def _field_filter(alpha: float) -> ConformalFilter:
    """A filter of a higher-is-better outside score (no model), with its monitor."""
    rng = random.Random(0)
    pairs = [Pair(query_id=f"q{q}", query=f"question {q}", snippet_id=f"s{j}", text=f"text {j}",
                  relevant=int(j == 0), meta={"rerank": rng.gauss(2.0 if j == 0 else 0.0, 1.0)})
             for q in range(60) for j in range(4)]
    return ConformalFilter(resolve_scorer("field", field="rerank", higher_is_better=True),
                           "marginal", alpha=alpha).calibrate(pairs)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cross-site")
    return {"a": _field_filter(0.2).save(root / "a.json"),
            "b": _field_filter(0.3).save(root / "b.json")}


def _body(query_id: str | None = None, n: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"query": "a question",
                            "snippets": [{"text": f"t{j}", "rerank": 1.0} for j in range(n)]}
    if query_id is not None:
        body["query_id"] = query_id
    return body


def _health(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/healthz", headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    return r.json()


def _fire_alarm(url: str, headers: dict[str, str] | None = None) -> None:
    """Real requests far from the calibration scores until the drift alarm fires."""
    for i in range(60):
        extreme = {"query": f"q{i}", "snippets": [
            {"text": f"t{j}", "rerank": 40.0 if j == 0 else -40.0} for j in range(5)]}
        r = httpx.post(url + "/filter", json=extreme, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        if _health(url)["monitor"]["alarm"]:
            return
    raise AssertionError(f"the alarm did not fire: {_health(url)['monitor']}")


def _label(url: str, query_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST /feedback of one label, as a program does; its counts."""
    r = httpx.post(url + "/feedback", json={"items": [
        {"query_id": query_id, "snippet_id": "0", "relevant": True}]}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _refused(url: str, endpoint: str, status: int) -> float:
    """``ragsieve_requests_total{endpoint, status}`` from ``/metrics`` (0 when absent)."""
    text = httpx.get(url + "/metrics", headers={"X-API-Key": KEY}).text
    match = re.search(rf'ragsieve_requests_total{{endpoint="{re.escape(endpoint)}",'
                      rf'status="{status}"}} ([0-9.]+)', text)
    return float(match.group(1)) if match else 0.0


# ------------------------------------------------------------------ another site's page
async def _other_site(_: Any) -> HTMLResponse:
    return HTMLResponse("<!doctype html><title>another site</title><p>another site</p>")


@pytest.fixture(scope="module")
def other_site() -> Iterator[ThreadServer]:
    """A second loopback server: the page of another origin."""
    with ThreadServer(Starlette(routes=[Route("/", _other_site)])) as server:
        yield server


_NO_CORS = """
const [base, posts, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
Promise.allSettled(posts.map(([path, body]) => fetch(base + path, body === null
    ? {method: "POST", mode: "no-cors"} : {method: "POST", mode: "no-cors", body: body})))
  .then(rs => done(rs.map(r => r.status === "fulfilled" ? r.value.type : String(r.reason))));
"""


def _attack(driver: Any, page: str, target: str, posts: list[tuple[str, str | None]]) -> None:
    """From ``page`` (another origin), POST each (path, body) to ``target`` with no-cors."""
    driver.get(page)
    assert driver.execute_script("return location.origin") == page.rstrip("/")
    driver.set_script_timeout(60)
    outcome = driver.execute_async_script(_NO_CORS, target, [list(p) for p in posts])
    # every request was sent and answered (opaque: the page cannot read the answer)
    assert outcome == ["opaque"] * len(posts), outcome


def test_a_no_cors_post_from_another_origin_changes_nothing(
        artifacts: dict[str, Path], other_site: ThreadServer, chrome: Any,  # noqa: F811
        tmp_path: Path) -> None:
    """A keyless service whose alarm has fired: another origin's page POSTs (no-cors) to
    /admin/monitor/reset, /admin/reload (the file now holds another artifact), /filter
    and /feedback. The alarm stays on, the artifact is not reloaded, no served row or label
    is recorded; a program's own requests still do all of it."""
    served = tmp_path / "served.json"
    shutil.copyfile(artifacts["a"], served)
    with serving(served, warmup=False) as srv:
        _fire_alarm(srv.url)
        assert httpx.post(srv.url + "/filter", json=_body("served-q")).status_code == 200
        shutil.copyfile(artifacts["b"], served)  # a reload would now serve b, alarm off
        before = _health(srv.url)
        assert before["monitor"]["alarm"] and before["generation"] == 1
        label = json.dumps({"items": [{"query_id": "served-q", "snippet_id": "0",
                                       "relevant": True}]})
        posts = [("/admin/monitor/reset", None), ("/admin/reload", None),
                 ("/filter", json.dumps(_body("cross-site-q"))), ("/feedback", label)]
        # another site (Sec-Fetch-Site: cross-site), then another port (same-site)
        for page in (f"http://localhost:{other_site.port}/", other_site.url + "/"):
            _attack(chrome, page, srv.url, posts)

        after = _health(srv.url)
        assert after["monitor"]["alarm"] is True  # still on: the reset was refused
        assert after["monitor"]["fired_at"] == before["monitor"]["fired_at"]
        assert after["generation"] == 1 and after["artifact"]["checksum"] == \
            before["artifact"]["checksum"]  # not reloaded
        for endpoint in ("/admin/monitor/reset", "/admin/reload", "/filter", "/feedback"):
            assert _refused(srv.url, endpoint, 403) == 2, endpoint  # both pages, refused
        assert _label(srv.url, "cross-site-q")["unknown"] == 1  # never served
        assert _label(srv.url, "served-q")["new"] == 1  # the cross-site label was not stored

        # the same routes from a program: the alarm goes off, the reload happens
        r = httpx.post(srv.url + "/admin/monitor/reset", headers=CLIENT)
        assert r.status_code == 200 and r.json()["alarm"] is False
        _fire_alarm(srv.url)
        r = httpx.post(srv.url + "/admin/reload", headers=CLIENT)
        assert r.status_code == 200 and r.json()["changed"] and r.json()["monitor_reset"]
        assert _health(srv.url)["monitor"]["alarm"] is False


@pytest.fixture(scope="module")
def open_url(artifacts: dict[str, Path]) -> Iterator[str]:
    """A keyless service (the default on loopback)."""
    with serving(artifacts["a"], warmup=False) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def keyed_url(artifacts: dict[str, Path]) -> Iterator[str]:
    with serving(artifacts["a"], warmup=False, api_key=KEY) as srv:
        yield srv.url


def _cross_site_headers(url: str) -> list[dict[str, str]]:
    port = int(url.rsplit(":", 1)[1])
    return [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of the same host
        {"Origin": f"http://localhost:{port + 1}"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},  # the port is compared
        {"Origin": f"https://127.0.0.1:{port}"},  # the scheme is compared
        {"Origin": "null"},  # a sandboxed frame, a file:// or data: page
        {"Origin": url, "Sec-Fetch-Site": "cross-site"},  # both must say same-origin
    ]


@pytest.mark.parametrize("keyed", [False, True])
def test_state_changes_from_another_origin_get_403_with_or_without_a_key(
        open_url: str, keyed_url: str, keyed: bool) -> None:
    url = keyed_url if keyed else open_url
    key = {"X-API-Key": KEY} if keyed else {}
    _fire_alarm(url, key)
    generation = _health(url)["generation"]
    routes = [("/filter", _body()), ("/query", {"query": "q"}),
              ("/feedback", {"items": [{"query_id": "q", "snippet_id": "0", "relevant": True}]}),
              ("/admin/reload", None), ("/admin/monitor/reset", None)]
    for headers in _cross_site_headers(url):
        for path, body in routes:
            r = httpx.post(url + path, json=body, headers={**key, **CLIENT, **headers},
                           timeout=60)
            assert r.status_code == 403, (path, headers, r.text)
            detail = r.json()["detail"]
            named = "Sec-Fetch-Site" if "Sec-Fetch-Site" in headers else "Origin"
            assert detail.startswith(f"POST {path} refused: {named} == ") and \
                "own origin" in detail and "\n" not in detail, detail
    assert _health(url)["monitor"]["alarm"] and _health(url)["generation"] == generation
    # programs (no Origin, no Sec-Fetch-*) and the service's own page are answered
    assert httpx.post(url + "/filter", json=_body(), headers=key).status_code == 200
    own = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
    assert httpx.post(url + "/filter", json=_body(), headers={**key, **own}).status_code == 200
    r = httpx.post(url + "/admin/monitor/reset", headers={**key, **CLIENT, **own})
    assert r.status_code == 200 and r.json()["alarm"] is False


def test_a_post_a_browser_could_send_cross_site_gets_415(open_url: str) -> None:
    """A form or no-cors fetch from a browser that sends no Sec-Fetch-* and no Origin:
    without JSON or a program's header, nothing changes."""
    _fire_alarm(open_url)
    for content_type in (None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):
        headers = {} if content_type is None else {"Content-Type": content_type}
        for path in ("/admin/monitor/reset", "/admin/reload", "/filter", "/feedback"):
            r = httpx.post(open_url + path, content=b"", headers=headers)
            assert r.status_code == 415, (path, content_type, r.text)
            assert "'X-Ragsieve: 1'" in r.json()["detail"] and \
                "'Content-Type: application/json'" in r.json()["detail"]
    assert _health(open_url)["monitor"]["alarm"]
    # what programs send: the header, JSON, or the API key's own headers
    r = httpx.post(open_url + "/admin/monitor/reset", json={})
    assert r.status_code == 200 and r.json()["alarm"] is False
    assert httpx.put(open_url + "/").status_code == 405  # no route that changes state


# ------------------------------------------------------------------ Host
@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}",
                                  "localhost:1", "127.0.0.1.nip.io:{port}", "a b", ""])
def test_a_host_that_does_not_name_the_service_gets_400(open_url: str, host: str) -> None:
    """DNS rebinding: a page of attacker.example whose name now points at 127.0.0.1 sends
    its own name as Host; refused on every route before anything runs."""
    port = int(open_url.rsplit(":", 1)[1])
    header = {"Host": host.format(port=port)}
    generation = _health(open_url)["generation"]
    for method, path, body in [("POST", "/filter", _body()), ("POST", "/admin/reload", None),
                               ("POST", "/admin/monitor/reset", None),
                               ("POST", "/feedback", {"items": []}), ("GET", "/status", None),
                               ("GET", "/healthz", None), ("GET", "/", None)]:
        r = httpx.request(method, open_url + path, json=body, headers={**CLIENT, **header})
        assert r.status_code == 400, (path, r.text)
        detail = r.json()["detail"]
        assert f"Host {header['Host']!r}" in detail and "--allowed-hosts" in detail, detail
        assert "answers to 127.0.0.1, localhost, [::1] on port" in detail
    assert _health(open_url)["generation"] == generation


def test_loopback_names_and_allowed_hosts_pass(artifacts: dict[str, Path]) -> None:
    with serving(artifacts["a"], warmup=False, allowed_hosts="ragsieve.example,b.example:99") \
            as srv:
        port = srv.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.1",
                     "LOCALHOST", "ragsieve.example", f"ragsieve.example:{port}",
                     "b.example:99"):
            r = httpx.post(srv.url + "/filter", json=_body(), headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        for host in ("b.example", f"b.example:{port}", "attacker.example"):
            r = httpx.post(srv.url + "/filter", json=_body(), headers={"Host": host})
            assert r.status_code == 400 and "ragsieve.example, b.example:99" in \
                r.json()["detail"], (host, r.text)
    with serving(artifacts["a"], warmup=False, allowed_hosts="*") as srv:  # unsafe: any Host
        r = httpx.post(srv.url + "/filter", json=_body(), headers={"Host": "attacker.example"})
        assert r.status_code == 200


def test_split_host_and_same_origin() -> None:
    assert split_host("[::1]:8000") == ("::1", 8000) and split_host("A.Example") == \
        ("a.example", None)
    for bad in ("", "a b", "a:b", "a.example:99999", "[::1", "[nothost]:1", "a/b", "a@b",
                "a.example:٨٠"):
        assert split_host(bad) is None, bad
    assert same_origin("http://[::1]:8000", "http", "[::1]:8000")
    assert same_origin("https://a.example", "https", "a.example:443")
    for origin in ("https://a.example:8000", "http://a.example:8001", "http://b.example:8000",
                   "null", "http://a.example:8000/path", "http://u@a.example:8000",
                   "http://a.example:port"):
        assert not same_origin(origin, "http", "a.example:8000"), origin


# ------------------------------------------------------------------ Origin scheme, Basic
def test_basic_credentials_need_the_same_scheme_too(keyed_url: str) -> None:
    """Item 9: an Origin of the same host and port but another scheme is another origin."""
    port = int(keyed_url.rsplit(":", 1)[1])
    r = httpx.post(keyed_url + "/filter", json=_body(),
                   headers={"Authorization": BASIC, "Origin": f"https://127.0.0.1:{port}"})
    assert r.status_code == 403 and "own origin" in r.json()["detail"]
    r = httpx.get(keyed_url + "/status", headers={"Authorization": BASIC,
                                                  "Origin": f"https://127.0.0.1:{port}"})
    assert r.status_code == 403 and "same-origin" in r.json()["detail"]
    assert httpx.get(keyed_url + "/status", headers={"Authorization": BASIC,
                                                     "Origin": keyed_url}).status_code == 200
    r = httpx.post(keyed_url + "/filter", json=_body(),
                   headers={"Authorization": BASIC, "Origin": keyed_url})
    assert r.status_code == 200


# ------------------------------------------------------------------ /docs
def test_docs_are_off_and_the_schema_is_behind_the_key(open_url: str, keyed_url: str,
                                                       chrome: Any) -> None:  # noqa: F811
    """No Swagger UI or ReDoc (FastAPI loads them from a CDN into the service's origin);
    /openapi.json stays, behind the key when there is one. Opened in Chromium, /docs
    fetches nothing but the service."""
    for url in (open_url, keyed_url):
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert httpx.get(url + path, headers={"X-API-Key": KEY}).status_code == 404, path
    assert httpx.get(keyed_url + "/openapi.json").status_code == 401
    schema = httpx.get(keyed_url + "/openapi.json", headers={"X-API-Key": KEY}).json()
    assert "/filter" in schema["paths"] and "/openapi.json" not in schema["paths"]
    assert "/filter" in httpx.get(open_url + "/openapi.json").json()["paths"]
    network_requests(chrome)
    chrome.get(open_url + "/docs")
    urls = network_requests(chrome)
    assert urls and all(u.startswith(open_url + "/") for u in urls), urls
    chrome.get("about:blank")


# ------------------------------------------------------------------ receiving cap
MAX_BODY = 1000
MAX_RECEIVING = 2500


class _Conn:
    """A raw HTTP/1.1 connection that reads answers head by head."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buffer = b""

    def head(self, length: int | None) -> str:
        """Send a ``POST /filter`` head (chunked when ``length`` is None) that asks for
        ``100 Continue``; the status line of the first answer."""
        framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
        self.sock.sendall(f"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          f"application/json\r\n{framing}\r\nExpect: 100-continue\r\n\r\n"
                          .encode())
        return self.read()[0]

    def read(self) -> tuple[str, dict[str, str], bytes]:
        """(status line, headers, body) of the next answer."""
        while b"\r\n\r\n" not in self.buffer:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection without an answer"
            self.buffer += data
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
        size = int(headers.get("content-length", 0))
        while len(self.buffer) < size:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection mid-answer"
            self.buffer += data
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return status, headers, body

    def close(self) -> None:
        self.sock.close()


def _padded(n: int) -> bytes:
    """A valid /filter body of exactly ``n`` bytes (JSON allows trailing blanks)."""
    return json.dumps(_body()).encode().ljust(n)


def _slow(port: int) -> _Conn:
    """A request of MAX_BODY bytes whose body the server has started reading (it answered
    100 Continue) and that has sent 10 bytes of it."""
    conn = _Conn(port)
    assert conn.head(MAX_BODY) == "HTTP/1.1 100 Continue"
    conn.sock.sendall(_padded(MAX_BODY)[:10])
    return conn


def _finish(conn: _Conn) -> str:
    conn.sock.sendall(_padded(MAX_BODY)[10:])
    status = conn.read()[0]
    conn.close()
    return status


def test_slow_bodies_cannot_take_more_than_max_receiving_bytes(
        artifacts: dict[str, Path]) -> None:
    # every connection here comes from 127.0.0.1: the per-address cap is set to the whole
    # cap, so that this test sees the cap over all connections alone
    with serving(artifacts["a"], warmup=False, max_body_bytes=MAX_BODY,
                 max_receiving_bytes=MAX_RECEIVING,
                 max_receiving_per_client=MAX_RECEIVING) as srv:
        first, second = _slow(srv.port), _slow(srv.port)  # 2000 bytes being received
        third = _Conn(srv.port)
        status = third.head(MAX_BODY)  # 3000 > 2500: refused before its body is read
        assert status == "HTTP/1.1 503 Service Unavailable", status
        third.close()
        r = httpx.post(srv.url + "/filter", content=_padded(MAX_BODY),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.json()["detail"] == (
            "the service is receiving 2000 bytes of request bodies at once; this body (1000 "
            "bytes) would take that over the limit of 2500 (--max-receiving-bytes): retry "
            "after 2 s.")
        # a small body still fits beside the slow ones; the per-request cap is still 413
        assert httpx.post(srv.url + "/filter", json=_body()).status_code == 200
        r = httpx.post(srv.url + "/filter", content=b" " * (MAX_BODY + 1),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        # a chunked body (no Content-Length) is counted as it arrives
        chunked = _Conn(srv.port)
        assert chunked.head(None) == "HTTP/1.1 100 Continue"
        chunked.sock.sendall(b"258\r\n" + b" " * 600 + b"\r\n")  # 2000 + 600 > 2500
        status, headers, _ = chunked.read()
        assert status == "HTTP/1.1 503 Service Unavailable" and headers["retry-after"] == "2"
        chunked.close()

        # a finished body gives its bytes back: another 1000 fit again
        assert _finish(first) == "HTTP/1.1 200 OK"
        fourth = _slow(srv.port)
        # so does one whose client went away
        second.close()
        deadline = time.monotonic() + 30
        while True:
            probe = _Conn(srv.port)
            status = probe.head(MAX_BODY)
            probe.close()
            if status == "HTTP/1.1 100 Continue" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == "HTTP/1.1 100 Continue", "a closed connection kept its bytes"
        assert _finish(fourth) == "HTTP/1.1 200 OK"


# ------------------------------------------------------------------ options
def _args(*argv: str) -> Any:
    return build_parser().parse_args(["serve", "--filter", "f.json", *argv])


def test_the_new_options_reach_the_service(tmp_path: Path) -> None:
    built = cli_serve_options(_args("--state-dir", str(tmp_path), "--allowed-hosts",
                                    "A.example, b.example:8443", "--max-receiving-bytes",
                                    "5000000"))
    assert built.allowed_hosts == ("a.example", "b.example:8443")
    assert built.max_receiving_bytes == 5_000_000 and built.receiving_limit == 5_000_000
    defaults = ServeOptions()
    assert defaults.allowed_hosts == () and defaults.max_receiving_bytes is None
    assert defaults.receiving_limit == 4 * defaults.max_body_bytes
    options = ServeOptions(allowed_hosts=["[::1]:9", "x.example"], max_receiving_bytes=10**7)
    assert ServeOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


@pytest.mark.parametrize(("changes", "error", "message"), [
    ({"allowed_hosts": "a.example,evil host"}, ValueError,
     "allowed_hosts: 'evil host' is not a host name, IP address or host:port"),
    ({"allowed_hosts": 3}, TypeError,
     "allowed_hosts must be a comma-separated str or a sequence of str"),
    ({"max_receiving_bytes": 10}, ValueError,
     "max_receiving_bytes == 10, must be an int >= 1000000 or None (at least max_body_bytes)."),
    ({"max_receiving_bytes": 500, "max_body_bytes": 1000}, ValueError,
     "max_receiving_bytes == 500, must be an int >= 1000"),
])
def test_bad_new_options_are_one_line_errors(changes: dict[str, Any], error: type[Exception],
                                             message: str) -> None:
    with pytest.raises(error) as info:
        ServeOptions(**changes)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
