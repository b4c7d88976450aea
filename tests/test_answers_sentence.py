"""``answers --unit sentence``: the sentence-unit conformal rows beside the snippet rows, on real XQuAD-en.

The sentence rows are what a deployed ``ConformalFilter(unit="sentence")`` hands the
generator: the test checks them against such a filter calibrated on the same topics.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ragsieve import ConformalFilter
from ragsieve.calibration import make_calibrator
from ragsieve.cli import main
from ragsieve.data.splits import group_splits
from ragsieve.errors import DataError
from ragsieve.evaluation import AnswerConfig, evaluate_answers, format_answer_table
from ragsieve.evaluation.answer_metrics import answer_in_context
from ragsieve.evaluation.answers import _evidence_spans, _queries
from ragsieve.evaluation.sweep import ScoredData
from ragsieve.scoring import resolve_scorer
from ragsieve.scoring.sentence_context import SentenceContextScorer
from ragsieve.types import Pair
from ragsieve.units import sentence_pairs

ALPHA, SEED = 0.2, 3


@pytest.fixture(scope="module")
def both(xquad_en, minilm_scorer, xquad_en_scores):  # type: ignore[no-untyped-def]
    """The same run at the snippet unit and with the sentence rows (60 test queries)."""
    config = AnswerConfig(alphas=(ALPHA,), generate=False, seed=SEED, limit_queries=60)
    snippet = evaluate_answers(xquad_en, minilm_scorer, config)
    sentence = evaluate_answers(xquad_en, minilm_scorer, dataclasses.replace(config, unit="sentence"))
    return snippet, sentence


def test_sentence_rows_sit_beside_the_snippet_rows_on_the_same_queries(both) -> None:  # type: ignore[no-untyped-def]
    snippet, sentence = both
    row = sentence.row("conformal (sentence)", ALPHA)
    assert row["unit"] == "sentence" and row["mode"] == "marginal"
    assert {r["method"] for r in sentence.results} == {r["method"] for r in snippet.results} | {
        "conformal (sentence)", "oracle", "oracle (sentence)"}
    # the snippet rows are untouched by the extra rows
    for r in snippet.results:
        twin = next(x for x in sentence.results
                    if x["method"] == r["method"] and x.get("alpha") == r.get("alpha"))
        assert twin == r
    # same held-out queries
    assert set(sentence.per_query["conformal (sentence) a=0.2"]) == set(sentence.per_query["all"])
    assert row["n_queries"] == sentence.row("conformal", ALPHA)["n_queries"] == 60
    # pruned sentences: never more text than the whole list, and with its interval
    assert row["context_chars_mean"] < sentence.row("all")["context_chars_mean"]
    assert {"low", "high"} <= set(row["ci"]["context_chars"])
    assert "conformal (sentence)" in format_answer_table(sentence)


def test_sentence_contexts_are_the_deployed_filters_kept_sentences(both, xquad_en,  # type: ignore[no-untyped-def]
                                                                   minilm_scorer, xquad_en_scores) -> None:
    _, report = both
    data = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    ((cal_idx, _),) = group_splits(data.group_index.tolist(), calibration_fraction=0.5, n_splits=1,
                                   seed=SEED)
    flt = ConformalFilter(minilm_scorer, make_calibrator("marginal", alpha=ALPHA), unit="sentence")
    flt.calibrate([xquad_en[i] for i in cal_idx], seed=SEED, monitor=False)
    per_query = report.per_query["conformal (sentence) a=0.2"]
    by_query: dict[str, list] = {}
    for p in xquad_en:
        by_query.setdefault(p.query_id, []).append(p)
    n_pruned = 0
    for qid, measured in per_query.items():
        pairs = by_query[qid]
        result = flt.filter(pairs[0].query, pairs)
        texts = [k.pruned_text for k in result.kept]
        n_pruned += sum(k.pruned_text != k.text for k in result.kept)
        assert measured["context_chars"] == sum(len(t) for t in texts), qid
        assert measured["context_snippets"] == len(texts)
        found = bool(texts) and answer_in_context("\n".join(texts), pairs[0].meta["answers"], "en")
        assert measured["answer_in_context"] == float(found)
    assert n_pruned > 0  # the sentence unit did cut sentences out of kept snippets


def test_a_learned_score_is_fitted_once_and_each_alpha_keeps_what_its_own_filter_keeps(  # type: ignore[no-untyped-def]
        xquad_en, minilm_scorer, xquad_en_scores, monkeypatch) -> None:
    """The fused sentence-in-context score is fitted by the first alpha's calibrate only; the
    second alpha's row is what a filter fitted and calibrated on its own keeps."""
    fits: list[int] = []
    real_fit = SentenceContextScorer.fit_topics

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        fits.append(1)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(SentenceContextScorer, "fit_topics", counted)
    best = resolve_scorer("best", base=minilm_scorer)
    report = evaluate_answers(xquad_en, best, AnswerConfig(
        alphas=(0.1, ALPHA), generate=False, seed=SEED, limit_queries=40, unit="sentence"))
    assert len(fits) == 1
    data = ScoredData.from_pairs(xquad_en, xquad_en_scores)
    ((cal_idx, _),) = group_splits(data.group_index.tolist(), calibration_fraction=0.5, n_splits=1,
                                   seed=SEED)
    own = ConformalFilter(resolve_scorer("best", base=minilm_scorer),
                          make_calibrator("marginal", alpha=ALPHA), unit="sentence")
    own.calibrate([xquad_en[i] for i in cal_idx], seed=SEED, monitor=False)
    assert len(fits) == 2
    by_query: dict[str, list] = {}
    for p in xquad_en:
        by_query.setdefault(p.query_id, []).append(p)
    per_query = report.per_query[f"conformal (sentence) a={ALPHA:g}"]
    assert len(per_query) == 40
    for qid, measured in per_query.items():
        result = own.filter(by_query[qid][0].query, by_query[qid])
        assert measured["context_chars"] == sum(len(k.pruned_text) for k in result.kept), qid
    # the two alphas differ: the reused fit was calibrated anew, not copied
    tighter = report.row("conformal (sentence)", 0.1)["context_chars_mean"]
    assert tighter > report.row("conformal (sentence)", ALPHA)["context_chars_mean"]


