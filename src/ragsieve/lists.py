"""The shape of the retrieved lists: what calibration saw, and a check of what a filter is given.

A split conformal threshold promises its coverage for (query, list) pairs exchangeable
with the calibration pairs. For a score of one snippet at a time (``1 - cos``, an LLM's
rating, an outside score, the portable fused score) the rest of the list does not enter the
score, and the promise travels to lists of any retriever that brings up snippets like the
calibration snippets. A **list-aware** score (the list-relative and fused scores, the
in-list BM25: :attr:`ragsieve.scoring.ScorerTags.list_dependent`) reads the other snippets of
the list, so its guarantee holds for lists like the calibration lists only: the same
retriever, the same ``k``, the same corpus. Calibrated on a data set's own lists (4 snippets
of one article section) and deployed behind a BM25 top-10 of a pooled corpus, the default
fused score kept well below the promised evidence (docs/deploy.md).

So the artifact records the calibration lists (:class:`ListRecord`, its sealed ``"lists"``
block) and every surface that applies a filter checks the lists it is given
(:class:`ListWatch`, which :class:`~ragsieve.ConformalFilter` holds):

* **where the lists came from** (``source``): ``"retriever"`` (the pairs carry the identity
  of the retriever that returned them: ``ragsieve retrieve`` over a ``ragsieve index``, or a
  framework component's ``calibrate(retriever, queries)``), ``"deployed"`` (the user says they
  are the deployed retriever's: ``calibrate --lists deployed``) or ``"data"`` (a data set's
  own lists). The default score is list-aware only for the first two
  (:func:`~ragsieve.scoring.auto.choose_score`); ``query`` and ``serve`` compare a recorded
  retriever with the index they search (:func:`compare_retriever`).
* **what the lists looked like**: the length of every calibration list and, for a
  list-aware score, the list-level statistic its features read: the **spread** of its root
  score within each list (the score at the bottom of the scorer's base chain, e.g.
  ``1 - cos`` under the fused score), ``mean - best``: how far a list's typical snippet lies
  from its best. A retriever's tight top-k (every snippet near the best), a lexical
  retriever's scattered one and a document's own snippets differ there at the same length;
  the level of the scores (the best, the mean) moves with the topic more than with the
  retriever, and is not watched.

The check (list-aware scores only; a list-free score's lists are recorded, not watched):

1. **Outside the calibration lengths** -- a list shorter than the shortest calibration list
   or longer than the longest (2 snippets where every calibration list had 10) is flagged at
   once: the score was never calibrated on such a list. On lists like the calibration lists
   this happens to a given list with probability at most ``2 / (n + 1)`` for ``n``
   calibration lists (a new exchangeable length is the strict minimum or maximum of ``n + 1``
   with at most that probability), and never when every calibration list had the same
   length (a retriever's top ``k``).
2. **A sequential test** over the lists seen so far -- one conformal test martingale per
   statistic (:class:`ragsieve._martingale.OnlineConformalTest`, the machinery of the
   service's exchangeability monitor, :mod:`ragsieve.monitoring`), combined by a union
   bound: the alarm fires when ``max_i M_i / K >= 1/delta`` after at least ``min_lists``
   lists *and* the mean of that statistic over the last :data:`WINDOW` lists differs from
   the calibration mean by more than its floor (:data:`FLOOR_SDS` standard deviations of
   the calibration topics' means: what one topic's lists alone do). That is a sub-event of
   the martingale's crossing, so on lists exchangeable with the calibration lists it ever
   fires with probability at most ``delta`` (default 0.01), however many lists follow.
   Exchangeable includes the order: a batch is shown to the watch in a random order
   (:meth:`ragsieve.ConformalFilter.filter_pairs`); a live stream in runs of one topic is
   not exchangeable, and the floor is what keeps most such runs quiet (docs/deploy.md has
   ``benchmarks/bench_list_watch.py``'s runs).

Either event logs one WARNING (each once per watch) with the numbers in the user's terms
("lists of 10.0 snippets on average over the 25 seen, where calibration saw 4.2 (1 to 15)")
and flags the results (:attr:`ragsieve.types.FilterResult.lists_unlike`, ``lists_note``):
``filter --json``, the service's responses and ``/metrics`` carry it. See docs/deploy.md.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ._martingale import OnlineConformalTest
from .errors import ArtifactError
from .types import RETRIEVER_KEY, Pair

__all__ = [
    "DEFAULT_DELTA", "DEFAULT_MIN_LISTS", "DOCS", "MAX_LISTS", "MAX_LIST_LENGTH", "SOURCE_KINDS",
    "ListCheck", "ListRecord",
    "ListWatch", "compare_retriever", "describe_retriever", "list_spread", "lists_source",
    "retriever_of",
]

logger = logging.getLogger(__name__)

#: Where the guide to calibrating through the deployed retriever lives.
DOCS = "docs/deploy.md"
#: Where calibration lists may come from.
SOURCE_KINDS = ("retriever", "deployed", "data")
#: False-alarm bound of the sequential test.
DEFAULT_DELTA = 0.01
#: Fewest lists seen before the sequential test may raise its alarm.
DEFAULT_MIN_LISTS = 10
#: The alarm compares a statistic's mean over the last this many lists with the calibration
#: mean (a shift after a long like-calibration stretch shows within it).
WINDOW = 50
#: At most this many calibration lists' statistics are kept (a seeded random subsample).
MAX_REFERENCE = 20_000
#: Most calibration lists a ``"lists"`` block may count (far beyond any calibration; its
#: lengths are held as one int64 array).
MAX_LISTS = 10**7
#: Longest calibration list a ``"lists"`` block may record (snippets).
MAX_LIST_LENGTH = 10**6
_VERSION = 1
_KEYS = frozenset({"version", "source", "list_dependent", "n_lists", "lengths", "seed"})
_OPTIONAL = frozenset({"spread", "score", "floors"})


def retriever_of(pairs: Sequence[Pair]) -> dict[str, Any] | None:
    """The retriever identity every pair carries (``meta["retriever"]``, what
    ``ragsieve retrieve`` writes), or None when some pair carries none or two pairs carry
    different ones (lists of several retrievers)."""
    found: dict[str, Any] | None = None
    for pair in pairs:
        value = pair.meta.get(RETRIEVER_KEY)
        if not isinstance(value, Mapping):
            return None
        if found is None:
            found = dict(value)
        elif dict(value) != found:
            return None
    return found


def lists_source(lists: Any, retriever: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``source`` of calibration lists, from what the user said and what the pairs carry.

    Parameters
    ----------
    lists : {None, "auto", "retriever", "deployed", "data"} or Mapping
        What the user said: None or ``"auto"`` reads it from the pairs (a retriever
        identity they all carry makes them ``"retriever"`` lists, else ``"data"``);
        ``"deployed"``: they are the deployed retriever's lists; ``"data"``: a data set's own
        lists (whatever the pairs carry); a mapping: a whole source, as recorded.
    retriever : Mapping or None
        The retriever identity every pair carries
        (:func:`retriever_of`), or None.

    Returns
    -------
    dict
        ``{"kind": ..., "retriever": identity}`` (the identity when the pairs carry one).

    Raises
    ------
    ValueError
        Another value, or ``"retriever"`` for pairs that carry no retriever identity.

    Examples
    --------
    >>> lists_source(None, None)
    {'kind': 'data'}
    >>> lists_source("deployed", {"kind": "ragsieve-index", "k": 10})
    {'kind': 'deployed', 'retriever': {'kind': 'ragsieve-index', 'k': 10}}
    """
    if isinstance(lists, Mapping):
        return _check_source(dict(lists), "lists", error=ValueError)
    if lists is None or lists == "auto":
        kind = "retriever" if retriever is not None else "data"
    elif lists in SOURCE_KINDS:
        kind = str(lists)
        if kind == "retriever" and retriever is None:
            raise ValueError("lists == 'retriever', but the calibration pairs carry no retriever "
                             "identity (the 'retriever' key `ragsieve retrieve` writes on every "
                             "line); pass lists='deployed' if they are your retriever's lists.")
    else:
        raise ValueError(f"lists == {lists!r:.60}, must be one of 'auto', "
                         f"{', '.join(map(repr, SOURCE_KINDS))}.")
    return {"kind": kind, **({"retriever": dict(retriever)} if retriever is not None else {})}


