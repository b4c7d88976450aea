"""Embedded snippet index on LanceDB: incremental indexing of a document folder.

Layout of an index directory::

    idx/
      ragsieve_index.json   {"format": 1, "model": model_id, "dim": 384, "size": .., "overlap": ..}
      snippets.lance/       one row per snippet: text, offsets, file hash, unit vector
      files.lance/          one row per indexed file: path, sha256, number of snippets
      .ragsieve-write.lock  held (``flock``) by the one process writing; records its pid

Consistency under interruption: files are committed in groups; for a group the
``files`` rows are deleted first, then the old snippet rows, then the new snippets are
added and only then the ``files`` rows. A file whose ``files`` row is missing or has
another hash is re-done on the next run (its snippet rows deleted first), so a killed
run leaves no duplicate and the rerun picks up the rest.

One writer at a time: :meth:`SnippetIndex.index_directory` holds an exclusive advisory
lock on ``.ragsieve-write.lock`` for the whole run, and a second writer fails at once
with ``BlockingIOError`` naming the holder's pid. The kernel drops the lock when its
holder exits, however it exits, so the file a killed writer leaves behind is taken over
by the next one. Readers take no lock (LanceDB reads a consistent version). A run also
repairs what unlocked writers of older versions left: extra copies of snippet and
``files`` rows are deleted, and a file with rows of two versions is embedded again.

Scores are ``1 - cos`` computed from the *stored* vectors: a query is embedded once
and the snippets are never re-embedded, so a :class:`~ragsieve.filter.ConformalFilter`
calibrated with the same embedding model applies unchanged.

Identity: :attr:`SnippetIndex.fingerprint` is a sha256 over the embedding model, the
chunking and the ``(path, sha256)`` rows of the files table, so the same documents indexed
the same way have one fingerprint wherever the index lives, and any added, removed or
changed file changes it. :meth:`SnippetIndex.retriever_identity` adds ``k`` and is what
:meth:`SnippetIndex.retrieve_pairs` (``ragsieve retrieve``) records on every calibration
pair, so a filter can say which retriever its calibration lists came from.

Search is exact. By default (``search="memory"``) the vectors are read once into a numpy
matrix, re-read when the table's version changes, and searched with one matrix-vector
product: ``benchmarks/bench_store.py`` measured LanceDB's brute-force search at 8.5 ms
(10k x 384) and 150 ms (100k x 384) per query against 0.25 ms and 8.1 ms for numpy.
The matrix costs ``4 * dim`` bytes per snippet (154 MB for 100k MiniLM snippets);
``search="lancedb"`` searches on disk instead, without that memory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from ._io import atomic_write_text
from ._optional import require
from ._validation import check_bool, check_int, check_str
from .chunking import DEFAULT_OVERLAP, DEFAULT_SIZE, chunk_text
from .embeddings import EmbeddingModel, load_embedding_model, resolve_model_id
from .errors import ArtifactError, DataError, ScorerMismatchError
from .scoring.embedding import EmbeddingScorer
from .types import FilterResult, Pair, Snippet

if TYPE_CHECKING:
    from .data.jsonl import PathOrFile
    from .data.queries import LabelledQuery
    from .filter import ConformalFilter

__all__ = [
    "SUPPORTED_SUFFIXES", "Hit", "IndexMissingError", "IndexReport", "SnippetIndex",
    "html_to_text",
]

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES = (".txt", ".md", ".html", ".htm", ".jsonl")
SEARCH_BACKENDS = ("memory", "lancedb")
_META_NAME = "ragsieve_index.json"
_LOCK_NAME = ".ragsieve-write.lock"
_FORMAT = 1
#: ``kind`` of :meth:`SnippetIndex.retriever_identity`; versions the fingerprint's recipe too.
RETRIEVER_KIND = "ragsieve-index"
_SNIPPETS = "snippets"
_FILES = "files"


class IndexMissingError(FileNotFoundError):
    """An open index whose directory (or metadata file) has been removed.

    Raised by every read and write of a :class:`SnippetIndex` once its files are gone, so
    a removed index is never silently recreated empty.
    """


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What one :meth:`SnippetIndex.index_directory` run did.

    Attributes
    ----------
    added : int
        Files (new or changed) whose snippets were embedded and stored.
    unchanged : int
        Files with the same sha256 as in the index (nothing embedded).
    removed : int
        Files that were indexed before and are gone (their rows deleted).
    skipped : list of (str, str)
        ``(path, reason)`` of files that could not be indexed (unreadable, not UTF-8,
        empty, malformed JSONL, symlink loops, dangling symlinks, FIFOs and other
        non-regular files, symlinks to directories, which are not followed); their old
        rows, if any, are deleted.
    n_embedded : int
        Snippets embedded in this run.
    n_duplicates : int
        Duplicate snippet rows found (copies of another row of the same file, left by
        concurrent writers of a version without the write lock) and deleted.
    """

    added: int
    unchanged: int
    removed: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    n_embedded: int = 0
    n_duplicates: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved snippet with its nonconformity score ``1 - cos`` (lower = closer).

    Attributes
    ----------
    snippet_id : str
        ``"{doc_id}:{start}-{end}"``.
    doc_id, path : str
        Document id and file path (relative to the indexed folder, POSIX form).
    start, end : int
        Character offsets in the document text.
    text : str
        Snippet text.
    vector : numpy.ndarray
        Stored unit embedding, ``(dim,)`` float32.
    score : float
        ``1 - cos(query, snippet)`` in [0, 2].
    """

    snippet_id: str
    doc_id: str
    path: str
    start: int
    end: int
    text: str
    vector: np.ndarray = field(compare=False, repr=False)
    score: float = 0.0


class _TextExtractor(HTMLParser):
    """Visible text of an HTML document (script/style dropped, blocks on new lines)."""

    _SKIP = frozenset({"script", "style", "head", "title", "noscript", "template"})
    _BLOCK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section",
              "article", "pre", "blockquote", "table", "ul", "ol", "hr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skip_depth += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of ``html`` with the stdlib parser (no external dependency)."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _read_docs(path: Path, rel: str, raw: bytes) -> list[tuple[str, str]]:
    """``(doc_id, text)`` of a file; raises ``DataError`` when it cannot be used."""
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        return [(rel, html_to_text(content))]
    if suffix != ".jsonl":
        return [(rel, content)]
    docs = []
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"line {lineno} is not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError(f'line {lineno} has no string "text" field')
        doc_id = obj.get("id")
        docs.append((str(doc_id) if doc_id is not None else f"{rel}#{lineno}", obj["text"]))
    return docs


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _in_list(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(_quote(v) for v in values)})"


_LINKED_DIR = "symlink to a directory (not followed)"
_FILE_KINDS = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
               (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def _scan_directory(root: Path, index_root: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """The files below ``root`` to index (supported, readable, outside the index itself) and
    the entries skipped with their reasons (relative path, reason)."""
    skipped: list[tuple[str, str]] = []
    paths = []
    for p in sorted(root.rglob("*")):
        supported = p.suffix.lower() in SUPPORTED_SUFFIXES
        if not supported and not p.is_symlink():
            continue
        reason = _not_indexable(p)
        if reason is None:
            if supported and index_root not in p.resolve().parents:
                paths.append(p)
        elif reason and (supported or reason == _LINKED_DIR):
            skipped.append((p.relative_to(root).as_posix(), reason))
    return paths, skipped


def _file_snippets(path: Path, rel: str, known_sha: str | None, size: int,
                   overlap: int) -> tuple[str, list[Snippet] | None]:
    """A file's SHA-256 and its snippets (None when the index holds it with that hash).

    Raises
    ------
    DataError
        The file cannot be read, or holds no text to index (the reason it is skipped).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"unreadable: {exc.strerror or exc}") from exc
    sha = hashlib.sha256(raw).hexdigest()
    if known_sha == sha:
        return sha, None
    snippets: list[Snippet] = []
    for doc_id, text in _read_docs(path, rel, raw):
        if text.strip():
            snippets.extend(chunk_text(text, doc_id, size=size, overlap=overlap))
    if not snippets:
        raise DataError("empty: no text to index")
    return sha, snippets


