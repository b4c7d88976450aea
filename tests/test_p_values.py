"""The conformal p-value on every surface: the unit a person can read beside any score.

``p = (1 + #{relevant calibration scores >= s}) / (n + 1)``; in the marginal mode a snippet
is kept exactly when ``p > alpha``; the other modes show it as an evidence percentile. It
reaches the result objects, the artifact (sealed), ``filter`` (text and ``--json``), the
service's ``/filter`` and the framework components' metadata.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from servers import serving

from ragsieve import ConformalFilter
from ragsieve.calibration import SplitConformalCalibrator, make_calibrator
from ragsieve.calibration.p_values import EvidenceScores, marginal_keeps
from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs
from ragsieve.errors import ArtifactError
from ragsieve.scoring import FieldScorer


# ----------------------------------------------------------------------------- the formula
@pytest.mark.parametrize("n", [1, 8, 9, 19, 99, 100, 257])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.3, 0.5])
def test_marginal_rule_is_p_above_alpha(n: int, alpha: float) -> None:
    """``s <= tau`` and ``p > alpha`` keep the same snippets, ties and (n+1)alpha integers
    included (n = 9, 19, 99 at alpha 0.1, 0.05 ...)."""
    rng = np.random.default_rng(n)
    cal = np.round(rng.normal(size=n), 1)  # many ties
    cal_fit = SplitConformalCalibrator(alpha=alpha).fit(cal)
    evidence = EvidenceScores.of_calibrator(cal_fit)
    assert evidence is not None and evidence.n == n
    new = np.concatenate([cal, np.round(rng.normal(size=500), 1), [-9.0, 9.0]])
    p = evidence.p_values(new)
    assert np.array_equal(marginal_keeps(p, alpha, n), cal_fit.predict(new))
    counts = [(1 + np.sum(cal >= s)) / (n + 1) for s in new]  # the definition, by hand
    assert np.allclose(p, counts)


def test_relevant_p_values_are_super_uniform() -> None:
    """Exchangeable relevant scores: P(p <= a) <= a (up to sampling noise)."""
    rng = np.random.default_rng(0)
    cal = rng.normal(size=200)
    p = EvidenceScores.of(cal).p_values(rng.normal(size=20_000))
    for a in (0.05, 0.1, 0.2, 0.5):
        assert np.mean(p <= a) <= a + 0.01


def test_evidence_takes_relevant_scores_only_and_subsamples_beyond_the_cap() -> None:
    ev = EvidenceScores.of([0.1, 5.0, 0.3], [1, 0, 1])
    assert ev.scores.tolist() == [0.1, 0.3] and ev.n_relevant == 2
    big = EvidenceScores.of(np.arange(50.0), seed=3, max_scores=10)
    assert big.n == 10 and big.n_relevant == 50 and np.all(np.diff(big.scores) >= 0)
    with pytest.raises(ValueError, match="no relevant calibration score"):
        EvidenceScores.of([0.1, 0.2], [0, 0])
    with pytest.raises(ArtifactError, match="expected the keys"):
        EvidenceScores.from_dict({"scores": [0.1]})
    with pytest.raises(ArtifactError, match="sorted"):
        EvidenceScores.from_dict({"scores": [0.3, 0.1], "n_relevant": 2, "seed": 0})


# ----------------------------------------------------------------------------- the filter
@pytest.fixture(scope="module")
def cal_pairs(xquad_en: Any) -> list[Any]:
    groups = sorted({p.group for p in xquad_en})[:10]
    return [p for p in xquad_en if p.group in groups]


@pytest.fixture(scope="module")
def test_pairs(xquad_en: Any) -> list[Any]:
    groups = sorted({p.group for p in xquad_en})[-3:]
    return [p for p in xquad_en if p.group in groups][:300]


@pytest.mark.parametrize("mode", ["marginal", "query-all"])
def test_filter_results_carry_p_values_through_the_artifact(
        mode: str, cal_pairs: list[Any], test_pairs: list[Any], minilm_scorer: Any,
        tmp_path: Path) -> None:
    flt = ConformalFilter(minilm_scorer, make_calibrator(mode, alpha=0.2)).calibrate(cal_pairs)
    results = flt.filter_pairs(test_pairs)
    kept = [s for r in results.values() for s in r.kept]
    removed = [s for r in results.values() for s in r.removed]
    assert kept and removed
    for r in results.values():
        assert len(r.p_values) == r.n_input
        assert np.allclose(r.p_values, flt.evidence.p_values(r.scores))
        assert {s.index: s.p_value for s in (*r.kept, *r.removed)} == dict(enumerate(r.p_values))
    if mode == "marginal":  # kept exactly when p > alpha
        assert min(s.p_value for s in kept) > 0.2 >= max(s.p_value for s in removed)
        assert flt.evidence.n == flt.calibrator_.n_calibration_
    else:  # the evidence percentile: the relevant calibration snippets' scores
        relevant = [p for p in cal_pairs if p.relevant == 1]
        assert flt.evidence.n == len(relevant)
    data = flt.to_dict()
    assert ("evidence" in data) is (mode != "marginal")  # marginal: its state holds them
    again = ConformalFilter.from_dict(data, scorer=minilm_scorer).filter_pairs(test_pairs)
    assert [r.p_values for r in again.values()] == [r.p_values for r in results.values()]
    if mode != "marginal":  # the block is sealed: an edit is refused
        data["evidence"]["scores"][0] -= 1.0
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            ConformalFilter.from_dict(data)


def test_sentence_unit_has_a_p_value_per_sentence(sentence_artifact: Path,
                                                  test_pairs: list[Any]) -> None:
    flt = ConformalFilter.load(sentence_artifact)
    res = flt.filter(test_pairs[0].query, [p.text for p in test_pairs[:6]])
    assert len(res.sentence_p_values) == len(res.sentences) > 0
    for (_, _, _, score, kept), p in zip(res.sentences, res.sentence_p_values, strict=True):
        assert p == flt.evidence.p_value(score)
        assert kept is bool(p > 0.2)  # marginal, alpha 0.2


# ----------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def bm25_like(cal_pairs: list[Any], test_pairs: list[Any],
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Pairs with a higher-is-better outside score (a word-overlap count, BM25-like)."""
    def with_score(pairs: list[Any]) -> list[Any]:
        out = []
        for p in pairs:
            words = set(p.query.lower().split())
            overlap = sum(w in words for w in p.text.lower().split()) / 10.0
            out.append(dataclasses.replace(p, meta={**p.meta, "overlap": overlap}))
        return out

    root = tmp_path_factory.mktemp("p-values")
    write_pairs(with_score(cal_pairs), root / "cal.jsonl")
    write_pairs(with_score(test_pairs), root / "test.jsonl")
    return root / "cal.jsonl", root / "test.jsonl"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_cli_prints_thresholds_in_the_scores_direction_and_p_values(
        bm25_like: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal, test = bm25_like
    out = tmp_path / "f.json"
    printed = _run(["-q", "calibrate", "--data", str(cal), "--scorer", "field",
                    "--score-field", "overlap",
                    "--higher-is-better", "--alpha", "0.2", "--out", str(out), "--no-expected"],
                   capsys)
    flt = ConformalFilter.load(out)
    assert flt.threshold < 0  # stored negated, printed in the score's own direction
    rule = flt.scorer_.keep_rule(flt.threshold)
    assert f"tau={rule.threshold:.4f}" in printed and f"tau={flt.threshold:.4f}" not in printed
    assert "keep overlap >= " in printed

    text = _run(["-q", "filter", "--filter", str(out), "--data", str(test), "--show-removed"],
                capsys)
    assert "p-value: the share of calibration evidence that scored no better; kept exactly " \
           "when p > 0.2" in text
    kept_p = [float(w[2:]) for line in text.splitlines() if not line.strip().startswith(
        "removed") for w in line.split() if w.startswith("p=")]
    removed_p = [float(w[2:]) for line in text.splitlines() if line.strip().startswith(
        "removed") for w in line.split() if w.startswith("p=")]
    assert kept_p and removed_p and min(kept_p) > 0.2 >= max(removed_p)
    assert f"rule >= {rule.threshold:.4f}" in text and "-" + f"{rule.threshold:.4f}" not in text
    # labelled data: coverage and removal, counted here the same way
    pairs = [json.loads(line) for line in test.read_text().splitlines()]
    results = flt.filter_pairs(read_pairs(test))
    relevant = {(p["query_id"], p["snippet_id"]) for p in pairs if p["relevant"] == 1}
    hits = sum((q, s) in relevant for q, r in results.items() for s in r.kept_ids)
    assert (f"on the labels in the data: coverage {hits / len(relevant):.3f} (kept {hits} of "
            f"{len(relevant)} relevant snippets)") in text

    lines = _run(["-q", "filter", "--filter", str(out), "--data", str(test), "--json"], capsys)
    records = [json.loads(line) for line in lines.splitlines()]
    assert all(len(r["p_values"]) == len(r["kept"]) for r in records)
    assert all(r["keep_if"] == ">=" and r["score_name"] == "overlap" for r in records)
    finite = [r["threshold"] for r in records if r["threshold"] is not None]
    assert finite and all(t == pytest.approx(rule.threshold) for t in finite)
    assert all(s >= rule.threshold - 1e-12 for r in records for s in r["scores"])
    assert all(x["p_value"] <= 0.2 for r in records for x in r["removed"])


def test_filter_on_unlabelled_data_prints_no_coverage(
        bm25_like: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal, test = bm25_like
    out = tmp_path / "f.json"
    ConformalFilter(FieldScorer("overlap", higher_is_better=True), alpha=0.2).calibrate(
        read_pairs(cal)).save(out)
    rows = [json.loads(line) for line in test.read_text().splitlines()]
    unlabelled = tmp_path / "u.jsonl"
    unlabelled.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "relevant"})
                                  + "\n" for r in rows))
    text = _run(["-q", "filter", "--filter", str(out), "--data", str(unlabelled)], capsys)
    assert "p=" in text and "on the labels in the data" not in text


