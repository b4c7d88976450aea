"""Sentence-level pruning: ``ConformalFilter(unit="sentence")``, its artifact, and the
guarantee on evidence sentences.

The mechanics (spans, pruned text, the per-sentence record, the empty-result policy, the
refusals) run on a small scorer of our own; the sentence-in-context score and the
guarantee on the real MiniLM model and real XQuAD-en sentence pairs.

The guarantee test follows tests/test_validity_real.py: a score fixed before the test
(the sentence-in-context score as ``calibrate`` fits it, on topics set aside), then 100
random topic-disjoint calibration/test splits of the other topics' sentence pairs; the mean
of each mode's guaranteed metric over evidence sentences must reach its target up to
``TOLERANCE_SE`` standard errors of the mean over splits (the rule every ``evaluate``
conformal row is checked with), and the marginal mode's coverage must stay below its
band's upper end by the same tolerance. The default run checks marginal and query-recall
on 20 of the 48 articles (5 fit the score, 15 are split); the slow run every article, the topic mode too, and the deployed
path (calibrate on half the articles, ``filter_pairs`` on the other half).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ArtifactError, ConformalFilter, DataError, Pair
from ragsieve.artifact import Artifact
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.data import group_splits
from ragsieve.evaluation import TOLERANCE_SE, ScoredData, evaluate_scores
from ragsieve.scoring import Scorer, resolve_scorer
from ragsieve.scoring.sentence_context import SentenceContextScorer, with_parent_text
from ragsieve.types import Scored
from ragsieve.units import sentence_pairs, split_sentences


class Overlap(Scorer):
    """Toy score: 1 - the share of the query's words found in the text (lower = better)."""

    name = "overlap"

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        words = set(re.findall(r"\w+", query.lower()))
        return np.array([1.0 - len(words & set(re.findall(r"\w+", s.lower()))) / len(words)
                         for s in snippets], dtype=float)

    def spec(self) -> dict[str, Any]:
        return {"scorer": "overlap"}


QUERY = "who built the tower"
TEXTS = [
    "The sky was grey. Gustave Eiffel built the tower. It opened in 1889.",
    "Paris is large. Nothing here.",
    "Who built the tower? Engineers did.",
]


def _toy(threshold: float, *, min_keep: int = 0) -> ConformalFilter:
    calibrator = SplitConformalCalibrator.from_threshold(alpha=0.5, threshold=threshold,
                                                         n_calibration=10)
    return ConformalFilter(Overlap(), calibrator, unit="sentence", min_keep=min_keep)


# ------------------------------------------------------------------ the mechanics
def test_kept_sentences_are_spans_of_the_input_with_their_pruned_text() -> None:
    res = _toy(0.3).filter(QUERY, TEXTS)
    assert res.unit == "sentence" and res.n_input == 3
    assert [k.index for k in res.kept] == [0, 2] and [r.index for r in res.removed] == [1]
    first, third = res.kept
    assert first.spans == ((18, 49),)
    assert TEXTS[0][18:49] == "Gustave Eiffel built the tower."
    assert first.pruned_text == "Gustave Eiffel built the tower."
    assert third.pruned_text == "Who built the tower?"
    # every sentence scored, in input order; a kept snippet's score is its best sentence's
    assert [s[:3] for s in res.sentences] == [
        (i, s.start, s.end) for i, t in enumerate(TEXTS) for s in split_sentences(t)]
    for k in res.kept:
        best = min(s[3] for s in res.sentences if s[0] == k.index)
        assert k.score == best == res.scores[k.index]
    assert all(kept == (score <= 0.3) for _, _, _, score, kept in res.sentences)


def test_one_span_per_kept_sentence_never_merged() -> None:
    text = "Eiffel built the tower。Eiffel built the tower again。"  # a CJK end: spans touch
    res = _toy(0.3).filter(QUERY, [text])
    spans = res.kept[0].spans
    assert len(spans) == len(split_sentences(text)) == 2 and spans[0][1] == spans[1][0]
    assert res.kept[0].pruned_text == " ".join(text[a:b] for a, b in spans)


def test_pruned_text_of_a_snippet_kept_whole_is_its_text() -> None:
    assert Scored(0, "s", "All of it.", 0.1).pruned_text == "All of it."


def test_blank_snippet_has_no_sentence_and_is_removed() -> None:
    res = _toy(0.3).filter(QUERY, ["   ", TEXTS[0]])
    assert [r.index for r in res.removed] == [0] and math.isinf(res.scores[0])
    assert all(s[0] == 1 for s in res.sentences)


