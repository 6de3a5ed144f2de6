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

**On any store** (``--store-url``, e.g. ``cassandra://127.0.0.1:9242/chronolock_scale``;
the default stays a fresh embedded SQLite file per point): each point gets a keyspace of its
own (the URL's keyspace + ``_<N>_<K>_<random>``, created with ``--replication-factor``,
default 3, and dropped at the end), one timesvc on that store (global time, as users deploy
it: holders use ``TimeServiceClock``), holders taking locks 16 at a time, and victims with a
lease of their own (``--victim-lease``, default ``min(lease, 60 s)``: a victim is revoked
within *its* lease + grace + look period, and a 6,000 s lease could not be waited for). The
plan is ``--points N:K:LEASE,...``; without it, on a networked store, 10,000 and 100,000 ids
with K = 3 and the lease :func:`ring_lease` gives (the renewals the ring can carry).

Every point also reports the **store load per live id per second** — requests the store
served for the holders (their :class:`~lockclient.store.counting.CountingStore`: renewals,
clock, anything else) and for leasewatch (``leasewatch_store_requests_total``, a many-rows
read counting one per row as Cassandra serves it), over the measuring window —, leasewatch's
CPU per lock looked at (``leasewatch_looks_total``), the holders' **renewal lateness**
(renewal start − due time, every renewal of every holder since it took its locks) and, on a
ring, the Cassandra JVMs' CPU (every ``CassandraDaemon`` process on the machine, read from
``/proc``; only read, never signalled).

Every process is started on 127.0.0.1 and stopped by its PID (never by name), also on
errors. The short version (``make bench``, or ``--quick``) stops at N = 10,000 and writes
``scale-short.*``; ``python -m bench scale`` runs every point and writes ``scale.*``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.common import (
    RESULTS_DIR,
    Fleet,
    ServiceProcess,
    cpu_seconds,
    machine_info,
    markdown_table,
    write_results,
)
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
MAX_WARMUP_LOOK = 60.0
"""The warm-up waits one look period (plus three scans) — at most this long: with a lease of
hours the locks were looked at as they were taken, during a setup of many minutes."""
MAX_MIN_WINDOW = 300.0
"""The measuring window lasts at least two look periods (the CPU and load averages cover every
lock's look) — at most this long; locks taken over a long setup come due evenly, so a shorter
window samples the same rate."""
RING_RENEWALS_PER_S = 50.0
"""Holder renewals per second the benchmark plans for on a networked store: half of the ~100
compare-and-sets per second a 3-node Cassandra 4.1 ring (Paxos v1, commitlog batch) served on
this 2-core machine (measured before the runs, BENCHMARKS.md), the other half left for the
acquisitions, leasewatch and partition leases. :func:`ring_lease` derives the lease from it."""
RING_THREADS = 16
"""Acquisitions at once per holder process on a networked store."""
RING_VICTIM_LEASE = 60.0


def ring_lease(n: int) -> float:
    """The lease a networked store can carry for ``n`` live locks: renewals (one compare-and-set
    per lock every lease / 3) at most :data:`RING_RENEWALS_PER_S`, and never below 60 s."""
    return float(max(60, math.ceil(3 * n / RING_RENEWALS_PER_S / 60) * 60))


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
    store: str = "sqlite"
    victim_lease: float = 0.0
    holder_processes: int = 0
    window_s: float = 0.0
    holder_requests_per_id_s: float = math.nan
    """Requests the store served for the holders, per live id per second, over the window."""
    leasewatch_requests_per_id_s: float = math.nan
    """Requests the store served for every leasewatch replica together, per live id per second."""
    leasewatch_requests_by_op: dict[str, float] = field(default_factory=dict)
    """leasewatch's requests per second over the window, by store operation."""
    looks_per_s: float = math.nan
    """Locks leasewatch read per second (all replicas)."""
    cpu_us_per_look: float = math.nan
    """leasewatch CPU per lock looked at (all replicas), microseconds."""
    cpu_us_per_id_s: float = math.nan
    """leasewatch CPU per live id per second (all replicas), microseconds."""
    renewals: int = 0
    renewal_late_p50_s: float = math.nan
    """The holders' renewal lateness, p50 (the worst holder process's, when there are several)."""
    renewal_late_p99_s: float = math.nan
    renewal_late_max_s: float = math.nan
    renewal_least_left_s: float = math.nan
    """The least validity a holder's lease had left when a renewal of it started."""
    label: str = ""
    """What distinguishes this point from others of the same N in a combined table (e.g. the code)."""
    n_target: int | None = None
    """The N asked for, when the setup deadline came first (then ``n`` is what was held)."""
    acquire_retries: int = 0
    """Acquisitions that failed while taking the locks and were tried again (bench/scale_holder.py)."""
    store_server_cpu_cores: float | None = None
    """CPU of the Cassandra JVMs on this machine over the window (sum), in cores; None on SQLite."""


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


