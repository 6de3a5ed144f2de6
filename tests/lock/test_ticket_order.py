"""Tickets from an extrapolating clock are linearizable (lockclient.clock, "Tickets are linearizable").

A fake global time ``g`` advances with a fake monotonic clock; the source answers ``g`` at any
moment inside its round trip. Whatever the round trips and the moments chosen, a ticket is never
below the global time at the call (so never below anything another client read before), and once
:meth:`Extrapolator.settle` returns global time has reached it (so anything read after is not
below it). Together: a contender whose enqueue completed before another started has the smaller
ticket. The same with the old rule (the lower end, no settle) fails — the test shows why.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from lockclient import RemoteLock, RemoteLocker, open_store
from lockclient.clock import DRIFT, TIGHT_US, Extrapolator
from lockclient.lockid import ticket_time
from lockclient.store import Table
from tests.support.waiting import wait_until


class World:
    """Global time (µs) = monotonic time (ns) / 1000 + offset, at real rate."""

    def __init__(self) -> None:
        self.mono = 10**12
        self.offset = 7_000_000

    def g(self) -> int:
        return self.mono // 1000 + self.offset

    def monotonic_ns(self) -> int:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.mono += max(1, int(seconds * 1e9))


class Source:
    """Answers with a round trip of ``rtt`` µs, global time taken at ``position`` (0..1) of it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rtt_us = 0
        self.position = 0.0

    def fetch(self) -> int:
        before = int(self.rtt_us * self.position)
        self.world.mono += before * 1000
        value = self.world.g()
        self.world.mono += (self.rtt_us - before) * 1000
        return value


steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=300_000),  # µs that pass before the call
        st.integers(min_value=10, max_value=3_000_000),  # round trip of a fetch (up to a paused replica's 3 s)
        st.floats(min_value=0.0, max_value=1.0),  # where in the round trip the value was taken
        st.integers(min_value=0, max_value=20_000),  # µs the queue write takes before settle
    ),
    min_size=1,
    max_size=40,
)


def make(world: World, source: Source) -> Extrapolator:
    return Extrapolator(
        source.fetch, max_age=1.0, refresh_after=10.0, monotonic_ns=world.monotonic_ns, sleep=world.sleep
    )


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_settled_ticket_lies_inside_the_call(schedule: list[tuple[int, int, float, int]]) -> None:
    world = World()
    source = Source(world)
    clock = make(world, source)
    for gap, rtt, position, write in schedule:
        world.mono += gap * 1000
        source.rtt_us, source.position = rtt, position
        if gap % 3 == 0:
            clock.sample()  # a background refresh landed before this call
        invoked = world.g()
        ticket = clock.ticket_us()
        assert ticket >= invoked, "a ticket below global time at its call: an earlier reader could be overtaken"
        world.mono += write * 1000  # the queue write
        waited = clock.settle(ticket)
        assert world.g() >= ticket, "settle returned before global time reached the ticket"
        # What it costs: never more than one round trip (widened by the drift: 2 · DRIFT per
        # second of the round trip and of the sample's age, at most max_age = 1 s), and no more
        # than the interval's tight width unless the fresh answer itself was slow.
        assert waited <= max(rtt / 1e6, TIGHT_US / 1e6) * (1 + 3 * DRIFT) + 2 * DRIFT * 1.0 + 1e-4


def test_the_lower_end_alone_is_not_linearizable() -> None:
    """Why tickets need the upper end and settle: a sample whose value was taken at the start of a
    slow round trip leaves the lower end behind global time by that round trip; another client
    reading global time just before would then be overtaken by a later ticket."""
    world = World()
    source = Source(world)
    clock = make(world, source)
    source.rtt_us, source.position = 20_000, 0.0
    clock.sample()
    world.mono += 1_000_000  # 1 ms later another client reads global time, then we take a ticket
    seen_by_other = world.g()
    assert clock.now_us() < seen_by_other
    assert clock.ticket_us() >= seen_by_other


