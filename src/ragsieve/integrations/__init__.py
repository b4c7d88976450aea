"""Drop-in components for RAG frameworks.

Each framework module imports its framework lazily, so this package imports without them:

- :mod:`ragsieve.integrations.langchain` -- ``ConformalCompressor``, a LangChain
  ``BaseDocumentCompressor`` (``pip install 'ragsieve[langchain]'``).
- :mod:`ragsieve.integrations.llamaindex` -- ``ConformalPostprocessor``, a LlamaIndex
  ``BaseNodePostprocessor`` (``pip install 'ragsieve[llamaindex]'``).
- :mod:`ragsieve.integrations.haystack` -- ``ConformalRanker``, a Haystack component
  (``pip install 'ragsieve[haystack]'``); it also sets a higher-is-better ``Document.score``
  and returns the removed documents and what was decided beside the kept ones.

What they share, one module per job (the names are re-exported here):

- :mod:`~ragsieve.integrations.filtering` -- documents to filter items, the one
  filter-and-copy path (:func:`filter_documents`), the ``score_source`` check.
- :mod:`~ragsieve.integrations.metadata` -- the keys a kept document carries (score,
  threshold and rule in the score's own units, mode, p-value, spans) and its pruned text.
- :mod:`~ragsieve.integrations.empty_lists` -- why the rule kept nothing, reported once and
  then counted (:class:`EmptyListLog`).
- :mod:`~ragsieve.integrations.native` -- filtering on the framework's native score.
- :mod:`~ragsieve.integrations.retrieval` -- calibrating through the deployed retriever.
- :mod:`~ragsieve.integrations.loading` -- ``from_file``: an artifact and its keywords.
- :mod:`~ragsieve.integrations.adapter` -- ``FrameworkAdapter``, the components' base.
"""

from ragsieve.integrations.empty_lists import (
    EmptyListLog,
    EmptyListStats,
    empty_reason,
    report_result,
)
from ragsieve.integrations.filtering import (
    SCORE_SOURCES,
    Copies,
    DocumentFields,
    check_documents,
    check_score_source,
    filter_documents,
    filter_items,
)
from ragsieve.integrations.loading import (
    POLICY_KEYS,
    load_filter,
    scorer_option_names,
    split_options,
)
from ragsieve.integrations.metadata import (
    KEEP_IF_KEY,
    LISTS_KEY,
    MODE_KEY,
    NOTE_KEY,
    ORIGINAL_LENGTH_KEY,
    P_VALUE_KEY,
    SCORE_KEY,
    SPANS_KEY,
    THRESHOLD_KEY,
    kept_metadata,
    pruned_text,
)
from ragsieve.integrations.native import calibrate_native, native_filter, native_pairs
from ragsieve.integrations.retrieval import (
    DOC_ID_KEYS,
    Retrieval,
    RetrievedDoc,
    calibrate_through,
    document_ids,
    retrieval_run,
    retrieve_pairs,
)

__all__ = [
    "DOC_ID_KEYS",
    "KEEP_IF_KEY",
    "LISTS_KEY",
    "MODE_KEY",
    "NOTE_KEY",
    "ORIGINAL_LENGTH_KEY",
    "POLICY_KEYS",
    "P_VALUE_KEY",
    "SCORE_KEY",
    "SCORE_SOURCES",
    "SPANS_KEY",
    "THRESHOLD_KEY",
    "Copies",
    "DocumentFields",
    "EmptyListLog",
    "EmptyListStats",
    "Retrieval",
    "RetrievedDoc",
    "calibrate_native",
    "calibrate_through",
    "check_documents",
    "check_score_source",
    "document_ids",
    "empty_reason",
    "filter_documents",
    "filter_items",
    "kept_metadata",
    "load_filter",
    "native_filter",
    "native_pairs",
    "pruned_text",
    "report_result",
    "retrieval_run",
    "retrieve_pairs",
    "scorer_option_names",
    "split_options",
]
