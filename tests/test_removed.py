"""Removed snippets are visible wherever a result is: the Python result, ``filter --json`` /
``--show-removed`` and ``POST /filter`` (real MiniLM, real XQuAD, a real uvicorn server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.cli import main as cli_main
from ragsieve.data import write_pairs


def _query(pairs: list[Pair], start: int) -> list[Pair]:
    qid = pairs[start].query_id
    return [p for p in pairs if p.query_id == qid]


def test_python_result_partitions_kept_and_removed(served_artifact: Any, xquad_en: list[Pair],
                                                   embedding_cache_dir: Path) -> None:
    flt = ConformalFilter.load(served_artifact(SplitConformalCalibrator(alpha=0.2)),
                               scorer_options={"cache_dir": embedding_cache_dir})
    chunk = _query(xquad_en, 400)
    res = flt.filter(chunk[0].query, [{"text": p.text, "snippet_id": p.snippet_id} for p in chunk])
    assert res.removed, "expected at least one snippet removed at alpha 0.2"
    ids = [p.snippet_id for p in chunk]
    assert sorted(res.kept_ids + res.removed_ids) == sorted(ids)
    assert not set(res.kept_ids) & set(res.removed_ids)
    assert all(s.score > res.threshold for s in res.removed)
    assert [s.score for s in res.removed] == [res.scores[s.index] for s in res.removed]


def test_cli_filter_shows_removed(served_artifact: Any, xquad_en: list[Pair], tmp_path: Path,
                                  embedding_cache_dir: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    data = tmp_path / "q.jsonl"
    write_pairs(_query(xquad_en, 400), data)
    base = ["-q", "filter", "--filter", str(artifact), "--data", str(data),
            "--cache-dir", str(embedding_cache_dir)]
    assert cli_main([*base, "--json"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["removed"] and all(r["score"] > r["threshold"] == line["threshold"]
                                   for r in line["removed"])
    assert cli_main([*base, "--show-removed"]) == 0
    out = capsys.readouterr().out
    assert out.count("removed ") >= len(line["removed"])
    assert all(r["snippet_id"] in out for r in line["removed"])


def test_http_filter_carries_removed(served_artifact: Any, xquad_en: list[Pair],
                                     embedding_cache_dir: Path) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from servers import serving

    chunk = _query(xquad_en, 400)
    body = {"query": chunk[0].query,
            "snippets": [{"text": p.text, "snippet_id": p.snippet_id} for p in chunk]}
    with serving(served_artifact(SplitConformalCalibrator(alpha=0.2)),
                 scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        out = httpx.post(srv.url + "/filter", json=body, timeout=60).json()
    kept = {s["snippet_id"] for s in out["kept"]}
    removed = {s["snippet_id"]: s for s in out["removed"]}
    assert removed and kept | set(removed) == {p.snippet_id for p in chunk}
    assert all(s["score"] > s["threshold"] == out["threshold"] for s in removed.values())
    assert all(out["scores"][s["index"]] == s["score"] for s in removed.values())