def _check_source(source: Any, where: str, *, error: type[Exception] = ArtifactError) -> dict[str, Any]:
    if not isinstance(source, Mapping) or source.get("kind") not in SOURCE_KINDS:
        got = source.get("kind") if isinstance(source, Mapping) else type(source).__name__
        raise error(f"{where} source kind == {got!r:.60}, expected one of {list(SOURCE_KINDS)}.")
    unknown = sorted(set(source) - {"kind", "retriever"})
    retriever = source.get("retriever")
    if unknown or (retriever is not None and not isinstance(retriever, Mapping)):
        raise error(f"{where} source {dict(source)!r:.120} has unknown keys {unknown} or a "
                    "retriever that is not an object; expected {'kind', 'retriever'}.")
    return dict(source)


def _summary(values: np.ndarray, noun: str = "") -> str:
    """``"4.7 snippets on average (1 to 8)"`` (``noun`` ``"snippets"``) of list lengths."""
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return f"{lo}{' ' + noun if noun else ''} each"
    return f"{values.mean():.1f}{' ' + noun if noun else ''} on average ({lo} to {hi})"


@dataclass(frozen=True)
class ListRecord:
    """The calibration lists of a filter: where they came from and what they looked like.

    Build one with :meth:`from_lists` (at calibration) or :meth:`from_dict` (from an
    artifact's ``"lists"`` block).

    Attributes
    ----------
    source : dict
        ``{"kind": "retriever" | "deployed" | "data", "retriever": identity}`` (see the
        module docstring; ``retriever`` when the pairs carried one).
    list_dependent : bool
        Whether the filter's score depends on the rest of the list (then the lists are
        checked).
    lengths : numpy.ndarray of int
        The length of every calibration list.
    spread : numpy.ndarray or None
        The spread of the root score in each calibration list, ``mean - best`` (a seeded
        subsample of at most 20,000), for a list-aware score; None when not recorded.
    score : str or None
        What ``spread`` is of (the root score's label, e.g. ``"1 - cos"``).
    floors : dict
        Per statistic (``length``, ``spread``), :data:`FLOOR_SDS` standard deviations of its mean
        over the calibration topics (:func:`_topic_floor`; 0 when fewer than 5 topics have
        2 or more lists): the sequential test's alarm needs the lists seen to differ from
        the calibration lists by more than that, not only to differ.
    seed : int
        Seed of the subsample.
    """

    source: dict[str, Any]
    list_dependent: bool
    lengths: np.ndarray
    spread: np.ndarray | None = None
    score: str | None = None
    floors: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    n_lists: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_lists", int(self.lengths.size))

    @classmethod
    def from_lists(cls, query_ids: Sequence[Any], root_scores: Any = None, *,
                   source: Mapping[str, Any], list_dependent: bool, score: str | None = None,
                   topics: Sequence[Any] | None = None, seed: int = 0) -> ListRecord:
        """The record of calibration lists: one list per query id.

        Parameters
        ----------
        query_ids : sequence
            The query of every calibration snippet (a query's snippets form its list).
        root_scores : array-like of float, optional
            The root score of every snippet (aligned with ``query_ids``), for the list-level
            statistics; None records the lengths alone.
        source : Mapping
            Where the lists came from (:func:`lists_source`).
        list_dependent : bool
            The filter's score reads the whole list.
        score : str, optional
            The root score's label.
        topics : sequence, optional
            The topic of every snippet (``Pair.group``, aligned with ``query_ids``), for the
            statistics' ``floors``: how far calibration topics' means lie from each other.
        seed : int
            Seed of the subsample beyond 20,000 lists.
        """
        by_query: dict[Any, list[int]] = {}
        for i, qid in enumerate(query_ids):
            by_query.setdefault(qid, []).append(i)
        if not by_query:
            raise ValueError("no calibration list to record (no pairs).")
        lengths = np.array([len(idx) for idx in by_query.values()], dtype=np.int64)
        topic = None if topics is None else [topics[idx[0]] for idx in by_query.values()]
        floors = {"length": _topic_floor(lengths, topic)}
        spread = None
        if root_scores is not None:
            arr = np.asarray(root_scores, dtype=np.float64)
            if arr.shape != (len(query_ids),) or not np.all(np.isfinite(arr)):
                raise ValueError(f"root_scores has shape {arr.shape} (or non-finite values); "
                                 f"expected {len(query_ids)} finite scores.")
            every = np.array([list_spread(arr[idx]) for idx in by_query.values()])
            floors["spread"] = _topic_floor(every, topic)
            spread = every[_subsample(len(by_query), seed)]
        return cls(source=_check_source(dict(source), "lists", error=ValueError),
                   list_dependent=bool(list_dependent), lengths=lengths, spread=spread,
                   score=score if spread is not None else None, floors=floors, seed=int(seed))

    # ------------------------------------------------------------------ the block
    def to_dict(self) -> dict[str, Any]:
        """The artifact's ``"lists"`` block (JSON): the lengths as ``[length, count]`` rows."""
        values, counts = np.unique(self.lengths, return_counts=True)
        out: dict[str, Any] = {
            "version": _VERSION, "source": dict(self.source),
            "list_dependent": self.list_dependent, "n_lists": self.n_lists,
            "lengths": [[int(v), int(c)] for v, c in zip(values, counts, strict=True)],
            "seed": self.seed}
        if self.spread is not None:
            out.update(spread=[round(float(v), 6) for v in self.spread], score=self.score)
        if self.floors:
            out["floors"] = {k: round(float(v), 6) for k, v in self.floors.items()}
        return out

    @classmethod
    def from_dict(cls, block: Any, *, max_lists: int = MAX_LISTS) -> ListRecord:
        """Read an artifact's ``"lists"`` block strictly.

        Parameters
        ----------
        block : Mapping
            The block as stored.
        max_lists : int, default=MAX_LISTS
            Most calibration lists the artifact can hold (the snippets they were recorded
            from, when it states them); lengths counting more lists are refused before any
            array is allocated.

        Raises
        ------
        ArtifactError
            Not an object, missing or unknown keys, a version this ragsieve does not read,
            lengths that are not ``[length >= 1, count >= 1]`` rows summing to ``n_lists``,
            more lists than ``max_lists`` or :data:`MAX_LISTS`, a list longer than
            :data:`MAX_LIST_LENGTH`,
            statistics that are not finite numbers (at most one per list), or a malformed
            source.
        """
        if not isinstance(block, Mapping) or not _KEYS <= set(block) <= _KEYS | _OPTIONAL:
            keys = sorted(block) if isinstance(block, Mapping) else type(block).__name__
            raise ArtifactError(f"artifact 'lists' has keys {keys}, expected {sorted(_KEYS)} and "
                                f"optionally {sorted(_OPTIONAL)}.")
        if block["version"] != _VERSION or isinstance(block["version"], bool):
            raise ArtifactError(f"artifact 'lists' version {block['version']!r:.20} is not one this "
                                f"ragsieve reads ({_VERSION}); recalibrate.")
        if not isinstance(block["list_dependent"], bool):
            raise ArtifactError("artifact 'lists' list_dependent must be true or false.")
        rows = block["lengths"]
        if not isinstance(rows, list) or not rows or any(
                not isinstance(r, list) or len(r) != 2 or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in r)
                for r in rows):
            raise ArtifactError("artifact 'lists' lengths must be a non-empty list of "
                                "[length >= 1, count >= 1] integer pairs.")
        # the counts are checked before any array is made of them (a 24-byte row may ask
        # for a billion lists)
        longest = max(r[0] for r in rows)
        if longest > MAX_LIST_LENGTH:
            raise ArtifactError(f"artifact 'lists' holds a list of {_digits(longest)} snippets, "
                                f"expected at most {MAX_LIST_LENGTH}; the artifact was edited: "
                                "recalibrate.")
        total = sum(r[1] for r in rows)
        n_lists, seed = block["n_lists"], block["seed"]
        if total > min(max_lists, MAX_LISTS):
            raise ArtifactError(f"artifact 'lists' counts {_digits(total)} calibration lists, more "
                                f"than its calibration can hold ({min(max_lists, MAX_LISTS)}); the "
                                "artifact was edited: recalibrate.")
        if isinstance(n_lists, bool) or n_lists != total or isinstance(seed, bool) \
                or not isinstance(seed, int) or seed < 0:
            raise ArtifactError(f"artifact 'lists' n_lists == {n_lists!r:.20} disagrees with its "
                                f"{total} lengths (or seed {seed!r:.20} is not an int >= 0).")
        lengths = np.repeat(np.array([r[0] for r in rows], dtype=np.int64),
                            [r[1] for r in rows])
        spread = _floats(block.get("spread"), "spread", lengths.size)
        if spread is not None and np.any(spread < 0):
            raise ArtifactError("artifact 'lists' spread must hold numbers >= 0 (mean - best).")
        score = block.get("score")
        if score is not None and not isinstance(score, str):
            raise ArtifactError("artifact 'lists' score must be a string.")
        floors = block.get("floors", {})
        if not isinstance(floors, Mapping) or any(
                k not in ("length", "spread") or isinstance(v, bool)
                or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                for k, v in floors.items()):
            raise ArtifactError("artifact 'lists' floors must map 'length' / 'spread' to finite "
                                "numbers >= 0.")
        return cls(source=_check_source(block["source"], "artifact 'lists'"),
                   list_dependent=block["list_dependent"], lengths=lengths, spread=spread,
                   score=score, floors={k: float(v) for k, v in floors.items()}, seed=seed)

    # ------------------------------------------------------------------ wording
    @property
    def deployed(self) -> bool:
        """True when the lists are the deployed retriever's (``retriever`` or ``deployed``)."""
        return self.source["kind"] in ("retriever", "deployed")

    @property
    def retriever(self) -> dict[str, Any] | None:
        """The recorded retriever identity, or None."""
        found = self.source.get("retriever")
        return dict(found) if isinstance(found, Mapping) else None

    def describe(self) -> str:
        """Where the lists came from and their lengths, in one clause.

        Examples
        --------
        >>> rec = ListRecord.from_lists(["a", "a", "b"], source={"kind": "data"},
        ...                             list_dependent=True)
        >>> rec.describe()
        "the data set's own lists: 2 lists of 1.5 snippets on average (1 to 2)"
        """
        kind = self.source["kind"]
        retriever = self.retriever
        if retriever is not None and kind != "data":
            where = f"the lists of {describe_retriever(retriever)}"
        elif kind == "deployed":
            where = "lists declared to be the deployed retriever's"
        else:
            where = "the data set's own lists"
        return f"{where}: {self.n_lists} lists of {_summary(self.lengths, 'snippets')}"


