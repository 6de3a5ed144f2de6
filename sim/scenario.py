"""One simulated deployment: timesvc replicas, leasewatch replicas and lock clients, all
running the real code (:mod:`lockclient`, :mod:`leasewatch.watcher`,
:mod:`leasewatch.partitions`, :class:`lockclient.globaltime.GlobalTimeUpdater`) on the
simulated runtime, store and network, under a seeded schedule of faults.

:class:`Simulation` builds it from a :class:`Config` and a seed, runs the workload and the
fault schedule (:mod:`sim.nemesis`), then a quiet phase, and hands the history to the
checkers (:mod:`sim.checkers`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import httpx

from leasewatch.partitions import PartitionLeases, PartitionStatus
from leasewatch.watcher import Revocation, Watcher
from lockclient.clock import TimeServiceClock
from lockclient.errors import ChronolockError, LockCancelled, LockTimeout
from lockclient.fencing import FencedResource, StaleFencingToken
from lockclient.globaltime import GlobalTimeNotEstablished, GlobalTimeUpdater, check_answerable
from lockclient.lease import HolderRecord, parse_fence
from lockclient.locker import RemoteLock, RemoteLocker
from lockclient.lockid import owner_prefix, split_row
from lockclient.runtime import Event
from lockclient.schedule import PeriodicSchedule
from sim.history import History
from sim.primitives import WORKER_PRIMITIVES, Primitives, enabled
from sim.runtime import SimRuntime
from sim.store import Network, SimCells, SimStoreClient
from sim.wakeups import SimWakeups, WakeupHost
from sim.world import NS, Process, Waiter, World

__all__ = ["Config", "Simulation"]

DUE_CHECK_S = 0.05


@dataclass(frozen=True)
class Config:
    """What one simulated run deploys and does. Times in seconds of virtual time."""

    duration: float = 60.0
    """The workload and the faults run this long ..."""
    quiet: float = 20.0
    """... then a quiet phase (no new faults, everything healed) after which liveness is judged."""
    clients: int = 4
    workers: int = 2
    """Concurrent get_lock loops per client process."""
    locks: int = 3
    fresh_every: float = 0.0
    """Every this many seconds (of virtual time) the lock ids move on to new ones, ``L<i>g<n>``, which
    no process used before: every client's next acquisition of each is a first use, racing the
    others' (issue 27: a first use sends its grant with the enqueue). 0: the ids stay ``L<i>``."""
    hosts: int = 2
    timesvc: int = 3
    """timesvc replicas (0: clients take global time from the store, as embedded use does)."""
    leasewatch: int = 2
    lease: float = 3.0
    grace: float = 1.0
    scan_interval: float = 0.5
    partition_lease: float = 3.0
    max_skew: float = 1.0
    tick: float = 0.5
    hold: float = 0.2
    """Longest time a worker holds a lock (uniform from 0) ..."""
    long_hold: float = 0.03
    """... except this share of holds, which last 1–3 leases: the lease is renewed meanwhile (the
    keeper, its batches, renewals whose answers are lost)."""
    think: float = 0.2
    mono_ppm: float = 500.0
    """Monotonic clocks run within ±this many ppm of real time."""
    faults: str = "all"
    """Which fault families the nemesis draws from (sim.nemesis.FAMILIES), comma separated, or "none"."""
    fault_rate: float = 0.15
    """Fault events per simulated second."""
    clock_faults: str = "step,rate,stop,misconfigured"
    """Which clock faults the ``clock`` family draws (sim.nemesis)."""
    resources: bool = True
    """Fenced writes to a FencedResource per lock while holding it."""
    primitives: str = "lock"
    """What the clients use (sim.primitives): comma separated among lock, semaphore, rwlock, election,
    once, watch — or "all"."""
    limit: int = 2
    """A semaphore's permits; a read-write lock's max_readers."""
    period: float = 1.0
    """Once-per-period jobs: cron fires every this many seconds of each host's wall clock."""


@dataclass
class Stats:
    acquisitions: int = 0
    try_busy: int = 0
    timeouts: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    releases: int = 0
    lost: int = 0
    revocations: int = 0
    fenced_writes: int = 0
    stale_writes: int = 0
    now_reads: int = 0
    faults: int = 0
    handovers: int = 0
    """Locks handed over in one Paxos round: a release's compare-and-set that granted the next."""


