"""Settings values from keywords: a frozen value given whole, or its fields one by one.

A client or a server takes a small frozen value of settings (:class:`~ragsieve._http.CallPolicy`,
:class:`~ragsieve.llm.local.LocalRuntime`) as one keyword, or each field as a keyword of its
own, the way the command line and the older calls give them; :func:`settings_from_keywords`
turns either into the value, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

__all__ = ["settings_from_keywords"]

T = TypeVar("T")


def settings_from_keywords(default: T, keywords: Mapping[str, Any], *, whole: str,
                           owner: str) -> T:
    """``default`` with the fields ``keywords`` gives, or the value ``keywords[whole]``.

    Parameters
    ----------
    default : frozen dataclass
        The value when nothing is given, of the type expected.
    keywords : Mapping
        Fields of the value by name, or ``{whole: value}``.
    whole : str
        The keyword that gives the value whole (``"calls"``).
    owner : str
        Who takes the keywords, named in the error of one that is no field
        (``"LLMClient.__init__()"``).

    Raises
    ------
    TypeError
        A keyword that is no field (as Python says it of a keyword a function lacks), or
        the whole value of another type.
    ValueError
        The value given whole and by fields.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Size:
    ...     w: int = 1
    ...     h: int = 1
    >>> settings_from_keywords(Size(), {"h": 3}, whole="size", owner="f()")
    Size(w=1, h=3)
    """
    given = dict(keywords)
    value = given.pop(whole, None)
    names = {f.name for f in fields(default)}  # type: ignore[arg-type]
    for name in given:
        if name not in names:
            raise TypeError(f"{owner} got an unexpected keyword argument {name!r}")
    if value is None:
        return replace(default, **given)  # type: ignore[type-var]
    if not isinstance(value, type(default)):
        raise TypeError(f"{whole} is {type(value).__name__}, expected "
                        f"{type(default).__name__}.")
    if given:
        raise ValueError(f"the {whole} settings are given twice: as {whole}= and by "
                         f"{sorted(given)}; give one.")
    return value
