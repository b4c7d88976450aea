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
:class:`~ragsieve.artifact.Artifact` (format version 2: the scorer spec, the calibration
block, the policy, the calibration data's provenance and, by default, see
``calibrate(monitor=...)``, the ``"monitor"`` block the exchangeability monitor ranks
served requests against) and :meth:`ConformalFilter.from_artifact` builds the filter back;
``save`` / ``load`` / ``to_dict`` / ``from_dict`` wrap them. :mod:`ragsieve.artifact` is
the one reader, writer, seal and identity. Version 1 artifacts (marginal only) and version
2 artifacts without a monitor block still load (``monitor_reference`` is then None).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._validation import check_alpha, check_instance, check_int, check_scores, check_str
from .artifact import Artifact, CalibrationBlock
from .calibration import (
    BaseCalibrator,
    SplitConformalCalibrator,  # noqa: F401 (the class docstring's example uses it)
    make_calibrator,
)
from .chunking import DEFAULT_SIZE
from .errors import ArtifactError, NotFittedError, ScorerMismatchError
from .fitting import fit_and_calibrate
from .keeping import apply_rule, see_list, see_lists, wants_root
from .lists import DEFAULT_DELTA, DEFAULT_MIN_LISTS, ListCheck, ListRecord, ListWatch
from .pieces import (
    MAX_CHARS,
    Pieces,
    SnippetLike,
    as_items,
    cut,
    cut_pairs,
    model_texts,
)
from .scoring import Scorer, resolve_scorer
from .types import FilterResult, Pair
from .units import check_unit

__all__ = ["MAX_CHARS", "ConformalFilter", "SnippetLike"]

logger = logging.getLogger(__name__)


def _scorer_of(spec: dict[str, Any], scorer: Scorer | None,
               scorer_options: Mapping[str, Any] | None) -> Scorer:
    """The scorer an artifact's ``spec`` names: rebuilt (``scorer`` None) or the one given,
    checked to be that score (``ScorerMismatchError``)."""
    if scorer is None:
        try:
            scorer = resolve_scorer(spec, **dict(scorer_options or {}))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ArtifactError):
                raise
            raise ArtifactError(f"artifact scorer {spec!r} cannot be rebuilt: {exc}") from exc
    if scorer.spec() != spec:
        raise ScorerMismatchError(
            f"the artifact was calibrated with scorer {spec!r} but the supplied scorer is "
            f"{scorer.spec()!r}; a threshold is only valid for the score it was calibrated on. "
            "Recalibrate with this scorer or load without passing one."
        )
    return scorer


