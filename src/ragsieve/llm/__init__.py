"""LLM access: one OpenAI-compatible client, its cache, the local default model, prompts.

* :mod:`~ragsieve.llm.client` -- ``LLMClient`` (retries, bounded concurrency) and
  ``LLMCache`` (persistent SQLite reply cache: killed jobs resume).
* :mod:`~ragsieve.llm.local` -- ``LocalLLMServer``: Gemma 3 270M (GGUF from a PyPI wheel)
  on xllamacpp, OpenAI-compatible, on 127.0.0.1.
* :mod:`~ragsieve.llm.connect` -- ``connect()``: an endpoint, or the local default.
* :mod:`~ragsieve.llm.prompts` -- versioned prompts and strict parsers.
* :mod:`~ragsieve.llm.judge` -- ``RelevanceJudge``: logprob, rating and yes/no judgements.
* :mod:`~ragsieve.llm.injection` -- how far injected instructions move judgements.

httpx and xllamacpp are imported only when a client or server is created.
"""

from .cache import LLMCache
from .client import Completion, LLMClient
from .connect import LLMConnection, connect, default_llm_cache_path
from .judge import JUDGE_MODES, Judgement, RelevanceJudge
from .local import DEFAULT_LOCAL_MODEL, LOCAL_MODELS, LocalLLMServer, local_model_path

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "JUDGE_MODES",
    "LOCAL_MODELS",
    "Completion",
    "Judgement",
    "LLMCache",
    "LLMClient",
    "LLMConnection",
    "LocalLLMServer",
    "RelevanceJudge",
    "connect",
    "default_llm_cache_path",
    "local_model_path",
]
