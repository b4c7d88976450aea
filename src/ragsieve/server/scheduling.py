"""Fair scheduling of model work: one model thread, one step per waiting request in turn.

Every call that may run the model is a *job* of one or more steps (callables) run in the
service's single model thread (the reason for one thread is in
:mod:`ragsieve.server.model_work`). The thread takes the job at the head of the queue, runs
its next step and, when the job has steps left, puts it at the back. A request of 4,000
snippet pieces is cut into steps of a few pieces, so a small request that arrives
meanwhile waits for one step of each job ahead of it, never for the whole large job.

Work is counted as the model pays for it: by the characters it reads, in *pieces* of
:data:`PIECE_CHARS` (500) characters (:func:`work_pieces`), whatever the text is (a snippet
piece, a sentence or a piece of a long one, a snippet read whole as a sentence's context, the
query), and at least :data:`MIN_TEXT_CHARS` per text; a text denser in tokens than prose
(``"a. a. a."``, Chinese) counts by its words and marks instead, :data:`PIECE_WORDS` a
piece, when that is more. :func:`cost_steps` packs a request's
texts into steps of at most a given cost (a text above it is a step of its own): that is
what bounds a step, since a request's texts are at most ~600 characters each once long
snippets and long sentences are cut, but for the query and the snippets a sentence filter
reads whole, which the per-request budget bounds.

A job's result is what its last step returns; an exception raised by any step ends the
job and is re-raised to its caller. At most ``max_waiting`` jobs are queued at once
(:class:`QueueFull` beyond, the service's 429).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["MIN_TEXT_CHARS", "PIECE_CHARS", "PIECE_WORDS", "FairQueue", "QueueFull",
           "cost_steps", "least_work", "text_cost", "work_pieces"]

logger = logging.getLogger(__name__)

#: Characters of model input that make one piece of model work: the chunker's window
#: (``ragsieve.chunking.DEFAULT_SIZE``), the piece the budget is sized in.
PIECE_CHARS = 500
#: Least a text counts for, in characters: a short text still costs a tokenizer call and a
#: row of the model's batch.
MIN_TEXT_CHARS = 50
#: Words, numbers and punctuation marks (each CJK character one) that make one piece: a
#: 500-character piece of prose holds fewer, so prose counts by its characters. The model's
#: cost follows its tokens, so a text denser in them (``"a. "`` repeated, Chinese) counts
#: more pieces than its characters (docs/serving.md, "Model work").
PIECE_WORDS = 100
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORDS = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+|[^\\w\\s]")


def text_cost(text: str) -> float:
    """The model work of reading ``text``, in pieces of :data:`PIECE_CHARS` characters, or
    of :data:`PIECE_WORDS` words and marks where that is more.

    Examples
    --------
    >>> text_cost("x" * 1000), text_cost("short"), text_cost("a. " * 100)
    (2.0, 0.1, 2.0)
    """
    chars = max(len(text), MIN_TEXT_CHARS) / PIECE_CHARS
    return max(chars, len(_WORDS.findall(text)) / PIECE_WORDS)


def work_pieces(texts: Iterable[str]) -> int:
    """The model work of reading ``texts``: their :func:`text_cost` summed, rounded up.

    Examples
    --------
    >>> work_pieces(["a question?", "x" * 600, "y" * 400])  # 0.1 + 1.2 + 0.8
    3
    >>> work_pieces(["word " * 198_000]), work_pieces(["a. " * 330_000])  # ~1 MB each
    (1980, 6600)
    """
    return math.ceil(round(sum(text_cost(t) for t in texts), 9))


def least_work(query: str, snippets: Iterable[str], *, whole_too: bool = False) -> int:
    """A lower bound of a request's :func:`work_pieces`, from its texts as sent (no cutting).

    However a filter cuts a snippet (into windows, sentences or pieces of a long sentence),
    its pieces hold every character of it but whitespace at least once; with ``whole_too``
    (a sentence filter) every snippet with a sentence is also read whole, as context. A
    request whose bound is over the budget is refused before it is cut (cutting a 1 MB
    sentence is itself about a second of CPU).

    Parameters
    ----------
    query : str
        The request's query (read whole).
    snippets : iterable of str
        The snippets' texts as sent.
    whole_too : bool
        Each non-blank snippet is read whole besides its pieces.

    Returns
    -------
    int
        Pieces of work, rounded up; at most :func:`work_pieces` of what the filter reads.

    Examples
    --------
    >>> least_work("q", ["a. " * 1000]), least_work("q", ["a. " * 1000], whole_too=True)
    (5, 11)
    """
    chars = max(len(query), MIN_TEXT_CHARS)
    for text in snippets:
        visible = len("".join(text.split()))  # the characters that are not whitespace
        chars += visible + (len(text) if whole_too and visible else 0)
    return math.ceil(round(chars / PIECE_CHARS, 9))


def cost_steps(texts: Sequence[str], max_cost: float, *, first_cost: float = 0.0
               ) -> list[tuple[list[str], int]]:
    """``texts`` packed in order into steps of at most ``max_cost`` pieces of work each.

    Parameters
    ----------
    texts : sequence of str
        What the steps read, in order.
    max_cost : float
        Most work of one step (:func:`text_cost` summed); a text that costs more is a
        step of its own.
    first_cost : float
        Work the first step does besides its texts (the query it embeds).

    Returns
    -------
    list of (list of str, int)
        Each step's texts and its cost rounded up (at least 1); one empty step when
        ``texts`` is empty.

    Examples
    --------
    >>> [(len(c), cost) for c, cost in cost_steps(["x" * 500] * 5 + ["y" * 3000], 2)]
    [(2, 2), (2, 2), (1, 1), (1, 6)]
    """
    steps: list[tuple[list[str], int]] = []
    chunk: list[str] = []
    cost = first_cost
    for text in texts:
        more = text_cost(text)
        if chunk and cost + more > max_cost:
            steps.append((chunk, max(1, math.ceil(round(cost, 9)))))
            chunk, cost = [], 0.0
        chunk.append(text)
        cost += more
    steps.append((chunk, max(1, math.ceil(round(cost, 9)))))
    return steps


class QueueFull(RuntimeError):
    """The queue holds ``max_waiting`` jobs already.

    Attributes
    ----------
    waiting : int
        Jobs in the queue.
    pending_cost : int
        Their remaining cost (snippet pieces).
    """

    def __init__(self, waiting: int, pending_cost: int) -> None:
        super().__init__(f"{waiting} requests are waiting for model work "
                         f"({pending_cost} pieces); the queue is full.")
        self.waiting = waiting
        self.pending_cost = pending_cost


class _Job:
    """One caller's steps, what is left of its cost, and its future."""

    __slots__ = ("costs", "future", "started", "steps")

    def __init__(self, steps: Sequence[Callable[[], Any]], costs: Sequence[int]) -> None:
        self.steps = deque(steps)
        self.costs = deque(costs)
        self.future: Future[Any] = Future()
        self.started = False


