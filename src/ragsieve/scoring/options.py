"""Options a scorer declares: the keyword arguments it takes and the command-line flag of each.

Every registered scorer names its options (simonw/llm's plugin-declared ``Options`` are the
model): the constructor keyword, its type and default, a help line, and the flag that sets
it on the command line. The CLI adds the flags and builds every scorer through
:func:`~ragsieve.scoring.resolve_scorer` from them, so a new scorer touches its own module
(and its :func:`~ragsieve.scoring.register_scorer` call) and nothing in ``cli/``.

An option is a keyword of the factory, or one field of a value the factory takes whole (an
:class:`OptionPack`: the ``rerank_*`` options of ``best`` and ``auto`` make their ``rerank``
keyword's reranker): :func:`pack_options`, the one place that packs them, turns the flat
keywords the command line and a spec give into that value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OptionPack", "ScorerOption", "check_options", "pack_options"]


@dataclass(frozen=True)
class OptionPack:
    """A value a factory takes whole, made of flat options (one field each).

    Parameters
    ----------
    keyword : str
        The factory keyword that takes the value (``"rerank"``).
    build : callable
        ``build(given, flat) -> value``: the value of the keyword given as it is (or None)
        and of the flat options given (``{"rerank_url": ...}``, by option name); it checks
        them (a flat option it does not know is a ``TypeError``) and refuses both at once.
    """

    keyword: str
    build: Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class ScorerOption:
    """One keyword argument of a scorer, and how the command line sets it.

    Parameters
    ----------
    name : str
        The constructor keyword (``"kind"``).
    type : type
        What the value is (``str``, ``bool``, ...); a ``bool`` flag is a switch.
    default : object
        The constructor's default; the CLI passes a value only when it differs.
    help : str
        The flag's help line.
    flag : str or None
        The command-line flag (``"--relative-kind"``); None: not on the command line. A
        ``bool`` option whose flag starts with ``--no-`` is set to False by the flag.
    choices : tuple of str, optional
        The accepted values.
    metavar : str, optional
        The value's name in ``--help``.
    required : bool
        The CLI asks for the flag when this scorer is chosen (it has no default there).
    runtime : bool
        The value does not change the scores (a cache, an endpoint): taken from the command
        line when a saved filter's scorer is rebuilt from its spec.
    group : str
        The ``--help`` section of the flag: ``"score"`` or ``"llm"`` (the LLM endpoint's).
    pack : OptionPack, optional
        The value this option is a field of; None: a keyword of the factory itself.

    Examples
    --------
    >>> ScorerOption("kind", str, "gap", "how a cosine is compared", "--relative-kind").dest
    'relative_kind'
    """

    name: str
    type: type
    default: Any
    help: str
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    required: bool = False
    runtime: bool = False
    group: str = "score"
    pack: OptionPack | None = None

    @property
    def dest(self) -> str | None:
        """The attribute the parsed flag lands in (``--relative-kind`` -> ``relative_kind``)."""
        return None if self.flag is None else self.flag.lstrip("-").replace("-", "_")

    @property
    def negated(self) -> bool:
        """True for a ``bool`` option set to False by its flag (``--no-cache``)."""
        return self.type is bool and bool(self.flag) and str(self.flag).startswith("--no-")

    def argparse_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ArgumentParser.add_argument`` for :attr:`flag`."""
        if self.type is bool:
            return {"action": "store_true", "help": self.help}
        kwargs: dict[str, Any] = {"default": None if self.required else self.default,
                                  "help": self.help}
        if self.choices is not None:
            kwargs["choices"] = list(self.choices)
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.type is not str and self.choices is None:
            kwargs["type"] = self.type
        return kwargs


def check_options(options: Sequence[ScorerOption], *, alias: str) -> tuple[ScorerOption, ...]:
    """Validate a scorer's declared options: ``ScorerOption`` values, distinct names and flags.

    Raises
    ------
    TypeError
        An element is not a ``ScorerOption``.
    ValueError
        Two options share a name or a flag.
    """
    if isinstance(options, (str, bytes, ScorerOption)):
        raise TypeError(f"options of scorer {alias!r} is a {type(options).__name__}, expected "
                        "a sequence of ScorerOption.")
    out = tuple(options)
    for i, opt in enumerate(out):
        if not isinstance(opt, ScorerOption):
            raise TypeError(f"options[{i}] of scorer {alias!r} is {type(opt).__name__}, "
                            "expected ScorerOption.")
    for what, values in (("name", [o.name for o in out]),
                         ("flag", [o.flag for o in out if o.flag is not None])):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"scorer {alias!r} declares the option {what}(s) {twice} twice; "
                             f"each {what} must be declared once.")
    return out


def pack_options(declared: Sequence[ScorerOption], params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the flat options of each :class:`OptionPack` of ``declared`` packed
    into the value of its keyword (the other keywords as they are).

    Raises
    ------
    TypeError, ValueError
        As the pack's ``build`` does: a flat option it does not take, a value given both
        whole and by its fields.

    Examples
    --------
    >>> pack = OptionPack("size", lambda given, flat: given or (flat["w"], flat["h"]))
    >>> opts = [ScorerOption("w", int, 1, "width", pack=pack),
    ...         ScorerOption("h", int, 1, "height", pack=pack)]
    >>> pack_options(opts, {"w": 2, "h": 3, "name": "x"})
    {'name': 'x', 'size': (2, 3)}
    """
    out = dict(params)
    packs = {o.pack.keyword: o.pack for o in declared if o.pack is not None}
    for keyword, pack in packs.items():
        names = [o.name for o in declared if o.pack is pack]
        flat = {name: out.pop(name) for name in names if name in out}
        if flat:
            out[keyword] = pack.build(out.get(keyword), flat)
    return out
