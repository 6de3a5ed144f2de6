"""asyncio: 1,000 ``aget_lock`` waiters on one lock in one process (issue 25, item 2).

One event loop, one ``RemoteLocker`` on a fresh embedded store, no timesvc or leasewatch (global
time from the store; waiters wake each other with the library's local wake-ups). A 1 ms ticker
runs on the loop throughout: its lateness (how much later than 1 ms ``await asyncio.sleep(0.001)``
returned) is the loop's lag for other work. Phases, in one run:

1. **baseline** — the ticker alone, 3 s: what this machine adds by itself;
2. **enqueue** — N waiters call ``aget_lock`` at the same moment on a held lock, until all are
   in the queue (the burst: N acquisitions' work on one loop);
3. **waiting** — 5 s while all N wait; also the latency of 20 unrelated ``asyncio.to_thread``
   calls, and the store operations per second the waiters cost;
4. **hand-over** — the holder releases; each waiter takes the lock and releases it at once, in turn;
5. **timeouts, spread** — N waiters on a held lock, two per deadline, deadlines 4 ms apart over
   2 s: each one's lateness (time of ``LockTimeout`` − its deadline);
6. **timeouts, together** — N waiters with the same 3 s timeout.

Threads: the most alive at once during the run, and how many there were before it.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from bench.common import machine_info, markdown_table, percentile, write_results

__all__ = ["run"]

TICK_S = 0.001


@dataclass
class Ticker:
    """The loop's lag: lateness samples of a 1 ms sleep, per phase."""

    samples: list[float] = field(default_factory=list)
    threads_max: int = 0

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            self.samples.append(time.monotonic() - before - TICK_S)
            self.threads_max = max(self.threads_max, threading.active_count())

    @contextmanager
    def phase(self, into: dict[str, Any]) -> Iterator[None]:
        self.samples = []
        started = time.monotonic()
        try:
            yield
        finally:
            into["seconds"] = round(time.monotonic() - started, 3)
            into["lag_ms"] = _summary(self.samples)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50) * 1000, 2),
        "p99": round(percentile(values, 99) * 1000, 2),
        "max": round(max(values) * 1000, 2) if values else float("nan"),
    }


def _store_ops() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "chronolock_client_store_ops":
            total += sum(sample.value for sample in metric.samples if sample.name.endswith("_total"))
    return total


