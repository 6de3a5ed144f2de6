"""lockclient.schedule: the sans-IO periodic schedule in virtual time, and its asyncio driver."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from lockclient.schedule import PeriodicSchedule, run_schedule


def test_jobs_run_every_period_from_their_first_time() -> None:
    s = PeriodicSchedule()
    s.add("tick", 0.5, first_at=10.0)
    s.add("scan", 2.0, first_at=11.0)
    assert s.next_at() == 10.0
    assert s.due(9.99) == []
    starts: dict[str, list[float]] = {"tick": [], "scan": []}
    now = 10.0
    while now < 20.0:
        for name in s.due(now):
            starts[name].append(now)
            s.done(name, now + 0.01)  # a run takes 10 ms
        next_at = s.next_at()
        assert next_at is not None and next_at > now
        now = next_at
    assert starts["tick"] == pytest.approx([10.0 + 0.5 * i for i in range(20)])
    assert starts["scan"] == pytest.approx([11.0 + 2.0 * i for i in range(5)])


def test_a_running_job_is_not_due_again_and_an_overrun_is_followed_by_one_run() -> None:
    s = PeriodicSchedule()
    s.add("scan", 1.0, first_at=0.0)
    assert s.due(0.0) == ["scan"]
    assert s.running("scan")
    assert s.due(5.0) == [] and s.next_at() is None  # still running at 5 s: no second instance
    s.done("scan", 5.5)  # it overran five periods
    assert s.next_at() == 5.5  # one run at once — not five missed ones
    assert s.due(5.5) == ["scan"]
    s.done("scan", 5.6)
    assert s.next_at() == 6.5  # then the period again, counted from that start
    assert s.due(6.49) == []


def test_the_schedule_knows_no_wall_clock() -> None:
    """The caller's clock is the only clock: a run that starts late (the process was paused) is
    followed one period after *its* start, whatever any wall clock did meanwhile."""
    s = PeriodicSchedule()
    s.add("due", 0.05, first_at=100.0)
    assert s.due(160.0) == ["due"]  # 60 s late: runs once
    s.done("due", 160.001)
    assert s.next_at() == pytest.approx(160.05)


def test_bad_jobs_are_refused() -> None:
    s = PeriodicSchedule()
    s.add("a", 1.0, first_at=0.0)
    with pytest.raises(ValueError, match="already"):
        s.add("a", 1.0, first_at=0.0)
    for period in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="period"):
            s.add("b", period, first_at=0.0)
    with pytest.raises(ValueError, match="first_at"):
        s.add("b", 1.0, first_at=float("nan"))
    with pytest.raises(ValueError, match="not running"):
        s.done("a", 1.0)


def test_the_driver_runs_jobs_concurrently_on_the_loop_clock_and_survives_a_failing_job() -> None:
    async def scenario() -> tuple[list[float], list[float], int]:
        loop = asyncio.get_running_loop()
        fast: list[float] = []
        slow: list[float] = []
        failures = 0

        async def due() -> None:
            fast.append(loop.time())

        async def scan() -> None:
            slow.append(loop.time())
            await asyncio.sleep(0.25)  # overruns its 0.1 s period: must not hold up `due`

        async def broken() -> None:
            nonlocal failures
            failures += 1
            raise RuntimeError("boom")

        start = loop.time()
        s = PeriodicSchedule()
        s.add("due", 0.02, first_at=start)
        s.add("scan", 0.1, first_at=start)
        s.add("broken", 0.05, first_at=start)
        driver = asyncio.create_task(run_schedule(s, {"due": due, "scan": scan, "broken": broken}))
        await asyncio.sleep(1.0)
        driver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driver
        return [t - start for t in fast], [t - start for t in slow], failures

    fast, slow, failures = asyncio.run(scenario())
    # Bounds that hold on a loaded machine: runs are never early, and never more than one per
    # period; the slow job's overruns neither pile up nor block the fast one.
    assert all(b - a >= 0.02 - 1e-3 for a, b in itertools.pairwise(fast)), fast
    assert len(fast) >= 10
    assert all(b - a >= 0.25 - 1e-3 for a, b in itertools.pairwise(slow)), slow
    assert 2 <= len(slow) <= 4
    assert failures >= 3  # a failing job keeps its schedule


def test_the_driver_refuses_a_job_without_a_callable() -> None:
    s = PeriodicSchedule()
    s.add("a", 1.0, first_at=0.0)
    with pytest.raises(ValueError, match="no callable"):
        asyncio.run(run_schedule(s, {}))
