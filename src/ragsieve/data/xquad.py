"""XQuAD (SQuAD v1.1 format) as labelled (query, snippet) pairs.

Each paragraph is a document ``"{title}/{paragraph_index}"`` cut into snippets by a
:class:`~ragsieve.chunking.Chunker`. A question's retrieved list is every snippet of
its article (``context="article"``) or of its own paragraph (``context="paragraph"``).
A snippet is relevant iff it lies in the question's own paragraph and its
``[start, end)`` overlaps an answer span ``[answer_start, answer_start + len(text))``; its
``meta["evidence"]`` holds those spans in its own offsets, so the sentence unit's evidence
sentence is the one the answer stands in (:mod:`ragsieve.units`).

XQuAD is parallel: every language holds the same questions (the same ids) over the same
articles and paragraphs, in the same order. ``load_xquad(language, query_language=q)``
therefore asks the questions of language ``q`` over the articles of ``language`` (the
answers and relevance are the article language's own), after checking that the two files
align.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragsieve.chunking import Chunker
from ragsieve.data.paths import resolve_dataset_file
from ragsieve.data.question_pairs import SnippetFn, question_pairs, read_json
from ragsieve.errors import DataError
from ragsieve.types import Pair, Snippet

__all__ = [
    "XQUAD_LANGUAGES",
    "XQUAD_SHA256",
    "load_xquad",
    "xquad_file",
]

logger = logging.getLogger(__name__)

XQUAD_LANGUAGES: tuple[str, ...] = (
    "ar", "de", "el", "en", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh",
)  # fmt: skip
"""Languages of XQuAD (google-deepmind/xquad)."""

XQUAD_URL = "https://raw.githubusercontent.com/google-deepmind/xquad/master/xquad.{language}.json"

XQUAD_SHA256: Mapping[str, str] = {
    # Upstream commit 7d30520; languages not listed download with a logged warning.
    "de": "990b5d746746ed65ed4702ea5f35f99ffa4e2f1c390c07d003642acd937916f9",
    "en": "e4c57d1c9143aaa1c5d265ba5987a65f4e69528d2a98f29d6e75019b10344f29",
    "es": "dcbae93ec3a9f4b9e78fd834a171d6f96c1a875e10e15b7530b7e4ef4971e37e",
    "zh": "691d0b3359bc6b8faa8de931dfdfe21d50a65861ae348e32a0d1a0190b0c8835",
}
"""Pinned SHA-256 of the XQuAD files we have verified."""

_CONTEXTS = ("article", "paragraph")


def _check_language(language: str) -> str:
    if language not in XQUAD_LANGUAGES:
        raise ValueError(f"language == {language!r}, must be one of {', '.join(XQUAD_LANGUAGES)}.")
    return language


def xquad_file(
    language: str = "en",
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Path:
    """Path of ``xquad.{language}.json``, downloading it into the cache if needed.

    See :func:`ragsieve.data.paths.resolve_dataset_file` for the lookup order.
    """
    language = _check_language(language)
    return resolve_dataset_file(
        f"xquad/xquad.{language}.json",
        url=XQUAD_URL.format(language=language),
        sha256=XQUAD_SHA256.get(language),
        data_dir=data_dir,
        download=download,
    )


def _read_squad(
    language: str, data_dir: str | os.PathLike[str] | None, download: bool
) -> tuple[Path, list[Any]]:
    """The path and the list of articles of ``xquad.{language}.json``."""
    path = xquad_file(language, data_dir=data_dir, download=download)
    raw = read_json(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise DataError(f"{path}: expected SQuAD v1.1 JSON with a 'data' list of articles.")
    return path, raw["data"]


def _article(path: Path, a_index: int, article: Any) -> tuple[str, list[Any]]:
    """An article's title and paragraphs."""
    try:
        return article["title"], article["paragraphs"]
    except (TypeError, KeyError):
        raise DataError(f"{path}: article #{a_index} lacks 'title' or 'paragraphs'.") from None


