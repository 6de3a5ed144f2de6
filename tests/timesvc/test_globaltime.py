"""TryUpdateGlobalTime's rules with clocks moved by hand, on a real store (DESIGN.md §4)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from lockclient import CellStore, open_store
from lockclient.globaltime import GlobalTimeUpdater, read_global_time
from timesvc.coalesce import Coalescer

S = 1_000_000  # µs


class Clocks:
    """One machine's wall clock (µs) and monotonic clock (ns), moved together or apart."""

    def __init__(self, wall_us: int) -> None:
        self.wall = wall_us
        self.mono = 10**12

    def wall_us(self) -> int:
        return self.wall

    def monotonic_ns(self) -> int:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += int(seconds * S)
        self.mono += int(seconds * 1e9)


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def updater(store: CellStore, clocks: Clocks, name: str) -> GlobalTimeUpdater:
    return GlobalTimeUpdater(
        store, replica_id=name, max_skew=1.0, stale_after=2.0, wall_us=clocks.wall_us, monotonic_ns=clocks.monotonic_ns
    )


def test_cell_value_is_its_timestamp_and_never_decreases(store: CellStore) -> None:
    a_clock, b_clock = Clocks(1_000 * S), Clocks(900 * S)
    a, b = updater(store, a_clock, "a"), updater(store, b_clock, "b")
    first = a.update().now_us
    assert first == 1_000 * S
    reading = read_global_time(store)
    assert reading is not None and reading.value_us == first and reading.publisher == "a" and reading.trusted
    b_clock.advance(0.1)
    assert b.update().now_us >= first  # b's clock is 100 s behind: it serves observed + elapsed
    assert not b.runaway


def test_runaway_clock_among_live_replicas_is_guarded(store: CellStore) -> None:
    healthy_clock, fast_clock = Clocks(1_000 * S), Clocks(1_600 * S)
    healthy = updater(store, healthy_clock, "healthy")
    fast = updater(store, fast_clock, "fast")
    healthy.update()
    for _ in range(20):
        healthy_clock.advance(0.5)
        fast_clock.advance(0.5)
        healthy.update()
        result = fast.update()
        assert result.runaway
        assert result.now_us <= healthy_clock.wall + 1 * S, "the fast clock leaked into global time"
    assert fast.runaway and not healthy.runaway


def test_no_freeze_after_the_fast_replica_dies(store: CellStore) -> None:
    fast_clock, slow_clock = Clocks(1_600 * S), Clocks(1_000 * S)
    fast, slow = updater(store, fast_clock, "fast"), updater(store, slow_clock, "slow")
    fast.update()  # alone: publishes its clock, 600 s ahead
    slow_clock.advance(0.1)
    before = slow.update().now_us
    assert before >= 1_600 * S
    slow_clock.advance(10)  # the fast replica is gone; 10 s of real time pass
    after = slow.update().now_us
    assert after - before >= 10 * S * 0.99, "global time froze (the thesis' 10-minute freeze)"


def test_stale_global_time_after_everyone_was_down_is_adopted_after_watching(store: CellStore) -> None:
    old = Clocks(1_000 * S)
    updater(store, old, "old").update()  # last value before a full outage
    a_clock, b_clock = Clocks(5_000 * S), Clocks(5_000 * S)
    a, b = updater(store, a_clock, "a"), updater(store, b_clock, "b")
    assert a.update().runaway and b.update().runaway  # 4000 s ahead of what they observe
    for _ in range(5):  # both publish guarded estimates; neither counts as evidence for the other
        a_clock.advance(0.5)
        b_clock.advance(0.5)
        ra, rb = a.update(), b.update()
    assert not ra.runaway and not rb.runaway
    assert rb.now_us >= 5_000 * S, "after watching, a replica with nobody to contradict it adopts its clock"


def test_coalescer_never_serves_a_caller_with_a_round_trip_that_started_before_it() -> None:
    async def scenario() -> None:
        started: list[int] = []
        release = asyncio.Event()

        async def operation() -> int:
            started.append(len(started))
            if len(started) == 1:
                await release.wait()  # the first round trip is slow
            return len(started)

        coalesce: Coalescer[int] = Coalescer(operation)
        early = asyncio.create_task(coalesce())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert started == [0]  # in flight
        late = [asyncio.create_task(coalesce()) for _ in range(5)]  # arrive during the first trip
        await asyncio.sleep(0)
        release.set()
        assert await early == 1
        assert [await t for t in late] == [2] * 5  # one new trip serves all late callers
        assert coalesce.round_trips == 2

    asyncio.run(scenario())


def test_coalescer_propagates_errors_to_every_waiter() -> None:
    async def scenario() -> None:
        async def failing() -> int:
            await asyncio.sleep(0)
            raise RuntimeError("store down")

        coalesce: Coalescer[int] = Coalescer(failing)
        results = await asyncio.gather(*(coalesce() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)

    asyncio.run(scenario())
