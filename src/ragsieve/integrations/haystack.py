"""Haystack ranker backed by a calibrated :class:`~ragsieve.ConformalFilter`.

Put it after a retriever in a ``haystack.Pipeline``::

    pipe.add_component("ranker", ConformalRanker.from_file("filter.json"))
    pipe.connect("retriever.documents", "ranker.documents")

or call ``ConformalRanker.run(query=..., documents=...)`` directly.
:meth:`ConformalRanker.calibrate` calibrates through the retriever you deploy
(``retriever.run(query=...)`` on labelled queries, or any ``run=`` callable). Requires
``pip install 'ragsieve[haystack]'`` (haystack-ai 2.10 or later; tested with 3.x).

Haystack sends anonymous usage data unless ``HAYSTACK_TELEMETRY_ENABLED=False`` is set
before ``haystack`` is imported; ragsieve does not change that setting for you.
"""

# No ``from __future__ import annotations`` here: Haystack 2.x reads the ``run``
# annotations as real types to build the component's input sockets.

import asyncio
import copy
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from ragsieve._optional import require
from ragsieve._validation import check_instance, check_path, check_str
from ragsieve.filter import ConformalFilter
from ragsieve.integrations import (
    Retrieval,
    RetrievedDoc,
    calibrate_native,
    calibrate_through,
    check_score_source,
    document_ids,
    filter_documents,
    kept_metadata,
    load_filter,
    native_pairs,
    pruned_text,
    retrieval_run,
    retrieve_pairs,
    split_options,
)
from ragsieve.types import FilterResult, Pair

if TYPE_CHECKING:
    from ragsieve.integrations import Queries
    from ragsieve.scoring import Scorer

require("haystack", "haystack")
from haystack import Document, component, default_from_dict, default_to_dict
from haystack.core.errors import SerializationError

__all__ = ["NATIVE_FIELD", "ORIGINAL_SCORE_KEY", "ConformalRanker"]

logger = logging.getLogger(__name__)

#: the ``Document.score`` a document had before the ranker (e.g. the retriever's BM25 score)
ORIGINAL_SCORE_KEY = "ragsieve_original_score"
#: the field name a native-score filter is calibrated under by default
NATIVE_FIELD = "score"
_NATIVE_NAME = "Document.score"


def _read_native(d: Document) -> tuple[Any, str, Any, dict[str, Any]]:
    return d.id, d.content or "", d.score, dict(d.meta)


def _read_hit(d: Document) -> RetrievedDoc:
    meta = dict(d.meta)
    return RetrievedDoc(id=d.id, text=d.content or "", doc_ids=document_ids([d.id], meta),
                        score=d.score, metadata=meta)


_EXPECTED = "a Haystack retriever component (run(query=...) returns {'documents': [...]})"


def _run_documents(retriever: Any) -> Callable[[str], Any]:
    """``retriever.run(query=q)["documents"]``, with errors that say to pass ``run=``."""
    call = retrieval_run(retriever, None, "run", _EXPECTED)
    name = type(retriever).__name__
    hint = ("; a retriever that needs more than the query text (an embedding retriever "
            "needs query_embedding) is called through run=, e.g. run=lambda q: "
            "retriever.run(query_embedding=embed(q))['documents']")

    def run(query: str) -> Any:
        try:
            out = call(query=query)
        except TypeError as exc:
            raise TypeError(f"{name}.run(query=...) failed ({exc}){hint}.") from exc
        if not isinstance(out, Mapping) or "documents" not in out:
            raise TypeError(f"{name}.run(query=...) returned a {type(out).__name__} without "
                            f"'documents'; expected {{'documents': [haystack.Document, ...]}}"
                            f"{hint}.")
        return out["documents"]

    return run


def _retrieval(retriever: Any, run: Callable[[str], Sequence[Document]] | None) -> Retrieval:
    call = (_run_documents(retriever) if run is None
            else retrieval_run(retriever, run, "run", _EXPECTED))
    return Retrieval(run=call, read=_read_hit, doc_type=Document, framework="haystack",
                     name=type(retriever).__name__)