class ConformalFilter:
    """Keep the snippets a calibrated guarantee mode keeps.

    Parameters
    ----------
    scorer : Scorer or str, default="auto"
        The nonconformity score (an alias such as ``"embedding"`` or ``"best"`` is
        resolved; ``"best"`` is fitted by :meth:`calibrate`). ``"auto"`` is chosen by
        :meth:`calibrate`: the list-aware fused score where the pairs are the deployed
        retriever's lists (see ``calibrate(lists=...)``), else the portable fused score, else
        ``1 - cos`` (:func:`~ragsieve.scoring.auto.choose_score`), over the embedding model
        of the detected language.
    calibrator : BaseCalibrator or str, optional
        A calibrator of any mode, fitted already or fitted by :meth:`calibrate`, or a
        mode name (``"marginal"``, ``"query-all"``, ...) built with ``alpha``.
        Defaults to the marginal mode.
    alpha : float, default=0.1
        Used only when ``calibrator`` is None or a mode name; checked at once (``ValueError``
        outside (0, 1), ``TypeError`` for a non-number), like ``min_keep``, ``group_by``
        and ``max_chars``.
    min_keep : int, default=0
        Empty-result policy: keep at least this many best-scoring snippets.
    group_by : str, optional
        ``group`` mode: the field holding each snippet's group (``Pair.meta`` key at
        calibration, snippet key at filtering).
    max_chars : int, optional
        Snippets whose text is longer are cut into sentence-aware pieces of the size the
        filter was calibrated on (500 characters, 100 of overlap) and scored piece by piece;
        the snippet is kept when any piece is kept, and ``Scored.spans`` says which parts.
        Defaults to ``MAX_CHARS`` (600). An embedding model would otherwise read only its
        first few hundred tokens and silently drop evidence placed further in.
    unit : {"snippet", "sentence"}, default="snippet"
        What is scored and kept. ``"sentence"``: every snippet is split into sentences
        (:func:`ragsieve.units.split_sentences`), :meth:`calibrate` takes the usual labelled
        snippet pairs and calibrates on their sentences (evidence sentences from
        ``meta["evidence"]`` spans or the query's ``answers``:
        :func:`ragsieve.units.sentence_pairs`), so the guarantee is on evidence sentences;
        :meth:`filter` keeps the sentences the rule keeps and returns the snippets with at
        least one of them, each with the kept sentences' ``spans`` and ``pruned_text``. An
        unfitted score (``"auto"``, ``"best"``) becomes the sentence-in-context score
        (:class:`~ragsieve.scoring.sentence_context.SentenceContextScorer`: the fused score
        over the query's sentences combined with its snippet's fused score over the
        snippets).

    Examples
    --------
    >>> from ragsieve.scoring import Scorer
    >>> class Length(Scorer):  # toy score: longer text = less relevant
    ...     name = "length"
    ...     def score_batch(self, query, snippets):
    ...         return np.array([len(s) / 100 for s in snippets], dtype=float)
    ...     def spec(self):
    ...         return {"scorer": "length"}
    >>> cal = SplitConformalCalibrator(alpha=0.5).fit([0.04, 0.05, 0.06])
    >>> f = ConformalFilter(Length(), cal)
    >>> f.filter("q", ["short", "a much longer snippet", "tiny"]).kept_ids
    ['0', '2']
    """

    def __init__(
        self,
        scorer: Scorer | str = "auto",
        calibrator: BaseCalibrator | str | None = None,
        *,
        alpha: float = 0.1,
        min_keep: int = 0,
        group_by: str | None = None,
        max_chars: int | None = None,
        unit: str = "snippet",
    ) -> None:
        alpha = check_alpha(alpha)  # the user facade checks its plain parameters at once
        self.scorer = resolve_scorer(scorer)
        if calibrator is None or isinstance(calibrator, str):
            calibrator = make_calibrator(calibrator or "marginal", alpha=alpha)
        self.calibrator = check_instance(
            calibrator, BaseCalibrator, "calibrator", expected="a ragsieve calibrator "
            "(ragsieve.calibration.make_calibrator(mode, ...)) or a mode name")
        self.min_keep = check_int(min_keep, "min_keep", min_value=0)
        self.group_by = check_str(group_by, "group_by", non_blank=True, allow_none=True,
                                  hint="the field name of the group")
        max_chars = check_int(max_chars, "max_chars", min_value=DEFAULT_SIZE, allow_none=True,
                              hint="the snippet size the pieces are cut to")
        self.max_chars = MAX_CHARS if max_chars is None else max_chars
        #: What is scored and kept: ``"snippet"`` or ``"sentence"``.
        self.unit = check_unit(unit)
        if self.unit == "snippet" and self.scorer.sentence_in_context:
            raise ValueError("the sentence_context score scores sentences in their snippets: "
                             "use it with unit='sentence' (CLI --unit sentence).")
        self.calibration_info: dict[str, Any] = {}
        #: The artifact's ``"monitor"`` block (see :mod:`ragsieve.monitoring`), or None.
        self.monitor_reference: dict[str, Any] | None = None
        #: The calibration lists (the artifact's ``"lists"`` block, :mod:`ragsieve.lists`), or
        #: None (not calibrated yet, or an artifact written before it existed).
        self.lists: ListRecord | None = None
        #: The check of the lists this filter is given against :attr:`lists` (None without
        #: them); shared by the filter's copies. :meth:`watch_lists` sets its false-alarm bound.
        self.list_watch: ListWatch | None = None

    # ------------------------------------------------------------------ state
    @property
    def mode(self) -> str:
        """The guarantee mode of the calibrator."""
        return self.calibrator.mode

    @property
    def alpha(self) -> float | None:
        """Target miscoverage (``None`` for a budget without a coverage target)."""
        return self.calibrator.miscoverage()

    def _check_calibrated(self) -> None:
        if not self.calibrator.is_fitted:
            raise NotFittedError(
                "This ConformalFilter is not calibrated; call calibrate(pairs) or "
                "ConformalFilter.load(path) first."
            )

    @property
    def threshold(self) -> float:
        """The calibrated threshold tau (group mode: the pooled one; budget: its cap)."""
        self._check_calibrated()
        return float(self.calibrator.threshold_)

    def guarantee(self) -> dict[str, Any]:
        """What the filter promises: the calibrator's :class:`~ragsieve.calibration.Guarantee`
        as a dict (mode, metric, target, statement, alpha, n_calibration, n_required,
        infinite, details), plus ``coverage_band`` for the marginal mode; for unit
        ``"sentence"`` also ``unit``, and the calibrator words its statement of evidence
        sentences (``guarantee(unit=...)``)."""
        self._check_calibrated()
        out = self.calibrator.guarantee(unit=self.unit).to_dict()
        if "coverage_band" in out["details"]:
            out["coverage_band"] = list(out["details"]["coverage_band"])
        if self.group_by is not None:
            out["group_by"] = self.group_by
        if self.unit == "sentence":  # the calibrated units are sentences, the relevant ones evidence
            out["unit"] = self.unit
        return out

    # ------------------------------------------------------------ calibrate
    def calibrate(
        self,
        pairs: Sequence[Pair],
        *,
        progress: bool = False,
        group_by: str | None = None,
        seed: int = 0,
        monitor: bool | None = None,
        language: str | None = None,
        lists: str | Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Score labelled calibration pairs and fit the calibrator.

        Only the relevant pairs are scored when the mode learns from them alone and the
        score of a snippet does not depend on its list; otherwise (list-dependent scores:
        relative, fused; budgets) every pair is scored, in its query's whole list. An
        unfitted fused score (``"best"``) is first fitted on a random quarter
        (``FUSION_FIT_FRACTION``) of the calibration topics (``Pair.group``) and calibrated
        on the rest, so the score is fixed before the data it is calibrated on is seen: its
        own :meth:`~ragsieve.scoring.Scorer.fit_topics`, the fit ``evaluate(seed=seed)``
        makes in its split 0. The calibrator gets its inputs from
        :class:`~ragsieve.calibration.inputs.CalibrationInputs`, as every split does. The
        steps are :func:`ragsieve.fitting.fit_and_calibrate`'s.

        With ``unit="sentence"`` the snippet pairs are cut into their sentences
        (:func:`ragsieve.units.sentence_pairs`: evidence sentences from ``meta["evidence"]``
        or the query's ``answers``) and the calibrator learns from the sentences. An unfitted
        score becomes the sentence-in-context score, whose two stages (the score over the
        snippets, the score over the sentences) and their combination are all fitted on the
        same share of the topics (:func:`~ragsieve.scoring.sentence_context.
        fit_sentence_context`); the threshold is calibrated on the other topics' sentences.

        Parameters
        ----------
        pairs : sequence of Pair
            Labelled calibration pairs (``relevant`` in {0, 1} for every pair); snippet
            pairs for either unit.
        progress : bool
            Show a progress bar while scoring.
        group_by : str, optional
            ``group`` mode: the ``Pair.meta`` field holding each pair's group (stored in
            the artifact; filtering reads the same field). Defaults to the constructor's.
        seed : int
            Seed of the fit/calibration topic split of an unfitted fused score, and of the
            subsample of the monitor reference beyond 20,000 queries.
        monitor : bool, optional
            Record the exchangeability monitor's reference (``monitor_reference``, saved in
            the artifact): the separation statistic of every calibration query, computed
            from the scores of all its snippets, so the irrelevant pairs are scored too
            when the mode would not need them. False skips it (the artifact then has no
            monitor block). The default records it unless that would send the irrelevant
            pairs to an LLM score (logged; pass True to pay for it).
        language : str, optional
            Language of the calibration texts, recorded in the artifact (``data.language``)
            and used by an ``"auto"`` score to pick the model. None detects it in a sample
            of the queries and snippets (py3langid); an undetected language is not recorded
            (``"auto"`` then uses English).
        lists : {None, "auto", "retriever", "deployed", "data"} or Mapping
            Where the calibration lists come from (:func:`ragsieve.lists.lists_source`),
            recorded in the artifact's ``lists`` block with their lengths (and, for a
            list-aware score, their list-level statistics), which every surface checks its
            lists against (:attr:`list_watch`). None reads it from the pairs: lists that
            all carry one retriever identity (``ragsieve retrieve``, a component's
            ``calibrate``) are the deployed retriever's, others a data set's own.
            ``"deployed"``: they are the deployed retriever's lists. An ``"auto"`` score is
            the list-aware fused score only on the deployed retriever's lists, else the
            list-free portable one (:func:`~ragsieve.scoring.auto.choose_score`).

        Returns
        -------
        ConformalFilter
            ``self``, calibrated.

        Raises
        ------
        DataError
            A pair is unlabelled, or lacks the group field in group mode; unit
            ``"sentence"``: a relevant snippet with neither ``evidence`` nor ``answers``.
        CalibrationError
            No relevant pair.
        """
        self.group_by = group_by or self.group_by
        done = fit_and_calibrate(self.scorer, self.calibrator, pairs, unit=self.unit,
                                 max_chars=self.max_chars, group_by=self.group_by, seed=seed,
                                 progress=progress, monitor=monitor, language=language,
                                 lists=lists)
        self.scorer, self.calibration_info = done.scorer, done.info
        self.monitor_reference, self.lists = done.monitor, done.lists
        self.watch_lists()
        self._warn_if_short()
        return self

    def watch_lists(self, *, delta: float = DEFAULT_DELTA, min_lists: int = DEFAULT_MIN_LISTS,
                    ) -> ListWatch | None:
        """(Re)start the check of the lists this filter is given against its calibration
        lists (:class:`ragsieve.lists.ListWatch`): false-alarm bound ``delta`` of its
        sequential test, which may fire after ``min_lists`` lists. None when the filter has
        no record of its calibration lists (an artifact written before it existed)."""
        if self.lists is None:
            self.list_watch = None
            return None
        label = self.scorer.keep_rule(0.0).score
        self.list_watch = ListWatch(self.lists, delta=delta, min_lists=min_lists,
                                    score_name=f"the {label}")
        return self.list_watch

    @property
    def language(self) -> str | None:
        """The language the filter was calibrated on (``data.language``), or None."""
        code = self.calibration_info.get("language")
        return code if isinstance(code, str) else None

    def _warn_if_short(self) -> None:
        g = self.calibrator.guarantee()
        if g.infinite:
            logger.warning("%s: the calibration data is too small for alpha=%s (has %d, needs %s); "
                           "the filter keeps everything.", g.mode, g.alpha, g.n_calibration,
                           g.n_required)

    # ---------------------------------------------------------------- apply
    def _cut(self, items: Sequence[dict[str, Any]]) -> Pieces:
        """The pieces this filter scores for ``items`` (:func:`ragsieve.pieces.cut`)."""
        return cut(items, unit=self.unit, max_chars=self.max_chars,
                   reads_text=self.scorer.reads_text)

    def piece_texts(self, snippets: Sequence[SnippetLike]) -> list[str]:
        """The texts a :meth:`filter` call hands its scorer for ``snippets`` (no scoring).

        A snippet longer than ``max_chars`` counts as its pieces. Unit ``"sentence"``: every
        snippet's sentences (a sentence longer than ``max_chars`` as its pieces), then each
        snippet once more, whole, as its sentences' context (the sentence-in-context score
        reads it). So these texts are the model work a ``filter`` call may cause (the
        service's budget counts their characters); snippets without text (an outside
        score) are left out.

        Examples
        --------
        >>> flt = ConformalFilter("embedding", alpha=0.2)
        >>> len(flt.piece_texts(["short", "Long sentence here. " * 100]))  # 1 + 7 pieces
        8
        >>> sentences = ConformalFilter("embedding", alpha=0.2, unit="sentence")
        >>> # 2 sentences, 2 pieces of the 1,000-character one, then each snippet whole
        >>> [len(t) for t in sentences.piece_texts(["One. Two.", "x" * 1000])]
        [4, 4, 500, 500, 9, 1000]
        """
        return model_texts(self._cut(as_items(snippets)), self.unit)

    def _apply(self, query: str, scores: Any, pieces: Pieces, group: Any,
               root: np.ndarray | None = None, check: ListCheck | None = None) -> FilterResult:
        """Apply the calibrated rule to the pieces' scores (:func:`ragsieve.keeping.apply_rule`).

        ``root``: the pieces' root scores, for the list check; ``check``: the list check
        made already (a batch checks its lists in a random order)."""
        self._check_calibrated()
        return apply_rule(
            self.calibrator, scores, pieces, query=query, unit=self.unit,
            min_keep=self.min_keep, max_chars=self.max_chars, group_by=self.group_by,
            group=group, see=lambda: see_list(self.list_watch, pieces, root) if check is None
            else check)

    def _root_scores(self, query: str, pieces: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
        """The pieces' root scores for the list check (the root of a fused score is its
        ``1 - cos``, whose embeddings scoring has just cached), or None when not wanted."""
        if not wants_root(self.list_watch) or not pieces:
            return None
        return self.scorer.root_scorer().score_items(query, pieces)

    def filter(self, query: str, snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Score one query's snippets and keep what the calibrated mode keeps.

        Parameters
        ----------
        query : str
            The query.
        snippets : sequence
            Each a ``str``, ``Snippet``, ``Pair`` or mapping (see the module docstring).
        group : optional
            ``group`` mode: the group of snippets that carry none of their own.

        Returns
        -------
        FilterResult
            Kept snippets in input order, all scores, tau and a note for unusual results.

        Raises
        ------
        TypeError
            ``snippets`` is one snippet (a ``str``, bytes, a mapping, a ``Snippet``) instead
            of a sequence of them, or holds a form not accepted.
        DataError
            A snippet lacks what the score or the mode needs (text, outside score, group).
        """
        check_str(query, "query")
        self._check_calibrated()  # fail before scoring
        pieces = self._cut(as_items(snippets))
        scores = self.scorer.score_items(query, pieces.pieces) if pieces.pieces else np.zeros(0)
        return self._apply(query, scores, pieces, group, self._root_scores(query, pieces.pieces))

    def filter_scores(self, query: str, scores: Any, snippets: Sequence[SnippetLike], *,
                      group: Any = None, root_scores: Any = None) -> FilterResult:
        """Apply the calibrated rule to precomputed scores of this filter's score (no scoring).

        Parameters
        ----------
        root_scores : array-like, optional
            Each snippet's root score (e.g. the stored ``1 - cos`` of an index's hits under
            a fused score of it), for the list check (:attr:`list_watch`); without them the
            check reads the list's length alone.

        Raises
        ------
        TypeError
            A filter of unit ``"sentence"``: it scores each snippet's sentences, so one
            score per snippet cannot be filtered (use :meth:`filter`).
        """
        self._check_snippet_unit("one precomputed score per snippet")
        items = as_items(snippets)
        root = None if root_scores is None else check_scores(root_scores, name="root_scores")
        return self._apply(query, scores, Pieces.whole(items), group, root)

    def _check_snippet_unit(self, what: str) -> None:
        if self.unit != "snippet":
            raise TypeError(f"this filter's unit is {self.unit!r}: it scores each snippet's "
                            f"sentences, so it cannot filter from {what}; call filter() with "
                            "the snippets' texts.")

    def filter_vectors(self, query: str, query_vector: Any, snippet_vectors: Any,
                       snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Filter with the caller's own embeddings: a dot product, no model call.

        For filters on the embedding score (``1 - cos``) and the relative / fused scores
        built on it. The vectors must come from the filter's embedding model
        (``scorer.spec()``); they are normalised here.

        Raises
        ------
        TypeError
            The filter's score cannot be computed from vectors (an LLM, an outside score),
            or its unit is ``"sentence"`` (it scores sentences, the vectors are snippets').
        ValueError
            Vectors that are not finite, zero, or of mismatched dimension or count.
        """
        self._check_calibrated()
        self._check_snippet_unit("the snippets' vectors")
        items = as_items(snippets)
        sv = np.asarray(snippet_vectors, dtype=float) if len(items) else np.zeros((0, 1))
        if sv.ndim != 2 or sv.shape[0] != len(items):
            raise ValueError(f"got snippet_vectors of shape {sv.shape} for {len(items)} snippets; "
                             "expected one vector per snippet.")
        scores = self.scorer.scores_from_vectors(query_vector, sv) if items else np.zeros(0)
        root = (self.scorer.root_scorer().scores_from_vectors(query_vector, sv)
                if items and wants_root(self.list_watch) else None)
        return self._apply(query, scores, Pieces.whole(items), group, root)

    def filter_pairs(self, pairs: Sequence[Pair], *, progress: bool = False,
                     seed: int = 0) -> dict[str, FilterResult]:
        """Filter many queries at once (batched scoring), keyed by query_id.

        A group-mode filter reads each pair's group from ``Pair.meta[group_by]``. The list
        check (:attr:`list_watch`) sees the batch's lists in a random order (``seed``), so
        a file sorted by topic is compared with the calibration lists as a sample, not as
        a stream of one topic after another; when its sequential test fires on the batch,
        every result of the batch is flagged.
        """
        self._check_calibrated()
        batch = cut_pairs(pairs, unit=self.unit, max_chars=self.max_chars,
                          reads_text=self.scorer.reads_text)
        scores = self.scorer.score_pairs(batch.pairs, progress=progress)
        roots = (self.scorer.root_scorer().score_pairs(batch.pairs)
                 if wants_root(self.list_watch) and batch.pairs else None)
        checks = see_lists(self.list_watch, batch.cuts, batch.offsets, roots, seed)
        return {qid: self._apply(batch.queries[qid], scores[batch.rows(qid)], pieces, None,
                                 check=checks[qid]) for qid, pieces in batch.cuts.items()}

    # ------------------------------------------------------------- artifact
    def to_artifact(self) -> Artifact:
        """The calibrated filter as a sealed :class:`~ragsieve.artifact.Artifact`."""
        block = CalibrationBlock.of(self.calibrator, group_by=self.group_by,
                                    guarantee=self.guarantee())
        return Artifact.create(scorer=self.scorer.spec(), calibration=block,
                               policy={"min_keep": self.min_keep, "max_chars": self.max_chars,
                                       "unit": self.unit},
                               data=dict(self.calibration_info), monitor=self.monitor_reference,
                               lists=None if self.lists is None else self.lists.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON artifact (format version 2) as a dict (see :meth:`to_artifact`)."""
        return self.to_artifact().to_dict()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the calibrated filter as a JSON artifact (atomically)."""
        return self.to_artifact().write(path)

    @classmethod
    def from_artifact(
        cls,
        artifact: Artifact,
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Build the filter an :class:`~ragsieve.artifact.Artifact` stores (see :meth:`load`).

        Raises
        ------
        TypeError
            ``artifact`` is not an ``Artifact`` (a dict goes through :meth:`from_dict`).
        ArtifactError, ScorerMismatchError
            As for :meth:`load`.
        """
        if not isinstance(artifact, Artifact):
            raise TypeError(f"artifact is a {type(artifact).__name__}, expected a "
                            "ragsieve.artifact.Artifact (ConformalFilter.from_dict takes a dict).")
        min_keep = artifact.min_keep
        calibrator = artifact.calibrator()
        group_by = artifact.group_by
        scorer = _scorer_of(dict(artifact.scorer), scorer, scorer_options)
        try:
            flt = cls(scorer, calibrator, min_keep=min_keep, group_by=group_by,
                      max_chars=artifact.max_chars, unit=artifact.unit)
        except ValueError as exc:
            raise ArtifactError(f"artifact policy: {exc}") from exc
        flt.calibration_info = dict(artifact.data or {})
        flt.monitor_reference = artifact.monitor_reference()
        flt.lists = artifact.list_record()
        flt.watch_lists()
        return flt

    @classmethod
    def from_dict(
        cls,
        payload: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Rebuild a filter from an artifact dict, checked as a file is checked (every
        field, the seal: :meth:`Artifact.from_dict <ragsieve.artifact.Artifact.from_dict>`);
        see :meth:`load`."""
        return cls.from_artifact(Artifact.from_dict(payload), scorer=scorer,
                                 scorer_options=scorer_options)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Load a saved filter.

        Parameters
        ----------
        path : path-like
            JSON artifact written by :meth:`save`.
        scorer : Scorer, optional
            Scorer to use; must have the same ``spec()`` as the artifact's, otherwise
            ``ScorerMismatchError``. When None the scorer is rebuilt from the artifact.
        scorer_options : Mapping, optional
            Extra keyword arguments for rebuilding the scorer that do not change its
            scores (e.g. ``{"cache_dir": ...}`` for the embedding scorer).

        Raises
        ------
        ArtifactError
            Unreadable, too large, non-JSON or malformed file, a field of the wrong type,
            an unknown format version, a broken seal, or a threshold that disagrees with
            the stored calibration state (see :meth:`Artifact.read <ragsieve.artifact.Artifact.read>`).
        ScorerMismatchError
            The supplied scorer differs from the one the threshold was calibrated with.
        """
        return cls.from_artifact(Artifact.read(path), scorer=scorer,
                                 scorer_options=scorer_options)

    def __repr__(self) -> str:
        tau = getattr(self.calibrator, "threshold_", None)
        unit = "" if self.unit == "snippet" else f", unit={self.unit!r}"
        return (f"ConformalFilter(scorer={self.scorer.spec()!r}, mode={self.mode!r}, "
                f"alpha={self.alpha}, threshold={tau}{unit})")
