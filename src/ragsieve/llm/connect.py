"""Connect to an LLM: a given OpenAI-compatible endpoint, or the embedded local default.

``connect()`` with no ``base_url`` (and no ``RAGSIEVE_LLM_BASE_URL``) starts the local
default model (Gemma 3 270M base on xllamacpp, 127.0.0.1, a free port) for the lifetime
of the connection, like the embedding model ships with the package: every command that
needs an LLM works offline, and says that it started one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._closing import Closing
from .._paths import cache_dir

if TYPE_CHECKING:
    from .client import LLMClient
    from .local import LocalLLMServer

__all__ = ["LLMConnection", "LLMTarget", "connect", "default_llm_cache_path", "resolve_target"]

logger = logging.getLogger(__name__)


def default_llm_cache_path() -> Path:
    """``$RAGSIEVE_CACHE/llm-cache.sqlite`` (default ``~/.cache/ragsieve/llm-cache.sqlite``)."""
    return cache_dir() / "llm-cache.sqlite"


@dataclass(frozen=True)
class LLMTarget:
    """What :func:`connect` would open, worked out without starting or opening anything.

    Attributes
    ----------
    base_url : str or None
        The endpoint; ``None`` means the local default model is started.
    model : str or None
        The model name sent with each request (for the local model, the name its server
        answers to, e.g. ``"gemma3-270m"``); ``None`` only for an endpoint given without
        a model, which :meth:`require_model` and :func:`connect` reject.
    style : str
        Prompt style, ``"completion"`` or ``"chat"``.
    local_model : str or os.PathLike or None
        The local model to start (a key of ``LOCAL_MODELS`` or a ``.gguf`` path); ``None``
        for an endpoint.
    """

    base_url: str | None
    model: str | None
    style: str
    local_model: str | os.PathLike[str] | None = None

    @property
    def is_local(self) -> bool:
        """True when :func:`connect` would start the local model."""
        return self.local_model is not None

    def require_model(self) -> str:
        """The model name; ``ValueError`` for an endpoint given without one."""
        if self.model is None:
            raise ValueError(
                f"base_url == {self.base_url!r} but no model name: pass model= (CLI --llm-model) "
                "or set RAGSIEVE_LLM_MODEL."
            )
        return self.model


def resolve_target(
    *,
    base_url: str | None = None,
    model: str | os.PathLike[str] | None = None,
    style: str | None = None,
) -> LLMTarget:
    """Resolve :func:`connect`'s arguments and environment without connecting.

    Parameters
    ----------
    base_url, model, style
        As for :func:`connect` (``RAGSIEVE_LLM_BASE_URL`` / ``RAGSIEVE_LLM_MODEL`` fill in
        what is not given).

    Returns
    -------
    LLMTarget
        The endpoint, model name and prompt style :func:`connect` uses with these
        arguments; for the local model, the name and style its server will have.

    Raises
    ------
    ValueError
        For a style other than ``"completion"`` or ``"chat"``.

    Examples
    --------
    >>> resolve_target(base_url="http://127.0.0.1:8080/v1", model="m")
    LLMTarget(base_url='http://127.0.0.1:8080/v1', model='m', style='chat', local_model=None)
    """
    base_url = base_url or os.environ.get("RAGSIEVE_LLM_BASE_URL") or None
    model = model or os.environ.get("RAGSIEVE_LLM_MODEL") or None
    local_model: str | os.PathLike[str] | None = None
    if base_url is None:
        from .local import DEFAULT_LOCAL_MODEL, LOCAL_MODELS

        local_model = model or DEFAULT_LOCAL_MODEL
        # the same naming as LocalLLMServer: a known key, else the .gguf file's stem
        known = LOCAL_MODELS.get(local_model) if isinstance(local_model, str) else None
        model = known.name if known else Path(local_model).stem
        style = style or (known.prompt_style if known else "completion")
    style = style or "chat"
    if style not in ("completion", "chat"):
        raise ValueError(f"style == {style!r}, must be 'completion' or 'chat'.")
    return LLMTarget(
        base_url=base_url, model=None if model is None else str(model), style=style,
        local_model=local_model,
    )


@dataclass
class LLMConnection(Closing):
    """A client, the prompt style to use with its model, and the local server it owns."""

    client: LLMClient
    model: str
    style: str
    base_url: str
    server: LocalLLMServer | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.server is not None

    def close(self) -> None:
        """Close the client and stop the local server if this connection started it."""
        self.client.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


def connect(
    *,
    base_url: str | None = None,
    model: str | None = None,
    style: str | None = None,
    cache: bool | str | os.PathLike[str] = True,
    concurrency: int | None = None,
    **settings: Any,
) -> LLMConnection:
    """Open an LLM connection.

    Parameters
    ----------
    base_url : str, optional
        OpenAI-style base URL including ``/v1`` (vLLM, Ollama, llama.cpp, OpenAI).
        Defaults to ``RAGSIEVE_LLM_BASE_URL``; when neither is set, the local default
        model is started on 127.0.0.1.
    model : str, optional
        Model name sent with each request (``RAGSIEVE_LLM_MODEL``); required with a
        ``base_url``. Without one it names the local model (``gemma3-270m`` default,
        ``smollm2-135m``, or a ``.gguf`` path).
    style : {"completion", "chat"}, optional
        Prompt style; defaults to the local model's style, or ``chat`` for endpoints.
    cache : bool or path
        Persistent reply cache: True for :func:`default_llm_cache_path`, a path, or False.
    concurrency : int, optional
        Requests in flight (default: 1 for the local model, 4 for endpoints).
    **settings
        The client's call settings (:class:`~ragsieve._http.CallPolicy`, defaults
        :data:`~ragsieve.llm.client.LLM_CALLS`: ``calls=`` whole, or ``api_key_env``, the
        environment variable holding the API key, sent as a Bearer token; ``timeout``, the
        per-request timeout in seconds; ``max_retries``, ``backoff``, ``max_backoff``) and
        the local model's (:class:`~ragsieve.llm.local.LocalRuntime`: ``runtime=`` whole, or
        ``threads``, its CPU threads, default ``RAGSIEVE_LLM_THREADS`` or 1; ``n_ctx``, its
        context window in tokens, default 4096, ignored for an endpoint, whose window is
        the server's; ``n_parallel``).

    Returns
    -------
    LLMConnection
        Close it (or use it as a context manager) to stop a local server.

    Raises
    ------
    TypeError
        A keyword that is none of these.
    """
    from .client import LLM_CALLS, LLMCache, LLMClient
    from .local import LocalRuntime

    runtime_names = {f.name for f in fields(LocalRuntime)} | {"runtime"}
    if settings.get("n_ctx", 0) is None:  # None: the local model's default window
        settings = {k: v for k, v in settings.items() if k != "n_ctx"}
    runtime = LocalRuntime.from_keywords(
        {k: v for k, v in settings.items() if k in runtime_names}, owner="connect()")
    calls = LLM_CALLS.from_keywords(
        {k: v for k, v in settings.items() if k not in runtime_names}, owner="connect()")
    target = resolve_target(base_url=base_url, model=model, style=style)
    url, name = target.base_url or "", target.model or ""
    if target.base_url is not None:
        name = target.require_model()
    cache_obj = None
    if cache is True:
        cache_obj = LLMCache(default_llm_cache_path())
    elif cache:
        cache_obj = LLMCache(cache)  # type: ignore[arg-type]
    server = None
    if target.local_model is not None:
        from .local import LocalLLMServer

        server = LocalLLMServer(target.local_model, runtime=runtime).start()
        url, name = server.base_url, server.model_name
        concurrency = concurrency or 1
        logger.warning(
            "no LLM base_url given: started the local default model %s at %s for this run",
            name, url,
        )
    client = LLMClient(url, name, cache=cache_obj,
                       calls=replace(calls, concurrency=concurrency or calls.concurrency))
    return LLMConnection(client=client, model=name, style=target.style, base_url=url,
                         server=server)
