"""Request and response models of the HTTP service (pydantic, extra ``server``).

The per-request limits (``max_snippets``, ``max_k``) are options of
:func:`~ragsieve.server.create_app`, so they are checked in the routes (413), not here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    StrictStr,
    model_validator,
)

__all__ = [
    "ArtifactInfo",
    "ErrorItem",
    "ErrorResponse",
    "FilterRequest",
    "FilterResponse",
    "Health",
    "HitOut",
    "IndexInfo",
    "KeptSnippet",
    "QueryRequest",
    "QueryResponse",
    "SnippetIn",
]

#: A JSON number that is finite (no bool, no string, no NaN / Infinity).
FiniteNumber = Annotated[float, Strict(), AllowInfNan(False)]

_MIN_KEEP = "Keep at least this many best snippets (outside the guarantee)."
_THRESHOLD = "Calibrated tau; null means keep all."


class SnippetIn(BaseModel):
    """A snippet as an object; ``snippet_id`` defaults to its position.

    It carries at least one of ``text`` (scored by the served scorer), ``score`` (an
    outside score, for filters calibrated on one) or ``vector`` (its embedding, used
    with the request's ``query_vector``).
    """

    model_config = ConfigDict(extra="forbid")
    text: StrictStr | None = None
    snippet_id: StrictStr | None = None
    score: FiniteNumber | None = Field(
        default=None, description="Outside score, for filters calibrated on a score field."
    )
    group: StrictStr | None = Field(
        default=None, description="The snippet's group, for group-conditional filters."
    )
    vector: list[FiniteNumber] | None = Field(
        default=None, min_length=1, description="The snippet's embedding (with query_vector)."
    )

    @model_validator(mode="after")
    def _has_content(self) -> SnippetIn:
        if self.text is None and self.score is None and self.vector is None:
            given = sorted(self.model_fields_set) or ["nothing"]
            raise ValueError(
                f"a snippet object needs 'text', 'score' or 'vector'; got {', '.join(given)}."
            )
        return self

    def as_item(self) -> dict[str, Any]:
        """The snippet as the mapping :meth:`ConformalFilter.filter` accepts (no vector)."""
        keys = ("text", "snippet_id", "score", "group")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class FilterRequest(BaseModel):
    """One query and its retrieved snippets."""

    model_config = ConfigDict(extra="forbid")
    query: StrictStr = Field(min_length=1, description="The query (non-empty).")
    snippets: list[StrictStr | SnippetIn] = Field(
        description="Snippets as strings or objects; at most the service's max_snippets."
    )
    min_keep: StrictInt | None = Field(default=None, ge=0, description=_MIN_KEEP)
    group: StrictStr | None = Field(
        default=None,
        description="The query's group, for group-conditional filters (snippets without one).",
    )
    query_vector: list[FiniteNumber] | None = Field(
        default=None,
        min_length=1,
        description="The query's embedding; then every snippet needs a vector of its length "
        "and the scores come from the vectors (no model call).",
    )


class KeptSnippet(BaseModel):
    """A snippet the filter kept."""

    index: int
    snippet_id: str
    text: str | None
    score: float = Field(description="Its score (for a snippet cut into pieces: the best piece's).")
    spans: list[tuple[int, int]] = Field(
        default_factory=list,
        description="For a snippet longer than the filter's window, cut into pieces: the "
        "character spans [start, end) of its text whose pieces were kept; empty when it was "
        "scored whole.",
    )


class FilterResponse(BaseModel):
    """The kept snippets of one ``/filter`` request."""

    kept: list[KeptSnippet]
    scores: list[float]
    threshold: float | None = Field(description=_THRESHOLD)
    removal: float
    note: str | None
    guarantee: dict[str, Any]
    n_cut: int = Field(
        default=0,
        description="Snippets longer than the filter's window, cut into pieces and scored "
        "piece by piece (kept when any piece is kept).",
    )


class ArtifactInfo(BaseModel):
    """What the served filter artifact is and what it guarantees."""

    format_version: int | None
    library_version: str | None
    created: str | None
    mode: str | None = Field(description="Calibration mode, e.g. 'marginal' or 'group'.")
    guaranteed_metric: str | None = Field(description="The metric the guarantee bounds.")
    alpha: float | None = Field(description="Target miscoverage; null for modes without one.")
    threshold: float | None = Field(description=_THRESHOLD)
    n_calibration: int | None
    min_keep: int
    group_by: str | None = Field(
        default=None, description="Snippet field holding the group (group-conditional filters)."
    )
    scorer: dict[str, Any]
    guarantee: dict[str, Any]


class QueryRequest(BaseModel):
    """A query answered from the served index."""

    model_config = ConfigDict(extra="forbid")
    query: StrictStr = Field(min_length=1, description="The query (non-empty).")
    k: StrictInt = Field(
        default=20, ge=1, description="Snippets to retrieve; at most the service's max_k."
    )
    min_keep: StrictInt | None = Field(default=None, ge=0, description=_MIN_KEEP)
    group: StrictStr | None = Field(
        default=None, description="The query's group, for a filter of the group mode."
    )


class HitOut(BaseModel):
    """One retrieved snippet, scored and marked kept or not."""

    index: int
    snippet_id: str
    doc_id: str
    path: str
    start: int
    end: int
    text: str
    distance: float = Field(description="1 - cosine of the query and the stored snippet vector.")
    score: float = Field(description="The filter's nonconformity score (kept when <= threshold).")
    kept: bool


class QueryResponse(BaseModel):
    """The retrieved and filtered snippets of one ``/query`` request."""

    hits: list[HitOut]
    n_kept: int
    threshold: float | None = Field(description=_THRESHOLD)
    removal: float
    note: str | None
    guarantee: dict[str, Any]


class IndexInfo(BaseModel):
    """The served snippet index."""

    name: str = Field(description="The index directory's name (not its path).")
    model: str
    n_snippets: int


class Health(BaseModel):
    """``GET /healthz``: status, versions, the artifact and the index."""

    status: str
    library_version: str
    artifact: ArtifactInfo
    index: IndexInfo | None = None


class ErrorItem(BaseModel):
    """One problem of a request body that failed validation."""

    type: str | None = Field(description="Kind of error, e.g. 'missing' or 'int_type'.")
    loc: list[str | int | None] = Field(description="Where: 'body', then field names / indices.")
    msg: str | None
    input: Any = Field(
        default=None,
        description="The value received (strings clipped to 200 characters, lone surrogates "
        "escaped, non-finite numbers as null, lists and objects to 20 items).",
    )
    ctx: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    """Every non-200 answer: a one-line ``detail``, or the list of validation errors (422)."""

    detail: str | list[ErrorItem]
