"""Calibrate what you deploy: a framework retriever run on labelled queries.

The default (fused) score reads each document against the others of its list, so its
guarantee holds on lists like the calibration lists. Each component's
``calibrate(retriever, queries, alpha=...)`` therefore runs the retriever that will be
deployed on labelled queries (:mod:`ragsieve.data.queries`: ``relevant_doc_ids`` and/or
``answers``), labels what it returns and calibrates on those lists
(:func:`calibrate_through`); every pair records the retriever's identity
(``{"kind": "framework", "framework", "retriever", "k"}``). :func:`retrieve_pairs` gives
the same pairs without calibrating (to label them with ``ragsieve label`` first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ragsieve._validation import check_int
from ragsieve.errors import DataError
from ragsieve.types import Pair

if TYPE_CHECKING:
    from typing import TypeAlias

    from ragsieve.data.jsonl import PathOrFile
    from ragsieve.data.queries import LabelledQuery

    #: labelled queries as the components' ``calibrate`` takes them: a JSONL path or open
    #: file, or mappings / :class:`~ragsieve.data.queries.LabelledQuery` objects
    Queries: TypeAlias = PathOrFile | Iterable[Mapping[str, Any] | LabelledQuery]

__all__ = [
    "DOC_ID_KEYS", "Retrieval", "RetrievedDoc", "calibrate_through", "document_ids",
    "retrieval_run", "retrieve_pairs",
]

logger = logging.getLogger(__name__)

#: a framework component class
C = TypeVar("C")

#: The metadata keys whose values (strings or integers) are ids of a framework document's
#: source document, matched against a labelled query's ``relevant_doc_ids``.
DOC_ID_KEYS = ("doc_id", "id", "source")
# metadata keys a calibration pair cannot carry: the pair's own fields (``write_pairs``
# refuses them) and what ``list_pairs`` sets itself
_PAIR_KEYS = frozenset({"query_id", "query", "snippet_id", "text", "relevant", "group",
                        "doc_ids", "retrieval_score", "rank", "retriever"})


@dataclass(frozen=True)
class RetrievedDoc:
    """One framework document as the calibration path reads it.

    Attributes
    ----------
    id : str or None
        The document's own id (the pair's ``snippet_id``); None or ``""``: the pair gets
        ``f"{query_id}#{rank}"``.
    text : str
        What the filter scores.
    doc_ids : tuple of str
        Every id the document goes by (:func:`document_ids`), matched against the query's
        ``relevant_doc_ids``.
    score : float or None
        The retriever's score (``Pair.meta["retrieval_score"]``), None when it gives none.
    metadata : Mapping
        The document's metadata (copied to ``Pair.meta``, without the ``ragsieve_*`` keys
        and the pair's own fields).
    """

    id: str | None
    text: str
    doc_ids: tuple[str, ...]
    score: float | None
    metadata: Mapping[str, Any]


def document_ids(own: Iterable[Any], metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """The ids a framework document goes by: ``own`` (its id, its source document's id)
    and its metadata's string or integer values under :data:`DOC_ID_KEYS`, in that order,
    each once; None and empty values are left out.

    Examples
    --------
    >>> document_ids(["p1:0-80", None], {"source": "p1", "id": 7, "doc_id": ["x"]})
    ('p1:0-80', '7', 'p1')
    """
    found = [*own, *(metadata.get(key) for key in DOC_ID_KEYS)]
    ids = [str(v) for v in found
           if isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))]
    return tuple(dict.fromkeys(i for i in ids if i))


@dataclass(frozen=True)
class Retrieval:
    """A framework retriever as :func:`retrieve_pairs` runs it.

    Attributes
    ----------
    run : callable
        ``run(query) -> documents``: what the retriever returns for a query string.
    read : callable
        A framework document as a :class:`RetrievedDoc`.
    doc_type : type
        The framework's document class; a result holding anything else is a ``TypeError``.
    framework : str
        ``"langchain"``, ``"llamaindex"`` or ``"haystack"``.
    name : str
        The retriever's class name (``type(retriever).__name__``), in the identity.
    kind : str
        How the documents are named in messages (``"documents"``, ``"nodes"``).
    """

    run: Callable[[str], Any]
    read: Callable[[Any], RetrievedDoc]
    doc_type: type
    framework: str
    name: str
    kind: str = "documents"

    def identity(self, k: int) -> dict[str, Any]:
        """The retriever identity every pair carries (``Pair.meta["retriever"]``)."""
        return {"kind": "framework", "framework": self.framework, "retriever": self.name,
                "k": k}


def retrieval_run(retriever: Any, run: Any, method: str, expected: str) -> Callable[..., Any]:
    """How a component calls ``retriever``: ``run`` when given, else its ``method``.

    Raises
    ------
    TypeError
        ``run`` is given and not callable, or ``retriever`` has no callable ``method``
        (``expected`` says what was expected).
    """
    if run is not None:
        if not callable(run):
            raise TypeError(f"run is a {type(run).__name__}; expected a callable "
                            "run(query) -> list of documents.")
        return cast(Callable[..., Any], run)
    call = getattr(retriever, method, None)
    if not callable(call):
        raise TypeError(f"retriever is a {type(retriever).__name__} without a {method}() "
                        f"method; expected {expected}, or pass run=lambda query: ... "
                        "returning the retrieved documents.")
    return cast(Callable[..., Any], call)


def retrieve_pairs(retrieval: Retrieval, queries: Queries, *, k: int | None = None,
                   language: str | None = None) -> list[Pair]:
    """Run a framework retriever on labelled queries: the labelled pairs of its lists.

    Parameters
    ----------
    retrieval : Retrieval
        The retriever, as its component runs it.
    queries : path, open file, or iterable of mapping or LabelledQuery
        The labelled queries (:func:`ragsieve.data.queries.read_queries`).
    k : int, optional
        The retriever's list size, recorded in the identity; defaults to the most
        documents any query got.
    language : str, optional
        The language of the answers' normalisation (None: English).

    Returns
    -------
    list of Pair
        Every retrieved document with text of every query, in the retriever's order
        (:func:`ragsieve.data.queries.list_pairs`; those without text are left out, with a
        warning): ``snippet_id`` its id (else
        ``f"{query_id}#{rank}"``), ``relevant`` its label (None for a query without
        labels), ``meta`` its metadata, ``retrieval_score``, ``rank`` and the retriever
        identity under ``"retriever"``.

    Raises
    ------
    TypeError
        The retriever returned something other than a list of the framework's documents.
    ValueError
        ``k`` is smaller than a list the retriever returned.
    DataError
        A query the reader refuses, a document returned twice for one query, or no
        document for any query.
    """
    from ragsieve.data.queries import list_pairs, read_queries

    k = check_int(k, "k", min_value=1, allow_none=True, hint="the retriever's list size")
    labelled = read_queries(queries, language=language)
    lists = [_retrieve(retrieval, q.query_id, q.query) for q in labelled]
    textless = sum(n for _, n in lists)
    if textless:
        logger.warning("left out %d retrieved %s without text (nothing to score or label)",
                       textless, retrieval.kind)
    identity = retrieval.identity(_list_size([h for h, _ in lists], labelled, k, retrieval))
    pairs = [pair for q, (hits, _) in zip(labelled, lists, strict=True)
             for pair in list_pairs(q, hits, retriever=identity, language=language)]
    _report_lists(retrieval, labelled, pairs)
    return pairs


def _retrieve(retrieval: Retrieval, query_id: str,
              query: str) -> tuple[list[dict[str, Any]], int]:
    """One query's list as the hit mappings of ``list_pairs``, and how many documents were
    left out for having no text."""
    result = retrieval.run(query)
    qualified = f"{retrieval.doc_type.__module__}.{retrieval.doc_type.__name__}"
    where = f"the retriever ({retrieval.name}) returned"
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Iterable):
        raise TypeError(f"{where} a {type(result).__name__} for query {query_id!r}; expected "
                        f"a list of {qualified}.")
    hits, textless = [], 0
    for rank, doc in enumerate(result):
        if not isinstance(doc, retrieval.doc_type):
            raise TypeError(f"{where} a {type(doc).__name__} at position {rank} for query "
                            f"{query_id!r}; expected {qualified}.")
        got = retrieval.read(doc)
        if not got.text.strip():
            textless += 1
            continue
        meta = {key: value for key, value in got.metadata.items()
                if key not in _PAIR_KEYS and not str(key).startswith("ragsieve_")}
        score = float(got.score) if isinstance(got.score, Real) else None
        hits.append({**meta, "snippet_id": got.id or f"{query_id}#{rank}", "text": got.text,
                     "doc_ids": list(got.doc_ids), "retrieval_score": score})
    return hits, textless


def _list_size(lists: Sequence[Sequence[Any]], queries: Sequence[Any], k: int | None,
               retrieval: Retrieval) -> int:
    """The identity's ``k``: the one given (no list may be longer) or the longest list."""
    sizes = [len(hits) for hits in lists]
    longest = max(sizes)
    if longest == 0:
        raise DataError(f"the retriever ({retrieval.name}) returned no {retrieval.kind} with "
                        f"text for any of the {len(sizes)} queries; nothing to calibrate on.")
    if k is not None and longest > k:
        first = queries[sizes.index(longest)].query_id
        raise ValueError(f"k == {k}, but the retriever ({retrieval.name}) returned {longest} "
                         f"{retrieval.kind} for query {first!r}; give the k it is deployed "
                         "with (or leave k=None: the longest list).")
    return longest if k is None else k


def _report_lists(retrieval: Retrieval, queries: Sequence[Any], pairs: Sequence[Pair]) -> None:
    """Warn about the queries whose lists carry no evidence: empty, or with no relevant pair."""
    got = {p.query_id for p in pairs}
    found = {p.query_id for p in pairs if p.relevant == 1}
    empty = [q.query_id for q in queries if q.query_id not in got]
    if empty:
        logger.warning("the retriever (%s) returned no %s with text for %d of %d queries "
                       "(first: %r); they add no pairs", retrieval.name, retrieval.kind,
                       len(empty), len(queries), empty[0])
    missed = [q.query_id for q in queries
              if q.labelled and q.query_id in got and q.query_id not in found]
    if missed:
        logger.warning("%d of %d queries have no relevant %s in their retrieved list (first: "
                       "%r); they carry no evidence for the threshold", len(missed),
                       len(queries), retrieval.kind.removesuffix("s"), missed[0])


def calibrate_through(component: Callable[..., C], retrieval: Retrieval, queries: Queries, *,
                      k: int | None = None, language: str | None = None,
                      scorer: Any = "auto", **filter_options: Any) -> C:
    """A component calibrated on what the deployed retriever returns for labelled queries.

    Parameters
    ----------
    component : type
        The component class; it takes ``filter=`` (and has ``retrieve_pairs``).
    retrieval : Retrieval
        The retriever, as the component runs it.
    queries : path, open file, or iterable of mapping or LabelledQuery
        Labelled queries (:func:`ragsieve.data.queries.read_queries`); every one needs
        ``relevant_doc_ids`` or ``answers``.
    k, language
        As :func:`retrieve_pairs` takes them (``language`` also goes to
        :meth:`ragsieve.ConformalFilter.calibrate`).
    scorer : Scorer or str, default="auto"
        The filter's score (``"auto"``: the fused score over whole lists, chosen at
        calibration).
    **filter_options
        ``ConformalFilter`` keywords: ``alpha``, ``calibrator`` (a mode name),
        ``min_keep``, ``group_by``, ``max_chars``, ``unit``.

    Returns
    -------
    component
        With an in-memory filter calibrated on the retriever's lists (every pair carries
        the retriever identity); ``.filter.save(path)`` writes its artifact.

    Raises
    ------
    DataError
        A query without labels (the message says how to label the pairs instead), or the
        errors of :func:`retrieve_pairs`.
    CalibrationError
        No retrieved document is relevant.
    """
    from ragsieve.data.queries import read_queries
    from ragsieve.filter import ConformalFilter

    flt = ConformalFilter(scorer, **filter_options)  # bad options fail before any retrieval
    labelled = read_queries(queries)
    unlabelled = [q.query_id for q in labelled if not q.labelled]
    if unlabelled:
        name = getattr(component, "__name__", "Component")
        raise DataError(
            f"{len(unlabelled)} of {len(labelled)} queries carry neither relevant_doc_ids nor "
            f"answers (first: query_id {unlabelled[0]!r}); {name}.calibrate labels the "
            "retrieved documents with them, so every query needs one. To label with an LLM "
            f"instead: pairs = {name}.retrieve_pairs(retriever, queries); "
            "ragsieve.data.write_pairs(pairs, 'pairs.jsonl'); ragsieve label --data "
            "pairs.jsonl --out labelled.jsonl; ragsieve calibrate --data labelled.jsonl.")
    pairs = retrieve_pairs(retrieval, labelled, k=k, language=language)
    return component(filter=flt.calibrate(pairs, progress=False, language=language))
