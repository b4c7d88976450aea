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

**Sentence-level pruning.** With a filter of unit ``"sentence"``
(``ConformalFilter(unit="sentence")``, ``ragsieve calibrate --unit sentence``) every
component returns *pruned* documents, as context pruners do: each kept document's text is
replaced by its kept sentences joined with ``" "`` (:func:`pruned_text`), the kept
sentences' character spans in the original text are under ``"ragsieve_spans"`` and the
original text's length under ``"ragsieve_original_length"``; a document none of whose
sentences is kept is removed.

**Empty results.** When the rule keeps nothing (or ``min_keep`` keeps the best anyway), a
WARNING log line gives the reason in the score's units (:func:`empty_reason`); kept
documents carry it under ``"ragsieve_note"``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ragsieve.errors import DataError
from ragsieve.types import Pair

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter
    from ragsieve.types import FilterResult, Scored

__all__ = [
    "KEEP_IF_KEY",
    "MODE_KEY",
    "NOTE_KEY",
    "ORIGINAL_LENGTH_KEY",
    "POLICY_KEYS",
    "SCORE_KEY",
    "SCORE_SOURCES",
    "SPANS_KEY",
    "THRESHOLD_KEY",
    "calibrate_native",
    "check_documents",
    "check_score_source",
    "empty_reason",
    "filter_documents",
    "filter_items",
    "kept_metadata",
    "load_filter",
    "native_filter",
    "native_pairs",
    "pruned_text",
    "report_result",
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
#: where a component's score comes from: the filter's own (text, an outside score in the
#: metadata) or the framework's native score field
SCORE_SOURCES = ("filter", "native")

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


def user_score(flt: ConformalFilter, score: float) -> float:
    """A nonconformity score in the keep rule's units (``bm25``, not ``-bm25``)."""
    return float(flt.scorer.keep_rule(score).threshold)


def kept_metadata(flt: ConformalFilter, result: FilterResult, kept: Scored,
                  note: str | None = None) -> dict[str, Any]:
    """The keys every component adds to a kept document's metadata: its score, the
    threshold and the rule's direction (in the score's units), the guarantee mode, for a
    document cut into pieces the kept spans, and the ``note`` when ``min_keep`` kept it.

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
    if kept.spans:
        meta[SPANS_KEY] = [list(span) for span in kept.spans]
    if result.unit == "sentence" and kept.spans:
        meta[ORIGINAL_LENGTH_KEY] = len(kept.text)
    if note:
        meta[NOTE_KEY] = note
    return meta


def filter_documents(
    flt: ConformalFilter, query: str, docs: Sequence[D], *, texts: Sequence[str],
    metadatas: Sequence[Mapping[str, Any]], native: Sequence[Any] | None, native_name: str,
    copy: Callable[..., D], log: logging.Logger, kind: str = "documents", removed: bool = True,
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
    note = report_result(log, flt, result, kind)
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
                  kind: str = "documents") -> str | None:
    """Log what a component kept: a WARNING with the reason when the rule kept nothing
    (:func:`empty_reason`), else a DEBUG line. Returns the reason (None: kept some)."""
    reason = empty_reason(flt, result, kind)
    if reason:
        log.warning("kept %d of %d %s for query %r: %s", len(result.kept), result.n_input,
                    kind, result.query[:80], reason)
    else:
        log.debug("kept %d of %d %s (%s)", len(result.kept), result.n_input, kind,
                  flt.scorer.keep_rule(result.threshold))
    return reason


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
            ``score_source="native"`` filters on the framework's own score (see the
            component); policy keywords (``min_keep=1``, ``max_chars=...``) set the filter's
            policy; the others rebuild the scorer without changing its scores
            (``cache_dir=...``; see ``ConformalFilter.load(scorer_options=...)``).

        Raises
        ------
        TypeError
            An unknown keyword (the message lists the accepted ones).
        """
        score_source = options.pop("score_source", "filter")
        scorer_options, policy = split_options(options)
        return cls._from_loaded(load_filter(path, scorer_options, policy), scorer_options,
                                score_source)

    @classmethod
    def _from_loaded(cls, flt: ConformalFilter, scorer_options: dict[str, Any],
                     score_source: str = "filter") -> Self:
        """The component around a loaded filter (``scorer_options`` as given to it)."""
        return cls(filter=flt, score_source=score_source)  # type: ignore[call-arg]
