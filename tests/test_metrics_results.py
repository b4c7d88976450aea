"""``/metrics`` counts empty results and each request's share of kept snippets (real server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families
from servers import serving

from ragsieve import Pair
from ragsieve.calibration import SplitConformalCalibrator


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_empty_results_and_kept_share(served_artifact: Any, xquad_en: list[Pair],
                                      embedding_cache_dir: Path) -> None:
    artifact = served_artifact(SplitConformalCalibrator(alpha=0.2))
    relevant = next(p for p in xquad_en[300:] if p.relevant)
    echo = f"{relevant.query} {relevant.query}"  # scores near 0: kept at any threshold
    unrelated = ["zqx vvk plorp", "kkr zzt mmq wub", "xxv qqk ttr"]
    with serving(artifact, scorer_options={"cache_dir": embedding_cache_dir}) as srv:
        kept = httpx.post(srv.url + "/filter", json={
            "query": relevant.query, "snippets": [echo, *unrelated]}, timeout=60).json()
        empty = httpx.post(srv.url + "/filter", json={
            "query": relevant.query, "snippets": unrelated}, timeout=60).json()
        m = _samples(srv.url)
    n_kept = len(kept["kept"])
    assert n_kept >= 1 and empty["kept"] == []
    ep = (("endpoint", "/filter"),)
    assert m[("ragsieve_empty_results_total", ep)] == 1
    assert m[("ragsieve_kept_share_count", ep)] == 2
    assert m[("ragsieve_kept_share_sum", ep)] == pytest.approx(n_kept / 4)
    assert m[("ragsieve_kept_share_bucket", (*ep, ("le", "0.0")))] == 1  # the empty one
