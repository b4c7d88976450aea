"""One contract suite for every registered scorer (in the spirit of MAPIE's test_common.py).

Every alias of :func:`ragsieve.scoring.registered_scorers` is put through the same checks,
with the real models: ``spec()`` rebuilds an equal scorer through ``resolve_scorer`` (the
same spec, the same scores); ``score_batch`` / ``score_items`` give finite floats, one per
snippet; the keep rule reads in the direction of the score; list-dependent scores change
when the list changes and the others do not; ``outside_field`` / ``vector_dim`` /
``scores_from_vectors`` agree with each other; the declared options match the factory's
keywords and defaults, and the CLI builds the scorer from them; the tags (``tags.thread_safe``,
``tags.model_free``) are bools that hold, and the service calls a scorer as its tags say.

The scorers that cannot score before calibration (``best``: unfitted, ``auto``: resolved
by calibrate) are checked for what they promise instead: a ``ScorerError`` that says what
to do, and (``best``) the fitted score once fitted, (``auto``) a scorer of the suite once
resolved. The LLM scorer runs on the real local model (Gemma 3 270M) on five snippets; the
rerank scorer on a real reranker on 127.0.0.1 (ragsieve's own service answering the rerank
API with every document's conformal p-value).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ragsieve import Pair
from ragsieve.errors import ScorerError
from ragsieve.scoring import (
    AutoScorer,
    CorpusBM25Scorer,
    FieldScorer,
    FusedScorer,
    IDFCoverageScorer,
    ListBM25Scorer,
    LLMScorer,
    RelativeScorer,
    RerankScorer,
    Scorer,
    ScorerTags,
    SentenceBM25Scorer,
    SentenceCosineScorer,
    registered_scorers,
    resolve_scorer,
    scorer_options,
)
from ragsieve.scoring.options import ScorerOption
from ragsieve.scoring.signals import DEFAULT_PRESET, preset_signals

QUERY = "Who wrote the novel War and Peace?"
SNIPPETS = [
    "War and Peace is a novel by the Russian author Leo Tolstoy.",
    "Tolstoy was born at Yasnaya Polyana in 1828.",
    "The Eiffel Tower stands on the Champ de Mars in Paris.",
    "Photosynthesis converts light into chemical energy.",
    "War and Peace was first published in full in 1869.",
]
VALUES = [0.9, 0.6, 0.1, 0.05, 0.7]  # an outside score (higher = more relevant)

#: Labelled pairs to fit the fused score on: six queries, a relevant snippet each.
_TRAIN = [
    ("Who painted the Mona Lisa?", ["Leonardo da Vinci painted the Mona Lisa.",
                                    "The Louvre is a museum in Paris.",
                                    "Bananas are rich in potassium."]),
    ("What is the capital of Japan?", ["Tokyo is the capital of Japan.",
                                       "Mount Fuji is the highest mountain in Japan.",
                                       "The Nile flows through Egypt."]),
    ("How many legs does a spider have?", ["A spider has eight legs.",
                                           "Insects have six legs.",
                                           "The violin has four strings."]),
    ("Which planet is known as the Red Planet?", ["Mars is called the Red Planet.",
                                                  "Jupiter is the largest planet.",
                                                  "Bread is baked in an oven."]),
    ("Who discovered penicillin?", ["Alexander Fleming discovered penicillin in 1928.",
                                    "Antibiotics treat bacterial infections.",
                                    "The Amazon is a river in South America."]),
    ("What is the boiling point of water?", ["Water boils at 100 degrees Celsius at sea level.",
                                             "Ice melts at 0 degrees Celsius.",
                                             "Chess is played on a board of 64 squares."]),
]
TRAIN = [Pair(f"t{q}", query, f"t{q}-{s}", text, relevant=s == 0)
         for q, (query, texts) in enumerate(_TRAIN) for s, text in enumerate(texts)]

#: Registered aliases the scoring checks leave out, and why (they are checked below).
NOT_SCORABLE = {
    "best": "the fused score before its weights are fitted: fitted, it is 'fusion'",
    "auto": "stands for the default until calibrate resolves it to 'fusion' or 'embedding'",
}


def _items() -> list[dict[str, Any]]:
    return [{"text": t, "bm25": v} for t, v in zip(SNIPPETS, VALUES, strict=True)]


def _scores(scorer: Scorer, items: list[dict[str, Any]]) -> np.ndarray:
    return np.asarray(scorer.score_items(QUERY, items), dtype=np.float64)


def _own_units(scorer: Scorer, items: list[dict[str, Any]]) -> np.ndarray:
    """The values the keep rule compares: the outside score as given, else the score."""
    field = scorer.outside_field()
    if field is not None:
        return np.array([float(item[field]) for item in items])
    return _scores(scorer, items)


@pytest.fixture(scope="module")
def fused(minilm_scorer: Scorer) -> FusedScorer:
    """The fused score of the base alone (the format of earlier versions)."""
    return FusedScorer.fit(TRAIN, base=minilm_scorer)


@pytest.fixture(scope="module")
def fused_quality(minilm_scorer: Scorer) -> FusedScorer:
    """Every bundled English signal (MiniLM, USE, e5, in-list BM25, best sentence), logistic."""
    return FusedScorer.fit(TRAIN, base=minilm_scorer, preset="quality", learner="logistic")


@pytest.fixture(scope="module")
def fused_boosted(minilm_scorer: Scorer, xquad_en: list[Pair]) -> FusedScorer:
    """The fast preset's signals under boosted trees, fitted on 40 XQuAD questions (the
    trees need more pairs than TRAIN has to split at all)."""
    qids = sorted({p.query_id for p in xquad_en})[:40]
    pairs = [p for p in xquad_en if p.query_id in set(qids)]
    return FusedScorer.fit(pairs, base=minilm_scorer, preset="fast", learner="boosted")


@pytest.fixture(scope="module")
def fused_portable(minilm_scorer: Scorer) -> FusedScorer:
    """The list-free preset: MiniLM's cosine, the BM25 of TRAIN's texts frozen, the best
    sentence's cosine, each its own score only."""
    return FusedScorer.fit(TRAIN, base=minilm_scorer, preset="portable")


