"""Shared checks of parameters and arrays: one place, one wording for every error.

Each check returns the converted value and raises ``TypeError`` for a wrong type and
``ValueError`` for a wrong value, with a message that names what was received and what
was expected (scikit-learn's ``check_scalar`` style).

The checks share their parameters' meaning:

``value``
    The parameter's value.
``name``
    The parameter's name, as the messages give it.
``allow_none``
    Accept ``None`` (returned as is).
``hint``
    Appended to the messages in parentheses (what the value means, its unit, an example,
    the fix).

JSON input and ids have one set of checks too, shared by the HTTP service and the data
readers, so a request and a data line are refused alike: :func:`loads_json` (strict JSON:
no ``NaN``, no duplicate key, at most :data:`MAX_JSON_DEPTH` levels, every number a finite
double, no lone surrogate), :func:`check_json_value` (the last two, for a value already
parsed) and :func:`check_id` (no control, bidirectional-control or zero-width character).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import unicodedata
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Literal, overload

import numpy as np

from .errors import DataError

__all__ = [
    "MAX_COUNT",
    "MAX_JSON_DEPTH",
    "check_aligned",
    "check_alpha",
    "check_bool",
    "check_codes",
    "check_finite_real",
    "check_id",
    "check_instance",
    "check_int",
    "check_json_value",
    "check_lengths",
    "check_path",
    "check_positive_int",
    "check_real",
    "check_relevant",
    "check_scores",
    "check_sequence",
    "check_str",
    "check_str_sequence",
    "check_unit_interval",
    "first_appearance_codes",
    "is_finite_number",
    "loads_json",
    "show_number",
]

#: ``include_boundaries`` of :func:`check_real`: which ends of the range are allowed.
BOUNDARIES = ("both", "left", "right", "neither")
#: Longest integer a message prints in full (digits); a longer one is described.
_MAX_SHOWN_DIGITS = 20


def _rule(text: str, allow_none: bool, hint: str | None) -> str:
    """The expectation as the messages word it: ``an int >= 1 or None (the hint)``."""
    return text + (" or None" if allow_none else "") + (f" ({hint})" if hint else "")


def _range(what: str, low: Any, high: Any, *, left: bool = True, right: bool = True) -> str:
    """``what`` with its bounds in words: ``an int in [0, 10]``, ``a real number > 0``;
    ``left`` / ``right``: whether the lower / upper bound is an allowed value."""
    if low is not None and high is not None:
        return f"{what} in {'[' if left else '('}{low}, {high}{']' if right else ')'}"
    if low is not None:
        return f"{what} {'>=' if left else '>'} {low}"
    if high is not None:
        return f"{what} {'<=' if right else '<'} {high}"
    return what


def _wrong_type(name: str, rule: str, value: Any, *, clip: bool = True) -> TypeError:
    """The ``TypeError`` of every check: ``name must be <rule>, got <type> (<value>)``, the
    value's repr clipped to 80 characters unless ``clip`` is False."""
    shown = f"{value!r:.80}" if clip else repr(value)
    return TypeError(f"{name} must be {rule}, got {type(value).__name__} ({shown}).")


def _not_real(value: Any) -> bool:
    """True unless ``value`` is a real number (bools are no numbers here)."""
    return isinstance(value, bool) or not isinstance(value, numbers.Real)


def _as_float(value: Any) -> float:
    """``float(value)``; an integer beyond the range of a double is +-inf, not an
    ``OverflowError``."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def show_number(value: Any) -> str:
    """``repr(value)`` for a message, or ``an integer of N digits`` for one too long to print.

    Examples
    --------
    >>> show_number(0.5), show_number(10**400)
    ('0.5', 'an integer of 401 digits')
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = abs(int(value))
        if number >= 10**_MAX_SHOWN_DIGITS:
            try:
                return f"an integer of {len(str(number))} digits"
            except ValueError:  # beyond int's digit limit for str()
                return f"an integer of about {int(number.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)


