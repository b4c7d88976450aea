"""Connect to an LLM: a given OpenAI-compatible endpoint, or the embedded local default.

``connect()`` with no ``base_url`` (and no ``RAGSIEVE_LLM_BASE_URL``) starts the local
default model (Gemma 3 270M base on xllamacpp, 127.0.0.1, a free port) for the lifetime
of the connection, like the embedding model ships with the package: every command that
needs an LLM works offline, and says that it started one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from .client import LLMClient
    from .local import LocalLLMServer

__all__ = ["LLMConnection", "connect", "default_llm_cache_path"]

logger = logging.getLogger(__name__)


def default_llm_cache_path() -> Path:
    """``$RAGSIEVE_CACHE/llm-cache.sqlite`` (default ``~/.cache/ragsieve/llm-cache.sqlite``)."""
    from ..data.paths import cache_dir

    return cache_dir() / "llm-cache.sqlite"


@dataclass
class LLMConnection:
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    *,
    base_url: str | None = None,
    model: str | None = None,
    style: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    cache: bool | str | os.PathLike[str] = True,
    concurrency: int | None = None,
    threads: int | None = None,
    timeout: float = 120.0,
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
    api_key_env : str
        Environment variable holding the API key (sent as a Bearer token).
    cache : bool or path
        Persistent reply cache: True for :func:`default_llm_cache_path`, a path, or False.
    concurrency : int, optional
        Requests in flight (default: 1 for the local model, 4 for endpoints).
    threads : int, optional
        CPU threads of the local model (default ``RAGSIEVE_LLM_THREADS`` or 1).
    timeout : float
        Per-request timeout in seconds.

    Returns
    -------
    LLMConnection
        Close it (or use it as a context manager) to stop a local server.
    """
    from .client import LLMCache, LLMClient

    base_url = base_url or os.environ.get("RAGSIEVE_LLM_BASE_URL") or None
    model = model or os.environ.get("RAGSIEVE_LLM_MODEL") or None
    cache_obj = None
    if cache is True:
        cache_obj = LLMCache(default_llm_cache_path())
    elif cache:
        cache_obj = LLMCache(cache)  # type: ignore[arg-type]
    server = None
    if base_url is None:
        from .local import DEFAULT_LOCAL_MODEL, LocalLLMServer

        server = LocalLLMServer(model or DEFAULT_LOCAL_MODEL, threads=threads).start()
        base_url, model = server.base_url, server.model_name
        style = style or server.prompt_style
        concurrency = concurrency or 1
        logger.warning(
            "no LLM base_url given: started the local default model %s at %s for this run",
            model, base_url,
        )
    elif model is None:
        raise ValueError(
            f"base_url == {base_url!r} but no model name: pass model= (CLI --llm-model) or set "
            "RAGSIEVE_LLM_MODEL."
        )
    style = style or "chat"
    if style not in ("completion", "chat"):
        raise ValueError(f"style == {style!r}, must be 'completion' or 'chat'.")
    client = LLMClient(
        base_url, model, api_key_env=api_key_env, cache=cache_obj,
        concurrency=concurrency or 4, timeout=timeout,
    )
    return LLMConnection(client=client, model=model, style=style, base_url=base_url, server=server)
