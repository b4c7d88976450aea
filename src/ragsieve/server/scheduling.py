"""Fair scheduling of model work: one model thread, one step per waiting request in turn.

Every call that may run the model is a *job* of one or more steps (callables) run in the
service's single model thread (the reason for one thread is in
:mod:`ragsieve.server.service`). The thread takes the job at the head of the queue, runs
its next step and, when the job has steps left, puts it at the back. A request of 4,000
snippet pieces is cut into steps of a few dozen pieces, so a small request that arrives
meanwhile waits for one step of each job ahead of it, never for the whole large job.

A job's result is what its last step returns; an exception raised by any step ends the
job and is re-raised to its caller. At most ``max_waiting`` jobs are queued at once
(:class:`QueueFull` beyond, the service's 429).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["FairQueue", "QueueFull"]

logger = logging.getLogger(__name__)


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
