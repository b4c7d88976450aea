"""The served filter's list check, kept in the state directory (``lists-<checksum>.sqlite``).

A :class:`~ragsieve.lists.ListWatch` in memory forgets a fired alarm when the process
dies, and each worker process of ``serve --workers N`` would watch only its own share of
the lists. :class:`SharedListWatch` keeps the watch's state in one SQLite row of the state
directory instead: every list is seen in one ``BEGIN IMMEDIATE`` transaction (read the
newest state when another process wrote it, see the list, write the state back), so the
workers run one sequential test over their merged stream and a restart on the same
artifact (same checksum, same watch settings) continues it; a row of another record or
settings is started afresh, with a log line. A state file that cannot be written is
logged and the watch goes on in memory: the request is answered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._sqlite import connect_shared
from ..lists import ListCheck, ListWatch

__all__ = ["SharedListWatch", "lists_path", "reset_lists_file"]

logger = logging.getLogger(__name__)

_CREATE = ("CREATE TABLE IF NOT EXISTS list_watch (id INTEGER PRIMARY KEY CHECK (id = 1), "
           "fingerprint TEXT NOT NULL, version INTEGER NOT NULL, state TEXT)")


def lists_path(state_dir: Path, checksum: str) -> Path:
    """The list-check file of the artifact ``checksum`` in ``state_dir``."""
    return state_dir / f"lists-{checksum[:16]}.sqlite"


def reset_lists_file(path: Path) -> None:
    """Start the list check kept in ``path`` afresh for every process that uses it (a new
    artifact was published); nothing when there is no such file.

    Raises
    ------
    sqlite3.Error, OSError
        The file cannot be written.
    """
    if not path.exists():
        return
    db = connect_shared(path)
    try:
        db.execute(_CREATE)
        db.execute("UPDATE list_watch SET state = NULL, version = version + 1")
    finally:
        db.close()


class SharedListWatch(ListWatch):
    """A :class:`~ragsieve.lists.ListWatch` whose state lives in an SQLite file.

    Parameters
    ----------
    watch : ListWatch
        The filter's own watch (its record and settings are taken; its state is not).
    store : Path
        The file (created).

    Raises
    ------
    sqlite3.Error, OSError
        The file cannot be opened or is not a list-check file.
    """

    _db: sqlite3.Connection | None = None

    def __init__(self, watch: ListWatch, store: Path) -> None:
        super().__init__(watch.record, delta=watch.delta, min_lists=watch.min_lists,
                         score_name=watch.score_name, seed=watch.seed)
        self.store = Path(store)
        self._db_lock = threading.Lock()
        self._version = -1
        self._fingerprint = hashlib.sha256(json.dumps(
            [watch.record.to_dict(), self.delta, self.min_lists, self.seed],
            sort_keys=True, default=str).encode()).hexdigest()
        db = connect_shared(self.store)
        try:
            db.execute(_CREATE)
        except BaseException:
            db.close()
            raise
        self._db = db
        with self._shared(write=False):
            pass  # restores a kept state, or starts one

    @contextmanager
    def _shared(self, *, write: bool) -> Iterator[None]:
        """Bring the state up to date from the file; with ``write``, store it after."""
        db = self._db
        if db is None:
            yield
            return
        with self._db_lock:
            try:
                db.execute("BEGIN IMMEDIATE")
                self._refresh(db)
            except sqlite3.Error as exc:
                self._give_up(exc)
                yield
                return
            try:
                yield
            except BaseException:
                db.execute("ROLLBACK")
                raise
            try:
                if write:
                    self._write(db)
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._give_up(exc)

    def _refresh(self, db: sqlite3.Connection) -> None:
        row = db.execute("SELECT fingerprint, version, state FROM list_watch").fetchone()
        if row is None or row[0] != self._fingerprint or row[2] is None:
            if row is not None and row[0] != self._fingerprint:
                logger.warning("list check state %s was kept for another artifact or settings; "
                               "discarded, the check starts afresh", self.store)
            super().reset()
            self._write(db)
            return
        if int(row[1]) == self._version:
            return
        try:
            self.load_state(json.loads(row[2]))
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("list check state %s is unreadable (%s); discarded, the check starts "
                           "afresh", self.store, exc)
            super().reset()
            self._write(db)
            return
        self._version = int(row[1])

    def _write(self, db: sqlite3.Connection) -> None:
        self._version = max(self._version, 0) + 1
        text = json.dumps(self.to_state())
        db.execute("INSERT OR REPLACE INTO list_watch VALUES (1, ?, ?, ?)",
                   (self._fingerprint, self._version, text))

    def _give_up(self, exc: sqlite3.Error) -> None:
        """Keep watching in memory after the file failed (logged once)."""
        logger.error("list check state %s cannot be used (%s); the check goes on in this "
                     "process's memory", self.store, exc)
        db, self._db = self._db, None
        if db is not None:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            db.close()

    def see(self, length: int, root_scores: Any = None) -> ListCheck:
        if not self.active:
            return super().see(length, root_scores)
        with self._shared(write=True):
            return super().see(length, root_scores)

    def reset(self) -> None:
        """Start afresh, for every process sharing the file."""
        with self._shared(write=True):
            super().reset()

    def alarm_check(self) -> ListCheck:
        with self._shared(write=False):
            return super().alarm_check()

    def state(self) -> dict[str, Any]:
        with self._shared(write=False):
            return super().state()

    def close(self) -> None:
        """Close the file (the watch goes on in memory)."""
        with self._db_lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()
