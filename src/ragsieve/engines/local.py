"""The local engine: every shard in this process, one after the other, streaming.

Memory is bounded by one batch of pairs (``batch_pairs``) plus the models, whatever the
size of the input: shards are read line by line and parts are written as they fill.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..data.shards import Shard
from .base import Task, process_shard

__all__ = ["LocalEngine"]


class LocalEngine:
    """Process shards in this process (see the module docstring)."""

    name = "local"

    def map_shards(self, task: Task, shards: Sequence[Shard], directory: Path, fmt: str,
                   batch_pairs: int, progress: bool) -> Iterator[dict[str, Any]]:
        """Yield each shard's part entry as soon as the part is written."""
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        if not shards:
            return
        task.setup()
        try:
            with tqdm(total=len(shards), desc=f"{task.kind} (local)", unit="shard",
                      disable=not progress) as bar:
                for shard in shards:
                    yield process_shard(task, shard, directory, fmt, batch_pairs)
                    bar.update(1)
        finally:
            task.close()

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": 1}
