"""The runtime of one app: what outlives an artifact swap, and the swap itself.

A :class:`Runtime` holds the model thread (:class:`~ragsieve.server.model_work.ModelWork`),
the served index, the feedback store, the metrics, the monitors' state directory and the
current :class:`~ragsieve.server.service.Service` in one attribute. It checks an artifact by
building what it would serve from it (:func:`~ragsieve.server.reload.check_artifact`, the
``/healthz`` view, one score computed with a new scorer), builds the service of a published
generation (model warmed up, monitor and list check attached: kept for the same artifact,
reset for another) and swaps it in; a worker that cannot build the newest generation
serves the newest one it can and says so (``published_generation``, ``degraded``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..artifact import Artifact
from ..errors import ArtifactError
from ..filter import ConformalFilter
from .answers import artifact_view, index_info
from .feedback import AdaptiveThreshold, FeedbackStore
from .list_store import SharedListWatch, lists_path
from .metrics import ServiceMetrics
from .model_work import ModelWork
from .options import ServeOptions
from .page import RecentRequests
from .parsing import printable
from .reload import ArtifactCheck, Generation, Generations, check_artifact, probe_scorer
from .service import Service
from .state import monitor_from_artifact, monitor_path, reset_shared_monitor

__all__ = ["NO_MONITOR", "Runtime"]

# the service's log lines keep the name they have always had (operators filter on it)
logger = logging.getLogger("ragsieve.server.service")

NO_MONITOR = "artifact has no monitor reference; recalibrate to enable the alarm"


class Runtime:
    """What an app keeps across artifact swaps, and the current :class:`Service`.

    Parameters
    ----------
    options : ServeOptions
        The service's settings (limits, scorer options, adaptive, monitor delta, warm-up,
        feedback caps); read here once.
    generations : Generations
        The control file the artifact generations are published in.
    store : FeedbackStore
        Served scores, labels and the adaptive state.
    metrics : ServiceMetrics
    index : SnippetIndex or None
    monitor_dir : Path, optional
        Directory of the shared monitor stores (one SQLite file per artifact checksum), for
        several worker processes; None keeps the monitor in memory.
    monitor_factory : callable, optional
        ``(payload, delta=, store=) -> monitor or None`` (default
        :func:`monitor_from_artifact`).
    """

    def __init__(self, options: ServeOptions, *, generations: Generations,
                 store: FeedbackStore, metrics: ServiceMetrics, index: Any,
                 monitor_dir: Path | None,
                 monitor_factory: Callable[..., Any] | None = None) -> None:
        self.options = options
        self.generations = generations
        self.store = store
        self.metrics = metrics
        self.index = index
        self.index_lock = threading.Lock()
        self.scorer_options = dict(options.scorer_options)
        self.max_snippets = options.max_snippets
        self.max_k = options.max_k
        self.max_pieces = options.max_pieces
        self.max_queue = options.max_queue
        self.max_labels_per_query = options.max_labels_per_query
        self.max_labels_per_minute = options.max_labels_per_minute
        self.adaptive = options.adaptive
        self.monitor_delta = options.monitor_delta
        self.monitor_dir = monitor_dir
        self.warmup = options.warmup
        self.monitor_factory = monitor_factory or monitor_from_artifact
        self.index_info = index_info(index)
        self.swap_lock = threading.Lock()
        self._refused_generation = 0
        self.model_work = ModelWork(max_pieces=options.max_pieces, max_queue=options.max_queue,
                                    metrics=metrics)  # the one model thread
        # what is served, the newest published generation and why that one is not served
        # (None: it is): one record written at once, so /healthz never reads a mix
        self._served = _Served(None, None, None)
        self.recent = RecentRequests()  # the last requests' kept/total counts (GET /status)

    #: What ``/healthz`` shows of a served index (:func:`~ragsieve.server.answers.index_info`).
    index_info_of = staticmethod(index_info)

    def close(self) -> None:
        """Stop the model thread (after the step it is running, if any) and close the files."""
        self.model_work.close()
        monitor = None if self.service is None else self.service.monitor
        watch: Any = None if self.service is None else self.service.flt.list_watch
        for closable in (self.store, self.generations, monitor, watch):
            if closable is None or not callable(getattr(closable, "close", None)):
                continue
            try:
                closable.close()
            except Exception:  # pragma: no cover
                logger.exception("closing %r failed", closable)

    @property
    def current(self) -> Service:
        """The service requests are answered with now."""
        service = self.service
        if service is None:  # pragma: no cover - set before the app serves
            raise RuntimeError("no artifact loaded yet")
        return service

    # ------------------------------------------------------------------ monitor
    def monitor_store(self, checksum: str) -> Path | None:
        """The shared monitor file of an artifact (None: the monitor lives in memory)."""
        if self.monitor_dir is None:
            return None
        return monitor_path(self.monitor_dir, checksum)

    def check_monitor(self, artifact: Artifact) -> None:
        """Build (and drop) an artifact's monitor in memory: raises on a malformed reference."""
        self.monitor_factory(artifact, delta=self.monitor_delta, store=None)

    def before_publish(self, checked: ArtifactCheck, previous_checksum: str | None) -> None:
        """Reset the shared monitor store of a newly published, different artifact."""
        if checked.checksum != previous_checksum and self.monitor_dir is not None:
            reset_shared_monitor(checked.artifact, checked.checksum, self.monitor_dir,
                                 self.monitor_delta, self.monitor_factory)

    def _list_watch(self, flt: ConformalFilter, checksum: str) -> Any:
        """The filter's list check, kept in the state directory when there is one."""
        watch = flt.list_watch
        if watch is None or self.monitor_dir is None:
            return watch
        try:
            return SharedListWatch(watch, lists_path(self.monitor_dir, checksum))
        except (sqlite3.Error, OSError) as exc:
            logger.error("list check state %s cannot be used (%s); the check runs in memory",
                         lists_path(self.monitor_dir, checksum), exc)
            return watch

    def reset_monitors(self, service: Service) -> tuple[Any, bool]:
        """Reset a service's exchangeability monitor (its state, or None without one) and
        its list check (True when it has one that watches: a list-dependent score):
        ``POST /admin/monitor/reset``."""
        state = None
        if service.monitor is not None:
            service.monitor.reset()
            state = service.monitor.state
            self.metrics.set_monitor(state)
        watch = service.flt.list_watch
        if watch is None or not watch.active:
            return state, False
        watch.reset()
        return state, True

    # ------------------------------------------------------------------ building, swapping
    def check_to_publish(self, text: str, source: str) -> ArtifactCheck:
        """:meth:`check`, then one score computed with the new scorer (model and weights
        loaded: :func:`probe_scorer`) in the model thread: what a reload publishes."""
        checked = self.check(text, source)
        current = self.service
        if current is None or checked.filter.scorer_ is not current.flt.scorer_:
            probe_scorer(checked, source, self.model_work.in_model_thread)
        return checked

    def check(self, text: str, source: str) -> ArtifactCheck:
        """Check an artifact by building what this runtime would serve from it
        (:func:`check_artifact`, then :func:`artifact_view`)."""
        current = self.service
        checked = check_artifact(
            text, source, scorer_options=self.scorer_options,
            index_path=None if self.index is None else self.index.path, adaptive=self.adaptive,
            monitor_check=self.check_monitor,
            scorer=None if current is None else current.flt.scorer_,
            verify_key=self.options.verify_key())
        artifact_view(checked)
        return checked

    def build(self, checked: ArtifactCheck, generation: int) -> Service:
        """A service for a checked artifact: model warmed up, monitor and adaptive attached."""
        flt = checked.filter
        current = self.service
        if self.index is not None:
            from ..filtered_search import list_scorer

            list_scorer(self.index, flt)
        reused = current is not None and flt.scorer_ is current.flt.scorer_
        if self.warmup and not reused and not flt.scorer_.tags.model_free:
            self.model_work.in_model_thread(
                lambda: flt.scorer_.score_batch("warm-up", ["warm-up"]))
        if current is not None and current.checksum == checked.checksum:
            monitor = current.monitor  # the same artifact again: the martingale goes on
            flt.list_watch = current.flt.list_watch  # and so does the list check
        else:
            flt.list_watch = self._list_watch(flt, checked.checksum)
            monitor = self.monitor_factory(checked.artifact, delta=self.monitor_delta,
                                           store=self.monitor_store(checked.checksum))
            if monitor is None:
                logger.warning("%s (checksum %s)", NO_MONITOR, checked.checksum[:12])
        adaptive = None
        if self.adaptive:
            adaptive = AdaptiveThreshold(self.store, checked.checksum, flt.calibrator_)
        return Service(self, checked, generation, monitor=monitor, adaptive=adaptive)

    @property
    def service(self) -> Service | None:
        """The service requests are answered with (None before the first is built)."""
        return self._served.service

    @property
    def published(self) -> tuple[int | None, str | None]:
        """The newest published generation and why it is not served here (None: it is),
        read together."""
        served = self._served
        return served.published_generation, served.degraded

    def swap(self, service: Service, *, published: int | None = None,
             refusal: str | None = None) -> None:
        """Serve ``service`` from the next request on (in-flight requests keep theirs), the
        newest published generation being ``published`` (default: the service's) and
        ``refusal`` why it is not the one served (None: it is)."""
        old = self.service
        number = service.generation if published is None else published
        # one attribute write: atomic for the request threads
        self._served = _Served(service, number, _degraded(service, refusal))
        self.metrics.set_artifact(service.info.model_dump(), service.generation, service.threshold)
        self.metrics.set_monitor(None if service.monitor is None else service.monitor.state)
        if old is None:
            return
        watch: Any = old.flt.list_watch
        if watch is not None and watch is not service.flt.list_watch \
                and callable(getattr(watch, "close", None)):
            watch.close()  # its file: the old artifact's (in-flight requests go on in memory)
        logger.warning("pid %d now serves generation %d (checksum %s, mode %s; was generation "
                       "%d, checksum %s)", os.getpid(), service.generation, service.checksum[:12],
                       service.flt.mode, old.generation, old.checksum[:12])

    def load_generation(self, gen: Generation) -> Service:
        """Build and swap in a published generation (``ArtifactError`` keeps the old one)."""
        checked = self.check_to_publish(gen.text, f"generation {gen.number}")
        service = self.build(checked, gen.number)
        self.swap(service, published=gen.number)
        return service

    def start(self, generations: Sequence[Generation],
              prepare: Callable[[ArtifactCheck], object] | None = None, *,
              checked: ArtifactCheck | None = None) -> Service:
        """Serve the newest of ``generations`` (newest first) that can be built.

        A worker starting after a crash walks back to an older generation rather than die
        on one it cannot build; ``/healthz`` then reports ``degraded``. ``prepare(checked)``
        runs before the first build (the app opens its index there); ``checked`` is the
        first generation already checked (a single app checks the file before publishing).

        Raises
        ------
        ArtifactError
            No generation can be built (the reasons of all of them); with one generation,
            the error that stopped it.
        """
        reasons: list[str] = []
        error: BaseException | None = None
        for i, gen in enumerate(generations):
            try:
                if i or checked is None:
                    checked = self.check(gen.text, f"generation {gen.number}")
                if prepare is not None:
                    prepare(checked)
                self.swap(self.build(checked, gen.number), published=generations[0].number,
                          refusal=reasons[0] if reasons else None)
            except Exception as exc:  # noqa: BLE001 (a scorer's load error is any type)
                reasons.append(f"generation {gen.number}: {exc}")
                error = exc
                if i + 1 < len(generations):
                    logger.error("pid %d cannot serve generation %d (%s); trying generation %d",
                                 os.getpid(), gen.number, exc, generations[i + 1].number)
                continue
            self._refused_generation = generations[0].number if reasons else 0
            return self.current
        if len(reasons) == 1 and error is not None:
            raise error
        raise ArtifactError("no published generation can be served here: " + "; ".join(reasons)
                            if reasons else "no generation is published")

    def _set_published(self, number: int, refusal: str | None) -> None:
        """Record the newest published generation and why it is not served (None: it is)."""
        service = self.current
        self._served = _Served(service, number, _degraded(service, refusal))

    def sync(self) -> None:
        """Swap in the newest published generation if it is newer than the served one.

        One that cannot be built is tried once (logged); the served one stays and
        ``/healthz`` says so (``degraded``) until a newer generation is served.
        """
        current = self.service
        latest = self.generations.latest_number()
        if current is not None and latest <= current.generation:
            if latest == current.generation:
                self._set_published(latest, None)
            return
        with self.swap_lock:
            gen = self.generations.latest()
            current = self.service
            if gen is None or (current is not None and gen.number <= current.generation):
                return
            if gen.number == self._refused_generation:
                return  # refused once already (logged); wait for the next generation
            try:
                self.load_generation(gen)
                self.metrics.reloads.labels("loaded").inc()
            except Exception as exc:  # noqa: BLE001 (a scorer's load error is any type): logged once
                self._refused_generation = gen.number
                self.metrics.reloads.labels("refused").inc()
                self._set_published(gen.number, f"generation {gen.number}: {printable(str(exc))}")
                logger.error("pid %d cannot serve generation %d: %s; still serving generation %s",
                             os.getpid(), gen.number, exc,
                             None if current is None else current.generation)


class _Served(NamedTuple):
    """What a runtime serves and what it knows of the newest published generation."""

    service: Service | None
    published_generation: int | None
    degraded: str | None


def _degraded(service: Service, refusal: str | None) -> str | None:
    """``/healthz``'s ``degraded``: why the newest generation is not served (None: it is)."""
    return None if refusal is None else (
        f"serving generation {service.generation}, not the newest ({refusal})")