@pytest.fixture(scope="module")
def sentence_context(fused: FusedScorer) -> Scorer:
    """The sentence-in-context score of the sentence unit, both stages the fused score, its
    two weights fitted on TRAIN (texts without a snippet: each is its own)."""
    from ragsieve.scoring.sentence_context import SentenceContextScorer

    return SentenceContextScorer(fused, fused).fitted_on(TRAIN)


@pytest.fixture(scope="module")
def reader() -> Scorer:
    """The reader fine-tuned for real on TRAIN (nine pairs: seconds)."""
    pytest.importorskip("torch")
    from ragsieve.scoring import ReaderScorer

    return ReaderScorer().fitted_on(TRAIN, seed=0)


@pytest.fixture()
def llm(llm_connection: Any) -> LLMScorer:
    return LLMScorer(llm_connection)


@pytest.fixture(scope="module")
def reranker_url(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair],
                 embedding_cache_dir: Path) -> Iterator[str]:
    """A real reranker on 127.0.0.1: ragsieve's service of a MiniLM filter, whose
    ``/all/v1/rerank`` answers every document with its conformal p-value."""
    from servers import ThreadServer

    from ragsieve import ConformalFilter
    from ragsieve.scoring import EmbeddingScorer
    from ragsieve.server import create_app

    root = tmp_path_factory.mktemp("reranker")
    ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(
        xquad_en[:300]).save(root / "filter.json")
    app = create_app(root / "filter.json", scorer_options={"cache_dir": embedding_cache_dir},
                     state_dir=root / "state")
    with ThreadServer(app) as server:
        yield f"{server.url}/all"


