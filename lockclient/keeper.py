"""The keeper: renews every lease of one :class:`~lockclient.locker.RemoteLocker`, fires
lost signals on time, and finishes store work the caller could not wait for.

Two kinds of thread, so that a slow store can never delay what must be on time:

* one **dispatcher** thread that never calls the store. It keeps a schedule (a heap)
  of renewals, expiry checks and deferred tasks, and hands due work to the workers.
  Expiry checks fire ``lock.lost`` at ``valid_until`` exactly, whatever the store does;
* a small pool of **workers** that make the store calls. One lease's renewal stuck
  for seconds in a compare-and-set occupies one worker; every other lease is renewed
  on time by the others (issue: "one slow compare-and-set on lock X delayed lock Y's
  renewal *and* Y's loss signal"). A lease is never renewed twice at once.

Holder renewals go out in batches (:meth:`CellStore.compare_and_set_many`: one round trip for
the batch on Cassandra): those due within 50 ms of each other, and — when every worker already
has a renewal batch to do — every renewal that came due meanwhile, kept back until a worker
is free and then sent together. So a slow store delays renewals by about a round trip, not by a
queue of one-renewal batches (issue 27: 10,000 leases in one process on a loaded ring).

Deferred tasks are store work that must eventually happen but need not happen on the
caller's path: the rest of a release whose store call failed, withdrawing a queue cell
after a cancelled wait, notifying leasewatch. Each is retried with back-off until it
succeeds or its time is up (by then leasewatch clears what is left).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from lockclient.lease import HeldLease, WaiterLease
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Event, Pool, Runtime, Task
from lockclient.store import CellStore

__all__ = ["Keeper"]

log = get_logger("lockclient.keeper")

_RENEW, _EXPIRE, _TASK = "renew", "expire", "task"

BATCH_MAX = 256
"""Holder renewals sent together at most (one transaction on SQLite, overlapped on Cassandra)."""
BUSY_RETRY_S = 0.01
"""A holder renewal that could not run because its lease was busy is tried again this much later."""
BATCH_AHEAD_S = 0.05
"""A renewal due this soon joins a batch now: renewing a few milliseconds early costs nothing."""


@dataclass(eq=False)
class _Task:
    run: Callable[[], object]
    """Returns normally when done; raising (or returning False) means try again later."""
    what: str
    lock_id: str
    give_up_at: float | None
    done: Event
    """Set once it succeeded or was given up."""
    on_done: Callable[[bool], None] | None = None
    """Called once with True (it succeeded) or False (given up)."""
    pause: float = 0.05
    attempts: int = 0


class Keeper:
    """Renewals, expiry and deferred store work for one locker. Thread-safe."""

    def __init__(
        self,
        store: CellStore,
        next_timestamp: Callable[[], int],
        *,
        workers: int = 8,
        runtime: Runtime = THREADS,
        name: str = "chronolock-keeper",
    ) -> None:
        self._store = store
        self._next_timestamp = next_timestamp
        self._runtime = runtime
        self._monotonic = runtime.monotonic
        self._name = name
        self._workers = workers
        self._cond = runtime.condition()
        self._heap: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._holders: set[HeldLease] = set()
        self._waiters: set[WaiterLease] = set()
        self._busy: set[object] = set()
        self._tasks: set[_Task] = set()
        self._renewing = 0
        """Holder renewal batches handed to the pool and not finished yet."""
        self._backlog: list[HeldLease] = []
        """Holder renewals that came due while every worker was busy: sent as one batch when one is free."""
        self._pool: Pool | None = None
        self._thread: Task | None = None
        self._closed = False

    # -- registration ----------------------------------------------------------------

    def add_holder(self, lease: HeldLease) -> None:
        with self._cond:
            self._check_open()
            self._holders.add(lease)
            self._push(lease.next_due(), _RENEW, lease)
            self._push(lease.valid_until(), _EXPIRE, lease)

    def add_waiter(self, lease: WaiterLease) -> None:
        with self._cond:
            self._check_open()
            self._waiters.add(lease)
            self._push(lease.next_due(), _RENEW, lease)

    def remove(self, lease: HeldLease | WaiterLease) -> None:
        with self._cond:
            if isinstance(lease, HeldLease):
                self._holders.discard(lease)
            else:
                self._waiters.discard(lease)

    def defer(
        self,
        run: Callable[[], object],
        *,
        what: str,
        lock_id: str,
        give_up_after: float | None = None,
        on_done: Callable[[bool], None] | None = None,
        delay: float = 0.0,
    ) -> Event:
        """Run ``run`` on a worker now (or ``delay`` seconds from now), and again with back-off
        while it raises or returns False, for at most ``give_up_after`` seconds more (None: until
        the keeper closes). Returns an event set when it succeeded or was given up;
        ``on_done(succeeded)`` runs then (on a worker thread)."""
        now = self._monotonic() + delay
        task = _Task(
            run, what, lock_id, None if give_up_after is None else now + give_up_after, self._runtime.event(), on_done
        )
        with self._cond:
            if self._closed:
                task.done.set()
                if on_done is not None:
                    on_done(False)
                return task.done
            self._tasks.add(task)
            self._push(now, _TASK, task)
        return task.done

    def pending_tasks(self) -> int:
        with self._cond:
            return len(self._tasks)

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for deferred tasks, then stop. Leases stop being renewed."""
        deadline = self._monotonic() + timeout
        with self._cond:
            tasks = list(self._tasks)
        for task in tasks:
            task.done.wait(max(0.0, deadline - self._monotonic()))
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._holders.clear()
            self._waiters.clear()
            self._cond.notify_all()
            pool, thread = self._pool, self._thread
        if pool is not None:
            pool.shutdown()
        if thread is not None and self._runtime.task_name() != self._name:
            thread.join(timeout=1.0)

    # -- scheduling ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the locker is closed")

    def _push(self, when: float, kind: str, target: object) -> None:
        """Caller holds the condition."""
        heapq.heappush(self._heap, (when, next(self._seq), kind, target))
        if self._thread is None:
            self._pool = self._runtime.pool(self._workers, name=f"{self._name}-worker")
            self._thread = self._runtime.spawn(self._dispatch_forever, name=self._name)
        else:
            self._cond.notify()

    def _dispatch_forever(self) -> None:
        while True:
            with self._cond:
                work: Callable[[], None] | None = None
                renewal = False
                while work is None:
                    if self._closed:
                        return
                    now = self._monotonic()
                    if self._backlog and self._renewing < self._workers:
                        work = self._backlog_batch(now)
                        renewal = True
                        continue
                    if self._heap and self._heap[0][0] <= now:
                        _, _, kind, target = heapq.heappop(self._heap)
                        holder = target if kind == _RENEW and isinstance(target, HeldLease) else None
                        renewal = holder is not None
                        if (
                            holder is not None
                            and self._renewing >= self._workers
                            and self._store.batches_compare_and_set
                        ):
                            # Every worker has a holder renewal batch to do (a slow store: each takes
                            # a round trip of seconds on a loaded ring). Handing this renewal to the
                            # pool now would queue it there as a batch of its own, behind them:
                            # renewals due at a steady rate would go one or two per round trip,
                            # falling further behind (seen on the ring: 10,000 leases in one process
                            # renewed up to 48 s late). Kept here, every renewal that comes due
                            # meanwhile goes in the next batch — one round trip for all of them.
                            # Only holder renewals count: waiter renewals and deferred tasks in the
                            # pool never hold a holder's renewal back longer than they did before.
                            self._backlog.append(holder)
                            continue
                        work = self._claim(kind, target)
                        if work is not None and holder is not None and self._store.batches_compare_and_set:
                            batch = self._more_holders_due(holder, now)
                            if len(batch) > 1:
                                work = partial(self._renew_holders, batch)
                        continue
                    self._cond.wait(None if not self._heap else min(self._heap[0][0] - now, 1.0))
                pool = self._pool
                if renewal:
                    self._renewing += 1
                    work = partial(self._renewal_done_after, work)
            if pool is None:
                return
            try:
                pool.submit(work)
            except RuntimeError:  # shut down meanwhile
                return

    def _renewal_done_after(self, work: Callable[[], None]) -> None:
        """Run a holder renewal's ``work`` on a worker; then the dispatcher may send the next batch."""
        try:
            work()
        finally:
            with self._cond:
                self._renewing -= 1
                self._cond.notify()

    def _backlog_batch(self, now: float) -> Callable[[], None] | None:
        """One batch of the renewals waiting for a worker, oldest first, with any others due by now
        (caller holds the condition). None if none of them still needs renewing."""
        backlog, self._backlog = self._backlog[:BATCH_MAX], self._backlog[BATCH_MAX:]
        batch = []
        for lease in backlog:
            if lease in self._holders and lease not in self._busy:
                self._busy.add(lease)
                batch.append(lease)
        if not batch:
            return None
        if len(batch) < BATCH_MAX:
            batch += self._more_holders_due(None, now, BATCH_MAX - len(batch))
        return partial(self._renew_holders, batch)

    def _claim(self, kind: str, target: object) -> Callable[[], None] | None:
        """Decide what a due entry means now (caller holds the condition)."""
        if kind == _EXPIRE:
            lease = target
            assert isinstance(lease, HeldLease)
            if lease not in self._holders:
                return None
            lease.check_expiry()  # no store call: fires lost at valid_until exactly
            if lease.lost.is_set():
                self._holders.discard(lease)
            elif not lease.ended and not lease.releasing:
                # (A lease being released does not expire into "lost": the release may have landed.
                # Its renewals go on until the release is settled; no expiry check to schedule.)
                self._push(lease.valid_until(), _EXPIRE, lease)
            return None
        if kind == _TASK:
            assert isinstance(target, _Task)
            if target in self._busy:
                return None
            self._busy.add(target)
            return lambda: self._run_task(target)
        registered = target in self._holders or target in self._waiters
        if not registered or target in self._busy:
            return None
        self._busy.add(target)
        return lambda: self._renew(target)

    def _more_holders_due(self, first: HeldLease | None, now: float, most: int = BATCH_MAX) -> list[HeldLease]:
        """``first`` and the holder renewals due within BATCH_AHEAD_S, ``most`` in all (caller
        holds the condition)."""
        batch = [] if first is None else [first]
        while self._heap and len(batch) < most:
            when, _, kind, target = self._heap[0]
            if when > now + BATCH_AHEAD_S or kind != _RENEW or not isinstance(target, HeldLease):
                break
            heapq.heappop(self._heap)
            if target in self._holders and target not in self._busy:
                self._busy.add(target)
                batch.append(target)
        return batch

    def _renew_holders(self, batch: list[HeldLease]) -> None:
        """Renew several holders' leases with one :meth:`CellStore.compare_and_set_many`."""
        held = [lease for lease in batch if lease.wants_renewal() and lease.try_hold()]
        lost: list[tuple[HeldLease, str]] = []
        again: list[HeldLease] = []
        try:
            started = self._monotonic()
            plans = []
            for lease in held:
                if lease.ended:
                    continue
                lease.last_attempt_at = started
                plans.append((lease, *lease.renewal()))
            for index, outcome in self._store.compare_and_set_many([plan[1] for plan in plans]):
                lease, _, new, value = plans[index]
                verdict, reason = lease.settle_renewal(new, value, started, outcome)
                if verdict == "again":
                    again.append(lease)
                if reason is not None:
                    lost.append((lease, reason))
        except Exception:  # never let one batch's bug stop the others
            log.exception("lease_renewal_crashed")
        finally:
            for lease in held:
                lease.let_go()
        for lease, reason in lost:
            lease.mark_lost(reason)
        for lease in again:
            lease.renew(self._store)
        for lease in batch:
            self._after_renewal(lease)

    def _renew(self, lease: object) -> None:
        try:
            if isinstance(lease, HeldLease):
                lease.renew(self._store)
            else:
                assert isinstance(lease, WaiterLease)
                lease.renew(self._store, self._next_timestamp)
        except Exception:  # never let one lease's bug stop the others
            log.exception("lease_renewal_crashed")
        self._after_renewal(lease)

    def _after_renewal(self, lease: object) -> None:
        """Schedule what comes next for a lease whose renewal just ran."""
        with self._cond:
            self._busy.discard(lease)
            if isinstance(lease, HeldLease):
                if lease.ended or lease.lost.is_set():
                    self._holders.discard(lease)
                elif lease in self._holders:
                    # Not before BUSY_RETRY_S from now: a lease a batch skipped because it was busy (a
                    # release holds its mutex across a store call) is still due, and rescheduled at its
                    # past due time it was dispatched again and again while the release waited — a hot
                    # loop (found by the simulator, whose timers never fire while a task is ready).
                    self._push(max(lease.next_due(), self._monotonic() + BUSY_RETRY_S), _RENEW, lease)
                    self._push(lease.valid_until(), _EXPIRE, lease)
            elif isinstance(lease, WaiterLease):
                if lease.ended:
                    self._waiters.discard(lease)
                elif lease in self._waiters:
                    self._push(lease.next_due(), _RENEW, lease)

    def _run_task(self, task: _Task) -> None:
        ok = False
        error: BaseException | None = None
        try:
            ok = task.run() is not False
        except Exception as exc:
            error = exc
        task.attempts += 1
        with self._cond:
            self._busy.discard(task)
            now = self._monotonic()
            finished = ok or self._closed or (task.give_up_at is not None and now + task.pause > task.give_up_at)
            if not finished:
                if task.attempts in (1, 10) or task.attempts % 100 == 0:
                    log.warning("deferred_task_retrying", what=task.what, lock_id=task.lock_id, error=str(error))
                self._push(now + task.pause, _TASK, task)
                task.pause = min(task.pause * 2, 2.0)
                return
            self._tasks.discard(task)
        if not ok:
            log.warning(
                "deferred_task_given_up", what=task.what, lock_id=task.lock_id, attempts=task.attempts, error=str(error)
            )
        if task.on_done is not None:
            try:
                task.on_done(ok)
            except Exception:
                log.exception("deferred_task_callback_failed", what=task.what)
        task.done.set()
