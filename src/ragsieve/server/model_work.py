"""Model work: every call of a request that may run the model, in one thread, in fair turns.

``/filter`` and ``/query`` are sync endpoints, so requests are parsed, checked and
answered in Starlette's threadpool and served concurrently. Every call that may run the
model (scoring snippet texts, embedding a ``/query`` question) is handed to one
dedicated model thread: the embedding cache serialises model calls anyway, and doing
them all in one thread keeps the model's working memory in one allocator arena instead
of one per pool thread (docs/integrations.md has the measurement).

Model work is fair (:class:`~ragsieve.server.scheduling.FairQueue`): a request's model work
is counted before any of it is done, by the characters the model reads in pieces of 500
(:func:`~ragsieve.server.scheduling.work_pieces`: the query, every snippet piece, every
sentence or piece of a long sentence, and for a sentence filter each snippet read whole as
context; 413 beyond ``max_pieces``, first from a bound on the texts as sent, so that a
request far over the budget is not even cut), then embedded into the scorer's cache in
steps of at most ``PIECES_PER_STEP`` pieces of work
(:func:`~ragsieve.server.scheduling.cost_steps`), one step per waiting request in turn,
and the request's final ``filter`` call (which a list-relative score needs whole) reads
them back from the cache. A small request therefore waits for one step of each request
ahead of it, not for a large request to finish; more than ``max_queue`` waiting requests
get 429 with ``Retry-After``. Requests with vectors or outside scores need no model and stay
in the pool (vectors must have the dimension of the scorer's model).

:class:`ModelWork` is that thread's queue with the service's limits (413 over the budget,
429 when full, both counted in ``ragsieve_refused_requests_total``);
:func:`filter_with_model` is a request's filter call cut into its steps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from ..filter import ConformalFilter
from ..types import FilterResult
from .metrics import ServiceMetrics
from .request_checks import http_error
from .scheduling import (
    PIECE_CHARS,
    PIECE_WORDS,
    FairQueue,
    QueueFull,
    cost_steps,
    least_work,
    text_cost,
    work_pieces,
)

__all__ = ["PIECES_PER_SECOND", "PIECES_PER_STEP", "ModelWork", "filter_with_model"]

# the service's log lines keep the name they have always had (operators filter on it)
logger = logging.getLogger("ragsieve.server.service")

_T = TypeVar("_T")

#: Most model work of one request per turn of the fair model queue, in pieces of 500
#: characters: about what a small request waits for beside a large one (docs/serving.md,
#: "Model work"). Only a single text costing more (the query, or a snippet a
#: sentence filter reads whole) makes a bigger step, bounded by ``max_pieces``.
PIECES_PER_STEP = 8
#: Model throughput assumed for ``Retry-After`` (pieces/s, see ``options.DEFAULT_MAX_PIECES``).
PIECES_PER_SECOND = 50


class ModelWork:
    """The one model thread of a service: a fair queue with a budget per request.

    Parameters
    ----------
    max_pieces : int
        Most model work of one request, in pieces (``--max-pieces``; 413 beyond).
    max_queue : int
        Most requests waiting for model work (``--max-queue``; 429 beyond).
    metrics : ServiceMetrics
        Counts the refusals and shows the queue.
    """

    def __init__(self, *, max_pieces: int, max_queue: int, metrics: ServiceMetrics) -> None:
        self.max_pieces = max_pieces
        self.max_queue = max_queue
        self.metrics = metrics
        self._queue = FairQueue(max_waiting=max_queue, on_change=metrics.set_queue)

    def in_model_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` run in the one model thread, in turn (never refused; exceptions re-raised)."""
        result: _T = self._queue.run([fn], costs=[1], refuse_when_full=False)
        return result

    def check_budget(self, texts: Sequence[str], *, uncut: bool = False,
                     whole_too: bool = False) -> None:
        """413 when reading ``texts`` is more than ``max_pieces`` pieces of model work
        (characters in pieces of 500, :mod:`ragsieve.server.scheduling`).

        Parameters
        ----------
        texts : sequence of str
            The query first, then what the filter hands the model
            (``ConformalFilter.piece_texts``), counted exactly
            (:func:`~ragsieve.server.scheduling.work_pieces`).
        uncut : bool
            ``texts`` are the query and the snippets as sent, counted from below before
            the filter cuts them (:func:`~ragsieve.server.scheduling.least_work`), so a
            request far over the budget costs no cutting either.
        whole_too : bool
            With ``uncut``: the filter also reads each snippet whole (unit sentence).

        Raises
        ------
        fastapi.HTTPException
            413 naming the work, the limit and the unit; counted in
            ``ragsieve_refused_requests_total{reason="max_pieces"}``.
        """
        if uncut:
            n_pieces = least_work(texts[0], texts[1:], whole_too=whole_too)
        else:
            n_pieces = work_pieces(texts)
        if n_pieces <= self.max_pieces:
            return
        self.metrics.refused.labels("max_pieces").inc()
        n_chars = sum(len(t) for t in texts)
        logger.info("request refused (413): %d pieces of model work (%d characters), limit %d",
                    n_pieces, n_chars, self.max_pieces)
        counted = (f"this request's query and {len(texts) - 1:,} snippet(s) come to "
                   f"{n_chars:,} characters, which the model reads at least {n_pieces} "
                   "pieces of, however they are cut" if uncut else
                   f"this request's query, snippets and sentences come to {n_chars:,} "
                   f"characters in {len(texts):,} texts")
        raise http_error(
            413,
            f"request needs {n_pieces} pieces of model work; the limit is "
            f"{self.max_pieces} per request (--max-pieces). A piece is {PIECE_CHARS} "
            f"characters the model reads, or {PIECE_WORDS} words and marks where a text is "
            f"denser: {counted} (a snippet or sentence longer than the filter's window is "
            "read as its pieces; a sentence filter also reads each snippet whole). Send "
            "fewer or shorter snippets, or a shorter query.",
        )

    def run(self, steps: Sequence[Callable[[], Any]], *, costs: Sequence[int]) -> Any:
        """Run ``steps`` in the model thread, in turn with other requests (429 when full)."""
        try:
            return self._queue.run(steps, costs=costs)
        except QueueFull as exc:
            self.metrics.refused.labels("max_queue").inc()
            retry = min(60.0, max(1.0, exc.pending_cost / PIECES_PER_SECOND))
            logger.info("request refused (429): %d requests already wait for model work",
                        exc.waiting)
            raise http_error(
                429,
                f"{exc.waiting} requests are waiting for model work, the limit is "
                f"{self.max_queue} (--max-queue); retry in {math.ceil(retry)} s.",
                retry_after=retry,
            ) from exc

    def close(self) -> None:
        """Stop the model thread (after the step it is running, if any)."""
        self._queue.close()


def filter_with_model(work: ModelWork, use: ConformalFilter, query: str, items: list[Any],
                      group: Any) -> FilterResult:
    """Count the model work (413 over budget: from below on the texts as sent, then
    exactly on the cut), embed it in fair steps of bounded cost, then filter."""
    sent = [t for t in (it if isinstance(it, str) else it.get("text") for it in items)
            if isinstance(t, str)]
    work.check_budget([query, *sent], uncut=True, whole_too=use.unit == "sentence")
    texts = use.piece_texts(items)
    work.check_budget([query, *texts])
    chunks = cost_steps(texts, PIECES_PER_STEP, first_cost=text_cost(query))
    # all chunks but the last go to the cache first (the first with the query); the
    # last step embeds the last chunk and reads the others back (a request of one
    # chunk is a single step)
    steps: list[Callable[[], Any]] = [partial(use.scorer_.prepare, query, c)
                                      for c, _ in chunks[:-1]]
    steps.append(lambda: use.filter(query, items, group=group))
    result: FilterResult = work.run(steps, costs=[cost for _, cost in chunks])
    return result
