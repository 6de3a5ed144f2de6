"""The review's findings, kept as a corpus: for each, the old behaviour (the one fixed function put
back) and the violation the simulator's *random search* must report against it.

Six broken promises found by review of the code landed before issues 22–24 could be modelled here
(the other two were configuration typos). Each entry below restores exactly what was fixed —
nothing is scripted: :func:`hunt` runs fresh seeds of an ordinary search profile until one of them
reports the finding's kind of violation, and says how many seeds and CPU-seconds that took
(``python -m sim --finding NAME``; ``tests/sim/test_findings.py``; the table in BENCHMARKS.md).

Two more entries are not review findings but the known broken variants of issue 27's one-round
hand-over (a release that grants the next in line): the search must catch those too.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sim.runtime import SimRuntime
from sim.search import Outcome, run_seed, tune_gc, usable_cpus

__all__ = ["FINDINGS", "Finding", "Hunt", "hunt"]


@dataclass(frozen=True)
class Finding:
    issue: int
    title: str
    profile: str
    """The search profile (sim.search.PROFILES) whose random seeds look for it."""
    kinds: tuple[str, ...]
    """The checker kinds that report it."""
    restore: Callable[[], None]
    """Puts the old behaviour back (in this process)."""
    what: str
    """What is restored, in words."""


# -- issue 23: unknown compare-and-set outcomes ------------------------------------------------------


def _restore_23_1() -> None:
    """Attempt ids gone: every compare-and-set value is what the change alone makes it, so a
    renewal's retry writes exactly what its lost first attempt wrote — the adapter then reports the
    retry applied and the lease is dated from the retry's start."""
    from leasewatch import watcher
    from lockclient import algorithm, fencing, lease, watermark
    from lockclient.store import base

    def no_attempt_id(runtime: object = None) -> str:
        return ""

    for module in (base, lease, algorithm, fencing, watermark, watcher):
        module.new_attempt_id = no_attempt_id  # type: ignore[attr-defined]


def _restore_23_2() -> None:
    """A holder whose release is pending takes "my record was replaced by the next holder's" for a
    loss (the old ``_release_tried`` covered only a record found absent)."""
    from lockclient import lease
    from lockclient.settle import Found

    def old_judge_answer(current: str | None, *, ours: str, pending: object, release_sent: bool) -> Found:
        if current == ours:
            return Found.OURS
        if current is not None and current in pending:  # type: ignore[operator]
            return Found.PENDING
        if current is None and release_sent:
            return Found.READ_END
        return Found.LOST

    lease.judge_answer = old_judge_answer  # type: ignore[attr-defined]


def _restore_23_3() -> None:
    """A grant that fails with anything but "unavailable" propagates and leaves its record: the
    old classification (WriteFailure and the other commit-step failures a plain StoreError) and the
    old grant, which settled only StoreUnavailable. (Two layers were fixed; both go back.)"""
    import sim.store as simstore
    from lockclient import algorithm
    from lockclient.errors import StoreError, StoreUnavailable
    from lockclient.store import cassandra

    original = cassandra.translate_error

    def old_translate_error(exc: BaseException, what: str) -> StoreError:
        name = type(exc).__name__
        if name in ("WriteFailure", "ServerError", "OverloadedErrorMessage"):
            return StoreError(f"Cassandra failed during {what}: {exc}")
        return original(exc, what)

    cassandra.translate_error = old_translate_error
    simstore.translate_error = old_translate_error  # type: ignore[attr-defined]
    settle = algorithm._settle

    def old_settle(services: object, attempt: object, record: object, cause: StoreError, *rest: object) -> object:
        if not isinstance(cause, StoreUnavailable):
            raise cause  # the old grant: anything but "unavailable" escaped, the record stayed
        # (``rest``: the holder column a semaphore's or read-write lock's grant settles, added since.)
        return settle(services, attempt, record, cause, *rest)  # type: ignore[arg-type]

    algorithm._settle = old_settle  # type: ignore[assignment]


# -- issue 22: global time and schedules -----------------------------------------------------------


def _restore_22_global_time() -> None:
    """The old TryUpdateGlobalTime (sim/corpus/globaltime_c056ae8.py) on every timesvc replica,
    and the old ``/now``: it answered whenever the replica was "in sync"."""
    from sim import scenario
    from sim.corpus import globaltime_c056ae8 as old

    def old_check_answerable(result: object, replica: str) -> None:
        if not getattr(result, "current", True):
            raise old.GlobalTimeNotCurrent(f"replica {replica} is not in sync with global time yet")

    setattr(scenario, "GlobalTimeUpdater", old.GlobalTimeUpdater)  # noqa: B010 - putting the old code back
    setattr(scenario, "check_answerable", old_check_answerable)  # noqa: B010


def _restore_22_3() -> None:
    """Periodic jobs planned by the host's wall clock, as APScheduler 3's interval trigger plans them
    (``datetime.now()``): a step back of a minute leaves every job waiting a minute."""
    from sim import scenario

    def wall_seconds(runtime: SimRuntime) -> Callable[[], float]:
        return lambda: runtime.wall_us() / 1e6

    scenario.schedule_clock = wall_seconds


