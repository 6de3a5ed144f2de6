"""Issue 25, item 2: ``aget_lock`` runs on the event loop — a thousand waiters in one process.

The findings (``aget_lock`` was ``asyncio.to_thread`` on the loop's default executor, 6 threads
on 2 CPUs): 10 waiters with ``timeout=4`` timed out at 4 s and at **8 s**; the later ones did not
even queue until a thread freed up (so they could be overtaken); an unrelated ``to_thread`` call
waited 3 s; an ``async with`` holder's release queued behind its own process's waiters and
happened only at **10.02 s**, after they had timed out. Measured figures (loop lag, timeout
accuracy, threads) are ``python -m bench asyncio`` (BENCHMARKS.md).

Every check here is a guarantee, not a timing that a busy machine (2 cores, load 20) could
break: order, "before any waiter finished", "never the default executor", and lateness compared
with how late the loop itself ran meanwhile (a ticker measures it: the machine's share, which no
code can remove).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from lockclient import CellStore, LockTimeout, RemoteLocker, open_store
from lockclient.lease import HOLDER_COLUMN
from lockclient.store import Table
from tests.support.faulty import FaultyStore
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

N = 1000
HONOURED_WITHIN_S = 0.1
"""The issue's bound for a timeout, beyond how late the loop itself was."""


@pytest.fixture
def locker(sqlite_url: str) -> Iterator[RemoteLocker]:
    with RemoteLocker(open_store(sqlite_url), lease=10, owns_store=True) as lk:
        yield lk


