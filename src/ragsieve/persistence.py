"""The filter as an artifact and back: what ``ConformalFilter.to_artifact`` writes and
``ConformalFilter.from_artifact`` reads.

:mod:`ragsieve.artifact` is the file (one reader, one writer, the seal, the calibration
block); this module maps a filter's parts onto it: :func:`artifact_of` seals the scorer
spec, the calibration block (:class:`~ragsieve.artifact.CalibrationBlock`, each value once),
the policy, the data's provenance, the monitor reference, the calibration lists and the
learned weights the score names (a fine-tuned reader's);
:func:`parts_of` checks an artifact and hands back what a filter is built from, with the
scorer rebuilt from its spec or the caller's own scorer checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from .artifact import Artifact, CalibrationBlock
from .calibration import BaseCalibrator
from .calibration.p_values import EvidenceScores
from .errors import ArtifactError, ScorerError, ScorerMismatchError
from .fitting import CalibrationInfo
from .keep_policy import KeepPolicy
from .lists import ListRecord
from .scoring import Scorer, resolve_scorer
from .scoring.weights import register_weights

__all__ = ["CalibratedFilter", "FilterParts", "SavedFilter", "artifact_of", "parts_of",
           "scorer_of"]


@dataclass(frozen=True)
class FilterParts:
    """What a filter is built from, read from a checked artifact.

    Attributes
    ----------
    scorer : Scorer
        The score the threshold was calibrated on.
    calibrator : BaseCalibrator
        The fitted calibrator.
    policy : KeepPolicy
        The filter's keep policy, checked against the scorer.
    info : CalibrationInfo
        The calibration data's provenance (``calibration_info``).
    monitor : dict or None
        The exchangeability monitor's reference.
    lists : ListRecord or None
        The calibration lists' record.
    evidence : EvidenceScores or None
        The relevant calibration scores behind the p-values (None: an artifact of another
        mode than marginal written before they were stored).
    """

    scorer: Scorer
    calibrator: BaseCalibrator
    policy: KeepPolicy
    info: CalibrationInfo
    monitor: dict[str, Any] | None
    lists: ListRecord | None
    evidence: EvidenceScores | None = None


class CalibratedFilter(Protocol):
    """What :func:`artifact_of` reads of a calibrated filter (``ConformalFilter``'s
    attributes: the score, calibrator and keep policy in force)."""

    scorer_: Scorer
    calibrator_: BaseCalibrator
    calibration_info: CalibrationInfo
    monitor_reference: dict[str, Any] | None
    lists: ListRecord | None
    evidence: EvidenceScores | None

    @property
    def policy_(self) -> KeepPolicy: ...


def artifact_of(flt: CalibratedFilter) -> Artifact:
    """A calibrated filter as a sealed artifact (format version 3).

    Raises
    ------
    ArtifactError
        A budget with a custom tokenizer, or a block that is not plain JSON.
    """
    policy = flt.policy_
    return Artifact.create(
        scorer=flt.scorer_.spec(),
        calibration=CalibrationBlock.of(flt.calibrator_, group_by=policy.group_by),
        policy=policy.block(), data=flt.calibration_info.to_dict(),
        weights=flt.scorer_.learned_weights(), monitor=flt.monitor_reference,
        lists=None if flt.lists is None else flt.lists.to_dict(), evidence=_evidence_block(flt))


def _evidence_block(flt: CalibratedFilter) -> dict[str, Any] | None:
    """The ``"evidence"`` block: the filter's relevant calibration scores, unless the
    calibrator's own state holds them (the marginal mode) or there are none."""
    if flt.evidence is None or EvidenceScores.of_calibrator(flt.calibrator_) is not None:
        return None
    return flt.evidence.to_dict()


