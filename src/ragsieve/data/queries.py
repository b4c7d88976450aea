"""Labelled queries, and the retrieved lists they label: the input of ``ragsieve retrieve``.

A calibrated filter promises coverage for lists like its calibration lists, so the easy
path to a filter is to run the retriever that will be deployed on labelled queries and
calibrate on what it returns (``ragsieve retrieve`` for a ``ragsieve index``, a framework
component's ``calibrate(retriever, queries)`` for a LangChain, LlamaIndex or Haystack
retriever). This module is what both share: the labelled queries, and the labels of a
retrieved snippet.

The queries file is JSONL, one query per line:

``query_id`` (string or integer, required), ``query`` (non-empty string of at most
:data:`MAX_QUERY_CHARS` characters, required), ``group`` (the topic, optional),
``relevant_doc_ids`` (a non-empty list of document ids, optional) and ``answers`` (a
non-empty list of gold answer strings, each keeping a word under SQuAD normalisation,
optional); other keys are kept in :attr:`LabelledQuery.meta`. A line holds at most
:data:`MAX_QUERY_LINE_BYTES` bytes, checked before it is decoded.

A retrieved snippet is labelled by :meth:`LabelledQuery.label`:

* ``relevant_doc_ids`` alone: relevant when it is a snippet of a listed document (the ids
  ``ragsieve index`` records: a file's path relative to the indexed folder, or a JSONL
  document's ``id``; a framework document's id or source document id);
* ``answers`` alone: relevant when its text contains a gold answer under SQuAD
  normalisation (:func:`ragsieve._text.answer_tokens`: lower case, no punctuation, no
  articles, a contiguous run of words);
* both: relevant when it is a snippet of a listed document *and* contains an answer (the
  SQuAD label: the evidence passage, at the place that answers);
* neither: unlabelled (``None``): the pairs go to ``ragsieve label`` (the LLM labeller)
  before they calibrate.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ragsieve._text import answer_tokens, contains_run
from ragsieve.data.jsonl import (
    PathOrFile,
    _binary_lines,
    _check_id,
    _check_values,
    _shown_json,
    _source_name,
    _type_name,
    load_line,
)
from ragsieve.errors import DataError
from ragsieve.types import RETRIEVER_KEY, Pair

__all__ = ["MAX_QUERY_CHARS", "MAX_QUERY_LINE_BYTES", "QUERY_KEYS", "RETRIEVER_KEY",
           "LabelledQuery", "ListSummary", "describe_lists", "documents_and_queries",
           "list_pairs", "read_queries", "unknown_doc_ids"]

#: The keys a labelled query line may carry besides free ones (kept in ``meta``).
QUERY_KEYS = ("query_id", "query", "group", "relevant_doc_ids", "answers")
#: Longest document :func:`documents_and_queries` rebuilds from snippet offsets (characters).
MAX_DOCUMENT_CHARS = 10_000_000
#: Longest query a labelled query may hold (characters): a search query, not a document.
MAX_QUERY_CHARS = 10_000
#: Longest line of a labelled queries file (bytes), refused before it is decoded: room for
#: a query of :data:`MAX_QUERY_CHARS` characters and its labels.
MAX_QUERY_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class LabelledQuery:
    """A query with the labels its retrieved snippets are judged by.

    Attributes
    ----------
    query_id : str
        Identifies the query (its pairs' ``query_id``).
    query : str
        The query text.
    group : str
        The topic, for topic-disjoint splits (``""``: the query is its own topic).
    relevant_doc_ids : tuple of str or None
        The documents whose snippets are evidence.
    answers : tuple of str or None
        The gold answers; a snippet containing one (SQuAD normalisation) is evidence.
    meta : Mapping
        The line's other keys.
    """

    query_id: str
    query: str
    group: str = ""
    relevant_doc_ids: tuple[str, ...] | None = None
    answers: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def labelled(self) -> bool:
        """True when the query carries ``relevant_doc_ids`` or ``answers``."""
        return self.relevant_doc_ids is not None or self.answers is not None

    def label(self, doc_ids: Collection[str], text: str, language: str | None = None) -> int | None:
        """The label of a retrieved snippet (see the module docstring).

        Parameters
        ----------
        doc_ids : collection of str
            The ids the snippet's document goes by (its id; a framework node's source
            document id too).
        text : str
            The snippet's text.
        language : str, optional
            The language whose articles the SQuAD normalisation removes (None: English).

        Returns
        -------
        int or None
            1 relevant, 0 not, None when the query carries no labels.

        Examples
        --------
        >>> q = LabelledQuery("q1", "Who won?", answers=("the Denver Broncos",))
        >>> q.label(["doc"], "Denver Broncos won Super Bowl 50."), q.label(["doc"], "Rain.")
        (1, 0)
        >>> LabelledQuery("q2", "Who?").label(["doc"], "Anything.") is None
        True
        """
        if not self.labelled:
            return None
        if self.relevant_doc_ids is not None and not set(map(str, doc_ids)) & set(
                self.relevant_doc_ids):
            return 0
        if self.answers is not None:
            haystack = answer_tokens(text, language)
            return int(any(contains_run(haystack, answer_tokens(a, language))
                           for a in self.answers))
        return 1

    def to_record(self) -> dict[str, Any]:
        """The query as a JSON line of the queries format."""
        out: dict[str, Any] = {"query_id": self.query_id, "query": self.query}
        if self.group:
            out["group"] = self.group
        if self.relevant_doc_ids is not None:
            out["relevant_doc_ids"] = list(self.relevant_doc_ids)
        if self.answers is not None:
            out["answers"] = list(self.answers)
        return {**out, **self.meta}

    @classmethod
    def from_record(cls, record: Any, where: str = "query", *,
                    language: str | None = None) -> LabelledQuery:
        """A labelled query from one decoded JSON object (or a mapping given in Python).

        Parameters
        ----------
        record : mapping
            The query's fields (see the module docstring).
        where : str
            Where it comes from, for messages (``file:line``).
        language : str, optional
            The language of the answers' SQuAD normalisation (None: English).

        Raises
        ------
        DataError
            Naming ``where`` and the field: not an object, a missing or empty
            ``query_id`` / ``query``, a query over :data:`MAX_QUERY_CHARS` characters, an
            id holding a control, bidirectional-control or zero-width character, a string
            holding a lone surrogate, a number beyond the range of a double,
            ``relevant_doc_ids`` / ``answers`` that are not non-empty lists of non-empty
            strings (ids may be integers), or an answer that normalises to no word
            (``"the"``, ``"..."``: it would label nothing).
        """
        if not isinstance(record, Mapping):
            raise DataError(f"{where}: expected a JSON object (a query), got {_type_name(record)} "
                            f"({_shown_json(record)}).")
        _check_values(dict(record), where)
        query_id = _id(record.get("query_id"), "query_id", where)
        query = record.get("query")
        if not isinstance(query, str) or not query.strip():
            raise DataError(f"{where}: query == {query!r:.60} ({_type_name(query)}), must be a "
                            "non-empty string.")
        if len(query) > MAX_QUERY_CHARS:
            raise DataError(f"{where}: query holds {len(query):,} characters; a query may hold "
                            f"at most {MAX_QUERY_CHARS:,} (a search query, not a document).")
        group = record.get("group")
        group = "" if group is None or group == "" else _id(group, "group", where)
        return cls(query_id=query_id, query=query, group=group,
                   relevant_doc_ids=_string_list(record, "relevant_doc_ids", where, ids=True),
                   answers=_answers(record, where, language),
                   meta={k: v for k, v in record.items() if k not in QUERY_KEYS})


def _id(value: Any, key: str, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: {key} == {value!r:.60} ({_type_name(value)}), must be a "
                        "non-empty string or an integer.")
    return _check_id(value, key, where)


def _string_list(record: Mapping[str, Any], key: str, where: str, *,
                 ids: bool) -> tuple[str, ...] | None:
    value = record.get(key)
    if value is None:
        return None
    what, example = (("document ids (strings or integers)", '["doc-3"]') if ids
                     else ("non-empty strings", '["Leonardo da Vinci"]'))
    if isinstance(value, (str, bytes)) or not isinstance(value, list) or not value:
        raise DataError(f"{where}: {key} == {_shown_json(value, 80)} "
                        f"({_type_name(value)}), must be a non-empty list of {what}, e.g. "
                        f"{example}.")
    out = []
    for i, item in enumerate(value):
        if ids:
            out.append(_id(item, f"{key}[{i}]", where))
        elif isinstance(item, str) and item.strip():
            out.append(item)
        else:
            raise DataError(f"{where}: {key}[{i}] == {item!r:.60} ({_type_name(item)}), must "
                            "be a non-empty string.")
    return tuple(out)


def _answers(record: Mapping[str, Any], where: str,
             language: str | None) -> tuple[str, ...] | None:
    """The query's ``answers``; one that SQuAD normalisation empties is refused: it is in
    no snippet's text (``""`` is refused, so ``"the"`` and ``"..."`` are too)."""
    answers = _string_list(record, "answers", where, ids=False)
    for i, answer in enumerate(answers or ()):
        if not answer_tokens(answer, language):
            raise DataError(f"{where}: answers[{i}] == {answer!r:.60} holds no word once "
                            f"normalised (SQuAD: lower case, no punctuation, no articles"
                            f"{'' if language is None else f' of {language!r}'}), so it "
                            "labels no snippet; give the answer's words or drop it.")
    return answers


