"""Package surface: __all__ complete and importable, extras named in errors exist, doctests."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ragsieve

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ragsieve"


def test_all_is_importable_and_complete() -> None:
    for name in ragsieve.__all__:
        assert hasattr(ragsieve, name), name
    public = {n for n in vars(ragsieve) if not n.startswith("_") and not isinstance(getattr(ragsieve, n), type(sys))}
    assert public <= set(ragsieve.__all__), public - set(ragsieve.__all__)


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages([str(SRC)], prefix="ragsieve.")]


@pytest.mark.parametrize("module", _modules())
def test_submodule_all_names_exist(module: str) -> None:
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{module}.{name}"


def test_extras_named_in_messages_exist() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named: set[str] = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        named |= set(re.findall(r"ragsieve\[([a-z0-9_-]+)\]", text))
        named |= set(re.findall(r"require\([^)]*?,\s*\"([a-z0-9_-]+)\"\)", text))
    assert named, "expected at least one extra named in the source"
    assert named <= extras, f"extras named in messages but missing in pyproject: {named - extras}"


def test_import_is_light() -> None:
    code = "import sys, ragsieve; print(any(m in sys.modules for m in ('torch', 'sentence_transformers', 'matplotlib', 'scipy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("module", [m for m in _modules() if not m.endswith("__main__")])
def test_doctests(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
