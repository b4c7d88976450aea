"""An outside score: a reranker's, a retriever's or any number the data already carries.

``FieldScorer`` reads a numeric field of each pair (a key of the generic JSONL line, kept
in ``Pair.meta``) or of each snippet mapping given to a filter, so that scores ragsieve
does not compute -- cross-encoders, hosted rerank APIs, hybrid BM25 + vector scores --
can be calibrated and filtered with the same guarantees. Higher-is-better scores are
negated, so that lower means more relevant, as for every nonconformity score.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .._validation import check_bool, check_str, is_finite_number, show_number
from ..errors import DataError, ScorerError
from ..types import Pair
from .base import KeepRule, Scorer
from .options import ScorerOption
from .tags import ScorerTags

__all__ = ["FieldScorer", "outside_score_conflict"]


class FieldScorer(Scorer):
    """The value of a numeric field as the nonconformity score.

    Parameters
    ----------
    field : str, default="score"
        The key holding the score (``Pair.meta[field]``; for snippet mappings given to a
        filter, ``item[field]`` or else ``item["score"]``).
    higher_is_better : bool, default=False
        True for similarities and reranker relevance scores: the score is then ``-value``.

    Examples
    --------
    >>> s = FieldScorer(field="rerank", higher_is_better=True)
    >>> s.score_pairs([Pair("q", "Q?", "a", "x", meta={"rerank": 0.9})]).tolist()
    [-0.9]
    """

    name: ClassVar[str] = "field"
    # an outside number, read from each item: no text, no model, any thread
    tags = ScorerTags(reads_text=False, thread_safe=True, model_free=True)
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("field", str, "score", "scorer field: the JSONL key holding each pair's "
                     "score (e.g. a reranker's); every line must hold a finite number there",
                     "--score-field", metavar="NAME", required=True),
        ScorerOption("higher_is_better", bool, False, "scorer field: higher values mean more "
                     "relevant (default: lower)", "--higher-is-better"),
    )

    def __init__(self, field: str = "score", *, higher_is_better: bool = False) -> None:
        self.field = check_str(field, "field", non_blank=True)
        self.higher_is_better = check_bool(higher_is_better, "higher_is_better")

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name, "field": self.field, "higher_is_better": self.higher_is_better}

    def outside_field(self) -> str | None:
        """The field read: the artifact's own name for the outside score."""
        return self.field

    def keep_rule(self, threshold: float) -> KeepRule:
        """``keep <field> <= tau``, or ``keep <field> >= -tau`` for a higher-is-better score.

        Examples
        --------
        >>> str(FieldScorer("bm25", higher_is_better=True).keep_rule(-0.655))
        'keep bm25 >= 0.655'
        """
        if self.higher_is_better:
            return KeepRule(score=self.field, keep_if=">=", threshold=-float(threshold))
        return KeepRule(score=self.field, keep_if="<=", threshold=float(threshold))

    def _value(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise DataError(
                f"{where}: field {self.field!r} == {value!r}, expected a number (the outside score)."
            )
        if not is_finite_number(value):  # an int beyond a double too, never OverflowError
            raise DataError(f"{where}: field {self.field!r} == {show_number(value)}, expected a "
                            "finite number (within +-1.8e308).")
        x = float(value)
        return -x if self.higher_is_better else x

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Read the field of every pair.

        Raises
        ------
        DataError
            A pair lacks the field or holds a non-numeric or non-finite value.
        """
        out = np.empty(len(pairs), dtype=np.float64)
        for i, p in enumerate(pairs):
            where = f"pair {i} (query_id={p.query_id!r}, snippet_id={p.snippet_id!r})"
            if self.field not in p.meta:
                raise DataError(f"{where} has no field {self.field!r}; the filter was calibrated on it.")
            out[i] = self._value(p.meta[self.field], where)
        return out

    def score_items(self, query: str, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Read ``item[field]`` (or ``item["score"]``) of each snippet mapping."""
        out = np.empty(len(items), dtype=np.float64)
        for i, item in enumerate(items):
            key = self.field if self.field in item else "score"
            if key not in item:
                raise DataError(
                    f"snippet {i} has no {self.field!r} (or 'score') value; this filter was "
                    f"calibrated on the outside score {self.field!r}."
                )
            out[i] = self._value(item[key], f"snippet {i}")
        return out

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        raise ScorerError(
            f"the field scorer reads the outside score {self.field!r}; texts alone carry none. "
            "Pass snippets as mappings with that key (or 'score'), or pairs with it in meta."
        )


def outside_score_conflict(scorer: Scorer, item: Mapping[str, Any]) -> str | None:
    """Why ``scorer`` cannot read the outside score of one snippet mapping (None: it can).

    A filter calibrated on an outside score reads it under its field name (``bm25``) or as
    ``score`` (an alias); any other filter reads none. The rules every surface applies:

    - a ``score`` given to a scorer that reads no outside score is refused, never ignored;
    - ``score`` and the field name both given with different values are refused (they
      name one score).

    Parameters
    ----------
    scorer : Scorer
        The filter's scorer (asked for :meth:`~Scorer.outside_field`).
    item : mapping
        One snippet's keys (a framework document's metadata plus its text, say).

    Returns
    -------
    str or None
        The problem, as the end of a sentence that starts with the snippet's name.

    Examples
    --------
    >>> outside_score_conflict(FieldScorer("bm25"), {"bm25": 1.0, "score": 2.0})
    "has both 'score' (2.0) and 'bm25' (1.0); they name the same outside score: give one"
    >>> outside_score_conflict(FieldScorer("bm25"), {"score": 2.0}) is None
    True
    """
    field = scorer.outside_field()
    given = item.get("score")
    if field is None:
        if given is None:
            return None
        return (f"has 'score' ({given!r}), but this filter scores "
                f"{scorer.keep_rule(0.0).score} and reads no outside score; drop it, or "
                "calibrate a filter on it (FieldScorer)")
    other = item.get(field)
    if field != "score" and given is not None and other is not None and other != given:
        return (f"has both 'score' ({given!r}) and {field!r} ({other!r}); they name the same "
                "outside score: give one")
    return None
