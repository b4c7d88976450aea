"""Served scores, feedback labels and the adaptive threshold, in one SQLite file.

The service records every snippet it scores (``served``: query_id, snippet_id, score,
threshold, kept, group, the scorer's key, the artifact checksum, time), so a label sent
later to ``POST /feedback`` (``labels``: query_id, snippet_id, relevant) can be joined to
the score that was served. A label's score is the served one when the service scored that
snippet with the same scorer, else the ``score`` sent with the label, else unknown (the
label is kept; it counts once a score is known).

With ``serve --adaptive`` (an artifact of mode ``adaptive``) each *new* relevant label
with a score is applied to the artifact's :class:`~ragsieve.calibration.AdaptiveCalibrator`
(adaptive conformal inference: a miss when its score is above the threshold in force),
and the calibrator's state is written back to the ``adaptive`` table in the same
transaction. The state is keyed by the artifact's checksum, so a restart continues where
it stopped and every worker process serves the same threshold.

:func:`recalibrate` rebuilds an artifact offline from the labels (``ragsieve recalibrate``).

The file uses WAL journaling; several processes (the workers of one ``serve``) share it,
each writing in short ``BEGIN IMMEDIATE`` transactions.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._sqlite import connect_shared
from ..calibration import calibrator_from_state, make_calibrator
from ..errors import CalibrationError, DataError

__all__ = [
    "AdaptiveThreshold",
    "FeedbackStore",
    "LabelOutcome",
    "Recalibration",
    "ServedRow",
    "recalibrate",
    "scorer_key",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ("CREATE TABLE IF NOT EXISTS served (id INTEGER PRIMARY KEY, query_id TEXT NOT NULL, "
     "snippet_id TEXT NOT NULL, score REAL, threshold REAL, kept INTEGER NOT NULL, grp TEXT, "
     "scorer_key TEXT NOT NULL, checksum TEXT, endpoint TEXT NOT NULL, time TEXT NOT NULL)"),
    "CREATE INDEX IF NOT EXISTS served_ids ON served (query_id, snippet_id)",
    ("CREATE TABLE IF NOT EXISTS labels (query_id TEXT NOT NULL, snippet_id TEXT NOT NULL, "
     "relevant INTEGER NOT NULL, score REAL, time TEXT NOT NULL, "
     "PRIMARY KEY (query_id, snippet_id))"),
    ("CREATE TABLE IF NOT EXISTS adaptive (checksum TEXT PRIMARY KEY, version INTEGER NOT NULL, "
     "mode TEXT NOT NULL, params TEXT NOT NULL, state TEXT NOT NULL, updated TEXT NOT NULL)"),
)
_TABLES = {
    "served": ["id", "query_id", "snippet_id", "score", "threshold", "kept", "grp", "scorer_key",
               "checksum", "endpoint", "time"],
    "labels": ["query_id", "snippet_id", "relevant", "score", "time"],
    "adaptive": ["checksum", "version", "mode", "params", "state", "updated"],
}
#: Served rows are pruned to about this many (oldest first) unless told otherwise.
DEFAULT_MAX_SERVED_ROWS = 1_000_000
_PRUNE_EVERY = 1000
#: Most served rows queued for the background writer (the oldest half is dropped beyond).
_MAX_PENDING = 200_000
#: Seconds a served score stays labellable (older served rows and their labels are pruned).
DEFAULT_FEEDBACK_RETENTION = 7 * 24 * 3600.0
#: Most labels counted for one query_id.
DEFAULT_MAX_LABELS_PER_QUERY = 1000
#: Most labels one client may send per minute.
DEFAULT_MAX_LABELS_PER_MINUTE = 6000
#: Seconds between two writes of queued served rows in the service.
SERVED_BATCH_SECONDS = 0.05


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


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

    stored: int
    new: int
    with_served_score: int
    with_given_score: int
    without_score: int
    adaptive_updates: int
    adaptive: dict[str, Any] | None = None


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
        Served rows kept (the oldest are pruned).
    batch_seconds : float, optional
        Queue served rows and write them in one transaction per this many seconds (a
        background thread); None writes each request's rows at once.

    Raises
    ------
    FileNotFoundError
        ``create=False`` and the file does not exist.
    DataError
        The file is not a ragsieve feedback database.
    """

    def __init__(self, path: str | Path, *, create: bool = True,
                 max_served_rows: int = DEFAULT_MAX_SERVED_ROWS,
                 retention_seconds: float = DEFAULT_FEEDBACK_RETENTION,
                 batch_seconds: float | None = None) -> None:
        self.path = Path(path)
        self.batch_seconds = batch_seconds
        self.retention_seconds = retention_seconds
        self._pending: list[tuple[Any, ...]] = []
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._closing = threading.Event()
        self._writer: threading.Thread | None = None
        if isinstance(max_served_rows, bool) or not isinstance(max_served_rows, int):
            raise TypeError(f"max_served_rows is {type(max_served_rows).__name__}, expected an "
                            "int >= 1.")
        if max_served_rows < 1:
            raise ValueError(f"max_served_rows == {max_served_rows!r}, must be an int >= 1.")
        self.max_served_rows = max_served_rows
        if not create and not self.path.is_file():
            raise FileNotFoundError(f"feedback database {str(self.path)!r} does not exist; it is "
                                    "written by `ragsieve serve` (see --feedback).")
        self._lock = threading.Lock()
        self._since_prune = 0
        try:
            self._db = connect_shared(self.path, wal=create)
        except sqlite3.DatabaseError as exc:
            raise DataError(f"{str(self.path)!r} is not a ragsieve feedback database: {exc}") from exc
        try:
            if create:
                self._init_schema()
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise DataError(f"{str(self.path)!r} is not a ragsieve feedback database: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    def _init_schema(self) -> None:
        with self._transaction():
            for statement in _SCHEMA:
                self._db.execute(statement)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                             (str(SCHEMA_VERSION),))

    def _check_schema(self) -> None:
        for table, columns in _TABLES.items():
            found = [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]
            if found != columns:
                raise sqlite3.DatabaseError(f"table {table!r} has columns {found}, expected {columns}")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row and row[0]!r}, expected {SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction (the write lock is taken at once)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Write the queued rows and close the connection."""
        self._closing.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
        try:
            self.flush()
        finally:
            with self._lock:
                self._db.close()

    # ------------------------------------------------------------------ served
    def record_served(self, rows: Sequence[ServedRow], *, key: str, checksum: str | None,
                      endpoint: str) -> None:
        """Record one request's served snippets.

        Written at once (one transaction) without ``batch_seconds``; otherwise queued and
        written by the background writer in one transaction per ``batch_seconds``, so the
        worker processes of one service do not contend for the file on every request.
        """
        if not rows:
            return
        now = _now()
        values = [(r.query_id, r.snippet_id, _db_score(r.score), r.threshold, int(r.kept),
                   r.group, key, checksum, endpoint, now) for r in rows]
        if self.batch_seconds is None:
            self._insert(values)
            return
        with self._pending_lock:
            if len(self._pending) + len(values) > _MAX_PENDING:
                dropped = len(self._pending) // 2
                del self._pending[:dropped]
                logger.warning("feedback database %s is not keeping up: dropped the %d oldest "
                               "unwritten served-score rows", self.path, dropped)
            self._pending.extend(values)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                name="ragsieve-served-writer")
                self._writer.start()

    def flush(self) -> None:
        """Write the queued served rows now (before joining labels to them)."""
        with self._flush_lock:
            with self._pending_lock:
                values, self._pending = self._pending, []
            if values:
                self._insert(values)

    def _write_loop(self) -> None:
        while not self._closing.wait(self.batch_seconds or 0.05):
            try:
                self.flush()
            except Exception:  # keep the writer alive; the rows of this batch are lost
                logger.exception("could not write served scores to %s", self.path)

    def _insert(self, values: list[tuple[Any, ...]]) -> None:
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO served (query_id, snippet_id, score, threshold, kept, grp, "
                "scorer_key, checksum, endpoint, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values)
            self._since_prune += len(values)
            if self._since_prune >= _PRUNE_EVERY:
                self._since_prune = 0
                db.execute("DELETE FROM served WHERE id <= (SELECT max(id) FROM served) - ?",
                           (self.max_served_rows,))

    def served_score(self, query_id: str, snippet_id: str, key: str) -> float | None:
        """The latest score served for this snippet under scorer ``key``, else None."""
        with self._lock:
            return self._served_score(self._db, query_id, snippet_id, key)

    @staticmethod
    def _served_score(db: sqlite3.Connection, query_id: str, snippet_id: str,
                      key: str) -> float | None:
        row = db.execute(
            "SELECT score FROM served WHERE query_id = ? AND snippet_id = ? AND scorer_key = ? "
            "ORDER BY id DESC LIMIT 1", (query_id, snippet_id, key)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def count_served(self) -> int:
        """Served rows held."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM served").fetchone()[0])

    # ------------------------------------------------------------------ labels
    def add_labels(self, items: Sequence[tuple[str, str, bool, float | None]], *, key: str,
                   adaptive: AdaptiveThreshold | None = None) -> LabelOutcome:
        """Store labels (query_id, snippet_id, relevant, given score) in one transaction.

        A repeated (query_id, snippet_id) replaces the earlier label. With ``adaptive``,
        every relevant label of a pair not labelled before, whose score is known, is applied
        to the adaptive threshold (in the given order) within the same transaction.
        """
        now = _now()
        counts = {"new": 0, "served": 0, "given": 0, "none": 0}
        to_apply: list[tuple[float, bool]] = []
        with self._transaction() as db:
            for query_id, snippet_id, relevant, given in items:
                known = db.execute("SELECT 1 FROM labels WHERE query_id = ? AND snippet_id = ?",
                                   (query_id, snippet_id)).fetchone() is not None
                db.execute("INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?)",
                           (query_id, snippet_id, int(relevant), given, now))
                served = self._served_score(db, query_id, snippet_id, key)
                score = served if served is not None else given
                counts["served" if served is not None else "given" if given is not None
                       else "none"] += 1
                if not known:
                    counts["new"] += 1
                    if adaptive is not None and relevant and score is not None:
                        to_apply.append((score, relevant))
            info = adaptive.apply(db, to_apply) if adaptive is not None else None
        return LabelOutcome(stored=len(items), new=counts["new"], with_served_score=counts["served"],
                            with_given_score=counts["given"], without_score=counts["none"],
                            adaptive_updates=len(to_apply), adaptive=info)

    def labelled(self, key: str) -> list[tuple[str, str, bool, float | None, str | None]]:
        """Every label with its score (served under scorer ``key``, else the given one) and
        the group it was served with: (query_id, snippet_id, relevant, score, group)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT l.query_id, l.snippet_id, l.relevant, "
                "  (SELECT s.score FROM served s WHERE s.query_id = l.query_id AND "
                "   s.snippet_id = l.snippet_id AND s.scorer_key = ? ORDER BY s.id DESC LIMIT 1), "
                "  l.score, "
                "  (SELECT s.grp FROM served s WHERE s.query_id = l.query_id AND "
                "   s.snippet_id = l.snippet_id ORDER BY s.id DESC LIMIT 1) "
                "FROM labels l ORDER BY l.rowid", (key,)).fetchall()
        return [(q, s, bool(r), served if served is not None else given, grp)
                for q, s, r, served, given, grp in rows]

    def served_lists(self, key: str) -> dict[str, list[float]]:
        """Every query's served scores under scorer ``key``: the whole list of its latest
        request (all snippets, labelled or not), by query_id."""
        with self._lock:
            rows = self._db.execute(
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
        with self._lock:
            row = self._db.execute("SELECT version FROM adaptive WHERE checksum = ?",
                                   (checksum,)).fetchone()
        return None if row is None else int(row[0])

    def adaptive_state(self, checksum: str) -> tuple[int, str, dict[str, Any], dict[str, Any]]:
        """(version, mode, params, state) of artifact ``checksum``."""
        with self._lock:
            row = self._db.execute("SELECT version, mode, params, state FROM adaptive WHERE "
                                   "checksum = ?", (checksum,)).fetchone()
        if row is None:
            raise KeyError(f"no adaptive state for artifact {checksum!r}")
        return int(row[0]), row[1], json.loads(row[2]), json.loads(row[3])


def _adaptive_info(calibrator: Any) -> dict[str, Any]:
    tau = float(calibrator.threshold_)
    return {"threshold": None if math.isinf(tau) else tau, "alpha_t": float(calibrator.alpha_t_),
            "n_updates": int(calibrator.n_updates_), "n_errors": int(calibrator.n_errors_)}


class AdaptiveThreshold:
    """The adaptive calibrator of one artifact, shared by every process through the store.

    Parameters
    ----------
    store : FeedbackStore
    checksum : str
        The artifact's checksum (the state's key).
    calibrator : AdaptiveCalibrator
        The artifact's fitted calibrator: the starting state when the store has none.
    """

    def __init__(self, store: FeedbackStore, checksum: str, calibrator: Any) -> None:
        if not callable(getattr(calibrator, "update", None)):
            raise TypeError(f"mode {calibrator.mode!r} has no online update; --adaptive needs "
                            "an artifact of mode 'adaptive'.")
        self.store = store
        self.checksum = checksum
        params = {**calibrator.get_params(), "keep_history": False}
        store.ensure_adaptive(checksum, calibrator.mode, params, calibrator.to_state())
        self._lock = threading.Lock()
        self._version = -1
        self._calibrator: Any = None

    def _build(self, mode: str, params: dict[str, Any], state: dict[str, Any]) -> Any:
        return calibrator_from_state(mode, {**params, "keep_history": False}, state)

    def current(self) -> tuple[int, Any]:
        """(version, calibrator) in force now (rebuilt only when the stored version moved)."""
        version = self.store.adaptive_version(self.checksum)
        with self._lock:
            if version != self._version or self._calibrator is None:
                v, mode, params, state = self.store.adaptive_state(self.checksum)
                self._calibrator = self._build(mode, params, state)
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
        calibrator = self._build(row[1], json.loads(row[2]), json.loads(row[3]))
        if labels:
            for score, relevant in labels:
                calibrator.update(score, relevant)
            db.execute("UPDATE adaptive SET version = version + 1, state = ?, updated = ? "
                       "WHERE checksum = ?",
                       (json.dumps(calibrator.to_state(), allow_nan=False), _now(), self.checksum))
        return _adaptive_info(calibrator)


# ---------------------------------------------------------------------- recalibrate
def _monitor_reference(lists: Mapping[str, list[float]], query_ids: set[str],
                       notes: list[str]) -> dict[str, Any] | None:
    """The exchangeability monitor's reference of a recalibrated artifact: the statistic of
    each labelled query's whole served list (as ``calibrate`` records it for its queries)."""
    from ..monitoring import reference_block

    scores = [s for q in sorted(query_ids) for s in lists.get(q, [])]
    qids = [q for q in sorted(query_ids) for _ in lists.get(q, [])]
    block = reference_block(np.asarray(scores, dtype=np.float64), qids) if scores else None
    if block is None:
        notes.append("no labelled query was served with 2 or more snippets: the new artifact "
                     "has no exchangeability monitor reference")
    return block


