"""The reader: a cross-encoder fine-tuned for real (on a few pairs, in seconds) from a
bundled encoder (multilingual-e5-small by default, MiniLM on request), fitted on the fit
topics only, carried and sealed in the artifact."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from topics import first_topics

from ragsieve import ConformalFilter
from ragsieve.artifact import seal_value
from ragsieve.errors import ArtifactError, CalibrationError, ScorerError
from ragsieve.scoring import ReaderScorer, resolve_scorer
from ragsieve.types import Pair

pytest.importorskip("torch")

#: A small fit: every test fine-tunes on at most this many pairs (a few seconds).
SMALL = 24


@pytest.fixture(scope="module")
def few_topics(xquad_en: list[Pair]) -> list[Pair]:
    """Eight questions of each of four XQuAD-en topics, their lists whole."""
    return first_topics(xquad_en, 4, 8)


@pytest.fixture(scope="module")
def calibrated(few_topics: list[Pair]) -> ConformalFilter:
    reader = ReaderScorer(max_fit_pairs=SMALL)
    return ConformalFilter(reader, alpha=0.2).calibrate(few_topics, seed=3, monitor=False)


def test_the_reader_is_fitted_on_the_fit_topics_only(calibrated: ConformalFilter,
                                                     few_topics: list[Pair]) -> None:
    reader = calibrated.scorer_
    assert isinstance(reader, ReaderScorer) and reader.is_fitted
    spec = reader.spec()
    assert spec["scorer"] == "reader" and len(spec["weights"]) == 64
    assert len(spec["base_sha256"]) == 64
    info = calibrated.calibration_info
    assert 0 < info["fusion_fit_pairs"] <= SMALL
    # the threshold is calibrated on the other topics: not one pair of the fit share
    from ragsieve.scoring.fusion import fusion_fit_mask

    seen: dict[object, int] = {}
    topics = np.array([seen.setdefault(p.group, len(seen)) for p in few_topics])
    fit_topics = {few_topics[i].group for i in np.flatnonzero(fusion_fit_mask(topics, seed=3))}
    assert calibrated.calibrator_.n_calibration_ == sum(
        p.relevant == 1 for p in few_topics if p.group not in fit_topics)


def test_scores_are_one_minus_a_probability(calibrated: ConformalFilter,
                                            few_topics: list[Pair]) -> None:
    query = few_topics[0].query
    texts = [p.text for p in few_topics[:6]]
    scores = calibrated.scorer_.score_batch(query, texts)
    assert scores.shape == (6,) and np.all((scores > 0) & (scores < 1))
    together = calibrated.scorer_.score_pairs(few_topics[:6])
    assert together == pytest.approx(scores, abs=1e-6)  # batched across queries: the same


def test_the_artifact_carries_and_seals_the_weights(calibrated: ConformalFilter,
                                                    few_topics: list[Pair],
                                                    tmp_path: Path) -> None:
    path = calibrated.save(tmp_path / "reader.json")
    payload = json.loads(path.read_text())
    sha = payload["scorer"]["weights"]
    assert list(payload["weights"]) == [sha] and "weights" in payload["checksum"]["covers"]
    # the six trained layers and the head in float16 (28 MB as base64), not the embeddings
    assert 20 * 2**20 < path.stat().st_size < 32 * 2**20
    back = ConformalFilter.load(path)
    pairs = [p for p in few_topics if p.query_id == few_topics[0].query_id]
    assert (back.filter(pairs[0].query, pairs).scores
            == calibrated.filter(pairs[0].query, pairs).scores)
    # edited weights, resealed by a forger: their sha256 is no longer their name
    blob = bytearray(base64.b64decode(payload["weights"][sha]))
    blob[-1] ^= 1
    payload["weights"][sha] = base64.b64encode(bytes(blob)).decode()
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        ConformalFilter.from_dict(payload)
    payload["checksum"]["value"] = seal_value(payload)
    with pytest.raises(ArtifactError, match="do not hash to their name"):
        ConformalFilter.from_dict(payload)


def test_a_spec_naming_weights_not_loaded_is_refused() -> None:
    with pytest.raises(ScorerError, match="not loaded"):
        resolve_scorer({"scorer": "reader", "weights": "0" * 64})


def test_fine_tuning_is_deterministic_for_a_seed(few_topics: list[Pair]) -> None:
    sample = [p for p in few_topics if p.relevant == 1][:4] + [
        p for p in few_topics if p.relevant == 0][:8]
    one = ReaderScorer(max_fit_pairs=12).fitted_on(sample, seed=5)
    two = ReaderScorer(max_fit_pairs=12).fitted_on(sample, seed=5)
    assert one.weights == two.weights and 0 < one.n_read <= 12


def test_a_fit_share_of_one_class_is_refused() -> None:
    pairs = [Pair(f"q{i}", "Who?", f"s{i}", "Some text.", 1, group=f"t{i}") for i in range(8)]
    with pytest.raises(CalibrationError, match="needs both"):
        ReaderScorer(max_fit_pairs=SMALL).fit_topics(pairs)


def test_the_unfitted_reader_asks_to_be_calibrated() -> None:
    with pytest.raises(ScorerError, match="not fine-tuned yet"):
        ReaderScorer().score_batch("Who?", ["Someone."])


@pytest.mark.slow  # three fine-tunes and a fused fit: about a minute each
@pytest.mark.parametrize(("preset", "learner", "list_dependent"),
                         [("portable-reader", "logistic", False),
                          ("quality-reader", "boosted", True)])
def test_a_reader_preset_cross_fits_the_reader(xquad_en: list[Pair], tmp_path: Path,
                                               preset: str, learner: str,
                                               list_dependent: bool) -> None:
    from ragsieve.scoring import FusedScorer

    pairs = first_topics(xquad_en, 8, 3)
    fused = FusedScorer.unfitted(preset=preset)
    flt = ConformalFilter(fused, alpha=0.2).calibrate(pairs, seed=1, monitor=False)
    readers = [s for s in flt.scorer_.signal_scorers if s.name == "reader"]
    assert len(readers) == 1 and readers[0].is_fitted
    assert flt.scorer_.tags.list_dependent == list_dependent
    assert flt.scorer_.spec()["learner"] == learner
    weights = flt.scorer_.learned_weights()
    assert list(weights) == [readers[0].weights]
    back = ConformalFilter.load(flt.save(tmp_path / "fused.json"))
    one = [p for p in pairs if p.query_id == pairs[0].query_id]
    assert back.filter(one[0].query, one).scores == flt.filter(one[0].query, one).scores


def test_evaluate_says_how_to_measure_the_reader(xquad_en: list[Pair]) -> None:
    from ragsieve.evaluation.sweep import score_for_evaluation

    with pytest.raises(ValueError, match="preset portable-reader"):
        score_for_evaluation(xquad_en[:10], ReaderScorer())


def test_evaluate_says_what_the_reader_costs_before_it_starts(
        shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Said on stderr before the sweep (stopped there by an injected failure, so nothing is
    fine-tuned): the fine-tunes per split, their pairs, and how to make it shorter."""
    import ragsieve.evaluation
    from ragsieve.cli import main

    def stop(*args: object, **kwargs: object) -> None:
        raise SystemExit(9)

    monkeypatch.setattr(ragsieve.evaluation, "evaluate", stop)
    with pytest.raises(SystemExit) as stopped:
        main(["evaluate", "--data", "xquad-en", "--data-dir", str(shared_data_dir),
              "--scorer", "best", "--preset", "portable-reader", "--splits", "2",
              "--limit-queries", "60", "--no-cache"])
    assert stopped.value.code == 9
    err = capsys.readouterr().err
    assert "cost: the reader is fine-tuned 3 times per split" in err
    assert "6 fine-tunes for 2 split(s)" in err
    assert "Shorter: fewer --splits, --limit-queries N, or --preset portable" in err


