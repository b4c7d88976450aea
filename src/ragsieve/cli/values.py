"""The values a command builds from its parsed options, once, at the edge.

Each ``cmd_*`` of the command modules (:mod:`ragsieve.cli.evaluating`,
:mod:`ragsieve.cli.filtering`, :mod:`ragsieve.cli.labelling`, :mod:`ragsieve.cli.serving`,
:mod:`ragsieve.cli.indexing`) reads its ``argparse.Namespace`` in one place and turns it
into small frozen values: the data source (:class:`DataSource`), the engine
(:class:`EngineOptions`), the LLM endpoint (:class:`LLMEndpoint`), the guarantee and its
calibrator parameters (:class:`GuaranteeOptions`, :func:`calibrator_params`), the scorer
(:class:`ragsieve.cli.scorers.ScorerRequest`) and the service's ``ServeOptions``.
Everything below the command takes these values, never the namespace.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.shards import DEFAULT_SHARD_BYTES
from .argtypes import BUDGET_UNITS, DEFAULT_DELTA, NotGiven
from .output import eprint

logger = logging.getLogger(__name__)

__all__ = [
    "CALIBRATOR_OPTIONS",
    "DataSource",
    "EngineOptions",
    "GuaranteeOptions",
    "LLMEndpoint",
    "budget_unit",
    "calibrator_params",
    "check_mode_list_params",
    "pruning_unit",
]


# ------------------------------------------------------------------ data
@dataclass(frozen=True)
class DataSource:
    """``--data`` (a JSONL or Parquet file, a directory of parts, or a dataset name) and
    ``--data-dir`` (where the datasets are)."""

    name: str
    data_dir: str | None = None

    def load(self, *, require_labels: bool = False,
             score_field: str | None = None) -> list[Any]:
        """Load the pairs.

        Parameters
        ----------
        require_labels : bool
            Every pair of a JSONL file must carry a 0/1 label.
        score_field : str, optional
            Every pair must hold a finite number under this key (``DataError`` naming
            file:line otherwise).
        """
        from ..data import load_dataset

        kw: dict[str, Any] = {}
        if str(self.name).endswith((".jsonl", ".parquet")) or Path(self.name).exists():
            if require_labels:
                kw["require_labels"] = True
        elif self.data_dir:
            kw["data_dir"] = self.data_dir
        if score_field is not None:
            kw["score_field"] = score_field
        t0 = time.perf_counter()
        pairs = load_dataset(self.name, **kw)
        logger.info("loaded %d pairs from %s in %.1fs", len(pairs), self.name,
                    time.perf_counter() - t0)
        return pairs

    def shard_inputs(self, *, limit_queries: int | None = None, seed: int = 0) -> list[Path]:
        """The data as files an engine can shard: a file or directory as it is; a dataset
        name (or a ``--limit-queries`` sample) written once as JSONL under the cache
        directory and reused, so that a rerun resumes on the same input."""
        import hashlib

        from .._paths import cache_dir
        from ..data import group_by_query, sample_queries, write_pairs

        path = Path(self.name)
        if limit_queries is None and (path.is_dir() or path.is_file()):
            return [path]
        key = json.dumps([str(path.resolve()) if path.exists() else str(self.name),
                          self.data_dir, limit_queries, seed])
        if path.exists():
            st = path.stat()
            key += f"{st.st_size}:{st.st_mtime_ns}"
        target = cache_dir() / "inputs" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.jsonl"
        if not target.is_file():
            pairs = self.load()
            if limit_queries:
                pairs = sample_queries(pairs, limit_queries, seed=seed)
            target.parent.mkdir(parents=True, exist_ok=True)
            write_pairs([pairs[i] for idx in group_by_query(pairs).values() for i in idx], target)
            logger.info("wrote the input of %s to %s", self.name, target)
        return [target]


# ------------------------------------------------------------------ engine
@dataclass(frozen=True)
class EngineOptions:
    """``--engine`` and its options (``add_engine_options``)."""

    engine: str = "local"
    ray_address: str | None = None
    workers: int | None = None
    shard_bytes: int = DEFAULT_SHARD_BYTES
    format: str | None = None
    overwrite: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineOptions:
        """The engine options of a parsed command line (``--format`` and ``--overwrite``
        only where the command writes a partitioned output)."""
        return cls(engine=args.engine, ray_address=args.ray_address, workers=args.workers,
                   shard_bytes=args.shard_bytes, format=getattr(args, "format", None),
                   overwrite=getattr(args, "overwrite", False))

    def make(self) -> Any:
        """The engine (a Ray engine starts or joins Ray when first used).

        Raises
        ------
        ValueError
            ``--ray-address`` or ``--workers`` with ``--engine local``.
        """
        from ..engines import make_engine as build

        if self.engine == "local":
            if self.ray_address or self.workers:
                raise ValueError("--ray-address and --workers apply to --engine ray only.")
            return build("local")
        return build("ray", address=self.ray_address, workers=self.workers)


# ------------------------------------------------------------------ LLM endpoint
@dataclass(frozen=True)
class LLMEndpoint:
    """The LLM endpoint options (``add_llm_options``)."""

    base_url: str | None = None
    model: str | None = None
    style: str | None = None
    threads: int | None = None
    concurrency: int | None = None
    api_key_env: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LLMEndpoint:
        """The endpoint of a parsed command line."""
        return cls(base_url=args.base_url, model=args.llm_model, style=args.llm_style,
                   threads=args.llm_threads, concurrency=args.llm_concurrency,
                   api_key_env=args.api_key_env)

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ragsieve.llm.connect``."""
        return {
            "base_url": self.base_url, "model": self.model, "style": self.style,
            "threads": self.threads, "concurrency": self.concurrency,
            "api_key_env": self.api_key_env,
        }


