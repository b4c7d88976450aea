"""Hot reload: artifact generations shared by the processes of one ``serve``.

A reload reads the served artifact's path again (a file over ``max_artifact_bytes`` is
refused from its ``stat``, before it is read), validates the new artifact by building
what the service builds from it (the one reader :meth:`~ragsieve.artifact.Artifact.parse`:
JSON, every field's type, the seal; then the filter, the calibration state, the scorer,
the served index, ``--adaptive``'s mode, the monitor and the ``/healthz`` view) and only
then publishes it as the next *generation* in a small SQLite file of the state directory
(``control.sqlite``: generation, the artifact's identity, its text; the newest
``_KEEP_GENERATIONS`` are kept). Every app polls the latest generation and swaps in a
service built from the published text, so all workers serve the same artifact even if the
file changes again. A worker that cannot build the newest generation (or starts after a
crash and cannot) serves the newest one it can build and says so in ``/healthz``
(``published_generation``, ``degraded``). A refused artifact is never published: the old
one keeps serving and the refusal is logged (and answered 413 for a file over the size
cap, 422 otherwise, by ``POST /admin/reload``).

Triggers: ``SIGHUP`` (to the ``serve`` process; with ``--workers`` the parent), ``POST
/admin/reload`` (in the worker that receives it, which swaps before answering), and with
``--watch`` a change of the file's modification time, size or inode (polled). A refused
file is not read again until one of them changes; a file is published unless it is the
very text the app serves of the newest generation, so a good file put back after a
refusal is picked up.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._sqlite import connect_shared
from ..artifact import MAX_ARTIFACT_BYTES, Artifact, read_text
from ..errors import ArtifactError, DataError
from ..filter import ConformalFilter
from .parsing import printable

__all__ = ["DEFAULT_MAX_ARTIFACT_BYTES", "ArtifactCheck", "Generation", "Generations", "Publisher",
           "check_artifact", "file_signature", "options_for_scorer", "probe_scorer", "read_text"]

logger = logging.getLogger(__name__)

#: Largest artifact file a service reads (bigger ones are refused before parsing).
DEFAULT_MAX_ARTIFACT_BYTES = MAX_ARTIFACT_BYTES
#: Generations kept in the control file (older ones are deleted).
_KEEP_GENERATIONS = 3
#: The control file's table and its columns.
_CREATE = ("CREATE TABLE IF NOT EXISTS generations (number INTEGER PRIMARY KEY, checksum TEXT "
           "NOT NULL, text TEXT NOT NULL, source TEXT NOT NULL, time TEXT NOT NULL)")
_COLUMNS = ["number", "checksum", "text", "source", "time"]
#: Rows of another shape than :class:`Generation`'s (an edited or foreign file).
_BAD_ROWS = ("SELECT count(*) FROM generations WHERE typeof(number) != 'integer' OR "
             "typeof(checksum) != 'text' OR typeof(text) != 'text' OR typeof(source) != 'text'")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Generation:
    """One published artifact."""

    number: int
    checksum: str
    text: str
    source: str


class Generations:
    """The control file: the published artifact generations of one ``serve``.

    Parameters
    ----------
    path : str or Path
        ``control.sqlite`` in the state directory (created).

    Raises
    ------
    DataError
        The file is not an SQLite database, is corrupt or has another schema (the message
        names the file and ``--state-dir``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._db = connect_shared(self.path)
        except sqlite3.DatabaseError as exc:
            raise self._unusable(exc) from exc
        try:
            self._db.execute(_CREATE)
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise self._unusable(exc) from exc

    def _check_schema(self) -> None:
        found = [row[1] for row in self._db.execute("PRAGMA table_info(generations)")]
        if found != _COLUMNS:
            raise sqlite3.DatabaseError(f"table 'generations' has columns {found}, expected "
                                        f"{_COLUMNS}")
        check = self._db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check and check[0]}")
        bad = int(self._db.execute(_BAD_ROWS).fetchone()[0])
        if bad:
            raise sqlite3.DatabaseError(f"{bad} generation row(s) of the wrong types")

    def _unusable(self, exc: BaseException) -> DataError:
        return DataError(f"state file {str(self.path)!r} is not a ragsieve control file ({exc}); "
                         "move it away or pass another --state-dir.")

    def publish(self, text: str, checksum: str, source: str) -> int:
        """Add the next generation; returns its number."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT max(number) FROM generations").fetchone()
                number = int(row[0] or 0) + 1
                self._db.execute("INSERT INTO generations VALUES (?, ?, ?, ?, ?)",
                                 (number, checksum, text, source, _now()))
                self._db.execute("DELETE FROM generations WHERE number <= ?",
                                 (number - _KEEP_GENERATIONS,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return number

    def latest_number(self) -> int:
        """The newest generation's number (0 when none)."""
        with self._lock:
            row = self._db.execute("SELECT max(number) FROM generations").fetchone()
        return int(row[0] or 0)

    def latest(self) -> Generation | None:
        """The newest generation, or None."""
        newest = self.history(limit=1)
        return newest[0] if newest else None

    def history(self, *, limit: int = _KEEP_GENERATIONS) -> list[Generation]:
        """The kept generations, newest first (a worker walks back through them)."""
        with self._lock:
            rows = self._db.execute("SELECT number, checksum, text, source FROM generations "
                                    "ORDER BY number DESC LIMIT ?", (limit,)).fetchall()
        return [Generation(int(r[0]), r[1], r[2], r[3]) for r in rows]

    def get(self, number: int) -> Generation | None:
        """Generation ``number``, or None when it is not kept."""
        with self._lock:
            row = self._db.execute("SELECT number, checksum, text, source FROM generations "
                                   "WHERE number = ?", (number,)).fetchone()
        return None if row is None else Generation(int(row[0]), row[1], row[2], row[3])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()


