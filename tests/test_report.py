"""``ragsieve report`` and ``evaluate`` / ``answers --html``: one self-contained HTML page each,
checked in the real headless Chromium against the Python filter result (real MiniLM, real
XQuAD-en, a real calibrated artifact): the lists, the order of the queries (misses first),
the page's height for 50 queries, and the figures' size as rendered."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from browser import chrome, network_requests, screenshot  # noqa: F401  (chrome: the fixture)
from topics import first_topics

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main as cli_main
from ragsieve.data import load_dataset, write_pairs
from ragsieve.evaluation.plots import LAYOUT_KEY, MIN_FONT_KEY
from ragsieve.evaluation.report import DEFAULT_OPEN_QUERIES, ReportSettings, build_report
from ragsieve.evaluation.sweep import DEFAULT_TOP_K
from ragsieve.types import FilterResult

pytest.importorskip("selenium")
pytest.importorskip("matplotlib")

SCRIPT = ("<script>document.title='pwned';window.__pwned=1</script>"
          "<img src=x onerror=\"window.__pwned=2\"> & \"quotes\"")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, served_artifact: Any,
           xquad_en: list[Pair]) -> dict[str, Path]:
    """A labelled JSONL of 3 XQuAD-en topics (8 queries each) plus one query whose snippet
    is an HTML/script injection, and the artifact calibrated on the first 300 pairs."""
    root = tmp_path_factory.mktemp("report")
    pairs = first_topics(xquad_en, 3, 8, start=300)
    pairs.append(Pair("q-inject", "what does the page run?", "inject-0", SCRIPT, relevant=0,
                      group="inject"))
    write_pairs(pairs, root / "data.jsonl")
    return {"root": root, "data": root / "data.jsonl",
            "artifact": served_artifact(SplitConformalCalibrator(alpha=0.2))}


@pytest.fixture(scope="module")
def report_page(inputs: dict[str, Path], embedding_cache_dir: Path) -> Path:
    out = inputs["root"] / "report.html"
    assert cli_main(["-q", "report", "--data", str(inputs["data"]), "--filter",
                     str(inputs["artifact"]), "--out", str(out), "--splits", "3",
                     "--cache-dir", str(embedding_cache_dir)]) == 0
    return out


@pytest.fixture()
def driver(chrome: Any) -> Any:  # noqa: F811  (the session's headless Chromium)
    return chrome


def _load(driver: Any, path: Path) -> str:
    network_requests(driver)  # drop what earlier pages fetched
    url = path.resolve().as_uri()
    driver.get(url)
    return url


def _missed(pairs: list[Pair], results: dict[str, FilterResult]) -> list[str]:
    """The queries the filter removed a relevant snippet of, in data order."""
    relevant = {(p.query_id, p.snippet_id) for p in pairs if p.relevant == 1}
    return [q for q, r in results.items() if any((q, s.snippet_id) in relevant for s in r.removed)]


def png_text(png: bytes) -> dict[str, str]:
    """The text chunks of a PNG (``tEXt``: keyword, NUL, latin-1 text)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    found, at = {}, 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at:at + 4])
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + length]
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return found


def _dom(driver: Any) -> list[Any]:
    """Per query in page order: (query id, its threshold and its kept and removed snippets as
    (id, score, label, p-value)), read from the page's data attributes."""
    return driver.execute_script("""
        return [...document.querySelectorAll('section.query')].map(s => {
          const read = sel => [...s.querySelectorAll(sel + ' > li[data-snippet-id]')].map(
              li => [li.dataset.snippetId, parseFloat(li.dataset.score), li.dataset.label,
                     parseFloat(li.dataset.pValue)]);
          return [s.dataset.queryId, {threshold: parseFloat(s.dataset.threshold),
                                      kept: read('ul.kept'), removed: read('ul.removed')}];
        });""")