class _Holder:
    def __init__(
        self,
        workdir: Path,
        store_url: str,
        prefix: str,
        count: int,
        lease: float,
        *,
        victim: bool,
        timesvc: str | None = None,
        threads: int = 1,
    ) -> None:
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
        if timesvc:
            args += ["--timesvc", timesvc]
        if threads > 1:
            args += ["--threads", str(threads)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.lock_ids = [f"{prefix}{i:06d}" for i in range(count)]

    def held(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"holder {self.status.name} exited with {self.proc.returncode}")
        return any(e["event"] == "held" for e in _events(self.status))

    def last_alive(self) -> dict[str, Any]:
        alive = [e for e in _events(self.status) if e["event"] == "alive"]
        return alive[-1] if alive else {}

    def held_count(self) -> int:
        return sum(int(e["held"]) for e in _events(self.status) if e["event"] == "held")

    def lost(self) -> int:
        return int(self.last_alive().get("lost", 0))

    def requests(self) -> int:
        return int(self.last_alive().get("requests", 0))

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


@dataclass
class _Totals:
    """One replica's counters so far, from its Prometheus metrics."""

    scan_seconds: float
    scans: float
    looks: float
    requests: dict[str, float]


def _totals(lw: ServiceProcess) -> _Totals:
    return parse_totals(lw.metrics())


def parse_totals(text: str) -> _Totals:
    """The counters :class:`_Totals` holds, from a replica's Prometheus text."""

    def value(name: str) -> float:
        match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    requests = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^leasewatch_store_requests_total\{op="([^"]+)"\} ([0-9.e+-]+)$', text, re.MULTILINE)
    }
    return _Totals(
        value("leasewatch_scan_seconds_sum"),
        value("leasewatch_scan_seconds_count"),
        value("leasewatch_looks_total"),
        requests,
    )


def _balanced(replicas: list[ServiceProcess]) -> bool:
    """Every partition owned once, each replica at most its cap (leasewatch.partitions: ceil(64 / K)),
    none watching more than it owns."""
    statuses = [_status(lw) for lw in replicas]
    owned = [set(st["partitions"]) for st in statuses]
    cap = math.ceil(64 / len(replicas))
    return (
        len(set().union(*owned)) == 64
        and sum(len(o) for o in owned) == 64
        and all(len(o) <= cap for o in owned)
        and all(set(st["watching"]) == o for st, o in zip(statuses, owned, strict=True))
    )