def read_queries(
    source: PathOrFile | Iterable[LabelledQuery | Mapping[str, Any]],
    *,
    language: str | None = None,
) -> list[LabelledQuery]:
    """Read labelled queries: a JSONL file (one query per line) or mappings given in Python.

    Parameters
    ----------
    source : path, ``"-"``, open file, or iterable of mappings
        The queries file (see the module docstring), or the queries as dicts (or
        :class:`LabelledQuery` objects, returned as they are).
    language : str, optional
        The language of the answers' SQuAD normalisation (None: English): an answer it
        leaves no word of is refused.

    Returns
    -------
    list of LabelledQuery
        In input order.

    Raises
    ------
    DataError
        With ``file:line`` (``queries[i]`` for mappings): an unreadable file, a line over
        :data:`MAX_QUERY_LINE_BYTES` bytes (refused before it is read whole), bytes that
        are not UTF-8, malformed JSON, a field :meth:`LabelledQuery.from_record` refuses,
        a repeated ``query_id``, or no query at all.

    Examples
    --------
    >>> qs = read_queries([{"query_id": 1, "query": "Who?", "answers": ["Ada"]}])
    >>> qs[0].query_id, qs[0].answers
    ('1', ('Ada',))
    """
    if isinstance(source, bytes):
        source = os.fsdecode(source)
    located: list[tuple[str, LabelledQuery]]  # (where, query)
    if isinstance(source, str) or hasattr(source, "__fspath__") or hasattr(source, "read"):
        name = _source_name(source)  # type: ignore[arg-type]
        if (isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-"
                and not os.path.exists(source)):
            raise DataError(f"{name}: no such file; expected a JSONL file of labelled queries "
                            "(one object per line with query_id and query).")
        lines = _binary_lines(source, name, max_line_bytes=MAX_QUERY_LINE_BYTES,  # type: ignore[arg-type]
                              what=" (a labelled query: a query of at most "
                              f"{MAX_QUERY_CHARS:,} characters and its labels)")
        located = _from_lines(lines, name, language)
    elif isinstance(source, Mapping):
        raise TypeError("source is one mapping; pass a list of queries, e.g. [query].")
    else:
        name = "queries"
        located = [(f"queries[{i}]", q if isinstance(q, LabelledQuery)
                    else LabelledQuery.from_record(q, f"queries[{i}]", language=language))
                   for i, q in enumerate(source)]
    seen: dict[str, str] = {}
    for where, q in located:
        if q.query_id in seen:
            raise DataError(f"{where}: query_id {q.query_id!r} is given twice (first at "
                            f"{seen[q.query_id]}); each query once.")
        seen[q.query_id] = where
    if not located:
        raise DataError(f"{name}: contains no queries; expected one JSON object per line "
                        "with query_id and query.")
    return [q for _, q in located]