def describe_retriever(identity: Mapping[str, Any]) -> str:
    """A retriever identity in a few words.

    Examples
    --------
    >>> describe_retriever({"kind": "ragsieve-index", "index": "3f2a9c0d1e", "model": "m", "k": 10})
    'index 3f2a9c0d (m, top 10)'
    >>> describe_retriever({"kind": "framework", "framework": "haystack",
    ...                     "retriever": "InMemoryBM25Retriever", "k": 5})
    'haystack InMemoryBM25Retriever (top 5)'
    """
    k = identity.get("k")
    top = f"top {k}" if k is not None else ""
    if identity.get("kind") == "ragsieve-index":
        inner = ", ".join(x for x in (str(identity.get("model") or ""), top) if x)
        return f"index {str(identity.get('index', '?'))[:8]}" + (f" ({inner})" if inner else "")
    name = " ".join(str(identity[k]) for k in ("framework", "retriever") if identity.get(k))
    return (name or "a retriever") + (f" ({top})" if top else "")


#: How many standard deviations of a statistic's mean over the calibration topics the recent
#: lists must differ by before the alarm fires: a run of one topic's lists moves their mean by
#: about one topic's deviation, beyond 2 standard deviations for about 1 topic in 20.
FLOOR_SDS = 2.0
#: Fewest calibration topics (of 2 or more lists each) a statistic's floor is computed from.
MIN_FLOOR_TOPICS = 5