class Simulation:
    def __init__(self, seed: int, config: Config | None = None, *, keep_history: bool = True) -> None:
        from sim.checkers import Checkers
        from sim.nemesis import Nemesis

        self.seed = seed
        self.config = config or Config()
        self.world = World(seed)
        self.history = History(keep=keep_history)
        self.cells = SimCells(self.world)
        self.network = Network(self.world)
        self.hosts = [WakeupHost() for _ in range(max(1, self.config.hosts))]
        self.stats = Stats()
        self.checkers = Checkers(self)
        self.cells.on_cas = self.checkers.on_cas
        self.cells.on_write = self.checkers.on_write
        self.timesvc: list[TimesvcReplica] = []
        self.leasewatch: list[LeasewatchReplica] = []
        self.clients: list[Client] = []
        self._ops = 0
        self.end_of_work = int(self.config.duration * NS)
        self.end = self.end_of_work + int(self.config.quiet * NS)
        self.nemesis = Nemesis(self)

    # -- building ---------------------------------------------------------------------------------

    def new_process(self, name: str, host: int, **clock: Any) -> Process:
        rng = self.world.rng
        ppm = self.config.mono_ppm
        clock.setdefault("mono_rate", rng.uniform(-ppm, ppm) / 1e6)
        return Process(self.world, name, host=f"h{host}", **clock)

    def store_for(self, process: Process) -> SimStoreClient:
        return SimStoreClient(self.cells, self.network, process)

    def record(self, what: str, /, **fields: object) -> None:
        self.history.record(self.world.now, what, **fields)

    def next_op(self) -> int:
        self._ops += 1
        return self._ops

    def build(self) -> None:
        c = self.config
        for i in range(c.timesvc):
            self.timesvc.append(TimesvcReplica(self, f"ts{i}", host=i % len(self.hosts)))
        for i in range(c.leasewatch):
            self.leasewatch.append(LeasewatchReplica(self, f"lw{i}", host=i % len(self.hosts)))
        for i in range(c.clients):
            self.clients.append(Client(self, f"c{i}", host=i % len(self.hosts)))

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> Report:
        with _quiet_logs():
            try:
                self.build()
                self.nemesis.schedule()
                self.world.run(self.end)
                self.checkers.finish()
            finally:
                self.world.stop()
        return Report(
            seed=self.seed,
            digest=self.history.sha256(),
            events=self.history.count,
            violations=list(self.checkers.violations) + list(self.world.failures),
            stats=self.stats,
            virtual_s=self.end / NS,
        )


@dataclass
class Report:
    seed: int
    digest: str
    events: int
    violations: list[str]
    stats: Stats
    virtual_s: float

    @property
    def ok(self) -> bool:
        return not self.violations


@contextmanager
def _quiet_logs() -> Iterator[None]:
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


# -- timesvc ----------------------------------------------------------------------------------------


class TimesvcReplica:
    """One ``timesvc serve``: the tick loop and ``/now`` (TryUpdateGlobalTime on demand)."""

    def __init__(self, sim: Simulation, name: str, *, host: int, configured: int | None = None) -> None:
        self.sim = sim
        self.name = name
        self.host = host
        self.configured = configured if configured is not None else sim.config.timesvc
        self.url = f"http://{name}.sim"
        self.lying = False
        """A faulty replica answering absurd times (the nemesis' ``lie``); its answers are not judged."""
        self.incarnation = 0
        self.start()

    def start(self, **clock: Any) -> None:
        self.incarnation += 1
        sim, c = self.sim, self.sim.config
        self.process = sim.new_process(f"{self.name}#{self.incarnation}", self.host, **clock)
        rt = self.process.runtime
        self.updater = GlobalTimeUpdater(
            sim.store_for(self.process),
            replica_id=self.name,
            max_skew=c.max_skew,
            replicas=self.configured,
            stale_after=max(4 * c.tick, 1.0),
            wall_us=rt.wall_us,
            monotonic_ns=rt.monotonic_ns,
            runtime=rt,
        )
        schedule = PeriodicSchedule()
        schedule.add("tick", c.tick, first_at=schedule_clock(rt)())
        self.process.spawn(partial(run_schedule, self.process, schedule, {"tick": self._tick}), "schedule")

    def _tick(self) -> None:
        self.updater.update(report_clock=True)

    def now(self) -> int:
        """``GET /now`` (timesvc.app.TimeService.now): 503 while the replica cannot vouch for it."""
        result = self.updater.update()
        check_answerable(result, self.name)
        return result.now_us


def schedule_clock(runtime: SimRuntime) -> Callable[[], float]:
    """The clock the services' periodic jobs are planned by: the monotonic clock
    (lockclient.schedule runs on the event loop's ``loop.time()``). Until issue 22 they were
    APScheduler 3 jobs planned by ``datetime.now()`` — the wall clock (sim/findings.py puts that back)."""
    return runtime.monotonic


