"""The exchangeability alarm under a hostile client: a few requests cannot latch it, and an
authenticated ``POST /admin/monitor/reset`` clears it (real uvicorn server, real MiniLM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from servers import serving

from ragsieve import ConformalFilter, Pair
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.monitoring import DEFAULT_MIN_REQUESTS, ExchangeabilityMonitor
from ragsieve.scoring import EmbeddingScorer

KEY = "monitor-key"
AUTH = {"X-API-Key": KEY}
#: What a program sends to a bodiless admin route without a key (no JSON body).
CLIENT = {"X-Ragsieve": "1"}


@pytest.fixture(scope="module")
def artifact(served_artifact: Any) -> Path:
    return served_artifact(SplitConformalCalibrator(alpha=0.2))


def _extreme(i: int) -> dict[str, Any]:
    """A request built to stand out: the question itself as the best snippet, noise after."""
    question = f"Which river flows through the city number {i}?"
    return {"query": question,
            "snippets": [question] + [f"zq{i} xv{j} kk{j * 7} pp" for j in range(5)]}


def _monitor(url: str) -> dict[str, Any]:
    return httpx.get(url + "/healthz").json()["monitor"]


def test_a_few_requests_cannot_latch_the_alarm_in_memory() -> None:
    rng = np.random.default_rng(0)
    m = ExchangeabilityMonitor(rng.uniform(0.05, 0.3, 300), delta=0.01)
    states = [m.observe([0.0, 1.0, 1.0, 1.0, 1.0]) for _ in range(DEFAULT_MIN_REQUESTS - 1)]
    assert states[-1].martingale >= 1 / 0.01  # the evidence is there ...
    assert not any(s.alarm for s in states)  # ... but too few requests to latch
    state = m.observe([0.0, 1.0, 1.0, 1.0, 1.0])
    assert state.alarm and state.fired_at == DEFAULT_MIN_REQUESTS
    with pytest.raises(ValueError, match="min_requests == 0"):
        ExchangeabilityMonitor([0.1, 0.2], min_requests=0)


def test_hostile_requests_and_the_authenticated_reset(artifact: Path,
                                                      embedding_cache_dir: Path) -> None:
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}, "api_key": KEY}
    with serving(artifact, **options) as srv:
        for i in range(DEFAULT_MIN_REQUESTS - 1):
            r = httpx.post(srv.url + "/filter", json=_extreme(i), headers=AUTH, timeout=60)
            assert r.status_code == 200
        state = _monitor(srv.url)
        assert state["n_observed"] == DEFAULT_MIN_REQUESTS - 1 and not state["alarm"], state
        for i in range(DEFAULT_MIN_REQUESTS - 1, 60):
            httpx.post(srv.url + "/filter", json=_extreme(i), headers=AUTH, timeout=60)
            if _monitor(srv.url)["alarm"]:
                break
        assert _monitor(srv.url)["alarm"]  # sustained junk does fire it
        refused = httpx.post(srv.url + "/admin/monitor/reset", headers=CLIENT)
        assert refused.status_code == 401
        r = httpx.post(srv.url + "/admin/monitor/reset", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["alarm"] is False and r.json()["n_observed"] == 0
        after = _monitor(srv.url)
        # two statistics (separation, best score): the union-bound martingale starts at 1/2
        assert not after["alarm"] and after["n_observed"] == 0 \
            and after["martingale"] == pytest.approx(0.5)
        metrics = httpx.get(srv.url + "/metrics", headers=AUTH).text
        assert "ragsieve_drift_alarm 0.0" in metrics


def test_reset_without_a_key_is_for_loopback_and_needs_a_monitor(
        artifact: Path, tmp_path: Path, xquad_en: list[Pair], embedding_cache_dir: Path) -> None:
    options = {"scorer_options": {"cache_dir": embedding_cache_dir}}
    with serving(artifact, **options) as srv:  # no key: loopback clients may reset
        r = httpx.post(srv.url + "/admin/monitor/reset", headers=CLIENT)
        assert r.status_code == 200 and r.json()["n_observed"] == 0
    bare = tmp_path / "bare.json"
    ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.2).calibrate(
        xquad_en[:300], monitor=False).save(bare)
    with serving(bare, **options) as srv:
        r = httpx.post(srv.url + "/admin/monitor/reset", headers=CLIENT)
        assert r.status_code == 404 and "no monitor reference" in r.json()["detail"]
