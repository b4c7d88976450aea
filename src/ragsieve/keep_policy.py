"""The keep policy: what a filter keeps besides its calibrated rule, one value wherever it
travels (the filter, :func:`ragsieve.keeping.apply_rule`, ``calibrate``'s fit, the
artifact's ``policy`` block, the framework components, the service).

:class:`KeepPolicy` holds ``min_keep`` (the empty-result policy), ``group_by`` (the
``group`` mode's field), ``max_chars`` (the size longer snippets, or sentences, are cut to)
and ``unit`` (``"snippet"`` or ``"sentence"``); :meth:`KeepPolicy.checked` builds one from
the values a caller gave (:func:`check_policy`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ._validation import check_int, check_str
from .chunking import DEFAULT_SIZE
from .units import check_unit

__all__ = ["MAX_CHARS", "KeepPolicy", "check_policy"]

#: Inputs longer than this many characters are cut into calibration-sized pieces.
MAX_CHARS = int(1.2 * DEFAULT_SIZE)


def check_policy(min_keep: Any, group_by: Any, max_chars: Any, unit: Any,
                 sentence_in_context: bool = False) -> tuple[int, str | None, int, str]:
    """A filter's policy, checked: ``min_keep`` an int >= 0, ``group_by`` a field name or
    None, ``max_chars`` an int >= the snippet size or None (``MAX_CHARS``), ``unit`` one of
    :data:`ragsieve.units.UNITS` (``"sentence"`` for a sentence-in-context score).

    Raises
    ------
    TypeError, ValueError
        A value of the wrong type, or out of range.
    """
    min_keep = check_int(min_keep, "min_keep", min_value=0)
    group_by = check_str(group_by, "group_by", non_blank=True, allow_none=True,
                         hint="the field name of the group")
    max_chars = check_int(max_chars, "max_chars", min_value=DEFAULT_SIZE, allow_none=True,
                          hint="the snippet size the pieces are cut to")
    unit = check_unit(unit)
    if unit == "snippet" and sentence_in_context:
        raise ValueError("the sentence_context score scores sentences in their snippets: "
                         "use it with unit='sentence' (CLI --unit sentence).")
    return min_keep, group_by, MAX_CHARS if max_chars is None else max_chars, unit


@dataclass(frozen=True)
class KeepPolicy:
    """What a filter keeps besides its calibrated rule: the filter's keep policy.

    Build a checked one with :meth:`checked` (the constructor itself trusts its values).

    Attributes
    ----------
    min_keep : int
        Empty-result policy: keep at least this many best-scoring units.
    group_by : str or None
        ``group`` mode: the field of each snippet's group.
    max_chars : int
        Longer snippets (sentences, unit ``"sentence"``) are cut into pieces of this size.
    unit : str
        What is scored and kept: ``"snippet"`` or ``"sentence"``.
    """

    min_keep: int = 0
    group_by: str | None = None
    max_chars: int = MAX_CHARS
    unit: str = "snippet"

    @classmethod
    def checked(cls, min_keep: Any = 0, group_by: Any = None, max_chars: Any = None,
                unit: Any = "snippet", *, sentence_in_context: bool = False) -> KeepPolicy:
        """The policy of these values, checked (:func:`check_policy`, which raises
        ``TypeError`` / ``ValueError``); ``max_chars`` None: ``MAX_CHARS``."""
        return cls(*check_policy(min_keep, group_by, max_chars, unit, sentence_in_context))

    def with_group_by(self, group_by: str | None) -> KeepPolicy:
        """This policy with the group field ``group_by`` (None: this policy's own)."""
        return self if group_by is None else replace(self, group_by=group_by)

    def keywords(self) -> dict[str, Any]:
        """The policy as ``ConformalFilter``'s keyword arguments."""
        return asdict(self)

    def block(self) -> dict[str, Any]:
        """The artifact's ``policy`` block (``group_by`` is stored in its calibration block)."""
        return {"min_keep": self.min_keep, "max_chars": self.max_chars, "unit": self.unit}
