"""Workloads for the primitives of issue 26, run by the simulated clients (:class:`sim.scenario.Client`)
on the real code: semaphores (``S<i>``), read-write locks (``R<i>``), elections (``E<i>``), jobs fired
by cron on every client (``J<i>``, ``lockctl run --once-per``'s ``try_get_lock(min_hold=...)``) and
lock events (``RemoteLocker.watch`` of ``L0``, ``S0``, ``E0``), each judged by :mod:`sim.checkers`.

``Config.primitives`` says which run; the ``primitives`` profile of :mod:`sim.search` runs them all,
under every fault family. The counted operations (``Checkers.ops``) are permits, read and write locks
and terms handed to a caller, once-per firings (ran or skipped), and watch events.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from lockclient.errors import ChronolockError, LockCancelled, LockTimeout
from lockclient.locker import RemoteLock
from lockclient.lockid import owner_prefix, primitive_row
from sim.checkers import WatchLog

if TYPE_CHECKING:
    from sim.scenario import Client

__all__ = ["PRIMITIVES", "WORKER_PRIMITIVES", "Primitives", "enabled"]

PRIMITIVES = ("lock", "semaphore", "rwlock", "election", "once", "watch")
WORKER_PRIMITIVES = ("lock", "semaphore", "rwlock", "election")
"""What a client's worker loop picks from; ``once`` and ``watch`` run as tasks of their own."""


def enabled(primitives: str) -> list[str]:
    chosen = list(PRIMITIVES) if primitives == "all" else [p.strip() for p in primitives.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PRIMITIVES))
    if unknown:
        raise ValueError(f"unknown primitives {unknown}; known: {', '.join(PRIMITIVES)}")
    return chosen


