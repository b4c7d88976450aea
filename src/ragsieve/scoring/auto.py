"""The default score (``"auto"``): the strongest score the calibration data allows.

:func:`choose_score` is the one rule, used by the CLI (``--scorer auto``, the default of
every command that fits a filter) and by :class:`~ragsieve.ConformalFilter` (scorer
``"auto"``, resolved when it is calibrated):

* the fused score (``"best"``, :mod:`ragsieve.scoring.fusion`) when the pairs give whole
  lists it can be fitted on: at least half of the queries have >= 2 snippets, the pairs hold
  both relevant and irrelevant snippets, and there are at least ``MIN_FUSION_TOPICS`` topics
  (``Pair.group``; a quarter of them fit the weights, the rest calibrate the threshold);
* otherwise ``1 - cos`` (``"embedding"``), with the reason logged as a warning.

:class:`AutoScorer` stands for the choice until then: it also picks the embedding model,
from the language given or detected in the calibration texts
(:func:`~ragsieve.embeddings.detection.detect_language`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..errors import ScorerError
from ..types import Pair
from .base import Scorer
from .embedding import EMBEDDING_OPTIONS
from .options import ScorerOption

__all__ = ["MIN_FUSION_TOPICS", "AutoScorer", "ScoreChoice", "choose_language", "choose_score"]

logger = logging.getLogger(__name__)

#: Fewest topics the fused score is chosen for (one fits the weights, three calibrate).
MIN_FUSION_TOPICS = 4
#: Share of queries that must have a list of >= 2 snippets.
MIN_LIST_SHARE = 0.5


@dataclass(frozen=True)
class ScoreChoice:
    """The score :func:`choose_score` picked and why.

    Attributes
    ----------
    alias : str
        ``"best"`` (the fused score) or ``"embedding"`` (``1 - cos``).
    reason : str
        One clause: ``"whole lists of 3-6 snippets per query (16 queries, 8 topics)"``.
    """

    alias: str
    reason: str

    @property
    def label(self) -> str:
        """``"fused (best)"`` or ``"1 - cos (embedding)"``."""
        return "fused (best)" if self.alias == "best" else "1 - cos (embedding)"

    def to_dict(self) -> dict[str, str]:
        """``{"scorer": alias, "label": ..., "reason": ...}``."""
        return {"scorer": self.alias, "label": self.label, "reason": self.reason}


def choose_score(pairs: Sequence[Pair]) -> ScoreChoice:
    """The strongest score the labelled pairs allow (see the module docstring for the rule).

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled calibration pairs.

    Returns
    -------
    ScoreChoice

    Examples
    --------
    >>> from ragsieve.types import Pair
    >>> single = [Pair(str(i), "q", f"s{i}", "t", 1, group=str(i)) for i in range(8)]
    >>> choose_score(single).alias
    'embedding'
    """
    pairs = list(pairs)
    sizes = Counter(p.query_id for p in pairs)
    n_queries = len(sizes)
    topics = {p.group for p in pairs}
    labels = {p.relevant for p in pairs}
    lists = sum(1 for n in sizes.values() if n >= 2)
    if not n_queries or lists < MIN_LIST_SHARE * n_queries:
        return ScoreChoice("embedding", f"{n_queries - lists} of {n_queries} queries have a single "
                           "snippet; the fused score needs whole retrieved lists")
    if labels != {0, 1}:
        kind = "irrelevant" if 1 in labels else "relevant"
        return ScoreChoice("embedding", f"no {kind} snippet in the calibration pairs; the fused "
                           "score is fitted on both")
    if len(topics) < MIN_FUSION_TOPICS:
        return ScoreChoice("embedding", f"{len(topics)} topic(s); the fused score needs >= "
                           f"{MIN_FUSION_TOPICS} (a quarter fit it, the rest calibrate)")
    lo, hi = min(sizes.values()), max(sizes.values())
    span = str(lo) if lo == hi else f"{lo}-{hi}"
    return ScoreChoice("best", f"whole lists of {span} snippets per query ({n_queries} queries, "
                       f"{len(topics)} topics)")


def choose_language(pairs: Sequence[Pair], language: str | None, *,
                    fallback: str | None = "en") -> tuple[Any, str]:
    """The language of the calibration texts and how it was found.

    Parameters
    ----------
    pairs : sequence of Pair
        The calibration pairs (a sample of their queries and snippets is classified).
    language : str or None
        The language given by the user, taken as it is.
    fallback : str or None
        The language when none is detected (logged as a warning); None: give None and log
        the reason at info level.

    Returns
    -------
    (code, source)
        ``language`` itself (``source`` ``"given"``) when not None; else the language
        :func:`~ragsieve.embeddings.detection.detect_language` finds in a sample of the
        queries and snippets (``source`` like ``"py3langid, 0.97 of 200 texts"``); else
        ``fallback`` with the reason.
    """
    from ..embeddings.detection import DETECTOR, detect_language, language_texts
    from ..embeddings.languages import normalise_language

    if language is not None:
        return normalise_language(language), "given"
    try:
        guess = detect_language(language_texts(pairs))
        reason = guess.reason
    except ImportError:
        guess, reason = None, f"{DETECTOR} is not installed (pip install 'ragsieve[embed]')"
    if guess is not None and guess.code is not None:
        return guess.code, f"{DETECTOR}, {guess.share:.2f} of {guess.n_texts} texts"
    if fallback is None:
        logger.info("language of the calibration texts not detected: %s", reason)
        return None, f"not detected: {reason}"
    logger.warning("language of the calibration texts not detected: %s; using %s (give the "
                   "language to choose another model)", reason, fallback)
    return fallback, f"default; not detected: {reason}"


class AutoScorer(Scorer):
    """Stands for the default score until :meth:`resolve` sees the calibration pairs.

    ``ConformalFilter("auto").calibrate(pairs)`` resolves it: the fused score or ``1 - cos``
    (:func:`choose_score`) over the embedding model of the given or detected language
    (:func:`choose_language`). Scoring with it before then raises ``ScorerError``.

    Parameters
    ----------
    model : str or None
        Embedding model (alias, sentence-transformers name or path); None picks the model
        of the language.
    language : str or None
        Language of the texts; None detects it from the calibration texts.
    backend, cache_dir, batch_size
        As for :class:`~ragsieve.scoring.EmbeddingScorer`.
    """

    name: ClassVar[str] = "auto"
    score_label: ClassVar[str] = "auto (resolved by calibrate)"
    resolved_at_calibration: ClassVar[bool] = True
    # the embedding scorer's, but the language defaults to the one detected in the pairs
    declared_options: ClassVar[tuple[ScorerOption, ...]] = tuple(
        replace(o, default=None, help="language of the texts (default: detected)")
        if o.name == "language" else o for o in EMBEDDING_OPTIONS)

    def __init__(self, model: str | os.PathLike[str] | None = None, *, language: str | None = None,
                 backend: str = "auto", cache_dir: str | os.PathLike[str] | None = None,
                 batch_size: int = 32) -> None:
        self.options: dict[str, Any] = {"model": model, "backend": backend,
                                        "cache_dir": cache_dir, "batch_size": batch_size}
        self.language = language

    def resolve(self, pairs: Sequence[Pair], *, language: str | None = None,
                ) -> tuple[Scorer, ScoreChoice, tuple[str, str]]:
        """The scorer the pairs call for, the score choice, and ``(language, source)``.

        ``language`` (when not None) overrides the one given at construction.
        """
        from . import resolve_scorer

        pairs = list(pairs)
        language, source = choose_language(pairs, language or self.language)
        choice = choose_score(pairs)
        if choice.alias != "best":
            logger.warning("score: 1 - cos (embedding), not the fused score: %s", choice.reason)
        base = resolve_scorer("embedding", language=language, **self.options)
        scorer = resolve_scorer("best", base=base) if choice.alias == "best" else base
        return scorer, choice, (language, source)

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        raise ScorerError("the 'auto' score is chosen when the filter is calibrated "
                          "(ConformalFilter.calibrate); calibrate it first.")

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name,
                **{k: str(v) for k, v in (("model", self.options["model"]),
                                          ("language", self.language)) if v is not None}}
