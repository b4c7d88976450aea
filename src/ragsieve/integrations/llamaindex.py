"""LlamaIndex node postprocessor backed by a calibrated :class:`~ragsieve.ConformalFilter`.

Use it as ``index.as_query_engine(node_postprocessors=[ConformalPostprocessor.from_file(...)])``
or call ``postprocess_nodes(nodes, query_str=...)`` directly.
:meth:`ConformalPostprocessor.calibrate` calibrates through the retriever you deploy
(``retriever.retrieve(query)`` on labelled queries). Requires ``pip install 'ragsieve[llamaindex]'`` (llama-index-core).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Self

from ragsieve._optional import require
from ragsieve.artifact import Artifact
from ragsieve.filter import ConformalFilter
from ragsieve.integrations.adapter import FrameworkAdapter
from ragsieve.integrations.empty_lists import EmptyListLog
from ragsieve.integrations.filtering import (
    Copies,
    DocumentFields,
    check_documents,
    filter_documents,
)
from ragsieve.integrations.metadata import (
    DOCUMENT_KEYS,
    ORIGINAL_SCORE_KEY,
    kept_metadata,
    pruned_text,
)
from ragsieve.integrations.native import calibrate_native, native_pairs
from ragsieve.integrations.retrieval import Retrieval, RetrievedDoc, document_ids, retrieval_run
from ragsieve.types import Pair

require("llama_index.core.postprocessor.types", "llamaindex")
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import ConfigDict, Field, PrivateAttr, field_serializer, model_validator

from ragsieve.integrations._pydantic import ScoreSourceCheck

__all__ = ["ORIGINAL_SCORE_KEY", "ConformalPostprocessor"]

logger = logging.getLogger(__name__)

#: the field name a native-score filter is calibrated under by default
NATIVE_FIELD = "score"
_NATIVE_NAME = "NodeWithScore.score"


def _read_native(n: NodeWithScore) -> tuple[Any, str, Any, dict[str, Any]]:
    return (n.node.node_id, n.node.get_content(metadata_mode=MetadataMode.NONE), n.score,
            dict(n.node.metadata))


def _read_hit(n: NodeWithScore) -> RetrievedDoc:
    node, meta = n.node, dict(n.node.metadata)
    return RetrievedDoc(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE),
                        doc_ids=document_ids([node.node_id, node.ref_doc_id], meta),
                        score=n.score, metadata=meta)


class ConformalPostprocessor(FrameworkAdapter, ScoreSourceCheck, BaseNodePostprocessor):
    """Keep the nodes a calibrated conformal filter keeps.

    Parameters
    ----------
    filter : ConformalFilter
        A calibrated filter (e.g. ``ConformalFilter.load("filter.json")``).
    score_source : {"filter", "native"}, default="filter"
        ``"native"``: filter on ``NodeWithScore.score`` (the retriever's score, higher is
        better), given to a filter calibrated on it (:meth:`calibrate_native`).
    on_result : callable, optional
        Called once per query as ``on_result(kept, removed)`` with the kept and the removed
        nodes (copies carrying the same ``ragsieve_*`` keys: each one's score against the
        threshold, in the score's units) — where to log, trace or show what was removed.
        Not serialised.

    Notes
    -----
    Returns new ``NodeWithScore`` objects (with copied nodes) in input order. The
    retriever's ``score`` is left unchanged on the returned object, because LlamaIndex
    treats higher scores as better while ragsieve's nonconformity score is lower =
    more relevant; mixing them in one field would mislead rerankers and cut-offs
    downstream. The filter's score and threshold (in the score's units), the rule's
    direction and the guarantee mode go into ``node.metadata`` under ``"ragsieve_score"`` /
    ``"ragsieve_threshold"`` / ``"ragsieve_keep_if"`` / ``"ragsieve_mode"``, and the
    original score is also recorded as ``"ragsieve_original_score"``; with
    ``score_source="native"`` the score is ``NodeWithScore.score`` itself and the rule
    ``keep score >= threshold``. When the rule keeps nothing a WARNING log line says why;
    nodes kept anyway by ``min_keep`` carry the reason as ``"ragsieve_note"``. These keys are excluded from the text that embedding
    models and LLMs see. Scoring uses ``node.get_content()`` (the node text without
    metadata); the node's metadata goes to the filter too (see
    :func:`ragsieve.integrations.filter_items`), so every guarantee mode works: a
    ``group``-mode filter reads ``metadata[filter.policy_.group_by]``, a filter on an outside score
    reads ``metadata[field]``; a node without it raises ``DataError``.

    **Serialisation.** ``to_dict()`` / ``to_json()`` store the filter as its sealed
    artifact (``ConformalFilter.to_artifact().to_dict()``) and the scorer options
    (path-likes as str); ``from_dict`` / ``from_json`` (and the constructor, given such a
    dict or an :class:`~ragsieve.artifact.Artifact` as ``filter``) rebuild it through the
    one artifact reader, checking every field and the seal as ``ConformalFilter.load`` does.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _empty_log: EmptyListLog = PrivateAttr(
        default_factory=lambda: EmptyListLog("ConformalPostprocessor"))
    native_score_name: ClassVar[str] = _NATIVE_NAME

    filter: ConformalFilter
    scorer_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options that rebuild the filter's scorer from its artifact (cache_dir).")
    score_source: str = Field(
        default="filter",
        description="'filter': the filter's own score; 'native': NodeWithScore.score.")
    on_result: Callable[[list[NodeWithScore], list[NodeWithScore]], None] | None = Field(
        default=None, exclude=True,
        description="Called per query with the kept and the removed nodes (not serialised).")

    @classmethod
    def native_pairs(cls, examples: Iterable[Any], *, field: str = NATIVE_FIELD) -> list[Pair]:
        """Labelled retriever output as calibration pairs holding ``NodeWithScore.score``.

        Parameters
        ----------
        examples : iterable
            ``(query, nodes, relevant_ids[, topic])``: what a retriever returned (a list
            of ``NodeWithScore``) and the node ids of the relevant ones.
        field : str
            The name the score is calibrated under (``Pair.meta[field]``).
        """
        return native_pairs(examples, NodeWithScore, _read_native, field=field, kind="nodes")

    @classmethod
    def calibrate_native(cls, examples: Iterable[Any], *, field: str = NATIVE_FIELD,
                         **filter_options: Any) -> Self:
        """A postprocessor on ``NodeWithScore.score``, calibrated on labelled examples
        (``examples`` as :meth:`native_pairs` takes them, ``field`` and the
        ``ConformalFilter`` keywords as :func:`ragsieve.integrations.calibrate_native`)."""
        return calibrate_native(cls, examples, field, **filter_options)

    @classmethod
    def _retrieval(cls, retriever: Any,
                   run: Callable[[str], Sequence[NodeWithScore]] | None) -> Retrieval:
        """``retriever.retrieve(query)`` (or ``run``), its nodes read as hits."""
        call = retrieval_run(retriever, run, "retrieve", "a LlamaIndex retriever (a "
                             "BaseRetriever: retrieve(query) returns a list of NodeWithScore)")
        return Retrieval(run=call, read=_read_hit, doc_type=NodeWithScore,
                         framework="llamaindex", name=type(retriever).__name__, kind="nodes")

    @model_validator(mode="before")
    @classmethod
    def _filter_from_artifact(cls, data: Any) -> Any:
        """A ``filter`` given as an artifact (``to_dict`` output, or an ``Artifact``) is rebuilt."""
        if isinstance(data, Mapping) and isinstance(data.get("filter"), (Mapping, Artifact)):
            options = dict(data.get("scorer_options") or {})
            given = data["filter"]
            artifact = given if isinstance(given, Artifact) else Artifact.from_dict(given)
            flt = ConformalFilter.from_artifact(artifact, scorer_options=options or None)
            data = {**data, "filter": flt}
        return data

    @field_serializer("filter")
    def _filter_as_artifact(self, flt: ConformalFilter) -> dict[str, Any]:
        return flt.to_artifact().to_dict()

    @field_serializer("scorer_options")
    def _options_as_json(self, options: dict[str, Any]) -> dict[str, Any]:
        return {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}

    @classmethod
    def _from_loaded(cls, flt: ConformalFilter, scorer_options: dict[str, Any],
                     score_source: str = "filter") -> Self:
        return cls(filter=flt, scorer_options=scorer_options, score_source=score_source)

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialisation."""
        return "RagsieveConformalPostprocessor"

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        """Return new NodeWithScore objects for the kept nodes, in input order.

        Raises
        ------
        TypeError
            ``nodes`` is one node or a string instead of a list of ``NodeWithScore``.
        ValueError
            No query (``query_bundle`` is None).
        DataError
            A node lacks what the filter's mode or score needs in its metadata.
        """
        if query_bundle is None:
            raise ValueError(
                "query_bundle is None; ConformalPostprocessor scores nodes against the query. "
                "Call postprocess_nodes(nodes, query_str='...') or pass a QueryBundle."
            )
        nodes = check_documents(nodes, NodeWithScore, "nodes")
        if not nodes:
            return []
        native = [n.score for n in nodes] if self.score_source == "native" else None
        out, removed, _, _ = filter_documents(
            self.filter, query_bundle.query_str, nodes, DocumentFields(
                [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes],
                [n.node.metadata for n in nodes], native, _NATIVE_NAME),
            Copies(self._copy, logger, "nodes", self._empty_log),
            removed=self.on_result is not None)
        if self.on_result is not None:
            self.on_result(list(out), removed)
        return out

    def _copy(self, src: NodeWithScore, result: Any, scored: Any,
              note: str | None = None) -> NodeWithScore:
        """A copy of ``src`` with the filter's keys added (and hidden from models and LLMs)."""
        node = src.node.model_copy(deep=True)
        node.metadata.update(kept_metadata(self.filter, result, scored, note))
        text = pruned_text(result, scored)  # unit sentence: the kept sentences only
        if text is not None:
            node.set_content(text)
        node.metadata[ORIGINAL_SCORE_KEY] = src.score
        for key in DOCUMENT_KEYS:
            for excluded in (node.excluded_embed_metadata_keys, node.excluded_llm_metadata_keys):
                if key not in excluded:
                    excluded.append(key)
        return NodeWithScore(node=node, score=src.score)
