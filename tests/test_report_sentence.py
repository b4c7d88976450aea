"""``ragsieve report`` for a filter of unit ``"sentence"``: the page's measures against the
filter's own sentence decisions and the evidence labels, and its sentence spans read in the
real headless Chromium (real MiniLM, real XQuAD-en, a real calibrated artifact)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser import chrome, network_requests  # noqa: F401  (chrome: the fixture)

from ragsieve import ConformalFilter, Pair
from ragsieve.cli import main as cli_main
from ragsieve.data import load_dataset, write_pairs
from ragsieve.evaluation.report import ReportSettings, build_report
from ragsieve.types import FilterResult
from ragsieve.units import sentence_pairs, split_sentences

pytest.importorskip("selenium")

SCRIPT = ("<script>document.title='pwned';window.__pwned=1</script>"
          "<img src=x onerror=\"window.__pwned=2\"> & \"quotes\".")
INJECTED = Pair("q-inject", "who wrote the page?", "inject-0",
                f"Ada Lovelace wrote the page. {SCRIPT} It ends here.", relevant=1,
                group="inject", meta={"evidence": [[0, 28]]})

EVIDENCE = "coverage of evidence sentences (evidence sentences kept)"
SENTENCES = "removal (sentences removed)"
CHARS = "removal of characters (kept sentences against all snippet characters)"
SNIPPETS = "snippet view: relevant snippets with at least one kept sentence"
WHOLE = "snippet view: snippets with no kept sentence"
NAMES = {1: "evidence", 0: "not evidence", None: "unknown"}


def _queries(pairs: list[Pair], topics: list[str], per_topic: int) -> list[Pair]:
    """The whole lists of the first ``per_topic`` queries of each topic."""
    chosen: dict[str, list[str]] = {}
    for p in pairs:
        qs = chosen.setdefault(p.group, [])
        if p.group in topics and p.query_id not in qs and len(qs) < per_topic:
            qs.append(p.query_id)
    keep = {q for qs in chosen.values() for q in qs}
    return [p for p in pairs if p.query_id in keep]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair],
           minilm_scorer: Any) -> dict[str, Any]:
    """A sentence filter on MiniLM calibrated on XQuAD-en's first 300 pairs (saved), and a
    labelled JSONL of 3 other articles (3 queries each, the query's answers in every line)
    plus a query whose evidence-span snippet holds an HTML/script sentence."""
    root = tmp_path_factory.mktemp("report-sentence")
    cal = xquad_en[:300]
    flt = ConformalFilter(minilm_scorer, alpha=0.2, unit="sentence").calibrate(cal)
    seen = {p.group for p in cal}
    topics = [g for g in dict.fromkeys(p.group for p in xquad_en) if g not in seen][:3]
    pairs = [*_queries(xquad_en, topics, 3), INJECTED]
    write_pairs(pairs, root / "data.jsonl")
    return {"root": root, "filter": flt, "artifact": flt.save(root / "sentence.json"),
            "data": root / "data.jsonl"}


@pytest.fixture(scope="module")
def data(inputs: dict[str, Any]) -> tuple[list[Pair], dict[str, FilterResult]]:
    """The data as ``report`` reads it, and the filter's results on it."""
    pairs = load_dataset(str(inputs["data"]))
    return pairs, inputs["filter"].filter_pairs(pairs)


def _labels(pairs: list[Pair]) -> dict[tuple[str, int, int], int | None]:
    return {(p.query_id, p.meta["parent_position"], p.meta["sentence_start"]): p.relevant
            for p in sentence_pairs(pairs)}


def _expected(pairs: list[Pair], results: dict[str, FilterResult]) -> dict[str, float]:
    """The page's measures, from ``FilterResult.sentences`` and the evidence labels."""
    labels = _labels(pairs)
    rows = [(labels[(qid, i, start)], kept, end - start) for qid, r in results.items()
            for i, start, end, _score, kept in r.sentences]
    evidence = [kept for label, kept, _ in rows if label == 1]
    relevant = {(p.query_id, p.snippet_id) for p in pairs if p.relevant == 1}
    kept = {(qid, s.snippet_id) for qid, r in results.items() for s in r.kept}
    kept_chars = sum(n for _, k, n in rows if k)
    assert evidence and 0 < sum(k for _, k, _ in rows) < len(rows)  # the check is not vacuous
    return {EVIDENCE: float(np.mean(evidence)),
            SENTENCES: 1 - float(np.mean([k for _, k, _ in rows])),
            CHARS: 1 - kept_chars / sum(len(p.text) for p in pairs),
            SNIPPETS: len(relevant & kept) / len(relevant),
            WHOLE: 1 - len(kept) / len(pairs)}


def _measures(text: str) -> dict[str, float]:
    """The rows of the page's ``table.metrics``: name -> value shown."""
    table = text[text.index("<table class=\"metrics\">"):]
    table = table[:table.index("</table>")]
    return {name: float(value) for name, value in
            re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">([^<]+)</td>", table)}


