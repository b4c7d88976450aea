"""Every code example in the README and the docs runs, and the docs site builds strictly.

- **Python examples** (```` ```python ```` blocks) run, page by page, in order, in one
  namespace per page, in a fresh working directory. The names a page leaves to the reader
  ("your data") are given real values from XQuAD-en, listed in :data:`PLACEHOLDERS` (the
  docs' index says so): ``pairs``, ``query``, ``snippets``, ``corpus``, ``labelled``,
  ``flt``, ``docs``, ``texts``, ``reranker_scores``; ``filter.json`` is a real calibrated
  artifact in the working directory. A page whose example fails, or a placeholder a page
  uses that is not listed, fails the test.
- **Command lines** (every line starting ``ragsieve`` in ```` ```bash ```` blocks) are
  parsed by the real command-line parser: every command, option and value a page shows
  exists and is accepted. (Running them all takes minutes of model work per line; the
  commands themselves are run by tests/test_cli.py and the other CLI tests.)
- **The site**: ``mkdocs build --strict`` (Material theme, API pages from the docstrings
  with mkdocstrings) builds with no warning: every page in the navigation, every link and
  anchor resolves, every documented parameter exists.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # before haystack is imported

from browser import chrome  # noqa: F401  (the fixture)

from ragsieve import Pair

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w[\w-]*)?\s*$")


def code_blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced block of ``language`` in a Markdown file."""
    blocks, current, start, lang = [], None, 0, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line.strip()) if line.startswith("```") else None
        if current is None and match:
            current, start, lang = [], number, match.group(1)
        elif current is not None and line.startswith("```"):
            if lang == language:
                blocks.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def _questions(pairs: list[Pair]) -> list[tuple[str, set[str]]]:
    by_q: dict[str, tuple[str, set[str]]] = {}
    for p in pairs:
        entry = by_q.setdefault(p.query_id, (p.query, set()))
        if p.relevant:
            entry[1].add(p.snippet_id)
    return list(by_q.values())


def _articles(xquad_en: list[Pair], n: int) -> list[Pair]:
    keep = sorted({p.group for p in xquad_en})[:n]
    return [p for p in xquad_en if p.group in keep]


@pytest.fixture(scope="module")
def placeholders(xquad_en: list[Pair], served_artifact: Callable[[Any], Path]
                 ) -> dict[str, Callable[[], Any]]:
    """Real values for the names the docs leave to the reader (built on first use)."""
    from rank_bm25 import BM25Okapi

    from ragsieve import ConformalFilter
    from ragsieve.calibration import SplitConformalCalibrator

    small = _articles(xquad_en, 4)
    first = small[0]
    one_query = [p for p in small if p.query_id == first.query_id]
    corpus = {p.snippet_id: p.text for p in xquad_en}
    labelled = _questions(_articles(xquad_en, 12))
    bm25 = BM25Okapi([t.lower().split() for t in (p.text for p in one_query)])

    def reranked() -> list[Pair]:  # an outside score on every pair: BM25 within its list
        out = []
        for qid in dict.fromkeys(p.query_id for p in small):
            group = [p for p in small if p.query_id == qid]
            scores = BM25Okapi([p.text.lower().split() for p in group]).get_scores(
                group[0].query.lower().split())
            out += [Pair(p.query_id, p.query, p.snippet_id, p.text, p.relevant, group=p.group,
                         meta={**p.meta, "rerank": float(s)}) for p, s in zip(group, scores,
                                                                               strict=True)]
        return out

    def docs() -> list[Any]:
        from langchain_core.documents import Document

        return [Document(page_content=p.text, id=p.snippet_id) for p in one_query]

    artifact = served_artifact(SplitConformalCalibrator(alpha=0.1))
    return {
        "pairs": lambda: reranked(),
        "query": lambda: first.query,
        "snippets": lambda: [p.text for p in one_query],
        "texts": lambda: [p.text for p in one_query],
        "reranker_scores": lambda: [float(s) for s in
                                    bm25.get_scores(first.query.lower().split())],
        "corpus": lambda: corpus,
        "labelled": lambda: labelled,
        "flt": lambda: ConformalFilter.load(artifact),
        "docs": docs,
        "filter.json": lambda: artifact,
    }


