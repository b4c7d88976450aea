"""Filtering a framework's documents: the one path of every component.

Every component keeps exactly the snippets that :meth:`ragsieve.ConformalFilter.filter`
keeps, in their original order, as new objects (the caller's inputs are never mutated),
with the keys of :func:`~ragsieve.integrations.metadata.kept_metadata`.

Every guarantee mode works: each document reaches the filter as its metadata plus its text
(:func:`filter_items`), so a ``group``-mode filter finds the group under its ``group_by``
key (e.g. ``metadata["language"]``) and a filter calibrated on an outside score
(``FieldScorer(field="rerank")``) finds it under that field. A document lacking what the
mode needs raises the filter's ``DataError``. An outside score is read under the filter's
field name (``metadata["bm25"]``) or as ``metadata["score"]``; both with different values,
or a ``score`` given to a filter that reads none, is a ``DataError``
(:func:`ragsieve.scoring.field.outside_score_conflict`, the rules of the HTTP service).
One document (or a string) where a list goes is a ``TypeError`` (:func:`check_documents`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ragsieve.errors import DataError
from ragsieve.integrations.empty_lists import report_result

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter
    from ragsieve.integrations.empty_lists import EmptyListLog
    from ragsieve.types import FilterResult

__all__ = [
    "SCORE_SOURCES", "Copies", "DocumentFields", "check_documents", "check_score_source",
    "filter_documents", "filter_items",
]

#: where a component's score comes from: the filter's own (text, an outside score in the
#: metadata) or the framework's native score field
SCORE_SOURCES = ("filter", "native")

#: a framework's document type (LangChain ``Document``, LlamaIndex ``NodeWithScore``, ...)
D = TypeVar("D")

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

    field = flt.scorer_.outside_field()
    wanted = {key for key in (flt.policy_.group_by, field, "score") if key}
    items = []
    for i, (text, meta) in enumerate(zip(texts, metadatas, strict=True)):
        item = {k: v for k, v in meta.items() if k not in _FILTER_KEYS or k in wanted}
        if native is not None and field is not None:
            item = _with_native(item, field, native[i], f"document {i}", native_name)
        problem = outside_score_conflict(flt.scorer_, item)
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
        rule = flt.scorer_.keep_rule(0.0)
        if flt.scorer_.outside_field() is None or rule.keep_if != ">=":
            raise ValueError(
                f"score_source='native' filters on {native_name} (higher is better), but this "
                f"filter keeps {rule.score} {rule.keep_if} tau. Calibrate one on the native "
                "score: calibrate_native(examples), or ragsieve calibrate --scorer field "
                "--score-field score --higher-is-better.")
    return str(score_source)


@dataclass(frozen=True)
class DocumentFields:
    """What a filter reads of a framework's documents, as :func:`filter_items` takes it.

    Attributes
    ----------
    texts : sequence of str
        Each document's text.
    metadatas : sequence of mapping
        Each document's metadata.
    native : sequence, optional
        Each document's native score (None unless ``score_source="native"``).
    native_name : str
        How the native score is named in errors.
    """

    texts: Sequence[str]
    metadatas: Sequence[Mapping[str, Any]]
    native: Sequence[Any] | None = None
    native_name: str = "the native score"


@dataclass(frozen=True)
class Copies(Generic[D]):
    """How a component copies its documents and reports what its filter did.

    Attributes
    ----------
    copy : callable
        The component's copy of a document with the filter's keys (:func:`kept_metadata`)
        and its pruned text (:func:`pruned_text`).
    log : logging.Logger
        Where :func:`report_result` logs.
    kind : str
        How the documents are named in the log lines.
    empties : EmptyListLog, optional
        The component's count of emptied lists (see :func:`report_result`).
    """

    copy: Callable[..., D]
    log: logging.Logger
    kind: str = "documents"
    empties: EmptyListLog | None = None


def filter_documents(
    flt: ConformalFilter, query: str, docs: Sequence[D], fields: DocumentFields,
    copies: Copies[D], *, removed: bool = True,
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
    fields : DocumentFields
        Each document's text, metadata and native score.
    copies : Copies
        The component's copy of a document, log, name of its documents and count of
        emptied lists.
    removed : bool
        Copy the removed documents too (else the second list is empty).

    Returns
    -------
    kept, removed : list
        The copies.
    result : FilterResult
        The filter's result.
    note : str or None
        Why the rule kept nothing (:func:`empty_reason`); None when it kept some.
    """
    result = flt.filter(query, filter_items(flt, fields.texts, fields.metadatas, fields.native,
                                            fields.native_name))
    note = report_result(copies.log, flt, result, copies.kind, copies.empties)
    copy = copies.copy
    kept = [copy(docs[s.index], result, s, note) for s in result.kept]
    out = [copy(docs[s.index], result, s) for s in result.removed] if removed else []
    return kept, out, result, note


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