BUILDERS: dict[str, Callable[[pytest.FixtureRequest], Scorer]] = {
    "embedding": lambda r: r.getfixturevalue("minilm_scorer"),
    "relative:gap": lambda r: RelativeScorer(r.getfixturevalue("minilm_scorer"), kind="gap"),
    "relative:z": lambda r: RelativeScorer(r.getfixturevalue("minilm_scorer"), kind="z"),
    "relative:rank": lambda r: RelativeScorer(r.getfixturevalue("minilm_scorer"), kind="rank"),
    "relative:ratio": lambda r: RelativeScorer(r.getfixturevalue("minilm_scorer"), kind="ratio"),
    "fusion": lambda r: r.getfixturevalue("fused"),
    "fusion:quality": lambda r: r.getfixturevalue("fused_quality"),
    "fusion:boosted": lambda r: r.getfixturevalue("fused_boosted"),
    "fusion:portable": lambda r: r.getfixturevalue("fused_portable"),
    "bm25-list": lambda r: ListBM25Scorer(),
    "bm25-corpus": lambda r: CorpusBM25Scorer().fitted_on_texts([p.text for p in TRAIN]),
    "idf-cov": lambda r: IDFCoverageScorer().fitted_on_texts([p.text for p in TRAIN]),
    "sent-bm25": lambda r: SentenceBM25Scorer().fitted_on_texts([p.text for p in TRAIN]),
    "sentence-cos": lambda r: SentenceCosineScorer(
        "minilm", cache_dir=r.getfixturevalue("embedding_cache_dir")),
    "field": lambda r: FieldScorer("bm25"),
    "field:higher": lambda r: FieldScorer("bm25", higher_is_better=True),
    "llm": lambda r: r.getfixturevalue("llm"),
    "sentence_context": lambda r: r.getfixturevalue("sentence_context"),
    "reader": lambda r: r.getfixturevalue("reader"),
    "rerank": lambda r: RerankScorer(url=r.getfixturevalue("reranker_url"), cache=False),
}
"""Every scorable registered alias (the key up to ``:``), in each of its shapes."""


@pytest.fixture(params=sorted(BUILDERS))
def scorer(request: pytest.FixtureRequest) -> Scorer:
    return BUILDERS[request.param](request)