PLACEHOLDERS = ("pairs", "query", "snippets", "texts", "reranker_scores", "corpus", "labelled",
                "flt", "docs")


def _free_names(code: str) -> set[str]:
    """Names a block loads that it never binds (before the namespace gives them)."""
    tree = ast.parse(code)
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store) else loaded).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            args = node.args
            bound.update(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
            bound.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
            if isinstance(node, ast.FunctionDef):
                bound.add(node.name)
        elif isinstance(node, ast.ClassDef):
            bound.add(node.name)
    return loaded - bound


PYTHON_PAGES = [p for p in PAGES if code_blocks(p, "python")]
#: Pages whose examples take minutes (every bundled embedder across languages; the three
#: frameworks with their models): ``slow`` (the frameworks keep their own tests).
SLOW_PAGES = {"cross-language.md", "integrations.md"}


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p
    for p in PYTHON_PAGES], ids=lambda p: p.name)
def test_python_examples_run(page: Path, placeholders: dict[str, Callable[[], Any]],
                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             embedding_cache_dir: Path) -> None:
    from ragsieve.scoring import registry

    # an example may register a scorer: it lasts for the page, not for the test session
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_OPTIONS", dict(registry._OPTIONS))
    monkeypatch.chdir(tmp_path)
    shutil.copy(placeholders["filter.json"](), tmp_path / "filter.json")
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    blocks = code_blocks(page, "python")
    with ExitStack() as stack:
        if any(SERVED_URL in code for _, code in blocks):  # the rerank clients' examples
            blocks = _against_a_served_filter(blocks, tmp_path / "filter.json", stack,
                                              monkeypatch, embedding_cache_dir)
        _run_blocks(page, blocks, namespace, placeholders)


#: The service's address in the examples of clients (docs/rerank.md): the test serves the
#: page's filter on a free loopback port and puts that port in its place.
SERVED_URL = "http://127.0.0.1:8000"


def _against_a_served_filter(blocks: list[tuple[int, str]], artifact: Path, stack: ExitStack,
                             monkeypatch: pytest.MonkeyPatch,
                             cache_dir: Path) -> list[tuple[int, str]]:
    """Serve ``artifact`` with a key (a real uvicorn on 127.0.0.1), set the key in
    ``RAGSIEVE_API_KEY`` and point the examples at the server."""
    from servers import ThreadServer

    from ragsieve.server import create_app

    key = "docs-example-key"
    monkeypatch.setenv("RAGSIEVE_API_KEY", key)
    server = stack.enter_context(ThreadServer(create_app(
        artifact, api_key=key, scorer_options={"cache_dir": cache_dir})))
    return [(line, code.replace(SERVED_URL, server.url)) for line, code in blocks]


def _run_blocks(page: Path, blocks: list[tuple[int, str]], namespace: dict[str, Any],
                placeholders: dict[str, Callable[[], Any]]) -> None:
    """Run a page's Python blocks in order in one namespace (placeholders filled in)."""
    import builtins

    for line, code in blocks:
        free = _free_names(code) - set(namespace) - set(dir(builtins))
        unknown = free - set(PLACEHOLDERS)
        assert not unknown, (f"{page.name}:{line}: the example uses {sorted(unknown)}, which "
                             f"it never defines and which are not placeholders {PLACEHOLDERS}")
        for name in free:
            namespace[name] = placeholders[name]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's notice
            try:
                exec(compile(code, f"{page.name}:{line}", "exec"), namespace)  # noqa: S102
            except Exception as exc:  # noqa: BLE001  (name the page and line of the failing example)
                pytest.fail(f"{page.name}:{line}: the example raised "
                            f"{type(exc).__name__}: {exc}")


