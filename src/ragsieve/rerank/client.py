"""An HTTP client of the rerank API: batches, a bound on requests in flight, retries, a cache.

:class:`RerankClient` asks a reranker (Cohere / Jina / vLLM / Xinference ``/v1/rerank``,
TEI ``/rerank``: :mod:`ragsieve.rerank.api`) for the relevance of (query, document) pairs.

Batches
    A query's documents not yet known go out ``batch_size`` at a time, at most
    ``concurrency`` requests in flight (across threads).
Retries
    Connection errors, timeouts, HTTP 429 and 5xx are retried through tenacity, up to
    ``max_retries`` times with exponential backoff and jitter; a ``Retry-After`` header is
    honoured (capped by ``max_backoff``). Other 4xx fail at once (401 / 403 name the
    environment variable the key is read from); an answer that is not the API's shape is
    a :class:`~ragsieve.errors.RerankResponseError`, never a score.
Cache
    Every relevance is stored as it arrives, keyed by the API kind, the model, the query
    and the text (not the URL: a moved endpoint keeps its cache; not the batch: a
    document's score is its own), in a SQLite file under the ragsieve cache
    (:func:`default_rerank_cache_path`), so running again never sends a pair twice, and a
    cached pair gives the same float.

The key (``Authorization: Bearer``) is read from the environment and is never logged,
stored or put in an error message.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._http import CallPolicy, PooledClient, Retryable
from .._http import excerpt as _excerpt
from .._http import retry_after as _retry_after
from .._optional import require
from .._paths import cache_dir
from .._validation import check_instance, check_int, check_str
from ..errors import RerankError, RerankResponseError
from ..llm.cache import LLMCache
from .api import api_of, parse_answer, request_body, resolve_url

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = ["CACHE_VERSION", "RERANK_CALLS", "RerankClient", "default_rerank_cache_path",
           "rerank_calls"]

logger = logging.getLogger(__name__)

CACHE_VERSION = "rerank-1"
"""Version tag of the cached relevance entries; bump it to invalidate them."""

_MEMO_LIMIT = 200_000  # pairs kept in memory beside the disk cache


def default_rerank_cache_path() -> Path:
    """``$RAGSIEVE_CACHE/rerank-cache.sqlite`` (default ``~/.cache/ragsieve/...``)."""
    return cache_dir() / "rerank-cache.sqlite"


#: The rerank client's call settings when none are given (:class:`~ragsieve._http.CallPolicy`).
RERANK_CALLS = CallPolicy(api_key_env="RERANK_API_KEY", timeout=60.0)


def rerank_calls(calls: Mapping[str, Any], *, owner: str = "RerankClient.__init__()") -> CallPolicy:
    """The call settings of a rerank client: :data:`RERANK_CALLS` with the fields ``calls``
    gives (or the value ``calls["calls"]``), checked without opening anything.

    Raises
    ------
    TypeError, ValueError
        A setting of the wrong type or value, e.g. ``concurrency == 0, must be an int >= 1.``

    Examples
    --------
    >>> rerank_calls({"concurrency": 8}).concurrency
    8
    """
    if "calls" not in calls:  # the key's variable: never blank (the policy takes any str)
        check_str(calls.get("api_key_env", RERANK_CALLS.api_key_env), "api_key_env",
                  non_blank=True)
    policy = RERANK_CALLS.from_keywords(calls, owner=owner, timeout_hint="seconds")
    check_str(policy.api_key_env, "api_key_env", non_blank=True)
    return policy


def _open_cache(cache: Any) -> tuple[LLMCache | None, bool]:
    """The cache ``cache`` names and whether this client owns it (closes it)."""
    check_instance(cache, (bool, LLMCache, str, os.PathLike), "cache",
                   expected="a bool, an LLMCache or a path", allow_none=True)
    if isinstance(cache, LLMCache):
        return cache, False
    if cache is None or cache is False:
        return None, False
    return LLMCache(default_rerank_cache_path() if cache is True else cache), True


class RerankClient(PooledClient):
    """A client of one rerank endpoint, scoring (query, document) pairs one by one.

    Parameters
    ----------
    url : str
        A base URL (``http://host:port``: the kind's default path is appended,
        ``/v1/rerank`` for ``cohere``, ``/rerank`` for ``tei``) or a full URL ending in
        ``/rerank``, ``/v1/rerank`` or ``/v2/rerank``, used as given
        (:func:`~ragsieve.rerank.api.resolve_url`).
    api : {"cohere", "tei"}
        The API the endpoint speaks.
    model : str, optional
        Sent as ``"model"`` (cohere kind) and part of the cache key.
    api_key : str, optional
        Sent as ``Authorization: Bearer <key>``; default: the environment variable
        ``api_key_env`` if set. Never logged.
    batch_size : int
        Documents per request.
    cache : bool, str, os.PathLike or LLMCache
        True: the SQLite file :func:`default_rerank_cache_path`; a path or an open cache;
        False: in memory only (this client's lifetime).
    transport : httpx.BaseTransport, optional
        httpx's transport (``httpx.MockTransport`` to inject failures).
    **calls
        How the requests are made (:class:`~ragsieve._http.CallPolicy`, defaults
        :data:`RERANK_CALLS`), the value whole as ``calls=`` or its fields: ``api_key_env``
        (the environment variable holding the key, default ``RERANK_API_KEY``);
        ``concurrency`` (most requests in flight at once, default 4); ``timeout`` (seconds
        allowed per HTTP attempt, default 60); ``max_retries`` (retries after the first
        attempt of a request: 429, 5xx, connection errors; default 4); ``backoff``,
        ``max_backoff`` (exponential backoff with jitter: the k-th wait is at most
        ``min(max_backoff, backoff * 2**k)``; ``Retry-After`` is capped by ``max_backoff``;
        defaults 0.5 and 30).

    Attributes
    ----------
    url : str
        The resolved endpoint URL.
    usage : dict
        Totals (a snapshot): ``n_requests`` (HTTP attempts), ``n_pairs_sent`` (documents
        sent, over every attempt), ``n_cache_hits`` (distinct pairs of a call answered from
        memory or the cache, without a request),
        ``n_retries``, ``seconds`` (time in HTTP).
    answered_model : str or None
        The model the endpoint's answers name (vLLM, Jina), once one did.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or value.
    ImportError
        When httpx or tenacity is missing (``pip install 'ragsieve[rerank]'``).
    """

    def __init__(self, url: str, *, api: str = "cohere", model: str | None = None,
                 api_key: str | None = None, batch_size: int = 32,
                 cache: bool | str | os.PathLike[str] | LLMCache = True,
                 transport: Any = None, **calls: Any) -> None:
        self.api = api_of(api).kind
        self.url = resolve_url(url, self.api)
        self.model = check_str(model, "model", non_blank=True, allow_none=True)
        self.batch_size: int = check_int(batch_size, "batch_size", min_value=1)
        policy = rerank_calls(calls)
        key = check_str(api_key, "api_key", allow_none=True)
        self._httpx = require("httpx", "rerank")
        self._tenacity = require("tenacity", "rerank")
        self.cache, self._owns_cache = _open_cache(cache)
        self._memo: dict[tuple[str, str], float] = {}
        self.answered_model: str | None = None
        self._open_pool(self._httpx, policy,
                        key if key is not None else os.environ.get(policy.api_key_env) or None,
                        usage={"n_requests": 0, "n_pairs_sent": 0, "n_cache_hits": 0,
                               "n_retries": 0, "seconds": 0.0}, transport=transport)

    # -- public API -------------------------------------------------------------------

    def rerank(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """The relevance of each of ``texts`` to ``query`` (higher = more relevant).

        Raises
        ------
        RerankError
            The endpoint failed for good (after retries where they help).
        RerankResponseError
            An answer that is not the API's shape.
        """
        return self.rerank_pairs([(query, t) for t in texts])

    def rerank_pairs(self, pairs: Sequence[tuple[str, str]], *,
                     progress: bool = False) -> np.ndarray:
        """The relevance of each ``(query, text)`` pair, each asked once at most.

        Pairs known (in memory or in the cache) are not sent; the others go out per
        query, ``batch_size`` at a time, ``concurrency`` requests in flight. On a failure
        no new request starts, those in flight finish (their answers are cached) and the
        error is raised.

        Parameters
        ----------
        pairs : sequence of (str, str)
            ``(query, text)`` pairs, in any order, repeats allowed.
        progress : bool
            A tqdm progress bar over the requests.

        Returns
        -------
        numpy.ndarray
            float64 relevance aligned with ``pairs``.

        Raises
        ------
        TypeError
            A query or text that is not a str.
        RerankError, RerankResponseError
            As in :meth:`rerank`.
        """
        found: dict[tuple[str, str], float] = {}
        todo: dict[str, dict[str, None]] = {}  # query -> its unknown texts, in order
        for i, (query, text) in enumerate(pairs):
            check_str(query, f"pairs[{i}] query")
            check_str(text, f"pairs[{i}] text")
            if (query, text) in found or text in todo.get(query, ()):
                continue
            value = self._known(query, text)
            if value is None:
                todo.setdefault(query, {})[text] = None
            else:
                found[(query, text)] = value
        batches = [(q, list(texts)) for q, texts in todo.items()]
        found.update(self._send_all([(q, texts[k:k + self.batch_size]) for q, texts in batches
                                     for k in range(0, len(texts), self.batch_size)],
                                    progress=progress))
        return np.array([found[pair] for pair in pairs], dtype=np.float64)

    def __repr__(self) -> str:
        return (f"RerankClient(url={self.url!r}, api={self.api!r}, model={self.model!r}, "
                f"api_key={'set' if self._secret else 'unset'})")

    # -- the cache --------------------------------------------------------------------

    def _key(self, query: str, text: str) -> str:
        return LLMCache.make_key(f"rerank/{self.api}", self.model or "", CACHE_VERSION,
                                 {"query": query, "text": text})

    def _known(self, query: str, text: str) -> float | None:
        """The pair's relevance from memory or the cache (counted as a hit), else None."""
        with self._lock:
            value = self._memo.get((query, text))
        if value is None and self.cache is not None:
            hit = self.cache.get(self._key(query, text))
            found = None if hit is None else hit.get("relevance")
            if isinstance(found, float) and math.isfinite(found):
                value = found
        if value is not None:
            self._remember(query, text, value, hits=1)
        return value

    def _remember(self, query: str, text: str, value: float, *, hits: int = 0) -> None:
        with self._lock:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[(query, text)] = value
            self._usage["n_cache_hits"] += hits

    # -- sending ----------------------------------------------------------------------

    def _send_all(self, jobs: list[tuple[str, list[str]]], *,
                  progress: bool) -> dict[tuple[str, str], float]:
        """Send every ``(query, texts)`` batch, ``concurrency`` at a time, and give each
        pair's relevance; the first failure stops new batches and is raised once those in
        flight are done (their answers cached)."""
        out: dict[tuple[str, str], float] = {}
        if len(jobs) <= 1:
            for query, texts in jobs:
                out.update(self._send(query, texts))
            return out
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(total=len(jobs), disable=not progress, unit="request",
                   desc=f"reranking ({self.model or self.api})")
        with self._thread_pool(len(jobs), "ragsieve-rerank", bar) as pool:
            futures = [pool.submit(self._send, q, texts) for q, texts in jobs]
            for future in as_completed(futures):
                out.update(future.result())
                bar.update(1)
        return out

    def _send(self, query: str, texts: list[str]) -> dict[tuple[str, str], float]:
        """One batch: ask (with retries), check, remember and cache each relevance."""
        body = request_body(self.api, query, texts, model=self.model)
        retrying = self._tenacity.Retrying(
            retry=self._tenacity.retry_if_exception_type(Retryable),
            stop=self._tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._wait, before_sleep=self._before_sleep, reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    relevance = self._attempt(body, len(texts))
        except Retryable as failure:
            n = self.max_retries + 1
            raise RerankError(f"{failure.error} (gave up after {n} attempt"
                              f"{'s' if n > 1 else ''})", url=self.url,
                              status=failure.error.status) from None
        for text, value in zip(texts, relevance, strict=True):
            self._remember(query, text, value)
            if self.cache is not None:
                self.cache.put(self._key(query, text), {"relevance": value})
        return {(query, text): value for text, value in zip(texts, relevance, strict=True)}

    def _wait(self, state: Any) -> float:
        """Seconds before the next attempt: ``Retry-After`` (capped), else exponential
        backoff with full jitter."""
        failure = state.outcome.exception() if state.outcome is not None else None
        after = getattr(failure, "retry_after", None)
        if after is not None:
            return float(min(after, self.max_backoff))
        jitter = self._tenacity.wait_random_exponential(multiplier=self.backoff,
                                                        max=self.max_backoff)
        return float(jitter(state))

    def _before_sleep(self, state: Any) -> None:
        with self._lock:
            self._usage["n_retries"] += 1
        failure = state.outcome.exception() if state.outcome is not None else None
        logger.info("rerank request to %s failed (%s); retry %d of %d in %.2f s", self.url,
                    failure, state.attempt_number, self.max_retries,
                    state.next_action.sleep if state.next_action else 0.0)

    def _post(self, body: dict[str, Any], n_texts: int) -> httpx.Response:
        """One HTTP attempt within the bound on requests in flight."""
        httpx = self._httpx
        with self._slots:
            start = time.perf_counter()
            try:
                return self._http.post(self.url, json=body)
            except httpx.TimeoutException as exc:
                raise Retryable(RerankError(
                    f"the reranker at {self.url} timed out after {self.timeout:g} s "
                    f"({type(exc).__name__})", url=self.url)) from None
            except httpx.TransportError as exc:
                raise Retryable(RerankError(
                    f"cannot reach the reranker at {self.url} ({type(exc).__name__}: "
                    f"{self._redact(str(exc))})", url=self.url)) from None
            finally:
                with self._lock:
                    self._usage["n_requests"] += 1
                    self._usage["n_pairs_sent"] += n_texts
                    self._usage["seconds"] += time.perf_counter() - start

    def _attempt(self, body: dict[str, Any], n_texts: int) -> tuple[float, ...]:
        """One attempt: the relevance of each document, or an error (retryable or not)."""
        response = self._post(body, n_texts)
        status = response.status_code
        said = f"the reranker at {self.url} answered HTTP {status}: " \
               f"{self._redact(_excerpt(response.text))}"
        if status == 429 or status >= 500:
            raise Retryable(RerankError(said, url=self.url, status=status),
                             retry_after=_retry_after(response.headers.get("Retry-After")))
        if status in (401, 403):
            raise RerankError(f"{said}; it refused the credentials: put the API key in the "
                              f"environment variable {self.api_key_env} (--rerank-key-env "
                              "names another).", url=self.url, status=status)
        if not 200 <= status < 300:
            raise RerankError(said, url=self.url, status=status)
        try:
            data = response.json()
        except ValueError:
            raise RerankResponseError(
                f"reranker answer from {self.url} is not JSON: "
                f"{self._redact(_excerpt(response.text))}; never used as a score.",
                url=self.url, status=status) from None
        answer = parse_answer(self.api, data, n_texts, url=self.url)
        if answer.model is not None:
            with self._lock:
                self.answered_model = self.answered_model or answer.model
        return answer.relevance

