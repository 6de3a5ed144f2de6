"""TimeServiceClock rejects implausible answers and never lets one lift its floor (issue 22,
finding 4), with replicas simulated by an httpx transport and a hand-moved monotonic clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from lockclient import TimeServiceUnavailable
from lockclient.clock import AsyncTimeServiceClock, TimeServiceClock

S = 1_000_000
LIE = 10**20
START = 1_800_000_000 * S


class World:
    """Real time (µs since the epoch) moved by hand; each replica answers a function of it."""

    def __init__(self) -> None:
        self.real_us = START
        self.asked: list[str] = []

    def monotonic_ns(self) -> int:
        return (self.real_us - START) * 1000 + 10**12

    def advance(self, seconds: float) -> None:
        self.real_us += int(seconds * S)

    def handler(self, answers: dict[str, Callable[[int], int]]) -> Callable[[httpx.Request], httpx.Response]:
        def handle(request: httpx.Request) -> httpx.Response:
            host = request.url.host
            self.asked.append(host)
            self.advance(0.001)  # a 1 ms round trip
            return httpx.Response(200, json={"now_us": answers[host](self.real_us), "replica": host})

        return handle


def honest(real: int) -> int:
    return real


def liar(real: int) -> int:
    return LIE


def test_a_lying_replica_asked_first_never_reaches_the_floor() -> None:
    world = World()
    transport = httpx.MockTransport(world.handler({"liar": liar, "a": honest, "b": honest}))
    clock = TimeServiceClock(
        ["http://liar", "http://a", "http://b"], transport=transport, max_age=0, monotonic_ns=world.monotonic_ns
    )
    for _ in range(20):
        value = clock.now_us()
        assert abs(value - world.real_us) <= 10_000, "a lie reached the clock"
        ticket = clock.ticket_us()
        assert abs(ticket - world.real_us) <= 10_000
        world.advance(0.05)
    assert clock.rejected >= 1
    # The liar was asked once, rejected (no other replica agreed), and never preferred again.
    assert world.asked.count("liar") == 1


def test_a_replica_that_starts_lying_later_is_rejected_against_what_the_client_knows() -> None:
    world = World()
    lying = {"now": False}
    # At the cold start a's answer waits for b's word (not a rejection), and b is preferred from
    # then on: so b is the one that starts lying.
    answers = {
        "a": honest,
        "b": lambda real: LIE if lying["now"] else real,
    }
    transport = httpx.MockTransport(world.handler(answers))
    clock = TimeServiceClock(["http://a", "http://b"], transport=transport, max_age=0, monotonic_ns=world.monotonic_ns)
    first = clock.now_us()
    lying["now"] = True
    world.advance(10)
    later = [clock.ticket_us() for _ in range(5)]
    assert all(first < t < first + 11 * S for t in later)
    assert clock.rejected == 1  # b's first lie; then a is preferred


def test_an_answer_slightly_ahead_is_accepted_but_far_ahead_needs_another_replica() -> None:
    world = World()
    offsets = {"a": 0, "b": 0}
    transport = httpx.MockTransport(world.handler({k: (lambda real, k=k: real + offsets[k]) for k in offsets}))
    clock = TimeServiceClock(["http://a", "http://b"], transport=transport, max_age=0, monotonic_ns=world.monotonic_ns)
    clock.now_us()  # cold start: a's answer waits for b's word; b is preferred from then on
    rejected = clock.rejected
    assert rejected == 0, "a first answer waiting for a second replica's word is not a rejection"
    offsets["b"] = int(1.5 * S)  # within max_skew + margin (2 s): plausible
    assert clock.now_us() >= world.real_us + S
    offsets["b"] = 600 * S  # far: a disagrees, so rejected
    assert clock.now_us() < world.real_us + 2 * S
    assert clock.rejected == rejected + 1


def test_a_legitimate_jump_of_global_time_is_accepted_when_two_replicas_agree() -> None:
    """Global time left behind by an outage catches up at once: every replica agrees on the new
    value, which is far from what the client knew — accepted on the second replica's word."""
    world = World()
    jump = {"by": 0}
    transport = httpx.MockTransport(world.handler({k: (lambda real: real + jump["by"]) for k in ("a", "b", "c")}))
    clock = TimeServiceClock(
        ["http://a", "http://b", "http://c"], transport=transport, max_age=0, monotonic_ns=world.monotonic_ns
    )
    before = clock.now_us()
    rejected = clock.rejected
    jump["by"] = 3600 * S
    after = clock.now_us()
    assert after - before >= 3600 * S
    assert clock.rejected == rejected + 1  # the first answer after the jump waited for a second replica


def test_no_plausible_answer_is_an_error_not_a_value() -> None:
    world = World()
    transport = httpx.MockTransport(world.handler({"a": honest, "b": liar}))
    clock = TimeServiceClock(["http://b", "http://a"], transport=transport, max_age=0, monotonic_ns=world.monotonic_ns)
    # Cold start, two replicas that disagree: neither can be believed.
    with pytest.raises(TimeServiceUnavailable, match="implausible"):
        clock.now_us()


def test_the_async_clock_rejects_lies_too() -> None:
    world = World()

    async def scenario() -> list[int]:
        handle = world.handler({"liar": liar, "a": honest, "b": honest})

        async def ahandle(request: httpx.Request) -> httpx.Response:
            return handle(request)

        clock = AsyncTimeServiceClock(
            ["http://liar", "http://a", "http://b"],
            transport=httpx.MockTransport(ahandle),
            monotonic_ns=world.monotonic_ns,
        )
        try:
            return [await clock.anow_us() for _ in range(5)]
        finally:
            await clock.aclose()

    values = asyncio.run(scenario())
    assert all(v < LIE // 2 for v in values)
    assert values == sorted(values)
