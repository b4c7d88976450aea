"""Fit the score on some topics, calibrate on the rest: the one step that ``calibrate``,
``evaluate`` and the answer evaluation share.

A score that learns (the fused score ``"best"``, the sentence-in-context score) is fitted
on a seeded share of the calibration topics (``Pair.group``) and the threshold is
calibrated on the other topics, so the score is fixed before the data it is calibrated on
is seen. The draw is :func:`~ragsieve.scoring.fusion.fusion_fit_mask`'s: ``calibrate(seed=s)``
fits what split 0 of ``evaluate(seed=s)`` fits.

- :func:`fit_split`: one split of ``evaluate`` (or of the answer evaluation): the fused
  score fitted on the features of a share of the split's calibration rows; the rows left
  to calibrate on.
- :func:`fit_and_calibrate`: what ``ConformalFilter.calibrate`` does with labelled pairs:
  resolve an ``"auto"`` score (:meth:`Scorer.resolve_for
  <ragsieve.scoring.Scorer.resolve_for>`), fit an unfitted one (:meth:`Scorer.fit_topics
  <ragsieve.scoring.Scorer.fit_topics>`), score the calibration share, fit the calibrator
  through :class:`~ragsieve.calibration.inputs.CalibrationInputs`, and record what the
  artifact keeps beside the calibrator (the data's provenance, the monitor's reference,
  the calibration lists).
- :class:`CalibrationInfo`: the calibration data's provenance (the artifact's ``data``
  block, ``ConformalFilter.calibration_info``), a typed record read as a mapping too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ._monitor_reference import calibration_reference
from .calibration import BaseCalibrator
from .calibration.inputs import CalibrationInputs
from .calibration.p_values import EvidenceScores
from .errors import CalibrationError, DataError
from .keep_policy import KeepPolicy
from .lists import ListRecord, lists_source, retriever_of
from .scoring import Scorer
from .scoring.auto import ScoreChoice, choose_languages
from .scoring.base import ScoreFit
from .scoring.fusion import FUSION_FIT_FRACTION, FusionFeatures, fit_fusion
from .scoring.sentence_context import SentenceContextScorer, with_parent_text
from .types import Pair, fingerprint_pairs
from .units import sentence_pairs

__all__ = ["Calibration", "CalibrationInfo", "CalibrationOptions", "check_labels",
           "fit_and_calibrate", "fit_split", "topics_shortfall"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- evaluate
def fit_split(features: np.ndarray | FusionFeatures, relevant: Any, topics: Any,
              rows: np.ndarray, *, seed: int, split: int,
              fraction: float = FUSION_FIT_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Fit the fused score on a random ``fraction`` of the topics of ``rows``; score every pair.

    The fit is :func:`~ragsieve.scoring.fusion.fit_fusion`, the one ``calibrate`` makes
    (split ``split`` of ``seed``), with the learner ``features`` names (a bare matrix:
    logistic regression); its text-fitted signals (the frozen-corpus BM25) take their
    statistics from the texts of the fit share alone.

    Returns
    -------
    scores : numpy.ndarray
        The fused score of every pair.
    calibration_rows : numpy.ndarray of int
        The rows of ``rows`` left for conformal calibration (not fitted on).
    """
    done = fit_fusion(features, relevant, topics, rows=rows, seed=seed, split=split,
                      fraction=fraction)
    return done.scores, rows[~done.fit]


# ----------------------------------------------------------------------------- calibrate
_INTS = ("n_pairs", "n_queries", "n_relevant", "n_groups", "n_snippet_pairs",
         "fusion_fit_pairs", "n_labels", "merged_calibration_scores")