def test_the_reader_also_reads_the_evidence_sentences_against_their_neighbours(
        few_topics: list[Pair]) -> None:
    from ragsieve.scoring.reader import evidence_sentences

    relevant = [p for p in few_topics if p.relevant == 1]
    sentences = evidence_sentences(relevant)
    assert sentences and {p.relevant for p in sentences} == {0, 1}
    parents = {(p.query_id, p.meta["parent_snippet_id"]) for p in sentences}
    assert parents <= {(p.query_id, p.snippet_id) for p in relevant}
    for parent in parents:  # whole snippets, each with evidence and a neighbour
        labels = [p.relevant for p in sentences
                  if (p.query_id, p.meta["parent_snippet_id"]) == parent]
        assert 0 < sum(labels) < len(labels)
    assert len(evidence_sentences(relevant, budget=5)) <= 5
    # pairs that do not say which sentences are evidence: snippets only
    bare = [Pair(p.query_id, p.query, p.snippet_id, p.text, 1, p.group) for p in relevant]
    assert evidence_sentences(bare) == []


@pytest.mark.parametrize("base", [
    # slow: the untrained e5 reader's ranking is test_the_default_base_reads_german's too
    pytest.param("multilingual-e5-small-q4", marks=pytest.mark.slow),
    "all-MiniLM-L6-v2"])