def _topic_floor(values: np.ndarray, topics: Sequence[Any] | None) -> float:
    """:data:`FLOOR_SDS` standard deviations of a statistic's mean over the calibration topics with
    2 or more lists (0 when fewer than :data:`MIN_FLOOR_TOPICS` such topics, or no topics):
    how far one topic's lists alone move its mean."""
    if topics is None:
        return 0.0
    by: dict[Any, list[float]] = {}
    for topic, value in zip(topics, values.tolist(), strict=True):
        by.setdefault(topic, []).append(value)
    means = [float(np.mean(v)) for v in by.values() if len(v) >= 2]
    return FLOOR_SDS * float(np.std(means)) if len(means) >= MIN_FLOOR_TOPICS else 0.0


def list_spread(scores: Any) -> float:
    """The spread of one list's root scores: ``mean - best`` (0 for a list of one).

    Examples
    --------
    >>> round(list_spread([0.2, 0.4, 0.6]), 6)
    0.2
    """
    arr = np.asarray(scores, dtype=np.float64)
    return float(arr.mean() - arr.min())


def _digits(value: int) -> str:
    """An int as written, or its digit count when it is long."""
    text = str(value)
    return text if len(text) <= 20 else f"a {len(text)}-digit number of"


def _floats(value: Any, name: str, n_lists: int) -> np.ndarray | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > n_lists or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in value):
        raise ArtifactError(f"artifact 'lists' {name} must be a non-empty list of finite numbers, "
                            f"at most one per calibration list ({n_lists}).")
    return np.asarray(value, dtype=np.float64)


