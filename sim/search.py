"""Searching schedules: many seeds in parallel, a watchdog per seed, and shrinking a failure.

A *seed* is a schedule: it chooses the deployment's variations (:func:`config_for_seed`), the
fault schedule (:mod:`sim.nemesis`) and every interleaving and delay (:mod:`sim.world`). A seed
that fails is *shrunk* (:func:`shrink`): its fault schedule is replayed with faults removed and
shortened, as long as the run still fails, and the smallest failing schedule is printed as a
replay (``SIM_SEED=<seed> SIM_REPLAY=<file> make sim``).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import queue
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from sim.nemesis import FaultEvent
from sim.primitives import enabled
from sim.scenario import Config, Simulation

__all__ = ["Outcome", "Profile", "config_for_seed", "run_seed", "search", "shrink", "tune_gc", "usable_cpus"]

SEED_CPU_LIMIT_S = 120
"""A seed that runs longer than this (CPU seconds) is a hang: a violation of its own."""


@dataclass(frozen=True)
class Profile:
    """What a search explores: the base configuration and which parts a seed may vary."""

    name: str = "mixed"
    base: Config = field(default_factory=Config)
    vary: bool = True
    leases: tuple[float, ...] = (2.0, 3.0, 5.0)
    """The lease lengths a seed chooses from."""
    fresh: tuple[float, ...] = (0.0, 0.0, 1.0, 3.0, 10.0)
    """The ``fresh_every`` a seed chooses from: half the seeds move their lock ids on now and then."""


PROFILES: dict[str, Profile] = {
    "mixed": Profile("mixed"),
    "quiet": Profile("quiet", Config(faults="none"), vary=True),
    "clocks": Profile("clocks", Config(faults="clock,pause,crash", fault_rate=0.2)),
    "unknown": Profile("unknown", Config(faults="lossy,paxos,cut", fault_rate=0.3)),
    "processes": Profile("processes", Config(faults="pause,crash,cut", fault_rate=0.25)),
    "misconfigured": Profile("misconfigured", Config(faults="clock", fault_rate=0.2, clock_faults="misconfigured")),
    "fastclocks": Profile("fastclocks", Config(faults="clock", fault_rate=0.2, clock_faults="rate")),
    "steps": Profile("steps", Config(faults="clock,crash", fault_rate=0.25)),
    # Long holds, 10 s leases, and unknown outcomes that only one client meets (its coordinator),
    # with pauses and cut-offs: what a renewal's retry after an unknown outcome must survive.
    "renewals": Profile(
        "renewals",
        Config(duration=240.0, faults="coordinator,pause,cut", fault_rate=0.6, long_hold=0.7),
        leases=(10.0,),
        # Lock ids stay: a long hold's lock then has waiters, one of which is granted the moment
        # leasewatch revokes the holder — what shows a lease dated too late. Ids that moved on every
        # few seconds left most long holds alone; with them drawn (10ec97e), the hunt for issue 23's
        # renewal finding needed 225 seeds and more, not 11 and 27.
        fresh=(0.0,),
    ),
    "leases": Profile(
        "leases", Config(faults="lossy,paxos,cut,pause", fault_rate=0.4, long_hold=0.5), leases=(5.0, 10.0)
    ),
    # Issue 26: semaphores, read-write locks, elections, once-per-period jobs and lock events beside
    # the lock (sim.primitives): "primitives" under process pauses, crashes, cut-offs and lossy
    # networks with unknown outcomes; "primitives-clocks" under every family (clock faults and lying
    # replicas included); "primitives-quiet" adds the exact per-period check of once-per jobs (no faults).
    "primitives": Profile("primitives", Config(primitives="all", faults="pause,crash,cut,lossy", fault_rate=0.2)),
    "primitives-clocks": Profile("primitives-clocks", Config(primitives="all", faults="all")),
    "primitives-quiet": Profile("primitives-quiet", Config(primitives="all", faults="none")),
}


def config_for_seed(seed: int, profile: Profile) -> Config:
    """The deployment a seed simulates: the profile's base, varied by the seed."""
    base = profile.base
    if not profile.vary:
        return base
    rng = random.Random(f"{seed}/config")
    lease = rng.choice(profile.leases)
    if base.primitives != "lock":
        # Drawn apart from the rest, so that a lock-only profile's seeds stay what they were.
        extra = random.Random(f"{seed}/primitives")
        base = replace(base, limit=extra.choice((1, 2, 3)), period=extra.choice((0.5, 1.0, 2.0)))
    # Drawn apart too: half the seeds move their lock ids on now and then (first uses racing).
    fresh = random.Random(f"{seed}/fresh").choice(profile.fresh)
    return replace(
        base,
        fresh_every=fresh,
        quiet=max(base.quiet, 4 * lease),
        clients=rng.randint(2, 6),
        workers=rng.randint(1, 3),
        locks=rng.randint(1, 4),
        hosts=rng.randint(1, 3),
        timesvc=rng.choice((0, 1, 3, 3, 3, 5)),
        leasewatch=rng.choice((1, 2, 2, 3)),
        lease=lease,
        grace=rng.choice((0.5, 1.0)),
        hold=rng.choice((0.01, 0.05, 0.2, 1.0)),
        think=rng.choice((0.0, 0.05, 0.2)),
    )


