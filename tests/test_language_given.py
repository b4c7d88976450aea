"""``--language`` given alone: the queries' language is checked, not assumed (issue 34, item 4).

English questions over German (or Chinese, ...) articles calibrated with ``--language de``
used to be taken as German questions: the monolingual model and score, several points of the
oracle's removal lost. Now a sample of the queries is classified; when it is confidently in
another language than the given one (and not the snippets' too), the cross-language setting
is chosen, said in one warning and recorded. ``--query-language`` is never overridden.

Real shared data (the parallel XQuAD files), the real py3langid detector; the filters use an
outside score (a ``bm25`` field of word overlap), so no embedding model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest

from ragsieve import ConformalFilter
from ragsieve.artifact import Artifact
from ragsieve.cli import build_parser, main
from ragsieve.cli.scorers import ScorerRequest, languages_choice, scorer_choice
from ragsieve.data import load_dataset, write_pairs
from ragsieve.embeddings.detection import detect_languages
from ragsieve.scoring import FieldScorer
from ragsieve.scoring.auto import (
    QUERY_SWITCH_SHARE,
    AutoScorer,
    LanguageChoice,
    choose_languages,
)
from ragsieve.types import Pair

pytest.importorskip("py3langid")

from test_crosslingual import _subset  # the first questions of the first articles

SWITCH = "was given without --query-language"


def _with_bm25(pairs: list[Pair]) -> list[Pair]:
    """The pairs with an outside score ``bm25``: the share of the query's words in the text,
    in eighths (exact binary fractions: equal scores of a list average to themselves)."""
    def overlap(p: Pair) -> float:
        words = set(re.findall(r"\w+", p.query.lower()))
        share = len(words & set(re.findall(r"\w+", p.text.lower()))) / max(len(words), 1)
        return round(share * 8) / 8

    return [dataclasses.replace(p, meta={**p.meta, "bm25": overlap(p)}) for p in pairs]


def _switches(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and SWITCH in r.getMessage()]


@pytest.fixture(scope="module")
def en2de(shared_data_dir: Path) -> list[Pair]:
    """English questions over German articles: 8 articles, 5 questions each (40 queries)."""
    return _with_bm25(_subset(load_dataset("xquad-en2de", data_dir=shared_data_dir), 8, 5))


@pytest.fixture(scope="module")
def german(shared_data_dir: Path, en2de: list[Pair]) -> list[Pair]:
    """The same questions in German over the same articles."""
    ids = {p.meta["qa_id"] for p in en2de}
    return _with_bm25([p for p in load_dataset("xquad-de", data_dir=shared_data_dir)
                       if p.meta["qa_id"] in ids])


# ------------------------------------------------------------------ the rule
@pytest.mark.parametrize(("dataset", "given", "asked"), [
    ("xquad-en2de", "de", "en"), ("xquad-en2zh", "zh", "en"), ("xquad-de2el", "el", "de")])
def test_given_language_alone_takes_the_detected_queries_language(
        shared_data_dir: Path, caplog: pytest.LogCaptureFixture, dataset: str, given: str,
        asked: str) -> None:
    pairs = load_dataset(dataset, data_dir=shared_data_dir)
    with caplog.at_level(logging.WARNING, logger="ragsieve.scoring.auto"):
        found = choose_languages(pairs, given)
    assert (found.code, found.query_code, found.cross) == (given, asked, True)
    assert re.fullmatch(rf"py3langid: queries \d\.\d\d of \d+ texts \(not the given {given}\), "
                        r"snippets given", found.source), found.source
    assert found.info() == {"language": given, "language_source": found.source,
                            "query_language": asked}
    notes = _switches(caplog)
    assert len(notes) == 1 and "\n" not in notes[0]
    note = notes[0]
    # what was detected, what was chosen, how to override
    assert note.startswith(f"--language {given} {SWITCH}, but the queries are detected in "
                           f"{asked} (py3langid, "), note
    assert f"snippets: {given})" in note
    assert f"chose queries in {asked} over snippets in {given} (cross-language)" in note
    assert "override with --query-language X" in note
    assert note.endswith(f"--query-language {given} for queries in {given}"), note


def test_given_query_language_is_never_overridden(en2de: list[Pair],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ragsieve.scoring.auto"):
        forced = choose_languages(en2de, "de", query_language="de")  # monolingual, as asked
        other = choose_languages(en2de, "de", query_language="es-ES")
    assert forced == LanguageChoice("de", "de", "given") and not forced.cross
    assert "query_language" not in forced.info()
    assert other == LanguageChoice("de", "es", "given")
    assert not caplog.records  # nothing detected, nothing said
    # the auto score of Python follows the same rule (what ConformalFilter.calibrate asks it)
    assert AutoScorer(language="de", query_language="de").languages(en2de) == forced
    assert AutoScorer().languages(en2de, language="de").query_code == "en"


def test_agreeing_or_unsure_detection_keeps_the_given_language(
        en2de: list[Pair], german: list[Pair], caplog: pytest.LogCaptureFixture) -> None:
    one_article = [p for p in en2de if p.group == en2de[0].group]
    assert len({p.query_id for p in one_article}) == 5
    english = sorted({p.meta["qa_id"] for p in en2de})[:28]  # 28 of the 40 questions
    mixed = ([p for p in en2de if p.meta["qa_id"] in english]
             + [p for p in german if p.meta["qa_id"] not in english])
    with caplog.at_level(logging.WARNING, logger="ragsieve.scoring.auto"):
        agrees = choose_languages(german, "de")
        # both sides detected in one other language: the user's word stands for both
        both_other = choose_languages(german, "es")
        # 5 English questions, all detected: too few queries to overrule what was given
        few = choose_languages(one_article, "de")
        # 0.7 of the questions English: detected, but below the share a switch needs
        unsure = choose_languages(mixed, "de")
    for found in (agrees, few, unsure):
        assert found == LanguageChoice("de", "de", "given")
    assert both_other == LanguageChoice("es", "es", "given")
    assert not _switches(caplog)
    seen = detect_languages(mixed).queries  # what the rule saw: en, not confidently
    assert seen.code == "en" and 0.6 <= seen.share < QUERY_SWITCH_SHARE


# ------------------------------------------------------------------ the command line
def _request(*flags: str) -> ScorerRequest:
    args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                      "--no-cache", *flags])
    return ScorerRequest.from_args(args)


def test_cli_language_choice_looks_at_the_pairs(en2de: list[Pair]) -> None:
    request = _request("--language", "de")
    found = languages_choice(request, en2de)
    assert (found.code, found.query_code) == ("de", "en")
    assert found.source.startswith("py3langid: queries ")
    assert languages_choice(request) == LanguageChoice("de", "de", "given")  # no pairs
    assert languages_choice(_request("--language", "de", "--query-language", "de"),
                            en2de) == LanguageChoice("de", "de", "given")
    # calibrate's choice (auto resolved later by ConformalFilter.calibrate): the queries'
    # language goes to the auto score, so calibrate does not detect it again
    chosen = scorer_choice(request, en2de, resolve_auto=False)
    assert (chosen.language, chosen.query_language, chosen.language_source) == (
        "de", "en", found.source)
    assert chosen.scorer.query_language == "en" and chosen.scorer.language == "de"
    # --query-language equal to --language: the auto score is told so, and does not detect
    forced = scorer_choice(_request("--language", "de", "--query-language", "de"), en2de,
                           resolve_auto=False)
    assert (forced.query_language, forced.scorer.query_language) == ("de", "de")
    assert forced.scorer.languages(en2de, language="de") == LanguageChoice("de", "de", "given")


def test_cli_calibrate_records_and_says_the_switch(
        tmp_path: Path, en2de: list[Pair], capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "en2de.jsonl"
    write_pairs(en2de, data)
    common = ["-q", "calibrate", "--data", str(data), "--scorer", "field", "--score-field",
              "bm25", "--higher-is-better", "--no-expected", "--language", "de"]
    with caplog.at_level(logging.WARNING):
        code = main([*common, "--out", str(tmp_path / "switched.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    notes = _switches(caplog)  # once: calibrate records the command line's choice quietly
    assert len(notes) == 1 and "queries are detected in en" in notes[0], notes
    line = next(x for x in out.splitlines() if "snippets de" in x)
    assert line.startswith("queries en, snippets de (py3langid: queries "), line
    assert line.endswith("(not the given de), snippets given)"), line
    artifact = Artifact.read(tmp_path / "switched.json")
    assert (artifact.language, artifact.query_language) == ("de", "en")
    assert artifact.data is not None and artifact.data["language_source"] == line[
        len("queries en, snippets de ("):-1]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        code = main([*common, "--query-language", "de", "--out", str(tmp_path / "mono.json")])
    out, err = capsys.readouterr()
    assert code == 0 and not _switches(caplog), err
    assert "language de (given)" in out.splitlines()
    mono = Artifact.read(tmp_path / "mono.json")
    assert (mono.language, mono.query_language) == ("de", "de")
    assert mono.data is not None and "query_language" not in mono.data


# ------------------------------------------------------------------ Python and the service
def _calibrated(pairs: list[Pair], path: Path, **calibrate: object) -> Path:
    flt = ConformalFilter(FieldScorer("bm25", higher_is_better=True), alpha=0.2)
    flt.calibrate(pairs, monitor=False, **calibrate)  # type: ignore[arg-type]
    flt.save(path)
    return path


def _traffic_note(artifact: Path, queries: list[Pair], state: Path) -> str | None:
    """The service's note after the first 20 /filter requests of ``queries`` (each with its
    query's snippets)."""
    from fastapi.testclient import TestClient

    from ragsieve.server import create_app

    first = list(dict.fromkeys(p.query_id for p in queries))[:20]
    app = create_app(artifact, warmup=False, state_dir=state)
    with TestClient(app) as client:
        for qid in first:
            listed = [p for p in queries if p.query_id == qid]
            r = client.post("/filter", json={"query": listed[0].query, "snippets": [
                {"text": p.text, "bm25": p.meta["bm25"]} for p in listed]})
            assert r.status_code == 200, r.text
        watch = app.state.runtime.current.language_watch
        watch.wait(30)
        return watch.note


