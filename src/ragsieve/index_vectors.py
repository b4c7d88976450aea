"""No embedding twice: the vectors an index stored, put into a scorer's embedding cache.

Pairs written by ``ragsieve retrieve`` name the index each snippet came from
(``meta["retriever"]``: its fingerprint, model and path; the pair's ``snippet_id`` is the
index's). :func:`reuse_index_vectors` opens each named index read-only, and when its
fingerprint is the one the pairs name and its model is the one the score embeds with,
reads those snippets' stored vectors and adds them to the score's
:class:`~ragsieve.embeddings.EmbeddingCache`: the model then embeds only the queries.
The file is never trusted: a snippet is taken only when the index holds its id and its
stored text equals the pair's text; every other snippet (another or a changed index, a
gone one, an id the index lacks, another text, pairs naming no index) is embedded as
before, and the returned notes say so. ``calibrate``, ``evaluate`` and ``filter`` print them.

It sits above the index (:mod:`ragsieve.store`) and the scores (:mod:`ragsieve.scoring`),
which know nothing of each other.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .embeddings import EmbeddingCache
from .errors import ArtifactError
from .scoring.base import Scorer
from .scoring.embedding import embedding_cache_of
from .store import RETRIEVER_KIND, IndexMissingError, SnippetIndex
from .types import Pair

__all__ = ["embedding_cache_of", "reuse_index_vectors"]


def _retriever(pair: Pair) -> Mapping[str, Any] | None:
    found = pair.meta.get("retriever") if isinstance(pair.meta, Mapping) else None
    if (isinstance(found, Mapping) and found.get("kind") == RETRIEVER_KIND
            and isinstance(found.get("path"), str) and isinstance(found.get("index"), str)):
        return found
    return None


def reuse_index_vectors(pairs: Iterable[Pair], scorer: Scorer, *,
                        cache_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Put the stored vectors of the pairs' index snippets into ``scorer``'s embedding cache.

    Parameters
    ----------
    pairs : iterable of Pair
        Pairs, some or all written by ``ragsieve retrieve`` (``meta["retriever"]``); read
        once, keeping each named snippet's texts only (a stream of any length will do).
    scorer : Scorer
        The score about to embed them: its embedding score of the index's model (the
        score itself, its base, or a fused score's signal) receives the vectors.
    cache_dir : str, os.PathLike or None
        The persistent embedding cache the score embeds through. An ``auto`` score builds
        its embedding score only when it is resolved (``ConformalFilter.calibrate``); with
        ``cache_dir`` the vectors are written to that cache's file for the index's model,
        where the resolved score finds them. None: an ``auto`` score gets none.

    Returns
    -------
    list of str
        One note per named index (what was taken, or why that index's snippets are
        embedded again), and one for snippets not taken; empty when no pair names an
        index.
    """
    # (path, fingerprint) -> snippet_id -> the texts the pairs give it
    groups: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    plain = 0
    for pair in pairs:
        found = _retriever(pair)
        if found is None:
            plain += 1
            continue
        groups[(found["path"], found["index"])][pair.snippet_id].add(pair.text)
    if not groups:
        return []
    notes = [_reuse_one(path, fingerprint, texts, scorer, cache_dir)
             for (path, fingerprint), texts in groups.items()]
    if plain:
        notes.append(f"{plain} pair(s) name no index: their snippets are embedded")
    return notes


def _reuse_one(path: str, fingerprint: str, texts: dict[str, set[str]], scorer: Scorer,
               cache_dir: str | os.PathLike[str] | None) -> str:
    """The vectors of one index's snippets ``texts`` (snippet id -> the pairs' texts) put
    into the cache of the score's embedder of that index's model; the note saying what
    happened."""
    try:
        index = SnippetIndex.open(path)
        stored_fingerprint = index.fingerprint
    except (FileNotFoundError, IndexMissingError, ArtifactError):
        return f"the index at {path} is gone: embedding its {len(texts)} snippet(s) again"
    if stored_fingerprint != fingerprint:
        return (f"the index at {path} changed (fingerprint {stored_fingerprint[:12]}, the pairs "
                f"say {fingerprint[:12]}): embedding its {len(texts)} snippet(s) again")
    cache = embedding_cache_of(scorer, index.model_id)
    if cache is None and cache_dir is not None and scorer.tags.resolved_at_calibration:
        cache = EmbeddingCache(index.model, cache_dir=cache_dir)  # read by the resolved score
    if cache is None:
        return (f"the index at {path} stores vectors of {index.model_id}, which the score does "
                f"not embed with: embedding its {len(texts)} snippet(s)")
    stored = index.tables.vectors_of(list(texts))
    usable = [sid for sid, (text, _) in stored.items() if text in texts[sid]]
    if usable:
        cache.add_known([stored[sid][0] for sid in usable],
                        np.stack([stored[sid][1] for sid in usable]))
    note = f"took {len(usable)} snippet vector(s) from the index at {path}"
    missing = len(texts) - len(stored)
    unlike = sum(len(texts[sid] - {text}) for sid, (text, _) in stored.items())
    if missing or unlike:
        note += (f"; embedding {missing + unlike} again ({missing} not in the index, "
                 f"{unlike} with another text there)")
    return note
