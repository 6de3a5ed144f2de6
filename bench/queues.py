"""Long queues and throughput over independent ids (issue 15), on the embedded store.

Two experiments, each measured side by side in one run (one store, one timesvc, one
leasewatch for the whole run; points in ABBA order so a drifting background load hits
every point alike):

**Long queues**: Q waiters on ONE lock id (Q = 5, 20, 50, 100), spread over 5 processes
(Q/5 threads each, sharing that process's ``RemoteLocker``; global time from
``TimeServiceClock``, wake-ups through ``LeasewatchWaker`` plus the library's local ones).
Each waiter loops for a fixed window: take the lock, hold it 10 ms, release it. Per Q:
acquisitions/s, store operations and round trips per acquisition (``RemoteLock``'s own
counts), the waiters' looks at the store per acquisition (``read_versioned_hint``: one per
wake-up or poll), leasewatch long-poll answers and leasewatch's own store polls
(``leasewatch_wait_polls``) per acquisition, timeouts (must be 0), the longest run of
consecutive grants to one process and to one waiter, and the client CPU per acquisition.

**Throughput over independent ids**: P = 1, 2, 4, 8 processes, each with its own
``RemoteLocker`` and ``TimeServiceClock``, taking and releasing its own 8 lock ids in turn
(no contention, no hold) for a fixed window. Per P: acquisitions/s in total, client CPU
per acquisition (``resource.getrusage`` in each worker over the window), timesvc CPU
(``/proc/<pid>/stat``) per acquisition, and the machine's busy cores.

Workers are ``multiprocessing`` (spawn) processes started together on a barrier that the
parent also waits on, so the parent samples leasewatch and timesvc exactly when the window
opens. Every point is bounded by its window plus a drain (waiters still queued when the
window closes are cancelled, not timed out); a worker over its bound is SIGKILLed by its
PID, and timesvc and leasewatch are stopped by their PIDs at the end.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import resource
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    Fleet,
    ServiceProcess,
    cpu_seconds,
    machine_info,
    markdown_table,
    system_busy_seconds,
    write_results,
)

QS = (5, 20, 50, 100)
QUEUE_PROCESSES = 5
HOLD_S = 0.010
LEASE_S = 10.0
ATTEMPT_TIMEOUT_S = 60.0
"""Per acquisition. At the issue's worst (Q = 100 at 3.5 acq/s) a waiter waits ~29 s."""
PS = (1, 2, 4, 8)
IDS_PER_PROCESS = 8
RATIO_TARGET = 0.8
THROUGHPUT_TARGET = 1500.0
DRAIN_S = 60.0
"""After the window: cancelled waiters leave, the holder releases; a worker still alive after
window + drain + start-up is killed."""
STARTUP_S = 120.0


# -- pure helpers (tests/test_bench_queues.py) ---------------------------------------------------


def longest_run(owners: Sequence[object]) -> int:
    """The most consecutive equal items (grants to one process or waiter, in grant order)."""
    best = run = 0
    previous: object = object()
    for owner in owners:
        run = run + 1 if owner == previous else 1
        previous = owner
        best = max(best, run)
    return best


def in_window(records: Sequence[dict[str, Any]], start: float, window: float) -> list[dict[str, Any]]:
    """Grants whose acquisition completed inside [start, start + window), in grant (token) order."""
    chosen = [r for r in records if start <= r["acquired"] < start + window]
    return sorted(chosen, key=lambda r: r["token"])


