"""The saved filter: one typed :class:`Artifact`, one reader, one writer, one identity.

An artifact is JSON format version 3: the scorer spec, the calibration block (mode,
params, learned state, group field: :class:`CalibrationBlock`, each value stored once), the policy, the provenance
of the calibration data, (by default) the ``"monitor"`` block the exchangeability
monitor (:mod:`ragsieve.monitoring`) ranks served requests against, and the ``"lists"``
block (:mod:`ragsieve.lists`: where the calibration lists came from and what they looked
like, which every surface checks its lists against). A sha256 checksum seals the scorer,
calibration and policy blocks, and the monitor and lists blocks when there are. Version 1
artifacts (marginal only, no monitor, no seal) and version 2 artifacts (whose calibration
block also held copies of alpha, the threshold, the count and the guarantee, checked
against the state on load) still read.

The seal is a sha256 anyone can recompute, so an artifact edited and sealed again passes
it: the reader is the strict JSON reader of request bodies
(:func:`ragsieve._validation.loads_json`), and every count an artifact states is bounded
before anything is allocated from it (the lists, the calibration states, the monitor
reference, the evidence, the ``data`` counts). What tells an artifact you made from one
anyone resealed is the optional ``"signature"``: an HMAC-SHA256 with a secret key of what
the seal hashes (:meth:`Artifact.signed`, :meth:`Artifact.verify`, ``verify_key=`` of the
readers).

Every reader goes through :meth:`Artifact.read` (a file, size-capped),
:meth:`Artifact.parse` (text) or :meth:`Artifact.from_dict` (a dict already in memory):
each type-checks every top-level field and verifies the seal. :meth:`Artifact.write`
writes atomically; :attr:`Artifact.identity` names the artifact (the service's
generations, monitor stores and feedback rows, a resumable filter job).

Examples
--------
>>> art = Artifact.create(scorer={"scorer": "field", "field": "score"},
...                       calibration={"mode": "marginal"}, policy={"min_keep": 0},
...                       data={}, created="2025-01-31T12:00:00+00:00")
>>> Artifact.parse(art.to_json(), "memory") == art
True
>>> art.identity == art.seal["value"]
True
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime as _dt
import hashlib
import hmac
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._io import atomic_write_text
from ._monitor_reference import read_monitor_block
from ._validation import MAX_COUNT, check_int, loads_json
from ._version import __version__
from .calibration import BaseCalibrator, SplitConformalCalibrator, calibrator_from_state
from .calibration.p_values import EvidenceScores
from .errors import ArtifactError, ArtifactTooLargeError
from .lists import MAX_LISTS, ListRecord
from .units import UNITS

__all__ = [
    "ARTIFACT_FORMAT", "ARTIFACT_VERSION", "CALIBRATION_KEYS", "CHECKSUM_COVERS", "FIELDS",
    "MAX_ARTIFACT_BYTES", "MIN_KEY_CHARS", "READABLE_VERSIONS", "SIGNATURE_ALGORITHM", "Artifact",
    "CalibrationBlock", "check_fields", "check_seal", "check_signature", "covers", "key_from_env",
    "read_text", "seal_value", "sign_value",
]

ARTIFACT_FORMAT = "ragsieve.filter"
ARTIFACT_VERSION = 3
#: the optional blocks :meth:`Artifact.create` takes by name (besides ``weights``)
_OPTIONAL_BLOCKS = ("monitor", "lists", "evidence")
#: The format versions this ragsieve reads.
READABLE_VERSIONS = (1, 2, ARTIFACT_VERSION)
#: Largest artifact file read (bigger ones are refused before parsing).
MAX_ARTIFACT_BYTES = 64 * 2**20
#: Artifact blocks sealed by the sha256 checksum (and ``"monitor"``, ``"lists"`` when present).
CHECKSUM_COVERS = ("scorer", "calibration", "policy")
#: The top-level fields of an artifact (version 1 has no monitor, lists, checksum or
#: signature).
FIELDS = ("format", "format_version", "library_version", "created", "scorer", "calibration",
          "policy", "data", "monitor", "lists", "weights", "evidence", "checksum", "signature")
#: The algorithm of the optional ``"signature"``: HMAC-SHA256 with a secret key over the
#: text the seal hashes (:func:`sign_value`).
SIGNATURE_ALGORITHM = "hmac-sha256"
#: Shortest signing key accepted (characters of the environment variable's value).
MIN_KEY_CHARS = 16
#: The provenance counts of the ``data`` block, range-checked on read.
DATA_COUNTS = ("n_pairs", "n_queries", "n_relevant", "n_groups", "n_snippet_pairs")
#: Optional sealed blocks: the monitor's reference, the calibration lists' record, the
#: learned weights a score names by sha256 (base64 of their bytes; a fine-tuned reader's),
#: the relevant calibration scores the p-values are computed against (modes other than
#: marginal, whose calibration block holds them already).
OPTIONAL_SEALED = ("monitor", "lists", "weights", "evidence")


# ----------------------------------------------------------------------------- the calibration
#: The keys of a version 3 calibration block: every value stored once.
CALIBRATION_KEYS = ("mode", "params", "state", "group_by")


@dataclass(frozen=True)
class CalibrationBlock:
    """The artifact's calibration block as one typed value: the fitted calibrator's mode,
    parameters and learned state, and the ``group`` mode's field.

    Every value is stored once (format version 3): the miscoverage is a parameter
    (``params["alpha"]``), the threshold and the number of calibration units are learned
    state (``state["threshold"]``, ``null`` for an infinite one, and
    ``state["n_calibration"]``); what the filter promises is computed from them when the
    artifact is loaded (:meth:`calibrator`, then ``guarantee()``). :meth:`read` also reads
    the layouts of versions 1 and 2, whose copies (alpha, threshold,
    ``threshold_is_infinite``, ``n_calibration``, the guarantee) it checks against the state
    and then drops.

    Attributes
    ----------
    mode : str
        The guarantee mode.
    params : dict
        The calibrator's parameters (``get_params``).
    state : dict
        Its learned state (``to_state``).
    group_by : str or None
        The ``group`` mode's field.
    """

    mode: str
    params: dict[str, Any]
    state: dict[str, Any]
    group_by: str | None = None

    @classmethod
    def of(cls, calibrator: BaseCalibrator, *, group_by: str | None = None) -> CalibrationBlock:
        """The block of a fitted calibrator.

        Raises
        ------
        ArtifactError
            A budget with a custom tokenizer (parameters are stored as JSON).
        """
        params = calibrator.get_params()
        if params.get("tokenizer") is not None:
            raise ArtifactError("a budget with a custom tokenizer cannot be saved; the artifact "
                                "stores parameters as JSON (use unit='tokens' without a tokenizer).")
        return cls(mode=calibrator.mode,
                   params={k: v for k, v in params.items() if k != "tokenizer"},
                   state=calibrator.to_state(), group_by=group_by)

    @classmethod
    def read(cls, block: Mapping[str, Any], *, version: int = 3) -> CalibrationBlock:
        """The block an artifact of format ``version`` stores.

        Raises
        ------
        ArtifactError
            A field that is missing or of the wrong type, a state the mode refuses, or (an
            older layout) a stored copy that disagrees with the state.
        """
        if version == 1:
            return cls.of(_version_1_calibrator(block))
        group_by = block.get("group_by")
        if group_by is not None and not isinstance(group_by, str):
            raise ArtifactError(f"artifact group_by == {group_by!r}, expected a field name or null.")
        out = cls(mode=block.get("mode"), params=block.get("params"),  # type: ignore[arg-type]
                  state=block.get("state"), group_by=group_by)  # type: ignore[arg-type]
        if version == 2:
            _check_copies(block, out.calibrator())
        return out

    def calibrator(self) -> BaseCalibrator:
        """The fitted calibrator (its threshold, alpha and guarantee come from here).

        Raises
        ------
        ArtifactError
            Unknown mode, or params / state the mode refuses.
        """
        return calibrator_from_state(self.mode, self.params, self.state)

    def to_dict(self) -> dict[str, Any]:
        """The stored layout (format version 3)."""
        return {"mode": self.mode, "params": dict(self.params), "state": dict(self.state),
                "group_by": self.group_by}


def _check_copies(block: Mapping[str, Any], fitted: BaseCalibrator) -> None:
    """A version 2 block's copies of the threshold, alpha and count against its state."""
    for name, stored, learned in (
            ("threshold", _stored_threshold(block), float(fitted.threshold_)),
            ("alpha", block.get("alpha"), fitted.miscoverage()),
            ("n_calibration", block.get("n_calibration"), fitted.n_calibration_)):  # type: ignore[attr-defined]
        if stored != learned:
            raise ArtifactError(
                f"artifact {name} {stored!r} disagrees with its calibration state "
                f"({learned!r}); the artifact was edited or corrupted: recalibrate.")


