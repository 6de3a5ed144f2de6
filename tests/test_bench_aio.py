"""bench/aio.py's ticker: what a phase counts as the loop's stretches (CPU time, not wall time)."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from bench.aio import Ticker

STRETCH_S = 0.03


def _spin(seconds: float) -> None:
    """Hold the loop's thread for ``seconds`` of its own CPU time (the machine's load cannot shorten
    or lengthen that: a descheduled thread uses none)."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_phase_counts_its_own_burst_and_not_the_work_done_before_it() -> None:
    """The benchmark's own work between phases (counting the heap, taking the holder's lock) falls
    in the tick that is under way when a phase begins; that tick is not the phase's. Until
    2026-12-07 it was, and made every phase's largest "less GC" figure (14 ms in a hand-over whose
    loop iterations took 2.5 ms at most). Work the phase itself starts at once (a burst of tasks)
    is counted."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        ticker = Ticker()
        tick = asyncio.create_task(ticker.run())
        await asyncio.sleep(0.01)
        quiet: dict[str, Any] = {}
        _spin(STRETCH_S)  # before the phase, inside the tick under way
        async with ticker.phase(quiet):
            await asyncio.sleep(0.05)
        busy: dict[str, Any] = {}
        async with ticker.phase(busy):
            _spin(STRETCH_S)  # the phase's own burst
            await asyncio.sleep(0.05)
        tick.cancel()
        return quiet, busy

    quiet, busy = asyncio.run(scenario())
    assert quiet["loop_cpu_ms"]["max"] < STRETCH_S * 1000 / 2, quiet
    assert busy["loop_cpu_ms"]["max"] >= STRETCH_S * 1000, busy
    assert busy["loop_cpu_less_gc_ms"]["max"] >= STRETCH_S * 1000 - 1, busy


def test_a_full_collection_in_another_thread_is_counted_but_not_taken_from_the_loops_cpu() -> None:
    """A full collection that a store worker's allocation triggers stops the loop too (it holds the
    GIL): the phase counts it. The loop thread's own CPU ("less GC") is left as it was."""

    async def scenario() -> dict[str, Any]:
        ticker = Ticker()
        tick = asyncio.create_task(ticker.run())
        await asyncio.sleep(0.01)
        phase: dict[str, Any] = {}
        async with ticker.phase(phase):
            await asyncio.to_thread(gc.collect)
            await asyncio.sleep(0.02)
        tick.cancel()
        return phase

    phase = asyncio.run(scenario())
    assert phase["full_gc"]["n"] >= 1, phase