class LoopLag:
    """How late a 1 ms ticker on the loop runs: what the machine (and everything on the loop) adds
    to any deadline. A timeout can be no more punctual than the loop that raises it."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.monotonic() - before - 0.001)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_a_thousand_waiters_keep_fifo_while_an_async_with_holder_releases(locker: RemoteLocker) -> None:
    """1,000 ``aget_lock`` waiters on one lock, enqueued strictly one after another (each starts
    once the previous one's queue cell is in the store): all queue, none on a thread of its own,
    the loop's default executor stays free for the application, the ``async with`` holder's
    release is not held up by its own process's waiters, and the grants follow the queue."""

    async def scenario() -> None:
        threads_before = threading.active_count()
        order: list[int] = []
        tokens: list[int] = []
        timed_out: list[int] = []

        async def waiter(i: int) -> None:
            try:
                async with await locker.aget_lock("fifo", timeout=120) as lock:
                    order.append(i)
                    tokens.append(lock.fencing_token)
            except LockTimeout:
                timed_out.append(i)

        tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        # The test's own look at the queue runs on a thread of its own: a synchronous status() on the
        # loop every millisecond, reading up to 1,000 cells, took the loop from the waiters it waits
        # for (at load 9-33 a waiter then did not reach the queue within 60 s, on main too). Not the
        # loop's default executor, which the assertions below show chronolock leaves alone.
        looker = ThreadPoolExecutor(1, thread_name_prefix="test-status")

        async def queued() -> int:
            return len((await loop.run_in_executor(looker, locker.status, "fifo")).queue)

        async with await locker.aget_lock("fifo") as holder:
            for i in range(N):
                tasks.append(asyncio.create_task(waiter(i)))
                queued_by = time.monotonic() + 60
                while await queued() < i + 2:
                    # The finding: waiters beyond the executor's 6 threads never reached the queue.
                    assert time.monotonic() < queued_by, f"waiter {i} never queued"
                    await asyncio.sleep(0.001)
            threads_waiting = threading.active_count()
            # No thread per waiter: the runtime's executor (16) and the keeper's workers (8) at most.
            assert threads_waiting - threads_before <= 32, f"{threads_waiting - threads_before} threads for {N} waiters"
            # The application's own to_thread work never queues behind chronolock's: chronolock does
            # not use the loop's default executor at all (so the call below starts it afresh).
            assert not any(t.name.startswith("asyncio_") for t in threading.enumerate())
            assert await asyncio.wait_for(asyncio.to_thread(threading.get_ident), 30) != threading.get_ident()
            assert not any(task.done() for task in tasks), "a waiter finished while the lock was held"
            await asyncio.sleep(0.2)
            leaving = time.monotonic()
        # The finding: the holder's release queued behind its waiters and ran only when they timed out.
        left_after = time.monotonic() - leaving
        assert not holder.held
        first_served = time.monotonic() + 60
        while not order:
            assert time.monotonic() < first_served, "nobody was granted the lock after the release"
            await asyncio.sleep(0.01)
        assert left_after < 10, f"leaving the async with block took {left_after:.2f} s"
        await asyncio.gather(*tasks)
        assert timed_out == []
        assert order == list(range(N)), "grants out of queue order"
        assert tokens == sorted(tokens) and len(set(tokens)) == N
        looker.shutdown()

    asyncio.run(scenario())
    status = locker.status("fifo")
    assert status.holders == [] and status.queue == []


def test_an_async_with_holder_releases_while_its_own_waiters_wait(locker: RemoteLocker) -> None:
    """The issue's schedule: one task holds "x" for 0.2 s with ``async with`` while 8 tasks of the
    same process wait (timeout 10 s). The release went through ``asyncio.to_thread`` behind the
    waiters' own threads and ran at 10.02 s, after 6 of the 8 had timed out."""

    async def scenario() -> None:
        served: list[int] = []
        timed_out: list[int] = []

        async def waiter(i: int) -> None:
            try:
                async with await locker.aget_lock("x", timeout=10):
                    served.append(i)
            except LockTimeout:
                timed_out.append(i)

        async with await locker.aget_lock("x"):
            tasks = [asyncio.create_task(waiter(i)) for i in range(8)]
            await asyncio.sleep(0.2)
        await asyncio.gather(*tasks)
        assert timed_out == [], f"{len(timed_out)} of 8 waiters timed out: the release came too late"
        assert sorted(served) == list(range(8))

    asyncio.run(scenario())


def test_a_thousand_timeouts_are_each_honoured_within_100_ms(locker: RemoteLocker) -> None:
    """1,000 waiters on a held lock, two per deadline, deadlines spread over 2 s: each gets its
    LockTimeout no earlier than its timeout and at most 100 ms later than the loop itself ran late
    meanwhile; afterwards nothing of theirs is left in the store."""

    async def scenario() -> None:
        holder = await locker.aget_lock("busy")
        lateness: list[float] = []

        async def waiter(i: int) -> None:
            timeout = 3.0 + (i // 2) * 0.004
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                await locker.aget_lock("busy", timeout=timeout)
            lateness.append(time.monotonic() - started - timeout)

        with LoopLag() as lag:
            await asyncio.gather(*(waiter(i) for i in range(N)))
        assert len(lateness) == N
        assert min(lateness) >= 0, "a timeout was raised early"
        worst = max(lateness)
        assert worst <= HONOURED_WITHIN_S + lag.worst, (
            f"a timeout came {worst * 1000:.0f} ms late; the loop itself was at most {lag.worst * 1000:.0f} ms late"
        )
        await asyncio.get_running_loop().run_in_executor(None, holder.release)

    asyncio.run(scenario())
    # The clean-up of an acquisition that was still busy at its deadline finishes in the background.
    wait_until(lambda: locker.status("busy").queue == [], "every timed-out waiter's queue cell to be removed", 30)


def _queue_delete(table: Table, *args: object, **kwargs: object) -> bool:
    return table is Table.QUEUE


def test_a_timeout_is_honoured_while_the_store_stalls_the_clean_up(store: CellStore) -> None:
    """The withdrawal of a timed-out waiter's queue cell hangs in the store for 5 s: the caller
    still gets LockTimeout on time, and the cell goes once the store answers."""
    faulty = FaultyStore(store)
    stalled, unstall = threading.Event(), threading.Event()

    def stall(*args: object, **kwargs: object) -> None:
        stalled.set()
        unstall.wait(5)

    with RemoteLocker(store, lease=5) as first, RemoteLocker(faulty, lease=5) as second:
        holder = first.get_lock("stall")

        async def scenario() -> None:
            faulty.arm("delete", before=stall, when=_queue_delete)
            with LoopLag() as lag:
                started = time.monotonic()
                with pytest.raises(LockTimeout):
                    await second.aget_lock("stall", timeout=0.5)
                late = time.monotonic() - started - 0.5
            # The withdrawal starts at the deadline too, before or just after LockTimeout is raised.
            assert await asyncio.to_thread(stalled.wait, 10), "the withdrawal never reached the store"
            assert late <= HONOURED_WITHIN_S + lag.worst, f"LockTimeout came {late:.2f} s late"
            assert len(first.status("stall").queue) == 2, "the withdrawal cannot have finished yet"
            unstall.set()
            withdrawn_by = time.monotonic() + 10
            while [q.owner for q in first.status("stall").queue] != [holder.owner]:
                assert time.monotonic() < withdrawn_by, "the withdrawal never finished"
                await asyncio.sleep(0.01)

        asyncio.run(scenario())
        holder.release()


def test_a_grant_that_lands_after_the_timeout_was_raised_is_released(store: CellStore) -> None:
    """The waiter's grant is in flight at its deadline and answers only after LockTimeout reached
    the caller: nobody holds that grant, so it is released — never left renewed."""
    faulty = FaultyStore(store)
    at_grant, proceed = threading.Event(), threading.Event()

    def hold_the_grant(*args: object, **kwargs: object) -> None:
        at_grant.set()
        proceed.wait(10)

    def is_grant(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
        return HOLDER_COLUMN in expected and expected[HOLDER_COLUMN] is None

    with RemoteLocker(store, lease=5) as first, RemoteLocker(faulty, lease=5) as second:
        holder = first.get_lock("late")

        async def scenario() -> None:
            task = asyncio.create_task(second.aget_lock("late", timeout=2.0))
            while len(first.status("late").queue) < 2:  # noqa: ASYNC110 - polling the store
                await asyncio.sleep(0.01)
            faulty.arm("compare_and_set", before=hold_the_grant, when=is_grant)
            holder.release()
            assert await asyncio.to_thread(at_grant.wait, 10), "the waiter never sent its grant"
            with pytest.raises(LockTimeout):
                await task
            proceed.set()  # the grant applies now, after the caller has been told it timed out
            released_by = time.monotonic() + 10
            while (status := first.status("late")).holders or status.queue:
                assert time.monotonic() < released_by, f"the abandoned grant was never released: {status}"
                await asyncio.sleep(0.01)

        asyncio.run(scenario())
        assert not second._services.keeper._holders, "a lease nobody holds is still being renewed"
        again = first.try_get_lock("late")
        assert again is not None
        again.release()


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s
