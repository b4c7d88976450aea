"""The fit-then-calibrate room (:mod:`ragsieve.fitting`), the scorer's ``fit_topics``
contract, and the rooms the filter hands its other jobs to (:mod:`ragsieve.pieces`,
:mod:`ragsieve.keeping`). Toy outside scores: no model is loaded."""

from __future__ import annotations

import numpy as np
import pytest
from field_pairs import field_pairs

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import make_calibrator
from ragsieve.errors import CalibrationError, ScorerError
from ragsieve.fitting import fit_and_calibrate, fit_split
from ragsieve.pieces import as_items, cut, cut_pairs
from ragsieve.scoring import FieldScorer, FusedScorer
from ragsieve.scoring.base import ScoreFit
from ragsieve.scoring.fusion import fit_fusion

FIELD = FieldScorer("bm25", higher_is_better=True)


_pairs = field_pairs


def test_a_score_that_does_not_learn_says_so() -> None:
    with pytest.raises(ScorerError, match="not fitted on labelled pairs"):
        FIELD.fit_topics(_pairs())


def test_the_fused_fit_keeps_the_other_topics_to_calibrate_on() -> None:
    pairs = _pairs()
    unfitted = FusedScorer.unfitted(FIELD)
    assert not unfitted.is_fitted
    done = unfitted.fit_topics(pairs, seed=3)
    assert isinstance(done, ScoreFit) and done.scorer.is_fitted
    assert done.n_fit + len(done.pairs) == len(pairs) and done.n_fit > 0
    fit_topics = {p.group for p in pairs} - {p.group for p in done.pairs}
    assert fit_topics and not fit_topics & {p.group for p in done.pairs}  # topic-disjoint
    np.testing.assert_array_equal(done.scores, done.scorer.score_pairs(done.pairs))


def test_calibrate_is_fit_and_calibrate() -> None:
    """The filter hands calibrate to the fitting room and keeps what it gives."""
    pairs = _pairs()
    flt = ConformalFilter(FusedScorer.unfitted(FIELD), alpha=0.2).calibrate(pairs, seed=4)
    cal = make_calibrator("marginal", alpha=0.2)
    done = fit_and_calibrate(FusedScorer.unfitted(FIELD), cal, pairs, seed=4)
    assert cal.to_state() == flt.calibrator_.to_state()
    assert done.scorer.spec() == flt.scorer_.spec() and done.info == flt.calibration_info
    assert done.monitor == flt.monitor_reference
    assert done.lists is not None and flt.lists is not None
    assert done.lists.to_dict() == flt.lists.to_dict()


def test_fit_split_is_the_fusion_fit_of_a_split() -> None:
    pairs = _pairs()
    unfitted = FusedScorer.unfitted(FIELD)
    features = unfitted.features_for_evaluation(pairs)
    relevant = np.array([p.relevant for p in pairs], dtype=float)
    seen: dict[str, int] = {}
    topics = np.array([seen.setdefault(p.group, len(seen)) for p in pairs])
    rows = np.flatnonzero(topics < 6)  # a split's calibration side
    scores, cal_rows = fit_split(features, relevant, topics, rows, seed=1, split=2)
    done = fit_fusion(features, relevant, topics, rows=rows, seed=1, split=2)
    np.testing.assert_array_equal(scores, done.scores)
    np.testing.assert_array_equal(cal_rows, rows[~done.fit])


def test_the_calibration_share_needs_a_relevant_pair() -> None:
    pairs = [Pair(p.query_id, p.query, p.snippet_id, p.text, relevant=0, group=p.group,
                  meta=p.meta) for p in _pairs()]
    with pytest.raises(CalibrationError, match="no relevant"):
        ConformalFilter(FusedScorer.unfitted(FIELD), alpha=0.2).calibrate(pairs)


def test_pieces_cut_long_texts_and_batches_keep_query_rows() -> None:
    items = as_items(["short", "Long sentence here. " * 100])
    pieces = cut(items, unit="snippet", max_chars=600)
    assert pieces.cut_summary() == (1, len(pieces.pieces) - 1)
    assert cut(items, unit="snippet", max_chars=600, reads_text=False).cut_summary() == (0, 0)
    pairs = [Pair("a", "qa", "1", "x"), Pair("b", "qb", "1", "y"), Pair("a", "qa", "2", "z")]
    batch = cut_pairs(pairs, unit="snippet", max_chars=600)
    assert batch.queries == {"a": "qa", "b": "qb"}
    assert [p.text for p in batch.pairs[batch.rows("a")]] == ["x", "z"]
    assert [p.text for p in batch.pairs[batch.rows("b")]] == ["y"]
    with pytest.raises(TypeError, match="expected a ragsieve.Pair"):
        cut_pairs(["x"], unit="snippet", max_chars=600)
