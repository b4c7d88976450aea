"""The list-free ("portable") score of issue 30, and ties in the list-aware ones.

A list-aware score (gap, z, rank, ratio, the in-list BM25, the fused presets built on them)
is calibrated for lists like its calibration lists; the portable fused score reads one
snippet at a time -- the base cosine, a BM25 whose statistics are frozen from the texts of
the fit share of the calibration topics, the share of the query's IDF found and the best
sentence's BM25 on those statistics -- so its threshold
holds behind any retriever. Real MiniLM, real XQuAD English.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration.inputs import CalibrationInputs
from ragsieve.errors import CalibrationError, ScorerError
from ragsieve.scoring import (
    AutoScorer,
    CorpusBM25Scorer,
    EmbeddingScorer,
    FusedScorer,
    IDFCoverageScorer,
    ListBM25Scorer,
    RelativeScorer,
    Scorer,
    SentenceBM25Scorer,
    choose_score,
    resolve_scorer,
)
from ragsieve.scoring.fusion import fit_fused_scorer
from ragsieve.scoring.lexical import bm25_scores, tokenize
from ragsieve.scoring.relative import RELATIVE_KINDS, within_query_min_rank, within_query_rank
from ragsieve.scoring.sentence_cosine import sentence_texts

SUPER_BOWL = "The Denver Broncos defeated the Carolina Panthers 24-10 to win Super Bowl 50."


def _topics(pairs: list[Pair], n: int, start: int = 0) -> list[Pair]:
    """The pairs of ``n`` topics (sorted), from the ``start``-th."""
    keep = set(sorted({p.group for p in pairs})[start:start + n])
    return [p for p in pairs if p.group in keep]


def _lists(pairs: list[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for p in pairs:
        out.setdefault(p.query_id, []).append(p)
    return out


def _topic_codes(pairs: list[Pair]) -> np.ndarray:
    """The topic codes ``ConformalFilter.calibrate`` draws the fit share from."""
    return CalibrationInputs.from_pairs(pairs).group_index


@pytest.fixture(scope="module")
def corpus_pairs(xquad_en: list[Pair]) -> list[Pair]:
    return _topics(xquad_en, 6)


@pytest.fixture(scope="module")
def fitted_bm25(corpus_pairs: list[Pair]) -> CorpusBM25Scorer:
    return CorpusBM25Scorer().fitted_on_texts([p.text for p in corpus_pairs])


@pytest.fixture(scope="module")
def fit_pairs(xquad_en: list[Pair]) -> list[Pair]:
    """Twelve XQuAD topics: enough for a fit share of three topics and both labels."""
    return _topics(xquad_en, 12)


@pytest.fixture(scope="module")
def portable(minilm_scorer: EmbeddingScorer, fit_pairs: list[Pair]) -> FusedScorer:
    """The portable fused score, fitted by the one fit ``calibrate`` makes."""
    done = fit_fused_scorer(FusedScorer.unfitted(minilm_scorer, preset="portable"), fit_pairs,
                            _topic_codes(fit_pairs), seed=1)
    return done.scorer


# ------------------------------------------------------------------ the frozen-corpus BM25
def test_corpus_bm25_is_lucene_bm25_of_its_frozen_corpus(corpus_pairs: list[Pair],
                                                         fitted_bm25: CorpusBM25Scorer) -> None:
    """Scoring the corpus's own texts gives the in-list BM25 of that corpus (the same
    Lucene formula, :func:`bm25_scores`), over the idf mass of *all* the query's tokens:
    a token the corpus never saw counts with df 0."""
    corpus = list(dict.fromkeys(p.text for p in corpus_pairs))  # each distinct text once
    docs = [tokenize(t) for t in corpus]
    stats = fitted_bm25.statistics
    assert stats is not None and stats.n_docs == len(corpus)
    assert stats.avgdl == sum(map(len, docs)) / len(docs)
    unseen_idf = math.log(1 + (len(docs) + 0.5) / 0.5)
    for query in ("Who won Super Bowl 50?", "What did the Panthers score zzzunseen zzzunseen?",
                  corpus_pairs[0].query, corpus_pairs[-1].query):
        tokens = tokenize(query)
        raw, matched = bm25_scores(tokens, docs)
        unseen = sum(n for tok, n in Counter(tokens).items() if tok not in stats.df)
        expected = 1.0 - raw / (matched + unseen * unseen_idf)
        np.testing.assert_allclose(fitted_bm25.score_batch(query, corpus), expected,
                                   rtol=1e-12, atol=1e-12)
    assert fitted_bm25.score_batch("???", corpus[:2]).tolist() == [1.0, 1.0]  # no token
    assert fitted_bm25.score_batch("Super Bowl", [""]).tolist() == [1.0]  # an empty snippet
    assert fitted_bm25.score_batch("q", []).size == 0


def test_corpus_bm25_is_list_free(fitted_bm25: CorpusBM25Scorer, xquad_en: list[Pair]) -> None:
    """A snippet's score is the same number alone, in its list, with other snippets added
    or removed, in any order, and through score_pairs (the in-list BM25's is not)."""
    lst = next(iter(_lists(_topics(xquad_en, 1)).values()))
    query, texts = lst[0].query, [p.text for p in lst]
    whole = fitted_bm25.score_batch(query, texts)
    others = [p.text for p in _topics(xquad_en, 2, start=20)][:15]
    rng = np.random.default_rng(0)
    for _ in range(5):
        k = int(rng.integers(1, len(texts)))
        mixed = texts[:k] + others[: rng.integers(0, len(others))]
        order = rng.permutation(len(mixed))
        scores = fitted_bm25.score_batch(query, [mixed[i] for i in order])
        for pos, i in enumerate(order):
            if i < k:
                assert scores[pos] == whole[i]
    for i, text in enumerate(texts):
        assert fitted_bm25.score_batch(query, [text])[0] == whole[i]
    np.testing.assert_array_equal(fitted_bm25.score_pairs(lst), whole)
    assert not fitted_bm25.tags.list_dependent and fitted_bm25.tags.reads_text
    in_list = ListBM25Scorer()
    assert in_list.score_batch(query, texts)[0] != in_list.score_batch(query, texts[:1] + others)[0]


def test_unfitted_corpus_bm25_says_how_to_fit_it(corpus_pairs: list[Pair]) -> None:
    scorer = resolve_scorer("bm25-corpus")
    assert isinstance(scorer, CorpusBM25Scorer) and not scorer.is_fitted
    assert scorer.spec() == {"scorer": "bm25-corpus", "k1": 1.5, "b": 0.75,
                             "max_vocabulary": 50_000}
    for attempt in (lambda: scorer.score_batch("q", ["a text"]),
                    lambda: scorer.score_pairs(corpus_pairs[:3])):
        with pytest.raises(ScorerError, match=r"fitted_on_texts\(texts\).*--preset portable"):
            attempt()
    with pytest.raises(ValueError, match="give all three or none"):
        CorpusBM25Scorer(n_docs=3, avgdl=2.0)
    with pytest.raises(ValueError, match=r"df\['a'\] == 4, must be an int in \[1, n_docs == 3\]"):
        CorpusBM25Scorer(n_docs=3, avgdl=2.0, df={"a": 4})
    with pytest.raises(ValueError, match="avgdl"):
        CorpusBM25Scorer(n_docs=3, avgdl=0.0, df={"a": 1})
    with pytest.raises(CalibrationError, match="0 token"):
        scorer.fitted_on_texts(["...", "!!!"])
    with pytest.raises(TypeError, match="single string"):
        scorer.fitted_on_texts("one text")  # type: ignore[arg-type]


def test_spec_round_trip_rebuilds_identical_scores(fitted_bm25: CorpusBM25Scorer,
                                                   xquad_en: list[Pair]) -> None:
    """Through JSON, as the artifact stores it: the same statistics, the same numbers."""
    spec = json.loads(json.dumps(fitted_bm25.spec()))
    again = resolve_scorer(spec)
    assert again.spec() == fitted_bm25.spec() and again.is_fitted
    pairs = _topics(xquad_en, 3, start=30)  # other topics than the corpus's
    np.testing.assert_array_equal(again.score_pairs(pairs), fitted_bm25.score_pairs(pairs))
    assert again.unfitted_copy().spec() == resolve_scorer("bm25-corpus").spec()


def test_the_vocabulary_is_bounded_by_document_frequency(xquad_en: list[Pair]) -> None:
    """At most max_vocabulary tokens keep their df: those in most texts; the rest count as
    unseen, so a spec of all 48 topics stays small."""
    texts = [p.text for p in xquad_en]
    full = CorpusBM25Scorer().fitted_on_texts(texts)
    small = CorpusBM25Scorer(max_vocabulary=500).fitted_on_texts(texts)
    assert full.statistics is not None and small.statistics is not None
    kept, every = small.statistics.df, full.statistics.df
    assert len(kept) == 500 < len(every)
    assert min(kept.values()) >= max(v for t, v in every.items() if t not in kept)
    assert all(every[t] == v for t, v in kept.items())
    assert len(json.dumps(full.spec())) < 1_000_000  # every token of XQuAD-en: well under 64 MiB
    # a dropped token scores as one the corpus never saw (df 0)
    dropped = max((t for t in every if t not in kept), key=lambda t: (every[t], t))
    stats = small.statistics
    query, text = f"{dropped} the", f"{dropped} {dropped} and the words around it"
    idf = {t: math.log(1 + (stats.n_docs - stats.df.get(t, 0) + 0.5) / (stats.df.get(t, 0) + 0.5))
           for t in (dropped, "the")}
    tf, length = Counter(tokenize(text)), len(tokenize(text))
    norm = 1.5 * (1 - 0.75 + 0.75 * length / stats.avgdl)
    bm25 = sum(idf[t] * tf[t] / (tf[t] + norm) for t in idf)
    assert small.score_batch(query, [text])[0] == pytest.approx(1 - bm25 / sum(idf.values()),
                                                                rel=1e-12)
    assert small.score_batch(query, [text])[0] != full.score_batch(query, [text])[0]


# ------------------------------------------------------------------ more signals on its statistics
@pytest.fixture(scope="module")
def corpus_signals(corpus_pairs: list[Pair]) -> dict[str, CorpusBM25Scorer]:
    """The IDF coverage and the best sentence's BM25 fitted on the corpus BM25's texts."""
    texts = [p.text for p in corpus_pairs]
    return {"idf-cov": IDFCoverageScorer().fitted_on_texts(texts),
            "sent-bm25": SentenceBM25Scorer().fitted_on_texts(texts)}


def test_idf_coverage_is_the_share_of_the_query_idf_found(fitted_bm25: CorpusBM25Scorer,
                                                          corpus_signals: dict[str, CorpusBM25Scorer],
                                                          xquad_en: list[Pair]) -> None:
    """Each distinct query token once, weighted by the frozen corpus's Lucene idf."""
    cov = corpus_signals["idf-cov"]
    assert cov.statistics == fitted_bm25.statistics
    stats = fitted_bm25.statistics
    assert stats is not None
    pair = _topics(xquad_en, 1, start=30)[0]
    query, text = pair.query, pair.text
    found = set(tokenize(text))
    idf = {t: math.log1p((stats.n_docs - stats.df.get(t, 0) + 0.5) / (stats.df.get(t, 0) + 0.5))
           for t in set(tokenize(query))}
    want = 1 - sum(v for t, v in idf.items() if t in found) / sum(idf.values())
    assert cov.score_batch(query, [text])[0] == pytest.approx(want, rel=1e-12)
    assert cov.score_batch(query, ["", "zzz qqq"]).tolist() == [1.0, 1.0]
    assert cov.score_batch("?", [text]).tolist() == [1.0]  # a query without tokens


def test_sentence_bm25_is_the_best_sentence_corpus_bm25(fitted_bm25: CorpusBM25Scorer,
                                                       corpus_signals: dict[str, CorpusBM25Scorer],
                                                       xquad_en: list[Pair]) -> None:
    """Each sentence scored by the corpus BM25 of the snippets' statistics; the lowest kept."""
    sent = corpus_signals["sent-bm25"]
    assert sent.statistics == fitted_bm25.statistics
    pairs = _topics(xquad_en, 1, start=31)[:6]
    for p in pairs:
        best = fitted_bm25.score_batch(p.query, sentence_texts(p.text)).min()
        assert sent.score_batch(p.query, [p.text])[0] == pytest.approx(best, rel=1e-12)
    np.testing.assert_allclose(sent.score_pairs(pairs),
                               [sent.score_batch(p.query, [p.text])[0] for p in pairs], rtol=1e-12)


@pytest.mark.parametrize("name", ["idf-cov", "sent-bm25"])
def test_corpus_signals_are_list_free_and_round_trip(name: str,
                                                     corpus_signals: dict[str, CorpusBM25Scorer],
                                                     xquad_en: list[Pair]) -> None:
    scorer = corpus_signals[name]
    assert not scorer.tags.list_dependent and scorer.spec()["scorer"] == name
    query, texts = _duplicate_list(xquad_en)
    scores = scorer.score_batch(query, texts)
    assert scores[0] == scores[-1] and len(set(scores[1:-1].tolist())) > 1
    assert scorer.score_batch(query, texts[2:4] + texts[:1]).tolist() == [*scores[2:4], scores[0]]
    again = resolve_scorer(json.loads(json.dumps(scorer.spec())))
    assert type(again) is type(scorer) and again.spec() == scorer.spec()
    np.testing.assert_array_equal(again.score_batch(query, texts), scores)
    fresh = again.unfitted_copy()
    assert not fresh.is_fitted and fresh.spec() == resolve_scorer(name).spec()
    with pytest.raises(ScorerError, match=f"{name!r} has no corpus statistics"):
        fresh.score_batch(query, texts)


# ------------------------------------------------------------------ the portable fused score
def test_portable_fused_is_list_free_and_says_so(portable: FusedScorer,
                                                 minilm_scorer: EmbeddingScorer,
                                                 xquad_en: list[Pair]) -> None:
    assert not portable.tags.list_dependent and portable.is_fitted
    assert portable.spec()["list_features"] is False and portable.spec()["preset"] == "portable"
    assert [s.spec()["scorer"] for s in portable.signals] == ["bm25-corpus", "idf-cov",
                                                              "sent-bm25"]
    assert portable.feature_names == ("embedding[all-MiniLM-L6-v2].score", "bm25-corpus.score",
                                      "idf-cov.score", "sent-bm25.score")
    assert FusedScorer.unfitted(minilm_scorer, preset="portable").tags.list_dependent is False
    for preset in ("fast", "base", "quality"):
        assert FusedScorer.unfitted(minilm_scorer, preset=preset).tags.list_dependent
    lst = next(iter(_lists(_topics(xquad_en, 1, start=40)).values()))
    query, texts = lst[0].query, [p.text for p in lst]
    others = [p.text for p in _topics(xquad_en, 1, start=41)][:8]
    whole = portable.score_batch(query, texts)  # warms the cache: later calls read the same vectors
    portable.score_batch(query, others)
    rng = np.random.default_rng(1)
    for _ in range(4):
        k = int(rng.integers(1, len(texts)))
        mixed = texts[:k] + others[: rng.integers(0, len(others))]
        order = rng.permutation(len(mixed))
        scores = portable.score_batch(query, [mixed[i] for i in order])
        for pos, i in enumerate(order):
            if i < k:
                assert scores[pos] == pytest.approx(whole[i], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(portable.score_pairs(lst), whole, rtol=1e-9, atol=1e-12)


def test_portable_spec_round_trips_through_json(portable: FusedScorer,
                                                minilm_scorer: EmbeddingScorer,
                                                xquad_en: list[Pair]) -> None:
    spec = json.loads(json.dumps(portable.spec()))
    # the three frozen-corpus signals fitted on one corpus: its statistics saved once
    assert [s.get("statistics") for s in spec["signals"]] == ["shared"] * 3
    assert not any("df" in s for s in spec["signals"]) and spec["corpus_statistics"]["df"]
    again = resolve_scorer(spec, cache_dir=minilm_scorer.cache_dir)
    assert again.spec() == portable.spec() and not again.tags.list_dependent
    assert len({id(s.statistics) for s in again.signals}) == 1  # one object in memory
    pairs = _topics(xquad_en, 1, start=44)
    np.testing.assert_allclose(again.score_pairs(pairs), portable.score_pairs(pairs),
                               rtol=1e-9, atol=1e-12)
    # refitted where it is used (expected on new topics): the statistics go with the weights
    fresh = portable.unfitted_copy()
    assert not fresh.is_fitted and not fresh.signals[0].is_fitted
    assert fresh.spec() == FusedScorer.unfitted(minilm_scorer, preset="portable").spec()


def test_shared_statistics_are_refused_when_half_given(portable: FusedScorer,
                                                      minilm_scorer: EmbeddingScorer) -> None:
    spec = json.loads(json.dumps(portable.spec()))
    orphan = {k: v for k, v in spec.items() if k != "corpus_statistics"}
    with pytest.raises(ValueError, match="holds no .corpus_statistics"):
        resolve_scorer(orphan, cache_dir=minilm_scorer.cache_dir)
    unused = {**spec, "signals": [{k: v for k, v in s.items() if k != "statistics"}
                                  for s in spec["signals"]]}
    with pytest.raises(ValueError, match="no signal refers to"):
        resolve_scorer(unused, cache_dir=minilm_scorer.cache_dir)
    # each signal's own copy, as earlier versions saved it, still loads
    inline = {**orphan, "signals": [{**{k: v for k, v in s.items() if k != "statistics"},
                                     **spec["corpus_statistics"]} for s in spec["signals"]]}
    assert resolve_scorer(inline, cache_dir=minilm_scorer.cache_dir).spec() == portable.spec()


def test_the_fit_takes_the_corpus_statistics_from_the_fit_share_only(
        minilm_scorer: EmbeddingScorer, fit_pairs: list[Pair]) -> None:
    """The frozen statistics are those of the fit share's texts (the share the learner is
    fitted on), never of the topics the threshold is calibrated on."""
    unfitted = FusedScorer.unfitted(minilm_scorer, preset="portable")
    done = fit_fused_scorer(unfitted, fit_pairs, _topic_codes(fit_pairs), seed=5)
    fit_texts = [p.text for p, f in zip(fit_pairs, done.fit, strict=True) if f]
    cal_texts = {p.text for p, f in zip(fit_pairs, done.fit, strict=True) if not f}
    assert 0 < len(fit_texts) < len(fit_pairs) and not cal_texts & set(fit_texts)
    bm25 = done.scorer.signals[0]
    assert isinstance(bm25, CorpusBM25Scorer)
    assert bm25.statistics == CorpusBM25Scorer().fitted_on_texts(fit_texts).statistics
    # one statistics object for the three signals (one tokenization, one fit per share)
    assert all(s.statistics is bm25.statistics for s in done.scorer.signals[1:])  # type: ignore[attr-defined]
    cal_only = {t for text in cal_texts for t in tokenize(text)} - {
        t for text in fit_texts for t in tokenize(text)}
    assert cal_only and not cal_only & set(bm25.statistics.df)  # unseen by the frozen corpus
    np.testing.assert_allclose(done.scores, done.scorer.score_pairs(fit_pairs), rtol=1e-9,
                               atol=1e-12)
    # calibrate makes that fit: the same statistics, the same weights
    flt = ConformalFilter(unfitted, "marginal", alpha=0.1).calibrate(fit_pairs, seed=5,
                                                                     monitor=False)
    assert flt.scorer_.spec() == done.scorer.spec()
    assert flt.calibration_info["fusion_fit_pairs"] == int(done.fit.sum())


def test_a_portable_filter_saves_and_loads(portable: FusedScorer, minilm_scorer: EmbeddingScorer,
                                           fit_pairs: list[Pair], tmp_path: Path) -> None:
    flt = ConformalFilter(FusedScorer.unfitted(minilm_scorer, preset="portable"), alpha=0.2)
    flt.calibrate(fit_pairs, seed=1, monitor=False)
    path = flt.save(tmp_path / "portable.json")
    loaded = ConformalFilter.load(path, scorer_options={"cache_dir": minilm_scorer.cache_dir})
    assert loaded.scorer.spec() == flt.scorer_.spec() and not loaded.scorer.tags.list_dependent
    assert path.stat().st_size < 1_000_000
    lst = next(iter(_lists(fit_pairs).values()))
    texts = [p.text for p in lst]
    assert loaded.filter(lst[0].query, texts).kept_ids == flt.filter(lst[0].query, texts).kept_ids


#: A portable filter saved before ``portable`` left the best sentence's cosine for the lexical
#: pair (its signals: a corpus BM25 of 200 tokens and ``sentence-cos``; MiniLM, alpha 0.2,
#: calibrated on the first twelve XQuAD-en topics with seed 1), and its scores of the first
#: twelve pairs of the topic ``Victoria_(Australia)`` then.
PORTABLE_BEFORE = Path(__file__).resolve().parent / "data" / "artifact_portable_sentence_cos.json"
SCORES_BEFORE = [-5.604393465998, 0.733377775, 7.284698318315, 6.687638289743, 6.091509470115,
                 5.859715328539, 7.917438852349, 8.137771947139, 6.833781727967, 8.71012333324,
                 -4.063878993055, -2.473195549682]


def test_a_portable_filter_saved_before_scores_as_before(minilm_scorer: EmbeddingScorer,
                                                         xquad_en: list[Pair]) -> None:
    """A saved filter restores the signals it was fitted with, whatever the preset table says."""
    loaded = ConformalFilter.load(PORTABLE_BEFORE,
                                  scorer_options={"cache_dir": minilm_scorer.cache_dir})
    scorer = loaded.scorer
    assert isinstance(scorer, FusedScorer) and scorer.preset == "portable"
    assert [s.spec()["scorer"] for s in scorer.signals] == ["bm25-corpus", "sentence-cos"]
    probe = [p for p in xquad_en if p.group == "Victoria_(Australia)"][:12]
    np.testing.assert_allclose(scorer.score_pairs(probe), SCORES_BEFORE, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ the default
def test_choose_score_by_where_the_lists_come_from(xquad_en: list[Pair],
                                                   embedding_cache_dir: Path) -> None:
    pairs = _topics(xquad_en, 8)
    own = choose_score(pairs)
    assert (own.alias, own.preset, own.label) == ("best", "portable", "fused, portable (list-free)")
    assert "the calibration lists are the data set's own, not the deployed retriever's" \
        in own.reason
    assert "ragsieve retrieve" in own.reason and "--lists deployed" in own.reason
    deployed = choose_score(pairs, deployed_lists=True)
    assert (deployed.alias, deployed.preset, deployed.label) == ("best", "fast",
                                                                 "fused (best, list-aware)")
    assert "from the deployed retriever" in deployed.reason
    # single-snippet queries: a list-aware score cannot be fitted; the portable one can
    singles = [lst[i] for lst in _lists(pairs).values() for i in (0,)]
    singles += [replace(lst[0], query_id=lst[0].query_id + "-r", snippet_id="r",
                        text=next(p.text for p in lst if p.relevant), relevant=1)
                for lst in _lists(pairs).values()]
    assert {p.relevant for p in singles} == {0, 1}
    for flag in (False, True):
        choice = choose_score(singles, deployed_lists=flag)
        assert (choice.alias, choice.preset) == ("best", "portable"), flag
    assert "queries have a single snippet" in choose_score(singles, deployed_lists=True).reason
    # no fused score at all: one label only, or too few topics
    assert choose_score([p for p in pairs if p.relevant]).alias == "embedding"
    few = choose_score(_topics(xquad_en, 3), deployed_lists=True)
    assert few.alias == "embedding" and few.preset is None and few.reason.startswith("3 topic(s)")
    assert few.to_dict() == {"scorer": "embedding", "preset": None, "label": "1 - cos (embedding)",
                             "reason": few.reason}
    # the auto score builds what was chosen
    auto = AutoScorer(model="minilm", language="en", cache_dir=embedding_cache_dir)
    for flag, preset, aware in ((False, "portable", False), (True, "fast", True)):
        scorer, choice, _ = auto.resolve(pairs, deployed_lists=flag)
        assert isinstance(scorer, FusedScorer) and choice.preset == preset == scorer.preset
        assert scorer.tags.list_dependent is aware


def test_calibrate_with_auto_fits_the_portable_score(xquad_en: list[Pair],
                                                    embedding_cache_dir: Path) -> None:
    flt = ConformalFilter(AutoScorer(model="minilm", language="en", cache_dir=embedding_cache_dir),
                          alpha=0.2)
    flt.calibrate(_topics(xquad_en, 8), monitor=False)
    assert flt.calibration_info["score_choice"]["preset"] == "portable"
    assert flt.scorer_.spec()["preset"] == "portable" and not flt.scorer_.tags.list_dependent


# ------------------------------------------------------------------ ties
def test_min_rank_gives_equal_scores_one_rank() -> None:
    scores = np.array([0.3, 0.1, 0.3, 0.5, 0.5, 0.2 + 1e-15, 0.2])
    query = np.array([0, 0, 0, 1, 1, 2, 2])
    assert within_query_min_rank(scores, query).tolist() == [1, 0, 1, 0, 0, 0, 0]
    assert within_query_rank(scores, query).tolist() == [1, 0, 2, 0, 1, 1, 0]  # exactly k
    assert within_query_min_rank(np.zeros(0), np.zeros(0, dtype=int)).size == 0


def _duplicate_list(xquad_en: list[Pair]) -> tuple[str, list[str]]:
    """The issue's example: a Super Bowl 50 question, the same snippet twice in its list."""
    article = next(p for p in xquad_en if p.query.startswith("How old was Peyton Manning"))
    others = [p.text for p in xquad_en if p.query_id == article.query_id][:5]
    return article.query, [SUPER_BOWL, *others, SUPER_BOWL]


@pytest.fixture(scope="module")
def list_aware_scores(minilm_scorer: EmbeddingScorer, fit_pairs: list[Pair],
                      ) -> dict[str, Scorer]:
    first = [p for p in fit_pairs if p.query_id in sorted({q.query_id for q in fit_pairs})[:60]]
    out: dict[str, Scorer] = {f"relative:{k}": RelativeScorer(minilm_scorer, kind=k)
                              for k in RELATIVE_KINDS}
    out["bm25-list"] = ListBM25Scorer()
    for preset in ("base", "fast", "quality"):
        out[f"fused:{preset}"] = FusedScorer.fit(first, minilm_scorer, preset=preset)
    return out


@pytest.mark.parametrize("name", [*(f"relative:{k}" for k in RELATIVE_KINDS), "bm25-list",
                                  "fused:base", "fused:fast", "fused:quality"])
def test_equal_texts_in_one_list_get_equal_scores(name: str, list_aware_scores: dict[str, Scorer],
                                                  xquad_en: list[Pair]) -> None:
    """Issue 30's example scored 1.194 and 2.002 for one text twice in a list (the log-rank
    feature broke the tie by position); every list-aware score gives it one score now."""
    query, texts = _duplicate_list(xquad_en)
    scorer = list_aware_scores[name]
    assert scorer.tags.list_dependent
    scores = scorer.score_batch(query, texts)
    assert scores[0] == scores[-1], (name, scores)
    assert len(set(scores[1:-1].tolist())) > 1  # the others still differ


def test_equal_texts_get_equal_portable_scores(portable: FusedScorer, xquad_en: list[Pair]) -> None:
    query, texts = _duplicate_list(xquad_en)
    scores = portable.score_batch(query, texts)
    assert scores[0] == scores[-1]
