"""SelQA answer sentence selection as labelled (query, snippet) pairs.

Every SelQA question comes with the sentences (``candidates``) of one Wikipedia
section and the indices of the answer sentences (``answers``). The sentences are
joined with single spaces into one document ``"{article}/{section}"`` which is cut
into snippets by a :class:`~ragsieve.chunking.Chunker`; the question's retrieved list
is all snippets of that document.

Labelling rule
--------------
A snippet is relevant iff, for some non-empty answer sentence (whitespace-trimmed
span ``[a, b)``), the snippet shares at least half of the shorter of the two::

    overlap >= min(b - a, len(snippet)) / 2

For the usual answer sentence (shorter than a snippet) this reads "the snippet holds
at least half of the answer sentence". Plain any-overlap would also label the
neighbouring snippet that only shares a few words through the chunk overlap. The
``min`` covers answer sentences longer than a snippet: the windows cut from inside
such a sentence are mostly answer text and are relevant.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragsieve.chunking import Chunker
from ragsieve.data.paths import resolve_dataset_file
from ragsieve.data.question_pairs import SnippetFn, question_pairs, read_json
from ragsieve.errors import DataError
from ragsieve.types import Pair, Snippet

__all__ = ["SELQA_SHA256", "SELQA_SPLITS", "is_relevant", "load_selqa", "selqa_file"]

logger = logging.getLogger(__name__)

SELQA_SPLITS: tuple[str, ...] = ("train", "dev", "test")
"""Splits of SelQA answer sentence selection (emorynlp/selqa)."""

SELQA_URL = "https://raw.githubusercontent.com/emorynlp/selqa/master/ass/selqa-ass-{split}.json"

SELQA_SHA256: Mapping[str, str] = {
    # Upstream commit fef3d6a; splits not listed download with a logged warning.
    "dev": "b4e6687e44a30b486e24d2b06aa3012ec07d61145f3521f35b7d49daae3e0ca4",
}
"""Pinned SHA-256 of the SelQA files we have verified."""


def selqa_file(
    split: str = "dev",
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Path:
    """Path of ``selqa-ass-{split}.json``, downloading it into the cache if needed."""
    if split not in SELQA_SPLITS:
        raise ValueError(f"split == {split!r}, must be one of {', '.join(SELQA_SPLITS)}.")
    return resolve_dataset_file(
        f"selqa/selqa-ass-{split}.json",
        url=SELQA_URL.format(split=split),
        sha256=SELQA_SHA256.get(split),
        data_dir=data_dir,
        download=download,
    )


def _join(candidates: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """Join sentences with single spaces; return the text and each sentence's trimmed span."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for sentence in candidates:
        lead = len(sentence) - len(sentence.lstrip())
        core = len(sentence.strip())
        spans.append((pos + lead, pos + lead + core))
        pos += len(sentence) + 1
    return " ".join(candidates), spans


def is_relevant(snippet: Snippet, answer_spans: list[tuple[int, int]]) -> bool:
    """The SelQA labelling rule (see the module docstring)."""
    length = snippet.end - snippet.start
    for a, b in answer_spans:
        shared = min(b, snippet.end) - max(a, snippet.start)
        if shared > 0 and 2 * shared >= min(b - a, length):
            return True
    return False


def _question(item: Any, where: str) -> tuple[str, str, str, str, list[str], list[int]]:
    if not isinstance(item, dict):
        raise DataError(f"{where}: expected an object, got {type(item).__name__}.")
    try:
        q, topic = item["question"], item["topic"]
        article, section = item["article"], item["section"]
        candidates, answers = item["candidates"], item["answers"]
    except KeyError as exc:
        raise DataError(f"{where}: missing key {exc.args[0]!r}.") from None
    if not all(isinstance(v, str) for v in (q, topic, article, section)) or not q.strip():
        raise DataError(f"{where}: question, topic, article and section must be strings.")
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise DataError(f"{where}: 'candidates' must be a list of strings.")
    if not isinstance(answers, list) or not all(
        isinstance(i, int) and 0 <= i < len(candidates) for i in answers
    ):
        raise DataError(
            f"{where}: 'answers' == {answers!r}, must be indices into the "
            f"{len(candidates)} candidates."
        )
    return q, topic, article, section, candidates, answers


