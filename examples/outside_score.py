"""Calibrate a score ragsieve does not compute: BM25 as an outside retriever score.

Writes XQuAD-en in the generic JSONL format with one extra key per line, ``bm25`` (the
Okapi BM25 score of the snippet for its query, computed over the article snippets; higher
is better), the way a hybrid retriever or a reranker would hand its scores over. Then::

    ragsieve evaluate  --data xquad-en-bm25.jsonl --scorer field --score-field bm25 --higher-is-better
    ragsieve calibrate --data cal.jsonl --scorer field --score-field bm25 --higher-is-better --out f.json
    ragsieve filter    --filter f.json --data test.jsonl

Usage: ``python examples/outside_score.py OUT.jsonl`` (tokens from scikit-learn's
``CountVectorizer``; k1 = 1.2, b = 0.75).
"""

from __future__ import annotations

import sys

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer

from ragsieve.data import load_dataset, write_pairs
from ragsieve.types import Pair


def bm25_field(pairs: list[Pair], k1: float = 1.2, b: float = 0.75) -> list[Pair]:
    texts = sorted({p.text for p in pairs})
    vec = CountVectorizer(lowercase=True)
    tf = vec.fit_transform(texts).tocsr().astype(float)
    row = {t: i for i, t in enumerate(texts)}
    lengths = np.asarray(tf.sum(axis=1)).ravel()
    df = np.asarray((tf > 0).sum(axis=0)).ravel()
    idf = np.log(1 + (len(texts) - df + 0.5) / (df + 0.5))
    analyzer = vec.build_analyzer()
    vocab = vec.vocabulary_
    out = []
    for p in pairs:
        terms = [vocab[w] for w in set(analyzer(p.query)) if w in vocab]
        r = row[p.text]
        f = tf[r, terms].toarray().ravel() if terms else np.zeros(0)
        norm = k1 * (1 - b + b * lengths[r] / lengths.mean())
        score = float(np.sum(idf[terms] * f * (k1 + 1) / (f + norm))) if terms else 0.0
        out.append(Pair(p.query_id, p.query, p.snippet_id, p.text, p.relevant, p.group,
                        meta={**p.meta, "bm25": score}))
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "xquad-en-bm25.jsonl"
    n = write_pairs(bm25_field(load_dataset("xquad-en")), target)
    print(f"wrote {n} pairs with a 'bm25' field to {target}")
