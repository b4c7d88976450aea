"""Labelled retrieval: an index's own lists for labelled queries, as calibration pairs.

What ``ragsieve retrieve`` does: run the index's search with the ``k`` the deployment
uses for every labelled query (``relevant_doc_ids`` and/or ``answers``,
:mod:`ragsieve.data.queries`), label the hits from the queries' labels and record the
index's identity (:meth:`SnippetIndex.retriever_identity
<ragsieve.store.SnippetIndex.retriever_identity>`) on every pair, so a filter calibrated on
them knows which retriever its calibration lists came from. It sits above the index and the
data readers and knows nothing of filters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._validation import check_int, check_str
from .data.queries import list_pairs, read_queries
from .errors import DataError
from .types import Pair

if TYPE_CHECKING:
    from .data.jsonl import PathOrFile
    from .data.queries import LabelledQuery
    from .embeddings import EmbeddingCache
    from .store import Hit, SnippetIndex

__all__ = ["retrieve_pairs"]


def retrieve_pairs(
    index: SnippetIndex,
    queries: PathOrFile | Iterable[LabelledQuery | Mapping[str, Any]],
    k: int = 20,
    *,
    language: str | None = None,
    batch_size: int = 32,
    progress: bool = False,
    query_cache: EmbeddingCache | None = None,
) -> list[Pair]:
    """Search for every labelled query and label what comes back: calibration lists of
    the index's own search (``ragsieve retrieve``).

    Parameters
    ----------
    index : SnippetIndex
        The deployed index.
    queries : path, open file, or iterable of LabelledQuery / mapping
        Labelled queries (:func:`ragsieve.data.queries.read_queries`).
    k : int
        Hits per query: the ``k`` the deployment retrieves.
    language : str, optional
        The language of the answers' SQuAD normalisation (None: English).
    batch_size : int
        Queries embedded per model call.
    progress : bool
        Show a progress bar over the queries.
    query_cache : EmbeddingCache, optional
        An embedding cache of the index's model the queries are embedded through (as
        queries): a later ``calibrate`` reading the same cache embeds them no more, as it
        takes the snippets' vectors from the index. None: the index's model embeds them.

    Returns
    -------
    list of Pair
        One per hit, query by query in input order and hit by hit in rank order:
        ``snippet_id`` the hit's, ``relevant`` from the query's labels
        (:meth:`LabelledQuery.label`; a hit is of a listed document when its
        ``doc_id`` or its ``path`` is listed), ``meta`` with ``doc_id``, ``path``,
        ``start``, ``end``, ``retrieval_score`` (``1 - cos``), ``rank``, the query's
        ``answers`` and ``retriever`` = :meth:`SnippetIndex.retriever_identity` ``(k)``.

    Raises
    ------
    ValueError
        ``query_cache`` embeds with another model than the index's.
    DataError
        Malformed queries (``file:line``); an index that holds no snippet, that is
        not whole (a writer is committing, or was stopped mid-commit) or that changed
        while the queries ran; two snippets of one id in one list (JSONL documents
        sharing an ``id``).
    IndexMissingError
        The index directory was removed.

    Examples
    --------
    >>> pairs = retrieve_pairs(SnippetIndex.open("idx"),  # doctest: +SKIP
    ...     [{"query_id": 1, "query": "Who won?", "answers": ["Denver Broncos"]}], k=5)
    >>> pairs[0].meta["retriever"]["kind"]  # doctest: +SKIP
    'ragsieve-index'
    """
    check_str(language, "language", allow_none=True, hint="a language code such as 'en'")
    labelled = read_queries(queries, language=language)
    k = check_int(k, "k", min_value=1)
    index.check_whole()
    identity = index.retriever_identity(k)
    if identity["n_snippets"] == 0:
        raise DataError(f"index {str(index.path)!r} holds no snippets; index documents "
                        f"first with `ragsieve index DOCS --index {index.path}`.")
    pairs: list[Pair] = []
    texts = [q.query for q in labelled]
    if query_cache is None:
        found = index.search_many(texts, k, batch_size=batch_size, progress=progress)
    else:
        if query_cache.model.model_id != index.model_id:
            raise ValueError(f"query_cache embeds with {query_cache.model.model_id!r}; the index "
                             f"{str(index.path)!r} holds vectors of {index.model_id!r}.")
        found = _cached_search(index, texts, k, query_cache, progress)
    for query, hits in zip(labelled, found, strict=True):
        pairs.extend(list_pairs(query, _hit_records(index, query.query_id, hits),
                                retriever=identity, language=language))
    if index.retriever_identity(k) != identity:
        raise DataError(
            f"index {str(index.path)!r} changed while the queries ran (a `ragsieve index` "
            "run committed files), so the lists mix two versions of it; retrieve again "
            "once the writer has finished.")
    return pairs

def _cached_search(index: SnippetIndex, queries: list[str], k: int, cache: EmbeddingCache,
                   progress: bool) -> Iterator[list[Hit]]:
    """The hits of each query, its vector embedded through ``cache`` (as a query), a
    thousand queries at a time."""
    for start in range(0, len(queries), _CACHED_CHUNK):
        vectors = cache.embed(queries[start:start + _CACHED_CHUNK], kind="query",
                              progress=progress)
        for vector in vectors:
            yield index.search_vector(vector, k)


#: Queries embedded through a query cache at a time (bounds the vectors held at once).
_CACHED_CHUNK = 1024


def _hit_records(index: SnippetIndex, query_id: str, hits: Sequence[Hit]) -> list[dict[str, Any]]:
    """The hits as :func:`~ragsieve.data.queries.list_pairs` takes them; a snippet id
    twice in one list (JSONL documents sharing an ``id``) is refused with the fix."""
    paths: dict[str, str] = {}
    for hit in hits:
        if hit.snippet_id in paths:
            raise DataError(
                f"query {query_id!r}: index {str(index.path)!r} returned snippet "
                f"{hit.snippet_id!r} twice (of {paths[hit.snippet_id]!r} and "
                f"{hit.path!r}): documents share the id {hit.doc_id!r}; give each JSONL "
                "document its own \"id\" and index again.")
        paths[hit.snippet_id] = hit.path
    return [{"snippet_id": h.snippet_id, "text": h.text, "doc_ids": [h.doc_id, h.path],
             "doc_id": h.doc_id, "path": h.path, "start": h.start, "end": h.end,
             "retrieval_score": h.score} for h in hits]