def _from_lines(lines: Iterable[bytes], name: str,
                language: str | None) -> list[tuple[str, LabelledQuery]]:
    out = []
    for lineno, raw in enumerate(lines, start=1):
        where = f"{name}:{lineno}"
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: bytes are not valid UTF-8 (at column {exc.start + 1}); "
                            "save the file as UTF-8.") from None
        if not line.strip():
            continue
        out.append((where, LabelledQuery.from_record(load_line(line, where), where,
                                                     language=language)))
    return out


def list_pairs(query: LabelledQuery, hits: Sequence[Mapping[str, Any]], *,
               retriever: Mapping[str, Any] | None = None,
               language: str | None = None) -> list[Pair]:
    """The pairs of one retrieved list, labelled by the query (:meth:`LabelledQuery.label`).

    Parameters
    ----------
    query : LabelledQuery
        The query the list was retrieved for.
    hits : sequence of mapping
        The list in the retriever's order, each with ``snippet_id``, ``text`` and
        ``doc_ids`` (the ids its document goes by); any other keys go to ``Pair.meta``
        (``doc_id``, ``path``, ``start``, ``end``, the retriever's ``retrieval_score``).
    retriever : mapping, optional
        The retriever's identity, recorded on every pair under :data:`RETRIEVER_KEY`
        (``calibrate`` records it in the artifact).
    language : str, optional
        The language of the answers' normalisation.

    Returns
    -------
    list of Pair
        One per hit, ``meta["rank"]`` its 0-based position; the query's ``answers`` on
        every line (what ``ragsieve answers`` and the sentence unit read).

    Raises
    ------
    DataError
        Two hits with one ``snippet_id``, or a hit without a text.
    """
    pairs = []
    seen: set[str] = set()
    for rank, hit in enumerate(hits):
        snippet_id, text = str(hit.get("snippet_id")), hit.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"query {query.query_id!r}: hit {rank} ({snippet_id!r}) has no text.")
        if snippet_id in seen:
            raise DataError(f"query {query.query_id!r}: the retriever returned snippet "
                            f"{snippet_id!r} twice; each snippet may appear once per query.")
        seen.add(snippet_id)
        doc_ids = [str(d) for d in hit.get("doc_ids", ()) if d is not None]
        meta = {k: v for k, v in hit.items()
                if k not in ("snippet_id", "text", "doc_ids") and v is not None
                and not (isinstance(v, float) and not math.isfinite(v))}
        meta["rank"] = rank
        if query.answers is not None:
            meta["answers"] = list(query.answers)
        if retriever is not None:
            meta[RETRIEVER_KEY] = dict(retriever)
        pairs.append(Pair(query_id=query.query_id, query=query.query, snippet_id=snippet_id,
                          text=text, relevant=query.label(doc_ids, text, language),
                          group=query.group, meta=meta))
    return pairs


