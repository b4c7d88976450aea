"""The base of the framework components: what LangChain's compressor, LlamaIndex's
postprocessor and Haystack's ranker do the same way.

:class:`FrameworkAdapter` gives each component ``from_file``, ``calibrate`` and
``retrieve_pairs``; a component says how its framework runs a retriever (its
``_retrieval``) and, when it is not built from a loaded filter as ``cls(filter=...)``, how
it is built from a file (its ``_from_file``). It is a plain class with no fields, so it
mixes into a pydantic model (LangChain, LlamaIndex) and into a Haystack component alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from ragsieve.integrations.empty_lists import EmptyListLog, EmptyListStats
from ragsieve.integrations.loading import load_filter, split_options
from ragsieve.integrations.retrieval import Retrieval, calibrate_through, retrieve_pairs

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter
    from ragsieve.integrations.retrieval import Queries
    from ragsieve.scoring import Scorer
    from ragsieve.types import Pair

__all__ = ["FrameworkAdapter"]


class FrameworkAdapter:
    """Loading from a file and calibrating through the deployed retriever, for a framework
    component with a ``filter`` and a ``score_source``.

    A component implements ``_retrieval(retriever, run)``: the :class:`Retrieval` that runs
    its framework's retriever (or ``run``) and reads what it returns, and holds an
    :class:`~ragsieve.integrations.EmptyListLog` as ``_empty_log`` (the lists its rule
    emptied, :attr:`empty_stats`).
    """

    if TYPE_CHECKING:  # set by each component (a pydantic private attribute or in __init__)
        _empty_log: EmptyListLog

    @property
    def empty_stats(self) -> EmptyListStats:
        """The lists this component filtered and those of which its rule kept nothing."""
        return self._empty_log.stats

    @classmethod
    def _retrieval(cls, retriever: Any, run: Callable[[str], Sequence[Any]] | None) -> Retrieval:
        """How the component's framework runs ``retriever`` (or ``run``) and reads a hit."""
        raise NotImplementedError(f"{cls.__name__} does not say how to run a retriever.")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> Self:
        """Load a saved filter artifact.

        Parameters
        ----------
        path : path-like
            JSON artifact written by ``ConformalFilter.save``.
        **options
            ``score_source="native"`` filters on the framework's own score (see the
            component); policy keywords (``min_keep=1``, ``max_chars=...``) set the filter's
            policy; the others rebuild the scorer without changing its scores
            (``cache_dir=...``; see ``ConformalFilter.load(scorer_options=...)``).

        Raises
        ------
        TypeError
            An unknown keyword (the message lists the accepted ones).
        ArtifactError
            The file cannot be read or is not a valid filter artifact (the message names it).
        """
        score_source = options.pop("score_source", "filter")
        scorer_options, policy = split_options(options)
        return cls._from_file(path, scorer_options, policy, score_source)

    @classmethod
    def _from_file(cls, path: str | os.PathLike[str], scorer_options: dict[str, Any],
                   policy: dict[str, Any], score_source: str) -> Self:
        """The component around the filter loaded from ``path``."""
        return cls._from_loaded(load_filter(path, scorer_options, policy), scorer_options,
                                score_source)

    @classmethod
    def _from_loaded(cls, flt: ConformalFilter, scorer_options: dict[str, Any],
                     score_source: str = "filter") -> Self:
        """The component around a loaded filter (``scorer_options`` as given to it)."""
        return cls(filter=flt, score_source=score_source)  # type: ignore[call-arg]

    @classmethod
    def calibrate(
        cls, retriever: Any, queries: Queries, *, k: int | None = None,
        language: str | None = None, scorer: Scorer | str = "auto",
        run: Callable[[str], Sequence[Any]] | None = None, **filter_options: Any,
    ) -> Self:
        """A component calibrated on what ``retriever`` returns for labelled queries.

        The default score reads each document against the others of its list, so the
        guarantee holds on lists like the calibration lists: calibrate through the retriever
        you deploy, with its ``k``, over its corpus.

        Parameters
        ----------
        retriever : the framework's retriever
            The deployed retriever, run for every query as its framework runs it: LangChain
            ``retriever.invoke(query)`` (a ``BaseRetriever``, or any ``Runnable`` returning
            a list of ``Document``), LlamaIndex ``retriever.retrieve(query)`` (any
            ``BaseRetriever``), Haystack ``retriever.run(query=query)["documents"]`` (the
            text-query retrievers). Its class name and ``k`` are recorded on every
            calibration pair (``meta["retriever"]``); a native score (``NodeWithScore.score``,
            Haystack's ``Document.score``) is kept as ``meta["retrieval_score"]``.
        queries : path, open file, or iterable of mapping or LabelledQuery
            Labelled queries (:func:`ragsieve.data.queries.read_queries`): ``query_id``,
            ``query``, optional ``group`` (the topic), and ``relevant_doc_ids`` and/or
            ``answers`` on every query. A retrieved document is relevant when one of its ids
            is in ``relevant_doc_ids`` and/or its text contains an answer
            (:meth:`~ragsieve.data.queries.LabelledQuery.label`). Its ids are the
            framework's own id (``Document.id``; ``node.node_id`` and ``node.ref_doc_id``
            for a LlamaIndex node) and the string or integer values of the metadata's
            ``"doc_id"``, ``"id"`` and ``"source"`` (those present).
        k : int, optional
            The retriever's list size (``k``, ``similarity_top_k``, ``top_k``), recorded
            with it; defaults to the most documents any query got (a list longer than ``k``
            is a ``ValueError``).
        language : str, optional
            The texts' language: the answers' normalisation (None: English) and the model
            of an ``"auto"`` score (None: detected).
        scorer : Scorer or str, default="auto"
            The filter's score (``"auto"``: the fused score over whole lists).
        run : callable, optional
            ``run(query) -> list of documents`` (the framework's type), called instead of
            the retriever: a chain, a pipeline, or a retriever that needs more than the
            query text. A Haystack embedding retriever needs the query embedded by the same
            embedder as in production: ``run=lambda q: retriever.run(query_embedding=
            embedder.run(text=q)["embedding"])["documents"]``, or a whole pipeline:
            ``run=lambda q: pipe.run({"embedder": {"text": q}})["retriever"]["documents"]``.
            ``retriever`` then only names the lists.
        **filter_options
            ``ConformalFilter`` keywords: ``alpha``, ``calibrator`` (a mode name),
            ``min_keep``, ``group_by``, ``max_chars``, ``unit``.

        Returns
        -------
        component
            With an in-memory calibrated filter; ``component.filter.save(path)`` writes its
            artifact (``from_file(path)`` loads it, also for a pipeline that serialises).

        Raises
        ------
        DataError
            A query with neither ``relevant_doc_ids`` nor ``answers`` (label the pairs of
            :meth:`retrieve_pairs` with ``ragsieve label`` instead), a malformed query, or
            a document returned twice for one query.
        CalibrationError
            No retrieved document is relevant.
        TypeError
            The retriever cannot be run as its framework runs it (pass ``run``), or it
            returned something other than a list of the framework's documents.

        Examples
        --------
        >>> comp = ConformalCompressor.calibrate(retriever, "queries.jsonl")  # doctest: +SKIP
        >>> comp.filter.save("filter.json")  # doctest: +SKIP
        """
        return calibrate_through(cls, cls._retrieval(retriever, run), queries, k=k,
                                 language=language, scorer=scorer, **filter_options)

    @classmethod
    def retrieve_pairs(
        cls, retriever: Any, queries: Queries, *, k: int | None = None,
        language: str | None = None, run: Callable[[str], Sequence[Any]] | None = None,
    ) -> list[Pair]:
        """What :meth:`calibrate` calibrates on, without calibrating: the retriever's lists
        for the queries as pairs (:func:`ragsieve.integrations.retrieve_pairs`), labelled
        from the queries' labels (``relevant`` None for a query without labels). Write
        them with :func:`ragsieve.data.write_pairs` to label them with ``ragsieve label``
        and calibrate with ``ragsieve calibrate``. Parameters as :meth:`calibrate`."""
        return retrieve_pairs(cls._retrieval(retriever, run), queries, k=k, language=language)
