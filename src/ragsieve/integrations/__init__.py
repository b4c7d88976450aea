"""Drop-in components for RAG frameworks.

Each submodule imports its framework lazily, so this package imports without them:

- :mod:`ragsieve.integrations.langchain` -- ``ConformalCompressor``, a LangChain
  ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).
- :mod:`ragsieve.integrations.llamaindex` -- ``ConformalPostprocessor``, a LlamaIndex
  ``BaseNodePostprocessor`` (``pip install 'ragsieve[llamaindex]'``).

Both keep exactly the snippets that :meth:`ragsieve.ConformalFilter.filter` keeps, in
their original order, as new objects (the caller's inputs are never mutated), and
record the nonconformity score and the threshold in the metadata under
``"ragsieve_score"`` and ``"ragsieve_threshold"``.
"""

from __future__ import annotations

__all__: list[str] = []

SCORE_KEY = "ragsieve_score"
THRESHOLD_KEY = "ragsieve_threshold"
