"""Labelled pairs scored by an outside field, for tests of fitting and calibration without a
model."""

from __future__ import annotations

import numpy as np

from ragsieve.types import Pair


def field_pairs(n_queries: int = 40, n_topics: int = 8, seed: int = 0) -> list[Pair]:
    """Lists of 4 snippets; the relevant one has a higher outside score (``meta["bm25"]``),
    with noise; each pair's language in ``meta["lang"]`` (a group mode's field)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_queries):
        for s in range(4):
            rel = int(s == q % 4)
            out.append(Pair(f"q{q}", f"query {q}", f"s{s}", f"text {q} {s}", relevant=rel,
                            group=f"t{q % n_topics}",
                            meta={"bm25": float(rng.normal(2.0 * rel, 1.0)),
                                  "lang": "en" if q % 2 else "de"}))
    return out