def test_the_untrained_reader_ranks_like_the_bi_encoder(few_topics: list[Pair],
                                                        base: str) -> None:
    """The cosine head: before any training the reader already ranks relevant snippets
    above the others (it reads the pair with the weights' own pooling and cosine)."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.embeddings.cross_encoder import untrained_reader

    reader = untrained_reader(base)
    sample = few_topics[:120]
    logits = reader.logits([p.query for p in sample], [p.text for p in sample])
    assert roc_auc_score([p.relevant for p in sample], logits) > 0.75


def test_a_pair_read_once_is_not_read_again(few_topics: list[Pair]) -> None:
    """The reader remembers logits by the pair's content: a second call reads only the
    pairs it has not seen, in any order and mixed with new ones, and gives what a reader
    that remembers nothing gives."""
    from ragsieve.embeddings.cross_encoder import CrossEncoderModel, untrained_reader

    reader = untrained_reader("all-MiniLM-L6-v2")
    fresh = CrossEncoderModel(reader.model, reader.encode, max_length=reader.max_length, keep=0)
    first, later = few_topics[:10], few_topics[5:20][::-1]
    reader.logits([p.query for p in first], [p.text for p in first])
    assert reader.n_read == 10
    got = reader.logits([p.query for p in later], [p.text for p in later])
    assert reader.n_read == 20  # 15 pairs asked, 5 of them read before
    want = fresh.logits([p.query for p in later], [p.text for p in later])
    assert got == pytest.approx(want, abs=1e-5) and fresh.n_read == 15
    # the same text for another question is another pair, and one call reads a pair once
    twice = [few_topics[0].query, few_topics[40].query, few_topics[0].query]
    logits = reader.logits(twice, [few_topics[0].text] * 3)
    assert reader.n_read == 21 and logits[0] == logits[2] != logits[1]
    assert fresh.logits(twice, [few_topics[0].text] * 3) == pytest.approx(logits, abs=1e-5)
    assert fresh.n_read == 17 and not fresh._seen  # keep=0 remembers nothing


def test_the_default_base_reads_german(shared_data_dir: Path) -> None:
    """multilingual-e5-small is the default base: a reader fine-tuned on German pairs scores
    German pairs, untrained it already ranks them (no English model reading German)."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.data import load_xquad
    from ragsieve.embeddings.cross_encoder import reader_base, untrained_reader

    german = first_topics(load_xquad("de", data_dir=shared_data_dir), 4, 8)
    assert ReaderScorer().spec()["model"] == "multilingual-e5-small-q4"
    base = reader_base("multilingual-e5-small-q4")
    untrained = untrained_reader(base.name)
    sample = german[:120]
    logits = untrained.logits([p.query for p in sample], [p.text for p in sample])
    assert roc_auc_score([p.relevant for p in sample], logits) > 0.65  # chance: 0.5
    flt = ConformalFilter(ReaderScorer(max_fit_pairs=SMALL), alpha=0.2).calibrate(
        german, seed=3, monitor=False)
    assert flt.scorer_.spec()["base_sha256"] == base.fingerprint()
    one = [p for p in german if p.query_id == german[0].query_id]
    scores = np.asarray(flt.filter(one[0].query, one).scores)
    assert scores.shape == (len(one),) and np.all((scores > 0) & (scores < 1))


def test_a_minilm_reader_is_still_fitted_saved_and_loaded(few_topics: list[Pair],
                                                          tmp_path: Path) -> None:
    """The English MiniLM base, chosen: the reader of earlier versions' artifacts."""
    reader = ReaderScorer(max_fit_pairs=SMALL, model="all-MiniLM-L6-v2")
    flt = ConformalFilter(reader, alpha=0.2).calibrate(few_topics, seed=3, monitor=False)
    assert flt.scorer_.spec()["model"] == "all-MiniLM-L6-v2"
    back = ConformalFilter.load(flt.save(tmp_path / "minilm.json"))
    assert back.scorer_.spec() == flt.scorer_.spec()
    one = [p for p in few_topics if p.query_id == few_topics[0].query_id]
    assert back.filter(one[0].query, one).scores == flt.filter(one[0].query, one).scores
    # the spec names the base the tensors were trained on: not another base's weights file
    other = dict(flt.scorer_.spec(), base_sha256="0" * 64)
    with pytest.raises(ScorerError, match=r"installed base model \(all-MiniLM-L6-v2\) differs"):
        resolve_scorer(other).score_batch("Who?", ["Someone."])
    with pytest.raises(ValueError, match="reader model == 'bert-base'"):
        ReaderScorer(model="bert-base")


def test_an_earlier_readers_weights_say_to_recalibrate() -> None:
    import torch
    from safetensors.torch import save

    from ragsieve.embeddings.cross_encoder import ReaderWeights, load_reader

    blob = save({"classifier.weight": torch.zeros(1, 384, dtype=torch.float16)})
    with pytest.raises(ScorerError, match="earlier reader"):
        load_reader(ReaderWeights(blob))
