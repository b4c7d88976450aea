"""Small labelled samples of a data set's topics, for tests that need whole query lists."""

from __future__ import annotations

from ragsieve import Pair


def first_topics(pairs: list[Pair], n_topics: int, per_topic: int, *,
                 start: int = 0) -> list[Pair]:
    """The first ``per_topic`` queries of the first ``n_topics`` topics (``Pair.group``)
    from ``pairs[start:]`` on, each query's list whole."""
    out: list[Pair] = []
    queries: dict[str, set[str]] = {}
    for p in pairs[start:]:
        qs = queries.setdefault(p.group, set())
        if len(queries) > n_topics:
            break
        if p.query_id in qs or len(qs) < per_topic:
            qs.add(p.query_id)
            out.append(p)
    return out