def test_settle_waits_only_the_uncertainty_and_counts_it() -> None:
    world = World()
    source = Source(world)
    clock = make(world, source)
    source.rtt_us, source.position = 4_000, 0.5
    clock.sample()
    ticket = clock.ticket_us()
    waited = clock.settle(ticket)
    assert 0.0035 <= waited <= 0.0045 and clock.settle_waits == 1
    world.mono += 10_000_000  # a write longer than the uncertainty: nothing left to wait for
    assert clock.settle(clock.ticket_us() - 5_000) == 0.0


def test_a_loose_interval_is_narrowed_by_a_fresh_answer_not_waited_out() -> None:
    """The only answer at hand came back after 2 s (a paused replica): waiting out its interval
    would cost 2 s per ticket; one fresh answer of 1 ms narrows it."""
    world = World()
    source = Source(world)
    clock = make(world, source)
    source.rtt_us, source.position = 2_000_000, 0.5
    clock.sample()
    source.rtt_us = 1_000
    invoked = world.g()
    ticket = clock.ticket_us()
    assert ticket >= invoked and clock.fetches == 2
    assert clock.settle(ticket) <= 0.0011 and world.g() >= ticket


class PausingSource(Source):
    """Answers in 1 ms, except that the next ``pauses`` fetches stall ``pause_us`` first: the
    process was stopped after noting the send time and before the request left (the value is
    then global time at the end of the stall)."""

    def __init__(self, world: World, pause_us: int) -> None:
        super().__init__(world)
        self.rtt_us, self.position = 1_000, 0.5
        self.pause_us = pause_us
        self.pauses = 0

    def fetch(self) -> int:
        if self.pauses:
            self.pauses -= 1
            self.world.mono += self.pause_us * 1000
        return super().fetch()


def test_a_pause_inside_the_fresh_answer_is_not_taken_as_the_ticket() -> None:
    """A loose interval asks for a fresh answer, and this process is paused 3 s inside that round
    trip: once the older answers have expired, the interval is 3 s wide and its upper end 3 s
    ahead of global time. Taken as the ticket (and kept by the ticket floor), it would queue this
    process 3 s behind everybody. One more answer — the pause is over — narrows it."""
    world = World()
    source = PausingSource(world, pause_us=3_000_000)
    clock = make(world, source)
    for _ in range(3):  # the source's usual round trip: 1 ms; these answers have expired since
        clock.sample()
        world.mono += 1_000_000_000
    source.rtt_us = 300_000  # a loose answer (a replica slow for a moment), 0.5 s ago
    clock.sample()
    source.rtt_us = 1_000
    world.mono += 500_000_000
    source.pauses = 1
    invoked = world.g()
    ticket = clock.ticket_us()
    assert ticket >= invoked
    assert clock.fetches == 6, "the answer slowed by the pause was not followed by a fresh one"
    assert ticket - world.g() <= 1_000 * (1 + 3 * DRIFT) + 1, "a ticket as far ahead as the pause"
    assert clock.settle(ticket) <= 0.0011


def test_a_steadily_slow_source_costs_one_fresh_answer_per_loose_ticket() -> None:
    """Every answer takes 300 ms (a loaded ring): a loose ticket asks once, as before; the second
    answer is for a round trip far slower than usual, not for one that is merely slow."""
    world = World()
    source = Source(world)
    clock = make(world, source)
    source.rtt_us, source.position = 300_000, 0.5
    clock.sample()
    world.mono += 500_000_000
    before = clock.fetches
    ticket = clock.ticket_us()
    assert clock.fetches == before + 1 and ticket >= world.g()


def test_without_extrapolation_every_ticket_is_a_fresh_answer() -> None:
    world = World()
    source = Source(world)
    clock = Extrapolator(source.fetch, max_age=0, monotonic_ns=world.monotonic_ns, sleep=world.sleep)
    source.rtt_us, source.position = 4_000, 0.5
    invoked = world.g()
    ticket = clock.ticket_us()
    assert invoked <= ticket <= world.g() and clock.settle(ticket) == 0.0 and clock.fetches == 1


# -- the commit wait in the fair queue ---------------------------------------------------------------