def test_empty_result_policy_keeps_the_best_sentences() -> None:
    res = _toy(-1.0, min_keep=1).filter(QUERY, TEXTS)
    assert res.rule_kept_none and "no sentence kept" in (res.note or "")
    assert [k.spans for k in res.kept] == [((0, 20),)]  # the best sentence alone
    assert sum(s[4] for s in res.sentences) == 1
    empty = _toy(-1.0).filter(QUERY, TEXTS)
    assert empty.kept == () and empty.rule_kept_none


def test_the_guarantee_is_said_of_evidence_sentences() -> None:
    g = _toy(0.3).guarantee()
    assert g["unit"] == "sentence"
    assert g["statement"].startswith("an evidence sentence exchangeable with the calibration")


def test_filter_pairs_agrees_with_filter() -> None:
    flt = _toy(0.3)
    pairs = [Pair("q", QUERY, f"s{i}", t) for i, t in enumerate(TEXTS)]
    batched = flt.filter_pairs(pairs)["q"]
    single = flt.filter(QUERY, pairs)
    assert batched.kept == single.kept and batched.sentences == single.sentences


def test_scores_per_snippet_and_vectors_are_refused() -> None:
    flt = _toy(0.3)
    with pytest.raises(TypeError, match="unit is 'sentence'.*call filter"):
        flt.filter_scores(QUERY, [0.1, 0.2, 0.3], TEXTS)
    with pytest.raises(TypeError, match="unit is 'sentence'"):
        flt.filter_vectors(QUERY, np.ones(3), np.ones((3, 3)), TEXTS)


def test_a_snippet_without_text_is_a_data_error() -> None:
    with pytest.raises(DataError, match="snippet 0 has no text.*unit 'sentence'"):
        _toy(0.3).filter(QUERY, [{"score": 0.3}])


