"""Request and response models of the HTTP service (pydantic, extra ``server``).

The per-request limits (``max_snippets``, ``max_k``) are options of
:func:`~ragsieve.server.create_app`, so they are checked in the routes (413), not here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .._validation import check_id, is_finite_number, show_number

__all__ = [
    "AdaptiveInfo",
    "ArtifactInfo",
    "ErrorItem",
    "ErrorResponse",
    "FeedbackItem",
    "FeedbackRequest",
    "FeedbackResponse",
    "FilterRequest",
    "FilterResponse",
    "Health",
    "HitOut",
    "IndexInfo",
    "KeepRuleInfo",
    "KeptSnippet",
    "MonitorInfo",
    "MonitorResetResponse",
    "QueryRequest",
    "QueryResponse",
    "RecentRequest",
    "ReloadResponse",
    "RemovedSnippet",
    "SnippetIn",
    "StatusResponse",
]

#: A JSON number that is finite (no bool, no string, no NaN / Infinity).
FiniteNumber = Annotated[float, Strict(), AllowInfNan(False)]

_MIN_KEEP = "Keep at least this many best snippets (outside the guarantee)."
_THRESHOLD = "Calibrated tau; null means keep all."
_QUERY_ID_IN = (
    "Your identifier of this request, echoed back and recorded with the served scores so "
    "POST /feedback can refer to it; a fresh one is generated when omitted."
)
_LISTS_UNLIKE = ("True when this list is unlike the filter's calibration lists, for a score that "
                 "reads the whole list: its length is outside the calibration lengths, or the "
                 "sequential test over the lists served so far fired (the guarantee then "
                 "assumes lists it was not calibrated on; see docs/deploy.md).")
_LISTS_NOTE = "What differs, in numbers (null when nothing is known to differ)."
_P_VALUE = ("Its conformal p-value: the share of the relevant calibration snippets that scored "
            "no better, in (0, 1], the same unit for every score and mode (marginal mode: kept "
            "exactly when it exceeds alpha); null when the artifact stores no calibration "
            "evidence.")
_P_VALUE_RULE = ("How to read the p-values beside this filter's rule (marginal: 'kept exactly "
                 "when p > alpha'; other modes: an evidence percentile); null without them.")
_QUERY_ID_OUT = "The request's query_id (yours, or generated): use it in POST /feedback."
#: Longest ``query_id`` / ``snippet_id`` accepted in a request.
MAX_ID_CHARS = 256


def _printable_id(value: str, info: ValidationInfo) -> str:
    """Refuse control, bidirectional-control and zero-width characters in an id: the data
    readers' definition (:func:`ragsieve._validation.check_id`)."""
    return check_id(value, info.field_name or "id")


#: A ``query_id`` / ``snippet_id``: 1 to 256 characters, none of them a control,
#: bidirectional-control or zero-width character.
QueryId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_ID_CHARS),
                    AfterValidator(_printable_id)]
#: A ``group``: a string holding no control, bidirectional-control or zero-width character.
GroupName = Annotated[str, Strict(), AfterValidator(_printable_id)]


