"""Lock benchmarks (DESIGN.md §9): uncontended latency and the thesis experiment (thesis §6).

(a) **Uncontended** acquire+release latency on the embedded SQLite store, global time
    from a timesvc replica on loopback (``TimeServiceClock``), for both algorithms.

(b) **The thesis experiment**: P = 1, 3, 5 processes (multiprocessing, spawn) each take
    the same lock K times, holding it ~1 ms each time, for the fair queue lock and the
    backoff baseline. Reported: mean and max wait per acquisition (thesis tables 1–2),
    store operations per acquisition (``RemoteLock.store_ops``: the thesis' complaint
    that the algorithm polls the database), the longest run of consecutive acquisitions
    by one process (in fencing-token order, which is acquisition order), and each
    process's share of the acquisitions made while all P were still contending.
    The thesis used K = 5000 on a 3-node Cassandra cluster; the default here is
    K = 200 (``--quick``: 50) to keep the run bounded; ``--k`` sets it.

    The baseline's sleeps are the thesis' scaled down 10× (listing 4: up to 1 s after
    AnotherThreadIsOwner, up to 50 ms × attempt after ConcurrentAttempt; here 0.1 s and
    5 ms × attempt), so a starved process waits seconds rather than minutes.

(c) **Timelines** like thesis figures 1–2 for P = 5: x = acquisition index of that
    process, y = ms since the start, one line per process.

No leasewatch runs: cross-process waiters poll the store with capped back-off
(``poll_min``/``poll_max``), the library's behaviour without a waker.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bench.common import RESULTS_DIR, fleet, machine_info, markdown_table, percentile, write_results

__all__ = ["LocksConfig", "run"]

Algorithm = Literal["queue", "backoff"]
ALGORITHMS: tuple[Algorithm, ...] = ("queue", "backoff")


@dataclass(frozen=True)
class Variant:
    name: str
    algorithm: Algorithm
    wake: bool
    """Waiters long-poll leasewatch (and releasers notify it) instead of polling the store."""


VARIANTS: tuple[Variant, ...] = (
    Variant("queue", "queue", wake=False),
    Variant("queue+wake", "queue", wake=True),
    Variant("backoff", "backoff", wake=False),
)

# The thesis' numbers (§6, K = 5000, Cassandra on 3 servers, 3 timesvc replicas), in ms.
# Its table headers say old | new, but its text (and figure 2) say the *old* algorithm's
# maximum reaches minutes and the new one's stays under a second: the headers are swapped.
# They are listed here as the text reads them.
THESIS_MEAN_MS = {1: {"backoff": 15, "queue": 25}, 3: {"backoff": 56, "queue": 53}, 5: {"backoff": 106, "queue": 107}}
THESIS_MAX_MS = {
    1: {"backoff": 39, "queue": 146},
    3: {"backoff": 155_817, "queue": 537},
    5: {"backoff": 502_441, "queue": 605},
}


@dataclass(frozen=True)
class LocksConfig:
    k: int = 200
    processes: tuple[int, ...] = (1, 3, 5)
    uncontended_n: int = 300
    hold_s: float = 0.001
    lease_s: float = 10.0
    backoff_owner_wait_s: float = 0.1
    backoff_step_s: float = 0.005

    @classmethod
    def quick(cls, k: int | None = None) -> LocksConfig:
        return cls(k=k or 50, uncontended_n=100)

    def run_timeout(self, p: int) -> float:
        """Per-experiment bound: generous for the expected ~10 ms/acquisition, never unbounded."""
        return 30.0 + 0.05 * self.k * p


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    store_url: str
    timesvc_url: str
    leasewatch_url: str | None
    lock_id: str
    algorithm: Algorithm
    k: int
    hold_s: float
    lease_s: float
    backoff_owner_wait_s: float
    backoff_step_s: float
    deadline_s: float
    """Stop taking the lock after this many seconds (partial results are still written)."""
    out_path: str


def _worker(spec: WorkerSpec, barrier: Any) -> None:
    """One contender process: take the lock K times, write what happened as JSON."""
    from lockclient import RemoteLocker
    from lockclient.clock import TimeServiceClock
    from lockclient.errors import LockTimeout
    from lockclient.store import open_store
    from lockclient.wake import LeasewatchWaker

    store = open_store(spec.store_url)
    clock = TimeServiceClock([spec.timesvc_url])
    waker = LeasewatchWaker(spec.leasewatch_url) if spec.leasewatch_url else None
    locker = RemoteLocker(
        store,
        clock,
        lease=spec.lease_s,
        algorithm=spec.algorithm,
        backoff_owner_wait=spec.backoff_owner_wait_s,
        backoff_step=spec.backoff_step_s,
        waker=waker,
    )
    records: list[list[float | int]] = []
    error: str | None = None
    try:
        clock.now_us()  # open the HTTP connection before the clock starts
        barrier.wait(timeout=120)
        start = time.monotonic()
        deadline = start + spec.deadline_s
        for _ in range(spec.k):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = "deadline reached"
                break
            requested = time.monotonic()
            try:
                lock = locker.get_lock(spec.lock_id, timeout=remaining)
            except LockTimeout:
                error = "deadline reached while waiting"
                break
            acquired = time.monotonic()
            time.sleep(spec.hold_s)
            releasing = time.monotonic()
            lock.release()
            released = time.monotonic()
            records.append(
                [
                    requested,
                    acquired,
                    releasing,
                    released,
                    lock.fencing_token,
                    lock.store_ops,
                    lock.round_trips,
                    lock.lwt_rounds,
                    lock.release_counts.round_trips,
                ]
            )
    except Exception as exc:  # report, do not hang the parent
        error = f"{type(exc).__name__}: {exc}"
        start = time.monotonic()
    finally:
        locker.close()
        clock.close()
        store.close()
        if waker is not None:
            waker.close()
    Path(spec.out_path).write_text(
        json.dumps({"index": spec.index, "pid": os.getpid(), "start": start, "records": records, "error": error})
    )


def _uncontended(cfg: LocksConfig, store_url: str, timesvc_url: str) -> dict[str, Any]:
    from lockclient import RemoteLocker
    from lockclient.clock import TimeServiceClock
    from lockclient.store import open_store

    out: dict[str, Any] = {"n": cfg.uncontended_n}
    store = open_store(store_url)
    clock = TimeServiceClock([timesvc_url])
    try:
        clock_lat: list[float] = []
        for _ in range(cfg.uncontended_n):
            t = time.perf_counter()
            clock.now_us()
            clock_lat.append(time.perf_counter() - t)
        out["clock_now_us"] = {"p50_ms": _ms(percentile(clock_lat, 50)), "p99_ms": _ms(percentile(clock_lat, 99))}
        for algorithm in ALGORITHMS:
            locker = RemoteLocker(
                store,
                clock,
                lease=cfg.lease_s,
                algorithm=algorithm,
                backoff_owner_wait=cfg.backoff_owner_wait_s,
                backoff_step=cfg.backoff_step_s,
            )
            lock_id = f"bench-uncontended-{algorithm}-{uuid.uuid4().hex[:8]}"
            total: list[float] = []
            acquire: list[float] = []
            release: list[float] = []
            ops: list[int] = []
            trips: list[tuple[int, int, int, int]] = []
            try:
                for i in range(cfg.uncontended_n + 10):
                    t0 = time.perf_counter()
                    lock = locker.get_lock(lock_id, timeout=10)
                    t1 = time.perf_counter()
                    lock.release()
                    t2 = time.perf_counter()
                    if i >= 10:  # the first few warm caches and connections
                        total.append(t2 - t0)
                        acquire.append(t1 - t0)
                        release.append(t2 - t1)
                        ops.append(lock.store_ops)
                        release_counts = lock.release_counts
                        trips.append(
                            (lock.round_trips, lock.lwt_rounds, release_counts.round_trips, release_counts.lwt_rounds)
                        )
            finally:
                locker.close()
            out[algorithm] = {
                "p50_ms": _ms(percentile(total, 50)),
                "p99_ms": _ms(percentile(total, 99)),
                "max_ms": _ms(max(total)),
                "acquire_p50_ms": _ms(percentile(acquire, 50)),
                "acquire_p99_ms": _ms(percentile(acquire, 99)),
                "release_p50_ms": _ms(percentile(release, 50)),
                "store_ops_per_acquisition_mean": round(statistics.fmean(ops), 2),
                # Round trips on the caller's path (a group of overlapping calls counts once), of
                # which Paxos rounds: the usual cycle, and the most any cycle needed (a grant racing
                # the lock's own watermark publication, once per 64 grants at most, looks twice).
                "acquire_round_trips": statistics.mode(t[0] for t in trips),
                "acquire_lwt_rounds": statistics.mode(t[1] for t in trips),
                "release_round_trips": statistics.mode(t[2] for t in trips),
                "release_lwt_rounds": statistics.mode(t[3] for t in trips),
                "acquire_round_trips_max": max(t[0] for t in trips),
                "acquire_lwt_rounds_max": max(t[1] for t in trips),
                "cycles_with_more_round_trips": sum(t[0] > statistics.mode(x[0] for x in trips) for t in trips),
                "clock_fetches": getattr(clock, "fetches", None),
            }
            print(
                f"  [locks] uncontended {algorithm:<7} acquire+release p50 {out[algorithm]['p50_ms']} ms, "
                f"p99 {out[algorithm]['p99_ms']} ms",
                flush=True,
            )
    finally:
        clock.close()
        store.close()
    return out


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _contended(
    cfg: LocksConfig,
    store_url: str,
    timesvc_url: str,
    leasewatch_url: str,
    variant: Variant,
    p: int,
    workdir: Path,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(p)
    algorithm = variant.algorithm
    lock_id = f"bench-thesis-{variant.name}-p{p}-{uuid.uuid4().hex[:8]}"
    timeout = cfg.run_timeout(p)
    specs = [
        WorkerSpec(
            index=i,
            store_url=store_url,
            timesvc_url=timesvc_url,
            leasewatch_url=leasewatch_url if variant.wake else None,
            lock_id=lock_id,
            algorithm=algorithm,
            k=cfg.k,
            hold_s=cfg.hold_s,
            lease_s=cfg.lease_s,
            backoff_owner_wait_s=cfg.backoff_owner_wait_s,
            backoff_step_s=cfg.backoff_step_s,
            deadline_s=timeout,
            out_path=str(workdir / f"{lock_id}-{i}.json"),
        )
        for i in range(p)
    ]
    procs = [
        ctx.Process(target=_worker, args=(spec, barrier), name=f"bench-{algorithm}-{i}") for i, spec in enumerate(specs)
    ]
    wall_start = time.monotonic()
    try:
        for proc in procs:
            proc.start()
        # Start-up (imports, spawn) is outside the measured window: workers wait on the barrier.
        end_by = time.monotonic() + timeout + 150
        for proc in procs:
            proc.join(timeout=max(0.0, end_by - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                print(f"  [locks] killing worker pid {proc.pid} (over its time bound)", flush=True)
                proc.kill()  # SIGKILL to this PID
                proc.join(timeout=10)
    wall = time.monotonic() - wall_start

    results = []
    for spec in specs:
        path = Path(spec.out_path)
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"index": spec.index, "pid": None, "start": None, "records": [], "error": "no result"})
    return _analyse(variant.name, p, cfg.k, results, wall)


def _analyse(algorithm: str, p: int, k: int, results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    starts = [r["start"] for r in results if r["start"] is not None]
    t0 = min(starts) if starts else 0.0
    acquisitions: list[tuple[int, int, float, float, float, int]] = []  # token, proc, acquired, releasing, wait, ops
    trips: list[tuple[int, int, int]] = []
    for r in results:
        for requested, acquired, releasing, _released, token, ops, rt, lwt, rel_rt in r["records"]:
            acquisitions.append((int(token), r["index"], acquired, releasing, acquired - requested, int(ops)))
            trips.append((int(rt), int(lwt), int(rel_rt)))
    waits = [a[4] for a in acquisitions]
    ops = [a[5] for a in acquisitions]
    by_token = sorted(acquisitions)

    # Longest run of consecutive acquisitions by one process, in acquisition (fencing token) order.
    longest, current, previous = 0, 0, None
    for a in by_token:
        current = current + 1 if a[1] == previous else 1
        previous = a[1]
        longest = max(longest, current)

    # Sanity: hold intervals never overlap, tokens strictly increase with acquisition time.
    by_time = sorted(acquisitions, key=lambda a: a[2])
    overlaps = sum(1 for x, y in itertools.pairwise(by_time) if y[2] < x[3])
    token_order_ok = [a[0] for a in by_time] == sorted(a[0] for a in by_time) and len({a[0] for a in by_time}) == len(
        by_time
    )

    # Shares while every process was still contending (until the first one finished its K).
    finish_times = [max(rec[1] for rec in r["records"]) for r in results if r["records"]]
    window_end = min(finish_times) if len(finish_times) == p else float("inf")
    in_window = [a for a in acquisitions if a[2] <= window_end]
    shares = [sum(1 for a in in_window if a[1] == i) / len(in_window) if in_window else 0.0 for i in range(p)]
    span = (max(a[2] for a in acquisitions) - t0) if acquisitions else 0.0

    out = {
        "algorithm": algorithm,
        "processes": p,
        "k": k,
        "acquisitions": len(acquisitions),
        "complete": len(acquisitions) == p * k and not any(r["error"] for r in results),
        "errors": [r["error"] for r in results if r["error"]],
        "span_s": round(span, 3),
        "wall_s_with_startup": round(wall, 3),
        "acquisitions_per_s": round(len(acquisitions) / span, 1) if span > 0 else None,
        "wait_mean_ms": _ms(statistics.fmean(waits)) if waits else None,
        "wait_p50_ms": _ms(percentile(waits, 50)),
        "wait_p99_ms": _ms(percentile(waits, 99)),
        "wait_max_ms": _ms(max(waits)) if waits else None,
        "store_ops_mean": round(statistics.fmean(ops), 2) if ops else None,
        "store_ops_p99": percentile(ops, 99) if ops else None,
        "store_ops_max": max(ops) if ops else None,
        "round_trips_mean": round(statistics.fmean(t[0] for t in trips), 2) if trips else None,
        "lwt_rounds_mean": round(statistics.fmean(t[1] for t in trips), 2) if trips else None,
        "release_round_trips_max": max(t[2] for t in trips) if trips else None,
        "longest_run": longest,
        "shares_while_all_contend": [round(s, 3) for s in shares],
        "overlapping_holds": overlaps,
        "tokens_in_time_order": token_order_ok,
        "timeline": {
            str(r["index"]): [round((rec[1] - t0) * 1e3, 3) for rec in r["records"]] for r in results if r["records"]
        },
    }
    print(
        f"  [locks] {algorithm:<7} P={p}: {len(acquisitions)} acquisitions in {span:.1f} s, wait mean "
        f"{out['wait_mean_ms']} ms max {out['wait_max_ms']} ms, store ops/acq {out['store_ops_mean']}, "
        f"longest run {longest}, overlaps {overlaps}",
        flush=True,
    )
    return out


def _plot(run: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for index, times in sorted(run["timeline"].items(), key=lambda kv: int(kv[0])):
        ax.plot(range(1, len(times) + 1), times, linewidth=1.2, label=f"process {int(index) + 1}")
    ax.set_xlabel("acquisition index (per process)")
    ax.set_ylabel("ms since the start")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    unc = data["uncontended"]
    runs = {(r["algorithm"], r["processes"]): r for r in data["contended"]}
    ps = cfg["processes"]

    def cell(algorithm: str, p: int, key: str) -> object:
        r = runs.get((algorithm, p))
        if r is None or r[key] is None:
            return "–"
        value = r[key]
        return f"{value:,.0f}" if isinstance(value, float) and value >= 100 else value

    def mark(algorithm: str, p: int) -> str:
        r = runs.get((algorithm, p))
        return "" if r is None or r["complete"] else " (incomplete)"

    parts = [
        "### Lock acquisition (embedded SQLite store, timesvc on loopback)",
        "",
        f"Uncontended: one process, {unc['n']} acquire+release cycles per algorithm "
        f"(global time from timesvc: `now_us()` p50 {unc['clock_now_us']['p50_ms']} ms, "
        f"p99 {unc['clock_now_us']['p99_ms']} ms).",
        "",
        markdown_table(
            [
                "algorithm",
                "acquire+release p50 ms",
                "p99 ms",
                "max ms",
                "acquire p50 ms",
                "release p50 ms",
                "store ops / acq",
                "acquire: round trips (of which LWT)",
                "release: round trips (of which LWT)",
            ],
            [
                [
                    a,
                    unc[a]["p50_ms"],
                    unc[a]["p99_ms"],
                    unc[a]["max_ms"],
                    unc[a]["acquire_p50_ms"],
                    unc[a]["release_p50_ms"],
                    unc[a]["store_ops_per_acquisition_mean"],
                    f"{unc[a]['acquire_round_trips']} ({unc[a]['acquire_lwt_rounds']})"
                    + (
                        f"; {unc[a]['acquire_round_trips_max']} ({unc[a]['acquire_lwt_rounds_max']}) "
                        f"in {unc[a]['cycles_with_more_round_trips']} of {cfg['uncontended_n']}"
                        if unc[a].get("cycles_with_more_round_trips")
                        else ""
                    ),
                    f"{unc[a]['release_round_trips']} ({unc[a]['release_lwt_rounds']})",
                ]
                for a in ALGORITHMS
            ],
        ),
        "",
        "Round trips are sequential store round trips on the caller's path — a group of calls that "
        "overlap counts once (they overlap on Cassandra; on the embedded store they run one after the "
        "other in microseconds) — counted by the store wrapper `lockclient.store.counting`; the same "
        "algorithm makes the same calls on every store. A queue grant that races its lock's "
        "watermark publication (at most once per 64 grants, `lockclient/watermark.py`) looks twice. "
        "`now_us()` is extrapolated between timesvc "
        f"answers: the queue lock's {cfg['uncontended_n'] + 10} acquisitions asked timesvc "
        f"{unc['queue'].get('clock_fetches', '?')} times.",
        "",
        f"### The thesis experiment: P processes each take one lock K = {cfg['k']} times "
        f"(thesis: K = 5000), holding it {cfg['hold_s'] * 1e3:g} ms",
        "",
        f"Backoff baseline sleeps scaled 10× down from the thesis: up to {cfg['backoff_owner_wait_s']:g} s after "
        f"AnotherThreadIsOwner (thesis 1 s), up to {cfg['backoff_step_s'] * 1e3:g} ms × attempt after "
        "ConcurrentAttempt (thesis 50 ms). No leasewatch: waiters poll the store with capped back-off. "
        "Thesis columns: 3-node Cassandra, K = 5000; its table headers are swapped relative to its text, "
        "shown here as the text reads.",
        "",
        "Table 1 — mean wait per acquisition, ms (queue: waiters poll the store; queue + wake-ups: waiters "
        "long-poll a leasewatch process and releasers notify it):",
        "",
        markdown_table(
            ["P", "backoff (baseline)", "queue (fair)", "queue + wake-ups", "thesis backoff", "thesis queue"],
            [
                [
                    p,
                    f"{cell('backoff', p, 'wait_mean_ms')}{mark('backoff', p)}",
                    f"{cell('queue', p, 'wait_mean_ms')}{mark('queue', p)}",
                    f"{cell('queue+wake', p, 'wait_mean_ms')}{mark('queue+wake', p)}",
                    THESIS_MEAN_MS.get(p, {}).get("backoff", "–"),
                    THESIS_MEAN_MS.get(p, {}).get("queue", "–"),
                ]
                for p in ps
            ],
        ),
        "",
        "Table 2 — max wait per acquisition, ms:",
        "",
        markdown_table(
            ["P", "backoff (baseline)", "queue (fair)", "queue + wake-ups", "thesis backoff", "thesis queue"],
            [
                [
                    p,
                    f"{cell('backoff', p, 'wait_max_ms')}{mark('backoff', p)}",
                    f"{cell('queue', p, 'wait_max_ms')}{mark('queue', p)}",
                    f"{cell('queue+wake', p, 'wait_max_ms')}{mark('queue+wake', p)}",
                    f"{THESIS_MAX_MS[p]['backoff']:,}" if p in THESIS_MAX_MS else "–",
                    f"{THESIS_MAX_MS[p]['queue']:,}" if p in THESIS_MAX_MS else "–",
                ]
                for p in ps
            ],
        ),
        "",
        "Details — store operations per acquisition (from `RemoteLock.store_ops`, acquisition only; a release "
        "adds 2–3), the longest run of consecutive acquisitions by one process (fencing-token order), and "
        "each process's share of the acquisitions made while all P were still contending (fair = 1/P):",
        "",
        markdown_table(
            [
                "algorithm",
                "P",
                "acq",
                "acq/s",
                "wait p50 ms",
                "wait p99 ms",
                "store ops/acq mean",
                "p99",
                "max",
                "round trips/acq (LWT)",
                "longest run",
                "shares (min–max)",
                "overlaps",
            ],
            [
                [
                    a,
                    p,
                    r["acquisitions"],
                    r["acquisitions_per_s"] or "–",
                    r["wait_p50_ms"],
                    r["wait_p99_ms"],
                    r["store_ops_mean"],
                    r["store_ops_p99"],
                    r["store_ops_max"],
                    f"{r['round_trips_mean']} ({r['lwt_rounds_mean']})",
                    r["longest_run"],
                    (
                        f"{min(r['shares_while_all_contend']):.0%}–{max(r['shares_while_all_contend']):.0%}"
                        if r["shares_while_all_contend"]
                        else "–"
                    ),
                    r["overlapping_holds"],
                ]
                for a in (v.name for v in VARIANTS)
                for p in ps
                if (r := runs.get((a, p))) is not None
            ],
        ),
        "",
        "Timelines for P = 5 (thesis figures 1–2): `timeline-queue.png`, `timeline-backoff.png`.",
        "",
        f"Machine: {data['machine']['cpus']} cores (shared by the P workers, timesvc and anything else running), "
        f"Python {data['machine']['python']}, load average {data['machine']['loadavg_1m_at_start']} at start.",
    ]
    errors = [f"{r['algorithm']} P={r['processes']}: {r['errors']}" for r in data["contended"] if r["errors"]]
    if errors:
        parts += ["", "Errors: " + "; ".join(errors)]
    return "\n".join(parts)


def run(*, quick: bool = False, k: int | None = None) -> dict[str, Any]:
    cfg = LocksConfig.quick(k) if quick else LocksConfig(k=k or LocksConfig.k)
    data: dict[str, Any] = {"benchmark": "locks", "quick": quick, "config": asdict(cfg), "machine": machine_info()}
    print(f"[locks] {'quick' if quick else 'full'} run: {cfg}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-locks-") as tmp:
        workdir = Path(tmp)
        store_url = f"sqlite:///{workdir / 'cells.db'}"
        with fleet(workdir) as f:
            timesvc = f.timesvc(store_url, "bench-locks-timesvc")
            leasewatch = f.leasewatch(store_url, "bench-locks-leasewatch")
            timesvc.wait_ready()
            leasewatch.wait_ready()
            data["uncontended"] = _uncontended(cfg, store_url, timesvc.url)
            data["contended"] = []
            for variant in VARIANTS:
                for p in cfg.processes:
                    data["contended"].append(
                        _contended(cfg, store_url, timesvc.url, leasewatch.url, variant, p, workdir)
                    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for run_data in data["contended"]:
        if run_data["processes"] == max(cfg.processes) and run_data["algorithm"] != "queue+wake":
            algorithm = run_data["algorithm"]
            name = "fair queue lock" if algorithm == "queue" else "backoff baseline (sleeps scaled 10× down)"
            _plot(
                run_data,
                RESULTS_DIR / f"timeline-{algorithm}.png",
                f"{name}: P = {run_data['processes']}, K = {cfg.k}; each line one process",
            )
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    write_results("locks", data, _markdown(data))
    return data
