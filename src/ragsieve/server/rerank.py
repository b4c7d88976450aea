"""The rerank API the RAG applications already call, with the calibrated cut inside.

Open WebUI, LibreChat, Dify, LiteLLM, the Cohere and Jina SDKs and the frameworks'
``CohereRerank`` / ``CohereRanker`` components call one of two shapes:

* ``POST /v1/rerank`` and ``POST /v2/rerank`` (Cohere v1 / v2, Jina, vLLM, Xinference):
  ``{"model", "query", "documents": [str | {"text": str}], "top_n", "return_documents"}``
  in, ``{"id", "results": [{"index", "relevance_score", "document"?}], "meta"}`` out;
* ``POST /rerank`` (Hugging Face TEI): ``{"query", "texts", "return_text"}`` in, a bare
  list ``[{"index", "score", "text"?}]`` out. ``/rerank`` also takes the first body.

A rerank request is a ``/filter`` request of its documents (``snippet_id`` = the document's
position): the same body and piece limits, fair model queue, list check, drift monitor,
served record and kept set. The answer lists the documents the filter keeps, most relevant
first, capped by ``top_n``, each with its **conformal p-value** as the relevance score (the
share of relevant calibration snippets that scored no better, in (0, 1]): in the marginal
mode a document is kept exactly when its p-value exceeds alpha, so a client's own threshold
``t`` on these scores keeps what ``alpha = t`` keeps. A document cut into pieces is kept when
a piece is and scored by its best piece.

**Everything, ranked.** Clients that make their own cut (Open WebUI's external reranker
pairs the scores with its documents by position, so it must get every document back) ask
for every document, ranked, with its p-value: ``?return=all`` or the path prefix ``/all``
(``/all/v1/rerank``), since such an app can only be given a URL; ``--rerank-return all``
makes it the service's default. Their relevance threshold set to alpha then makes the cut.

What ragsieve adds (threshold, alpha, kept and removed counts, the list note) is in
``meta.ragsieve``, which strict clients ignore, and, for TEI's bare list, in ``X-Ragsieve-*``
response headers. Fields those APIs accept that ragsieve does not use (``rank_fields``,
``max_chunks_per_doc``, ``max_tokens_per_doc``, ``truncate``, ``raw_scores``, ...) are
accepted and ignored, and named in ``meta.ragsieve.ignored``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from ..types import FilterResult, Scored
from .schemas import FilterRequest, SnippetIn

__all__ = [
    "ALL_PREFIX",
    "RERANK_DESCRIPTION",
    "RERANK_ROUTES",
    "Api",
    "RerankAnswer",
    "RerankDocument",
    "RerankMeta",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "ServedFilter",
    "TEIRerankResult",
    "rerank_answer",
    "to_filter_request",
]


#: The path prefix that asks for every document, ranked (``/all/v1/rerank``).
ALL_PREFIX = "/all"
#: The OpenAPI description of every rerank route.
RERANK_DESCRIPTION = (
    "The documents are filtered as POST /filter snippets (the same limits, queue, list check "
    "and monitor; snippet_id = the document's position). The answer lists the kept documents "
    "(or, with ?return=all or the /all prefix, every document), most relevant first, capped "
    "by top_n; relevance_score (TEI: score) is the document's conformal p-value in (0, 1]: "
    "in the marginal mode a document is kept exactly when it exceeds alpha. ragsieve's "
    "additions are in meta.ragsieve and the X-Ragsieve-* headers.")
#: Most names of ignored request fields listed in ``meta.ragsieve.ignored``.
_MAX_IGNORED_SHOWN = 20

Api = Literal["v1", "v2", "tei"]
#: ``(path, api)`` of every rerank route; each is also served under the ``/all`` prefix.
RERANK_ROUTES: tuple[tuple[str, Api], ...] = (
    ("/v1/rerank", "v1"), ("/v2/rerank", "v2"), ("/rerank", "tei"))


class RerankDocument(BaseModel):
    """A document as an object: its ``text`` is ranked; other keys (a Cohere v1
    semi-structured document's) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    text: StrictStr = Field(description="The document's text.")


class RerankRequest(BaseModel):
    """A rerank request: Cohere v1 / v2, Jina, vLLM (``documents``) or TEI (``texts``).

    ``/v1/rerank`` and ``/v2/rerank`` take ``documents``; ``/rerank`` takes either
    ``texts`` (TEI's body, TEI's answer) or ``documents`` (the Cohere answer). Any other
    field is accepted and ignored (the APIs' ``rank_fields``, ``max_chunks_per_doc``,
    ``max_tokens_per_doc``, ``truncate``, ``raw_scores``, ...).
    """

    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = Field(
        default=None, description="Accepted and echoed; the served filter decides the score.")
    query: StrictStr = Field(min_length=1, description="The query (non-empty).")
    documents: list[StrictStr | RerankDocument] | None = Field(
        default=None, description="The documents, as strings or {\"text\": ...} objects; at "
        "most the service's max_snippets.")
    texts: list[StrictStr] | None = Field(
        default=None, description="TEI's name for the documents (POST /rerank only).")
    top_n: StrictInt | None = Field(
        default=None, ge=1, description="Answer at most this many documents (default: all "
        "that are answered).")
    return_documents: StrictBool | None = Field(
        default=None, description="Include each document's text (default false).")
    return_text: StrictBool | None = Field(
        default=None, description="TEI's name for return_documents.")

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            given = "both 'documents' and 'texts'" if self.documents is not None else "neither"
            raise ValueError(f"a rerank body needs its documents as 'documents' (Cohere, Jina, "
                             f"vLLM) or 'texts' (TEI, POST /rerank); got {given}.")
        return self

    @property
    def texts_sent(self) -> list[str]:
        """The documents' texts, in order."""
        if self.texts is not None:
            return list(self.texts)
        return [d if isinstance(d, str) else d.text for d in self.documents or ()]

    @property
    def wants_text(self) -> bool:
        """Whether the answer carries the documents' texts."""
        return bool(self.return_documents or self.return_text)

    @property
    def ignored(self) -> list[str]:
        """The names of the fields accepted and not used."""
        return sorted(self.model_extra or {})


class RerankDocumentOut(BaseModel):
    """A document as answered (``return_documents``)."""

    text: str


class RerankResult(BaseModel):
    """One answered document."""

    index: int = Field(description="Its position in the request's documents.")
    relevance_score: float = Field(
        description="Its conformal p-value in (0, 1]: the share of relevant calibration "
        "snippets that scored no better. Marginal mode: kept exactly when > alpha.")
    document: RerankDocumentOut | None = Field(
        default=None, description="Present when the request asked for return_documents.")


class RerankMeta(BaseModel):
    """What ragsieve adds to the answer, under ``meta.ragsieve`` (strict clients ignore it)."""

    alpha: float | None = Field(description="The artifact's alpha (null for modes without one).")
    mode: str | None = Field(description="The calibration mode.")
    threshold: float | None = Field(description="Calibrated tau on the score; null: keep all.")
    score: str = Field(description="The score the threshold is on, and its keep rule.")
    p_value_rule: str | None = Field(description="How to read relevance_score beside the rule.")
    returned: Literal["kept", "all"] = Field(
        description="'kept': the documents the filter keeps; 'all': every document, ranked.")
    total: int = Field(description="Documents in the request.")
    kept: int = Field(description="Documents the filter keeps.")
    removed: int = Field(description="Documents the filter removes.")
    answered: int = Field(description="Documents in results (top_n applied).")
    kept_indices: list[int] = Field(description="The kept documents' positions, best first.")
    note: str | None = Field(description="The filter's note (e.g. nothing kept).")
    n_cut: int = Field(description="Documents longer than the filter's window, cut into "
                       "pieces and scored by their best piece.")
    unit: str = Field(description="'snippet' or 'sentence' (a document is kept when one of its "
                      "sentences is; the rerank API answers whole documents).")
    lists_unlike: bool = Field(description="The list is unlike the calibration lists.")
    lists_note: str | None = Field(description="What differs, in numbers.")
    ignored: list[str] = Field(description="Request fields accepted and not used.")
    endpoint_note: str | None = Field(
        default=None, description="The reranker behind the served score answered with "
        "another model than the calibrated one (the threshold does not hold for it).")


class RerankResponse(BaseModel):
    """The Cohere / Jina / vLLM answer (``/v1/rerank``, ``/v2/rerank``, ``/rerank`` with
    ``documents``)."""

    id: str = Field(description="The request's query_id: use it in POST /feedback, with each "
                    "document's index (as a string) as its snippet_id.")
    model: str = Field(description="The request's model, echoed (or the served score's name).")
    results: list[RerankResult]
    meta: dict[str, Any] = Field(description="api_version and billed_units as Cohere answers "
                                 "them, and ragsieve's additions under 'ragsieve' (RerankMeta).")
    usage: dict[str, int] = Field(description="As Jina / vLLM answer it (no tokens are billed).")


class TEIRerankResult(BaseModel):
    """One answered document of TEI's ``/rerank`` (a bare list of these)."""

    index: int
    score: float = Field(description="Its conformal p-value in (0, 1] (see RerankResult).")
    text: str | None = Field(default=None, description="Present when return_text was true.")


RerankAnswer = tuple[Any, dict[str, str]]


@dataclass(frozen=True)
class ServedFilter:
    """What a rerank answer says of the served filter.

    Attributes
    ----------
    guarantee : Mapping
        The filter's ``guarantee()`` (``alpha``, ``mode``, ...).
    rule : str
        Its keep rule in the score's own units (``keep 1 - cos <= 0.52``).
    name : str
        The served score's name, answered as ``model`` when the request names none.
    p_value_rule : str or None
        How its p-values read beside its rule.
    endpoint_note : str or None
        The score's endpoint answered with another model (:meth:`Scorer.endpoint_note`).
    """

    guarantee: Mapping[str, Any]
    rule: str
    name: str
    p_value_rule: str | None
    endpoint_note: str | None = None


def to_filter_request(request: RerankRequest) -> FilterRequest:
    """The ``/filter`` request of a rerank request: its documents as snippets whose id is
    their position (the ``snippet_id`` to label them by in ``POST /feedback``)."""
    snippets: list[StrictStr | SnippetIn] = [
        SnippetIn(text=text, snippet_id=str(i)) for i, text in enumerate(request.texts_sent)]
    return FilterRequest(query=request.query, snippets=snippets)


def _p_value(s: Scored) -> float:
    """A document's p-value (the route refuses a filter without calibration evidence, so
    every scored document has one: a missing one is a bug, never a relevance of 0)."""
    if s.p_value is None:
        raise RuntimeError(f"document {s.index} has no p-value; the rerank routes answer "
                           "only filters with calibration evidence.")
    return float(s.p_value)


def _best_first(scored: list[Scored]) -> list[Scored]:
    """Most relevant first: by p-value, then by score, then by position (a document's
    score is its best piece's)."""
    return sorted(scored, key=lambda s: (-_p_value(s), s.score, s.index))


def _meta(res: FilterResult, request: RerankRequest, info: ServedFilter,
          kept: list[Scored], n_answered: int, everything: bool) -> RerankMeta:
    guarantee = info.guarantee
    threshold = float(res.threshold) if math.isfinite(res.threshold) else None
    return RerankMeta(
        alpha=guarantee.get("alpha"), mode=guarantee.get("mode"), threshold=threshold,
        score=info.rule, p_value_rule=info.p_value_rule,
        returned="all" if everything else "kept",
        total=res.n_input, kept=len(res.kept), removed=len(res.removed), answered=n_answered,
        kept_indices=[s.index for s in kept], note=res.note, n_cut=res.n_cut, unit=res.unit,
        lists_unlike=res.lists_unlike, lists_note=res.lists_note,
        ignored=request.ignored[:_MAX_IGNORED_SHOWN], endpoint_note=info.endpoint_note)


def _headers(meta: RerankMeta, query_id: str) -> dict[str, str]:
    """ragsieve's additions as response headers (TEI's answer is a bare list)."""
    def show(value: float | None) -> str:
        return "null" if value is None else f"{value:.6g}"

    return {"X-Ragsieve-Query-Id": query_id, "X-Ragsieve-Alpha": show(meta.alpha),
            "X-Ragsieve-Threshold": show(meta.threshold), "X-Ragsieve-Kept": str(meta.kept),
            "X-Ragsieve-Removed": str(meta.removed), "X-Ragsieve-Return": meta.returned}


def rerank_answer(res: FilterResult, query_id: str, request: RerankRequest, *, api: Api,
                  everything: bool, info: ServedFilter) -> RerankAnswer:
    """The rerank API's answer to a filtered request, and the ``X-Ragsieve-*`` headers.

    Parameters
    ----------
    res : FilterResult
        The filter's result for the request's documents (with p-values).
    query_id : str
        The served record's query id (the answer's ``id``).
    request : RerankRequest
        The request as received.
    api : {"v1", "v2", "tei"}
        The route's API; ``"tei"`` answers TEI's bare list when the body used ``texts``.
    everything : bool
        Every document, ranked, instead of the kept ones.
    info : ServedFilter
        What the answer says of the served filter.

    Returns
    -------
    tuple
        The JSON-ready answer (a dict, or a list for TEI) and the headers.
    """
    kept = _best_first(list(res.kept))
    ranked = _best_first(kept + list(res.removed)) if everything else kept
    answered = ranked if request.top_n is None else ranked[: request.top_n]
    meta = _meta(res, request, info, kept, len(answered), everything)
    headers = _headers(meta, query_id)
    texts = request.texts_sent
    if api == "tei" and request.texts is not None:
        return [TEIRerankResult(index=s.index, score=_p_value(s),
                                text=texts[s.index] if request.wants_text else None
                                ).model_dump(exclude_none=True) for s in answered], headers
    results = [RerankResult(index=s.index, relevance_score=_p_value(s),
                            document=RerankDocumentOut(text=texts[s.index])
                            if request.wants_text else None).model_dump(exclude_none=True)
               for s in answered]
    version = "2" if api == "v2" else "1"
    body = RerankResponse(
        id=query_id, model=request.model or info.name, results=[],
        meta={"api_version": {"version": version}, "billed_units": {"search_units": 1},
              "ragsieve": meta.model_dump()},
        usage={"total_tokens": 0},
    ).model_dump()
    body["results"] = results  # without "document": null where none was asked for
    return body, headers