def load_selqa(
    split: str = "dev",
    *,
    data_dir: str | os.PathLike[str] | None = None,
    chunker: Chunker | SnippetFn | None = None,
    download: bool = True,
) -> list[Pair]:
    """Load SelQA answer sentence selection as labelled (query, snippet) pairs.

    Parameters
    ----------
    split : {"train", "dev", "test"}, default "dev"
    data_dir : str or os.PathLike, optional
        Data directory holding ``selqa/selqa-ass-{split}.json``.
    chunker : Chunker or callable (text, doc_id) -> list of Snippet, optional
        Cuts each section into snippets; defaults to ``Chunker()`` (500 characters, 100
        overlap).
    download : bool, default True
        Whether the file may be downloaded when it is not found locally.

    Returns
    -------
    list of Pair
        Grouped by question in file order. ``query_id`` is ``"selqa-{split}-{i}"``,
        ``group`` the topic; ``meta`` holds ``topic``, ``article``, ``section``,
        ``doc_id``, ``start`` and ``end``. Labels follow the rule in the module
        docstring.

    Raises
    ------
    ValueError
        For an unknown split.
    DataError
        When the file is missing (and cannot be downloaded) or malformed.
    """
    chunk: SnippetFn = Chunker() if chunker is None else chunker
    path = selqa_file(split, data_dir=data_dir, download=download)
    raw = read_json(path)
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{path}: expected a non-empty JSON list of questions.")
    sections: dict[str, tuple[str, list[Snippet]]] = {}
    pairs: list[Pair] = []
    no_answer = no_relevant = 0
    for i, item in enumerate(raw):
        where = f"{path}: question #{i}"
        question, topic, article, section, candidates, answers = _question(item, where)
        doc_id = f"{article}/{section}"
        text, spans = _join(candidates)
        snippets = _section_snippets(sections, doc_id, text, chunk, where)
        answer_spans = [spans[j] for j in answers if spans[j][1] > spans[j][0]]
        no_answer += not answer_spans
        head = {"topic": topic, "article": article, "section": section, "doc_id": doc_id}
        listed = question_pairs(
            f"selqa-{split}-{i}", question, topic, snippets,
            relevant=lambda snip: is_relevant(snip, answer_spans),  # noqa: B023 (called here)
            meta=lambda snip: {**head, "start": snip.start, "end": snip.end},  # noqa: B023
        )
        no_relevant += not any(p.relevant for p in listed)
        pairs.extend(listed)
    if no_relevant:
        logger.warning(
            "SelQA %s: %d of %d questions have no relevant snippet (%d have no non-empty "
            "answer sentence)",
            split,
            no_relevant,
            len(raw),
            no_answer,
        )
    logger.debug("SelQA %s: %d pairs, %d questions", split, len(pairs), len(raw))
    return pairs


def _section_snippets(
    sections: dict[str, tuple[str, list[Snippet]]], doc_id: str, text: str, chunk: SnippetFn,
    where: str,
) -> list[Snippet]:
    """The snippets of the section ``doc_id`` (joined as ``text``), cut once and kept in
    ``sections`` for the section's later questions.

    Raises
    ------
    DataError
        The section is empty, or an earlier question gave it other sentences.
    """
    if not text.strip():
        raise DataError(f"{where}: all candidate sentences are empty.")
    if doc_id in sections and sections[doc_id][0] != text:
        raise DataError(
            f"{where}: section {doc_id!r} has different sentences than an earlier "
            "question; snippet ids would collide."
        )
    return sections.setdefault(doc_id, (text, chunk(text, doc_id)))[1]
