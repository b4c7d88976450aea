"""The ``argparse`` types of the command line and the bounds of its count options.

Each type raises ``argparse.ArgumentTypeError`` with what it expected and what it got, so a
bad value is a usage error (exit 2) naming the option, before any work is done.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, overload

from ..data.splits import MAX_SPLITS  # the library's own bound on splits

__all__ = [
    "BUDGET_UNITS",
    "DEFAULT_DELTA",
    "LIMITS",
    "NotGiven",
    "at_most",
    "bounded_int",
    "bounded_ints",
    "count",
    "finite_float",
    "floats",
    "fraction",
    "ints",
    "known_modes",
    "modes",
    "nonnegative_float",
    "nonnegative_int",
    "number",
    "port",
    "positive_float",
    "positive_int",
    "positive_ints",
]


def _float(text: str, expected: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _int(text: str, expected: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def finite_float(text: str) -> float:
    """A finite number (``nan`` and ``inf`` refused); ranges are checked by the library."""
    value = _float(text, "a finite number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text, "a finite number > 0")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _float(text, "a finite number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in the open interval (0, 1) (``nan`` fails the comparison)."""
    value = _float(text, "a number in (0, 1)")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, limits)."""
    value = _int(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


LIMITS: dict[str, int] = {
    "splits": MAX_SPLITS,
    "top_k": 10_000,            # snippets per query kept by a top-k baseline / retrieved
    "limit_queries": 10_000_000,
    "bootstrap_resamples": 100_000,
    "max_tokens": 32_768,       # length cap of a generated answer
    "n_ctx": 131_072,           # KV cache of the local model, in tokens
    "parallel": 64,             # decoding slots of the local model
    "threads": 256,             # CPU threads
    "concurrency": 256,         # LLM requests in flight
    "workers": 1_024,           # Ray actors
    "shard_bytes": 2**30,       # a shard is read into memory whole
    "batch_size": 4_096,        # snippets embedded at once
    "n_pairs": 100_000,
    "window": 10_000_000,       # recent scores kept by the adaptive mode
}
"""Upper bounds of the count options, far above any real use: a mistyped count is a usage
error (``--splits 1000000000: must be <= 10000``) instead of a run that allocates until
the kernel kills it."""


def bounded_int(high: int, *, low: int = 1) -> Any:
    """An ``argparse`` type: an integer in ``[low, high]``.

    Examples
    --------
    >>> bounded_int(10)("7")
    7
    >>> bounded_int(10)("11")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 11: must be <= 10
    """
    def parse(text: str) -> int:
        value = _int(text, f"an integer >= {low}")
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value}: must be <= {high}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def bounded_ints(high: int) -> Any:
    """An ``argparse`` type: comma-separated integers in ``[1, high]``, at least one."""
    def parse(text: str) -> list[int]:
        values = positive_ints(text)
        over = [v for v in values if v > high]
        if over:
            raise argparse.ArgumentTypeError(f"{over[0]}: must be <= {high}")
        return values

    parse.__name__ = f"integers in [1, {high}]"
    return parse


def count(name: str) -> Any:
    """The ``argparse`` type of the count option ``name`` (a key of :data:`LIMITS`)."""
    return bounded_int(LIMITS[name])


def at_most(name: str) -> str:
    """Help text naming the bound of a count option: ``"at most 10000"``."""
    return f"at most {LIMITS[name]}"


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port number (0 lets the system choose)."""
    value = _int(text, "a port number in [0, 65535]")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}")
    return value


def floats(text: str) -> list[float]:
    """Parse ``"0.1,0.2"`` into finite floats, at least one (an ``argparse`` type)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(
            f"expected finite numbers, comma-separated, got {text!r}")
    return values


def ints(text: str) -> list[int]:
    """Parse ``"1,2,3"`` into integers (an ``argparse`` type)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from exc


def positive_ints(text: str) -> list[int]:
    """Parse ``"1,2,3"`` into integers >= 1, at least one (an ``argparse`` type)."""
    values = ints(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected integers >= 1, comma-separated, got {text!r}")
    return values


def known_modes() -> tuple[str, ...]:
    from ..calibration import MODES

    return tuple(MODES)


def modes(text: str) -> list[str]:
    """Parse comma-separated guarantee modes, each one of ``ragsieve.calibration.MODES``."""
    accepted = known_modes()
    found = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in found if m not in accepted]
    if bad or not found:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {bad}; accepted: {', '.join(accepted)}")
    return found


#: The length units of the budget mode (``--budget-unit``).
BUDGET_UNITS = ("chars", "tokens")

#: ``--delta`` when not given (for ``calibrate``: the modes that take a delta).
DEFAULT_DELTA = 0.1


class NotGiven:
    """A number option's default, marked as not given on the command line.

    Not a number: read it with :func:`number` (its :attr:`value`).
    :func:`ragsieve.cli.values.calibrator_params` passes only given options.

    Parameters
    ----------
    value : float
        The default the option stands for.
    """

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def __repr__(self) -> str:
        return f"NotGiven({self.value!r})"

    def __str__(self) -> str:  # ``%(default)s`` in ``--help``: the number
        return str(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotGiven) and other.value == self.value

    def __hash__(self) -> int:
        return hash((NotGiven, self.value))


@overload
def number(value: float | NotGiven) -> float: ...
@overload
def number(value: None) -> None: ...
@overload
def number(value: float | NotGiven | None) -> float | None: ...
def number(value: float | NotGiven | None) -> float | None:
    """A number option's value: the default's number when it was not given.

    Parameters
    ----------
    value : float, NotGiven or None
        The parsed option.

    Returns
    -------
    float or None
        ``value.value`` for a :class:`NotGiven`, else ``value`` unchanged.
    """
    return value.value if isinstance(value, NotGiven) else value
