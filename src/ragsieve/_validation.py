"""Shared checks of parameters and arrays: one place, one wording for every error.

Each check returns the converted value and raises ``TypeError`` for a wrong type and
``ValueError`` for a wrong value, with a message that names what was received and what
was expected (scikit-learn's ``check_scalar`` style).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .errors import DataError

__all__ = [
    "check_aligned",
    "check_alpha",
    "check_codes",
    "check_finite_real",
    "check_lengths",
    "check_positive_int",
    "check_relevant",
    "check_scores",
    "check_str",
    "check_str_sequence",
    "check_unit_interval",
]


def check_str(value: Any, name: str) -> str:
    """``value`` if it is a str, else ``TypeError`` naming what was received."""
    if not isinstance(value, str):
        raise TypeError(f"{name} is {type(value).__name__}, expected a str.")
    return value


def check_str_sequence(value: Any, name: str) -> list[str]:
    """``value`` as a list of str; ``TypeError`` for a single string, a non-sequence or a
    non-str item (named by its index)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} is {type(value).__name__}, expected a sequence of str.")
    out = list(value)
    for i, item in enumerate(out):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] is {type(item).__name__}, expected a str.")
    return out


def check_alpha(alpha: Any, *, name: str = "alpha") -> float:
    """Validate a level in the open interval (0, 1).

    Raises
    ------
    TypeError
        If ``alpha`` is not a real number.
    ValueError
        If it is not in (0, 1).

    Examples
    --------
    >>> check_alpha(0.1)
    0.1
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(alpha).__name__} ({alpha!r}).")
    value = float(alpha)
    if math.isnan(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} == {alpha!r}, must be in (0, 1).")
    return value


def check_finite_real(value: Any, name: str) -> float:
    """A single finite real number (bools refused).

    Examples
    --------
    >>> check_finite_real(0.5, "score")
    0.5
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r}).")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} == {value!r}, must be a finite number.")
    return out


def check_unit_interval(value: Any, name: str, *, closed_right: bool) -> float:
    """Validate a number in (0, 1) or (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r}).")
    v = float(value)
    ok = 0.0 < v <= 1.0 if closed_right else 0.0 < v < 1.0
    if not ok:
        raise ValueError(f"{name} == {value!r}, must be in {'(0, 1]' if closed_right else '(0, 1)'}.")
    return v


def check_positive_int(value: Any, name: str, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """Validate an int ``>= minimum`` (``None`` passes when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        rule = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} == {value!r}, must be {rule}.")
    return int(value)


def check_scores(scores: Any, *, name: str = "scores") -> np.ndarray:
    """Convert to a 1-d float array and reject NaN or infinite values.

    Raises
    ------
    TypeError
        If the input cannot be converted to floats.
    ValueError
        If it is not 1-d or holds NaN / infinite values (count and first index named).
    """
    try:
        arr = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}.")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{name} contains {idx.size} non-finite value(s) (NaN or inf), first at index "
            f"{int(idx[0])} ({arr[idx[0]]!r}); every score must be a finite number."
        )
    return arr


def check_relevant(relevant: Any, n: int) -> np.ndarray:
    """Relevance labels aligned with ``n`` scores as a bool mask; ``None`` means all relevant.

    Raises
    ------
    ValueError
        Wrong shape.
    DataError
        A value other than 0/1 or a bool (e.g. an unlabelled pair's ``None``).
    """
    if relevant is None:
        return np.ones(n, dtype=bool)
    rel = np.asarray(relevant)
    if rel.shape != (n,):
        raise ValueError(f"relevant has shape {rel.shape}, expected ({n},) to match scores.")
    if rel.dtype == np.bool_:
        return rel
    try:
        values = rel.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"relevant must hold 0/1 or booleans, got dtype {rel.dtype}.") from exc
    bad = np.flatnonzero((values != 0) & (values != 1))
    if bad.size:
        raise DataError(
            f"relevant[{int(bad[0])}] == {rel[bad[0]].item()!r}, must be 0/1 or a bool "
            "(unlabelled pairs cannot be used for calibration)."
        )
    return values == 1


def check_aligned(values: Any, n: int, name: str, *, mode: str | None = None) -> np.ndarray:
    """Per-snippet labels (query ids, groups) aligned with ``n`` scores.

    Raises
    ------
    ValueError
        ``values`` is None (the mode needs it) or has the wrong shape.
    """
    if values is None:
        who = f"mode {mode!r}" if mode else "this calibrator"
        raise ValueError(f"{who} needs {name} aligned with the scores; got None.")
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence with one value per score, got a single string.")
    arr = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
    if arr.shape != (n,):
        raise ValueError(f"{name} has shape {arr.shape}, expected ({n},) to match scores.")
    return arr


def check_codes(values: Any, n: int, name: str, *, mode: str | None = None) -> np.ndarray:
    """Labels aligned with ``n`` scores as int codes 0..k-1, numbered by first appearance."""
    arr = check_aligned(values, n, name, mode=mode)
    codes: dict[Hashable, int] = {}
    try:
        return np.fromiter((codes.setdefault(v, len(codes)) for v in arr.tolist()),
                           dtype=np.int64, count=n)
    except TypeError as exc:
        raise TypeError(f"{name} must be hashable (str or int): {exc}") from exc


def check_lengths(lengths: Any, n: int, name: str = "lengths", *, mode: str | None = None) -> np.ndarray:
    """Non-negative integer sizes aligned with ``n`` scores."""
    if lengths is None:
        who = f"mode {mode!r}" if mode else "this calibrator"
        raise ValueError(f"{who} needs {name} (characters or tokens per snippet); got None.")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}.")
    if arr.size != n:
        raise ValueError(f"got {arr.size} {name} for {n} scores; they must align.")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_):
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise TypeError(
                f"{name} must be non-negative integers (characters or tokens), got dtype "
                f"{arr.dtype}; pass e.g. [len(text) for text in texts]."
            )
    arr = arr.astype(np.int64)
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        raise ValueError(f"{name}[{int(neg[0])}] == {int(arr[neg[0]])}, lengths must be >= 0.")
    return arr