class Primitives:
    """The operations of one client process (a new one per incarnation)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sim = client.sim
        self.process = client.process
        self.locker = client.locker

    # -- one acquisition, judged like a lock's ------------------------------------------------------

    def _acquire(
        self,
        row: str,
        mode: str,
        get: Callable[[float | None], RemoteLock],
        try_get: Callable[[], RemoteLock | None],
    ) -> tuple[int, RemoteLock] | None:
        """Invoke, get (or try), record the outcome; the granted lock and its op number, or None."""
        sim, process = self.sim, self.process
        rng, rt = process.rng, process.runtime
        op = sim.next_op()
        trying = rng.random() < 0.15
        timeout = None if trying else rng.choice((1.0, 5.0, 30.0, 30.0, 60.0))
        sim.record(
            "invoke", op=op, client=process.name, lock=row, mode=f"{mode}-try" if trying else mode, timeout=timeout
        )
        sim.checkers.invoked(op, process, row, blocking=not trying)
        try:
            lock = try_get() if trying else get(timeout)
        except LockTimeout:
            sim.stats.timeouts += 1
            sim.record("timeout", op=op)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op)
            return None
        except LockCancelled:
            sim.record("cancelled", op=op)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op)
            return None
        except ChronolockError as exc:
            kind = type(exc).__name__
            sim.stats.errors[kind] = sim.stats.errors.get(kind, 0) + 1
            sim.record("error", op=op, error=kind)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op, error=exc)
            rt.sleep(rng.uniform(0, sim.config.think))
            return None
        sim.checkers.completed(op)
        if lock is None:
            sim.stats.try_busy += 1
            sim.record("busy", op=op)
            rt.sleep(rng.uniform(0, sim.config.think))
            return None
        return op, lock

    def semaphore(self) -> None:
        c, rng = self.sim.config, self.process.rng
        name = f"S{rng.randrange(c.locks)}"
        row = primitive_row(name, "semaphore")
        got = self._acquire(
            row,
            "permit",
            lambda timeout: self.locker.get_semaphore(name, c.limit, timeout),
            lambda: self.locker.try_get_semaphore(name, c.limit),
        )
        if got is not None:
            # No fenced writes: permit holders hold at once, each with its own token (a resource shared by
            # all of them fences per holder, not by the largest token).
            self.client._hold(got[0], row, got[1], mode="permit", primitive="semaphore", write=False)

    def rwlock(self) -> None:
        c, rng = self.sim.config, self.process.rng
        name = f"R{rng.randrange(c.locks)}"
        row = primitive_row(name, "rwlock")
        writer = rng.random() < 0.3
        mode = "write" if writer else "read"
        get = self.locker.get_write_lock if writer else self.locker.get_read_lock
        try_get = self.locker.try_get_write_lock if writer else self.locker.try_get_read_lock
        got = self._acquire(
            row,
            mode,
            lambda timeout: get(name, timeout, max_readers=c.limit),
            lambda: try_get(name, max_readers=c.limit),
        )
        if got is not None:
            # Writers write through a fenced resource (one writer at a time, tokens increasing).
            self.client._hold(got[0], row, got[1], mode=mode, primitive="rwlock", write=writer)

    def election(self) -> None:
        sim, c = self.sim, self.sim.config
        process = self.process
        rng, rt = process.rng, process.runtime
        name = f"E{rng.randrange(c.locks)}"
        election = self.locker.election(name)
        if rng.random() < 0.3:
            invoked = sim.world.now
            try:
                info = election.leader()
            except ChronolockError:
                pass
            else:
                sim.checkers.leader_answer(
                    name, invoked, sim.world.now, None if info is None else (info.owner, info.term)
                )
        op = sim.next_op()
        timeout = rng.choice((1.0, 5.0, 30.0, 60.0))
        sim.record("invoke", op=op, client=process.name, lock=name, mode="campaign", timeout=timeout)
        sim.checkers.invoked(op, process, name, blocking=True)
        try:
            leadership = election.campaign(timeout)
        except LockTimeout:
            sim.record("timeout", op=op)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op)
            return
        except ChronolockError as exc:
            kind = type(exc).__name__
            sim.stats.errors[kind] = sim.stats.errors.get(kind, 0) + 1
            sim.record("error", op=op, error=kind)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op, error=exc)
            rt.sleep(rng.uniform(0, c.think))
            return
        sim.checkers.completed(op)
        if leadership.term != leadership.lock.fencing_token or leadership.owner != leadership.lock.owner:
            sim.checkers.violation("election", f"{name}: term {leadership.term} is not the grant's token")
        self.client._hold(op, name, leadership.lock, primitive="election", release=leadership.resign)

    # -- once per period ---------------------------------------------------------------------------

    def cron(self, job: str) -> None:
        """Cron on this host: fire at every period boundary of this host's *wall clock* (plus this
        host's own jitter, within a quarter of the tolerance), as ``lockctl run --once-per``."""
        sim, c = self.sim, self.sim.config
        process = self.process
        rng, rt = process.rng, process.runtime
        period = c.period
        tolerance = period / 4
        jitter = rng.uniform(-tolerance / 4, tolerance / 4)
        last = -1
        while sim.world.now < sim.end_of_work:
            wall = rt.wall_us() / 1e6
            k = math.floor((wall - jitter) / period) + 1
            if k <= last:  # a wall clock stopped or stepped back: never fire one period twice
                rt.sleep(period / 2)
                continue
            rt.sleep(max(0.0, k * period + jitter - wall))
            if sim.world.now >= sim.end_of_work:
                return
            last = k
            op = sim.next_op()
            invoked = sim.world.now
            sim.record("invoke", op=op, client=process.name, lock=job, mode="once", timeout=None)
            sim.checkers.invoked(op, process, job, blocking=False)
            try:
                lock = self.locker.try_get_lock(job, min_hold=period - tolerance)
            except ChronolockError as exc:
                sim.record("error", op=op, error=type(exc).__name__)
                sim.checkers.completed(op, error=exc)
                sim.checkers.once_fired(job, k, False, invoked)
                continue
            sim.checkers.completed(op)
            sim.checkers.once_fired(job, k, lock is not None, invoked)
            if lock is None:
                sim.record("skipped", op=op)
                continue
            # The job runs for up to a quarter period, then lockctl releases (parking the record).
            self.client._hold(op, job, lock, primitive=None, run_for=rng.uniform(0, period / 4), once=job)

    # -- lock events --------------------------------------------------------------------------------

    def watch(self, name: str, kind: Literal["lock", "semaphore", "rwlock"]) -> None:
        """``RemoteLocker.watch`` for the whole run, every event judged as it comes."""
        sim = self.sim
        row = name if kind == "lock" else primitive_row(name, kind)
        log = WatchLog(row, self.process)
        sim.checkers.watching(log)
        poll = self.process.rng.choice((0.05, 0.2, 1.0))
        while sim.world.now < sim.end:
            try:
                for event in self.locker.watch(name, kind=kind, poll=poll):
                    sim.checkers.watch_event(log, event)
            except ChronolockError as exc:
                # The store away: a watch raises; the application starts another (which reports the
                # state it finds as initial, and nothing in between: a fresh log judges it).
                sim.record("watch_error", error=type(exc).__name__)
                log = WatchLog(row, self.process)
                sim.checkers.watching(log)
                self.process.runtime.sleep(poll)