# -- issue 27: a contended hand-over in one Paxos round -------------------------------------------------
# Not review findings: the two known ways to get the one-round hand-over wrong, kept so that the
# search is shown to catch them.


def _restore_27_second_in_line() -> None:
    """The release hands the lock to the cell right behind the releaser's own (its head read starts
    at its own ticket), not to the first in queue order: a cell with a ticket below the holder's
    (enqueued while the holder's overlapped look could not see it) is overtaken."""
    from lockclient import fairqueue
    from lockclient.store import Table
    from lockclient.store.base import ReadRow

    def behind_me(lock_id: str, start: str, own_ticket: str) -> ReadRow:
        return ReadRow(Table.QUEUE, lock_id, own_ticket, limit=2)

    fairqueue._head_read = behind_me


def _restore_27_dated_from_the_look() -> None:
    """A lock handed over is dated from the look that found it, not from the waiter's write of the
    queue-cell version the releaser read: leasewatch may have started timing the record long before."""
    from lockclient import fairqueue
    from lockclient.lease import HolderRecord, WaiterLease

    def from_the_look(waiter: WaiterLease, record: HolderRecord, looked_at: float) -> float | None:
        return looked_at

    fairqueue._adopted_since = from_the_look


FINDINGS: dict[str, Finding] = {
    "fast-clock-drags-global-time": Finding(
        22,
        "a fast clock drags global time without limit",
        "fastclocks",
        ("time",),
        _restore_22_global_time,
        "TryUpdateGlobalTime as at c056ae8 (a runaway guard against the last global value)",
    ),
    "misconfigured-replica-adopts-its-clock": Finding(
        22,
        "a replica restarted with TIMESVC_REPLICAS=1 adopts its runaway clock",
        "misconfigured",
        ("time",),
        _restore_22_global_time,
        "TryUpdateGlobalTime as at c056ae8 (a majority of one)",
    ),
    "wall-step-stops-leasewatch": Finding(
        22,
        "a wall-clock step back stops leasewatch (and timesvc's ticks)",
        "steps",
        ("liveness",),
        _restore_22_3,
        "periodic jobs planned by the wall clock (APScheduler 3)",
    ),
    "renewal-dated-from-retry": Finding(
        23,
        "a renewal's lease is dated from a retry that wrote nothing",
        "renewals",
        ("lease",),
        _restore_23_1,
        "attempt ids removed from compare-and-set values",
    ),
    "released-lock-reported-lost": Finding(
        23,
        "a lock released cleanly is reported lost",
        "leases",
        ("lost",),
        _restore_23_2,
        "lockclient.settle.judge_answer as before the fix",
    ),
    "orphaned-grant": Finding(
        23,
        "a grant that fails with anything but 'unavailable' orphans a holder record",
        "leases",
        ("abandoned",),
        _restore_23_3,
        "WriteFailure/ServerError/Overloaded classified as plain errors, and take() settling only 'unavailable'",
    ),
    "handover-to-the-second-in-line": Finding(
        27,
        "a release hands the lock to the waiter right behind the holder, over a cell ahead of the holder's",
        "mixed",
        ("fifo",),
        _restore_27_second_in_line,
        "the releaser's head read starting at its own ticket",
    ),
    "handover-dated-from-the-look": Finding(
        27,
        "a lock handed over is dated from the look that found it",
        "leases",
        ("lease",),
        _restore_27_dated_from_the_look,
        "the adopted lease dated from the waiter's look, not from its queue-cell write",
    ),
}


@dataclass
class Hunt:
    finding: str
    found: Outcome | None
    seeds: int
    cpu_s: float
    wall_s: float


def _init(name: str) -> None:
    FINDINGS[name].restore()
    tune_gc()


def _one(args: tuple[int, str]) -> Outcome:
    return run_seed(args[0], args[1])[0]


def hunt(name: str, *, base: int, max_seeds: int, max_cpu_s: float | None = None, jobs: int | None = None) -> Hunt:
    """Run seeds ``base, base + 1, ...`` of the finding's profile, with the old behaviour restored
    in the worker processes, until one reports the finding's kind of violation."""
    finding = FINDINGS[name]
    jobs = jobs or usable_cpus()
    started = time.monotonic()
    cpu = 0.0
    tried = 0
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs, initializer=_init, initargs=(name,)) as pool:
        seeds: Iterator[int] = iter(range(base, base + max_seeds))
        for outcome in pool.imap(_one, ((seed, finding.profile) for seed in seeds)):
            tried += 1
            cpu += outcome.cpu_s
            if any(v.startswith(tuple(f"[{kind}]" for kind in finding.kinds)) for v in outcome.violations):
                pool.terminate()
                return Hunt(name, outcome, tried, cpu, time.monotonic() - started)
            if max_cpu_s is not None and cpu > max_cpu_s:
                break
        pool.terminate()
    return Hunt(name, None, tried, cpu, time.monotonic() - started)
