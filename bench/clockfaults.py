"""``python -m bench clockfaults [--seconds S] [--parallel N]``: one faulty clock, on real processes.

Issue 22: global time that no faulty clock can drag, and schedules that ignore wall-clock steps.

**Global time.** Per clock fault, three ``timesvc serve`` replicas on one fresh SQLite store: two
with correct clocks (``TIMESVC_REPLICAS=3``), the third under libfaketime with a run-time clock file
— fast at 1.1×, 1.6×, 2×, 10×, slow at 0.5× (rates from its start), jumping ±600 s or stopping after
five healthy seconds, or configured with ``TIMESVC_REPLICAS=1`` and a clock +600 s from its start.
A reader asks every replica for ``/now`` in turn, every 50 ms, for ``--seconds`` (default 600), and
judges each answer against this process' own clock: the value was global time at some moment of
the read's window, so "ahead" is value − real time at the read's completion and "behind" is real
time at its invocation − value. Reported per fault: the largest of each (goal: ≤ ``max_skew`` =
1 s), decreases seen across replicas (goal: 0), the faulty replica's 503s and whether it refuses
its clock at the end. A lying replica (a fake one answering ``now_us`` = 10^20) is judged through a
``TimeServiceClock`` instead: the largest offset of its values and tickets to real time, and how many
answers it rejected.

**Revocation after a wall-clock step.** One ``leasewatch serve`` (defaults: scan 1 s, grace 2 s)
under libfaketime; a holder (``bench.clockfaults_holder``, lease 3 s) takes a lock; leasewatch's
wall clock steps by −60 s or +60 s (or not at all); the holder is SIGKILLed; reported: the time from
the kill to leasewatch's revocation record (polled every 20 ms), against the bound ``lease + grace +
look period + scan`` (docs/guarantees.md, "Liveness").

Faults can run side by side (``--parallel``); the machine's load is recorded with the results.
Every process is started on 127.0.0.1 and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from bench.common import ServiceProcess, fleet, free_port, machine_info, markdown_table, write_results

ROOT = Path(__file__).resolve().parent.parent
FAKETIME_SITE = ROOT / "tests" / "support" / "faketime_site"
"""The sitecustomize that makes ``time.sleep`` work under libfaketime with a real monotonic clock
(shared with the tests; shared/TESTING.md)."""
MAX_SKEW = 1.0
READ_EVERY = 0.05
LEASE = 3.0
GRACE = 2.0
SCAN = 1.0


def libfaketime() -> str:
    found = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=False).stdout
    for line in found.splitlines():
        if line.endswith("/libfaketime.so.1"):
            return line
    raise RuntimeError("libfaketime is not installed (Debian: apt-get install faketime libfaketime)")


def clock_env(clock_file: Path, initial: str) -> dict[str, str]:
    """libfaketime on the process itself, its wall clock from ``clock_file`` (re-read every second)."""
    clock_file.write_text(initial + "\n")
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_CACHE_DURATION": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(FAKETIME_SITE), os.environ.get("PYTHONPATH", "")])),
    }


@dataclass
class Fault:
    name: str
    spec: str
    from_start: bool
    replicas: int = 3


FAULTS = [
    Fault("fast 1.1×", "+0 x1.1", True),
    Fault("fast 1.6×", "+0 x1.6", True),
    Fault("fast 2×", "+0 x2", True),
    Fault("fast 10×", "+0 x10", True),
    Fault("slow 0.5×", "+0 x0.5", True),
    Fault("jump +600 s", "+600s", False),
    Fault("jump −600 s", "-600s", False),
    Fault("stopped", "STOPPED", False),
    Fault("TIMESVC_REPLICAS=1, +600 s", "+600s", True, replicas=1),
]


@dataclass
class Judged:
    reads: int = 0
    max_ahead_s: float = -1e9
    max_behind_s: float = -1e9
    decreases: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    highest: int = 0
    """The largest value read so far: one reader reads in sequence, so every earlier read completed
    before the next was invoked, and none may be above a later one (monotonic reads)."""

    def add(self, wall_invoked_us: int, wall_completed_us: int, value: int, *, ordered: bool = True) -> None:
        self.reads += 1
        self.max_ahead_s = max(self.max_ahead_s, (value - wall_completed_us) / 1e6)
        self.max_behind_s = max(self.max_behind_s, (wall_invoked_us - value) / 1e6)
        if ordered:
            if value < self.highest:
                self.decreases += 1
            self.highest = max(self.highest, value)


def _get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our loopback server
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def read_loop(replicas: list[ServiceProcess], seconds: float, judged: Judged) -> None:
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        r = replicas[i % len(replicas)]
        i += 1
        wall_invoked = time.time_ns() // 1000
        try:
            status, body = _get(f"{r.url}/now")
        except (OSError, ValueError):
            judged.errors += 1
            continue
        wall_completed = time.time_ns() // 1000
        if status == 200:
            judged.add(wall_invoked, wall_completed, int(body["now_us"]))
        else:
            judged.refused[r.name] = judged.refused.get(r.name, 0) + 1
        time.sleep(READ_EVERY / len(replicas))


def run_fault(fault: Fault, seconds: float, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{workdir / 'cells.db'}"
    with fleet(workdir) as f:
        healthy = [f.timesvc(store, f"ok{i}", replicas=3) for i in range(2)]
        for r in healthy:
            r.wait_ready(timeout=60)
        clock = workdir / "clock-faulty"
        faulty = f.timesvc(
            store,
            "faulty",
            replicas=fault.replicas,
            extra_env=clock_env(clock, fault.spec if fault.from_start else "+0 x1"),
            log_level="info",
        )
        judged = Judged()
        started = time.monotonic()
        if not fault.from_start:
            read_loop([*healthy, faulty], 5.0, judged)
            spec = fault.spec
            if spec == "STOPPED":
                spec = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())  # an absolute time: frozen
            clock.write_text(spec + "\n")
        read_loop([*healthy, faulty], seconds - (time.monotonic() - started), judged)
        status = faulty.status(timeout=10)
        return {
            "fault": fault.name,
            "seconds": round(time.monotonic() - started, 1),
            "reads": judged.reads,
            "max_ahead_s": round(judged.max_ahead_s, 3),
            "max_behind_s": round(judged.max_behind_s, 3),
            "decreases": judged.decreases,
            "faulty_503": judged.refused.get("faulty", 0),
            "healthy_503": sum(v for k, v in judged.refused.items() if k != "faulty"),
            "errors": judged.errors,
            "refusing_at_end": sorted(status.get("refusing", {})),
        }


def run_liar(seconds: float, workdir: Path) -> dict[str, Any]:
    from lockclient.clock import TimeServiceClock

    workdir.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{workdir / 'cells.db'}"
    port = free_port()
    liar_log = (workdir / "liar.log").open("ab")
    liar = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "timesvc" / "liar.py"), str(port)], stdout=liar_log, stderr=liar_log
    )
    try:
        with fleet(workdir) as f:
            healthy = [f.timesvc(store, f"ok{i}", replicas=3) for i in range(2)]
            for r in healthy:
                r.wait_ready(timeout=60)
            clock = TimeServiceClock([f"http://127.0.0.1:{port}", *(r.url for r in healthy)], timeout=5.0)
            judged = Judged()
            started = time.monotonic()
            failures = 0
            while time.monotonic() - started < seconds:
                # now_us is the lower end of the clock's interval (never decreasing), a ticket the
                # upper end: both are judged against real time, only now_us for order.
                for take, ordered in ((clock.now_us, True), (clock.ticket_us, False)):
                    wall_invoked = time.time_ns() // 1000
                    try:
                        value = take()
                    except Exception:  # a failure to answer is counted, never a value
                        failures += 1
                        continue
                    judged.add(wall_invoked, time.time_ns() // 1000, value, ordered=ordered)
                time.sleep(READ_EVERY)
            result = {
                "fault": "lying replica (now_us = 10^20), via TimeServiceClock",
                "seconds": round(time.monotonic() - started, 1),
                "reads": judged.reads,
                "max_ahead_s": round(judged.max_ahead_s, 3),
                "max_behind_s": round(judged.max_behind_s, 3),
                "decreases": judged.decreases,
                "rejected": clock.rejected,
                "errors": failures,
            }
            clock.close()
            return result
    finally:
        os.kill(liar.pid, signal.SIGKILL)
        liar.wait(timeout=10)
        liar_log.close()


def _leasewatch_offset_s(lw: ServiceProcess) -> float:
    with urllib.request.urlopen(f"{lw.url}/healthz", timeout=5) as response:  # noqa: S310 - loopback
        date = response.headers["Date"]
    return parsedate_to_datetime(date).timestamp() - time.time()


def run_revocation(step: str, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{workdir / 'cells.db'}"
    with fleet(workdir) as f:
        clock = workdir / "clock-leasewatch"
        lw = f.leasewatch(
            store, "lw", scan_interval=SCAN, settings={"GRACE": str(GRACE)}, extra_env=clock_env(clock, "+0 x1")
        )
        lw.wait_ready(timeout=60)
        status = workdir / "holder.jsonl"
        holder_log = (workdir / "holder.log").open("ab")
        holder = subprocess.Popen(
            [sys.executable, "-m", "bench.clockfaults_holder", "--store", store, "--lock", "bench:step",
             "--lease", str(LEASE), "--status", str(status)],
            stdout=holder_log, stderr=holder_log, cwd=ROOT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (status.exists() and status.read_text().strip()):
                if time.monotonic() > deadline or holder.poll() is not None:
                    raise RuntimeError(
                        f"the holder did not take the lock: {(workdir / 'holder.log').read_text()[-2000:]}"
                    )
                time.sleep(0.02)
            owner = json.loads(status.read_text().splitlines()[0])["owner"]
            time.sleep(2 * LEASE)  # leasewatch watches the lease for a while first
            if step != "none":
                clock.write_text(step + "\n")
                deadline = time.monotonic() + 10
                while abs(_leasewatch_offset_s(lw)) < 50:
                    if time.monotonic() > deadline:
                        raise RuntimeError("leasewatch's clock did not step")
                    time.sleep(0.05)
            killed = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=10)
            deadline = killed + 120
            revoked = None
            while time.monotonic() < deadline:
                code, events = _get(f"{lw.url}/revocations?lock_id=bench:step")
                if code == 200 and any(e.get("owner") == owner for e in events):
                    revoked = time.monotonic() - killed
                    break
                time.sleep(0.02)
        finally:
            if holder.poll() is None:
                os.kill(holder.pid, signal.SIGKILL)
                holder.wait(timeout=10)
            holder_log.close()
    look = max(SCAN, LEASE / 10)
    return {
        "step": step,
        "revoked_after_kill_s": None if revoked is None else round(revoked, 3),
        "bound_s": LEASE + GRACE + look + SCAN,
    }


def run(*, seconds: float = 600.0, parallel: int = 3) -> dict[str, Any]:
    info = machine_info()
    print(
        f"[bench clockfaults] {len(FAULTS) + 1} clock faults × {seconds:.0f} s, {parallel} at a time; "
        f"load {info['loadavg_1m_at_start']}",
        flush=True,
    )
    base = Path(tempfile.mkdtemp(prefix="chronolock-clockfaults-"))
    loads: list[float] = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample_load() -> None:
        while not stop.wait(10):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(run_fault, fault, seconds, base / f"fault-{i}") for i, fault in enumerate(FAULTS)]
        futures.append(pool.submit(run_liar, seconds, base / "liar"))
        rows = [future.result() for future in futures]
    revocations = [run_revocation(step, base / f"revoke-{i}") for i, step in enumerate(("none", "-60s", "+60s"))]
    stop.set()
    info["loadavg_1m_during"] = {"min": min(loads, default=None), "max": max(loads, default=None)}
    data = {"machine": info, "seconds": seconds, "parallel": parallel, "faults": rows, "revocations": revocations}

    def last_column(r: dict[str, Any]) -> str:
        if "faulty_503" in r:
            return f"{r['faulty_503']}, {', '.join(r['refusing_at_end']) or '—'}"
        return f"{r['rejected']} answers rejected"

    table = markdown_table(
        ["fault (one of three replicas)", "s", "/now reads", "max ahead of real time", "max behind", "decreases",
         "faulty replica: 503s, refusing at end"],
        [[r["fault"], r["seconds"], r["reads"], f"{r['max_ahead_s']:+.3f} s", f"{r['max_behind_s']:+.3f} s",
          r["decreases"], last_column(r)] for r in rows],
    )  # fmt: skip
    revocation_table = markdown_table(
        ["leasewatch host's wall clock", "SIGKILLed holder revoked after", "bound (lease + grace + look + scan)"],
        [[r["step"], "not within 120 s" if r["revoked_after_kill_s"] is None else f"{r['revoked_after_kill_s']:.2f} s",
          f"{r['bound_s']:.1f} s"] for r in revocations],
    )  # fmt: skip
    load = info["loadavg_1m_during"]
    markdown = (
        f"## Clock faults ({seconds:.0f} s per fault, {parallel} at a time, "
        f"1-minute load {load['min']:.1f}–{load['max']:.1f}, "
        f"{time.monotonic() - started:.0f} s in all)\n\n{table}\n\n{revocation_table}\n"
    )
    write_results("clockfaults", data, markdown)
    return data