def _command_lines(page: Path) -> list[tuple[int, list[str]]]:
    out = []
    for line, code in code_blocks(page, "bash"):
        for offset, text in enumerate(code.replace("\\\n", " ").splitlines()):
            text = text.split(" #")[0].strip()
            if text.startswith("ragsieve "):
                argv = shlex.split(text)[1:]
                if any(re.fullmatch(r"\[.*|.*\]", a) for a in argv):  # [--optional] hints
                    argv = shlex.split(re.sub(r"\[[^\]]*\]", "", text))[1:]
                out.append((line + 1 + offset, argv))
    return out


COMMAND_PAGES = [p for p in PAGES if _command_lines(p)]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: p.name)
def test_command_lines_parse(page: Path) -> None:
    from ragsieve.cli import build_parser

    parser = build_parser()
    for line, argv in _command_lines(page):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{page.name}:{line}: `ragsieve {' '.join(argv)}` does not parse "
                        f"(exit {exc.code})")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site as ``mkdocs build --strict`` writes it, built once for this module."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), "mkdocs is missing: pip install -e '.[docs]' (make test does)"
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_site_builds_strictly(site: Path) -> None:
    page = site / "reference" / "filter.html"  # pages are files, not folders (file:// works)
    assert page.exists(), sorted(p.name for p in (site / "reference").iterdir())
    text = page.read_text(encoding="utf-8")
    assert "ConformalFilter" in text and "calibrate" in text  # API pages from the docstrings
    for html in site.rglob("*.html"):  # readable offline: no web fonts or CDNs
        assert "fonts.googleapis" not in html.read_text(encoding="utf-8"), html


def test_every_nav_link_opens_a_page_from_file_urls(site: Path, chrome: Any) -> None:  # noqa: F811
    """Opened from disk (file://, no server), every link of the navigation leads to a
    page of the site, not to a folder listing (issue 34: links pointed at folders)."""
    from selenium.webdriver.common.by import By

    chrome.get((site / "index.html").as_uri())
    links = {a.get_attribute("href") for a in
             chrome.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link")}
    links = {href.split("#")[0] for href in links if href and href.startswith("file://")}
    assert len(links) >= 10, links
    for href in sorted(links):
        chrome.get(href)
        assert href.endswith(".html"), f"nav link {href} is not a page file"
        assert "Index of" not in chrome.title, f"{href} opens a folder listing"
        headings = chrome.find_elements(By.CSS_SELECTOR, "article h1")
        assert headings and headings[0].text.strip(), f"{href} has no page heading"


def test_search_works_from_file_urls(site: Path, chrome: Any) -> None:  # noqa: F811
    """Opened from disk, the site's search finds a page (issue 50: it could not load its
    index from file://, where the theme reads ``search/search_index.js`` as a script)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chrome.get((site / "index.html").as_uri())
    chrome.execute_script("document.getElementById('__search').click()")  # open the search box
    box = chrome.find_element(By.CSS_SELECTOR, "input.md-search__input")
    WebDriverWait(chrome, 30).until(lambda d: box.is_enabled() and box.is_displayed())
    box.send_keys("exchangeability")
    found = WebDriverWait(chrome, 30).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, ".md-search-result__item a"))
    assert any("monitoring.html" in (a.get_attribute("href") or "") for a in found), \
        [a.get_attribute("href") for a in found]


def test_the_layer_table_of_the_architecture_page_is_the_one_the_tests_enforce() -> None:
    from test_layers import LAYERS  # tests/ is on sys.path (rootdir-relative imports)

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", text, flags=re.MULTILINE)
    documented = {name: int(level) for level, names in rows
                  for name in re.findall(r"`(\w+)`", names)}
    assert documented == LAYERS
