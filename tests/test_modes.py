"""Guarantee modes: exact rules on hand-made cases, and one statistical test per mode.

Each statistical test draws many random calibration/test splits and checks the quantity
the mode guarantees against its target with a stated tolerance: 3 standard errors of the
mean over splits (``TOLERANCE_SE``), unless said otherwise.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from ragsieve.calibration import (
    CALIBRATORS,
    MODES,
    MondrianCalibrator,
    PACCalibrator,
    QueryAllCalibrator,
    QueryRecallCalibrator,
    TopicCalibrator,
    binomial_sf,
    make_calibrator,
)
from ragsieve.calibration.modes import mode_params
from ragsieve.errors import CalibrationError, NotFittedError
from ragsieve.evaluation import TOLERANCE_SE, ScoredData, evaluate_scores


# ----------------------------------------------------------------------- exact rules
def test_query_recall_hand_made() -> None:
    # 3 queries: q0 relevant scores (0.1, 0.5), q1 (0.2), q2 (0.3, 0.4, 0.9)
    s = np.array([0.1, 0.5, 0.2, 0.3, 0.4, 0.9])
    q = np.array([0, 0, 1, 2, 2, 2])
    cal = QueryRecallCalibrator(alpha=0.4).fit(s, None, query_ids=q)
    # n = 3: need 3/4 * R(t) + 1/4 <= 0.4  ->  R(t) <= 0.2
    # R(0.4) = (1/2 + 0 + 1/3) / 3 = 0.278 ; R(0.5) = (0 + 0 + 1/3) / 3 = 0.111
    assert cal.threshold_ == pytest.approx(0.5)
    assert cal.n_calibration_ == 3


def test_query_recall_too_few_queries_is_inf(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cal = QueryRecallCalibrator(alpha=0.1).fit([0.1, 0.2], None, query_ids=[0, 1])
    assert math.isinf(cal.threshold_) and "too few" in caplog.text


def test_query_all_uses_each_querys_worst_score() -> None:
    s = np.array([0.1, 0.5, 0.2, 0.3, 0.9, 0.05])
    q = np.array([0, 0, 1, 2, 2, 3])
    cal = QueryAllCalibrator(alpha=0.2).fit(s, None, query_ids=q)
    # maxima: 0.5, 0.2, 0.9, 0.05 ; n = 4, rank ceil(5 * 0.8) = 4 -> 0.9
    assert cal.threshold_ == pytest.approx(0.9)


def test_binomial_sf_matches_direct_sum() -> None:
    n, p = 30, 0.9
    direct = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(25, n + 1))
    assert binomial_sf(25, n, p) == pytest.approx(direct, rel=1e-9)
    assert binomial_sf(0, n, p) == 1.0 and binomial_sf(31, n, p) == 0.0


def test_pac_rank_and_required_n() -> None:
    scores = np.linspace(0, 1, 200)
    cal = PACCalibrator(alpha=0.1, delta=0.1).fit(scores)
    k = cal.rank_
    assert binomial_sf(k, 200, 0.9) <= 0.1 < binomial_sf(k - 1, 200, 0.9)
    assert k >= math.ceil(201 * 0.9)  # never looser than the marginal rank
    assert cal.n_required_ == math.ceil(math.log(0.1) / math.log(0.9))  # 22
    small = PACCalibrator(alpha=0.1, delta=0.1).fit(np.arange(10.0))
    assert math.isinf(small.threshold_)


def test_mondrian_per_group_and_fallback(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    s = np.r_[rng.uniform(0, 1, 50), rng.uniform(1, 2, 50), rng.uniform(5, 6, 3)]
    g = np.array(["a"] * 50 + ["b"] * 50 + ["tiny"] * 3)
    with caplog.at_level(logging.WARNING):
        cal = MondrianCalibrator(alpha=0.1).fit(s, None, groups=g)
    assert cal.threshold_for("a") < 1.0 < cal.threshold_for("b") < 2.0
    assert cal.fallback_groups_ == ["tiny"] and "tiny" in caplog.text
    assert cal.threshold_for("tiny") == cal.threshold_for("never-seen") == cal.threshold_
    keep = cal.predict([0.99, 0.99], groups=["a", "b"])
    assert keep.tolist() == [False, True]


def test_topic_needs_enough_topics(caplog: pytest.LogCaptureFixture) -> None:
    s = np.arange(40.0)
    with caplog.at_level(logging.WARNING):
        few = TopicCalibrator(alpha=0.1).fit(s, None, groups=np.repeat(np.arange(5), 8))
    assert math.isinf(few.threshold_) and few.topics_required_ == 9
    ok = TopicCalibrator(alpha=0.2).fit(s, None, groups=np.repeat(np.arange(5), 8))
    assert math.isfinite(ok.threshold_)


def test_topic_weights_topics_equally() -> None:
    # one huge topic of low scores and 9 small topics of high scores: pooled snippet-level
    # conformal would follow the big topic; the topic rule follows the topics
    s = np.r_[np.full(1000, 0.1), np.repeat(np.linspace(0.5, 0.9, 9), 5)]
    g = np.r_[np.zeros(1000), np.repeat(np.arange(1, 10), 5)]
    assert TopicCalibrator(alpha=0.1).fit(s, None, groups=g).threshold_ >= 0.9
    assert make_calibrator("marginal", alpha=0.1).fit(s).threshold_ == pytest.approx(0.1)


@pytest.mark.parametrize("mode", ["query-recall", "query-all", "pac", "group", "topic", "marginal"])
def test_validation_and_unfitted(mode: str) -> None:
    cal = make_calibrator(mode, alpha=0.1)
    with pytest.raises(NotFittedError):
        cal.predict([0.1], groups=["a"])
    with pytest.raises(ValueError, match="alpha"):
        make_calibrator(mode, alpha=1.5).fit([0.1, 0.2], None, query_ids=[0, 1], groups=[0, 1])
    with pytest.raises(CalibrationError):
        make_calibrator(mode, alpha=0.1).fit([0.1, 0.2], [0, 0], query_ids=[0, 1], groups=[0, 1])
    with pytest.raises(ValueError, match="accepted modes"):
        make_calibrator("per-user", alpha=0.1)


# ------------------------------------------------------------- parameters of a mode
def test_a_parameter_the_mode_does_not_take_is_an_error() -> None:
    """``make_calibrator("marginal", delta=0.05)`` used to drop ``delta`` without a word."""
    with pytest.raises(TypeError, match=r"^mode 'marginal' does not take delta; it takes: alpha\.$"):
        make_calibrator("marginal", alpha=0.1, delta=0.05)
    with pytest.raises(TypeError, match="mode 'budget' does not take gamma; it takes: alpha, budget"):
        make_calibrator("budget", budget=100, gamma=0.01)
    with pytest.raises(ValueError, match="got alpha == 0.2 and target == 0.9; pass one"):
        make_calibrator("budget", budget=100, alpha=0.2, target=0.9)


def test_none_is_not_given_and_a_modes_own_none_is_kept() -> None:
    assert make_calibrator("marginal", alpha=0.2, delta=None).get_params() == {"alpha": 0.2}
    assert make_calibrator("adaptive", alpha=0.1, window=None).window is None  # keep every score
    assert make_calibrator("budget", budget=100, alpha=0.2).target == pytest.approx(0.8)


@pytest.mark.parametrize("mode", MODES)
def test_mode_params_are_what_make_calibrator_takes(mode: str) -> None:
    """Each mode takes exactly its calibrator's parameters (budget: also alpha)."""
    names = mode_params(mode)
    assert set(names) == set(CALIBRATORS[mode]._param_names()) | (
        {"alpha"} if mode == "budget" else set())
    values = {"alpha": 0.1, "budget": 100} if mode == "budget" else {"alpha": 0.1}
    assert make_calibrator(mode, **values).mode == mode
    with pytest.raises(TypeError, match=f"it takes: {', '.join(names)}"):
        make_calibrator(mode, **values, not_a_parameter=1)


