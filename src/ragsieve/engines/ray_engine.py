"""The Ray engine: shards processed by a pool of Ray actors, each holding the model.

Ray Data schedules the work: a dataset of shard descriptions (one block per shard) goes
through ``map_batches`` with an actor class, so each actor sets the task up once (loads
the embedding model, starts or reaches the LLM) and then reads, scores and writes one
shard after another. The driver only plans shards from file sizes and Parquet footers
and records each finished part in the manifest as its entry streams back; it never reads
the pairs. Workers read the inputs and write the parts themselves, so on a cluster the
inputs and the output directory must be on storage every node sees (a shared or network
file system).

Faults: Ray Data restarts a dead actor and retries its task (``max_restarts=-1``,
``max_task_retries=-1`` are its defaults for actor pools). A retried shard writes its
part afresh from a new temporary file; the part is renamed into place and recorded once,
so every pair is in the output once. A killed driver leaves the recorded parts: rerun the
same command and only the missing shards are processed.

Ray's start-up is kept off the network: usage statistics are disabled
(``RAY_USAGE_STATS_ENABLED=0``) and the dashboard is not started.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .._closing import Closing
from .._validation import check_int, check_real
from ..data.shards import Shard
from .base import Task, process_shard

__all__ = ["PROBE_TIMEOUT", "RayEngine", "probe_address"]

logger = logging.getLogger(__name__)


PROBE_TIMEOUT = 5.0
"""Seconds a TCP connection to ``address`` may take before the engine gives up on it
(``ray.init`` itself waits minutes for a cluster that is not there)."""


def probe_address(address: str, *, timeout: float = PROBE_TIMEOUT) -> None:
    """Check that something listens at a Ray address before Ray is asked to join it.

    ``"auto"`` and ``"local"`` are left to Ray; at ``HOST:PORT`` and ``ray://HOST:PORT``
    one TCP connection must open and answer the HTTP/2 preface (Ray's servers speak
    gRPC), else ``ray.init`` would wait for minutes.

    Raises
    ------
    ValueError
        The address is neither of those forms.
    ConnectionError
        Nothing accepted the connection within ``timeout`` seconds, or what did is not a
        gRPC server.
    """
    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"Ray address {address!r}: expected HOST:PORT (as `ray start --head` "
                         "prints it), ray://HOST:PORT or auto.")
    try:
        speaks_grpc = _speaks_http2((host.strip("[]"), int(port)), timeout)
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConnectionError(
            f"no Ray cluster at {address}: {reason.lower()} (waited at most {timeout:g} s); "
            "start one with `ray start --head`, or leave out the address to run Ray "
            "locally.") from None
    if not speaks_grpc:
        raise ConnectionError(
            f"no Ray cluster at {address}: something listens there but does not answer as "
            "Ray's gRPC server does; check the address `ray start --head` printed.")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04" + bytes(5)
"""The HTTP/2 client preface followed by an empty SETTINGS frame."""


def _speaks_http2(target: tuple[str, int], timeout: float) -> bool:
    """Whether the server at ``target`` answers the HTTP/2 preface with a SETTINGS frame,
    as every gRPC server (Ray's GCS and client server among them) does at once."""
    with socket.create_connection(target, timeout=timeout) as conn:
        conn.sendall(_HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    return head[3] == 0x04  # frame type SETTINGS


def _import_ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home
    from .._optional import require

    return require("ray", "ray")


class _ShardWorker:
    """A Ray Data actor: sets the task up once, then processes one shard per call."""

    def __init__(self, task: Task, directory: str, fmt: str, batch_pairs: int,
                 threads: int) -> None:
        self.task, self.directory, self.fmt, self.batch_pairs = task, directory, fmt, batch_pairs
        # one actor per reserved CPU count: its model's threads must not use the others'
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        task.setup()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from ..errors import RagsieveError

        entries = []
        for item in batch["shard"]:
            try:
                entry = process_shard(self.task, Shard.from_dict(json.loads(str(item))),
                                      self.directory, self.fmt, self.batch_pairs)
            except (RagsieveError, ValueError, OSError) as exc:  # bad input: report, not retry
                entry = _error_entry(exc)
            entries.append(json.dumps(entry))
        return {"entry": np.array(entries, dtype=object)}


def _error_entry(exc: BaseException) -> dict[str, Any]:
    """An expected error of a worker as data (Ray loses the cause of a raised one)."""
    return {"error": {"module": type(exc).__module__, "name": type(exc).__name__,
                      "message": str(exc), "status": getattr(exc, "status", None)}}


def _raise_error_entry(error: dict[str, Any]) -> None:
    """Raise a worker's error on the driver as the same one-line exception."""
    from .. import errors

    name, message = str(error.get("name")), str(error.get("message"))
    cls: Any = None
    if str(error.get("module", "")).startswith("ragsieve."):
        cls = getattr(errors, name, None)
    elif name in ("ValueError", "OSError", "FileNotFoundError", "PermissionError"):
        cls = {"ValueError": ValueError, "OSError": OSError,
               "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError}[name]
    if cls is None:
        raise RuntimeError(f"a Ray worker failed: {name}: {message}")
    if name == "LLMError":
        raise cls(message, status=error.get("status"))
    raise cls(message)


class RayEngine(Closing):
    """Process shards on a Ray cluster (see the module docstring).

    Parameters
    ----------
    address : str, optional
        A running cluster (``ray start --head`` prints it, e.g. ``"10.0.0.1:6379"``, or
        ``"auto"``). None starts a local Ray runtime for this process and stops it on
        :meth:`close`.
    workers : int, optional
        Actors in the pool (default: the cluster's CPUs // ``cpus_per_worker``).
    cpus_per_worker : float, default 1
        CPUs reserved per actor (its model's threads).
    num_cpus : int, optional
        CPUs of a local runtime started here (default: all).

    Raises
    ------
    ImportError
        Ray is not installed: ``pip install 'ragsieve[ray]'``.
    ConnectionError
        Nothing listens at ``address`` (:func:`probe_address`, within
        :data:`PROBE_TIMEOUT` seconds).
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, workers: int | None = None,
                 cpus_per_worker: float = 1.0, num_cpus: int | None = None) -> None:
        workers = check_int(workers, "workers", min_value=1, allow_none=True)
        cpus_per_worker = check_real(cpus_per_worker, "cpus_per_worker", min_value=0,
                                     max_value=math.inf, include_boundaries="neither")
        if address is not None:
            probe_address(address)  # fail in seconds, before any data is read
        self.address = address
        self.workers = workers
        self.cpus_per_worker = float(cpus_per_worker)
        self.num_cpus = num_cpus
        self._ray = _import_ray()
        self._started = False

    def _ensure_started(self) -> Any:
        ray = self._ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False,
                                      "logging_level": logging.WARNING}
            if self.address is None and self.num_cpus is not None:
                kwargs["num_cpus"] = self.num_cpus
            ray.init(address=self.address, **kwargs)
            self._started = True
        return ray

    def _pool_size(self, ray: Any, n_shards: int) -> int:
        if self.workers is not None:
            return min(self.workers, max(n_shards, 1))
        cpus = float(ray.cluster_resources().get("CPU", 1))
        return max(1, min(int(cpus // self.cpus_per_worker), max(n_shards, 1)))

    def map_shards(self, task: Task, shards: Sequence[Shard], directory: Path, fmt: str,
                   batch_pairs: int, progress: bool) -> Iterator[dict[str, Any]]:
        """Yield each shard's part entry as its actor finishes it (any order)."""
        if not shards:
            return
        ray = self._ensure_started()
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = progress
        items = [{"shard": json.dumps(s.to_dict())} for s in shards]
        dataset = ray.data.from_items(items, override_num_blocks=len(items))
        results = dataset.map_batches(
            _ShardWorker,
            fn_constructor_kwargs={"task": task, "directory": str(Path(directory).resolve()),
                                   "fmt": fmt, "batch_pairs": batch_pairs,
                                   "threads": max(1, int(self.cpus_per_worker))},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=self._pool_size(ray, len(shards))),
            num_cpus=self.cpus_per_worker,
        )
        for row in results.iter_rows():
            entry = json.loads(str(row["entry"]))
            if "error" in entry:
                _raise_error_entry(entry["error"])
            yield entry

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"engine": self.name, "address": self.address or "local",
                                "workers": self.workers, "cpus_per_worker": self.cpus_per_worker}
        if self._ray.is_initialized():
            info["cluster_cpus"] = self._ray.cluster_resources().get("CPU")
        return info

    def close(self) -> None:
        """Stop the local runtime this engine started (a cluster it joined keeps running)."""
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False