@dataclass
class Outcome:
    """What one seed did (picklable: it crosses process boundaries)."""

    seed: int
    profile: str
    digest: str
    acquisitions: int
    virtual_s: float
    cpu_s: float
    violations: list[str]
    schedule: list[dict[str, Any]]
    ops: dict[str, int] = field(default_factory=dict)
    """Operations judged per primitive (sim.checkers.Checkers.ops)."""
    handovers: int = 0
    """Locks handed over by a release's compare-and-set (one Paxos round per hand-over)."""


class SimHang(BaseException):
    """A seed exceeded its CPU budget (an endless loop in the code under test, or a livelock).

    A BaseException, like KeyboardInterrupt: the code under test catches ``Exception`` where one
    task's bug must not stop the others (the keeper's renewals), and would swallow it there."""


def run_seed(
    seed: int,
    profile: str = "mixed",
    *,
    schedule: list[dict[str, Any]] | None = None,
    keep_history: bool = False,
    duration: float | None = None,
) -> tuple[Outcome, Simulation]:
    """Run one seed (optionally with a given fault schedule instead of the drawn one)."""
    config = config_for_seed(seed, PROFILES[profile])
    if duration is not None:
        config = replace(config, duration=duration)
    sim = Simulation(seed, config, keep_history=keep_history)
    if schedule is not None:
        sim.nemesis.events = [FaultEvent(**event) for event in schedule]
    started = time.process_time()
    hung: list[str] = []

    def hang(signum: int, frame: FrameType | None) -> None:
        # Raised in whatever is running: a task (its wrapper ends it) or the hub; either way the
        # world stops, and the hang is reported as a violation of its own.
        sim.world.stopped = True
        if not hung:
            hung.append(f"[hang] seed {seed} ran for more than {budget:g} s of CPU (a livelock or an endless loop)")
        # Again every second until the run is over: where it was raised may have swallowed it (a
        # garbage collector callback reports and drops what its code raised).
        signal.setitimer(signal.ITIMER_VIRTUAL, 1.0)
        raise SimHang(hung[0])

    signal.signal(signal.SIGVTALRM, hang)
    # The budget grows with the horizon: SEED_CPU_LIMIT_S per simulated minute of work, at least.
    budget = SEED_CPU_LIMIT_S * max(1.0, config.duration / 60.0)
    signal.setitimer(signal.ITIMER_VIRTUAL, budget)
    violations: list[str] = []
    try:
        violations = sim.run().violations
    except SimHang:
        pass
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    violations = [*hung, *violations]
    outcome = Outcome(
        seed=seed,
        profile=profile,
        digest=sim.history.sha256(),
        acquisitions=sim.stats.acquisitions,
        virtual_s=sim.end / 1e9,
        cpu_s=time.process_time() - started,
        violations=violations,
        schedule=[asdict(e) for e in sim.nemesis.events or []],
        ops=dict(sim.checkers.ops),
        handovers=sim.stats.handovers,
    )
    return outcome, sim


