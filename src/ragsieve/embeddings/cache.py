"""The per-text embedding cache: in memory (bounded), optionally persisted to SQLite."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import numpy as np

from .._sqlite import close_quietly, open_table
from .._validation import check_instance, check_int, check_sequence, check_str
from ..errors import ScorerError
from .base import EmbeddingModel, _normalise_rows, _QueryView

__all__ = ["EmbeddingCache"]

logger = logging.getLogger(__name__)


def _check_texts(texts: Sequence[str]) -> list[str]:
    out = check_sequence(texts, "texts", expected="a list of str", iterable=True)
    for i, t in enumerate(out):
        check_str(t, f"texts[{i}]")
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_TABLE = "embeddings"
_COLUMNS = ["model_id", "text_sha256", "dim", "vector"]
_SQL_CHUNK = 500  # stays below SQLite's bound-variable limit


class EmbeddingCache:
    """Per-text embedding cache in memory, optionally persisted to SQLite.

    Rows are keyed by ``(model.cache_id, sha256(text))`` (the model and its backend) and stored as float32 bytes in
    ``cache_dir/embeddings.sqlite``. A corrupt or unusable cache file is reported with a
    logged warning and the cache continues in memory only. Thread-safe within one process.

    Parameters
    ----------
    model : EmbeddingModel
        The model computing missing embeddings.
    cache_dir : str, os.PathLike or None
        Directory of the SQLite file; ``None`` keeps the cache in memory only.
    batch_size : int
        Most texts per call to ``model.embed_batch``.
    max_batch_chars : int
        Character budget of one call, counted as padded: ``n_texts * len(longest text)``.
        Texts to compute are sorted by length (characters, a proxy for tokens) and cut into
        batches of at most ``batch_size`` texts whose padded size stays within this budget
        (a single longer text forms its own batch). Sorting keeps short texts from being
        padded to long ones, which is faster on torch and ONNX alike; the budget bounds
        memory. The default, 32,000 characters, is about 8k tokens. Rows are returned in
        input order.
    max_memory_items : int
        Vectors kept in memory; beyond it the least recently used are dropped (they stay
        in the SQLite file when persisting). Bounds the memory of a long streaming run:
        100,000 vectors of 384 floats take about 150 MB. One ``embed`` call may exceed it
        by its own size until it returns.

    Attributes
    ----------
    n_computed : int
        Number of texts actually sent to the model so far.
    path : pathlib.Path or None
        The SQLite file, or None when not persisting.
    """

    def __init__(
        self,
        model: EmbeddingModel,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 32,
        max_batch_chars: int = 32_000,
        max_memory_items: int = 100_000,
    ) -> None:
        self.model = check_instance(model, EmbeddingModel, "model",
                                    expected="an EmbeddingModel")
        self.max_memory_items = check_int(max_memory_items, "max_memory_items", min_value=1)
        self.batch_size = check_int(batch_size, "batch_size", min_value=1)
        self.max_batch_chars = check_int(max_batch_chars, "max_batch_chars", min_value=1)
        self.n_computed = 0
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries: EmbeddingCache | None = None  # query side of an asymmetric model
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self.path: Path | None = None
        if cache_dir is not None:
            self.path = Path(cache_dir) / "embeddings.sqlite"
            self._open()

    @property
    def persistent(self) -> bool:
        """True while vectors are also written to the SQLite file."""
        return self._db is not None

    def __len__(self) -> int:
        return len(self._memory)

    def _open(self) -> None:
        assert self.path is not None
        try:
            db = open_table(
                self.path, _TABLE,
                f"CREATE TABLE IF NOT EXISTS {_TABLE} (model_id TEXT NOT NULL, "
                    "text_sha256 TEXT NOT NULL, dim INTEGER NOT NULL, vector BLOB NOT NULL, "
                    "PRIMARY KEY (model_id, text_sha256))",
                _COLUMNS, wal=False,
            )
        except (sqlite3.Error, OSError) as exc:
            self._disable(f"cannot use embedding cache file {self.path} ({exc})")
            return
        self._db = db

    def _disable(self, reason: str) -> None:
        logger.warning("%s; continuing with an in-memory cache only.", reason)
        close_quietly(self._db)
        self._db = None

    def close(self) -> None:
        """Close the SQLite file (the in-memory cache stays usable)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._queries is not None:
                self._queries.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _load_from_db(self, keys: list[str]) -> None:
        if self._db is None or not keys:
            return
        dim = self.model.dim
        try:
            for i in range(0, len(keys), _SQL_CHUNK):
                chunk = keys[i : i + _SQL_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT text_sha256, dim, vector FROM {_TABLE} "
                    f"WHERE model_id = ? AND text_sha256 IN ({marks})",
                    [self.model.cache_id, *chunk],
                ).fetchall()
                for key, row_dim, blob in rows:
                    vec = np.frombuffer(blob, dtype=np.float32) if isinstance(blob, bytes) else None
                    if (
                        row_dim != dim
                        or vec is None
                        or vec.size != dim
                        or not np.isfinite(vec).all()
                    ):
                        logger.warning("ignoring a malformed cached vector for %s", key[:12])
                        continue
                    self._memory[key] = vec.copy()
        except sqlite3.Error as exc:
            self._disable(f"cannot read embedding cache file {self.path} ({exc})")

    def _store(self, keys: list[str], vecs: np.ndarray) -> None:
        for key, vec in zip(keys, vecs):
            self._memory[key] = vec
        if self._db is None:
            return
        rows = [(self.model.cache_id, k, int(v.size), v.tobytes()) for k, v in zip(keys, vecs)]
        try:
            with self._db:
                self._db.executemany(f"INSERT OR REPLACE INTO {_TABLE} VALUES (?, ?, ?, ?)", rows)
        except sqlite3.Error as exc:
            self._disable(f"cannot write embedding cache file {self.path} ({exc})")

    def _compute(self, texts: list[str]) -> np.ndarray:
        vecs = self.model.embed_batch(texts)
        vecs = np.asarray(vecs)
        if vecs.shape != (len(texts), self.model.dim):
            raise ScorerError(
                f"embedding model {self.model.model_id!r} returned shape {vecs.shape} for "
                f"{len(texts)} texts, expected ({len(texts)}, {self.model.dim})."
            )
        bad = int((~np.isfinite(vecs).all(axis=1)).sum())
        if bad:
            raise ScorerError(
                f"embedding model {self.model.model_id!r} returned NaN or inf in {bad} of "
                f"{len(texts)} rows; refusing to cache or score them."
            )
        return _normalise_rows(vecs)

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, kind: str = "passage"
    ) -> np.ndarray:
        """Embed ``texts``, computing only those not cached yet.

        Parameters
        ----------
        texts : sequence of str
            Texts to embed; duplicates are computed once.
        progress : bool
            Show a tqdm progress bar over the texts being computed.
        kind : {"passage", "query"}
            What the texts are. For an asymmetric model (``model.asymmetric``) queries go
            through ``model.embed_queries`` and are cached under ``model_id + "#query"``;
            for other models both kinds share one cache.

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32 array, rows in input order.

        Raises
        ------
        TypeError
            When ``texts`` is a single string or holds a non-string.
        ScorerError
            When the model returns a wrong shape or non-finite values.
        """
        if kind not in ("passage", "query"):
            raise ValueError(f"kind == {kind!r}, must be 'passage' or 'query'.")
        if kind == "query" and self.model.asymmetric:
            return self._query_side(texts, progress)
        items = _check_texts(texts)
        dim = self.model.dim
        if not items:
            return np.empty((0, dim), dtype=np.float32)
        keys = [_sha256(t) for t in items]
        with self._lock:
            todo: dict[str, str] = {}
            for key, text in zip(keys, items):
                if key not in self._memory:
                    todo.setdefault(key, text)
                else:
                    self._memory.move_to_end(key)  # recently used
            if todo:
                self._load_from_db(list(todo))
                todo = {k: t for k, t in todo.items() if k not in self._memory}
            if todo:
                self._compute_missing(todo, progress=progress)
            out = np.stack([self._memory[k] for k in keys]).astype(np.float32, copy=False)
            while len(self._memory) > self.max_memory_items:  # least recently used first
                self._memory.popitem(last=False)
            return out

    def add_known(self, texts: Sequence[str], vectors: np.ndarray) -> int:
        """Cache vectors already computed by this model elsewhere (an index's stored vectors),
        so :meth:`embed` never sends these texts to the model.

        They go where computed vectors go: memory, and the SQLite file when persisting (a
        vector dropped from memory is then read back, never recomputed). Texts cached
        already are left as they are.

        Parameters
        ----------
        texts : sequence of str
            The passages (never queries of an asymmetric model: those have their own side).
        vectors : numpy.ndarray
            ``(len(texts), dim)`` vectors of ``self.model``, rows in the order of ``texts``.

        Returns
        -------
        int
            The number of texts added (not cached before).

        Raises
        ------
        ValueError
            ``vectors`` has another shape or holds NaN or inf.
        """
        items = _check_texts(texts)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape != (len(items), self.model.dim) or not np.isfinite(vecs).all():
            raise ValueError(
                f"vectors has shape {vecs.shape} (finite: {bool(np.isfinite(vecs).all())}), "
                f"expected finite ({len(items)}, {self.model.dim}) rows of {self.model.model_id!r}."
            )
        vecs = _normalise_rows(vecs)
        with self._lock:
            new = {_sha256(t): v for t, v in zip(items, vecs)}
            new = {k: v for k, v in new.items() if k not in self._memory}
            if new:
                self._store(list(new), np.stack(list(new.values())))
            return len(new)

    def _query_side(self, texts: Sequence[str], progress: bool) -> np.ndarray:
        """Queries of an asymmetric model: a second cache over the model's query view."""
        with self._lock:
            side = self._queries
            if side is None:
                side = self._queries = EmbeddingCache(
                    _QueryView(self.model),
                    cache_dir=None if self.path is None else self.path.parent,
                    batch_size=self.batch_size,
                    max_batch_chars=self.max_batch_chars,
                    max_memory_items=self.max_memory_items,
                )
            before = side.n_computed
            out = side.embed(texts, progress=progress)
            self.n_computed += side.n_computed - before
            return out

    def _compute_missing(self, todo: dict[str, str], *, progress: bool) -> None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        missing_keys = sorted(todo, key=lambda k: len(todo[k]))
        with tqdm(
            total=len(missing_keys),
            disable=not progress,
            unit="text",
            desc=f"embedding ({self.model.cache_id})",
        ) as bar:
            for batch_keys in self._batches(missing_keys, todo):
                vecs = self._compute([todo[k] for k in batch_keys])
                self.n_computed += len(batch_keys)
                self._store(batch_keys, vecs)
                bar.update(len(batch_keys))

    def _batches(self, keys: list[str], todo: dict[str, str]) -> list[list[str]]:
        """Cut ``keys`` (sorted by text length) into batches within both limits."""
        batches: list[list[str]] = []
        current: list[str] = []
        for key in keys:
            longest = len(todo[key])  # keys ascend in length: this text is the longest
            if current and (
                len(current) >= self.batch_size
                or (len(current) + 1) * longest > self.max_batch_chars
            ):
                batches.append(current)
                current = []
            current.append(key)
        if current:
            batches.append(current)
        return batches

    def __repr__(self) -> str:
        where = str(self.path) if self.persistent else "memory"
        return f"EmbeddingCache(model={self.model.cache_id!r}, cached={len(self)}, store={where!r})"
