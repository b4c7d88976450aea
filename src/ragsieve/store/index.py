"""The snippet index: a documents folder chunked, embedded and searched (:class:`SnippetIndex`).

:meth:`SnippetIndex.open` reads or creates the index directory (see :mod:`ragsieve.store`
for its layout), :meth:`~SnippetIndex.index_directory` runs an incremental indexing
(:mod:`~ragsieve.store.indexing`) under the write lock (:mod:`~ragsieve.store._locking`),
and :meth:`~SnippetIndex.search` is the exact cosine search on the stored vectors
(:mod:`~ragsieve.store.vectors`): a query is embedded once, the snippets never again.

Identity: :attr:`SnippetIndex.fingerprint` is a sha256 over the embedding model, the
chunking and the ``(path, sha256)`` rows of the files table, so the same documents indexed
the same way have one fingerprint wherever the index lives, and any added, removed or
changed file changes it. :meth:`SnippetIndex.retriever_identity` adds ``k`` and is what
:func:`ragsieve.retrieval.retrieve_pairs` (``ragsieve retrieve``) records on every
calibration pair, so a filter can say which retriever its calibration lists came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_text
from .._optional import require
from .._validation import check_bool, check_int, check_str
from ..chunking import DEFAULT_OVERLAP, DEFAULT_SIZE
from ..embeddings import EmbeddingModel, load_embedding_model, resolve_model_id
from ..errors import ArtifactError, DataError, ScorerMismatchError
from ._locking import WriteLock
from .indexing import index_folder
from .records import Hit, IndexReport
from .tables import FILES, META_NAME, SNIPPETS, SnippetTables
from .vectors import VectorSearch

__all__ = ["RETRIEVER_KIND", "SnippetIndex"]

logger = logging.getLogger(__name__)

_FORMAT = 1
#: ``kind`` of :meth:`SnippetIndex.retriever_identity`; versions the fingerprint's recipe too.
RETRIEVER_KIND = "ragsieve-index"


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
        self.path = path
        self._meta = meta
        self._model = model
        self.model_id: str = meta["model"]
        self.dim: int = int(meta["dim"])
        self.n_embedded = 0
        #: the index's LanceDB tables (storage) and the exact search over their vectors
        self.tables = SnippetTables(path, self.dim)
        self._search = VectorSearch(self.tables, search)

    @property
    def search_backend(self) -> str:
        """``"memory"`` or ``"lancedb"``: where :meth:`search` runs."""
        return self._search.backend

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
        root = Path(path)
        if root.exists() and not root.is_dir():
            raise ArtifactError(f"index path {str(root)!r} is a file, expected a directory.")
        meta_path = root / META_NAME
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
            require("lancedb", "store")  # only now: a missing index costs no import
            return cls(root, meta, loaded, search)
        if not create:
            what = ("is not a ragsieve index (no ragsieve_index.json)" if root.is_dir()
                    else "does not exist")
            raise FileNotFoundError(
                f"index {str(root)!r} {what}; build it first with `ragsieve index DOCS "
                f"--index {root}` (in Python: SnippetIndex.open(path, create=True))."
            )
        require("lancedb", "store")
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

    def count(self) -> int:
        """Number of stored snippets."""
        return self.tables.count()

    def indexed_files(self) -> dict[str, str]:
        """``{path: sha256}`` of the files committed to the index."""
        return self.tables.files()

    def document_ids(self) -> frozenset[str]:
        """The ids a labelled query's ``relevant_doc_ids`` can name: every stored snippet's
        ``doc_id`` and every indexed file's path (relative to the indexed folder)."""
        rows = self.tables.rows(SNIPPETS, ["doc_id", "path"])
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
        files = self.tables.rows(FILES, ["path", "sha256"])
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

    def check_whole(self) -> None:
        """Refuse an index whose snippet rows disagree with its files table: a writer is
        committing, or one was killed between two steps of a commit."""
        listed = sum(int(r["n_snippets"]) for r in self.tables.rows(FILES, ["n_snippets"]))
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
        ``skipped``, never abort the run. The run holds the index's write lock (see
        :mod:`ragsieve.store`) and first repairs duplicate rows left by unlocked writers.

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
        chunking = (int(self._meta.get("size", DEFAULT_SIZE)),
                    int(self._meta.get("overlap", DEFAULT_OVERLAP)))
        with WriteLock(self.path):
            return index_folder(self.tables, root, lambda texts: self._embed(texts, batch_size),
                                chunking=chunking, batch_size=batch_size, progress=progress)

    def _embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        """``(len(texts), dim)`` float32 snippet vectors, ``batch_size`` texts per model call."""
        vecs = np.concatenate([
            np.asarray(self.model.embed_batch(texts[i : i + batch_size]), dtype=np.float32)
            for i in range(0, len(texts), batch_size)
        ])
        if vecs.shape != (len(texts), self.dim):
            raise ArtifactError(
                f"embedding model returned shape {vecs.shape}, expected ({len(texts)}, {self.dim})."
            )
        self.n_embedded += len(texts)
        return vecs


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
        return self._search.nearest(self._embed_queries([query])[0], k)

    def search_vector(self, query_vector: np.ndarray, k: int = 20) -> list[Hit]:
        """:meth:`search` with the query already embedded by this index's model (a caller
        that embeds the query anyway, through its own cache, embeds it once).

        Parameters
        ----------
        query_vector : numpy.ndarray
            ``(dim,)`` unit query vector of :attr:`model_id`'s query side.
        k : int
            Number of hits.

        Returns
        -------
        list of Hit
            As :meth:`search` gives them.

        Raises
        ------
        ValueError
            ``query_vector`` is not ``(dim,)`` or holds NaN or inf.
        """
        k = check_int(k, "k", min_value=1)
        qvec = np.asarray(query_vector, dtype=np.float32)
        if qvec.shape != (self.dim,) or not np.isfinite(qvec).all():
            raise ValueError(f"query_vector has shape {qvec.shape}, expected finite ({self.dim},) "
                             f"of {self.model_id!r}.")
        return self._search.nearest(qvec, k)

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
                    yield self._search.nearest(qvec, k)
                    bar.update(1)

    def _embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), dim)`` float32 query vectors of this index's model."""
        vecs = np.asarray(self.model.embed_queries(list(queries)), dtype=np.float32)
        if vecs.shape != (len(queries), self.dim):
            raise ArtifactError(f"embedding model returned shape {vecs.shape}, expected "
                                f"({len(queries)}, {self.dim}).")
        return vecs

    def __repr__(self) -> str:
        return f"SnippetIndex(path={str(self.path)!r}, model_id={self.model_id!r})"