@overload
def check_str(value: Any, name: str, *, non_blank: bool = ..., allow_none: Literal[False] = ...,
              hint: str | None = ...) -> str: ...
@overload
def check_str(value: Any, name: str, *, non_blank: bool = ..., allow_none: bool,
              hint: str | None = ...) -> str | None: ...


def check_str(value: Any, name: str, *, non_blank: bool = False, allow_none: bool = False,
              hint: str | None = None) -> str | None:
    """``value`` if it is a str (``None`` passes when ``allow_none``).

    Parameters
    ----------
    non_blank : bool
        Refuse an empty or whitespace-only string.

    Raises
    ------
    TypeError
        ``value`` is not a str.
    ValueError
        ``non_blank`` and ``value`` is empty or whitespace-only.

    Examples
    --------
    >>> check_str("bm25", "field", non_blank=True)
    'bm25'
    >>> check_str(" ", "field", non_blank=True)
    Traceback (most recent call last):
    ...
    ValueError: field == ' ', must be a non-blank str.
    """
    if value is None and allow_none:
        return None
    rule = _rule("a non-blank str" if non_blank else "a str", allow_none, hint)
    if not isinstance(value, str):
        raise _wrong_type(name, rule, value)
    if non_blank and not value.strip():
        raise ValueError(f"{name} == {value!r}, must be {rule}.")
    return value


def check_sequence(value: Any, name: str, *, expected: str = "a sequence",
                   iterable: bool = False) -> list[Any]:
    """``value`` as a list; a single ``str`` or ``bytes`` is refused, since it would be read
    one character at a time (the message suggests ``[value]``).

    Parameters
    ----------
    expected : str
        The expectation in words, e.g. ``"a sequence of group names"``.
    iterable : bool
        Accept any iterable (a generator, a numpy array), not only a ``Sequence``.

    Raises
    ------
    TypeError
        ``value`` is a str or bytes, or not a sequence (an iterable when ``iterable``).

    Examples
    --------
    >>> check_sequence(("a", "b"), "groups")
    ['a', 'b']
    >>> check_sequence("ab", "groups", expected="a sequence of group names")
    Traceback (most recent call last):
    ...
    TypeError: groups must be a sequence of group names, got a single str ('ab'); pass ['ab'].
    """
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {expected}, got a single {type(value).__name__} "
                        f"({value!r:.60}); pass [{value!r:.60}].")
    if not isinstance(value, Iterable if iterable else Sequence):
        raise _wrong_type(name, expected, value)
    return list(value)


def check_str_sequence(value: Any, name: str, *, hint: str | None = None) -> list[str]:
    """``value`` as a list of str.

    Raises
    ------
    TypeError
        ``value`` is a single string (the message suggests ``[value]``), not a sequence, or
        holds a non-str item (named by its index).

    Examples
    --------
    >>> check_str_sequence(("a", "b"), "golds")
    ['a', 'b']
    >>> check_str_sequence(["a", 2], "golds")
    Traceback (most recent call last):
    ...
    TypeError: golds[1] must be a str, got int (2).
    """
    out = check_sequence(value, name, expected=_rule("a sequence of str", False, hint))
    for i, item in enumerate(out):
        check_str(item, f"{name}[{i}]")
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
    if _not_real(alpha):
        raise _wrong_type(name, "a real number", alpha, clip=False)
    value = _as_float(alpha)
    if math.isnan(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} == {show_number(alpha)}, must be in (0, 1).")
    return value


def check_finite_real(value: Any, name: str) -> float:
    """A single finite real number (bools refused).

    Examples
    --------
    >>> check_finite_real(0.5, "score")
    0.5
    """
    if _not_real(value):
        raise _wrong_type(name, "a real number", value, clip=False)
    out = _as_float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} == {show_number(value)}, must be a finite number.")
    return out


def check_unit_interval(value: Any, name: str, *, closed_right: bool) -> float:
    """Validate a number in (0, 1) or (0, 1]."""
    if _not_real(value):
        raise _wrong_type(name, "a real number", value, clip=False)
    v = _as_float(value)
    ok = 0.0 < v <= 1.0 if closed_right else 0.0 < v < 1.0
    if not ok:
        raise ValueError(f"{name} == {show_number(value)}, must be in "
                         f"{'(0, 1]' if closed_right else '(0, 1)'}.")
    return v