def test_report_page_matches_the_filter(driver: Any, inputs: dict[str, Path], report_page: Path,
                                        embedding_cache_dir: Path) -> None:
    url = _load(driver, report_page)
    assert network_requests(driver) == [url]  # the page itself and nothing else
    flt = ConformalFilter.load(inputs["artifact"], scorer_options={"cache_dir": embedding_cache_dir})
    pairs = load_dataset(str(inputs["data"]))
    results = flt.filter_pairs(pairs)
    labels = {(p.query_id, p.snippet_id): p.relevant for p in pairs}
    shown_order = _dom(driver)
    page = dict(shown_order)
    missed = _missed(pairs, results)
    assert missed and len(missed) < len(results)  # the order below is not vacuous
    # every query (fewer than --max-queries): those that lost a relevant snippet first
    assert [q for q, _ in shown_order] == missed + [q for q in results if q not in missed]
    name = {1: "relevant", 0: "not relevant"}
    for qid, r in results.items():
        shown = page[qid]
        assert shown["threshold"] == pytest.approx(r.threshold, rel=1e-12)
        for side, expected in (("kept", r.kept), ("removed", r.removed)):
            assert [s[0] for s in shown[side]] == [s.snippet_id for s in expected]
            # float32 embeddings: other batches move the last bits, nothing more
            assert [s[1] for s in shown[side]] == pytest.approx([s.score for s in expected],
                                                                rel=1e-6)
            assert [s[2] for s in shown[side]] == [name[labels[(qid, s.snippet_id)]]
                                                   for s in expected]
            assert [s[3] for s in shown[side]] == pytest.approx([s.p_value for s in expected])
        assert all(s[3] > flt.alpha for s in shown["kept"])  # marginal: kept iff p > alpha
        assert all(s[3] <= flt.alpha for s in shown["removed"])
    assert any(page[q]["removed"] for q in page) and any(page[q]["kept"] for q in page)
    top = driver.find_element("css selector", "p.threshold")
    assert float(top.get_attribute("data-threshold")) == pytest.approx(flt.threshold, rel=1e-12)
    assert str(flt.scorer_.keep_rule(flt.threshold)) in top.text
    guarantee = driver.find_element("css selector", "p.guarantee").text
    assert flt.guarantee()["statement"] in guarantee
    metrics = driver.find_element("css selector", "table.metrics").text
    assert "coverage" in metrics and "[" in metrics
    unit = driver.find_element("css selector", "p.interval-unit").get_attribute("data-unit")
    assert unit == "topics"
    img = driver.find_element("css selector", "img.figure")
    assert img.get_attribute("src").startswith("data:image/png;base64,")
    assert driver.execute_script("return arguments[0].naturalWidth", img) > 300
    shot = screenshot(driver, inputs["root"] / "report.png")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_figures_are_one_per_panel_at_a_readable_size(driver: Any, report_page: Path) -> None:
    """Each panel of the trade-off figure is its own image, shown unshrunk in the page's
    width: its smallest text (ticks, legend, point labels) is at least 10 CSS px as rendered.
    The trade-off panel labels every top-k baseline, and no label touches another or a
    legend, or leaves the image."""
    _load(driver, report_page)
    shown = driver.execute_script("""
        return [...document.querySelectorAll('div.figures figure.panel')].map(f => {
          const img = f.querySelector('img.figure');
          return [f.dataset.panel, img.getAttribute('src'), img.clientWidth, img.clientHeight,
                  img.naturalWidth, img.naturalHeight];
        });""")
    assert [s[0] for s in shown] == ["coverage", "removal", "trade-off"]
    texts = {}
    for name, src, width, height, natural_width, natural_height in shown:
        texts[name] = png_text(base64.b64decode(src.split(",", 1)[1]))
        scale = width / natural_width
        assert width >= 450 and height / natural_height == pytest.approx(scale, rel=0.01)
        assert float(texts[name][MIN_FONT_KEY]) * scale >= 10.0, name  # CSS px
    layout = json.loads(texts["trade-off"][LAYOUT_KEY])
    named = {part.strip() for text, _ in layout["labels"] for part in text.split(",")}
    assert named == {f"k={k}" for k in DEFAULT_TOP_K}
    boxes = [box for _, box in layout["labels"]]
    assert layout["legends"]
    _, _, _, _, natural_width, natural_height = shown[2]
    for i, box in enumerate(boxes):
        assert 0 <= box[0] < box[2] <= natural_width and 0 <= box[1] < box[3] <= natural_height
        assert not any(_overlap(box, other) for other in boxes[i + 1:] + layout["legends"])


@pytest.fixture(scope="module")
def fifty(inputs: dict[str, Path], xquad_en: list[Pair], embedding_cache_dir: Path
          ) -> tuple[Path, list[Pair], dict[str, FilterResult]]:
    """A report page of 50 XQuAD-en queries of 4 topics (the first 3 those of ``inputs``),
    the pairs and the filter's results on them."""
    pairs = first_topics(xquad_en, 4, 20, start=300)
    chosen = set(list(dict.fromkeys(p.query_id for p in pairs))[:50])
    pairs = [p for p in pairs if p.query_id in chosen]
    flt = ConformalFilter.load(inputs["artifact"], scorer_options={"cache_dir": embedding_cache_dir})
    results = flt.filter_pairs(pairs)
    out = inputs["root"] / "fifty.html"
    out.write_text(build_report(flt, pairs, ReportSettings(n_splits=2, n_resamples=200), results=results),
                   encoding="utf-8")
    return out, pairs, results


