"""A sentence-unit filter served over HTTP (a real uvicorn server on a loopback port).

``POST /filter`` answers, per kept snippet, its kept sentences' spans and its pruned text,
exactly as the library's ``filter`` does; the exchangeability monitor ranks each request's
*sentence* scores (what the artifact's reference was calibrated on). The paths that learn
from ``/feedback`` labels (``--adaptive``, ``recalibrate``) and ``/query`` from an index
refuse a sentence artifact with an error that says why: labels and stored vectors name
snippets, the threshold is over evidence sentences.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from servers import ThreadServer

from ragsieve import ArtifactError, ConformalFilter, Pair
from ragsieve.calibration import make_calibrator
from ragsieve.server import create_app


def _articles(xquad_en: list[Pair], n: int) -> list[Pair]:
    chosen = set(sorted({p.group for p in xquad_en})[:n])
    return [p for p in xquad_en if p.group in chosen]


@pytest.fixture(scope="module")
def reference(sentence_artifact: Path, embedding_cache_dir: Path) -> ConformalFilter:
    return ConformalFilter.load(sentence_artifact,
                                scorer_options={"cache_dir": embedding_cache_dir})


@pytest.fixture(scope="module")
def served(sentence_artifact: Path, embedding_cache_dir: Path) -> Iterator[httpx.Client]:
    app = create_app(sentence_artifact, scorer_options={"cache_dir": embedding_cache_dir})
    with ThreadServer(app) as srv, httpx.Client(base_url=srv.url, timeout=120) as client:
        yield client


def _requests(xquad_en: list[Pair], n: int) -> list[tuple[str, list[str]]]:
    """``n`` queries of articles the filter was not calibrated on (the 9th to 20th, which
    tests/test_sentence_filter.py embeds too), with their lists."""
    held = [p for p in _articles(xquad_en, 20) if p.group not in
            {q.group for q in _articles(xquad_en, 8)}]
    queries: dict[str, tuple[str, list[str]]] = {}
    for p in held:
        queries.setdefault(p.query_id, (p.query, []))[1].append(p.text)
    return list(queries.values())[:n]


def test_filter_returns_kept_sentences_as_the_library_does(  # type: ignore[no-untyped-def]
        served: httpx.Client, reference: ConformalFilter, xquad_en) -> None:
    health = served.get("/healthz").json()
    assert health["artifact"]["unit"] == "sentence"
    monitor = reference.monitor_reference is not None
    assert monitor and health["monitor"]["n_observed"] == 0
    requests = _requests(xquad_en, 6)
    for query, texts in requests:
        body = served.post("/filter", json={"query": query, "snippets": texts}).json()
        expected = reference.filter(query, texts)
        assert body["unit"] == "sentence" and body["n_cut"] == 0
        assert [k["index"] for k in body["kept"]] == [k.index for k in expected.kept]
        for got, want in zip(body["kept"], expected.kept, strict=True):
            assert [tuple(span) for span in got["spans"]] == list(want.spans)
            assert got["pruned_text"] == want.pruned_text
            assert got["pruned_text"] == " ".join(got["text"][a:b] for a, b in got["spans"])
            assert got["score"] == pytest.approx(want.score, abs=1e-9)
        assert [r["index"] for r in body["removed"]] == [r.index for r in expected.removed]
        assert body["scores"] == pytest.approx(list(expected.scores), abs=1e-9)
    # the monitor ranked each request's sentence scores against the sentence reference
    from ragsieve.monitoring import ExchangeabilityMonitor

    after = served.get("/healthz").json()["monitor"]
    assert after["n_observed"] == len(requests)
    own = ExchangeabilityMonitor.from_artifact(reference.to_artifact(), delta=after["delta"])
    assert own is not None
    for query, texts in requests:
        state = own.observe(np.array([s[3] for s in reference.filter(query, texts).sentences]))
    assert after["log10_martingale"] == pytest.approx(state.log10_martingale, abs=1e-9)


def test_a_blank_snippet_is_removed_with_no_score(served: httpx.Client) -> None:
    body = served.post("/filter", json={"query": "Who built it?",
                                        "snippets": ["   ", "Eiffel built it. It is tall."]})
    assert body.status_code == 200, body.text
    assert body.json()["scores"][0] is None and body.json()["removed"][0]["index"] == 0


def test_vectors_are_refused_for_a_sentence_filter(served: httpx.Client) -> None:
    r = served.post("/filter", json={"query": "q", "query_vector": [1.0, 0.0],
                                     "snippets": [{"text": "a.", "vector": [1.0, 0.0]}]})
    assert r.status_code == 422


def test_adaptive_index_and_recalibrate_refuse_a_sentence_artifact(  # type: ignore[no-untyped-def]
        sentence_artifact: Path, reference: ConformalFilter, xquad_en, tmp_path: Path,
        embedding_cache_dir: Path) -> None:
    from ragsieve.artifact import Artifact
    from ragsieve.server.recalibrate import recalibrate

    options = {"cache_dir": embedding_cache_dir}
    adaptive = ConformalFilter(reference.scorer, make_calibrator("adaptive", alpha=0.2),
                               unit="sentence")
    path = adaptive.calibrate(_articles(xquad_en, 2)).save(tmp_path / "adaptive.json")
    with pytest.raises(ArtifactError, match="--adaptive cannot serve .* unit 'sentence'.*"
                                            "labels name snippets"):
        create_app(path, adaptive=True, scorer_options=options, warmup=False)
    (tmp_path / "index").mkdir()
    with pytest.raises(ArtifactError, match="unit is 'sentence'.*without --index"):
        create_app(sentence_artifact, index_path=tmp_path / "index", scorer_options=options,
                   warmup=False)
    with pytest.raises(ValueError, match="cannot recalibrate a filter of unit 'sentence'"):
        recalibrate(Artifact.read(sentence_artifact), tmp_path / "feedback.sqlite",
                    scorer_options=options)