def _version_1_calibrator(block: Mapping[str, Any]) -> BaseCalibrator:
    """The marginal calibrator of a version 1 block (alpha, threshold, n_calibration)."""
    try:
        return SplitConformalCalibrator.from_threshold(
            alpha=block["alpha"], threshold=_stored_threshold(block),
            n_calibration=block["n_calibration"])
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise ArtifactError("malformed filter artifact: missing or invalid field "
                            f"({exc!r}).") from exc


def _check_calibration_keys(block: Mapping[str, Any]) -> None:
    """A version 3 calibration block holds only :data:`CALIBRATION_KEYS` (an old copy such
    as ``threshold`` or ``alpha`` next to the state is refused: it could disagree)."""
    unknown = sorted(set(block) - set(CALIBRATION_KEYS))
    if unknown:
        raise ArtifactError(f"artifact calibration has unknown field(s) {unknown}; format "
                            f"version {ARTIFACT_VERSION} stores only {list(CALIBRATION_KEYS)} "
                            "(each value once).")


# ----------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Artifact:
    """A checked filter artifact (build one with :meth:`read`, :meth:`parse`,
    :meth:`from_dict` or :meth:`create`; every one is type-checked and sealed).

    Attributes
    ----------
    format_version : int
        1, 2 or 3 (what this ragsieve writes).
    scorer : dict
        The scorer spec (``{"scorer": name, ...}``).
    calibration : dict
        The calibration block as stored (:meth:`calibration_block` reads it).
    policy : dict or None
        ``min_keep``, ``max_chars`` and ``unit`` (None: not stored; a missing ``unit`` is
        ``"snippet"``).
    data : dict or None
        Provenance of the calibration data (language, counts, notes; None: not stored).
    monitor : dict or None
        The exchangeability monitor's reference block, as stored.
    lists : dict or None
        The calibration lists' record (:class:`ragsieve.lists.ListRecord`: where they came
        from, their lengths and list-level statistics), as stored; None for artifacts
        written before it existed.
    weights : dict or None
        Learned weights the scorer names by sha256, as base64 strings (a fine-tuned
        reader's); None when the score has none.
    evidence : dict or None
        The relevant calibration scores behind each snippet's p-value
        (:class:`ragsieve.calibration.p_values.EvidenceScores`); None for the marginal mode
        (its calibration state holds them) and for artifacts written before it existed.
    seal : dict or None
        The ``"checksum"`` block (``algorithm``, ``covers``, ``value``); None for version 1.
    signature : dict or None
        The ``"signature"`` (``algorithm`` ``"hmac-sha256"``, ``value``): an HMAC of the
        sealed blocks with a secret key (:meth:`signed`, :meth:`verify`); None: unsigned.
    library_version : str or None
        The ragsieve that wrote it.
    created : str or None
        ISO-8601 date-time of writing.

    The blocks are copies owned by the record: treat them as read-only (:meth:`to_dict`
    hands out fresh copies).
    """

    format_version: int
    scorer: dict[str, Any]
    calibration: dict[str, Any]
    policy: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    monitor: dict[str, Any] | None = None
    lists: dict[str, Any] | None = None
    weights: dict[str, str] | None = None
    evidence: dict[str, Any] | None = None
    seal: dict[str, Any] | None = None
    signature: dict[str, Any] | None = None
    library_version: str | None = None
    created: str | None = None

    def __hash__(self) -> int:
        return hash(self.identity)

    # -------------------------------------------------------------------- readers
    @classmethod
    def read(cls, path: str | os.PathLike[str], *, max_bytes: int = MAX_ARTIFACT_BYTES,
             verify_key: bytes | None = None) -> Artifact:
        """Read an artifact file: size cap, UTF-8, strict JSON, every field, the seal.

        Parameters
        ----------
        path : path-like
            The JSON artifact.
        max_bytes : int, default=64 MiB
            Larger files are refused before they are read (:func:`read_text`).
        verify_key : bytes, optional
            Require a signature made with this key (:meth:`verify`).

        Raises
        ------
        ArtifactError
            The file cannot be read, is too large (``ArtifactTooLargeError``), is not UTF-8
            or JSON, or :meth:`parse` refuses it (an unsigned or wrongly signed artifact
            when ``verify_key`` is given).
        """
        return cls.parse(read_text(path, max_bytes=max_bytes), os.fspath(path),
                         verify_key=verify_key)

    @classmethod
    def parse(cls, text: str, source: str, *, verify_key: bytes | None = None) -> Artifact:
        """Parse an artifact's text, type-check every field and verify its seal.

        Parameters
        ----------
        text : str
            The artifact's JSON text.
        source : str
            Where it came from (a path), for the error messages.
        verify_key : bytes, optional
            Require a signature made with this key (:meth:`verify`).

        Raises
        ------
        ArtifactError
            Not strict JSON (the reader of request bodies and data lines,
            :func:`ragsieve._validation.loads_json`: NaN / Infinity, a duplicate key, nesting
            beyond 64 levels, a number beyond a double and a lone surrogate are refused), not
            an object, a field :func:`check_fields` refuses, or (``verify_key``) no valid
            signature; one line naming ``source``.
        """
        try:
            payload = loads_json(text, "artifact")
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"filter artifact {source!r} is not valid JSON: {exc.msg} at line "
                                f"{exc.lineno} column {exc.colno}.") from None
        except ValueError as exc:  # a duplicate key, NaN, too deep, a number beyond a double
            raise ArtifactError(f"filter artifact {source!r} is not strict JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise ArtifactError(f"filter artifact {source!r} holds a JSON "
                                f"{type(payload).__name__}, expected an object.")
        artifact = cls.from_dict(payload, source=source)
        if verify_key is not None:
            try:
                artifact.verify(verify_key)
            except ArtifactError as exc:
                raise ArtifactError(f"filter artifact {source!r}: {exc}") from None
        return artifact

    @classmethod
    def from_dict(cls, payload: Any, *, source: str | None = None) -> Artifact:
        """An artifact from a dict already in memory, checked as :meth:`parse` checks text.

        Parameters
        ----------
        payload : Mapping
            The artifact as a dict (e.g. :meth:`to_dict` output); it is copied.
        source : str, optional
            Where it came from, prefixed to the error messages.

        Raises
        ------
        ArtifactError
            A field that is missing, unknown or of the wrong type, or a broken seal.
        """
        try:
            version = check_fields(payload)
        except ArtifactError as exc:
            if source is None:
                raise
            raise ArtifactError(f"filter artifact {source!r}: {exc}") from exc
        own = copy.deepcopy(dict(payload))
        return cls(format_version=version, scorer=dict(own["scorer"]),
                   calibration=dict(own["calibration"]), policy=own.get("policy"),
                   data=own.get("data"), monitor=own.get("monitor"), lists=own.get("lists"),
                   weights=own.get("weights"), evidence=own.get("evidence"),
                   seal=own.get("checksum"), signature=own.get("signature"),
                   library_version=own.get("library_version"), created=own.get("created"))

    @classmethod
    def create(cls, *, scorer: Mapping[str, Any], calibration: Mapping[str, Any] | CalibrationBlock,
               policy: Mapping[str, Any], data: Mapping[str, Any],
               weights: Mapping[str, bytes] | None = None, created: str | None = None,
               **blocks: Mapping[str, Any] | None) -> Artifact:
        """A new sealed version 3 artifact (what ``ConformalFilter.to_artifact`` writes).

        Parameters
        ----------
        scorer, calibration, policy, data : Mapping
            The blocks (plain JSON values; ``calibration`` may be a :class:`CalibrationBlock`).
        weights : Mapping of str to bytes, optional
            Learned weights by sha256 (:meth:`Scorer.learned_weights
            <ragsieve.scoring.Scorer.learned_weights>`), stored as base64.
        created : str, optional
            ISO-8601 date-time; default now (UTC, seconds).
        **blocks : Mapping, optional
            The optional blocks by name (None: not stored): ``monitor``, the monitor
            reference block; ``lists``, the calibration lists' record
            (:meth:`ragsieve.lists.ListRecord.to_dict`); ``evidence``, the ``"evidence"``
            block (:meth:`EvidenceScores.to_dict
            <ragsieve.calibration.p_values.EvidenceScores.to_dict>`).

        Raises
        ------
        TypeError
            A block of another name.
        ArtifactError
            A block that is not plain JSON, or a field :func:`check_fields` refuses.
        """
        unknown = sorted(set(blocks) - set(_OPTIONAL_BLOCKS))
        if unknown:
            raise TypeError(f"Artifact.create got unexpected block(s) {unknown}; the optional "
                            f"blocks are {list(_OPTIONAL_BLOCKS)}.")
        payload: dict[str, Any] = {
            "format": ARTIFACT_FORMAT, "format_version": ARTIFACT_VERSION,
            "library_version": __version__,
            "created": created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "scorer": dict(scorer), "policy": dict(policy),
            "calibration": calibration.to_dict() if isinstance(calibration, CalibrationBlock)
            else dict(calibration),
            "data": dict(data),
        }
        for name in ("monitor", "lists"):
            if blocks.get(name) is not None:
                payload[name] = dict(blocks[name] or {})
        if weights:
            payload["weights"] = {name: base64.b64encode(blob).decode("ascii")
                                  for name, blob in sorted(weights.items())}
        if blocks.get("evidence") is not None:
            payload["evidence"] = dict(blocks["evidence"] or {})
        # what decides which snippets are kept is sealed: an edit after `calibrate` is refused
        try:
            value = seal_value(payload)
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"artifact blocks are not plain JSON: {exc}") from exc
        payload["checksum"] = {"algorithm": "sha256", "covers": covers(payload), "value": value}
        return cls.from_dict(payload)

    # -------------------------------------------------------------------- writer
    def to_dict(self) -> dict[str, Any]:
        """The artifact as a JSON-ready dict (a fresh copy; fields not stored are absent)."""
        out: dict[str, Any] = {"format": ARTIFACT_FORMAT, "format_version": self.format_version}
        for key, value in (("library_version", self.library_version), ("created", self.created),
                           ("scorer", self.scorer), ("calibration", self.calibration),
                           ("policy", self.policy), ("data", self.data),
                           ("monitor", self.monitor), ("lists", self.lists),
                           ("weights", self.weights), ("evidence", self.evidence),
                           ("checksum", self.seal), ("signature", self.signature)):
            if value is not None:
                out[key] = copy.deepcopy(value)
        return out

    def to_json(self) -> str:
        """The artifact's text as :meth:`write` writes it (strict JSON, sorted keys)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the artifact atomically (a reader never sees half a file); return the path."""
        return atomic_write_text(path, self.to_json())

    # -------------------------------------------------------------------- signature
    def signed(self, key: bytes) -> Artifact:
        """This artifact with a ``"signature"`` made with ``key`` (:func:`sign_value`).

        Raises
        ------
        ArtifactError
            A version 1 artifact (it has no seal to sign), or a key shorter than
            :data:`MIN_KEY_CHARS`.
        """
        if self.seal is None:
            raise ArtifactError("a version 1 artifact has no seal to sign; recalibrate it first.")
        value = sign_value(self.to_dict(), _check_key(key))
        return dataclasses.replace(self, signature={"algorithm": SIGNATURE_ALGORITHM,
                                                    "value": value})

    def verify(self, key: bytes) -> None:
        """Check that the artifact was signed with ``key`` (:func:`check_signature`).

        Raises
        ------
        ArtifactError
            No signature, or one another key (or none of these sealed blocks) made.
        """
        check_signature(self.to_dict(), key)

    # -------------------------------------------------------------------- identity
    @property
    def identity(self) -> str:
        """What names this artifact: the seal's sha256 (versions 2 and 3: scorer, calibration,
        policy, monitor and lists blocks), or the sha256 of the canonical JSON of the whole
        artifact (version 1, which has no seal). Equal for the same content, whatever the
        file's whitespace."""
        if self.seal is not None:
            return str(self.seal["value"])
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def checksum(self) -> str | None:
        """The sealed checksum (versions 2 and 3), None for a version 1 artifact."""
        return None if self.seal is None else str(self.seal["value"])

    # -------------------------------------------------------------------- blocks
    def monitor_reference(self) -> dict[str, Any] | None:
        """The checked monitor block (float reference values), or None when there is none."""
        return None if self.monitor is None else read_monitor_block(self.monitor)

    def weight_blobs(self) -> dict[str, bytes]:
        """The checked learned weights by sha256 (:func:`read_weights_block`); none: {}."""
        return {} if self.weights is None else read_weights_block(self.weights)

    def list_record(self) -> ListRecord | None:
        """The checked calibration lists' record, or None when the artifact has none."""
        return None if self.lists is None else ListRecord.from_dict(
            self.lists, max_lists=_calibration_snippets({"data": self.data}))

    def evidence_scores(self) -> EvidenceScores | None:
        """The relevant calibration scores behind the p-values: the ``"evidence"`` block,
        else the marginal calibration state's scores; None when neither is stored."""
        if self.evidence is not None:
            return EvidenceScores.from_dict(self.evidence)
        return EvidenceScores.of_calibrator(self.calibrator())

    def calibration_block(self) -> CalibrationBlock:
        """The checked calibration block (any format version: :meth:`CalibrationBlock.read`)."""
        return CalibrationBlock.read(self.calibration, version=self.format_version)

    def calibrator(self) -> BaseCalibrator:
        """The fitted calibrator the calibration block stores.

        Raises
        ------
        ArtifactError
            A threshold that is not a number, a state the mode refuses, or (versions 1 and
            2) a stored copy that disagrees with the state.
        """
        return self.calibration_block().calibrator()

    @property
    def group_by(self) -> str | None:
        """The group field of the ``group`` mode (None for version 1 and other modes)."""
        return self.calibration_block().group_by if self.format_version > 1 else None

    @property
    def min_keep(self) -> int:
        """The policy's ``min_keep`` (0 when not stored)."""
        value = (self.policy or {}).get("min_keep", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ArtifactError(f"artifact policy min_keep == {value!r}, expected an int >= 0.")
        return value

    @property
    def max_chars(self) -> Any:
        """The policy's ``max_chars`` as stored (None: the default; checked by the filter)."""
        return (self.policy or {}).get("max_chars")

    @property
    def unit(self) -> str:
        """The policy's pruning ``unit``: ``"snippet"`` or ``"sentence"`` (what the filter
        scores and keeps); artifacts written before units existed read as ``"snippet"``.

        Raises
        ------
        ArtifactError
            A stored unit that is not one of :data:`ragsieve.units.UNITS`.
        """
        value = (self.policy or {}).get("unit", "snippet")
        if not isinstance(value, str) or value not in UNITS:
            raise ArtifactError(f"artifact policy unit == {value!r:.60}, expected one of "
                                f"{list(UNITS)}.")
        return value

    @property
    def language(self) -> str | None:
        """The language the filter was calibrated on (``data.language``), None when unknown."""
        code = (self.data or {}).get("language")
        return code if isinstance(code, str) and code else None

    @property
    def query_language(self) -> str | None:
        """The language of the calibration queries: ``data.query_language`` when they were
        asked in another language than the snippets are in, else :attr:`language`."""
        code = (self.data or {}).get("query_language")
        return code if isinstance(code, str) and code else self.language

    @property
    def model(self) -> str | None:
        """The embedding model of the scorer (of its base, for a relative or fused score)."""
        return spec_model(self.scorer)

    @property
    def score_field(self) -> str | None:
        """The field an outside-score (``field``) scorer reads, None for any other scorer."""
        if self.scorer.get("scorer") == "field" and self.scorer.get("field"):
            return str(self.scorer["field"])
        return None


def spec_model(spec: Any) -> str | None:
    """The embedding model a scorer spec names, itself or through its ``base`` chain (a
    relative or fused score) or its sentence stage (the sentence-in-context score); None
    for a score with no model (an outside field, ...)."""
    while isinstance(spec, Mapping):
        if spec.get("model"):
            return str(spec["model"])
        spec = spec.get("base") or spec.get("sentence")
    return None


# ----------------------------------------------------------------------------- the seal
def covers(payload: Mapping[str, Any]) -> list[str]:
    """The blocks a checksum seals: ``CHECKSUM_COVERS``, and the monitor and lists blocks
    when present."""
    return [*CHECKSUM_COVERS, *(key for key in OPTIONAL_SEALED if key in payload)]


def _sealed_bytes(payload: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the sealed blocks (what the seal hashes and the key signs)."""
    sealed = {k: payload.get(k) for k in covers(payload)}
    return json.dumps(sealed, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def seal_value(payload: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the sealed blocks."""
    return hashlib.sha256(_sealed_bytes(payload)).hexdigest()


def sign_value(payload: Mapping[str, Any], key: bytes) -> str:
    """HMAC-SHA256 with ``key`` of the canonical JSON of the sealed blocks (hex): what only a
    holder of the key can compute, unlike the seal."""
    return hmac.new(key, _sealed_bytes(payload), hashlib.sha256).hexdigest()


def check_signature(payload: Mapping[str, Any], key: bytes) -> None:
    """Verify an artifact dict's ``"signature"`` against ``key`` (constant-time compare).

    Raises
    ------
    ArtifactError
        No signature, or a value ``key`` does not give for the sealed blocks (another key,
        or blocks edited and resealed after signing). The key is never in the message.
    """
    found = payload.get("signature")
    if found is None:
        raise ArtifactError("artifact is not signed, and a signed one is required (a key was "
                            "given to verify it); sign it with `calibrate --sign-key-env NAME`.")
    _check_signature_field(found)
    try:
        expected = sign_value(payload, key)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"artifact blocks are not plain JSON: {exc}") from exc
    if not hmac.compare_digest(expected, found["value"]):
        raise ArtifactError("artifact signature does not match: it was signed with another key, "
                            "or its blocks were edited after signing; sign it again with the "
                            "serving key.")


def key_from_env(name: str) -> bytes:
    """The signing key held by the environment variable ``name`` (UTF-8 bytes).

    Raises
    ------
    ArtifactError
        The variable is unset, or its value is shorter than :data:`MIN_KEY_CHARS` (the
        value itself is never shown).
    """
    value = os.environ.get(name, "")
    if len(value) < MIN_KEY_CHARS:
        state = "is not set" if name not in os.environ else f"holds {len(value)} characters"
        raise ArtifactError(f"signing key variable {name} {state}; expected a secret of at "
                            f"least {MIN_KEY_CHARS} characters.")
    return value.encode("utf-8")


def _check_key(key: Any) -> bytes:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_CHARS:
        got = f"{len(key)} bytes" if isinstance(key, bytes) else type(key).__name__
        raise ArtifactError(f"signing key is {got}, expected at least {MIN_KEY_CHARS} bytes.")
    return key


def _check_signature_field(found: Any) -> None:
    if not isinstance(found, Mapping) or set(found) != {"algorithm", "value"} \
            or found["algorithm"] != SIGNATURE_ALGORITHM or not isinstance(found["value"], str) \
            or len(found["value"]) != 64 or any(c not in "0123456789abcdef" for c in found["value"]):
        raise ArtifactError(f"artifact signature {_kind(found)} is not {{'algorithm': "
                            f"{SIGNATURE_ALGORITHM!r}, 'value': 64 hex digits}}.")


def check_seal(payload: Mapping[str, Any]) -> None:
    """Verify the ``"checksum"`` seal of a version 2 or 3 artifact dict.

    Raises
    ------
    ArtifactError
        No seal, a seal of another algorithm or over other blocks, a monitor block added
        after ``calibrate``, or a value that does not match the sealed blocks.
    """
    seal = payload.get("checksum")
    if not isinstance(seal, Mapping) or not isinstance(seal.get("value"), str):
        raise ArtifactError("artifact has no checksum; version 2 and 3 artifacts are sealed by "
                            "`calibrate`: recalibrate instead of writing one by hand.")
    sealed = seal.get("covers", [])
    sealed = list(sealed) if isinstance(sealed, (list, tuple)) else sealed
    for key in OPTIONAL_SEALED:
        if key in payload and isinstance(sealed, list) and key not in sealed:
            raise ArtifactError(f"artifact {key!r} block is not sealed by its checksum (covers "
                                f"{sealed}); it was added after `calibrate`: recalibrate.")
    if seal.get("algorithm") != "sha256" or sealed != covers(payload) or set(seal) != {
            "algorithm", "covers", "value"}:
        raise ArtifactError(f"artifact checksum {dict(seal)!r} is not the sha256 over "
                            f"{covers(payload)} this ragsieve writes.")
    try:
        actual = seal_value(payload)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"artifact blocks are not plain JSON: {exc}") from exc
    if actual != seal["value"]:
        raise ArtifactError(
            "artifact checksum mismatch: its scorer, calibration, policy, monitor or lists block was "
            "edited after `calibrate` wrote it; recalibrate rather than editing a filter by hand."
        )