def _store_server_pids() -> list[int]:
    """The Cassandra JVMs on this machine (read from /proc; only their CPU is read)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"CassandraDaemon" in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _keyspace_url(store_url: str, suffix: str) -> tuple[str, str]:
    """The store URL with its keyspace (the path) + ``suffix``, and that keyspace."""
    parts = urlsplit(store_url)
    keyspace = f"{parts.path.strip('/')}{suffix}"
    return urlunsplit(parts._replace(path=f"/{keyspace}")), keyspace


def _drop_keyspace(store_url: str, keyspace: str) -> None:
    from lockclient.store.cassandra import connect_cluster
    from lockclient.store.url import parse_store_url

    cluster, session, _ = connect_cluster(parse_store_url(store_url))
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    finally:
        cluster.shutdown()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def run_point(
    workdir: Path,
    n: int,
    k: int,
    lease: float,
    *,
    store_url: str | None = None,
    victim_lease: float | None = None,
    replication_factor: int = 3,
    setup_timeout: float | None = None,
) -> Point:
    """One point. ``store_url`` None: a fresh SQLite file in ``workdir``; else a keyspace of its own
    on that store (created here, dropped at the end). ``setup_timeout``: if the locks are not all
    held by then, the holders stop taking more and the point is measured at the N they hold
    (reported, with ``n_target`` the N asked for)."""
    victim_lease = lease if victim_lease is None else victim_lease
    networked = store_url is not None and not store_url.startswith("sqlite:")
    point = Point(n=n, k=k, lease=lease, victim_lease=victim_lease, store="sqlite" if not networked else "cassandra")
    keyspace: str | None = None
    if store_url is None:
        point_url = f"sqlite:///{workdir / 'cells.db'}"
    elif networked:
        point_url, keyspace = _keyspace_url(store_url, f"_{n}_{k}_{secrets.token_hex(3)}")
    else:
        point_url = store_url
    fleet = Fleet(workdir)
    holders: list[_Holder] = []
    victims: list[_Holder] = []
    print(
        f"[bench] scale: N={n:,} K={k} lease={lease:g}s victims' lease={victim_lease:g}s on {point.store}", flush=True
    )
    try:
        timesvc_url: str | None = None
        if keyspace is not None:
            from lockclient.store.cassandra_schema import create_schema

            create_schema(point_url, replication_factor=replication_factor)
            timesvc = fleet.timesvc(point_url, "ts-0")
            timesvc.wait_ready(timeout=120)
            timesvc_url = timesvc.url
        settings = {
            "SCAN_INTERVAL": str(SCAN_INTERVAL),
            "GRACE": str(GRACE),
            "PARTITION_LEASE": str(PARTITION_LEASE),
            "ORPHAN_AFTER": "12",
            "GC_INTERVAL": "30",
        }
        replicas = [fleet.leasewatch(point_url, f"lw-{i}", settings=settings) for i in range(k)]
        for lw in replicas:
            lw.wait_ready(timeout=120)
        _wait(lambda: sum(len(_status(lw)["partitions"]) for lw in replicas) == 64, 120, "partitions to be owned")
        # And shared out, each partition watched by its owner only, before any lock is taken: a partition
        # handed over later is watched by both replicas for the longest lease seen + grace (leasewatch's
        # linger), which with long leases would double the scan work measured below.
        _wait(lambda: _balanced(replicas), 180, "the partitions to be shared out")

        started = time.monotonic()
        count = n - VICTIMS
        threads = RING_THREADS if networked else 1
        for i, first in enumerate(range(0, count, PER_HOLDER)):
            size = min(PER_HOLDER, count - first)
            holders.append(
                _Holder(workdir, point_url, f"h{i}-", size, lease, victim=False, timesvc=timesvc_url, threads=threads)
            )
        point.holder_processes = len(holders)
        victims = [
            _Holder(workdir, point_url, f"victim{i}-", 1, victim_lease, victim=True, timesvc=timesvc_url)
            for i in range(VICTIMS)
        ]
        # On a networked store one acquisition is a few round trips: allow 20 per second at least.
        limit = max(900, n / 20) if setup_timeout is None else setup_timeout
        try:
            _wait(lambda: all(h.held() for h in victims), 300, "the victims' locks to be held")
            left = max(1.0, limit - (time.monotonic() - started))
            _wait(lambda: all(h.held() for h in holders), left, f"{n:,} locks to be held")
        except RuntimeError:
            if setup_timeout is None:
                raise
            # The setup deadline: the holders stop taking locks and the point goes on with what they hold.
            for h in holders:
                if h.proc.poll() is None:
                    os.kill(h.proc.pid, signal.SIGUSR1)
            _wait(lambda: all(h.held() for h in holders), 300, "the holders to stop taking locks")
            held = sum(h.held_count() for h in holders) + VICTIMS
            point.errors.append(f"setup deadline {setup_timeout:g} s: {held:,} of {n:,} locks held, measured at that N")
            point.n_target, point.n = n, held
            n = held
        point.setup_s = round(time.monotonic() - started, 1)
        held_events = [e for h in holders + victims for e in _events(h.status) if e["event"] == "held"]
        point.acquire_retries = sum(int(e.get("acquire_errors", 0)) for e in held_events)
        failed = [lock_id for e in held_events for lock_id in e.get("failed", [])]
        if failed and point.n_target is None:
            point.errors.append(f"{len(failed)} ids not taken after 5 tries each ({', '.join(failed[:5])})")
            point.n_target, point.n = n, n - len(failed)
            n = point.n
        print(f"[bench]   {n:,} locks held after {point.setup_s:.0f} s", flush=True)

        # Warm-up: every lock is new to leasewatch (looked at in two scans), then steady state.
        look = max(SCAN_INTERVAL, lease / 10)
        victim_look = max(SCAN_INTERVAL, victim_lease / 10)
        time.sleep(max(6.0, min(look, MAX_WARMUP_LOOK) + 3 * SCAN_INTERVAL))
        window_start = time.monotonic()
        cpu_before = [cpu_seconds(lw.pid) or 0.0 for lw in replicas]
        holders_cpu_before = sum(cpu_seconds(h.proc.pid) or 0.0 for h in holders)
        servers = _store_server_pids() if networked else []
        servers_cpu_before = {pid: cpu_seconds(pid) for pid in servers}
        totals_before = [_totals(lw) for lw in replicas]
        requests_before = sum(h.requests() for h in holders + victims)
        scans: list[dict[str, Any]] = []
        next_sample = window_start
        revoked_at: dict[int, int] = {}
        killed = []

        store = open_store(point_url)
        try:
            victim_ids = [v.lock_ids[0] for v in victims]
            stagger = victim_lease / 3 / VICTIMS  # kill at different points of the renewal cycle
            kill_at = [window_start + 1.0 + i * stagger for i in range(VICTIMS)]
            bound = victim_lease + GRACE + victim_look
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
            # At least two look periods in the window (at most MAX_MIN_WINDOW), for the averages.
            while time.monotonic() < window_start + max(20.0, min(2 * look, MAX_MIN_WINDOW)):
                for lw in replicas:
                    last = _status(lw).get("last_scan")
                    if last:
                        scans.append(last)
                time.sleep(1.0)
        finally:
            store.close()
        elapsed = time.monotonic() - window_start
        point.window_s = round(elapsed, 1)
        point.cpu_cores = [
            round(((cpu_seconds(lw.pid) or 0.0) - b) / elapsed, 3) for lw, b in zip(replicas, cpu_before, strict=True)
        ]
        point.holders_cpu_cores = round(
            (sum(cpu_seconds(h.proc.pid) or 0.0 for h in holders) - holders_cpu_before) / elapsed, 3
        )
        if servers:
            used = [
                (cpu_seconds(pid) or 0.0) - before for pid, before in servers_cpu_before.items() if before is not None
            ]
            point.store_server_cpu_cores = round(sum(used) / elapsed, 3)
        # The victims' requests until they died are in, their last second's not: negligible (3 ids).
        holder_requests = sum(h.requests() for h in holders + victims) - requests_before
        point.holder_requests_per_id_s = round(holder_requests / n / elapsed, 5)
        point.loadavg = [round(x, 2) for x in os.getloadavg()]
        seconds = [s["seconds"] for s in scans]
        totals = [_totals(lw) for lw in replicas]
        spent = sum(t.scan_seconds - b.scan_seconds for t, b in zip(totals, totals_before, strict=True))
        scans_done = sum(t.scans - b.scans for t, b in zip(totals, totals_before, strict=True))
        looks = sum(t.looks - b.looks for t, b in zip(totals, totals_before, strict=True))
        by_op: dict[str, float] = {}
        for t, b in zip(totals, totals_before, strict=True):
            for op, value in t.requests.items():
                by_op[op] = by_op.get(op, 0.0) + value - b.requests.get(op, 0.0)
        point.leasewatch_requests_by_op = {op: round(v / elapsed, 2) for op, v in sorted(by_op.items())}
        point.leasewatch_requests_per_id_s = round(sum(by_op.values()) / n / elapsed, 5)
        point.looks_per_s = round(looks / elapsed, 1)
        lw_cpu = sum(point.cpu_cores) * elapsed
        point.cpu_us_per_look = round(1e6 * lw_cpu / looks, 1) if looks else math.nan
        point.cpu_us_per_id_s = round(1e6 * sum(point.cpu_cores) / n, 3)
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
        point.bound_s = round(victim_lease + GRACE + victim_look + point.scan_ms_max / 1000 + DUE_SLACK, 2)
        point.live_lost = sum(h.lost() for h in holders)
        revocations = [int(_status(lw)["revocations"]) for lw in replicas]
        point.revocations = sum(revocations)
        _renewal_lateness(point, holders)
        if not networked:
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
            # The dead replica's revocations as it last reported them, and the survivors' since.
            point.revocations = revocations[-1] + sum(int(_status(lw)["revocations"]) for lw in survivors)
            _renewal_lateness(point, holders)
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
        if keyspace is not None and store_url is not None:
            try:
                _drop_keyspace(store_url, keyspace)
            except Exception as exc:
                point.errors.append(f"dropping keyspace {keyspace}: {exc!r}")
    print(f"[bench]   {json.dumps(asdict(point))}", flush=True)
    return point


def _renewal_lateness(point: Point, holders: list[_Holder]) -> None:
    """The holders' renewal lateness (every renewal since each took its locks): the worst
    process's p50, p99 and max, and the least validity left at any renewal's start."""
    summaries = [h.last_alive().get("renewals", {}) for h in holders]
    summaries = [s for s in summaries if s.get("count")]
    point.renewals = sum(int(s["count"]) for s in summaries)
    if summaries:
        point.renewal_late_p50_s = max(float(s["p50_s"]) for s in summaries)
        point.renewal_late_p99_s = max(float(s["p99_s"]) for s in summaries)
        point.renewal_late_max_s = max(float(s["max_s"]) for s in summaries)
        left = [float(s["least_left_s"]) for s in summaries if s.get("least_left_s") is not None]
        point.renewal_least_left_s = min(left) if left else math.nan


def _plot(points: list[Point], path: Path, where: str = "embedded store") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, late) = plt.subplots(1, 3, figsize=(16, 4.4))
    # One series per K (and label, in a combined table); a point measured at fewer ids than asked
    # (the setup deadline) is drawn at the N it held.
    for k, label in sorted({(p.k, p.label) for p in points}):
        ours = sorted((p for p in points if (p.k, p.label) == (k, label) and p.revocation_s), key=lambda p: p.n)
        if not ours:
            continue
        name = f"K={k}" + (f", {label}" if label else "")
        ns = [p.n for p in ours]
        left.plot(ns, [p.scan_ms_mean for p in ours], marker="o", label=f"{name}: mean scan")
        left.plot(ns, [p.scan_ms_max for p in ours], marker="x", linestyle="--", label=f"{name}: max scan")
        # Beyond the lease: what leasewatch adds (grace, look period, scan), comparable across leases.
        worst = [max(p.revocation_s) - p.victim_lease for p in ours]
        right.plot(ns, worst, marker="o", label=f"{name}: worst of 3 victims")
        bounds = [p.bound_s - p.victim_lease for p in ours]
        right.plot(ns, bounds, linestyle=":", marker=".", label=f"{name}: documented bound")
        renewed = [p for p in ours if p.renewals]
        if renewed:
            late.plot([p.n for p in renewed], [p.renewal_late_p99_s for p in renewed], marker="o", label=f"{name}: p99")
            late.plot(
                [p.n for p in renewed],
                [p.renewal_late_max_s for p in renewed],
                marker="x",
                linestyle="--",
                label=f"{name}: max",
            )
    for ax in (left, right, late):
        ax.set_xscale("log")
        ax.set_xlabel("live lock ids (N)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("leasewatch scan duration (ms)")
    left.set_yscale("log")
    late.set_ylabel("holders' renewal lateness: start − due (s)")
    late.set_yscale("log")
    right.set_ylabel("last renewal → revocation, minus the victims' lease (s)")
    leases = ", ".join(sorted({f"{p.n:,}: {p.lease:g} s" for p in points}))
    fig.suptitle(f"leasewatch at scale ({where}; lease {leases})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def replot(path: Path = RESULTS_DIR / "scale.json") -> None:
    """Draw the plot again from a run's raw numbers (``scale.json``)."""
    data = json.loads(path.read_text())
    points = [Point(**p) for p in data["points"]]
    for p in points:
        p.victim_lease = p.victim_lease or p.lease  # results from before victims had their own lease
    _plot(points, path.with_suffix(".png"), data.get("store", "embedded store"))


