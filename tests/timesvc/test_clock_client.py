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
