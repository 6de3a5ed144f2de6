"""Issue 25, item 2: every ``aget_lock`` deadline of a loop is an entry in one heap under a single
asyncio timer (``_Deadlines``), and the runs leave their deadline to it.

The finding (``python -m bench asyncio``): when 1,000 deadlines fell together, asyncio ran ~1,250
timers in one loop iteration — each caller's deadline timer, and the timer of each run's own wait,
which the algorithm caps at the same deadline — chronolock's longest stretch on the loop (17 ms).
Every check here is counted or ordered, never timed: how many timers were set for the deadline
moment, which deadlines were delivered and in what order, how many between two turns of another
task, that none came before its time by the clock the deadlines are set on, and what is left in
the heap after callers went away.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from lockclient import CellStore, LockTimeout, RemoteLocker
from lockclient.runtime import aio
from lockclient.runtime.aio import AsyncioRuntime, _Deadlines
from tests.lock.test_asyncio_pacing import Turns, store
from tests.lock.test_asyncio_runs import _queued

__all__ = ["store"]  # (the fixture, shared with the other asyncio tests)

WAITERS = 300


class Recorder:
    """A caller waiting for its deadline: records when (by the heap's clock) and in which turn of
    another task it was told."""

    def __init__(self, key: int, when: float, told: list[Recorder], clock: Callable[[], float], turns: Turns) -> None:
        self.key = key
        self.when = when
        self.told = told
        self.clock = clock
        self.turns = turns
        self.told_at = -1.0
        self.turn = -1

    def notify(self) -> None:
        self.told_at = self.clock()
        self.turn = self.turns.count
        self.told.append(self)
        if len(self.told) == self.all_told_at:
            self.all_told.set()

    all_told = asyncio.Event()
    all_told_at = 0
    """(Set per test:) how many deadlines are to be told, and the event set once they are."""


class DirectPacer:
    """A pacer that wakes every caller at once: what the heap itself hands over per iteration is
    then counted alone."""

    def wake(self, callback: Callable[[], None]) -> None:
        callback()


class StepCpu:
    """A CPU clock for the heap by which every look at it costs ``step``: the number of deadlines
    taken per iteration is then the heap's decision alone, whatever the machine does."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_heap_delivers_every_deadline_in_order_never_early_under_one_timer() -> None:
    """300 deadlines added in random order, 100 of them discarded before they fall: the 200 others
    are delivered, in deadline order, none before its time by the heap's clock; the discarded
    ones never; the loop holds one timer of the heap's, not one per deadline (re-set by an add
    only when it is the earliest yet); and the heap is empty and unarmed afterwards."""

    async def scenario() -> None:
        runtime = AsyncioRuntime.current()
        deadlines = _Deadlines(runtime)
        told: list[Recorder] = []
        rng = random.Random(25)
        with Turns() as turns:
            start = time.monotonic()
            offsets = [0.05 + i * 0.001 for i in range(WAITERS)]
            rng.shuffle(offsets)
            recorders = []
            for offset in offsets:
                recorder = Recorder(-1, start + offset, told, time.monotonic, turns)
                recorder.key = deadlines.add(recorder.when, recorder)
                recorders.append(recorder)
            assert deadlines.armed and len(deadlines) == WAITERS
            # One timer at a time: re-set only by an add earlier than every deadline before it.
            earlier_than_all_before = sum(1 for i, o in enumerate(offsets) if o < min(offsets[:i], default=1e9))
            assert deadlines.timers_set == earlier_than_all_before
            dropped = rng.sample(recorders, 100)
            for recorder in dropped:
                deadlines.discard(recorder.key)
            assert len(deadlines) == WAITERS - 100
            Recorder.all_told, Recorder.all_told_at = asyncio.Event(), WAITERS - 100
            await asyncio.wait_for(Recorder.all_told.wait(), 60)
        assert {id(r) for r in told}.isdisjoint(id(r) for r in dropped), "a discarded deadline was delivered"
        assert [r.when for r in told] == sorted(r.when for r in told), "deadlines delivered out of order"
        early = [r for r in told if r.told_at < r.when]
        assert early == [], f"{len(early)} deadlines delivered before their time"
        assert len(deadlines) == 0 and not deadlines.armed

    asyncio.run(scenario())


def test_due_deadlines_are_taken_off_the_heap_in_bounded_slices() -> None:
    """1,000 deadlines due at once (the application blocked the loop past all of them): the heap
    hands them over a slice at a time — at most ``slice_s`` of CPU per iteration by its clock,
    checked every 32 — with other tasks' turns between, and every one of them is delivered."""

    async def scenario() -> None:
        runtime = AsyncioRuntime.current()
        runtime.pacer = DirectPacer()  # type: ignore[assignment]
        # Each look at the CPU clock "costs" 1 ms: a 5 ms slice is 5 checks of 32 = 160 deadlines.
        deadlines = _Deadlines(runtime, cpu=StepCpu(0.001), slice_s=0.005)
        told: list[Recorder] = []
        with Turns() as turns:
            when = time.monotonic() + 0.05
            for _ in range(1000):
                recorder = Recorder(-1, when, told, time.monotonic, turns)
                recorder.key = deadlines.add(when, recorder)
            Recorder.all_told, Recorder.all_told_at = asyncio.Event(), 1000
            # The application's own stall: all 1,000 are due when the loop runs again.
            asyncio.get_running_loop().call_soon(time.sleep, 0.1)
            await asyncio.wait_for(Recorder.all_told.wait(), 60)
        per_turn = Counter(r.turn for r in told)
        assert max(per_turn.values()) <= 2 * 160, f"{max(per_turn.values())} deadlines between two turns"
        assert len(per_turn) >= 1000 // (2 * 160)
        assert len(deadlines) == 0 and not deadlines.armed

    asyncio.run(scenario())


def test_deadlines_that_fall_together_set_no_timer_per_waiter(
    store: CellStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 ``aget_lock`` waiters whose deadlines fall together, each of whose waits the algorithm
    caps at its deadline (``poll_max`` beyond the timeout): every one gets LockTimeout, none before
    its deadline, and the timers set for the deadline moment or later are the heap's few — not a
    deadline timer per caller plus one per run's wait (~600 before). Their queue cells are
    withdrawn afterwards, and the heap is left empty."""

    async def scenario(timeout: float) -> bool:
        """False when the machine was too slow for the premise (not all queued well before the
        deadlines); then the caller tries a longer timeout."""
        loop = asyncio.get_running_loop()
        with RemoteLocker(store, lease=10, poll_max=4 * timeout) as locker:
            holder = await asyncio.to_thread(locker.get_lock, "together")
            runtime = AsyncioRuntime.current()
            start = loop.time()
            late_timers: list[Any] = []
            call_at = loop.call_at

            def counting_call_at(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
                if when >= start + timeout - 0.001:
                    late_timers.append(callback)
                return call_at(when, callback, *args, context=context)

            monkeypatch.setattr(loop, "call_at", counting_call_at)
            outcomes: list[float] = []

            async def expires() -> None:
                began = time.monotonic()
                with pytest.raises(LockTimeout):
                    await locker.aget_lock("together", timeout=timeout)
                outcomes.append(time.monotonic() - began - timeout)

            callers = asyncio.gather(*(expires() for _ in range(WAITERS)))
            await _queued(locker, "together", WAITERS + 1)
            queued_in_time = loop.time() < start + timeout / 2
            await asyncio.wait_for(callers, 300)
            monkeypatch.undo()
            await asyncio.to_thread(holder.release)
            by = loop.time() + 120
            while (await asyncio.to_thread(locker.status, "together")).queue:
                assert loop.time() < by, "the timed-out waiters' cells were never withdrawn"
                await asyncio.sleep(0.05)
            assert len(outcomes) == WAITERS
            assert min(outcomes) >= 0, f"a LockTimeout {-min(outcomes) * 1000:.3f} ms before its deadline"
            assert len(runtime.deadlines) == 0 and not runtime.deadlines.armed
            if not queued_in_time:
                return False
            ours = [cb for cb in late_timers if getattr(cb, "__self__", None) is runtime.deadlines]
            others = [cb for cb in late_timers if cb not in ours]
            assert len(ours) <= 10, f"{len(ours)} heap timers for {WAITERS} deadlines"
            assert len(others) <= 10, f"{len(others)} other timers at the deadline: {Counter(map(repr, others))}"
            return True

    assert any(asyncio.run(scenario(timeout)) for timeout in (3.0, 12.0, 48.0)), "the waiters never queued in time"


def test_a_cancelled_caller_leaves_nothing_in_the_heap(store: CellStore) -> None:
    """200 waiters with deadlines far off; half of their callers are cancelled: the heap forgets
    exactly those (``len``), the others are still due, and once the rest are cancelled too the
    heap is empty and holds no timer — and the loop's asyncio timers are not left one per caller."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            holder = await asyncio.to_thread(locker.get_lock, "cancelled")
            runtime = AsyncioRuntime.current()
            tasks = [asyncio.create_task(locker.aget_lock("cancelled", timeout=600)) for _ in range(200)]
            await _queued(locker, "cancelled", 201)
            assert len(runtime.deadlines) == 200 and runtime.deadlines.armed
            for task in tasks[::2]:
                task.cancel()
            await asyncio.gather(*tasks[::2], return_exceptions=True)
            assert len(runtime.deadlines) == 100
            for task in tasks[1::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert len(runtime.deadlines) == 0 and not runtime.deadlines.armed
            assert len(runtime.deadlines._heap) == 0
            await asyncio.to_thread(holder.release)

    asyncio.run(scenario())


def test_a_run_waits_without_a_timer_only_when_its_caller_ends_the_wait() -> None:
    """The rule a run's wait follows to set no timer of its own: only inside a run, only for the
    event its caller sets at the deadline, and only for a wait that would last until the deadline."""

    async def scenario() -> None:
        runtime = AsyncioRuntime.current()
        event, other = runtime.event(), runtime.event()
        seen: list[tuple[bool, bool, bool]] = []
        deadline = time.monotonic() + 60

        def inside() -> None:
            seen.append(
                (
                    aio._ended_by_deadline(120, event),
                    aio._ended_by_deadline(120, other),
                    aio._ended_by_deadline(1, event),
                )
            )

        run: aio._Run[None] = aio._Run(runtime, inside)
        run.deadline, run.deadline_event = deadline, event
        run.start()
        await run.result
        assert seen == [(True, False, False)]
        assert not aio._ended_by_deadline(120, event), "outside a run, a wait always sets its timer"

    asyncio.run(scenario())


PRIMITIVE_WAITERS = 60


def _held_and_waiting(locker: RemoteLocker, kind: str) -> tuple[Callable[[], Any], Callable[[float], Any]]:
    """What holds ``kind`` (a blocking call, run in a thread) and what waits for it (an awaitable)."""
    if kind == "semaphore":
        return (lambda: locker.get_semaphore("shared", 1)), (lambda t: locker.aget_semaphore("shared", 1, timeout=t))
    if kind == "read-lock":
        return (lambda: locker.get_write_lock("shared")), (lambda t: locker.aget_read_lock("shared", timeout=t))
    if kind == "write-lock":
        return (lambda: locker.get_read_lock("shared")), (lambda t: locker.aget_write_lock("shared", timeout=t))
    assert kind == "election"
    election = locker.election("shared")
    return election.campaign, (lambda t: election.acampaign(timeout=t))


@pytest.mark.parametrize("kind", ["semaphore", "read-lock", "write-lock", "election"])
def test_every_asyncio_primitive_waits_on_the_loops_deadline_heap(
    store: CellStore, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Semaphores, read-write locks and elections run on the loop exactly like ``aget_lock``
    (``lockclient.locker.aacquire``): each waiter's deadline is an entry in the loop's one heap
    (they had a greenlet task each with its own timers, and no pacer), LockTimeout comes no sooner
    than the deadline, and the heap is left empty."""

    added: list[float] = []
    add = _Deadlines.add

    def counting_add(self: _Deadlines, when: float, *args: Any, **kwargs: Any) -> Any:
        added.append(when)
        return add(self, when, *args, **kwargs)

    monkeypatch.setattr(_Deadlines, "add", counting_add)

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            hold, wait = _held_and_waiting(locker, kind)
            held = await asyncio.to_thread(hold)
            runtime = AsyncioRuntime.current()
            timeout = 2.0
            outcomes: list[float] = []

            async def expires() -> None:
                began = time.monotonic()
                with pytest.raises(LockTimeout):
                    await wait(timeout)
                outcomes.append(time.monotonic() - began - timeout)

            await asyncio.gather(*(expires() for _ in range(PRIMITIVE_WAITERS)))
            # One entry per waiter (a waiter whose store call was under way at its deadline adds one
            # more, TIMEOUT_GRACE_S later).
            assert len(added) >= PRIMITIVE_WAITERS, f"{len(added)} heap deadlines for {PRIMITIVE_WAITERS} waiters"
            assert len(outcomes) == PRIMITIVE_WAITERS
            assert min(outcomes) >= 0, f"a LockTimeout {-min(outcomes) * 1000:.3f} ms before its deadline"
            assert len(runtime.deadlines) == 0 and not runtime.deadlines.armed
            await asyncio.to_thread(held.resign if kind == "election" else held.release)

    asyncio.run(scenario())