def parts_of(artifact: Artifact, *, scorer: Scorer | None = None,
             scorer_options: Mapping[str, Any] | None = None) -> FilterParts:
    """The checked parts of ``artifact``.

    Raises
    ------
    TypeError
        ``artifact`` is not an :class:`~ragsieve.artifact.Artifact`.
    ArtifactError
        A calibration block, monitor or lists block the artifact's readers refuse, or a
        scorer spec that cannot be rebuilt.
    ScorerMismatchError
        ``scorer`` is not the score the artifact was calibrated on.
    """
    if not isinstance(artifact, Artifact):
        raise TypeError(f"artifact is a {type(artifact).__name__}, expected a "
                        "ragsieve.artifact.Artifact (ConformalFilter.from_dict takes a dict).")
    policy = (artifact.min_keep, artifact.group_by, artifact.max_chars, artifact.unit)
    calibrator = artifact.calibrator()
    register_weights(artifact.weight_blobs())  # before the scorer that names them is rebuilt
    scorer = scorer_of(dict(artifact.scorer), scorer, scorer_options)
    try:
        checked = KeepPolicy.checked(*policy, sentence_in_context=scorer.tags.sentence_in_context)
    except ValueError as exc:
        raise ArtifactError(f"artifact policy: {exc}") from exc
    return FilterParts(scorer=scorer, calibrator=calibrator, policy=checked,
                       info=CalibrationInfo.from_dict(artifact.data or {}),
                       monitor=artifact.monitor_reference(), lists=artifact.list_record(),
                       evidence=(EvidenceScores.from_dict(artifact.evidence)
                                 if artifact.evidence is not None
                                 else EvidenceScores.of_calibrator(calibrator)))


def scorer_of(spec: dict[str, Any], scorer: Scorer | None,
              scorer_options: Mapping[str, Any] | None) -> Scorer:
    """The scorer an artifact's ``spec`` names: rebuilt (``scorer`` None) or the one given,
    checked to be that score (``ScorerMismatchError``)."""
    if scorer is None:
        try:
            scorer = resolve_scorer(spec, **dict(scorer_options or {}))
        except (TypeError, ValueError, ScorerError) as exc:  # ScorerError: weights missing
            if isinstance(exc, ArtifactError):
                raise
            raise ArtifactError(f"artifact scorer {_short(spec)} cannot be rebuilt: {exc}") from exc
    if scorer.spec() != spec:
        raise ScorerMismatchError(
            f"the artifact was calibrated with scorer {_short(spec)} but the supplied scorer "
            f"is {_short(scorer.spec())}; a threshold is only valid for the score it was calibrated on. "
            "Recalibrate with this scorer or load without passing one."
        )
    return scorer


def _short(spec: Any) -> str:
    """A spec for an error message: its repr, cut at 300 characters (a fused spec with
    boosted trees runs to pages)."""
    text = repr(spec)
    return text if len(text) <= 300 else text[:297] + "..."


class SavedFilter:
    """The forms of a saved filter, built on its ``to_artifact`` / ``from_artifact``
    (``ConformalFilter`` defines both): the artifact as a dict (:meth:`to_dict`,
    :meth:`from_dict`) and as a file (:meth:`save`, :meth:`load`)."""

    def to_artifact(self) -> Artifact:
        """The filter as a sealed artifact."""
        raise NotImplementedError

    @classmethod
    def from_artifact(cls, artifact: Artifact, *, scorer: Scorer | None = None,
                      scorer_options: Mapping[str, Any] | None = None) -> Self:
        """The filter an artifact stores."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The artifact (format version 3) as a dict."""
        return self.to_artifact().to_dict()

    def save(self, path: str | os.PathLike[str], *, sign_key: bytes | None = None) -> Path:
        """Write the calibrated filter as a JSON artifact (atomically); ``sign_key``: sign it
        with this secret (:meth:`Artifact.signed <ragsieve.artifact.Artifact.signed>`), so
        a reader given the key (``load(..., verify_key=)``, ``serve --verify-key-env``)
        accepts it."""
        artifact = self.to_artifact()
        return (artifact if sign_key is None else artifact.signed(sign_key)).write(path)

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any], *, scorer: Scorer | None = None,
                  scorer_options: Mapping[str, Any] | None = None) -> Self:
        """A filter from an artifact dict, checked as a file is (see :meth:`load`)."""
        return cls.from_artifact(Artifact.from_dict(payload), scorer=scorer,
                                 scorer_options=scorer_options)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, scorer: Scorer | None = None,
             scorer_options: Mapping[str, Any] | None = None,
             verify_key: bytes | None = None) -> Self:
        """Load a filter :meth:`save` wrote. ``scorer``: use this one (it must have the
        artifact's ``spec()``) instead of rebuilding it; ``scorer_options``: keyword
        arguments for the rebuild that do not change the scores (e.g. ``cache_dir``);
        ``verify_key``: require a signature made with this key (checked before anything
        is built).

        Raises ``ArtifactError`` for a file :meth:`Artifact.read
        <ragsieve.artifact.Artifact.read>` refuses (unsigned or wrongly signed when
        ``verify_key`` is given) or a state the mode refuses, and ``ScorerMismatchError``
        for a supplied scorer of another score.
        """
        return cls.from_artifact(Artifact.read(path, verify_key=verify_key), scorer=scorer,
                                 scorer_options=scorer_options)
