"""Scale (issue 15): N live lock ids watched by K leasewatch replicas on the embedded store.

For each point (N, K, lease):

1. a fresh SQLite store; K ``leasewatch serve`` processes (default settings: scan 1 s, grace
   2 s, partition lease 10 s);
2. N locks taken and held by holder processes (``bench/scale_holder.py``: one ``RemoteLocker``
   each, 25,000 locks at most per process; renewals batched by the client), plus three
   *victim* processes holding one lock each and logging every successful renewal;
3. after a warm-up (leasewatch has looked at every lock twice), a measuring window: every
   leasewatch's CPU (``/proc/<pid>/stat``), its scans (``/status``: duration of the last scan,
   locks looked at), the store's size; the victims are SIGKILLed one after the other, and the
   store is polled (every 20 ms) until each one's holder record is gone: **last real
   renewal → revocation**, against the documented bound ``lease + grace + max(scan interval,
   lease / 10) + scan duration + 0.1 s``;
4. at the end: how many live holders lost their lock (must be 0) and how many revocations
   leasewatch made (must be exactly the three victims); with K = 3, one replica is
   SIGKILLed and the time until the others own all 64 partitions is measured (bound:
   partition lease + grace + a refresh).

The lease is the default 10 s up to N = 10,000 and 60 s at N = 100,000: 100,000 holders
renewing every 3.3 s would need ~1.1 cores for the holders alone (0.11 core per 10,000, the
N = 10,000 row of ``bench/results/scale.md``), more than this 2-core machine has beside leasewatch.

Every process is started on 127.0.0.1 and stopped by its PID (never by name), also on
errors. The short version (``make bench``, or ``--quick``) stops at N = 10,000 and writes
``scale-short.*``; ``python -m bench scale`` runs every point and writes ``scale.*``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, Fleet, ServiceProcess, cpu_seconds, machine_info, markdown_table, write_results
from lockclient import open_store
from lockclient.lease import HOLDER_COLUMN

SCAN_INTERVAL = 1.0
GRACE = 2.0
PARTITION_LEASE = 10.0
PER_HOLDER = 25_000
VICTIMS = 3
DUE_SLACK = 0.1
"""leasewatch looks at its due schedule every 50 ms (plus a thread hop); this benchmark polls the
store every 20 ms."""


@dataclass
class Point:
    n: int
    k: int
    lease: float
    # measured
    setup_s: float = 0.0
    loadavg: list[float] = field(default_factory=list)
    cpu_cores: list[float] = field(default_factory=list)
    """Each leasewatch replica's CPU over the window, in cores."""
    scan_ms_mean: float = 0.0
    scan_ms_max: float = 0.0
    looked_per_scan: float = 0.0
    revocation_s: list[float] = field(default_factory=list)
    """Each victim: last successful renewal (completion) -> holder record gone."""
    bound_s: float = 0.0
    live_lost: int = 0
    revocations: int = 0
    takeover_s: float | None = None
    store_mib: float = 0.0
    wal_mib: float = 0.0
    holders_cpu_cores: float = 0.0
    errors: list[str] = field(default_factory=list)


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


class _Holder:
    def __init__(self, workdir: Path, store_url: str, prefix: str, count: int, lease: float, *, victim: bool) -> None:
        self.status = workdir / f"{prefix.strip('-')}.jsonl"
        self.log = (workdir / f"{prefix.strip('-')}.log").open("ab")
        args = [
            sys.executable,
            "-m",
            "bench.scale_holder",
            "--store",
            store_url,
            "--prefix",
            prefix,
            "--count",
            str(count),
            "--lease",
            str(lease),
            "--status",
            str(self.status),
        ]
        if victim:
            args.append("--victim")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.lock_ids = [f"{prefix}{i:06d}" for i in range(count)]

    def held(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"holder {self.status.name} exited with {self.proc.returncode}")
        return any(e["event"] == "held" for e in _events(self.status))

    def lost(self) -> int:
        alive = [e for e in _events(self.status) if e["event"] == "alive"]
        return alive[-1]["lost"] if alive else 0

    def last_renewal_ns(self, before_ns: int) -> int | None:
        done = [e["done_ns"] for e in _events(self.status) if e["event"] == "renewed" and e["done_ns"] <= before_ns]
        return max(done) if done else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def _status(lw: ServiceProcess) -> dict[str, Any]:
    return lw.status(timeout=10.0)