def _rebuild_options(scorer: Scorer, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Options that do not change scores, as a saved filter's scorer is rebuilt with."""
    if scorer.name == "llm":
        server = request.getfixturevalue("local_llm")
        return {"base_url": server.base_url, "style": server.prompt_style, "cache": False}
    if scorer.name == "rerank":  # the endpoint is given where the filter is applied
        return {"url": request.getfixturevalue("reranker_url"), "cache": False}
    runtime = {o.name for o in scorer_options(scorer.spec()["scorer"]) if o.runtime}
    if "cache_dir" in runtime:  # the embedding-based scores (not the in-list BM25)
        return {"cache_dir": request.getfixturevalue("embedding_cache_dir")}
    return {}


def test_every_registered_scorer_is_in_the_suite() -> None:
    covered = {key.split(":")[0] for key in BUILDERS} | set(NOT_SCORABLE)
    assert set(registered_scorers()) == covered


def test_spec_round_trips_to_an_equal_scorer(scorer: Scorer,
                                             request: pytest.FixtureRequest) -> None:
    spec = scorer.spec()
    assert spec["scorer"] in registered_scorers()
    again = resolve_scorer(spec, **_rebuild_options(scorer, request))
    assert type(again) is type(scorer)
    assert again.spec() == spec
    if scorer.name != "llm":  # the LLM's replies are compared in its own tests
        np.testing.assert_allclose(_scores(again, _items()), _scores(scorer, _items()),
                                   rtol=1e-6, atol=1e-6)


def test_scores_are_finite_floats_one_per_snippet(scorer: Scorer) -> None:
    scores = _scores(scorer, _items())
    assert scores.shape == (len(SNIPPETS),) and scores.dtype == np.float64
    assert np.isfinite(scores).all()
    if scorer.tags.reads_text:
        np.testing.assert_allclose(
            np.asarray(scorer.score_batch(QUERY, SNIPPETS), dtype=np.float64), scores)
    pairs = [Pair("q", QUERY, f"s{i}", item["text"], meta={"bm25": item["bm25"]})
             for i, item in enumerate(_items())]
    np.testing.assert_allclose(scorer.score_pairs(pairs), scores, rtol=1e-6, atol=1e-6)


def test_keep_rule_reads_in_the_direction_of_the_score(scorer: Scorer) -> None:
    items = _items()
    scores, units = _scores(scorer, items), _own_units(scorer, items)
    for tau in np.unique(scores):
        rule = scorer.keep_rule(float(tau))
        assert rule.keep_if in ("<=", ">=") and rule.score
        kept = units >= rule.threshold if rule.keep_if == ">=" else units <= rule.threshold
        np.testing.assert_array_equal(kept, scores <= tau)
    assert scorer.keep_rule(float("inf")).to_dict()["threshold"] is None


def test_list_dependent_scores_change_with_the_list(scorer: Scorer) -> None:
    items = _items()
    whole = _scores(scorer, items)
    best = int(np.argmin(whole))
    rest = [i for i in range(len(items)) if i != best]
    without_best = _scores(scorer, [items[i] for i in rest])
    if scorer.tags.list_dependent:
        assert not np.allclose(without_best, whole[rest])
    else:
        np.testing.assert_allclose(without_best, whole[rest], rtol=1e-6, atol=1e-6)


def test_outside_field_and_vectors_agree(scorer: Scorer) -> None:
    field, dim = scorer.outside_field(), scorer.vector_dim()
    assert (field is None) == scorer.tags.reads_text
    if field is not None:
        assert field == "bm25" and dim is None
    if dim is None:
        assert scorer.embedding_model() is None
        with pytest.raises(TypeError, match="cannot score from vectors"):
            scorer.scores_from_vectors(np.ones(4), np.ones((2, 4)))
        return
    model = scorer.embedding_model()  # vectors only from an embedding model's cosine
    assert model is not None and model is (scorer.base_scorer() or scorer).model  # type: ignore[attr-defined]
    assert dim == model.dim
    q = model.embed_queries([QUERY])[0]
    s = model.embed_batch(SNIPPETS)
    np.testing.assert_allclose(scorer.scores_from_vectors(q, s), _scores(scorer, _items()),
                               rtol=1e-5, atol=1e-5)


def test_base_scorer_and_with_base(scorer: Scorer, minilm_scorer: Scorer) -> None:
    base = scorer.base_scorer()
    if base is None:
        with pytest.raises(TypeError, match="no base scorer"):
            scorer.with_base(minilm_scorer)
        return
    if scorer.vector_dim() is None and base.vector_dim() is not None:
        # more than a transform of the base's cosine (a fused score of several signals):
        # it cannot be computed from the base's numbers, and says so
        for attempt in (lambda: scorer.with_base(base), lambda: scorer.scores_from_base(np.zeros(3))):
            with pytest.raises(TypeError, match="cannot"):
                attempt()
        return
    again = scorer.with_base(base)
    assert type(again) is type(scorer) and again.spec() == scorer.spec()
    np.testing.assert_allclose(_scores(again, _items()), _scores(scorer, _items()), atol=1e-12)


def test_capabilities_are_consistent(scorer: Scorer) -> None:
    root = scorer.root_scorer()
    assert root.base_scorer() is None
    assert root is scorer or scorer.base_scorer() is not None
    fresh = scorer.unfitted_copy()
    assert isinstance(fresh, Scorer) and type(fresh) is type(scorer)
    # learned weights, statistics: an unfitted copy
    if scorer.name not in ("fusion", "bm25-corpus", "idf-cov", "sent-bm25", "reader"):
        assert fresh is scorer
    else:
        assert not fresh.is_fitted
    assert scorer.tags.costly == (scorer.name in ("llm", "rerank"))  # a model call per snippet
    if scorer.base_scorer() is None:
        with pytest.raises(TypeError, match="not computed from a base scorer"):
            scorer.scores_from_base(np.zeros(3))
    assert not scorer.tags.resolved_at_calibration  # only the "auto" stand-in is


#: The service's behaviour before scorers carried tags (its lists of scorer names): the
#: tags reproduce it.
THREAD_SAFE = {"embedding", "field", "rerank"}  # rerank: an HTTP client, a locked cache
MODEL_FREE = {"field"}


def test_tags_are_typed_and_hold(scorer: Scorer) -> None:
    for tag in ("thread_safe", "model_free"):
        value = getattr(type(scorer).tags, tag)
        assert isinstance(value, bool), f"{tag} is {value!r}, expected a bool"
        assert getattr(scorer.tags, tag) is value  # a class tag: the same for every instance
    alias = scorer.spec()["scorer"]
    assert scorer.tags.thread_safe == (alias in THREAD_SAFE)
    assert scorer.tags.model_free == (alias in MODEL_FREE)
    if scorer.tags.model_free:  # no model: no vectors of one, no embedding model to share
        assert scorer.vector_dim() is None and scorer.embedding_model() is None
    if scorer.tags.thread_safe:  # several threads at once give the scores one thread gives
        alone = _scores(scorer, _items())
        with ThreadPoolExecutor(max_workers=4) as pool:
            together = list(pool.map(lambda _: _scores(scorer, _items()), range(16)))
        for scores in together:
            np.testing.assert_array_equal(scores, alone)


class _Toy(Scorer):
    """A score that calls no model: the word count of the snippet. Two requests score it
    at once only when the service calls it without a lock (the barrier needs both)."""

    name = "toy-tagged"
    barrier: ClassVar[threading.Barrier | None] = None
    calls: ClassVar[list[str]] = []

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        self.calls.append(query)
        if query == "together" and self.barrier is not None:
            self.barrier.wait()
        return np.array([float(len(s.split())) for s in snippets])

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name}


