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

import pytest

from ragsieve.cli import main


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
