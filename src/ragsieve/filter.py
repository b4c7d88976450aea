"""``ConformalFilter``: a scorer plus a calibrated threshold, and its JSON artifact.

A filter is calibrated once on labelled pairs from *other* topics and then applied
to each query's retrieved snippets: it keeps the snippets whose nonconformity score
is at most the calibrated threshold tau, in their original order.

Empty-result policy
-------------------
When no snippet scores at or below tau, the default (``min_keep=0``) returns an
empty ``kept`` tuple and says so in ``FilterResult.note`` (and an INFO log line):
an empty context is a legitimate outcome ("nothing retrieved looks like evidence").
With ``min_keep=k`` the ``k`` best-scoring snippets are kept instead; the note says
that these snippets were kept by the policy, not by the calibrated threshold.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._io import atomic_write_text
from ._version import __version__
from .calibration import SplitConformalCalibrator, check_scores
from .errors import ArtifactError, CalibrationError, DataError, NotFittedError, ScorerMismatchError
from .scoring import Scorer, resolve_scorer
from .types import FilterResult, Pair, Scored, Snippet

__all__ = ["ARTIFACT_FORMAT", "ConformalFilter", "SnippetLike", "read_artifact"]

logger = logging.getLogger(__name__)

ARTIFACT_FORMAT = "ragsieve.filter"
ARTIFACT_VERSION = 1

SnippetLike = str | Snippet | Pair | Mapping[str, Any]
_ACCEPTED = "str, ragsieve.Snippet, ragsieve.Pair, or a mapping with a 'text' key"


def _as_text_and_id(item: Any, index: int) -> tuple[str, str]:
    """Convert one accepted snippet form to ``(text, snippet_id)``."""
    if isinstance(item, str):
        return item, str(index)
    if isinstance(item, Snippet):
        return item.text, item.snippet_id
    if isinstance(item, Pair):
        return item.text, item.snippet_id
    if isinstance(item, Mapping) and isinstance(item.get("text"), str):
        sid = item.get("snippet_id", item.get("id", index))
        return item["text"], str(sid)
    raise TypeError(
        f"snippet {index} has type {type(item).__name__}; expected {_ACCEPTED}."
    )


class ConformalFilter:
    """Keep the snippets whose nonconformity score is at most a calibrated tau.

    Parameters
    ----------
    scorer : Scorer or str
        The nonconformity score (an alias such as ``"embedding"`` is resolved).
    calibrator : SplitConformalCalibrator, optional
        A calibrator; fitted already, or fitted by :meth:`calibrate`.
        Defaults to ``SplitConformalCalibrator(alpha=alpha)``.
    alpha : float, default=0.1
        Used only when ``calibrator`` is None.
    min_keep : int, default=0
        Empty-result policy: keep at least this many best-scoring snippets.

    Examples
    --------
    >>> from ragsieve.scoring import Scorer
    >>> class Length(Scorer):  # toy score: longer text = less relevant
    ...     name = "length"
    ...     def score_batch(self, query, snippets):
    ...         return np.array([len(s) / 100 for s in snippets], dtype=float)
    ...     def spec(self):
    ...         return {"scorer": "length"}
    >>> cal = SplitConformalCalibrator(alpha=0.5).fit([0.04, 0.05, 0.06])
    >>> f = ConformalFilter(Length(), cal)
    >>> f.filter("q", ["short", "a much longer snippet", "tiny"]).kept_ids
    ['0', '2']
    """

    def __init__(
        self,
        scorer: Scorer | str,
        calibrator: SplitConformalCalibrator | None = None,
        *,
        alpha: float = 0.1,
        min_keep: int = 0,
    ) -> None:
        self.scorer = resolve_scorer(scorer)
        self.calibrator = calibrator if calibrator is not None else SplitConformalCalibrator(alpha=alpha)
        if isinstance(min_keep, bool) or not isinstance(min_keep, int) or min_keep < 0:
            raise ValueError(f"min_keep == {min_keep!r}, must be an int >= 0.")
        self.min_keep = min_keep
        self.calibration_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ state
    @property
    def alpha(self) -> float:
        """Target miscoverage of the calibrator."""
        return float(self.calibrator.alpha)

    def _check_calibrated(self) -> None:
        if not hasattr(self.calibrator, "threshold_"):
            raise NotFittedError(
                "This ConformalFilter is not calibrated; call calibrate(pairs) or "
                "ConformalFilter.load(path) first."
            )

    @property
    def threshold(self) -> float:
        """The calibrated threshold tau (raises ``NotFittedError`` before calibration)."""
        self._check_calibrated()
        return float(self.calibrator.threshold_)

    def guarantee(self) -> dict[str, Any]:
        """Plain description of the guarantee the filter carries."""
        band = self.calibrator.coverage_band()
        return {
            "mode": "marginal",
            "statement": (
                f"a relevant snippet exchangeable with the calibration data is kept with "
                f"probability >= {1 - self.alpha:.3g}"
            ),
            "alpha": self.alpha,
            "coverage_band": list(band),
            "n_calibration": int(self.calibrator.n_calibration_),
        }

    # ------------------------------------------------------------ calibrate
    def calibrate(self, pairs: Sequence[Pair], *, progress: bool = False) -> ConformalFilter:
        """Score the relevant calibration pairs and fit the calibrator.

        The threshold depends on the relevant pairs' scores alone, so only they are
        scored -- except for a list-dependent score (``scorer.list_dependent``: relative
        and fused scores), whose value for a snippet depends on the rest of its query's
        list: then every pair is scored, in its query's whole list, and the relevant
        pairs' scores are kept.

        Parameters
        ----------
        pairs : sequence of Pair
            Labelled calibration pairs (``relevant`` in {0, 1} for every pair).
        progress : bool
            Show a progress bar while scoring.

        Returns
        -------
        ConformalFilter
            ``self``, calibrated.

        Raises
        ------
        DataError
            A pair is unlabelled.
        CalibrationError
            No relevant pair.
        """
        pairs = list(pairs)
        unlabelled = [p for p in pairs if p.relevant is None]
        if unlabelled:
            raise DataError(
                f"{len(unlabelled)} calibration pair(s) have no relevance label (first: "
                f"query_id={unlabelled[0].query_id!r}, snippet_id={unlabelled[0].snippet_id!r}); "
                "calibration needs relevant = 0 or 1 on every pair."
            )
        relevant = [p for p in pairs if p.relevant == 1]
        if not relevant:
            raise CalibrationError(
                f"no relevant calibration snippet among {len(pairs)} pairs; "
                "need at least one pair with relevant == 1."
            )
        if self.scorer.list_dependent:
            all_scores = self.scorer.score_pairs(pairs, progress=progress)
            scores = all_scores[np.array([p.relevant == 1 for p in pairs])]
        else:
            scores = self.scorer.score_pairs(relevant, progress=progress)
        self.calibrator.fit(scores)
        from .data.jsonl import fingerprint_pairs

        self.calibration_info = {
            "fingerprint": fingerprint_pairs(pairs),
            "n_pairs": len(pairs),
            "n_queries": len({p.query_id for p in pairs}),
            "n_relevant": len(relevant),
            "n_groups": len({p.group for p in pairs}),
        }
        return self

    # ---------------------------------------------------------------- apply
    def filter_scores(
        self, query: str, scores: Any, snippets: Sequence[SnippetLike]
    ) -> FilterResult:
        """Apply the threshold to precomputed scores (no scoring).

        Parameters
        ----------
        query : str
            The query (recorded in the result).
        scores : array-like of float
            Nonconformity scores aligned with ``snippets``.
        snippets : sequence
            The snippets (any accepted form).

        Returns
        -------
        FilterResult
        """
        tau = self.threshold
        arr = check_scores(scores, name="snippet scores")
        items = [_as_text_and_id(s, i) for i, s in enumerate(snippets)]
        if len(items) != arr.size:
            raise ValueError(f"got {arr.size} scores for {len(items)} snippets; they must align.")
        keep = arr <= tau
        note = None
        if len(items) and not keep.any():
            if self.min_keep:
                order = np.argsort(arr, kind="stable")[: self.min_keep]
                keep[order] = True
                note = (
                    f"no snippet scored <= tau={tau:.4g} (best {arr.min():.4g}); kept the "
                    f"{int(keep.sum())} best by the min_keep={self.min_keep} policy, outside "
                    "the calibrated guarantee"
                )
            else:
                note = (
                    f"no snippet scored <= tau={tau:.4g} (best {arr.min():.4g}); returning an "
                    "empty context (set min_keep to keep the best ones anyway)"
                )
            logger.info("query %r: %s", query[:80], note)
        kept = tuple(
            Scored(index=i, snippet_id=sid, text=text, score=float(arr[i]))
            for i, (text, sid) in enumerate(items)
            if keep[i]
        )
        return FilterResult(
            query=query,
            kept=kept,
            scores=tuple(float(x) for x in arr),
            threshold=tau,
            n_input=len(items),
            note=note,
        )

    def filter(self, query: str, snippets: Sequence[SnippetLike]) -> FilterResult:
        """Score one query's snippets and keep those with score <= tau.

        Parameters
        ----------
        query : str
            The query.
        snippets : sequence
            Each a ``str``, ``Snippet``, ``Pair`` or mapping with a ``"text"`` key.

        Returns
        -------
        FilterResult
            Kept snippets in input order, all scores, tau and a note for unusual results.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}.")
        self._check_calibrated()  # fail before scoring
        items = [_as_text_and_id(s, i) for i, s in enumerate(snippets)]
        scores = self.scorer.score_batch(query, [t for t, _ in items]) if items else np.zeros(0)
        return self.filter_scores(query, scores, snippets)

    def filter_pairs(
        self, pairs: Sequence[Pair], *, progress: bool = False
    ) -> dict[str, FilterResult]:
        """Filter many queries at once (batched scoring), keyed by query_id."""
        self._check_calibrated()
        pairs = list(pairs)
        scores = self.scorer.score_pairs(pairs, progress=progress)
        by_query: dict[str, list[int]] = {}
        for i, p in enumerate(pairs):
            by_query.setdefault(p.query_id, []).append(i)
        return {
            qid: self.filter_scores(pairs[idx[0]].query, scores[idx], [pairs[i] for i in idx])
            for qid, idx in by_query.items()
        }

    # ------------------------------------------------------------- artifact
    def to_dict(self) -> dict[str, Any]:
        """The JSON artifact as a dict (see :meth:`save`)."""
        tau = self.threshold
        cal = self.calibrator
        return {
            "format": ARTIFACT_FORMAT,
            "format_version": ARTIFACT_VERSION,
            "library_version": __version__,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "scorer": self.scorer.spec(),
            "calibration": {
                "mode": "marginal",
                "method": "split-conformal",
                "alpha": float(cal.alpha),
                "threshold": None if math.isinf(tau) else tau,
                "threshold_is_infinite": math.isinf(tau),
                "n_calibration": int(cal.n_calibration_),
                "rank": int(cal.rank_),
                "coverage_band": list(cal.coverage_band()),
            },
            "policy": {"min_keep": self.min_keep},
            "data": dict(self.calibration_info),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the calibrated filter as a JSON artifact (atomically).

        The artifact records the scorer id and model, alpha, tau, n, the data
        fingerprint and the library version.
        """
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(
        cls,
        payload: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Rebuild a filter from an artifact dict; see :meth:`load`."""
        if not isinstance(payload, Mapping) or payload.get("format") != ARTIFACT_FORMAT:
            raise ArtifactError(
                f"not a ragsieve filter artifact: format == {payload.get('format') if isinstance(payload, Mapping) else type(payload).__name__!r}, "
                f"expected {ARTIFACT_FORMAT!r}."
            )
        version = payload.get("format_version")
        if version != ARTIFACT_VERSION:
            raise ArtifactError(
                f"artifact format_version == {version!r}; this ragsieve ({__version__}) reads "
                f"version {ARTIFACT_VERSION}."
            )
        try:
            spec = dict(payload["scorer"])
            cal = payload["calibration"]
            alpha = float(cal["alpha"])
            tau = math.inf if cal["threshold_is_infinite"] else float(cal["threshold"])
            n = int(cal["n_calibration"])
            min_keep = int(payload.get("policy", {}).get("min_keep", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"malformed filter artifact: missing or invalid field ({exc!r}).") from exc
        if scorer is None:
            scorer = resolve_scorer(spec, **dict(scorer_options or {}))
        if scorer.spec() != spec:
            raise ScorerMismatchError(
                f"the artifact was calibrated with scorer {spec!r} but the supplied scorer is "
                f"{scorer.spec()!r}; a threshold is only valid for the score it was calibrated on. "
                "Recalibrate with this scorer or load without passing one."
            )
        calibrator = SplitConformalCalibrator.from_threshold(alpha=alpha, threshold=tau, n_calibration=n)
        flt = cls(scorer, calibrator, min_keep=min_keep)
        flt.calibration_info = dict(payload.get("data", {}))
        return flt

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Load a saved filter.

        Parameters
        ----------
        path : path-like
            JSON artifact written by :meth:`save`.
        scorer : Scorer, optional
            Scorer to use; must have the same ``spec()`` as the artifact's, otherwise
            ``ScorerMismatchError``. When None the scorer is rebuilt from the artifact.
        scorer_options : Mapping, optional
            Extra keyword arguments for rebuilding the scorer that do not change its
            scores (e.g. ``{"cache_dir": ...}`` for the embedding scorer).

        Raises
        ------
        ArtifactError
            Unreadable, non-JSON or malformed file, or an unknown format version.
        ScorerMismatchError
            The supplied scorer differs from the one the threshold was calibrated with.
        """
        return cls.from_dict(read_artifact(path), scorer=scorer, scorer_options=scorer_options)

    def __repr__(self) -> str:
        tau = getattr(self.calibrator, "threshold_", None)
        return f"ConformalFilter(scorer={self.scorer.spec()!r}, alpha={self.alpha}, threshold={tau})"


def read_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a filter artifact's JSON without building the filter.

    Raises
    ------
    ArtifactError
        The file cannot be read, is not UTF-8, or is not a JSON object.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"cannot read filter artifact {str(path)!r}: {exc}") from exc
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"filter artifact {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ArtifactError(
            f"filter artifact {str(path)!r} holds a JSON {type(payload).__name__}, expected an object."
        )
    return payload