# ----------------------------------------------------------------------------- field checks
def check_fields(payload: Any) -> int:
    """Type-check every top-level field of an artifact dict and verify its seal.

    ``format`` is ``"ragsieve.filter"``; ``format_version`` 1, 2 or 3; ``library_version`` a
    string; ``created`` an ISO-8601 string; ``scorer``, ``calibration``, ``policy`` and
    ``data`` objects; versions 2 and 3 have a valid ``checksum`` seal and, when present,
    valid ``monitor`` and ``lists`` blocks; a version 3 calibration block holds only
    :data:`CALIBRATION_KEYS`. Unknown fields are refused. The calibration block's values are
    checked when its calibrator is built (:meth:`Artifact.calibrator`).

    Returns
    -------
    int
        The format version.

    Raises
    ------
    ArtifactError
        The first field that is missing, unknown or of the wrong type, or a broken seal.
    """
    version = _check_format(payload)
    _check_unsealed(payload)
    if version == 1:
        extra = sorted({*OPTIONAL_SEALED, "checksum", "signature"} & set(payload))
        if extra:
            raise ArtifactError(f"version 1 artifacts have no {extra}; this one was edited: "
                                "recalibrate.")
        return version
    check_seal(payload)
    if "signature" in payload:
        _check_signature_field(payload["signature"])
    if version >= 3:
        _check_calibration_keys(payload["calibration"])
    if "monitor" in payload:
        read_monitor_block(payload["monitor"])
    if "lists" in payload:
        ListRecord.from_dict(payload["lists"], max_lists=_calibration_snippets(payload))
    if "weights" in payload:
        read_weights_block(payload["weights"])
    if "evidence" in payload:
        EvidenceScores.from_dict(payload["evidence"])
    return version


