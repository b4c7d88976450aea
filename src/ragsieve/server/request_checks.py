"""What a request to the service is checked for, and the library's errors as HTTP answers.

The checks run on a parsed request (:mod:`ragsieve.server.schemas`) before any model work,
each raising an :class:`~fastapi.HTTPException` with a one-line ``detail`` that names what
was received and what is expected: a blank query, more snippets or a larger ``min_keep``
than a request may have (413 / 422), a repeated snippet id, vectors of another dimension
than the served scorer's model makes, outside scores the served filter does not read.
Around the filter call, :func:`bad_request_as_422` and :func:`upstream_as_502` turn the
library's errors into answers, and :func:`state_unavailable` a state file that cannot be
written into 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import fastapi
import numpy as np

from ..errors import DataError, RerankError
from .feedback import FeedbackStore
from .parsing import BUSY_RETRY_AFTER, printable
from .schemas import FilterRequest

__all__ = ["bad_request_as_422", "check_min_keep", "check_outside_scores", "check_query",
           "check_vector_dim", "http_error", "model_of", "request_snippet_ids", "show_int",
           "snippet_vectors", "state_unavailable", "upstream_as_502"]

# the service's log lines keep the name they have always had (operators filter on it)
logger = logging.getLogger("ragsieve.server.service")


def http_error(status: int, detail: str, *,
               retry_after: float | None = None) -> fastapi.HTTPException:
    """An ``HTTPException`` with a one-line JSON ``detail`` (and ``Retry-After`` seconds)."""
    headers = None if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}
    return fastapi.HTTPException(status_code=status, detail=detail, headers=headers)


@contextmanager
def bad_request_as_422() -> Iterator[None]:
    """Turn the library's errors about a request (bad values, types, data) into 422."""
    try:
        yield
    except (DataError, ValueError, TypeError) as exc:
        message = printable(str(exc))
        logger.info("request refused (422): %s", message)
        raise http_error(422, message) from exc


@contextmanager
def upstream_as_502() -> Iterator[None]:
    """Turn a failure of the endpoint a score calls (a reranker that is down, refuses or
    answers out of shape, after its retries) into 502 Bad Gateway naming it: the request
    was fine, the service behind the filter was not. Logged; never a score."""
    try:
        yield
    except RerankError as exc:
        message = printable(str(exc))
        logger.warning("upstream reranker failed (502): %s", message)
        raise http_error(502, f"the reranker this filter's score calls failed: {message}"
                         ) from exc


def request_snippet_ids(request: FilterRequest) -> list[str]:
    """Each snippet's id (its own, else its position), refusing a repeated one with 422: the
    served record keys a snippet by (query_id, snippet_id), so ``POST /feedback`` on a
    repeated id would label another snippet than the one meant."""
    ids = [str(i) if isinstance(s, str) or s.snippet_id is None else s.snippet_id
           for i, s in enumerate(request.snippets)]
    first: dict[str, int] = {}
    for i, sid in enumerate(ids):
        if sid in first:
            raise http_error(
                422, f"snippets[{i}].snippet_id == {printable(sid)[:80]!r} repeats "
                     f"snippets[{first[sid]}]'s (a snippet without an id takes its position as "
                     "its id); every snippet of a request needs its own id, or POST /feedback "
                     "would label another snippet than the one meant.")
        first[sid] = i
    return ids


def check_query(query: str) -> None:
    if not query.strip():
        raise http_error(422, "query is blank; expected a non-empty string.")


def show_int(value: int) -> str:
    """``value`` for an error message (a description when it is very long)."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 20 else f"a {digits}-digit number"


def check_min_keep(min_keep: int | None, limit: int, what: str) -> None:
    if min_keep is not None and min_keep > limit:
        raise http_error(
            422,
            f"min_keep == {show_int(min_keep)}, must be <= {limit} (the {what} a request "
            "may have).",
        )


def check_vector_dim(dim: int, scorer_dim: int | None, spec: Mapping[str, Any]) -> None:
    """422 unless the request's vectors have the dimension the served scorer takes."""
    if scorer_dim is None:
        raise http_error(
            422,
            f"the served scorer ({spec.get('scorer')}) does not score from vectors; send the "
            "snippets' texts (or outside scores) without 'query_vector' and 'vector'.",
        )
    if dim != scorer_dim:
        raise http_error(
            422,
            f"query_vector and the snippet vectors have dimension {dim}; the served scorer's "
            f"model ({model_of(spec)}) makes vectors of dimension "
            f"{scorer_dim}. Embed with that model.",
        )


def model_of(spec: Mapping[str, Any]) -> Any:
    """The embedding model named by a scorer spec (or by its base scorer's)."""
    base = spec.get("base")
    return spec.get("model") or (base.get("model") if isinstance(base, Mapping) else base)


def snippet_vectors(request: FilterRequest) -> np.ndarray | None:
    """The ``(n, dim)`` snippet vectors of a request with ``query_vector``, else None.

    Raises 422 when a snippet lacks a vector or its length differs from the query's,
    and when snippets carry vectors but the request has no ``query_vector``.
    """
    snippets = request.snippets
    if request.query_vector is None:
        carrying = [i for i, s in enumerate(snippets) if not isinstance(s, str) and s.vector]
        if carrying:
            raise http_error(
                422,
                f"snippet {carrying[0]} has a 'vector' but the request has no 'query_vector'; "
                "send the query's vector too, or drop the snippet vectors.",
            )
        return None
    dim = len(request.query_vector)
    for i, s in enumerate(snippets):
        vector = None if isinstance(s, str) else s.vector
        if vector is None or len(vector) != dim:
            got = "no 'vector'" if vector is None else f"a vector of length {len(vector)}"
            raise http_error(
                422,
                f"snippet {i} has {got}; with a query_vector of length {dim} every snippet "
                f"must be an object with a 'vector' of length {dim}.",
            )
    rows = [s.vector for s in snippets if not isinstance(s, str)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), dim)


def check_outside_scores(request: FilterRequest, scorer: Any) -> None:
    """422 for an outside score the served filter does not read (never ignored).

    A filter calibrated on an outside score reads it as ``score`` or under its field name
    (e.g. ``bm25``); any other filter reads none.
    """
    field = scorer.outside_field()
    for i, s in enumerate(request.snippets):
        if isinstance(s, str):
            continue
        extra = sorted(s.outside)
        if field is None and (s.score is not None or extra):
            given = ["score"] if s.score is not None else []
            raise http_error(422, f"snippet {i} has {given + extra}, but this filter scores "
                                  f"{scorer.keep_rule(0.0).score} and reads no outside score; "
                                  "drop them.")
        unknown = [k for k in extra if k != field]
        if unknown:
            raise http_error(422, f"snippet {i} has unknown key(s) {unknown}; this filter reads "
                                  f"its outside score as {field!r} (or 'score').")
        if field in extra and s.score is not None and field != "score":
            raise http_error(422, f"snippet {i} has both 'score' and {field!r}; they name the "
                                  "same outside score: give one.")


def state_unavailable(store: FeedbackStore, exc: sqlite3.Error) -> fastapi.HTTPException:
    """503 with ``Retry-After`` for a state file that could not be written (logged)."""
    logger.error("feedback database %s: %s; answered 503", store.path, exc)
    return http_error(503, f"the service's state file is unavailable ({printable(str(exc))}); "
                           f"nothing was stored, retry after {BUSY_RETRY_AFTER} s.",
                      retry_after=BUSY_RETRY_AFTER)