class IntervalClock:
    """A ticket clock over a shared, hand-moved global time: its tickets are ``width`` µs ahead of
    it (the upper end of an interval that wide), and settling a ticket lets global time reach it."""

    def __init__(self, world: dict[str, int], width_us: int) -> None:
        self.world = world
        self.width_us = width_us
        self.settled: list[int] = []

    def now_us(self) -> int:
        return self.world["g"]

    def ticket_us(self) -> int:
        return self.world["g"] + self.width_us

    def settle(self, value_us: int) -> float:
        self.settled.append(value_us)
        self.world["g"] = max(self.world["g"], value_us)
        return 0.0

    def close(self) -> None:
        pass


def test_a_ticket_below_an_uncontended_holders_only_waits_for_its_release(sqlite_url: str) -> None:
    """A is granted on its first look and skips the commit wait, so B, starting right after, takes
    a ticket *below* A's (A's interval was 5 ms wide, B's is exact). That decides nothing: B waits
    for A's release; C, which starts after B settled, comes after B; the grants go A, B, C."""
    world = {"g": 1_800_000_000_000_000}
    with open_store(sqlite_url) as store:
        clocks = {name: IntervalClock(world, width) for name, width in (("a", 5_000), ("b", 0), ("c", 0))}
        lockers = {name: RemoteLocker(store, clock=clock, lease=30) for name, clock in clocks.items()}
        try:
            a = lockers["a"].get_lock("L")
            assert not a.waited and clocks["a"].settled == [], "an uncontended grant waited for its ticket"
            granted: dict[str, RemoteLock] = {}
            errors: list[BaseException] = []

            def contend(name: str) -> None:
                try:
                    granted[name] = lockers[name].get_lock("L", timeout=60)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = {}
            for name in ("b", "c"):
                threads[name] = threading.Thread(target=contend, args=(name,))
                threads[name].start()
                wait_until(lambda name=name: clocks[name].settled, f"{name} to settle its ticket before waiting", 30)
                world["g"] += 1_000
            queue = [cell.column for cell in store.read_row(Table.QUEUE, "L")]
            # In the store's order: b and c (below the holder's ticket), then the holder's own cell.
            assert [ticket_time(t) for t in queue] == [*(clocks[n].settled[0] for n in "bc"), ticket_time(a.ticket)]
            assert ticket_time(queue[0]) < ticket_time(a.ticket), "b's ticket should sort below the holder's"
            assert not granted and not errors
            a.release()
            wait_until(lambda: "b" in granted or errors, "b's grant", 30)
            assert not errors and "c" not in granted, "c was granted before b released"
            granted["b"].release()
            threads["c"].join(60)
            assert not errors and "c" in granted
            assert a.fencing_token < granted["b"].fencing_token < granted["c"].fencing_token
            assert granted["b"].waited and granted["c"].waited
            granted["c"].release()
            threads["b"].join(60)
        finally:
            for locker in lockers.values():
                locker.close()


def test_a_look_retried_while_the_store_was_away_is_dated_from_the_try_that_answered(tmp_path: object) -> None:
    """``RemoteLock.looked_at`` promises that every queue cell written before it was visible to the
    grant's look. A look retried through a store outage used to keep the first try's start, so a
    cell written (or removed) during the outage fell on the wrong side of it — found by the
    simulator (a grant appeared to overtake a cell leasewatch revoked during a 4 s cut-off)."""
    import time

    from lockclient.errors import StoreUnavailable
    from tests.support.faulty import FaultyStore

    tries: list[float] = []
    with open_store(f"sqlite:///{tmp_path}/cells.db") as store:
        faulty = FaultyStore(store)
        faulty.arm(
            "read_row",
            before=lambda *a, **k: tries.append(time.monotonic()),
            raise_before=StoreUnavailable("injected: the store is away"),
            when=lambda table, *a, **k: table is Table.QUEUE,
            times=3,
        )
        with RemoteLocker(faulty, lease=5.0) as locker, locker.get_lock("retried-look", timeout=30) as lock:
            assert len(tries) == 3, "the look failed three times before it answered"
            assert lock.looked_at is not None
            assert lock.looked_at > tries[-1], "looked_at is the start of the try that answered, after the failures"
