"""How an HTTP client of ragsieve calls its endpoint: one settings value for every client.

:class:`CallPolicy` holds what the LLM client (:class:`~ragsieve.llm.LLMClient`) and the
rerank client (:class:`~ragsieve.rerank.RerankClient`) share: where the key is read from,
the timeout, the retries and their backoff, the requests in flight (httpx's ``Timeout`` and
``Limits`` are the model: small frozen values with their defaults beside them). Each client
names its defaults (``LLM_CALLS``, ``RERANK_CALLS``) and takes the fields one by one as
keywords, or the value whole as ``calls=``; :meth:`CallPolicy.from_keywords` checks them
once. :class:`PooledClient` is what both clients hold besides their API (the pooled
connections, the bound on requests in flight, the totals, closing); :class:`Retryable`
marks a failed attempt worth retrying; the helpers below read what a server answered (an
excerpt of a body, ``Retry-After``).
"""

from __future__ import annotations

import email.utils
import math
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._closing import Closing
from ._settings import settings_from_keywords
from ._validation import check_int, check_real, check_str

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = ["CallPolicy", "PooledClient", "Retryable", "excerpt", "retry_after"]

_EXCERPT = 300

_E = TypeVar("_E", bound=Exception)


@dataclass(frozen=True)
class CallPolicy:
    """How a client calls its endpoint.

    Parameters
    ----------
    api_key_env : str
        The environment variable holding the API key (sent as ``Authorization: Bearer``).
    timeout : float
        Seconds allowed per HTTP attempt.
    max_retries : int
        Retries after the first attempt of a request (429, 5xx, connection errors).
    backoff, max_backoff : float
        Exponential backoff with jitter: the k-th wait is at most
        ``min(max_backoff, backoff * 2**k)``; ``Retry-After`` is capped by ``max_backoff``.
    concurrency : int
        Most requests in flight at once (across threads).

    Examples
    --------
    >>> CallPolicy("RERANK_API_KEY", 60.0).from_keywords({"max_retries": 2}).max_retries
    2
    """

    api_key_env: str
    timeout: float
    max_retries: int = 4
    backoff: float = 0.5
    max_backoff: float = 30.0
    concurrency: int = 4

    def from_keywords(self, keywords: Mapping[str, Any], *, owner: str = "CallPolicy",
                      timeout_hint: str | None = None) -> CallPolicy:
        """This policy with the fields ``keywords`` give (or the value ``keywords["calls"]``),
        checked.

        Parameters
        ----------
        keywords : Mapping
            Fields of a policy by name, or ``{"calls": CallPolicy}``.
        owner : str
            Who takes them, named in the error of a keyword that is no field
            (``"LLMClient.__init__()"``).
        timeout_hint : str, optional
            Said after the rule of a refused ``timeout`` (``"seconds"``).

        Raises
        ------
        TypeError
            A keyword that is no field (as Python says it of a keyword a function lacks), or
            ``calls`` not a ``CallPolicy``
            (:func:`~ragsieve._settings.settings_from_keywords`).
        ValueError
            ``calls`` and fields both, or a field of the wrong value, e.g.
            ``concurrency == 0, must be an int >= 1.``
        """
        value = settings_from_keywords(self, keywords, whole="calls", owner=owner)
        return value._checked(timeout_hint)

    def _checked(self, timeout_hint: str | None) -> CallPolicy:
        """The policy with its numbers as ``float`` / ``int``; refuses a wrong field."""
        check_str(self.api_key_env, "api_key_env")
        # finite: (0, inf) and [0, inf) refuse inf as well as NaN
        timeout = check_real(self.timeout, "timeout", min_value=0, max_value=math.inf,
                             include_boundaries="neither", hint=timeout_hint)
        max_retries = check_int(self.max_retries, "max_retries", min_value=0)
        backoff = check_real(self.backoff, "backoff", min_value=0, max_value=math.inf,
                             include_boundaries="left")
        max_backoff = check_real(self.max_backoff, "max_backoff", min_value=0,
                                 max_value=math.inf, include_boundaries="left")
        concurrency = check_int(self.concurrency, "concurrency", min_value=1)
        return replace(self, timeout=timeout, max_retries=max_retries, backoff=backoff,
                       max_backoff=max_backoff, concurrency=concurrency)


class Retryable(Exception, Generic[_E]):
    """Internal: one failed attempt worth retrying.

    Parameters
    ----------
    error : Exception
        What the client raises once the retries are spent (``LLMError``, ``RerankError``).
    retry_after : float, optional
        Seconds the server asked to wait (its ``Retry-After``).
    """

    def __init__(self, error: _E, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class PooledClient(Closing):
    """What the HTTP clients share besides their API: a pooled httpx client of ``concurrency``
    connections with the key as a Bearer header, a bound on requests in flight, running
    totals, a cache they may own, closing, and the key kept out of every message.

    A client calls :meth:`_open_pool` once in its ``__init__``, after setting ``cache`` and
    ``_owns_cache``; it then has its policy as ``calls`` and each field of it as an
    attribute of the same name (``timeout``, ``max_retries``, ...).
    """

    calls: CallPolicy
    api_key_env: str
    timeout: float
    max_retries: int
    backoff: float
    max_backoff: float
    concurrency: int
    cache: Any
    _owns_cache: bool
    _secret: str | None
    _http: httpx.Client
    _slots: threading.BoundedSemaphore
    _lock: threading.Lock
    _usage: dict[str, float | int]

    def _open_pool(self, httpx_module: Any, policy: CallPolicy, key: str | None, *,
                   usage: Mapping[str, float | int], transport: Any = None) -> None:
        """Open the pooled HTTP client for ``policy``, sending ``key``; ``usage`` at zero."""
        self.calls = policy
        for name in (f.name for f in fields(policy)):  # client.timeout == client.calls.timeout
            setattr(self, name, getattr(policy, name))
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx_module.Client(
            timeout=httpx_module.Timeout(policy.timeout), headers=headers, transport=transport,
            limits=httpx_module.Limits(max_connections=policy.concurrency,
                                       max_keepalive_connections=policy.concurrency))
        self._slots = threading.BoundedSemaphore(policy.concurrency)
        self._lock = threading.Lock()
        self._usage = dict(usage)

    @property
    def usage(self) -> dict[str, float | int]:
        """Snapshot of the running totals (see the class docstring)."""
        with self._lock:
            return dict(self._usage)

    def close(self) -> None:
        """Close the HTTP connections and a cache this client opened."""
        self._http.close()
        if self._owns_cache and self.cache is not None:
            self.cache.close()

    @contextmanager
    def _thread_pool(self, n_jobs: int, name: str, bar: Any) -> Iterator[ThreadPoolExecutor]:
        """Threads for ``n_jobs`` requests, ``concurrency`` at most, named ``name``; the
        progress ``bar`` is closed at the end.

        On an exception in the ``with`` block (Ctrl-C, or a failed request the caller
        re-raises) nothing new is started, the requests running finish (their replies
        reach the cache) and the exception is re-raised.
        """
        executor = ThreadPoolExecutor(max_workers=min(self.concurrency, n_jobs),
                                      thread_name_prefix=name)
        try:
            yield executor
        except BaseException:
            executor.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            executor.shutdown(wait=True)
            bar.close()

    def _redact(self, text: str) -> str:
        """``text`` with the key replaced by ``***``."""
        return text.replace(self._secret, "***") if self._secret else text


def excerpt(text: str) -> str:
    """``text`` on one line, at most 300 characters (``"(empty body)"`` for none)."""
    text = " ".join(text.split())
    if not text:
        return "(empty body)"
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