@component
class ConformalRanker:
    """Keep the documents a calibrated conformal filter keeps (a Haystack component).

    Parameters
    ----------
    path : str or path-like, optional
        JSON artifact written by ``ConformalFilter.save`` (or ``ragsieve calibrate``).
        Loaded at once, so a missing or malformed file fails here, not at the first query.
    filter : ConformalFilter, optional
        A calibrated filter, instead of ``path``. A ranker built this way runs but cannot
        be serialised with its pipeline: save the filter and use :meth:`from_file`.
    scorer_options : mapping, optional
        With ``path``: keyword arguments for rebuilding the scorer that do not change its
        scores (e.g. ``{"cache_dir": "emb-cache"}``); see ``ConformalFilter.load``.
    min_keep, max_chars : int, optional
        With ``path``: replace the artifact's empty-result policy (keep at least
        ``min_keep`` best documents) and long-document window (see ``ConformalFilter``).
    score_source : {"filter", "native"}, default="filter"
        ``"native"``: filter on ``Document.score`` (the retriever's score, e.g. BM25; higher
        is better), given to a filter calibrated on it (:meth:`calibrate_native`).

    Notes
    -----
    **What comes out.** ``run`` returns new ``Document`` objects (``dataclasses.replace``
    with a deep copy of ``meta``; the caller's documents are never mutated) for the kept
    documents, in input order -- like ragsieve's LangChain and LlamaIndex components, and
    unlike Haystack's reranking rankers it does not sort (the retriever's order is kept) and
    has no ``top_k`` (cutting the kept set would break the guarantee). ``id`` and ``content``
    are kept.

    **Scores.** For a score kept when low (``keep s <= tau``), ``Document.score`` becomes
    ``1 - s``, so that higher is better as Haystack's rankers and retrievers report it: the
    cosine similarity for the embedding score (``s = 1 - cos``), the LLM's relevance for
    the LLM score (``s = 1 - r``); for other such scores a monotone rescaling without a
    unit. For a higher-is-better outside score (``keep bm25 >= t``, and
    ``score_source="native"``) ``Document.score`` is that score itself. ``meta`` also gets
    ``"ragsieve_score"`` and ``"ragsieve_threshold"`` (in the keep rule's units),
    ``"ragsieve_keep_if"`` (``"<="`` or ``">="``), ``"ragsieve_mode"`` (the guarantee mode),
    ``"ragsieve_original_score"`` (the score the document arrived with, e.g. the
    retriever's BM25 score, or None) and, for a document longer than the filter's window
    (cut into pieces), ``"ragsieve_spans"`` (the kept character spans).

    **Outputs.** ``documents`` (kept), ``removed`` (the others, as new Documents with the
    same score keys) and ``ragsieve``: ``{"kept", "removed", "dropped"`` (documents without
    text), ``"score", "keep_if", "threshold"`` (the rule, in the score's units),
    ``"mode", "reason"}``; ``reason`` is None unless the rule kept nothing, when it says why
    (every score below the threshold, the best score) and a WARNING log line says the same.

    **Every mode.** Each document goes to the filter as its ``meta`` plus its text (see
    :func:`ragsieve.integrations.filter_items`): a ``group``-mode filter reads
    ``meta[filter.group_by]``, a filter on an outside score reads ``meta[field]``; a
    document without it raises ``DataError``.

    **Documents without text.** When the filter's score reads text (every score except an
    outside score from ``meta``), a document whose ``content`` is None, empty or only
    whitespace (an image or a table held in ``blob``, say) cannot be scored: it is dropped
    (never passed on as evidence) and a WARNING log line gives how many and their ids. A
    filter on an outside score scores such documents from ``meta`` like any other.

    **Serialisation.** :meth:`to_dict` stores the artifact path (as given) and the scorer
    options, so the pipeline file points at the artifact and loads whatever that file holds
    when the pipeline is loaded. Haystack 3 only deserialises classes from modules on its
    allowlist: ``Pipeline.loads(text, allowed_modules=["ragsieve.integrations.haystack"])``.

    Examples
    --------
    >>> ranker = ConformalRanker.from_file("filter.json")  # doctest: +SKIP
    >>> ranker.run(query="who wrote it?", documents=docs)["documents"]  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        filter: ConformalFilter | None = None,
        scorer_options: Mapping[str, Any] | None = None,
        min_keep: int | None = None,
        max_chars: int | None = None,
        score_source: str = "filter",
    ) -> None:
        if (path is None) == (filter is None):
            raise ValueError(
                "ConformalRanker needs exactly one of path (a filter artifact) or filter "
                f"(a ConformalFilter); got {'both' if path is not None else 'neither'}."
            )
        check_instance(scorer_options, Mapping, "scorer_options",
                       expected="a mapping of keyword arguments", allow_none=True)
        if filter is not None:
            check_instance(filter, ConformalFilter, "filter",
                           expected="a ragsieve.ConformalFilter (or pass path=...)")
            if scorer_options:
                raise ValueError("scorer_options apply when loading from path; a ready "
                                 "filter already has its scorer.")
            if min_keep is not None or max_chars is not None:
                raise ValueError("min_keep and max_chars apply when loading from path; set "
                                 "them on the ConformalFilter itself.")
            self.path: str | None = None
            self.filter = filter
        else:
            path = check_path(path, "path", hint="a filter artifact written by ConformalFilter.save")
            self.path = os.fspath(path)
            self.filter = load_filter(path, dict(scorer_options or {}), self._policy(
                min_keep, max_chars))
        self.scorer_options: dict[str, Any] = dict(scorer_options or {})
        self.min_keep, self.max_chars = min_keep, max_chars
        self.score_source = check_score_source(self.filter, score_source, _NATIVE_NAME)

    @staticmethod
    def _policy(min_keep: int | None, max_chars: int | None) -> dict[str, int]:
        return {k: v for k, v in (("min_keep", min_keep), ("max_chars", max_chars))
                if v is not None}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> Self:
        """Load a saved filter artifact.

        Parameters
        ----------
        path : path-like
            JSON artifact written by ``ConformalFilter.save``.
        **options
            ``score_source="native"`` filters on ``Document.score``; policy keywords
            (``min_keep=1``, ``max_chars=...``) set the filter's policy; the others rebuild
            the scorer without changing its scores (``cache_dir=...``; see
            ``ConformalFilter.load(scorer_options=...)``).

        Raises
        ------
        TypeError
            An unknown keyword (the message lists the accepted ones).
        ArtifactError
            The file cannot be read or is not a valid filter artifact (the message names it).
        """
        score_source = options.pop("score_source", "filter")
        scorer_options, policy = split_options(options)
        return cls(path, scorer_options=scorer_options, score_source=score_source, **policy)

    @classmethod
    def native_pairs(cls, examples: Iterable[Any], *, field: str = NATIVE_FIELD) -> list[Pair]:
        """Labelled retriever output as calibration pairs holding ``Document.score``.

        Parameters
        ----------
        examples : iterable
            ``(query, documents, relevant_ids[, topic])``: what a retriever returned for a
            query and the ids (``Document.id``) of the relevant ones.
        field : str
            The name the score is calibrated under (``Pair.meta[field]``).

        Examples
        --------
        >>> from ragsieve.data import write_pairs  # doctest: +SKIP
        >>> write_pairs(ConformalRanker.native_pairs(examples), "pairs.jsonl")  # doctest: +SKIP

        then ``ragsieve calibrate --data pairs.jsonl --scorer field --score-field score
        --higher-is-better --out filter.json`` and
        ``ConformalRanker.from_file("filter.json", score_source="native")``.
        """
        return native_pairs(examples, Document, _read_native, field=field)

    @classmethod
    def calibrate_native(cls, examples: Iterable[Any], *, field: str = NATIVE_FIELD,
                         **filter_options: Any) -> Self:
        """A ranker on ``Document.score``, calibrated on labelled retriever output
        (``examples`` as :meth:`native_pairs` takes them, ``field`` and the
        ``ConformalFilter`` keywords as :func:`ragsieve.integrations.calibrate_native`).

        The filter is in memory: save it (``ranker.filter.save(path)``) and use
        ``from_file(path, score_source="native")`` for a pipeline that serialises.
        """
        return calibrate_native(cls, examples, field, **filter_options)

    @classmethod
    def calibrate(
        cls, retriever: Any, queries: "Queries", *, k: int | None = None,
        language: str | None = None, scorer: "Scorer | str" = "auto",
        run: Callable[[str], Sequence[Document]] | None = None, **filter_options: Any,
    ) -> Self:
        """A ranker calibrated on what ``retriever`` returns for labelled queries.

        The default score reads each document against the others of its list, so the
        guarantee holds on lists like the calibration lists: calibrate through the retriever
        you deploy, with its ``top_k``, over its document store.

        Parameters
        ----------
        retriever : component or Pipeline
            The deployed retriever. Without ``run`` it is run as
            ``retriever.run(query=query)["documents"]`` (``InMemoryBM25Retriever`` and the
            other text-query retrievers). Its class name and ``k`` are recorded on every
            calibration pair (``meta["retriever"]``); ``Document.score`` is kept as
            ``meta["retrieval_score"]``.
        queries : path, open file, or iterable of mapping or LabelledQuery
            Labelled queries (:func:`ragsieve.data.queries.read_queries`): ``query_id``,
            ``query``, optional ``group`` (the topic), and ``relevant_doc_ids`` and/or
            ``answers`` on every query. A retrieved document is relevant when one of its ids
            is in ``relevant_doc_ids`` and/or its text contains an answer
            (:meth:`~ragsieve.data.queries.LabelledQuery.label`). Its ids are ``Document.id``
            and the string or integer values of ``meta["doc_id"]``, ``meta["id"]`` and
            ``meta["source"]`` (those present).
        k : int, optional
            The retriever's list size (its ``top_k``), recorded with it; defaults to the most
            documents any query got (a list longer than ``k`` is a ``ValueError``).
        language : str, optional
            The texts' language: the answers' normalisation (None: English) and the model
            of an ``"auto"`` score (None: detected).
        scorer : Scorer or str, default="auto"
            The filter's score (``"auto"``: the fused score over whole lists).
        run : callable, optional
            ``run(query) -> list of Document``: how to get the deployed lists when the
            retriever needs more than the query text, so any pipeline can be the retriever.
            An embedding retriever needs the query embedded by the same embedder as in
            production: ``run=lambda q: retriever.run(query_embedding=embedder.run(text=q)
            ["embedding"])["documents"]``, or a whole pipeline:
            ``run=lambda q: pipe.run({"embedder": {"text": q}})["retriever"]["documents"]``.
            ``retriever`` then only names the lists.
        **filter_options
            ``ConformalFilter`` keywords: ``alpha``, ``calibrator`` (a mode name),
            ``min_keep``, ``group_by``, ``max_chars``, ``unit``.

        Returns
        -------
        ConformalRanker
            With an in-memory calibrated filter; save it (``ranker.filter.save(path)``) and
            use ``from_file(path)`` for a pipeline that serialises.

        Raises
        ------
        DataError
            A query with neither ``relevant_doc_ids`` nor ``answers`` (label the pairs of
            :meth:`retrieve_pairs` with ``ragsieve label`` instead), a malformed query, or
            a document returned twice for one query.
        CalibrationError
            No retrieved document is relevant.
        TypeError
            ``retriever.run(query=...)`` cannot be called or returns no ``documents``
            (pass ``run``), or the documents are not ``haystack.Document``.

        Examples
        --------
        >>> ranker = ConformalRanker.calibrate(retriever, "queries.jsonl")  # doctest: +SKIP
        >>> ranker.filter.save("filter.json")  # doctest: +SKIP
        """
        return calibrate_through(cls, _retrieval(retriever, run), queries, k=k,
                                 language=language, scorer=scorer, **filter_options)

    @classmethod
    def retrieve_pairs(
        cls, retriever: Any, queries: "Queries", *, k: int | None = None,
        language: str | None = None, run: Callable[[str], Sequence[Document]] | None = None,
    ) -> list[Pair]:
        """What :meth:`calibrate` calibrates on, without calibrating: the retriever's lists
        for the queries as pairs (:func:`ragsieve.integrations.retrieve_pairs`), labelled
        from the queries' labels (``relevant`` None for a query without labels). Write
        them with :func:`ragsieve.data.write_pairs` to label them with ``ragsieve label``
        and calibrate with ``ragsieve calibrate``. Parameters as :meth:`calibrate`."""
        return retrieve_pairs(_retrieval(retriever, run), queries, k=k, language=language)

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """Serialise as the artifact path and the scorer options (path-likes as str).

        Raises
        ------
        SerializationError
            The ranker was built from an in-memory filter (no path to store).
        """
        if self.path is None:
            raise SerializationError(
                "ConformalRanker built from an in-memory filter cannot be serialised: save it "
                "(filter.save('filter.json')) and use ConformalRanker.from_file('filter.json')."
            )
        options = {k: os.fspath(v) if isinstance(v, os.PathLike) else v
                   for k, v in self.scorer_options.items()}
        source = {"score_source": self.score_source} if self.score_source != "filter" else {}
        return default_to_dict(self, path=self.path, scorer_options=options,
                               **self._policy(self.min_keep, self.max_chars), **source)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild from :meth:`to_dict` output (loads the artifact at the stored path)."""
        return default_from_dict(cls, data)

    # ------------------------------------------------------------------------ run
    def warm_up(self) -> None:
        """Load the score's model before the first query (Haystack calls this on run)."""
        if self.filter.scorer.reads_text:
            self.filter.scorer.score_batch("warm-up", ["warm-up"])

    @component.output_types(documents=list[Document], removed=list[Document],
                            ragsieve=dict[str, Any])
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """Keep the documents the calibrated filter keeps, as new Documents in input order.

        Parameters
        ----------
        query : str
            The query the documents were retrieved for.
        documents : list of Document
            Retrieved documents; not modified.

        Returns
        -------
        dict
            ``{"documents": [...], "removed": [...], "ragsieve": {...}}``: copies of the
            kept and of the removed documents with their scores, and what was decided
            (see the class notes).

        Raises
        ------
        TypeError
            ``query`` is not a str, or ``documents`` is not a list of ``haystack.Document``.
        DataError
            A document lacks what the filter's mode or score needs in its ``meta`` (the
            group under ``filter.group_by``, an outside score; ``Document.score`` with
            ``score_source="native"``), or gives an outside score the filter cannot read.
        """
        check_str(query, "query")
        check_instance(documents, (list, tuple), "documents",
                       expected="a list of haystack.Document")
        for i, d in enumerate(documents):
            check_instance(d, Document, f"documents[{i}]", expected="a haystack.Document")
        docs = self._with_text(list(documents))
        dropped = len(documents) - len(docs)
        if not docs:
            return self._outputs([], [], None, dropped)
        native = [d.score for d in docs] if self.score_source == "native" else None
        kept, removed, result, reason = filter_documents(
            self.filter, query, docs, texts=[d.content or "" for d in docs],
            metadatas=[d.meta for d in docs], native=native, native_name=_NATIVE_NAME,
            copy=self._copy, log=logger)
        return self._outputs(kept, removed, result, dropped, reason)

    def _with_text(self, docs: list[Document]) -> list[Document]:
        """The documents the score can read: all, or those with text when it reads text."""
        if not self.filter.scorer.reads_text:
            return docs
        textless = [d for d in docs if not (d.content or "").strip()]
        if textless:
            logger.warning(
                "dropped %d of %d documents without text content (the %s score reads text): "
                "ids %s", len(textless), len(docs), self.filter.scorer.spec().get("scorer"),
                [d.id for d in textless[:10]] + (["..."] if len(textless) > 10 else []))
        return [d for d in docs if (d.content or "").strip()]

    def _copy(self, src: Document, result: FilterResult, scored: Any,
              reason: str | None = None) -> Document:
        """A new Document with the score keys in ``meta`` and the higher-is-better score."""
        meta: dict[str, Any] = copy.deepcopy(src.meta)
        meta.update(kept_metadata(self.filter, result, scored, reason))
        meta[ORIGINAL_SCORE_KEY] = src.score
        higher = meta["ragsieve_score"] if meta["ragsieve_keep_if"] == ">=" \
            else 1.0 - float(scored.score)
        text = pruned_text(result, scored)  # unit sentence: the kept sentences only
        if text is None:
            return dataclasses.replace(src, meta=meta, score=higher)
        return dataclasses.replace(src, content=text, meta=meta, score=higher)

    def _outputs(self, kept: list[Document], removed: list[Document],
                 result: FilterResult | None, dropped: int,
                 reason: str | None = None) -> dict[str, Any]:
        rule = self.filter.scorer.keep_rule(
            result.threshold if result is not None else self.filter.threshold)
        info = {"kept": len(kept), "removed": len(removed), "dropped": dropped,
                **rule.to_dict(), "mode": self.filter.mode, "reason": reason}
        return {"documents": kept, "removed": removed, "ragsieve": info}

    @component.output_types(documents=list[Document], removed=list[Document],
                            ragsieve=dict[str, Any])
    async def run_async(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """Async :meth:`run` (for ``AsyncPipeline``); scoring runs in a worker thread."""
        return await asyncio.to_thread(self.run, query, documents)

    def __repr__(self) -> str:
        source = repr(self.path) if self.path is not None else "in-memory filter"
        return f"ConformalRanker({source}, {self.filter!r})"
