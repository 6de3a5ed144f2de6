"""Tickets from an extrapolating clock are linearizable (lockclient.clock, "Tickets are linearizable").

A fake global time ``g`` advances with a fake monotonic clock; the source answers ``g`` at any
moment inside its round trip. Whatever the round trips and the moments chosen, a ticket is never
below the global time at the call (so never below anything another client read before), and once
:meth:`Extrapolator.settle` returns global time has reached it (so anything read after is not
below it). Together: a contender whose enqueue completed before another started has the smaller
ticket. The same with the old rule (the lower end, no settle) fails — the test shows why.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lockclient.clock import Extrapolator


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
        # What it costs: never more than one round trip (plus the drift margin), and no more
        # than the interval's tight width unless the fresh answer itself was slow.
        assert waited <= max(rtt / 1e6, 0.02) + 1e-3


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


def test_without_extrapolation_every_ticket_is_a_fresh_answer() -> None:
    world = World()
    source = Source(world)
    clock = Extrapolator(source.fetch, max_age=0, monotonic_ns=world.monotonic_ns, sleep=world.sleep)
    source.rtt_us, source.position = 4_000, 0.5
    invoked = world.g()
    ticket = clock.ticket_us()
    assert invoked <= ticket <= world.g() and clock.settle(ticket) == 0.0 and clock.fetches == 1