async def _measure(n: int, store_url: str) -> dict[str, Any]:
    from lockclient import LockTimeout, RemoteLocker, open_store

    threads_before = threading.active_count()
    ticker = Ticker()
    tick = asyncio.create_task(ticker.run())
    phases: dict[str, dict[str, Any]] = {}
    locker = RemoteLocker(open_store(store_url), lease=10, owns_store=True)
    try:
        phases["baseline"] = {}
        with ticker.phase(phases["baseline"]):
            await asyncio.sleep(3)

        holder = await locker.aget_lock("one")
        finished: list[str] = []

        async def waiter(i: int) -> None:
            async with await locker.aget_lock("one", timeout=300) as lock:
                finished.append(lock.ticket)

        phases["enqueue"] = {}
        with ticker.phase(phases["enqueue"]):
            tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
            while len(locker.status("one").queue) < n + 1:  # noqa: ASYNC110 - polling the store
                await asyncio.sleep(0.05)

        await asyncio.sleep(3)  # let the first looks and binds settle
        phases["waiting"] = {}
        ops_before = _store_ops()
        with ticker.phase(phases["waiting"]):
            await asyncio.sleep(2.5)
            latencies = []
            for _ in range(20):
                started = time.monotonic()
                await asyncio.to_thread(time.monotonic)
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
        phases["waiting"]["store_ops_per_s"] = round((_store_ops() - ops_before) / phases["waiting"]["seconds"])
        phases["waiting"]["to_thread_ms"] = _summary(latencies)
        assert not finished, "a waiter was granted while the lock was held"

        phases["hand-over"] = {}
        with ticker.phase(phases["hand-over"]):
            await asyncio.to_thread(holder.release)
            await asyncio.gather(*tasks)
        phases["hand-over"]["per_s"] = round(n / phases["hand-over"]["seconds"])
        # Enqueued all at once, so the order to keep is the tickets' (docs/guarantees.md, "Order (FIFO)").
        phases["hand-over"]["in_ticket_order"] = finished == sorted(finished)

        for name, timeout_of in (
            ("timeouts, spread", lambda i: 3.0 + (i // 2) * 0.004),
            ("timeouts, together", lambda i: 3.0),
        ):
            holder = await locker.aget_lock("busy")
            lateness: list[float] = []

            async def expires(i: int, timeout_of: Any = timeout_of, lateness: list[float] = lateness) -> None:
                timeout = timeout_of(i)
                started = time.monotonic()
                try:
                    await locker.aget_lock("busy", timeout=timeout)
                except LockTimeout:
                    lateness.append(time.monotonic() - started - timeout)

            phases[name] = {}
            with ticker.phase(phases[name]):
                await asyncio.gather(*(expires(i) for i in range(n)))
            phases[name]["timed_out"] = len(lateness)
            phases[name]["late_ms"] = _summary(lateness)
            await asyncio.to_thread(holder.release)
            cleaning = time.monotonic()
            while locker.status("busy").queue and time.monotonic() < cleaning + 60:  # noqa: ASYNC110 - the store
                await asyncio.sleep(0.1)
            phases[name]["cleaned_up_s"] = round(time.monotonic() - cleaning, 2)
    finally:
        tick.cancel()
        await asyncio.to_thread(locker.close)
    return {"n": n, "threads_before": threads_before, "threads_max": ticker.threads_max, "phases": phases}


def run(*, quick: bool = False) -> None:
    n = 200 if quick else 1000
    print(f"[bench asyncio] {n} aget_lock waiters on one lock, one event loop, embedded store", flush=True)
    info = machine_info()
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-asyncio-") as tmp:
        result = asyncio.run(_measure(n, f"sqlite:///{Path(tmp) / 'cells.db'}"))
    result["machine"] = info
    phases = result["phases"]
    rows = []
    for name, phase in phases.items():
        lag = phase["lag_ms"]
        rows.append([name, phase["seconds"], lag["p50"], lag["p99"], lag["max"]])
    lag_table = markdown_table(["phase", "s", "loop lag p50 ms", "p99 ms", "max ms"], rows)
    rows = []
    for name in ("timeouts, spread", "timeouts, together"):
        phase = phases[name]
        late = phase["late_ms"]
        rows.append([name, phase["timed_out"], late["p50"], late["p99"], late["max"], phase["cleaned_up_s"]])
    timeout_table = markdown_table(
        ["waiters", "timed out", "late p50 ms", "p99 ms", "max ms", "queue empty (s after the release)"], rows
    )
    waiting, handover = phases["waiting"], phases["hand-over"]
    markdown = "\n\n".join(
        [
            f"# asyncio: {result['n']} aget_lock waiters on one lock in one process",
            f"Machine: {info['cpus']} CPUs, Python {info['python']}, load {info['loadavg_1m_at_start']} at the start "
            f"({info['when_utc']}). Loop lag = lateness of `await asyncio.sleep(0.001)`.",
            lag_table,
            timeout_table,
            (
                f"Threads: {result['threads_before']} before, {result['threads_max']} at most during the run. "
                f"While {result['n']} waited: {waiting['store_ops_per_s']} store operations/s; unrelated "
                f"`asyncio.to_thread` calls took {waiting['to_thread_ms']['p50']} ms (median), "
                f"{waiting['to_thread_ms']['max']} ms at most. Hand-over of all {result['n']}: "
                f"{handover['seconds']} s ({handover['per_s']}/s), in ticket order: {handover['in_ticket_order']}."
            ),
        ]
    )
    write_results("asyncio", result, markdown)
