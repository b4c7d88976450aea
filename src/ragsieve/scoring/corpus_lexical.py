"""Two more list-free lexical signals on the frozen-corpus BM25's statistics.

Both read the statistics of :class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`
(:class:`~ragsieve.scoring.corpus_bm25.CorpusStatistics`: document frequencies, document
count and mean length, frozen from the texts they were fitted on, never from the list being
scored) and its tokens (:func:`~ragsieve.scoring.lexical.tokenize`: words, and CJK character
uni- and bigrams), and are fitted, saved and restored as it is. A snippet's score is a
function of the query, the snippet and those statistics alone (``tags.list_dependent``
False), so both may join the list-free ``portable`` preset:

``idf-cov`` (:class:`IDFCoverageScorer`)
    ``1 -`` the share of the query's IDF mass (each distinct query token once, weighted by
    its Lucene idf) found in the snippet: which of the query's rare words the snippet holds,
    however often (BM25 saturates the count; this ignores it). 1 for a query without tokens.
``sent-bm25`` (:class:`SentenceBM25Scorer`)
    the frozen-corpus BM25 share (``1 - BM25 / M``, :mod:`~ragsieve.scoring.corpus_bm25`) of
    the snippet's best sentence (the sentences of
    :func:`~ragsieve.scoring.sentence_cosine.sentence_texts`), the statistics those of the
    snippets fitted on: a snippet whose one sentence answers the query, amid other text.

docs/scores.md ("The portable score") has what each adds to the portable score, and the
list-free signals tried and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from .corpus_bm25 import (
    CorpusBM25Scorer,
    CorpusStatistics,
    PairTerms,
    SharedCorpus,
    TextTerms,
    _idf,
    _terms_of,
)
from .options import ScorerOption
from .sentence_cosine import sentence_texts

__all__ = ["IDFCoverageScorer", "SentenceBM25Scorer", "SentenceTerms"]


def _corpus_options(name: str, only: tuple[str, ...] | None = None) -> tuple[ScorerOption, ...]:
    """The frozen-corpus BM25's declared options (those named in ``only``), their help
    naming the score ``name``."""
    return tuple(replace(o, help=o.help.replace(CorpusBM25Scorer.name, name))
                 for o in CorpusBM25Scorer.declared_options if only is None or o.name in only)


class IDFCoverageScorer(CorpusBM25Scorer):
    """``1 -`` the share of the query's IDF mass found in the snippet (frozen corpus IDF).

    Parameters
    ----------
    max_vocabulary, n_docs, avgdl, df
        As for :class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer` (the statistics;
        ``avgdl`` is kept with them, unused).

    Examples
    --------
    >>> corpus = ["Denver won Super Bowl 50.", "Leaves are green.", "Bowls are round."]
    >>> scorer = IDFCoverageScorer().fitted_on_texts(corpus)
    >>> s = scorer.score_batch("Who won Super Bowl 50?", ["Denver won Super Bowl 50.",
    ...                                                  "Leaves are green."])
    >>> bool(s[0] < s[1] == 1.0), scorer.tags.list_dependent
    (True, False)
    """

    name: ClassVar[str] = "idf-cov"
    score_label: ClassVar[str] = "1 - idf share found (frozen corpus)"
    declared_options: ClassVar[tuple[ScorerOption, ...]] = _corpus_options("idf-cov",
                                                                            ("max_vocabulary",))

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "idf-cov", "max_vocabulary"}`` and, once fitted, ``"n_docs"``,
        ``"avgdl"`` and ``"df"`` (the BM25's ``k1`` and ``b`` play no part)."""
        out = super().spec()
        del out["k1"], out["b"]
        return out

    def scores_of_prepared(self, prepared: Any, stats: CorpusStatistics) -> np.ndarray:
        """``1 -`` each pair's share of its query's idf mass found in its text."""
        terms: PairTerms = prepared
        n = terms.pair_text.size
        df = np.array([stats.df.get(tok, 0) for tok in terms.query_vocabulary], dtype=np.float64)
        idf = _idf(df, stats.n_docs)[terms.entry_token]
        mass = np.bincount(terms.entry_pair, idf, minlength=n)
        found = np.bincount(terms.entry_pair, idf * (terms.entry_tf > 0), minlength=n)
        return np.where(mass > 0, 1.0 - found / np.where(mass > 0, mass, 1.0), 1.0)


@dataclass(frozen=True, eq=False)  # numpy fields
class SentenceTerms:
    """Pairs tokenized once for :class:`SentenceBM25Scorer`: the snippets (whose statistics
    are fitted) and the (query, sentence) pairs of their sentences.

    Attributes
    ----------
    texts : TextTerms
        The distinct snippet texts.
    pair_text : numpy.ndarray
        Each pair's row in ``texts``.
    sentences : PairTerms
        One (query, sentence) pair per sentence of each pair's snippet.
    owner : numpy.ndarray
        The pair of each sentence.
    """

    texts: TextTerms
    pair_text: np.ndarray
    sentences: PairTerms
    owner: np.ndarray

    @classmethod
    def of(cls, queries: Sequence[str], texts: Sequence[str], *,
           corpus: SharedCorpus | None = None) -> SentenceTerms:
        """Tokenize ``len(texts)`` pairs and their sentences (the snippets' tokens taken
        from ``corpus`` when given)."""
        terms, pair_text = _terms_of(texts, corpus)
        owner, asked, sentences = [], [], []
        for i, (query, text) in enumerate(zip(queries, texts, strict=True)):
            for sentence in sentence_texts(text):
                owner.append(i)
                asked.append(query)
                sentences.append(sentence)
        return cls(terms, pair_text, PairTerms.of(asked, sentences),
                   np.array(owner, dtype=np.int64))


class SentenceBM25Scorer(CorpusBM25Scorer):
    """The frozen-corpus BM25 share of the snippet's best sentence.

    Parameters
    ----------
    k1, b, max_vocabulary, n_docs, avgdl, df
        As for :class:`~ragsieve.scoring.corpus_bm25.CorpusBM25Scorer`: the statistics are
        those of the snippets fitted on; each sentence is scored as a document of them.

    Examples
    --------
    >>> corpus = ["Denver won Super Bowl 50. Leaves are green.", "Bowls are round."]
    >>> scorer = SentenceBM25Scorer().fitted_on_texts(corpus)
    >>> s = scorer.score_batch("Who won Super Bowl 50?", corpus)
    >>> bool(s[0] < s[1] == 1.0), scorer.tags.list_dependent
    (True, False)
    """

    name: ClassVar[str] = "sent-bm25"
    score_label: ClassVar[str] = "1 - bm25 share of the best sentence (frozen corpus)"
    declared_options: ClassVar[tuple[ScorerOption, ...]] = _corpus_options("sent-bm25")

    def prepare_pairs(self, queries: Sequence[str], texts: Sequence[str], *,
                      corpus: SharedCorpus | None = None) -> SentenceTerms:
        """The snippets and their sentences tokenized once (:class:`SentenceTerms`)."""
        return SentenceTerms.of(queries, texts, corpus=corpus)

    def scores_of_prepared(self, prepared: Any, stats: CorpusStatistics) -> np.ndarray:
        """The best (lowest) BM25 share among each pair's sentences."""
        terms: SentenceTerms = prepared
        per_sentence = terms.sentences.scores(stats, k1=self.k1, b=self.b)
        out = np.ones(terms.pair_text.size)  # every snippet has a sentence; 1 is the worst
        np.minimum.at(out, terms.owner, per_sentence)
        return out
