"""The sha256 seal of a filter artifact (format version 2).

Shared by :mod:`ragsieve.filter` (which writes and reads artifacts) and
:mod:`ragsieve.monitoring` (which builds its monitor from an artifact's sealed ``"monitor"``
block); neither may import the other, so the one definition of the seal lives here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .errors import ArtifactError

__all__ = ["CHECKSUM_COVERS", "check_seal", "covers", "seal_value"]

#: Artifact blocks sealed by the sha256 checksum (and ``"monitor"`` when present).
CHECKSUM_COVERS = ("scorer", "calibration", "policy")


def covers(payload: Mapping[str, Any]) -> list[str]:
    """The blocks a checksum seals: ``CHECKSUM_COVERS``, and the monitor block when present."""
    return [*CHECKSUM_COVERS, *(["monitor"] if "monitor" in payload else [])]


def seal_value(payload: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the sealed blocks."""
    sealed = {k: payload.get(k) for k in covers(payload)}
    text = json.dumps(sealed, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_seal(payload: Mapping[str, Any]) -> None:
    """Verify the ``"checksum"`` seal of a version 2 artifact.

    Raises
    ------
    ArtifactError
        No seal, a seal of another algorithm or over other blocks, a monitor block added
        after ``calibrate``, or a value that does not match the sealed blocks.
    """
    seal = payload.get("checksum")
    if not isinstance(seal, Mapping) or not isinstance(seal.get("value"), str):
        raise ArtifactError("artifact has no checksum; version 2 artifacts are sealed by "
                            "`calibrate`: recalibrate instead of writing one by hand.")
    sealed = seal.get("covers", [])
    sealed = list(sealed) if isinstance(sealed, (list, tuple)) else sealed
    if "monitor" in payload and sealed == list(CHECKSUM_COVERS):
        raise ArtifactError("artifact 'monitor' block is not sealed by its checksum (covers "
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
            "artifact checksum mismatch: its scorer, calibration, policy or monitor block was "
            "edited after `calibrate` wrote it; recalibrate rather than editing a filter by hand."
        )
