"""What the SQuAD-like loaders share: reading their JSON file and turning one question's
retrieved list into labelled pairs.

:mod:`~ragsieve.data.xquad` and :mod:`~ragsieve.data.selqa` each read a file of questions
over documents, cut the documents into snippets and label every snippet of a question's
list by their own rule; :func:`question_pairs` writes the pairs of one question, the same
way for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragsieve.errors import DataError
from ragsieve.types import Pair, Snippet

__all__ = ["SnippetFn", "question_pairs", "read_json"]

SnippetFn = Callable[[str, str], list[Snippet]]
"""A chunker as the loaders take it: ``(text, doc_id) -> list of Snippet``."""


def read_json(path: Path) -> Any:
    """The JSON value in the UTF-8 file ``path``.

    Raises
    ------
    DataError
        The file cannot be read or is not UTF-8 JSON.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as UTF-8 JSON ({exc}).") from exc


def question_pairs(
    query_id: str,
    query: str,
    group: str,
    snippets: Sequence[Snippet],
    *,
    relevant: Callable[[Snippet], bool],
    meta: Callable[[Snippet], dict[str, Any]],
) -> list[Pair]:
    """One question's retrieved list as labelled pairs, one a snippet, in list order.

    Parameters
    ----------
    query_id, query, group : str
        The question's id, text and topic (``Pair.group``).
    snippets : sequence of Snippet
        The question's retrieved list.
    relevant : callable
        ``relevant(snippet)``: the loader's labelling rule.
    meta : callable
        ``meta(snippet)``: the pair's ``meta``.
    """
    return [
        Pair(
            query_id=query_id,
            query=query,
            snippet_id=snip.snippet_id,
            text=snip.text,
            relevant=int(relevant(snip)),
            group=group,
            meta=meta(snip),
        )
        for snip in snippets
    ]