@overload
def check_int(value: Any, name: str, *, min_value: int | None = ..., max_value: int | None = ...,
              allow_none: Literal[False] = ..., hint: str | None = ...) -> int: ...
@overload
def check_int(value: Any, name: str, *, min_value: int | None = ..., max_value: int | None = ...,
              allow_none: bool, hint: str | None = ...) -> int | None: ...


def check_int(value: Any, name: str, *, min_value: int | None = None,
              max_value: int | None = None, allow_none: bool = False,
              hint: str | None = None) -> int | None:
    """Validate an int in ``[min_value, max_value]`` and return it as a plain ``int``.

    Numpy integers are accepted; bools are refused (``True`` is no count).

    Parameters
    ----------
    min_value, max_value : int, optional
        Inclusive bounds; ``None`` leaves that side open.

    Raises
    ------
    TypeError
        ``value`` is not an integer (or is a bool).
    ValueError
        ``value`` is outside the bounds.

    Examples
    --------
    >>> check_int(3, "k", min_value=1)
    3
    >>> check_int(0, "k", min_value=1)
    Traceback (most recent call last):
    ...
    ValueError: k == 0, must be an int >= 1.
    >>> check_int("3", "port", min_value=0, max_value=65535)
    Traceback (most recent call last):
    ...
    TypeError: port must be an int in [0, 65535], got str ('3').
    """
    if value is None and allow_none:
        return None
    rule = _rule(_range("an int", min_value, max_value), allow_none, hint)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _wrong_type(name, rule, value)
    out = int(value)
    if (min_value is not None and out < min_value) or (max_value is not None and out > max_value):
        raise ValueError(f"{name} == {show_number(value)}, must be {rule}.")
    return out


