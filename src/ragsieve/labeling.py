"""LLM as an annotation function: binary relevance labels for (query, snippet) pairs.

``LLMLabeler`` asks the rubric prompt of :mod:`ragsieve.llm.prompts` ("is the snippet
relevant for answering the question?") and fills ``relevant`` in the generic JSONL
format, keeping the raw answer. Two methods:

``yes-no``
    The reply's first word must be yes or no (instruction models); an unparseable
    reply is asked again once, then recorded as an error: ``relevant`` stays null and
    ``meta["llm_error"]`` says why. It never counts as relevant.
``logprob``
    ``relevant = P(yes) / (P(yes) + P(no)) >= threshold`` from the first-token
    log-probabilities (base models, which do not follow the answer format reliably).

``auto`` picks ``logprob`` for completion-style (base) models and ``yes-no`` for chat
models.

Resuming: every reply is stored in the persistent LLM cache as soon as it arrives, and
the output file is written atomically at the end, so a labelling job that is killed
leaves no half-written output and, rerun, asks the LLM only for the pairs it had not
answered yet.

A dead endpoint is an error, not a file of null labels: when ``max_failures_in_a_row``
pairs in a row (or every pair of a smaller run) fail after the client's retries because
the endpoint does not answer -- refused or reset connections, timeouts, HTTP 429 or 5xx
-- no new pair is started and :class:`~ragsieve.errors.LLMError` is raised; the replies
obtained so far stay in the cache, so a rerun resumes. A reply that arrives but cannot
be used (not JSON, no yes/no) stays an error of its pair: label null, run goes on.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ._validation import check_int, check_unit_interval
from .errors import LLMError
from .types import Pair

if TYPE_CHECKING:
    from .llm.connect import LLMConnection
    from .llm.judge import Judgement, RelevanceJudge

__all__ = [
    "LABEL_METHODS",
    "LLMLabeler",
    "LabelReport",
    "LabelTask",
    "agreement_from_counts",
    "label_agreement",
]

logger = logging.getLogger(__name__)

LABEL_METHODS = ("auto", "logprob", "yes-no")

_FAILED = "request failed: "
"""How :class:`~ragsieve.llm.judge.RelevanceJudge` records a request that failed for good."""
_ENDPOINT_DOWN = re.compile(r"(cannot reach |request to \S+ timed out |HTTP (429|5\d\d) from )")
"""The client's messages for failures of the endpoint itself (not of one reply)."""
_NOT_ASKED = "not asked: the endpoint had stopped answering"


def label_agreement(human: Sequence[int], llm: Sequence[int]) -> dict[str, float]:
    """Accuracy and Cohen's kappa of two binary label sequences.

    Parameters
    ----------
    human, llm : sequence of {0, 1}
        Aligned labels (pairs with a missing label must be removed first).

    Returns
    -------
    dict
        ``n``, ``accuracy``, ``kappa`` (NaN when chance agreement is 1), and the
        confusion counts ``tp``, ``fp``, ``fn``, ``tn`` (human as reference).

    Examples
    --------
    >>> d = label_agreement([1, 1, 0, 0], [1, 0, 0, 0])
    >>> d["accuracy"], d["kappa"]
    (0.75, 0.5)
    """
    h = np.asarray(human, dtype=int)
    m = np.asarray(llm, dtype=int)
    if h.shape != m.shape:
        raise ValueError(f"label sequences differ in length: {h.size} vs {m.size}.")
    return agreement_from_counts(
        tp=int(np.sum((h == 1) & (m == 1))), fp=int(np.sum((h == 0) & (m == 1))),
        fn=int(np.sum((h == 1) & (m == 0))), tn=int(np.sum((h == 0) & (m == 0))))


def agreement_from_counts(*, tp: int, fp: int, fn: int, tn: int) -> dict[str, float]:
    """:func:`label_agreement` from confusion counts (human as reference), e.g. added up
    over the shards of a run."""
    n = tp + fp + fn + tn
    if n == 0:
        return {"n": 0, "accuracy": math.nan, "kappa": math.nan, "tp": 0, "fp": 0, "fn": 0, "tn": 0}
    po = (tp + tn) / n
    pe = ((tp + fn) * (tp + fp) + (tn + fp) * (tn + fn)) / n**2
    kappa = math.nan if pe == 1 else (po - pe) / (1 - pe)
    return {"n": n, "accuracy": po, "kappa": kappa, "tp": tp, "fp": fp, "fn": fn, "tn": tn}


