"""LangChain document compressor backed by a calibrated :class:`~ragsieve.ConformalFilter`.

Use it wherever LangChain accepts a ``BaseDocumentCompressor``, e.g. in
``ContextualCompressionRetriever(base_compressor=..., base_retriever=...)``
(``from langchain_classic.retrievers import ContextualCompressionRetriever``), or call
:meth:`ConformalCompressor.compress_documents` directly. Requires
``pip install 'ragsieve[langchain]'`` (langchain-core and langchain-classic).

LangChain's native score is ``metadata["relevance_score"]``, what its rerankers and
reranking compressors write (Cohere, Jina, Infinity, DashScope, ...). Its retrievers
return none: the vector-store retriever drops the similarity even with
``search_type="similarity_score_threshold"``, and langchain-community's ``BM25Retriever``
ranks by rank-bm25 scores without returning them; :func:`bm25_relevance` writes them.

:meth:`ConformalCompressor.calibrate` calibrates through the retriever you deploy:
``ConformalCompressor.calibrate(retriever, queries, alpha=0.1)`` runs
``retriever.invoke(query)`` on labelled queries and calibrates on its lists.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Self

from ragsieve._optional import require
from ragsieve.filter import ConformalFilter
from ragsieve.integrations.adapter import FrameworkAdapter
from ragsieve.integrations.empty_lists import EmptyListLog
from ragsieve.integrations.filtering import (
    Copies,
    DocumentFields,
    check_documents,
    filter_documents,
)
from ragsieve.integrations.metadata import kept_metadata, pruned_text
from ragsieve.integrations.native import calibrate_native, native_pairs
from ragsieve.integrations.retrieval import Retrieval, RetrievedDoc, document_ids, retrieval_run
from ragsieve.types import Pair

require("langchain_core.documents", "langchain")
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field, PrivateAttr

from ragsieve.integrations._pydantic import ScoreSourceCheck

__all__ = ["NATIVE_KEY", "ConformalCompressor", "bm25_relevance"]

logger = logging.getLogger(__name__)

#: the metadata key of LangChain's native score (rerankers' relevance)
NATIVE_KEY = "relevance_score"
_NATIVE_NAME = f"metadata[{NATIVE_KEY!r}]"


def bm25_relevance(retriever: Any, query: str, documents: Sequence[Document]) -> list[Document]:
    """Copies of a ``BM25Retriever``'s results with their BM25 score as ``relevance_score``.

    langchain-community's ``BM25Retriever`` ranks by its rank-bm25 ``vectorizer`` but
    returns no score; this reads the same scores from it
    (``vectorizer.get_scores(preprocess_func(query))``).

    Parameters
    ----------
    retriever : langchain_community.retrievers.BM25Retriever
        The retriever that returned ``documents``.
    query : str
        The query they were retrieved for.
    documents : sequence of Document
        ``retriever.invoke(query)``: the retriever's own Document objects; not modified.

    Raises
    ------
    ValueError
        A document that is not one of the retriever's (``retriever.docs``).
    """
    docs = check_documents(documents, Document)
    scores = retriever.vectorizer.get_scores(retriever.preprocess_func(query))
    position = {id(d): i for i, d in enumerate(retriever.docs)}
    out = []
    for j, d in enumerate(docs):
        if id(d) not in position:
            raise ValueError(f"documents[{j}] is not one of the retriever's documents; pass "
                             "what retriever.invoke(query) returned.")
        meta = {**copy.deepcopy(dict(d.metadata)), NATIVE_KEY: float(scores[position[id(d)]])}
        out.append(Document(page_content=d.page_content, metadata=meta, id=d.id))
    return out


def _read_native(doc: Document) -> tuple[Any, str, Any, dict[str, Any]]:
    return doc.id, doc.page_content, doc.metadata.get(NATIVE_KEY), dict(doc.metadata)


def _read_hit(doc: Document) -> RetrievedDoc:
    meta = dict(doc.metadata)
    return RetrievedDoc(id=doc.id, text=doc.page_content, doc_ids=document_ids([doc.id], meta),
                        score=meta.get(NATIVE_KEY), metadata=meta)


class ConformalCompressor(FrameworkAdapter, ScoreSourceCheck, BaseDocumentCompressor):
    """Keep the documents a calibrated conformal filter keeps.

    Parameters
    ----------
    filter : ConformalFilter
        A calibrated filter (e.g. ``ConformalFilter.load("filter.json")``).
    score_source : {"filter", "native"}, default="filter"
        ``"native"``: filter on ``metadata["relevance_score"]`` (LangChain's native score,
        higher is better), given to a filter calibrated on it (:meth:`calibrate_native`).
    on_result : callable, optional
        Called once per query as ``on_result(kept, removed)`` with the kept and the removed
        documents (copies carrying the same ``ragsieve_*`` keys: each one's score against the
        threshold, in the score's units) — where to log, trace or show what was removed.
        Not serialised.

    Notes
    -----
    Each document goes to the filter with its metadata (see
    :func:`ragsieve.integrations.filter_items`), so every guarantee mode works: a
    ``group``-mode filter reads ``metadata[filter.policy_.group_by]``, a filter on an outside score
    reads ``metadata[field]`` (or ``metadata["score"]``); a document without it raises
    ``DataError``.

    Returns new ``Document`` objects in input order; each carries a copy of the
    original metadata plus ``"ragsieve_score"`` and ``"ragsieve_threshold"`` (in the
    score's units), ``"ragsieve_keep_if"`` (``"<="`` or ``">="``) and ``"ragsieve_mode"``
    (the guarantee mode). ``id`` is kept. When the rule keeps nothing a WARNING log line
    says why; documents kept anyway by ``min_keep`` carry the reason as ``"ragsieve_note"``.

    Examples
    --------
    >>> comp = ConformalCompressor.from_file("filter.json")  # doctest: +SKIP
    >>> comp.compress_documents(docs, "who wrote it?")  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _empty_log: EmptyListLog = PrivateAttr(
        default_factory=lambda: EmptyListLog("ConformalCompressor"))
    native_score_name: ClassVar[str] = _NATIVE_NAME

    filter: ConformalFilter
    score_source: str = "filter"
    on_result: Callable[[list[Document], list[Document]], None] | None = Field(
        default=None, exclude=True)

    @classmethod
    def native_pairs(cls, examples: Iterable[Any], *, field: str = NATIVE_KEY) -> list[Pair]:
        """Labelled retriever output as calibration pairs holding ``relevance_score``.

        Parameters
        ----------
        examples : iterable
            ``(query, documents, relevant_ids[, topic])``: what a scoring retriever (or
            :func:`bm25_relevance`) returned and the ids (``Document.id``) of the relevant ones.
        field : str
            The name the score is calibrated under (``Pair.meta[field]``).
        """
        return native_pairs(examples, Document, _read_native, field=field)

    @classmethod
    def calibrate_native(cls, examples: Iterable[Any], *, field: str = NATIVE_KEY,
                         **filter_options: Any) -> Self:
        """A compressor on ``metadata["relevance_score"]``, calibrated on labelled examples
        (``examples`` as :meth:`native_pairs` takes them, ``field`` and the
        ``ConformalFilter`` keywords as :func:`ragsieve.integrations.calibrate_native`);
        ``comp.filter.save(path)`` writes its artifact."""
        return calibrate_native(cls, examples, field, **filter_options)

    @classmethod
    def _retrieval(cls, retriever: Any,
                   run: Callable[[str], Sequence[Document]] | None) -> Retrieval:
        """``retriever.invoke(query)`` (or ``run``), its Documents read as hits."""
        call = retrieval_run(retriever, run, "invoke", "a LangChain retriever (a BaseRetriever, "
                             "or any Runnable whose invoke(query) returns a list of Documents)")
        return Retrieval(run=call, read=_read_hit, doc_type=Document, framework="langchain",
                         name=type(retriever).__name__)

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
            group under ``filter.policy_.group_by``, an outside score, ``relevance_score`` with
            ``score_source="native"``), or gives an outside score the filter cannot read.
        """
        docs = check_documents(documents, Document)
        if not docs:
            return []
        native = ([d.metadata.get(NATIVE_KEY) for d in docs]
                  if self.score_source == "native" else None)
        out, removed, _, _ = filter_documents(
            self.filter, query, docs, DocumentFields(
                [d.page_content for d in docs], [d.metadata for d in docs], native,
                _NATIVE_NAME),
            Copies(self._copy, logger, empties=self._empty_log),
            removed=self.on_result is not None)
        if self.on_result is not None:
            self.on_result(list(out), removed)
        return out

    def _copy(self, src: Document, result: Any, scored: Any, note: str | None = None) -> Document:
        """A copy of ``src`` with the filter's keys (score, threshold, rule, mode) added."""
        meta: dict[str, Any] = copy.deepcopy(dict(src.metadata))
        meta.update(kept_metadata(self.filter, result, scored, note))
        text = pruned_text(result, scored)  # unit sentence: the kept sentences only
        return Document(page_content=src.page_content if text is None else text, metadata=meta,
                        id=src.id)

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Async :meth:`compress_documents`; scoring runs in a thread executor."""
        return await run_in_executor(None, self.compress_documents, documents, query, callbacks)