def run_schedule(process: Process, schedule: PeriodicSchedule, jobs: dict[str, Callable[[], None]]) -> None:
    """:func:`lockclient.schedule.run_schedule` for a simulated process: the same PeriodicSchedule,
    each due job a task of its own, sleeping until the next is due — on :func:`schedule_clock`."""
    rt = process.runtime
    clock = schedule_clock(rt)
    changed = rt.event()

    def run(name: str) -> None:
        try:
            jobs[name]()
        except ChronolockError:
            pass  # logged by the service; the job keeps its schedule
        finally:
            schedule.done(name, clock())
            changed.set()

    while True:
        changed.clear()
        for name in schedule.due(clock()):
            process.spawn(partial(run, name), name)
        next_at = schedule.next_at()
        changed.wait(None if next_at is None else max(0.0, next_at - clock()))


class SimTimesvcTransport(httpx.BaseTransport):
    """HTTP from one client process to the simulated timesvc replicas, over the simulated network."""

    def __init__(self, sim: Simulation, client: Process) -> None:
        self.sim = sim
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sim, world, client = self.sim, self.sim.world, self.client
        host = request.url.host
        replica = next((r for r in sim.timesvc if host == f"{r.name}.sim"), None)
        net = sim.network
        invoked = world.now
        waiter = Waiter(world)
        answer: list[tuple[int, str]] = []
        lied: list[bool] = []

        def arrive() -> None:
            if replica is None or replica.process.dead:
                world.after(net.delay(), lambda: waiter.fire(True))  # connection refused
                answer.append((0, "refused"))
                return
            target = replica

            def serve() -> None:
                try:
                    value = target.now()
                except GlobalTimeNotEstablished as exc:
                    answer.append((503, json.dumps({"detail": str(exc)})))
                except ChronolockError as exc:
                    answer.append((503, json.dumps({"detail": f"global time unavailable: {exc}"})))
                else:
                    if target.lying:
                        value = 10**20 + value  # an absurd answer (issue 22, finding 4)
                    answer.append((200, json.dumps({"now_us": value, "replica": target.name})))
                    lied.append(target.lying)
                world.after(net.delay(), lambda: waiter.fire(True))

            target.process.spawn(serve, "now")

        world.after(net.delay(), arrive)
        timeout = float(request.extensions.get("timeout", {}).get("read") or 2.0)
        if not waiter.wait(client.real_delay_ns(timeout), False) or not answer:
            sim.record("now", client=client.name, ok=0, invoked=invoked)
            raise httpx.ReadTimeout("simulated timeout", request=request)
        status, body = answer[0]
        if status == 0:
            raise httpx.ConnectError("simulated connection refused", request=request)
        if status == 200:
            value = json.loads(body)["now_us"]
            sim.stats.now_reads += 1
            if not any(lied):
                sim.checkers.on_now(client.name, invoked, world.now, value)
        return httpx.Response(status, content=body.encode(), headers={"content-type": "application/json"})


# -- leasewatch --------------------------------------------------------------------------------------


class LeasewatchReplica:
    """One ``leasewatch serve``: the scan, due-check and partition jobs on one watcher."""

    def __init__(self, sim: Simulation, name: str, *, host: int) -> None:
        self.sim = sim
        self.name = name
        self.host = host
        self.incarnation = 0
        self.start()

    def start(self, **clock: Any) -> None:
        self.incarnation += 1
        sim, c = self.sim, self.sim.config
        self.process = sim.new_process(f"{self.name}#{self.incarnation}", self.host, **clock)
        rt = self.process.runtime
        store = sim.store_for(self.process)
        self.watcher = Watcher(
            store,
            grace=c.grace,
            orphan_after=4 * c.lease,
            replica_id=self.name,
            scan_interval=c.scan_interval,
            on_revoke=self._revoked,
            runtime=rt,
        )
        watcher = self.watcher
        self.partitions = PartitionLeases(
            store,
            self.name,
            lease=c.partition_lease,
            grace=c.grace,
            linger=lambda: watcher.longest_lease + c.grace + 3 * c.scan_interval,
            runtime=rt,
        )
        self.status: PartitionStatus | None = None
        # leasewatch.app's jobs that the locks depend on, on their periods (the page's trends, the
        # store's garbage collection and the timesvc poll are not simulated).
        schedule = PeriodicSchedule()
        now = schedule_clock(rt)()
        schedule.add("scan", c.scan_interval, first_at=now)
        schedule.add("refresh", min(c.scan_interval, c.partition_lease / 6), first_at=now)
        schedule.add("due", DUE_CHECK_S, first_at=now)
        jobs = {"scan": self._scan, "refresh": self._refresh, "due": self._due}
        self.process.spawn(partial(run_schedule, self.process, schedule, jobs), "schedule")

    def _revoked(self, event: Revocation) -> None:
        self.sim.stats.revocations += 1
        self.sim.record("revoked", by=self.name, lock=event.lock_id, owner=event.owner, holder=int(event.holder))

    def _refresh(self) -> None:
        self.status = self.partitions.refresh()

    def _scan(self) -> None:
        if self.status is None:
            self._refresh()
        assert self.status is not None
        self.watcher.scan(self.status.watching)

    def _due(self) -> None:
        due = self.watcher.next_due()
        if due is not None and due <= self.process.runtime.monotonic():
            self.watcher.check_due()


