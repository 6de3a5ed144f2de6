"""asyncio: 1,000 ``aget_lock`` waiters on one lock in one process (issue 25, item 2).

One event loop, one ``RemoteLocker`` on a fresh embedded store, no timesvc or leasewatch (global
time from the store; waiters wake each other with the library's local wake-ups). A 1 ms ticker
runs on the loop throughout: its lateness (how much later than 1 ms ``await asyncio.sleep(0.001)``
returned) is the loop's lag for other work. Phases, in one run:

1. **baseline** — the ticker alone, 3 s: what this machine adds by itself; then **burst, no
   lock** — N tasks started at once that only await a future: the application's own share of
   the enqueue burst below (asyncio's N first task steps in one loop iteration);
2. **enqueue** — N waiters call ``aget_lock`` at the same moment on a held lock, until all are
   in the queue (the burst: N acquisitions' work on one loop);
3. **waiting** — 5 s while all N wait; also the latency of 20 unrelated ``asyncio.to_thread``
   calls, and the store operations per second the waiters cost;
4. **hand-over** — the holder releases; each waiter takes the lock and releases it at once, in turn;
5. **timeouts, spread** — N waiters on a held lock, two per deadline, deadlines 4 ms apart over
   2 s: each one's lateness (time of ``LockTimeout`` − its deadline);
6. **timeouts, together** — N waiters with the same 3 s timeout.

Threads: the most alive at once during the run, and how many there were before it.

Garbage collection: the loop CPU between ticks includes CPython's cyclic collections, which run
wherever an allocation triggers them and stop the loop for as long as walking every tracked
object takes (a full one: the whole process). Each phase reports its full (generation 2)
collections and the longest — in any thread: one that a store worker's or the keeper's
allocation triggers holds the GIL and stops the loop just the same — and the loop CPU between
ticks less the loop thread's collections' own CPU time: what chronolock's code did in one stretch.

The heap: the objects CPython's collector tracks, counted (``gc.get_objects()``) before the
enqueue and once all N wait — per waiting acquisition, the application's own task and coroutine
included — and one full collection run by hand then (its CPU time: what any full collection costs
while they wait). Both between phases, never inside one. ``--gc-freeze`` measures this tree a second
time with ``gc.freeze()`` called after start-up (imports, the locker and its store made): the
start-up heap is then left out of every later collection (advice for applications, never done by
the library).

Each measurement runs in a child process (``python bench/aio.py --child``, run as a script so
that ``lockclient`` is the interpreter's own). ``--against-python PATH`` measures another
interpreter's installed ``lockclient`` too (an older checkout's ``.venv/bin/python``), alternating
with this tree's in the same invocation, so that both see the same machine. The benchmark's own
look at the queue (``status``) runs on a thread, never on the loop it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["run"]

TICK_S = 0.001


@dataclass
class Ticker:
    """The loop's lag: lateness samples of a 1 ms sleep, per phase."""

    samples: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    """CPU time of the loop's thread between two ticks, less the 1 ms: the longest stretch of work on
    the loop, which the machine's load does not inflate (a descheduled thread, or one waiting for
    the GIL, uses no CPU) — what this code alone would make the loop late by."""
    threads_max: int = 0
    busy_less_gc: list[float] = field(default_factory=list)
    """:attr:`busy` less the CPU time of the garbage collections that ran in the loop's thread meanwhile."""
    full_gc: list[float] = field(default_factory=list)
    """CPU time of each full (generation 2) collection this phase, in any thread (see :meth:`on_gc`)."""
    gc_cpu: float = 0.0
    since: float = -math.inf
    """When the current phase began (``time.monotonic()``): a tick that began before it is left out
    of the phase — its stretch holds the benchmark's own work between phases (counting the heap,
    taking the holder's lock), which made every phase's largest "less GC" figure until 2026-12-07
    (hand-over: 14 ms, of which no loop iteration in the phase took more than 2.5)."""
    ticking: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a tick has begun since :attr:`since`: a phase's work starts inside a counted tick."""
    _gc_started: dict[int, float] = field(default_factory=dict)
    """When the collection under way in each thread began (its thread's CPU time)."""
    loop_thread: int = 0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` hook: the collections' CPU time. Any thread's full collection is
        counted in :attr:`full_gc` — it holds the GIL, so it stops the loop all the same (one of
        24 ms ran in the keeper's thread while 1,000 waited) — but only the loop thread's are taken
        out of :attr:`busy_less_gc`, which is the loop thread's own CPU time."""
        thread = threading.get_ident()
        if phase == "start":
            self._gc_started[thread] = time.thread_time()
            return
        started = self._gc_started.pop(thread, None)
        if started is None:
            return
        took = time.thread_time() - started
        if thread == self.loop_thread:
            self.gc_cpu += took
        if info["generation"] == 2:
            self.full_gc.append(took)

    async def run(self) -> None:
        self.loop_thread = threading.get_ident()
        gc.callbacks.append(self.on_gc)
        try:
            while True:
                before, cpu_before, gc_before = time.monotonic(), time.thread_time(), self.gc_cpu
                if before >= self.since:
                    self.ticking.set()
                await asyncio.sleep(TICK_S)
                if before < self.since:
                    continue
                self.samples.append(time.monotonic() - before - TICK_S)
                busy = time.thread_time() - cpu_before
                self.busy.append(busy)
                self.busy_less_gc.append(busy - (self.gc_cpu - gc_before))
                self.threads_max = max(self.threads_max, threading.active_count())
        finally:
            gc.callbacks.remove(self.on_gc)

    @asynccontextmanager
    async def phase(self, into: dict[str, Any]) -> AsyncIterator[None]:
        self.samples = []
        self.busy = []
        self.busy_less_gc = []
        self.full_gc = []
        self.ticking.clear()
        self.since = time.monotonic()
        await self.ticking.wait()
        started = time.monotonic()
        try:
            yield
        finally:
            into["seconds"] = round(time.monotonic() - started, 3)
            into["lag_ms"] = _summary(self.samples)
            into["loop_cpu_ms"] = _summary(self.busy)
            into["loop_cpu_less_gc_ms"] = _summary(self.busy_less_gc)
            into["full_gc"] = {"n": len(self.full_gc), "max_ms": round(max(self.full_gc, default=0.0) * 1000, 2)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as bench.common's (this file also runs as a script, without the package)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(max(1, math.ceil(q / 100 * len(ordered))), len(ordered)) - 1]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50) * 1000, 2),
        "p99": round(percentile(values, 99) * 1000, 2),
        "max": round(max(values) * 1000, 2) if values else float("nan"),
    }


def _store_ops() -> float:
    from prometheus_client import REGISTRY

    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "chronolock_client_store_ops":
            total += sum(sample.value for sample in metric.samples if sample.name.endswith("_total"))
    return total


async def _measure(n: int, store_url: str, gc_freeze: bool = False) -> dict[str, Any]:
    from lockclient import LockTimeout, RemoteLocker, open_store

    threads_before = threading.active_count()
    ticker = Ticker()
    tick = asyncio.create_task(ticker.run())
    phases: dict[str, dict[str, Any]] = {}
    heap: dict[str, Any] = {}
    locker = RemoteLocker(open_store(store_url), lease=10, owns_store=True)
    if gc_freeze:
        # After start-up: the modules, the locker, its store — what an application has made by the
        # time it serves. (gc.collect() first, as the documentation of gc.freeze() advises.)
        gc.collect()
        gc.freeze()
    heap["frozen"] = gc.get_freeze_count()
    try:
        phases["baseline"] = {}
        async with ticker.phase(phases["baseline"]):
            await asyncio.sleep(3)

        # The application's own share of a burst: N tasks started at once that only await a future
        # (asyncio's task steps and the benchmark's coroutines; no lock at all).
        phases["burst, no lock"] = {}
        async with ticker.phase(phases["burst, no lock"]):
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def idle() -> None:
                await gate

            idlers = [asyncio.create_task(idle()) for _ in range(n)]
            await asyncio.sleep(0.2)
            gate.set_result(None)
            await asyncio.gather(*idlers)

        holder = await locker.aget_lock("one")
        finished: list[str] = []

        async def waiter(i: int) -> None:
            async with await locker.aget_lock("one", timeout=300) as lock:
                finished.append(lock.ticket)

        tracked_before = len(gc.get_objects())
        phases["enqueue"] = {}
        async with ticker.phase(phases["enqueue"]):
            tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
            # On a thread: a store call on the loop would be the benchmark's own stall.
            while len((await asyncio.to_thread(locker.status, "one")).queue) < n + 1:  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.sleep(3)  # let the first looks and binds settle
        phases["waiting"] = {}
        ops_before = _store_ops()
        async with ticker.phase(phases["waiting"]):
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
        # Between phases: the heap while all N wait, and what one full collection of it costs.
        tracked = len(gc.get_objects())
        heap["tracked"] = tracked
        heap["per_waiter"] = round((tracked - tracked_before) / n, 1)
        heap["full_gc_ms"] = round(_full_collection_cpu() * 1000, 1)

        phases["hand-over"] = {}
        async with ticker.phase(phases["hand-over"]):
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
            async with ticker.phase(phases[name]):
                await asyncio.gather(*(expires(i) for i in range(n)))
            phases[name]["timed_out"] = len(lateness)
            phases[name]["late_ms"] = _summary(lateness)
            await asyncio.to_thread(holder.release)
            cleaning = time.monotonic()
            while (await asyncio.to_thread(locker.status, "busy")).queue and time.monotonic() < cleaning + 60:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            phases[name]["cleaned_up_s"] = round(time.monotonic() - cleaning, 2)
    finally:
        tick.cancel()
        await asyncio.to_thread(locker.close)
    return {
        "n": n,
        "threads_before": threads_before,
        "threads_max": ticker.threads_max,
        "phases": phases,
        "heap": heap,
    }


def _full_collection_cpu() -> float:
    """The CPU time of one full collection in this thread. ``gc.collect()`` returns at once, having
    collected nothing, while another thread is collecting (a store worker's allocation triggered
    one): then it is tried again, up to 20 times, and NaN if it never ran here."""
    ran: list[float] = []
    me = threading.get_ident()

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() == me and phase == "stop" and info["generation"] == 2:
            ran.append(time.thread_time())

    gc.callbacks.append(on_gc)
    try:
        for _ in range(20):
            cpu = time.thread_time()
            gc.collect()
            if ran:
                return ran[0] - cpu
            time.sleep(0.001)
    finally:
        gc.callbacks.remove(on_gc)
    return math.nan


def _child(n: int, out: Path, gc_freeze: bool) -> None:
    """One measurement, in this process, with whatever ``lockclient`` this interpreter has."""
    import lockclient

    with tempfile.TemporaryDirectory(prefix="chronolock-bench-asyncio-") as tmp:
        load_before = os.getloadavg()[0]
        result = asyncio.run(_measure(n, f"sqlite:///{Path(tmp) / 'cells.db'}", gc_freeze))
        result["load_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["lockclient"] = str(Path(lockclient.__file__).parent)
    out.write_text(json.dumps(result))


def _code_label(python: str) -> str:
    """Which code ``python`` runs: the git commit of the checkout its lockclient comes from."""
    where = subprocess.run(
        [python, "-c", "import lockclient, os; print(os.path.dirname(os.path.dirname(lockclient.__file__)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    ).stdout.strip()
    head = subprocess.run(
        ["git", "-C", where, "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", where, "status", "--porcelain", "--", "lockclient"], check=False, capture_output=True, text=True
    )
    label = head.stdout.strip() or where
    return f"{label}+changes" if dirty.stdout.strip() else label


def _measure_with(python: str, n: int, gc_freeze: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-asyncio-run-") as tmp:
        out = Path(tmp) / "result.json"
        # Run as a script from a neutral directory: `lockclient` is then the interpreter's own.
        command = [python, str(Path(__file__).resolve()), "--child", str(n), str(out)]
        subprocess.run([*command, "--gc-freeze"] if gc_freeze else command, check=True, cwd=tmp)
        return dict(json.loads(out.read_text()))


def run(*, quick: bool = False, against_python: str | None = None, rounds: int = 1, gc_freeze: bool = False) -> None:
    from bench.common import machine_info, markdown_table, write_results

    n = 200 if quick else 1000
    this = f"this tree ({_code_label(sys.executable)})"
    variants = [(sys.executable, this, False)]
    if gc_freeze:
        variants.append((sys.executable, f"{this}, gc.freeze() after start-up", True))
    if against_python:
        variants.append((against_python, f"{_code_label(against_python)} ({against_python})", False))
    labels = [label for _, label, _ in variants]
    print(f"[bench asyncio] {n} aget_lock waiters on one lock, one event loop, embedded store: {labels}", flush=True)
    info = machine_info()
    runs: list[dict[str, Any]] = []
    for round_no in range(rounds):
        for python, label, freeze in variants:
            print(f"[bench asyncio] round {round_no + 1}: {label}", flush=True)
            result = _measure_with(python, n, freeze)
            result["code"] = label
            result["round"] = round_no + 1
            runs.append(result)

    lag_rows = []
    timeout_rows = []
    notes = []
    phase_names = list(runs[0]["phases"])
    for name in phase_names:
        for result in runs:
            phase = result["phases"][name]
            lag = phase["lag_ms"]
            tag = f"{result['code']}, round {result['round']}" if rounds > 1 else result["code"]
            cpu = phase["loop_cpu_ms"]
            own = phase.get("loop_cpu_less_gc_ms", {"p99": math.nan, "max": math.nan})
            full = phase.get("full_gc", {"n": math.nan, "max_ms": math.nan})
            lag_rows.append(
                [
                    name,
                    tag,
                    phase["seconds"],
                    lag["p50"],
                    lag["p99"],
                    lag["max"],
                    cpu["p99"],
                    cpu["max"],
                    own["p99"],
                    own["max"],
                    full["n"],
                    full["max_ms"],
                ]
            )
    for name in ("timeouts, spread", "timeouts, together"):
        for result in runs:
            phase = result["phases"][name]
            late = phase["late_ms"]
            tag = f"{result['code']}, round {result['round']}" if rounds > 1 else result["code"]
            timeout_rows.append(
                [name, tag, phase["timed_out"], late["p50"], late["p99"], late["max"], phase["cleaned_up_s"]]
            )
    heap_rows = []
    for result in runs:
        tag = f"{result['code']}, round {result['round']}" if rounds > 1 else result["code"]
        heap = result.get("heap", {})
        heap_rows.append([tag, *(heap.get(key, math.nan) for key in ("frozen", "tracked", "per_waiter", "full_gc_ms"))])
    for result in runs:
        waiting, handover = result["phases"]["waiting"], result["phases"]["hand-over"]
        tag = f"{result['code']}, round {result['round']}" if rounds > 1 else result["code"]
        notes.append(
            f"- {tag}: load {result['load_1m'][0]} → {result['load_1m'][1]}; threads {result['threads_before']} "
            f"before, {result['threads_max']} at most; while {result['n']} waited: {waiting['store_ops_per_s']} "
            f"store operations/s, unrelated `asyncio.to_thread` calls {waiting['to_thread_ms']['p50']} ms "
            f"(median), {waiting['to_thread_ms']['max']} ms at most; hand-over of all {result['n']}: "
            f"{handover['seconds']} s ({handover['per_s']}/s), in ticket order: {handover['in_ticket_order']}."
        )
    markdown = "\n\n".join(
        [
            f"# asyncio: {n} aget_lock waiters on one lock in one process",
            f"Machine: {info['cpus']} CPUs, Python {info['python']}, load {info['loadavg_1m_at_start']} at the start "
            f"({info['when_utc']}). Loop lag = lateness of `await asyncio.sleep(0.001)`; loop CPU between "
            "ticks = CPU time the loop's thread used from one tick to the next (the longest stretch of work "
            "on the loop, which the machine's load does not inflate: the lag this code would cause by "
            "itself); less GC = the same less the CPU time of CPython's garbage collections in those "
            "ticks (chronolock's own stretches); full GCs = generation-2 collections in the phase, in any "
            "thread (one in a store worker's or the keeper's thread stops the loop too), and the longest "
            "(CPU ms). "
            + (
                "The code versions ran alternately in one invocation, each in a process of its own."
                if len(variants) > 1
                else ""
            ),
            markdown_table(
                [
                    "phase",
                    "code",
                    "s",
                    "loop lag p50 ms",
                    "p99 ms",
                    "max ms",
                    "loop CPU between ticks p99 ms",
                    "max ms",
                    "less GC p99 ms",
                    "max ms",
                    "full GCs",
                    "longest ms",
                ],
                lag_rows,
            ),
            markdown_table(
                [
                    "waiters",
                    "code",
                    "timed out",
                    "late p50 ms",
                    "p99 ms",
                    "max ms",
                    "queue empty (s after the release)",
                ],
                timeout_rows,
            ),
            markdown_table(
                [
                    f"heap while {n} wait",
                    "frozen (gc.freeze)",
                    "tracked objects",
                    "per waiting acquisition",
                    "one full collection, CPU ms",
                ],
                heap_rows,
            ),
            "\n".join(notes),
        ]
    )
    write_results("asyncio", {"machine": info, "runs": runs}, markdown)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one asyncio measurement (run by bench asyncio)")
    parser.add_argument("--child", nargs=2, metavar=("N", "OUT"), required=True)
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after start-up")
    args = parser.parse_args()
    _child(int(args.child[0]), Path(args.child[1]), args.gc_freeze)