def usable_cpus() -> int:
    """The CPUs this process may run on (a CPU set or ``taskset`` narrows them), not the machine's:
    the default number of search workers."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _worker(args: tuple[int, str]) -> Outcome:
    return run_seed(*args)[0]


def search(
    seeds: Iterator[int],
    *,
    profile: str = "mixed",
    jobs: int | None = None,
    acquisitions: int | None = None,
    max_seeds: int | None = None,
    seconds: float | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    ops: int | None = None,
) -> list[Outcome]:
    """Run seeds in parallel until ``acquisitions`` simulated acquisitions, ``ops`` operations of every
    primitive the profile runs, ``max_seeds`` seeds or ``seconds`` of wall time — whichever comes first."""
    jobs = jobs or usable_cpus()
    outcomes: list[Outcome] = []
    started = time.monotonic()
    total = 0
    per: dict[str, int] = {}
    wanted = [p for p in enabled(PROFILES[profile].base.primitives)]
    submitted = [0]

    def more() -> bool:
        if max_seeds is not None and submitted[0] >= max_seeds:
            return False
        if acquisitions is not None and total >= acquisitions:
            return False
        if ops is not None and all(per.get(p, 0) >= ops for p in wanted):
            return False
        return seconds is None or time.monotonic() - started < seconds

    def count(outcome: Outcome) -> None:
        for primitive, n in outcome.ops.items():
            per[primitive] = per.get(primitive, 0) + n

    context = multiprocessing.get_context("spawn" if jobs > 1 else "fork")
    if jobs == 1:
        tune_gc()
        for seed in seeds:
            if not more():
                break
            submitted[0] += 1
            outcome = run_seed(seed, profile)[0]
            outcomes.append(outcome)
            total += outcome.acquisitions
            count(outcome)
            if on_outcome:
                on_outcome(outcome)
        return outcomes
    # Outcomes are taken in the order seeds finish, not the order they were sent: seeds differ in
    # cost by 10x and more, and waiting for the oldest one while the other worker has finished and
    # has nothing queued left a core idle (CI used 1.2 of its 2 cores).
    finished: queue.SimpleQueue[Outcome | BaseException] = queue.SimpleQueue()
    with context.Pool(jobs, initializer=_init_worker) as pool:
        in_flight = 0
        iterator = iter(seeds)
        while True:
            # One seed more than there are workers: a worker that finishes starts the next at once.
            while more() and in_flight < jobs + 1:
                seed = next(iterator)
                submitted[0] += 1
                pool.apply_async(_worker, ((seed, profile),), callback=finished.put, error_callback=finished.put)
                in_flight += 1
            if not in_flight:
                break
            answer = finished.get()
            in_flight -= 1
            if isinstance(answer, BaseException):
                raise answer
            outcome = answer
            outcomes.append(outcome)
            total += outcome.acquisitions
            count(outcome)
            if on_outcome:
                on_outcome(outcome)
        pool.terminate()
    return outcomes


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tune_gc()


def tune_gc() -> None:
    """Make the cyclic garbage collector cheaper for a process that only runs simulations: with
    CPython's defaults it took about a sixth of a seed's CPU time, walking the interpreter's
    imported modules and the simulation's long-lived state again and again. What is imported so
    far is moved out of its sight (``gc.freeze``), and it runs after 20,000 allocations instead of
    700. Histories do not change (a history never depends on when garbage is collected: every
    task's greenlet stays referenced by its process until the world stops — checked with the
    collector off, same digests); reference counting still frees almost everything at once."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def shrink(outcome: Outcome, *, budget_s: float = 120.0) -> Outcome:
    """A smaller fault schedule that still fails (delta debugging over the fault list, then
    shortening each fault), within ``budget_s`` of wall time."""
    deadline = time.monotonic() + budget_s
    best = outcome
    schedule = list(outcome.schedule)

    def fails(candidate: list[dict[str, Any]]) -> Outcome | None:
        result = run_seed(outcome.seed, outcome.profile, schedule=candidate)[0]
        return result if result.violations else None

    chunk = max(1, len(schedule) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        index, removed = 0, False
        while index < len(schedule) and time.monotonic() < deadline:
            candidate = schedule[:index] + schedule[index + chunk :]
            found = fails(candidate)
            if found is not None:
                schedule, best, removed = candidate, found, True
            else:
                index += chunk
        if not removed:
            chunk //= 2
    for i, event in enumerate(schedule):
        if time.monotonic() >= deadline:
            break
        shorter = [*schedule[:i], {**event, "duration": round(event["duration"] / 2, 3)}, *schedule[i + 1 :]]
        found = fails(shorter)
        if found is not None:
            schedule, best = shorter, found
    return best


def save_schedule(outcome: Outcome, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"seed-{outcome.seed}.json"
    path.write_text(
        json.dumps({"seed": outcome.seed, "profile": outcome.profile, "schedule": outcome.schedule}, indent=1)
    )
    return path
