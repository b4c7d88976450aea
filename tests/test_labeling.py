"""LLMLabeler on the real local model: labels, agreement, a killed-and-resumed job, bad answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llm_doubles import FakeLLMServer

from ragsieve import LLMLabeler, Pair
from ragsieve.data import load_selqa, read_pairs, sample_queries, write_pairs
from ragsieve.errors import LLMError
from ragsieve.labeling import label_agreement
from ragsieve.llm import LLMCache, connect


@pytest.fixture(scope="module")
def selqa_subset(shared_data_dir):  # type: ignore[no-untyped-def]
    return sample_queries(load_selqa("dev", data_dir=shared_data_dir), 6, seed=5)


def test_label_agreement_hand_made() -> None:
    d = label_agreement([1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0, 0])
    assert d["accuracy"] == pytest.approx(6 / 8)
    # po = 0.75, pe = (3*3 + 5*5) / 64 = 34/64
    assert d["kappa"] == pytest.approx((0.75 - 34 / 64) / (1 - 34 / 64))
    assert (d["tp"], d["fp"], d["fn"], d["tn"]) == (2, 1, 1, 4)
    with pytest.raises(ValueError):
        label_agreement([1], [1, 0])


def test_label_pairs_real_model(llm_connection, selqa_subset) -> None:  # type: ignore[no-untyped-def]
    labeler = LLMLabeler(llm_connection)  # auto -> logprob on the completion-style base model
    out, report = labeler.label_pairs(selqa_subset)
    assert report.method == "logprob" and report.model == "gemma3-270m"
    assert len(out) == len(selqa_subset) and report.n_labelled + report.n_errors == len(out)
    for before, after in zip(selqa_subset, out):
        assert after.meta["human_relevant"] == before.relevant  # the human label is kept
        assert "llm_answer" in after.meta and after.meta["llm_prompt_version"] == "judge-completion-v2"
        if after.relevant is None:
            assert after.meta["llm_error"]
        else:
            assert after.relevant == int(after.meta["llm_p_yes"] >= 0.5)
    assert selqa_subset[0].meta.get("llm_answer") is None  # inputs not mutated
    a = report.agreement
    assert a is not None and a["n"] == report.n_labelled
    assert 0.0 <= a["accuracy"] <= 1.0
    assert report.prompt_tokens > 100 * len({(p.query, p.text) for p in selqa_subset})


def test_unparseable_answers_stay_unlabelled(tmp_path: Path) -> None:
    """yes-no method against a server answering garbage: label null, never relevant."""
    pairs = [Pair("q", "Who?", f"s{i}", f"text {i}", relevant=1) for i in range(3)]
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="chat",
                                          cache=tmp_path / "c.sqlite") as conn:
        out, report = LLMLabeler(conn, method="yes-no").label_pairs(pairs)
    assert [p.relevant for p in out] == [None, None, None]
    assert report.n_errors == 3 and report.n_relevant == 0
    assert all("unparseable reply" in p.meta["llm_error"] for p in out)
    assert report.agreement is None  # nothing labelled to compare


def test_killed_labelling_job_resumes_without_repeating(local_llm, selqa_subset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_pairs(selqa_subset, src)
    n_unique = len({(p.query, p.text) for p in selqa_subset})
    env = {**os.environ, "RAGSIEVE_CACHE": str(tmp_path / "cache")}
    cmd = [str(Path(sys.executable).parent / "ragsieve"), "-q", "label", "--data", str(src),
           "--out", str(dst), "--base-url", local_llm.base_url, "--llm-model", local_llm.model_name,
           "--llm-style", "completion", "--json"]
    cache_file = tmp_path / "cache" / "llm-cache.sqlite"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    answered = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if cache_file.exists():
            answered = len(LLMCache(cache_file))
            if answered >= n_unique // 3:
                break
        time.sleep(0.2)
    assert proc.poll() is None, "the job finished before it could be killed; use more pairs"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dst.exists()  # no half-written output
    done_before = len(LLMCache(cache_file))
    assert 0 < done_before < n_unique

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=300)
    report = json.loads(rerun.stdout)
    assert report["n_cache_hits"] == done_before  # answers from before the kill are reused ...
    assert report["n_requests"] == n_unique - done_before  # ... and never asked again
    assert len(LLMCache(cache_file)) == n_unique
    labelled = read_pairs(dst)
    assert [(p.query_id, p.snippet_id) for p in labelled] == [(p.query_id, p.snippet_id) for p in selqa_subset]
    assert all(p.relevant in (0, 1) or p.meta["llm_error"] for p in labelled)


def test_label_method_validation() -> None:
    with pytest.raises(ValueError, match="method"):
        LLMLabeler(method="vote")
    with pytest.raises(ValueError, match="threshold"):
        LLMLabeler(threshold=1.0)


# ------------------------------------------------------------ a dead or dying endpoint
def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_label_against_a_dead_endpoint_fails_without_output(tmp_path: Path) -> None:
    """``ragsieve label --base-url`` at a closed port: exit 2 after the retries, one line,
    and no output file (not one full of null labels)."""
    pairs = [Pair(f"q{i}", f"Question {i}?", f"s{i}", f"snippet {i}", relevant=i % 2)
             for i in range(6)]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_pairs(pairs, src)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ragsieve"), "-q", "label", "--data", str(src),
         "--out", str(dst), "--base-url", url, "--llm-model", "m", "--json"],
        env={**os.environ, "RAGSIEVE_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"ragsieve label: error: the LLM endpoint {url} is not answering")
    assert "cannot reach" in err and "after their retries" in err and "rerun" in err
    assert err.endswith(f"Nothing was written to {dst}.")
    assert not dst.exists()


YES = ("json", {"object": "chat.completion", "usage": {"prompt_tokens": 7, "completion_tokens": 1},
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes"},
                             "finish_reason": "stop"}]})


def test_endpoint_dying_midway_keeps_the_replies_and_a_rerun_resumes(tmp_path: Path) -> None:
    """Replies obtained before the endpoint died stay in the cache; the run raises
    ``LLMError`` instead of returning null labels; a rerun asks only for the rest."""
    pairs = [Pair(f"q{i}", f"Question {i}?", f"s{i}", f"snippet {i}") for i in range(7)]
    cache = tmp_path / "c.sqlite"
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="chat",
                                          cache=cache) as conn:
        fake.script = [YES] * 3
        first, _ = LLMLabeler(conn, method="yes-no").label_pairs(pairs[:3])
        dead_url = fake.base_url
    assert [p.relevant for p in first] == [1, 1, 1]
    expected = ("is not answering: . pairs in a row failed after their retries .last: cannot "
                "reach .*3 of 7 pairs were answered.*reply cache")
    with (connect(base_url=dead_url, model="fake", style="chat", cache=cache) as conn,
          pytest.raises(LLMError, match=expected)):
        LLMLabeler(conn, method="yes-no").label_pairs(pairs)
    assert len(LLMCache(cache)) == 3  # kept: what was answered
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="chat",
                                          cache=cache) as conn:
        fake.script = [YES] * 4
        out, report = LLMLabeler(conn, method="yes-no").label_pairs(pairs)
    assert report.n_cache_hits == 3 and fake.n_requests == 4
    assert [p.relevant for p in out] == [1] * 7 and len(LLMCache(cache)) == 7


def test_a_malformed_reply_for_one_pair_keeps_the_run_going(tmp_path: Path) -> None:
    """A pair whose replies stay unusable (not JSON) gets a null label with the reason; the
    run does not fail for it."""
    pairs = [Pair(f"q{i}", f"Question {i}?", f"s{i}", f"snippet {i}") for i in range(3)]
    with FakeLLMServer() as fake, connect(base_url=fake.base_url, model="fake", style="chat",
                                          cache=tmp_path / "c.sqlite", concurrency=1) as conn:
        fake.script = [("garbage", "<html>busy</html>")] * (conn.client.max_retries + 1) + [YES] * 2
        out, report = LLMLabeler(conn, method="yes-no").label_pairs(pairs)
    assert [p.relevant for p in out] == [None, 1, 1] and report.n_errors == 1
    assert "is not JSON" in out[0].meta["llm_error"]
