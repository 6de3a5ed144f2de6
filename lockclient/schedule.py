"""Periodic jobs on a clock the caller owns: a sans-IO schedule, and its asyncio driver.

Every periodic job of timesvc (the TryUpdateGlobalTime tick) and leasewatch (scans, due checks,
partition heartbeats, garbage collection, trends, the timesvc poll) runs from a
:class:`PeriodicSchedule`. They used to be APScheduler 3 interval jobs, and APScheduler 3 plans
with ``datetime.now()``: after the host's wall clock stepped back 60 s, *nothing* ran for 60 s —
no tick, no scan, no revocation (issue 22, finding 3). APScheduler has no monotonic time source
(4.x, which has pluggable clocks, is a pre-release), so the jobs moved off it.

:class:`PeriodicSchedule` owns no clock, thread or task — it is told the time (any monotonic
seconds: asyncio's ``loop.time()`` in the services, virtual time in a simulator) and answers
which jobs are due. Rules, per job:

* a job is due when ``now >= next_at``; :meth:`PeriodicSchedule.due` marks it started, and it is
  not due again until :meth:`PeriodicSchedule.done` says it finished (one instance at a time);
* the next run is one ``period`` after the *start* of the previous one, or at once if that moment
  has already passed when the run ends — a run that overran its period is followed by exactly one
  run, never by a pile of missed ones.

:func:`run_schedule` is the driver for asyncio: it starts each due job as a task, sleeps until the
next one is due (``asyncio.sleep``-style timers run on the event loop's monotonic clock), and is
woken early when a job finishes. A wall-clock step, in either direction, changes nothing.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass

from lockclient.logs import get_logger

__all__ = ["PeriodicSchedule", "run_schedule"]

log = get_logger("lockclient.schedule")


@dataclass(slots=True)
class _Job:
    period: float
    next_at: float
    started_at: float | None = None
    """When the running instance started (None: not running)."""


class PeriodicSchedule:
    """Which periodic jobs are due at a given moment. Pure: no clock, thread or task of its own.

    Times are seconds on any monotonic clock the caller chooses, used consistently."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def add(self, name: str, period: float, *, first_at: float) -> None:
        """A job that runs every ``period`` seconds, first at ``first_at``."""
        if name in self._jobs:
            raise ValueError(f"job {name!r} is already scheduled")
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(f"period of job {name!r} must be positive and finite, got {period}")
        if not math.isfinite(first_at):
            raise ValueError(f"first_at of job {name!r} must be finite, got {first_at}")
        self._jobs[name] = _Job(period, first_at)

    @property
    def names(self) -> list[str]:
        return list(self._jobs)

    def period(self, name: str) -> float:
        return self._jobs[name].period

    def running(self, name: str) -> bool:
        return self._jobs[name].started_at is not None

    def due(self, now: float) -> list[str]:
        """The jobs due at ``now`` that are not running, in the order they were added; each is
        marked started at ``now``."""
        started = []
        for name, job in self._jobs.items():
            if job.started_at is None and job.next_at <= now:
                job.started_at = now
                started.append(name)
        return started

    def done(self, name: str, now: float) -> None:
        """The run of ``name`` started by :meth:`due` ended at ``now``: the next run is one period
        after that start, or ``now`` if that has passed already."""
        job = self._jobs[name]
        if job.started_at is None:
            raise ValueError(f"job {name!r} is not running")
        job.next_at = max(job.started_at + job.period, now)
        job.started_at = None

    def next_at(self) -> float | None:
        """When the earliest job that is not running is due (None: every job is running, or none
        is scheduled)."""
        return min((job.next_at for job in self._jobs.values() if job.started_at is None), default=None)


async def run_schedule(
    schedule: PeriodicSchedule,
    jobs: Mapping[str, Callable[[], Awaitable[object]]],
    *,
    name: str = "schedule",
) -> None:
    """Run ``schedule`` on this event loop's monotonic clock until cancelled.

    Each due job runs as its own task (a slow scan does not hold up the 50 ms due check); an
    exception in a job is logged and the job keeps its schedule. Cancelling the driver cancels
    the jobs still running."""
    missing = set(schedule.names) - set(jobs)
    if missing:
        raise ValueError(f"no callable for scheduled jobs {sorted(missing)}")
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()
    running: set[asyncio.Task[None]] = set()

    async def run(job: str) -> None:
        try:
            await jobs[job]()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one failing run must not stop the schedule
            log.error("job_failed", schedule=name, job=job, error=str(exc), error_type=type(exc).__name__)
        finally:
            schedule.done(job, loop.time())
            changed.set()

    try:
        while True:
            # No await between reading the schedule and clearing the event: a job that ends while
            # we sleep always wakes us (its done() happens after the clear).
            changed.clear()
            for job in schedule.due(loop.time()):
                task = asyncio.create_task(run(job), name=f"{name}:{job}")
                running.add(task)
                task.add_done_callback(running.discard)
            next_at = schedule.next_at()
            timeout = None if next_at is None else max(0.0, next_at - loop.time())
            with suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
    finally:
        for task in list(running):
            task.cancel()
        for task in list(running):
            with suppress(asyncio.CancelledError, Exception):
                await task
