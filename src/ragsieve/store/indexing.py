"""One incremental indexing run over a documents folder, under the index's write lock.

The run first repairs what unlocked writers left (:meth:`SnippetTables.repair`), deletes
the rows of removed files, then chunks and embeds only the files whose sha256 changed,
committing them in groups (see :mod:`ragsieve.store.tables` for the order). A file that
cannot be read is listed as skipped and its old rows are deleted; it never aborts the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import DataError
from .extraction import file_snippets, scan_directory
from .records import IndexReport
from .tables import SNIPPETS, FileGroup, SnippetTables

__all__ = ["index_folder"]

logger = logging.getLogger(__name__)


def index_folder(
    tables: SnippetTables, root: Path, embed: Callable[[list[str]], np.ndarray], *,
    chunking: tuple[int, int], batch_size: int, progress: bool,
) -> IndexReport:
    """Index the supported files under ``root`` into ``tables`` (the write lock is held).

    Parameters
    ----------
    tables : SnippetTables
        The index's tables.
    root : pathlib.Path
        The documents folder.
    embed : callable
        ``embed(texts) -> (len(texts), dim)`` float32 unit vectors; called only for files
        that changed.
    chunking : (int, int)
        The index's chunk ``(size, overlap)``.
    batch_size : int
        The commit granularity: files are committed once their pending snippets reach it.
    progress : bool
        Show a progress bar over the files.

    Returns
    -------
    IndexReport
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    n_duplicates = tables.repair()
    paths, skipped = scan_directory(root, tables.path.resolve())
    known = tables.files()
    stored_paths = {r["path"] for r in tables.rows(SNIPPETS, ["path"])}
    current = {p.relative_to(root).as_posix() for p in paths}
    gone = sorted((set(known) | stored_paths) - current)
    if gone:
        tables.delete(gone)
    removed = len(set(known) - current)
    unchanged = added = n_embedded = 0
    pending: FileGroup = []
    n_pending = 0
    for p in tqdm(paths, disable=not progress, unit="file", desc="indexing"):
        rel = p.relative_to(root).as_posix()
        try:
            sha, snippets = file_snippets(p, rel, known.get(rel), *chunking)
        except DataError as exc:
            skipped.append((rel, str(exc)))
            if rel in known or rel in stored_paths:
                tables.delete([rel])
            continue
        if snippets is None:
            unchanged += 1
            continue
        pending.append((rel, sha, snippets))
        n_pending += len(snippets)
        added += 1
        if n_pending >= batch_size:
            n_embedded += _commit(tables, pending, embed)
            pending, n_pending = [], 0
    if pending:
        n_embedded += _commit(tables, pending, embed)
    report = IndexReport(added=added, unchanged=unchanged, removed=removed,
                         skipped=sorted(skipped), n_embedded=n_embedded,
                         n_duplicates=n_duplicates)
    logger.info("indexed %s: %s", root, report)
    return report


def _commit(tables: SnippetTables, group: FileGroup,
            embed: Callable[[list[str]], np.ndarray]) -> int:
    """Embed and store a group of files; return how many snippets were embedded."""
    texts = [s.text for _, _, snips in group for s in snips]
    tables.add(group, embed(texts))
    return len(texts)
