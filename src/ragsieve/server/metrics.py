"""Prometheus metrics of the service (prometheus-client, extra ``server``).

Each app has its own :class:`ServiceMetrics` and its own registry, so two apps in one
process never mix their counts. With ``serve --workers N`` the workers write their values
to files in ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory per ``serve``, set by
:func:`~ragsieve.server.run_server` before the workers start) and ``GET /metrics``,
answered by whichever worker, merges them with prometheus-client's
``MultiProcessCollector``: counters and histograms are summed over the workers, the
gauges follow the ``multiprocess_mode`` given below (the latest value written by a live
worker for values every worker sees alike, the maximum for flags).

Exposed (text format 0.0.4):

* ``ragsieve_requests_total{endpoint, status}`` and ``ragsieve_request_errors_total{endpoint,
  status}`` (status >= 400); ``ragsieve_request_duration_seconds{endpoint}`` (histogram);
  ``endpoint`` is the route (``/filter``, ``/query``, ...) or ``other`` for unknown paths;
* ``ragsieve_snippets_scored_total{endpoint}``, ``ragsieve_snippets_kept_total{endpoint}``
  and ``ragsieve_served_score`` (histogram of every served snippet's score);
* ``ragsieve_empty_results_total{endpoint}`` (requests that kept none of their snippets)
  and ``ragsieve_kept_share{endpoint}`` (histogram of each request's share kept);
* ``ragsieve_threshold`` (the threshold in force; ``+Inf`` keeps all);
* ``ragsieve_artifact_info{format_version, library_version, mode, alpha, checksum}`` (1 for
  the served artifact) and ``ragsieve_artifact_generation``;
* ``ragsieve_drift_alarm`` (0 or 1) and ``ragsieve_exchangeability_martingale`` (NaN when
  the artifact has no monitor reference);
* ``ragsieve_feedback_labels_total{relevant}`` and ``ragsieve_reloads_total{outcome}``;
* ``ragsieve_model_queue_requests`` and ``ragsieve_model_queue_pieces`` (requests queued
  for model work, the one running included, and the pieces of model work they still need;
  summed over the workers) and ``ragsieve_refused_requests_total{reason}`` (refused before
  any model work: ``max_pieces`` with 413, ``max_queue`` with 429).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .._optional import require

__all__ = ["ENDPOINTS", "MULTIPROC_ENV", "ServiceMetrics", "multiprocess_enabled"]

require("prometheus_client", "server")

import prometheus_client as prom
from prometheus_client import multiprocess

#: The environment variable that switches prometheus-client to multi-process mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Routes counted under their own name; any other path is counted as ``other``.
ENDPOINTS = frozenset(
    {"/", "/status", "/filter", "/query", "/feedback", "/healthz", "/metrics", "/admin/reload",
     "/admin/monitor/reset", "/openapi.json", "/docs", "/redoc",
     # the rerank API (server/rerank.py), each also under the /all prefix
     "/v1/rerank", "/v2/rerank", "/rerank", "/all/v1/rerank", "/all/v2/rerank", "/all/rerank"}
)
#: Buckets of the served-score histogram: ``1 - cos`` lies in [0, 2]. Relative scores
#: (z, gap) may be negative and fall in the ``le="0.0"`` bucket (a negative bucket bound
#: would make prometheus-client drop the histogram's ``_sum``).
SCORE_BUCKETS = (0.0, *(round(0.05 * i, 2) for i in range(1, 21)), 1.5, 2.0)
#: Buckets of the per-request share of snippets kept (0 = an empty result).
SHARE_BUCKETS = (0.0, *(round(0.1 * i, 1) for i in range(1, 11)))
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]


def multiprocess_enabled() -> bool:
    """True when prometheus-client writes its values to ``$PROMETHEUS_MULTIPROC_DIR``.

    prometheus-client chooses its mode once, when it is first imported; the service
    follows that choice (the variable must name a directory by then).
    """
    from prometheus_client import values

    return values.ValueClass is not values.MutexValue


def _label(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _check_multiprocess_dir() -> None:
    """Raise unless ``$PROMETHEUS_MULTIPROC_DIR`` names an existing directory."""
    path = os.environ.get(MULTIPROC_ENV, "")
    if not path or not os.path.isdir(path):
        raise ValueError(
            f"{MULTIPROC_ENV} == {path!r}; multi-process metrics need an existing "
            "directory (run_server creates one per serve)."
        )


class ServiceMetrics:
    """The metrics of one app, in its own registry (or the shared multi-process files).

    Parameters
    ----------
    multiprocess_mode : bool, optional
        Merge the values of all worker processes from ``$PROMETHEUS_MULTIPROC_DIR``;
        defaults to prometheus-client's own mode (see :func:`multiprocess_enabled`).

    Raises
    ------
    ValueError
        Multi-process mode without an existing ``$PROMETHEUS_MULTIPROC_DIR`` directory.
    """

    def __init__(self, *, multiprocess_mode: bool | None = None) -> None:
        self.multiprocess = multiprocess_enabled() if multiprocess_mode is None else multiprocess_mode
        if self.multiprocess:
            _check_multiprocess_dir()
        # in multi-process mode the values live in files; a scrape builds a fresh registry
        self.registry = None if self.multiprocess else prom.CollectorRegistry(auto_describe=True)
        self._add_request_metrics(self.registry)
        self._add_filter_metrics(self.registry)
        self._add_artifact_metrics(self.registry)
        self._add_operation_metrics(self.registry)
        self._artifact_labels: tuple[str, ...] | None = None
        self.martingale.set(math.nan)
        self.alarm.set(0)

    def _add_request_metrics(self, reg: prom.CollectorRegistry | None) -> None:
        """Requests, errors and latency by endpoint."""
        self.requests = prom.Counter(
            "ragsieve_requests", "HTTP requests answered, by endpoint and status.",
            ["endpoint", "status"], registry=reg)
        self.errors = prom.Counter(
            "ragsieve_request_errors", "HTTP requests answered with a status >= 400.",
            ["endpoint", "status"], registry=reg)
        self.latency = prom.Histogram(
            "ragsieve_request_duration_seconds", "Time to answer a request, by endpoint.",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg)

    def _add_filter_metrics(self, reg: prom.CollectorRegistry | None) -> None:
        """What /filter and /query scored and kept, and the threshold they kept it by."""
        self.scored = prom.Counter(
            "ragsieve_snippets_scored", "Snippets scored by /filter and /query.",
            ["endpoint"], registry=reg)
        self.kept = prom.Counter(
            "ragsieve_snippets_kept", "Snippets kept by /filter and /query.",
            ["endpoint"], registry=reg)
        self.empty = prom.Counter(
            "ragsieve_empty_results",
            "Answered /filter and /query requests that kept no snippet (of at least one).",
            ["endpoint"], registry=reg)
        self.unlike_lists = prom.Counter(
            "ragsieve_unlike_lists",
            "Answered /filter and /query requests whose list was unlike the filter's calibration "
            "lists (a score that reads the whole list: its length outside the calibration "
            "lengths, or the lists' sequential test fired; see docs/deploy.md).",
            ["endpoint"], registry=reg)
        self.kept_share = prom.Histogram(
            "ragsieve_kept_share", "Share of a request's snippets kept, per answered request.",
            ["endpoint"], buckets=SHARE_BUCKETS, registry=reg)
        self.scores = prom.Histogram(
            "ragsieve_served_score", "Nonconformity score of every served snippet.",
            buckets=SCORE_BUCKETS, registry=reg)
        self.threshold = prom.Gauge(
            "ragsieve_threshold", "Threshold in force (+Inf keeps every snippet).",
            registry=reg, multiprocess_mode="livemostrecent")

    def _add_artifact_metrics(self, reg: prom.CollectorRegistry | None) -> None:
        """The served artifact, its generation and its drift monitor."""
        self.artifact = prom.Gauge(
            "ragsieve_artifact_info", "The served filter artifact (value 1).",
            ["format_version", "library_version", "mode", "alpha", "checksum"],
            registry=reg, multiprocess_mode="livemax")
        self.generation = prom.Gauge(
            "ragsieve_artifact_generation", "Artifact generation (1 at start, +1 per reload).",
            registry=reg, multiprocess_mode="livemax")
        self.alarm = prom.Gauge(
            "ragsieve_drift_alarm",
            "1 once the exchangeability martingale reached 1/delta, else 0.",
            registry=reg, multiprocess_mode="livemax")
        self.martingale = prom.Gauge(
            "ragsieve_exchangeability_martingale",
            "Conformal test martingale of the served scores (NaN without a monitor).",
            registry=reg, multiprocess_mode="livemostrecent")

    def _add_operation_metrics(self, reg: prom.CollectorRegistry | None) -> None:
        """Feedback labels, reloads, the model-work queue and the requests it refused."""
        self.feedback = prom.Counter(
            "ragsieve_feedback_labels", "Labels received by /feedback.", ["relevant"],
            registry=reg)
        self.reloads = prom.Counter(
            "ragsieve_reloads", "Artifact reloads, by outcome (loaded or refused).",
            ["outcome"], registry=reg)
        self.queue = prom.Gauge(
            "ragsieve_model_queue_requests",
            "Requests queued for model work (the one running included).",
            registry=reg, multiprocess_mode="livesum")
        self.queue_pieces = prom.Gauge(
            "ragsieve_model_queue_pieces",
            "Pieces of model work (about 500 characters of text each) still queued.",
            registry=reg, multiprocess_mode="livesum")
        self.refused = prom.Counter(
            "ragsieve_refused_requests",
            "Requests refused before any model work: max_pieces (413), max_queue (429).",
            ["reason"], registry=reg)

    # ------------------------------------------------------------------ updates
    def served(self, endpoint: str, scores: Iterable[float], n_kept: int, threshold: float,
               *, lists_unlike: bool = False) -> None:
        """Count one answered ``/filter`` or ``/query`` request's snippets and scores (and
        whether its list was unlike the calibration lists)."""
        values = [float(s) for s in scores]
        if lists_unlike:
            self.unlike_lists.labels(endpoint).inc()
        self.scored.labels(endpoint).inc(len(values))
        self.kept.labels(endpoint).inc(n_kept)
        if values:
            self.kept_share.labels(endpoint).observe(n_kept / len(values))
            if n_kept == 0:
                self.empty.labels(endpoint).inc()
        for value in values:
            if math.isfinite(value):
                self.scores.observe(value)
        self.threshold.set(threshold)

    def set_artifact(self, info: dict[str, Any], generation: int, threshold: float) -> None:
        """Show a newly served artifact: its info labels, generation and threshold."""
        labels = tuple(
            _label(info.get(k))
            for k in ("format_version", "library_version", "mode", "alpha", "checksum")
        )
        old = self._artifact_labels
        if old is not None and old != labels:
            if self.multiprocess:  # a file value cannot be removed: mark it stale
                self.artifact.labels(*old).set(0)
            else:
                self.artifact.remove(*old)
        self.artifact.labels(*labels).set(1)
        self._artifact_labels = labels
        self.generation.set(generation)
        self.threshold.set(threshold)

    def set_queue(self, requests: int, pieces: int) -> None:
        """Show the model queue: requests in it and the pieces they still need."""
        self.queue.set(requests)
        self.queue_pieces.set(pieces)

    def set_monitor(self, state: Any | None) -> None:
        """Show the monitor's state (``None``: no monitor; the martingale becomes NaN)."""
        if state is None:
            self.martingale.set(math.nan)
            self.alarm.set(0)
            return
        self.martingale.set(float(state.martingale))
        self.alarm.set(1 if state.alarm else 0)

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> bytes:
        """The metrics in Prometheus text format (all workers merged in multi-process mode)."""
        if self.multiprocess:
            registry = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return prom.generate_latest(registry)
        return prom.generate_latest(self.registry or prom.REGISTRY)

    content_type = prom.CONTENT_TYPE_LATEST

    def middleware(self, app: Any) -> Callable[[_Scope, Any, Any], Awaitable[None]]:
        """ASGI middleware counting every HTTP request by endpoint and status, and timing it.

        Installed outermost, so requests refused by the body limits (413, 408) are counted.
        """

        async def count(scope: _Scope, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "other"
            status = [500]

            async def send_status(message: _Message) -> None:
                if message["type"] == "http.response.start":
                    status[0] = int(message["status"])
                await send(message)

            t0 = time.perf_counter()
            try:
                await app(scope, receive, send_status)
            finally:
                self.latency.labels(endpoint).observe(time.perf_counter() - t0)
                code = str(status[0])
                self.requests.labels(endpoint, code).inc()
                if status[0] >= 400:
                    self.errors.labels(endpoint, code).inc()

        return count

    def mark_process_dead(self, pid: int | None = None) -> None:
        """Drop a finished worker's live gauges (multi-process mode; no-op otherwise)."""
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid() if pid is None else pid)
