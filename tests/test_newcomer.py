"""What a newcomer met in the first hour (issue 50, "Hardening IV", items 13-18): the batch
``filter`` says when its queries stop looking exchangeable with the calibration data, the
demo's own example is not suspect, one wording per list-check event, ``--show-removed``
marks the relevant snippets it removed, and ``RAGSIEVE_CACHE`` keeps each cache in its own
folder. (The docs site's search from ``file://`` is tested in tests/test_docs.py.)

Real components throughout: the bundled MiniLM, the shared datasets, the real CLI.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from ragsieve.cli import main
from ragsieve.lists import ListRecord, ListWatch


def _tiny_pairs(path: Path) -> Path:
    rows = [{"query_id": f"q{q}", "query": f"who wrote book {q}?", "snippet_id": f"s{s}",
             "text": f"Book {s} was written by author {s}.", "relevant": int(q == s)}
            for q in range(2) for s in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------ item 18: RAGSIEVE_CACHE
def test_the_embedding_cache_has_its_own_folder_under_ragsieve_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny_pairs(tmp_path / "pairs.jsonl")
    root = tmp_path / "cache"
    monkeypatch.setenv("RAGSIEVE_CACHE", str(root))
    assert main(["-q", "score", "--data", str(data), "--out", str(tmp_path / "s1.jsonl")]) == 0
    assert (root / "embeddings" / "embeddings.sqlite").is_file()
    assert not (root / "embeddings.sqlite").exists()  # was: the cache's root itself
    # an earlier version's cache, left directly in RAGSIEVE_CACHE: read where it is, said once
    old = tmp_path / "old"
    old.mkdir()
    (root / "embeddings" / "embeddings.sqlite").rename(old / "embeddings.sqlite")
    monkeypatch.setenv("RAGSIEVE_CACHE", str(old))
    with caplog.at_level(logging.WARNING, logger="ragsieve._paths"):
        assert main(["-q", "score", "--data", str(data), "--out", str(tmp_path / "s2.jsonl")]) == 0
    assert not (old / "embeddings").exists() and (old / "embeddings.sqlite").is_file()
    said = [r.getMessage() for r in caplog.records if r.name == "ragsieve._paths"]
    assert len(said) == 1 and all("old place" in m and "mv " in m for m in said)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default $RAGSIEVE_CACHE/embeddings" in text and "onnx/, serve/" in text


# ------------------------------------------------------------------ item 15: one wording per event
def test_the_list_alarm_has_one_wording_in_the_log_and_every_note(
        caplog: pytest.LogCaptureFixture) -> None:
    """The sequential test's alarm fires once; the log said "over the last 10" while the
    notes of the lists after it (``--json``, stdout) said "over the last 50"."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 16, 600)  # calibration: lists of 1-15, about 8 snippets
    qids = [f"q{i}" for i, n in enumerate(lengths) for _ in range(n)]
    watch = ListWatch(ListRecord.from_lists(qids, source={"kind": "data"}, list_dependent=True))
    with caplog.at_level(logging.WARNING, logger="ragsieve.lists"):
        checks = [watch.see(14) for _ in range(80)]  # in range, but always long
    assert watch.alarm and watch.fired_at < 50
    logged = [r.getMessage() for r in caplog.records if r.name == "ragsieve.lists"]
    assert len(logged) == 1
    event = checks[watch.fired_at - 1].note.removesuffix(" (see docs/deploy.md)")
    assert logged[0].startswith(event + "; ")
    assert {c.note for c in checks[watch.fired_at - 1:]} == {watch.alarm_check().note}
    assert f"over the last {watch.fired_at}," in event
