"""The shared parameter checks of ragsieve._validation: every branch of each shape.

Wrong type -> TypeError, wrong value -> ValueError; each message names the parameter,
what was received and what was expected.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ragsieve._validation import (
    check_bool,
    check_instance,
    check_int,
    check_path,
    check_positive_int,
    check_real,
    check_sequence,
    check_str,
    check_str_sequence,
)

# --------------------------------------------------------------------------- check_int


def test_check_int_accepts_ints_and_numpy_ints_and_returns_plain_int() -> None:
    assert check_int(3, "k") == 3
    out = check_int(np.int64(4), "k", min_value=1)
    assert out == 4 and type(out) is int


@pytest.mark.parametrize("value", [True, False, 1.0, "3", None, np.bool_(True)])
def test_check_int_wrong_type(value: object) -> None:
    with pytest.raises(TypeError, match=r"^k must be an int >= 1, got "):
        check_int(value, "k", min_value=1)


def test_check_int_boundaries_are_inclusive() -> None:
    assert check_int(0, "port", min_value=0, max_value=65535) == 0
    assert check_int(65535, "port", min_value=0, max_value=65535) == 65535
    with pytest.raises(ValueError, match=r"^port == -1, must be an int in \[0, 65535\]\.$"):
        check_int(-1, "port", min_value=0, max_value=65535)
    with pytest.raises(ValueError, match=r"^port == 65536, must be an int in \[0, 65535\]\.$"):
        check_int(65536, "port", min_value=0, max_value=65535)


def test_check_int_one_sided_and_unbounded() -> None:
    with pytest.raises(ValueError, match=r"^k == 0, must be an int >= 1\.$"):
        check_int(0, "k", min_value=1)
    with pytest.raises(ValueError, match=r"^k == 11, must be an int <= 10\.$"):
        check_int(11, "k", max_value=10)
    assert check_int(-(10**30), "seed") == -(10**30)
    with pytest.raises(TypeError, match=r"^seed must be an int, got float \(1\.5\)\.$"):
        check_int(1.5, "seed")


def test_check_int_allow_none_and_hint() -> None:
    assert check_int(None, "window", min_value=1, allow_none=True) is None
    with pytest.raises(TypeError, match=r"^window must be an int >= 1, got NoneType"):
        check_int(None, "window", min_value=1)
    with pytest.raises(ValueError, match=r"^window == 0, must be an int >= 1 or None "
                                         r"\(None keeps all\)\.$"):
        check_int(0, "window", min_value=1, allow_none=True, hint="None keeps all")


def test_check_positive_int_keeps_its_signature() -> None:
    assert check_positive_int(2, "n") == 2
    assert check_positive_int(None, "n", allow_none=True) is None
    assert check_positive_int(0, "n", minimum=0) == 0
    with pytest.raises(ValueError, match=r"^n == 0, must be an int >= 1\.$"):
        check_positive_int(0, "n")
    with pytest.raises(ValueError, match=r"^n == 1, must be an int >= 2 or None\.$"):
        check_positive_int(1, "n", minimum=2, allow_none=True)
    with pytest.raises(TypeError, match=r"^n must be an int >= 1, got bool \(True\)\.$"):
        check_positive_int(True, "n")


# --------------------------------------------------------------------------- check_real


def test_check_real_accepts_numbers_and_returns_float() -> None:
    for value in (1, 0.5, np.float32(0.25), np.int64(2)):
        out = check_real(value, "x")
        assert out == float(value) and type(out) is float
    assert check_real(math.inf, "x") == math.inf  # no bound excludes it


@pytest.mark.parametrize("value", [True, "0.5", None, [0.5], np.bool_(False)])
def test_check_real_wrong_type(value: object) -> None:
    with pytest.raises(TypeError, match=r"^x must be a real number in \(0, 1\), got "):
        check_real(value, "x", min_value=0, max_value=1, include_boundaries="neither")


def test_check_real_refuses_nan_even_without_bounds() -> None:
    with pytest.raises(ValueError, match=r"^x == nan, must be a real number\.$"):
        check_real(math.nan, "x")


@pytest.mark.parametrize(("boundaries", "rule", "low_ok", "high_ok"), [
    ("both", "[0, 1]", True, True),
    ("left", "[0, 1)", True, False),
    ("right", "(0, 1]", False, True),
    ("neither", "(0, 1)", False, False),
])
def test_check_real_boundaries(boundaries: str, rule: str, low_ok: bool, high_ok: bool) -> None:
    assert check_real(0.5, "x", min_value=0, max_value=1, include_boundaries=boundaries) == 0.5
    for edge, ok in ((0, low_ok), (1, high_ok)):
        if ok:
            assert check_real(edge, "x", min_value=0, max_value=1,
                              include_boundaries=boundaries) == edge
        else:
            with pytest.raises(ValueError, match=rf"^x == {edge}, must be a real number in "
                                                 rf"{re.escape(rule)}\.$"):
                check_real(edge, "x", min_value=0, max_value=1, include_boundaries=boundaries)
    for outside in (-0.1, 1.1):
        with pytest.raises(ValueError, match=rf"^x == {outside}, must be"):
            check_real(outside, "x", min_value=0, max_value=1, include_boundaries=boundaries)


def test_check_real_one_sided_bounds() -> None:
    with pytest.raises(ValueError, match=r"^t == 0, must be a real number > 0 \(seconds\)\.$"):
        check_real(0, "t", min_value=0, include_boundaries="neither", hint="seconds")
    assert check_real(0, "t", min_value=0) == 0.0
    with pytest.raises(ValueError, match=r"^t == 2, must be a real number <= 1\.$"):
        check_real(2, "t", max_value=1)
    with pytest.raises(ValueError, match=r"^t == 1, must be a real number < 1\.$"):
        check_real(1, "t", max_value=1, include_boundaries="left")


def test_check_real_finite_through_an_infinite_bound() -> None:
    assert check_real(0, "temperature", min_value=0, max_value=math.inf,
                      include_boundaries="left") == 0.0
    with pytest.raises(ValueError, match=r"^temperature == inf, must be a real number in "
                                         r"\[0, inf\)\.$"):
        check_real(math.inf, "temperature", min_value=0, max_value=math.inf,
                   include_boundaries="left")


def test_check_real_allow_none_and_bad_boundaries() -> None:
    assert check_real(None, "x", allow_none=True) is None
    with pytest.raises(TypeError, match=r"^x must be a real number >= 0 or None, got str"):
        check_real("a", "x", min_value=0, allow_none=True)
    with pytest.raises(ValueError, match="include_boundaries == 'open', must be one of"):
        check_real(0.5, "x", include_boundaries="open")


# --------------------------------------------------------------------------- check_bool


def test_check_bool() -> None:
    assert check_bool(True, "flag") is True
    out = check_bool(np.bool_(False), "flag")
    assert out is False
    for value in (1, 0, "yes", None):
        with pytest.raises(TypeError, match=r"^flag must be a bool, got "):
            check_bool(value, "flag")


# --------------------------------------------------------------------------- check_path


def test_check_path(tmp_path: Path) -> None:
    assert check_path("a.sqlite", "path") == "a.sqlite"
    assert check_path(tmp_path, "path") is tmp_path
    assert check_path(None, "path", allow_none=True) is None
    with pytest.raises(TypeError, match=r"^path must be a path \(str or os\.PathLike\), got int"):
        check_path(3, "path")
    with pytest.raises(TypeError, match=r"^path must be a path \(str or os\.PathLike\), got "
                                        r"NoneType"):
        check_path(None, "path")
    with pytest.raises(TypeError, match=r"or None \(a .gguf file\), got bytes"):
        check_path(b"x", "path", allow_none=True, hint="a .gguf file")
    with pytest.raises(ValueError, match=r"^path == '', must be a non-empty path"):
        check_path("", "path")


def test_check_path_accepts_any_pathlike() -> None:
    class Custom(os.PathLike[str]):
        def __fspath__(self) -> str:
            return "custom"

    value = Custom()
    assert check_path(value, "path") is value


# --------------------------------------------------------------------------- check_str


def test_check_str() -> None:
    assert check_str("", "s") == ""
    assert check_str(" a ", "s", non_blank=True) == " a "
    assert check_str(None, "s", allow_none=True) is None
    with pytest.raises(TypeError, match=r"^s must be a str, got bytes \(b'x'\)\.$"):
        check_str(b"x", "s")
    with pytest.raises(TypeError, match=r"^s must be a str, got NoneType"):
        check_str(None, "s")
    for blank in ("", " \n\t"):
        with pytest.raises(ValueError, match=r"^s == .*, must be a non-blank str or None "
                                             r"\(e\.g\. 'x'\)\.$"):
            check_str(blank, "s", non_blank=True, allow_none=True, hint="e.g. 'x'")


# --------------------------------------------------------------------------- check_instance


def test_check_instance() -> None:
    d: dict[str, int] = {}
    assert check_instance(d, dict, "options") is d
    assert check_instance(None, dict, "options", allow_none=True) is None
    with pytest.raises(TypeError, match=r"^options must be an instance of dict or list, "
                                        r"got int \(3\)\.$"):
        check_instance(3, (dict, list), "options")
    with pytest.raises(TypeError, match=r"^options must be a mapping or None, got str \('a'\)"):
        check_instance("a", dict, "options", expected="a mapping", allow_none=True)
    with pytest.raises(TypeError, match=r"^options must be an instance of dict, got NoneType"):
        check_instance(None, dict, "options")


# --------------------------------------------------------------------------- sequences


def test_check_sequence() -> None:
    assert check_sequence(("a", 1), "items") == ["a", 1]
    assert check_sequence(iter("ab"), "items", iterable=True) == ["a", "b"]
    assert check_sequence(np.arange(2), "items", iterable=True) == [0, 1]
    with pytest.raises(TypeError, match=r"^items must be a sequence, got generator"):
        check_sequence((x for x in "ab"), "items")
    with pytest.raises(TypeError, match=r"^items must be a list of str, got a single str "
                                        r"\('ab'\); pass \['ab'\]\.$"):
        check_sequence("ab", "items", expected="a list of str", iterable=True)
    with pytest.raises(TypeError, match=r"got a single bytes"):
        check_sequence(b"ab", "items")
    with pytest.raises(TypeError, match=r"^items must be a sequence, got int \(3\)\.$"):
        check_sequence(3, "items", iterable=True)


def test_check_str_sequence() -> None:
    assert check_str_sequence(("a", "b"), "golds") == ["a", "b"]
    with pytest.raises(TypeError, match=r"^golds must be a sequence of str \(the answers\), "
                                        r"got a single str"):
        check_str_sequence("a", "golds", hint="the answers")
    with pytest.raises(TypeError, match=r"^golds must be a sequence of str, got set"):
        check_str_sequence({"a"}, "golds")
    with pytest.raises(TypeError, match=r"^golds\[1\] must be a str, got int \(2\)\.$"):
        check_str_sequence(["a", 2], "golds")


# --------------------------------------------------------------------------- messages


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(TypeError) as info:
        check_int("x" * 1000, "k")
    assert len(str(info.value)) < 150
