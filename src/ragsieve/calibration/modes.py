"""The one place guarantee-mode names are resolved.

=============== ============================================= ============================
mode            guarantee                                     class
=============== ============================================= ============================
marginal        P(relevant snippet kept) >= 1 - alpha         SplitConformalCalibrator
query-recall    E[share of a query's evidence kept] >= 1-a    QueryRecallCalibrator
query-all       P(all of a query's evidence kept) >= 1 - a    QueryAllCalibrator
pac             P_cal(coverage >= 1 - alpha) >= 1 - delta     PACCalibrator
group           coverage >= 1 - alpha within every group      MondrianCalibrator
topic           coverage on a new topic >= 1 - alpha          TopicCalibrator
topic-pac       ... with confidence 1 - delta (RCPS)          TopicPACCalibrator
budget          best snippets within N chars/tokens a query   BudgetCalibrator
adaptive        long-run coverage under shift (feedback)      AdaptiveCalibrator
=============== ============================================= ============================
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from ..errors import ArtifactError
from .adaptive import AdaptiveCalibrator
from .base import BaseCalibrator
from .budget import BudgetCalibrator
from .mondrian import MondrianCalibrator
from .pac import PACCalibrator
from .query import QueryAllCalibrator, QueryRecallCalibrator
from .split import SplitConformalCalibrator
from .topic import TopicCalibrator
from .topic_pac import TopicPACCalibrator

__all__ = ["CALIBRATORS", "MODES", "calibrator_from_state", "make_calibrator", "mode_params"]

logger = logging.getLogger(__name__)

CALIBRATORS: dict[str, type[BaseCalibrator]] = {
    cls.mode: cls
    for cls in (SplitConformalCalibrator, QueryRecallCalibrator, QueryAllCalibrator,
                PACCalibrator, MondrianCalibrator, TopicCalibrator, TopicPACCalibrator,
                BudgetCalibrator, AdaptiveCalibrator)
}
MODES: tuple[str, ...] = tuple(CALIBRATORS)


def _class_of(mode: Any) -> type[BaseCalibrator]:
    try:
        return CALIBRATORS[mode]
    except (KeyError, TypeError):
        raise ValueError(f"mode == {mode!r}; accepted modes: {', '.join(MODES)}.") from None


def mode_params(mode: str) -> tuple[str, ...]:
    """The parameters :func:`make_calibrator` takes for ``mode``: its calibrator's keyword
    parameters (for a mode that takes a coverage ``target`` instead, ``budget``, also
    ``alpha``, read as ``target = 1 - alpha``: ``BaseCalibrator.alpha_as_target``).

    Raises
    ------
    ValueError
        Unknown mode.

    Examples
    --------
    >>> mode_params("pac")
    ('alpha', 'delta')
    """
    cls = _class_of(mode)
    names = tuple(cls._param_names())
    return ("alpha", *names) if cls.alpha_as_target else names


def make_calibrator(mode: str, **params: Any) -> BaseCalibrator:
    """The calibrator of a guarantee mode.

    Parameters
    ----------
    mode : str
        One of :data:`MODES`.
    **params
        Constructor parameters of the mode (alpha, delta, min_group_size, budget, unit,
        gamma, window, ...; :func:`mode_params` lists them). None for a parameter the
        mode does not take counts as not given. For ``budget``, ``alpha`` becomes the
        coverage ``target = 1 - alpha`` the budget is measured against.

    Raises
    ------
    TypeError
        A parameter (not None) that ``mode`` does not take; the message lists those it
        takes. (One set of options for several modes: keep, per mode, the names in
        :func:`mode_params`.)
    ValueError
        Unknown mode, or ``budget`` given both ``alpha`` and ``target``.

    Examples
    --------
    >>> make_calibrator("pac", alpha=0.1, delta=0.05)
    PACCalibrator(alpha=0.1, delta=0.05)
    >>> make_calibrator("marginal", alpha=0.1, delta=0.05)
    Traceback (most recent call last):
    ...
    TypeError: mode 'marginal' does not take delta; it takes: alpha.
    """
    cls = _class_of(mode)
    accepted = mode_params(mode)
    refused = [k for k, v in params.items() if k not in accepted and v is not None]
    if refused:
        raise TypeError(f"mode {mode!r} does not take {', '.join(refused)}; it takes: "
                        f"{', '.join(accepted)}.")
    taken = {k: v for k, v in params.items() if k in accepted}
    alpha = taken.pop("alpha", None) if cls.alpha_as_target else None
    if alpha is not None:
        if taken.get("target") is not None:
            raise ValueError(f"mode {mode!r} got alpha == {alpha!r} and target == "
                             f"{taken['target']!r}; pass one (target = 1 - alpha).")
        taken["target"] = 1.0 - float(alpha)
    return cls(**taken)


def calibrator_from_state(mode: Any, params: Any, state: Any) -> BaseCalibrator:
    """Rebuild a fitted calibrator from an artifact's ``mode``, ``params`` and ``state``.

    Raises
    ------
    ArtifactError
        Unknown mode or malformed params / state.
    """
    try:
        cls = _class_of(mode)
    except ValueError as exc:
        raise ArtifactError(f"artifact calibration: {exc}") from None
    if not isinstance(params, dict):
        raise ArtifactError(f"artifact calibration params must be an object, got {params!r}.")
    sig = inspect.signature(cls.__init__)
    unknown = sorted(set(params) - set(sig.parameters))
    if unknown:
        raise ArtifactError(f"artifact calibration params {unknown} are not parameters of mode {mode!r}.")
    return cls.from_state(params, state)