def _qa_ids(path: Path, doc_id: str, paragraph: Any) -> list[Any]:
    try:
        return [qa.get("id") for qa in paragraph["qas"]]
    except (TypeError, KeyError, AttributeError):
        raise DataError(f"{path}: paragraph {doc_id!r} lacks a 'qas' list of questions.") from None


def _parallel_questions(
    q_path: Path, q_articles: list[Any], c_path: Path, c_articles: list[Any]
) -> tuple[list[str], dict[str, str]]:
    """The question file's article titles and questions by id, after checking that it
    aligns with the article file: the same articles, paragraphs and question ids, in the
    same order.

    Raises
    ------
    DataError
        Naming the first article, paragraph or question where the two files differ.
    """
    mismatch = f"{q_path.name} and {c_path.name} are not parallel"
    if len(q_articles) != len(c_articles):
        raise DataError(f"{mismatch}: {len(q_articles)} articles in {q_path.name}, "
                        f"{len(c_articles)} in {c_path.name}.")
    titles: list[str] = []
    questions: dict[str, str] = {}
    for a_index, (q_article, c_article) in enumerate(zip(q_articles, c_articles, strict=True)):
        title, q_paragraphs = _article(q_path, a_index, q_article)
        c_title, c_paragraphs = _article(c_path, a_index, c_article)
        if len(q_paragraphs) != len(c_paragraphs):
            raise DataError(f"{mismatch}: article #{a_index} ({title!r} / {c_title!r}) has "
                            f"{len(q_paragraphs)} paragraphs in {q_path.name}, "
                            f"{len(c_paragraphs)} in {c_path.name}.")
        for p_index, (q_par, c_par) in enumerate(zip(q_paragraphs, c_paragraphs, strict=True)):
            doc_id = f"{c_title}/{p_index}"
            q_ids, c_ids = _qa_ids(q_path, doc_id, q_par), _qa_ids(c_path, doc_id, c_par)
            if q_ids != c_ids:
                raise DataError(f"{mismatch}: paragraph {doc_id!r} has question ids {q_ids} in "
                                f"{q_path.name}, {c_ids} in {c_path.name}.")
            for qa in q_par["qas"]:
                question = qa.get("question")
                if not isinstance(question, str) or not question.strip():
                    raise DataError(f"{q_path}: question {qa.get('id')!r} in {doc_id!r} needs a "
                                    "non-empty 'question'.")
                questions[str(qa.get("id"))] = question
        titles.append(title)
    return titles, questions


def _answer_spans(
    context: str, answers: Any, where: str, counts: dict[str, int]
) -> list[tuple[int, int]]:
    """Verified ``[start, end)`` spans of the answers in ``context``.

    A span whose text does not match the context at ``answer_start`` is moved to the
    occurrence of the answer text nearest to ``answer_start`` ("fixed"); an answer
    that does not occur at all is dropped.
    """
    if not isinstance(answers, list):
        raise DataError(f"{where}: 'answers' must be a list, got {type(answers).__name__}.")
    spans: list[tuple[int, int]] = []
    for answer in answers:
        try:
            text, start = answer["text"], answer["answer_start"]
        except (TypeError, KeyError):
            raise DataError(f"{where}: answer {answer!r} lacks 'text' or 'answer_start'.") from None
        if not isinstance(text, str) or not isinstance(start, int):
            raise DataError(f"{where}: answer {answer!r} has mistyped 'text' or 'answer_start'.")
        if not text.strip():
            counts["dropped"] += 1
            continue
        if context[start : start + len(text)] == text:
            spans.append((start, start + len(text)))
            continue
        hits, i = [], context.find(text)
        while i != -1:
            hits.append(i)
            i = context.find(text, i + 1)
        if hits:
            best = min(hits, key=lambda h: abs(h - start))
            spans.append((best, best + len(text)))
            counts["fixed"] += 1
        else:
            counts["dropped"] += 1
    return spans


