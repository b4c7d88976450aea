"""The tasks engines run on batches of whole queries: scoring and filtering.

Labelling is :class:`ragsieve.labeling.LabelTask` (same contract, next to the labeller).
A task holds only plain options; :meth:`setup` builds the scorer or filter in the worker
that runs it, so a Ray actor loads its model once and keeps it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..artifact import Artifact
from ..data.jsonl import pair_to_record
from ..data.parquet import records_table
from ..types import FilterResult, Pair

__all__ = ["FilterTask", "ScoreTask", "filter_record"]


class ScoreTask:
    """Write every pair with its nonconformity score under ``score_name``.

    Parameters
    ----------
    scorer : dict
        The scorer's spec (``Scorer.spec()``), e.g. an artifact's fitted fused score.
    scorer_options : mapping, optional
        Options that do not change scores (embedding cache, LLM endpoint).
    score_name : str, default "score"
        The key the score is written under (it must not be a key the pairs already hold).
    require_labels : bool, default False
        Refuse unlabelled pairs.
    score_field : str, optional
        The outside score every pair must carry (``field`` scorer).

    Examples
    --------
    >>> task = ScoreTask({"scorer": "field", "field": "bm25", "higher_is_better": True})
    >>> task.setup()
    >>> records, stats = task.process([Pair("q", "Q?", "a", "x", meta={"bm25": 2.0})])
    >>> records[0]["score"], stats
    (-2.0, {'pairs': 1})
    """

    kind = "score"

    def __init__(self, scorer: Mapping[str, Any], *, scorer_options: Mapping[str, Any] | None = None,
                 score_name: str = "score", require_labels: bool = False,
                 score_field: str | None = None) -> None:
        if not isinstance(scorer, Mapping) or "scorer" not in scorer:
            raise TypeError(f"scorer == {scorer!r}, expected a scorer spec (a dict with key "
                            "'scorer', as Scorer.spec() returns).")
        if not isinstance(score_name, str) or not score_name.strip():
            raise ValueError(f"score_name == {score_name!r}, expected a non-empty string.")
        self.scorer_spec = json.loads(json.dumps(dict(scorer)))
        self.scorer_options = dict(scorer_options or {})
        self.score_name = score_name
        self.require_labels = require_labels
        self.score_field = score_field
        self.columns: tuple[str, ...] = (score_name,)
        self._scorer: Any = None

    def spec(self) -> dict[str, Any]:
        return {"task": self.kind, "scorer": self.scorer_spec, "score_name": self.score_name}

    def setup(self) -> None:
        if self._scorer is None:
            from ..scoring import resolve_scorer

            self._scorer = resolve_scorer(self.scorer_spec, **self.scorer_options)

    def process(self, pairs: list[Pair]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        self.setup()
        scores = self._scorer.score_pairs(pairs)
        records = []
        for pair, score in zip(pairs, scores, strict=True):
            record = pair_to_record(pair)
            if self.score_name in record:
                from ..errors import DataError

                raise DataError(f"pair ({pair.query_id!r}, {pair.snippet_id!r}) already holds "
                                f"a key {self.score_name!r}; choose another --score-name.")
            record[self.score_name] = float(score)
            records.append(record)
        return records, {"pairs": len(pairs)}

    def arrow(self, records: list[dict[str, Any]]) -> Any:
        return records_table(records, columns=self.columns, float_columns=self.columns)

    def close(self) -> None:
        closer = getattr(self._scorer, "close", None)
        if callable(closer):
            closer()
        self._scorer = None

    def __getstate__(self) -> dict[str, Any]:  # ship options, never a loaded model
        state = dict(self.__dict__)
        state["_scorer"] = None
        return state


def filter_record(query_id: str, result: FilterResult, scorer: Any = None) -> dict[str, Any]:
    """One query's filter result as a JSON object (``ragsieve filter --json`` lines).

    Per kept snippet (aligned with ``kept``): its score, its conformal ``p_values`` (the
    share of the relevant calibration snippets that scored no better: in the marginal mode
    a snippet is kept exactly when it exceeds alpha; null when the artifact stores no
    calibration evidence) and ``spans``, the kept character spans (unit ``"sentence"``: one
    per kept sentence; else the kept pieces of a snippet that was cut, empty when kept
    whole); with unit ``"sentence"`` also ``pruned_text``, its kept sentences joined with a
    space. Each removed snippet carries its score, p-value and the threshold it missed.
    ``lists_unlike`` and ``lists_note`` say when the query's list is unlike the filter's
    calibration lists (:mod:`ragsieve.lists`).

    ``scorer``: the filter's score; given, scores and threshold are in its own units and
    direction (``bm25``, not ``-bm25``) and ``score_name`` / ``keep_if`` name the rule.
    """
    def own(x: float) -> float | None:  # in the score's units; None for inf (keeps all)
        value = x if scorer is None else scorer.keep_rule(x).threshold
        return float(value) if math.isfinite(value) else None

    threshold = own(result.threshold)
    record: dict[str, Any] = {
        "query_id": query_id, "query": result.query, "unit": result.unit,
        "kept": list(result.kept_ids), "scores": [own(s.score) for s in result.kept],
        "p_values": [s.p_value for s in result.kept],
        "spans": [[list(span) for span in (getattr(s, "spans", ()) or ())] for s in result.kept],
        "n_input": result.n_input, "n_cut": getattr(result, "n_cut", 0),
        "removal": result.removal, "threshold": threshold,
        "note": result.note,
        "removed": [{"snippet_id": s.snippet_id, "score": own(s.score), "p_value": s.p_value,
                     "threshold": threshold}
                    for s in result.removed],
        # the list unlike the filter's calibration lists (a list-aware score: see ragsieve.lists)
        "lists_unlike": result.lists_unlike, "lists_note": result.lists_note,
    }
    if scorer is not None:
        rule = scorer.keep_rule(result.threshold)
        record["score_name"], record["keep_if"] = rule.score, rule.keep_if
    if result.unit == "sentence":
        record["pruned_text"] = [s.pruned_text for s in result.kept]
    return record


class FilterTask:
    """Apply a saved filter: one record per query (see :func:`filter_record`).

    Parameters
    ----------
    artifact : Artifact or Mapping
        The filter artifact (``Artifact.read(path)``); a dict is read by
        :meth:`Artifact.from_dict <ragsieve.artifact.Artifact.from_dict>` (every field, the
        seal).
    scorer_options : mapping, optional
        Options that do not change scores (embedding cache, LLM endpoint).
    score_field : str, optional
        The outside score every pair must carry (an artifact of the ``field`` scorer).
    """

    kind = "filter"
    require_labels = False
    columns: tuple[str, ...] = ()

    def __init__(self, artifact: Artifact | Mapping[str, Any], *,
                 scorer_options: Mapping[str, Any] | None = None,
                 score_field: str | None = None) -> None:
        if isinstance(artifact, Mapping):
            artifact = Artifact.from_dict(artifact)
        if not isinstance(artifact, Artifact):
            raise TypeError(f"artifact is a {type(artifact).__name__}, expected an Artifact "
                            "(ragsieve.artifact.Artifact.read(path)) or the artifact dict.")
        self.artifact = artifact
        self.scorer_options = dict(scorer_options or {})
        self.score_field = score_field
        self._filter: Any = None

    def spec(self) -> dict[str, Any]:
        return {"task": self.kind, "artifact_sha256": self.artifact.identity}

    def setup(self) -> None:
        if self._filter is None:
            from ..filter import ConformalFilter

            self._filter = ConformalFilter.from_artifact(self.artifact,
                                                         scorer_options=self.scorer_options)

    @property
    def filter(self) -> Any:
        """The loaded :class:`~ragsieve.filter.ConformalFilter`."""
        self.setup()
        return self._filter

    def process(self, pairs: list[Pair]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        results = self.filter.filter_pairs(pairs)
        scorer = self.filter.scorer_
        records = [filter_record(qid, r, scorer) for qid, r in results.items()]
        kept = sum(len(r.kept) for r in results.values())
        return records, {"queries": len(results), "snippets": sum(r.n_input for r in
                                                                  results.values()), "kept": kept}

    def arrow(self, records: list[dict[str, Any]]) -> Any:
        from .._optional import require

        pa = require("pyarrow", "ray")
        schema = pa.schema([
            ("query_id", pa.string()), ("query", pa.string()), ("unit", pa.string()),
            ("kept", pa.list_(pa.string())), ("scores", pa.list_(pa.float64())),
            ("p_values", pa.list_(pa.float64())),
            ("spans", pa.string()), ("pruned_text", pa.list_(pa.string())),
            ("n_input", pa.int64()), ("n_cut", pa.int64()), ("removal", pa.float64()),
            ("threshold", pa.float64()), ("note", pa.string()), ("removed", pa.string()),
            ("lists_unlike", pa.bool_()), ("lists_note", pa.string()),
            ("score_name", pa.string()), ("keep_if", pa.string()),
        ])
        rows = [{**r, "spans": json.dumps(r["spans"]), "removed": json.dumps(r["removed"])}
                for r in records]
        return pa.Table.from_pylist(rows, schema=schema)

    def close(self) -> None:
        closer = getattr(getattr(self._filter, "scorer", None), "close", None)
        if callable(closer):
            closer()
        self._filter = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_filter"] = None
        return state