# ------------------------------------------------------------------ units
def pruning_unit(unit: str | None) -> str | None:
    """``--unit`` when it names a pruning unit (``snippet``, ``sentence``), else None."""
    return None if unit in BUDGET_UNITS else unit


def budget_unit(unit: str | None, given: str | None) -> str | None:
    """``--budget-unit`` (``given``), or the old ``--unit chars|tokens`` (a note on
    stderr).

    Raises
    ------
    ValueError
        Both given, and they differ.
    """
    if unit not in BUDGET_UNITS:
        return given
    if given is not None and given != unit:
        raise ValueError(f"--unit {unit} and --budget-unit {given} disagree; give --budget-unit "
                         "alone (--unit names the pruning unit: snippet or sentence).")
    eprint(f"note: --unit {unit} is the budget's unit: spell it --budget-unit {unit} "
           "(--unit is now the pruning unit, snippet or sentence)")
    return str(unit)


# ------------------------------------------------------------------ guarantee
@dataclass(frozen=True)
class GuaranteeOptions:
    """``--mode`` and the calibrator options (``add_guarantee_options``) as given: a number
    left at its default is a :class:`~ragsieve.cli.argtypes.NotGiven`, an option the
    command lacks is None. ``unit`` is ``--unit`` (its old spelling of the budget's unit,
    ``chars|tokens``, counts as ``--budget-unit``)."""

    mode: Any = "marginal"
    alpha: Any = None
    delta: float | NotGiven | None = None
    group_by: str | None = None
    min_group_size: int | None = None
    budget: Any = None
    budget_unit: str | None = None
    unit: str | None = None
    gamma: float | None = None
    window: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GuaranteeOptions:
        """The guarantee options of a parsed command line."""
        return cls(mode=args.mode, alpha=getattr(args, "alpha", None), delta=args.delta,
                   group_by=args.group_by, min_group_size=args.min_group_size,
                   budget=args.budget, budget_unit=getattr(args, "budget_unit", None),
                   unit=getattr(args, "unit", None), gamma=getattr(args, "gamma", None),
                   window=getattr(args, "window", None))

    def option(self, name: str) -> Any:
        """The value of the calibrator parameter ``name`` (None: not given)."""
        return budget_unit(self.unit, self.budget_unit) if name == "unit" else getattr(self, name)


#: ``calibrate``'s options that are calibrator parameters (``unit``: the budget's, given as
#: ``--budget-unit``).
CALIBRATOR_OPTIONS = ("alpha", "delta", "min_group_size", "budget", "unit", "gamma", "window")


def calibrator_params(options: GuaranteeOptions) -> dict[str, Any]:
    """Keyword arguments of ``make_calibrator`` from ``calibrate``'s options.

    Only options the user gave count (None: not given, the calibrator keeps its own
    default; ``--delta`` is :data:`DEFAULT_DELTA` for the modes that take one, ``--alpha``
    has its own default); a given option the mode does not take is an error.

    Raises
    ------
    ValueError
        ``--mode budget`` without ``--budget``, ``--mode group`` without ``--group-by``,
        or an option the mode does not take (``--mode marginal --delta 0.05``).
    """
    from ..calibration.modes import mode_params

    if options.mode == "budget" and options.budget is None:
        raise ValueError("--mode budget needs --budget N, the context budget per query "
                         "(in --budget-unit, default chars).")
    if options.mode == "group" and not options.group_by:
        raise ValueError("--mode group needs --group-by FIELD, the meta field (JSONL key) to "
                         "calibrate per, e.g. --group-by language.")
    values = {k: options.option(k) for k in CALIBRATOR_OPTIONS}
    given = {k: v for k, v in values.items() if v is not None and not isinstance(v, NotGiven)}
    taken = [k for k in CALIBRATOR_OPTIONS if k in mode_params(options.mode)]
    refused = [k for k in given if k not in taken]
    if refused:
        raise ValueError(f"--mode {options.mode} does not take "
                         f"{', '.join(map(_flag, refused))}; "
                         f"it takes: {', '.join(map(_flag, taken))}.")
    if "delta" in taken and "delta" not in given:
        given["delta"] = DEFAULT_DELTA
    return given


def check_mode_list_params(options: GuaranteeOptions) -> None:
    """``evaluate``/``choose-alpha``'s calibrator options against the listed modes: an
    option given on the command line that none of them takes is an error (never ignored).

    Raises
    ------
    ValueError
        E.g. ``--mode marginal,topic --delta 0.05`` (no listed mode takes delta).
    """
    from ..calibration.modes import mode_params

    modes = list(options.mode) if isinstance(options.mode, (list, tuple)) else [options.mode]
    if options.budget:
        modes.append("budget")  # --budget N adds the budget rows
    taken = {k for m in modes for k in mode_params(m)}
    for name in ("delta", "min_group_size", "unit", "gamma", "window"):
        value = options.option(name)
        if value is not None and not isinstance(value, NotGiven) and name not in taken:
            raise ValueError(f"{_flag(name)} applies to none of the modes {', '.join(modes)}: "
                             f"add a mode that takes it, or drop {_flag(name)}.")


def _flag(name: str) -> str:
    return "--budget-unit" if name == "unit" else "--" + name.replace("_", "-")