def check_positive_int(value: Any, name: str, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """Validate an int ``>= minimum`` (``None`` passes when ``allow_none``); see
    :func:`check_int`.

    Examples
    --------
    >>> check_positive_int(2, "n_resamples")
    2
    """
    return check_int(value, name, min_value=minimum, allow_none=allow_none)


@overload
def check_real(value: Any, name: str, *, min_value: float | None = ...,
               max_value: float | None = ..., include_boundaries: str = ...,
               allow_none: Literal[False] = ..., hint: str | None = ...) -> float: ...
@overload
def check_real(value: Any, name: str, *, min_value: float | None = ...,
               max_value: float | None = ..., include_boundaries: str = ...,
               allow_none: bool, hint: str | None = ...) -> float | None: ...


def check_real(value: Any, name: str, *, min_value: float | None = None,
               max_value: float | None = None, include_boundaries: str = "both",
               allow_none: bool = False, hint: str | None = None) -> float | None:
    """Validate a real number in a range and return it as a ``float``.

    Bools and NaN are refused; infinity passes unless a bound excludes it (e.g.
    ``min_value=0, max_value=math.inf, include_boundaries="left"`` means finite and >= 0).

    Parameters
    ----------
    min_value, max_value : float, optional
        Bounds; ``None`` leaves that side open.
    include_boundaries : {"both", "left", "right", "neither"}
        Which of the given bounds are allowed values (scikit-learn's ``check_scalar``).

    Raises
    ------
    TypeError
        ``value`` is not a real number (or is a bool).
    ValueError
        ``value`` is NaN or outside the range.

    Examples
    --------
    >>> check_real(0.5, "threshold", min_value=0, max_value=1, include_boundaries="neither")
    0.5
    >>> check_real(0, "timeout", min_value=0, include_boundaries="neither", hint="seconds")
    Traceback (most recent call last):
    ...
    ValueError: timeout == 0, must be a real number > 0 (seconds).
    """
    if include_boundaries not in BOUNDARIES:
        raise ValueError(f"include_boundaries == {include_boundaries!r}, must be one of "
                         f"{', '.join(map(repr, BOUNDARIES))}.")
    if value is None and allow_none:
        return None
    left = include_boundaries in ("both", "left")
    right = include_boundaries in ("both", "right")
    rule = _rule(_range("a real number", min_value, max_value, left=left, right=right),
                 allow_none, hint)
    if _not_real(value):
        raise _wrong_type(name, rule, value)
    out = _as_float(value)
    low_ok = min_value is None or (out >= min_value if left else out > min_value)
    high_ok = max_value is None or (out <= max_value if right else out < max_value)
    if math.isnan(out) or not (low_ok and high_ok):
        raise ValueError(f"{name} == {show_number(value)}, must be {rule}.")
    return out


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a ``bool`` if it is one (``numpy.bool_`` too); ints such as 0/1 are refused.

    Examples
    --------
    >>> check_bool(True, "create")
    True
    >>> check_bool(1, "create")
    Traceback (most recent call last):
    ...
    TypeError: create must be a bool, got int (1).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise _wrong_type(name, "a bool", value)
    return bool(value)


@overload
def check_path(value: Any, name: str, *, allow_none: Literal[False] = ...,
               hint: str | None = ...) -> str | os.PathLike[str]: ...
@overload
def check_path(value: Any, name: str, *, allow_none: bool,
               hint: str | None = ...) -> str | os.PathLike[str] | None: ...


def check_path(value: Any, name: str, *, allow_none: bool = False,
               hint: str | None = None) -> str | os.PathLike[str] | None:
    """``value`` if it is a non-empty path: a ``str`` or an ``os.PathLike`` (``None`` passes
    when ``allow_none``). Returned as given; the caller makes the ``Path``.

    Raises
    ------
    TypeError
        ``value`` is neither a str nor an ``os.PathLike``.
    ValueError
        ``value`` is the empty string (which would silently mean the current directory).

    Examples
    --------
    >>> check_path("cache.sqlite", "path")
    'cache.sqlite'
    >>> check_path(3, "path", allow_none=True)
    Traceback (most recent call last):
    ...
    TypeError: path must be a path (str or os.PathLike) or None, got int (3).
    """
    if value is None and allow_none:
        return None
    rule = _rule("a path (str or os.PathLike)", allow_none, hint)
    if not isinstance(value, (str, os.PathLike)):
        raise _wrong_type(name, rule, value)
    if not os.fspath(value):
        raise ValueError(f"{name} == {value!r}, must be a non-empty {rule.removeprefix('a ')}.")
    return value


def check_instance(value: Any, types: type | tuple[type, ...], name: str, *,
                   expected: str | None = None, allow_none: bool = False) -> Any:
    """``value`` if it is an instance of ``types`` (``None`` passes when ``allow_none``).

    Parameters
    ----------
    types : type or tuple of type
        The accepted classes.
    expected : str, optional
        The expectation in words (default: the class names), e.g. ``"a ragsieve
        calibrator (make_calibrator(mode))"``; `` or None`` is added when ``allow_none``.

    Raises
    ------
    TypeError
        ``value`` is not an instance of ``types``.

    Examples
    --------
    >>> check_instance({}, dict, "options")
    {}
    >>> check_instance([], dict, "options", expected="a mapping of option names")
    Traceback (most recent call last):
    ...
    TypeError: options must be a mapping of option names, got list ([]).
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, types):
        classes = types if isinstance(types, tuple) else (types,)
        what = expected or "an instance of " + " or ".join(c.__name__ for c in classes)
        raise _wrong_type(name, _rule(what, allow_none, None), value)
    return value


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
    except OverflowError:
        raise ValueError(f"{name} holds an integer beyond the range of a double (+-1.8e308); "
                         "every score must be a finite number.") from None
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


# --------------------------------------------------------------------------- JSON input, ids

#: Deepest nesting of arrays and objects accepted in JSON input (a request body, a data
#: line, a Parquet ``meta`` cell): far beyond what valid input needs (a request nests 4
#: levels), far below where a parser or a later ``json.dumps`` would hit Python's recursion
#: limit.
MAX_JSON_DEPTH = 64
#: Largest count a saved artifact may state (calibration pairs, queries, relevant pairs):
#: far beyond any calibration, small enough that no reader's arithmetic or loop over it runs
#: away.
MAX_COUNT = 10**9
#: The largest integer that is a finite double; JSON numbers beyond it are refused.
_MAX_FINITE_INT = int(sys.float_info.max)
#: Characters no id may hold, by kind: C0 / C1 controls (NUL, newline, escape, ...) and the
#: line / paragraph separators, which corrupt logs, terminals, paths and joins; the
#: bidirectional controls, which make an id read differently from what it is (U+202E shows
#: ``abc\u202Edef`` as ``abcfed``); zero-width characters, which make two different ids look
#: alike; lone surrogates, which cannot be encoded (UTF-8) at all.
_ID_FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("control character", "\x00-\x1f\x7f-\x9f\u2028\u2029"),
    ("bidirectional control character", "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"),
    ("zero-width character", "\u200b-\u200d\u2060\ufeff"),
    ("lone UTF-16 surrogate", "\ud800-\udfff"),
)
_ID_BAD = re.compile("[" + "".join(chars for _, chars in _ID_FORBIDDEN) + "]")
_ID_KIND = [(re.compile(f"[{chars}]"), kind) for kind, chars in _ID_FORBIDDEN]
_SURROGATE = re.compile("[\ud800-\udfff]")
#: A \uD800-\uDFFF escape in JSON text: only then can a parsed string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: A JSON string (with its escapes), then the structural characters the depth scan reads.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: ``bytes.translate`` deletes every byte but the brackets.
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+")
#: The rule of every JSON number, as the messages give it.
_FINITE_RULE = "a JSON number must be finite and within +-1.8e308 (a double)"
#: Most keys / indices of a path shown in a message.
_PATH_PARTS = 8


def _char_name(char: str) -> str:
    """``U+202E (RIGHT-TO-LEFT OVERRIDE)``; only the code point for a nameless one."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" ({name})" if name else "")


def _clip(value: str, limit: int = 60) -> str:
    """``repr(value)`` of its first ``limit`` characters (escapes make it printable)."""
    return repr(value[:limit]) + ("..." if len(value) > limit else "")


def check_id(value: str, name: str) -> str:
    """``value`` unchanged if it is printable text fit for an id.

    An id (``query_id``, ``snippet_id``, ``group``, ``doc_id``) is refused when it holds a
    control character (NUL, newline, escape, C1, U+2028 / U+2029), a bidirectional control
    (U+202A-U+202E, U+2066-U+2069, U+200E / U+200F, U+061C), a zero-width character
    (U+200B-U+200D, U+2060, U+FEFF) or a lone surrogate: the one definition of the HTTP
    service and the data readers.

    Raises
    ------
    ValueError
        Naming the character, its kind and its position (0-based).

    Examples
    --------
    >>> check_id("doc-3/0:0-120", "snippet_id")
    'doc-3/0:0-120'
    >>> check_id("abc\\u202edef", "query_id")
    Traceback (most recent call last):
    ...
    ValueError: query_id == 'abc\\u202edef' holds the bidirectional control character U+202E (RIGHT-TO-LEFT OVERRIDE) at position 3; an id must be printable text (no control, bidirectional-control or zero-width characters).
    """
    bad = _ID_BAD.search(value)
    if bad is None:
        return value
    char = bad.group()
    kind = next(k for pattern, k in _ID_KIND if pattern.match(char))
    raise ValueError(f"{name} == {_clip(value)} holds the {kind} {_char_name(char)} at position "
                     f"{bad.start()}; an id must be printable text (no control, "
                     "bidirectional-control or zero-width characters).")


def is_finite_number(value: Any) -> bool:
    """True for an int or float that is a finite double (bools are no numbers here).

    Unlike ``math.isfinite``, an integer beyond the range of a double is False, not an
    ``OverflowError``.

    Examples
    --------
    >>> is_finite_number(3), is_finite_number(10**400), is_finite_number(float("nan"))
    (True, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if isinstance(value, numbers.Integral):
        return abs(int(value)) <= _MAX_FINITE_INT
    return math.isfinite(_as_float(value))


def _path(parts: Sequence[str | int], root: str) -> str:
    """``snippets[0].text`` of the keys and indices ``parts`` (``root`` when empty, or
    first when ``parts`` starts with an index); more than 8 parts end in ``...``."""
    out = root if parts and isinstance(parts[0], int) else ""
    for part in parts[:_PATH_PARTS]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{_clip(part, 40)}]"
    return (out + ("..." if len(parts) > _PATH_PARTS else "")) or root


def _value_problem(value: Any) -> str | None:
    """What is wrong with one scalar of parsed JSON, or None."""
    if isinstance(value, str):
        bad = _SURROGATE.search(value)
        if bad is None:
            return None
        return (f"holds a lone UTF-16 surrogate U+{ord(bad.group()):04X} at position "
                f"{bad.start()}: strings must be valid Unicode (a \\uD800-\\uDFFF escape "
                "needs its pair)")
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and not is_finite_number(value):
        shown = show_number(value) if isinstance(value, int) else \
            f"{value} (a number beyond the range of a double)"
        return f"== {shown}: {_FINITE_RULE}"
    return None


def _json_ok(value: Any, strings: bool) -> bool:
    """True when every number in parsed JSON ``value`` is a finite double (and, with
    ``strings``, no string or key holds a lone surrogate): the fast check, without paths."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            if strings and any(_SURROGATE.search(key) for key in item):
                return False
            stack.extend(item.values())
        elif kind is list:
            try:  # a list of numbers (a vector) in one C call
                if math.isfinite(math.fsum(item)):
                    continue
            except (TypeError, OverflowError):
                pass
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is int:
            if not -_MAX_FINITE_INT <= item <= _MAX_FINITE_INT:
                return False
        elif kind is str and strings and _SURROGATE.search(item) is not None:
            return False
    return True


def check_json_value(value: Any, root: str = "value") -> Any:
    """``value`` unchanged if every string and key in it is valid Unicode and every number
    a finite double.

    Parameters
    ----------
    value : object
        Parsed JSON (dicts, lists, str, int, float, bool, None; other objects pass).
    root : str
        What ``value`` is, named in the message when the problem is ``value`` itself.

    Raises
    ------
    ValueError
        One line naming the first bad place by its path (``snippets[0].text``), the
        problem (a lone surrogate and its position; a number beyond a double) and the rule.

    Examples
    --------
    >>> check_json_value({"evidence": [[0, 10**400]]})
    Traceback (most recent call last):
    ...
    ValueError: evidence[0][1] == an integer of 401 digits: a JSON number must be finite and within +-1.8e308 (a double).
    """
    if _json_ok(value, strings=True):
        return value
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, parts = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and _SURROGATE.search(key) is not None:
                    where = f"a key ({_clip(key, 40)}) of {_path(parts, root)}"
                    raise ValueError(f"{where} {_value_problem(key)}.")
            stack.extend((v, (*parts, str(k))) for k, v in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, (*parts, i)) for i, v in reversed(list(enumerate(item))))
        else:
            problem = _value_problem(item)
            if problem is not None:
                raise ValueError(f"{_path(parts, root)} {problem}.")
    return value


