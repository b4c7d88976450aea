"""Frozen-corpus BM25: a lexical nonconformity score that reads one snippet at a time.

``CorpusBM25Scorer`` (alias ``"bm25-corpus"``) is Lucene's BM25, as the in-list BM25 of
:mod:`ragsieve.scoring.lexical` (``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, term
frequency saturated by ``k1``, length normalised by ``b``), but its document frequencies,
document count ``N`` and mean length are *frozen*: taken once from the texts it was fitted on
(:meth:`CorpusBM25Scorer.fitted_on_texts`), never from the list being scored. A snippet's
score is a function of the query, the snippet and those statistics alone, so it does not
change when other snippets join or leave its list, whichever retriever made the list and
however long it is (``tags.list_dependent`` False): a threshold calibrated on one retriever's
lists holds for another's, where the in-list BM25's (whose IDF comes from the list) does not.

Nonconformity = ``1 - BM25 / M`` with ``M`` the summed idf of *all* the query's tokens (each
as often as it occurs in the query; a token the corpus never saw has ``df = 0``, the largest
idf), in (0, 1]: the share of the query's idf mass the snippet does not cover; 1 for a
snippet sharing no token with the query, or a query without tokens. Tokens are those of
:func:`~ragsieve.scoring.lexical.tokenize`.

The corpus is a set: each distinct text counts once, however often it was given (a paragraph
retrieved for ten queries is one document). The fitted statistics are part of the scorer's
``spec()`` and hence of a saved filter (JSON): ``n_docs``, ``avgdl``, ``k1``, ``b`` and the
document frequency of at most ``max_vocabulary`` tokens (default 50,000: the tokens in most
documents, ties by the token's text). A token outside that vocabulary counts as unseen
(``df = 0``); 50,000 tokens take about 1 MB of JSON, far below the 64 MiB artifact cap.

Fitted inside the fused score (the ``portable`` preset, :mod:`ragsieve.scoring.signals`),
the statistics come from the texts of the fit share of the calibration topics only, the
share its learner is fitted on (:func:`~ragsieve.scoring.fusion.fit_fused_scorer`): the
texts the threshold is calibrated on never enter the IDF, so their scores stay exchangeable
with the scores of new snippets. :meth:`CorpusBM25Scorer.fit_share` tokenizes the pairs once
and fits any share of them cheaply (one ``bincount`` per split of ``evaluate``).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._validation import check_int, check_real
from ..errors import CalibrationError, ScorerError
from ..types import Pair
from .base import Scorer, check_score_array, group_pairs
from .lexical import check_bm25_params, tokenize
from .options import ScorerOption
from .tags import ScorerTags

__all__ = ["MAX_VOCABULARY", "SHARED", "CorpusBM25Scorer", "CorpusFit", "CorpusStatistics",
           "PairTerms", "SharedCorpus", "TextTerms", "inline_statistics", "one_statistics",
           "share_statistics"]

#: Default bound on the tokens whose document frequency a fitted scorer keeps.
MAX_VOCABULARY = 50_000


def _idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene's idf of document frequencies ``df`` in a corpus of ``n_docs`` documents."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


@dataclass(frozen=True, eq=False)  # numpy fields
class TextTerms:
    """Distinct texts tokenized once: a sorted vocabulary and each text's token counts.

    Attributes
    ----------
    vocabulary : tuple of str
        Every token of the texts, sorted.
    lengths : numpy.ndarray
        Tokens per text.
    indptr, token_ids, counts : numpy.ndarray
        Text ``i``'s distinct tokens (ids into ``vocabulary``) and their counts are
        ``token_ids[indptr[i]:indptr[i + 1]]`` and ``counts[...]``.
    counters : tuple of Counter
        Each text's token counts by token.
    """

    vocabulary: tuple[str, ...]
    lengths: np.ndarray
    indptr: np.ndarray
    token_ids: np.ndarray
    counts: np.ndarray
    counters: tuple[Counter[str], ...]

    @classmethod
    def of(cls, texts: Sequence[str]) -> tuple[TextTerms, np.ndarray]:
        """The distinct ``texts`` tokenized, and the row of each given text among them.

        Examples
        --------
        >>> terms, rows = TextTerms.of(["b a a", "c", "b a a"])
        >>> terms.vocabulary, terms.lengths.tolist(), rows.tolist()
        (('a', 'b', 'c'), [3, 1], [0, 1, 0])
        """
        row_of: dict[str, int] = {}
        rows = np.array([row_of.setdefault(t, len(row_of)) for t in texts], dtype=np.int64)
        counters = tuple(Counter(tokenize(t)) for t in row_of)
        vocabulary = tuple(sorted({tok for c in counters for tok in c}))
        ids = {tok: i for i, tok in enumerate(vocabulary)}
        token_ids = np.array([ids[tok] for c in counters for tok in c], dtype=np.int64)
        counts = np.array([n for c in counters for n in c.values()], dtype=np.int64)
        sizes = np.array([len(c) for c in counters], dtype=np.int64)
        lengths = np.array([sum(c.values()) for c in counters], dtype=np.int64)
        indptr = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        return cls(vocabulary, lengths, indptr, token_ids, counts, counters), rows


@dataclass(frozen=True)
class CorpusStatistics:
    """The frozen statistics of a corpus: what a fitted :class:`CorpusBM25Scorer` scores with.

    Attributes
    ----------
    df : Mapping of str to int
        Document frequency of each kept token (sorted by token); any other token has 0.
    n_docs : int
        Number of distinct documents.
    avgdl : float
        Mean document length in tokens (``total tokens / n_docs``).
    """

    df: Mapping[str, int]
    n_docs: int
    avgdl: float

    @classmethod
    def of_terms(cls, terms: TextTerms, rows: np.ndarray | None = None, *,
                 max_vocabulary: int = MAX_VOCABULARY) -> CorpusStatistics:
        """The statistics of the texts ``rows`` of ``terms`` (all when None), each counted once.

        The ``max_vocabulary`` tokens found in most of those texts keep their document
        frequency (ties by the token's text); the others count as unseen.

        Raises
        ------
        CalibrationError
            No text, or no token in the texts.
        """
        n_texts = terms.lengths.size
        chosen = np.arange(n_texts) if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
        total = int(terms.lengths[chosen].sum()) if chosen.size else 0
        if not chosen.size or total == 0:
            raise CalibrationError(
                f"the frozen-corpus BM25 is fitted on {chosen.size} text(s) holding {total} "
                "token(s); it needs texts with words to take its statistics from.")
        owner = np.repeat(np.arange(n_texts), np.diff(terms.indptr))
        mine = np.zeros(n_texts, dtype=bool)
        mine[chosen] = True
        df = np.bincount(terms.token_ids[mine[owner]], minlength=len(terms.vocabulary))
        keep = np.flatnonzero(df)  # token ids, in the order of the sorted tokens
        if keep.size > max_vocabulary:
            most = np.argsort(-df[keep], kind="stable")[:max_vocabulary]
            keep = np.sort(keep[most])
        return cls({terms.vocabulary[i]: int(df[i]) for i in keep}, int(chosen.size),
                   total / int(chosen.size))


class SharedCorpus:
    """The snippets of the pairs a fused score is fitted on, tokenized once, and the
    statistics of the last share asked for: what its frozen-corpus signals share.

    ``bm25-corpus``, ``idf-cov`` and ``sent-bm25`` all take their statistics from the same
    snippets; given one :class:`SharedCorpus`, :meth:`CorpusBM25Scorer.fit_share` of each
    reads the snippets' tokens from it and :meth:`CorpusFit.fitted` its statistics, so the
    three fit on one tokenization and one statistics object per split (the same object,
    saved once: :func:`share_statistics`).

    Parameters
    ----------
    texts : sequence of str
        The snippet of every pair, in pair order.
    """

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = list(texts)
        self._last: tuple[bytes, int, CorpusStatistics] | None = None

    @functools.cached_property
    def terms(self) -> tuple[TextTerms, np.ndarray]:
        """The distinct texts tokenized and each pair's row among them (on first use)."""
        return TextTerms.of(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def statistics(self, fit: np.ndarray, max_vocabulary: int) -> CorpusStatistics:
        """The statistics of the texts of the pairs ``fit`` (a mask), computed once per
        share and vocabulary bound (the last one asked for is kept)."""
        key = (np.packbits(fit).tobytes() + fit.size.to_bytes(8, "little"), max_vocabulary)
        last = self._last
        if last is not None and last[:2] == key:
            return last[2]
        terms, pair_text = self.terms
        stats = CorpusStatistics.of_terms(terms, pair_text[fit], max_vocabulary=max_vocabulary)
        self._last = (*key, stats)
        return stats


def share_statistics(specs: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                 dict[str, Any] | None]:
    """Signal specs with one copy of the corpus statistics two or more of them hold.

    Parameters
    ----------
    specs : sequence of Mapping
        A fused score's signal specs.

    Returns
    -------
    specs : list of dict
        The specs, those holding the shared statistics with ``"statistics": "shared"`` in
        place of their ``n_docs``, ``avgdl`` and ``df``.
    shared : dict or None
        ``{"n_docs", "avgdl", "df"}``, or None when no two specs hold equal statistics
        (the specs are then returned as they are).

    Examples
    --------
    >>> stats = {"n_docs": 2, "avgdl": 1.5, "df": {"a": 1}}
    >>> specs, shared = share_statistics([{"scorer": "bm25-corpus", **stats},
    ...                                   {"scorer": "idf-cov", **stats}])
    >>> specs, shared == stats
    ([{'scorer': 'bm25-corpus', 'statistics': 'shared'}, {'scorer': 'idf-cov', 'statistics': 'shared'}], True)
    """
    out = [dict(s) for s in specs]
    held = [i for i, s in enumerate(out) if all(k in s for k in _STAT_KEYS)]
    for i in held:
        first = {k: out[i][k] for k in _STAT_KEYS}
        same = [j for j in held if {k: out[j][k] for k in _STAT_KEYS} == first]
        if len(same) > 1:
            for j in same:
                for k in _STAT_KEYS:
                    del out[j][k]
                out[j]["statistics"] = SHARED
            return out, first
    return out, None


def inline_statistics(specs: Sequence[Any], shared: Any) -> list[Any]:
    """The signal specs with the shared statistics put back where a spec says
    ``"statistics": "shared"`` (the inverse of :func:`share_statistics`).

    Raises
    ------
    ValueError
        A spec refers to shared statistics and none are given, or statistics are given
        and no spec refers to them.
    TypeError
        ``shared`` is not a mapping.
    """
    referring = [i for i, s in enumerate(specs)
                 if isinstance(s, Mapping) and s.get("statistics") == SHARED]
    if shared is None:
        if referring:
            raise ValueError(f"signal {referring[0]} says \"statistics\": \"shared\" but the "
                             "fused score holds no \"corpus_statistics\".")
        return list(specs)
    if not isinstance(shared, Mapping):
        raise TypeError(f"corpus_statistics is {type(shared).__name__}, expected a mapping "
                        "with n_docs, avgdl and df.")
    if not referring:
        raise ValueError("the fused score holds corpus_statistics that no signal refers to "
                         "(expected \"statistics\": \"shared\" in a signal's spec).")
    stats = {k: shared[k] for k in _STAT_KEYS if k in shared}
    out = list(specs)
    for i in referring:
        spec = {k: v for k, v in out[i].items() if k != "statistics"}
        out[i] = {**spec, **stats}
    return out


def one_statistics(scorers: tuple[Scorer, ...]) -> tuple[Scorer, ...]:
    """``scorers``, the frozen-corpus ones holding equal statistics made to hold one object
    (restored from one saved copy, they would hold one copy each).

    Examples
    --------
    >>> a = CorpusBM25Scorer().fitted_on_texts(["a b", "b c"])
    >>> b = CorpusBM25Scorer(k1=1.2).fitted_on_texts(["a b", "b c"])
    >>> a.statistics is b.statistics, one_statistics((a, b))[1].statistics is a.statistics
    (False, True)
    """
    held: list[CorpusStatistics] = []
    for scorer in scorers:
        if isinstance(scorer, CorpusBM25Scorer) and scorer.statistics is not None:
            same = next((h for h in held if h == scorer.statistics), None)
            if same is None:
                held.append(scorer.statistics)
            else:
                scorer.statistics = same
    return scorers


def _terms_of(texts: Sequence[str], corpus: SharedCorpus | None) -> tuple[TextTerms, np.ndarray]:
    """The tokens of ``texts``: from ``corpus`` (which must hold as many texts), else
    tokenized here."""
    if corpus is None:
        return TextTerms.of(texts)
    if len(corpus) != len(texts):
        raise ValueError(f"the shared corpus holds {len(corpus)} texts for {len(texts)} pairs; "
                         "expected the pairs' own texts.")
    return corpus.terms


#: The keys of a fitted frozen-corpus score's statistics in its spec.
_STAT_KEYS = ("n_docs", "avgdl", "df")
#: The value of a signal's ``"statistics"`` that names its fused score's ``corpus_statistics``.
SHARED = "shared"


@dataclass(frozen=True, eq=False)  # numpy fields
class PairTerms:
    """(query, text) pairs tokenized once, ready to be scored under any corpus statistics.

    Every pair holds one entry per distinct token of its query (sorted by token): the
    token's multiplicity in the query and its count in the pair's text. A pair's score is
    then summed over its own entries in a fixed order, so it is the same number whatever
    other pairs are scored with it.

    Attributes
    ----------
    texts : TextTerms
        The distinct texts of the pairs.
    pair_text : numpy.ndarray
        Each pair's row in ``texts``.
    query_vocabulary : tuple of str
        The distinct query tokens (entries index it).
    entry_pair, entry_token, entry_times, entry_tf : numpy.ndarray
        One value per entry: its pair, its query token, the token's count in the query and
        in the pair's text.
    """

    texts: TextTerms
    pair_text: np.ndarray
    query_vocabulary: tuple[str, ...]
    entry_pair: np.ndarray
    entry_token: np.ndarray
    entry_times: np.ndarray
    entry_tf: np.ndarray

    @classmethod
    def of(cls, queries: Sequence[str], texts: Sequence[str], *,
           corpus: SharedCorpus | None = None) -> PairTerms:
        """Tokenize ``len(texts)`` pairs, the ``i``-th of query ``queries[i]`` and text ``texts[i]``
        (the texts' tokens taken from ``corpus`` when given: it holds these texts).

        Raises
        ------
        ValueError
            ``queries`` and ``texts`` differ in length, or ``corpus`` holds another number
            of texts.
        """
        if len(queries) != len(texts):
            raise ValueError(f"{len(queries)} queries for {len(texts)} texts; expected one "
                             "query per text.")
        terms, pair_text = _terms_of(texts, corpus)
        query_terms: dict[str, list[tuple[str, int]]] = {}
        vocab: dict[str, int] = {}
        pairs, tokens, times, tfs = [], [], [], []
        for i, (query, row) in enumerate(zip(queries, pair_text.tolist(), strict=True)):
            own = query_terms.get(query)
            if own is None:
                own = query_terms[query] = sorted(Counter(tokenize(query)).items())
                for tok, _ in own:
                    vocab.setdefault(tok, len(vocab))
            counter = terms.counters[row]
            for tok, n in own:
                pairs.append(i)
                tokens.append(vocab[tok])
                times.append(n)
                tfs.append(counter.get(tok, 0))
        return cls(terms, pair_text, tuple(vocab), np.array(pairs, dtype=np.int64),
                   np.array(tokens, dtype=np.int64), np.array(times, dtype=np.float64),
                   np.array(tfs, dtype=np.float64))

    def scores(self, stats: CorpusStatistics, *, k1: float, b: float) -> np.ndarray:
        """``1 - BM25 / M`` of every pair under ``stats`` (see the module docstring)."""
        n = self.pair_text.size
        df = np.array([stats.df.get(tok, 0) for tok in self.query_vocabulary], dtype=np.float64)
        weight = self.entry_times * _idf(df, stats.n_docs)[self.entry_token]
        norm = k1 * (1.0 - b + b * self.texts.lengths[self.pair_text] / stats.avgdl)
        tf = self.entry_tf
        saturated = np.divide(tf, tf + norm[self.entry_pair], out=np.zeros_like(tf), where=tf > 0)
        bm25 = np.bincount(self.entry_pair, weight * saturated, minlength=n)
        mass = np.bincount(self.entry_pair, weight, minlength=n)
        return np.where(mass > 0, 1.0 - bm25 / np.where(mass > 0, mass, 1.0), 1.0)


@dataclass(frozen=True, eq=False)
class CorpusFit:
    """An unfitted :class:`CorpusBM25Scorer` and tokenized pairs: fit it on any share of them.

    Built by :meth:`CorpusBM25Scorer.fit_share`; :meth:`fitted` is what the fused score calls
    once per split, with the split's fit share.
    """

    scorer: CorpusBM25Scorer
    terms: Any  # what the scorer's ``prepare_pairs`` gives: PairTerms for the BM25 itself
    corpus: SharedCorpus

    def fitted(self, fit: np.ndarray) -> tuple[CorpusBM25Scorer, np.ndarray]:
        """The scorer fitted on the texts of the pairs ``fit`` (a boolean mask over the
        pairs), and its scores of every pair.

        Raises
        ------
        ValueError
            ``fit`` is not one boolean per pair.
        CalibrationError
            The texts of ``fit`` hold no token.
        """
        fit = np.asarray(fit)
        if fit.dtype != bool or fit.shape != self.terms.pair_text.shape:
            raise ValueError(f"fit is a {fit.dtype} array of shape {fit.shape}; expected one "
                             f"bool per pair ({self.terms.pair_text.size}).")
        stats = self.corpus.statistics(fit, self.scorer.max_vocabulary)
        fitted = self.scorer.with_statistics(stats)
        return fitted, fitted.scores_of_prepared(self.terms, stats)


class CorpusBM25Scorer(Scorer):
    """``1 - BM25(query, snippet) / M`` with statistics frozen from a corpus of texts.

    Parameters
    ----------
    k1 : float
        Term-frequency saturation (> 0).
    b : float
        Length normalisation, in [0, 1].
    max_vocabulary : int
        At most this many tokens keep their document frequency when fitted (the rest count
        as unseen).
    n_docs, avgdl, df
        The fitted statistics (:meth:`fitted_on_texts` computes them; a saved spec records
        them): the number of distinct documents, their mean length in tokens and the
        document frequency of each kept token. All three or none (unfitted).

    Examples
    --------
    >>> corpus = ["Denver won Super Bowl 50.", "Leaves are green.", "Bowls are round."]
    >>> scorer = CorpusBM25Scorer().fitted_on_texts(corpus)
    >>> s = scorer.score_batch("Who won Super Bowl 50?", ["Denver won Super Bowl 50.",
    ...                                                  "Leaves are green."])
    >>> bool(s[0] < s[1] == 1.0), scorer.tags.list_dependent
    (True, False)
    """

    name: ClassVar[str] = "bm25-corpus"
    score_label: ClassVar[str] = "1 - bm25 share (frozen corpus)"
    tags = ScorerTags(list_dependent=False)
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("k1", float, 1.5, "scorer bm25-corpus: term-frequency saturation"),
        ScorerOption("b", float, 0.75, "scorer bm25-corpus: length normalisation"),
        ScorerOption("max_vocabulary", int, MAX_VOCABULARY, "scorer bm25-corpus: at most this "
                     "many tokens keep their document frequency"),
    )

    def __init__(self, *, k1: float = 1.5, b: float = 0.75, max_vocabulary: int = MAX_VOCABULARY,
                 n_docs: int | None = None, avgdl: float | None = None,
                 df: Mapping[str, int] | None = None) -> None:
        self.k1, self.b = check_bm25_params(k1, b)
        self.max_vocabulary = check_int(max_vocabulary, "max_vocabulary", min_value=1)
        given = [x is not None for x in (n_docs, avgdl, df)]
        if any(given) and not all(given):
            raise ValueError("n_docs, avgdl and df are the fitted statistics: give all three or "
                             "none (fit with CorpusBM25Scorer().fitted_on_texts(texts)).")
        self.statistics = None if df is None else self._read_statistics(n_docs, avgdl, df)
        self.is_fitted = self.statistics is not None

    def _read_statistics(self, n_docs: Any, avgdl: Any, df: Any) -> CorpusStatistics:
        n = check_int(n_docs, "n_docs", min_value=1)
        mean = check_real(avgdl, "avgdl", min_value=0.0, max_value=math.inf,
                          include_boundaries="neither")
        if not isinstance(df, Mapping):
            raise TypeError(f"df is {type(df).__name__}, expected a mapping of token to "
                            "document frequency.")
        if len(df) > self.max_vocabulary:
            raise ValueError(f"df holds {len(df)} tokens, more than max_vocabulary == "
                             f"{self.max_vocabulary}.")
        for tok, count in df.items():
            if not isinstance(tok, str) or not tok:
                raise ValueError(f"df has the key {tok!r}; expected non-empty token strings.")
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) \
                    or not 1 <= count <= n:
                raise ValueError(f"df[{tok!r}] == {count!r}, must be an int in [1, n_docs == {n}].")
        return CorpusStatistics({tok: int(df[tok]) for tok in sorted(df)}, n, mean)

    # ------------------------------------------------------------------ fitting
    def unfitted_copy(self) -> CorpusBM25Scorer:
        """The scorer without its statistics, to be fitted afresh on other texts."""
        if not self.is_fitted:
            return self
        return type(self)(k1=self.k1, b=self.b, max_vocabulary=self.max_vocabulary)

    def with_statistics(self, stats: CorpusStatistics) -> CorpusBM25Scorer:
        """The same scorer (``k1``, ``b``, vocabulary bound) with these frozen statistics
        (the object itself: scores fitted on one corpus share it).

        Raises
        ------
        ValueError
            ``stats`` holds more tokens than the vocabulary bound.
        """
        if len(stats.df) > self.max_vocabulary:
            raise ValueError(f"the statistics hold {len(stats.df)} tokens, more than "
                             f"max_vocabulary == {self.max_vocabulary}.")
        out = type(self)(k1=self.k1, b=self.b, max_vocabulary=self.max_vocabulary)
        out.statistics, out.is_fitted = stats, True
        return out

    def fitted_on_texts(self, texts: Sequence[str]) -> CorpusBM25Scorer:
        """A copy with the statistics of ``texts`` (each distinct text one document).

        Raises
        ------
        TypeError
            ``texts`` is a single string.
        CalibrationError
            No text, or no token in the texts.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("texts is a single string; pass a list of str, e.g. [text].")
        terms, _ = TextTerms.of(list(texts))
        return self.with_statistics(CorpusStatistics.of_terms(
            terms, max_vocabulary=self.max_vocabulary))

    def fit_share(self, pairs: Sequence[Pair], *, corpus: SharedCorpus | None = None) -> CorpusFit:
        """The pairs tokenized once, to fit this scorer on any share of them
        (:meth:`CorpusFit.fitted`) and score them all; ``corpus`` (the pairs' snippets,
        :class:`SharedCorpus`) is shared with the fused score's other frozen-corpus signals."""
        pairs = list(pairs)
        texts = [p.text for p in pairs]
        corpus = SharedCorpus(texts) if corpus is None else corpus
        return CorpusFit(self.unfitted_copy(),
                         self.prepare_pairs([p.query for p in pairs], texts, corpus=corpus), corpus)

    def prepare_pairs(self, queries: Sequence[str], texts: Sequence[str], *,
                      corpus: SharedCorpus | None = None) -> Any:
        """The pairs tokenized once, to be scored under any statistics
        (:meth:`scores_of_prepared`); the snippets' tokens come from ``corpus`` when given. A
        scorer on the same statistics overrides both."""
        return PairTerms.of(queries, texts, corpus=corpus)

    def scores_of_prepared(self, prepared: Any, stats: CorpusStatistics) -> np.ndarray:
        """The scores of pairs prepared by :meth:`prepare_pairs` under ``stats``."""
        return np.asarray(prepared.scores(stats, k1=self.k1, b=self.b))

    # ------------------------------------------------------------------ scoring
    def _check_fitted(self) -> CorpusStatistics:
        if self.statistics is None:
            raise ScorerError(
                f"the frozen-corpus score {self.name!r} has no corpus statistics yet; fit it "
                f"with {type(self).__name__}().fitted_on_texts(texts), or use it in the fused "
                "score (`--scorer best --preset portable`), which fits it on the fit share of "
                "the calibration topics.")
        return self.statistics

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "bm25-corpus", "k1", "b", "max_vocabulary"}`` and, once fitted,
        ``"n_docs"``, ``"avgdl"`` and ``"df"`` (token -> document frequency, sorted)."""
        out: dict[str, Any] = {"scorer": self.name, "k1": self.k1, "b": self.b,
                               "max_vocabulary": self.max_vocabulary}
        if self.statistics is not None:
            out.update(n_docs=self.statistics.n_docs, avgdl=self.statistics.avgdl,
                       df=dict(self.statistics.df))
        return out

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets, each on its own (the statistics are frozen)."""
        stats = self._check_fitted()
        if not isinstance(query, str):
            raise TypeError(f"query is {type(query).__name__}, expected str.")
        if isinstance(snippets, (str, bytes)):
            raise TypeError("snippets is a single string; pass a list of str, e.g. [text].")
        texts = list(snippets)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"snippets[{i}] is {type(text).__name__}, expected str.")
        return self.scores_of_prepared(self.prepare_pairs([query] * len(texts), texts), stats)

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs at once (each text tokenized once; no per-query loop)."""
        stats = self._check_fitted()
        pairs = list(pairs)
        group_pairs(pairs)  # Pairs, one text per query_id
        scores = self.scores_of_prepared(
            self.prepare_pairs([p.query for p in pairs], [p.text for p in pairs]), stats)
        return check_score_array(scores, len(pairs))