def test_python_calibrate_and_the_service_check_the_queries(
        tmp_path: Path, en2de: list[Pair], german: list[Pair]) -> None:
    pytest.importorskip("fastapi")
    # ConformalFilter.calibrate(language=...) records the switch as the command line does
    cross = _calibrated(en2de, tmp_path / "cross.json", language="de")
    info = json.loads(cross.read_text(encoding="utf-8"))["data"]
    assert (info["language"], info["query_language"]) == ("de", "en")
    assert info["language_source"].endswith("(not the given de), snippets given")
    # German questions calibrated with the given German: a German filter
    mono = _calibrated(german, tmp_path / "mono.json", language="de")
    assert Artifact.read(mono).query_language == "de"
    # served: English questions to the German filter are named, with both ways to fix it
    note = _traffic_note(mono, en2de, tmp_path / "s1")
    assert note is not None and note.startswith("the queries are in en (py3langid")
    assert "calibrated on de:" in note and "(--query-language en)" in note
    # the switched filter expects English questions: they pass, German ones are named
    assert _traffic_note(cross, en2de, tmp_path / "s2") is None
    note = _traffic_note(cross, german, tmp_path / "s3")
    assert note is not None and note.startswith("the queries are in de (py3langid")
    assert "calibrated on queries en over snippets de:" in note