def test_measures_are_of_evidence_sentences(inputs: dict[str, Any],
                                            data: tuple[list[Pair], dict[str, FilterResult]]) -> None:
    pairs, results = data
    flt = inputs["filter"]
    text = build_report(flt, pairs, ReportSettings(n_resamples=200), results=results)
    shown = _measures(text)
    assert set(shown) == {EVIDENCE, SENTENCES, CHARS, SNIPPETS, WHOLE}
    for name, value in _expected(pairs, results).items():
        assert shown[name] == pytest.approx(value, abs=5e-4), name
    assert "<dd>sentence (each snippet&#x27;s sentences scored and kept on their own)</dd>" in text
    assert "evidence sentence" in flt.guarantee()["statement"]
    assert f"{flt.guarantee()['statement'].replace('>', '&gt;')}.</p>" in text
    assert "data-unit=\"topics\"" in text  # 4 topics hold relevant snippets
    assert "data-reason=\"unit\"" in text and "<img" not in text  # no snippet-level figure


def test_cli_page_shows_every_sentence_in_chromium(chrome: Any, inputs: dict[str, Any],  # noqa: F811
                                                   data: tuple[list[Pair], dict[str, FilterResult]],
                                                   embedding_cache_dir: Path) -> None:
    out = inputs["root"] / "report.html"
    assert cli_main(["-q", "report", "--data", str(inputs["data"]), "--filter",
                     str(inputs["artifact"]), "--out", str(out),
                     "--cache-dir", str(embedding_cache_dir)]) == 0
    network_requests(chrome)
    url = out.resolve().as_uri()
    chrome.get(url)
    assert network_requests(chrome) == [url]  # the page itself and nothing else
    pairs, results = data
    labels = _labels(pairs)
    missed = [qid for qid, r in results.items()
              if any(not kept and labels[(qid, i, a)] == 1 for i, a, _, _, kept in r.sentences)]
    expected = {}
    for qid, r in results.items():
        sentences = {}
        for s in r.sentences:
            sentences.setdefault(s[0], []).append(s)
        expected[qid] = [qid, [
            [s.snippet_id, side, [[f"sentence {'kept' if k else 'removed'}", a, b, score,
                                   NAMES[labels[(qid, s.index, a)]], s.text[a:b]]
                                  for _, a, b, score, k in sentences[s.index]]]
            for side, snippets in (("kept", r.kept), ("removed", r.removed)) for s in snippets]]
    page = chrome.execute_script("""
        return [...document.querySelectorAll('section.query')].map(q => [q.dataset.queryId,
          [...q.querySelectorAll('li[data-snippet-id]')].map(li => [li.dataset.snippetId,
            li.parentElement.className, [...li.querySelectorAll('span.sentence')].map(s => [
              s.className, +s.dataset.start, +s.dataset.end, parseFloat(s.dataset.score),
              s.dataset.label, s.querySelector('.text').textContent])])]);""")
    # the queries that lost an evidence sentence first, the others in data order
    assert missed and len(missed) < len(results)
    assert [got[0] for got in page] == missed + [q for q in results if q not in missed]
    n = sum(not kept and labels[(missed[0], i, a)] == 1
            for i, a, _, _, kept in results[missed[0]].sentences)
    flag = chrome.find_element("css selector", "section.query.miss summary .missed")
    assert flag.text == f"{n} evidence sentence{'s' if n > 1 else ''} removed"
    for got in page:
        want = expected[got[0]]
        for li, li_want in zip(got[1], want[1], strict=True):
            assert li[:2] == li_want[:2]
            for span, span_want in zip(li[2], li_want[2], strict=True):
                assert span[:3] == span_want[:3] and span[4:] == span_want[4:]
                # float32 embeddings: the page's run may embed in other batches (or read the
                # shared embedding cache another test filled), which moves the last bits
                assert span[3] == pytest.approx(span_want[3], rel=1e-6)
    colours = chrome.execute_script("""
        const c = sel => [...new Set([...document.querySelectorAll(sel)].map(
            s => getComputedStyle(s).backgroundColor))];
        return [c('span.sentence.kept'), c('span.sentence.removed')];""")
    assert colours == [["rgb(218, 251, 225)"], ["rgb(255, 235, 233)"]]  # green, red
    rows = chrome.find_elements("css selector", "table.metrics tbody tr")
    shown = {r.find_elements("css selector", "td")[0].text: r.find_elements("css selector", "td")
             for r in rows}
    for name, value in _expected(pairs, results).items():
        assert float(shown[name][1].text) == pytest.approx(value, abs=5e-4), name
        assert shown[name][2].text.startswith("[")  # an interval over topics
    assert not chrome.find_elements("css selector", "img.figure")


