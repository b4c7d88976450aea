"""Served scores, feedback labels and the adaptive threshold, in one SQLite file.

The service records every snippet it scores (``served``: query_id, snippet_id, score,
threshold, kept, group, the scorer's key, the artifact checksum, time) in the request,
before it answers: an answered ``/filter`` or ``/query`` has its rows committed, and when
the file cannot be written the request is answered 503 instead.

A label sent to ``POST /feedback`` (query_id, snippet_id, relevant) counts only when the
service served that snippet under that query_id with the same scorer within the
retention window: it is stored with the served row's id and the score the service
computed. Unknown pairs are counted and never stored. At most ``max_labels_per_query``
pairs of one query_id are labelled, and one client sends at most
``max_labels_per_minute`` labels per minute (counted in the file, so across the worker
processes of one ``serve``).

With ``serve --adaptive`` (an artifact of mode ``adaptive``) each *new* relevant label is
applied to the artifact's :class:`~ragsieve.calibration.AdaptiveCalibrator` (adaptive
conformal inference, always ``bounded``: the threshold stays one of its pool's scores,
which are calibration and served scores), and the calibrator's state is written back to
the ``adaptive`` table in the same transaction. The state is keyed by the artifact's
checksum, so a restart continues where it stopped and every worker process serves the
same threshold; a stored state outside the bounds is refused at start.

Served rows older than the retention window, or beyond ``max_served_rows``, are pruned
(oldest first) with their labels, so the file stays bounded.

:func:`ragsieve.server.recalibrate.recalibrate` rebuilds an artifact offline from the
labels (``ragsieve recalibrate``).

The file uses WAL journaling; several processes (the workers of one ``serve``) share it,
each writing in short ``BEGIN IMMEDIATE`` transactions. A write waits at most
``busy_seconds`` for another writer's lock, then raises ``sqlite3.OperationalError``
("database is locked"), which the service answers with 503 and ``Retry-After``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._sqlite import connect_shared, is_busy
from .._validation import check_int
from ..calibration import BaseCalibrator, calibrator_from_state
from ..errors import ArtifactError, DataError

__all__ = [
    "AdaptiveThreshold",
    "FeedbackStore",
    "LabelOutcome",
    "LabelRateLimited",
    "ServedRow",
    "build_adaptive",
    "scorer_key",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
_SCHEMA = (
    ("CREATE TABLE IF NOT EXISTS served (id INTEGER PRIMARY KEY, query_id TEXT NOT NULL, "
     "snippet_id TEXT NOT NULL, score REAL, threshold REAL, kept INTEGER NOT NULL, grp TEXT, "
     "scorer_key TEXT NOT NULL, checksum TEXT, endpoint TEXT NOT NULL, time TEXT NOT NULL)"),
    "CREATE INDEX IF NOT EXISTS served_ids ON served (query_id, snippet_id)",
    "CREATE INDEX IF NOT EXISTS served_time ON served (time)",
    ("CREATE TABLE IF NOT EXISTS labels (query_id TEXT NOT NULL, snippet_id TEXT NOT NULL, "
     "relevant INTEGER NOT NULL, score REAL NOT NULL, served_id INTEGER NOT NULL, "
     "time TEXT NOT NULL, PRIMARY KEY (query_id, snippet_id))"),
    "CREATE INDEX IF NOT EXISTS labels_served ON labels (served_id)",
    ("CREATE TABLE IF NOT EXISTS adaptive (checksum TEXT PRIMARY KEY, version INTEGER NOT NULL, "
     "mode TEXT NOT NULL, params TEXT NOT NULL, state TEXT NOT NULL, updated TEXT NOT NULL)"),
    ("CREATE TABLE IF NOT EXISTS label_rate (second INTEGER NOT NULL, client TEXT NOT NULL, "
     "n INTEGER NOT NULL, PRIMARY KEY (second, client))"),
)
_TABLES = {
    "served": ["id", "query_id", "snippet_id", "score", "threshold", "kept", "grp", "scorer_key",
               "checksum", "endpoint", "time"],
    "labels": ["query_id", "snippet_id", "relevant", "score", "served_id", "time"],
    "adaptive": ["checksum", "version", "mode", "params", "state", "updated"],
    "label_rate": ["second", "client", "n"],
}
_HINT = "move it away, or give `ragsieve serve` another --state-dir (or --feedback)"
#: Served rows are pruned to about this many (oldest first) unless told otherwise.
DEFAULT_MAX_SERVED_ROWS = 1_000_000
_PRUNE_EVERY = 1000
#: Seconds a served score stays labellable (older served rows and their labels are pruned).
DEFAULT_FEEDBACK_RETENTION = 7 * 24 * 3600.0
#: Most (query_id, snippet_id) pairs labelled for one query_id.
DEFAULT_MAX_LABELS_PER_QUERY = 1000
#: Most labels one client may send per minute.
DEFAULT_MAX_LABELS_PER_MINUTE = 6000
#: Seconds a write waits for another writer's lock before it fails (the service: 503).
DEFAULT_BUSY_SECONDS = 3.0
#: Seconds the store waits for the file's lock while it opens and sets up the file.
_OPEN_BUSY_SECONDS = 30.0
_RATE_WINDOW = 60


def _iso(moment: _dt.datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


def _now() -> str:
    return _iso(_dt.datetime.now(_dt.UTC))


def scorer_key(spec: Mapping[str, Any]) -> str:
    """A short stable key of a scorer spec (scores are comparable only within one key).

    Examples
    --------
    >>> scorer_key({"scorer": "embedding", "model": "m"}) == scorer_key({"model": "m", "scorer": "embedding"})
    True
    """
    text = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ServedRow:
    """One served snippet, as recorded."""

    query_id: str
    snippet_id: str
    score: float
    threshold: float
    kept: bool
    group: str | None = None


@dataclass(frozen=True)
class LabelOutcome:
    """What one ``POST /feedback`` batch did (see :class:`~ragsieve.server.schemas.FeedbackResponse`)."""

    accepted: int
    new: int
    unknown: int
    over_limit: int
    adaptive_updates: int
    adaptive: dict[str, Any] | None = None


class LabelRateLimited(Exception):
    """A client sent more labels in the last minute than the service allows (HTTP 429)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _db_score(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


class FeedbackStore:
    """The service's SQLite file of served scores, labels and adaptive state.

    Parameters
    ----------
    path : str or Path
        The file (created with its directory when ``create``).
    create : bool, default=True
        Create the file and tables when missing; with False a missing file raises
        ``FileNotFoundError`` and nothing is written (``ragsieve recalibrate``).
    max_served_rows : int, default=1_000_000
        Served rows kept (the oldest are pruned, with their labels).
    retention_seconds : float, default=7 days
        Seconds a served row stays labellable; older rows are pruned with their labels.
    busy_seconds : float, default=3.0
        Seconds a read or write waits for a lock held by another writer (or another
        thread of this process) before ``sqlite3.OperationalError("database is locked")``.

    Raises
    ------
    FileNotFoundError
        ``create=False`` and the file does not exist.
    DataError
        The file is not a ragsieve feedback database (corrupt, another schema or version),
        or another process held its lock for 30 s while it was opened.
    """

    def __init__(self, path: str | Path, *, create: bool = True,
                 max_served_rows: int = DEFAULT_MAX_SERVED_ROWS,
                 retention_seconds: float = DEFAULT_FEEDBACK_RETENTION,
                 busy_seconds: float = DEFAULT_BUSY_SECONDS) -> None:
        self.path = Path(path)
        self.max_served_rows = check_int(max_served_rows, "max_served_rows", min_value=1)
        self.retention_seconds = float(retention_seconds)
        self.busy_seconds = float(busy_seconds)
        if not create and not self.path.is_file():
            raise FileNotFoundError(f"feedback database {str(self.path)!r} does not exist; it is "
                                    "written by `ragsieve serve` (see --feedback).")
        self._lock = threading.Lock()
        self._since_prune = 0
        try:
            self._db = connect_shared(self.path, wal=create, timeout=_OPEN_BUSY_SECONDS)
        except sqlite3.DatabaseError as exc:
            raise self._refused(exc) from exc
        try:
            if create:
                self._init_schema()
            self._check_schema()
            self._db.execute(f"PRAGMA busy_timeout = {int(self.busy_seconds * 1000)}")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise self._refused(exc) from exc
        except BaseException:
            self._db.close()
            raise

    def _refused(self, exc: sqlite3.DatabaseError) -> DataError:
        if is_busy(exc):
            return DataError(f"feedback database {str(self.path)!r} is locked by another process "
                             f"(waited {_OPEN_BUSY_SECONDS:g} s); stop it, or {_HINT}.")
        return DataError(f"{str(self.path)!r} is not a ragsieve feedback database ({exc}); "
                         f"{_HINT}.")

    def _init_schema(self) -> None:
        with self._transaction() as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:
                raise sqlite3.DatabaseError(f"it holds other tables: {sorted(tables)[:5]}")
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._check_version(db)
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                       (str(SCHEMA_VERSION),))

    @staticmethod
    def _check_version(db: sqlite3.Connection) -> None:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row[0]!r}, expected {SCHEMA_VERSION}: "
                                        "written by another version of ragsieve")

    def _check_schema(self) -> None:
        self._check_version(self._db)
        for table, columns in _TABLES.items():
            found = [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]
            if found != columns:
                raise sqlite3.DatabaseError(f"table {table!r} has columns {found}, expected {columns}")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise sqlite3.DatabaseError("no schema version")

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """The connection, held by this thread (waits at most ``busy_seconds`` for it)."""
        if not self._lock.acquire(timeout=self.busy_seconds):
            raise sqlite3.OperationalError(
                f"database is locked: {self.path} is in use by another request of this process "
                f"for more than {self.busy_seconds:g} s")
        try:
            yield self._db
        finally:
            self._lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction (the write lock is taken at once)."""
        with self._locked() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the connection (every write is committed when its call returns)."""
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ served
    def record_served(self, rows: Sequence[ServedRow], *, key: str, checksum: str | None,
                      endpoint: str) -> None:
        """Record one request's served snippets in one committed transaction.

        Raises
        ------
        sqlite3.OperationalError
            The file stayed locked for ``busy_seconds`` (nothing was written).
        """
        if not rows:
            return
        now = _now()
        values = [(r.query_id, r.snippet_id, _db_score(r.score), r.threshold, int(r.kept),
                   r.group, key, checksum, endpoint, now) for r in rows]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO served (query_id, snippet_id, score, threshold, kept, grp, "
                "scorer_key, checksum, endpoint, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values)
            self._since_prune += len(values)
            if self._since_prune >= _PRUNE_EVERY:
                self._since_prune = 0
                self._prune(db)

    def _cutoff(self) -> str:
        """The time before which served rows are out of the retention window."""
        moment = _dt.datetime.now(_dt.UTC) - _dt.timedelta(seconds=self.retention_seconds)
        return _iso(moment)

    def _prune(self, db: sqlite3.Connection) -> int:
        """Delete the served rows past the retention window or the row cap, and their
        labels (always a prefix of ids, so a label never outlives its served row)."""
        expired = db.execute("SELECT max(id) FROM served WHERE time < ?",
                             (self._cutoff(),)).fetchone()[0] or 0
        top = db.execute("SELECT max(id) FROM served").fetchone()[0] or 0
        cut = max(expired, top - self.max_served_rows)
        if cut <= 0:
            return 0
        db.execute("DELETE FROM labels WHERE served_id <= ?", (cut,))
        return db.execute("DELETE FROM served WHERE id <= ?", (cut,)).rowcount

    def prune(self) -> int:
        """Prune now (otherwise done every 1,000 served rows); returns served rows deleted."""
        with self._transaction() as db:
            return self._prune(db)

    def served_score(self, query_id: str, snippet_id: str, key: str) -> float | None:
        """The latest score served for this snippet under scorer ``key``, else None."""
        with self._locked() as db:
            row = self._served_row(db, query_id, snippet_id, key, cutoff=None)
        return None if row is None else row[1]

    @staticmethod
    def _served_row(db: sqlite3.Connection, query_id: str, snippet_id: str, key: str, *,
                    cutoff: str | None) -> tuple[int, float] | None:
        """(id, score) of the latest row served for the pair under ``key`` (since ``cutoff``)."""
        row = db.execute(
            "SELECT id, score FROM served WHERE query_id = ? AND snippet_id = ? AND "
            "scorer_key = ? AND score IS NOT NULL AND time >= ? ORDER BY id DESC LIMIT 1",
            (query_id, snippet_id, key, cutoff or "")).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def count_served(self) -> int:
        """Served rows held."""
        with self._locked() as db:
            return int(db.execute("SELECT count(*) FROM served").fetchone()[0])

    def count_labels(self) -> int:
        """Labels held."""
        with self._locked() as db:
            return int(db.execute("SELECT count(*) FROM labels").fetchone()[0])

    # ------------------------------------------------------------------ labels
    def add_labels(self, items: Sequence[tuple[str, str, bool]], *, key: str, client: str = "",
                   adaptive: AdaptiveThreshold | None = None,
                   max_per_query: int | None = DEFAULT_MAX_LABELS_PER_QUERY,
                   max_per_minute: int | None = DEFAULT_MAX_LABELS_PER_MINUTE) -> LabelOutcome:
        """Store labels (query_id, snippet_id, relevant) of served snippets, in one transaction.

        A label is stored only when the pair was served under scorer ``key`` within the
        retention window, with that row's score; a repeated pair replaces the earlier
        label. Pairs not served are counted as ``unknown``, new pairs of a query_id that
        already has ``max_per_query`` labelled pairs as ``over_limit``; neither is stored.
        With ``adaptive``, every relevant label of a pair not labelled before is applied
        to the adaptive threshold (in the given order) within the same transaction.

        Raises
        ------
        LabelRateLimited
            ``client`` sent more than ``max_per_minute`` labels in the last 60 s with this
            batch (nothing is stored).
        sqlite3.OperationalError
            The file stayed locked for ``busy_seconds``.
        """
        now, cutoff = _now(), self._cutoff()
        counts = {"accepted": 0, "new": 0, "unknown": 0, "over_limit": 0}
        to_apply: list[tuple[float, bool]] = []
        per_query: dict[str, int] = {}
        with self._transaction() as db:
            if max_per_minute is not None:
                self._take_rate(db, client, len(items), max_per_minute)
            for query_id, snippet_id, relevant in items:
                served = self._served_row(db, query_id, snippet_id, key, cutoff=cutoff)
                if served is None:
                    counts["unknown"] += 1
                    continue
                known = db.execute("SELECT 1 FROM labels WHERE query_id = ? AND snippet_id = ?",
                                   (query_id, snippet_id)).fetchone() is not None
                if not known:
                    if query_id not in per_query:
                        per_query[query_id] = int(db.execute(
                            "SELECT count(*) FROM labels WHERE query_id = ?",
                            (query_id,)).fetchone()[0])
                    if max_per_query is not None and per_query[query_id] >= max_per_query:
                        counts["over_limit"] += 1
                        continue
                    per_query[query_id] += 1
                db.execute("INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?, ?)",
                           (query_id, snippet_id, int(relevant), served[1], served[0], now))
                counts["accepted"] += 1
                if not known:
                    counts["new"] += 1
                    if adaptive is not None and relevant:
                        to_apply.append((served[1], True))
            info = adaptive.apply(db, to_apply) if adaptive is not None else None
        return LabelOutcome(**counts, adaptive_updates=len(to_apply), adaptive=info)

    @staticmethod
    def _take_rate(db: sqlite3.Connection, client: str, n: int, limit: int) -> None:
        """Count ``n`` labels of ``client`` in this second; refuse beyond ``limit`` a minute."""
        second = int(time.time())
        db.execute("DELETE FROM label_rate WHERE second <= ?", (second - _RATE_WINDOW,))
        used, oldest = db.execute("SELECT coalesce(sum(n), 0), min(second) FROM label_rate "
                                  "WHERE client = ?", (client,)).fetchone()
        if used + n > limit:
            wait = _RATE_WINDOW - (second - oldest) if oldest is not None else _RATE_WINDOW
            raise LabelRateLimited(
                f"this client sent {used} labels in the last {_RATE_WINDOW} s; {n} more would "
                f"exceed the limit of {limit} per minute: retry after {wait} s.", wait)
        db.execute("INSERT INTO label_rate VALUES (?, ?, ?) ON CONFLICT (second, client) "
                   "DO UPDATE SET n = n + excluded.n", (second, client, n))

    def labelled(self, key: str) -> list[tuple[str, str, bool, float, str | None]]:
        """Every label of a snippet served under scorer ``key``, with the served score and
        group, in the order stored: (query_id, snippet_id, relevant, score, group)."""
        with self._locked() as db:
            rows = db.execute(
                "SELECT l.query_id, l.snippet_id, l.relevant, l.score, s.grp FROM labels l "
                "JOIN served s ON s.id = l.served_id WHERE s.scorer_key = ? ORDER BY l.rowid",
                (key,)).fetchall()
        return [(q, s, bool(r), float(score), grp) for q, s, r, score, grp in rows]

    def served_lists(self, key: str) -> dict[str, list[float]]:
        """Every query's served scores under scorer ``key``: the whole list of its latest
        request (all snippets, labelled or not), by query_id."""
        with self._locked() as db:
            rows = db.execute(
                "SELECT s.query_id, s.score FROM served s JOIN (SELECT query_id, max(time) AS t "
                "FROM served WHERE scorer_key = ? GROUP BY query_id) last "
                "ON s.query_id = last.query_id AND s.time = last.t "
                "WHERE s.scorer_key = ? AND s.score IS NOT NULL ORDER BY s.id", (key, key)).fetchall()
        out: dict[str, list[float]] = {}
        for query_id, score in rows:
            out.setdefault(query_id, []).append(float(score))
        return out

    # ------------------------------------------------------------------ adaptive
    def ensure_adaptive(self, checksum: str, mode: str, params: Mapping[str, Any],
                        state: Mapping[str, Any]) -> None:
        """Start the adaptive state of artifact ``checksum`` unless it is already there."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO adaptive VALUES (?, 0, ?, ?, ?, ?)",
                (checksum, mode, json.dumps(dict(params), sort_keys=True),
                 json.dumps(dict(state), allow_nan=False), _now()))

    def adaptive_version(self, checksum: str) -> int | None:
        """Version of the adaptive state of ``checksum`` (+1 per feedback batch applied)."""
        with self._locked() as db:
            row = db.execute("SELECT version FROM adaptive WHERE checksum = ?",
                             (checksum,)).fetchone()
        return None if row is None else int(row[0])

    def adaptive_state(self, checksum: str) -> tuple[int, str, dict[str, Any], dict[str, Any]]:
        """(version, mode, params, state) of artifact ``checksum``."""
        with self._locked() as db:
            row = db.execute("SELECT version, mode, params, state FROM adaptive WHERE "
                             "checksum = ?", (checksum,)).fetchone()
        if row is None:
            raise KeyError(f"no adaptive state for artifact {checksum!r}")
        return int(row[0]), row[1], json.loads(row[2]), json.loads(row[3])


def _adaptive_info(calibrator: Any) -> dict[str, Any]:
    tau = float(calibrator.threshold_)
    return {"threshold": None if math.isinf(tau) else tau, "alpha_t": float(calibrator.alpha_t_),
            "n_updates": int(calibrator.n_updates_), "n_errors": int(calibrator.n_errors_)}


def build_adaptive(mode: str, params: Mapping[str, Any], state: Mapping[str, Any]) -> Any:
    """The served adaptive calibrator of a stored state: always bounded, no history.

    Raises
    ------
    ArtifactError
        A malformed state, or one outside the bounds (``alpha_t`` out of range).
    """
    return calibrator_from_state(mode, {**params, "keep_history": False, "bounded": True},
                                 dict(state))


class AdaptiveThreshold:
    """The adaptive calibrator of one artifact, shared by every process through the store.

    Parameters
    ----------
    store : FeedbackStore
    checksum : str
        The artifact's checksum (the state's key).
    calibrator : BaseCalibrator
        The artifact's fitted calibrator, one that learns online (``online``: the
        ``adaptive`` mode): the starting state when the store has none.

    Raises
    ------
    TypeError
        The calibrator does not learn online.
    ArtifactError
        The store holds a state for this artifact that is malformed or out of bounds.
    """

    def __init__(self, store: FeedbackStore, checksum: str, calibrator: BaseCalibrator) -> None:
        if not calibrator.online:
            raise TypeError(f"mode {calibrator.mode!r} has no online update; --adaptive needs "
                            "an artifact of mode 'adaptive'.")
        self.store = store
        self.checksum = checksum
        params = {**calibrator.get_params(), "keep_history": False, "bounded": True}
        store.ensure_adaptive(checksum, calibrator.mode, params, calibrator.to_state())
        self._lock = threading.Lock()
        self._version = -1
        self._calibrator: Any = None
        try:
            self.current()
        except ArtifactError as exc:
            raise ArtifactError(f"feedback database {str(store.path)!r}: the adaptive state of "
                                f"artifact {checksum[:12]} is refused: {exc} ({_HINT})") from exc

    def current(self) -> tuple[int, Any]:
        """(version, calibrator) in force now (rebuilt only when the stored version moved)."""
        version = self.store.adaptive_version(self.checksum)
        with self._lock:
            if version != self._version or self._calibrator is None:
                v, mode, params, state = self.store.adaptive_state(self.checksum)
                self._calibrator = build_adaptive(mode, params, state)
                self._version = v
            return self._version, self._calibrator

    def info(self) -> dict[str, Any]:
        """Threshold, alpha_t, n_updates, n_errors in force now."""
        return _adaptive_info(self.current()[1])

    def apply(self, db: sqlite3.Connection, labels: Sequence[tuple[float, bool]]) -> dict[str, Any]:
        """Apply labels inside the caller's transaction; returns the resulting info."""
        row = db.execute("SELECT version, mode, params, state FROM adaptive WHERE checksum = ?",
                         (self.checksum,)).fetchone()
        if row is None:
            raise KeyError(f"no adaptive state for artifact {self.checksum!r}")
        calibrator = build_adaptive(row[1], json.loads(row[2]), json.loads(row[3]))
        if labels:
            for score, relevant in labels:
                calibrator.update(score, relevant)
            db.execute("UPDATE adaptive SET version = version + 1, state = ?, updated = ? "
                       "WHERE checksum = ?",
                       (json.dumps(calibrator.to_state(), allow_nan=False), _now(), self.checksum))
        return _adaptive_info(calibrator)