def parse_points(text: str) -> list[tuple[int, int, float | None]]:
    """``"10000:3:600,100000:3"`` -> [(10000, 3, 600.0), (100000, 3, None)] (no lease: the default)."""
    plan: list[tuple[int, int, float | None]] = []
    for item in text.split(","):
        fields = item.strip().split(":")
        if len(fields) not in (2, 3) or not all(fields):
            raise ValueError(f"a point is N:K or N:K:LEASE, not {item!r}")
        n, k = int(fields[0]), int(fields[1])
        lease = float(fields[2]) if len(fields) == 3 else None
        if n <= VICTIMS or k < 1 or (lease is not None and lease <= 0):
            raise ValueError(f"a point needs N > {VICTIMS}, K >= 1 and a positive lease: {item!r}")
        plan.append((n, k, lease))
    return plan


def run(
    *,
    quick: bool = False,
    max_n: int | None = None,
    only_n: int | None = None,
    store_url: str | None = None,
    points: str | None = None,
    victim_lease: float | None = None,
    replication_factor: int = 3,
    setup_timeout: float | None = None,
) -> dict[str, Any]:
    networked = store_url is not None and not store_url.startswith("sqlite:")
    top = max_n or only_n or (10_000 if quick else 100_000)
    plan: list[tuple[int, int, float]]
    if points is not None:
        default = ring_lease if networked else (lambda n: 10.0 if n <= 10_000 else 60.0)
        plan = [(n, k, lease if lease is not None else default(n)) for n, k, lease in parse_points(points)]
    elif networked:
        plan = [(n, 3, ring_lease(n)) for n in (10_000, 100_000) if n <= top]
    else:
        plan = [(n, 1, 10.0) for n in (100, 1_000, 10_000) if n <= top]
        if top >= 100_000:
            plan.append((100_000, 1, 60.0))
            plan.append((100_000, 3, 60.0))
        else:
            plan.append((min(top, 10_000), 3, 10.0))
    if only_n is not None:
        plan = [p for p in plan if p[0] == only_n]
    machine = machine_info()
    points_done: list[Point] = []
    data: dict[str, Any] = {}
    for n, k, lease in plan:
        victims = victim_lease if victim_lease is not None else (min(lease, RING_VICTIM_LEASE) if networked else lease)
        with tempfile.TemporaryDirectory(prefix="chronolock-scale-") as tmp:
            points_done.append(
                run_point(
                    Path(tmp),
                    n,
                    k,
                    lease,
                    store_url=store_url,
                    victim_lease=victims,
                    replication_factor=replication_factor,
                    setup_timeout=setup_timeout,
                )
            )
        # Written after every point: a long run stopped half-way keeps what it measured.
        data = _write(
            points_done,
            machine,
            quick=quick,
            top=top,
            only_n=only_n,
            points=points,
            store_url=store_url,
            replication_factor=replication_factor,
            final=len(points_done) == len(plan),
        )
    return data