@dataclass(frozen=True)
class LabelReport:
    """What a labelling run did.

    ``prompt_tokens`` / ``completion_tokens`` count every answer used, including those
    served from the cache (what the labels cost in all); ``new_tokens`` counts only the
    tokens of the HTTP requests of this run (what this run cost); ``n_requests`` counts
    HTTP attempts and ``n_cache_hits`` answers reused from an earlier, possibly killed, run.
    """

    n_pairs: int
    n_labelled: int
    n_errors: int
    n_relevant: int
    method: str
    model: str
    prompt_version: str
    n_requests: int
    n_cache_hits: int
    prompt_tokens: int
    completion_tokens: int
    new_tokens: int
    seconds: float
    agreement: dict[str, float] | None = None

    @property
    def pairs_per_second(self) -> float:
        return self.n_pairs / self.seconds if self.seconds > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pairs_per_second"] = self.pairs_per_second
        return d


class LLMLabeler:
    """Label (query, snippet) pairs with an LLM.

    Parameters
    ----------
    connection : LLMConnection, optional
        Open connection; when None one is opened on first use with ``connect_options``
        (no ``base_url`` starts the local default model).
    method : {"auto", "logprob", "yes-no"}
        See the module docstring.
    threshold : float
        P(yes) at or above which ``logprob`` labels a pair relevant.
    max_failures_in_a_row : int
        Pairs in a row whose requests fail for good because the endpoint does not answer
        (after the client's retries) that stop the run with ``LLMError``; see the module
        docstring.
    **connect_options
        Passed to :func:`ragsieve.llm.connect`.
    """

    def __init__(
        self,
        connection: LLMConnection | None = None,
        *,
        method: str = "auto",
        threshold: float = 0.5,
        max_failures_in_a_row: int = 3,
        **connect_options: Any,
    ) -> None:
        if method not in LABEL_METHODS:
            raise ValueError(f"method == {method!r}, must be one of {LABEL_METHODS}.")
        self.threshold = check_unit_interval(threshold, "threshold", closed_right=False)
        self.max_failures_in_a_row = check_int(max_failures_in_a_row, "max_failures_in_a_row",
                                               min_value=1)
        self.method = method
        self._connection = connection
        self._owns_connection = connection is None
        self._connect_options = connect_options

    @property
    def connection(self) -> LLMConnection:
        if self._connection is None:
            from .llm.connect import connect

            self._connection = connect(**self._connect_options)
        return self._connection

    @property
    def resolved_method(self) -> str:
        """The method actually used (``auto`` resolved by the prompt style)."""
        if self.method != "auto":
            return self.method
        return "logprob" if self.connection.style == "completion" else "yes-no"

    def close(self) -> None:
        if self._owns_connection and self._connection is not None:
            self._connection.close()
            self._connection = None

    def label_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> tuple[list[Pair], LabelReport]:
        """Label pairs; returns new pairs (inputs are never mutated) and a report.

        Each output pair has ``relevant`` set from the LLM (``None`` on error) and
        ``meta`` extended with ``llm_answer``, ``llm_error``, ``llm_p_yes`` (logprob),
        ``llm_model``, ``llm_prompt_version`` and, when the input had a label,
        ``human_relevant``.

        Raises
        ------
        LLMError
            The endpoint stopped answering (see the module docstring); the replies
            obtained so far are in the reply cache.
        """
        from .llm.judge import RelevanceJudge

        pairs = list(pairs)
        conn = self.connection
        method = self.resolved_method
        judge = RelevanceJudge(conn.client, style=conn.style)
        version = judge.prompt_version(method)
        before = dict(conn.client.usage)
        t0 = time.perf_counter()
        items = list(dict.fromkeys((p.query, p.text) for p in pairs))
        judgements = dict(zip(items, self._judge_all(judge, method, items, progress)))
        seconds = time.perf_counter() - t0
        out: list[Pair] = []
        human: list[int] = []
        llm: list[int] = []
        n_err = 0
        for p in pairs:
            j = judgements[(p.query, p.text)]
            label: int | None = None
            if j.value is not None:
                label = int(j.value >= self.threshold) if method == "logprob" else int(j.value)
            else:
                n_err += 1
            meta = dict(p.meta)
            meta.update({"llm_answer": j.answer, "llm_error": j.error, "llm_model": conn.model,
                         "llm_prompt_version": version})
            if method == "logprob":
                meta["llm_p_yes"] = j.value
            if p.relevant is not None:
                meta["human_relevant"] = p.relevant
                if label is not None:
                    human.append(p.relevant)
                    llm.append(label)
            out.append(replace(p, relevant=label, meta=meta))
        usage = conn.client.usage
        report = LabelReport(
            n_pairs=len(pairs), n_labelled=len(pairs) - n_err, n_errors=n_err,
            n_relevant=sum(1 for p in out if p.relevant == 1), method=method, model=conn.model,
            prompt_version=version,
            n_requests=int(usage.get("n_requests", 0) - before.get("n_requests", 0)),
            n_cache_hits=int(usage.get("n_cache_hits", 0) - before.get("n_cache_hits", 0)),
            prompt_tokens=sum(j.prompt_tokens for j in judgements.values()),
            completion_tokens=sum(j.completion_tokens for j in judgements.values()),
            new_tokens=int(sum(usage.get(k, 0) - before.get(k, 0)
                               for k in ("prompt_tokens", "completion_tokens"))),
            seconds=seconds,
            agreement=label_agreement(human, llm) if human else None,
        )
        if n_err:
            logger.warning("%d of %d pairs got no usable LLM answer; their label is null "
                           "(see meta.llm_error)", n_err, len(pairs))
        return out, report

    def _judge_all(self, judge: RelevanceJudge, method: str, items: list[tuple[str, str]],
                   progress: bool) -> list[Judgement]:
        """Judge every item concurrently; stop starting new ones, and raise ``LLMError``,
        once the endpoint has stopped answering."""
        from .llm.judge import Judgement

        conn = self.connection
        limit = min(self.max_failures_in_a_row, len(items))
        lock = threading.Lock()
        state: dict[str, Any] = {"in_a_row": 0, "down": None}

        def ask(item: tuple[str, str]) -> Judgement:
            if state["down"] is not None:
                return Judgement(value=None, answer="", error=_NOT_ASKED)
            j = judge.judge(method, item[0], item[1])
            error = j.error or ""
            with lock:
                if error.startswith(_FAILED) and _ENDPOINT_DOWN.match(error, len(_FAILED)):
                    state["in_a_row"] += 1
                    if state["in_a_row"] >= limit and state["down"] is None:
                        state["down"] = (state["in_a_row"], error[len(_FAILED):])
                else:
                    state["in_a_row"] = 0
            return j

        results: list[Judgement] = []
        for r in conn.client.map(ask, items, progress=progress, desc=f"labelling ({conn.model})"):
            if isinstance(r, BaseException):  # a bug or an interrupt, never a bad reply
                raise r
            results.append(r)
        if state["down"] is not None:
            in_a_row, last = state["down"]
            n_ok = sum(1 for r in results if r.value is not None)
            if not n_ok:
                kept = f"None of the {len(items)} pairs was answered"
            elif conn.client.cache is not None:
                kept = (f"{n_ok} of {len(items)} pairs were answered and their replies are "
                        "kept in the reply cache, so a rerun asks only for the rest")
            else:
                kept = (f"{n_ok} of {len(items)} pairs were answered, but no reply cache is in "
                        "use (--no-cache): a rerun asks for every pair again")
            pairs = "pair" if in_a_row == 1 else "pairs"
            raise LLMError(
                f"the LLM endpoint {conn.base_url} is not answering: {in_a_row} {pairs} in a row "
                f"failed after their retries (last: {last}). {kept}. Check the endpoint "
                "(--base-url), then rerun."
            )
        return results

    def label_file(self, source: str | os.PathLike[str], destination: str | os.PathLike[str], *,
                   progress: bool = False) -> LabelReport:
        """Label a generic JSONL file into another; resumable through the LLM cache."""
        from .data.jsonl import read_pairs, write_pairs

        pairs = read_pairs(source)
        labelled, report = self.label_pairs(pairs, progress=progress)
        write_pairs(labelled, destination)
        return report


