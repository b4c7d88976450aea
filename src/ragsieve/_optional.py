"""Lazy imports of optional dependencies with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError`` naming the ragsieve extra to install.

    Parameters
    ----------
    module : str
        Dotted module name, e.g. ``"matplotlib.pyplot"``.
    extra : str
        Name of the extra in ``pyproject.toml`` that provides it, e.g. ``"plot"``.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    ImportError
        When the module is not installed; the message gives the pip command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module!r} is required for this feature but could not be imported ({exc}). "
            f"Install it with: pip install 'ragsieve[{extra}]'"
        ) from exc
