"""What several ``ragsieve`` subcommands share: the threshold as printed, closing an
engine, running an engine job and its one-line summary, the index vectors taken for
``retrieve`` pairs.

These helpers are private to the package :mod:`ragsieve.cli`: the command modules
(:mod:`~ragsieve.cli.evaluating`, :mod:`~ragsieve.cli.filtering`,
:mod:`~ragsieve.cli.labelling`, :mod:`~ragsieve.cli.serving`) import them by name, each
from here and nowhere else, and this module imports no command module.
"""

from __future__ import annotations

from typing import Any

from .output import eprint
from .values import EngineOptions

__all__: list[str] = []  # private helpers of the command modules


def _tau(value: float) -> str:
    return f"{value:.4f}"


def _close(engine: Any) -> None:
    closer = getattr(engine, "close", None)
    if callable(closer):
        closer()


def _index_vectors(pairs: Any, scorer: Any, *, cache_dir: Any = None,
                   quiet: bool = False) -> list[str]:
    """The stored vectors of the index the ``retrieve`` pairs name, put into ``scorer``'s
    embedding cache (:func:`ragsieve.index_vectors.reuse_index_vectors`), so those snippets
    are not embedded again; each note said once on stderr (``index: ...``) unless ``quiet``,
    and returned for ``--json``."""
    from ..index_vectors import reuse_index_vectors

    notes = reuse_index_vectors(pairs, scorer, cache_dir=cache_dir)
    if not quiet:
        for note in notes:
            eprint(f"index: {note}")
    return notes


def _run_job(options: EngineOptions, task: Any, inputs: list[Any], *, out: str,
             progress: bool) -> Any:
    """Run an engine job with the engine ``options``, writing ``out``; the engine is
    closed afterwards."""
    from ..engines import JobOutput, run_job

    engine = options.make()
    try:
        return run_job(task, inputs, JobOutput(out, options.format, options.overwrite), engine,
                       shard_bytes=options.shard_bytes, progress=progress)
    finally:
        _close(engine)


def _job_line(report: Any) -> str:
    e = report.engine
    where = "this process" if e.get("engine") == "local" else (
        f"Ray ({e.get('address')}, {e.get('workers') or 'one per CPU'} workers)")
    resumed = f", {report.n_resumed} already written by an earlier run" if report.n_resumed else ""
    shards = "shard" if report.n_shards == 1 else "shards"
    return (f"  {report.pairs} pairs in {report.n_shards} {shards}{resumed}; "
            f"{report.seconds:.1f} s on {where}, {report.pairs_per_second:.1f} pairs/s")
