"""Embedded snippet index on LanceDB: incremental indexing of a document folder, search.

Layout of an index directory::

    idx/
      ragsieve_index.json   {"format": 1, "model": model_id, "dim": 384, "size": .., "overlap": ..}
      snippets.lance/       one row per snippet: text, offsets, file hash, unit vector
      files.lance/          one row per indexed file: path, sha256, number of snippets
      .ragsieve-write.lock  held (``flock``) by the one process writing; records its pid

The index stores and searches, nothing more; one module per job:

- :mod:`~ragsieve.store.index` -- :class:`SnippetIndex`: open, index, search, identity.
- :mod:`~ragsieve.store.extraction` -- which files of a folder are read, and their text
  (:func:`html_to_text`, JSONL documents), cut into snippets.
- :mod:`~ragsieve.store.tables` -- the two LanceDB tables, the order a commit writes them
  in (a killed run leaves no duplicate; the rerun picks up the rest) and their repair.
- :mod:`~ragsieve.store.indexing` -- one incremental run: only changed files embedded.
- :mod:`~ragsieve.store._locking` -- one writer at a time: a second fails at once with
  ``BlockingIOError`` naming the holder's pid; a dead writer's lock is taken over.
- :mod:`~ragsieve.store.vectors` -- the exact search: scores ``1 - cos`` from the *stored*
  vectors, so a :class:`~ragsieve.filter.ConformalFilter` calibrated with the same
  embedding model applies unchanged.
- :mod:`~ragsieve.store.records` -- :class:`Hit`, :class:`IndexReport`,
  :class:`IndexMissingError`.

Labelled retrieval over an index (``ragsieve retrieve``) is :mod:`ragsieve.retrieval`;
searching and then filtering the hits (``query --filter``, ``serve --index``) is
:mod:`ragsieve.filtered_search`.
"""

from .extraction import SUPPORTED_SUFFIXES, html_to_text
from .index import RETRIEVER_KIND, SnippetIndex
from .records import Hit, IndexMissingError, IndexReport
from .vectors import SEARCH_BACKENDS

__all__ = [
    "RETRIEVER_KIND", "SEARCH_BACKENDS", "SUPPORTED_SUFFIXES", "Hit", "IndexMissingError",
    "IndexReport", "SnippetIndex", "html_to_text",
]
