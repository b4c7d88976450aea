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
from typing import Any, Self

from ragsieve._optional import require
from ragsieve._validation import check_instance, check_path, check_str
from ragsieve.filter import ConformalFilter
from ragsieve.integrations.adapter import FrameworkAdapter
from ragsieve.integrations.empty_lists import EmptyListLog
from ragsieve.integrations.filtering import (
    Copies,
    DocumentFields,
    check_score_source,
    filter_documents,
)
from ragsieve.integrations.loading import load_filter
from ragsieve.integrations.metadata import ORIGINAL_SCORE_KEY, kept_metadata, pruned_text
from ragsieve.integrations.native import calibrate_native, native_pairs
from ragsieve.integrations.retrieval import Retrieval, RetrievedDoc, document_ids, retrieval_run
from ragsieve.types import FilterResult, Pair

require("haystack", "haystack")
from haystack import Document, component, default_from_dict, default_to_dict
from haystack.core.errors import SerializationError

__all__ = ["NATIVE_FIELD", "ORIGINAL_SCORE_KEY", "ConformalRanker"]

logger = logging.getLogger(__name__)

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


@component
class ConformalRanker(FrameworkAdapter):
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

    **Scores.** Haystack's rankers set ``Document.score`` to a higher-is-better relevance.
    For a score kept when low (``keep s <= tau``: ``1 - cos``, the fused score, an LLM's
    ``1 - P(yes)``), ``Document.score`` becomes the document's conformal p-value: the share
    of the relevant calibration snippets that scored no better, in (0, 1], the same unit
    for every score (in the marginal mode a document is kept exactly when it exceeds
    alpha); an artifact without calibration evidence gives ``1 - s`` instead. For a
    higher-is-better outside score (``keep bm25 >= t``, and ``score_source="native"``)
    ``Document.score`` is that score itself, the one the rule reads. ``meta`` also gets
    ``"ragsieve_score"`` and ``"ragsieve_threshold"`` (in the keep rule's units),
    ``"ragsieve_p_value"`` (the p-value, whatever the score),
    ``"ragsieve_keep_if"`` (``"<="`` or ``">="``), ``"ragsieve_mode"`` (the guarantee mode),
    ``"ragsieve_original_score"`` (the score the document arrived with, e.g. the
    retriever's BM25 score, or None) and, for a document longer than the filter's window
    (cut into pieces), ``"ragsieve_spans"`` (the kept character spans).

    **Outputs.** ``documents`` (kept), ``removed`` (the others, as new Documents with the
    same score keys) and ``ragsieve``: ``{"kept", "removed", "dropped"`` (documents without
    text), ``"score", "keep_if", "threshold"`` (the rule, in the score's units),
    ``"mode", "reason"}``; ``reason`` is None unless the rule kept nothing, when it says why
    (every score below the threshold, the best score). The first emptied list also gets a
    WARNING log line saying why; the next are counted in :attr:`empty_stats`, with a
    WARNING summary at the 10th, 100th, ... (:class:`~ragsieve.integrations.EmptyListLog`),
    not a line each. The output depends on the query and documents alone.

    **Every mode.** Each document goes to the filter as its ``meta`` plus its text (see
    :func:`ragsieve.integrations.filter_items`): a ``group``-mode filter reads
    ``meta[filter.policy_.group_by]``, a filter on an outside score reads ``meta[field]``; a
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
        self._empty_log = EmptyListLog(type(self).__name__)
        self.score_source = check_score_source(self.filter, score_source, _NATIVE_NAME)

    @staticmethod
    def _policy(min_keep: int | None, max_chars: int | None) -> dict[str, int]:
        return {k: v for k, v in (("min_keep", min_keep), ("max_chars", max_chars))
                if v is not None}

    @classmethod
    def _from_file(cls, path: str | os.PathLike[str], scorer_options: dict[str, Any],
                   policy: dict[str, Any], score_source: str) -> Self:
        """A ranker that loads ``path`` itself, so that it serialises as that path."""
        return cls(path, scorer_options=scorer_options, score_source=score_source, **policy)

    @classmethod
    def _retrieval(cls, retriever: Any,
                   run: Callable[[str], Sequence[Document]] | None) -> Retrieval:
        """``retriever.run(query=...)["documents"]`` (or ``run``), read as hits."""
        call = (_run_documents(retriever) if run is None
                else retrieval_run(retriever, run, "run", _EXPECTED))
        return Retrieval(run=call, read=_read_hit, doc_type=Document, framework="haystack",
                         name=type(retriever).__name__)

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
        if self.filter.scorer_.tags.reads_text:
            self.filter.scorer_.score_batch("warm-up", ["warm-up"])

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
            group under ``filter.policy_.group_by``, an outside score; ``Document.score`` with
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
            self.filter, query, docs, DocumentFields(
                [d.content or "" for d in docs], [d.meta for d in docs], native, _NATIVE_NAME),
            Copies(self._copy, logger, empties=self._empty_log))
        return self._outputs(kept, removed, result, dropped, reason)

    def _with_text(self, docs: list[Document]) -> list[Document]:
        """The documents the score can read: all, or those with text when it reads text."""
        if not self.filter.scorer_.tags.reads_text:
            return docs
        textless = [d for d in docs if not (d.content or "").strip()]
        if textless:
            logger.warning(
                "dropped %d of %d documents without text content (the %s score reads text): "
                "ids %s", len(textless), len(docs), self.filter.scorer_.spec().get("scorer"),
                [d.id for d in textless[:10]] + (["..."] if len(textless) > 10 else []))
        return [d for d in docs if (d.content or "").strip()]

    def _copy(self, src: Document, result: FilterResult, scored: Any,
              reason: str | None = None) -> Document:
        """A new Document with the score keys in ``meta`` and the higher-is-better score
        (the class docstring's *Scores*)."""
        meta: dict[str, Any] = copy.deepcopy(src.meta)
        meta.update(kept_metadata(self.filter, result, scored, reason))
        meta[ORIGINAL_SCORE_KEY] = src.score
        if self.score_source == "native" or meta["ragsieve_keep_if"] == ">=":
            higher = meta["ragsieve_score"]  # the score the rule reads, in its own units
        elif scored.p_value is not None:
            higher = scored.p_value
        else:  # an artifact without calibration evidence
            higher = 1.0 - float(scored.score)
        text = pruned_text(result, scored)  # unit sentence: the kept sentences only
        if text is None:
            return dataclasses.replace(src, meta=meta, score=higher)
        return dataclasses.replace(src, content=text, meta=meta, score=higher)

    def _outputs(self, kept: list[Document], removed: list[Document],
                 result: FilterResult | None, dropped: int,
                 reason: str | None = None) -> dict[str, Any]:
        rule = self.filter.scorer_.keep_rule(
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