def _subsample(n: int, seed: int) -> np.ndarray:
    if n <= MAX_REFERENCE:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=MAX_REFERENCE, replace=False))


def compare_retriever(record: ListRecord | None, identity: Mapping[str, Any]) -> str | None:
    """Why lists from the retriever ``identity`` are not the calibration lists; None when
    nothing known differs (or the score does not read the list).

    Parameters
    ----------
    record : ListRecord or None
        The artifact's record (None: an artifact written before it existed: nothing known).
    identity : Mapping
        The deploying retriever, e.g. :meth:`ragsieve.store.SnippetIndex.retriever_identity`.

    Examples
    --------
    >>> rec = ListRecord.from_lists(["a"] * 10, source={"kind": "retriever", "retriever": {
    ...     "kind": "ragsieve-index", "index": "ab12", "model": "m", "k": 10}}, list_dependent=True)
    >>> compare_retriever(rec, {"kind": "ragsieve-index", "index": "ab12", "model": "m", "k": 10}) is None
    True
    >>> compare_retriever(rec, {"kind": "ragsieve-index", "index": "ab12", "model": "m", "k": 20})
    'the filter was calibrated on the top 10 of its retriever, and this retrieves the top 20'
    """
    if record is None or not record.list_dependent:
        return None
    recorded = record.retriever
    if recorded is None or record.source["kind"] == "data":
        return (f"the filter was calibrated on {record.describe()}, not on lists of "
                f"{describe_retriever(identity)}")
    reasons = []
    if recorded.get("kind") != identity.get("kind") or any(
            recorded.get(key) != identity.get(key) for key in ("index", "model", "framework",
                                                                 "retriever")
            if key in recorded or key in identity):
        reasons.append(f"the filter was calibrated on lists of {describe_retriever(recorded)}, "
                       f"not of {describe_retriever(identity)}")
    elif recorded.get("k") is not None and identity.get("k") is not None \
            and recorded["k"] != identity["k"]:
        reasons.append(f"the filter was calibrated on the top {recorded['k']} of its retriever, "
                       f"and this retrieves the top {identity['k']}")
    return "; ".join(reasons) or None


