"""The reader check of the default score: ``auto`` fuses the reader only where, with
1 - cos, it ranks the fit share's held-back topics better than 1 - cos alone (fine-tuned for
real, on a few pairs)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest
from topics import first_topics

from ragsieve import ConformalFilter
from ragsieve.embeddings.cross_encoder import fine_tune
from ragsieve.scoring import AutoScorer
from ragsieve.scoring import reader as reader_module
from ragsieve.scoring.reader_check import MIN_READER_GAIN, check_reader
from ragsieve.scoring.shares import fusion_fit_mask
from ragsieve.types import Pair

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def few_topics(xquad_en: list[Pair]) -> list[Pair]:
    """Four questions of each of four XQuAD-en topics, their lists whole."""
    return first_topics(xquad_en, 4, 4)


def _fit_share(pairs: list[Pair], seed: int) -> set[object]:
    seen: dict[object, int] = {}
    topics = np.array([seen.setdefault(p.group, len(seen)) for p in pairs])
    return {pairs[i].group for i in np.flatnonzero(fusion_fit_mask(topics, seed=seed))}


def test_languages_the_base_was_not_trained_on_are_not_tried() -> None:
    found = check_reader([], None, language="en", query_language="tlh")  # type: ignore[arg-type]
    assert not found.helps and found.reader_auc is None
    assert "not trained on queries tlh, snippets en" in found.reason
    unknown = check_reader([], None, language=None)  # type: ignore[arg-type]
    assert "texts of an unknown language" in unknown.reason


def test_other_languages_the_base_knows_are_checked(shared_data_dir) -> None:  # type: ignore[no-untyped-def]
    from ragsieve.data import load_xquad

    german = first_topics(load_xquad("de", data_dir=shared_data_dir), 4, 4)
    found = check_reader(german, None, language="de", query_language="en")  # type: ignore[arg-type]
    assert found.reason.startswith("not tried: the fit share holds")  # the size gate, not language


def test_auto_needs_enough_relevant_fit_pairs(few_topics: list[Pair], minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    found = check_reader(few_topics, minilm_scorer, seed=1)
    fit = _fit_share(few_topics, 1)
    n = sum(p.relevant == 1 for p in few_topics if p.group in fit)
    assert not found.helps and found.n_pairs == 0
    assert f"holds {n} relevant pairs" in found.reason and "--reader-check always" in found.reason
    assert "not tried (--reader-check never)" == check_reader(
        few_topics, minilm_scorer, mode="never").reason
    with pytest.raises(ValueError, match="expected one of auto, always, never"):
        check_reader(few_topics, minilm_scorer, mode="sometimes")


def _counting(sizes: list[int]):  # type: ignore[no-untyped-def]
    """``fine_tune`` that appends the size of each fit to ``sizes`` (its base to ``BASES``)."""
    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(len(args[0]))
        BASES.append(args[3].base)
        return fine_tune(*args, **kwargs)

    return counted


@pytest.fixture(scope="module")
def checked(few_topics: list[Pair], minilm_scorer):  # type: ignore[no-untyped-def]
    """The check of ``few_topics`` (seed 1, always), run once for the module from an empty
    cache of cross-fits, and the sizes of the real fine-tunes it caused. Its cache of the
    half-share readers' scores stays in place for the module's tests (they read it)."""
    sizes: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_module, "_OUT_OF_FOLD", OrderedDict())
        patch.setattr(reader_module, "fine_tune", _counting(sizes))
        found = check_reader(few_topics, minilm_scorer, seed=1, mode="always")
        patch.setattr(reader_module, "fine_tune", fine_tune)
        yield found, list(sizes)


def test_the_check_reads_the_fit_share_only(few_topics: list[Pair], minilm_scorer,  # type: ignore[no-untyped-def]
                                            checked) -> None:  # type: ignore[no-untyped-def]
    found = checked[0]
    fit = _fit_share(few_topics, 1)
    assert found.n_pairs == sum(p.group in fit for p in few_topics)
    assert found.reader_auc is not None and found.base_auc is not None
    assert 0.0 <= found.reader_auc <= 1.0 and 0.0 <= found.base_auc <= 1.0
    assert found.fused_auc is not None and 0.0 <= found.fused_auc <= 1.0
    assert found.helps == (found.fused_auc >= found.base_auc + MIN_READER_GAIN)
    assert f"{found.reader_auc:.3f}" in found.reason and f"{found.fused_auc:.3f}" in found.reason
    # the calibration topics' labels turned upside down: the check cannot see them
    flipped = [p if p.group in fit else replace(p, relevant=1 - int(p.relevant or 0))
               for p in few_topics]
    assert check_reader(flipped, minilm_scorer, seed=1, mode="always") == found


def test_auto_records_what_the_check_found(few_topics: list[Pair]) -> None:
    never = ConformalFilter(AutoScorer(reader_check="never"), alpha=0.2).calibrate(
        few_topics, seed=1, monitor=False)
    choice = never.calibration_info["score_choice"]
    assert choice["preset"] == "portable" and choice["reader"] == \
        "not tried (--reader-check never)"
    default = ConformalFilter("auto", alpha=0.2).calibrate(few_topics, seed=1, monitor=False)
    assert "not tried: the fit share holds" in default.calibration_info["score_choice"]["reader"]
    assert default.scorer_.spec() == never.scorer_.spec()  # both the portable fused score


#: The base of every real fine-tune a test causes (``tuned`` fills it beside the sizes).
BASES: list[str] = []


@pytest.fixture
def tuned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every real fine-tune the test causes (the reader's own, counted; its
    base in ``BASES``), with no earlier test's cross-fits in the process's cache."""
    sizes: list[int] = []
    BASES.clear()
    monkeypatch.setattr(reader_module, "_OUT_OF_FOLD", OrderedDict())
    monkeypatch.setattr(reader_module, "fine_tune", _counting(sizes))
    return sizes


