"""LlamaIndex node postprocessor backed by a calibrated :class:`~ragsieve.ConformalFilter`.

Use it as ``index.as_query_engine(node_postprocessors=[ConformalPostprocessor.from_file(...)])``
or call ``postprocess_nodes(nodes, query_str=...)`` directly.
Requires ``pip install 'ragsieve[llamaindex]'`` (llama-index-core).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Self

from ragsieve._optional import require
from ragsieve.filter import ConformalFilter
from ragsieve.integrations import (
    MODE_KEY,
    SCORE_KEY,
    SPANS_KEY,
    THRESHOLD_KEY,
    FromFileMixin,
    check_documents,
    filter_items,
    kept_metadata,
)

require("llama_index.core.postprocessor.types", "llamaindex")
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import ConfigDict, Field, field_serializer, model_validator

__all__ = ["ORIGINAL_SCORE_KEY", "ConformalPostprocessor"]

logger = logging.getLogger(__name__)

ORIGINAL_SCORE_KEY = "ragsieve_original_score"


class ConformalPostprocessor(FromFileMixin, BaseNodePostprocessor):
    """Keep the nodes a calibrated conformal filter keeps.

    Parameters
    ----------
    filter : ConformalFilter
        A calibrated filter (e.g. ``ConformalFilter.load("filter.json")``).

    Notes
    -----
    Returns new ``NodeWithScore`` objects (with copied nodes) in input order. The
    retriever's ``score`` is left unchanged on the returned object, because LlamaIndex
    treats higher scores as better while ragsieve's nonconformity score is lower =
    more relevant; mixing them in one field would mislead rerankers and cut-offs
    downstream. The nonconformity score, tau and the guarantee mode go into
    ``node.metadata`` under ``"ragsieve_score"`` / ``"ragsieve_threshold"`` /
    ``"ragsieve_mode"``, and the original score is also recorded as
    ``"ragsieve_original_score"``. These keys are excluded from the text that embedding
    models and LLMs see. Scoring uses ``node.get_content()`` (the node text without
    metadata); the node's metadata goes to the filter too (see
    :func:`ragsieve.integrations.filter_items`), so every guarantee mode works: a
    ``group``-mode filter reads ``metadata[filter.group_by]``, a filter on an outside score
    reads ``metadata[field]``; a node without it raises ``DataError``.

    **Serialisation.** ``to_dict()`` / ``to_json()`` store the filter as its artifact (the
    dict ``ConformalFilter.to_dict`` writes, sealed) and the scorer options (path-likes as
    str); ``from_dict`` / ``from_json`` (and the constructor, given such a dict as
    ``filter``) rebuild it, checking the seal as ``ConformalFilter.load`` does.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    filter: ConformalFilter
    scorer_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options that rebuild the filter's scorer from its artifact (cache_dir).")

    @model_validator(mode="before")
    @classmethod
    def _filter_from_artifact(cls, data: Any) -> Any:
        """A ``filter`` given as an artifact dict (``to_dict`` output) is rebuilt."""
        if isinstance(data, Mapping) and isinstance(data.get("filter"), Mapping):
            options = dict(data.get("scorer_options") or {})
            flt = ConformalFilter.from_dict(data["filter"], scorer_options=options or None)
            data = {**data, "filter": flt}
        return data

    @field_serializer("filter")
    def _filter_as_artifact(self, flt: ConformalFilter) -> dict[str, Any]:
        return flt.to_dict()

    @field_serializer("scorer_options")
    def _options_as_json(self, options: dict[str, Any]) -> dict[str, Any]:
        return {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}

    @classmethod
    def _from_loaded(cls, flt: ConformalFilter, scorer_options: dict[str, Any]) -> Self:
        return cls(filter=flt, scorer_options=scorer_options)

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
        texts = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        items = filter_items(self.filter, texts, [n.node.metadata for n in nodes])
        result = self.filter.filter(query_bundle.query_str, items)
        logger.debug("kept %d of %d nodes (tau=%s)", len(result.kept), len(nodes),
                     result.threshold)
        out: list[NodeWithScore] = []
        for kept in result.kept:
            src = nodes[kept.index]
            node = src.node.model_copy(deep=True)
            node.metadata.update(kept_metadata(self.filter, result, kept))
            node.metadata[ORIGINAL_SCORE_KEY] = src.score
            for key in (SCORE_KEY, THRESHOLD_KEY, MODE_KEY, ORIGINAL_SCORE_KEY, SPANS_KEY):
                for excluded in (node.excluded_embed_metadata_keys,
                                 node.excluded_llm_metadata_keys):
                    if key not in excluded:
                        excluded.append(key)
            out.append(NodeWithScore(node=node, score=src.score))
        return out
