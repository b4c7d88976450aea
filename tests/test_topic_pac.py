"""topic-pac: risk control with confidence over topics, its bounds, and the spread evaluate reports."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from scipy import stats

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator, TopicPACCalibrator, make_calibrator
from ragsieve.calibration.bounds import hb_upper, wsr_upper
from ragsieve.calibration.modes import mode_params
from ragsieve.calibration.topic_pac import topics_required
from ragsieve.evaluation import ScoredData, evaluate_scores
from ragsieve.scoring import resolve_scorer


# ----------------------------------------------------------------------- exact rules
def test_hand_made_topics_hb() -> None:
    # 25 topics, topic k holds one relevant snippet of score k: L_k(t) = 1{k > t}
    scores = np.arange(1.0, 26.0)
    topics = np.arange(25)
    cal = TopicPACCalibrator(alpha=0.1, delta=0.1, bound="hb").fit(scores, groups=topics)
    # no miss at t = 25: the bound is 1 - delta ** (1/25) = 0.088 <= 0.1; one miss is too many
    assert hb_upper(np.zeros(25), 0.1) <= 0.1 < hb_upper(np.r_[1.0, np.zeros(24)], 0.1)
    assert cal.threshold_ == 25.0 and cal.bound_achieved_ == pytest.approx(1 - 0.1 ** (1 / 25))
    # at alpha = 0.3 the largest number of misses m with UCB(m / 25) <= 0.3 sets tau = 25 - m
    m = max(j for j in range(26) if hb_upper(np.r_[np.ones(j), np.zeros(25 - j)], 0.1) <= 0.3)
    assert TopicPACCalibrator(alpha=0.3, delta=0.1, bound="hb").fit(scores, groups=topics).threshold_ \
        == 25.0 - m


def test_each_topic_weighs_the_same_and_sizes_matter_when_asked() -> None:
    # 40 large topics (40 snippets) with low scores, 40 small ones (10) with high scores
    rng = np.random.default_rng(0)
    sizes = np.r_[np.full(40, 40), np.full(40, 10)]
    scores = np.concatenate([rng.normal(0.3, 0.1, 40) for _ in range(40)]
                            + [rng.normal(0.5, 0.1, 10) for _ in range(40)])
    topics = np.repeat(np.arange(80), sizes)
    by_topic = TopicPACCalibrator(alpha=0.2, delta=0.1).fit(scores, groups=topics)
    by_size = TopicPACCalibrator(alpha=0.2, delta=0.1, weighting="snippet").fit(scores, groups=topics)
    # per topic the small, high-scoring topics count as much as the large ones; weighted by
    # size they count a quarter as much, so a lower threshold suffices
    assert by_size.threshold_ < by_topic.threshold_
    assert by_topic.guarantee().details["weighting"] == "topic"
    # the order of the rows does not change the threshold (topics are shuffled with a fixed seed)
    perm = rng.permutation(scores.size)
    again = TopicPACCalibrator(alpha=0.2, delta=0.1).fit(scores[perm], groups=topics[perm])
    assert abs(again.threshold_ - by_topic.threshold_) < 0.05


def test_sorted_topics_cannot_fool_the_betting_bound() -> None:
    """Topics given easiest first: read in that order, the betting bound would reject early."""
    losses = np.r_[np.full(40, 0.05), np.full(40, 0.5)]
    assert wsr_upper(losses, 0.1) < losses.mean()  # in sorted order the bound is invalid
    rng = np.random.default_rng(0)
    assert wsr_upper(rng.permutation(losses), 0.1) > losses.mean()


def test_too_few_topics_keep_everything_and_say_how_many(caplog: pytest.LogCaptureFixture) -> None:
    assert topics_required(0.1, 0.1, bound="hb") == 22
    assert topics_required(0.1, 0.1, bound="wsr") == 25
    with caplog.at_level(logging.WARNING):
        cal = TopicPACCalibrator(alpha=0.1, delta=0.1).fit(np.arange(10.0), groups=np.arange(10))
    assert math.isinf(cal.threshold_) and "at least 22 topics" in caplog.text
    assert cal.guarantee().n_required == 22 and cal.guarantee().infinite


def test_calibrate_warns_when_the_data_spans_too_few_topics(caplog: pytest.LogCaptureFixture) -> None:
    pairs = [Pair(f"q{t}", "q?", "s", "x", 1, group=f"t{t}", meta={"s": 0.1 * t}) for t in range(8)]
    scorer = resolve_scorer("field", field="s")
    with caplog.at_level(logging.WARNING):
        ConformalFilter(scorer, make_calibrator("topic-pac", alpha=0.1)).calibrate(pairs)
    assert "needs 22" in caplog.text and "has 8" in caplog.text


def test_auto_bound_depends_on_the_number_of_topics_only() -> None:
    rng = np.random.default_rng(0)
    for k, expected in ((24, "hb"), (60, "wsr")):
        s = rng.random(k * 3)
        g = np.repeat(np.arange(k), 3)
        assert TopicPACCalibrator(alpha=0.1).fit(s, groups=g).bound_used_ == expected


# ----------------------------------------------------------------------- the bounds are valid
@pytest.mark.parametrize("bound", [hb_upper, wsr_upper])
def test_upper_bounds_cover_the_mean_at_their_level(bound) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    delta, n_sim, a, b = 0.1, 400, 1.0, 9.0  # Beta(1, 9) losses, mean 0.1
    fails = sum(bound(rng.beta(a, b, 30), delta) < a / (a + b) for _ in range(n_sim))
    assert fails / n_sim <= delta + 3 * math.sqrt(delta * (1 - delta) / n_sim)


# ----------------------------------------------------------------------- PAC over topics
def _true_topic_coverage(tau: float, mu: np.ndarray, sigma: float) -> float:
    """E over new topics of P(score <= tau | topic): topic means mu, within-topic sd sigma."""
    return float(stats.norm.cdf((tau - mu) / sigma).mean())


def test_topic_pac_meets_the_pac_criterion_where_marginal_fails() -> None:
    """Topic random effects: scores ~ N(mu_k, 0.1), mu_k ~ N(0.5, 0.15), 5-30 snippets a topic.

    Over 200 calibration draws of 60 topics, the share of deployments whose expected
    coverage on new topics reaches 0.8 must be >= 1 - delta = 0.9 (minus 3 standard
    errors) for topic-pac; the marginal rule, right on average, falls short in about half.
    """
    rng = np.random.default_rng(7)
    alpha, delta, sigma, reps = 0.2, 0.1, 0.1, 200
    population = rng.normal(0.5, 0.15, 20000)  # new topics
    ok = {"marginal": 0, "topic-pac": 0}
    for _ in range(reps):
        mu = rng.normal(0.5, 0.15, 60)
        sizes = rng.integers(5, 31, 60)
        scores = np.concatenate([rng.normal(m, sigma, n) for m, n in zip(mu, sizes, strict=True)])
        topics = np.repeat(np.arange(60), sizes)
        for mode in ok:
            params = {"alpha": alpha, "delta": delta}
            cal = make_calibrator(mode, **{k: v for k, v in params.items()
                                           if k in mode_params(mode)}).fit(scores, groups=topics)
            ok[mode] += _true_topic_coverage(cal.threshold_, population, sigma) >= 1 - alpha
    se = math.sqrt(delta * (1 - delta) / reps)
    assert ok["topic-pac"] / reps >= 1 - delta - 3 * se
    assert ok["marginal"] / reps < 1 - delta - 3 * se  # the criterion has teeth


def test_evaluate_reports_the_spread_of_every_mode() -> None:
    rng = np.random.default_rng(3)
    n_topics, per = 40, 12
    mu = rng.normal(0.5, 0.15, n_topics)
    scores = np.concatenate([rng.normal(m, 0.1, per) for m in mu])
    g = np.repeat(np.arange(n_topics), per)
    data = ScoredData(scores=scores, relevant=np.ones(scores.size, bool), query_index=np.arange(scores.size),
                      group_index=g, lengths=np.full(scores.size, 100))
    rep = evaluate_scores(data, alphas=[0.2], top_k=[], thetas=[], n_splits=50, modes=["marginal", "topic-pac"],
                          delta=0.1, calibrated_baselines=False)
    rows = {r["mode"]: r for r in rep.rows("conformal")}
    for r in rows.values():
        assert 0 <= r["share_at_target"] <= 1 and r["coverage_q"] <= r["topic_coverage_mean"] + 1e-9
    tp = rows["topic-pac"]
    assert tp["guaranteed_metric"] == "topic_coverage_quantile_0.1"
    assert tp["guaranteed_value"] == tp["coverage_q"]
    assert tp["share_at_target"] >= rows["marginal"]["share_at_target"]


def test_marginal_is_in_the_contract_family() -> None:
    assert isinstance(make_calibrator("marginal"), SplitConformalCalibrator)
