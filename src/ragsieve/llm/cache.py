"""Persistent cache of LLM replies in one SQLite file.

A reply is stored under the SHA-256 of a canonical JSON description of its request
(endpoint, model, prompt version, payload) and written with an immediate commit, so a
job killed with ``SIGKILL`` loses at most the requests in flight: rerunning it asks the
server only for what is missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LLMCache"]

from .._closing import Closing
from .._sqlite import close_quietly, open_table
from .._validation import check_instance, check_path

logger = logging.getLogger(__name__)

_TABLE = "llm_replies"
_COLUMNS = ["key", "value", "created"]


def _canonical_json(obj: Any, *, allow_nan: bool = False) -> str:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
    )


class LLMCache(Closing):
    """Persistent SQLite cache of LLM replies (response JSON by request key).

    The file is opened in WAL mode and every :meth:`put` commits at once. One
    connection is shared behind a lock, so an instance is safe to use from many
    threads; several processes may share one file. A corrupt or unopenable file is
    reported with a logged warning and the cache continues in memory only, never
    raising.

    Parameters
    ----------
    path : str or os.PathLike
        The SQLite file; parent directories are created.

    Attributes
    ----------
    path : pathlib.Path
        The SQLite file.

    Examples
    --------
    >>> import tempfile, os
    >>> cache = LLMCache(os.path.join(tempfile.mkdtemp(), "llm.sqlite"))
    >>> key = LLMCache.make_key("completions", "m", "v1", {"prompt": "hi", "max_tokens": 1})
    >>> cache.put(key, {"choices": [{"text": "!"}]})
    >>> cache.get(key)
    {'choices': [{'text': '!'}]}
    >>> len(cache)
    1
    >>> cache.close()
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(check_path(path, "path"))
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._memory: dict[str, str] = {}
        self._open()

    @property
    def persistent(self) -> bool:
        """True while replies are written to the SQLite file (False after a fallback)."""
        return self._db is not None

    def _open(self) -> None:
        try:
            db = open_table(
                self.path, _TABLE,
                f"CREATE TABLE IF NOT EXISTS {_TABLE} (key TEXT PRIMARY KEY NOT NULL, "
                    "value TEXT NOT NULL, created REAL NOT NULL)",
                _COLUMNS, wal=True,
            )
        except (sqlite3.Error, OSError) as exc:
            self._disable(f"cannot use LLM cache file {self.path} ({exc})")
            return
        self._db = db

    def _disable(self, reason: str) -> None:
        logger.warning("%s; continuing with an in-memory LLM cache only.", reason)
        close_quietly(self._db)
        self._db = None

    @staticmethod
    def make_key(endpoint: str, model: str, prompt_version: str, payload: Mapping[str, Any]) -> str:
        """Return the cache key of a request: SHA-256 hex of its canonical JSON.

        Parameters
        ----------
        endpoint : str
            Path of the endpoint relative to the base URL, e.g. ``"chat/completions"``
            (the host is left out on purpose, so a local server on a new port still hits).
        model : str
            Model name sent with the request.
        prompt_version : str
            Caller's version tag of the prompt template; bump it to invalidate.
        payload : Mapping
            The request body without ``model``: messages or prompt plus sampling
            parameters. Must be JSON-serialisable.

        Returns
        -------
        str
            64 hexadecimal characters.

        Raises
        ------
        TypeError
            When ``payload`` cannot be serialised to JSON.
        """
        try:
            text = _canonical_json(
                {
                    "endpoint": endpoint,
                    "model": model,
                    "prompt_version": prompt_version,
                    "payload": dict(payload),
                }
            )
        except (TypeError, ValueError) as exc:
            raise TypeError(f"payload is not JSON-serialisable ({exc}).") from exc
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        """Return the stored reply for ``key``, or None when absent or unreadable."""
        with self._lock:
            text = self._memory.get(key)
            if text is None and self._db is not None:
                try:
                    row = self._db.execute(
                        f"SELECT value FROM {_TABLE} WHERE key = ?", (key,)
                    ).fetchone()
                except sqlite3.Error as exc:
                    self._disable(f"cannot read LLM cache file {self.path} ({exc})")
                    row = None
                text = row[0] if row is not None else None
        if text is None:
            return None
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            logger.warning("ignoring a malformed cached LLM reply for key %s", key[:12])
            return None
        if not isinstance(value, dict):
            logger.warning("ignoring a cached LLM reply that is not an object (key %s)", key[:12])
            return None
        return value

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        """Store ``value`` (a JSON object) under ``key`` and commit immediately.

        Raises
        ------
        TypeError
            When ``value`` is not a JSON-serialisable mapping.
        """
        check_instance(value, Mapping, "value", expected="a JSON object (dict)")
        try:
            text = _canonical_json(dict(value), allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"value is not JSON-serialisable ({exc}).") from exc
        with self._lock:
            if self._db is None:
                self._memory[key] = text
                return
            try:
                with self._db:  # commits on success
                    self._db.execute(
                        f"INSERT OR REPLACE INTO {_TABLE} VALUES (?, ?, ?)",
                        (key, text, time.time()),
                    )
            except sqlite3.Error as exc:
                self._disable(f"cannot write LLM cache file {self.path} ({exc})")
                self._memory[key] = text

    def __len__(self) -> int:
        with self._lock:
            if self._db is not None:
                try:
                    (count,) = self._db.execute(f"SELECT count(*) FROM {_TABLE}").fetchone()
                    return int(count)
                except sqlite3.Error as exc:
                    self._disable(f"cannot read LLM cache file {self.path} ({exc})")
            return len(self._memory)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def close(self) -> None:
        """Close the SQLite file; later calls use the in-memory cache only."""
        with self._lock:
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error:  # pragma: no cover - close of a valid connection
                    pass
                self._db = None

    def __repr__(self) -> str:
        return f"LLMCache({str(self.path)!r}, persistent={self.persistent})"