# ----------------------------------------------------------------------------- the service
def test_service_filter_returns_p_values(served_artifact: Any, xquad_en: Any) -> None:
    path = served_artifact(make_calibrator("marginal", alpha=0.1))
    flt = ConformalFilter.load(path)
    query = xquad_en[400].query
    texts = [p.text for p in xquad_en[400:410]]
    with serving(path) as server:
        body = httpx.post(f"{server.url}/filter", json={"query": query, "snippets": texts},
                          timeout=60).json()
    assert body["p_value_rule"].endswith("kept exactly when p > 0.1")
    assert body["p_values"] == pytest.approx(list(flt.evidence.p_values(body["scores"])))
    assert all(k["p_value"] > 0.1 for k in body["kept"])
    assert all(r["p_value"] <= 0.1 for r in body["removed"])
    assert len(body["kept"]) + len(body["removed"]) == len(texts)


# ----------------------------------------------------------------------------- the components
def test_components_carry_the_p_value(cal_pairs: list[Any], test_pairs: list[Any],
                                      minilm_scorer: Any) -> None:
    """LangChain and LlamaIndex keep the retriever's score and add ragsieve's score and
    p-value to the metadata; Haystack's ``Document.score`` (a higher-is-better relevance)
    is the p-value."""
    from haystack import Document as HaystackDocument
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from ragsieve.integrations.haystack import ConformalRanker
    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    flt = ConformalFilter(minilm_scorer, alpha=0.2).calibrate(cal_pairs)
    results = flt.filter_pairs(test_pairs)
    qid = next(q for q, r in results.items() if r.kept and r.removed)  # both kinds
    query, texts = results[qid].query, [p.text for p in test_pairs if p.query_id == qid]
    expected = {s.text: s.p_value for s in flt.filter(query, texts).kept}

    docs = ConformalCompressor(filter=flt).compress_documents(
        [Document(page_content=t, metadata={"retriever_score": 0.5}) for t in texts], query)
    assert {d.page_content: d.metadata["ragsieve_p_value"] for d in docs} == expected
    assert all(d.metadata["retriever_score"] == 0.5 for d in docs)

    nodes = ConformalPostprocessor(filter=flt).postprocess_nodes(
        [NodeWithScore(node=TextNode(text=t), score=0.7) for t in texts],
        query_bundle=QueryBundle(query))
    assert {n.node.text: n.node.metadata["ragsieve_p_value"] for n in nodes} == expected
    assert all(n.score == 0.7 for n in nodes)  # the retriever's score, where it was
    assert all("ragsieve_p_value" in n.node.excluded_llm_metadata_keys for n in nodes)

    ranked = ConformalRanker(filter=flt).run(
        query=query, documents=[HaystackDocument(content=t, score=0.7) for t in texts])
    got = ranked["documents"]
    assert {d.content: d.score for d in got} == expected
    assert all(d.meta["ragsieve_original_score"] == 0.7 for d in got)