def _scan_totals(lw: ServiceProcess) -> tuple[float, float]:
    """(seconds, count) of all scans so far, from the replica's Prometheus histogram."""
    text = lw.metrics()
    values = {}
    for name in ("leasewatch_scan_seconds_sum", "leasewatch_scan_seconds_count"):
        match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
        values[name] = float(match.group(1)) if match else 0.0
    return values["leasewatch_scan_seconds_sum"], values["leasewatch_scan_seconds_count"]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def run_point(workdir: Path, n: int, k: int, lease: float) -> Point:
    point = Point(n=n, k=k, lease=lease)
    store_url = f"sqlite:///{workdir / 'cells.db'}"
    fleet = Fleet(workdir)
    holders: list[_Holder] = []
    victims: list[_Holder] = []
    print(f"[bench] scale: N={n:,} K={k} lease={lease:g}s", flush=True)
    try:
        settings = {
            "SCAN_INTERVAL": str(SCAN_INTERVAL),
            "GRACE": str(GRACE),
            "PARTITION_LEASE": str(PARTITION_LEASE),
            "ORPHAN_AFTER": "12",
            "GC_INTERVAL": "30",
        }
        replicas = [fleet.leasewatch(store_url, f"lw-{i}", settings=settings) for i in range(k)]
        for lw in replicas:
            lw.wait_ready()
        _wait(lambda: sum(len(_status(lw)["partitions"]) for lw in replicas) == 64, 60, "partitions to be owned")

        started = time.monotonic()
        count = n - VICTIMS
        for i, first in enumerate(range(0, count, PER_HOLDER)):
            size = min(PER_HOLDER, count - first)
            holders.append(_Holder(workdir, store_url, f"h{i}-", size, lease, victim=False))
        victims = [_Holder(workdir, store_url, f"victim{i}-", 1, lease, victim=True) for i in range(VICTIMS)]
        _wait(lambda: all(h.held() for h in holders + victims), 900, f"{n:,} locks to be held")
        point.setup_s = round(time.monotonic() - started, 1)
        print(f"[bench]   {n:,} locks held after {point.setup_s:.0f} s", flush=True)

        # Warm-up: every lock is new to leasewatch (looked at in two scans), then steady state.
        look = max(SCAN_INTERVAL, lease / 10)
        time.sleep(max(6.0, look + 3 * SCAN_INTERVAL))
        window_start = time.monotonic()
        cpu_before = [cpu_seconds(lw.pid) or 0.0 for lw in replicas]
        holders_cpu_before = sum(cpu_seconds(h.proc.pid) or 0.0 for h in holders)
        totals_before = [_scan_totals(lw) for lw in replicas]
        scans: list[dict[str, Any]] = []
        next_sample = window_start
        revoked_at: dict[int, int] = {}
        killed = []

        store = open_store(store_url)
        try:
            victim_ids = [v.lock_ids[0] for v in victims]
            stagger = lease / 3 / VICTIMS  # kill at different points of the renewal cycle
            kill_at = [window_start + 1.0 + i * stagger for i in range(VICTIMS)]
            bound = lease + GRACE + look
            window_end = kill_at[-1] + bound + 10.0
            while time.monotonic() < window_end and len(revoked_at) < VICTIMS:
                now = time.monotonic()
                for i, victim in enumerate(victims):
                    if i not in killed and now >= kill_at[i]:
                        os.kill(victim.proc.pid, signal.SIGKILL)
                        victim.proc.wait(timeout=10)
                        killed.append(i)
                gone = store.read_versioned_many([victim_ids[i] for i in killed])
                for i in killed:
                    if i not in revoked_at and HOLDER_COLUMN not in gone.get(victim_ids[i], {}):
                        revoked_at[i] = time.monotonic_ns()
                if now >= next_sample:  # the last scan of each replica, about once a second
                    next_sample = now + 1.0
                    for lw in replicas:
                        last = _status(lw).get("last_scan")
                        if last:
                            scans.append(last)
                time.sleep(0.02)
            # At least one full look period in the window, for the CPU average.
            while time.monotonic() < window_start + max(20.0, 2 * look):
                for lw in replicas:
                    last = _status(lw).get("last_scan")
                    if last:
                        scans.append(last)
                time.sleep(1.0)
        finally:
            store.close()
        elapsed = time.monotonic() - window_start
        point.cpu_cores = [
            round(((cpu_seconds(lw.pid) or 0.0) - b) / elapsed, 3) for lw, b in zip(replicas, cpu_before, strict=True)
        ]
        point.holders_cpu_cores = round(
            (sum(cpu_seconds(h.proc.pid) or 0.0 for h in holders) - holders_cpu_before) / elapsed, 3
        )
        point.loadavg = [round(x, 2) for x in os.getloadavg()]
        seconds = [s["seconds"] for s in scans]
        totals = [_scan_totals(lw) for lw in replicas]
        spent = sum(t[0] - b[0] for t, b in zip(totals, totals_before, strict=True))
        scans_done = sum(t[1] - b[1] for t, b in zip(totals, totals_before, strict=True))
        point.scan_ms_mean = round(1000 * spent / scans_done, 1) if scans_done else float("nan")
        point.scan_ms_max = round(1000 * max(seconds), 1) if seconds else float("nan")
        point.looked_per_scan = round(sum(s["looked"] for s in scans) / len(scans), 1) if scans else float("nan")
        for i, victim in enumerate(victims):
            if i not in revoked_at:
                point.errors.append(f"victim {i} not revoked within the window")
                continue
            last = victim.last_renewal_ns(revoked_at[i])
            if last is None:
                point.errors.append(f"victim {i}: no renewal recorded")
                continue
            point.revocation_s.append(round((revoked_at[i] - last) / 1e9, 2))
        point.bound_s = round(lease + GRACE + look + point.scan_ms_max / 1000 + DUE_SLACK, 2)
        point.live_lost = sum(h.lost() for h in holders)
        point.revocations = sum(_status(lw)["revocations"] for lw in replicas)
        sizes = _status(replicas[0])["store"]
        db = workdir / "cells.db"
        point.store_mib = round(os.path.getsize(db) / 2**20, 1)
        wal = Path(f"{db}-wal")
        point.wal_mib = round((os.path.getsize(wal) if wal.exists() else 0) / 2**20, 1)
        if sizes and "wal" in sizes:
            point.wal_mib = max(point.wal_mib, round(int(sizes["wal"]) / 2**20, 1))

        if k > 1:
            # One replica dies: the others own its partitions within partition lease + grace.
            dead = replicas[-1]
            killed_at = time.monotonic()
            os.kill(dead.pid, signal.SIGKILL)
            dead.proc.wait(timeout=10)
            survivors = replicas[:-1]
            _wait(
                lambda: len(set().union(*(set(_status(lw)["partitions"]) for lw in survivors))) == 64,
                PARTITION_LEASE + GRACE + 60,
                "the survivors to take the partitions over",
            )
            point.takeover_s = round(time.monotonic() - killed_at, 2)
            time.sleep(3.0)
            point.live_lost = sum(h.lost() for h in holders)
    except Exception as exc:  # a point that fails is reported, the others still run
        point.errors.append(repr(exc))
        print(f"[bench]   failed: {exc!r}", flush=True)
    finally:
        for h in holders + victims:
            try:
                h.stop()
            except Exception as exc:
                point.errors.append(f"stopping a holder: {exc!r}")
        fleet.stop_all()
    print(f"[bench]   {json.dumps(asdict(point))}", flush=True)
    return point