class ListCheck(NamedTuple):
    """What :meth:`ListWatch.see` found for one list.

    Attributes
    ----------
    unlike : bool
        The list is outside the calibration lengths, or the sequential test's alarm is on.
    outside : bool
        This list's length is outside the calibration lists' range.
    alarm : bool
        The sequential test has fired (latched).
    note : str or None
        What differs, in the user's terms (None when ``unlike`` is False).
    """

    unlike: bool = False
    outside: bool = False
    alarm: bool = False
    note: str | None = None


_NOTHING = ListCheck()


class ListWatch:
    """Check the lists a filter is given against its calibration lists (see the module docstring).

    Parameters
    ----------
    record : ListRecord
        The calibration lists.
    delta : float, default=0.01
        False-alarm bound of the sequential test.
    min_lists : int, default=10
        Fewest lists seen before the sequential test may fire.
    score_name : str
        How the filter's score is named in the warning (``"the fused score"``).
    seed : int
        Seed of the p-values' tie-breaking.
    log : bool, default=True
        Log one WARNING per event (a list outside the lengths, the alarm); False when the
        caller reports each :class:`ListCheck` note itself (``ragsieve query``), so that the
        event is said once.

    Thread-safe: a served filter's copies share one watch.
    """

    def __init__(self, record: ListRecord, *, delta: float = DEFAULT_DELTA,
                 min_lists: int = DEFAULT_MIN_LISTS, score_name: str = "this score",
                 seed: int = 0, log: bool = True) -> None:
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta == {delta!r}, must be in (0, 1).")
        self.record = record
        self.delta = float(delta)
        self.min_lists = int(min_lists)
        self.score_name = score_name
        self.seed = seed
        self.log = bool(log)
        self.active = record.list_dependent
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start afresh: no list seen, no alarm, warnings not yet given."""
        rec = self.record
        refs: dict[str, Any] = {"length": rec.lengths.astype(np.float64)}
        if rec.spread is not None:
            refs["spread"] = rec.spread
        with self._lock:
            self._tests = {name: OnlineConformalTest(ref, seed=self.seed + i)
                           for i, (name, ref) in enumerate(refs.items())}
            self._log_m = dict.fromkeys(self._tests, 0.0)
            self._recent: dict[str, deque[float]] = {
                name: deque(maxlen=WINDOW) for name in self._tests}
            self.n_seen = 0
            self.n_outside = 0
            self.fired_at: int | None = None
            self._fired: str | None = None
            #: The alarm's one wording, fixed when it fires (its numbers are the firing's).
            self._alarm_note: str | None = None
            self._warned_outside = False

    def to_state(self) -> dict[str, Any]:
        """Everything the watch has seen, as plain JSON (:meth:`load_state` continues from
        it): the service keeps it in its state directory so a restart keeps the alarm."""
        with self._lock:
            return {"n_seen": self.n_seen, "n_outside": self.n_outside,
                    "fired_at": self.fired_at, "fired": self._fired,
                    "warned_outside": self._warned_outside, "log_m": dict(self._log_m),
                    "recent": {k: list(v) for k, v in self._recent.items()},
                    "tests": {k: t.to_state() for k, t in self._tests.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`to_state`'s output (of a watch of the same record).

        Raises
        ------
        ValueError, TypeError, KeyError
            A state of another shape or of other statistics.
        """
        tests = state["tests"]
        if set(tests) != set(self._tests) or set(state["recent"]) != set(self._tests):
            raise ValueError(f"a list watch state of statistics {sorted(tests)}, expected "
                             f"{sorted(self._tests)}.")
        with self._lock:
            for name, test in self._tests.items():
                test.load_state(tests[name])
            self._log_m = {k: float(state["log_m"][k]) for k in self._tests}
            self._recent = {k: deque((float(v) for v in state["recent"][k]), maxlen=WINDOW)
                            for k in self._tests}
            self.n_seen, self.n_outside = int(state["n_seen"]), int(state["n_outside"])
            fired_at = state["fired_at"]
            self.fired_at = None if fired_at is None else int(fired_at)
            self._fired = None if state["fired"] is None else str(state["fired"])
            self._warned_outside = bool(state["warned_outside"])

    @property
    def alarm(self) -> bool:
        """True once the sequential test has fired."""
        return self.fired_at is not None

    def see(self, length: int, root_scores: Any = None) -> ListCheck:
        """Take one list: its length (snippets given) and, when known, its root scores.

        Returns
        -------
        ListCheck
            Nothing (``unlike`` False) for a list-free score.
        """
        if not self.active:
            return _NOTHING
        values: dict[str, float] = {"length": float(length)}
        scores = None if root_scores is None else np.asarray(root_scores, dtype=np.float64)
        if scores is not None and scores.size and np.all(np.isfinite(scores)) \
                and "spread" in self._tests:
            values["spread"] = list_spread(scores)
        lengths = self.record.lengths
        outside = bool(length < lengths.min() or length > lengths.max())
        warn = []
        with self._lock:
            self.n_seen += 1
            self.n_outside += outside
            for name, value in values.items():
                self._log_m[name] = self._tests[name].observe(value)
                self._recent[name].append(value)
            crossing = [name for name in self._tests if self._crosses(name)]
            if self.fired_at is None and self.n_seen >= self.min_lists and crossing:
                self.fired_at = self.n_seen
                self._fired = max(crossing, key=lambda k: self._log_m[k])
                self._alarm_note = self._alarm_text()
                warn.append(self._alarm_note)
            if outside and not self._warned_outside:
                self._warned_outside = True
                warn.append(self._outside_text(length))
            alarm = self.fired_at is not None
            note = None
            if outside or alarm:
                note = self._outside_text(length) if outside else self._alarm_note
        for text in warn if self.log else ():
            logger.warning("%s; %s", text, self._advice())
        if note is None:
            return ListCheck()
        return ListCheck(True, outside, alarm, f"{note} (see {DOCS})")

    def _crosses(self, name: str) -> bool:
        """Statistic ``name``'s martingale is at ``K / delta`` or more (union bound over the
        K statistics) and the mean of the lists seen lies further than its floor from the
        calibration mean: a sub-event of the martingale's crossing, so on exchangeable
        lists the alarm still fires with probability at most ``delta``."""
        if self._log_m[name] < math.log(len(self._tests) / self.delta) or not self._recent[name]:
            return False
        reference = self._tests[name].reference
        effect = abs(self._mean(name) - float(reference.mean()))
        return effect > self.record.floors.get(name, 0.0)

    def _mean(self, name: str) -> float:
        """The mean of statistic ``name`` over the last :data:`WINDOW` lists."""
        return float(np.mean(self._recent[name]))

    def alarm_check(self) -> ListCheck:
        """The check every list gets while the alarm is on (unlike, with the alarm's note);
        nothing while it is off."""
        with self._lock:
            if self.fired_at is None:
                return ListCheck()
            return ListCheck(True, False, True, f"{self._alarm_note} (see {DOCS})")

    def _outside_text(self, length: int) -> str:
        lengths = self.record.lengths
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo == hi:
            return f"a list of {length} snippets, where every calibration list had {lo}"
        return (f"a list of {length} snippets, outside the calibration lists' {lo} to {hi} "
                f"({lengths.mean():.1f} on average)")

    def _alarm_text(self) -> str:
        """The alarm's wording, with the numbers of the lists seen when it fired: computed
        once, at the firing, so the log, ``lists_note`` and every later note say the same."""
        stat = self._fired
        text = (f"the lists are unlike the calibration lists: {self._mean('length'):.1f} snippets "
                f"on average over the last {len(self._recent['length'])}, where calibration saw "
                f"{_summary(self.record.lengths, 'snippets')}")
        ref = self.record.spread
        if stat == "spread" and ref is not None and self._recent[stat]:
            score = self.record.score or "root score"
            text += (f"; their spread (mean - best {score} in a list) {self._mean(stat):.3f} on "
                     f"average over the last {len(self._recent[stat])}, where calibration saw "
                     f"{ref.mean():.3f}")
        return text + f" (a sequential test at false-alarm probability {self.delta:g})"

    def _advice(self) -> str:
        return (f"{self.score_name} depends on the whole list, so its guarantee assumes lists like "
                f"the calibration lists ({self.record.describe()}): calibrate through your "
                "retriever (`ragsieve retrieve`, or a component's calibrate) or use a list-free "
                f"score (`--scorer best --preset portable`); see {DOCS}")

    def state(self) -> dict[str, Any]:
        """What the watch has seen: ``n_seen``, ``n_outside``, ``alarm``, ``fired_at``,
        ``mean_length``, ``delta``, ``active`` (JSON-ready)."""
        with self._lock:
            seen = len(self._recent["length"])
            return {"active": self.active, "n_seen": self.n_seen, "n_outside": self.n_outside,
                    "alarm": self.fired_at is not None, "fired_at": self.fired_at,
                    "mean_length": self._mean("length") if seen else None,
                    "calibration_mean_length": float(self.record.lengths.mean()),
                    "delta": self.delta}

    def __repr__(self) -> str:
        return (f"ListWatch(active={self.active}, n_seen={self.n_seen}, alarm={self.alarm}, "
                f"delta={self.delta})")
