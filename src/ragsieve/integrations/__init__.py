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

``from_file(path, **options)`` splits its keywords: the policy keywords (``min_keep``,
``max_chars``: :data:`POLICY_KEYS`) set the loaded filter's policy, the others rebuild the
artifact's scorer (``cache_dir``); an unknown keyword is a ``TypeError`` listing both kinds
(:func:`load_filter`). One document (or a string) where a list goes is a ``TypeError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter

__all__ = [
    "MODE_KEY",
    "POLICY_KEYS",
    "SCORE_KEY",
    "SPANS_KEY",
    "THRESHOLD_KEY",
    "check_documents",
    "filter_items",
    "kept_metadata",
    "load_filter",
    "scorer_option_names",
    "split_options",
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
    from ragsieve.filter import ConformalFilter, read_artifact

    payload = read_artifact(path)
    accepted = scorer_option_names(payload["scorer"])
    unknown = sorted(set(scorer_options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise TypeError(
            f"from_file got unexpected keyword argument(s) {unknown}; it accepts the policy "
            f"keywords {list(POLICY_KEYS)} and the options of the artifact's "
            f"{payload['scorer']['scorer']!r} scorer {accepted}.")
    flt = ConformalFilter.from_dict(payload, scorer_options=dict(scorer_options) or None)
    if policy:  # checked by the constructor, as for a filter built by hand
        checked = ConformalFilter(flt.scorer, flt.calibrator, group_by=flt.group_by,
                                  **{"min_keep": flt.min_keep, "max_chars": flt.max_chars,
                                     **policy})
        flt.min_keep, flt.max_chars = checked.min_keep, checked.max_chars
    return flt


class FromFileMixin:
    """``from_file`` for a framework component with a ``filter`` field."""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> Self:
        """Load a saved filter artifact.

        Parameters
        ----------
        path : path-like
            JSON artifact written by ``ConformalFilter.save``.
        **options
            Policy keywords (``min_keep=1``, ``max_chars=...``) set the filter's policy; the
            others rebuild the scorer without changing its scores (``cache_dir=...``; see
            ``ConformalFilter.load(scorer_options=...)``).

        Raises
        ------
        TypeError
            An unknown keyword (the message lists the accepted ones).
        """
        scorer_options, policy = split_options(options)
        return cls._from_loaded(load_filter(path, scorer_options, policy), scorer_options)

    @classmethod
    def _from_loaded(cls, flt: ConformalFilter, scorer_options: dict[str, Any]) -> Self:
        """The component around a loaded filter (``scorer_options`` as given to it)."""
        return cls(filter=flt)  # type: ignore[call-arg]