def _calibration_snippets(payload: Mapping[str, Any]) -> int:
    """Most calibration lists the artifact can hold: the snippets its lists were recorded
    from (each list holds one at least) as ``calibrate`` counts them in ``data``
    (``n_snippet_pairs`` for the sentence unit, else ``n_pairs``), else
    :data:`ragsieve.lists.MAX_LISTS`."""
    data = payload.get("data") or {}
    count = data.get("n_snippet_pairs", data.get("n_pairs"))
    return count if isinstance(count, int) and not isinstance(count, bool) else MAX_LISTS


def _check_unsealed(payload: Mapping[str, Any]) -> None:
    """The field names, the blocks' kinds and the fields the seal does not cover."""
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise ArtifactError(f"artifact has unknown field(s) {unknown}; expected only "
                            f"{list(FIELDS)} (free-form notes belong in 'data').")
    for key in ("scorer", "calibration"):
        if not isinstance(payload.get(key), Mapping):
            raise ArtifactError(f"malformed filter artifact: {key!r} is "
                                f"{_kind(payload.get(key))}, expected an object.")
    if not isinstance(payload["scorer"].get("scorer"), str):
        raise ArtifactError(f"malformed filter artifact: scorer 'scorer' == "
                            f"{payload['scorer'].get('scorer')!r}, expected a scorer name.")
    for key in ("policy", "data"):
        if key in payload and not isinstance(payload[key], Mapping):
            raise ArtifactError(f"artifact {key!r} is {_kind(payload[key])}, expected an object.")
    if "data" in payload:
        _check_data_counts(payload["data"])
    unit = payload.get("policy", {}).get("unit", UNITS[0])
    if not isinstance(unit, str) or unit not in UNITS:
        raise ArtifactError(f"artifact policy unit == {unit!r:.60}, expected one of {list(UNITS)}.")
    if "library_version" in payload and not isinstance(payload["library_version"], str):
        raise ArtifactError(f"artifact 'library_version' is {_kind(payload['library_version'])}, "
                            "expected a string.")
    if "created" in payload:
        _check_created(payload["created"])