# the same AutoScorer(reader_check="always") path, check then fused fit, counted the same way:
@pytest.mark.slow  # test_auto_checks_and_fuses_the_reader_of_the_base_asked_for covers it
def test_always_fuses_the_reader_where_it_read_better(few_topics: list[Pair],
                                                      tuned: list[int]) -> None:
    flt = ConformalFilter(AutoScorer(reader_check="always"), alpha=0.2).calibrate(
        few_topics, seed=1, monitor=False)
    choice = flt.calibration_info["score_choice"]
    read_better = choice["reader"].startswith("fused:")
    assert read_better or choice["reader"].startswith("not fused:")
    assert choice["preset"] == ("portable-reader" if read_better else "portable")
    assert flt.scorer_.spec()["preset"] == choice["preset"]
    assert bool(flt.scorer_.learned_weights()) == read_better  # the reader's tensors, if fused
    # the check's two half-share readers, and when fused one reader on the whole share: the
    # fused fit reads the check's out-of-fold scores, it does not fine-tune the halves again
    assert len(tuned) == 2 + read_better


def test_the_cross_fit_says_when_it_cannot_measure() -> None:
    from ragsieve.scoring.reader_check import _cross_fitted

    held = [Pair(f"q{i}", "Q?", f"s{i}", "t", relevant=int(i < 4), group=f"g{i // 4}")
            for i in range(8)]  # each topic one class: no half can be measured
    labels = np.array([p.relevant for p in held])
    base, reader = np.linspace(0, 1, 8), np.linspace(1, 0, 8)
    assert _cross_fitted(labels, base, reader, held) is None
    mixed = [replace(p, group=f"g{i % 2}") for i, p in enumerate(held)]
    measured = _cross_fitted(labels, base, reader, mixed)
    assert measured is not None and all(0.0 <= auc <= 1.0 for auc in measured)


# slow: test_auto_checks_and_fuses_the_reader_of_the_base_asked_for covers it (the same
# pairs and seed fuse there: its check's two halves, then one fine-tune of the fused fit)
@pytest.mark.slow
def test_the_fused_fit_reads_the_checks_half_readers(few_topics: list[Pair], checked,  # type: ignore[no-untyped-def]
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ragsieve.scoring import FusedScorer

    found, tuned = checked  # the module's check, from an empty cache
    assert found.reader_auc is not None and len(tuned) == 2  # the two half-share readers
    tuned = list(tuned)
    monkeypatch.setattr(reader_module, "fine_tune", _counting(tuned))
    fused = FusedScorer.unfitted(preset="portable-reader").fit_topics(few_topics, seed=1)
    assert fused.scorer.is_fitted
    assert len(tuned) == 3  # and the whole share's reader only: the halves were the check's


def test_auto_checks_and_fuses_the_reader_of_the_base_asked_for(few_topics: list[Pair],
                                                                tuned: list[int]) -> None:
    german = check_reader([], None, language="de", reader_base="all-MiniLM-L6-v2")  # type: ignore[arg-type]
    assert german.reason == ("not tried: the reader is fine-tuned from all-MiniLM-L6-v2, "
                             "not trained on de")
    auto = AutoScorer(reader_check="always", reader_base="all-MiniLM-L6-v2")
    assert auto.spec()["reader_base"] == "all-MiniLM-L6-v2"
    flt = ConformalFilter(auto, alpha=0.2).calibrate(few_topics, seed=1, monitor=False)
    fused = flt.calibration_info["score_choice"]["reader"].startswith("fused:")
    assert len(tuned) == 2 + fused and set(BASES) == {"all-MiniLM-L6-v2"}
    if fused:  # the fused preset's reader is the base that was checked
        assert flt.scorer_.spec()["signals"][-1]["model"] == "all-MiniLM-L6-v2"
    with pytest.raises(ValueError, match="reader_check='never'"):
        AutoScorer(reader_check="never", reader_base="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="reader base == 'bert', expected one of"):
        AutoScorer(reader_base="bert")
