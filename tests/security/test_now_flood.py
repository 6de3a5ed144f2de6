"""Issue 16, also-fix: a flood of ``/now`` requests cannot become store load.

Trips start at least ``TIMESVC_MIN_TRIP_INTERVAL`` apart; requests that arrive meanwhile
share the next trip — which still starts after each of them arrived, so DESIGN §4's rule
("≥ every value any replica returned before the request arrived") is untouched. Checked
with the monotonic-reads checker across replicas, and store trips counted.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from tests.support.history import monotonic_read_violations
from tests.support.procs import Fleet
from tests.timesvc.test_replicas import hammer
from timesvc.coalesce import Coalescer

pytestmark = pytest.mark.slow


def trips(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^timesvc_store_round_trips_total ([0-9.e+]+)$", text, re.M)
    assert match
    return float(match.group(1))


def test_a_trip_never_serves_a_request_that_arrived_after_it_started() -> None:
    """The generation rule holds with the pause: every caller's trip starts after its call."""
    starts: list[float] = []

    async def operation() -> float:
        starts.append(time.monotonic())
        await asyncio.sleep(0.003)
        return starts[-1]

    async def run() -> list[tuple[float, float]]:
        coalescer: Coalescer[float] = Coalescer(operation, min_interval=0.01)

        async def caller(delay: float) -> tuple[float, float]:
            await asyncio.sleep(delay)
            called = time.monotonic()
            return called, await coalescer()

        return await asyncio.gather(*(caller(i * 0.0007) for i in range(200)))

    results = asyncio.run(run())
    assert all(started >= called for called, started in results)
    # The promise is a token bucket: in every window, at most one trip per 10 ms plus a burst of 8.
    # Judged on every window, not on "the second half": a loop stalled by a busy machine refills the
    # bucket, and the burst that follows is allowed (a CI run at load saw 11 trips in 83 ms there).
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            trips_in_window, span = j - i + 1, starts[j] - first
            assert trips_in_window <= 8 + span / 0.01 + 1e-3, f"{trips_in_window} trips in {span:.4f} s"
    assert len(starts) < len(results), "requests shared trips"


def test_sequential_requests_cannot_drive_store_trips_beyond_the_bound(processes: Fleet, sqlite_url: str) -> None:
    """The review: 2,419 sequential requests cost 2,435 round trips. One client, one replica, 3 s."""
    interval = 0.01
    replica = processes.timesvc(sqlite_url, name="r", tick=0.5, env={"TIMESVC_MIN_TRIP_INTERVAL": str(interval)})
    replica.wait_ready()
    with httpx.Client(base_url=replica.url, timeout=5) as http:
        before, started, requests = trips(replica.url), time.monotonic(), 0
        while time.monotonic() - started < 3:
            assert http.get("/now").status_code == 200
            requests += 1
        elapsed, spent = time.monotonic() - started, trips(replica.url) - before
    rate = spent / elapsed
    print(f"\nsequential client: {requests} requests, {spent:.0f} trips in {elapsed:.1f} s = {rate:.0f} trips/s")
    assert rate <= 1 / interval + 2 + 5  # the bound, the ticks, slack for the /metrics reads' timing


def test_concurrent_flood_across_replicas_stays_monotonic_and_shares_trips(processes: Fleet, sqlite_url: str) -> None:
    replicas = [processes.timesvc(sqlite_url, name=f"r{i}", tick=0.5, replicas=3) for i in range(3)]
    for replica in replicas:
        replica.wait_ready()
    urls = [replica.url for replica in replicas]
    before = [trips(url) for url in urls]
    started = time.monotonic()
    reads = asyncio.run(hammer(urls, clients=48, seconds=5))
    elapsed = time.monotonic() - started
    spent = sum(trips(url) for url in urls) - sum(before)
    assert not monotonic_read_violations(reads)
    per_request = spent / len(reads)
    print(
        f"\n/now flood, 48 clients over 3 replicas (default TIMESVC_MIN_TRIP_INTERVAL): {len(reads)} requests, "
        f"{spent:.0f} store trips = {per_request:.3f} trips/request, {spent / elapsed / 3:.0f} trips/s per replica"
    )
    assert spent / elapsed / 3 <= 1 / 0.002 + 2 + 20
    assert per_request < 0.5
