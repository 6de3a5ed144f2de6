"""chronolock against the lock most Cassandra users write, on a real multi-node ring (issue 14).

Needs a running Cassandra 4.x/5.x ring (the benchmark never starts one):

    CHRONOLOCK_BENCH_CASSANDRA=127.0.0.1,127.0.0.2,127.0.0.3:9242 \\
    CHRONOLOCK_BENCH_RING_CTL=../shared/cassandra-modern/ring41.sh CASS_HOME=... \\
    .venv/bin/python -m bench ring

chronolock runs as users deploy it: 3 ``timesvc serve`` replicas and one ``leasewatch serve``
on the same ring (started here, on free loopback ports, stopped by PID), clients with
``TimeServiceClock`` over the three and leasewatch wake-ups.

* **Uncontended**: one process, acquire + release, p50/p99, with chronolock's round trips and
  Paxos rounds counted by its store wrapper, in three cases (:data:`CASES`: a re-take, a first
  use of a new id, an id another client used before), both locks, interleaved (issue 27).
  ``CHRONOLOCK_BENCH_RING_PARTS=uncontended`` runs only these; ``CHRONOLOCK_BENCH_RING_LABEL``
  adds a suffix to the results' file name (a run of other code, kept beside).
* **Contended** P = 5 processes, no work inside the lock, through phases: no fault; node 3
  paused (SIGSTOP); resumed; node 3 killed; restarted (only with ``..._RING_CTL``). Per phase:
  acquisitions/s, wait p50 / max, the longest time nobody held the lock while a worker waited,
  the longest same-process run, errors by type.

The naive lock: ``INSERT ... IF NOT EXISTS USING TTL 30`` to acquire (retried every 5 ms while
not applied), ``DELETE ... IF owner = ?`` to release, QUORUM / SERIAL. Not fair, not fenced; a
holder that stalls past the TTL loses it silently.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import ServiceProcess, machine_info, markdown_table, percentile, write_results

__all__ = ["run"]

PHASE_S = 20.0
QUICK_PHASE_S = 8.0


def _hosts_port() -> tuple[list[str], int]:
    target = os.environ["CHRONOLOCK_BENCH_CASSANDRA"]
    hosts, _, port = target.rpartition(":")
    return hosts.split(","), int(port or 9042)


def _keyspace(hosts: list[str]) -> str:
    return "chronolock_bench" if len(hosts) == 1 else f"chronolock_bench_rf{min(3, len(hosts))}"


def _store_url() -> str:
    hosts, port = _hosts_port()
    return f"cassandra://{','.join(hosts)}:{port}/{_keyspace(hosts)}"


def _naive_session() -> tuple[Any, Any, Any, Any]:
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    hosts, port = _hosts_port()
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(), shuffle_replicas=True),
        consistency_level=ConsistencyLevel.QUORUM,
        serial_consistency_level=ConsistencyLevel.SERIAL,
        request_timeout=2.0,
    )
    cluster = Cluster(hosts, port=port, protocol_version=5, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    session = cluster.connect()
    ks = _keyspace(hosts)
    acquire = session.prepare(f"INSERT INTO {ks}.naive_lock (id, owner) VALUES (?, ?) IF NOT EXISTS USING TTL 30")
    release = session.prepare(f"DELETE FROM {ks}.naive_lock WHERE id = ? IF owner = ?")
    return cluster, session, acquire, release


def _prepare_schema() -> None:
    from cassandra.cluster import Cluster

    from lockclient.store.cassandra_schema import create_schema

    hosts, port = _hosts_port()
    create_schema(_store_url(), replication_factor=min(3, len(hosts)))
    cluster = Cluster(hosts, port=port, protocol_version=5)
    try:
        session = cluster.connect()
        session.execute(f"CREATE TABLE IF NOT EXISTS {_keyspace(hosts)}.naive_lock (id text PRIMARY KEY, owner text)")
    finally:
        cluster.shutdown()


# -- workers (spawned processes) ----------------------------------------------------------------


def _clock() -> Any:
    from lockclient import TimeServiceClock

    return TimeServiceClock(os.environ["CHRONOLOCK_BENCH_TIMESVC_URLS"].split(","))


def _locker(store: Any, clock: Any = None) -> Any:
    """A client as deployed: global time from the timesvc replicas (``clock``: one shared by the
    lockers of one process), leasewatch wake-ups."""
    from lockclient import RemoteLocker
    from lockclient.wake import LeasewatchWaker

    waker = LeasewatchWaker(os.environ["CHRONOLOCK_BENCH_LEASEWATCH_URL"])
    return RemoteLocker(store, clock or _clock(), lease=10, waker=waker)


def _worker(kind: str, lock_id: str, out: str, stop: str, barrier: Any) -> None:
    from lockclient import ChronolockError, open_store

    records: list[dict[str, Any]] = []
    stop_file = Path(stop)
    pid = os.getpid()
    if kind == "chronolock":
        store = open_store(_store_url())
        locker = _locker(store)
        locker.clock.now_us()
        barrier.wait(timeout=120)
        while not stop_file.exists():
            invoked = time.monotonic()
            try:
                lock = locker.get_lock(lock_id, timeout=60)
            except ChronolockError as exc:
                records.append({"error": type(exc).__name__, "at": time.monotonic()})
                continue
            granted = time.monotonic()
            released_at = time.monotonic()
            lock.release()
            records.append({"pid": pid, "invoked": invoked, "granted": granted, "released": released_at})
        locker.close()
        store.close()
    else:
        cluster, session, acquire, release = _naive_session()
        barrier.wait(timeout=120)
        while not stop_file.exists():
            owner = uuid.uuid4().hex
            invoked = time.monotonic()
            try:
                while not session.execute(acquire, (lock_id, owner)).was_applied:
                    if stop_file.exists():
                        break
                    time.sleep(0.005)
                else:
                    granted = time.monotonic()
                    released_at = time.monotonic()
                    session.execute(release, (lock_id, owner))
                    records.append({"pid": pid, "invoked": invoked, "granted": granted, "released": released_at})
            except Exception as exc:  # what a user of the naive lock meets
                records.append({"error": f"{type(exc).__name__}:{getattr(exc, 'code', '')}", "at": time.monotonic()})
                time.sleep(0.05)
        cluster.shutdown()
    Path(out).write_text(json.dumps(records))


CASES = ("re-take", "first use", "used by others")
"""The uncontended cases, each measured for both locks, interleaved (one acquisition of every case
in turn, so that the machine's load falls on all of them alike):

* **re-take** — one lock id, acquired and released again and again by the same client;
* **first use** — a lock id nobody ever used (a new one for every acquisition): most ids a service
  locks (``account:42``) are taken once, or rarely;
* **used by others** — a lock id this client never used but another client took and released
  before (another process, in a deployment): chronolock's guess that the lock row does not exist
  is refused."""


class _Naive:
    def __init__(self) -> None:
        self.cluster, self.session, self.acquire_stmt, self.release_stmt = _naive_session()

    def acquire(self, lock_id: str) -> str:
        owner = uuid.uuid4().hex
        assert self.session.execute(self.acquire_stmt, (lock_id, owner)).was_applied
        return owner

    def release(self, lock_id: str, owner: str) -> None:
        self.session.execute(self.release_stmt, (lock_id, owner))

    def close(self) -> None:
        self.cluster.shutdown()


def _uncontended(n: int) -> dict[str, Any]:
    """Both locks, every case of :data:`CASES`, ``n`` acquisitions each after 20 of warm-up."""
    from lockclient import open_store

    store = open_store(_store_url())
    # One client per case, as a process of its own would be (what a client remembers of a lock is
    # its own); "others" takes and releases the ids that the "used by others" client then takes.
    # One global clock for all, as one process has: four would ask timesvc — and through it the
    # ring — four times as often as one client does.
    clock = _clock()
    lockers = {case: _locker(store, clock) for case in CASES}
    others = _locker(store, clock)
    naive, naive_other = _Naive(), _Naive()
    run_id = uuid.uuid4().hex[:8]
    samples: dict[tuple[str, str], dict[str, list[float]]] = {
        (kind, case): {"acquire": [], "total": [], "round_trips": [], "lwt_rounds": []}
        for kind in ("naive", "chronolock")
        for case in CASES
    }
    load_start = os.getloadavg()[0]
    try:
        for i in range(n + 20):
            for case in CASES:
                if case == "re-take":
                    lock_id = f"u-{run_id}-retake"
                elif case == "first use":
                    lock_id = f"u-{run_id}-new-{i}"
                else:
                    lock_id = f"u-{run_id}-used-{i}"
                    others.get_lock(lock_id).release()
                    naive_other.release(lock_id, naive_other.acquire(lock_id))
                for kind in ("naive", "chronolock"):
                    slot = samples[(kind, case)]
                    t0 = time.perf_counter()
                    if kind == "naive":
                        owner = naive.acquire(lock_id)
                        t1 = time.perf_counter()
                        naive.release(lock_id, owner)
                        trips, lwts = 1, 1
                    else:
                        lock = lockers[case].get_lock(lock_id)
                        t1 = time.perf_counter()
                        lock.release()
                        trips, lwts = lock.round_trips, lock.lwt_rounds
                    t2 = time.perf_counter()
                    if i >= 20:
                        slot["acquire"].append(t1 - t0)
                        slot["total"].append(t2 - t0)
                        slot["round_trips"].append(trips)
                        slot["lwt_rounds"].append(lwts)
    finally:
        for locker in (*lockers.values(), others):
            locker.close()
        clock.close()
        store.close()
        naive.close()
        naive_other.close()
    out: dict[str, Any] = {
        "acquisitions_per_case": n,
        "loadavg_1m_at_start": round(load_start, 2),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "cases": {},
    }
    for (kind, case), slot in samples.items():
        out["cases"].setdefault(case, {})[kind] = {
            "acquire_p50_ms": round(percentile(slot["acquire"], 50) * 1e3, 2),
            "acquire_p99_ms": round(percentile(slot["acquire"], 99) * 1e3, 2),
            "acquire_release_p50_ms": round(percentile(slot["total"], 50) * 1e3, 2),
            "acquire_round_trips": round(statistics.mean(slot["round_trips"]), 2),
            "acquire_lwt_rounds": round(statistics.mean(slot["lwt_rounds"]), 2),
        }
    return out


def _ring(*args: str) -> None:
    ctl = os.environ["CHRONOLOCK_BENCH_RING_CTL"]
    subprocess.run(["bash", ctl, *args], check=True, timeout=300, capture_output=True)


def _contended(kind: str, workdir: Path, phase_s: float, faults: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    p = 5
    barrier = ctx.Barrier(p)
    lock_id = f"c-{kind}-{uuid.uuid4().hex[:8]}"
    stop = workdir / f"stop-{lock_id}"
    outs = [workdir / f"{lock_id}-{i}.json" for i in range(p)]
    procs = [ctx.Process(target=_worker, args=(kind, lock_id, str(o), str(stop), barrier)) for o in outs]
    for proc in procs:
        proc.start()
    phases: list[tuple[str, float, float]] = []

    def phase(name: str, seconds: float) -> None:
        start = time.monotonic()
        time.sleep(seconds)
        phases.append((name, start, time.monotonic()))

    try:
        time.sleep(3)  # start-up behind the barrier
        phase("no fault", phase_s)
        if faults:
            _ring("pause", "3")
            try:
                phase("node 3 paused", phase_s)
            finally:
                _ring("resume", "3")
            phase("after resume", phase_s)
            _ring("kill", "3")
            phase("node 3 killed", phase_s)
            started = time.monotonic()
            _ring("restart", "3")
            phases.append(("node 3 restarting", started, time.monotonic()))
            phase("after restart", phase_s)
    finally:
        stop.touch()
        for proc in procs:
            proc.join(timeout=120)
            if proc.is_alive():
                proc.kill()
        if faults:
            _ring("start")
    records = [r for o in outs if o.exists() for r in json.loads(o.read_text())]
    return {"phases": [_phase_stats(records, *ph) for ph in phases]}


def _phase_stats(records: list[dict[str, Any]], name: str, start: float, end: float) -> dict[str, Any]:
    grants = sorted((r for r in records if "granted" in r and start <= r["granted"] < end), key=lambda r: r["granted"])
    waits = [r["granted"] - r["invoked"] for r in grants]
    gaps = [b["granted"] - a["released"] for a, b in itertools.pairwise(grants)]
    longest, run, previous = 0, 0, None
    for r in grants:
        run = run + 1 if r["pid"] == previous else 1
        previous = r["pid"]
        longest = max(longest, run)
    errors = Counter(r["error"] for r in records if "error" in r and start <= r["at"] < end)
    return {
        "phase": name,
        "seconds": round(end - start, 1),
        "acquisitions_per_s": round(len(grants) / max(end - start, 1e-9), 2),
        "wait_p50_ms": round(statistics.median(waits) * 1e3, 1) if waits else None,
        "wait_max_ms": round(max(waits) * 1e3, 1) if waits else None,
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "longest_run": longest,
        "errors": dict(errors),
    }


def run(*, quick: bool = False) -> dict[str, Any] | None:
    if not os.environ.get("CHRONOLOCK_BENCH_CASSANDRA"):
        print("[ring] skipped: set CHRONOLOCK_BENCH_CASSANDRA=h1,h2,h3:port (a running Cassandra 4.x/5.x ring)")
        return None
    faults = bool(os.environ.get("CHRONOLOCK_BENCH_RING_CTL"))
    phase_s = QUICK_PHASE_S if quick else PHASE_S
    _prepare_schema()
    data: dict[str, Any] = {
        "benchmark": "ring",
        "target": os.environ["CHRONOLOCK_BENCH_CASSANDRA"],
        "paxos_variant": os.environ.get("CHRONOLOCK_BENCH_PAXOS", "v1 (server default)"),
        "machine": machine_info(),
        "uncontended": {},
        "contended": {},
    }
    n = 100 if quick else 300
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"chronolock-bench-ring-{os.getpid()}"
    workdir.mkdir(exist_ok=True)
    services = [ServiceProcess("timesvc", f"ring-t{i}", _store_url(), workdir, {"REPLICAS": "3"}) for i in range(3)]
    services.append(ServiceProcess("leasewatch", "ring-lw", _store_url(), workdir, {}))
    try:
        for service in services:
            service.wait_ready(timeout=60)
        os.environ["CHRONOLOCK_BENCH_TIMESVC_URLS"] = ",".join(s.url for s in services[:3])
        os.environ["CHRONOLOCK_BENCH_LEASEWATCH_URL"] = services[3].url
        data["uncontended"] = _uncontended(n)
        print(f"[ring] uncontended: {data['uncontended']}", flush=True)
        if os.environ.get("CHRONOLOCK_BENCH_RING_PARTS", "all") != "uncontended":
            for kind in ("naive", "chronolock"):
                data["contended"][kind] = _contended(kind, workdir, phase_s, faults)
                print(f"[ring] contended {kind}: {data['contended'][kind]}", flush=True)
    finally:
        for service in services:
            service.stop()
    data["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    # One file per Paxos variant (CHRONOLOCK_BENCH_PAXOS names the ring's; v1 is 4.1's default).
    label = os.environ.get("CHRONOLOCK_BENCH_RING_LABEL", "")
    write_results(
        f"ring-paxos-{os.environ.get('CHRONOLOCK_BENCH_PAXOS', 'v1')}{'-' + label if label else ''}",
        data,
        _markdown(data),
    )
    return data


def _markdown(data: dict[str, Any]) -> str:
    unc = data["uncontended"]
    rows = []
    for case, kinds in unc["cases"].items():
        for kind, u in kinds.items():
            ratio = u["acquire_p50_ms"] / kinds["naive"]["acquire_p50_ms"] if kind != "naive" else 1.0
            rows.append(
                [
                    case,
                    kind,
                    u["acquire_p50_ms"],
                    u["acquire_p99_ms"],
                    f"{ratio:.2f}",
                    u["acquire_release_p50_ms"],
                    f"{u['acquire_round_trips']:g} ({u['acquire_lwt_rounds']:g})",
                ]
            )
    parts = [
        f"### On a Cassandra ring ({data['target']}, Paxos {data['paxos_variant']})",
        "",
        f"Uncontended, one process, {unc['acquisitions_per_case']} acquisitions per case and lock, the cases "
        f"interleaved (load average {unc['loadavg_1m_at_start']} at start, {unc['loadavg_1m_at_end']} at the end):",
        "",
        markdown_table(
            [
                "case",
                "lock",
                "acquire p50 ms",
                "acquire p99 ms",
                "p50 ÷ naive",
                "acquire+release p50 ms",
                "acquire: round trips (LWT)",
            ],
            rows,
        ),
        "",
        "Contended, P = 5 processes, no work inside the lock:",
        "",
    ]
    table = []
    for kind, result in data["contended"].items():
        for ph in result["phases"]:
            table.append(
                [
                    kind,
                    ph["phase"],
                    ph["acquisitions_per_s"],
                    ph["wait_p50_ms"] if ph["wait_p50_ms"] is not None else "–",
                    ph["wait_max_ms"] if ph["wait_max_ms"] is not None else "–",
                    ph["max_gap_s"] if ph["max_gap_s"] is not None else "–",
                    ph["longest_run"],
                    ", ".join(f"{k} × {v}" for k, v in sorted(ph["errors"].items())) or "none",
                ]
            )
    parts.append(
        markdown_table(
            ["lock", "phase", "acq/s", "wait p50 ms", "wait max ms", "longest gap s", "longest run", "errors"],
            table,
        )
        if table
        else "(not run this time: CHRONOLOCK_BENCH_RING_PARTS=uncontended)"
    )
    m = data["machine"]
    parts += [
        "",
        f"Machine: {m['cpus']} cores shared by the ring's JVMs, the workers and the benchmark; "
        f"load average {m['loadavg_1m_at_start']} at start, {m.get('loadavg_1m_at_end')} at the end.",
    ]
    return "\n".join(parts)
