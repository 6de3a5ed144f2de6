"""TryUpdateGlobalTime's rules with clocks moved by hand, on a real store (DESIGN.md §4)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from lockclient import CellStore, open_store
from lockclient.globaltime import (
    GLOBAL_TIME_ROW,
    GlobalTimeNotEstablished,
    GlobalTimeUpdater,
    UpdateResult,
    read_global_time,
)
from lockclient.store import Table
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


def updater(store: CellStore, clocks: Clocks, name: str, replicas: int = 3) -> GlobalTimeUpdater:
    return GlobalTimeUpdater(
        store,
        replica_id=name,
        max_skew=1.0,
        replicas=replicas,
        stale_after=2.0,
        wall_us=clocks.wall_us,
        monotonic_ns=clocks.monotonic_ns,
    )


def tick(*pairs: tuple[GlobalTimeUpdater, Clocks], seconds: float = 0.5) -> list[UpdateResult]:
    """One scheduled tick of each replica (clock readings published), then time passes."""
    results = [u.update(report_clock=True) for u, _ in pairs]
    for _, c in pairs:
        c.advance(seconds)
    return results


def establish(*pairs: tuple[GlobalTimeUpdater, Clocks]) -> None:
    """Tick until global time exists (the first value needs a majority of agreeing clocks)."""
    for _ in range(3):
        for u, c in pairs:
            with contextlib.suppress(GlobalTimeNotEstablished):
                u.update(report_clock=True)
            c.advance(0.1)
        if read_global_time(pairs[0][0]._store) is not None:
            return
    raise AssertionError("global time was never established")


def test_cell_value_is_its_timestamp_and_never_decreases(store: CellStore) -> None:
    a_clock, b_clock = Clocks(1_000 * S), Clocks(900 * S)
    a, b = updater(store, a_clock, "a", replicas=1), updater(store, b_clock, "b", replicas=1)
    first = a.update().now_us
    assert first == 1_000 * S
    reading = read_global_time(store)
    assert reading is not None and reading.value_us == first and reading.publisher == "a" and reading.trusted
    b_clock.advance(0.1)
    assert b.update().now_us >= first  # b's clock is 100 s behind: it serves observed + elapsed
    assert not b.runaway


def test_a_fast_clock_among_live_replicas_is_refused_and_never_leaks(store: CellStore) -> None:
    h1, h2, fast = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_600 * S)
    a, b, f = updater(store, h1, "h1"), updater(store, h2, "h2"), updater(store, fast, "fast")
    establish((a, h1), (b, h2))
    for i in range(20):
        _, _, result = tick((a, h1), (b, h2), (f, fast))
        if i >= 2:  # it has seen both peers' readings change: they are running
            assert result.runaway and "clock" in result.refusing
            assert not result.current or result.now_us <= h1.wall + 1 * S
        assert result.now_us <= h1.wall + 1 * S, "the fast clock leaked into global time"
    assert f.runaway and not a.runaway and not b.runaway


def test_a_clock_ahead_within_the_slack_is_capped_at_the_majoritys_support(store: CellStore) -> None:
    """A clock 0.8 s ahead is not refused (within max_skew), but it never publishes more than the
    support of the majority + max_skew/2: global time follows the correct clocks, not it."""
    h1, h2, fast = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_000 * S + 800_000)
    a, b, f = updater(store, h1, "h1"), updater(store, h2, "h2"), updater(store, fast, "fast")
    establish((a, h1), (b, h2))
    for _ in range(40):
        results = tick((a, h1), (b, h2), (f, fast))
        assert all(r.now_us <= h1.wall + S // 2 + 1 for r in results), "more than max_skew/2 above the clocks"
    assert not f.runaway


def test_the_majority_s_support_is_the_f_plus_1_th_largest_clock(store: CellStore) -> None:
    """Five replicas, two faulty (+600 s and +300 s): the third-largest fresh reading is a correct
    clock, so global time follows the correct ones."""
    clocks = [Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_600 * S), Clocks(1_300 * S)]
    pairs = [(updater(store, c, f"r{i}", replicas=5), c) for i, c in enumerate(clocks)]
    establish(*pairs[:3])
    for _ in range(10):
        results = tick(*pairs)
        assert all(r.now_us <= clocks[0].wall + 1 * S for r in results)
    assert pairs[3][0].runaway and pairs[4][0].runaway
    assert not any(u.runaway for u, _ in pairs[:3])


def test_first_value_needs_a_majority_so_a_runaway_starting_first_cannot_set_it(store: CellStore) -> None:
    fast, h1, h2 = Clocks(1_600 * S), Clocks(1_000 * S), Clocks(1_000 * S)
    f = updater(store, fast, "fast")
    for _ in range(10):  # alone on an empty store: never publishes its clock
        with pytest.raises(GlobalTimeNotEstablished, match="majority"):
            f.update(report_clock=True)
        fast.advance(0.5)
    assert read_global_time(store) is None
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2), (f, fast))
    reading = read_global_time(store)
    assert reading is not None and reading.value_us <= h1.wall + 1 * S


def test_no_freeze_after_the_fast_replica_dies(store: CellStore) -> None:
    fast_clock, slow_clock = Clocks(1_600 * S), Clocks(1_000 * S)
    fast, slow = updater(store, fast_clock, "fast", replicas=1), updater(store, slow_clock, "slow", replicas=1)
    fast.update()  # alone (one configured replica): publishes its clock, 600 s ahead
    slow_clock.advance(0.1)
    before = slow.update().now_us
    assert before >= 1_600 * S
    slow_clock.advance(10)  # the fast replica is gone; 10 s of real time pass
    after = slow.update().now_us
    assert after - before >= 10 * S * 0.99, "global time froze (the thesis' 10-minute freeze)"


def test_the_carry_is_slowed_by_the_rate_bound(store: CellStore) -> None:
    """Without a majority only the carry is published; it advances by the monotonic clock slowed by
    ρ, so a monotonic clock running fast by up to ρ cannot move global time ahead of real time."""
    clock = Clocks(1_000 * S)
    a = GlobalTimeUpdater(
        store,
        replica_id="a",
        replicas=3,
        wall_us=clock.wall_us,
        monotonic_ns=lambda: int(clock.mono * (1 + 500e-6)),  # runs 500 ppm fast
    )
    updater(store, Clocks(1_000 * S), "b", replicas=1).update()  # a value exists; b is gone: a is alone
    first = a.update(report_clock=True).now_us
    for _ in range(3600):
        clock.advance(1.0)
        last = a.update(report_clock=True).now_us
    assert last - first <= 3600 * S, "the carry ran ahead of real time"
    assert last - first >= 3600 * S * (1 - 2 * 500e-6), "the carry froze"


@pytest.mark.parametrize("pause", [2.0, 10.0, 60.0])
def test_a_runaway_replica_cannot_adopt_its_clock_while_the_healthy_ones_are_paused(
    store: CellStore, pause: float
) -> None:
    """Finding 8: with an old rule, a replica 600 s ahead adopted its own clock once it had seen
    no trusted publisher for 4 ticks — pausing the healthy replicas for ~2 s moved global time
    600 s ahead for good. Now nothing but a majority's support puts a clock into global time."""
    h1, h2, fast = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_600 * S)
    a, b, f = updater(store, h1, "h1"), updater(store, h2, "h2"), updater(store, fast, "fast")
    establish((a, h1), (b, h2))
    for _ in range(4):
        tick((a, h1), (b, h2), (f, fast))
    assert f.runaway
    # The healthy replicas are paused (SIGSTOP, a partition from the store): they do not tick,
    # but real time passes on every machine.
    for _ in range(int(pause / 0.5)):
        result = f.update(report_clock=True)
        assert result.now_us - fast.wall < -599 * S  # still far behind the runaway clock
        assert result.now_us <= h1.wall + 1 * S, "global time jumped ahead of wall time"
        for c in (h1, h2, fast):
            c.advance(0.5)
    # They come back: global time went on at real rate meanwhile (the carry) and the healthy
    # replicas' clocks are within max_skew of it again.
    for _ in range(4):
        results = tick((a, h1), (b, h2), (f, fast))
        assert all(r.now_us <= h1.wall + 1 * S for r in results)
    assert not a.runaway and not b.runaway and f.runaway
    reading = read_global_time(store)
    assert reading is not None and abs(reading.value_us - h1.wall) <= 1 * S