def load_xquad(
    language: str = "en",
    *,
    query_language: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    context: str = "article",
    chunker: Chunker | SnippetFn | None = None,
    download: bool = True,
) -> list[Pair]:
    """Load XQuAD as labelled (query, snippet) pairs.

    Parameters
    ----------
    language : str, default "en"
        One of :data:`XQUAD_LANGUAGES`: the language of the articles (the snippets), their
        answers and so the relevance labels.
    query_language : str, optional
        The language the questions are asked in (default: ``language``). Another one gives
        the cross-language set: that language's questions (the same ids, XQuAD is
        parallel) over the articles of ``language``, with the labels of ``language``.
    data_dir : str or os.PathLike, optional
        Data directory holding ``xquad/xquad.{language}.json``.
    context : {"article", "paragraph"}, default "article"
        The retrieved list of a question: every snippet of its article, or only the
        snippets of its own paragraph.
    chunker : Chunker or callable (text, doc_id) -> list of Snippet, optional
        Defaults to ``Chunker()`` (500 characters, 100 overlap).
    download : bool, default True
        Whether the file may be downloaded when not found locally.

    Returns
    -------
    list of Pair
        Grouped by question in file order. ``query_id`` is ``"xquad-{language}-{id}"``
        (``"xquad-{query_language}2{language}-{id}"`` across languages), ``group`` the
        article title (the question file's), ``snippet_id``
        ``"{title}/{paragraph}:{start}-{end}"``; ``meta`` holds ``language`` (of the
        snippet), ``qa_id``, ``doc_id``, ``start``, ``end``, ``answers`` (the answer texts),
        for a relevant snippet ``evidence`` (the answer spans inside it, ``[start, end]`` in
        its text) and, across languages, ``query_language``.

    Raises
    ------
    ValueError
        For an unknown language or context.
    DataError
        When a file is missing (and cannot be downloaded) or not in SQuAD format, or
        (across languages) the two files do not align: the message names the first
        article, paragraph or question where they differ.
    """
    language = _check_language(language)
    query_language = language if query_language is None else _check_language(query_language)
    if context not in _CONTEXTS:
        raise ValueError(f"context == {context!r}, must be one of {', '.join(_CONTEXTS)}.")
    chunk: SnippetFn = Chunker() if chunker is None else chunker
    path, articles = _read_squad(language, data_dir, download)
    cross = query_language != language
    run = _Run(path=path, language=language,
               name=f"{query_language}2{language}" if cross else language,
               query_meta={"query_language": query_language} if cross else {})
    titles: list[str] | None = None
    if cross:
        q_path, q_articles = _read_squad(query_language, data_dir, download)
        titles, run.questions = _parallel_questions(q_path, q_articles, path, articles)
    pairs: list[Pair] = []
    for a_index, article in enumerate(articles):
        title, paragraphs = _article(path, a_index, article)
        group = title if titles is None else titles[a_index]
        chunked = _chunk_paragraphs(path, title, paragraphs, chunk)
        article_snippets = [s for par in chunked for s in par.snippets]
        for par in chunked:
            candidates = article_snippets if context == "article" else par.snippets
            for qa in par.qas:
                pairs.extend(_question_pairs(run, qa, par, candidates, group))
    if not pairs:
        raise DataError(f"{path}: no answerable questions found.")
    _log_counts(run, len(pairs))
    return pairs


@dataclass
class _Run:
    """What one :func:`load_xquad` call reads its questions with, and what it counts."""

    path: Path
    language: str
    name: str
    query_meta: dict[str, str]
    questions: dict[str, str] = field(default_factory=dict)  # across languages: by id
    counts: dict[str, int] = field(
        default_factory=lambda: {"fixed": 0, "dropped": 0, "unanswerable": 0, "no_relevant": 0})
    seen_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Paragraph:
    """A paragraph (the document ``doc_id``), its snippets and its questions."""

    doc_id: str
    text: str
    snippets: list[Snippet]
    qas: list[Any]


