"""Issue 25, item 2: an ``aget_lock`` acquisition is a greenlet driven by callbacks (``_Run``), not
a task of its own; deadlines reach their callers a slice at a time. Every check is counted or
ordered, never timed: how many tasks exist while hundreds wait, how many ``LockTimeout`` are
raised between two turns of another task, what is left in the store after ``asyncio.run``
returns, whose name an owner carries, and which context the algorithm runs in.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from lockclient import CellStore, LockTimeout, RemoteLocker, open_store
from lockclient import locker as locker_module
from lockclient.runtime import aio
from lockclient.runtime.aio import AsyncioRuntime, _Pacer, run_in_greenlet
from lockclient.store import Table
from tests.lock.test_asyncio_pacing import StepClock, Turns, _fill, _paced
from tests.support.faulty import FaultyStore

WAITERS = 300


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


async def _queued(locker: RemoteLocker, lock_id: str, n: int) -> None:
    """Until ``n`` cells are in the lock's queue (polled on a thread: never a store call on the loop)."""
    by = asyncio.get_running_loop().time() + 120
    while len((await asyncio.to_thread(locker.status, lock_id)).queue) < n:
        assert asyncio.get_running_loop().time() < by, f"fewer than {n} queue cells after 120 s"
        await asyncio.sleep(0.02)


def test_waiting_acquisitions_are_no_tasks_of_their_own(store: CellStore) -> None:
    """300 ``aget_lock`` waiters on a held lock: the loop holds the callers' 300 tasks and a
    handful of chronolock's own — not a second task per waiter — and all are served in ticket
    order once the holder releases."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            holder = await locker.aget_lock("runs")
            tasks_before = len(asyncio.all_tasks())
            granted: list[str] = []

            async def waiter() -> None:
                async with await locker.aget_lock("runs", timeout=300) as lock:
                    granted.append(lock.ticket)

            callers = [asyncio.create_task(waiter()) for _ in range(WAITERS)]
            await _queued(locker, "runs", WAITERS + 1)
            extra = len(asyncio.all_tasks()) - tasks_before - WAITERS
            assert extra <= 5, f"{extra} tasks besides the {WAITERS} callers' (a task per waiter?)"
            await asyncio.to_thread(holder.release)
            await asyncio.wait_for(asyncio.gather(*callers), 300)
            assert len(granted) == WAITERS and granted == sorted(granted), "grants out of ticket order"

    asyncio.run(scenario())


def test_deadlines_that_fall_together_reach_their_callers_a_slice_at_a_time(store: CellStore) -> None:
    """300 waiters whose deadlines all fall while the application blocks the loop for half a second
    (so every timer is due in the same iteration): all get LockTimeout, but never more of them
    between two turns of another task than a slice has room for (each wake-up counts
    ``WAKE_COST_S``) — not 300 task steps in one loop iteration — and every queue cell is
    withdrawn afterwards."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            loop = asyncio.get_running_loop()
            runtime = AsyncioRuntime.current()
            # Steps cost nothing by this clock: only the wake-ups' counted cost fills a slice (wake-ups
            # get up to the longest slice: 0.5 ms here, 33 of them).
            runtime.pacer = _Pacer(loop, slice_s=0.0005, clock=StepClock(0.0), max_slice_s=0.0005)
            per_slice = math.ceil(0.0005 / aio.WAKE_COST_S)
            holder = await asyncio.to_thread(locker.get_lock, "deadline")
            raised: Counter[int] = Counter()
            with Turns() as turns:

                async def expires() -> None:
                    with pytest.raises(LockTimeout):
                        await locker.aget_lock("deadline", timeout=3.0)
                    raised[turns.count] += 1

                # The application's own stall, from before the first deadline to after the last.
                loop.call_later(2.5, time.sleep, 1.0)
                await asyncio.wait_for(asyncio.gather(*(expires() for _ in range(WAITERS))), 300)
            assert sum(raised.values()) == WAITERS
            # One count of the other task's turns may span two iterations.
            assert max(raised.values()) <= 2 * per_slice + 2, f"{max(raised.values())} between two turns: {raised}"
            await asyncio.to_thread(holder.release)
            by = loop.time() + 120
            while (await asyncio.to_thread(locker.status, "deadline")).queue:
                assert loop.time() < by, "the timed-out waiters' cells were never withdrawn"
                await asyncio.sleep(0.05)

    asyncio.run(scenario())


def test_an_abandoned_clean_up_finishes_before_asyncio_run_returns(store: CellStore) -> None:
    """A waiter times out while its withdrawal hangs in the store, and the application's
    ``asyncio.run`` returns right after the LockTimeout: the run cleaning up has no task that
    ``asyncio.run`` could cancel and wait for, so chronolock's own watcher does — the queue cell
    is gone when ``asyncio.run`` returns, and no lease is left renewed."""
    faulty = FaultyStore(store)
    stalled, unstall = threading.Event(), threading.Event()

    def stall(*args: object, **kwargs: object) -> None:
        stalled.set()
        unstall.wait(30)

    def queue_delete(table: Table, *args: object, **kwargs: object) -> bool:
        return table is Table.QUEUE

    with RemoteLocker(store, lease=5) as first, RemoteLocker(faulty, lease=5) as second:
        holder = first.get_lock("abandoned")

        async def scenario() -> None:
            faulty.arm("delete", before=stall, when=queue_delete)
            with pytest.raises(LockTimeout):
                await asyncio.wait_for(second.aget_lock("abandoned", timeout=0.5), 60)
            assert await asyncio.to_thread(stalled.wait, 30), "the withdrawal never reached the store"
            # asyncio.run now cancels what is left and waits for it; the store answers meanwhile.
            threading.Timer(0.5, unstall.set).start()

        asyncio.run(scenario())
        assert unstall.is_set(), "asyncio.run returned before the store answered the withdrawal"
        assert [q.owner for q in first.status("abandoned").queue] == [holder.owner]
        assert not second._services.keeper._waiters, "a withdrawn waiter's lease is still being renewed"
        holder.release()


