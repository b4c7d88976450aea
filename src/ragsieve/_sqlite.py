"""Open a one-table SQLite cache file, checking its schema (shared by the caches)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["close_quietly", "connect_shared", "is_busy", "open_table"]


def open_table(path: Path, table: str, create_sql: str, columns: list[str], *,
               wal: bool = False) -> sqlite3.Connection:
    """Connect to ``path``, create ``table`` if missing and check its columns.

    Parameters
    ----------
    path : Path
        The SQLite file (its directory is created).
    table : str
        Table name.
    create_sql : str
        ``CREATE TABLE IF NOT EXISTS ...`` statement.
    columns : list of str
        Expected column names, in order.
    wal : bool
        Use WAL journaling with ``synchronous=NORMAL``: every commit survives a killed
        process; only a power cut can drop the last ones.

    Returns
    -------
    sqlite3.Connection
        Shared across threads (``check_same_thread=False``): callers hold a lock.

    Raises
    ------
    sqlite3.Error or OSError
        The file cannot be opened, is not a database, or has another schema.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False)
    try:
        if wal:
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            db.execute("PRAGMA synchronous=NORMAL")
        db.execute(create_sql)
        found = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        if found != columns:
            raise sqlite3.DatabaseError(f"table {table!r} has columns {found}, expected {columns}")
        db.execute(f"SELECT count(*) FROM {table}").fetchone()
        db.commit()
    except BaseException:
        db.close()
        raise
    return db


def connect_shared(path: Path, *, timeout: float = 30.0, wal: bool = True) -> sqlite3.Connection:
    """Connect to a SQLite file that several threads and processes write (service state).

    Parameters
    ----------
    path : Path
        The file (its directory is created).
    timeout : float
        Seconds a writer waits for another's lock before ``sqlite3.OperationalError``.
    wal : bool
        Switch the file to WAL journaling with ``synchronous=NORMAL`` (readers never block
        the writer; every commit survives a killed process, only a power cut can drop the
        last ones). False leaves the file's journal mode as it is (a reader of a file
        written by others).

    Returns
    -------
    sqlite3.Connection
        In autocommit mode (``isolation_level=None``: callers issue ``BEGIN IMMEDIATE``)
        and shared across threads (``check_same_thread=False``: callers hold a lock).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None,
                         check_same_thread=False)
    try:
        if wal:
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


def close_quietly(db: sqlite3.Connection | None) -> None:
    """Close a connection that may already be broken (a corrupt file), ignoring errors."""
    if db is not None:
        try:
            db.close()
        except sqlite3.Error:
            pass


def is_busy(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" / "busy" errors (another writer holds the file)."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
