"""Drop-in components for RAG frameworks.

Each submodule imports its framework lazily, so this package imports without them:

- :mod:`ragsieve.integrations.langchain` -- ``ConformalCompressor``, a LangChain
  ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).
- :mod:`ragsieve.integrations.llamaindex` -- ``ConformalPostprocessor``, a LlamaIndex
  ``BaseNodePostprocessor`` (``pip install 'ragsieve[llamaindex]'``).
- :mod:`ragsieve.integrations.haystack` -- ``ConformalRanker``, a Haystack component
  (``pip install 'ragsieve[haystack]'``); it also sets a higher-is-better ``Document.score``
  and returns the removed documents and what was decided beside the kept ones.

All keep exactly the snippets that :meth:`ragsieve.ConformalFilter.filter` keeps, in
their original order, as new objects (the caller's inputs are never mutated), and
record the nonconformity score, the threshold and the guarantee mode in the metadata
under ``"ragsieve_score"``, ``"ragsieve_threshold"`` and ``"ragsieve_mode"``.

Every guarantee mode works: each document reaches the filter as its metadata plus its
text (:func:`filter_items`), so a ``group``-mode filter finds the group under its
``group_by`` key (e.g. ``metadata["language"]``) and a filter calibrated on an outside
score (``FieldScorer(field="rerank")``) finds it under that field. A document lacking
what the mode needs raises the filter's ``DataError``.

``from_file(path, **options)`` splits its keywords: the policy keywords (``min_keep``,
``max_chars``: :data:`POLICY_KEYS`) set the loaded filter's policy, the others rebuild the
artifact's scorer (``cache_dir``); an unknown keyword is a ``TypeError`` listing both kinds
(:func:`load_filter`). One document (or a string) where a list goes is a ``TypeError``.

**Scores in the score's own units.** ``"ragsieve_score"`` and ``"ragsieve_threshold"`` are
in the units of the keep rule (:meth:`ragsieve.scoring.Scorer.keep_rule`) and
``"ragsieve_keep_if"`` gives its direction: ``<=`` for ragsieve's own scores (``1 - cos``),
``>=`` for a higher-is-better outside score such as BM25 (never negated). An outside score
is read under the filter's field name (``metadata["bm25"]``) or as ``metadata["score"]``;
both with different values, or a ``score`` given to a filter that reads none, is a
``DataError`` (:func:`ragsieve.scoring.field.outside_score_conflict`, the rules of the
HTTP service).

**Native scores.** ``score_source="native"`` filters on the framework's own score
(Haystack ``Document.score``, LlamaIndex ``NodeWithScore.score``, LangChain
``metadata["relevance_score"]``), handed to a filter calibrated on it under its field name:
each component's ``calibrate_native(examples)`` fits one from labelled retriever output
(:func:`native_pairs`).

**Calibrate what you deploy.** The default (fused) score reads each document against the
others of its list, so its guarantee holds on lists like the calibration lists. Each
component's ``calibrate(retriever, queries, alpha=...)`` therefore runs the retriever that
will be deployed on labelled queries (:mod:`ragsieve.data.queries`: ``relevant_doc_ids``
and/or ``answers``), labels what it returns and calibrates on those lists
(:func:`calibrate_through`); every pair records the retriever's identity
(``{"kind": "framework", "framework", "retriever", "k"}``). ``retrieve_pairs`` gives the
same pairs without calibrating (to label them with ``ragsieve label`` first).

**Sentence-level pruning.** With a filter of unit ``"sentence"``
(``ConformalFilter(unit="sentence")``, ``ragsieve calibrate --unit sentence``) every
component returns *pruned* documents, as context pruners do: each kept document's text is
replaced by its kept sentences joined with ``" "`` (:func:`pruned_text`), the kept
sentences' character spans in the original text are under ``"ragsieve_spans"`` and the
original text's length under ``"ragsieve_original_length"``; a document none of whose
sentences is kept is removed.

**Empty results.** When the rule keeps nothing (or ``min_keep`` keeps the best anyway), the
component's first such list gets a WARNING log line with the reason in the score's units
(:func:`empty_reason`) and the fix; the next ones are counted, not repeated
(:class:`EmptyListLog`): a DEBUG line each and one WARNING summary line at the 10th, 100th,
1000th, ... emptied list, the count in the component's ``empty_stats``. Documents kept by
``min_keep`` carry the reason under ``"ragsieve_note"``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
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
    from ragsieve.filter import ConformalFilter
    from ragsieve.types import FilterResult, Scored

    #: labelled queries as the components' ``calibrate`` takes them: a JSONL path or open
    #: file, or mappings / :class:`~ragsieve.data.queries.LabelledQuery` objects
    Queries: TypeAlias = PathOrFile | Iterable[Mapping[str, Any] | LabelledQuery]

__all__ = [
    "DOC_ID_KEYS",
    "KEEP_IF_KEY",
    "LISTS_KEY",
    "MODE_KEY",
    "NOTE_KEY",
    "ORIGINAL_LENGTH_KEY",
    "POLICY_KEYS",
    "P_VALUE_KEY",
    "SCORE_KEY",
    "SCORE_SOURCES",
    "SPANS_KEY",
    "THRESHOLD_KEY",
    "EmptyListLog",
    "EmptyListStats",
    "Retrieval",
    "RetrievedDoc",
    "calibrate_native",
    "calibrate_through",
    "check_documents",
    "check_score_source",
    "document_ids",
    "empty_reason",
    "filter_documents",
    "filter_items",
    "kept_metadata",
    "load_filter",
    "native_filter",
    "native_pairs",
    "pruned_text",
    "report_result",
    "retrieval_run",
    "retrieve_pairs",
    "scorer_option_names",
    "split_options",
]

SCORE_KEY = "ragsieve_score"
THRESHOLD_KEY = "ragsieve_threshold"
MODE_KEY = "ragsieve_mode"
#: kept character spans of a document: its kept sentences (a filter of unit "sentence"), or
#: the kept pieces of one longer than the filter's window (cut into pieces)
SPANS_KEY = "ragsieve_spans"
#: the length of a pruned document's original text (a filter of unit "sentence")
ORIGINAL_LENGTH_KEY = "ragsieve_original_length"
#: the keep rule's direction: ``">="`` (keep score >= threshold) or ``"<="``
KEEP_IF_KEY = "ragsieve_keep_if"
#: why the rule kept nothing and ``min_keep`` kept the best anyway (on those documents)
NOTE_KEY = "ragsieve_note"
#: the document's conformal p-value: the share of the relevant calibration snippets that
#: scored no better, in (0, 1] (marginal mode: kept exactly when it exceeds alpha); absent
#: when the artifact stores no calibration evidence
P_VALUE_KEY = "ragsieve_p_value"
#: why the query's list is unlike the filter's calibration lists (a score that reads the whole
#: list: see ragsieve.lists), on every document of that query's result
LISTS_KEY = "ragsieve_lists_note"
#: where a component's score comes from: the filter's own (text, an outside score in the
#: metadata) or the framework's native score field
SCORE_SOURCES = ("filter", "native")

logger = logging.getLogger(__name__)

#: a framework's document type (LangChain ``Document``, LlamaIndex ``NodeWithScore``, ...)
D = TypeVar("D")
#: a framework component class
C = TypeVar("C")

# keys a filter reads from a snippet mapping besides the metadata it is told to read
_FILTER_KEYS = frozenset({"text", "snippet_id", "id", "score", "group"})


def filter_items(
    flt: ConformalFilter, texts: Sequence[str], metadatas: Sequence[Mapping[str, Any]],
    native: Sequence[Any] | None = None, native_name: str = "the native score",
) -> list[dict[str, Any]]:
    """Documents as the snippet mappings :meth:`ConformalFilter.filter` takes.

    Parameters
    ----------
    flt : ConformalFilter
        The filter the items are for.
    texts : sequence of str
        Each document's text (what the scorer scores).
    metadatas : sequence of mapping
        Each document's metadata.
    native : sequence, optional
        ``score_source="native"``: each document's framework score, given to the filter
        under its outside-score field (see :func:`check_score_source`).
    native_name : str
        How the native score is named in errors (``"Document.score"``).

    Returns
    -------
    list of dict
        ``{**metadata, "text": text, "snippet_id": str(position)}``. The text and the
        position always win over metadata keys of the same name. The keys a filter would
        read as a fallback (``"group"``, ``"id"``) are dropped unless they are the filter's
        own ``group_by`` field; ``"score"`` is kept as the alias of the outside score.

    Raises
    ------
    DataError
        A document's outside score cannot be read
        (:func:`~ragsieve.scoring.field.outside_score_conflict`: a ``score`` for a filter
        that reads none, or ``score`` and the field name with different values), or a
        native score is None.

    Examples
    --------
    >>> from ragsieve import ConformalFilter
    >>> from ragsieve.scoring import FieldScorer
    >>> flt = ConformalFilter(FieldScorer(field="rerank"))
    >>> filter_items(flt, ["a"], [{"rerank": 0.2, "group": "x", "text": "meta"}])
    [{'rerank': 0.2, 'text': 'a', 'snippet_id': '0'}]
    """
    from ragsieve.scoring.field import outside_score_conflict

    field = flt.scorer.outside_field()
    wanted = {key for key in (flt.group_by, field, "score") if key}
    items = []
    for i, (text, meta) in enumerate(zip(texts, metadatas, strict=True)):
        item = {k: v for k, v in meta.items() if k not in _FILTER_KEYS or k in wanted}
        if native is not None and field is not None:
            item = _with_native(item, field, native[i], f"document {i}", native_name)
        problem = outside_score_conflict(flt.scorer, item)
        if problem:
            raise DataError(f"document {i} {problem}.")
        item["text"] = text
        item["snippet_id"] = str(i)
        items.append(item)
    return items


def _with_native(item: dict[str, Any], field: str, value: Any, where: str,
                 native_name: str) -> dict[str, Any]:
    """``item`` with the native score under ``field``; the metadata must not say otherwise."""
    if value is None:
        raise DataError(f"{where} has no score ({native_name} is None); score_source='native' "
                        f"filters on it. Use a retriever that scores its results, or "
                        f"score_source='filter'.")
    for key in dict.fromkeys((field, "score")):
        if item.get(key) is not None and item[key] != value:
            raise DataError(f"{where} has {key!r} ({item[key]!r}) in its metadata and "
                            f"{native_name} {value!r}; score_source='native' reads "
                            f"{native_name}: drop the metadata key or give the same value.")
    item = {k: v for k, v in item.items() if k != "score"}
    item[field] = value
    return item


def check_score_source(flt: ConformalFilter, score_source: Any, native_name: str) -> str:
    """``score_source`` checked against the filter: ``"filter"`` or ``"native"``.

    ``"native"`` needs a filter calibrated on a higher-is-better outside score (keep
    ``score >= t``), e.g. by a component's ``calibrate_native`` or
    ``ragsieve calibrate --scorer field --score-field score --higher-is-better``.

    Raises
    ------
    ValueError
        Another value, or ``"native"`` with a filter on another score.
    """
    if score_source not in SCORE_SOURCES:
        raise ValueError(f"score_source == {score_source!r}, must be one of {SCORE_SOURCES}.")
    if score_source == "native":
        rule = flt.scorer.keep_rule(0.0)
        if flt.scorer.outside_field() is None or rule.keep_if != ">=":
            raise ValueError(
                f"score_source='native' filters on {native_name} (higher is better), but this "
                f"filter keeps {rule.score} {rule.keep_if} tau. Calibrate one on the native "
                "score: calibrate_native(examples), or ragsieve calibrate --scorer field "
                "--score-field score --higher-is-better.")
    return str(score_source)


def native_filter(pairs: list[Pair], field: str, **filter_options: Any) -> ConformalFilter:
    """A filter calibrated on a framework's native score: ``Pair.meta[field]``, higher is
    better (``keep field >= t``), with ``ConformalFilter``'s keywords (``alpha``, a mode
    name as ``calibrator``, ``min_keep``, ``group_by``)."""
    from ragsieve.filter import ConformalFilter
    from ragsieve.scoring import FieldScorer

    return ConformalFilter(FieldScorer(field, higher_is_better=True), **filter_options).calibrate(pairs)


def calibrate_native(component: Callable[..., C], examples: Iterable[Any], field: str,
                     **filter_options: Any) -> C:
    """A component on its framework's native score, calibrated on labelled retriever output.

    Parameters
    ----------
    component : type
        The component class; it has ``native_pairs(examples, field=...)`` and takes
        ``filter=`` and ``score_source=`` keywords.
    examples : iterable
        See the component's ``native_pairs``: ``(query, documents, relevant_ids[, topic])``.
    field : str
        The score's name in the keep rule and the artifact.
    **filter_options
        ``ConformalFilter`` keywords (``alpha``, ``calibrator`` (a mode name),
        ``min_keep``, ``group_by``).

    Returns
    -------
    component
        With ``score_source="native"`` and an in-memory filter (:func:`native_filter`);
        ``.filter.save(path)`` writes its artifact.
    """
    pairs = component.native_pairs(examples, field=field)  # type: ignore[attr-defined]
    return component(filter=native_filter(pairs, field, **filter_options), score_source="native")


def native_pairs(examples: Iterable[Any], doc_type: type,
                 read: Callable[[Any], tuple[Any, str, Any, Mapping[str, Any]]],
                 *, field: str = "score", kind: str = "documents") -> list[Pair]:
    """Labelled retriever output as calibration pairs holding the native score.

    Parameters
    ----------
    examples : iterable
        ``(query, documents, relevant_ids)`` or ``(query, documents, relevant_ids, topic)``
        tuples: what the retriever returned for a query and the ids of the relevant ones
        among them (``topic`` is the pair's ``group`` for topic splits).
    doc_type : type
        The framework's document class.
    read : callable
        A framework document as ``(id, text, native score, metadata)``.
    field : str
        The key the native score goes under (``Pair.meta[field]``).
    kind : str
        How the documents are named in errors.

    Returns
    -------
    list of Pair
        One per document, ``relevant`` 1 when its id is among ``relevant_ids``; ``meta``
        holds its metadata and the native score under ``field`` (write them with
        :func:`ragsieve.data.write_pairs` for ``ragsieve calibrate``).

    Raises
    ------
    TypeError
        An example of another shape, or ``relevant_ids`` given as one string.
    DataError
        A document without an id or without a native score.
    """
    pairs: list[Pair] = []
    for qi, example in enumerate(examples):
        if not isinstance(example, (tuple, list)) or len(example) not in (3, 4):
            raise TypeError(f"examples[{qi}] is {type(example).__name__} {example!r:.60}; "
                            f"expected (query, {kind}, relevant_ids[, topic]).")
        query, docs, relevant = example[:3]
        if not isinstance(query, str):
            raise TypeError(f"examples[{qi}] query has type {type(query).__name__}; expected str.")
        if isinstance(relevant, (str, bytes)) or not isinstance(relevant, Iterable):
            raise TypeError(f"examples[{qi}] relevant_ids is {relevant!r:.60}; expected a "
                            "collection of ids, e.g. ['doc-3'].")
        wanted = {str(r) for r in relevant}
        topic = str(example[3]) if len(example) == 4 else ""
        for di, doc in enumerate(check_documents(docs, doc_type, kind)):
            doc_id, text, score, meta = read(doc)
            where = f"examples[{qi}] {kind}[{di}]"
            if doc_id is None:
                raise DataError(f"{where} has no id; relevant_ids name {kind} by id.")
            if score is None:
                raise DataError(f"{where} has no native score (None); calibrate on what the "
                                "retriever returns with its scores.")
            extra = {k: v for k, v in meta.items() if not k.startswith("ragsieve_")
                     and k != "score"}
            pairs.append(Pair(query_id=f"q{qi}", query=query, snippet_id=str(doc_id),
                              text=text, relevant=int(str(doc_id) in wanted), group=topic,
                              meta={**extra, field: score}))
    return pairs


# ------------------------------------------------------- calibrate through a retriever
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


def user_score(flt: ConformalFilter, score: float) -> float:
    """A nonconformity score in the keep rule's units (``bm25``, not ``-bm25``)."""
    return float(flt.scorer.keep_rule(score).threshold)


def kept_metadata(flt: ConformalFilter, result: FilterResult, kept: Scored,
                  note: str | None = None) -> dict[str, Any]:
    """The keys every component adds to a kept document's metadata: its score, the
    threshold and the rule's direction (in the score's units), the guarantee mode, its
    conformal p-value (:data:`P_VALUE_KEY`, when the artifact stores the evidence), for a
    document cut into pieces the kept spans, the ``note`` when ``min_keep`` kept it, and
    :data:`LISTS_KEY` when the query's list is unlike the filter's calibration lists.

    Parameters
    ----------
    flt : ConformalFilter
        The filter that kept it.
    result : FilterResult
        The filter's result for the query.
    kept : Scored
        The kept document's entry of ``result.kept`` (or of ``result.removed``).
    note : str, optional
        Why the rule kept nothing (:func:`empty_reason`).
    """
    rule = flt.scorer.keep_rule(result.threshold)
    meta: dict[str, Any] = {SCORE_KEY: user_score(flt, kept.score), THRESHOLD_KEY: rule.threshold,
                            KEEP_IF_KEY: rule.keep_if, MODE_KEY: flt.mode}
    if kept.p_value is not None:
        meta[P_VALUE_KEY] = kept.p_value
    if kept.spans:
        meta[SPANS_KEY] = [list(span) for span in kept.spans]
    if result.unit == "sentence" and kept.spans:
        meta[ORIGINAL_LENGTH_KEY] = len(kept.text)
    if note:
        meta[NOTE_KEY] = note
    if result.lists_unlike:
        meta[LISTS_KEY] = result.lists_note
    return meta


def filter_documents(
    flt: ConformalFilter, query: str, docs: Sequence[D], *, texts: Sequence[str],
    metadatas: Sequence[Mapping[str, Any]], native: Sequence[Any] | None, native_name: str,
    copy: Callable[..., D], log: logging.Logger, kind: str = "documents", removed: bool = True,
    empties: EmptyListLog | None = None,
) -> tuple[list[D], list[D], FilterResult, str | None]:
    """Filter a framework's documents and copy the kept (and removed) ones, in input order.

    The one path of every component: :func:`filter_items`, :meth:`ConformalFilter.filter`,
    :func:`report_result`, then ``copy(doc, result, scored, note)`` for each kept document
    and ``copy(doc, result, scored)`` for each removed one.

    Parameters
    ----------
    flt : ConformalFilter
        The component's filter.
    query : str
        The query the documents were retrieved for.
    docs : sequence
        The framework's documents (not modified).
    texts, metadatas, native, native_name
        Each document's text, metadata and native score (None unless
        ``score_source="native"``), as :func:`filter_items` takes them.
    copy : callable
        The component's copy of a document with the filter's keys (:func:`kept_metadata`)
        and its pruned text (:func:`pruned_text`).
    log : logging.Logger
        Where :func:`report_result` logs.
    kind : str
        How the documents are named in the log lines.
    removed : bool
        Copy the removed documents too (else the second list is empty).
    empties : EmptyListLog, optional
        The component's count of emptied lists (see :func:`report_result`).

    Returns
    -------
    kept, removed : list
        The copies.
    result : FilterResult
        The filter's result.
    note : str or None
        Why the rule kept nothing (:func:`empty_reason`); None when it kept some.
    """
    result = flt.filter(query, filter_items(flt, texts, metadatas, native, native_name))
    note = report_result(log, flt, result, kind, empties)
    kept = [copy(docs[s.index], result, s, note) for s in result.kept]
    out = [copy(docs[s.index], result, s) for s in result.removed] if removed else []
    return kept, out, result, note


def pruned_text(result: FilterResult, scored: Scored) -> str | None:
    """The text a component gives a kept document: for a filter of unit ``"sentence"`` its
    kept sentences joined with ``" "`` (:attr:`ragsieve.types.Scored.pruned_text`); None for
    unit ``"snippet"`` (the document keeps its text) and for a removed document."""
    if result.unit != "sentence" or not scored.spans:
        return None
    return scored.pruned_text


def empty_reason(flt: ConformalFilter, result: FilterResult, kind: str = "documents") -> str | None:
    """Why the rule kept none of ``result``'s documents, in the score's units; None when it
    kept some.

    Examples
    --------
    ``no documents passed the marginal rule: every score is below the threshold (keep
    bm25 >= 7.2; the best is 5.1); the context is empty (set min_keep to keep the best
    ones anyway)``
    """
    if not result.rule_kept_none:
        return None
    rule = flt.scorer.keep_rule(result.threshold)
    best = min(result.scores)
    reason = f"no {kind} passed the {flt.mode} rule: "
    if math.isfinite(result.threshold) and best > result.threshold:
        side = "below" if rule.keep_if == ">=" else "above"
        reason += f"every score is {side} the threshold "
    reason += f"({rule}; the best is {user_score(flt, best):.4g}); "
    if result.kept:
        return reason + (f"kept the {len(result.kept)} best by min_keep={flt.min_keep}, "
                         "outside the calibrated guarantee")
    return reason + "the context is empty (set min_keep to keep the best ones anyway)"


def report_result(log: logging.Logger, flt: ConformalFilter, result: FilterResult,
                  kind: str = "documents", empties: EmptyListLog | None = None) -> str | None:
    """Log what a component kept: when the rule kept nothing, a WARNING with the reason
    (:func:`empty_reason`), or with ``empties`` what :meth:`EmptyListLog.see` logs; else a
    DEBUG line. Returns the reason (None: kept some)."""
    reason = empty_reason(flt, result, kind)
    if empties is not None:
        empties.see(log, result, reason, kind)
    elif reason:
        log.warning("kept %d of %d %s for query %r: %s", len(result.kept), result.n_input,
                    kind, result.query[:80], reason)
    if not reason:
        log.debug("kept %d of %d %s (%s)", len(result.kept), result.n_input, kind,
                  flt.scorer.keep_rule(result.threshold))
    return reason


@dataclass(frozen=True)
class EmptyListStats:
    """What a component's rule emptied so far (:attr:`EmptyListLog.stats`).

    Attributes
    ----------
    lists : int
        Lists the component filtered.
    emptied : int
        Lists of which the rule kept nothing (``min_keep`` may have kept the best anyway).
    """

    lists: int = 0
    emptied: int = 0


def _summary_due(n: int) -> bool:
    """The counts of emptied lists that :class:`EmptyListLog` summarises in a WARNING:
    1, 10, 100, 1000, ... (a power of ten)."""
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class EmptyListLog:
    """How a framework component reports the lists its rule empties, one call per query:
    as the CLI prints one summary rather than a line per query.

    The first emptied list is a WARNING with its reason and the fix (:func:`empty_reason`);
    every later one is a DEBUG line and counted, and at the 10th, 100th, 1000th, ... a
    WARNING summary line gives the count so far. :attr:`stats` is the count (each
    component's ``empty_stats``). Thread-safe: a component may serve several threads.

    Parameters
    ----------
    component : str
        The component's class name, for the log lines.
    """

    def __init__(self, component: str) -> None:
        self.component = component
        self._lock = threading.Lock()
        self._stats = EmptyListStats()

    @property
    def stats(self) -> EmptyListStats:
        """The lists seen and emptied so far."""
        return self._stats

    def see(self, log: logging.Logger, result: FilterResult, reason: str | None,
            kind: str = "documents") -> None:
        """Count one filtered list; log it as the class says when ``reason`` (it was
        emptied) is given."""
        with self._lock:
            lists, emptied = self._stats.lists + 1, self._stats.emptied + bool(reason)
            self._stats = EmptyListStats(lists, emptied)
        if not reason:
            return
        where = f"{self.component}.empty_stats"
        if emptied == 1:
            log.warning("kept %d of %d %s for query %r: %s (the next lists the rule empties "
                        "are counted in %s and summarised at the 10th, 100th, ...)",
                        len(result.kept), result.n_input, kind, result.query[:80], reason,
                        where)
        elif _summary_due(emptied):
            log.warning("the rule emptied %d of the %d lists of %s %s has filtered so far "
                        "(the count is in %s); the last: %s", emptied, lists, kind,
                        self.component, where, reason)
        else:
            log.debug("kept %d of %d %s for query %r: %s", len(result.kept), result.n_input,
                      kind, result.query[:80], reason)


def check_documents(documents: Any, kind: type, name: str = "documents") -> list[Any]:
    """``documents`` as a list of ``kind``; ``TypeError`` for one document or a string given
    where a sequence is expected, or an item of another type (named by its index)."""
    qualified = f"{kind.__module__}.{kind.__name__}"
    if isinstance(documents, (str, bytes, bytearray, Mapping, kind)) \
            or not isinstance(documents, Iterable):
        raise TypeError(f"{name} is a {type(documents).__name__} ({documents!r:.60}); expected "
                        f"a sequence of {qualified}, e.g. [doc].")
    for i, d in enumerate(documents):
        if not isinstance(d, kind):
            raise TypeError(f"{name}[{i}] is a {type(d).__name__}; expected {qualified}.")
    return list(documents)


#: ``from_file`` keywords that set the filter's empty-result and long-snippet policy (see
#: ``ConformalFilter``); every other keyword rebuilds the artifact's scorer.
POLICY_KEYS = ("min_keep", "max_chars")


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``from_file`` keywords as (scorer options, policy keywords of :data:`POLICY_KEYS`)."""
    policy = {k: v for k, v in options.items() if k in POLICY_KEYS}
    return {k: v for k, v in options.items() if k not in POLICY_KEYS}, policy


def scorer_option_names(spec: Mapping[str, Any]) -> list[str] | None:
    """The keyword options that rebuild a scorer from its artifact ``spec`` (the keywords of
    its constructor that the spec does not fix), or None when they cannot be listed (an
    unknown alias, a plug-in taking any keyword).

    Examples
    --------
    >>> scorer_option_names({"scorer": "embedding", "model": "all-MiniLM-L6-v2"})
    ['backend', 'batch_size', 'cache_dir', 'language']
    """
    import inspect

    from ragsieve.scoring import _lookup

    try:
        factory = _lookup(str(spec.get("scorer")))
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        base = spec.get("base")
        if isinstance(base, Mapping):  # relative, fused: the options go to the base scorer
            inner = scorer_option_names(base)
        elif spec.get("scorer") == "llm":  # the connection's options
            from ragsieve.llm import connect

            inner = list(inspect.signature(connect).parameters)
        else:
            return None
        if inner is None:
            return None
        names |= set(inner)
    return sorted(names - set(spec) - {"base", "connection"})


def load_filter(path: str | os.PathLike[str], scorer_options: Mapping[str, Any],
                policy: Mapping[str, Any]) -> ConformalFilter:
    """Load an artifact for a framework component: scorer options rebuild its scorer, the
    policy keywords (:data:`POLICY_KEYS`) replace the artifact's policy.

    Raises
    ------
    TypeError
        A keyword that is neither a policy keyword nor an option of the artifact's scorer;
        the message lists the accepted ones.
    ValueError
        A policy value the filter refuses (``min_keep=-1``).
    ArtifactError
        The artifact cannot be read or is not valid.
    """
    from ragsieve.artifact import Artifact
    from ragsieve.filter import ConformalFilter

    artifact = Artifact.read(path)
    accepted = scorer_option_names(artifact.scorer)
    unknown = sorted(set(scorer_options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise TypeError(
            f"from_file got unexpected keyword argument(s) {unknown}; it accepts the policy "
            f"keywords {list(POLICY_KEYS)} and the options of the artifact's "
            f"{artifact.scorer['scorer']!r} scorer {accepted}.")
    flt = ConformalFilter.from_artifact(artifact, scorer_options=dict(scorer_options) or None)
    if policy:  # checked by the constructor, as for a filter built by hand
        checked = ConformalFilter(flt.scorer, flt.calibrator, group_by=flt.group_by,
                                  **{"min_keep": flt.min_keep, "max_chars": flt.max_chars,
                                     **policy})
        flt.min_keep, flt.max_chars = checked.min_keep, checked.max_chars
    return flt

