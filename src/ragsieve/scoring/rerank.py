"""Any reranker as a score: ``A(q, s) = -relevance(q, s)`` from an endpoint of the rerank API.

A reranker the user runs (a bge-reranker or Cohere rerank behind TEI, vLLM, Jina, an API)
scores one (query, document) pair at a time: each document's relevance is asked on its
own (batched per request, never compared within the batch: the cache keys a score by the
query and the text alone), so the score is list-free and travels across retrievers.

The endpoint's identity is the API kind and the model (:meth:`RerankScorer.spec`); the URL,
the key and how the calls are made are options that do not change the scores
(``runtime``), given again where a saved filter is applied (``--rerank-url``). The
threshold holds for the model it was calibrated with: when the endpoint answers with
another model (vLLM and Jina name it), a warning says so, once per scorer
(:attr:`RerankScorer.identity_note`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._validation import check_int, check_str
from ..errors import RerankError
from ..types import Pair
from .base import Scorer
from .options import OptionPack, ScorerOption
from .tags import ScorerTags

if TYPE_CHECKING:
    from ..llm.cache import LLMCache
    from ..rerank.client import RerankClient

__all__ = ["RERANK_PACK", "RERANK_SIGNAL_OPTIONS", "RerankScorer", "given_reranker",
           "reranker_from_options"]

logger = logging.getLogger(__name__)

_KINDS = ("cohere", "tei")  # ragsieve.rerank.api.RERANK_KINDS (the table is imported lazily)


class RerankScorer(Scorer):
    """Minus the relevance a reranker endpoint gives each (query, snippet) pair.

    Parameters
    ----------
    url : str, optional
        The endpoint: a base URL (``http://host:port``; ``/v1/rerank`` is appended for the
        ``cohere`` kind, ``/rerank`` for ``tei``) or a full URL ending in ``/rerank``,
        ``/v1/rerank`` or ``/v2/rerank`` (used as given, its query string kept). Needed to
        score, not to build the scorer: a saved filter is rebuilt from its spec and given
        the URL where it is applied (CLI ``--rerank-url``).
    model : str, optional
        The reranker model: sent with each request (``cohere`` kind), recorded in the
        spec, part of the cache key, compared with the model the endpoint answers with.
    api : {"cohere", "tei"}
        The API the endpoint speaks: Cohere v1 / v2, Jina, vLLM and Xinference share
        ``cohere``; Hugging Face TEI is ``tei``.
    batch_size : int
        Documents per request.
    cache : bool, str, os.PathLike or LLMCache
        True (default): the on-disk cache under the ragsieve cache directory
        (``$RAGSIEVE_CACHE/rerank-cache.sqlite``); a path or an open cache; False: in
        memory for this scorer only.
    transport : httpx.BaseTransport, optional
        httpx's transport of the client (failure injection in tests).
    **calls
        How the client calls (:func:`~ragsieve.rerank.client.rerank_calls`), the value whole
        as ``calls=`` (a :class:`~ragsieve._http.CallPolicy`) or its fields: ``api_key_env``
        (the environment variable holding the key, sent as ``Authorization: Bearer``;
        default ``RERANK_API_KEY``), ``concurrency`` (most requests in flight, default 4),
        ``timeout`` (seconds per HTTP attempt, default 60), ``max_retries`` (retries of a
        request after a 429, a 5xx or a connection error, default 4).

    Examples
    --------
    >>> s = RerankScorer(url="http://127.0.0.1:8080", model="bge-reranker-base")
    >>> s.spec()
    {'scorer': 'rerank', 'api': 'cohere', 'model': 'bge-reranker-base'}
    >>> str(s.keep_rule(-0.62))
    'keep -relevance <= -0.62'
    """

    name: ClassVar[str] = "rerank"
    score_label: ClassVar[str] = "-relevance"
    # costly: a call per pair; thread-safe: the client is a pooled httpx client, a locked cache
    tags = ScorerTags(costly=True, thread_safe=True)
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("model", str, None, "scorer rerank: the reranker model (recorded in the "
                     "filter; sent with each request)", "--rerank-model", metavar="NAME"),
        ScorerOption("api", str, "cohere", "scorer rerank: the API the endpoint speaks: cohere "
                     "(Cohere v1/v2, Jina, vLLM, Xinference: /v1/rerank) or tei (/rerank)",
                     "--rerank-api", choices=_KINDS),
        # the endpoint's whereabouts and the calls: they change where and how fast, not scores
        ScorerOption("url", str, None, "scorer rerank: the endpoint, a base URL "
                     "(http://host:port) or one ending in /rerank, /v1/rerank, /v2/rerank",
                     "--rerank-url", metavar="URL", runtime=True),
        ScorerOption("api_key_env", str, "RERANK_API_KEY", "scorer rerank: the environment "
                     "variable holding the endpoint's API key (default RERANK_API_KEY)",
                     "--rerank-key-env", metavar="NAME", runtime=True),
        ScorerOption("batch_size", int, 32, "scorer rerank: documents per request (default "
                     "32)", "--rerank-batch-size", metavar="N", runtime=True),
        ScorerOption("concurrency", int, 4, "scorer rerank: requests in flight (default 4)",
                     "--rerank-concurrency", metavar="N", runtime=True),
        ScorerOption("timeout", float, 60.0, "scorer rerank: seconds per request (default 60)",
                     "--rerank-timeout", metavar="SECONDS", runtime=True),
        ScorerOption("cache", bool, True, "keep the reranker's answers in the on-disk cache",
                     "--no-cache", runtime=True),
        ScorerOption("max_retries", int, 4, "retries after a 429, a 5xx or a refused connection",
                     runtime=True),
    )

    def __init__(self, url: str | None = None, *, model: str | None = None,
                 api: str = "cohere", batch_size: int = 32,
                 cache: bool | str | os.PathLike[str] | LLMCache = True,
                 transport: Any = None, **calls: Any) -> None:
        from ..rerank.api import api_of, resolve_url
        from ..rerank.client import rerank_calls

        self.api = api_of(api).kind
        self.url = check_str(url, "url", non_blank=True, allow_none=True,
                             hint="the reranker endpoint's URL")
        if self.url is not None:
            resolve_url(self.url, self.api)  # refused now, not at the first call
        self.model = check_str(model, "model", non_blank=True, allow_none=True)
        # checked now; the client (httpx, the cache file) is opened on first use
        self._client_args: dict[str, Any] = {
            "batch_size": check_int(batch_size, "batch_size", min_value=1),
            "calls": rerank_calls(calls, owner="RerankScorer.__init__()"),
            "cache": cache, "transport": transport}
        self._client: RerankClient | None = None
        self._lock = threading.Lock()
        self._warned = False

    # ------------------------------------------------------------ the endpoint
    @property
    def client(self) -> RerankClient:
        """The endpoint's client (opened on first use).

        Raises
        ------
        RerankError
            No URL was given.
        """
        with self._lock:
            if self._client is None:
                if self.url is None:
                    raise RerankError(
                        f"the rerank score ({self._identity()}) needs the reranker's URL: pass "
                        "--rerank-url URL (Python: url=...); a saved filter records the API "
                        "kind and model, never the URL.")
                from ..rerank.client import RerankClient

                self._client = RerankClient(self.url, api=self.api, model=self.model,
                                            **self._client_args)
            return self._client

    @property
    def usage(self) -> dict[str, float | int]:
        """The client's totals: ``n_requests``, ``n_pairs_sent``, ``n_cache_hits``,
        ``n_retries``, ``seconds`` (all 0 before the first call)."""
        if self._client is None:
            return {"n_requests": 0, "n_pairs_sent": 0, "n_cache_hits": 0, "n_retries": 0,
                    "seconds": 0.0}
        return self._client.usage

    @property
    def answered_model(self) -> str | None:
        """The model the endpoint's answers name (vLLM, Jina), once one did; else None."""
        return None if self._client is None else self._client.answered_model

    @property
    def identity_note(self) -> str | None:
        """A note when the endpoint answered with another model than the spec's; else None."""
        answered = self.answered_model
        if answered is None or self.model is None or answered == self.model:
            return None
        return (f"the reranker at {self.url} answered with model {answered!r}, but this "
                f"filter's score is model {self.model!r} ({self.api} API): a threshold "
                "calibrated on one reranker does not hold for another; recalibrate, or point "
                "--rerank-url at the calibrated model.")

    def endpoint_note(self) -> str | None:
        """:attr:`identity_note`: the endpoint answered with another model (see
        :meth:`Scorer.endpoint_note`)."""
        return self.identity_note

    def _identity(self) -> str:
        return f"{self.api} API" + (f", model {self.model}" if self.model else "")

    def _check_identity(self) -> None:
        note = self.identity_note
        if note is not None and not self._warned:
            self._warned = True
            logger.warning("%s", note)

    def close(self) -> None:
        """Close the client (its connections, and a cache file it opened)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "rerank", "api", "model"}``: the endpoint's identity, never its URL
        or key."""
        return {"scorer": self.name, "api": self.api, "model": self.model}

    # -------------------------------------------------------------- scoring
    def _scores(self, items: Sequence[tuple[str, str]], *, progress: bool) -> np.ndarray:
        relevance = self.client.rerank_pairs(items, progress=progress)
        self._check_identity()
        return -relevance

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets, each on its own; see :meth:`Scorer.score_batch`.

        Raises
        ------
        RerankError
            No URL, or the endpoint failed (the message names the URL and the status).
        RerankResponseError
            An answer that is not the API's shape: never a score.
        """
        if isinstance(snippets, str):
            raise TypeError("snippets is a single string; pass a list of str, e.g. [text].")
        return self._scores([(query, s) for s in snippets], progress=False)

    def prepare(self, query: str, snippets: Sequence[str]) -> None:
        """Ask the reranker for ``snippets`` ahead (a service does it a few dozen at a time
        between other requests' work); the later scoring call finds them remembered."""
        self._scores([(query, s) for s in snippets], progress=False)

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs: every query's unknown pairs in batches, requests in flight
        at once; each pair asked once (the cache remembers it)."""
        pairs = list(pairs)
        for i, pair in enumerate(pairs):
            if not isinstance(pair, Pair):
                raise TypeError(f"pairs[{i}] is {type(pair).__name__}, expected "
                                "ragsieve.types.Pair.")
        return self._scores([(p.query, p.text) for p in pairs], progress=progress)

    def __repr__(self) -> str:
        return f"RerankScorer(api={self.api!r}, model={self.model!r}, url={self.url!r})"


_PREFIX = "rerank_"


def reranker_from_options(options: Mapping[str, Any]) -> tuple[RerankScorer | None, dict[str, Any]]:
    """The reranker the ``rerank_*`` options (:data:`RERANK_SIGNAL_OPTIONS`) give, and the
    other options.

    A reranker is built when ``rerank_url`` or ``rerank_model`` is given (not None); the
    ``rerank_*`` options at their defaults, or ``rerank_cache`` alone (the shared
    ``--no-cache``), build none.

    Raises
    ------
    ValueError
        Another ``rerank_*`` option off its default without ``rerank_url`` nor
        ``rerank_model``.

    Examples
    --------
    >>> scorer, rest = reranker_from_options({"rerank_model": "m", "preset": "portable"})
    >>> scorer.spec(), rest
    ({'scorer': 'rerank', 'api': 'cohere', 'model': 'm'}, {'preset': 'portable'})
    >>> reranker_from_options({"rerank_cache": False, "rerank_timeout": 60.0})
    (None, {})
    """
    own = {k.removeprefix(_PREFIX): v for k, v in options.items() if k.startswith(_PREFIX)}
    rest = {k: v for k, v in options.items() if not k.startswith(_PREFIX)}
    if own.get("url") is None and own.get("model") is None:
        defaults = {o.name: o.default for o in RerankScorer.declared_options}
        stray = sorted(f"rerank_{k}" for k, v in own.items()
                       if k != "cache" and (k not in defaults or v != defaults[k]))
        if stray:
            raise ValueError(f"{', '.join(stray)} given without rerank_url or rerank_model "
                             "(--rerank-url / --rerank-model): they set up a reranker signal, "
                             "and none was named.")
        return None, rest
    return RerankScorer(**own), rest


def given_reranker(rerank: Any, keywords: Mapping[str, Any]) -> Any:
    """The user's reranker: ``rerank`` (a scorer or spec), or the one the ``rerank_*``
    ``keywords`` name (:func:`reranker_from_options`); None when neither gives one. The
    ``build`` of :data:`RERANK_PACK`: how the flat options become the ``rerank`` keyword's
    value.

    Raises
    ------
    ValueError
        Both give one, or the keywords are set without naming a reranker.
    """
    named, _ = reranker_from_options(keywords)
    if named is not None and rerank is not None:
        raise ValueError("the reranker is given twice: as rerank and by the rerank_* "
                         "options (--rerank-url, --rerank-model); give one.")
    return rerank if rerank is not None else named


#: The ``rerank_*`` options packed into the reranker of the ``rerank`` keyword of a fused
#: score and ``auto`` (:func:`given_reranker`; :func:`~ragsieve.scoring.options.pack_options`).
RERANK_PACK = OptionPack("rerank", given_reranker)

#: The reranker's options as the fused score (``best``) and ``auto`` take them, to add it as
#: a signal: ``rerank_<name>`` (its ``model`` is not the base embedder's), the same flags
#: (``--rerank-url``, ``--rerank-model``, ``--rerank-api``, ...); each a field of the
#: reranker their ``rerank`` keyword takes (:data:`RERANK_PACK`).
RERANK_SIGNAL_OPTIONS: tuple[ScorerOption, ...] = tuple(
    replace(o, name=f"{_PREFIX}{o.name}", help=o.help.replace(
        "scorer rerank:", "scorer rerank, or a signal of best / auto:"), pack=RERANK_PACK)
    for o in RerankScorer.declared_options)
