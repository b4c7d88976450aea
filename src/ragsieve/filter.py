"""``ConformalFilter``: a scorer plus a calibrator of any guarantee mode, and its artifact.

A filter is calibrated once on labelled pairs from *other* topics and then applied
to each query's retrieved snippets: it keeps what its calibrator keeps (for most modes
the snippets whose nonconformity score is at most the calibrated threshold tau), in
their original order.

The filter is the join; its steps live in rooms of their own: :mod:`ragsieve.pieces`
(the accepted snippet forms as items, cut into what is scored), :mod:`ragsieve.fitting`
(resolve and fit the score on some topics, calibrate on the rest: ``calibrate``),
:mod:`ragsieve.keeping` (the rule applied to the pieces' scores, the empty-result policy)
and :mod:`ragsieve.artifact` (the saved filter).

Snippets
--------
A snippet is a ``str``, a :class:`~ragsieve.types.Snippet`, a :class:`~ragsieve.types.Pair`
or a mapping with any of ``"text"``, ``"score"`` (an outside score, for filters calibrated
on one with :class:`~ragsieve.scoring.FieldScorer`; the field's own name works too),
``"snippet_id"`` / ``"id"``, and the group value of the ``group`` mode under the filter's
``group_by`` key or ``"group"``. :meth:`ConformalFilter.filter_vectors` scores from the
caller's own embeddings instead of texts.

Units
-----
``unit="snippet"`` (the default) scores and keeps whole snippets. ``unit="sentence"``
scores and keeps each snippet's sentences (:func:`ragsieve.units.sentence_pieces`: a
sentence longer than ``max_chars`` is cut into pieces of at most 500 characters, each
scored and kept like a sentence) and calibrates on evidence sentences, cut the same way
(:func:`ragsieve.units.sentence_pairs`); a kept snippet's ``Scored.spans`` are its kept
sentences (and pieces) and ``Scored.pruned_text`` their text, and
``FilterResult.sentences`` records every sentence's (and piece's) score and decision. The
unit is part of the artifact's policy.

Empty-result policy
-------------------
When nothing is kept, the default (``min_keep=0``) returns an empty ``kept`` tuple and
says so in ``FilterResult.note`` (and an INFO log line): an empty context is a legitimate
outcome ("nothing retrieved looks like evidence"). With ``min_keep=k`` the ``k``
best-scoring snippets are kept instead; the note says that these snippets were kept by
the policy, not by the calibrated rule.

Artifact
--------
:meth:`ConformalFilter.to_artifact` gives the filter as a sealed
:class:`~ragsieve.artifact.Artifact` (format version 3: the scorer spec, the calibration
block, the policy, the calibration data's provenance and, by default, see
``calibrate(monitor=...)``, the ``"monitor"`` block the exchangeability monitor ranks
served requests against) and :meth:`ConformalFilter.from_artifact` builds the filter back
(:mod:`ragsieve.persistence` maps the one onto the other); ``save`` / ``load`` /
``to_dict`` / ``from_dict`` wrap them (:class:`ragsieve.persistence.SavedFilter`). :mod:`ragsieve.artifact` is the one reader,
writer, seal and identity. Version 1 artifacts (marginal only) and version
2 artifacts (with copies in their calibration block, or without a monitor block) still load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from ._validation import check_alpha, check_instance, check_scores, check_str
from .artifact import Artifact
from .calibration import (
    BaseCalibrator,
    SplitConformalCalibrator,  # noqa: F401 (the module docstring's example uses it)
    make_calibrator,
)
from .calibration.p_values import EvidenceScores
from .errors import NotFittedError
from .fitting import Calibration, CalibrationInfo, CalibrationOptions, fit_and_calibrate
from .keep_policy import KeepPolicy
from .keeping import apply_rule, promise, see_list, see_lists, wants_root
from .lists import DEFAULT_DELTA, DEFAULT_MIN_LISTS, ListCheck, ListRecord, ListWatch
from .persistence import FilterParts, SavedFilter, artifact_of, parts_of
from .pieces import (
    MAX_CHARS,
    Pieces,
    SnippetLike,
    as_items,
    check_snippet_unit,
    cut,
    cut_pairs,
    model_texts,
    vector_scores,
)
from .scoring import Scorer, resolve_scorer
from .types import DEFAULT_ALPHA, FilterResult, Pair

__all__ = ["MAX_CHARS", "ConformalFilter", "SnippetLike"]

logger = logging.getLogger(__name__)


class ConformalFilter(SavedFilter):
    """Keep the snippets a calibrated guarantee mode keeps (see the module docstring).
    Every parameter is checked at once (``ValueError`` out of range, ``TypeError`` of the
    wrong type: :meth:`ragsieve.keep_policy.KeepPolicy.checked`) and kept as given (resolved);
    what :meth:`calibrate` learns is kept apart, in the attributes ending in ``_``.

    Parameters
    ----------
    scorer : Scorer or str, default="auto"
        The nonconformity score or its alias (``"best"`` is fitted by :meth:`calibrate`;
        ``"auto"`` is chosen there: :func:`~ragsieve.scoring.auto.choose_score`).
    calibrator : BaseCalibrator or str, optional
        A calibrator of any mode, or a mode name built with ``alpha`` (default: marginal).
    alpha : float, default=0.1
        Used only when ``calibrator`` is None or a mode name.
    min_keep : int, default=0
        Empty-result policy: keep at least this many best-scoring snippets.
    group_by : str, optional
        ``group`` mode: the field of each snippet's group (``Pair.meta`` key at calibration).
    max_chars : int, optional
        Longer snippets are cut into pieces of the calibrated size, scored piece by piece
        and kept when any piece is kept (default ``MAX_CHARS``, 600).
    unit : {"snippet", "sentence"}, default="snippet"
        What is scored and kept (the module docstring's *Units*).

    Attributes
    ----------
    scorer_ : Scorer
        The score in force: what :meth:`calibrate` resolved and fitted (``"auto"``,
        ``"best"``), else the given one.
    calibrator_ : BaseCalibrator
        The calibrator in force: the copy :meth:`calibrate` fitted (the given one is never
        fitted), else the given one (fitted when the filter was loaded).
    policy_ : KeepPolicy
        The keep policy in force (with the ``group_by`` given to :meth:`calibrate`).
    calibration_info : CalibrationInfo
        The calibration data's provenance (the artifact's ``data`` block).
    """

    def __init__(self, scorer: Scorer | str = "auto", calibrator: BaseCalibrator | str | None = None,
                 *, alpha: float = DEFAULT_ALPHA, min_keep: int = 0, group_by: str | None = None,
                 max_chars: int | None = None, unit: str = "snippet") -> None:
        alpha = check_alpha(alpha)  # the user facade checks its plain parameters at once
        self.scorer = resolve_scorer(scorer)
        if calibrator is None or isinstance(calibrator, str):
            calibrator = make_calibrator(calibrator or "marginal", alpha=alpha)
        self.calibrator = check_instance(
            calibrator, BaseCalibrator, "calibrator", expected="a ragsieve calibrator "
            "(ragsieve.calibration.make_calibrator(mode, ...)) or a mode name")
        policy = KeepPolicy.checked(min_keep, group_by, max_chars, unit,
                                    sentence_in_context=self.scorer.tags.sentence_in_context)
        self.min_keep, self.group_by = policy.min_keep, policy.group_by
        self.max_chars, self.unit = policy.max_chars, policy.unit
        self.scorer_, self.calibrator_ = self.scorer, self.calibrator  # until calibrated
        self.group_by_: str | None = None  # the group field calibrate was given
        self.calibration_info = CalibrationInfo()
        #: The ``"monitor"`` block (:mod:`ragsieve.monitoring`) and the calibration lists
        #: (:mod:`ragsieve.lists`), None until calibrated; the check of the given lists.
        self.monitor_reference: dict[str, Any] | None = None
        self.lists: ListRecord | None = None
        self.list_watch: ListWatch | None = None
        #: The relevant calibration scores behind each snippet's p-value
        #: (:mod:`ragsieve.calibration.p_values`); None until calibrated.
        self.evidence: EvidenceScores | None = None

    @property
    def policy_(self) -> KeepPolicy:
        """The keep policy in force: the constructor's, with ``calibrate``'s ``group_by``."""
        return KeepPolicy(self.min_keep, self.group_by_ or self.group_by, self.max_chars,
                          self.unit)

    @property
    def mode(self) -> str:
        """The guarantee mode of the calibrator."""
        return self.calibrator_.mode

    @property
    def alpha(self) -> float | None:
        """Target miscoverage (``None`` for a budget without a coverage target)."""
        return self.calibrator_.miscoverage()

    def _check_calibrated(self) -> None:
        if not self.calibrator_.is_fitted:
            raise NotFittedError("This ConformalFilter is not calibrated; call calibrate(pairs) "
                                 "or ConformalFilter.load(path) first.")

    @property
    def threshold(self) -> float:
        """The calibrated threshold tau (group mode: the pooled one; budget: its cap)."""
        self._check_calibrated()
        return float(self.calibrator_.threshold_)

    def guarantee(self) -> dict[str, Any]:
        """What the filter promises (:func:`ragsieve.keeping.promise`)."""
        self._check_calibrated()
        return promise(self.calibrator_, unit=self.unit, group_by=self.policy_.group_by)

    @property
    def language(self) -> str | None:
        """The language the filter was calibrated on (``data.language``), or None."""
        return self.calibration_info.language

    def calibrate(self, pairs: Sequence[Pair], *, progress: bool = False,
                  group_by: str | None = None, seed: int = 0, monitor: bool | None = None,
                  language: str | None = None,
                  lists: str | Mapping[str, Any] | None = None) -> ConformalFilter:
        """Score labelled calibration pairs and fit a copy of the calibrator: the steps of
        :func:`ragsieve.fitting.fit_and_calibrate`, which documents them in full. The
        parameters stay as given; what is learned goes to ``scorer_``, ``calibrator_``,
        ``policy_``, ``calibration_info``, ``monitor_reference``, ``lists``, ``evidence``.

        Parameters
        ----------
        pairs : sequence of Pair
            Labelled snippet pairs (``relevant`` in {0, 1}), for either unit.
        progress : bool
            Show a progress bar while scoring.
        group_by : str, optional
            ``group`` mode: the ``Pair.meta`` field of each pair's group.
        seed : int
            Seed of the fit / calibration topic split of a score that learns.
        monitor, language, lists : optional
            What calibration records beside the threshold, as
            :class:`~ragsieve.fitting.CalibrationOptions` says: the exchangeability
            monitor's reference (None: unless an LLM score), the texts' language (None:
            detected), where the calibration lists come from (None: read from the pairs;
            ``"auto"``, ``"retriever"``, ``"deployed"``, ``"data"`` or a mapping).

        Raises
        ------
        DataError, CalibrationError
            An unlabelled pair, a group-mode pair without its group, a relevant snippet
            without evidence (unit ``"sentence"``); no relevant pair.
        """
        done = fit_and_calibrate(self.scorer, self.calibrator.unfitted_copy(), pairs,
                                 policy=self.policy_.with_group_by(group_by), seed=seed,
                                 progress=progress,
                                 options=CalibrationOptions(monitor, language, lists))
        self.group_by_ = group_by
        return self._learned(done)

    def _learned(self, done: Calibration | FilterParts) -> Self:
        """Keep what calibration learned (or the artifact stores); restart the list check."""
        self.scorer_, self.calibrator_, self.calibration_info = done.scorer, done.calibrator, done.info
        self.monitor_reference, self.lists, self.evidence = done.monitor, done.lists, done.evidence
        self.watch_lists()
        return self

    def watch_lists(self, *, delta: float = DEFAULT_DELTA, min_lists: int = DEFAULT_MIN_LISTS,
                    log: bool = True) -> ListWatch | None:
        """(Re)start the check of the given lists against the calibration lists
        (:class:`ragsieve.lists.ListWatch`; ``log=False``: the caller reports the results'
        ``lists_note`` itself); None without a record of the calibration lists."""
        self.list_watch = None if self.lists is None else ListWatch(
            self.lists, delta=delta, min_lists=min_lists,
            score_name=f"the {self.scorer_.keep_rule(0.0).score}", log=log)
        return self.list_watch

    def _cut(self, snippets: Sequence[SnippetLike]) -> Pieces:
        return cut(as_items(snippets), unit=self.unit, max_chars=self.max_chars,
                   reads_text=self.scorer_.tags.reads_text)

    def piece_texts(self, snippets: Sequence[SnippetLike]) -> list[str]:
        """The texts a :meth:`filter` call hands its scorer (the model work it may cause:
        :func:`ragsieve.pieces.model_texts`); nothing is scored."""
        return model_texts(self._cut(snippets), self.unit)

    def _apply(self, query: str, scores: Any, pieces: Pieces, group: Any,
               root: np.ndarray | None = None, check: ListCheck | None = None) -> FilterResult:
        """:func:`ragsieve.keeping.apply_rule`; ``root`` scores or the ``check`` made."""
        self._check_calibrated()
        return apply_rule(
            self.calibrator_, scores, pieces, query=query, policy=self.policy_, group=group,
            see=lambda: see_list(self.list_watch, pieces, root) if check is None else check,
            evidence=self.evidence)

    def filter(self, query: str, snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Score one query's snippets and keep what the calibrated mode keeps.

        ``snippets`` are ``str``, ``Snippet``, ``Pair`` or mappings (the module docstring);
        ``group``: the ``group`` mode's group of snippets that carry none of their own.
        Raises ``TypeError`` for one snippet instead of a sequence or a form not accepted,
        ``DataError`` for a snippet without what the score or mode needs.
        """
        check_str(query, "query")
        self._check_calibrated()  # fail before scoring
        pieces = self._cut(snippets)
        scores = self.scorer_.score_items(query, pieces.pieces) if pieces.pieces else np.zeros(0)
        root = (self.scorer_.root_scorer().score_items(query, pieces.pieces)  # cached embeddings
                if pieces.pieces and wants_root(self.list_watch) else None)
        return self._apply(query, scores, pieces, group, root)

    def filter_scores(self, query: str, scores: Any, snippets: Sequence[SnippetLike], *,
                      group: Any = None, root_scores: Any = None) -> FilterResult:
        """Apply the calibrated rule to precomputed scores of this filter's score;
        ``root_scores`` (e.g. an index's stored ``1 - cos``) feed the list check.
        ``TypeError`` for unit ``"sentence"`` (it scores sentences: use :meth:`filter`)."""
        check_snippet_unit(self.unit, "one precomputed score per snippet")
        root = None if root_scores is None else check_scores(root_scores, name="root_scores")
        return self._apply(query, scores, Pieces.whole(as_items(snippets)), group, root)

    def filter_vectors(self, query: str, query_vector: Any, snippet_vectors: Any,
                       snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Filter with the caller's own embeddings of the filter's model (no model call):
        :func:`ragsieve.pieces.vector_scores`, ``TypeError`` for unit ``"sentence"``."""
        self._check_calibrated()
        check_snippet_unit(self.unit, "the snippets' vectors")
        items = as_items(snippets)
        scores, root = vector_scores(self.scorer_, query_vector, snippet_vectors, len(items),
                                     root=wants_root(self.list_watch))
        return self._apply(query, scores, Pieces.whole(items), group, root)

    def filter_pairs(self, pairs: Sequence[Pair], *, progress: bool = False,
                     seed: int = 0) -> dict[str, FilterResult]:
        """Filter many queries at once (batched scoring), keyed by query_id; groups from
        ``Pair.meta[group_by]``. The list check sees the batch's lists in a random order
        (``seed``); when it fires on the batch, every result is flagged."""
        self._check_calibrated()
        batch = cut_pairs(pairs, unit=self.unit, max_chars=self.max_chars,
                          reads_text=self.scorer_.tags.reads_text)
        scores = self.scorer_.score_pairs(batch.pairs, progress=progress)
        roots = (self.scorer_.root_scorer().score_pairs(batch.pairs)
                 if wants_root(self.list_watch) and batch.pairs else None)
        checks = see_lists(self.list_watch, batch.cuts, batch.offsets, roots, seed)
        return {qid: self._apply(batch.queries[qid], scores[batch.rows(qid)], pieces, None,
                                 check=checks[qid]) for qid, pieces in batch.cuts.items()}

    def to_artifact(self) -> Artifact:
        """The calibrated filter as a sealed artifact (:func:`ragsieve.persistence.artifact_of`)."""
        self._check_calibrated()
        return artifact_of(self)

    @classmethod
    def from_artifact(cls, artifact: Artifact, *, scorer: Scorer | None = None,
                      scorer_options: Mapping[str, Any] | None = None) -> Self:
        """The filter an :class:`~ragsieve.artifact.Artifact` stores (see :meth:`load`;
        ``TypeError`` for a dict: :meth:`from_dict` takes one)."""
        parts = parts_of(artifact, scorer=scorer, scorer_options=scorer_options)
        return cls(parts.scorer, parts.calibrator, **parts.policy.keywords())._learned(parts)

    def __repr__(self) -> str:
        tau = getattr(self.calibrator_, "threshold_", None)
        unit = "" if self.unit == "snippet" else f", unit={self.unit!r}"
        return (f"ConformalFilter(scorer={self.scorer_.spec()!r}, mode={self.mode!r}, "
                f"alpha={self.alpha}, threshold={tau}{unit})")