@dataclass(frozen=True)
class ArtifactCheck:
    """A read and fully checked artifact, ready to publish."""

    artifact: Artifact
    text: str
    filter: ConformalFilter

    @property
    def checksum(self) -> str:
        """The artifact's identity (:attr:`Artifact.identity <ragsieve.artifact.Artifact.identity>`):
        the key of its generation, monitor store and feedback rows."""
        return self.artifact.identity

    @property
    def payload(self) -> dict[str, Any]:
        """The artifact as a dict (a copy), for views that show its fields."""
        return self.artifact.to_dict()


def options_for_scorer(spec: Mapping[str, Any],
                       scorer_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The service's scorer options that the scorer of ``spec`` takes
    (:func:`ragsieve.scoring.registry.spec_option_names`: those it declares, and a fused
    score's also the runtime ones of its signals, a reranker's ``url``); the others are not
    passed to it.

    A service keeps one set of scorer options (``ServeOptions.scorer_options``: e.g. the
    embedding cache) for every artifact it serves, and a reload may bring a scorer of
    another kind: ``cache_dir`` means nothing to an outside score. The options dropped are
    logged. An alias that is not registered keeps them all (rebuilding it names the alias).

    Examples
    --------
    >>> options_for_scorer({"scorer": "field", "field": "bm25"}, {"cache_dir": "/tmp/c"})
    {}
    >>> options_for_scorer({"scorer": "embedding", "model": "m"}, {"cache_dir": "/tmp/c"})
    {'cache_dir': '/tmp/c'}
    """
    from ..scoring.registry import spec_option_names

    given = dict(scorer_options or {})
    kind = str(spec.get("scorer"))
    try:  # a fused score's also: the runtime options of its signals (a reranker's url)
        declared = spec_option_names(spec)
    except ValueError:  # not registered: from_artifact says so
        return given
    dropped = sorted(set(given) - declared)
    if dropped:
        logger.info("scorer options %s are not options of scorer %r: not passed to it",
                    dropped, kind)
    return {name: value for name, value in given.items() if name in declared}


def check_artifact(text: str, source: str, *, scorer_options: Mapping[str, Any] | None = None,
                   index_path: str | Path | None = None, adaptive: bool = False,
                   monitor_check: Callable[[Artifact], object] | None = None,
                   scorer: Any = None, verify_key: bytes | None = None) -> ArtifactCheck:
    """Check an artifact's text as the service would load it (no model is loaded).

    The text is read by :meth:`~ragsieve.artifact.Artifact.parse` (every field's type, the
    seal), then the filter is built from the :class:`~ragsieve.artifact.Artifact`, its
    scorer from the artifact's own spec with the ``scorer_options`` that scorer declares
    (:func:`options_for_scorer`: a reload may bring another kind of scorer). :meth:`~ragsieve.server.runtime.Runtime.check` adds
    the ``/healthz`` view.

    Raises
    ------
    ArtifactError
        Not JSON, a field of the wrong type, a broken seal, bad state, a scorer that cannot
        be rebuilt or does not match the served index (a filter of unit ``"sentence"``
        never does: the index holds snippet vectors), a mode other than ``adaptive`` or a
        unit other than ``"snippet"`` under ``--adaptive``, or a malformed monitor
        reference; with ``verify_key``, no signature made with it (checked first).
    """
    artifact = Artifact.parse(text, source, verify_key=verify_key)
    reuse = scorer if scorer is not None and scorer.spec() == artifact.scorer else None
    options = options_for_scorer(artifact.scorer, scorer_options)
    try:
        flt = ConformalFilter.from_artifact(artifact, scorer=reuse, scorer_options=options)
    except ArtifactError:
        raise
    except (TypeError, ValueError, KeyError, ImportError) as exc:
        raise ArtifactError(f"filter artifact {source!r} cannot be loaded: {exc}") from exc
    if adaptive and flt.unit != "snippet":
        raise ArtifactError(
            f"serve --adaptive cannot serve {source!r}, a filter of unit {flt.unit!r}: its "
            "threshold is over evidence sentences, /feedback labels name snippets, and a label "
            "does not say which sentence's score to learn from. Serve it without --adaptive "
            "(the monitor works per sentence), or calibrate --unit snippet --mode adaptive.")
    if adaptive and not flt.calibrator_.online:
        raise ArtifactError(
            f"serve --adaptive needs an artifact of mode 'adaptive' (its calibrator follows "
            f"feedback); {source!r} has mode {flt.mode!r}. Calibrate with `ragsieve calibrate "
            "--mode adaptive`, or serve without --adaptive.")
    if index_path is not None and flt.unit != "snippet":
        raise ArtifactError(
            f"artifact {source!r} is a filter of unit {flt.unit!r}: it scores the sentences of "
            "each snippet, and the served index stores one vector per snippet, so /query cannot "
            "score its hits from it. Serve it without --index and POST /filter the hits' texts.")
    if index_path is not None:
        from ..filtered_search import list_scorer
        from ..store import SnippetIndex

        try:
            list_scorer(SnippetIndex.open(index_path), flt)
        except ValueError as exc:  # ScorerMismatchError is a ValueError
            raise ArtifactError(f"artifact {source!r} does not match the served index: {exc}") from exc
    if monitor_check is not None:
        try:
            monitor_check(artifact)
        except (TypeError, ValueError, KeyError) as exc:
            raise ArtifactError(f"artifact {source!r} has a malformed monitor reference: {exc}") from exc
    return ArtifactCheck(artifact, text, flt)


def probe_scorer(checked: ArtifactCheck, source: str,
                 run: Callable[[Callable[[], Any]], Any] | None = None) -> None:
    """Score one pair with a checked artifact's scorer (its model and learned weights are
    loaded here), so an artifact whose scorer cannot score is refused before it is
    published. A scorer that needs no model (an outside score) has nothing to load.

    Raises
    ------
    ArtifactError
        The scorer failed (one line naming the artifact and the reason).
    """
    scorer = checked.filter.scorer_
    if scorer.tags.model_free:
        return
    call = run or (lambda fn: fn())
    try:
        call(lambda: scorer.score_batch("ragsieve reload check", ["ragsieve reload check"]))
    except Exception as exc:  # whatever the weights or the model raise: refused, never published
        raise ArtifactError(f"artifact {source!r} cannot score with its scorer "
                            f"({type(exc).__name__}: {printable(str(exc))[:300]})") from exc


def file_signature(path: str | Path) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of ``path``, or None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Publisher:
    """Reads the served path, checks the artifact and publishes it as a new generation.

    Used by whichever process owns the triggers: the ``serve`` process (one worker), the
    parent (``--workers``) and the worker answering ``POST /admin/reload``.

    Parameters
    ----------
    path : str or Path
        The served artifact path (re-read on every reload).
    generations : Generations
        The control file.
    check : callable
        ``check(text, source) -> ArtifactCheck``; raises ``ArtifactError`` to refuse. It
        builds what the service builds, so nothing that cannot be served is published.
    before_publish : callable, optional
        Called with ``(check, previous_checksum)`` after the check and before the publish
        (resets the shared monitor when the checksum changed, before any worker uses it).
    max_bytes : int
        Larger files are refused from their size, unread.
    served : callable, optional
        ``served() -> int | None``: the generation this process serves (the file watch
        publishes unless the file is that generation's text and it is the newest). None:
        the newest published one (the parent of ``--workers``, which serves nothing).
    """

    def __init__(self, path: str | Path, generations: Generations,
                 check: Callable[[str, str], ArtifactCheck],
                 before_publish: Callable[[ArtifactCheck, str | None], object] | None = None,
                 *, max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
                 served: Callable[[], int | None] | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.generations = generations
        self.check = check
        self.before_publish = before_publish
        self.served = served
        self.lock = threading.Lock()
        self.signature = file_signature(self.path)

    def publish(self, reason: str, *, only_if_changed: bool = False) -> tuple[ArtifactCheck, int]:
        """Read, check and publish the artifact at the served path.

        With ``only_if_changed`` (the file watch), a file whose text is the served
        generation's, while that generation is the newest (e.g. already published by
        ``POST /admin/reload``), is not published again; its number is returned.

        Raises
        ------
        ArtifactError
            The artifact was refused (logged; nothing published); ``ArtifactTooLargeError``
            for a file over ``max_bytes``.
        """
        with self.lock:
            signature = file_signature(self.path)
            try:
                text = read_text(self.path, max_bytes=self.max_bytes)
                checked = self.check(text, str(self.path))
            except ArtifactError as exc:
                self.signature = signature  # do not retry the same bad file on every poll
                self._log_refusal(reason, exc)
                raise
            previous = self.generations.latest()
            previous_checksum = previous.checksum if previous else None
            if only_if_changed and self._is_served(previous, checked.text):
                self.signature = signature
                return checked, previous.number  # type: ignore[union-attr]
            if self.before_publish is not None:
                self.before_publish(checked, previous_checksum)
            number = self.generations.publish(checked.text, checked.checksum, reason)
            self.signature = signature
        logger.warning("reload (%s): published generation %d (checksum %s, mode %s%s) from %s",
                       reason, number, checked.checksum[:12], checked.filter.mode,
                       "" if checked.checksum != previous_checksum else ", unchanged", self.path)
        return checked, number

    def _is_served(self, newest: Generation | None, text: str) -> bool:
        """True when ``text`` is the newest generation's and this process serves it."""
        if newest is None or newest.text != text:
            return False
        return self.served is None or self.served() == newest.number

    def _log_refusal(self, reason: str, exc: ArtifactError) -> None:
        served = None if self.served is None else self.served()
        current = self.generations.latest() if served is None else self.generations.get(served)
        logger.error("reload (%s) refused: %s; still serving generation %s (checksum %s)",
                     reason, exc, current.number if current else "?",
                     current.checksum[:12] if current else "?")

    def file_changed(self) -> bool:
        """True when the file's (mtime, size, inode) differs from the last one read."""
        signature = file_signature(self.path)
        return signature is not None and signature != self.signature