@dataclass(frozen=True)
class CalibrationInfo(Mapping[str, Any]):
    """The calibration data's provenance: the artifact's ``data`` block, read as a record
    (``info.language``) or as the mapping it is stored as (``info["language"]``).

    A field that is None is not stored. :meth:`from_dict` keeps the keys it does not know
    (an artifact of a newer version) in ``extra``, so the block round-trips unchanged.

    Attributes
    ----------
    fingerprint : str, optional
        :func:`~ragsieve.types.fingerprint_pairs` of the calibration pairs.
    n_pairs, n_queries, n_relevant, n_groups : int, optional
        The calibration pairs (sentences, unit ``"sentence"``), their queries, the relevant
        ones and their topics.
    language, language_source, query_language : str, optional
        The snippets' language, how it was found, the queries' when it differs.
    score_choice : Mapping, optional
        Why ``"auto"`` chose the score (:class:`~ragsieve.scoring.auto.ScoreChoice`).
    fusion_fit_pairs : int, optional
        The pairs a score that learns was fitted on.
    n_snippet_pairs : int, optional
        Unit ``"sentence"``: the snippet pairs the sentences were cut from.
    source, n_labels, merged_calibration_scores, previous_checksum : optional
        A recalibration on served feedback (:mod:`ragsieve.server.recalibrate`).
    extra : Mapping
        The keys not known here, as read.
    """

    fingerprint: str | None = None
    n_pairs: int | None = None
    n_queries: int | None = None
    n_relevant: int | None = None
    n_groups: int | None = None
    language: str | None = None
    language_source: str | None = None
    query_language: str | None = None
    score_choice: Mapping[str, Any] | None = None
    fusion_fit_pairs: int | None = None
    n_snippet_pairs: int | None = None
    source: str | None = None
    n_labels: int | None = None
    merged_calibration_scores: int | None = None
    previous_checksum: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationInfo:
        """The record of a ``data`` block; a value of a known key but not of its type (or
        None) stays in ``extra`` as read."""
        known = {f.name for f in fields(cls)} - {"extra"}
        typed = {k: v for k, v in data.items() if k in known and _typed(k, v)}
        return cls(**typed, extra={k: v for k, v in data.items() if k not in typed})

    def to_dict(self) -> dict[str, Any]:
        """The ``data`` block: the fields that are set, then the keys of ``extra``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    def but(self, **changes: Any) -> CalibrationInfo:
        """This record with some fields changed (None: not stored)."""
        return replace(self, **changes)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


def _typed(key: str, value: Any) -> bool:
    """Whether ``value`` has the type of the field ``key``."""
    if key in _INTS:
        return isinstance(value, int) and not isinstance(value, bool)
    if key == "score_choice":
        return isinstance(value, Mapping)
    return isinstance(value, str)


@dataclass(frozen=True)
class CalibrationOptions:
    """How :func:`fit_and_calibrate` finds what it records beside the calibrator (the
    parameters of ``ConformalFilter.calibrate`` of the same names).

    Attributes
    ----------
    monitor : bool, optional
        Record the exchangeability monitor's reference (None: unless an LLM score).
    language : str, optional
        The calibration texts' language (None: detected).
    lists : {None, "auto", "retriever", "deployed", "data"} or Mapping
        Where the calibration lists come from (None: read from the pairs).
    """

    monitor: bool | None = None
    language: str | None = None
    lists: str | Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Calibration:
    """What :func:`fit_and_calibrate` gives: the fitted score and calibrator, and what the
    artifact keeps beside them.

    Attributes
    ----------
    scorer : Scorer
        The score calibrated (resolved and fitted where it had to be).
    calibrator : BaseCalibrator
        The calibrator given, fitted.
    info : CalibrationInfo
        The calibration data's provenance (the artifact's ``data`` block).
    monitor : dict or None
        The exchangeability monitor's reference block (None: not recorded).
    lists : ListRecord
        The calibration lists' record.
    evidence : EvidenceScores
        The relevant calibration scores the p-values are computed against (the
        calibrator's own when its state holds them: the marginal mode).
    """

    scorer: Scorer
    calibrator: BaseCalibrator
    info: CalibrationInfo
    monitor: dict[str, Any] | None
    lists: ListRecord
    evidence: EvidenceScores


def check_labels(pairs: Sequence[Pair]) -> None:
    """``DataError`` for an unlabelled calibration pair, ``CalibrationError`` for no relevant one."""
    unlabelled = [p for p in pairs if p.relevant is None]
    if unlabelled:
        raise DataError(
            f"{len(unlabelled)} calibration pair(s) have no relevance label (first: "
            f"query_id={unlabelled[0].query_id!r}, snippet_id={unlabelled[0].snippet_id!r}); "
            "calibration needs relevant = 0 or 1 on every pair."
        )
    if not any(p.relevant == 1 for p in pairs):
        raise CalibrationError(
            f"no relevant calibration snippet among {len(pairs)} pairs; "
            "need at least one pair with relevant == 1."
        )


def topics_shortfall(calibrator: BaseCalibrator, pairs: Sequence[Pair], *,
                     learns: bool = False) -> tuple[str, bool] | None:
    """What a topic mode will lack, said before calibrating: the topics with evidence
    ``pairs`` hold against :meth:`~ragsieve.calibration.BaseCalibrator.topics_needed`.

    Parameters
    ----------
    learns : bool
        The score is fitted on a share of the topics first (:data:`FUSION_FIT_FRACTION` of
        them), so only the rest calibrate.

    Returns
    -------
    (str, bool) or None
        The message and whether the data as a whole holds too few (True) or only the
        calibration share left by a learning score does (False); None when there are enough
        or the mode's units are not topics.
    """
    needed = calibrator.topics_needed()
    if needed is None:
        return None
    k, why = needed
    have = len({p.group for p in pairs if p.relevant == 1})
    if have < k:
        return ((f"{why}; the data holds {have} (the pairs' group field): with so few the "
                 "filter would keep everything. Give more topics, a larger alpha (or delta), "
                 "or the marginal mode (its units are snippets)"), True)
    left = have - max(1, round(have * FUSION_FIT_FRACTION))
    if learns and left < k:
        return ((f"{why}; the data holds {have}, but the score learns on a quarter of them "
                 f"and calibrates on about {left}: the filter may keep everything (a score "
                 "that does not learn, e.g. --scorer embedding, calibrates on all of them)"),
                False)
    return None


def fit_and_calibrate(scorer: Scorer, calibrator: BaseCalibrator, pairs: Sequence[Pair], *,
                      policy: KeepPolicy | None = None, seed: int = 0, progress: bool = False,
                      options: CalibrationOptions | None = None) -> Calibration:
    """Resolve and fit the score, fit ``calibrator`` (in place) on the calibration share.

    The steps and parameters of :meth:`ragsieve.filter.ConformalFilter.calibrate`, which
    documents them; ``policy`` is the filter's (its ``unit``, ``max_chars`` and
    ``group_by``; None: the default policy), ``options`` its calibrate's ``monitor``,
    ``language`` and ``lists``.

    Raises
    ------
    DataError
        A pair is unlabelled (or, unit ``"sentence"``, a relevant snippet has no evidence).
    CalibrationError
        No relevant pair, or none left in the calibration share.
    ValueError
        The ``group`` mode without ``group_by``.
    """
    policy, options = policy or KeepPolicy(), options or CalibrationOptions()
    unit, group_by, monitor = policy.unit, policy.group_by, options.monitor
    pairs = snippets = list(pairs)
    check_labels(pairs)
    if unit == "sentence":
        pairs = with_parent_text(sentence_pairs(snippets, max_chars=policy.max_chars), snippets)
        check_labels(pairs)
    if calibrator.group_kind == "attribute" and group_by is None:
        raise ValueError(
            "mode 'group' needs group_by: the Pair.meta field holding each snippet's group "
            "(e.g. group_by='language'; CLI --group-by FIELD)."
        )
    short = topics_shortfall(calibrator, snippets, learns=not scorer.is_fitted)
    if short is not None:
        logger.warning("%s", short[0])
    source = lists_source(options.lists, retriever_of(snippets))
    chosen = scorer.tags.resolved_at_calibration
    if chosen:
        scorer, info = scorer.resolve_for(snippets, language=options.language, seed=seed,
                                          deployed_lists=source["kind"] != "data")
    else:
        info = choose_languages(snippets, options.language, fallback=None).info()
    fitted = _fit(scorer, pairs, snippets, unit=unit, seed=seed, progress=progress,
                  info=info, fallback=chosen)
    scorer, pairs = fitted.scorer, fitted.pairs
    used, scores = _calibration_scores(scorer, calibrator, pairs, fitted.scores, progress)
    if monitor is None:
        monitor = used is pairs or not scorer.tags.costly
        if not monitor:
            logger.info("no exchangeability monitor reference: it would send the %d "
                        "irrelevant calibration pairs to the LLM score (calibrate(..., "
                        "monitor=True) records it)", len(pairs) - len(used))
    reference = calibration_reference(
        pairs, used, scores, lambda rest: scorer.score_pairs(rest, progress=progress),
        seed=seed) if monitor else None
    attribute = group_by if calibrator.group_kind == "attribute" else None
    CalibrationInputs.from_pairs(used, group_by=attribute).fit(calibrator, scores)
    _warn_if_short(calibrator)
    info = {"fingerprint": fingerprint_pairs(pairs), "n_pairs": len(pairs),
            "n_queries": len({p.query_id for p in pairs}),
            "n_relevant": sum(p.relevant == 1 for p in pairs),
            "n_groups": len({p.group for p in pairs}), **info}
    if unit == "sentence":
        info["n_snippet_pairs"] = len(snippets)
    record = _record_lists(scorer, unit, snippets, source, seed, progress)
    evidence = EvidenceScores.of_calibrator(calibrator) or EvidenceScores.of(
        scores, [p.relevant == 1 for p in used], seed=seed)
    return Calibration(scorer, calibrator, CalibrationInfo.from_dict(info), reference, record,
                       evidence)


def _fit(scorer: Scorer, pairs: list[Pair], snippets: list[Pair], *, unit: str, seed: int,
         progress: bool, info: dict[str, Any], fallback: bool) -> ScoreFit:
    """Fit an unfitted score on a seeded share of the topics (a fitted one: every pair
    calibrates). Unit ``"sentence"``: the score of sentences in their snippets, each
    unfitted stage fitted on the same share, then their combination. ``fallback``: the
    score was chosen by ``"auto"``, so a fused stage that cannot be fitted becomes
    ``1 - cos``; ``info`` records the fit (and the fallback)."""
    if scorer.is_fitted:
        return ScoreFit(scorer, pairs)

    def fit_stage(stage: Scorer, stage_pairs: list[Pair]) -> ScoreFit:
        try:
            done = stage.fit_topics(stage_pairs, seed=seed, progress=progress)
        except CalibrationError as exc:
            if not fallback:
                raise
            choice = ScoreChoice("embedding", f"the fused score could not be fitted ({exc})")
            logger.warning("score: 1 - cos (embedding), not the fused score: %s", choice.reason)
            info["score_choice"] = choice.to_dict()
            return ScoreFit(stage.root_scorer(), stage_pairs)
        logger.info("%s score fitted on %d pairs of some topics; calibrating on the other %d",
                    stage.name, done.n_fit, len(done.pairs))
        info["fusion_fit_pairs"] = done.n_fit
        if not any(p.relevant == 1 for p in done.pairs):
            raise CalibrationError("the calibration share of the topics has no relevant pair.")
        return done

    if unit != "sentence":
        return fit_stage(scorer, pairs)
    context = scorer if scorer.tags.sentence_in_context else SentenceContextScorer(scorer)
    return context.fit_topics(pairs, seed=seed, progress=progress, snippets=snippets,
                              fit_stage=fit_stage)


def _calibration_scores(scorer: Scorer, calibrator: BaseCalibrator, pairs: list[Pair],
                        fitted: np.ndarray | None, progress: bool,
                        ) -> tuple[list[Pair], np.ndarray]:
    """The pairs the calibrator learns from and their scores.

    Every pair in its query's whole list for a list-dependent score or a mode that uses
    the irrelevant pairs; else the relevant pairs alone (the threshold depends on them
    only). ``fitted``: the scores the fit gave every pair.
    """
    if fitted is not None:
        return pairs, fitted
    if scorer.tags.list_dependent or calibrator.uses_irrelevant:
        return pairs, scorer.score_pairs(pairs, progress=progress)
    used = [p for p in pairs if p.relevant == 1]
    return used, scorer.score_pairs(used, progress=progress)


def _warn_if_short(calibrator: BaseCalibrator) -> None:
    """Log when the calibration data is too small for the mode's alpha (it keeps all)."""
    g = calibrator.guarantee()
    if g.infinite:
        logger.warning("%s: the calibration data is too small for alpha=%s (has %d, needs %s); "
                       "the filter keeps everything.", g.mode, g.alpha, g.n_calibration,
                       g.n_required)


def _record_lists(scorer: Scorer, unit: str, snippets: list[Pair], source: Mapping[str, Any],
                  seed: int, progress: bool) -> ListRecord:
    """The calibration lists' record: their source, lengths and, for a list-aware score
    of a snippet's own root score, its best and mean per list."""
    root = scorer.root_scorer()
    scored = scorer.tags.list_dependent and unit == "snippet" and not root.tags.costly
    return ListRecord.from_lists(
        [p.query_id for p in snippets],
        root.score_pairs(snippets, progress=progress) if scored else None,
        source=source, list_dependent=scorer.tags.list_dependent,
        score=root.keep_rule(0.0).score if scored else None,
        topics=[p.group for p in snippets], seed=seed)
