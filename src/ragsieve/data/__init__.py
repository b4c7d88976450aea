"""Datasets as (query, snippet) pairs: the generic JSONL format, loaders, splits.

* :mod:`~ragsieve.data.jsonl` -- read/write/validate the generic JSONL format.
* :mod:`~ragsieve.data.paths` -- data directory, cache, verified downloads.
* :mod:`~ragsieve.data.xquad`, :mod:`~ragsieve.data.selqa` -- built-in datasets.
* :mod:`~ragsieve.data.registry` -- :func:`load_dataset` by name.
* :mod:`~ragsieve.data.splits` -- group-disjoint calibration/test splits.
* :mod:`~ragsieve.data.queries` -- labelled queries and the labelled pairs of their
  retrieved lists (``ragsieve retrieve``).

The format is described in ``docs/data-format.md``.
"""

from __future__ import annotations

from ragsieve.data.jsonl import (
    describe_pairs,
    fingerprint_pairs,
    group_by_query,
    iter_pairs,
    read_pairs,
    write_pairs,
)
from ragsieve.data.paths import cache_dir, data_dir, resolve_dataset_file, sha256_file
from ragsieve.data.queries import (
    LabelledQuery,
    ListSummary,
    describe_lists,
    list_pairs,
    read_queries,
)
from ragsieve.data.registry import available_datasets, load_dataset
from ragsieve.data.selqa import SELQA_SPLITS, load_selqa
from ragsieve.data.splits import group_splits, sample_queries
from ragsieve.data.xquad import XQUAD_LANGUAGES, load_xquad

__all__ = [
    "SELQA_SPLITS",
    "XQUAD_LANGUAGES",
    "LabelledQuery",
    "ListSummary",
    "available_datasets",
    "cache_dir",
    "data_dir",
    "describe_lists",
    "describe_pairs",
    "fingerprint_pairs",
    "group_by_query",
    "group_splits",
    "iter_pairs",
    "list_pairs",
    "load_dataset",
    "load_selqa",
    "load_xquad",
    "read_pairs",
    "read_queries",
    "resolve_dataset_file",
    "sample_queries",
    "sha256_file",
    "write_pairs",
]