@dataclass(frozen=True)
class ListSummary:
    """What retrieved lists of labelled queries hold to calibrate on.

    Attributes
    ----------
    k : int
        The number of hits asked for per query.
    n_queries : int
        Queries retrieved for.
    n_hits : int
        Retrieved snippets over all queries (one pair each).
    n_relevant : int
        Hits labelled relevant.
    unlabelled : tuple of str
        Ids of the queries without labels (their pairs have ``relevant: null``).
    no_relevant : tuple of str
        Ids of the labelled queries with no relevant hit among theirs (recall misses of
        the retriever at ``k``, or labels naming no indexed document).
    short : tuple of str
        Ids of the queries that got fewer than ``k`` hits (a corpus smaller than ``k``).
    unknown_doc_ids : tuple of (str, str)
        ``(query_id, doc_id)`` of each ``relevant_doc_ids`` entry that names no document of
        the index (empty unless :func:`describe_lists` is given the index's ids): a hit of
        it can never be retrieved.
    unfindable : tuple of str
        Ids of the labelled queries whose every ``relevant_doc_ids`` entry names no
        document of the index: no retriever could find their evidence.
    """

    k: int
    n_queries: int
    n_hits: int
    n_relevant: int
    unlabelled: tuple[str, ...] = ()
    no_relevant: tuple[str, ...] = ()
    short: tuple[str, ...] = ()
    unknown_doc_ids: tuple[tuple[str, str], ...] = ()
    unfindable: tuple[str, ...] = ()

    @property
    def misses(self) -> tuple[str, ...]:
        """The labelled queries with no relevant hit whose evidence is in the index:
        recall misses of the retriever at ``k``."""
        unfindable = set(self.unfindable)
        return tuple(q for q in self.no_relevant if q not in unfindable)

    @property
    def n_labelled(self) -> int:
        """Queries carrying labels."""
        return self.n_queries - len(self.unlabelled)

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values (the id tuples as lists)."""
        return {"k": self.k, "n_queries": self.n_queries, "n_labelled": self.n_labelled,
                "n_hits": self.n_hits, "n_relevant": self.n_relevant,
                "unlabelled": list(self.unlabelled), "no_relevant": list(self.no_relevant),
                "short": list(self.short),
                "unknown_doc_ids": [{"query_id": q, "doc_id": d}
                                    for q, d in self.unknown_doc_ids],
                "unfindable": list(self.unfindable)}


def describe_lists(queries: Sequence[LabelledQuery], pairs: Iterable[Pair],
                   k: int, *, known_doc_ids: Collection[str] | None = None) -> ListSummary:
    """Count what the retrieved lists of ``queries`` hold (``ragsieve retrieve``'s summary).

    Parameters
    ----------
    queries : sequence of LabelledQuery
        The queries retrieved for (a query without pairs counts as an empty list).
    pairs : iterable of Pair
        Their retrieved lists, as :func:`list_pairs` makes them.
    k : int
        The number of hits asked for per query.
    known_doc_ids : collection of str, optional
        The ids the retriever's documents go by (:meth:`SnippetIndex.document_ids`): the
        ``relevant_doc_ids`` outside it are counted in ``unknown_doc_ids``.

    Returns
    -------
    ListSummary

    Examples
    --------
    >>> q = LabelledQuery("q1", "Who won?", answers=("Denver Broncos",))
    >>> hits = [{"snippet_id": "a", "text": "The Denver Broncos won."},
    ...         {"snippet_id": "b", "text": "It rained."}]
    >>> s = describe_lists([q], list_pairs(q, hits), k=3)
    >>> s.n_hits, s.n_relevant, s.no_relevant, s.short
    (2, 1, (), ('q1',))
    """
    unknown = () if known_doc_ids is None else unknown_doc_ids(queries, known_doc_ids)
    n_unknown = Counter(q for q, _ in unknown)
    hits: dict[str, int] = {q.query_id: 0 for q in queries}
    relevant: dict[str, int] = dict(hits)
    n_hits = n_relevant = 0
    for pair in pairs:
        hits[pair.query_id] = hits.get(pair.query_id, 0) + 1
        relevant[pair.query_id] = relevant.get(pair.query_id, 0) + (pair.relevant == 1)
        n_hits += 1
        n_relevant += pair.relevant == 1
    return ListSummary(
        k=k, n_queries=len(queries), n_hits=n_hits, n_relevant=n_relevant,
        unlabelled=tuple(q.query_id for q in queries if not q.labelled),
        no_relevant=tuple(q.query_id for q in queries
                          if q.labelled and not relevant[q.query_id]),
        short=tuple(q.query_id for q in queries if hits[q.query_id] < k),
        unknown_doc_ids=unknown,
        unfindable=tuple(q.query_id for q in queries if q.relevant_doc_ids is not None
                         and n_unknown[q.query_id] == len(q.relevant_doc_ids)))


def unknown_doc_ids(queries: Iterable[LabelledQuery],
                    known: Collection[str]) -> tuple[tuple[str, str], ...]:
    """``(query_id, doc_id)`` of every ``relevant_doc_ids`` entry not in ``known``.

    Examples
    --------
    >>> q = LabelledQuery("q1", "Who?", relevant_doc_ids=("a.txt", "../../etc/passwd"))
    >>> unknown_doc_ids([q], {"a.txt", "b.txt"})
    (('q1', '../../etc/passwd'),)
    """
    known = known if isinstance(known, (set, frozenset)) else set(known)
    return tuple((q.query_id, d) for q in queries for d in q.relevant_doc_ids or ()
                 if d not in known)


def _is_offset(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def documents_and_queries(pairs: Iterable[Pair]) -> tuple[dict[str, str], list[LabelledQuery]]:
    """A labelled data set as the documents to index and the labelled queries to retrieve for
    (``ragsieve export --docs DIR --queries FILE``): what you need to try the
    retrieve-then-calibrate path on a built-in data set.

    A document is rebuilt from its snippets (``meta["doc_id"]``, ``meta["start"]``,
    ``meta["end"]``: what the built-in loaders record); a query is labelled with the
    documents of its relevant snippets (``relevant_doc_ids``) and its ``answers`` when the
    pairs carry them.

    Returns
    -------
    documents : dict
        ``doc_id -> text``, in order of first appearance.
    queries : list of LabelledQuery
        In order of first appearance.

    Raises
    ------
    DataError
        A pair without ``doc_id`` / ``start`` / ``end`` (offsets >= 0) in its meta, an
        ``end`` beyond :data:`MAX_DOCUMENT_CHARS`, or two snippets of one document that
        disagree on a character.
    """
    texts: dict[str, list[str | None]] = {}
    queries: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        doc_id, start, end = (pair.meta.get(k) for k in ("doc_id", "start", "end"))
        if not isinstance(doc_id, str) or not _is_offset(start) or not _is_offset(end) \
                or end - start != len(pair.text):
            raise DataError(f"pair {pair.query_id!r}/{pair.snippet_id!r} carries no doc_id, start "
                            "and end matching its text in its meta; documents are rebuilt from "
                            "them (the built-in data sets record them).")
        if end > MAX_DOCUMENT_CHARS:
            raise DataError(f"pair {pair.query_id!r}/{pair.snippet_id!r}: end == {end}, beyond "
                            f"the longest document rebuilt ({MAX_DOCUMENT_CHARS} characters); "
                            "its offsets cannot be character offsets of a document.")
        chars = texts.setdefault(doc_id, [])
        chars.extend([None] * (end - len(chars)))
        for offset, ch in enumerate(pair.text, start):
            if chars[offset] not in (None, ch):
                raise DataError(f"document {doc_id!r}: two snippets disagree at character "
                                f"{offset}; they are not windows of one text.")
            chars[offset] = ch
        query = queries.setdefault(pair.query_id, {"query_id": pair.query_id, "query": pair.query,
                                                   "group": pair.group, "relevant_doc_ids": []})
        if pair.meta.get("answers"):
            query["answers"] = list(pair.meta["answers"])
        if pair.relevant == 1 and doc_id not in query["relevant_doc_ids"]:
            query["relevant_doc_ids"].append(doc_id)
    documents = {d: "".join(c if c is not None else " " for c in chars)
                 for d, chars in texts.items()}
    labelled = [LabelledQuery.from_record({k: v for k, v in q.items()
                                           if k != "relevant_doc_ids" or v}, "pairs")
                for q in queries.values()]
    return documents, labelled
