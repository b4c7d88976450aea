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

import os
from typing import Any, Self

__all__: list[str] = []

SCORE_KEY = "ragsieve_score"
THRESHOLD_KEY = "ragsieve_threshold"


class FromFileMixin:
    """``from_file`` for a framework component with a ``filter`` field."""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **scorer_options: Any) -> Self:
        """Load a saved filter artifact.

        Parameters
        ----------
        path : path-like
            JSON artifact written by ``ConformalFilter.save``.
        **scorer_options
            Passed to ``ConformalFilter.load(scorer_options=...)``, e.g. ``cache_dir=...``.
        """
        from ragsieve.filter import ConformalFilter

        return cls(filter=ConformalFilter.load(path, scorer_options=scorer_options or None))  # type: ignore[call-arg]