@pytest.mark.parametrize(("argv", "refused"), [
    (["--mode", "marginal", "--delta", "0.05"],
     "--mode marginal does not take --delta; it takes: --alpha."),
    (["--mode", "marginal", "--delta", "0.1"], "--mode marginal does not take --delta"),
    (["--mode", "group", "--group-by", "g", "--budget-unit", "chars"],
     "--mode group does not take --budget-unit; it takes: --alpha, --min-group-size."),
    (["--mode", "adaptive", "--budget", "100"], "--mode adaptive does not take --budget"),
])
def test_calibrate_refuses_an_option_its_mode_does_not_take(
        argv: list[str], refused: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import main

    data = tmp_path / "pairs.jsonl"
    data.write_text('{"query_id": "q", "query": "q", "snippet_id": "s", "text": "t", '
                    '"relevant": 1}\n', encoding="utf-8")
    out = tmp_path / "f.json"
    assert main(["calibrate", "--data", str(data), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert refused in err and len(err.splitlines()) == 1 and not out.exists()


def test_calibrate_passes_only_the_options_given() -> None:
    from ragsieve.cli import build_parser
    from ragsieve.cli.values import GuaranteeOptions, calibrator_params

    def params(*argv: str) -> dict[str, object]:
        return calibrator_params(GuaranteeOptions.from_args(build_parser().parse_args(
            ["calibrate", "--data", "d.jsonl", "--out", "f.json", *argv])))

    assert params("--mode", "marginal") == {"alpha": 0.1}
    assert params("--mode", "pac") == {"alpha": 0.1, "delta": 0.1}
    assert params("--mode", "pac", "--delta", "0.05") == {"alpha": 0.1, "delta": 0.05}
    assert params("--mode", "budget", "--budget", "100") == {"alpha": 0.1, "budget": 100,
                                                             "delta": 0.1}
    assert params("--mode", "adaptive", "--gamma", "0.01") == {"alpha": 0.1, "gamma": 0.01}


# ------------------------------------------------------------- statistical tests
def synthetic(n_topics: int = 60, q_per_topic: int = 8, per_query: int = 10, topic_sd: float = 0.0,
              seed: int = 0) -> ScoredData:
    """Queries with 1-4 relevant snippets; optional topic-level shift of the scores."""
    rng = np.random.default_rng(seed)
    n_q = n_topics * q_per_topic
    q = np.repeat(np.arange(n_q), per_query)
    topic = q // q_per_topic
    rel = np.zeros(q.size, dtype=bool)
    for qi in range(n_q):
        idx = np.flatnonzero(q == qi)
        rel[rng.choice(idx, size=rng.integers(1, 5), replace=False)] = True
    shift = rng.normal(0, topic_sd, n_topics)[topic]
    scores = np.where(rel, rng.beta(2, 5, q.size), rng.beta(5, 2, q.size)) + shift
    attribute = np.array(["short" if t % 3 else "long" for t in topic], dtype=object)
    scores = scores + np.where(attribute == "long", 0.15 * rel, 0.0)  # groups differ
    return ScoredData(scores=scores, relevant=rel, query_index=q, group_index=topic,
                      lengths=np.full(q.size, 300), attribute=attribute)


@pytest.mark.parametrize("mode", ["marginal", "query-recall", "query-all", "group", "topic"])
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_mode_guarantee_on_synthetic(mode: str, alpha: float) -> None:
    data = synthetic(topic_sd=0.05 if mode == "topic" else 0.0, seed=11)
    rep = evaluate_scores(data, alphas=[alpha], top_k=[], thetas=[], n_splits=200, seed=1, modes=[mode])
    row = rep.rows("conformal")[0]
    assert row["mode"] == mode
    se = row.get("se", row["coverage_se"])
    assert row["guaranteed_value"] >= 1 - alpha - TOLERANCE_SE * se, row
    assert row["removal_mean"] > 0.2  # the filter still removes context


def test_pac_guarantee_on_synthetic() -> None:
    """Exchangeable snippets: over 300 calibration draws, coverage >= 1 - alpha in >= 1 - delta of them.

    Tolerance: the share of good draws is a binomial proportion; allow 3 of its standard errors.
    """
    rng = np.random.default_rng(5)
    alpha, delta, n = 0.1, 0.1, 300
    good = 0
    reps = 300
    for _ in range(reps):
        x = rng.gamma(2.0, 0.3, size=n + 5000)
        tau = PACCalibrator(alpha=alpha, delta=delta).fit(x[:n]).threshold_
        good += np.mean(x[n:] <= tau) >= 1 - alpha
    sd = math.sqrt(delta * (1 - delta) / reps)
    assert good / reps >= 1 - delta - 3 * sd


def test_marginal_fails_the_topic_test_where_topic_mode_passes() -> None:
    """With few, heterogeneous topics the marginal rule under-covers a new topic; the test sees it."""
    data = synthetic(n_topics=24, topic_sd=0.15, seed=3)
    rep = evaluate_scores(data, alphas=[0.1], top_k=[], thetas=[], n_splits=300, seed=2,
                          modes=["marginal", "topic"])
    marginal, topic = rep.rows("conformal")
    marginal_topic_cov = marginal["topic_coverage_mean"]
    assert topic["guaranteed_value"] > marginal_topic_cov
    assert topic["guaranteed_value"] >= 0.9 - TOLERANCE_SE * topic["se"]


# ------------------------------------------------------------------- real data
@pytest.mark.parametrize("mode", ["query-recall", "query-all", "topic"])
def test_modes_on_xquad_topic_splits(mode: str, xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    data = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    rep = evaluate_scores(data, alphas=[0.1, 0.2], top_k=[], thetas=[], n_splits=200, seed=1, modes=[mode])
    for row in rep.rows("conformal"):
        assert row["guaranteed_value"] >= row["target"] - TOLERANCE_SE * row["se"], row


def test_group_mode_on_xquad_per_article(xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    """Mondrian per article with query-level splits (articles appear on both sides)."""
    base = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    data = ScoredData(scores=base.scores, relevant=base.relevant, query_index=base.query_index,
                      group_index=base.query_index, lengths=base.lengths,
                      attribute=base.group_index.astype(str).astype(object))
    rep = evaluate_scores(data, alphas=[0.2], top_k=[], thetas=[], n_splits=100, seed=1, modes=["group"])
    row = rep.rows("conformal")[0]
    per = np.array(list(row["per_group_coverage"].values()))
    assert per.size == 48
    # every article's mean coverage within 4 of its standard errors (~10 relevant test snippets
    # per article and split: se ~ 0.013 over 100 splits); the mean over articles in the band
    assert per.mean() >= 0.8 - 0.01
    assert row["guaranteed_value"] >= 0.8 - 0.08


def test_pac_on_xquad_score_distribution(xquad_en, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    """PAC is a statement about i.i.d. snippets: draw calibration sets of n = 300 from the
    empirical distribution of XQuAD's 1,407 relevant MiniLM scores and measure coverage on
    that whole distribution (its true coverage). Tolerance: 3 binomial standard errors."""
    rel = np.asarray(xquad_en_scores)[[p.relevant == 1 for p in xquad_en]]
    rng = np.random.default_rng(0)
    alpha, delta, reps, n = 0.1, 0.1, 400, 300
    good = 0
    for _ in range(reps):
        cal = rng.choice(rel, size=n, replace=True)
        good += np.mean(rel <= PACCalibrator(alpha=alpha, delta=delta).fit(cal).threshold_) >= 1 - alpha
    assert good / reps >= 1 - delta - 3 * math.sqrt(delta * (1 - delta) / reps)
    # the marginal rule, by contrast, is below 1 - alpha in about half of the draws
    marginal = sum(np.mean(rel <= make_calibrator("marginal", alpha=alpha).fit(
        rng.choice(rel, size=n, replace=True)).threshold_) >= 1 - alpha for _ in range(reps))
    assert marginal / reps < 1 - delta


@pytest.mark.parametrize("argv", [
    ["evaluate", "--data", "x.jsonl", "--mode", "marginal,topic", "--delta", "0.05"],
    ["choose-alpha", "--data", "x.jsonl", "--mode", "marginal", "--removal", "0.5",
     "--delta", "0.05"],
])
def test_evaluate_refuses_an_option_no_listed_mode_takes(argv: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import main

    assert main(argv) == 2  # before any data is read (x.jsonl does not exist)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--delta applies to none of the modes" in err


def test_evaluate_takes_delta_when_a_listed_mode_does() -> None:
    from ragsieve.cli import build_parser
    from ragsieve.cli.values import GuaranteeOptions, check_mode_list_params

    args = build_parser().parse_args(["evaluate", "--data", "x", "--mode", "marginal,pac",
                                      "--delta", "0.05"])
    check_mode_list_params(GuaranteeOptions.from_args(args))  # pac takes it: no error
    args = build_parser().parse_args(["evaluate", "--data", "x", "--budget", "600",
                                      "--delta", "0.05"])
    check_mode_list_params(GuaranteeOptions.from_args(args))  # --budget adds the budget rows, which take delta