class SnippetIn(BaseModel):
    """A snippet as an object; ``snippet_id`` (or its other name ``id``, as in the Python
    API; not both) defaults to its position.

    It carries at least one of ``text`` (scored by the served scorer), ``score`` (an
    outside score, for filters calibrated on one; also accepted under the field name the
    filter was calibrated on, e.g. ``"bm25"``) or ``vector`` (its embedding, used with the
    request's ``query_vector``). Any other key must be a number and is checked by the
    service against the served filter: a key or a ``score`` the filter does not read is a
    422, never ignored.
    """

    model_config = ConfigDict(extra="allow")
    text: StrictStr | None = None
    snippet_id: QueryId | None = Field(
        default=None, validation_alias=AliasChoices("snippet_id", "id"),
        description="The snippet's id (also accepted as 'id'); defaults to its position.")
    score: FiniteNumber | None = Field(
        default=None, description="Outside score, for filters calibrated on a score field."
    )
    group: GroupName | None = Field(
        default=None, description="The snippet's group, for group-conditional filters."
    )
    vector: list[FiniteNumber] | None = Field(
        default=None, min_length=1, description="The snippet's embedding (with query_vector)."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "snippet_id" in data and "id" in data:
            raise ValueError("a snippet object has both 'snippet_id' and 'id'; 'id' is another "
                             "name of 'snippet_id': give one.")
        return data

    @model_validator(mode="after")
    def _has_content(self) -> SnippetIn:
        for key, value in self.outside.items():
            if not is_finite_number(value):
                shown = show_number(value) if isinstance(value, (int, float)) \
                    else repr(str(value)[:40])
                raise ValueError(f"snippet key {key[:40]!r} == {shown[:60]}; keys other than "
                                 "text, snippet_id, id, score, group and vector are outside "
                                 "scores: finite numbers.")
        if self.text is None and self.score is None and self.vector is None \
                and not self.outside:
            given = sorted(self.model_fields_set) or ["nothing"]
            raise ValueError(
                f"a snippet object needs 'text', 'score' or 'vector'; got {', '.join(given)}."
            )
        return self

    @property
    def outside(self) -> dict[str, Any]:
        """The keys beyond the named fields: outside scores under the filter's field name."""
        return dict(self.model_extra or {})

    def as_item(self) -> dict[str, Any]:
        """The snippet as the mapping :meth:`ConformalFilter.filter` accepts (no vector)."""
        keys = ("text", "snippet_id", "score", "group")
        named = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        return {**self.outside, **named}


class FilterRequest(BaseModel):
    """One query and its retrieved snippets."""

    model_config = ConfigDict(extra="forbid")
    query: StrictStr = Field(min_length=1, description="The query (non-empty).")
    snippets: list[StrictStr | SnippetIn] = Field(
        description="Snippets as strings or objects; at most the service's max_snippets."
    )
    min_keep: StrictInt | None = Field(default=None, ge=0, description=_MIN_KEEP)
    group: GroupName | None = Field(
        default=None,
        description="The query's group, for group-conditional filters (snippets without one).",
    )
    query_vector: list[FiniteNumber] | None = Field(
        default=None,
        min_length=1,
        description="The query's embedding; then every snippet needs a vector of its length "
        "and the scores come from the vectors (no model call).",
    )
    query_id: QueryId | None = Field(default=None, description=_QUERY_ID_IN)


class KeptSnippet(BaseModel):
    """A snippet the filter kept."""

    index: int
    snippet_id: str
    text: str | None
    score: float = Field(description="Its score (for a snippet cut into pieces: the best "
                         "piece's; for a filter of unit 'sentence': its best sentence's).")
    p_value: float | None = Field(default=None, description=_P_VALUE)
    spans: list[tuple[int, int]] = Field(
        default_factory=list,
        description="The character spans [start, end) of its text that were kept: for a filter "
        "of unit 'sentence', one per kept sentence, in order; for a snippet longer than the "
        "filter's window, cut into pieces, the spans of its kept pieces; empty when it was "
        "kept whole.",
    )
    pruned_text: str | None = Field(
        default=None,
        description="Unit 'sentence': the kept sentences joined with a space (what to put in "
        "the context); null for unit 'snippet'.",
    )


class RemovedSnippet(BaseModel):
    """A snippet the filter removed: its score was above the threshold it missed."""

    index: int = Field(description="Position in the request's snippets (or the hits).")
    snippet_id: str
    score: float = Field(description="Its score (for a snippet cut into pieces: the best piece's).")
    p_value: float | None = Field(default=None, description=_P_VALUE)
    threshold: float | None = Field(description="The threshold it missed (null: keep all).")


class FilterResponse(BaseModel):
    """The kept snippets of one ``/filter`` request, and the removed ones."""

    kept: list[KeptSnippet]
    removed: list[RemovedSnippet] = Field(
        default_factory=list, description="The snippets not kept, each with its score.")
    scores: list[float]
    p_values: list[float] = Field(
        default_factory=list, description="The p-value of each snippet's score, aligned with "
        "scores (empty when the artifact stores no calibration evidence).")
    p_value_rule: str | None = Field(default=None, description=_P_VALUE_RULE)
    threshold: float | None = Field(description=_THRESHOLD)
    removal: float
    note: str | None
    guarantee: dict[str, Any]
    n_cut: int = Field(
        default=0,
        description="Snippets longer than the filter's window, cut into pieces and scored "
        "piece by piece (kept when any piece is kept).",
    )
    unit: str = Field(
        default="snippet",
        description="What the filter scores and keeps: 'snippet', or 'sentence' (kept "
        "snippets then carry their kept sentences' spans and pruned_text).",
    )
    query_id: str = Field(description=_QUERY_ID_OUT)
    lists_unlike: bool = Field(default=False, description=_LISTS_UNLIKE)
    lists_note: str | None = Field(default=None, description=_LISTS_NOTE)


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
    unit: str = Field(default="snippet",
                      description="What the filter scores and keeps: 'snippet' or 'sentence'.")
    group_by: str | None = Field(
        default=None, description="Snippet field holding the group (group-conditional filters)."
    )
    scorer: dict[str, Any]
    guarantee: dict[str, Any]
    checksum: str | None = Field(
        default=None, description="The artifact's sha256 seal (changes with every recalibration)."
    )


class QueryRequest(BaseModel):
    """A query answered from the served index."""

    model_config = ConfigDict(extra="forbid")
    query: StrictStr = Field(min_length=1, description="The query (non-empty).")
    k: StrictInt = Field(
        default=20, ge=1, description="Snippets to retrieve; at most the service's max_k."
    )
    min_keep: StrictInt | None = Field(default=None, ge=0, description=_MIN_KEEP)
    group: GroupName | None = Field(
        default=None, description="The query's group, for a filter of the group mode."
    )
    query_id: QueryId | None = Field(default=None, description=_QUERY_ID_IN)


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
    p_value: float | None = Field(default=None, description=_P_VALUE)
    kept: bool


class QueryResponse(BaseModel):
    """The retrieved and filtered snippets of one ``/query`` request."""

    hits: list[HitOut]
    n_kept: int
    removed: list[RemovedSnippet] = Field(
        default_factory=list, description="The hits not kept, each with its score.")
    p_value_rule: str | None = Field(default=None, description=_P_VALUE_RULE)
    threshold: float | None = Field(description=_THRESHOLD)
    removal: float
    note: str | None
    guarantee: dict[str, Any]
    query_id: str = Field(description=_QUERY_ID_OUT)
    lists_unlike: bool = Field(default=False, description=_LISTS_UNLIKE)
    lists_note: str | None = Field(
        default=None, description=_LISTS_NOTE + " /query also says when the served index's top "
        "k are not the retriever the filter was calibrated through.")


class IndexInfo(BaseModel):
    """The served snippet index."""

    name: str = Field(description="The index directory's name (not its path).")
    model: str
    n_snippets: int


class MonitorInfo(BaseModel):
    """The exchangeability monitor: a conformal test martingale over the served scores."""

    alarm: bool = Field(description="True once the martingale reached 1/delta (stays on).")
    martingale: float | None = Field(description="Current value (null when not finite).")
    log10_martingale: float | None
    fired_at: int | None = Field(description="Request number at which the alarm fired.")
    fired_time: str | None = Field(description="ISO-8601 UTC time the alarm fired.")
    n_observed: int = Field(description="Requests observed since start or the last reset.")
    delta: float = Field(description="False-alarm probability bound on exchangeable traffic.")


class MonitorResetResponse(BaseModel):
    """``POST /admin/monitor/reset``: the exchangeability monitor after the reset (its fields
    null when the artifact has none) and which checks were reset."""

    alarm: bool | None = Field(default=None, description="The monitor's alarm (false).")
    martingale: float | None = None
    log10_martingale: float | None = None
    fired_at: int | None = None
    fired_time: str | None = None
    n_observed: int | None = None
    delta: float | None = None
    monitor_reset: bool = Field(description="The exchangeability monitor was reset.")
    lists_reset: bool = Field(description="The list check (alarm, lists seen) was reset; "
                              "false when the artifact records no calibration lists.")


class AdaptiveInfo(BaseModel):
    """The served threshold under ``serve --adaptive`` (adaptive conformal inference)."""

    threshold: float | None = Field(description="Current threshold; null means keep all.")
    alpha_t: float = Field(description="Current working miscoverage.")
    n_updates: int = Field(description="Relevant labelled snippets applied so far.")
    n_errors: int = Field(description="How many of them the threshold in force had dropped.")


class KeepRuleInfo(BaseModel):
    """The threshold in the score's own units: keep a snippet when ``score keep_if threshold``."""

    score: str = Field(description="The score's name, e.g. '1 - cos' or 'bm25'.")
    keep_if: str = Field(description="'<=' or '>='.")
    threshold: float | None = Field(description="In the score's units; null means keep all.")
    score_sign: int = Field(description="Multiply a /filter score or threshold by this (1 or -1) "
                                        "to read it in the keep rule's units.")


class RecentRequest(BaseModel):
    """One answered /filter or /query request: how many snippets it kept of how many."""

    time: str = Field(description="ISO-8601 UTC time of the answer.")
    endpoint: str
    kept: int
    total: int


class StatusResponse(BaseModel):
    """What the page at / shows: the guarantee, the keep rule, the drift state and the last
    requests' removal (this process's last requests)."""

    generation: int = Field(description="The artifact generation this process serves.")
    statement: str = Field(description="The guarantee in plain words.")
    keep_rule: KeepRuleInfo
    monitor: MonitorInfo | None = Field(
        default=None, description="The exchangeability alarm; null when the artifact has no "
                                  "monitor reference.")
    recent: list[RecentRequest] = Field(description="The last answered requests, oldest first.")
    recent_capacity: int = Field(description="How many requests the list holds at most.")


class ListsInfo(BaseModel):
    """The calibration lists and the service's check of the served lists against them (kept
    in the state directory: shared by the workers, kept across restarts on one artifact)."""

    calibration: str = Field(description="Where the calibration lists came from and their "
                             "lengths, in words.")
    source: str = Field(description="'retriever', 'deployed' or 'data' (see docs/deploy.md).")
    list_dependent: bool = Field(description="Whether the score reads the whole list (only then "
                                 "are the served lists checked).")
    n_seen: int = Field(description="Lists checked since this artifact was first served here "
                        "or the last POST /admin/monitor/reset.")
    n_outside: int = Field(description="Of them, lists whose length was outside the "
                           "calibration lengths.")
    alarm: bool = Field(description="True once the sequential test fired (stays on).")
    fired_at: int | None = None
    mean_length: float | None = Field(description="Mean length of the lists checked.")
    calibration_mean_length: float
    delta: float = Field(description="False-alarm bound of the sequential test.")


class Health(BaseModel):
    """``GET /healthz``: status, versions, the artifact, the index and the monitors."""

    status: str
    library_version: str
    artifact: ArtifactInfo
    index: IndexInfo | None = None
    generation: int = Field(
        default=1, description="Artifact generation: 1 at start, +1 per accepted reload."
    )
    published_generation: int | None = Field(
        default=None, description="The newest published generation (the one served unless "
        "'degraded' says why not)."
    )
    degraded: str | None = Field(
        default=None, description="Why this process serves an older generation than the "
        "newest published one (it could not build it); null when it serves the newest."
    )
    monitor: MonitorInfo | None = Field(
        default=None,
        description="Exchangeability monitor; null when the artifact carries no monitor "
        "reference (recalibrate to enable the alarm).",
    )
    adaptive: AdaptiveInfo | None = Field(
        default=None, description="The threshold followed from feedback (serve --adaptive)."
    )
    lists: ListsInfo | None = Field(
        default=None, description="The calibration lists and the check of the served lists "
        "against them (this process's); null for an artifact written before it was recorded.")
    endpoint_note: str | None = Field(
        default=None, description="What the endpoint the served score calls (a reranker) "
        "answered that differs from the artifact's score: another model than the calibrated "
        "one. Null when nothing differs (or the score calls no endpoint).")


class FeedbackItem(BaseModel):
    """One label: was snippet ``snippet_id`` of request ``query_id`` relevant?"""

    model_config = ConfigDict(extra="forbid")
    query_id: QueryId = Field(description="The query_id a /filter or /query answer carried.")
    snippet_id: QueryId = Field(
        description="The snippet's id in that request (/filter: yours or its position; "
        "/query: the hit's snippet_id)."
    )
    relevant: StrictBool | StrictInt = Field(description="true/false or 1/0.")

    @model_validator(mode="before")
    @classmethod
    def _no_score(cls, data: Any) -> Any:
        if isinstance(data, dict) and "score" in data:
            raise ValueError(
                "'score' is not accepted: a label counts with the score the service computed "
                "when it served the snippet (send query_id, snippet_id and relevant only)"
            )
        return data

    @field_validator("relevant")
    @classmethod
    def _zero_or_one(cls, value: bool | int) -> bool:
        if not isinstance(value, bool) and value not in (0, 1):
            raise ValueError(f"relevant == {show_number(value)}, must be true, false, 1 or 0")
        return bool(value)


class FeedbackRequest(BaseModel):
    """``POST /feedback``: a batch of labels (one label is a list of one)."""

    model_config = ConfigDict(extra="forbid")
    items: list[FeedbackItem] = Field(
        min_length=1, description="Labels; at most the service's max_snippets per request."
    )


class FeedbackResponse(BaseModel):
    """What ``POST /feedback`` stored and did.

    Every item is counted once: ``accepted + unknown + over_limit`` is the batch size.
    """

    accepted: int = Field(
        description="Labels stored, each joined to the snippet the service served under this "
        "query_id and the score it computed (a repeated label replaces the earlier one)."
    )
    new: int = Field(description="Accepted labels of (query_id, snippet_id) pairs not labelled "
                                 "before.")
    unknown: int = Field(
        description="Items whose (query_id, snippet_id) the service did not serve with this "
        "scorer within the retention window: counted, never stored."
    )
    over_limit: int = Field(
        description="Items beyond the service's max_labels_per_query for their query_id: "
        "counted, never stored."
    )
    adaptive_updates: int = Field(
        description="Relevant new labels applied to the adaptive threshold (serve --adaptive)."
    )
    adaptive: AdaptiveInfo | None = None


class ReloadResponse(BaseModel):
    """``POST /admin/reload``: the artifact now served."""

    generation: int
    checksum: str | None
    changed: bool = Field(description="The new artifact differs from the one served before.")
    monitor_reset: bool = Field(description="The exchangeability monitor was reset.")
    lists_reset: bool = Field(default=False, description="The list check (alarm, lists seen) "
                              "was reset: only when the artifact changed.")


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