class Trigger:
    """Reload requests (SIGHUP) and file watching, handled in one background thread.

    ``request(reason)`` is safe to call from a signal handler: it only appends to a list
    and sets an event.
    """

    def __init__(self, publisher: Publisher, *, watch: bool, interval: float,
                 tick: Callable[[], None] | None = None) -> None:
        self.publisher = publisher
        self.watch = watch
        self.interval = interval
        self.tick = tick
        self._pending: list[str] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ragsieve-reload", daemon=True)

    def start(self) -> None:
        """Start the background thread."""
        self._thread.start()

    def request(self, reason: str) -> None:
        """Ask for a reload (e.g. from a SIGHUP handler)."""
        self._pending.append(reason)
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread (after its current step)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # never let the thread die: log and keep polling
                logger.exception("reload thread step failed")

    def step(self) -> None:
        """One round: pending requests, the file watch, then ``tick``."""
        reasons = []
        while self._pending:
            reasons.append(self._pending.pop(0))
        watched = not reasons and self.watch and self.publisher.file_changed()
        if reasons or watched:
            try:
                self.publisher.publish(" + ".join(sorted(set(reasons))) or "file change",
                                       only_if_changed=watched)
            except ArtifactError:
                pass  # logged by the publisher; the old generation keeps serving
        if self.tick is not None:
            self.tick()
