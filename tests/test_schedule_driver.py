"""lockclient.schedule's asyncio driver: what it leaves behind (mutation testing, issue 24) — no
error for the event loop to report, and, once a cancelled driver has returned, no job of its
still running."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lockclient.schedule import PeriodicSchedule, run_schedule


def test_the_driver_reports_nothing_to_the_event_loop() -> None:
    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        runs = 0
        five = asyncio.Event()

        async def job() -> None:
            nonlocal runs
            runs += 1
            if runs == 5:
                five.set()

        s = PeriodicSchedule()
        s.add("job", 0.01, first_at=loop.time())
        driver = asyncio.create_task(run_schedule(s, {"job": job}))
        await asyncio.wait_for(five.wait(), 30)  # bounded: a driver that runs nothing fails here
        driver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driver
        await asyncio.sleep(0.01)
        return runs, reported

    runs, reported = asyncio.run(scenario())
    assert runs >= 5
    assert reported == []


def test_a_cancelled_driver_returns_only_after_every_job_it_started_has_ended() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        loop = asyncio.get_running_loop()
        started: list[str] = []
        both = asyncio.Event()
        cancelled: list[str] = []
        ended: list[str] = []

        def job(name: str) -> Any:
            async def run() -> None:
                started.append(name)
                if len(started) == 2:
                    both.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    # The first job cancelled (the first the driver waits for) cleans up quickly, the
                    # next one slowly: a driver that stopped waiting after the first would return
                    # while the second still runs.
                    cancelled.append(name)
                    await asyncio.sleep(0.01 if len(cancelled) == 1 else 0.1)
                    ended.append(name)
                    raise

            return run

        s = PeriodicSchedule()
        s.add("a", 3600.0, first_at=loop.time())
        s.add("b", 3600.0, first_at=loop.time())
        driver = asyncio.create_task(run_schedule(s, {"a": job("a"), "b": job("b")}))
        await asyncio.wait_for(both.wait(), 30)
        driver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driver
        return started, list(ended)

    started, ended = asyncio.run(scenario())
    assert sorted(started) == ["a", "b"]
    assert sorted(ended) == ["a", "b"]


def test_each_job_runs_as_a_task_named_after_its_schedule_and_job() -> None:
    """A task dump (or a log line that names the current task) says which schedule's which job is
    running: ``<schedule>:<job>``."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        names: list[str] = []
        ran = asyncio.Event()

        async def job() -> None:
            task = asyncio.current_task()
            assert task is not None
            names.append(task.get_name())
            ran.set()

        s = PeriodicSchedule()
        s.add("scan", 3600.0, first_at=loop.time())
        driver = asyncio.create_task(run_schedule(s, {"scan": job}, name="leasewatch"))
        await asyncio.wait_for(ran.wait(), 30)
        driver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driver
        return names

    assert asyncio.run(scenario()) == ["leasewatch:scan"]
