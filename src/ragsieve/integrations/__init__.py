"""Drop-in components for RAG frameworks.

Each submodule imports its framework lazily, so this package imports without them:

- :mod:`ragsieve.integrations.langchain` -- ``ConformalCompressor``, a LangChain
  ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).
- :mod:`ragsieve.integrations.llamaindex` -- ``ConformalPostprocessor``, a LlamaIndex
  ``BaseNodePostprocessor`` (``pip install 'ragsieve[llamaindex]'``).
- :mod:`ragsieve.integrations.haystack` -- ``ConformalRanker``, a Haystack component
  (``pip install 'ragsieve[haystack]'``); it also sets ``Document.score`` to ``1 - score``.

All keep exactly the snippets that :meth:`ragsieve.ConformalFilter.filter` keeps, in
their original order, as new objects (the caller's inputs are never mutated), and
record the nonconformity score, the threshold and the guarantee mode in the metadata
under ``"ragsieve_score"``, ``"ragsieve_threshold"`` and ``"ragsieve_mode"``.

Every guarantee mode works: each document reaches the filter as its metadata plus its
text (:func:`filter_items`), so a ``group``-mode filter finds the group under its
``group_by`` key (e.g. ``metadata["language"]``) and a filter calibrated on an outside
score (``FieldScorer(field="rerank")``) finds it under that field. A document lacking
what the mode needs raises the filter's ``DataError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter

__all__ = [
    "MODE_KEY",
    "SCORE_KEY",
    "SPANS_KEY",
    "THRESHOLD_KEY",
    "filter_items",
    "kept_metadata",
]

SCORE_KEY = "ragsieve_score"
THRESHOLD_KEY = "ragsieve_threshold"
MODE_KEY = "ragsieve_mode"
#: kept character spans of a document longer than the filter's window (cut into pieces)
SPANS_KEY = "ragsieve_spans"

# keys a filter reads from a snippet mapping besides the metadata it is told to read
_FILTER_KEYS = frozenset({"text", "snippet_id", "id", "score", "group"})


def filter_items(
    flt: ConformalFilter, texts: Sequence[str], metadatas: Sequence[Mapping[str, Any]]
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

    Returns
    -------
    list of dict
        ``{**metadata, "text": text, "snippet_id": str(position)}``. The text and the
        position always win over metadata keys of the same name. Metadata keys that the
        filter would read as a fallback (``"score"``, ``"group"``, ``"id"``) are dropped
        unless they are the filter's own ``group_by`` field or its outside-score field,
        so an unrelated ``metadata["score"]`` (a retriever's similarity, say) is never
        taken for the calibrated score.

    Examples
    --------
    >>> from ragsieve import ConformalFilter
    >>> from ragsieve.scoring import FieldScorer
    >>> flt = ConformalFilter(FieldScorer(field="rerank"))
    >>> filter_items(flt, ["a"], [{"rerank": 0.2, "score": 0.9, "text": "meta"}])
    [{'rerank': 0.2, 'text': 'a', 'snippet_id': '0'}]
    """
    from ragsieve.scoring import FieldScorer

    field = flt.scorer.field if isinstance(flt.scorer, FieldScorer) else None
    wanted = {key for key in (flt.group_by, field) if key}
    items = []
    for i, (text, meta) in enumerate(zip(texts, metadatas, strict=True)):
        item = {k: v for k, v in meta.items() if k not in _FILTER_KEYS or k in wanted}
        item["text"] = text
        item["snippet_id"] = str(i)
        items.append(item)
    return items


def kept_metadata(flt: ConformalFilter, result: Any, kept: Any) -> dict[str, Any]:
    """The keys every component adds to a kept document's metadata: its score, the
    threshold, the guarantee mode and, for a document cut into pieces, the kept spans.

    Parameters
    ----------
    flt : ConformalFilter
        The filter that kept it.
    result : FilterResult
        The filter's result for the query.
    kept : Scored
        The kept document's entry of ``result.kept``.
    """
    meta: dict[str, Any] = {SCORE_KEY: float(kept.score), THRESHOLD_KEY: float(result.threshold),
                            MODE_KEY: flt.mode}
    if kept.spans:
        meta[SPANS_KEY] = [list(span) for span in kept.spans]
    return meta


class FromFileMixin:
    """``from_file`` for a framework component with a ``filter`` field."""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **scorer_options: Any) -> Self:
        """Load a saved filter artifact.

        Parameters
        ----------
        path : path-like
            JSON artifact written by ``ConformalFilter.save``.
        **scorer_options
            Passed to ``ConformalFilter.load(scorer_options=...)``, e.g. ``cache_dir=...``.
        """
        from ragsieve.filter import ConformalFilter

        flt = ConformalFilter.load(path, scorer_options=scorer_options or None)
        return cls(filter=flt)  # type: ignore[call-arg]
