"""docs/http-api.md is the rendering of the live service's OpenAPI schema (issue 34).

A real uvicorn server (``tests/servers.py``) serves a real artifact, calibrated on
XQuAD-en with an API key; the test fetches ``GET /openapi.json`` over HTTP, renders it
with ``render`` of ``tools/api_page.py`` (the page's generator) and requires the page in the repository to be
exactly that, so a change to a route or a schema model fails here until ``make api-docs``
is run. The page must also show every route of the live schema and the ``POST /filter``
body, and ``make api-docs``'s in-process schema must be the live one (what it writes is
what this test checks).
"""

from __future__ import annotations

import difflib
import doctest
import re
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="needs the service: pip install 'ragsieve[server]'")

import httpx
from servers import serving

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # the page's generator: a tool, not in the package

import api_page
from api_page import render, service_schema

PAGE = ROOT / "docs" / "http-api.md"
KEY = "api-docs-test-key"


@pytest.fixture(scope="module")
def live_schema(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Any]) -> dict[str, Any]:
    """``GET /openapi.json`` of a real server with an API key, serving a filter calibrated
    on three XQuAD-en articles with the list BM25 score (no model to load)."""
    from ragsieve import ConformalFilter

    articles = set(sorted({p.group for p in xquad_en})[:3])
    flt = ConformalFilter("bm25-list", alpha=0.2).calibrate(
        [p for p in xquad_en if p.group in articles], progress=False)
    root = tmp_path_factory.mktemp("api-docs")
    path = flt.save(root / "filter.json")
    with serving(path, api_key=KEY, state_dir=root / "state") as server:
        refused = httpx.get(f"{server.url}/openapi.json", timeout=30)
        answer = httpx.get(f"{server.url}/openapi.json", headers={"X-API-Key": KEY}, timeout=30)
    assert refused.status_code == 401  # the schema is behind the key, as the page says
    assert answer.status_code == 200, answer.text[:500]
    return dict(answer.json())


def test_the_page_is_the_rendering_of_the_live_schema(live_schema: dict[str, Any]) -> None:
    expected = render(live_schema)
    actual = PAGE.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            actual.splitlines(keepends=True), expected.splitlines(keepends=True),
            "docs/http-api.md", "rendered from the live /openapi.json", n=1))
        pytest.fail("docs/http-api.md is stale: run `make api-docs` "
                    f"(python tools/api_page.py --out docs/http-api.md)\n{diff[:4000]}")


def test_every_route_of_the_live_schema_is_on_the_page(live_schema: dict[str, Any]) -> None:
    page = PAGE.read_text(encoding="utf-8")
    routes = [(method.upper(), path) for path, item in live_schema["paths"].items()
              for method in item]
    assert len(routes) >= 8, routes
    for method, path in routes:
        assert f"### `{method} {path}`" in page, f"{method} {path} has no section"
        assert f"[`{method} {path}`](#" in page, f"{method} {path} is not in the route table"
    for status in ("401", "413", "422"):  # every documented answer of /filter is listed
        assert status in live_schema["paths"]["/filter"]["post"]["responses"]


def test_the_filter_body_and_the_authentication_are_visible() -> None:
    page = PAGE.read_text(encoding="utf-8")
    section = page.split("### `POST /filter`")[1].split("\n### ")[0]
    assert '"query": string,' in section
    # a snippet is a string or an object with text, snippet_id, score, ... (any other key)
    assert re.search(r'"snippets": \[string \| \{"text"\?, "snippet_id"\?, "score"\?.*\.\.\.\}\]',
                     section), section[:1500]
    assert "| `snippets` | array of (string or [`SnippetIn`](#schema-snippetin)) | yes |" in section
    assert "`Authorization: Bearer <key>` or `X-API-Key: <key>`" in section
    assert "| 401 | Missing or invalid API key." in section
    assert "## Authentication" in page and "No key, ever: `GET /healthz`." in page


def test_make_api_docs_renders_the_live_schema(live_schema: dict[str, Any]) -> None:
    """``python tools/api_page.py`` builds the schema in its own process over a
    placeholder artifact: it is the live one (the schema depends on the key, not on the
    artifact served)."""
    built = service_schema()
    assert built == live_schema
    assert render(built) == render(live_schema)


def test_the_generator_doctests() -> None:
    """The generator's examples run (tests/test_api.py runs those of the package's modules)."""
    result = doctest.testmod(api_page, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted and result.failed == 0