_COUNTS = ("n_pairs", "n_labelled", "n_errors", "n_relevant", "n_requests", "n_cache_hits",
           "prompt_tokens", "completion_tokens", "new_tokens")


class LabelTask:
    """Labelling as an engine task (:mod:`ragsieve.engines`): labelled pair records.

    Every worker opens its own connection in :meth:`setup` (with no ``base_url``, each
    starts the local model); replies go through the LLM reply cache as in
    :class:`LLMLabeler`. The counts of every batch (pairs, errors, tokens, agreement with
    existing labels as confusion counts) are added up by the engine.

    Parameters
    ----------
    method, threshold, max_failures_in_a_row
        As in :class:`LLMLabeler`.
    **connect_options
        Passed to :func:`ragsieve.llm.connect` in each worker.
    """

    kind = "label"
    require_labels = False
    score_field: str | None = None
    columns: tuple[str, ...] = ()

    def __init__(self, *, method: str = "auto", threshold: float = 0.5,
                 max_failures_in_a_row: int = 3, **connect_options: Any) -> None:
        LLMLabeler(method=method, threshold=threshold,  # validates, connects nothing
                   max_failures_in_a_row=max_failures_in_a_row)
        self.method, self.threshold = method, float(threshold)
        self.max_failures_in_a_row = max_failures_in_a_row
        self.connect_options = dict(connect_options)
        self._labeler: LLMLabeler | None = None
        self._info: dict[str, str] = {}

    def spec(self) -> dict[str, Any]:
        o = self.connect_options
        return {"task": self.kind, "method": self.method, "threshold": self.threshold,
                "base_url": o.get("base_url"), "model": o.get("model"), "style": o.get("style")}

    def setup(self) -> None:
        if self._labeler is None:
            self._labeler = LLMLabeler(method=self.method, threshold=self.threshold,
                                       max_failures_in_a_row=self.max_failures_in_a_row,
                                       **self.connect_options)

    def process(self, pairs: list[Pair]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        from .data.jsonl import pair_to_record

        self.setup()
        assert self._labeler is not None
        labelled, report = self._labeler.label_pairs(pairs)
        stats: dict[str, float] = {k: getattr(report, k) for k in _COUNTS}
        stats["seconds_labelling"] = report.seconds
        for key in ("tp", "fp", "fn", "tn"):
            stats[key] = (report.agreement or {}).get(key, 0)
        self._info = {"model": report.model, "method": report.method,
                      "prompt_version": report.prompt_version}
        return [pair_to_record(p) for p in labelled], stats

    def info(self) -> dict[str, str]:
        """Model, method and prompt version of the last batch."""
        return dict(self._info)

    def arrow(self, records: list[dict[str, Any]]) -> Any:
        from .data.parquet import records_table

        return records_table(records)

    def close(self) -> None:
        if self._labeler is not None:
            self._labeler.close()
        self._labeler = None

    def __getstate__(self) -> dict[str, Any]:  # ship options, never a connection
        state = dict(self.__dict__)
        state["_labeler"] = None
        return state

    @staticmethod
    def report(stats: dict[str, float], info: dict[str, str], seconds: float,
               new_stats: dict[str, float] | None = None) -> LabelReport:
        """A :class:`LabelReport` of a whole run from the added-up counts; requests,
        cache hits and new tokens come from ``new_stats`` (the parts this run wrote)."""
        counts = {k: int(stats.get(k, 0)) for k in _COUNTS}
        if new_stats is not None:
            counts.update({k: int(new_stats.get(k, 0))
                           for k in ("n_requests", "n_cache_hits", "new_tokens")})
        counts_2x2 = {k: int(stats.get(k, 0)) for k in ("tp", "fp", "fn", "tn")}
        agreement = agreement_from_counts(**counts_2x2) if any(counts_2x2.values()) else None
        return LabelReport(**counts, method=info.get("method", "?"),
                           model=info.get("model", "?"),
                           prompt_version=info.get("prompt_version", "?"),
                           seconds=seconds, agreement=agreement)