def _too_deep(text: str, limit: int) -> tuple[str, int] | None:
    """Where ``text`` nests arrays / objects more than ``limit`` deep: the path of the
    innermost named field and the character (1-based); None if it does not.

    Runs in C for any text without many brackets; never recurses.
    """
    if text.count("[") + text.count("{") <= limit:
        return None
    outside = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    depth = 0
    for byte in outside.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        if depth > limit:
            break
    else:
        return None
    return _deep_place(text, limit)


def _deep_place(text: str, limit: int) -> tuple[str, int]:
    """The path and character at which ``text`` first nests deeper than ``limit``."""
    frames: list[list[Any]] = []  # [kind, key or index, expecting a key]
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            frames.append(["array", 0, False] if token == "[" else ["object", None, True])
            if len(frames) > limit:
                parts = [f[1] for f in frames[:-1] if f[1] is not None]
                named = max((i for i, p in enumerate(parts) if isinstance(p, str)), default=-1)
                return _path(parts[:named + 1], ""), match.start() + 1
        elif token in "]}":
            if frames:
                frames.pop()
        elif not frames:
            continue
        elif token == ",":
            frame = frames[-1]
            if frame[0] == "array":
                frame[1] += 1
            else:
                frame[2] = True
        elif frames[-1][0] == "object" and frames[-1][2]:
            try:
                frames[-1][1] = json.loads(token)
            except ValueError:
                frames[-1][1] = token[1:-1]
            frames[-1][2] = False
    return "", len(text)  # pragma: no cover - _too_deep saw the depth


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON: numbers must be finite (no NaN, Infinity or "
                     "-Infinity)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {_clip(key, 40)} in one object; give each key "
                                 "once")
            seen.add(key)
    return obj