def _chunk_paragraphs(
    path: Path, title: str, paragraphs: list[Any], chunk: SnippetFn
) -> list[_Paragraph]:
    """An article's paragraphs, each cut into snippets."""
    chunked = []
    for p_index, paragraph in enumerate(paragraphs):
        doc_id = f"{title}/{p_index}"
        try:
            text, qas = paragraph["context"], paragraph["qas"]
        except (TypeError, KeyError):
            raise DataError(f"{path}: paragraph {doc_id!r} lacks 'context' or 'qas'.") from None
        chunked.append(_Paragraph(doc_id, text, chunk(text, doc_id), qas))
    return chunked


def _checked_question(run: _Run, qa: Any, doc_id: str) -> tuple[str, str, str]:
    """Where the question is (for messages), its id and its text, checked; the id is
    recorded as seen."""
    where = f"{run.path}: question {qa.get('id')!r} in {doc_id!r}"
    qa_id, question = qa.get("id"), qa.get("question")
    if not isinstance(qa_id, str) or not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: needs a string 'id' and a non-empty 'question'.")
    if qa_id in run.seen_ids:
        raise DataError(f"{where}: duplicate question id.")
    run.seen_ids.add(qa_id)
    return where, qa_id, question


def _question_pairs(
    run: _Run, qa: Any, par: _Paragraph, candidates: list[Snippet], group: str
) -> list[Pair]:
    """The pairs of one question over ``candidates``; none for a question without an
    answer found in its paragraph.

    A snippet is relevant iff it lies in the question's own paragraph and overlaps an
    answer span.
    """
    where, qa_id, question = _checked_question(run, qa, par.doc_id)
    spans = _answer_spans(par.text, qa.get("answers"), where, run.counts)
    if not spans:
        run.counts["unanswerable"] += 1
        return []
    answers = [par.text[s:e] for s, e in spans]
    head = {**run.query_meta, "language": run.language, "qa_id": qa_id}
    pairs = question_pairs(
        f"xquad-{run.name}-{qa_id}", run.questions.get(qa_id, question), group, candidates,
        relevant=lambda snip: bool(_evidence(snip, par.doc_id, spans)),
        meta=lambda snip: {**head, "doc_id": snip.doc_id, "start": snip.start, "end": snip.end,
                           "answers": answers, **_evidence(snip, par.doc_id, spans)},
    )
    if not any(p.relevant for p in pairs):
        run.counts["no_relevant"] += 1
    return pairs


def _evidence(snip: Snippet, doc_id: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
    """``{"evidence": [[start, end], ...]}``: the answer spans inside a snippet of the
    question's own paragraph, in the snippet's offsets (where the answer stands, so the
    sentence unit's evidence is the answer's sentence, not every sentence that happens to
    hold the answer's words); ``{}`` for a snippet no answer span overlaps, which is what
    makes a snippet irrelevant (the one definition of the overlap)."""
    if snip.doc_id != doc_id:
        return {}
    inside = [[max(s, snip.start) - snip.start, min(e, snip.end) - snip.start]
              for s, e in spans if snip.start < e and s < snip.end]
    return {"evidence": inside} if inside else {}


def _log_counts(run: _Run, n_pairs: int) -> None:
    """Log the answers re-located or dropped and the questions skipped or without a
    relevant snippet."""
    name, counts = run.name, run.counts
    if counts["fixed"]:
        logger.info(
            "XQuAD %s: %d answer spans re-located in the paragraph", name, counts["fixed"]
        )
    if counts["dropped"] or counts["unanswerable"]:
        logger.warning(
            "XQuAD %s: %d answers not found in their paragraph were dropped; %d questions "
            "left without any answer were skipped",
            name,
            counts["dropped"],
            counts["unanswerable"],
        )
    if counts["no_relevant"]:
        logger.warning(
            "XQuAD %s: %d questions have no relevant snippet (chunker left the answer out?)",
            name,
            counts["no_relevant"],
        )
    logger.debug("XQuAD %s: %d pairs, %d questions", name, n_pairs, len(run.seen_ids))