def _write(
    points_done: list[Point],
    machine: dict[str, Any],
    *,
    quick: bool,
    top: int,
    only_n: int | None,
    points: str | None,
    store_url: str | None,
    replication_factor: int,
    final: bool,
) -> dict[str, Any]:
    networked = store_url is not None and not store_url.startswith("sqlite:")
    rows = [
        [
            f"{p.n:,}" + (f" ({p.label})" if p.label else "") + (f" of {p.n_target:,}" if p.n_target else ""),
            p.k,
            f"{p.lease:g}" + ("" if p.victim_lease == p.lease else f" ({p.victim_lease:g})"),
            " / ".join(f"{x:.2f}" for x in p.loadavg),
            f"{p.setup_s:.0f}",
            p.scan_ms_mean,
            p.scan_ms_max,
            p.looked_per_scan,
            " / ".join(f"{c:.2f}" for c in p.cpu_cores),
            p.cpu_us_per_look,
            p.holders_cpu_cores,
            f"{p.holder_requests_per_id_s:.4f} / {p.leasewatch_requests_per_id_s:.4f}",
            _lateness_cell(p),
            " / ".join(f"{r:.1f}" for r in p.revocation_s) or "–",
            f"{p.bound_s:.1f}",
            p.live_lost,
            p.revocations,
            "–" if p.takeover_s is None else f"{p.takeover_s:.1f}",
            "–" if p.store_server_cpu_cores is None else f"{p.store_server_cpu_cores:.2f}",
            f"{p.store_mib:g} / {p.wal_mib:g}" if p.store == "sqlite" else "–",
            "; ".join(p.errors) or "",
        ]
        for p in points_done
    ]
    headers = [
        "N",
        "K",
        "lease s (victims')",
        "load 1/5/15 min (end)",
        "setup s",
        "scan ms mean",
        "scan ms max",
        "locks looked / scan",
        "leasewatch CPU (cores, each)",
        "leasewatch CPU µs / look",
        "holders CPU (cores)",
        "store requests / id / s (holders / leasewatch)",
        "renewal lateness s p50 / p99 / max (renewals)",
        "last renewal → revoked (s, 3 victims)",
        "bound s",
        "live holders revoked",
        "revocations",
        "take-over s (K=3)",
        "Cassandra JVMs CPU (cores)",
        "store / WAL MiB",
        "errors",
    ]
    where = (
        "embedded SQLite store"
        if not networked
        else f"{_redacted(store_url)}, RF {replication_factor}, one timesvc, holders on TimeServiceClock"
    )
    markdown = "\n\n".join(
        [
            f"### leasewatch at scale ({where}; scan 1 s, grace 2 s, partition lease 10 s)",
            markdown_table(headers, rows),
            f"Machine: {machine['cpus']} CPUs, load at start {machine['loadavg_1m_at_start']}. "
            "Bound = the victims' lease + grace + max(scan interval, lease / 10) + the longest scan seen + 0.1 s "
            "(the 50 ms due-check tick and this benchmark's 20 ms poll). Store requests per live id per second "
            "over the measuring window: the holders' (renewals, clock, all) / every leasewatch replica's "
            "(a many-rows read counts one per row). Renewal lateness: renewal start − due time (previous "
            "renewal + lease / 3), the worst holder process's.",
        ]
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    base = "scale-ring" if networked else "scale"
    full = points is not None or top >= 100_000
    name = f"{base}-{only_n}" if only_n is not None else (base if full else f"{base}-short")
    if only_n is None and final:
        _plot(points_done, RESULTS_DIR / f"{name}.png", where)
    data = {
        "benchmark": "scale",
        "quick": quick,
        "complete": final,
        "store": _redacted(store_url) if store_url else "sqlite (temporary file per point)",
        "machine": machine,
        "points": [asdict(p) for p in points_done],
    }
    write_results(name, data, markdown)
    return data


def combine(
    paths: list[Path], store_url: str, labels: list[str] | None = None, replication_factor: int = 3
) -> dict[str, Any]:
    """Write ``scale-ring.*`` again from the points of several runs' ``.json`` files (runs of one
    point each, e.g. ``--only-n``), in the order given, each labelled (``labels``, one per file);
    each point keeps its own load columns."""
    loaded = [json.loads(path.read_text()) for path in paths]
    points_done = []
    for i, data in enumerate(loaded):
        for raw in data["points"]:
            point = Point(**raw)
            if labels is not None:
                point.label = labels[i]
            points_done.append(point)
    machine = dict(loaded[0]["machine"])
    machine["runs"] = [data["machine"] for data in loaded]
    return _write(
        points_done,
        machine,
        quick=False,
        top=max(p.n for p in points_done),
        only_n=None,
        points="combined",
        store_url=store_url,
        replication_factor=replication_factor,
        final=True,
    )


def _redacted(store_url: str | None) -> str:
    from lockclient.store.url import parse_store_url

    return parse_store_url(store_url).redacted() if store_url else "sqlite"


def _lateness_cell(p: Point) -> str:
    if not p.renewals:
        return "– (0)"
    return f"{p.renewal_late_p50_s:.3f} / {p.renewal_late_p99_s:.3f} / {p.renewal_late_max_s:.3f} ({p.renewals:,})"