def per(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def prometheus_value(text: str, name: str) -> float:
    """A label-less sample of a Prometheus text exposition (0 if absent); ``_total`` tolerated."""
    match = re.search(rf"^{re.escape(name)}(?:_total)? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


# -- workers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueSpec:
    index: int
    store_url: str
    timesvc_url: str
    leasewatch_url: str
    lock_id: str
    threads: int
    hold_s: float
    window_s: float
    out_path: str


def _queue_worker(spec: QueueSpec, barrier: Any) -> None:
    """One process with ``threads`` waiters on one lock id, sharing one RemoteLocker."""
    from lockclient import LockCancelled, LockTimeout, RemoteLocker, TimeServiceClock, open_store
    from lockclient.wake import LeasewatchWaker

    store = open_store(spec.store_url)
    clock = TimeServiceClock([spec.timesvc_url])
    waker = LeasewatchWaker(spec.leasewatch_url)
    locker = RemoteLocker(store, clock, lease=LEASE_S, waker=waker)
    records: list[dict[str, Any]] = []
    ops: Counter[str] = Counter()
    timeouts = 0
    errors: list[str] = []
    guard = threading.Lock()
    cancel = threading.Event()
    start = cpu_before = cpu_after = 0.0

    def waiter(thread: int, stop_at: float) -> None:
        nonlocal timeouts
        while time.monotonic() < stop_at and not cancel.is_set():
            requested = time.monotonic()
            try:
                lock = locker.get_lock(spec.lock_id, timeout=ATTEMPT_TIMEOUT_S, cancel=cancel)
            except LockTimeout:
                with guard:
                    timeouts += 1
                continue
            except LockCancelled:
                return
            except Exception as exc:  # report, keep the others going
                with guard:
                    errors.append(f"{type(exc).__name__}: {exc}")
                return
            acquired = time.monotonic()
            time.sleep(spec.hold_s)
            clean = lock.release()
            record = {
                "process": spec.index,
                "waiter": f"{spec.index}.{thread}",
                "requested": requested,
                "acquired": acquired,
                "token": lock.fencing_token,
                "ops": lock.store_ops,
                "round_trips": lock.round_trips,
                "release_ops": lock.release_counts.total,
                "looks": lock.store_op_counts.get("read_versioned_hint", 0),
                "clean": clean,
            }
            with guard:
                records.append(record)
                ops.update(lock.store_op_counts)

    try:
        clock.now_us()  # open the HTTP connection before the window
        barrier.wait(timeout=STARTUP_S)
        start = time.monotonic()
        cpu_before = _own_cpu()
        stop_at = start + spec.window_s
        threads = [
            threading.Thread(target=waiter, args=(i, stop_at), name=f"waiter-{i}", daemon=True)
            for i in range(spec.threads)
        ]
        for t in threads:
            t.start()
        time.sleep(max(0.0, stop_at - time.monotonic()))
        cpu_after = _own_cpu()
        cancel.set()  # waiters still queued leave: the window is over, not their patience
        for t in threads:
            t.join(timeout=DRAIN_S)
        if any(t.is_alive() for t in threads):
            errors.append("a waiter did not finish within the drain")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        with guard:
            result = {
                "index": spec.index,
                "pid": os.getpid(),
                "start": start,
                "cpu_s": cpu_after - cpu_before,
                "records": list(records),
                "ops": dict(ops),
                "timeouts": timeouts,
                "longpoll_answers": waker.wakeups,
                "longpoll_fallbacks": waker.fallbacks,
                "notifications": waker.notifications,
                "notices_skipped": waker.notices_skipped,
                "errors": errors,
            }
        Path(spec.out_path).write_text(json.dumps(result))
        locker.close()
        waker.close()
        clock.close()
        store.close()


@dataclass(frozen=True)
class ThroughputSpec:
    index: int
    store_url: str
    timesvc_url: str
    prefix: str
    window_s: float
    out_path: str


def _throughput_worker(spec: ThroughputSpec, barrier: Any) -> None:
    """Take and release this process's own lock ids in turn until the window closes."""
    from lockclient import RemoteLocker, TimeServiceClock, open_store

    store = open_store(spec.store_url)
    clock = TimeServiceClock([spec.timesvc_url])
    locker = RemoteLocker(store, clock, lease=LEASE_S)
    ids = [f"{spec.prefix}{i}" for i in range(IDS_PER_PROCESS)]
    done = ops = round_trips = release_ops = 0
    errors: list[str] = []
    start = cpu = 0.0
    try:
        clock.now_us()
        for lock_id in ids:  # warm: every id exists, the connection is open
            locker.get_lock(lock_id, timeout=30).release()
        barrier.wait(timeout=STARTUP_S)
        start = time.monotonic()
        cpu_before = _own_cpu()
        stop_at = start + spec.window_s
        while time.monotonic() < stop_at:
            lock = locker.get_lock(ids[done % IDS_PER_PROCESS], timeout=30)
            lock.release()
            done += 1
            ops += lock.store_ops
            round_trips += lock.round_trips
            release_ops += lock.release_counts.total
        cpu = _own_cpu() - cpu_before
        elapsed = time.monotonic() - start
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - start if start else 0.0
    finally:
        Path(spec.out_path).write_text(
            json.dumps(
                {
                    "index": spec.index,
                    "pid": os.getpid(),
                    "acquisitions": done,
                    "elapsed_s": elapsed,
                    "cpu_s": cpu,
                    "ops": ops,
                    "round_trips": round_trips,
                    "release_ops": release_ops,
                    "errors": errors,
                }
            )
        )
        locker.close()
        clock.close()
        store.close()


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run_processes(
    target: Any, specs: Sequence[Any], bound_s: float, on_start: Callable[[], None] | None = None
) -> tuple[float, float]:
    """Start one spawn process per spec and a barrier the parent joins (then ``on_start``);
    return (window start, busy cores of the machine from the window's start until every
    worker exited). Processes over ``bound_s`` after the start are SIGKILLed by their PID."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(specs) + 1)
    procs = [ctx.Process(target=target, args=(spec, barrier), name=f"bench-queues-{i}") for i, spec in enumerate(specs)]
    start = math.nan
    busy_before = system_busy_seconds()
    t0 = time.monotonic()
    try:
        for proc in procs:
            proc.start()
        barrier.wait(timeout=STARTUP_S)
        start = time.monotonic()
        busy_before, t0 = system_busy_seconds(), start
        if on_start is not None:
            on_start()
        end_by = start + bound_s
        for proc in procs:
            proc.join(timeout=max(0.0, end_by - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                print(f"[bench]   killing worker pid {proc.pid} (over its time bound)", flush=True)
                proc.kill()  # SIGKILL to this PID
                proc.join(timeout=10)
    busy = (system_busy_seconds() - busy_before) / max(time.monotonic() - t0, 1e-9)
    return start, busy


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


# -- long queues ----------------------------------------------------------------------------------


@dataclass
class QueuePoint:
    q: int
    round: int
    window_s: float
    loadavg: list[float] = field(default_factory=list)
    busy_cores: float = 0.0
    acquisitions: int = 0
    acq_per_s: float = 0.0
    ops_per_acq: float = 0.0
    ops_per_acq_max: int = 0
    release_ops_per_acq: float = 0.0
    round_trips_per_acq: float = 0.0
    looks_per_acq: float = 0.0
    longpoll_answers_per_acq: float = 0.0
    leasewatch_polls_per_acq: float = 0.0
    leasewatch_polls_per_s: float = 0.0
    leasewatch_waiters_max: float = 0.0
    timeouts: int = 0
    longest_process_run: int = 0
    longest_waiter_run: int = 0
    waiters_served: int = 0
    wait_ms_p50: float = 0.0
    wait_ms_max: float = 0.0
    client_cpu_ms_per_acq: float = 0.0
    unclean_releases: int = 0
    op_mix: dict[str, float] = field(default_factory=dict)
    """Store operations per acquisition by kind, over every grant of the point."""
    errors: list[str] = field(default_factory=list)


def _queue_point(
    workdir: Path, store_url: str, timesvc: ServiceProcess, leasewatch: ServiceProcess, q: int, rnd: int, window: float
) -> QueuePoint:
    point = QueuePoint(q=q, round=rnd, window_s=window)
    lock_id = f"queue-q{q}-r{rnd}-{uuid.uuid4().hex[:6]}"
    per_process = [q // QUEUE_PROCESSES + (1 if i < q % QUEUE_PROCESSES else 0) for i in range(QUEUE_PROCESSES)]
    specs = [
        QueueSpec(
            index=i,
            store_url=store_url,
            timesvc_url=timesvc.url,
            leasewatch_url=leasewatch.url,
            lock_id=lock_id,
            threads=n,
            hold_s=HOLD_S,
            window_s=window,
            out_path=str(workdir / f"{lock_id}-{i}.json"),
        )
        for i, n in enumerate(per_process)
        if n > 0
    ]
    print(f"[bench] queues: Q = {q} ({len(specs)} processes), round {rnd}, {window:g} s", flush=True)
    # leasewatch's store polls for waiters, counted over the window exactly: sampled when the
    # window opens (the parent passed the barrier) and when it closes.
    polls: dict[str, float] = {}
    waiters_max = 0.0
    opened = threading.Event()
    finished = threading.Event()

    def sample() -> None:
        nonlocal waiters_max
        if not opened.wait(STARTUP_S + 30):
            return
        closes_at = polls["opened_at"] + window
        while not finished.is_set():
            now = time.monotonic()
            try:
                text = leasewatch.metrics()
            except OSError:
                text = ""
            if now >= closes_at:
                polls["closed"] = prometheus_value(text, "leasewatch_wait_polls")
                return
            waiters_max = max(waiters_max, prometheus_value(text, "leasewatch_waiters"))
            finished.wait(min(0.5, max(0.0, closes_at - time.monotonic())))

    def on_start() -> None:
        polls["opened_at"] = time.monotonic()
        polls["opened"] = prometheus_value(leasewatch.metrics(), "leasewatch_wait_polls")
        opened.set()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        start, point.busy_cores = _run_processes(_queue_worker, specs, window + DRAIN_S + 30, on_start=on_start)
    finally:
        finished.set()
        opened.set()
        sampler.join(timeout=10)
    in_window_polls = polls.get("closed", math.nan) - polls.get("opened", math.nan)
    point.loadavg = [round(x, 2) for x in os.getloadavg()]
    point.busy_cores = round(point.busy_cores, 2)
    point.leasewatch_waiters_max = waiters_max

    results = [_read(Path(s.out_path)) for s in specs]
    records: list[dict[str, Any]] = []
    ops: Counter[str] = Counter()
    cpu = 0.0
    longpoll = 0
    for spec, r in zip(specs, results, strict=True):
        if r is None:
            point.errors.append(f"process {spec.index}: no result")
            continue
        records += r["records"]
        ops.update(r["ops"])
        cpu += r["cpu_s"]
        longpoll += r["longpoll_answers"]
        point.timeouts += r["timeouts"]
        point.errors += [f"process {spec.index}: {e}" for e in r["errors"]]
    chosen = in_window(records, start, window)
    n = len(chosen)
    point.acquisitions = n
    point.acq_per_s = round(n / window, 1)
    if n:  # costs of the grants inside the window (the drain's grants and cancellations aside)
        point.ops_per_acq = round(sum(r["ops"] for r in chosen) / n, 1)
        point.ops_per_acq_max = max(r["ops"] for r in chosen)
        point.release_ops_per_acq = round(sum(r["release_ops"] for r in chosen) / n, 1)
        point.round_trips_per_acq = round(sum(r["round_trips"] for r in chosen) / n, 1)
        point.looks_per_acq = round(sum(r["looks"] for r in chosen) / n, 1)
        point.leasewatch_polls_per_acq = round(in_window_polls / n, 1)
        point.unclean_releases = sum(1 for r in records if not r["clean"])
    # Long-poll answers are counted per process over the whole point (window and drain).
    point.longpoll_answers_per_acq = round(per(longpoll, len(records)), 2)
    point.leasewatch_polls_per_s = round(in_window_polls / window, 0)
    point.op_mix = {k: round(v / len(records), 2) for k, v in sorted(ops.items())} if records else {}
    point.client_cpu_ms_per_acq = round(1000 * per(cpu, n), 2)
    point.longest_process_run = longest_run([r["process"] for r in chosen])
    point.longest_waiter_run = longest_run([r["waiter"] for r in chosen])
    point.waiters_served = len({r["waiter"] for r in chosen})
    waits = sorted(1000 * (r["acquired"] - r["requested"]) for r in chosen)
    if waits:
        point.wait_ms_p50 = round(waits[len(waits) // 2], 1)
        point.wait_ms_max = round(waits[-1], 1)
    print(f"[bench]   {json.dumps(asdict(point))}", flush=True)
    return point


# -- throughput -----------------------------------------------------------------------------------


@dataclass
class ThroughputPoint:
    p: int
    round: int
    window_s: float
    loadavg: list[float] = field(default_factory=list)
    busy_cores: float = 0.0
    acquisitions: int = 0
    acq_per_s: float = 0.0
    client_cpu_ms_per_acq: float = 0.0
    client_cpu_cores: float = 0.0
    timesvc_cpu_ms_per_acq: float = 0.0
    timesvc_cpu_cores: float = 0.0
    ops_per_acq: float = 0.0
    release_ops_per_acq: float = 0.0
    round_trips_per_acq: float = 0.0
    errors: list[str] = field(default_factory=list)


def _throughput_point(
    workdir: Path, store_url: str, timesvc: ServiceProcess, p: int, rnd: int, window: float
) -> ThroughputPoint:
    point = ThroughputPoint(p=p, round=rnd, window_s=window)
    tag = uuid.uuid4().hex[:6]
    specs = [
        ThroughputSpec(
            index=i,
            store_url=store_url,
            timesvc_url=timesvc.url,
            prefix=f"tp-{tag}-p{p}-{i}-",
            window_s=window,
            out_path=str(workdir / f"tp-{tag}-{i}.json"),
        )
        for i in range(p)
    ]
    print(f"[bench] throughput: P = {p}, round {rnd}, {window:g} s", flush=True)
    # timesvc's CPU over the window: sampled when the parent passes the barrier and when the
    # last worker has exited (the workers' windows end within milliseconds of each other).
    cpu_before = [0.0]

    def opened() -> None:
        cpu_before[0] = cpu_seconds(timesvc.pid) or 0.0

    _, point.busy_cores = _run_processes(_throughput_worker, specs, window + 60, on_start=opened)
    timesvc_cpu = (cpu_seconds(timesvc.pid) or 0.0) - cpu_before[0]
    point.loadavg = [round(x, 2) for x in os.getloadavg()]
    point.busy_cores = round(point.busy_cores, 2)
    results = [_read(Path(s.out_path)) for s in specs]
    total = ops = trips = release_ops = 0
    cpu = 0.0
    elapsed = []
    for spec, r in zip(specs, results, strict=True):
        if r is None:
            point.errors.append(f"process {spec.index}: no result")
            continue
        total += r["acquisitions"]
        ops += r["ops"]
        trips += r["round_trips"]
        release_ops += r["release_ops"]
        cpu += r["cpu_s"]
        elapsed.append(r["elapsed_s"])
        point.errors += [f"process {spec.index}: {e}" for e in r["errors"]]
    span = max(elapsed) if elapsed else window
    point.acquisitions = total
    point.acq_per_s = round(per(total, span), 0)
    point.client_cpu_ms_per_acq = round(1000 * per(cpu, total), 2)
    point.client_cpu_cores = round(cpu / span, 2)
    # The timesvc sample includes the workers' close (after their window), not their warm-up.
    point.timesvc_cpu_ms_per_acq = round(1000 * per(timesvc_cpu, total), 2)
    point.timesvc_cpu_cores = round(timesvc_cpu / span, 2)
    point.ops_per_acq = round(per(ops, total), 1)
    point.release_ops_per_acq = round(per(release_ops, total), 1)
    point.round_trips_per_acq = round(per(trips, total), 1)
    print(f"[bench]   {json.dumps(asdict(point))}", flush=True)
    return point


# -- the run --------------------------------------------------------------------------------------


def summarise_queues(points: Sequence[QueuePoint]) -> list[dict[str, Any]]:
    """Per Q, over its rounds: acquisitions per second of window time, and the costs weighted by
    acquisitions (the rounds' own acq/s kept to show the spread)."""
    out = []
    for q in sorted({p.q for p in points}):
        ours = [p for p in points if p.q == q]
        n = sum(p.acquisitions for p in ours)

        def weighted(key: str, ours: list[QueuePoint] = ours, n: int = n) -> float:
            return round(per(sum(getattr(p, key) * p.acquisitions for p in ours), n), 2)

        out.append(
            {
                "q": q,
                "rounds": [p.acq_per_s for p in ours],
                "acquisitions": n,
                "acq_per_s": round(per(n, sum(p.window_s for p in ours)), 1),
                "ops_per_acq": weighted("ops_per_acq"),
                "ops_per_acq_max": max(p.ops_per_acq_max for p in ours),
                "release_ops_per_acq": weighted("release_ops_per_acq"),
                "round_trips_per_acq": weighted("round_trips_per_acq"),
                "looks_per_acq": weighted("looks_per_acq"),
                "longpoll_answers_per_acq": weighted("longpoll_answers_per_acq"),
                "leasewatch_polls_per_acq": weighted("leasewatch_polls_per_acq"),
                "leasewatch_polls_per_s": round(sum(p.leasewatch_polls_per_s for p in ours) / len(ours), 0),
                "leasewatch_waiters_max": max(p.leasewatch_waiters_max for p in ours),
                "timeouts": sum(p.timeouts for p in ours),
                "longest_process_run": max(p.longest_process_run for p in ours),
                "longest_waiter_run": max(p.longest_waiter_run for p in ours),
                "waiters_served": min(p.waiters_served for p in ours),
                "wait_ms_p50": round(sum(p.wait_ms_p50 for p in ours) / len(ours), 1),
                "wait_ms_max": max(p.wait_ms_max for p in ours),
                "client_cpu_ms_per_acq": weighted("client_cpu_ms_per_acq"),
                "busy_cores": round(sum(p.busy_cores for p in ours) / len(ours), 2),
                "loadavg_1m": [p.loadavg[0] for p in ours if p.loadavg],
                "errors": sorted({e for p in ours for e in p.errors}),
            }
        )
    return out


def summarise_throughput(points: Sequence[ThroughputPoint]) -> list[dict[str, Any]]:
    out = []
    for p_ in sorted({p.p for p in points}):
        ours = [p for p in points if p.p == p_]
        n = sum(p.acquisitions for p in ours)

        def weighted(key: str, ours: list[ThroughputPoint] = ours, n: int = n) -> float:
            return round(per(sum(getattr(p, key) * p.acquisitions for p in ours), n), 2)

        out.append(
            {
                "p": p_,
                "rounds": [p.acq_per_s for p in ours],
                "acquisitions": n,
                "acq_per_s": round(sum(p.acq_per_s for p in ours) / len(ours), 0),
                "client_cpu_ms_per_acq": weighted("client_cpu_ms_per_acq"),
                "client_cpu_cores": round(sum(p.client_cpu_cores for p in ours) / len(ours), 2),
                "timesvc_cpu_ms_per_acq": weighted("timesvc_cpu_ms_per_acq"),
                "timesvc_cpu_cores": round(sum(p.timesvc_cpu_cores for p in ours) / len(ours), 2),
                "ops_per_acq": weighted("ops_per_acq"),
                "release_ops_per_acq": weighted("release_ops_per_acq"),
                "round_trips_per_acq": weighted("round_trips_per_acq"),
                "busy_cores": round(sum(p.busy_cores for p in ours) / len(ours), 2),
                "loadavg_1m": [p.loadavg[0] for p in ours if p.loadavg],
                "errors": sorted({e for p in ours for e in p.errors}),
            }
        )
    return out


def _loads(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values) or "–"


def _markdown(machine: dict[str, Any], queues: list[dict[str, Any]], throughput: list[dict[str, Any]]) -> str:
    parts = [
        f"### Long queues: Q waiters on one lock id (embedded SQLite store; {QUEUE_PROCESSES} processes, "
        f"Q/{QUEUE_PROCESSES} threads each; hold {HOLD_S * 1000:g} ms; timesvc clock; leasewatch + local wake-ups)",
        markdown_table(
            [
                "Q",
                "acq/s",
                "acq/s per round",
                "store ops / acq (mean, max)",
                "release ops",
                "round trips / acq",
                "looks / acq",
                "leasewatch long-poll answers / acq",
                "leasewatch store polls / acq (per s)",
                "long-poll waiters (max)",
                "timeouts",
                "longest run: process / waiter",
                "waiters served (min)",
                "wait ms p50 / max",
                "client CPU ms / acq",
                "busy cores",
                "load 1 min (per round)",
                "errors",
            ],
            [
                [
                    s["q"],
                    s["acq_per_s"],
                    " / ".join(f"{x:g}" for x in s["rounds"]),
                    f"{s['ops_per_acq']:g}, {s['ops_per_acq_max']}",
                    s["release_ops_per_acq"],
                    s["round_trips_per_acq"],
                    s["looks_per_acq"],
                    s["longpoll_answers_per_acq"],
                    f"{s['leasewatch_polls_per_acq']:g} ({s['leasewatch_polls_per_s']:g})",
                    f"{s['leasewatch_waiters_max']:g}",
                    s["timeouts"],
                    f"{s['longest_process_run']} / {s['longest_waiter_run']}",
                    f"{s['waiters_served']} of {s['q']}",
                    f"{s['wait_ms_p50']:g} / {s['wait_ms_max']:,.0f}",
                    s["client_cpu_ms_per_acq"],
                    s["busy_cores"],
                    _loads(s["loadavg_1m"]),
                    "; ".join(s["errors"]),
                ]
                for s in queues
            ],
        ),
    ]
    by_q = {s["q"]: s for s in queues}
    if 5 in by_q and 100 in by_q:
        ratio = per(by_q[100]["acq_per_s"], by_q[5]["acq_per_s"])
        verdict = "met" if ratio >= RATIO_TARGET else "**missed**"
        timeouts = sum(s["timeouts"] for s in queues)
        parts.append(
            f"acq/s(Q=100) ÷ acq/s(Q=5) = **{ratio:.2f}** (target ≥ {RATIO_TARGET}: {verdict}); "
            f"timeouts over all Q: {timeouts} (target 0: {'met' if timeouts == 0 else '**missed**'})."
        )
    parts += [
        f"### Throughput over independent ids: P processes, each its own {IDS_PER_PROCESS} lock ids in turn "
        "(embedded SQLite store; timesvc clock; no hold, no contention)",
        markdown_table(
            [
                "P",
                "acq/s (total)",
                "acq/s per round",
                "client CPU ms / acq",
                "client CPU (cores)",
                "timesvc CPU ms / acq",
                "timesvc CPU (cores)",
                "store ops / acq (+ release)",
                "round trips / acq",
                "busy cores",
                "load 1 min (per round)",
                "errors",
            ],
            [
                [
                    s["p"],
                    s["acq_per_s"],
                    " / ".join(f"{x:g}" for x in s["rounds"]),
                    s["client_cpu_ms_per_acq"],
                    s["client_cpu_cores"],
                    s["timesvc_cpu_ms_per_acq"],
                    s["timesvc_cpu_cores"],
                    f"{s['ops_per_acq']:g} (+{s['release_ops_per_acq']:g})",
                    s["round_trips_per_acq"],
                    s["busy_cores"],
                    _loads(s["loadavg_1m"]),
                    "; ".join(s["errors"]),
                ]
                for s in throughput
            ],
        ),
    ]
    by_p = {s["p"]: s for s in throughput}
    if 4 in by_p:
        four = by_p[4]["acq_per_s"]
        verdict = "met" if four >= THROUGHPUT_TARGET else "**missed**"
        parts.append(f"P = 4: **{four:,.0f} acq/s** (target ≥ {THROUGHPUT_TARGET:,.0f}: {verdict}).")
    parts.append(
        f"Machine: {machine['cpus']} CPUs, load at start {machine['loadavg_1m_at_start']}, "
        f"at end {machine.get('loadavg_at_end', '?')} (1/5/15 min). Points in ABBA order in one run; "
        "busy cores = the whole machine's (/proc/stat) during the point, of "
        f"{machine['cpus']}. Compare rows of this run with each other, not with other runs."
    )
    return "\n\n".join(parts)


def _plot(queues: list[dict[str, Any]], throughput: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if queues:
        qs = [s["q"] for s in queues]
        left.plot(qs, [s["acq_per_s"] for s in queues], marker="o", color="C0", label="acq/s")
        left.set_xlabel("waiters on one lock id (Q)")
        left.set_ylabel("acquisitions / s", color="C0")
        left.set_xscale("log")
        left.set_ylim(bottom=0)
        twin = left.twinx()
        twin.plot(qs, [s["ops_per_acq"] for s in queues], marker="x", color="C1", label="store ops / acq")
        twin.plot(qs, [s["looks_per_acq"] for s in queues], marker=".", color="C2", label="looks / acq")
        twin.set_ylabel("per acquisition")
        twin.set_ylim(bottom=0)
        left.legend(loc="lower left", fontsize=8)
        twin.legend(loc="lower right", fontsize=8)
        left.set_title(f"long queues (hold {HOLD_S * 1000:g} ms)")
        left.grid(True, alpha=0.3)
    if throughput:
        ps = [s["p"] for s in throughput]
        right.plot(ps, [s["acq_per_s"] for s in throughput], marker="o", color="C0", label="acq/s (total)")
        right.axhline(THROUGHPUT_TARGET, linestyle=":", color="grey", label="target at P = 4")
        right.set_xlabel("processes (P), independent ids")
        right.set_ylabel("acquisitions / s", color="C0")
        right.set_ylim(bottom=0)
        twin = right.twinx()
        twin.plot(
            ps, [s["client_cpu_ms_per_acq"] for s in throughput], marker="x", color="C1", label="client CPU ms/acq"
        )
        twin.plot(
            ps, [s["timesvc_cpu_ms_per_acq"] for s in throughput], marker=".", color="C2", label="timesvc CPU ms/acq"
        )
        twin.set_ylabel("CPU ms per acquisition")
        twin.set_ylim(bottom=0)
        right.legend(loc="lower left", fontsize=8)
        twin.legend(loc="lower right", fontsize=8)
        right.set_title("throughput over independent ids")
        right.grid(True, alpha=0.3)
    fig.suptitle("chronolock queues and throughput (embedded store, 2 shared cores)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(*, quick: bool = False) -> dict[str, Any]:
    """Both experiments in one run. ``quick``: one round each, shorter windows (~1.5 min)."""
    queue_window = 6.0 if quick else 20.0
    tp_window = 4.0 if quick else 10.0
    queue_plan = list(QS) if quick else list(QS) + list(reversed(QS))
    tp_plan = list(PS) if quick else list(PS) + list(reversed(PS))
    machine = machine_info()
    queue_points: list[QueuePoint] = []
    tp_points: list[ThroughputPoint] = []
    with tempfile.TemporaryDirectory(prefix="chronolock-queues-") as tmp:
        workdir = Path(tmp)
        store_url = f"sqlite:///{workdir / 'cells.db'}"
        fleet = Fleet(workdir)
        try:
            timesvc = fleet.timesvc(store_url, "ts-0")
            leasewatch = fleet.leasewatch(store_url, "lw-0")
            timesvc.wait_ready()
            leasewatch.wait_ready()
            seen: Counter[int] = Counter()
            for q in queue_plan:
                seen[q] += 1
                queue_points.append(_queue_point(workdir, store_url, timesvc, leasewatch, q, seen[q], queue_window))
            seen.clear()
            for p in tp_plan:
                seen[p] += 1
                tp_points.append(_throughput_point(workdir, store_url, timesvc, p, seen[p], tp_window))
        finally:
            fleet.stop_all()
    machine["loadavg_at_end"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    queues = summarise_queues(queue_points)
    throughput = summarise_throughput(tp_points)
    name = "queues-short" if quick else "queues"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _plot(queues, throughput, RESULTS_DIR / f"{name}.png")
    data = {
        "benchmark": "queues",
        "quick": quick,
        "machine": machine,
        "config": {
            "qs": QS,
            "queue_processes": QUEUE_PROCESSES,
            "hold_s": HOLD_S,
            "lease_s": LEASE_S,
            "attempt_timeout_s": ATTEMPT_TIMEOUT_S,
            "queue_window_s": queue_window,
            "ps": PS,
            "ids_per_process": IDS_PER_PROCESS,
            "throughput_window_s": tp_window,
        },
        "queues": queues,
        "throughput": throughput,
        "queue_points": [asdict(p) for p in queue_points],
        "throughput_points": [asdict(p) for p in tp_points],
    }
    write_results(name, data, _markdown(machine, queues, throughput))
    return data
