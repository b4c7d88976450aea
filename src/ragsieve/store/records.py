"""What an index gives back: a search :class:`Hit`, an indexing run's :class:`IndexReport`,
and the error of an index removed while open (:class:`IndexMissingError`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Hit", "IndexMissingError", "IndexReport"]


class IndexMissingError(FileNotFoundError):
    """An open index whose directory (or metadata file) has been removed.

    Raised by every read and write of a :class:`~ragsieve.store.SnippetIndex` once its files are gone, so
    a removed index is never silently recreated empty.
    """


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What one :meth:`~ragsieve.store.SnippetIndex.index_directory` run did.

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
