"""The calibrator contract: every guarantee mode is one estimator of the same shape.

scikit-learn's estimator contract, as MAPIE's conformity scores follow it:

* ``__init__`` stores keyword-only parameters, nothing else;
* ``fit(scores, relevant=None, *, query_ids=None, groups=None, lengths=None)`` validates,
  learns state whose names end in ``_`` (always ``threshold_``, ``n_calibration_`` and
  ``infinite_``), returns ``self``;
* ``predict(scores, *, query_ids=None, groups=None, lengths=None)`` returns the keep-mask;
  using it unfitted raises :class:`~ragsieve.errors.NotFittedError`;
* ``guarantee()`` says what is promised, on which metric, at which target, and what the
  promise needs (calibration size, topics);
* ``get_params`` / ``set_params`` are derived from ``__init__``'s signature;
* ``to_state()`` / ``from_state(params, state)`` carry a fitted calibrator through the
  JSON filter artifact.

``fit_requires`` and ``predict_requires`` name the per-snippet inputs a mode needs
besides the scores (``"query_ids"``, ``"groups"``, ``"lengths"``); a caller such as
:class:`~ragsieve.filter.ConformalFilter` passes what it has and the calibrator checks.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np

from .._validation import MAX_COUNT, check_alpha, check_scores
from ..errors import ArtifactError, NotFittedError
from ..types import DEFAULT_ALPHA

__all__ = ["UNIT_NOUNS", "BaseCalibrator", "Guarantee", "Nouns", "ThresholdCalibrator", "nouns"]


@dataclass(frozen=True)
class Nouns:
    """How a guarantee statement names the units a calibrator was fitted on.

    A filter of unit ``"snippet"`` calibrates on snippets, whose positives are relevant
    snippets; one of unit ``"sentence"`` on sentences, whose positives are evidence
    sentences. Every calibrator's :meth:`BaseCalibrator.guarantee` takes the unit and
    words its statement with these nouns.

    Examples
    --------
    >>> nouns("sentence").relevant_plural
    'evidence sentences'
    """

    plural: str
    relevant: str
    a_relevant: str
    relevant_plural: str
    live_relevant_plural: str


#: The nouns of each unit a filter calibrates on (``ConformalFilter.unit``).
UNIT_NOUNS: dict[str, Nouns] = {
    "snippet": Nouns(plural="snippets", relevant="relevant snippet",
                     a_relevant="a relevant snippet", relevant_plural="relevant snippets",
                     live_relevant_plural="relevant live snippets"),
    "sentence": Nouns(plural="sentences", relevant="evidence sentence",
                      a_relevant="an evidence sentence", relevant_plural="evidence sentences",
                      live_relevant_plural="live evidence sentences"),
}


def nouns(unit: str) -> Nouns:
    """The :class:`Nouns` of ``unit`` (``"snippet"`` or ``"sentence"``).

    Raises
    ------
    ValueError
        For another unit, naming the ones accepted.
    """
    try:
        return UNIT_NOUNS[unit]
    except (KeyError, TypeError):
        raise ValueError(f"unit == {unit!r}; expected one of {', '.join(UNIT_NOUNS)}.") from None


@dataclass(frozen=True)
class Guarantee:
    """What a fitted calibrator promises.

    Attributes
    ----------
    mode : str
        The guarantee mode (``"marginal"``, ``"query-all"``, ...).
    metric : str
        The quantity the promise is about, named as ``evaluate`` reports it
        (``coverage``, ``query_coverage``, ``query_all_kept``, ``group_coverage_min``,
        ``topic_coverage``, ``coverage_quantile_<delta>``, ``miss_rate``).
    target : float or None
        The promised value of ``metric`` (``1 - alpha``); ``None`` for a budget, which
        promises a size and reports an estimated coverage instead.
    statement : str
        The promise in one sentence.
    alpha : float or None
        The miscoverage level.
    n_calibration : int
        Calibration units the state was learned from (snippets, queries or topics).
    n_required : int or None
        Units needed for a finite (non-trivial) threshold at this alpha.
    infinite : bool
        True when the calibration data was too small and everything is kept.
    details : dict
        Mode-specific facts (coverage band, per-group sizes, delta, budget report, ...).
    """

    mode: str
    metric: str
    target: float | None
    statement: str
    alpha: float | None
    n_calibration: int
    n_required: int | None = None
    infinite: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (the service and the artifact carry it)."""
        return {
            "mode": self.mode, "metric": self.metric, "target": self.target,
            "statement": self.statement, "alpha": self.alpha,
            "n_calibration": self.n_calibration, "n_required": self.n_required,
            "infinite": self.infinite, "details": dict(self.details),
        }


