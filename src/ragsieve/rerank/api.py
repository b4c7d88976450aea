"""The rerank API's wire shapes, as a client speaks them: where to send, what to send, and
the strict check of what comes back.

Two kinds of endpoint (:data:`RERANK_APIS`, one frozen record each):

``cohere``
    Cohere v1 / v2, Jina, vLLM and Xinference share one shape, ``POST /v1/rerank``:
    ``{"model", "query", "documents": [str], "top_n", "return_documents": false}`` in,
    ``{"results": [{"index", "relevance_score"}], "model"?, ...}`` out.
``tei``
    Hugging Face Text Embeddings Inference, ``POST /rerank``:
    ``{"query", "texts": [str], "raw_scores": false}`` in, a bare list
    ``[{"index", "score"}]`` out.

An answer is never trusted: it must be the API's shape and hold exactly one finite number
for every document sent (no index out of range, repeated or missing); anything else is a
one-line :class:`~ragsieve.errors.RerankResponseError` naming the URL, never a score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import RerankResponseError

__all__ = ["RERANK_APIS", "RERANK_KINDS", "RerankAPI", "RerankAnswer", "api_of", "parse_answer",
           "request_body", "resolve_url"]


@dataclass(frozen=True)
class RerankAPI:
    """One kind of rerank endpoint: its default path and the keys of its bodies.

    Attributes
    ----------
    kind : str
        ``"cohere"`` or ``"tei"``.
    path : str
        The path appended to a base URL.
    texts_key : str
        The request key of the documents (``"documents"`` / ``"texts"``).
    score_key : str
        The answer key of a document's relevance (``"relevance_score"`` / ``"score"``).
    """

    kind: str
    path: str
    texts_key: str
    score_key: str


RERANK_APIS: dict[str, RerankAPI] = {
    "cohere": RerankAPI("cohere", "/v1/rerank", "documents", "relevance_score"),
    "tei": RerankAPI("tei", "/rerank", "texts", "score"),
}
"""The rerank API kinds a client speaks, by name."""

RERANK_KINDS: tuple[str, ...] = tuple(RERANK_APIS)
"""``("cohere", "tei")``."""

#: the endings of a full rerank URL (kept as given); any other path is a base
_FULL_PATHS = ("/v1/rerank", "/v2/rerank", "/rerank")


def api_of(kind: str) -> RerankAPI:
    """The :class:`RerankAPI` of ``kind``; ``ValueError`` naming the accepted kinds."""
    try:
        return RERANK_APIS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"api == {kind!r}, must be one of {RERANK_KINDS}.") from None


def resolve_url(url: str, kind: str = "cohere") -> str:
    """The URL a request of ``kind`` goes to.

    A URL whose path ends in ``/rerank``, ``/v1/rerank`` or ``/v2/rerank`` is used as
    given; any other is a base URL, and the kind's default path is appended to its path:
    ``/v1/rerank`` for ``cohere``, ``/rerank`` for ``tei``. A query string is kept
    (``?return=all``).

    Parameters
    ----------
    url : str
        An ``http://`` or ``https://`` URL.
    kind : {"cohere", "tei"}
        The API kind.

    Raises
    ------
    TypeError
        ``url`` is not a string.
    ValueError
        Not an http(s) URL with a host, or an unknown kind.

    Examples
    --------
    >>> resolve_url("http://127.0.0.1:8080")
    'http://127.0.0.1:8080/v1/rerank'
    >>> resolve_url("http://127.0.0.1:8080/", "tei")
    'http://127.0.0.1:8080/rerank'
    >>> resolve_url("https://api.example.com/v2/rerank?x=1")
    'https://api.example.com/v2/rerank?x=1'
    """
    api = api_of(kind)
    if not isinstance(url, str):
        raise TypeError(f"url is {type(url).__name__}, expected an http(s) URL str.")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url == {url!r}, expected an http(s) URL: a base URL "
                         "('http://127.0.0.1:8080') or one ending in /rerank, /v1/rerank or "
                         "/v2/rerank.")
    path = parts.path.rstrip("/")
    if not path.endswith(_FULL_PATHS):
        path += api.path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def request_body(kind: str, query: str, texts: Sequence[str], *,
                 model: str | None = None) -> dict[str, Any]:
    """The JSON body of one rerank request.

    Parameters
    ----------
    kind : {"cohere", "tei"}
        The API kind.
    query : str
        The query.
    texts : sequence of str
        The documents, in the order their scores come back.
    model : str, optional
        Sent as ``"model"`` (``cohere`` kind only: a TEI server serves one model).

    Examples
    --------
    >>> request_body("cohere", "q?", ["a", "b"], model="m")
    {'model': 'm', 'query': 'q?', 'documents': ['a', 'b'], 'top_n': 2, 'return_documents': False}
    >>> request_body("tei", "q?", ["a"])
    {'query': 'q?', 'texts': ['a'], 'raw_scores': False}
    """
    api = api_of(kind)
    if api.kind == "tei":
        return {"query": query, "texts": list(texts), "raw_scores": False}
    body: dict[str, Any] = {} if model is None else {"model": model}
    body.update({"query": query, "documents": list(texts), "top_n": len(texts),
                 "return_documents": False})
    return body


@dataclass(frozen=True)
class RerankAnswer:
    """A checked answer: one relevance per document sent, in the order sent.

    Attributes
    ----------
    relevance : tuple of float
        Finite relevance scores (higher = more relevant).
    model : str or None
        The model the endpoint says answered (``"model"`` of a vLLM / Jina answer).
    """

    relevance: tuple[float, ...]
    model: str | None = None


def _bad(url: str, what: str) -> RerankResponseError:
    return RerankResponseError(f"reranker answer from {url} {what}; never used as a score.",
                               url=url)


def _results(api: RerankAPI, data: Any, url: str) -> tuple[list[Any], str | None]:
    """The list of result objects of an answer and the model it names."""
    if api.kind == "tei":
        if not isinstance(data, list):
            raise _bad(url, f"is a JSON {type(data).__name__}, expected the TEI shape: a list "
                            "of {'index', 'score'}")
        return data, None
    results = data.get("results") if isinstance(data, Mapping) else None
    if not isinstance(results, list):
        got = (f"an object with keys {sorted(map(str, data))[:8]}" if isinstance(data, Mapping)
               else f"a JSON {type(data).__name__}")
        raise _bad(url, f"is {got}, expected the rerank shape: {{'results': [{{'index', "
                        "'relevance_score'}]}")
    model = data.get("model")
    return results, model if isinstance(model, str) and model else None


def parse_answer(kind: str, data: Any, n_texts: int, *, url: str) -> RerankAnswer:
    """Check an answer to a request of ``n_texts`` documents and read its scores.

    Parameters
    ----------
    kind : {"cohere", "tei"}
        The API kind.
    data : object
        The answer's decoded JSON.
    n_texts : int
        How many documents were sent: the answer must score each exactly once.
    url : str
        The endpoint, named in errors.

    Returns
    -------
    RerankAnswer

    Raises
    ------
    RerankResponseError
        Not the API's shape; an index that is not an integer, out of range, repeated or
        missing; a score that is not a finite number.

    Examples
    --------
    >>> parse_answer("cohere", {"results": [{"index": 1, "relevance_score": 0.2},
    ...     {"index": 0, "relevance_score": 0.9}], "model": "m"}, 2, url="http://h/v1/rerank")
    RerankAnswer(relevance=(0.9, 0.2), model='m')
    >>> parse_answer("tei", [{"index": 0, "score": 0.5}], 1, url="http://h/rerank").relevance
    (0.5,)
    """
    api = api_of(kind)
    results, model = _results(api, data, url)
    scores: list[float | None] = [None] * n_texts
    for i, item in enumerate(results):
        where = f"results[{i}]" if api.kind == "cohere" else f"[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(url, f"holds {where} == {item!r:.60}, expected an object "
                            f"{{'index', '{api.score_key}'}}")
        index, value = item.get("index"), item.get(api.score_key)
        if isinstance(index, bool) or not isinstance(index, int):
            raise _bad(url, f"holds {where}.index == {index!r:.40}, expected an integer")
        if not 0 <= index < n_texts:
            raise _bad(url, f"holds {where}.index == {index}, out of range for {n_texts} "
                            "documents sent")
        if scores[index] is not None:
            raise _bad(url, f"scores document {index} twice")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise _bad(url, f"holds {where}.{api.score_key} == {value!r:.40}, expected a "
                            "finite number")
        scores[index] = float(value)
    missing = [i for i, s in enumerate(scores) if s is None]
    if missing:
        raise _bad(url, f"scores {n_texts - len(missing)} of the {n_texts} documents sent "
                        f"(first missing: {missing[0]}); a score needs every document scored "
                        "(an endpoint that returns only some, such as ragsieve serve's cut, "
                        "needs its return-everything mode: ?return=all)")
    return RerankAnswer(tuple(s for s in scores if s is not None), model)