def test_oracle_rows_keep_the_labels_relevant_snippets_and_their_evidence_sentences(  # type: ignore[no-untyped-def]
        both, xquad_en) -> None:
    _, report = both
    by_query: dict[str, list] = {}
    for p in xquad_en:
        by_query.setdefault(p.query_id, []).append(p)
    whole, evidence = report.per_query["oracle"], report.per_query["oracle (sentence)"]
    assert set(whole) == set(evidence) == set(report.per_query["all"])
    shorter = 0
    for qid, measured in evidence.items():
        relevant = [p for p in by_query[qid] if p.relevant == 1]
        assert whole[qid]["context_chars"] == sum(len(p.text) for p in relevant), qid
        assert whole[qid]["context_snippets"] == len(relevant)
        # evidence sentences: inside the relevant snippets, each holding a gold answer
        expected = [" ".join(s.text for s in sentence_pairs([p]) if s.relevant == 1)
                    for p in relevant]
        assert measured["context_chars"] == sum(len(t) for t in expected if t), qid
        shorter += measured["context_chars"] < whole[qid]["context_chars"]
        # the answer sits in the evidence sentences wherever it sits in the relevant snippets
        assert measured["answer_in_context"] == whole[qid]["answer_in_context"], qid
    assert shorter > len(evidence) // 2  # most relevant snippets hold sentences besides the evidence
    oracle = report.row("oracle (sentence)")
    assert oracle["answer_in_context_mean"] > 0.95
    assert oracle["context_chars_mean"] < report.row("oracle")["context_chars_mean"]


def test_sentence_calibration_needs_evidence_or_answers(xquad_en, minilm_scorer, xquad_en_scores) -> None:  # type: ignore[no-untyped-def]
    # the even topics lose their answers and evidence spans: they can calibrate snippets,
    # not sentences
    groups = sorted({p.group for p in xquad_en})
    unanswered = set(groups[::2])
    pairs = [p if p.group not in unanswered else dataclasses.replace(
        p, meta={k: v for k, v in p.meta.items() if k not in ("answers", "evidence")})
        for p in xquad_en]
    with pytest.raises(DataError, match="'evidence'.*'answers'"):
        evaluate_answers(pairs, minilm_scorer, alphas=(ALPHA,), generate=False, unit="sentence",
                         limit_queries=20)
    # with evidence spans (here: the answer's offsets) the same pairs calibrate sentences
    spanned = []
    for p in pairs:
        if p.relevant and "answers" not in p.meta:
            answer = next(q.meta["answers"][0] for q in xquad_en if q.query_id == p.query_id)
            at = p.text.find(answer)
            meta = {**p.meta, "evidence": [[at, at + len(answer)]] if at >= 0 else [[0, len(p.text)]]}
            p = dataclasses.replace(p, meta=meta)
        spanned.append(p)
    report = evaluate_answers(spanned, minilm_scorer, alphas=(ALPHA,), generate=False,
                              unit="sentence", limit_queries=20)
    assert report.row("conformal (sentence)", ALPHA)["n_queries"] > 0


def test_config_rejects_an_unknown_unit() -> None:
    with pytest.raises(ValueError, match="unit == 'paragraph', must be one of 'snippet', 'sentence'"):
        AnswerConfig(unit="paragraph")


def test_cli_answers_unit_sentence(xquad_en, tmp_path: Path, capsys, embedding_cache_dir) -> None:  # type: ignore[no-untyped-def]
    from ragsieve.data import write_pairs

    groups = sorted({p.group for p in xquad_en})[:8]
    data = tmp_path / "x.jsonl"
    write_pairs([p for p in xquad_en if p.group in groups], data)
    code = main(["-q", "answers", "--data", str(data), "--no-generate", "--unit", "sentence",
                 "--alpha", "0.2", "--scorer", "embedding", "--cache-dir", str(embedding_cache_dir),
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    methods = {r["method"]: r for r in out["results"]}
    assert {"all", "conformal", "conformal (sentence)"} <= set(methods)
    sentence = methods["conformal (sentence)"]
    assert sentence["unit"] == "sentence" and np.isfinite(sentence["context_chars_mean"])


def test_oracle_evidence_reads_answers_from_any_line_of_the_query() -> None:
    # the query's answers stand on its first line only; its relevant snippet is the second
    pairs = [Pair("q1", "Who built it?", "d:0", "Paris is big.", relevant=0, group="t",
                  meta={"answers": ["Gustave Eiffel"]}),
             Pair("q1", "Who built it?", "d:1", "It is tall. Gustave Eiffel built it.", relevant=1,
                  group="t"),
             Pair("q2", "When?", "e:0", "In 1889 it opened. Crowds came.", relevant=1, group="u",
                  meta={"answers": ["1889"]})]
    data = ScoredData.from_pairs(pairs, np.zeros(len(pairs)))
    queries = _queries(pairs, data, None)
    spans = _evidence_spans(pairs, queries, np.ones(len(queries), dtype=bool), None)
    assert spans == {1: ((12, 36),), 2: ((0, 18),)}