def _not_indexable(path: Path) -> str | None:
    """Why the directory entry ``path`` cannot be read as a document, without opening it.

    Returns None for a regular file (or a symlink to one), ``""`` for a directory (its
    files are listed by the walk itself), else the reason shown among the skipped files.
    """
    try:
        info = path.stat()  # follows symlinks
    except OSError as exc:
        if not path.is_symlink():
            return f"unreadable: {exc.strerror or exc}"
        if exc.errno == errno.ELOOP:
            return "symlink loop"
        if exc.errno == errno.ENOENT:
            return f"dangling symlink (its target {os.readlink(path)!r} does not exist)"
        return f"unreadable symlink: {exc.strerror or exc}"
    if stat.S_ISREG(info.st_mode):
        return None
    if stat.S_ISDIR(info.st_mode):
        return _LINKED_DIR if path.is_symlink() else ""
    kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "unknown kind")
    return f"not a regular file ({kind})"


class _WriteLock:
    """Exclusive lock of one index directory's writers (an advisory ``flock``).

    The lock file holds the pid of the writer for the error message only: the lock itself
    is the kernel's, dropped when its holder exits (kill -9 included), so a lock file left
    by a dead writer is simply taken over.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / _LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``BlockingIOError`` naming the writer that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _lock(fd)
        except BlockingIOError:
            os.lseek(fd, 0, os.SEEK_SET)
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise BlockingIOError(
                f"index {str(self.directory)!r} is being written by {who}; wait for it to "
                "finish (or stop it) and run again."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Clear the recorded pid and drop the lock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing the descriptor drops the lock

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _lock(fd: int) -> None:
    """Lock ``fd`` exclusively without waiting; ``BlockingIOError`` when it is held."""
    if sys.platform == "win32":  # pragma: no cover - lock one byte far past the pid
        import msvcrt

        os.lseek(fd, 1 << 20, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from exc
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class SnippetIndex:
    """A folder of documents chunked, embedded and stored in an embedded LanceDB.

    Use :meth:`open`, not the constructor.

    Attributes
    ----------
    path : pathlib.Path
        The index directory.
    model_id : str
        Embedding model the index was built with.
    n_embedded : int
        Snippets embedded by this instance so far (0 after an unchanged re-index).
    """

    def __init__(
        self, path: Path, meta: dict[str, Any], model: EmbeddingModel | None, search: str = "memory"
    ) -> None:
        if search not in SEARCH_BACKENDS:
            raise ValueError(f"search == {search!r}, must be one of {SEARCH_BACKENDS}.")
        self.search_backend = search
        self._snapshot: tuple[int, np.ndarray, Any] | None = None  # (version, vectors, rows)
        self.path = path
        self._meta = meta
        self._model = model
        self.model_id: str = meta["model"]
        self.dim: int = int(meta["dim"])
        self.n_embedded = 0
        lancedb = require("lancedb", "store")
        self._db = lancedb.connect(str(path))

    # ------------------------------------------------------------------ open
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        model: str | os.PathLike[str] | EmbeddingModel | None = None,
        size: int = DEFAULT_SIZE,
        overlap: int = DEFAULT_OVERLAP,
        search: str = "memory",
        create: bool = False,
    ) -> SnippetIndex:
        """Open the index at ``path``; with ``create``, make a new one if there is none.

        Parameters
        ----------
        path : str or os.PathLike
            Index directory.
        model : str, EmbeddingModel or None
            Embedding model (alias, name or loaded model). None uses the model stored
            in the index, or the English default for a new index.
        size, overlap : int
            Chunking parameters of a new index (an existing index keeps its own).
        search : {"memory", "lancedb"}
            Exact search on an in-memory copy of the vectors (fast; ``4 * dim`` bytes per
            snippet) or LanceDB's brute-force search on disk (no copy; slower).
        create : bool
            Create the directory and a new, empty index when ``path`` holds none (a
            writer, like ``ragsieve index``). False (the default, for readers like
            ``query`` and ``serve``): a missing index is an error and nothing is written,
            so a mistyped path never becomes an empty index.

        Returns
        -------
        SnippetIndex

        Raises
        ------
        FileNotFoundError
            ``create`` is False and ``path`` does not exist or holds no index.
        ScorerMismatchError
            The index was built with another embedding model than ``model``.
        ArtifactError
            ``path`` is a file, or its metadata file is unreadable.
        """
        create = check_bool(create, "create")
        require("lancedb", "store")
        root = Path(path)
        if root.exists() and not root.is_dir():
            raise ArtifactError(f"index path {str(root)!r} is a file, expected a directory.")
        meta_path = root / _META_NAME
        loaded = model if isinstance(model, EmbeddingModel) else None
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                stored = str(meta["model"])
                int(meta["dim"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ArtifactError(
                    f"index metadata {str(meta_path)!r} is unreadable ({exc}); expected JSON "
                    'with "model" and "dim". Delete the directory to rebuild the index.'
                ) from exc
            if model is not None:
                wanted = (
                    loaded.model_id if loaded is not None
                    else resolve_model_id(model)  # type: ignore[arg-type]
                )
                if wanted != stored:
                    raise ScorerMismatchError(
                        f"index {str(root)!r} was built with embedding model {stored!r} but "
                        f"model {wanted!r} was given; open it with model={stored!r} (or None), "
                        "or build a new index in another directory."
                    )
            return cls(root, meta, loaded, search)
        if not create:
            what = ("is not a ragsieve index (no ragsieve_index.json)" if root.is_dir()
                    else "does not exist")
            raise FileNotFoundError(
                f"index {str(root)!r} {what}; build it first with `ragsieve index DOCS "
                f"--index {root}` (in Python: SnippetIndex.open(path, create=True))."
            )
        if loaded is None:
            loaded = load_embedding_model(model)  # type: ignore[arg-type]
        root.mkdir(parents=True, exist_ok=True)
        meta = {"format": _FORMAT, "model": loaded.model_id, "dim": int(loaded.dim),
                "size": size, "overlap": overlap}
        # through a unique temporary file: two writers creating one index at once both
        # succeed (and then take turns at the write lock)
        atomic_write_text(meta_path, json.dumps(meta, indent=2))
        logger.info("created index %s with model %s", root, loaded.model_id)
        return cls(root, meta, loaded, search)

    @property
    def model(self) -> EmbeddingModel:
        """The embedding model (loaded on first use)."""
        if self._model is None:
            self._model = load_embedding_model(self.model_id)
        return self._model

    # --------------------------------------------------------------- tables
    def _schemas(self) -> dict[str, Any]:
        pa = require("pyarrow", "store")
        return {
            _SNIPPETS: pa.schema([
                ("snippet_id", pa.string()), ("doc_id", pa.string()), ("path", pa.string()),
                ("start", pa.int64()), ("end", pa.int64()), ("text", pa.string()),
                ("file_sha256", pa.string()), ("vector", pa.list_(pa.float32(), self.dim)),
            ]),
            _FILES: pa.schema([
                ("path", pa.string()), ("sha256", pa.string()), ("n_snippets", pa.int64()),
            ]),
        }

    def _table(self, name: str) -> Any:
        """Table ``name`` (created empty in a new index, never in a removed one).

        Raises
        ------
        IndexMissingError
            The index directory or its metadata file is gone.
        """
        if not (self.path / _META_NAME).is_file():
            raise IndexMissingError(
                f"index {str(self.path)!r} is gone (no {_META_NAME} in it any more); it was "
                "removed or moved while open. Rebuild it with `ragsieve index DOCS --index "
                f"{self.path}` and restart, or restore the directory."
            )
        return self._db.create_table(name, schema=self._schemas()[name], exist_ok=True)

    def _column(self, name: str, columns: list[str]) -> list[dict[str, Any]]:
        """``columns`` of every row of table ``name`` (the vectors are not read)."""
        query = self._table(name).search().select(columns).limit(None)
        rows: list[dict[str, Any]] = query.to_arrow().to_pylist()
        return rows

    def count(self) -> int:
        """Number of stored snippets."""
        return int(self._table(_SNIPPETS).count_rows())

    def indexed_files(self) -> dict[str, str]:
        """``{path: sha256}`` of the files committed to the index."""
        return {r["path"]: r["sha256"] for r in self._column(_FILES, ["path", "sha256"])}

    def document_ids(self) -> frozenset[str]:
        """The ids a labelled query's ``relevant_doc_ids`` can name: every stored snippet's
        ``doc_id`` and every indexed file's path (relative to the indexed folder)."""
        rows = self._column(_SNIPPETS, ["doc_id", "path"])
        return frozenset(str(r[c]) for r in rows for c in ("doc_id", "path") if r[c] is not None)

    # ------------------------------------------------------------- identity
    @property
    def fingerprint(self) -> str:
        """The identity of what this index searches: a sha256 hex digest.

        Computed (on each access, from the files table) over the embedding model id, the
        chunk size and overlap, and the sorted ``(path, sha256)`` rows of the indexed
        files. The same documents indexed the same way give the same fingerprint in any
        directory; an added, removed or changed file, another model or another chunking
        gives another. Files that were skipped (unreadable, empty) are not part of it.
        """
        files = self._column(_FILES, ["path", "sha256"])
        rows = sorted({(str(r["path"]), str(r["sha256"])) for r in files})
        recipe = {"kind": RETRIEVER_KIND, "format": _FORMAT, "model": self.model_id,
                  "size": int(self._meta.get("size", DEFAULT_SIZE)),
                  "overlap": int(self._meta.get("overlap", DEFAULT_OVERLAP)),
                  "files": [list(r) for r in rows]}
        canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def retriever_identity(self, k: int) -> dict[str, Any]:
        """Which retriever a list of :meth:`search` ``(query, k)`` came from (JSON-ready).

        Parameters
        ----------
        k : int
            The number of hits per query.

        Returns
        -------
        dict
            ``{"kind": "ragsieve-index", "index": fingerprint, "model": model_id, "k": k,
            "n_snippets": count, "path": the index directory}``. Two lists come from the
            same retriever when everything but ``path`` (informational: an index copied
            elsewhere is the same retriever) is equal.

        Raises
        ------
        ValueError
            ``k`` is below 1.
        """
        k = check_int(k, "k", min_value=1)
        return {"kind": RETRIEVER_KIND, "index": self.fingerprint, "model": self.model_id,
                "k": k, "n_snippets": self.count(), "path": str(self.path.resolve())}

    def _check_whole(self) -> None:
        """Refuse an index whose snippet rows disagree with its files table: a writer is
        committing, or one was killed between two steps of a commit."""
        listed = sum(int(r["n_snippets"]) for r in self._column(_FILES, ["n_snippets"]))
        stored = self.count()
        if listed != stored:
            raise DataError(
                f"index {str(self.path)!r} is not in a whole state: its files table lists "
                f"{listed} snippet(s) but it holds {stored} (a `ragsieve index` run is writing "
                "it, or one was stopped mid-commit); wait for the writer, or run `ragsieve "
                f"index DOCS --index {self.path}` again to repair it, then retrieve again."
            )

    # ------------------------------------------------------------- indexing
    def index_directory(
        self, docs_dir: str | os.PathLike[str], *, batch_size: int = 32, progress: bool = False
    ) -> IndexReport:
        """Index the supported files under ``docs_dir`` (recursively), incrementally.

        Only files whose sha256 changed are chunked and embedded; rows of changed and
        removed files are deleted. Files that cannot be read are listed in
        ``skipped``, never abort the run. The run holds the index's write lock (see the
        module docstring) and first repairs duplicate rows left by unlocked writers.

        Parameters
        ----------
        docs_dir : str or os.PathLike
            Folder with ``.txt``, ``.md``, ``.html`` and ``.jsonl`` files (a JSONL line is
            one document with ``"text"`` and optional ``"id"``). Symlinks to files are
            read; symlinks to directories are not followed.
        batch_size : int
            Snippets per model call; also the commit granularity (files are committed
            once their pending snippets reach it).
        progress : bool
            Show a progress bar over the files.

        Returns
        -------
        IndexReport

        Raises
        ------
        BlockingIOError
            Another process is writing this index (the message gives its pid).
        DataError
            ``docs_dir`` is not a directory.
        """
        batch_size = check_int(batch_size, "batch_size", min_value=1)
        root = Path(docs_dir)
        if not root.is_dir():
            raise DataError(f"docs_dir {str(root)!r} is not a directory.")
        with _WriteLock(self.path):
            return self._index_locked(root, batch_size, progress)

    def _index_locked(self, root: Path, batch_size: int, progress: bool) -> IndexReport:
        """:meth:`index_directory` once the write lock is held."""
        n_duplicates = self._repair()
        paths, skipped = _scan_directory(root, self.path.resolve())
        known = self.indexed_files()
        stored_paths = {r["path"] for r in self._column(_SNIPPETS, ["path"])}
        current = {p.relative_to(root).as_posix() for p in paths}
        gone = sorted((set(known) | stored_paths) - current)
        if gone:
            self._delete(gone)
        removed = len(set(known) - current)

        size, overlap = int(self._meta.get("size", DEFAULT_SIZE)), int(
            self._meta.get("overlap", DEFAULT_OVERLAP))
        unchanged = added = 0
        embedded_before = self.n_embedded
        pending: list[tuple[str, str, list[Snippet]]] = []  # (rel, sha, snippets)
        n_pending = 0
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        for p in tqdm(paths, disable=not progress, unit="file", desc="indexing"):
            rel = p.relative_to(root).as_posix()
            try:
                sha, snippets = _file_snippets(p, rel, known.get(rel), size, overlap)
            except DataError as exc:
                skipped.append((rel, str(exc)))
                if rel in known or rel in stored_paths:
                    self._delete([rel])
                continue
            if snippets is None:
                unchanged += 1
                continue
            pending.append((rel, sha, snippets))
            n_pending += len(snippets)
            added += 1
            if n_pending >= batch_size:
                self._commit(pending, batch_size)
                pending, n_pending = [], 0
        if pending:
            self._commit(pending, batch_size)
        report = IndexReport(added=added, unchanged=unchanged, removed=removed,
                             skipped=sorted(skipped), n_embedded=self.n_embedded - embedded_before,
                             n_duplicates=n_duplicates)
        logger.info("indexed %s: %s", root, report)
        return report

    def _repair(self) -> int:
        """Delete the duplicate rows concurrent unlocked writers left; return how many
        snippet rows were copies of another.

        A file is consistent when it has one ``files`` row and exactly its ``n_snippets``
        snippet rows, all of its hash (a JSONL file may repeat a snippet id on purpose).
        Otherwise, when the distinct snippet rows are exactly the ``n_snippets`` of the
        one hash its rows carry, the extra copies are deleted (nothing is re-embedded);
        when rows of two versions are mixed, every row of the file is deleted and the
        file is embedded again by this run. Rewrites follow the commit order of the
        module docstring, so a run killed here is repaired by the next.
        """
        files: dict[str, list[tuple[str, int]]] = {}
        for r in self._column(_FILES, ["path", "sha256", "n_snippets"]):
            files.setdefault(r["path"], []).append((r["sha256"], int(r["n_snippets"])))
        rows: dict[str, list[tuple[str, int, int, str]]] = {}
        for r in self._column(_SNIPPETS, ["path", "snippet_id", "start", "end", "file_sha256"]):
            rows.setdefault(r["path"], []).append(
                (r["snippet_id"], int(r["start"]), int(r["end"]), r["file_sha256"]))
        dedupe: dict[str, tuple[str, int]] = {}
        redo: list[str] = []
        n_duplicates = 0
        for path, entries in files.items():
            mine = rows.get(path, [])
            shas = {sha for sha, _ in entries} | {r[3] for r in mine}
            if len(entries) == 1 and len(shas) == 1 and len(mine) == entries[0][1]:
                continue
            n_duplicates += len(mine) - len(set(mine))
            if len(shas) == 1 and len(set(mine)) == entries[0][1]:
                dedupe[path] = entries[0]
            else:
                redo.append(path)
        if redo:
            logger.warning("index %s: the rows of %s are inconsistent (two versions, or "
                           "snippets missing); embedding them again", self.path, redo)
            self._delete(redo)
        if dedupe:
            self._rewrite_distinct(dedupe)
        if n_duplicates:
            logger.warning("index %s: deleted %d duplicate snippet row(s) of %d file(s)",
                           self.path, n_duplicates, len(dedupe) + len(redo))
        return n_duplicates

    def _rewrite_distinct(self, files: dict[str, tuple[str, int]]) -> None:
        """Store one copy of each snippet row, and one ``files`` row, of ``files``."""
        pa = require("pyarrow", "store")
        rels = sorted(files)
        snippets = self._table(_SNIPPETS)
        table = pa.concat_tables([
            snippets.search().where(_in_list("path", rels[i : i + 500])).limit(None).to_arrow()
            for i in range(0, len(rels), 500)
        ]).cast(self._schemas()[_SNIPPETS])
        keys = zip(*(table.column(c).to_pylist()
                     for c in ("path", "snippet_id", "start", "end", "file_sha256")))
        first: dict[tuple[Any, ...], int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        distinct = table.take(pa.array(sorted(first.values()), type=pa.int64()))
        self._delete(rels)
        snippets.add(distinct)
        self._table(_FILES).add(pa.table({
            "path": rels, "sha256": [files[r][0] for r in rels],
            "n_snippets": [files[r][1] for r in rels],
        }, schema=self._schemas()[_FILES]))

    def _delete(self, rels: Sequence[str]) -> None:
        """Delete the file rows, then the snippet rows, of ``rels``."""
        for i in range(0, len(rels), 500):
            where = _in_list("path", rels[i : i + 500])
            self._table(_FILES).delete(where)
            self._table(_SNIPPETS).delete(where)

    def _commit(self, group: list[tuple[str, str, list[Snippet]]], batch_size: int) -> None:
        """Embed and store a group of files (see the module docstring for the order)."""
        snippets = [s for _, _, snips in group for s in snips]
        texts = [s.text for s in snippets]
        vecs = np.concatenate([
            np.asarray(self.model.embed_batch(texts[i : i + batch_size]), dtype=np.float32)
            for i in range(0, len(texts), batch_size)
        ])
        if vecs.shape != (len(texts), self.dim):
            raise ArtifactError(
                f"embedding model returned shape {vecs.shape}, expected ({len(texts)}, {self.dim})."
            )
        self.n_embedded += len(texts)
        pa = require("pyarrow", "store")
        schemas = self._schemas()
        rels = [rel for rel, _, _ in group]
        self._delete(rels)
        file_of = {id(s): (rel, sha) for rel, sha, snips in group for s in snips}
        rows = pa.table({
            "snippet_id": [s.snippet_id for s in snippets],
            "doc_id": [s.doc_id for s in snippets],
            "path": [file_of[id(s)][0] for s in snippets],
            "start": [s.start for s in snippets],
            "end": [s.end for s in snippets],
            "text": texts,
            "file_sha256": [file_of[id(s)][1] for s in snippets],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), self.dim),
        }, schema=schemas[_SNIPPETS])
        self._table(_SNIPPETS).add(rows)
        self._table(_FILES).add(pa.table({
            "path": rels, "sha256": [sha for _, sha, _ in group],
            "n_snippets": [len(snips) for _, _, snips in group],
        }, schema=schemas[_FILES]))

    # -------------------------------------------------------------- search
    def search(self, query: str, k: int = 20) -> list[Hit]:
        """The ``k`` snippets closest to ``query`` (exact cosine search).

        Parameters
        ----------
        query : str
            Query text (embedded once).
        k : int
            Number of hits.

        Returns
        -------
        list of Hit
            Sorted by ``score = 1 - cos`` ascending, computed from the stored vectors.
        """
        check_str(query, "query")
        k = check_int(k, "k", min_value=1)
        return self._nearest(self._embed_queries([query])[0], k)

    def search_many(self, queries: Sequence[str], k: int = 20, *, batch_size: int = 32,
                    progress: bool = False) -> Iterator[list[Hit]]:
        """:meth:`search` for each query, in order, embedding ``batch_size`` queries at once.

        Parameters
        ----------
        queries : sequence of str
            Query texts.
        k : int
            Number of hits per query.
        batch_size : int
            Queries per model call.
        progress : bool
            Show a progress bar over the queries.

        Returns
        -------
        iterator of list of Hit
            The hits of each query, as :meth:`search` gives them (the same exact search on
            the same stored vectors; only the query embeddings are batched).
        """
        if isinstance(queries, (str, bytes)):
            raise TypeError(f"queries is a single {type(queries).__name__}; pass a list, e.g. "
                            "[query], or call search(query).")
        for i, query in enumerate(queries):
            check_str(query, f"queries[{i}]")
        k = check_int(k, "k", min_value=1)
        batch_size = check_int(batch_size, "batch_size", min_value=1)
        return self._search_batches(list(queries), k, batch_size, progress)

    def _search_batches(self, queries: list[str], k: int, batch_size: int,
                        progress: bool) -> Iterator[list[Hit]]:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        with tqdm(total=len(queries), disable=not progress, unit="query",
                  desc="retrieving") as bar:
            for start in range(0, len(queries), batch_size):
                for qvec in self._embed_queries(queries[start : start + batch_size]):
                    yield self._nearest(qvec, k)
                    bar.update(1)

    def _embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), dim)`` float32 query vectors of this index's model."""
        vecs = np.asarray(self.model.embed_queries(list(queries)), dtype=np.float32)
        if vecs.shape != (len(queries), self.dim):
            raise ArtifactError(f"embedding model returned shape {vecs.shape}, expected "
                                f"({len(queries)}, {self.dim}).")
        return vecs

    def _nearest(self, qvec: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` hits of one query vector (the search itself, for every caller)."""
        table = self._table(_SNIPPETS)
        if self.search_backend == "memory":
            matrix, table_rows = self._vectors(table)
            if not len(matrix):
                return []
            top = np.argpartition(-(matrix @ qvec), min(k, len(matrix)) - 1)[:k]
            rows = table_rows.take(top).to_pylist()
            vecs = matrix[top]
        else:
            if table.count_rows() == 0:
                return []
            rows = table.search(qvec).distance_type("cosine").limit(k).to_list()
            if not rows:
                return []
            vecs = np.asarray([r["vector"] for r in rows], dtype=np.float32)
        scores = EmbeddingScorer.scores_from_embeddings(qvec, vecs)
        hits = [
            Hit(snippet_id=r["snippet_id"], doc_id=r["doc_id"], path=r["path"],
                start=int(r["start"]), end=int(r["end"]), text=r["text"],
                vector=vecs[i], score=float(scores[i]))
            for i, r in enumerate(rows)
        ]
        hits.sort(key=lambda h: (h.score, h.snippet_id))
        return hits

    def _vectors(self, table: Any) -> tuple[np.ndarray, Any]:
        """``(vectors (n, dim) float32, rows without vectors)`` of the table's current version."""
        version = int(table.version)
        if self._snapshot is None or self._snapshot[0] != version:
            arrow = table.to_arrow()
            column = arrow.column("vector").combine_chunks()
            matrix = np.asarray(column.flatten(), dtype=np.float32).reshape(len(arrow), self.dim)
            self._snapshot = (version, matrix, arrow.drop_columns(["vector"]))
            logger.debug("loaded %d vectors of %s (version %d)", len(arrow), self.path, version)
        return self._snapshot[1], self._snapshot[2]

    # ------------------------------------------------------------ calibration lists
    def retrieve_pairs(
        self,
        queries: PathOrFile | Iterable[LabelledQuery | Mapping[str, Any]],
        k: int = 20,
        *,
        language: str | None = None,
        batch_size: int = 32,
        progress: bool = False,
    ) -> list[Pair]:
        """Search for every labelled query and label what comes back: calibration lists of
        this very retriever (``ragsieve retrieve``).

        Parameters
        ----------
        queries : path, open file, or iterable of LabelledQuery / mapping
            Labelled queries (:func:`ragsieve.data.queries.read_queries`).
        k : int
            Hits per query: the ``k`` the deployment retrieves.
        language : str, optional
            The language of the answers' SQuAD normalisation (None: English).
        batch_size : int
            Queries embedded per model call.
        progress : bool
            Show a progress bar over the queries.

        Returns
        -------
        list of Pair
            One per hit, query by query in input order and hit by hit in rank order:
            ``snippet_id`` the hit's, ``relevant`` from the query's labels
            (:meth:`LabelledQuery.label`; a hit is of a listed document when its
            ``doc_id`` or its ``path`` is listed), ``meta`` with ``doc_id``, ``path``,
            ``start``, ``end``, ``retrieval_score`` (``1 - cos``), ``rank``, the query's
            ``answers`` and ``retriever`` = :meth:`retriever_identity` ``(k)``.

        Raises
        ------
        DataError
            Malformed queries (``file:line``); an index that holds no snippet, that is
            not whole (a writer is committing, or was stopped mid-commit) or that changed
            while the queries ran; two snippets of one id in one list (JSONL documents
            sharing an ``id``).
        IndexMissingError
            The index directory was removed.

        Examples
        --------
        >>> pairs = index.retrieve_pairs(  # doctest: +SKIP
        ...     [{"query_id": 1, "query": "Who won?", "answers": ["Denver Broncos"]}], k=5)
        >>> pairs[0].meta["retriever"]["kind"]  # doctest: +SKIP
        'ragsieve-index'
        """
        from .data.queries import list_pairs, read_queries

        check_str(language, "language", allow_none=True, hint="a language code such as 'en'")
        labelled = read_queries(queries, language=language)
        k = check_int(k, "k", min_value=1)
        self._check_whole()
        identity = self.retriever_identity(k)
        if identity["n_snippets"] == 0:
            raise DataError(f"index {str(self.path)!r} holds no snippets; index documents "
                            f"first with `ragsieve index DOCS --index {self.path}`.")
        pairs: list[Pair] = []
        found = self.search_many([q.query for q in labelled], k, batch_size=batch_size,
                                 progress=progress)
        for query, hits in zip(labelled, found, strict=True):
            pairs.extend(list_pairs(query, self._hit_records(query.query_id, hits),
                                    retriever=identity, language=language))
        if self.retriever_identity(k) != identity:
            raise DataError(
                f"index {str(self.path)!r} changed while the queries ran (a `ragsieve index` "
                "run committed files), so the lists mix two versions of it; retrieve again "
                "once the writer has finished.")
        return pairs

    def _hit_records(self, query_id: str, hits: Sequence[Hit]) -> list[dict[str, Any]]:
        """The hits as :func:`~ragsieve.data.queries.list_pairs` takes them; a snippet id
        twice in one list (JSONL documents sharing an ``id``) is refused with the fix."""
        paths: dict[str, str] = {}
        for hit in hits:
            if hit.snippet_id in paths:
                raise DataError(
                    f"query {query_id!r}: index {str(self.path)!r} returned snippet "
                    f"{hit.snippet_id!r} twice (of {paths[hit.snippet_id]!r} and "
                    f"{hit.path!r}): documents share the id {hit.doc_id!r}; give each JSONL "
                    "document its own \"id\" and index again.")
            paths[hit.snippet_id] = hit.path
        return [{"snippet_id": h.snippet_id, "text": h.text, "doc_ids": [h.doc_id, h.path],
                 "doc_id": h.doc_id, "path": h.path, "start": h.start, "end": h.end,
                 "retrieval_score": h.score} for h in hits]

    def list_scorer(self, flt: ConformalFilter) -> Callable[[np.ndarray], np.ndarray]:
        """How ``flt``'s score is computed from this index's stored ``1 - cos`` of a hit list.

        Supported: the embedding scorer of this index's model (the scores themselves), and
        the list-relative scores built on it (``relative`` and the fused score of that
        cosine alone), recomputed from the stored vectors -- nothing is re-embedded. A
        fused score of several signals on this model (the ``best`` presets: BM25, other
        embedders, ...) is accepted too, but its callable raises ``TypeError``: the other
        signals need the texts, and :meth:`query_with_filter` scores the hit texts instead.

        Raises
        ------
        ScorerMismatchError
            The filter was calibrated on another score (another model, an LLM, ...).
        """
        scorer = flt.scorer
        spec = scorer.spec()
        expected = {"scorer": EmbeddingScorer.name, "model": self.model_id}
        if spec == expected:
            return lambda base: base
        base = scorer.base_scorer()
        if base is not None and base.spec() == expected:  # a list transform of this 1 - cos
            return scorer.scores_from_base
        raise ScorerMismatchError(
            f"the filter was calibrated with scorer {spec!r}, but this index can only compute "
            f"{expected!r} and the relative or fused scores built on it from its stored "
            f"vectors; calibrate a filter with EmbeddingScorer({self.model_id!r}) (or "
            "`ragsieve calibrate --scorer embedding|relative|best` with that model)."
        )

    def query_with_filter(
        self, query: str, flt: ConformalFilter, k: int = 20, *, group: Any = None
    ) -> tuple[list[Hit], FilterResult]:
        """Search, then apply a calibrated filter to the hits, scored from stored vectors.

        Parameters
        ----------
        query : str
            Query text.
        flt : ConformalFilter
            A calibrated filter whose score this index computes (see :meth:`list_scorer`):
            the embedding scorer of this index's model, or a relative / fused score on it.
        k : int
            Number of hits to retrieve before filtering.
        group : optional
            The query's group, for a filter of the ``group`` mode.

        Returns
        -------
        (list of Hit, FilterResult)
            All ``k`` hits (``Hit.score`` is always ``1 - cos``) and what the filter kept
            of them; ``FilterResult.scores`` are the filter's own scores.

        Raises
        ------
        ScorerMismatchError
            The filter was calibrated on a score this index cannot compute.

        Notes
        -----
        A relative or fused score depends on the list it is computed in. Its guarantee
        transfers when the calibration lists were formed like these hit lists (the same
        retriever and ``k``: ``ragsieve retrieve`` calibrates on them); the ``1 - cos`` score of
        a snippet does not depend on the list. The filter's list check sees every hit list
        with its stored ``1 - cos`` (:attr:`ConformalFilter.list_watch
        <ragsieve.filter.ConformalFilter.list_watch>`); :func:`ragsieve.lists.compare_retriever`
        with :meth:`retriever_identity` says when the filter was calibrated on another
        retriever's lists.
        """
        to_scores = self.list_scorer(flt)
        hits = self.search(query, k=k)
        snippets = [Snippet(h.doc_id, h.start, h.end, h.text) for h in hits]
        scores = np.array([h.score for h in hits], dtype=float)
        if hits:
            try:
                scores = to_scores(scores)
            except TypeError:  # a fused score of several signals: they need the hit texts
                scores = flt.scorer.score_batch(query, [h.text for h in hits])
        # the filter's root score is this index's 1 - cos (list_scorer checked it)
        result = flt.filter_scores(query, scores, snippets, group=group,
                                   root_scores=[h.score for h in hits])
        return hits, result

    def __repr__(self) -> str:
        return f"SnippetIndex(path={str(self.path)!r}, model_id={self.model_id!r})"