# -- lock clients ------------------------------------------------------------------------------------


class Client:
    """A process using the library: ``workers`` loops of get_lock / try_get_lock, fenced writes,
    release — the way an application uses it."""

    def __init__(self, sim: Simulation, name: str, *, host: int) -> None:
        self.sim = sim
        self.name = name
        self.host = host
        self.incarnation = 0
        self.start()

    def start(self, **clock: Any) -> None:
        self.incarnation += 1
        sim, c = self.sim, self.sim.config
        self.process = sim.new_process(f"{self.name}#{self.incarnation}", self.host, **clock)
        rt = self.process.runtime
        self.store = sim.store_for(self.process)
        clock_source = None
        if sim.timesvc:
            transport = SimTimesvcTransport(sim, self.process)
            clock_source = TimeServiceClock([r.url for r in sim.timesvc], timeout=2.0, transport=transport, runtime=rt)
        self.locker = RemoteLocker(
            self.store,
            clock_source,
            lease=c.lease,
            runtime=rt,
            wakeups=SimWakeups(self.process, sim.hosts[self.host]),
            allow_store_clock=True,
            # A simulated process ends in virtual time; the interpreter's exit is not its exit.
            release_at_exit=False,
        )
        self.resources = {f"L{i}": FencedResource(self.store, f"res-L{i}", runtime=rt) for i in range(c.locks)}
        chosen = enabled(c.primitives)
        self.work = Primitives(self)
        self.kinds = [p for p in chosen if p in WORKER_PRIMITIVES]
        for w in range(c.workers if self.kinds else 0):
            self.process.spawn(self._work, f"worker{w}")
        if "once" in chosen:
            for i in range(c.locks):
                self.process.spawn(partial(self.work.cron, f"J{i}"), f"cron-J{i}")
        if "watch" in chosen:
            watched: tuple[tuple[str, Literal["lock", "semaphore", "rwlock"], str], ...] = (
                ("L0", "lock", "lock"),
                ("S0", "semaphore", "semaphore"),
                ("E0", "lock", "election"),
                ("R0", "rwlock", "rwlock"),
                ("J0", "lock", "once"),
            )
            targets = [(name, kind) for name, kind, needs in watched if needs in chosen]
            if targets:
                index = int(self.name.lstrip("c") or 0)
                name, kind = targets[index % len(targets)]
                self.process.spawn(partial(self.work.watch, name, kind), f"watch-{name}")

    def _work(self) -> None:
        sim, c, process = self.sim, self.sim.config, self.process
        rt, rng = process.runtime, process.rng
        while sim.world.now < sim.end_of_work:
            kind = self.kinds[0] if len(self.kinds) == 1 else rng.choice(self.kinds)
            if kind == "lock":
                self._lock_op()
            else:
                getattr(self.work, kind)()
                rt.sleep(rng.uniform(0, c.think))

    def _lock_op(self) -> None:
        sim, c, process = self.sim, self.sim.config, self.process
        rt, rng = process.runtime, process.rng
        locker = self.locker
        lock_id = f"L{rng.randrange(c.locks)}"
        if c.fresh_every > 0:
            lock_id += f"g{int(sim.world.now / (c.fresh_every * NS))}"
        op = sim.next_op()
        trying = rng.random() < 0.15
        timeout = None if trying else rng.choice((1.0, 5.0, 30.0, 30.0, 60.0))
        sim.record("invoke", op=op, client=process.name, lock=lock_id, mode="try" if trying else "get", timeout=timeout)
        sim.checkers.invoked(op, process, lock_id, blocking=not trying)
        cancel = None
        if not trying and rng.random() < 0.1:
            # The caller gives up on its own (a cancel event set from another task).
            cancel = rt.event()
            process.spawn(partial(_cancel_after, rt, cancel, rng.uniform(0, 2.0)), "canceller")
        try:
            lock = locker.try_get_lock(lock_id) if trying else locker.get_lock(lock_id, timeout, cancel=cancel)
        except LockTimeout:
            sim.stats.timeouts += 1
            sim.record("timeout", op=op)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op)
            return
        except LockCancelled:
            sim.record("cancelled", op=op)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op)
            return
        except ChronolockError as exc:
            kind = type(exc).__name__
            sim.stats.errors[kind] = sim.stats.errors.get(kind, 0) + 1
            sim.record("error", op=op, error=kind)
            sim.checkers.came_back_empty(op, owner_prefix(runtime=rt))
            sim.checkers.completed(op, error=exc)
            rt.sleep(rng.uniform(0, c.think))
            return
        sim.checkers.completed(op)
        if lock is None:
            sim.stats.try_busy += 1
            sim.record("busy", op=op)
            rt.sleep(rng.uniform(0, c.think))
            return
        self._hold(op, lock_id, lock)
        rt.sleep(rng.uniform(0, c.think))

    def _hold(
        self,
        op: int,
        lock_id: str,
        lock: RemoteLock,
        *,
        mode: str = "lock",
        primitive: str | None = "lock",
        write: bool = True,
        release: Callable[[], bool] | None = None,
        run_for: float | None = None,
        once: str | None = None,
    ) -> None:
        """Hold a granted lock (or permit, read or write lock, term): fenced writes through the row's
        resource (``write``), or just ``run_for`` seconds (a once-per job); then release it (``release``:
        e.g. an election's resign)."""
        sim, c, process = self.sim, self.sim.config, self.process
        rt, rng = process.runtime, process.rng
        if primitive == "lock":
            sim.stats.acquisitions += 1
        state = sim.checkers.granted(op, self, lock_id, lock, mode=mode, primitive=primitive)
        if once is not None:
            sim.checkers.once_ran(once, state)
        lock.on_lost(lambda reason: sim.checkers.lost(state, reason))
        if run_for is not None:
            rt.sleep(run_for)
        else:
            writes = rng.randint(0, 2) if c.resources and write else 0
            hold = rng.uniform(c.lease, 3 * c.lease) if rng.random() < c.long_hold else rng.uniform(0, c.hold)
            if sim.world.now >= sim.end_of_work:
                hold = min(hold, c.hold)  # the quiet phase drains the queues
            resource = self._resource(lock_id) if writes else None
            for k in range(writes):
                rt.sleep(rng.uniform(0, hold / (writes + 1)))
                if not lock.held:
                    break
                assert resource is not None
                try:
                    resource.write(lock.fencing_token, "v", f"{lock.owner}:{k}", holder=lock.owner, timeout=2.0)
                    sim.stats.fenced_writes += 1
                    sim.checkers.fenced_write(state, ok=True)
                except StaleFencingToken:
                    sim.stats.stale_writes += 1
                    sim.checkers.fenced_write(state, ok=False)
                except ChronolockError as exc:
                    sim.record("write_error", owner=lock.owner, error=type(exc).__name__)
            rt.sleep(rng.uniform(0, hold / (writes + 1)))
        sim.checkers.releasing(state)
        try:
            held = (release or lock.release)()
        except ChronolockError as exc:  # release never raises for a store failure (docs/api.md)
            sim.checkers.violation("release", f"release() raised {type(exc).__name__}: {exc}")
            return
        sim.stats.releases += 1
        sim.record("released", owner=lock.owner, held=int(held))
        sim.checkers.released(state, held)
        if once is not None:
            sim.checkers.once_released(once, state)

    def _resource(self, lock_id: str) -> FencedResource:
        resource = self.resources.get(lock_id)
        if resource is None:
            name, kind = split_row(lock_id)
            resource = self.resources[lock_id] = FencedResource(
                self.store, f"res-{name}" if kind == "lock" else f"res-{name}-{kind}", runtime=self.process.runtime
            )
        return resource


def _cancel_after(runtime: SimRuntime, cancel: Event, delay: float) -> None:
    runtime.sleep(delay)
    cancel.set()


def holder_of(raw: str | None) -> HolderRecord | None:
    if raw is None:
        return None
    try:
        return HolderRecord.decode(raw)
    except ChronolockError:
        return None


def fence_token(raw: str | None) -> int:
    return parse_fence(raw)[0]
