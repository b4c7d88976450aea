"""Engines: score, filter and label inputs of any size, locally or on Ray.

* :mod:`~ragsieve.engines.base` -- the task contract, one shard's work, a resumable run.
* :mod:`~ragsieve.engines.tasks` -- :class:`ScoreTask` and :class:`FilterTask`.
* :mod:`~ragsieve.engines.local` -- :class:`LocalEngine`, streaming in this process.
* :mod:`~ragsieve.engines.ray_engine` -- :class:`RayEngine`, a pool of Ray actors.

Inputs are cut into shards that keep every query's list whole
(:mod:`ragsieve.data.shards`); outputs are parts with a manifest
(:mod:`ragsieve.data.partitioned`), so a killed run resumes without duplicates.
"""

from __future__ import annotations

from typing import Any

from .base import (
    DEFAULT_BATCH_PAIRS,
    Engine,
    JobOutput,
    RunReport,
    Task,
    process_shard,
    run_job,
)
from .local import LocalEngine
from .tasks import FilterTask, ScoreTask, filter_record

__all__ = [
    "DEFAULT_BATCH_PAIRS",
    "ENGINES",
    "Engine",
    "FilterTask",
    "JobOutput",
    "LocalEngine",
    "RunReport",
    "ScoreTask",
    "Task",
    "filter_record",
    "make_engine",
    "process_shard",
    "run_job",
]

ENGINES: tuple[str, ...] = ("local", "ray")
"""Engine names accepted by :func:`make_engine` (and ``--engine``)."""


def make_engine(name: str = "local", *, address: str | None = None, workers: int | None = None,
                **options: Any) -> Any:
    """The engine called ``name``.

    Parameters
    ----------
    name : {"local", "ray"}
    address : str, optional
        Ray only: the cluster to join (None starts a local runtime).
    workers : int, optional
        Ray only: actors in the pool.
    **options
        Further options of :class:`~ragsieve.engines.ray_engine.RayEngine`.

    Raises
    ------
    ValueError
        An unknown name, or Ray options with the local engine.
    ImportError
        ``"ray"`` without Ray installed (``pip install 'ragsieve[ray]'``).
    """
    if name == "local":
        if address is not None or workers not in (None, 1) or options:
            raise ValueError("--ray-address and --workers apply to --engine ray only.")
        return LocalEngine()
    if name == "ray":
        from .ray_engine import RayEngine

        return RayEngine(address, workers=workers, **options)
    raise ValueError(f"engine == {name!r}, expected one of {', '.join(ENGINES)}.")