def test_a_run_names_the_calling_task_and_sees_its_context() -> None:
    """An acquisition runs in no task, yet inside it the runtime's task name is the task that
    started it (who asked, as a thread's name is on threads), and it runs in a copy of the
    caller's context (contextvars such as structured-log bindings) — set after the copy, a value
    is not seen."""
    request = contextvars.ContextVar("request", default="none")

    async def scenario() -> None:
        async def billing() -> tuple[str, str]:
            runtime = AsyncioRuntime.current()
            request.set("r-42")
            return await run_in_greenlet(lambda: (runtime.task_name(), request.get()))

        assert await asyncio.create_task(billing(), name="billing-7") == ("billing-7", "r-42")
        assert request.get() == "none"

    asyncio.run(scenario())


def test_a_burst_of_calls_is_let_in_a_slice_at_a_time_and_in_order(
    store: CellStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 ``aget_lock`` calls started together on a held lock: their acquisitions are built (the
    set-up after the caller is let in) never more of them between two turns of another task than
    a slice has room for (each counts ``ADMIT_COST_S``) — the burst's own iteration costs a
    future each — in the order the calls were made, and all 300 queue."""
    built: list[int] = []
    init = locker_module._AsyncAcquisition.__init__

    def counted(self: locker_module._AsyncAcquisition, *args: Any, **kwargs: Any) -> None:
        built.append(turns_seen[0].count)
        order.append(asyncio.current_task())
        init(self, *args, **kwargs)

    turns_seen: list[Turns] = []
    order: list[asyncio.Task[Any] | None] = []
    monkeypatch.setattr(locker_module._AsyncAcquisition, "__init__", counted)

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            loop = asyncio.get_running_loop()
            runtime = AsyncioRuntime.current()
            # Half-millisecond slices: 50 let in per slice, so all 300 at once would show.
            runtime.pacer = _Pacer(loop, slice_s=0.0005, clock=StepClock(0.0))
            per_slice = round(0.0005 / aio.ADMIT_COST_S)
            holder = await asyncio.to_thread(locker.get_lock, "burst")
            with Turns() as turns:
                turns_seen.append(turns)
                callers = [asyncio.create_task(locker.aget_lock("burst", timeout=300)) for _ in range(WAITERS)]
                await _queued(locker, "burst", WAITERS + 1)
            per_turn = Counter(built)
            assert sum(per_turn.values()) == WAITERS
            assert max(per_turn.values()) <= 2 * per_slice + 2, f"{max(per_turn.values())} built between two turns"
            assert order == callers, "let in out of the order the calls were made"
            for caller in callers:
                caller.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
            await asyncio.to_thread(holder.release)

    asyncio.run(scenario())


def test_a_call_whose_deadline_passes_before_it_is_let_in_touches_nothing(store: CellStore) -> None:
    """The pacer is busy (a step waits in line), so new calls wait to be let in: one whose deadline
    has passed when its turn comes gets LockTimeout without building anything — no queue cell —
    while the next one, with time left, is let in and queues."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            loop = asyncio.get_running_loop()
            runtime = AsyncioRuntime.current()
            pacer, clock = _paced(loop)
            holder = await asyncio.to_thread(locker.get_lock, "late")
            _fill(pacer, clock, 1)
            late = asyncio.create_task(locker.aget_lock("late", timeout=0.0))
            _fill(pacer, clock, 1)
            later = asyncio.create_task(locker.aget_lock("late", timeout=300))
            with pytest.raises(LockTimeout, match="turn"):
                await late
            await _queued(locker, "late", 2)
            # The holder's cell and the later call's: none of the late one's.
            assert len((await asyncio.to_thread(locker.status, "late")).queue) == 2
            assert runtime.pacer is pacer
            later.cancel()
            await asyncio.gather(later, return_exceptions=True)
            await asyncio.to_thread(holder.release)

    asyncio.run(scenario())


def test_timed_out_acquisitions_leave_no_reference_cycles(store: CellStore) -> None:
    """50 waiters time out and clean up: nothing of theirs is left for the cyclic collector — every
    run, its state, its error and the caller's LockTimeout are freed as soon as the caller drops
    the LockTimeout. (A run's
    own frame in the error's traceback made a cycle per timeout: 62 objects each, and a longer
    full collection when 1,000 deadlines fell together.)"""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            holder = await asyncio.to_thread(locker.get_lock, "cycles")

            async def expires() -> None:
                with pytest.raises(LockTimeout):
                    await locker.aget_lock("cycles", timeout=0.5)

            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await asyncio.wait_for(asyncio.gather(*(expires() for _ in range(50))), 120)
                by = asyncio.get_running_loop().time() + 60
                while len((await asyncio.to_thread(locker.status, "cycles")).queue) > 1:
                    assert asyncio.get_running_loop().time() < by, "the clean-ups never finished"
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.1)
                gc.collect()
                ours = [o for o in gc.garbage if isinstance(o, aio._Run | locker_module._AsyncAcquisition)]
                errors = [o for o in gc.garbage if isinstance(o, LockTimeout)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
            assert ours == [], f"{len(ours)} runs or acquisition states only the collector could free"
            # (A LockTimeout raised from a frame that also held it — its traceback holds that frame:
            # 13 objects per timeout for the collector, found by counting what gc.collect() freed.)
            assert errors == [], f"{len(errors)} LockTimeout errors only the collector could free"
            await asyncio.to_thread(holder.release)

    asyncio.run(scenario())
