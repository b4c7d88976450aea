"""The ``Scorer`` plug-in point: one abstract batch method, the rest built on it."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ..errors import DataError, ScorerError
from ..types import Pair
from .options import ScorerOption
from .tags import TAG_NAMES, ScorerTags

__all__ = ["KeepRule", "ListTransform", "Resolution", "ScoreFit", "Scorer", "StageFit",
           "check_score_array", "group_pairs"]


@dataclass(frozen=True)
class KeepRule:
    """Which snippets a threshold keeps, in the score's own units: ``score keep_if threshold``.

    Examples
    --------
    >>> str(KeepRule("bm25", ">=", 0.655))
    'keep bm25 >= 0.655'
    """

    score: str
    keep_if: str
    threshold: float

    def __str__(self) -> str:
        return f"keep {self.score} {self.keep_if} {self.threshold:.4g}"

    def to_dict(self) -> dict[str, Any]:
        """``{"score", "keep_if", "threshold"}`` (threshold None when infinite: keep all)."""
        tau = self.threshold
        return {"score": self.score, "keep_if": self.keep_if,
                "threshold": tau if np.isfinite(tau) else None}

logger = logging.getLogger(__name__)


def check_score_array(scores: Any, n_expected: int, *, query_id: str | None = None) -> np.ndarray:
    """Validate what a scorer returned: ``n_expected`` finite floats.

    Parameters
    ----------
    scores : array-like
        Scores returned by ``score_batch``.
    n_expected : int
        Number of snippets that were scored.
    query_id : str, optional
        Named in error messages.

    Returns
    -------
    numpy.ndarray
        1-D float64 array.

    Raises
    ------
    ScorerError
        On a wrong shape or any NaN/inf value.
    """
    where = f" for query_id {query_id!r}" if query_id is not None else ""
    try:
        arr = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ScorerError(f"scorer returned non-numeric scores{where} ({exc}).") from exc
    if arr.shape != (n_expected,):
        raise ScorerError(
            f"scorer returned scores of shape {arr.shape}{where}, expected ({n_expected},)."
        )
    bad = int((~np.isfinite(arr)).sum())
    if bad:
        raise ScorerError(
            f"scorer returned {bad} non-finite (NaN or inf) of {n_expected} scores{where}."
        )
    return arr


def group_pairs(pairs: Sequence[Pair]) -> dict[str, tuple[str, list[int]]]:
    """Group pair positions by ``query_id``, in order of first appearance.

    Parameters
    ----------
    pairs : sequence of Pair
        Query/snippet pairs.

    Returns
    -------
    dict
        ``query_id -> (query text, positions in pairs)``.

    Raises
    ------
    TypeError
        When an element is not a ``Pair``.
    DataError
        When one query_id carries two different query texts.
    """
    if isinstance(pairs, (str, bytes, Pair)):
        raise TypeError(f"pairs is a {type(pairs).__name__}, expected a sequence of Pair.")
    groups: dict[str, tuple[str, list[int]]] = {}
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Pair):
            raise TypeError(f"pairs[{i}] is {type(pair).__name__}, expected ragsieve.types.Pair.")
        entry = groups.get(pair.query_id)
        if entry is None:
            groups[pair.query_id] = (pair.query, [i])
        else:
            if entry[0] != pair.query:
                raise DataError(
                    f"query_id {pair.query_id!r} has two query texts: {entry[0]!r} and "
                    f"{pair.query!r} (pairs[{i}]); a query_id must name one query."
                )
            entry[1].append(i)
    return groups


class Scorer(ABC):
    """A nonconformity score for (query, snippet) pairs: lower means more relevant.

    Subclasses implement :meth:`score_batch` and :meth:`spec`; :meth:`score_pairs` is
    built on ``score_batch`` and may be overridden for batching across queries.

    Examples
    --------
    >>> class Length(Scorer):
    ...     name = "length"
    ...     def score_batch(self, query, snippets):
    ...         return np.array([float(len(s)) for s in snippets])
    ...     def spec(self):
    ...         return {"scorer": "length"}
    >>> Length().score_pairs([Pair("q1", "Q?", "a", "abc"), Pair("q1", "Q?", "b", "a")])
    array([3., 1.])
    """

    name: ClassVar[str]
    #: What the scorer can do, one record (:class:`~ragsieve.scoring.tags.ScorerTags`):
    #: callers ask it instead of the scorer's type. A subclass states its own here
    #: (``tags = ScorerTags(reads_text=False, ...)``), or per instance in ``__init__`` where
    #: a flag follows its parts (the fused score's ``list_dependent``: its signals').
    tags: ScorerTags = ScorerTags()
    #: How the score reads in a keep rule (``keep 1 - cos <= 0.52``); default "<name> score".
    score_label: ClassVar[str] = ""
    #: The keyword arguments the scorer takes and their command-line flags
    #: (:class:`~ragsieve.scoring.options.ScorerOption`); the CLI builds it from them.
    declared_options: ClassVar[tuple[ScorerOption, ...]] = ()
    #: False while the score still has to be fitted on labelled pairs (the unfitted fused
    #: score, alias ``"best"``, sets it per instance); scoring it then raises ``ScorerError``.
    #: State, not a tag: it changes when the score is fitted, and it is the question
    #: ``fitting`` asks a calibrator too (``BaseCalibrator.is_fitted``).
    #: Scores that learn are fitted on some calibration topics, calibrated on the rest
    #: (ragsieve.fitting runs it; ask ``is_fitted``, then call ``fit_topics``).
    is_fitted: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a tag set as its own class attribute (``reads_text = False``): nothing
        reads it there, so the scorer would silently claim the defaults."""
        super().__init_subclass__(**kwargs)
        loose = sorted(TAG_NAMES & set(vars(cls)))
        if loose:
            raise TypeError(
                f"{cls.__name__} sets {', '.join(loose)} as class attribute(s); a scorer "
                f"states its tags in one record: tags = ScorerTags({loose[0]}=...) "
                "(ragsieve.ScorerTags).")

    def fit_topics(self, pairs: Sequence[Pair], *, seed: int = 0, progress: bool = False,
                   snippets: Sequence[Pair] | None = None,
                   fit_stage: StageFit | None = None) -> ScoreFit:
        """Fit this unfitted score on a seeded share of the topics (``Pair.group``) of
        labelled pairs; the fitted score and the pairs of the other topics, to calibrate on.

        Scores that learn (the fused score, the sentence-in-context score) override it; the
        draw is ``evaluate(seed=seed)``'s split 0, so calibrate fits what evaluate measures.

        Parameters
        ----------
        pairs : sequence of Pair
            Labelled calibration pairs (sentences, for a score of sentences).
        seed : int
            The draw of the fit share.
        progress : bool
            Progress bars while scoring.
        snippets : sequence of Pair, optional
            A score of sentences in context: the snippet pairs ``pairs`` were cut from.
        fit_stage : callable, optional
            A score made of stages: how to fit each unfitted stage,
            ``fit_stage(stage, pairs) -> ScoreFit`` (default: the stage's own ``fit_topics``).

        Raises
        ------
        ScorerError
            This score has nothing to fit (the default).
        CalibrationError
            Fewer than two topics, or a fit share of one class only.
        """
        raise ScorerError(f"the {getattr(self, 'name', type(self).__name__)} score is not "
                          "fitted on labelled pairs; give a fitted score or one that learns "
                          "(e.g. 'best').")

    def learned_weights(self) -> dict[str, bytes]:
        """Large learned tensors this score needs beyond its spec, by sha256 (the spec names
        them; the artifact stores them in its sealed ``weights`` block:
        :mod:`ragsieve.scoring.weights`). Default: those of the score it is computed from
        (:meth:`base_scorer`), else none."""
        base = self.base_scorer()
        return {} if base is None else base.learned_weights()

    def resolve_for(self, pairs: Sequence[Pair], *, language: str | None = None,
                    deployed_lists: bool = False, seed: int = 0) -> Resolution:
        """The real score a stand-in (``tags.resolved_at_calibration``: ``"auto"``) stands for,
        chosen from the calibration pairs (``seed``: the calibration's, which draws the
        topics a choice may learn from).

        Raises
        ------
        TypeError
            This score is no stand-in (the default).
        """
        raise TypeError(f"the {getattr(self, 'name', type(self).__name__)} score is not "
                        "resolved at calibration (tags.resolved_at_calibration is False).")

    @abstractmethod
    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets.

        Parameters
        ----------
        query : str
            The query.
        snippets : sequence of str
            Snippet texts.

        Returns
        -------
        numpy.ndarray
            ``(len(snippets),)`` float64 nonconformity scores, lower = more relevant.
        """

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """JSON-serialisable identity of the score, e.g. ``{"scorer": "embedding", ...}``.

        ``resolve_scorer(scorer.spec())`` rebuilds an equivalent scorer; artifacts
        compare specs to refuse a threshold calibrated on another score.
        """

    def keep_rule(self, threshold: float) -> KeepRule:
        """The rule a threshold on this score means, in the score's own units.

        Nonconformity scores keep ``score <= threshold``; an outside score that is higher-is-
        better says ``keep <field> >= value`` (:class:`~ragsieve.scoring.FieldScorer`).
        """
        return KeepRule(score=self.score_label or f"{self.name} score", keep_if="<=",
                        threshold=float(threshold))

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs, one ``score_batch`` call per query.

        Parameters
        ----------
        pairs : sequence of Pair
            Pairs of any number of queries, in any order.
        progress : bool
            Show a tqdm progress bar over queries.

        Returns
        -------
        numpy.ndarray
            float64 scores aligned with ``pairs``.

        Raises
        ------
        ScorerError
            When ``score_batch`` returns a wrong shape or non-finite values; the message
            names the query_id and the number of bad values.
        """
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        if not isinstance(pairs, (list, tuple)):
            pairs = list(pairs)
        groups = group_pairs(pairs)
        label = getattr(self, "name", type(self).__name__)
        out = np.empty(sum(len(idx) for _, idx in groups.values()), dtype=np.float64)
        for qid, (query, idx) in tqdm(
            groups.items(), disable=not progress, unit="query", desc=f"scoring ({label})"
        ):
            raw = self.score_batch(query, [pairs[i].text for i in idx])
            out[idx] = check_score_array(raw, len(idx), query_id=qid)
        return out

    def score_items(self, query: str, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Score one query's snippets given as mappings (``"text"``, and any other keys).

        The default scores ``item["text"]`` with :meth:`score_batch`; a scorer that reads
        another key (an outside score, see ``FieldScorer``) overrides it.

        Raises
        ------
        DataError
            An item has no ``"text"`` string.
        """
        texts = []
        for i, item in enumerate(items):
            text = item.get("text")
            if not isinstance(text, str):
                raise DataError(
                    f"snippet {i} has no text (got {type(text).__name__}); the "
                    f"{getattr(self, 'name', type(self).__name__)} scorer scores snippet texts."
                )
            texts.append(text)
        return self.score_batch(query, texts)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Do the model work of scoring ``snippets`` ahead, so that a later call is cheap.

        A service calls it on a long list a few dozen snippets at a time, between other
        requests' work, then scores the whole list (a list-relative score needs it
        whole). Scorers that cache what the model computes (the embedding scorer and the
        scores built on it) fill their cache here; the default does nothing, and the
        whole cost then falls on the scoring call.
        """

    def outside_field(self) -> str | None:
        """The field holding the outside score this scorer reads; None: it reads none.

        The service refuses a snippet's ``score`` for a scorer that reads none, rather than
        ignore it (the relative / fused scores ask their base scorer).
        """
        return None

    def vector_dim(self) -> int | None:
        """The dimension of the vectors :meth:`scores_from_vectors` takes; None: no vectors.

        The default takes none; the embedding scorer gives its model's dimension (loading
        the model), and the relative / fused scores their base scorer's.
        """
        return None

    def scores_from_vectors(self, query_vector: Any, snippet_vectors: Any) -> np.ndarray:
        """Scores from the caller's own embeddings, without a model call.

        Supported by the embedding scorer (``1 - cos``) and by the scores built on it
        (``relative``, ``fusion``); the vectors must come from the scorer's model.

        Raises
        ------
        TypeError
            This scorer cannot be computed from vectors.
        """
        raise TypeError(
            f"the {getattr(self, 'name', type(self).__name__)} scorer cannot score from vectors; "
            "only embedding scorers and the relative / fused scores built on them can."
        )

    def base_scorer(self) -> Scorer | None:
        """The scorer this one is computed from (relative, fused: their base); None: none."""
        return None

    def endpoint_note(self) -> str | None:
        """What the outside endpoint this score calls answered that differs from the score's
        identity (a reranker answering with another model than the calibrated one); None
        when nothing differs or the score calls no endpoint. Surfaces show it beside their
        answers (``/healthz``, the rerank answers' ``meta``)."""
        return None

    def embedding_model(self) -> Any:
        """The loaded embedding model whose cosine this score is (or is built on), for a
        caller that embeds with the same model (the served index shares it); None: the
        score is not an embedding model's cosine. The list transforms ask their base."""
        return None

    def scores_from_base(self, base: np.ndarray) -> np.ndarray:
        """This score from its :meth:`base_scorer`'s scores of one query's whole list
        (the list transforms: relative and fused scores).

        Raises
        ------
        TypeError
            This scorer is not computed from a base scorer's scores.
        """
        raise TypeError(f"the {getattr(self, 'name', type(self).__name__)} scorer is not "
                        "computed from a base scorer's scores.")

    def root_scorer(self) -> Scorer:
        """The scorer at the bottom of the :meth:`base_scorer` chain (itself when none)."""
        scorer: Scorer = self
        while (base := scorer.base_scorer()) is not None:
            scorer = base
        return scorer

    def unfitted_copy(self) -> Scorer:
        """This score before fitting, to be fitted afresh on other data (a fitted fused
        score without its weights); the scorer itself when nothing of it is fitted."""
        return self

    def with_base(self, base: Scorer) -> Scorer:
        """This score computed from another base scorer (same parameters).

        Raises
        ------
        TypeError
            This scorer has no base scorer (see :meth:`base_scorer`).
        """
        raise TypeError(
            f"the {getattr(self, 'name', type(self).__name__)} scorer has no base scorer to "
            "replace; only list transforms (relative, fused) do."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


class ScoreFit(NamedTuple):
    """What :meth:`Scorer.fit_topics` gives.

    Attributes
    ----------
    scorer : Scorer
        The fitted score (or, where a chosen score could not be fitted, its fallback).
    pairs : list of Pair
        The pairs of the topics nothing was fitted on: the calibration share.
    scores : numpy.ndarray or None
        Their scores under ``scorer`` when the fit computed them (None: score them).
    n_fit : int
        Pairs the score was fitted on (0: none).
    """

    scorer: Scorer
    pairs: list[Pair]
    scores: np.ndarray | None = None
    n_fit: int = 0


#: How a score made of stages has each unfitted stage fitted (see :meth:`Scorer.fit_topics`).
StageFit = Callable[[Scorer, list[Pair]], ScoreFit]


class Resolution(NamedTuple):
    """What :meth:`Scorer.resolve_for` gives.

    Attributes
    ----------
    scorer : Scorer
        The chosen score (possibly still to be fitted).
    info : dict
        What the artifact's data block records of the choice (languages, the score choice).
    """

    scorer: Scorer
    info: dict[str, Any]


class ListTransform(Scorer):
    """A score computed from a base scorer's scores over each query's list (relative, fused).

    The base scorer does the model work: :meth:`prepare`, :meth:`outside_field` and
    :meth:`vector_dim` are the base scorer's (``self.base``).
    """

    base: Scorer

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """The base scorer's model work for ``snippets`` (the list transform comes later)."""
        self.base.prepare(query, snippets)

    def outside_field(self) -> str | None:
        """The base scorer's outside field (None for embedding-based scores)."""
        return self.base.outside_field()

    def vector_dim(self) -> int | None:
        """The base scorer's vector dimension."""
        return self.base.vector_dim()

    def embedding_model(self) -> Any:
        """The base scorer's embedding model (None when the base is no embedding score)."""
        return self.base.embedding_model()

    def endpoint_note(self) -> str | None:
        """The base scorer's endpoint note (:meth:`Scorer.endpoint_note`)."""
        return self.base.endpoint_note()

    @abstractmethod
    def scores_from_base(self, base: np.ndarray) -> np.ndarray:
        """This score from the base scorer's scores of one query's whole list."""

    def scores_from_vectors(self, query_vector: Any, snippet_vectors: Any) -> np.ndarray:
        """The base scorer's scores from the caller's vectors, transformed over the list.

        Raises
        ------
        TypeError
            The base scorer cannot be computed from vectors.
        """
        return np.asarray(self.scores_from_base(
            self.base.scores_from_vectors(query_vector, snippet_vectors)))

    def base_scorer(self) -> Scorer:
        """The base scorer (``self.base``)."""
        return self.base

    def with_base(self, base: Scorer) -> Scorer:
        """The same transform (its spec's parameters, without ``"base"``) over ``base``:
        ``type(self)(**params, base=base)``, as scikit-learn's ``clone`` rebuilds an estimator."""
        params = {k: v for k, v in self.spec().items() if k not in ("scorer", "base")}
        transform: Callable[..., Scorer] = type(self)  # every list transform takes ``base=``
        return transform(**params, base=base)