def test_script_sentence_is_shown_as_text(chrome: Any, inputs: dict[str, Any],  # noqa: F811
                                          data: tuple[list[Pair], dict[str, FilterResult]],
                                          tmp_path: Path) -> None:
    pairs, results = data
    text = build_report(inputs["filter"], pairs, ReportSettings(n_resamples=200), results=results)
    assert "<script>document" not in text and "&lt;script&gt;document" in text
    out = tmp_path / "report.html"
    out.write_text(text, encoding="utf-8")
    chrome.get(out.resolve().as_uri())
    assert chrome.title.startswith("ragsieve report")  # the injected script never ran
    assert chrome.execute_script("return typeof window.__pwned") == "undefined"
    assert chrome.execute_script("return document.getElementsByTagName('script').length") == 0
    assert not chrome.find_elements("css selector", "section.query img")
    spans = chrome.find_elements("css selector", "li[data-snippet-id='inject-0'] span.sentence")
    got = [(s.get_attribute("data-label"), int(s.get_attribute("data-start")),
            s.find_element("css selector", ".text").get_attribute("textContent")) for s in spans]
    assert [(label, start) for label, start, _ in got] == [
        ("evidence", s.start) if s.start == 0 else ("not evidence", s.start)
        for s in split_sentences(INJECTED.text)]
    assert [t for _, _, t in got] == ["Ada Lovelace wrote the page.", SCRIPT, "It ends here."]


def test_unlabelled_data_shows_removal_only(inputs: dict[str, Any],
                                            data: tuple[list[Pair], dict[str, FilterResult]]) -> None:
    pairs, results = data
    bare = [replace(p, relevant=None) for p in pairs]
    text = build_report(inputs["filter"], bare, results=results)
    removed = 1 - np.mean([s[4] for r in results.values() for s in r.sentences])
    assert "class=\"metrics none\"" in text and "coverage cannot be measured" in text
    assert f"Removal on this data: {removed:.3f} of the sentences" in text
    assert "table class=\"metrics\"" not in text
    labels = re.findall(r"<span class=\"sentence (?:kept|removed)\"[^>]* data-label=\"([^\"]+)\"",
                        text)
    assert labels and set(labels) == {"unknown"}


def test_labels_without_evidence_fields_keep_the_snippet_view(
        inputs: dict[str, Any], data: tuple[list[Pair], dict[str, FilterResult]]) -> None:
    pairs, results = data
    plain = [replace(p, meta={}) for p in pairs]  # relevant snippets without answers or spans
    text = build_report(inputs["filter"], plain, ReportSettings(n_resamples=200),
                        results=results)
    assert "Coverage of evidence sentences not measured:" in text and "no &#x27;evidence&#x27;" in text
    shown = _measures(text)
    assert EVIDENCE not in shown
    assert shown[SNIPPETS] == pytest.approx(_expected(pairs, results)[SNIPPETS], abs=5e-4)


def test_results_of_other_pairs_are_refused(inputs: dict[str, Any],
                                            data: tuple[list[Pair], dict[str, FilterResult]]) -> None:
    """Sentences the filter cut that the data does not hold are an error, not "unknown"
    labels quietly left out of coverage."""
    pairs, results = data
    moved = [replace(p, text="A first line here. " + p.text) if p.snippet_id == INJECTED.snippet_id
             else p for p in pairs]
    with pytest.raises(ValueError, match="not those of these pairs"):
        build_report(inputs["filter"], moved, ReportSettings(n_resamples=200),
                     results=results)