def test_unit_is_checked_and_the_context_score_needs_sentences() -> None:
    with pytest.raises(ValueError, match="unit == 'paragraph'"):
        ConformalFilter(Overlap(), unit="paragraph")
    with pytest.raises(TypeError, match="unit"):
        ConformalFilter(Overlap(), unit=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unit='sentence'"):
        ConformalFilter(SentenceContextScorer(Overlap()), unit="snippet")


def test_calibrate_takes_snippet_pairs_and_learns_from_evidence_sentences() -> None:
    pairs = []
    for q in range(40):
        relevant = "Gustave Eiffel built the tower." if q % 4 else "Engineers built the tower."
        pairs += [Pair(f"q{q}", QUERY, f"q{q}-a", f"The sky was grey. {relevant}", 1,
                       group=f"t{q % 10}", meta={"answers": [relevant.split(" built")[0]]}),
                  Pair(f"q{q}", QUERY, f"q{q}-b", "Paris is large. Nothing here.", 0,
                       group=f"t{q % 10}")]
    flt = ConformalFilter(Overlap(), alpha=0.2, unit="sentence").calibrate(pairs)
    assert flt.calibration_info["n_pairs"] == len(sentence_pairs(pairs)) == 160
    assert flt.calibration_info["n_relevant"] == 40  # one evidence sentence per query
    assert flt.calibration_info["n_snippet_pairs"] == 80
    assert flt.threshold == pytest.approx(0.25)  # "... built the tower." misses 1 of 4 words
    with pytest.raises(DataError, match="neither|no 'evidence'"):
        ConformalFilter(Overlap(), unit="sentence").calibrate(
            [Pair("q", QUERY, "s", "A. B.", 1), Pair("q", QUERY, "t", "C.", 0)])


# ------------------------------------------------------------------ the artifact
def test_unit_is_saved_in_the_policy_and_read_back(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ragsieve.scoring import registry

    # the toy score is registered for this test only (the scorer suite checks the registry)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_OPTIONS", dict(registry._OPTIONS))
    registry.register_scorer("overlap", Overlap)
    path = _toy(0.3).save(tmp_path / "f.json")
    payload = json.loads(path.read_text())
    assert payload["policy"]["unit"] == "sentence"
    again = ConformalFilter.load(path)
    assert again.unit == "sentence"
    assert again.filter(QUERY, TEXTS).kept == _toy(0.3).filter(QUERY, TEXTS).kept
    # an artifact written before units existed reads as a snippet filter
    art = Artifact.create(scorer={"scorer": "overlap"}, calibration=payload["calibration"],
                          policy={"min_keep": 0}, data={})
    assert art.unit == "snippet" and ConformalFilter.from_artifact(art).unit == "snippet"
    # a unit the library does not know is refused when the artifact is read
    bad = Artifact.create(scorer={"scorer": "overlap"}, calibration=payload["calibration"],
                          policy={"min_keep": 0, "unit": "snippet"}, data={}).to_dict()
    bad["policy"]["unit"] = "paragraph"
    with pytest.raises(ArtifactError, match="policy unit == 'paragraph'"):
        Artifact.from_dict(bad)


# ------------------------------------------------------------------ the real score
def _first_topics(pairs: list[Pair], n: int) -> list[Pair]:
    """The pairs of the first ``n`` topics in sorted order (the command-line tests' eight
    among them, so the session's embedding cache serves both)."""
    chosen = set(sorted({p.group for p in pairs})[:n])
    return [p for p in pairs if p.group in chosen]


def _fixed_scores(pairs: list[Pair], base: Scorer) -> tuple[list[Pair], np.ndarray]:
    """The sentence-in-context score fitted by ``calibrate`` on a quarter of the topics,
    then fixed; the sentence pairs of the other topics and their scores."""
    topics = sorted({p.group for p in pairs})
    held = set(np.random.default_rng(24).choice(topics, size=len(topics) // 4,
                                                replace=False).tolist())
    fit = [p for p in pairs if p.group in held]
    rest = [p for p in pairs if p.group not in held]
    flt = ConformalFilter(resolve_scorer("best", base=base), unit="sentence")
    scorer = flt.calibrate(fit, seed=0).scorer_
    assert isinstance(scorer, SentenceContextScorer)
    sentences = with_parent_text(sentence_pairs(rest), rest)
    return sentences, scorer.score_pairs(sentences)


@pytest.fixture(scope="module")
def fixed_small(xquad_en, minilm_scorer):  # type: ignore[no-untyped-def]
    """20 of XQuAD-en's 48 articles: 5 fit the score, 15 are split 100 times."""
    return _fixed_scores(_first_topics(xquad_en, 20), minilm_scorer)


@pytest.fixture(scope="module")
def fixed_all(xquad_en, minilm_scorer):  # type: ignore[no-untyped-def]
    """Every XQuAD-en article: 12 fit the score, 36 are split 100 times."""
    return _fixed_scores(xquad_en, minilm_scorer)


def _check_guarantee(fixed: tuple[list[Pair], np.ndarray], mode: str,
                     min_removal: float) -> None:
    sentences, scores = fixed
    rep = evaluate_scores(ScoredData.from_pairs(sentences, scores), alphas=(0.1, 0.2),
                          modes=(mode,), top_k=(), thetas=(), calibrated_baselines=False,
                          n_splits=100, seed=1)
    for row in rep.rows("conformal"):
        assert not row["infinite_threshold_fraction"], row  # the check is not vacuous
        assert row["within_tolerance"], row  # guaranteed value >= target - 3 SE
        if mode == "marginal":
            tol = TOLERANCE_SE * row["coverage_se"]
            assert row["coverage_mean"] <= row["band_high"] + tol, row
    at_01 = next(r for r in rep.rows("conformal") if r["alpha"] == 0.1)
    assert at_01["removal_mean"] > min_removal  # and it removes most sentences


@pytest.mark.parametrize("mode", ["marginal", "query-recall"])
def test_guarantee_on_evidence_sentences_over_topic_disjoint_splits(fixed_small,  # type: ignore[no-untyped-def]
                                                                    mode: str) -> None:
    _check_guarantee(fixed_small, mode, min_removal=0.6)


def test_the_guarantee_check_has_teeth(fixed_small) -> None:  # type: ignore[no-untyped-def]
    """Calibrating at alpha 0.15 while claiming 90 % is caught by the same rule."""
    sentences, scores = fixed_small
    rep = evaluate_scores(ScoredData.from_pairs(sentences, scores), alphas=(0.15,), top_k=(),
                          thetas=(), calibrated_baselines=False, n_splits=100, seed=1)
    row = rep.rows("conformal")[0]
    assert row["coverage_mean"] < 0.90 - TOLERANCE_SE * row["coverage_se"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["marginal", "query-recall", "topic"])
def test_guarantee_on_every_article(fixed_all, mode: str) -> None:  # type: ignore[no-untyped-def]
    _check_guarantee(fixed_all, mode, min_removal=0.7)


@pytest.fixture(scope="module")
def xquad_split(xquad_en):  # type: ignore[no-untyped-def]
    cal_idx, test_idx = group_splits([p.group for p in xquad_en], n_splits=1, seed=3)[0]
    return [xquad_en[i] for i in cal_idx], [xquad_en[i] for i in test_idx]


@pytest.fixture(scope="module")
def sentence_filter(xquad_split, minilm_scorer) -> ConformalFilter:  # type: ignore[no-untyped-def]
    cal, _ = xquad_split
    best = resolve_scorer("best", base=minilm_scorer)
    return ConformalFilter(best, alpha=0.1, unit="sentence").calibrate(cal, seed=0)


@pytest.mark.slow
def test_an_unfitted_score_becomes_the_sentence_in_context_score(sentence_filter) -> None:  # type: ignore[no-untyped-def]
    scorer = sentence_filter.scorer_
    assert isinstance(scorer, SentenceContextScorer) and scorer.is_fitted
    spec = scorer.spec()
    assert spec["sentence"]["scorer"] == spec["snippet"]["scorer"] == "fusion"
    assert spec["sentence"]["weights"] != spec["snippet"]["weights"]  # fitted apart
    assert all(w < 0 for w in spec["weights"])  # a higher stage score: less relevant
    assert scorer.snippet.base_scorer() is scorer.sentence.base_scorer()  # one model, one cache


def test_the_fitted_score_ranks_evidence_per_character(sentence_filter) -> None:  # type: ignore[no-untyped-def]
    """The deployed sentence score is -log P(evidence) + log(characters): two sentences the
    stages score alike differ by the log of their lengths' ratio, and the shorter is kept
    first; ``per_char=False`` scores -logit P, with no length in it."""
    scorer = sentence_filter.scorer_
    assert scorer.per_char and scorer.spec()["per_char"] is True
    short = "The tower was built by Gustave Eiffel."
    long = " ".join([short] * 6)
    x = np.array([[0.2, 0.4], [0.2, 0.4]])  # the same two stage scores for both
    logit = ((x - scorer.mean) / scorer.scale) @ scorer.weights + scorer.bias
    got = scorer._combine(x, [short, long])
    assert got == pytest.approx(np.logaddexp(0, -logit) + np.log([len(short), len(long)]))
    assert got[1] - got[0] == pytest.approx(math.log(len(long) / len(short)))
    plain = SentenceContextScorer(scorer.sentence, scorer.snippet, weights=scorer.weights,
                                  bias=scorer.bias, mean=scorer.mean, scale=scorer.scale)
    assert not plain.per_char and "per_char" not in plain.spec()  # as saved before it existed
    assert plain._combine(x, [short, long]) == pytest.approx(-logit)


def test_per_char_round_trips_and_an_old_spec_scores_as_it_was_saved() -> None:
    """A fitted spec says ``per_char`` when it is true; one without it (saved before the
    length term) rebuilds the ``-logit`` score it was calibrated on, unfitted ones default
    to per character; anything but a bool is refused."""
    fitted = {"scorer": "sentence_context", "sentence": {"scorer": "embedding"},
              "weights": [-1.0, -1.0], "bias": 0.0, "mean": [0.5, 0.5], "scale": [0.1, 0.1]}
    assert resolve_scorer(fitted).per_char is False
    new = resolve_scorer({**fitted, "per_char": True})
    assert new.per_char is True and resolve_scorer(new.spec()).per_char is True
    assert SentenceContextScorer("embedding").per_char is True
    off = SentenceContextScorer("embedding", per_char=False)
    assert off.spec()["per_char"] is False and resolve_scorer(off.spec()).per_char is False
    with pytest.raises(ValueError, match="per_char == 'yes'"):
        SentenceContextScorer("embedding", per_char="yes")  # type: ignore[arg-type]


@pytest.mark.slow
def test_real_sentence_filter_round_trips_and_prunes(sentence_filter, xquad_split,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path, embedding_cache_dir) -> None:
    _, test = xquad_split
    qid = test[0].query_id
    pairs = [p for p in test if p.query_id == qid]
    res = sentence_filter.filter(pairs[0].query, pairs)
    loaded = ConformalFilter.load(sentence_filter.save(tmp_path / "s.json"),
                                  scorer_options={"cache_dir": embedding_cache_dir})
    again = loaded.filter(pairs[0].query, pairs)
    assert again.kept == res.kept and again.sentences == res.sentences
    assert sentence_filter.filter_pairs(pairs)[qid].sentences == res.sentences
    kept_chars = sum(len(k.pruned_text) for k in res.kept)
    assert kept_chars < sum(len(p.text) for p in pairs)
    for k in res.kept:
        assert k.pruned_text == " ".join(k.text[a:b] for a, b in k.spans)


@pytest.mark.slow
def test_held_out_evidence_sentences_are_covered(sentence_filter, xquad_split) -> None:  # type: ignore[no-untyped-def]
    """One held-out split through the deployed path (calibrate, then filter_pairs)."""
    _, test = xquad_split
    results = sentence_filter.filter_pairs(test)
    label = {(p.query_id, p.meta["parent_position"], p.meta["sentence_start"]): p.relevant
             for p in sentence_pairs(test)}
    scored = [(label[(qid, i, start)], kept) for qid, r in results.items()
              for i, start, _end, _score, kept in r.sentences]
    evidence = [kept for relevant, kept in scored if relevant == 1]
    coverage, n = float(np.mean(evidence)), len(evidence)
    assert coverage >= 0.9 - 0.05 - 3 * math.sqrt(0.09 / n), (coverage, n)  # one split: loose
    assert 1 - np.mean([kept for _, kept in scored]) > 0.6  # most sentences removed


# ------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def small_jsonl(xquad_en, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """Eight XQuAD articles in the generic JSONL format (the query's answers in each line)."""
    from ragsieve.data import write_pairs

    groups = sorted({p.group for p in xquad_en})[:8]
    path = tmp_path_factory.mktemp("sentence-cli") / "small.jsonl"
    write_pairs([p for p in xquad_en if p.group in groups], path)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from ragsieve.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_calibrate_filter_evaluate_at_the_sentence_unit(  # type: ignore[no-untyped-def]
        small_jsonl: Path, embedding_cache_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.data import read_pairs

    cache = ["--cache-dir", str(embedding_cache_dir)]
    artifact = tmp_path / "sentences.json"
    code, out, _ = _run(["-q", "calibrate", "--data", str(small_jsonl), "--unit", "sentence",
                         "--out", str(artifact), *cache], capsys)
    assert code == 0 and "not estimated for --unit sentence" in out
    assert "(each sentence's " in out and "each snippet's" not in out  # issue 34: the unit
    payload = json.loads(artifact.read_text())
    assert payload["policy"]["unit"] == "sentence"
    assert payload["scorer"]["scorer"] == "sentence_context"
    code, out, _ = _run(["-q", "filter", "--filter", str(artifact), "--data", str(small_jsonl),
                         "--json", *cache], capsys)
    assert code == 0
    pairs = {(p.query_id, p.snippet_id): p.text for p in read_pairs(small_jsonl)}
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines and all(line["unit"] == "sentence" for line in lines)
    for line in lines:
        assert len(line["pruned_text"]) == len(line["spans"]) == len(line["kept"])
        for sid, spans, pruned in zip(line["kept"], line["spans"], line["pruned_text"],
                                      strict=True):
            text = pairs[(line["query_id"], sid)]
            assert spans and pruned == " ".join(text[a:b] for a, b in spans)
    # --unit on filter must agree with the artifact
    code, _, err = _run(["-q", "filter", "--filter", str(artifact), "--data", str(small_jsonl),
                         "--unit", "snippet", *cache], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--unit snippet disagrees with the artifact, calibrated on unit 'sentence'" in err
    code, out, _ = _run(["-q", "evaluate", "--data", str(small_jsonl), "--unit", "sentence",
                         "--alpha", "0.1", "--splits", "2", "--top-k", "1", "--json", *cache],
                        capsys)
    report = json.loads(out)
    assert code == 0 and report["unit"] == "sentence"
    assert report["n_snippets"] == len(sentence_pairs(read_pairs(small_jsonl)))


def test_budget_unit_and_its_old_spelling(small_jsonl: Path, embedding_cache_dir: Path,  # type: ignore[no-untyped-def]
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = ["-q", "calibrate", "--data", str(small_jsonl), "--scorer", "embedding",
            "--mode", "budget", "--budget", "300", "--no-expected",
            "--cache-dir", str(embedding_cache_dir)]
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    code, _, err = _run([*base, "--budget-unit", "tokens", "--out", str(new)], capsys)
    assert code == 0 and "--budget-unit" not in err
    code, _, err = _run([*base, "--unit", "tokens", "--out", str(old)], capsys)
    assert code == 0
    assert "note: --unit tokens is the budget's unit: spell it --budget-unit tokens" in err
    for path in (new, old):
        payload = json.loads(path.read_text())
        assert payload["calibration"]["params"]["unit"] == "tokens"
        assert payload["policy"]["unit"] == "snippet"
    code, _, err = _run([*base, "--unit", "tokens", "--budget-unit", "chars",
                         "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2 and "--unit tokens and --budget-unit chars disagree" in err
