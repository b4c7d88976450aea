"""Over HTTP an outside score is accepted under the artifact's own field name (``score``
stays an alias), and a score a filter does not read is refused, never ignored."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from servers import serving

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.scoring import FieldScorer


def _overlap(p: Pair) -> float:
    words = set(re.findall(r"\w+", p.query.lower()))
    return len(words & set(re.findall(r"\w+", p.text.lower()))) / max(len(words), 1)


@pytest.fixture(scope="module")
def bm25_artifact(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Pair]) -> Path:
    pairs = [dataclasses.replace(p, meta={**p.meta, "bm25": _overlap(p)}) for p in xquad_en[:300]]
    path = tmp_path_factory.mktemp("bm25") / "bm25.json"
    ConformalFilter(FieldScorer("bm25", higher_is_better=True), alpha=0.2).calibrate(
        pairs, monitor=False).save(path)
    return path


def test_field_name_and_score_alias_agree(bm25_artifact: Path) -> None:
    values = [0.9, 0.1, 0.5, 0.05]
    with serving(bm25_artifact) as srv:
        named = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"bm25": v} for v in values]}).json()
        alias = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"score": v} for v in values]}).json()
        unknown = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"bm52": 0.3}]})
        both = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"bm25": 0.3, "score": 0.3}]})
        text = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"bm25": "high"}]})
    assert named["scores"] == alias["scores"] == [-v for v in values]
    assert [k["index"] for k in named["kept"]] == [k["index"] for k in alias["kept"]]
    assert unknown.status_code == 422 and "'bm25'" in unknown.json()["detail"]
    assert both.status_code == 422 and "give one" in both.json()["detail"]
    assert text.status_code == 422


def test_a_score_sent_to_a_filter_that_reads_none_is_refused(
        served_artifact: Any, embedding_cache_dir: Path) -> None:
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    with serving(artifact, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        r = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"text": "a river", "score": 0.1}]}, timeout=60)
        ok = httpx.post(srv.url + "/filter", json={
            "query": "q", "snippets": [{"text": "a river"}]}, timeout=60)
    assert r.status_code == 422 and "reads no outside score" in r.json()["detail"]
    assert "1 - cos" in r.json()["detail"]
    assert ok.status_code == 200
