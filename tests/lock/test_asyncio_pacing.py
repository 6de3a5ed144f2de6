"""Issue 25, item 2: the event loop stays free for other work while a thousand acquisitions want it.

The finding (``python -m bench asyncio``): a burst of 1,000 ``aget_lock`` calls held the loop for
287–563 ms at a time, and 1,000 deadlines falling together made each ``LockTimeout`` 118 ms to
1.5 s late — the timers were due, the loop that runs them was busy with every greenlet that had
become ready. Each check here is counted, never timed: how many acquisition steps ran between two
turns of another task, whether a timeout comes with no store reply at all, and what a call that
never got its turn left behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from lockclient import CellStore, LockTimeout, RemoteLocker, open_store
from lockclient import locker as locker_module
from lockclient.runtime import aio
from lockclient.runtime.aio import AsyncioRuntime, _Pacer, run_in_greenlet
from tests.support.faulty import FaultyStore

BURST = 200


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


class Turns:
    """Counts the loop's iterations from another task's point of view (one ``sleep(0)`` each)."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Turns:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class StepClock:
    """A clock for the pacer by which every greenlet step costs ``step`` seconds and nothing else
    takes any time, whatever the machine is doing: the count of steps per slice is then the
    pacer's decision alone. Advanced by the counting switch below."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        return self.now


def _paced(loop: asyncio.AbstractEventLoop, *, step: float = 0.0005) -> tuple[_Pacer, StepClock]:
    """This loop's runtime with a pacer on a :class:`StepClock` (2 ms slices, 0.5 ms steps)."""
    runtime = AsyncioRuntime.current()
    clock = StepClock(step)
    runtime.pacer = _Pacer(loop, slice_s=0.002, clock=clock)
    return runtime.pacer, clock


class Filler:
    """A stand-in for another acquisition's step in the pacer's line: it "costs" a whole slice by
    the :class:`StepClock`, so one of them runs per loop iteration."""

    def __init__(self, clock: StepClock, slice_s: float) -> None:
        self.clock = clock
        self.slice_s = slice_s
        self.done = False

    def step(self) -> None:
        self.clock.now += self.slice_s
        self.done = True


def _fill(pacer: _Pacer, clock: StepClock, n: int) -> list[Filler]:
    fillers = [Filler(clock, pacer.slice_s) for _ in range(n)]
    pacer.line.extend(fillers)
    pacer.spent(0.0)  # (schedules the next slice)
    return fillers


def _count_steps(monkeypatch: pytest.MonkeyPatch, turns: Turns, clock: StepClock, into: Counter[int]) -> None:
    """Record, for every step into a bridge greenlet, the other task's turn it ran in; each step
    takes ``clock.step`` by the pacer's clock."""
    switch = aio._Bridge.switch

    def counted(self: aio._Bridge, *args: Any, **kwargs: Any) -> Any:
        into[turns.count] += 1
        clock.now += clock.step
        return switch(self, *args, **kwargs)

    monkeypatch.setattr(aio._Bridge, "switch", counted)


