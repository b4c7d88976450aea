"""Statistical validity of the marginal guarantee on real data and the real embedding model.

Over many random topic-disjoint splits (group = XQuAD article, SelQA topic), the mean
micro coverage of relevant test snippets must lie in the band
[1 - alpha, 1 - alpha + 1/(n + 1)] up to a sampling tolerance of
``TOLERANCE_SE`` (3) standard errors of the mean over splits, where the standard error
is measured from the splits themselves (it includes the between-topic variance).
"""

from __future__ import annotations

import numpy as np
import pytest

from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.evaluation import TOLERANCE_SE, ScoredData, evaluate_scores

ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.4)


def _check_band(data: ScoredData, n_splits: int, seed: int) -> list[dict]:
    rep = evaluate_scores(data, alphas=ALPHAS, top_k=[], thetas=[], n_splits=n_splits, seed=seed)
    rows = rep.rows("conformal")
    for row in rows:
        tol = TOLERANCE_SE * row["coverage_se"]
        assert row["band_low"] - tol <= row["coverage_mean"], row
        assert row["coverage_mean"] <= row["band_high"] + tol, row
    return rows


def test_xquad_en_topic_disjoint_validity(xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    data = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    rows = _check_band(data, n_splits=200, seed=1)
    # and the filter does real work: at alpha = 0.1 it removes a large share of the context
    assert next(r for r in rows if r["alpha"] == 0.1)["removal_mean"] > 0.3


def test_xquad_en_snippet_level_validity(xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    """Exchangeable by construction: random halves of the relevant snippets themselves.

    The rule under test is ragsieve's own ``SplitConformalCalibrator``: fit on one half,
    ``predict`` (keep-mask) on the other.
    """
    rel_scores = np.asarray(xquad_en_scores)[[p.relevant == 1 for p in xquad_en]]
    rng = np.random.default_rng(0)
    n = rel_scores.size // 2
    for alpha in ALPHAS:
        covs = []
        for _ in range(500):
            perm = rng.permutation(rel_scores.size)
            cal, test = rel_scores[perm[:n]], rel_scores[perm[n:]]
            calibrator = SplitConformalCalibrator(alpha=alpha).fit(cal)
            assert calibrator.n_calibration_ == n and not calibrator.infinite_
            covs.append(float(np.mean(calibrator.predict(test))))
        mean, se = float(np.mean(covs)), float(np.std(covs, ddof=1) / np.sqrt(len(covs)))
        assert 1 - alpha - 4 * se <= mean <= 1 - alpha + 1 / (n + 1) + 4 * se, (alpha, mean, se)


def test_wrong_rule_fails_the_same_check(xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    """The check has teeth: calibrating at a looser level than claimed is caught."""
    data = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    rep = evaluate_scores(data, alphas=[0.15], top_k=[], thetas=[], n_splits=200, seed=1)
    row = rep.rows("conformal")[0]
    claimed_target = 0.90  # pretend alpha = 0.15 delivers 90 %
    assert row["coverage_mean"] < claimed_target - TOLERANCE_SE * row["coverage_se"]


@pytest.mark.slow
def test_selqa_dev_topic_disjoint_validity(shared_data_dir, minilm_scorer) -> None:  # type: ignore[no-untyped-def]
    from ragsieve.data import load_selqa

    pairs = load_selqa("dev", data_dir=shared_data_dir)
    data = ScoredData.from_pairs(pairs, minilm_scorer.score_pairs(pairs))
    _check_band(data, n_splits=200, seed=1)
