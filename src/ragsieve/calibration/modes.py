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

__all__ = ["CALIBRATORS", "MODES", "calibrator_from_state", "make_calibrator"]

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


def make_calibrator(mode: str, **params: Any) -> BaseCalibrator:
    """The calibrator of a guarantee mode.

    Parameters
    ----------
    mode : str
        One of :data:`MODES`.
    **params
        Constructor parameters (alpha, delta, min_group_size, budget, unit, gamma,
        window, ...). Those the mode does not take are ignored (logged at debug level),
        so one set of options can serve every mode. For ``budget``, ``alpha`` becomes
        the coverage ``target = 1 - alpha`` the budget is measured against.

    Examples
    --------
    >>> make_calibrator("pac", alpha=0.1, delta=0.05)
    PACCalibrator(alpha=0.1, delta=0.05)
    """
    cls = _class_of(mode)
    names = set(cls._param_names())
    if cls is BudgetCalibrator and "alpha" in params and params.get("target") is None:
        params = {**params, "target": 1.0 - float(params["alpha"])}
    taken = {k: v for k, v in params.items() if k in names}
    ignored = sorted(k for k, v in params.items() if k not in names and v is not None)
    if ignored:
        logger.debug("mode %s ignores %s", mode, ignored)
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