def test_misses_come_first_and_the_page_stays_short(
        driver: Any, fifty: tuple[Path, list[Pair], dict[str, FilterResult]]) -> None:
    """50 queries: those that lost a relevant snippet first (the first listed is one, and
    says so), then the others in data order; the first few open, every other one line, so
    the page stays under 10,000 px (7,307 px; it was 54,950 px with every query open in data
    order)."""
    path, pairs, results = fifty
    _load(driver, path)
    missed = _missed(pairs, results)
    assert len(results) == 50 and 0 < len(missed) < 50
    sections = driver.execute_script("""
        return [...document.querySelectorAll('section.query')].map(s => [s.dataset.queryId,
          s.querySelector('details').open, s.getBoundingClientRect().height]);""")
    order = [qid for qid, _, _ in sections]
    assert order == missed + [q for q in results if q not in missed]
    first = driver.find_element("css selector", "section.query")
    assert "miss" in first.get_attribute("class").split()
    relevant = {(p.query_id, p.snippet_id) for p in pairs if p.relevant == 1}
    n = sum((order[0], s.snippet_id) in relevant for s in results[order[0]].removed)
    assert first.find_element("css selector", "summary .missed").text == \
        f"{n} relevant snippet{'s' if n > 1 else ''} removed"
    assert [qid for qid, opened, _ in sections if opened] == order[:DEFAULT_OPEN_QUERIES]
    assert max(h for _, opened, h in sections if not opened) < 80  # one line (two if long)
    assert first.find_element("css selector", "ul.removed").is_displayed()
    height = driver.execute_script("return document.documentElement.scrollHeight")
    assert height < 10_000, height


def test_snippet_html_is_shown_as_text(driver: Any, report_page: Path) -> None:
    _load(driver, report_page)
    assert driver.title.startswith("ragsieve report")  # the injected script never ran
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    assert driver.execute_script("return document.getElementsByTagName('script').length") == 0
    li = driver.find_element("css selector", "li[data-snippet-id='inject-0'] .text")
    assert li.get_attribute("textContent") == SCRIPT
    assert not driver.find_elements("css selector", "section.query img")


def test_max_queries_bounds_the_list(inputs: dict[str, Path], embedding_cache_dir: Path) -> None:
    flt = ConformalFilter.load(inputs["artifact"], scorer_options={"cache_dir": embedding_cache_dir})
    pairs = load_dataset(str(inputs["data"]))
    results = flt.filter_pairs(pairs)
    text = build_report(flt, pairs, ReportSettings(max_queries=5, n_splits=2), results=results)
    listed = re.findall(r"<section class=\"query(?: miss)?\" data-query-id=\"([^\"]+)\"", text)
    missed = _missed(pairs, results)
    assert listed == (missed + [q for q in results if q not in missed])[:5]
    assert text.count("<details open>") == DEFAULT_OPEN_QUERIES
    left = len(results) - 5
    assert f"data-left-out=\"{left}\"" in text and f"{left} left out" in text


def test_report_errors_are_one_line(inputs: dict[str, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    base = ["report", "--data", str(inputs["data"]), "--filter", str(inputs["artifact"])]
    for out in (inputs["data"], inputs["artifact"]):
        assert cli_main([*base, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--out" in err
    missing = tmp_path / "none.json"
    assert cli_main(["report", "--data", str(inputs["data"]), "--filter", str(missing),
                     "--out", str(tmp_path / "r.html")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_evaluate_and_answers_html(driver: Any, inputs: dict[str, Path], embedding_cache_dir: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = inputs["root"]
    data = root / "eval.jsonl"
    write_pairs([p for p in load_dataset(str(inputs["data"])) if p.group != "inject"], data)
    common = ["--data", str(data), "--scorer", "embedding", "--cache-dir", str(embedding_cache_dir)]
    assert cli_main(["-q", "evaluate", *common, "--splits", "3", "--alpha", "0.1,0.2",
                     "--json", "--html", str(root / "evaluate.html")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert cli_main(["-q", "answers", *common, "--no-generate", "--alpha", "0.1,0.2",
                     "--bootstrap-resamples", "200", "--json",
                     "--html", str(root / "answers.html")]) == 0
    answered = json.loads(capsys.readouterr().out)
    for name, report in (("evaluate", evaluated), ("answers", answered)):
        url = _load(driver, root / f"{name}.html")
        assert network_requests(driver) == [url]
        rows = driver.find_elements("css selector", "table.results tbody tr")
        assert len(rows) == len(report["results"])
        methods = [r.find_element("css selector", "td").text for r in rows]
        assert "conformal" in " ".join(methods)
        assert driver.find_elements("css selector", "img.figure")
        assert driver.find_element("css selector", "p.guarantee").text
    # answers: every method's "vs all" cell shows an interval [low, high]
    cells = [r.find_elements("css selector", "td")[6].text for r in rows]
    assert any(c.count("[") == 1 and c.endswith("]") for c in cells)


def test_report_without_labels_says_so(inputs: dict[str, Path], embedding_cache_dir: Path) -> None:
    from dataclasses import replace

    flt = ConformalFilter.load(inputs["artifact"], scorer_options={"cache_dir": embedding_cache_dir})
    pairs = [replace(p, relevant=None) for p in load_dataset(str(inputs["data"]))]
    text = build_report(flt, pairs, ReportSettings(max_queries=2))
    assert "class=\"metrics none\"" in text and "coverage cannot be measured" in text
    assert "class=\"figure none\"" in text and "<img" not in text
    assert "data-label=\"unknown\"" in text and "data-label=\"relevant\"" not in text
