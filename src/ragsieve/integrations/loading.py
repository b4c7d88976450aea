"""Loading a saved filter for a framework component (``from_file(path, **options)``).

``from_file`` splits its keywords: the policy keywords (``min_keep``, ``max_chars``:
:data:`POLICY_KEYS`) set the loaded filter's policy, the others rebuild the artifact's
scorer (``cache_dir``); an unknown keyword is a ``TypeError`` listing both kinds
(:func:`load_filter`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragsieve.filter import ConformalFilter

__all__ = ["POLICY_KEYS", "load_filter", "scorer_option_names", "split_options"]


#: ``from_file`` keywords that set the filter's empty-result and long-snippet policy (see
#: ``ConformalFilter``); every other keyword rebuilds the artifact's scorer.
POLICY_KEYS = ("min_keep", "max_chars")


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``from_file`` keywords as (scorer options, policy keywords of :data:`POLICY_KEYS`)."""
    policy = {k: v for k, v in options.items() if k in POLICY_KEYS}
    return {k: v for k, v in options.items() if k not in POLICY_KEYS}, policy


def scorer_option_names(spec: Mapping[str, Any]) -> list[str] | None:
    """The keyword options that rebuild a scorer from its artifact ``spec`` (the keywords of
    its constructor that the spec does not fix), or None when they cannot be listed (an
    unknown alias, a plug-in taking any keyword).

    Examples
    --------
    >>> scorer_option_names({"scorer": "embedding", "model": "all-MiniLM-L6-v2"})
    ['backend', 'batch_size', 'cache_dir', 'language']
    """
    import inspect

    from ragsieve.scoring import _lookup

    try:
        factory = _lookup(str(spec.get("scorer")))
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        base = spec.get("base")
        if isinstance(base, Mapping):  # relative, fused: the options go to the base scorer
            inner = scorer_option_names(base)
        elif spec.get("scorer") == "llm":  # the connection's options
            from ragsieve.llm import connect

            inner = list(inspect.signature(connect).parameters)
        else:
            return None
        if inner is None:
            return None
        names |= set(inner)
    return sorted(names - set(spec) - {"base", "connection"})


def load_filter(path: str | os.PathLike[str], scorer_options: Mapping[str, Any],
                policy: Mapping[str, Any]) -> ConformalFilter:
    """Load an artifact for a framework component: scorer options rebuild its scorer, the
    policy keywords (:data:`POLICY_KEYS`) replace the artifact's policy.

    Raises
    ------
    TypeError
        A keyword that is neither a policy keyword nor an option of the artifact's scorer;
        the message lists the accepted ones.
    ValueError
        A policy value the filter refuses (``min_keep=-1``).
    ArtifactError
        The artifact cannot be read or is not valid.
    """
    from ragsieve.artifact import Artifact
    from ragsieve.filter import ConformalFilter
    from ragsieve.keep_policy import KeepPolicy

    artifact = Artifact.read(path)
    accepted = scorer_option_names(artifact.scorer)
    unknown = sorted(set(scorer_options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise TypeError(
            f"from_file got unexpected keyword argument(s) {unknown}; it accepts the policy "
            f"keywords {list(POLICY_KEYS)} and the options of the artifact's "
            f"{artifact.scorer['scorer']!r} scorer {accepted}.")
    flt = ConformalFilter.from_artifact(artifact, scorer_options=dict(scorer_options) or None)
    if policy:  # checked as the constructor checks a filter built by hand
        checked = KeepPolicy.checked(**{**flt.policy_.keywords(), **policy},
                                     sentence_in_context=flt.scorer_.tags.sentence_in_context)
        flt.min_keep, flt.max_chars = checked.min_keep, checked.max_chars
    return flt