@dataclass(frozen=True)
class Recalibration:
    """The outcome of :func:`recalibrate`."""

    filter: Any
    mode: str
    n_labels: int
    n_used: int
    n_relevant: int
    n_without_score: int
    n_queries: int
    old_threshold: float
    new_threshold: float
    notes: list[str] = field(default_factory=list)


def recalibrate(payload: Mapping[str, Any], feedback_db: str | Path, *, min_labels: int = 50,
                scorer_options: Mapping[str, Any] | None = None) -> Recalibration:
    """Rebuild a filter artifact from the labels stored by the service.

    The labelled snippets' scores (the served ones, or those sent with the labels) become
    the calibration scores of the artifact's own mode and parameters; scorer, policy and
    group field are kept. Modes that need what labels do not carry are refused: the
    ``budget`` mode (snippet lengths), ``topic`` and ``topic-pac`` (calibration topics).

    Parameters
    ----------
    payload : Mapping
        The current artifact (:func:`~ragsieve.filter.read_artifact`).
    feedback_db : str or Path
        The service's feedback database (``serve --feedback``).
    min_labels : int, default=50
        Fewest relevant labels with a score to recalibrate on.
    scorer_options : Mapping, optional
        Passed to :meth:`ConformalFilter.from_dict` (nothing is scored here).

    Returns
    -------
    Recalibration
        The new filter (save it with ``.save``) and what was used.

    Raises
    ------
    CalibrationError
        Fewer than ``min_labels`` relevant labels with a score.
    ValueError
        The mode cannot be recalibrated from labels, or ``min_labels`` < 1.
    FileNotFoundError, DataError, ArtifactError
        Missing or foreign database; malformed artifact.
    """
    from ..filter import ConformalFilter

    if isinstance(min_labels, bool) or not isinstance(min_labels, int):
        raise TypeError(f"min_labels is {type(min_labels).__name__}, expected an int >= 1.")
    if min_labels < 1:
        raise ValueError(f"min_labels == {min_labels!r}, must be an int >= 1.")
    old = ConformalFilter.from_dict(payload, scorer_options=scorer_options)
    cal = old.calibrator
    if "lengths" in cal.fit_requires or cal.group_kind == "topic":
        needs = "snippet lengths" if "lengths" in cal.fit_requires else "calibration topics"
        raise ValueError(f"mode {cal.mode!r} needs {needs}, which feedback labels do not carry; "
                         "recalibrate it with `ragsieve calibrate` on labelled pairs.")
    key = scorer_key(old.scorer.spec())
    store = FeedbackStore(feedback_db, create=False)
    try:
        rows = store.labelled(key)
        lists = store.served_lists(key)
    finally:
        store.close()
    usable = [r for r in rows if r[3] is not None and math.isfinite(r[3])]
    n_relevant = sum(1 for r in usable if r[2])
    if n_relevant < min_labels:
        raise CalibrationError(
            f"feedback database {str(feedback_db)!r} holds {n_relevant} relevant label(s) with a "
            f"score ({len(rows)} label(s), {len(rows) - len(usable)} without a score); "
            f"min_labels is {min_labels}: collect more labels or lower --min-labels.")
    notes: list[str] = []
    groups = None
    if cal.group_kind == "attribute":
        missing = [r for r in usable if r[4] is None]
        if missing:
            notes.append(f"{len(missing)} label(s) without a served group skipped")
            usable = [r for r in usable if r[4] is not None]
        groups = [r[4] for r in usable]
    params = {k: v for k, v in cal.get_params().items() if k != "tokenizer"}
    new_cal = make_calibrator(cal.mode, **params)
    new_cal.fit(np.array([r[3] for r in usable], dtype=np.float64),
                np.array([r[2] for r in usable], dtype=bool),
                query_ids=[r[0] for r in usable], groups=groups)
    flt = ConformalFilter(old.scorer, new_cal, min_keep=old.min_keep, group_by=old.group_by,
                          max_chars=old.max_chars)
    flt.monitor_reference = _monitor_reference(lists, {r[0] for r in usable}, notes)
    flt.calibration_info = {
        "source": "feedback", "n_labels": len(usable),
        "n_relevant": int(sum(1 for r in usable if r[2])),
        "n_queries": len({r[0] for r in usable}),
        "previous_checksum": (payload.get("checksum") or {}).get("value"),
    }
    return Recalibration(
        filter=flt, mode=cal.mode, n_labels=len(rows), n_used=len(usable),
        n_relevant=int(sum(1 for r in usable if r[2])), n_without_score=len(rows) - len(
            [r for r in rows if r[3] is not None]),
        n_queries=len({r[0] for r in usable}), old_threshold=old.threshold,
        new_threshold=flt.threshold, notes=notes)