def _check_data_counts(data: Mapping[str, Any]) -> None:
    """The provenance counts (:data:`DATA_COUNTS`): ints in ``[0, MAX_COUNT]``, and no more
    relevant pairs or queries than pairs."""
    for key in DATA_COUNTS:
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise ArtifactError(f"artifact data {key} == {_clip(value)}, expected an int in "
                                f"[0, {MAX_COUNT}].")
    if "n_pairs" in data:
        for key in ("n_relevant", "n_queries"):
            if data.get(key, 0) > data["n_pairs"]:
                raise ArtifactError(f"artifact data {key} == {data[key]} exceeds its n_pairs "
                                    f"({data['n_pairs']}); the artifact was edited: recalibrate.")


def _clip(value: Any) -> str:
    """``repr(value)`` in at most 60 characters (a 4,000-digit integer as its digit count)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value!r:.60}"


def read_weights_block(block: Any) -> dict[str, bytes]:
    """The ``weights`` block's blobs by name, each checked to hash to its name.

    Raises
    ------
    ArtifactError
        Not an object of sha256 names to base64 strings, or a blob whose sha256 is not its
        name.
    """
    if not isinstance(block, Mapping):
        raise ArtifactError(f"artifact 'weights' is {_kind(block)}, expected an object of "
                            "sha256 -> base64 weights.")
    out: dict[str, bytes] = {}
    for name, text in block.items():
        if not (isinstance(name, str) and len(name) == 64
                and all(c in "0123456789abcdef" for c in name)) or not isinstance(text, str):
            raise ArtifactError(f"artifact weights entry {str(name)[:70]!r} is not a sha256 name "
                                "with a base64 string.")
        try:
            blob = base64.b64decode(text, validate=True)
        except ValueError as exc:
            raise ArtifactError(f"artifact weights {name[:16]}... are not base64: {exc}") from exc
        if hashlib.sha256(blob).hexdigest() != name:
            raise ArtifactError(f"artifact weights {name[:16]}... do not hash to their name; "
                                "they were edited or corrupted: recalibrate.")
        out[name] = blob
    return out


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__} ({value!r:.60})"


def _check_format(payload: Any) -> int:
    if not isinstance(payload, Mapping) or payload.get("format") != ARTIFACT_FORMAT:
        got = payload.get("format") if isinstance(payload, Mapping) else type(payload).__name__
        raise ArtifactError(
            f"not a ragsieve filter artifact: format == {got!r:.80}, expected {ARTIFACT_FORMAT!r}."
        )
    version = payload.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool) \
            or not isinstance(version, int):
        raise ArtifactError(
            f"artifact format_version == {version!r:.80}; this ragsieve ({__version__}) reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}."
        )
    return int(version)


def _check_created(value: Any) -> None:
    try:
        _dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ArtifactError(f"artifact 'created' is {_kind(value)}, expected an ISO-8601 "
                            "date-time string (e.g. '2025-01-31T12:00:00+00:00').") from None


def _strict_bool(block: Mapping[str, Any], key: str) -> bool:
    value = block.get(key)
    if not isinstance(value, bool):
        raise ArtifactError(f"artifact calibration {key!r} == {value!r}, expected true or false.")
    return value


def _stored_threshold(block: Mapping[str, Any]) -> float:
    if _strict_bool(block, "threshold_is_infinite"):
        if block.get("threshold") is not None:
            raise ArtifactError("artifact calibration says threshold_is_infinite but holds a "
                                "threshold.")
        return math.inf
    value = block.get("threshold")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArtifactError(f"artifact calibration threshold == {value!r}, expected a finite "
                            "number.")
    return float(value)


# ----------------------------------------------------------------------------- the file
def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_ARTIFACT_BYTES) -> str:
    """The text of an artifact file, refused cheaply when it is larger than ``max_bytes``.

    The size is read from ``stat`` before the file is opened, and at most ``max_bytes + 1``
    bytes are read (a file growing meanwhile is refused too).

    Raises
    ------
    ArtifactTooLargeError
        The file is larger than ``max_bytes``.
    ArtifactError
        The file is missing, not a regular file, unreadable or not UTF-8.
    """
    max_bytes = check_int(max_bytes, "max_bytes", min_value=1)
    name = os.fspath(path)
    try:
        size = _regular_size(name)
        if size <= max_bytes:
            with open(name, "rb") as fh:
                data = fh.read(max_bytes + 1)
            size = len(data)
    except OSError as exc:
        raise ArtifactError(f"cannot read filter artifact {name!r}: {exc}") from exc
    if size > max_bytes:
        raise ArtifactTooLargeError(
            f"filter artifact {name!r} has {size} bytes, more than the limit of {max_bytes} "
            "(max_artifact_bytes, --max-artifact-bytes); nothing was parsed.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"cannot read filter artifact {name!r}: {exc}") from exc


def _regular_size(name: str) -> int:
    """The size of a regular file (``OSError`` for anything else: a FIFO is never opened)."""
    st = os.stat(name)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{name!r} is not a regular file")
    return st.st_size

