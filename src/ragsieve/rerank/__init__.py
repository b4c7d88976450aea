"""The rerank API as a client speaks it: any reranker behind Cohere / Jina / vLLM /
Xinference ``/v1/rerank`` or TEI ``/rerank``, for the rerank score.

* :mod:`~ragsieve.rerank.api` -- the wire shapes: the URL a request goes to, the request
  body of each API kind, the strict check of an answer.
* :mod:`~ragsieve.rerank.client` -- ``RerankClient``: batches, a bound on requests in
  flight, retries with backoff (tenacity), the reply cache (``ragsieve.llm.cache``).

httpx and tenacity (the ``rerank`` extra) are imported only when a client is created.
"""

from .api import (
    RERANK_APIS,
    RERANK_KINDS,
    RerankAnswer,
    RerankAPI,
    parse_answer,
    request_body,
    resolve_url,
)
from .client import RerankClient, default_rerank_cache_path

__all__ = [
    "RERANK_APIS",
    "RERANK_KINDS",
    "RerankAPI",
    "RerankAnswer",
    "RerankClient",
    "default_rerank_cache_path",
    "parse_answer",
    "request_body",
    "resolve_url",
]