class _ThreadSafeToy(_Toy):
    name = "toy-thread-safe"
    tags = ScorerTags(thread_safe=True, model_free=True)


@pytest.mark.parametrize("cls", [_Toy, _ThreadSafeToy], ids=lambda c: c.name)
def test_the_service_reads_the_tags(cls: type[_Toy], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A new scorer's tags decide how the service calls it, with nothing edited in the
    server: warmed up unless model-free, scored at once by two requests when thread-safe."""
    from fastapi.testclient import TestClient

    from ragsieve import ConformalFilter
    from ragsieve.scoring import register_scorer, registry
    from ragsieve.server import create_app
    from ragsieve.server.schemas import FilterRequest

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_OPTIONS", dict(registry._OPTIONS))
    register_scorer(cls.name, cls)
    monkeypatch.setattr(cls, "calls", [])
    path = tmp_path / "toy.json"
    ConformalFilter(cls(), alpha=0.2).calibrate(TRAIN).save(path)
    app = create_app(path, warmup=True, state_dir=tmp_path / "state")
    with TestClient(app):
        service = app.state.runtime.current
        assert service.uses_model == (not cls.tags.model_free)
        assert ("warm-up" in cls.calls) == (not cls.tags.model_free)
        assert isinstance(service.lock, nullcontext) == cls.tags.thread_safe
        if cls.tags.thread_safe:
            monkeypatch.setattr(cls, "barrier", threading.Barrier(2, timeout=30))
            request = FilterRequest(query="together", snippets=SNIPPETS)
            with ThreadPoolExecutor(max_workers=2) as pool:
                answers = list(pool.map(lambda _: service.run_filter(request), range(2)))
            assert answers[0].kept == answers[1].kept


def test_unfitted_fused_score_asks_to_be_fitted(minilm_scorer: Scorer) -> None:
    best = resolve_scorer("best", base=minilm_scorer)
    assert not best.is_fitted and best.tags.list_dependent
    assert resolve_scorer(best.spec(), cache_dir=minilm_scorer.cache_dir).spec() == best.spec()  # type: ignore[attr-defined]
    with pytest.raises(ScorerError, match="calibrate it first"):
        best.score_batch(QUERY, SNIPPETS)
    assert best.spec()["preset"] == DEFAULT_PRESET  # type: ignore[attr-defined]
    fitted = best.fitted_on(TRAIN)  # type: ignore[attr-defined]
    assert fitted.is_fitted
    assert fitted.spec() == FusedScorer.fit(TRAIN, minilm_scorer, preset=DEFAULT_PRESET).spec()
    assert fitted.spec()["signals"] == [s.spec() for s in preset_signals(minilm_scorer, DEFAULT_PRESET)]
    again = fitted.unfitted_copy()  # refitted where it is used (each evaluate fold)
    assert not again.is_fitted and again.base_scorer() is fitted.base_scorer()
    assert str(best.keep_rule(0.5)) == "keep fused score <= 0.5"


def test_auto_resolves_to_a_scorer_of_the_suite(embedding_cache_dir: Path) -> None:
    auto = resolve_scorer("auto", model="minilm", language="en", cache_dir=embedding_cache_dir)
    assert isinstance(auto, AutoScorer) and auto.is_fitted and auto.tags.resolved_at_calibration
    assert resolve_scorer(auto.spec()).spec() == auto.spec()
    with pytest.raises(ScorerError, match="calibrate it first"):
        auto.score_batch(QUERY, SNIPPETS)
    resolved, choice, (language, _source) = auto.resolve(TRAIN)
    assert language == "en" and choice.alias in ("best", "embedding")
    assert resolved.spec()["scorer"] in ("best", "embedding")


# ------------------------------------------------------------------ declared options
def _signature_defaults(alias: str) -> dict[str, Any]:
    """Keyword defaults of the factory of ``alias``, and of where its ``**kwargs`` go (the
    LLM connection's keywords and the fields of the values it packs its ``**settings``
    into; the rerank client's call settings, a value's fields; the embedding scorer's)."""
    from ragsieve.llm import connect
    from ragsieve.llm.client import LLM_CALLS
    from ragsieve.llm.local import LocalRuntime
    from ragsieve.rerank.client import RERANK_CALLS
    from ragsieve.scoring import EmbeddingScorer, _lookup

    out: dict[str, Any] = {}
    targets = [_lookup(alias)]
    params = inspect.signature(targets[0]).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params) and alias == "rerank":
        out.update(asdict(RERANK_CALLS))
    elif any(p.kind is p.VAR_KEYWORD for p in params) and alias == "llm":
        out.update({**asdict(LLM_CALLS), **asdict(LocalRuntime())})
        targets.append(connect)
    elif any(p.kind is p.VAR_KEYWORD for p in params):
        targets.append(EmbeddingScorer)
    for target in reversed(targets):
        for p in inspect.signature(target).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                out[p.name] = p.default
    return out


def _reaches_the_factory(alias: str, option: ScorerOption, defaults: dict[str, Any]) -> None:
    """Assert that ``option`` reaches the factory of ``alias`` with its default: as a keyword
    of it, or as a field of the value it declares (its ``pack``), which takes it (an option
    the value does not know raises) and at its default makes the value the factory has
    when the option is not given."""
    if option.pack is not None:
        assert option.pack.keyword in defaults, f"{alias}: {option.pack.keyword!r} is not a keyword"
        at_default = option.pack.build(None, {option.name: option.default})
        assert at_default == option.pack.build(None, {}), f"{alias}: {option.name!r} default"
        return
    assert option.name in defaults, f"{alias}: {option.name!r} is not a keyword"
    assert option.default == defaults[option.name], f"{alias}: {option.name!r} default"


@pytest.mark.parametrize("alias", registered_scorers())
def test_declared_options_are_the_factory_keywords(alias: str) -> None:
    options = scorer_options(alias)
    defaults = _signature_defaults(alias)
    assert options, f"scorer {alias!r} declares no options"
    for option in options:
        _reaches_the_factory(alias, option, defaults)
        assert option.flag is None or option.flag.startswith("--")
        if option.choices is not None and option.default is not None:
            assert option.default in option.choices


@pytest.mark.parametrize("alias", ["best", "auto"])
def test_an_option_declared_and_not_taken_fails_the_check(alias: str) -> None:
    """The check above holds for packed options too: one the factory does not take fails."""
    defaults = _signature_defaults(alias)
    packed = next(o for o in scorer_options(alias) if o.pack is not None)
    for stray in (replace(packed, name="rerank_colour", default="blue"),
                  replace(packed, pack=replace(packed.pack, keyword="reranker")),
                  replace(packed, pack=None),
                  replace(packed, name="rerank_timeout", default=5.0)):
        with pytest.raises((AssertionError, TypeError, ValueError)):
            _reaches_the_factory(alias, stray, defaults)


def test_the_cli_offers_every_declared_flag_and_builds_through_them() -> None:
    from ragsieve.cli import build_parser
    from ragsieve.cli.scorers import ScorerRequest, make_scorer

    parser = build_parser()
    args = parser.parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json"])
    for alias in registered_scorers():
        for option in scorer_options(alias):
            if option.flag is not None:
                assert hasattr(args, str(option.dest)), f"{alias}: {option.flag}"
    cases = {
        ("--scorer", "relative", "--relative-kind", "z"): {"scorer": "relative", "kind": "z"},
        ("--scorer", "field", "--score-field", "bm25", "--higher-is-better"):
            FieldScorer("bm25", higher_is_better=True).spec(),
        ("--scorer", "embedding", "--model", "minilm"): {"scorer": "embedding",
                                                         "model": "all-MiniLM-L6-v2"},
    }
    for flags, expected in cases.items():
        args = parser.parse_args(["calibrate", "--data", "x.jsonl", "--out", "f.json",
                                  "--no-cache", "--language", "en", *flags])
        spec = make_scorer(ScorerRequest.from_args(args)).spec()
        assert {k: spec[k] for k in expected} == expected
