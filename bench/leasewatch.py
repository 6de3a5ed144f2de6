"""leasewatch: scan cost per 1,000 live leases (and that history adds none), and store
operations per contended acquisition with wake-ups versus polling (DESIGN.md §6, issue 4)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import HOST, free_port, machine_info, markdown_table, write_results
from leasewatch.watcher import Watcher
from lockclient import RemoteLocker, open_store
from lockclient.wake import LeasewatchWaker


class _FakeMonotonic:
    """Moves the watcher past its observation windows without waiting for them."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _median_scan_ms(watcher: Watcher, clock: _FakeMonotonic, repeats: int, step: float) -> tuple[float, int, int]:
    """Median of ``repeats`` scans, the fake clock moved by ``step`` before each: past the look
    period, every lock is looked at; by less, only the index is read."""
    times = []
    report = None
    for _ in range(repeats):
        clock.now += step
        started = time.perf_counter()
        report = watcher.scan()
        times.append((time.perf_counter() - started) * 1000)
    assert report is not None
    return statistics.median(times), report.locks, report.looked


def scan_cost(workdir: Path, live: int, history: int, repeats: int) -> list[list[object]]:
    store_url = f"sqlite:///{workdir / 'scan.db'}"
    rows: list[list[object]] = []
    with open_store(store_url) as store, RemoteLocker(store, lease=600) as locker:
        for i in range(history):  # lock ids used once and released: history
            locker.get_lock(f"old-{i}").release()
        held = [locker.get_lock(f"live-{i}") for i in range(live)]
        clock = _FakeMonotonic()
        watcher = Watcher(store, grace=2.0, orphan_after=5.0, monotonic=clock)
        look = 61.0  # past the look period of a 600 s lease (60 s): every lock is looked at
        ms, locks, looked = _median_scan_ms(watcher, clock, repeats, look)
        rows.append(
            [f"{live} live + {history} released lock ids, every lock looked at", locks, looked, ms, ms * 1000 / live]
        )
        clock.now += 6  # past the orphan window: idle lock ids leave the index
        watcher.scan()
        ms, locks, looked = _median_scan_ms(watcher, clock, repeats, look)
        rows.append([f"{live} live, history dropped, every lock looked at", locks, looked, ms, ms * 1000 / live])
        ms, locks, looked = _median_scan_ms(watcher, clock, repeats, 1.0)
        rows.append([f"{live} live, nothing due (the index read only)", locks, looked, ms, ms * 1000 / live])
        for lock in held:
            lock.release()
    return rows


def _start_leasewatch(store_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
    env |= {
        "CHRONOLOCK_STORE_URL": store_url,
        "LEASEWATCH_HOST": HOST,
        "LEASEWATCH_PORT": str(port),
        "LEASEWATCH_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "leasewatch.cli", "serve"], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("leasewatch did not start")


def wakeups(workdir: Path, contenders: int, k: int, hold: float) -> list[list[object]]:
    store_url = f"sqlite:///{workdir / 'wake.db'}"
    proc, url = _start_leasewatch(store_url, workdir / "leasewatch.log")
    rows: list[list[object]] = []
    try:
        for mode in ("polling", "leasewatch wake-ups"):
            lockers = [
                RemoteLocker(
                    open_store(store_url),
                    lease=10,
                    owns_store=True,
                    waker=LeasewatchWaker(url) if mode != "polling" else None,
                )
                for _ in range(contenders)
            ]
            counts: list[dict[str, int]] = []

            def worker(locker: RemoteLocker, lock_id: str, out: list[dict[str, int]]) -> None:
                for _ in range(k):
                    with locker.get_lock(lock_id, timeout=120) as lock:
                        out.append(lock.store_op_counts)
                        threading.Event().wait(hold)

            lock_id = f"wake-{mode}"
            threads = [threading.Thread(target=worker, args=(lk, lock_id, counts)) for lk in lockers]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            for lk in lockers:
                lk.close()
            reads = [c.get("read_row", 0) for c in counts]
            totals = [sum(c.values()) for c in counts]
            rows.append(
                [
                    mode,
                    len(counts),
                    statistics.mean(reads),
                    statistics.mean(totals),
                    max(totals),
                    len(counts) / elapsed,
                ]
            )
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return rows


def run(*, quick: bool = False) -> dict[str, Any]:
    live = 300 if quick else 1000
    history = 500 if quick else 2000
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-") as tmp:
        workdir = Path(tmp)
        print(f"[bench] leasewatch scan cost: {live} live leases, {history} released lock ids", flush=True)
        scans = scan_cost(workdir, live, history, repeats=3 if quick else 5)
        print("[bench] leasewatch wake-ups vs polling", flush=True)
        wakes = wakeups(workdir, contenders=4, k=10 if quick else 30, hold=0.05)
    markdown = "\n\n".join(
        [
            "### leasewatch scan cost (embedded SQLite store, one in-process Watcher, median of scans)",
            markdown_table(
                ["state", "lock ids listed", "locks looked at", "scan ms", "ms per 1,000 live leases"], scans
            ),
            "### Store operations per contended acquisition: polling vs leasewatch wake-ups"
            " (4 contenders in one process, separate lockers, hold 50 ms)",
            markdown_table(
                ["mode", "acquisitions", "queue/owner row reads", "all store ops (mean)", "max", "acq/s"], wakes
            ),
        ]
    )
    data = {"machine": machine_info(), "scan": scans, "wakeups": wakes}
    write_results("leasewatch", data, markdown)
    return data
