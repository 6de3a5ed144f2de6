"""lockclient.clock against real timesvc replicas: fail-over, the monotonic floor, clear errors."""

from __future__ import annotations

import asyncio
import time

import pytest

from lockclient import ConfigurationError, TimeServiceUnavailable
from lockclient.clock import AsyncTimeServiceClock, TimeServiceClock
from tests.support.procs import Fleet, free_port

pytestmark = pytest.mark.slow


def test_fails_over_between_replicas_and_never_goes_back(processes: Fleet, sqlite_url: str) -> None:
    a, b = processes.timesvc(sqlite_url, name="a"), processes.timesvc(sqlite_url, name="b")
    a.wait_ready()
    b.wait_ready()
    dead = f"http://127.0.0.1:{free_port()}"
    clock = TimeServiceClock([dead, a.url, b.url], timeout=1.0, max_age=0)  # every value from timesvc
    values = [clock.now_us() for _ in range(5)]  # the dead replica is skipped
    a.kill()
    values += [clock.now_us() for _ in range(5)]  # fails over to b
    assert values == sorted(values) and len(set(values)) > 1
    b.kill()
    with pytest.raises(TimeServiceUnavailable, match="no timesvc replica answered") as info:
        clock.now_us()
    assert dead in str(info.value) and b.url in str(info.value)
    clock.close()


def test_extrapolated_time_never_runs_ahead_and_expires(processes: Fleet, sqlite_url: str) -> None:
    """Between answers the clock extrapolates with the local monotonic clock: never ahead of
    what timesvc answers afterwards, and only for max_age once timesvc is gone."""
    replica = processes.timesvc(sqlite_url, name="r")
    replica.wait_ready()
    clock = TimeServiceClock([replica.url], timeout=1.0, max_age=0.5, refresh_after=0.1)
    truth = TimeServiceClock([replica.url], timeout=1.0, max_age=0)
    for _ in range(200):
        extrapolated = clock.now_us()
        assert extrapolated <= truth.now_us(), "an extrapolated ticket ran ahead of global time"
    asked = clock.fetches
    assert asked < 100, f"extrapolation should spare most round trips, asked {asked} times for 200 values"
    replica.kill()
    time.sleep(0.6)  # past max_age: no more extrapolation without a fresh answer
    with pytest.raises(TimeServiceUnavailable):
        clock.now_us()
    clock.close()
    truth.close()


def test_async_clock_and_bad_urls(processes: Fleet, sqlite_url: str) -> None:
    replica = processes.timesvc(sqlite_url, name="r")
    replica.wait_ready()

    async def scenario() -> list[int]:
        clock = AsyncTimeServiceClock([replica.url])
        try:
            return [await clock.anow_us() for _ in range(5)]
        finally:
            await clock.aclose()

    values = asyncio.run(scenario())
    assert values == sorted(values)
    for bad in ("", "ftp://x", " , "):
        with pytest.raises(ConfigurationError):
            TimeServiceClock(bad)


def test_a_lying_replica_never_breaks_later_tickets(processes: Fleet, sqlite_url: str) -> None:
    """Issue 22 finding 4: one replica answering now_us = 10^20 lifted the client's floor for good,
    and every later ticket of that process failed. Now its answer needs another replica's word,
    gets none, and is rejected; the locks of that process keep working with sane tickets."""
    from pathlib import Path

    from lockclient import RemoteLocker, open_store
    from lockclient.lockid import ticket_time
    from tests.support.waiting import wait_until

    port = free_port()
    liar = processes.python("liar", [str(Path(__file__).with_name("liar.py")), str(port)], {})
    wait_until(lambda: "listening" in liar.log_tail(), "the lying replica to listen")
    a, b = (processes.timesvc(sqlite_url, name=n, replicas=3, wait=False) for n in ("a", "b"))
    a.wait_ready()
    b.wait_ready()
    clock = TimeServiceClock([f"http://127.0.0.1:{port}", a.url, b.url], timeout=2.0)
    locker = RemoteLocker(open_store(sqlite_url), clock, lease=5, owns_store=True)
    try:
        for i in range(10):
            with locker.get_lock(f"liar-{i % 2}", timeout=10) as lock:
                ticket_us = ticket_time(lock.ticket)
                assert abs(ticket_us - time.time_ns() // 1000) < 2_000_000, f"ticket {lock.ticket} far from real time"
            assert clock.now_us() < time.time_ns() // 1000 + 2_000_000
        assert clock.rejected >= 1, "the lie was never even seen"
    finally:
        locker.close()
        clock.close()