def test_greenlet_steps_come_in_slices_with_other_tasks_between(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 greenlets, ready together, each taking three steps of 0.5 ms: at most a 2 ms slice of
    them (4) runs before another task gets its turn — not all 100 in one stretch — and in the
    order they became ready."""
    order: list[int] = []

    async def scenario() -> None:
        _, clock = _paced(asyncio.get_running_loop())
        runtime = AsyncioRuntime.current()
        steps: Counter[int] = Counter()
        with Turns() as turns:
            _count_steps(monkeypatch, turns, clock, steps)

            def work(i: int) -> None:
                for _ in range(3):
                    order.append(i)
                    runtime.sleep(0)

            await asyncio.gather(*(run_in_greenlet(lambda i=i: work(i)) for i in range(100)))
        assert sum(steps.values()) == 100 * 4  # three waits each, and the step that returns
        # Two turns of the other task may fall into one iteration's count; slices are 4 steps.
        assert max(steps.values()) <= 2 * 4 + 2, f"{max(steps.values())} steps between two turns: {steps}"
        assert len(steps) >= 100 * 4 // 10

    asyncio.run(scenario())
    assert order[:100] == list(range(100)), "first steps out of the order they became ready"


def test_a_burst_of_aget_lock_calls_lets_other_tasks_run_between_its_pieces(
    store: CellStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 ``aget_lock`` calls started together on a held lock: the loop alternates between their
    steps and other tasks (the finding: every call's first steps in one loop iteration), and all
    200 still queue, in the order they were called."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            _, clock = _paced(asyncio.get_running_loop())
            holder = await locker.aget_lock("burst")
            steps: Counter[int] = Counter()
            with Turns() as turns:
                _count_steps(monkeypatch, turns, clock, steps)
                tasks = [asyncio.create_task(locker.aget_lock("burst", timeout=120)) for _ in range(BURST)]
                queued_by = asyncio.get_running_loop().time() + 60
                while len(locker.status("burst").queue) < BURST + 1:
                    assert asyncio.get_running_loop().time() < queued_by, "the burst never queued"
                    await asyncio.sleep(0.01)
            # A call let in by one slice takes its first step an iteration later, alongside the next
            # slice's: two slices (8 steps) per iteration, and one count may span two iterations.
            assert max(steps.values()) <= 2 * 2 * 4, f"{max(steps.values())} steps between two turns: {steps}"
            assert len(steps) >= BURST // 16
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(holder.release)

    asyncio.run(scenario())


def test_a_burst_costs_its_first_iteration_an_admission_each_and_nothing_more(
    store: CellStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first thing ``aget_lock`` does after validating its arguments is take its turn at the
    pacer. Of 1,000 calls started together, only those the first slice has room for go on to
    their checks and set-up in the iteration that starts them; the rest wait for later slices.
    Before, each of the 1,000 ran its checks, its re-entry check and the coroutine chain first.
    That was 17 ms of CPU in one iteration on a quiet machine, against the issue's 10 ms."""
    checked: list[str] = []
    real = locker_module.check_label

    def counted(label: str | None) -> str:
        checked.append("")
        return real(label)

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            _paced(asyncio.get_running_loop())
            holder = await locker.aget_lock("burst")
            monkeypatch.setattr(locker_module, "check_label", counted)
            tasks = [asyncio.create_task(locker.aget_lock("burst", timeout=120)) for _ in range(1000)]
            await asyncio.sleep(0)  # this task resumes right after the 1,000 first steps
            in_first_iteration = len(checked)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(holder.release)
        assert in_first_iteration <= 0.002 / aio.ADMIT_COST_S + 1, in_first_iteration
        assert in_first_iteration >= 1  # the first one found an idle pacer and went straight on

    asyncio.run(scenario())


def test_a_slow_loop_widens_the_slice_for_steps_but_never_for_admissions() -> None:
    """After 10 ms of the loop's other work, a slice may run steps for up to ``max_slice_s`` (5 ms):
    on a busy loop the waiters still get a share. But a caller let in runs its task step in the
    next iteration, outside every slice, so admissions keep to ``slice_s``: 134 of 1,000 waiting
    callers, not the 334 that filled the widened slice and put 3.7 ms of their steps into one
    iteration of ``python -m bench asyncio``."""

    async def scenario() -> None:
        clock = StepClock(0.0)
        pacer = _Pacer(asyncio.get_running_loop(), slice_s=0.002, clock=clock, max_slice_s=0.005)
        fillers = _fill(pacer, clock, 2)
        admissions = [pacer.admit() for _ in range(1000)]
        clock.now += 0.010  # the loop's other work before the slice
        await asyncio.sleep(0)  # the slice runs (it was scheduled before this task's wake-up)
        let_in = [future for future in admissions if future is not None and future.done()]
        assert all(future.result() for future in let_in)
        assert abs(len(let_in) - 0.002 / aio.ADMIT_COST_S) <= 1, len(let_in)
        # The steps had the widened slice: both fillers (2 ms each, after 2 ms of admissions) ran.
        assert [filler.done for filler in fillers] == [True, True]
        for future in admissions:
            if future is not None:
                future.cancel()

    asyncio.run(scenario())


def test_a_slice_full_before_it_begins_still_lets_one_caller_in() -> None:
    """Steps taken inline since the last slice (hand-overs, each stepped at once) count against it;
    when they alone fill it, it still lets one waiting caller in, as it still takes one step from
    its line. Otherwise a loop busy with hand-overs in every iteration would keep new calls out
    until their deadline, and forever with ``timeout=None``."""

    async def scenario() -> None:
        clock = StepClock(0.0)
        pacer = _Pacer(asyncio.get_running_loop(), slice_s=0.002, clock=clock, max_slice_s=0.005)
        filler = _fill(pacer, clock, 1)[0]
        admissions = [pacer.admit() for _ in range(10)]
        pacer._inline = 0.010  # inline steps took 10 ms since the last slice
        await asyncio.sleep(0)  # the slice runs
        let_in = [future for future in admissions if future is not None and future.done()]
        assert len(let_in) == 1 and let_in[0].result() is True
        assert filler.done  # and the line its one step
        for future in admissions:
            if future is not None:
                future.cancel()

    asyncio.run(scenario())


def test_a_slice_full_before_it_begins_still_delivers_one_deadline() -> None:
    """The same for wake-ups (a ``LockTimeout`` to deliver): steps taken inline since the last slice
    that filled even the longest slice leave room for one wake-up, so a loop busy with hand-overs
    in every iteration still delivers its deadlines."""
    woken: list[int] = []

    async def scenario() -> None:
        clock = StepClock(0.0)
        pacer = _Pacer(asyncio.get_running_loop(), slice_s=0.002, clock=clock, max_slice_s=0.005)
        pacer._used = pacer._inline = 0.010  # inline steps took 10 ms since the last slice
        for i in range(5):
            pacer.wake(lambda i=i: woken.append(i))
        assert woken == []  # all in line: the iteration is over its slice
        await asyncio.sleep(0)  # the slice runs
        assert woken == [0]

    asyncio.run(scenario())


def test_a_timeout_fires_with_no_store_reply_at_all(store: CellStore) -> None:
    """Every write and read of the waiter stalls in the store (its enqueue never answers): its
    ``aget_lock`` still raises LockTimeout — the deadline is the loop's timer, not a reply — and
    once the store answers again its queue cell is withdrawn."""
    faulty = FaultyStore(store)
    unstall = threading.Event()

    def stall(*args: object, **kwargs: object) -> None:
        unstall.wait(30)

    with RemoteLocker(store, lease=5) as first, RemoteLocker(faulty, lease=5) as second:
        holder = first.get_lock("silent")

        async def scenario() -> None:
            for method in ("put", "put_cells", "read_row", "read_versioned", "compare_and_set", "delete"):
                faulty.arm(method, before=stall, times=10**6)
            with pytest.raises(LockTimeout):
                # wait_for only guards against a hang: the timeout under test is 0.3 s.
                await asyncio.wait_for(second.aget_lock("silent", timeout=0.3), 25)
            assert not unstall.is_set()
            unstall.set()
            faulty.disarm()

        asyncio.run(scenario())
        deadline = threading.Event()
        for _ in range(1000):
            if [q.owner for q in first.status("silent").queue] == [holder.owner]:
                break
            deadline.wait(0.02)
        assert [q.owner for q in first.status("silent").queue] == [holder.owner], "the withdrawal never finished"
        holder.release()


def test_a_call_that_never_got_its_turn_times_out_having_touched_nothing(store: CellStore) -> None:
    """The loop's turns are spoken for (50,000 steps wait ahead, one per iteration): an
    ``aget_lock`` with a 10 ms timeout raises LockTimeout while still waiting for its first turn —
    no queue cell written, nothing to clean up — and a call with no deadline is served once the
    turns come round, after every step that was in line before it (FIFO)."""

    async def scenario() -> None:
        with RemoteLocker(store, lease=10) as locker:
            loop = asyncio.get_running_loop()
            pacer, clock = _paced(loop)
            ahead = _fill(pacer, clock, 50_000)
            with pytest.raises(LockTimeout, match="turn"):
                await locker.aget_lock("never", timeout=0.01)
            assert not all(filler.done for filler in ahead), "the timeout waited for the line"
            assert locker.status("never").queue == []
            served = await asyncio.wait_for(locker.aget_lock("never"), 60)
            assert all(filler.done for filler in ahead), "a later call overtook the steps waiting ahead"
            await asyncio.to_thread(served.release)

    asyncio.run(scenario())


def test_blocking_calls_keep_their_outcomes_and_errors(store: CellStore) -> None:
    """The runtime's worker pool: results and errors reach their callers (errors raised where the
    call was made), and a caller cancelled meanwhile leaves the others' outcomes intact."""

    async def scenario() -> None:
        threads_before = threading.active_count()
        runtime = AsyncioRuntime.current()
        release = threading.Event()

        def slow(i: int) -> int:
            release.wait(10)
            if i % 7 == 0:
                raise ValueError(i)
            return i

        calls = [asyncio.ensure_future(runtime.run_blocking(lambda i=i: slow(i))) for i in range(50)]
        await asyncio.sleep(0)
        calls[1].cancel()
        release.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for i, outcome in enumerate(outcomes):
            if i == 1:
                assert isinstance(outcome, asyncio.CancelledError)
            elif i % 7 == 0:
                assert isinstance(outcome, ValueError) and outcome.args == (i,)
            else:
                assert outcome == i
        # (Counted from before this loop's runtime: earlier tests' loops may still have workers.)
        assert threading.active_count() - threads_before < 50, "a thread per call"

    asyncio.run(scenario())


def test_a_waiting_acquisition_times_out_at_its_deadline_without_waiting_for_its_turn(store: CellStore) -> None:
    """A waiter merely waiting at its deadline (no store call of its own under way) gets LockTimeout
    then, even when its own greenlet cannot run for a long while (100,000 steps wait ahead, one
    let through per iteration): its clean-up comes in its turn, afterwards."""

    async def scenario(timeout: float) -> bool:
        """False when the machine was too slow for the premise: the waiter timed out before it was
        seen waiting (its enqueue took longer than ``timeout``); then the caller tries a longer one."""
        with RemoteLocker(store, lease=10) as locker:
            holder = await locker.aget_lock("busy")
            task = asyncio.create_task(locker.aget_lock("busy", timeout=timeout))
            while len((await asyncio.to_thread(locker.status, "busy")).queue) < 2:
                if task.done():
                    assert isinstance(task.exception(), LockTimeout), task.exception()
                    await asyncio.to_thread(holder.release)
                    return False
                await asyncio.sleep(0.01)
            pacer, clock = _paced(asyncio.get_running_loop())
            # A line that never runs dry while the waiter waits: two more steps each loop iteration
            # than the one let through (a fixed 100,000 drained before the deadline on a quiet machine).
            ahead = _fill(pacer, clock, 1000)
            feeding = True

            async def feed() -> None:
                while feeding:
                    ahead.extend(_fill(pacer, clock, 2))
                    await asyncio.sleep(0)

            feeder = asyncio.create_task(feed())
            with pytest.raises(LockTimeout):
                await asyncio.wait_for(task, 25)
            waiting_ahead = sum(not filler.done for filler in ahead)
            feeding = False
            await feeder
            assert waiting_ahead > 0, "the timeout waited for the line"
            withdrawn_by = asyncio.get_running_loop().time() + 60
            while len((await asyncio.to_thread(locker.status, "busy")).queue) != 1:
                assert asyncio.get_running_loop().time() < withdrawn_by, "the clean-up never came"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(holder.release)
            return True

    assert any(asyncio.run(scenario(timeout)) for timeout in (1.0, 4.0, 16.0)), "the waiter never queued in time"
