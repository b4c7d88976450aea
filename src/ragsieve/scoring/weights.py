"""Learned weights a score needs beyond its spec, stored by content.

A score that learns large tensors (the fine-tuned reader,
:class:`~ragsieve.scoring.reader.ReaderScorer`) names them in its spec by their sha256 and
hands the bytes out through :meth:`Scorer.learned_weights
<ragsieve.scoring.Scorer.learned_weights>`; the artifact stores them in its sealed
``weights`` block. Loading an artifact registers its weights here
(:func:`register_weights`, each checked against its name) before the scorer is rebuilt from
its spec, and the scorer reads them back with :func:`weights_blob`. The store is per process
and content-addressed: one name always means the same bytes.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping

from ..errors import ScorerError

__all__ = ["register_weights", "weights_blob"]

_LOCK = threading.Lock()
_STORE: dict[str, bytes] = {}


def register_weights(blobs: Mapping[str, bytes]) -> None:
    """Make ``blobs`` (sha256 hex -> bytes) available to the scores that name them.

    Raises
    ------
    ValueError
        A blob whose sha256 is not its name.
    """
    for name, blob in blobs.items():
        actual = hashlib.sha256(blob).hexdigest()
        if actual != name:
            raise ValueError(f"weights named {name[:16]}... hash to {actual[:16]}...; they "
                             "were edited or corrupted.")
    with _LOCK:
        _STORE.update(blobs)


def weights_blob(name: str) -> bytes:
    """The weights named ``name`` (their sha256).

    Raises
    ------
    ScorerError
        No weights of that name were registered in this process (load the artifact that
        holds them, or fit the score).
    """
    with _LOCK:
        blob = _STORE.get(name)
    if blob is None:
        raise ScorerError(f"the weights {name[:16]}... this score names are not loaded; they "
                          "travel in the artifact's 'weights' block: load the filter with "
                          "ConformalFilter.load (or recalibrate).")
    return blob
