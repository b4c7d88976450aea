"""The service's answers built from what it computed: a filter result, a checked artifact,
the monitor and list check states.

:func:`filter_response` and :func:`query_response` are ``POST /filter``'s and ``POST
/query``'s bodies; :func:`artifact_info`, :func:`monitor_info`, :func:`lists_info` and
:func:`index_info` are what ``GET /healthz`` (and ``POST /admin/monitor/reset``) show.
Numbers that are not finite (a threshold of +inf: keep everything) are answered as null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..artifact import Artifact
from ..errors import ArtifactError
from ..filter import ConformalFilter
from ..keeping import p_value_rule
from ..types import FilterResult
from .parsing import printable
from .reload import ArtifactCheck
from .schemas import (
    ArtifactInfo,
    FilterResponse,
    Health,
    HitOut,
    IndexInfo,
    KeptSnippet,
    ListsInfo,
    MonitorInfo,
    QueryResponse,
    RemovedSnippet,
)

__all__ = ["artifact_info", "artifact_view", "filter_response", "finite_or_none", "index_info",
           "lists_info", "monitor_info", "p_value_rule_of", "query_response", "removed"]


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON: numpy scalars unwrapped, tuples as lists, inf/NaN as null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def finite_or_none(value: float) -> float | None:
    """``value`` as a float, or None when it is not finite (JSON has no inf)."""
    return None if not math.isfinite(value) else float(value)


def removed(res: FilterResult) -> list[RemovedSnippet]:
    """The removed snippets of a result, each with its score and the threshold it missed."""
    tau = finite_or_none(res.threshold)
    return [RemovedSnippet(index=s.index, snippet_id=s.snippet_id, score=s.score,
                           p_value=s.p_value, threshold=tau)
            for s in res.removed]


def p_value_rule_of(flt: ConformalFilter) -> str | None:
    """How the p-values read beside the filter's rule; None when it has none."""
    return None if flt.evidence is None else p_value_rule(flt.calibrator_)


def monitor_info(state: Any) -> MonitorInfo:
    """What ``/healthz`` (and ``/admin/monitor/reset``) show of a monitor state."""
    return MonitorInfo(
        alarm=bool(state.alarm),
        martingale=finite_or_none(float(state.martingale)),
        log10_martingale=finite_or_none(float(state.log10_martingale)),
        fired_at=state.fired_at,
        fired_time=state.fired_time,
        n_observed=int(state.n_observed),
        delta=float(state.delta),
    )


def artifact_view(checked: ArtifactCheck) -> ArtifactInfo:
    """Build what ``/healthz`` shows of a checked artifact, so a reload that cannot be shown
    is refused before it is published (``ArtifactError``)."""
    try:
        info = artifact_info(checked.filter, checked.artifact, checked.checksum)
        Health(status="ok", library_version=__version__, artifact=info)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ArtifactError(f"artifact cannot be shown by /healthz: {printable(str(exc))}") from exc
    return info


def artifact_info(flt: ConformalFilter, artifact: Artifact, checksum: str) -> ArtifactInfo:
    """What ``/healthz`` shows of a served filter and its artifact."""
    guarantee = _json_safe(flt.guarantee())
    n_calibration = guarantee.get("n_calibration")
    return ArtifactInfo(
        format_version=artifact.format_version,
        library_version=artifact.library_version,
        created=artifact.created,
        mode=guarantee.get("mode"),
        guaranteed_metric=guarantee.get("metric"),
        alpha=guarantee.get("alpha"),
        threshold=finite_or_none(flt.threshold),
        n_calibration=None if n_calibration is None else int(n_calibration),
        min_keep=flt.min_keep,
        unit=flt.unit,
        group_by=flt.policy_.group_by,
        scorer=flt.scorer_.spec(),
        guarantee=guarantee,
        checksum=checksum,
    )


def lists_info(flt: ConformalFilter) -> ListsInfo | None:
    """The calibration lists and the service's list check (None without a record)."""
    if flt.lists is None or flt.list_watch is None:
        return None
    state = flt.list_watch.state()
    return ListsInfo(calibration=flt.lists.describe(), source=flt.lists.source["kind"],
                     list_dependent=flt.lists.list_dependent, n_seen=state["n_seen"],
                     n_outside=state["n_outside"], alarm=state["alarm"],
                     fired_at=state["fired_at"], mean_length=state["mean_length"],
                     calibration_mean_length=state["calibration_mean_length"],
                     delta=state["delta"])


def index_info(index: Any) -> IndexInfo | None:
    """What ``/healthz`` shows of a served index (its directory's name, not its path)."""
    if index is None:
        return None
    return IndexInfo(name=Path(index.path).resolve().name, model=index.model_id,
                     n_snippets=index.count())


def filter_response(res: FilterResult, query_id: str, flt: ConformalFilter,
                    guarantee: dict[str, Any]) -> FilterResponse:
    """``POST /filter``'s answer: ``res`` of the served filter ``flt``, as ``query_id``."""
    kept = [
        KeptSnippet(
            index=s.index,
            snippet_id=s.snippet_id,
            text=s.text,
            score=s.score,
            p_value=s.p_value,
            spans=[(int(a), int(b)) for a, b in getattr(s, "spans", ())],
            pruned_text=s.pruned_text if res.unit == "sentence" else None,
        )
        for s in res.kept
    ]
    return FilterResponse(
        kept=kept,
        removed=removed(res),
        scores=list(res.scores),
        p_values=list(res.p_values),
        p_value_rule=p_value_rule_of(flt),
        threshold=finite_or_none(res.threshold),
        removal=res.removal,
        note=res.note,
        guarantee=guarantee,
        n_cut=getattr(res, "n_cut", 0),
        unit=res.unit,
        query_id=query_id,
        lists_unlike=res.lists_unlike,
        lists_note=res.lists_note,
    )


def query_response(hits: Sequence[Any], res: FilterResult, use: ConformalFilter, *,
                   guarantee: dict[str, Any], query_id: str,
                   lists_note: str | None) -> QueryResponse:
    """``POST /query``'s answer: the index's ``hits`` and ``res``, what ``use`` made of them."""
    kept = {s.index for s in res.kept}
    return QueryResponse(
        hits=[
            HitOut(
                index=i,
                snippet_id=h.snippet_id,
                doc_id=h.doc_id,
                path=h.path,
                start=h.start,
                end=h.end,
                text=h.text,
                distance=h.score,
                score=res.scores[i],
                p_value=res.p_values[i] if res.p_values else None,
                kept=i in kept,
            )
            for i, h in enumerate(hits)
        ],
        n_kept=len(kept),
        removed=removed(res),
        p_value_rule=p_value_rule_of(use),
        threshold=finite_or_none(res.threshold),
        removal=res.removal,
        note=res.note,
        guarantee=guarantee,
        query_id=query_id,
        lists_unlike=res.lists_unlike,
        lists_note=lists_note,
    )
