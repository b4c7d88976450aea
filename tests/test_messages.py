"""Messages a newcomer reads in the first hour, each read back by a test.

- ``calibrate`` with few topics says why it gives no expectation and what ``choose-alpha``
  does instead; ``choose-alpha`` on the same topics says its splits overlap.
- A topic mode says before calibrating how many topics its alpha (and delta) need, and
  ``calibrate`` refuses with that number (``1 - delta^(1/K)`` for topic-pac).
- The sentence unit names its score as the sentence-in-context score, and its model.
- ``-q`` silences the libraries' progress bars too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ragsieve import ConformalFilter
from ragsieve.calibration import make_calibrator
from ragsieve.cli import main
from ragsieve.cli.output import choice_lines
from ragsieve.cli.scorers import ScorerChoice
from ragsieve.data import write_pairs
from ragsieve.fitting import topics_shortfall


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def five_topics(xquad_en: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    groups = sorted({p.group for p in xquad_en})[:5]
    path = tmp_path_factory.mktemp("messages") / "five.jsonl"
    write_pairs([p for p in xquad_en if p.group in groups], path)
    return path


def test_few_topics_calibrate_and_choose_alpha_say_the_same_thing(
        five_topics: Path, embedding_cache_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["-q", "calibrate", "--data", str(five_topics), "--scorer", "embedding",
                         "--cache-dir", str(embedding_cache_dir),
                         "--out", str(tmp_path / "f.json")], capsys)
    assert code == 0
    assert "5 topic(s) (the pairs' group field) is too few for a topic-disjoint estimate: " \
           "it needs at least 10 (5 folds of at least 2 topics); `ragsieve choose-alpha` and " \
           "`evaluate` still run random splits of these 5 topics" in out
    code, out, _ = _run(["-q", "choose-alpha", "--data", str(five_topics), "--scorer",
                         "embedding", "--cache-dir", str(embedding_cache_dir),
                         "--removal", "0.5"], capsys)
    assert code == 0
    assert "10 splits over only 5 topics, whose held-out topics overlap from split to split" in out
    assert "`calibrate` estimates new topics from 10 topics on" in out


@pytest.mark.parametrize(("mode", "params", "needed"), [
    ("topic-pac", {"alpha": 0.1, "delta": 0.1}, 22),
    ("topic", {"alpha": 0.05}, 19),
])
def test_topic_modes_say_how_many_topics_they_need_before_calibrating(
        mode: str, params: dict[str, float], needed: int, five_topics: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cal = make_calibrator(mode, **params)
    assert cal.topics_needed()[0] == needed
    argv = ["-q", "calibrate", "--data", str(five_topics), "--scorer", "embedding",
            "--mode", mode, "--alpha", str(params["alpha"]), "--out", str(tmp_path / "f.json")]
    if "delta" in params:
        argv += ["--delta", str(params["delta"])]
    code, _out, err = _run(argv, capsys)
    assert code == 2 and not (tmp_path / "f.json").exists()  # refused before any scoring
    assert f"needs at least {needed} calibration topics with evidence" in err
    assert "the data holds 5 (the pairs' group field)" in err
    if mode == "topic-pac":  # the smallest certifiable miss rate with K topics and no miss
        assert f"1 - delta^(1/K) ({1 - 0.1 ** (1 / needed):.3f} at K = {needed})" in err
    assert len(err.strip().splitlines()) == 1


def test_a_learning_score_is_warned_of_the_topics_it_takes(xquad_en: Any) -> None:
    groups = sorted({p.group for p in xquad_en})[:24]
    pairs = [p for p in xquad_en if p.group in groups]
    cal = make_calibrator("topic-pac", alpha=0.1, delta=0.1)
    assert topics_shortfall(cal, pairs, learns=False) is None  # 24 >= 22
    message, refused = topics_shortfall(cal, pairs, learns=True)
    assert not refused and "calibrates on about 18" in message
    # topics count where they hold evidence
    no_evidence = [dataclasses.replace(p, relevant=0) if p.group == groups[0] else p
                   for p in pairs]
    assert "the data holds 23," in topics_shortfall(cal, no_evidence, learns=True)[0]


def test_sentence_unit_names_its_score_and_model(sentence_artifact: Path) -> None:
    flt = ConformalFilter.load(sentence_artifact)
    spec = flt.scorer_.spec()
    assert spec["scorer"] == "sentence_context"
    choice = ScorerChoice(flt.scorer_, "en", "given", alias="best").to_dict(
        flt.calibration_info, spec)
    lines = choice_lines(choice)
    assert lines[0].startswith("score: sentence in context, each stage ")
    assert lines[-1].startswith("model: all-MiniLM-L6-v2 - language en")


def test_quiet_silences_the_libraries_progress_bars(
        five_topics: Path, embedding_cache_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    import transformers

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    huggingface_hub.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()
    try:
        code, _, _ = _run(["-q", "calibrate", "--data", str(five_topics), "--scorer",
                           "embedding", "--cache-dir", str(embedding_cache_dir), "--no-expected",
                           "--out", str(tmp_path / "f.json")], capsys)
        assert code == 0
        assert huggingface_hub.utils.are_progress_bars_disabled()
        assert not transformers.utils.logging.is_progress_bar_enabled()
    finally:  # the rest of the session keeps its bars
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        huggingface_hub.utils.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()
