"""One OpenAI-compatible LLM client for every LLM use in ragsieve.

The same code drives vLLM, Ollama, llama.cpp servers and OpenAI: only ``base_url``
changes. Requests go to ``{base_url}/completions`` (legacy completions) and
``{base_url}/chat/completions``.

Retries
    Connection errors, timeouts, HTTP 429 and 5xx, and 2xx replies that are not usable
    (not JSON, no ``choices``) are retried up to ``max_retries`` times with exponential
    backoff and jitter; a ``Retry-After`` header is honoured, capped by ``max_backoff``.
    Other 4xx statuses fail at once with :class:`~ragsieve.errors.LLMError`.

Caching
    With a cache, replies to requests with ``temperature == 0`` (deterministic) are
    stored once parsed successfully and served from the cache on an identical request;
    errors are never cached. Sampled replies (``temperature > 0``) are cached only when
    the client is built with ``cache_nondeterministic=True``, because replaying one
    sample forever is rarely what a caller asking for randomness wants.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._http import CallPolicy, PooledClient, Retryable
from .._http import excerpt as _excerpt
from .._http import retry_after as _retry_after
from .._optional import require
from .._validation import (
    check_instance,
    check_int,
    check_real,
    check_sequence,
    check_str,
    check_str_sequence,
)
from ..errors import LLMError, LLMResponseError
from .cache import LLMCache

__all__ = ["LLM_CALLS", "Completion", "LLMCache", "LLMClient"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_CHAT = "chat/completions"
_COMPLETIONS = "completions"
_RESERVED = frozenset({"model", "prompt", "messages", "stream"})


@dataclass(frozen=True)
class Completion:
    """One parsed reply of an OpenAI-compatible server.

    Attributes
    ----------
    text : str
        ``choices[0].text`` (completions) or ``choices[0].message.content`` (chat).
    top_logprobs : tuple of dict
        One ``{token: logprob}`` dict of the top alternatives per generated token;
        empty when log-probabilities were not requested or not returned. When a
        server lists one token string twice, the first (most likely) entry is kept.
    finish_reason : str or None
        ``"stop"``, ``"length"``, ... as reported.
    prompt_tokens, completion_tokens : int
        Token usage reported in the reply (0 when absent). A cached reply reports the
        usage of the original request.
    cached : bool
        True when served from the cache without any HTTP request.
    raw : Mapping
        The response JSON.
    """

    text: str
    top_logprobs: tuple[dict[str, float], ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


#: The LLM client's call settings when none are given (:class:`~ragsieve._http.CallPolicy`).
LLM_CALLS = CallPolicy(api_key_env="OPENAI_API_KEY", timeout=120.0)


def _check_target(base_url: Any, model: Any, api_key: Any, cache: Any) -> None:
    """Check :class:`LLMClient`'s endpoint, model, key and cache.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or value.
    """
    url = "an http(s) URL including /v1, e.g. 'http://127.0.0.1:8080/v1'"
    if not check_str(base_url, "base_url", hint=url).startswith(("http://", "https://")):
        raise ValueError(f"base_url == {base_url!r}, expected {url}.")
    check_str(model, "model", non_blank=True, hint="the model name")
    check_str(api_key, "api_key", allow_none=True)
    check_instance(cache, (LLMCache, str, os.PathLike), "cache",
                   expected="an LLMCache or a path (str or os.PathLike)", allow_none=True)


class LLMClient(PooledClient):
    """OpenAI-compatible HTTP client with retries, a concurrency bound and a reply cache.

    Parameters
    ----------
    base_url : str
        OpenAI-style base URL including ``/v1``, e.g. ``"http://127.0.0.1:8080/v1"``,
        ``"https://api.openai.com/v1"`` or ``"http://localhost:11434/v1"``.
    model : str
        Model name sent with every request.
    api_key : str or None
        API key sent as ``Authorization: Bearer <key>``; when None the environment
        variable named by ``api_key_env`` is used if set. The key is never logged.
    cache : LLMCache, str, os.PathLike or None
        Reply cache, or the path of its SQLite file. A cache built here from a path is
        closed by :meth:`close`; a passed instance is left open.
    cache_nondeterministic : bool
        Also cache replies to ``temperature > 0`` requests (default: only
        ``temperature == 0``).
    **calls
        How the requests are made (:class:`~ragsieve._http.CallPolicy`, defaults
        :data:`LLM_CALLS`), the value whole as ``calls=`` or its fields:
        ``api_key_env`` (environment variable holding the API key, default
        ``OPENAI_API_KEY``); ``timeout`` (seconds allowed per HTTP attempt: connect, read,
        write, pool; default 120); ``max_retries`` (retries after the first attempt of a
        request, 0 = no retry; default 4); ``backoff`` (base delay in seconds: retry ``k``
        waits ``backoff * 2**(k-1)`` scaled by a random factor in [0.5, 1], at most
        ``max_backoff``; default 0.5); ``max_backoff`` (upper bound of one wait, also
        applied to ``Retry-After``; default 30); ``concurrency`` (most HTTP requests in
        flight at once, across threads, and the worker count of :meth:`map`; default 4).

    Attributes
    ----------
    usage : dict
        Thread-safe totals (a snapshot copy): ``n_requests`` (HTTP attempts),
        ``n_cache_hits``, ``n_retries``, ``prompt_tokens`` and ``completion_tokens``
        (of HTTP replies only), ``seconds`` (time spent in HTTP).

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or value.
    ImportError
        When ``httpx`` is missing (``pip install 'ragsieve[llm]'``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        cache: LLMCache | str | os.PathLike[str] | None = None,
        cache_nondeterministic: bool = False,
        **calls: Any,
    ) -> None:
        _check_target(base_url, model, api_key, cache)
        policy = LLM_CALLS.from_keywords(calls, owner="LLMClient.__init__()")
        httpx_module = require("httpx", "llm")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.cache_nondeterministic = bool(cache_nondeterministic)
        self._owns_cache = cache is not None and not isinstance(cache, LLMCache)
        self.cache: LLMCache | None = (
            cache if isinstance(cache, LLMCache) or cache is None else LLMCache(cache)
        )
        key = api_key if api_key is not None else os.environ.get(policy.api_key_env) or None
        self._httpx = httpx_module
        self._open_pool(httpx_module, policy, key, usage={
            "n_requests": 0,
            "n_cache_hits": 0,
            "n_retries": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "seconds": 0.0,
        })

    # -- public API -------------------------------------------------------------------

    def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = 1,
        temperature: float = 0.0,
        logprobs: int | None = None,
        stop: list[str] | None = None,
        prompt_version: str = "",
        **extra: Any,
    ) -> Completion:
        """Send a legacy completion request (``POST {base_url}/completions``).

        Parameters
        ----------
        prompt : str
            The raw prompt text.
        max_tokens : int
            Tokens to generate.
        temperature : float
            Sampling temperature; 0 is greedy and cacheable.
        logprobs : int or None
            Number of top alternatives to return per generated token.
        stop : list of str or None
            Stop sequences.
        prompt_version : str
            Version tag of the prompt template, part of the cache key.
        **extra
            Further JSON fields of the request body (``seed``, ``top_p``, ...).

        Returns
        -------
        Completion

        Raises
        ------
        LLMError
            The request failed for good (after retries for transient failures).
        LLMResponseError
            Replies kept arriving unusable (not JSON, no choices).
        """
        check_str(prompt, "prompt")
        body = self._body(max_tokens, temperature, extra)
        body["prompt"] = prompt
        if logprobs is not None:
            body["logprobs"] = check_int(logprobs, "logprobs", min_value=0)
        if stop is not None:
            body["stop"] = check_str_sequence(stop, "stop")
        return self._request(_COMPLETIONS, body, prompt_version)

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        logprobs: int | None = None,
        prompt_version: str = "",
        **extra: Any,
    ) -> Completion:
        """Send a chat completion request (``POST {base_url}/chat/completions``).

        Parameters
        ----------
        messages : sequence of mapping
            ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``.
        max_tokens, temperature, prompt_version, **extra
            As in :meth:`complete`.
        logprobs : int or None
            Number of top alternatives per generated token (sent as
            ``"logprobs": true, "top_logprobs": n``).

        Returns
        -------
        Completion

        Raises
        ------
        LLMError, LLMResponseError
            As in :meth:`complete`.
        """
        given = check_sequence(messages, "messages",
                               expected="a list of {'role': ..., 'content': ...} mappings")
        checked: list[dict[str, str]] = []
        for i, message in enumerate(given):
            check_instance(message, Mapping, f"messages[{i}]",
                           expected="a mapping with str 'role' and 'content'")
            check_str(message.get("role"), f"messages[{i}]['role']")
            check_str(message.get("content"), f"messages[{i}]['content']")
            checked.append(dict(message))
        if not checked:
            raise ValueError("messages is empty, expected at least one message.")
        body = self._body(max_tokens, temperature, extra)
        body["messages"] = checked
        if logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = check_int(logprobs, "logprobs", min_value=0)
        return self._request(_CHAT, body, prompt_version)

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        progress: bool = False,
        desc: str = "",
    ) -> list[R | BaseException]:
        """Apply ``fn`` to every item with at most ``concurrency`` calls in flight.

        Parameters
        ----------
        fn : callable
            Called once per item in a worker thread (typically it calls
            :meth:`complete` or :meth:`chat`).
        items : sequence
            The inputs.
        progress : bool
            Show a tqdm progress bar.
        desc : str
            Label of the progress bar.

        Returns
        -------
        list
            ``fn(item)`` in the order of ``items``; an item whose call raised holds the
            exception instead, so no failure is lost and none stops the others.

        Raises
        ------
        KeyboardInterrupt
            On Ctrl-C no new item is started; calls already running finish (their
            replies are cached) and the interrupt is re-raised.
        """
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        items = list(items)
        results: list[R | BaseException] = [None] * len(items)  # type: ignore[list-item]
        if not items:
            return results
        bar = tqdm(total=len(items), disable=not progress, desc=desc or None, unit="item")
        n_failed = 0
        first_failure: BaseException | None = None
        # Ctrl-C (or another interrupt in this thread): start nothing new, let the running
        # calls finish so their replies reach the cache, then re-raise (_thread_pool).
        with self._thread_pool(len(items), "ragsieve-llm", bar) as executor:
            futures: dict[Future[R], int] = {
                executor.submit(fn, item): i for i, item in enumerate(items)
            }
            for future in as_completed(futures):
                i = futures[future]
                exc = future.exception()
                if exc is None:
                    results[i] = future.result()
                else:
                    results[i] = exc
                    n_failed += 1
                    first_failure = first_failure or exc
                bar.update(1)
        if n_failed:
            logger.warning(
                "%d of %d items failed (returned in place); first: %s: %s",
                n_failed,
                len(items),
                type(first_failure).__name__,
                first_failure,
            )
        return results

    def __repr__(self) -> str:
        return (
            f"LLMClient(base_url={self.base_url!r}, model={self.model!r}, "
            f"concurrency={self.concurrency}, cache={self.cache!r}, "
            f"api_key={'set' if self._secret else 'unset'})"
        )

    # -- internals --------------------------------------------------------------------

    def _body(
        self, max_tokens: int, temperature: float, extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        max_tokens = check_int(max_tokens, "max_tokens", min_value=0)
        temperature = check_real(temperature, "temperature", min_value=0, max_value=math.inf,
                                 include_boundaries="left")
        clash = sorted(_RESERVED.intersection(extra))
        if clash:
            raise ValueError(
                f"extra request fields {clash} are set by the client itself; pass the "
                "prompt/messages as arguments (streaming is not supported)."
            )
        # float() makes 0 and 0.0 the same request, hence the same cache key
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": float(temperature),
            **extra,
        }

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._usage[name] += delta

    def _request(self, endpoint: str, body: dict[str, Any], prompt_version: str) -> Completion:
        check_str(prompt_version, "prompt_version")
        key: str | None = None
        if self.cache is not None and (body["temperature"] == 0 or self.cache_nondeterministic):
            payload = {k: v for k, v in body.items() if k != "model"}
            key = LLMCache.make_key(endpoint, self.model, prompt_version, payload)
            hit = self.cache.get(key)
            if hit is not None:
                try:
                    completion = _parse(hit, chat=endpoint == _CHAT, cached=True)
                except LLMResponseError as exc:
                    logger.warning("ignoring an unusable cached LLM reply (%s)", exc)
                else:
                    self._count(n_cache_hits=1)
                    return completion
        data, completion = self._post(endpoint, body)
        self._count(
            prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens
        )
        if key is not None and self.cache is not None:
            self.cache.put(key, data)
        return completion

    def _post(self, endpoint: str, body: dict[str, Any]) -> tuple[dict[str, Any], Completion]:
        url = f"{self.base_url}/{endpoint}"
        attempts = self.max_retries + 1
        last: Retryable[LLMError] | None = None
        for attempt in range(attempts):
            if last is not None:
                delay = self._delay(attempt, last.retry_after)
                logger.info(
                    "LLM request to %s failed (%s); retry %d of %d in %.2f s",
                    url,
                    last.error,
                    attempt,
                    self.max_retries,
                    delay,
                )
                self._count(n_retries=1)
                time.sleep(delay)
            try:
                return self._attempt(url, body, chat=endpoint == _CHAT)
            except Retryable as failure:
                last = failure
        assert last is not None
        error = last.error
        raise type(error)(
            f"{error} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})",
            status=error.status,
        ) from error

    def _attempt(
        self, url: str, body: dict[str, Any], *, chat: bool
    ) -> tuple[dict[str, Any], Completion]:
        httpx = self._httpx
        with self._slots:
            start = time.perf_counter()
            try:
                response = self._http.post(url, json=body)
            except httpx.TimeoutException as exc:
                raise Retryable(
                    LLMError(
                        f"request to {url} timed out after {self.timeout:g} s "
                        f"({type(exc).__name__})"
                    )
                ) from exc
            except httpx.TransportError as exc:
                raise Retryable(
                    LLMError(f"cannot reach {url} ({type(exc).__name__}: {exc})")
                ) from exc
            finally:
                self._count(n_requests=1, seconds=time.perf_counter() - start)
        status = response.status_code
        excerpt = self._redact(_excerpt(response.text))
        if status == 429 or status >= 500:
            raise Retryable(
                LLMError(f"HTTP {status} from {url}: {excerpt}", status=status),
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        if status in (401, 403):
            raise LLMError(
                f"HTTP {status} from {url}: {excerpt}. The server refused the credentials: "
                f"set the API key in the environment variable {self.api_key_env} "
                "(or pass api_key=...).",
                status=status,
            )
        if not 200 <= status < 300:
            raise LLMError(f"HTTP {status} from {url}: {excerpt}", status=status)
        try:
            data = response.json()
        except ValueError:
            raise Retryable(
                LLMResponseError(f"reply from {url} is not JSON: {excerpt}", status=status)
            ) from None
        try:
            return data, _parse(data, chat=chat, cached=False)
        except LLMResponseError as exc:
            raise Retryable(
                LLMResponseError(f"unusable reply from {url}: {exc}", status=status)
            ) from None

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return base * (0.5 + 0.5 * random.random())


# -- parsing --------------------------------------------------------------------------


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return int(value)


def _logprob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LLMResponseError(f"{where} == {value!r}, expected a number.")
    return float(value)


def _parse_logprobs(logprobs: Any) -> tuple[dict[str, float], ...]:
    """Top alternatives per generated token from any of the three reply formats."""
    if logprobs is None:
        return ()
    if not isinstance(logprobs, Mapping):
        raise LLMResponseError(f"logprobs is {type(logprobs).__name__}, expected an object.")
    content = logprobs.get("content")
    if isinstance(content, list):
        # OpenAI chat format, also llama.cpp's /completions:
        # content[i] = {"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}
        positions: list[dict[str, float]] = []
        for i, entry in enumerate(content):
            if not isinstance(entry, Mapping):
                raise LLMResponseError(f"logprobs.content[{i}] is not an object.")
            alternatives: dict[str, float] = {}
            top = entry.get("top_logprobs") or []
            if not isinstance(top, list):
                raise LLMResponseError(f"logprobs.content[{i}].top_logprobs is not a list.")
            for j, alt in enumerate(top):
                if not isinstance(alt, Mapping) or not isinstance(alt.get("token"), str):
                    raise LLMResponseError(
                        f"logprobs.content[{i}].top_logprobs[{j}] has no str 'token'."
                    )
                where = f"logprobs.content[{i}].top_logprobs[{j}].logprob"
                alternatives.setdefault(alt["token"], _logprob(alt.get("logprob"), where))
            if not alternatives and isinstance(entry.get("token"), str):
                where = f"logprobs.content[{i}].logprob"
                alternatives[entry["token"]] = _logprob(entry.get("logprob"), where)
            positions.append(alternatives)
        return tuple(positions)
    top = logprobs.get("top_logprobs")
    if isinstance(top, list):
        # legacy completions: top_logprobs[i] = {token: logprob, ...} (None for echoed
        # first prompt token)
        legacy: list[dict[str, float]] = []
        for i, alt in enumerate(top):
            if alt is None:
                legacy.append({})
                continue
            if not isinstance(alt, Mapping):
                raise LLMResponseError(f"logprobs.top_logprobs[{i}] is not an object.")
            legacy.append(
                {str(t): _logprob(v, f"logprobs.top_logprobs[{i}][{t!r}]") for t, v in alt.items()}
            )
        return tuple(legacy)
    return ()


def _parse(data: Any, *, chat: bool, cached: bool) -> Completion:
    """Turn a response JSON into a :class:`Completion` or raise LLMResponseError."""
    if not isinstance(data, Mapping):
        raise LLMResponseError(
            f"reply is a JSON {type(data).__name__}, expected an object with 'choices'."
        )
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        error = data.get("error")
        hint = f" (server error: {_excerpt(str(error))})" if error else ""
        raise LLMResponseError(f"reply has no choices{hint}; keys: {sorted(data)[:10]}.")
    choice = choices[0]
    if chat:
        message = choice.get("message")
        if not isinstance(message, Mapping):
            raise LLMResponseError("choices[0] has no 'message' object (chat reply expected).")
        text = message.get("content")
        text = "" if text is None else text
        where = "choices[0].message.content"
    else:
        text = choice.get("text")
        where = "choices[0].text"
    if not isinstance(text, str):
        raise LLMResponseError(f"{where} is {type(text).__name__}, expected a str.")
    finish = choice.get("finish_reason")
    usage = data.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    return Completion(
        text=text,
        top_logprobs=_parse_logprobs(choice.get("logprobs")),
        finish_reason=finish if isinstance(finish, str) else None,
        prompt_tokens=_as_int(usage.get("prompt_tokens")),
        completion_tokens=_as_int(usage.get("completion_tokens")),
        cached=cached,
        raw=data,
    )