def test_a_replica_configured_for_one_beside_two_configured_for_three_refuses(store: CellStore) -> None:
    """Issue 22 finding 2: configured TIMESVC_REPLICAS=1 with a clock +600 s, it was its own
    majority. Now it counts the fresh readings it sees (three: it is no majority alone) and refuses
    because its peers are configured for more."""
    h1, h2, bad = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_600 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    m = updater(store, bad, "misconfigured", replicas=1)
    for i in range(10):
        results = tick((a, h1), (b, h2), (m, bad))
        assert all(r.now_us <= h1.wall + 1 * S for r in results), "the misconfigured replica moved global time"
        if i >= 1:
            assert "replicas" in results[2].refusing and "clock" in results[2].refusing
    assert not a.refusing and not b.refusing


def test_a_replica_restarted_alone_with_too_few_replicas_still_cannot_publish_its_clock(store: CellStore) -> None:
    """The healthy replicas are gone, but their readings (kept for READING_EXPIRY) say they
    were configured for three: a replica started with TIMESVC_REPLICAS=1 counts like them (no
    majority alone), and global time goes on from the carry, not from its clock 600 s ahead."""
    h1, h2 = Clocks(1_000 * S), Clocks(1_000 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    tick((a, h1), (b, h2))
    bad = Clocks(h1.wall + 600 * S)
    m = updater(store, bad, "misconfigured", replicas=1)
    start = h1.wall
    for _ in range(20):
        result = m.update(report_clock=True)
        assert result.needed == 2 and result.support_us is None, "it must count like its peers did"
        assert result.now_us <= h1.wall + 1 * S
        for c in (h1, bad):
            c.advance(0.5)
    assert result.now_us >= start + 8 * S, "global time must not freeze either"


def test_more_fresh_readings_than_configured_is_counted_not_refused(store: CellStore) -> None:
    """A rolling update runs a fourth replica beside three for a while (maxSurge 1), all configured
    for three: the count of fresh readings is used (a majority of four), nobody refuses."""
    clocks = [Clocks(1_000 * S) for _ in range(4)]
    pairs = [(updater(store, c, f"r{i}"), c) for i, c in enumerate(clocks)]
    establish(*pairs[:3])
    for _ in range(6):
        results = tick(*pairs)
    assert all(not r.refusing for r in results)
    assert results[0].fresh == 4 and results[0].needed == 3


def test_a_dead_replica_s_last_reading_is_not_fresh(store: CellStore) -> None:
    """A replica that starts sees its peers' readings for the first time: one that has stopped
    (its reading stays until the TTL) must not count towards a majority."""
    h1, h2, late = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_000 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    tick((a, h1), (b, h2))
    # b stops for good; a new replica c starts while a is paused: it sees a's and b's last readings.
    c = updater(store, late, "c")
    for _ in range(6):
        result = c.update(report_clock=True)
        assert result.fresh == 1 and result.support_us is None
        late.advance(0.5)


@pytest.mark.parametrize("jump_s", [0.4, 0.9, 600.0])
def test_a_clock_that_jumps_ahead_while_running_never_steps_global_time(store: CellStore, jump_s: float) -> None:
    """One replica's clock jumps ahead — within max_skew/2 (a correct clock may), within max_skew,
    or far: global time rises no faster than 1 + ρ, so a client extrapolating an earlier answer at
    real rate is never overtaken by a later one (no step)."""
    clocks = [Clocks(1_000 * S) for _ in range(3)]
    pairs = [(updater(store, c, f"r{i}"), c) for i, c in enumerate(clocks)]
    establish(*pairs)
    tick(*pairs, seconds=0.1)
    previous = max(r.now_us for r in tick(*pairs, seconds=0.1))
    clocks[2].wall += int(jump_s * S)
    for _ in range(200):
        results = tick(*pairs, seconds=0.1)
        for r in results:
            assert r.now_us - previous <= 100_000 * (1 + 2 * 500e-6) + 2, "global time stepped"
            previous = max(previous, r.now_us)
    assert previous <= clocks[0].wall + 1 * S


def test_global_time_left_behind_by_an_outage_catches_up_at_once(store: CellStore) -> None:
    old = Clocks(1_000 * S)
    updater(store, old, "old", replicas=1).update()  # the last value, 10 s before the outage ended
    h1, h2 = Clocks(1_010 * S), Clocks(1_010 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    results = tick((a, h1), (b, h2))
    assert results[-1].now_us >= h2.wall - 1 * S and results[-1].current


def test_a_replica_in_sync_keeps_serving_when_its_clock_jumps_ahead(store: CellStore) -> None:
    """A replica whose clock jumps 600 s ahead is refused, but it still hands out the stored value
    and its carry — current, since a majority's readings vouch for it."""
    h1, h2 = Clocks(1_000 * S), Clocks(1_000 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    assert tick((a, h1), (b, h2))[1].current
    h2.wall += 600 * S
    for _ in range(4):
        result = tick((a, h1), (b, h2))[1]
        assert result.runaway and result.current
        assert abs(result.now_us - h1.wall) <= 1 * S


def test_stale_global_time_after_a_full_outage_is_recovered_by_a_majority(store: CellStore) -> None:
    old = Clocks(1_000 * S)
    updater(store, old, "old", replicas=1).update()  # the last value before a full outage
    a_clock, b_clock, c_clock = Clocks(5_000 * S), Clocks(5_000 * S), Clocks(5_000 * S)
    a, b = updater(store, a_clock, "a"), updater(store, b_clock, "b")
    first = a.update(report_clock=True)
    assert first.published is False or first.now_us < 5_000 * S  # alone: only the carry
    assert not first.current  # stale global time or a wrong clock: a cannot vouch for now_us (503)
    a_clock.advance(0.5)
    b_clock.advance(0.5)
    results = tick((a, a_clock), (b, b_clock))  # they see each other's readings change: 2 of 3
    results += tick((a, a_clock), (b, b_clock))
    results += tick((a, a_clock), (b, b_clock))
    assert not results[-1].runaway and not results[-2].runaway
    assert all(r.current for r in results[-2:])
    assert results[-1].now_us >= 5_000 * S, "a majority of healthy clocks recovers from stale global time"
    # A third replica that is 600 s ahead of them is refused; it hands out their time, not its own.
    c_clock.wall = a_clock.wall + 600 * S
    c = updater(store, c_clock, "c")
    for i in range(6):
        result = tick((a, a_clock), (b, b_clock), (c, c_clock))[2]
        if i >= 2:
            assert result.runaway and result.current
        assert result.now_us <= a_clock.wall + 1 * S
    reading = read_global_time(store)
    assert reading is not None and reading.value_us <= a_clock.wall + 1 * S


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


def test_a_reading_unchanged_for_the_expiry_is_deleted_by_observation_not_by_a_clock(store: CellStore) -> None:
    """Readings carry no TTL (a TTL is judged by a wall clock: a replica ten minutes ahead would see
    every peer's reading expired and believe itself alone); a replica that has seen one unchanged
    for READING_EXPIRY deletes it, just above its write timestamp."""
    from lockclient.globaltime import CLOCK_PREFIX, READING_EXPIRY

    h1, h2, gone = Clocks(1_000 * S), Clocks(1_000 * S), Clocks(1_000 * S)
    a, b, c = updater(store, h1, "h1"), updater(store, h2, "h2"), updater(store, gone, "gone")
    establish((a, h1), (b, h2), (c, gone))
    tick((a, h1), (b, h2), (c, gone))

    def columns() -> set[str]:
        return {cell.column for cell in store.read_row(Table.GLOBAL_TIME, GLOBAL_TIME_ROW)}

    assert CLOCK_PREFIX + "gone" in columns()
    for _ in range(int(READING_EXPIRY / 0.5) - 4):  # c stopped; a and b tick on
        tick((a, h1), (b, h2))
    assert CLOCK_PREFIX + "gone" in columns(), "deleted before the expiry"
    for _ in range(8):
        tick((a, h1), (b, h2))
    assert CLOCK_PREFIX + "gone" not in columns()
    assert {CLOCK_PREFIX + "h1", CLOCK_PREFIX + "h2"} <= columns()
    # It comes back: its next reading is written far above the tombstone.
    tick((a, h1), (b, h2), (c, gone))
    assert CLOCK_PREFIX + "gone" in columns()


def test_while_the_clocks_are_behind_the_carry_the_fresh_readings_are_still_counted(store: CellStore) -> None:
    """Every wall clock steps back (NTP): the majority's clocks are behind what global time has
    reached, so the carry is published, not the clocks — and the result still says how many fresh
    readings were seen (timesvc's replicas-seen gauge and /status read it)."""
    clocks = [Clocks(1_000 * S) for _ in range(3)]
    pairs = [(updater(store, c, f"r{i}"), c) for i, c in enumerate(clocks)]
    establish(*pairs)
    for _ in range(4):
        assert [r.fresh for r in tick(*pairs, seconds=0.1)] == [3, 3, 3]
    for c in clocks:
        c.wall -= S // 2  # within max_skew of each other, behind global time
    results = tick(*pairs, seconds=0.1)
    assert all(r.now_us > c.wall for r, c in zip(results, clocks, strict=True)), "global time stepped back"
    assert [r.fresh for r in results] == [3, 3, 3]


def test_a_clock_ahead_within_the_slack_is_caught_up_with_at_rate_one_plus_rho(store: CellStore) -> None:
    """A replica whose clock is 0.3 s ahead of the majority (within the slack) starts trusting it at
    the majority's support, and follows it up at exactly rate 1 + ρ of its monotonic clock — no
    faster (a step for clients extrapolating at real rate), and no slower (a trust that fell behind
    its own, correct, clock at ρ per second)."""
    h1, h2 = Clocks(1_000 * S), Clocks(1_000 * S)
    a, b = updater(store, h1, "h1"), updater(store, h2, "h2")
    establish((a, h1), (b, h2))
    ahead = Clocks(h1.wall + 300_000)
    f = updater(store, ahead, "ahead")
    for _ in range(5):
        tick((a, h1), (b, h2), (f, ahead), seconds=0.1)
    start = tick((a, h1), (b, h2), (f, ahead), seconds=0.1)[2].now_us
    for _ in range(199):
        tick((a, h1), (b, h2), (f, ahead), seconds=0.1)
    end = tick((a, h1), (b, h2), (f, ahead), seconds=0.1)[2].now_us
    assert end < ahead.wall, "caught up already: the window shows no rate"
    rho = f._rho
    # ±1 µs of rounding per tick at most; a rate of 1 - ρ would be 20,000 µs short.
    assert abs((end - start) - 20 * S * (1 + rho)) <= 200, f"rose {end - start} µs in 20 s"