class FairQueue:
    """Jobs run step by step in one thread, round-robin across the waiting jobs.

    Parameters
    ----------
    max_waiting : int
        Most jobs queued (running or waiting) at once; :meth:`submit` raises
        :class:`QueueFull` beyond it unless called with ``refuse_when_full=False``.
    on_change : callable, optional
        ``(waiting_jobs, pending_cost)``, called after every change of the queue (for the
        service's gauges); its errors are logged.
    name : str
        Name of the thread.

    Examples
    --------
    >>> q = FairQueue(max_waiting=4)
    >>> q.run([lambda: 1, lambda: 2], costs=[1, 1])
    2
    >>> q.close()
    """

    def __init__(self, *, max_waiting: int,
                 on_change: Callable[[int, int], None] | None = None,
                 name: str = "ragsieve-model") -> None:
        self.max_waiting = max_waiting
        self._on_change = on_change
        self._jobs: deque[_Job] = deque()
        self._pending_cost = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs in the queue (the one running included)."""
        return len(self._jobs)

    @property
    def pending_cost(self) -> int:
        """The cost of the steps not run yet, summed over the queued jobs."""
        return self._pending_cost

    def submit(self, steps: Sequence[Callable[[], Any]], *, costs: Sequence[int],
               refuse_when_full: bool = True) -> Future[Any]:
        """Queue a job of ``steps`` (``costs[i]`` is what step ``i`` costs); its future.

        Raises
        ------
        QueueFull
            ``max_waiting`` jobs are queued already (and ``refuse_when_full``).
        RuntimeError
            The queue was closed.
        """
        if not steps or len(steps) != len(costs):
            raise ValueError(f"got {len(steps)} steps and {len(costs)} costs; expected as "
                             "many costs as steps, and at least one step.")
        job = _Job(steps, costs)
        with self._cond:
            if self._closed:
                raise RuntimeError("the model queue is closed (the service is stopping).")
            if refuse_when_full and len(self._jobs) >= self.max_waiting:
                raise QueueFull(len(self._jobs), self._pending_cost)
            self._jobs.append(job)
            self._pending_cost += sum(costs)
            self._cond.notify()
            self._changed()
        return job.future

    def run(self, steps: Sequence[Callable[[], Any]], *, costs: Sequence[int],
            refuse_when_full: bool = True) -> Any:
        """:meth:`submit` and wait: the last step's result (or the first step's exception)."""
        return self.submit(steps, costs=costs, refuse_when_full=refuse_when_full).result()

    def close(self) -> None:
        """Stop after the step that is running; the jobs still waiting are cancelled.

        The running job's caller gets ``RuntimeError`` after its step, unless it was the
        job's last."""
        with self._cond:
            self._closed = True
            running = [j for j in list(self._jobs)[:1] if j.started]
            dropped = [j for j in self._jobs if j not in running]
            self._jobs = deque(running)
            self._pending_cost = sum(sum(j.costs) for j in running)
            self._cond.notify_all()
            self._changed()
        for job in dropped:
            job.future.cancel()

    # ------------------------------------------------------------------ the thread
    def _next(self) -> tuple[_Job, Callable[[], Any], int] | None:
        """The head job and its next step (None once closed)."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            job = self._jobs[0]
            return job, job.steps.popleft(), job.costs.popleft()

    def _loop(self) -> None:
        while (got := self._next()) is not None:
            job, step, cost = got
            if not job.started:
                job.started = True
                if not job.future.set_running_or_notify_cancel():  # cancelled while queued
                    self._finish(job, cost, done=True)
                    continue
            try:
                value = step()
            except Exception as exc:  # noqa: BLE001 - handed to the caller, which re-raises it
                self._finish(job, cost, done=True)
                job.future.set_exception(exc)
                continue
            done = not job.steps
            if not self._finish(job, cost, done=done):
                job.future.set_exception(
                    RuntimeError("the model queue was closed (the service is stopping)."))
            elif done:
                job.future.set_result(value)

    def _finish(self, job: _Job, cost: int, *, done: bool) -> bool:
        """After a step: the job leaves the queue, or goes to its back (False: closed)."""
        with self._cond:
            if self._jobs and self._jobs[0] is job:
                self._jobs.popleft()
            requeue = not done and not self._closed
            if requeue:
                self._jobs.append(job)
            self._pending_cost -= cost + (0 if requeue else sum(job.costs))
            self._pending_cost = max(self._pending_cost, 0)
            self._changed()
            return done or requeue

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(len(self._jobs), self._pending_cost)
        except Exception:  # pragma: no cover - a gauge update does not raise
            logger.exception("model queue gauge update failed")
