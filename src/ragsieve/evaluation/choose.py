"""Which alpha reaches the removal (or coverage) you want? Measured on held-out topics.

:func:`choose_alpha` runs the topic-disjoint sweep of :func:`~ragsieve.evaluation.evaluate`
over a grid of alphas for one guarantee mode and picks:

* for a **removal** target ``r``: the smallest alpha (the strongest guarantee) whose mean
  removal on held-out topics is at least ``r``;
* for a **coverage** target ``c``: the largest alpha of the grid with ``1 - alpha >= c``
  (the guarantee itself promises the coverage; the sweep says how much that removes).

Removal is what the sweep measured on topics held out of calibration, averaged over the
splits: an estimate for new topics, not a promise. The guarantee is the mode's (coverage
``>= 1 - alpha`` under exchangeability).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .._validation import check_real
from ..types import Pair
from .sweep import evaluate

__all__ = ["DEFAULT_ALPHA_GRID", "AlphaChoice", "AlphaTarget", "choose_alpha"]

#: The alphas tried unless told otherwise.
DEFAULT_ALPHA_GRID = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class AlphaChoice:
    """The outcome of :func:`choose_alpha`.

    Attributes
    ----------
    target : {"removal", "coverage"}
        What was asked for, and ``value`` how much.
    alpha : float or None
        The chosen alpha; None when no alpha of the grid reaches the target.
    reached : bool
        Whether the chosen alpha reaches the target (as measured / as promised).
    coverage, removal : float or None
        Mean coverage of relevant snippets and mean removal on held-out topics at ``alpha``.
    statement : str
        The guarantee in words, or why nothing was chosen.
    grid : tuple of dict
        Per alpha tried: ``alpha``, ``coverage``, ``removal``.
    """

    target: str
    value: float
    mode: str
    alpha: float | None
    reached: bool
    coverage: float | None
    removal: float | None
    statement: str
    n_splits: int
    grid: tuple[dict[str, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """The choice as plain JSON-able values."""
        out = asdict(self)
        out["grid"] = [dict(row) for row in self.grid]
        return out


def _check_target(removal: float | None, coverage: float | None) -> tuple[str, float]:
    if (removal is None) == (coverage is None):
        raise ValueError("give exactly one target: removal= (share of snippets to remove) or "
                         "coverage= (share of relevant snippets to keep).")
    name, value = ("removal", removal) if removal is not None else ("coverage", coverage)
    return name, check_real(value, name, min_value=0, max_value=1, include_boundaries="neither")


@dataclass(frozen=True)
class AlphaTarget:
    """What :func:`choose_alpha` is asked to reach: a removal or a coverage, for one mode.

    Attributes
    ----------
    removal : float, optional
        Share of snippets to remove, in (0, 1).
    coverage : float, optional
        Share of relevant snippets to keep, in (0, 1). Give exactly one of the two.
    mode : str, default="marginal"
        The guarantee mode.

    Raises
    ------
    ValueError
        Not exactly one target, or a target outside (0, 1).
    """

    removal: float | None = None
    coverage: float | None = None
    mode: str = "marginal"

    def __post_init__(self) -> None:
        _check_target(self.removal, self.coverage)

    @property
    def name(self) -> str:
        """``"removal"`` or ``"coverage"``: the one given."""
        return "removal" if self.removal is not None else "coverage"

    @property
    def value(self) -> float:
        """The share asked for."""
        return _check_target(self.removal, self.coverage)[1]


def _check_grid(alphas: Sequence[float]) -> tuple[float, ...]:
    grid = tuple(sorted({float(a) for a in alphas}))
    if not grid or any(not (0 < a < 1) or not math.isfinite(a) for a in grid):
        raise ValueError(f"alphas == {list(alphas)!r}, must be numbers in (0, 1).")
    return grid


def _pick(target: str, value: float, rows: list[dict[str, float]]) -> dict[str, float] | None:
    if target == "removal":
        return next((r for r in rows if r["removal"] >= value), None)  # smallest alpha first
    promised = [r for r in rows if 1.0 - r["alpha"] >= value - 1e-12]
    return promised[-1] if promised else None


def choose_alpha(pairs: Sequence[Pair], scorer: Any, target: AlphaTarget, *,
                 alphas: Sequence[float] = DEFAULT_ALPHA_GRID, n_splits: int = 10,
                 seed: int = 0, progress: bool = False, **evaluate_kwargs: Any) -> AlphaChoice:
    """The alpha of ``target.mode`` that reaches a removal or coverage target.

    Parameters
    ----------
    pairs : sequence of Pair
        Labelled pairs with groups (topics), as for :func:`~ragsieve.evaluation.evaluate`.
    scorer : Scorer or str
        The nonconformity score.
    target : AlphaTarget
        The removal or the coverage to reach, and the guarantee mode.
    alphas : sequence of float
        The alphas tried (default :data:`DEFAULT_ALPHA_GRID`).
    n_splits, seed : int
        Topic-disjoint calibration/test splits and their seed.
    progress : bool
        Progress bar while scoring.
    **evaluate_kwargs
        Passed to :func:`~ragsieve.evaluation.evaluate` (``group_by``, ``delta``, ...).

    Returns
    -------
    AlphaChoice

    Raises
    ------
    ValueError
        Alphas outside (0, 1).
    """
    mode, value = target.mode, target.value
    grid = _check_grid(alphas)
    report = evaluate(pairs, scorer, progress=progress, modes=(mode,), alphas=grid,
                      n_splits=n_splits, seed=seed, top_k=(), thetas=(),
                      calibrated_baselines=False, **evaluate_kwargs)
    conformal = sorted((r for r in report.rows("conformal") if r.get("mode") == mode),
                       key=lambda r: r["alpha"])
    rows = [{"alpha": float(r["alpha"]), "coverage": float(r["coverage_mean"]),
             "removal": float(r["removal_mean"])} for r in conformal]
    metric = str(conformal[0]["guaranteed_metric"])
    chosen = _pick(target.name, value, rows)
    if chosen is None:
        best = max(rows, key=lambda r: r["removal"])
        why = (f"no alpha in {list(grid)} reaches removal {value:g} on held-out topics (at most "
               f"{best['removal']:.3f}, at alpha {best['alpha']:g}): a stronger score or a "
               "larger alpha is needed." if target.name == "removal" else
               f"no alpha in {list(grid)} promises coverage {value:g}: add a smaller alpha.")
        return AlphaChoice(target.name, value, mode, None, False, None, None,
                           why + _few_topics(pairs, sentence=True), n_splits, tuple(rows))
    a = chosen["alpha"]
    promise = (f"a relevant snippet of a new query is kept with probability >= {1 - a:.2f}"
               if metric == "coverage" else f"its guaranteed {metric} is >= {1 - a:.2f}")
    statement = (f"mode {mode}, alpha {a:g}: {promise} (under exchangeability); on held-out "
                 f"topics it kept {chosen['coverage']:.3f} of the relevant snippets and removed "
                 f"{chosen['removal']:.3f} of all snippets ({n_splits} splits"
                 f"{_few_topics(pairs)}).")
    return AlphaChoice(target.name, value, mode, a, True, chosen["coverage"], chosen["removal"],
                       statement, n_splits, tuple(rows))


def _few_topics(pairs: Sequence[Pair], *, sentence: bool = False) -> str:
    """What a few topics mean for the splits: under :data:`~ragsieve.evaluation.expect.MIN_TOPICS`
    topics their held-out topics overlap (the reason ``calibrate`` gives no expectation);
    empty from there on."""
    from .expect import MIN_TOPICS

    k = len({p.group for p in pairs})
    if k >= MIN_TOPICS:
        return ""
    text = (f"over only {k} topics, whose held-out topics overlap from split to split: read "
            f"it as a rough guide (`calibrate` estimates new topics from {MIN_TOPICS} topics on)")
    return f" ({text})" if sentence else f" {text}"
