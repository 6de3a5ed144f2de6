"""A wall-clock step on the leasewatch host changes no revocation bound (issue 22, finding 3;
DESIGN.md §6, §7.3).

leasewatch judges leases by its own monotonic clock, but its jobs (scan, due check, partition
heartbeats) used to be APScheduler 3 interval jobs, planned by ``datetime.now()``: after the host's
clock stepped back 60 s, nothing ran for 60 s, and a SIGKILLed holder with a 2 s lease was not
revoked within 30 s. Now every job runs on the event loop's monotonic clock.

Real processes: two timesvc replicas, one leasewatch under libfaketime with a run-time clock file,
a holder and a waiter (``tests/leasewatch/actor.py``). The leasewatch host's clock steps by ±60 s,
then the holder is SIGKILLed; the waiter must get the lock within the same bound as without a step
(``tests/leasewatch/test_faults.py``).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.leasewatch.test_faults import BOUND, GRACE, LEASE, SCAN, Cluster, assert_released_ok, latency
from tests.support.procs import Fleet, clock_file_env
from tests.support.waiting import StallProbe, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def stepped(processes: Fleet, sqlite_url: str, tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    timesvc = [processes.timesvc(sqlite_url, name=f"timesvc-{i}") for i in range(2)]
    for t in timesvc:
        t.wait_ready()
    clock = tmp_path / "clock-leasewatch"
    lw = processes.leasewatch(
        sqlite_url, name="leasewatch-a", scan_interval=SCAN, grace=GRACE, env=clock_file_env({}, clock)
    )
    lw.wait_ready()
    with httpx.Client(timeout=5) as http, StallProbe() as stalls:
        yield Cluster(processes, sqlite_url, timesvc, lw, tmp_path, http, stalls), clock


@pytest.mark.parametrize("step", ["-60s", "+60s"])
def test_a_killed_holder_is_revoked_within_its_bound_after_a_wall_clock_step(
    stepped: tuple[Cluster, Path], step: str
) -> None:
    cluster, clock = stepped
    lock_id = f"steps:{step}"
    holder = cluster.actor("holder", lock_id, "--hold-for", "60")
    held = holder.held()
    waiter = cluster.actor("waiter", lock_id, "--mode", "wait", "--hold-for", "0.3", wake_via=cluster.leasewatch)
    cluster.wait_queued(waiter, 1)

    scans = cluster.metric("leasewatch_scans_total", outcome="ok")
    clock.write_text(step + "\n")  # in force within a second (FAKETIME_CACHE_DURATION=1)
    # Wait until the step has taken effect: the Date header of leasewatch's answers comes from
    # its wall clock.

    def stepped_by() -> float:
        date = cluster.http.get(f"{cluster.leasewatch.url}/healthz").headers["date"]
        parsed = email.utils.parsedate_to_datetime(date).timestamp()
        return parsed - time.time()

    wait_until(lambda: abs(stepped_by()) > 50, f"leasewatch's clock to step {step}", timeout=10)
    killed_at = holder.kill()
    acquired = waiter.held(timeout=BOUND + 30)
    took = latency(acquired, killed_at)
    what = f"wall-clock step {step} on leasewatch: kill -> next holder"
    cluster.assert_within_bound(took, killed_at, what, earliest=True)
    assert acquired["token"] > held["token"]
    assert_released_ok(waiter)
    revocations = cluster.revocations()
    assert [(r["lock_id"], r["owner"], r["holder"]) for r in revocations] == [(lock_id, held["owner"], True)]
    assert revocations[0]["unchanged_for_s"] >= LEASE + GRACE
    # Scans went on at their period throughout.
    assert cluster.metric("leasewatch_scans_total", outcome="ok") - scans >= took / SCAN / 3
