"""Character spans of a text (``evidence``): one check for the JSONL reader and the sentence labels."""

from __future__ import annotations

import json
import numbers
from typing import Any

from .errors import DataError

__all__ = ["check_spans"]

_EXPECTED = "a list of [start, end] integer pairs with 0 <= start < end <= {n} (len(text))"


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_spans(value: Any, length: int, where: str, *, name: str = "evidence") -> list[tuple[int, int]]:
    """The spans of ``value`` as ``(start, end)`` ints, checked against a text of ``length``.

    Parameters
    ----------
    value : object
        A list (or tuple) of ``[start, end]`` pairs of integers (not bools), each with
        ``0 <= start < end <= length``. Spans may overlap and come in any order.
    length : int
        Length of the text the offsets point into.
    where : str
        Start of the error message (``"data.jsonl:3"``, ``"snippet 'd1:0-40'"``).
    name : str
        The field's name in the message.

    Returns
    -------
    list of (int, int)
        In the given order.

    Raises
    ------
    DataError
        One line: where, the field, what was received and what was expected.

    Examples
    --------
    >>> check_spans([[0, 4], [6, 9]], 10, "line 1")
    [(0, 4), (6, 9)]
    >>> check_spans([[4, 2]], 10, "line 1")
    Traceback (most recent call last):
    ...
    ragsieve.errors.DataError: line 1: evidence[0] == [4, 2] is not a span: expected a list of [start, end] integer pairs with 0 <= start < end <= 10 (len(text)).
    """
    expected = _EXPECTED.format(n=length)
    if not isinstance(value, (list, tuple)):
        raise DataError(
            f"{where}: {name} == {_shown(value)} ({type(value).__name__}), expected {expected}."
        )
    spans: list[tuple[int, int]] = []
    for i, item in enumerate(value):
        ok = (isinstance(item, (list, tuple)) and len(item) == 2
              and _is_int(item[0]) and _is_int(item[1])
              and 0 <= item[0] < item[1] <= length)
        if not ok:
            raise DataError(
                f"{where}: {name}[{i}] == {_shown(item)} is not a span: expected {expected}."
            )
        spans.append((int(item[0]), int(item[1])))
    return spans
