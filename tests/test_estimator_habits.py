"""The filter keeps scikit-learn's estimator habits: ``calibrate`` leaves the constructor's
parameters (the scorer, the calibrator, the keep policy) as given and keeps what it learns
apart (``scorer_``, ``calibrator_``, ``policy_``, ``calibration_info``). Toy outside scores:
no model is loaded."""

from __future__ import annotations

import pytest
from field_pairs import field_pairs

from ragsieve import ConformalFilter
from ragsieve.calibration import make_calibrator
from ragsieve.fitting import CalibrationInfo
from ragsieve.keep_policy import MAX_CHARS, KeepPolicy
from ragsieve.scoring import FieldScorer, FusedScorer

FIELD = FieldScorer("bm25", higher_is_better=True)


_pairs = field_pairs


def test_calibrate_leaves_the_parameters_as_given() -> None:
    scorer, calibrator = FusedScorer.unfitted(FIELD), make_calibrator("group", alpha=0.2)
    flt = ConformalFilter(scorer, calibrator, min_keep=1)
    assert flt.calibrate(_pairs(), group_by="lang", seed=4) is flt
    assert flt.calibrator is calibrator and not calibrator.is_fitted  # never fitted in place
    assert flt.calibrator_ is not calibrator and flt.calibrator_.is_fitted
    assert flt.scorer is scorer and not scorer.is_fitted
    assert flt.scorer_.is_fitted and flt.scorer_.spec() != scorer.spec()
    assert flt.group_by is None and flt.policy_.group_by == "lang"  # calibrate's, kept apart
    assert flt.policy_ == KeepPolicy(min_keep=1, group_by="lang", max_chars=MAX_CHARS)
    assert flt.guarantee()["group_by"] == "lang"
    assert flt.to_artifact().group_by == "lang"


def test_calibrating_twice_gives_the_same_filter() -> None:
    flt = ConformalFilter(FusedScorer.unfitted(FIELD), alpha=0.2)
    first = flt.calibrate(_pairs(), seed=4).to_dict()
    second = flt.calibrate(_pairs(), seed=4).to_dict()  # from the given, unfitted score again
    assert {k: v for k, v in first.items() if k not in ("created", "checksum")} == {
        k: v for k, v in second.items() if k not in ("created", "checksum")}


def test_a_loaded_filter_has_its_learned_attributes() -> None:
    flt = ConformalFilter(FusedScorer.unfitted(FIELD), "group", alpha=0.2)
    flt.calibrate(_pairs(), group_by="lang", seed=4)
    back = ConformalFilter.from_dict(flt.to_dict())
    assert back.scorer_.spec() == flt.scorer_.spec() and back.calibrator_.is_fitted
    assert back.threshold == flt.threshold and back.policy_ == flt.policy_
    assert isinstance(back.calibration_info, CalibrationInfo)
    assert back.calibration_info == flt.calibration_info


def test_calibration_info_round_trips_the_data_block() -> None:
    data = {"fingerprint": "abc", "n_pairs": 3, "language": "de", "query_language": "en",
            "score_choice": {"preset": "fast"}, "newer_key": [1, 2], "n_groups": "odd"}
    info = CalibrationInfo.from_dict(data)
    assert info.to_dict() == data and dict(info) == data  # unknown and odd keys kept
    assert (info.language, info.n_pairs, info.n_groups) == ("de", 3, None)
    assert info["newer_key"] == [1, 2] and info.get("n_relevant") is None


def test_keep_policy_checks_as_the_constructor_does() -> None:
    assert KeepPolicy.checked() == KeepPolicy(0, None, MAX_CHARS, "snippet")
    with pytest.raises(ValueError, match="min_keep"):
        KeepPolicy.checked(min_keep=-1)
    with pytest.raises(ValueError, match="min_keep"):
        ConformalFilter(FIELD, min_keep=-1)
    with pytest.raises(ValueError, match="use it with unit='sentence'"):
        KeepPolicy.checked(sentence_in_context=True)