def _json_float(x: float) -> float | None:
    return None if math.isinf(x) else float(x)


def _read_float(state: dict[str, Any], key: str, *, allow_inf: bool = True) -> float:
    """A float from saved state: ``None`` stands for +inf; strings and bools are refused."""
    value = state.get(key, ...)
    if value is ...:
        raise ArtifactError(f"calibration state has no {key!r}.")
    if value is None and allow_inf:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArtifactError(f"calibration state {key!r} == {value!r}, expected a number.")
    out = float(value)
    if not math.isfinite(out):
        raise ArtifactError(f"calibration state {key!r} == {value!r}, expected a finite number.")
    return out


class BaseCalibrator(ABC):
    """Base class of every guarantee mode (see the module docstring for the contract)."""

    mode: ClassVar[str]
    #: inputs besides scores and labels that ``fit`` needs
    fit_requires: ClassVar[frozenset[str]] = frozenset()
    #: inputs besides scores that ``predict`` needs
    predict_requires: ClassVar[frozenset[str]] = frozenset()
    #: True when ``fit`` uses the scores of non-relevant snippets too (budgets); other
    #: modes learn from the relevant ones alone, so callers may score only those
    uses_irrelevant: ClassVar[bool] = False
    #: what ``groups`` means for this mode: ``"topic"`` (the exchangeable unit of
    #: calibration, ``Pair.group``), ``"attribute"`` (a field the guarantee is conditional
    #: on, e.g. language) or None (groups unused)
    group_kind: ClassVar[str | None] = None
    #: True when the fitted calibrator learns online from labelled live snippets
    #: (``update(score, relevant)``, ``update_batch``): what ``serve --adaptive`` and the
    #: feedback store ask for (the ``adaptive`` mode)
    online: ClassVar[bool] = False
    #: True when the mode takes no ``alpha`` but a coverage ``target`` (``budget``):
    #: :func:`~ragsieve.calibration.modes.make_calibrator` then reads a given ``alpha`` as
    #: ``target = 1 - alpha``
    alpha_as_target: ClassVar[bool] = False
    #: The threshold learned by ``fit`` (every mode sets it; absent until then, which is
    #: what :attr:`is_fitted` asks).
    threshold_: float

    # ------------------------------------------------------------ parameters
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind == p.KEYWORD_ONLY]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor parameters, read from ``__init__``'s signature (scikit-learn style)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters; unknown names raise ``ValueError``.

        Returns
        -------
        self
        """
        valid = self._param_names()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(
                    f"invalid parameter {key!r} for {type(self).__name__}; valid parameters: "
                    f"{', '.join(valid)}."
                )
            setattr(self, key, value)
        return self

    def unfitted_copy(self) -> Self:
        """A new unfitted calibrator of the same parameters (scikit-learn's ``clone``):
        what ``ConformalFilter.calibrate`` fits, leaving the caller's calibrator as given."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    # ------------------------------------------------------------ estimator
    @abstractmethod
    def fit(self, scores: Any, relevant: Any = None, *, query_ids: Any = None,
            groups: Any = None, lengths: Any = None) -> Self:
        """Learn the state from calibration scores and relevance labels; return ``self``."""

    @abstractmethod
    def predict(self, scores: Any, *, query_ids: Any = None, groups: Any = None,
                lengths: Any = None) -> np.ndarray:
        """Boolean keep-mask aligned with ``scores``."""

    @abstractmethod
    def guarantee(self, *, unit: str = "snippet") -> Guarantee:
        """What the fitted calibrator promises (raises ``NotFittedError`` before ``fit``),
        its statement worded for the ``unit`` calibrated on (:func:`nouns`: a filter of unit
        ``"sentence"`` promises evidence sentences)."""

    @property
    def is_fitted(self) -> bool:
        """True once :meth:`fit` (or :meth:`from_state`) has learned the state (what
        scikit-learn's ``check_is_fitted`` asks)."""
        return hasattr(self, "threshold_")

    def miscoverage(self) -> float | None:
        """The miscoverage alpha the mode calibrates to (None: it has no coverage target,
        e.g. a budget given none)."""
        alpha = getattr(self, "alpha", None)
        return None if alpha is None else float(alpha)

    def topics_needed(self) -> tuple[int, str] | None:
        """The fewest calibration topics (with evidence) this mode needs for a finite
        threshold at its parameters, and why; None for a mode whose units are not topics.
        Known before fitting, so a caller can say it before calibrating."""
        return None

    def threshold_for(self, group: Any) -> float:
        """The threshold a snippet of ``group`` is held to (one global threshold here;
        the ``group`` mode has one per group)."""
        self._check_fitted()
        return float(self.threshold_)

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet; call fit(scores, relevant) first."
            )

    # ------------------------------------------------------------ state
    @abstractmethod
    def _state(self) -> dict[str, Any]:
        """JSON-safe learned state (without the parameters)."""

    @abstractmethod
    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_state` wrote; raise ``ArtifactError`` on a bad value."""

    def to_state(self) -> dict[str, Any]:
        """The fitted state as JSON-safe data (``+inf`` written as ``None``)."""
        self._check_fitted()
        return self._state()

    @classmethod
    def from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild a fitted calibrator from :meth:`get_params` and :meth:`to_state` output.

        Raises
        ------
        ArtifactError
            Unknown parameters or a malformed state.
        """
        if not isinstance(params, dict) or not isinstance(state, dict):
            raise ArtifactError(
                f"calibration params and state must be JSON objects, got "
                f"{type(params).__name__} and {type(state).__name__}."
            )
        try:
            self = cls(**params)
        except TypeError as exc:
            raise ArtifactError(f"calibration params {params!r} do not fit {cls.__name__}: {exc}") from exc
        try:
            self._set_state(state)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # Overflow: an int64
            if isinstance(exc, ArtifactError):
                raise
            raise ArtifactError(f"malformed {cls.mode} calibration state: {exc!r:.300}") from exc
        return self


class ThresholdCalibrator(BaseCalibrator):
    """A mode whose keep-rule is one global threshold: ``keep = score <= threshold_``.

    Subclasses implement ``fit`` (setting ``threshold_``, ``n_calibration_`` and
    ``infinite_``) and ``guarantee``; ``predict`` and the state round trip come from here.
    """

    def _promise(self, metric: str, claim: str, *, unit: str, n_required: int,
                 n_calibration: int | None = None,
                 details: dict[str, Any] | None = None) -> Guarantee:
        """The fitted mode's :class:`Guarantee` that ``claim`` holds at ``1 - alpha``:
        ``claim``'s ``{a_relevant}``, ``{relevant}`` and ``{relevant_plural}`` are worded for
        ``unit`` (:func:`nouns`) and ``{target}`` is ``1 - alpha``; ``n_calibration``
        defaults to the calibration units counted."""
        self._check_fitted()
        a = float(self.alpha)
        n = nouns(unit)
        statement = claim.format(a_relevant=n.a_relevant, relevant=n.relevant,
                                 relevant_plural=n.relevant_plural, target=f"{1 - a:.3g}")
        return Guarantee(
            mode=self.mode, metric=metric, target=1 - a, alpha=a, statement=statement,
            n_calibration=self.n_calibration_ if n_calibration is None else n_calibration,
            n_required=n_required, infinite=self.infinite_, details=details or {})

    def __init__(self, *, alpha: float = DEFAULT_ALPHA) -> None:
        self.alpha = alpha

    def predict(self, scores: Any, *, query_ids: Any = None, groups: Any = None,
                lengths: Any = None) -> np.ndarray:
        """Boolean keep-mask ``scores <= threshold_``."""
        self._check_fitted()
        return check_scores(scores) <= self.threshold_

    def _set_fitted(self, threshold: float, n: int) -> None:
        self.threshold_ = float(threshold)
        self.n_calibration_ = int(n)
        self.infinite_ = math.isinf(self.threshold_)

    def _state(self) -> dict[str, Any]:
        return {"threshold": _json_float(self.threshold_), "n_calibration": self.n_calibration_}

    def _set_state(self, state: dict[str, Any]) -> None:
        check_alpha(self.alpha)
        n = state["n_calibration"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT:
            raise ArtifactError(f"calibration state n_calibration == {n!r:.30}, expected an int in "
                                f"[1, {MAX_COUNT}].")
        self._set_fitted(_read_float(state, "threshold"), n)
