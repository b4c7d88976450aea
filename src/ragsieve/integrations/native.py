"""Filtering on a framework's native score, calibrated on labelled retriever output.

``score_source="native"`` filters on the framework's own score (Haystack
``Document.score``, LlamaIndex ``NodeWithScore.score``, LangChain
``metadata["relevance_score"]``), handed to a filter calibrated on it under its field name:
each component's ``calibrate_native(examples)`` fits one (:func:`calibrate_native`) from
the pairs of :func:`native_pairs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ragsieve.errors import DataError
from ragsieve.integrations.filtering import check_documents
from ragsieve.types import Pair

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter

__all__ = ["calibrate_native", "native_filter", "native_pairs"]

#: a framework component class
C = TypeVar("C")


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