def loads_json(text: str, root: str = "value") -> Any:
    """Parse ``text`` as strict JSON (RFC 8259): the one parser of request bodies and data lines.

    Refused: ``NaN`` / ``Infinity`` literals, a duplicate key, nesting deeper than
    :data:`MAX_JSON_DEPTH` (found before the parser recurses), an integer of more than
    4300 digits, a number beyond the range of a double and a string or key holding a lone
    surrogate (``"\\ud800"``).

    Parameters
    ----------
    text : str
        The JSON text.
    root : str
        What the text is (``"body"``, ``"line"``), named when the problem is the whole value.

    Raises
    ------
    json.JSONDecodeError
        The text is not JSON (its ``msg``, ``lineno`` and ``colno`` say where).
    ValueError
        Any other refusal, one line naming the field by its path and the rule.

    Examples
    --------
    >>> loads_json('{"text": "a", "bm25": 0.5}')
    {'text': 'a', 'bm25': 0.5}
    >>> loads_json('{"snippets": [{"text": "a\\\\ud800"}]}')
    Traceback (most recent call last):
    ...
    ValueError: snippets[0].text holds a lone UTF-16 surrogate U+D800 at position 1: strings must be valid Unicode (a \\uD800-\\uDFFF escape needs its pair).
    >>> loads_json('{"x": ' + "[" * 100000 + "]" * 100000 + '}')
    Traceback (most recent call last):
    ...
    ValueError: x nests arrays and objects more than 64 deep (at character 70); JSON input may nest at most 64 levels.
    """
    deep = _too_deep(text, MAX_JSON_DEPTH)
    if deep is not None:
        raise ValueError(f"{deep[0] or root} nests arrays and objects more than "
                         f"{MAX_JSON_DEPTH} deep (at character {deep[1]}); JSON input may nest "
                         f"at most {MAX_JSON_DEPTH} levels.")
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError:
        raise
    except RecursionError:  # pragma: no cover - the depth scan refuses such text first
        raise ValueError(f"{root} is nested too deeply to parse.") from None
    except ValueError as exc:  # NaN, a duplicate key, or an integer beyond int's digit limit
        message = str(exc)
        if "integer string conversion" in message or "digits" in message:
            message = f"{root} holds an integer of more than 4300 digits: {_FINITE_RULE}"
        raise ValueError(message + ".") from None
    if not _json_ok(value, strings=_SURROGATE_ESCAPE.search(text) is not None):
        check_json_value(value, root)  # says where
    return value


def first_appearance_codes(values: Sequence[Any]) -> np.ndarray:
    """Values (labels, topics, groups) as int codes 0..k-1, numbered by first appearance.

    Examples
    --------
    >>> first_appearance_codes(["b", "a", "b"]).tolist()
    [0, 1, 0]
    """
    seen: dict[Any, int] = {}
    return np.array([seen.setdefault(v, len(seen)) for v in values], dtype=int)
