"""What a kept document carries: the metadata keys every component writes, and its text.

**Scores in the score's own units.** :data:`SCORE_KEY` and :data:`THRESHOLD_KEY` are in the
units of the keep rule (:meth:`ragsieve.scoring.Scorer.keep_rule`) and :data:`KEEP_IF_KEY`
gives its direction: ``<=`` for ragsieve's own scores (``1 - cos``), ``>=`` for a
higher-is-better outside score such as BM25 (never negated).

**Sentence-level pruning.** With a filter of unit ``"sentence"``
(``ConformalFilter(unit="sentence")``, ``ragsieve calibrate --unit sentence``) every
component returns *pruned* documents, as context pruners do: each kept document's text is
replaced by its kept sentences joined with ``" "`` (:func:`pruned_text`), the kept
sentences' character spans in the original text are under :data:`SPANS_KEY` and the
original text's length under :data:`ORIGINAL_LENGTH_KEY`; a document none of whose
sentences is kept is removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter
    from ragsieve.types import FilterResult, Scored

__all__ = [
    "DOCUMENT_KEYS", "KEEP_IF_KEY", "LISTS_KEY", "MODE_KEY", "NOTE_KEY", "ORIGINAL_LENGTH_KEY",
    "ORIGINAL_SCORE_KEY", "P_VALUE_KEY", "SCORE_KEY", "SPANS_KEY", "THRESHOLD_KEY",
    "kept_metadata", "pruned_text", "user_score",
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
#: the score a document had before the component (Haystack's ``Document.score``, LlamaIndex's
#: ``NodeWithScore.score``, e.g. the retriever's BM25 score); LangChain's has none
ORIGINAL_SCORE_KEY = "ragsieve_original_score"
#: the keys a component writes about the document itself: all but :data:`LISTS_KEY`, which
#: is about the query's list (LlamaIndex hides them from embeddings and LLMs)
DOCUMENT_KEYS = (SCORE_KEY, THRESHOLD_KEY, KEEP_IF_KEY, MODE_KEY, ORIGINAL_SCORE_KEY, SPANS_KEY,
                 NOTE_KEY, ORIGINAL_LENGTH_KEY, P_VALUE_KEY)


def user_score(flt: ConformalFilter, score: float) -> float:
    """A nonconformity score in the keep rule's units (``bm25``, not ``-bm25``)."""
    return float(flt.scorer_.keep_rule(score).threshold)


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
    rule = flt.scorer_.keep_rule(result.threshold)
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


def pruned_text(result: FilterResult, scored: Scored) -> str | None:
    """The text a component gives a kept document: for a filter of unit ``"sentence"`` its
    kept sentences joined with ``" "`` (:attr:`ragsieve.types.Scored.pruned_text`); None for
    unit ``"snippet"`` (the document keeps its text) and for a removed document."""
    if result.unit != "sentence" or not scored.spans:
        return None
    return scored.pruned_text
