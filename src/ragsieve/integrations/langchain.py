"""LangChain document compressor backed by a calibrated :class:`~ragsieve.ConformalFilter`.

Use it wherever LangChain accepts a ``BaseDocumentCompressor``, e.g. in
``ContextualCompressionRetriever(base_compressor=..., base_retriever=...)``
(``from langchain_classic.retrievers import ContextualCompressionRetriever``), or call
:meth:`ConformalCompressor.compress_documents` directly. Requires
``pip install 'ragsieve[langchain]'`` (langchain-core and langchain-classic).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

from ragsieve._optional import require
from ragsieve.filter import ConformalFilter
from ragsieve.integrations import (
    FromFileMixin,
    check_documents,
    filter_items,
    kept_metadata,
)

require("langchain_core.documents", "langchain")
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict

__all__ = ["ConformalCompressor"]

logger = logging.getLogger(__name__)


class ConformalCompressor(FromFileMixin, BaseDocumentCompressor):
    """Keep the documents a calibrated conformal filter keeps.

    Parameters
    ----------
    filter : ConformalFilter
        A calibrated filter (e.g. ``ConformalFilter.load("filter.json")``).

    Notes
    -----
    Each document goes to the filter with its metadata (see
    :func:`ragsieve.integrations.filter_items`), so every guarantee mode works: a
    ``group``-mode filter reads ``metadata[filter.group_by]``, a filter on an outside score
    reads ``metadata[field]``; a document without it raises ``DataError``.

    Returns new ``Document`` objects in input order; each carries a copy of the
    original metadata plus ``"ragsieve_score"`` (nonconformity score, lower = more
    relevant), ``"ragsieve_threshold"`` (the calibrated tau) and ``"ragsieve_mode"``
    (the guarantee mode). ``id`` is kept.

    Examples
    --------
    >>> comp = ConformalCompressor.from_file("filter.json")  # doctest: +SKIP
    >>> comp.compress_documents(docs, "who wrote it?")  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    filter: ConformalFilter

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Return new Documents for the kept ones, in input order.

        Parameters
        ----------
        documents : sequence of Document
            Retrieved documents; not modified.
        query : str
            The query they were retrieved for.
        callbacks : Callbacks, optional
            Accepted for interface compatibility; unused.

        Returns
        -------
        list of Document
            Copies of the kept documents with score, threshold and mode in ``metadata``.

        Raises
        ------
        TypeError
            ``documents`` is one Document or a string instead of a sequence of Documents.
        DataError
            A document lacks what the filter's mode or score needs in its metadata (the
            group under ``filter.group_by``, an outside score).
        """
        docs = check_documents(documents, Document)
        if not docs:
            return []
        items = filter_items(self.filter, [d.page_content for d in docs],
                             [d.metadata for d in docs])
        result = self.filter.filter(query, items)
        logger.debug("kept %d of %d documents (tau=%s)", len(result.kept), len(docs),
                     result.threshold)
        out: list[Document] = []
        for kept in result.kept:
            src = docs[kept.index]
            meta: dict[str, Any] = copy.deepcopy(dict(src.metadata))
            meta.update(kept_metadata(self.filter, result, kept))
            out.append(Document(page_content=src.page_content, metadata=meta, id=src.id))
        return out

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Async :meth:`compress_documents`; scoring runs in a thread executor."""
        return await run_in_executor(None, self.compress_documents, documents, query, callbacks)