def _plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k in sorted({p.k for p in points}):
        ours = sorted((p for p in points if p.k == k and not p.errors), key=lambda p: p.n)
        if not ours:
            continue
        ns = [p.n for p in ours]
        left.plot(ns, [p.scan_ms_mean for p in ours], marker="o", label=f"K={k}: mean scan")
        left.plot(ns, [p.scan_ms_max for p in ours], marker="x", linestyle="--", label=f"K={k}: max scan")
        # Beyond the lease: what leasewatch adds (grace, look period, scan), comparable across leases.
        worst = [max(p.revocation_s) - p.lease if p.revocation_s else float("nan") for p in ours]
        right.plot(ns, worst, marker="o", label=f"K={k}: worst of 3 victims")
        bounds = [p.bound_s - p.lease for p in ours]
        right.plot(ns, bounds, linestyle=":", marker=".", label=f"K={k}: documented bound")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("live lock ids (N)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("leasewatch scan duration (ms)")
    left.set_yscale("log")
    right.set_ylabel("last renewal → revocation, minus the lease (s)")
    fig.suptitle("leasewatch at scale (embedded store; lease 10 s, 60 s at 100,000)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def replot(path: Path = RESULTS_DIR / "scale.json") -> None:
    """Draw the plot again from a run's raw numbers (``scale.json``)."""
    data = json.loads(path.read_text())
    _plot([Point(**p) for p in data["points"]], path.with_suffix(".png"))


def run(*, quick: bool = False, max_n: int | None = None, only_n: int | None = None) -> dict[str, Any]:
    top = max_n or only_n or (10_000 if quick else 100_000)
    plan: list[tuple[int, int, float]] = [(n, 1, 10.0) for n in (100, 1_000, 10_000) if n <= top]
    if top >= 100_000:
        plan.append((100_000, 1, 60.0))
        plan.append((100_000, 3, 60.0))
    else:
        plan.append((min(top, 10_000), 3, 10.0))
    if only_n is not None:
        plan = [p for p in plan if p[0] == only_n]
    machine = machine_info()
    points: list[Point] = []
    for n, k, lease in plan:
        with tempfile.TemporaryDirectory(prefix="chronolock-scale-") as tmp:
            points.append(run_point(Path(tmp), n, k, lease))
    rows = [
        [
            f"{p.n:,}",
            p.k,
            f"{p.lease:g}",
            " / ".join(f"{x:.2f}" for x in p.loadavg),
            f"{p.setup_s:.0f}",
            p.scan_ms_mean,
            p.scan_ms_max,
            p.looked_per_scan,
            " / ".join(f"{c:.2f}" for c in p.cpu_cores),
            p.holders_cpu_cores,
            " / ".join(f"{r:.1f}" for r in p.revocation_s) or "–",
            f"{p.bound_s:.1f}",
            p.live_lost,
            p.revocations,
            "–" if p.takeover_s is None else f"{p.takeover_s:.1f}",
            f"{p.store_mib:g} / {p.wal_mib:g}",
            "; ".join(p.errors) or "",
        ]
        for p in points
    ]
    headers = [
        "N",
        "K",
        "lease s",
        "load 1/5/15 min (end)",
        "setup s",
        "scan ms mean",
        "scan ms max",
        "locks looked / scan",
        "leasewatch CPU (cores, each)",
        "holders CPU (cores)",
        "last renewal → revoked (s, 3 victims)",
        "bound s",
        "live holders revoked",
        "revocations",
        "take-over s (K=3)",
        "store / WAL MiB",
        "errors",
    ]
    markdown = "\n\n".join(
        [
            "### leasewatch at scale (embedded SQLite store; scan 1 s, grace 2 s, partition lease 10 s)",
            markdown_table(headers, rows),
            f"Machine: {machine['cpus']} CPUs, load at start {machine['loadavg_1m_at_start']}. "
            "Bound = lease + grace + max(scan interval, lease / 10) + the longest scan seen + 0.1 s "
            "(the 50 ms due-check tick and this benchmark's 20 ms poll).",
        ]
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if only_n is None:
        _plot(points, RESULTS_DIR / ("scale.png" if top >= 100_000 else "scale-short.png"))
    data = {"benchmark": "scale", "quick": quick, "machine": machine, "points": [asdict(p) for p in points]}
    name = f"scale-{only_n}" if only_n is not None else ("scale" if top >= 100_000 else "scale-short")
    write_results(name, data, markdown)
    return data
