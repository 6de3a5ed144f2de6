"""The leasewatch HTTP service: ``create_app(settings)`` builds a FastAPI app.

The lifespan opens the store and starts the periodic jobs (:mod:`lockclient.schedule`, on the
event loop's monotonic clock: a wall-clock step of the host changes no period and no bound). The
API:

* ``GET /locks?limit=&after=&prefix=`` — one page of the locks with live state, in lock-id
  order, searchable by prefix; the next page's address is in the ``Link`` header
  (``rel="next"``), so a page costs the same at 100 lock ids as at 100,000;
* ``GET /locks/{id}`` — holder, fencing token, queue in order, lease ages *as this watcher
  observed them*;
* ``GET /wait/{id}?gone=<ticket>`` or ``?holder=<owner>`` — long-poll that answers
  when that queue cell is gone (a waiter watches the one ahead of it) or the holder
  changes (the first in line watches the holder). One poller per awaited lock id
  serves every waiter of it, so N waiters cost the store one read pair per poll
  instead of N (the thesis' "feedback mechanism" Cassandra lacks);
* ``POST /notify/{id}`` — a client released or withdrew: poll that lock now, so the
  next waiter is answered at once rather than at the next poll;
* ``POST /revoke/{id}`` — operator revocation, bearer token required (one of the named
  ``LEASEWATCH_ADMIN_TOKENS``; the name is recorded with the revocation);
* ``GET /revocations?lock_id=&limit=`` — recent revocations by this replica; ``GET /observed``
  — what it saw happen: the longest wait now (which lock), recent grants with their observed
  waits, recent store errors (:mod:`leasewatch.observed`);
* ``GET /time`` — each timesvc replica's ``/status`` as last polled (:mod:`leasewatch.timeview`);
  ``GET /trends`` — the last hour of samples (:mod:`leasewatch.trends`); both feed the page;

* ``/healthz``, ``/readyz`` and ``/status`` (both name the partitions this replica watches),
  ``/metrics``, OpenAPI at ``/docs``, and a small page at ``/``.

Actions put the lock id last (``/wait/{id}``, not ``/locks/{id}/wait``): a lock id may
contain ``/``, and ``/locks/{id}`` only ever shows a lock.

Jobs: ``refresh`` (the partition leases, :mod:`leasewatch.partitions`) every
``min(scan_interval, partition_lease / 6)``; ``trends`` every ``trend_interval`` and ``time`` (the
timesvc poll, when URLs are set) every 2 s; ``scan`` every ``scan_interval`` over the
partitions this replica watches; ``due`` every 50 ms (re-reads the leases whose deadline
came, when any did); ``gc`` every ``gc_interval`` (store maintenance: SQLite tombstones in
batches and a WAL checkpoint, with the outcome logged and the store's size in metrics).

With ``LEASEWATCH_READ_TOKEN`` set, ``/locks``, ``/locks/{id}``, ``/revocations``,
``/observed``, ``/time`` and ``/trends`` (lock ids and owners are business identifiers; replica
names and clock offsets are what timesvc guards with its own read token) need it, or an admin
token, as a bearer token. The page itself holds no data.

**Bounds on long-polls** (a security review found 300 waiters on distinct ids making
~17,000 store reads per second): at most ``max_waiters`` long-polls per process and
``max_waiters_per_lock`` per lock id (beyond them: ``429`` with ``Retry-After``, which the
lock client treats like an unreachable leasewatch — it polls the store itself for a
while); a lock id whose queue is empty is not waited on (``404``: nobody can be waiting
in it); and every store read pair done for waiters — the polls and the first look at
an id — draws from one budget of ``wait_poll_rate`` per second (:class:`ReadBudget`):
with few ids each is polled every 10 ms, with many each is polled less often, and the
store never sees more than the budget. A first look that finds the budget spent is
answered ``429`` at once.

Error bodies say what failed, not where: the store's host, port or file path appear
only in the logs.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field

from leasewatch.observed import Grant, Observed, StoreErrorEvent, ticket_seconds
from leasewatch.partitions import PartitionLeases, PartitionStatus
from leasewatch.settings import LeasewatchSettings
from leasewatch.timeview import POLL_INTERVAL_S as TIME_POLL_INTERVAL_S
from leasewatch.timeview import ReplicaTime, TimeView
from leasewatch.trends import Trends
from leasewatch.trends import window as trend_window
from leasewatch.watcher import LockView, Revocation, Watcher, queue_start
from lockclient.errors import ChronolockError, InvalidLockId, StoreAccessDenied, StoreError
from lockclient.lease import HOLDER_COLUMN, HolderRecord
from lockclient.lockid import INDEX_SHARDS, MAX_LOCK_ID_BYTES, validate_row_id
from lockclient.logs import get_logger
from lockclient.schedule import PeriodicSchedule, run_schedule
from lockclient.store import CellStore, Table
from lockclient.store.counting import CountingStore
from lockclient.store.opener import StoreOpener, public_error
from lockclient.version import __version__, build_info
from lockclient.wake import Watch

__all__ = ["create_app"]

log = get_logger("leasewatch")

DUE_CHECK_S = 0.05
"""How often the due schedule is looked at (a revocation comes at most this late after its deadline)."""
PAGE_LIMIT_MAX = 1000
WAIT_POLL_S = 0.01
"""How often the shared poller of an awaited lock reads its head and holder."""
MAX_WAIT_S = 30.0
RETRY_AFTER_S = 1


class WaitRefused(Exception):
    """A long-poll this process will not take: the status code and why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class ReadBudget:
    """At most ``rate`` store read pairs per second for long-polls.

    A virtual schedule (GCRA): each read takes the next free slot, ``1/rate`` after the
    previous one, and a poller sleeps until its slot — so with N awaited ids each is polled
    about every ``N/rate`` seconds (never more often than every 10 ms). A first look at a
    newly awaited id takes a slot at once unless the schedule is already booked more than
    ``max_backlog`` seconds ahead (more ids than the budget can poll once a second); then
    it is refused (429) instead of adding to the backlog."""

    def __init__(
        self, rate: float, *, max_backlog: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = 1.0 / rate
        self.max_backlog = max_backlog
        self._next = 0.0
        self._monotonic = monotonic

    def _take(self) -> float:
        now = self._monotonic()
        slot = max(now, self._next)
        self._next = slot + self.interval
        return slot - now

    def try_take(self) -> bool:
        """Take a slot now, or return False when the schedule is booked too far ahead."""
        now = self._monotonic()
        if self._next - now > self.max_backlog:
            return False
        self._next = max(now, self._next) + self.interval
        return True

    async def take(self) -> None:
        """Wait for a slot."""
        delay = self._take()
        if delay > 0:
            await asyncio.sleep(delay)


class LeaseOut(BaseModel):
    owner: str
    ticket: str
    version: int
    lease_s: float
    holding: bool
    observed_age_s: float | None = Field(description="seconds since this watcher saw the record change")
    label: str | None = Field(default=None, description="the owner's label (get_lock(..., label=...)); None: none")


class QueueEntryOut(BaseModel):
    ticket: str
    owner: str
    enqueued_at: datetime = Field(description="the ticket's global time")
    holding: bool = Field(description="this cell is the holder's (it stays first in line while it holds)")
    waited_s: float | None = Field(
        description="a waiter's wait so far: this replica's wall clock minus the ticket's global time "
        "(errs by the clock skew between them); None for the holder"
    )
    lease_age_s: float | None
    label: str | None = Field(default=None, description="the owner's label; None: none")


class HolderOut(BaseModel):
    owner: str
    fencing_token: int = Field(description="the holder's own token (from its holder record)")
    ticket: str
    version: int = Field(description="renewals of the holder record so far")
    lease_s: float
    seen_since: datetime | None = Field(
        description="when this replica first saw this holder (None: the lock is in a partition it does not "
        "watch); its grant, unless the holder was already there when this replica began watching the lock"
    )
    held_for_s: float | None = Field(description="seconds since seen_since: the hold time, at least")
    label: str | None = Field(default=None, description="the holder's label (get_lock(..., label=...)); None: none")
    payload: str | None = Field(default=None, description="the holder's payload (at most 1 KiB of text); None: none")
    granted_at: datetime | None = Field(
        default=None,
        description="the grant's global time as the holder estimated it (ticket time + its own elapsed time); "
        "None: not recorded (older clients, the baseline algorithm)",
    )


class LockOut(BaseModel):
    lock_id: str
    holders: list[str]
    holder: HolderOut | None = Field(description="the fair queue's holder, with its token and hold time")
    fencing_token: int
    fencing_owner: str
    queue: list[QueueEntryOut]
    leases: list[LeaseOut]


class LockSummary(BaseModel):
    lock_id: str
    holder: str | None
    holder_label: str | None = Field(default=None, description="the holder's label; None: none")
    fencing_token: int
    queue_length: int
    oldest_lease_age_s: float | None
    most_overdue: float | None = Field(
        description="the largest 'unchanged for' / lease length of its leases, as this replica observed them: "
        "a lease renews at a third, so above ~0.4 renewals are late, above 1 it is overdue and it is revoked "
        "at 1 + grace / lease (None: not observed here)"
    )


class RefusedOut(BaseModel):
    detail: str


class WaitOut(BaseModel):
    changed: bool
    head: str | None
    holders: list[str]


class RevokeOut(BaseModel):
    lock_id: str
    revoked: list[str]


class RevocationOut(BaseModel):
    lock_id: str
    owner: str
    reason: str
    unchanged_for_s: float | None
    at: datetime
    by: str = Field(description="the leasewatch replica that revoked")
    caller: str | None = Field(description="the admin token's name, for operator revocations")
    holder: bool


class LongestWaitOut(BaseModel):
    seconds: float = Field(description="the longest wait of any queued waiter now")
    leases: float = Field(description="the longest wait in the waiter's own lease lengths")
    lock_id: str | None = Field(description="the lock of the longest wait in leases")


class GrantOut(BaseModel):
    lock_id: str
    owner: str
    fencing_token: int
    ticket: str
    seen_at: datetime = Field(description="first sighting of this holder by this replica")
    wait_s: float | None = Field(description="seen_at minus the ticket's global time (errs long by a look)")


class StoreErrorOut(BaseModel):
    at: datetime
    where: str = Field(description="scan, revoke, partitions or due_check")
    kind: str = Field(description="the error class (the label of leasewatch_store_errors_total)")
    detail: str = Field(description="what failed, never where (no host or path)")
    lock_id: str | None


class ObservedOut(BaseModel):
    longest_wait: LongestWaitOut
    grants: list[GrantOut] = Field(description="recent grants seen by this replica, newest first")
    store_errors: list[StoreErrorOut] = Field(description="recent store errors, newest first")


class ReplicaTimeOut(BaseModel):
    target: int = Field(description="1-based position in LEASEWATCH_TIMESVC_URLS")
    replica: str | None = Field(description="its TIMESVC_REPLICA_ID, from its last answer (None: never answered)")
    reachable: bool = Field(description="the last poll got a /status answer")
    error: str | None = Field(description="why the last poll got none (a kind of failure; no URL)")
    polled_at: datetime | None
    answered_age_s: float | None = Field(description="seconds since its last answer")
    version: str | None
    ready: bool | None
    runaway: bool | None = Field(description="its clock is refused (disagrees with the majority by more than max_skew)")
    refusing: dict[str, str] = Field(
        description="why it publishes only the carry, never its clock, by kind: clock, replicas (empty: it does not)"
    )
    in_sync: bool | None
    offset_s: float | None = Field(description="its wall clock minus GlobalTime at its last tick")
    support_offset_s: float | None = Field(
        description="its wall clock minus the support of a majority of fresh clock readings (None: no majority)"
    )
    fresh_readings: int | None = Field(description="fresh clock readings it saw, its own included")
    needed_readings: int | None = Field(description="fresh readings a majority needs")
    max_skew_s: float | None
    last_tick_ok: bool | None
    last_ok_tick_age_s: float | None = Field(
        description="seconds since its last successful tick (which publishes its clock reading)"
    )
    last_publisher: str | None = Field(description="the replica that last wrote GlobalTime, as it saw it")
    last_error: str | None
    failed_ticks: int | None
    rejected_ticks: int | None
    now_requests: int | None = Field(description="its GET /now answers since it started")
    now_errors: int | None
    now_per_s: float | None = Field(description="GET /now answers per second between the last two polls")
    peer_offsets_s: dict[str, float] = Field(description="each running peer's clock minus this one's")
    problems: list[str] = Field(description="what is wrong, in words; empty = healthy")


class TimeOut(BaseModel):
    configured: int = Field(description="timesvc replicas in LEASEWATCH_TIMESVC_URLS (0: no time panel)")
    poll_interval_s: float
    healthy: bool | None = Field(description="every replica answered and has no problem (None: none configured)")
    replicas: list[ReplicaTimeOut]


class TrendSampleOut(BaseModel):
    at: datetime = Field(description="end of the interval")
    seconds: float = Field(description="length of the interval")
    grants: int = Field(description="grants seen in the interval (new holders)")
    grants_per_s: float
    wait_p50_s: float | None = Field(description="median observed wait of those grants (ticket to first sighting)")
    wait_p99_s: float | None
    revocations: int
    store_errors: int
    longest_wait_s: float = Field(description="the longest wait of a queued waiter at the end of the interval")
    locks: int | None = Field(description="lock ids with live state in the last scan")
    now_per_s: float | None = Field(description="timesvc GET /now answers per second, all replicas that answered")
    clock_offsets_s: dict[str, float] = Field(description="each timesvc replica's wall clock minus GlobalTime")


class TrendWindowOut(BaseModel):
    samples: int
    grants: int = Field(description="grants seen in all the samples")
    revocations: int
    store_errors: int
    max_grants_per_s: float | None
    max_wait_p99_s: float | None
    max_longest_wait_s: float | None
    max_now_per_s: float | None


class TrendsOut(BaseModel):
    interval_s: float = Field(description="LEASEWATCH_TREND_INTERVAL")
    size: int = Field(description="samples kept at most")
    window: TrendWindowOut = Field(description="totals and peaks over the samples answered")
    samples: list[TrendSampleOut] = Field(description="oldest first")


class LastScanOut(BaseModel):
    locks: int = Field(description="lock ids listed in the watched partitions")
    looked: int = Field(description="locks read in that scan (the others were not due)")
    leases: int = Field(description="leases observed")
    due: int = Field(description="leases on the due schedule after it")
    revoked: int
    seconds: float
    errors: list[str] = Field(description="the first 10 per-lock errors")


class StatusOut(BaseModel):
    replica: str
    version: str = Field(description="chronolock version of this replica")
    ready: bool
    reasons: list[str]
    member: str | None = Field(description="this run's member id in the partition table")
    partitions: list[int] = Field(description="partitions (index shards) whose lease this replica holds")
    watching: list[int] = Field(description="partitions it scans: its own and those recently handed over")
    replicas_seen: list[str] = Field(description="replicas it believes alive, itself included")
    partition_error: str | None
    last_scan_ok: bool | None
    last_scan_age_s: float | None = Field(description="seconds since the last successful scan")
    locks: int | None = Field(description="lock ids with live state in the last scan")
    leases: int | None = Field(description="lease records seen in the last scan")
    last_scan: LastScanOut | None
    revocations: int = Field(description="revocations by this replica since it started")
    scan_interval_s: float
    grace_s: float
    partition_lease_s: float
    store: dict[str, object] = Field(description="the last store maintenance: purged cells, file sizes, checkpoint")


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.scans = Counter("leasewatch_scans", "scans by outcome", ["outcome"], registry=r)
        self.scan_seconds = Histogram(
            "leasewatch_scan_seconds", "duration of one scan", registry=r, buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)
        )
        self.leases = Gauge("leasewatch_leases_watched", "lease records seen in the last scan", registry=r)
        self.locks = Gauge("leasewatch_locks_watched", "lock ids with live state in the last scan", registry=r)
        self.revocations = Counter("leasewatch_revocations", "leases revoked", ["kind"], registry=r)
        self.orphans = Counter("leasewatch_orphans_cleared", "cells without a lease record removed", registry=r)
        self.waiters = Gauge("leasewatch_waiters", "long-poll waiters", registry=r)
        self.wait_polls = Counter("leasewatch_wait_polls", "store read pairs done for waiters", registry=r)
        self.wait_refused = Counter("leasewatch_wait_refused", "long-polls refused, by reason", ["reason"], registry=r)
        self.auth_failures = Counter(
            "leasewatch_auth_failures", "requests refused for a missing or wrong token", ["scope"], registry=r
        )
        self.gc = Counter("leasewatch_gc_purged", "tombstones and expired cells purged by GC", registry=r)
        self.build = build_info(r, "leasewatch")
        # What this replica saw happen (leasewatch.observed): grants, waits, store errors.
        self.grants = Counter("leasewatch_grants_observed", "new holders seen by scans", registry=r)
        self.waits = Histogram(
            "leasewatch_observed_wait_seconds",
            "ticket to first sighting as holder (errs long by up to a scan interval)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        # Set to functions of leasewatch.observed by observed_by(): aged to the scrape's time.
        self.oldest_wait = Gauge(
            "leasewatch_oldest_waiter_seconds",
            "longest wait of a queued waiter now (the oldest waiter of each watched lock, as of its last look)",
            registry=r,
        )
        self.oldest_wait_leases = Gauge(
            "leasewatch_oldest_waiter_leases", "longest wait of a queued waiter, in its own lease lengths", registry=r
        )
        self.store_errors = Counter(
            "leasewatch_store_errors", "store operations that failed, by kind of error", ["kind"], registry=r
        )
        self.looked = Gauge(
            "leasewatch_locks_looked", "locks read in the last scan (the others were not due)", registry=r
        )
        self.due = Gauge(
            "leasewatch_due_leases", "leases on the due schedule (deadline before their next look)", registry=r
        )
        self.due_checks = Counter("leasewatch_due_checks", "re-reads of leases at their deadline", registry=r)
        self.partitions = Gauge(
            "leasewatch_partitions_owned", "partitions of the lock ids this replica owns", registry=r
        )
        # The constant the alert "some partition is owned by nobody" compares the sum of
        # leasewatch_partitions_owned over all replicas with (so the rules need no number).
        self.partitions_total = Gauge(
            "leasewatch_partitions", "partitions of the lock-id space (lock index shards)", registry=r
        )
        self.partitions_total.set(INDEX_SHARDS)
        self.watching = Gauge(
            "leasewatch_partitions_watched", "partitions scanned (owned + recently handed over)", registry=r
        )
        self.members = Gauge("leasewatch_replicas_seen", "leasewatch replicas this one believes alive", registry=r)
        self.takeovers = Counter(
            "leasewatch_partition_takeovers", "partitions taken over from a replica that stopped", registry=r
        )
        self.store_bytes = Gauge("leasewatch_store_bytes", "size of the store's files on disk", ["file"], registry=r)
        self.checkpoints = Counter("leasewatch_store_checkpoints", "store journal checkpoints", ["outcome"], registry=r)
        # The store load this replica makes (scans, due checks, partition leases, long-poll reads,
        # revocations): one per request the store serves — a many-rows read counts one per row,
        # as Cassandra serves it. Divided by the live lock ids: the store load per id (BENCHMARKS.md).
        self.store_requests = Counter(
            "leasewatch_store_requests",
            "requests sent to the store, by operation (a many-rows read: one per row)",
            ["op"],
            registry=r,
        )
        self._store_request_children: dict[str, Any] = {}
        self.looks = Counter("leasewatch_looks", "locks read by scans (the sum of leasewatch_locks_looked)", registry=r)

    def count_store_requests(self, op: str, n: int) -> None:
        """``store_requests.labels(op).inc(n)``, the labelled child looked up once per name."""
        child = self._store_request_children.get(op)
        if child is None:
            child = self._store_request_children[op] = self.store_requests.labels(op)
        child.inc(n)


@dataclass
class _LockState:
    """What waiters of one lock watch: the live queue cells (tickets) and the holder."""

    tickets: frozenset[str]
    head: str | None
    holder: str
    """The holder's owner id ("" when nobody holds the lock)."""


@dataclass
class _Awaited:
    """One lock id that someone is waiting on, and its single poller."""

    state: _LockState | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    poll_now: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0
    task: asyncio.Task[None] | None = None


class WaitHub:
    """Long-polls for waiters: one poller per awaited lock id, woken early by ``notify``."""

    def __init__(
        self,
        store: CellStore,
        watcher: Watcher,
        metrics: Metrics,
        *,
        max_waiters: int = 512,
        max_waiters_per_lock: int = 64,
        poll_rate: float = 200.0,
    ) -> None:
        self.store = store
        self.watcher = watcher
        self.metrics = metrics
        self.max_waiters = max_waiters
        self.max_waiters_per_lock = max_waiters_per_lock
        self.budget = ReadBudget(poll_rate)
        self.waiting = 0
        self._locks: dict[str, _Awaited] = {}

    @property
    def awaited_ids(self) -> int:
        return len(self._locks)

    def _read_state(self, lock_id: str, awaited: _Awaited) -> _LockState:
        # The lease row first: the holder, and the watermark the queue read starts from.
        row = self.store.read_versioned(lock_id, serial=False)
        cells = self.store.read_row(Table.QUEUE, lock_id, start=queue_start(row))
        raw = row.get(HOLDER_COLUMN)
        holder = ""
        if raw is not None:
            try:
                holder = HolderRecord.decode(raw).owner
            except StoreError:
                holder = "?"
        tickets = frozenset(c.column for c in cells)
        return _LockState(tickets, cells[0].column if cells else None, holder)

    async def _refresh(self, lock_id: str, awaited: _Awaited) -> None:
        state = await asyncio.to_thread(self._read_state, lock_id, awaited)
        self.metrics.wait_polls.inc()
        if state != awaited.state:
            awaited.state = state
            async with awaited.changed:
                awaited.changed.notify_all()

    async def _poll(self, lock_id: str, awaited: _Awaited) -> None:
        try:
            while awaited.waiters > 0:
                awaited.poll_now.clear()
                await self.budget.take()  # many awaited ids: each is polled less often
                if awaited.waiters <= 0:
                    break
                try:
                    await self._refresh(lock_id, awaited)
                except StoreError as exc:
                    log.warning("wait_poll_failed", lock_id=lock_id, error=str(exc))
                    await asyncio.sleep(0.5)
                    continue
                with suppress(TimeoutError):
                    await asyncio.wait_for(awaited.poll_now.wait(), WAIT_POLL_S)
        finally:
            if self._locks.get(lock_id) is awaited and awaited.waiters == 0:
                del self._locks[lock_id]

    async def notify(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> bool:
        """A client changed the lock: its queue cell ``gone`` was deleted, or the holder
        ``released`` let go. Waiters watching exactly that are answered at once, from the
        notice alone (they re-read the store before acting, so a wrong notice costs only a
        read); the poller then reads the lock to confirm. False if nobody waits on it."""
        awaited = self._locks.get(lock_id)
        if awaited is None:
            return False
        state = awaited.state
        if state is not None and (gone in state.tickets or (released and state.holder == released)):
            tickets = state.tickets - {gone} if gone is not None else state.tickets
            holder = "" if released and state.holder == released else state.holder
            head = min(tickets) if tickets else None
            awaited.state = _LockState(tickets, head, holder)
            async with awaited.changed:
                awaited.changed.notify_all()
        awaited.poll_now.set()
        return True

    def _refuse(self, status: int, reason: str, detail: str) -> WaitRefused:
        self.metrics.wait_refused.labels(reason).inc()
        return WaitRefused(status, detail)

    async def wait(self, lock_id: str, watch: Watch, timeout: float) -> WaitOut:
        if self.waiting >= self.max_waiters:
            raise self._refuse(429, "process", f"too many long-polls in this process ({self.max_waiters})")
        awaited = self._locks.get(lock_id)
        if awaited is not None and awaited.waiters >= self.max_waiters_per_lock:
            raise self._refuse(429, "lock", f"too many long-polls on this lock id ({self.max_waiters_per_lock})")
        fresh = awaited is None
        if awaited is None:
            awaited = _Awaited()
        if awaited.state is None or _moved(awaited.state, watch):
            # No state yet, or it says "changed" but may be older than what the caller saw
            # (answering from it would make the caller look again for nothing): read now,
            # if the budget allows (a flood of first looks at distinct ids is refused here).
            if not self.budget.try_take():
                raise self._refuse(429, "budget", "long-poll store budget spent; retry shortly")
            await self._refresh(lock_id, awaited)
        assert awaited.state is not None
        if not awaited.state.tickets:
            # Nobody is queued: a real waiter always has its own queue cell (or it was just
            # revoked, and then its answer is to look again anyway). Nothing to wait for, so
            # no poller is started for this id.
            raise self._refuse(404, "no_queue", "this lock id has no queue: nothing to wait for")
        if fresh:
            existing = self._locks.get(lock_id)
            if existing is not None:  # another request registered it while we read
                awaited = existing
        # Checked again after the read (it awaited): from here to the increment nothing awaits.
        if self.waiting >= self.max_waiters:
            raise self._refuse(429, "process", f"too many long-polls in this process ({self.max_waiters})")
        if awaited.waiters >= self.max_waiters_per_lock:
            raise self._refuse(429, "lock", f"too many long-polls on this lock id ({self.max_waiters_per_lock})")
        self._locks.setdefault(lock_id, awaited)
        awaited.waiters += 1
        self.waiting += 1
        self.metrics.waiters.inc()
        try:
            if awaited.task is None or awaited.task.done():
                # Created in the same step as the entry (no await in between): one poller per id.
                awaited.task = asyncio.create_task(self._poll(lock_id, awaited))

            def done() -> bool:
                return awaited.state is not None and _moved(awaited.state, watch)

            async with awaited.changed:
                with suppress(TimeoutError):
                    await asyncio.wait_for(awaited.changed.wait_for(done), timeout)
            state = awaited.state
            assert state is not None
            return WaitOut(
                changed=_moved(state, watch), head=state.head, holders=[state.holder] if state.holder else []
            )
        finally:
            awaited.waiters -= 1
            self.waiting -= 1
            self.metrics.waiters.dec()


def observed_by(metrics: Metrics, trends: Trends | None = None) -> Observed:
    """An :class:`Observed` that counts what it sees in ``metrics`` (and ``trends``)."""

    def grant(event: Grant) -> None:
        metrics.grants.inc()
        if event.wait_s is not None:
            metrics.waits.observe(event.wait_s)
        if trends is not None:
            trends.grant(event.wait_s)

    def error(event: StoreErrorEvent) -> None:
        metrics.store_errors.labels(event.kind).inc()
        if trends is not None:
            trends.store_error()

    observed = Observed(on_grant=grant, on_error=error)
    metrics.oldest_wait.set_function(lambda: observed.longest_wait().seconds)
    metrics.oldest_wait_leases.set_function(lambda: observed.longest_wait().leases)
    return observed


def _moved(state: _LockState, watch: Watch) -> bool:
    if watch.kind == "gone":
        return watch.value not in state.tickets
    return state.holder != watch.value


class Leasewatch:
    """One replica: store, watcher, wait hub, metrics, health."""

    def __init__(self, settings: LeasewatchSettings, store: CellStore | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._store = store
        self._owns_store = store is None
        self._opener = StoreOpener(settings.open_store)
        self.watcher: Watcher | None = None
        self.trends = Trends()
        self.observed = observed_by(self.metrics, self.trends)
        token = settings.timesvc_token.get_secret_value() if settings.timesvc_token else None
        self.time_view = TimeView(settings.timesvc_url_list, token) if settings.timesvc_url_list else None
        self.partitions: PartitionLeases | None = None
        self.partition_status: PartitionStatus | None = None
        self.partition_error: str | None = None
        self.hub: WaitHub | None = None
        self.last_maintenance: dict[str, object] = {}
        self.last_scan_ok: bool | None = None
        self.last_scan_at: float | None = None
        self.last_error: ChronolockError | None = None
        self._open_lock = asyncio.Lock()

    async def ready(self) -> Watcher:
        if self.watcher is not None:
            return self.watcher
        async with self._open_lock:  # concurrent first requests must not open two stores
            return await self._open()

    async def _open(self) -> Watcher:
        if self.watcher is None:
            if self._store is None:
                # Backs off after failures: a wrong password must not mean a login per request.
                self._store = await asyncio.to_thread(self._opener.open)
            # Everything this replica asks of the store goes through the counter (the store is still
            # closed through self._store: the wrapper never closes what it wraps).
            store = CountingStore(self._store, on_requests=self.metrics.count_store_requests, client_metrics=False)
            watcher = Watcher(
                store,
                grace=self.settings.grace,
                orphan_after=self.settings.orphan_after,
                replica_id=self.settings.replica_id,
                on_revoke=self._count,
                observed=self.observed,
                scan_interval=self.settings.scan_interval,
            )
            self.partitions = PartitionLeases(
                store,
                self.settings.replica_id,
                lease=self.settings.partition_lease,
                grace=self.settings.grace,
                # A partition handed over is watched on until its new owner can revoke there
                # itself: the longest lease it holds + grace, and a few scans to be sure.
                linger=lambda: watcher.longest_lease + self.settings.grace + 3 * self.settings.scan_interval,
            )
            self.hub = WaitHub(
                store,
                watcher,
                self.metrics,
                max_waiters=self.settings.max_waiters,
                max_waiters_per_lock=self.settings.max_waiters_per_lock,
                poll_rate=self.settings.wait_poll_rate,
            )
            self.watcher = watcher
        return self.watcher

    def _count(self, event: Revocation) -> None:
        self.metrics.revocations.labels("holder" if event.holder else "waiter").inc()
        self.trends.revocation()

    async def poll_time(self) -> None:
        if self.time_view is not None:
            await self.time_view.poll()

    async def sample_trends(self) -> None:
        """Cut a trend sample (on the event loop: a few counters and the longest-wait pass)."""
        report = self.watcher.last_report if self.watcher is not None else None
        times = self.time_view.snapshot() if self.time_view is not None else []
        rates = [t.now_per_s for t in times if t.reachable and t.now_per_s is not None]
        self.trends.sample(
            longest_wait_s=self.observed.longest_wait().seconds,
            locks=report.locks if report is not None else None,
            now_per_s=sum(rates) if rates else None,
            clock_offsets_s={t.name: t.offset_s for t in times if t.reachable and t.offset_s is not None},
        )

    async def refresh_partitions(self) -> PartitionStatus | None:
        try:
            await self.ready()
            assert self.partitions is not None
            status = await asyncio.to_thread(self.partitions.refresh)
        except ChronolockError as exc:
            self.partition_error = public_error(exc)  # shown by /status: what failed, not where
            log.warning("partition_refresh_failed", error=str(exc))
            self.observed.store_error("partitions", type(exc).__name__, public_error(exc))
            return None
        before = self.partition_status.takeovers if self.partition_status is not None else 0
        self.partition_status, self.partition_error = status, None
        self.metrics.partitions.set(len(status.owned))
        self.metrics.watching.set(len(status.watching))
        self.metrics.members.set(len(status.members))
        if status.takeovers > before:
            self.metrics.takeovers.inc(status.takeovers - before)
        return status

    async def scan(self) -> None:
        try:
            watcher = await self.ready()
            status = self.partition_status or await self.refresh_partitions()
            if status is None:
                raise StoreError(f"partitions unknown: {self.partition_error}")
            report = await asyncio.to_thread(watcher.scan, status.watching)
        except ChronolockError as exc:
            self.last_scan_ok, self.last_error = False, exc
            self.metrics.scans.labels("error").inc()
            log.warning("scan_failed", error=str(exc), error_type=type(exc).__name__)
            self.observed.store_error("scan", type(exc).__name__, public_error(exc))
            return
        self.last_scan_ok, self.last_error, self.last_scan_at = True, None, time.monotonic()
        self.metrics.scans.labels("ok").inc()
        self.metrics.scan_seconds.observe(report.seconds)
        self.metrics.leases.set(report.leases)
        self.metrics.locks.set(report.locks)
        self.metrics.looked.set(report.looked)
        self.metrics.looks.inc(report.looked)
        self.metrics.due.set(report.due)
        if report.orphans_cleared:
            self.metrics.orphans.inc(report.orphans_cleared)

    async def check_due(self) -> None:
        watcher = self.watcher
        if watcher is None:
            return
        due = watcher.next_due()
        if due is None or due > time.monotonic():
            return  # the common case: nothing due, no thread hop
        try:
            report = await asyncio.to_thread(watcher.check_due)
        except ChronolockError as exc:
            log.warning("due_check_failed", error=str(exc))
            self.observed.store_error("due_check", type(exc).__name__, public_error(exc))
            return
        self.metrics.due_checks.inc()
        self.metrics.due.set(report.due)

    async def collect_garbage(self) -> None:
        """Store maintenance: purge tombstones (in batches), checkpoint the journal, report sizes."""
        started = time.monotonic()
        try:
            store = (await self.ready()).store  # the first run may come before the first scan
            purged = await asyncio.to_thread(store.collect_garbage)
            self.metrics.gc.inc(purged)
            checkpoint = await asyncio.to_thread(store.checkpoint)
            sizes = await asyncio.to_thread(store.storage_bytes)
        except ChronolockError as exc:
            log.warning("gc_failed", error=str(exc))
            return
        for name, size in sizes.items():
            self.metrics.store_bytes.labels(name).set(size)
        outcome: dict[str, object] = {"purged": purged, "seconds": round(time.monotonic() - started, 3), **sizes}
        if checkpoint is not None:
            self.metrics.checkpoints.labels("busy" if checkpoint.busy else "ok").inc()
            outcome |= {
                "checkpoint": "busy" if checkpoint.busy else "ok",
                "wal_frames": checkpoint.wal_frames,
                "checkpointed_frames": checkpoint.checkpointed_frames,
                "wal_bytes_before": checkpoint.wal_bytes_before,
                "wal_bytes_after": checkpoint.wal_bytes_after,
            }
        self.last_maintenance = outcome
        log.info("store_maintenance", **outcome)

    def readiness(self) -> tuple[bool, list[str]]:
        if self.last_scan_ok is None:
            return False, ["no scan has completed yet"]
        if not self.last_scan_ok:
            error = self.last_error
            return False, [public_error(error) if error is not None else "store failed"]
        if self.last_scan_at is not None and time.monotonic() - self.last_scan_at > 3 * self.settings.scan_interval + 5:
            return False, ["no successful scan recently"]
        return True, []

    async def aclose(self) -> None:
        if self.time_view is not None:
            await self.time_view.aclose()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        if self.partitions is not None:
            try:
                self.partitions.release_all()  # the others take over at once, not after a lease
            except ChronolockError as exc:
                log.warning("partition_release_failed", error=str(exc))
        if self._owns_store and self._store is not None:
            self._store.close()


async def _service(request: Request) -> Leasewatch:  # async: no threadpool hop per request
    service: Leasewatch = request.app.state.service
    return service


ServiceDep = Annotated[Leasewatch, Depends(_service)]
LockIdPath = Annotated[
    str,
    Path(
        description=f"lock id, URL-encoded: at most {MAX_LOCK_ID_BYTES} bytes of UTF-8 in NFC, no control, "
        "format (zero-width, bidi) or separator characters other than the space",
        # Documented, not enforced here: the handler checks the byte limit (and the rest) with
        # one clear message. maxLength counts characters, so 256 is a true upper bound.
        json_schema_extra={"minLength": 1, "maxLength": MAX_LOCK_ID_BYTES, "x-max-utf8-bytes": MAX_LOCK_ID_BYTES},
    ),
]
LockIdQuery = Annotated[
    str | None,
    Query(
        description=f"only this lock id: at most {MAX_LOCK_ID_BYTES} bytes of UTF-8 (ids are in NFC)",
        json_schema_extra={"maxLength": MAX_LOCK_ID_BYTES, "x-max-utf8-bytes": MAX_LOCK_ID_BYTES},
    ),
]
_REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"model": RefusedOut, "description": "a bearer token is required (LEASEWATCH_READ_TOKEN)"},
    422: {"description": "invalid lock id or parameters"},
    503: {"model": RefusedOut, "description": "the store is unavailable (no host or path is named)"},
}


def _lock_out(view: LockView, observed: Observed, wall: float) -> LockOut:
    ages = {owner: lease.observed_age for owner, lease in view.leases.items()}
    holding = next((lease for lease in view.leases.values() if lease.holding), None)
    holder: HolderOut | None = None
    if holding is not None:
        held = observed.held_for(view.lock_id, holding.owner)
        holder = HolderOut(
            owner=holding.owner,
            fencing_token=holding.token,
            ticket=holding.ticket,
            version=holding.version,
            lease_s=holding.lease,
            seen_since=None if held is None else held[0],
            held_for_s=None if held is None else round(held[1], 3),
            label=holding.label or None,
            payload=holding.payload or None,
            granted_at=datetime.fromtimestamp(holding.granted_us / 1e6, UTC) if holding.granted_us else None,
        )

    def waited(ticket: str) -> float | None:
        issued = ticket_seconds(ticket)
        if issued is None or (holding is not None and ticket == holding.ticket):
            return None
        return round(max(0.0, wall - issued), 3)

    return LockOut(
        lock_id=view.lock_id,
        holders=view.holders,
        holder=holder,
        fencing_token=view.fencing_token,
        fencing_owner=view.fencing_owner,
        queue=[
            QueueEntryOut(
                ticket=ticket,
                owner=owner,
                enqueued_at=datetime.fromtimestamp(int(ticket[:20]) / 1e6, UTC),
                holding=holding is not None and ticket == holding.ticket,
                waited_s=waited(ticket),
                lease_age_s=ages.get(owner),
                label=view.labels.get(ticket) or None,
            )
            for ticket, owner in view.queue
        ],
        leases=[
            LeaseOut(
                owner=lease.owner,
                ticket=lease.ticket,
                version=lease.version,
                lease_s=lease.lease,
                holding=lease.holding,
                observed_age_s=lease.observed_age,
                label=lease.label or None,
            )
            for lease in view.leases.values()
        ],
    )


AuthorizationHeader = Annotated[str | None, Header(alias="Authorization", description="Bearer <token>")]


def _replica_time_out(replica: ReplicaTime) -> ReplicaTimeOut:
    return ReplicaTimeOut(**asdict(replica))


def _bearer(authorization: str | None) -> str | None:
    scheme, _, given = (authorization or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def _caller(tokens: dict[str, str], given: str | None) -> str | None:
    """The name of the token ``given`` matches, comparing every token in constant time."""
    if given is None:
        return None
    found = None
    for token, name in tokens.items():
        if hmac.compare_digest(given.encode(), token.encode()):
            found = name
    return found


def create_app(settings: LeasewatchSettings | None = None, *, store: CellStore | None = None) -> FastAPI:
    """Build a leasewatch app. Nothing is opened until the app starts (lifespan)."""
    settings = settings or LeasewatchSettings()
    admin_tokens = settings.admin_token_names
    read_token = settings.read_token.get_secret_value() if settings.read_token else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = Leasewatch(settings, store)
        app.state.service = service
        schedule = PeriodicSchedule()
        now = asyncio.get_running_loop().time()
        jobs: dict[str, Callable[[], Awaitable[object]]] = {
            "scan": service.scan,
            "refresh": service.refresh_partitions,
            "due": service.check_due,
            "gc": service.collect_garbage,
            "trends": service.sample_trends,
        }
        schedule.add("scan", settings.scan_interval, first_at=now)
        refresh = min(settings.scan_interval, settings.partition_lease / 6)
        schedule.add("refresh", refresh, first_at=now + refresh)
        schedule.add("due", DUE_CHECK_S, first_at=now + DUE_CHECK_S)
        schedule.add("gc", settings.gc_interval, first_at=now)  # the store's size is known from the start
        schedule.add("trends", settings.trend_interval, first_at=now + settings.trend_interval)
        if service.time_view is not None:
            jobs["time"] = service.poll_time
            schedule.add("time", min(TIME_POLL_INTERVAL_S, settings.trend_interval), first_at=now)
        driver = asyncio.create_task(run_schedule(schedule, jobs, name="leasewatch"))
        log.info("leasewatch_started", replica=settings.replica_id, scan_interval_s=settings.scan_interval)
        try:
            yield
        finally:
            driver.cancel()
            with suppress(asyncio.CancelledError):
                await driver
            await service.aclose()

    app = FastAPI(
        title="chronolock leasewatch",
        summary="Revokes dead lock holders and waiters by observation; lock introspection and wake-ups",
        version=__version__,
        lifespan=lifespan,
    )

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        # The full error (hosts, ports, file paths) goes to the log, a kind of failure to the client.
        log.warning("request_store_error", path=request.url.path, error=str(exc), error_type=type(exc).__name__)
        retry = "30" if isinstance(exc, StoreAccessDenied) else "1"
        return JSONResponse(status_code=503, content={"detail": public_error(exc)}, headers={"Retry-After": retry})

    @app.exception_handler(InvalidLockId)
    async def bad_lock_id(request: Request, exc: InvalidLockId) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": f"invalid lock id: {exc}"})

    @app.exception_handler(WaitRefused)
    async def wait_refused(request: Request, exc: WaitRefused) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else {}
        return JSONResponse(status_code=exc.status, content={"detail": exc.detail}, headers=headers)

    def require_reader(service: Leasewatch, authorization: str | None) -> None:
        """With LEASEWATCH_READ_TOKEN set, lock ids and owners are shown only to its holder
        (or an admin)."""
        if read_token is None:
            return
        given = _bearer(authorization)
        if given is not None and (
            hmac.compare_digest(given.encode(), read_token.encode()) or _caller(admin_tokens, given)
        ):
            return
        service.metrics.auth_failures.labels("read").inc()
        raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    from leasewatch.primitives import add_primitive_routes  # its module imports this one

    add_primitive_routes(app, require_reader)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        # The page itself holds no data; it fetches /locks (with the token from the URL fragment).
        return HTMLResponse(resources.files("leasewatch").joinpath("static/index.html").read_text())

    @app.get(
        "/locks",
        response_model=list[LockSummary],
        summary="One page of the locks with live state, in lock-id order",
        description="At most `limit` locks whose id starts with `prefix`, after the id `after` (a cursor: "
        "the last id of the previous page). The next page's address is in the `Link` header "
        '(`rel="next"`), absent after the last page. Lease ages are this replica\'s observations '
        "(none for locks in partitions another replica watches).",
        responses=_REFUSALS,
    )
    async def locks(
        service: ServiceDep,
        request: Request,
        response: Response,
        limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT_MAX, description="locks per page")] = 100,
        after: Annotated[
            str | None,
            Query(max_length=MAX_LOCK_ID_BYTES, description="cursor: the last id of the page before"),
        ] = None,
        prefix: Annotated[
            str, Query(max_length=MAX_LOCK_ID_BYTES, description="only lock ids starting with this")
        ] = "",
        authorization: AuthorizationHeader = None,
    ) -> list[LockSummary]:
        require_reader(service, authorization)
        watcher = await service.ready()
        page, cursor = await asyncio.to_thread(watcher.page, after=after, limit=limit, prefix=prefix)
        if cursor is not None:
            query = urlencode({"limit": limit, "after": cursor, **({"prefix": prefix} if prefix else {})})
            response.headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
        return [
            LockSummary(
                lock_id=line.lock_id,
                holder=line.holder,
                holder_label=line.holder_label or None,
                fencing_token=line.fencing_token,
                queue_length=line.queue_length,
                oldest_lease_age_s=line.oldest_lease_age,
                most_overdue=line.most_overdue,
            )
            for line in page
        ]

    @app.get(
        "/wait/{lock_id:path}",
        response_model=WaitOut,
        summary="Long-poll until a queue cell is gone or the holder changes",
        responses={
            404: {"model": RefusedOut, "description": "the lock id has no queue: nothing to wait for"},
            429: {"model": RefusedOut, "description": "too many long-polls (process, lock id or store budget)"},
            422: _REFUSALS[422],
            503: _REFUSALS[503],
        },
    )
    async def wait(
        service: ServiceDep,
        lock_id: LockIdPath,
        gone: Annotated[
            str | None, Query(max_length=512, description="return when this queue cell (a ticket) is gone")
        ] = None,
        holder: Annotated[
            str | None,
            Query(max_length=512, description="return when the holder is no longer this owner ('' = nobody)"),
        ] = None,
        timeout: Annotated[float, Query(gt=0, le=MAX_WAIT_S, description="seconds to wait at most")] = 10.0,
    ) -> WaitOut:
        validate_row_id(lock_id)  # a lock id, or a semaphore's / read-write lock's row
        if (gone is None) == (holder is None):
            raise HTTPException(422, "give exactly one of gone=<ticket> or holder=<owner>")
        watch = Watch("gone", gone) if gone is not None else Watch("holder", holder or "")
        await service.ready()
        assert service.hub is not None
        return await service.hub.wait(lock_id, watch, timeout)

    @app.post("/notify/{lock_id:path}", status_code=202, summary="A client changed this lock: wake its waiters now")
    async def notify(
        service: ServiceDep,
        lock_id: LockIdPath,
        gone: Annotated[str | None, Query(max_length=512, description="a queue cell (ticket) just deleted")] = None,
        released: Annotated[str | None, Query(max_length=512, description="the holder that just let go")] = None,
    ) -> dict[str, bool]:
        validate_row_id(lock_id)
        await service.ready()
        assert service.hub is not None
        return {"waiters": await service.hub.notify(lock_id, gone=gone, released=released)}

    @app.post(
        "/revoke/{lock_id:path}",
        response_model=RevokeOut,
        summary="Revoke the holder (admin)",
        description="Revokes the holder (every holder of a semaphore's or read-write lock's row), or the owner "
        "named by `owner`; with `token`, only the holder whose fencing token that is, and 409 if no current "
        "holder has it (the lock changed hands: nothing is revoked). `lockctl revoke NAME --token N` does the "
        "same on the store directly.",
        responses={
            403: {"model": RefusedOut, "description": "no admin token is configured"},
            409: {"model": RefusedOut, "description": "no current holder has this fencing token"},
            **_REFUSALS,
        },
    )
    async def revoke(
        service: ServiceDep,
        lock_id: LockIdPath,
        authorization: AuthorizationHeader = None,
        owner: Annotated[
            str | None, Query(max_length=512, description="revoke this owner instead of the holder")
        ] = None,
        token: Annotated[
            int | None, Query(ge=1, description="revoke only the holder with this fencing token (409 if none has it)")
        ] = None,
    ) -> RevokeOut:
        if not admin_tokens:
            raise HTTPException(403, "revocation is disabled: no LEASEWATCH_ADMIN_TOKENS are configured")
        caller = _caller(admin_tokens, _bearer(authorization))
        if caller is None:
            service.metrics.auth_failures.labels("admin").inc()
            log.warning("revoke_refused", lock_id=lock_id, detail="missing or wrong bearer token")
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        # Operators may still name a lock whose id predates the stricter rules, to clear it.
        validate_row_id(lock_id, legacy=True)
        watcher = await service.ready()
        log.info("revoke_requested", lock_id=lock_id, owner=owner, caller=caller, token=token)
        revoked = await asyncio.to_thread(partial(watcher.revoke_now, lock_id, owner, caller=caller, token=token))
        if token is not None and not revoked:
            raise HTTPException(409, f"no current holder of {lock_id!r} has fencing token {token}: nothing revoked")
        return RevokeOut(lock_id=lock_id, revoked=revoked)

    @app.get(
        "/locks/{lock_id:path}",
        response_model=LockOut,
        summary="Holder, fencing token, queue, lease ages",
        responses=_REFUSALS,
    )
    async def lock(service: ServiceDep, lock_id: LockIdPath, authorization: AuthorizationHeader = None) -> LockOut:
        require_reader(service, authorization)
        validate_row_id(lock_id, legacy=True)
        watcher = await service.ready()
        view = await asyncio.to_thread(watcher.view, lock_id)
        return _lock_out(view, service.observed, time.time())

    @app.get(
        "/revocations",
        response_model=list[RevocationOut],
        summary="Recent revocations by this replica",
        responses=_REFUSALS,
    )
    async def revocations(
        service: ServiceDep,
        limit: Annotated[int, Query(ge=1, le=500, description="newest this many")] = 500,
        lock_id: LockIdQuery = None,
        authorization: AuthorizationHeader = None,
    ) -> list[RevocationOut]:
        require_reader(service, authorization)
        if lock_id is not None:
            validate_row_id(lock_id, legacy=True)
        watcher = await service.ready()
        events = [e for e in reversed(watcher.events) if lock_id is None or e.lock_id == lock_id][:limit]
        return [
            RevocationOut(
                lock_id=e.lock_id,
                owner=e.owner,
                reason=e.reason,
                unchanged_for_s=e.unchanged_for,
                at=e.at,
                by=e.by,
                caller=e.caller,
                holder=e.holder,
            )
            for e in events
        ]

    @app.get(
        "/observed",
        response_model=ObservedOut,
        summary="What this replica saw happen: the longest wait now, recent grants, recent store errors",
        description="The JSON behind the alerts ChronolockLongWait (which lock) and "
        "ChronolockStoreErrorsLeasewatch (which errors, when). Only the partitions this replica "
        "watches: ask each replica.",
        responses=_REFUSALS,
    )
    async def observed(
        service: ServiceDep,
        limit: Annotated[int, Query(ge=1, le=1000, description="grants and errors each")] = 50,
        lock_id: LockIdQuery = None,
        authorization: AuthorizationHeader = None,
    ) -> ObservedOut:
        require_reader(service, authorization)
        if lock_id is not None:
            validate_row_id(lock_id, legacy=True)
        seen = service.observed
        waits = seen.longest_wait()
        return ObservedOut(
            longest_wait=LongestWaitOut(
                seconds=round(waits.seconds, 3), leases=round(waits.leases, 3), lock_id=waits.lock_id
            ),
            grants=[
                GrantOut(
                    lock_id=g.lock_id,
                    owner=g.owner,
                    fencing_token=g.fencing_token,
                    ticket=g.ticket,
                    seen_at=g.seen_at,
                    wait_s=None if g.wait_s is None else round(g.wait_s, 3),
                )
                for g in seen.recent_grants(lock_id, limit)
            ],
            store_errors=[
                StoreErrorOut(at=e.at, where=e.where, kind=e.kind, detail=e.detail, lock_id=e.lock_id)
                for e in seen.recent_errors(limit)
            ],
        )

    @app.get(
        "/time",
        response_model=TimeOut,
        summary="Is time healthy? Each timesvc replica's /status as this replica last polled it",
        description="The replicas are LEASEWATCH_TIMESVC_URLS, polled every "
        f"{TIME_POLL_INTERVAL_S:g} s (this answer is the last poll; it costs timesvc nothing). "
        "A replica is named by its position in the setting and the replica id it answered with, never "
        "by its URL.",
        responses={401: _REFUSALS[401]},
    )
    async def time_status(service: ServiceDep, authorization: AuthorizationHeader = None) -> TimeOut:
        require_reader(service, authorization)
        view = service.time_view
        replicas = view.snapshot() if view is not None else []
        return TimeOut(
            configured=len(replicas),
            poll_interval_s=min(TIME_POLL_INTERVAL_S, settings.trend_interval),
            healthy=None if not replicas else all(not r.problems for r in replicas),
            replicas=[_replica_time_out(r) for r in replicas],
        )

    @app.get(
        "/trends",
        response_model=TrendsOut,
        summary="The last hour (720 samples) of grants, waits, revocations, store errors and timesvc",
        description="One sample every LEASEWATCH_TREND_INTERVAL, kept in memory (a restart starts afresh). "
        "Counts are over each sample's interval, levels at its end; what this replica saw, in the "
        "partitions it watches.",
        responses={401: _REFUSALS[401], 422: _REFUSALS[422]},
    )
    async def trends(
        service: ServiceDep,
        limit: Annotated[int | None, Query(ge=1, le=100_000, description="only the newest this many")] = None,
        authorization: AuthorizationHeader = None,
    ) -> TrendsOut:
        require_reader(service, authorization)
        samples = service.trends.samples(limit)
        return TrendsOut(
            interval_s=settings.trend_interval,
            size=service.trends.size,
            window=TrendWindowOut(**asdict(trend_window(samples))),
            samples=[TrendSampleOut(**asdict(sample)) for sample in samples],
        )

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Store reachable and scans succeeding")
    async def readyz(service: ServiceDep, response: Response) -> dict[str, object]:
        ready, reasons = service.readiness()
        response.status_code = 200 if ready else 503
        status = service.partition_status
        return {
            "ready": ready,
            "reasons": reasons,
            "partitions": sorted(status.owned) if status is not None else [],
        }

    @app.get("/status", response_model=StatusOut, summary="Version, readiness, partitions, the last scan, the store")
    async def status(service: ServiceDep) -> StatusOut:
        ready, reasons = service.readiness()
        watcher, at, parts = service.watcher, service.last_scan_at, service.partition_status
        report = watcher.last_report if watcher is not None else None
        return StatusOut(
            replica=settings.replica_id,
            version=__version__,
            ready=ready,
            reasons=reasons,
            member=parts.member if parts is not None else None,
            partitions=sorted(parts.owned) if parts is not None else [],
            watching=sorted(parts.watching) if parts is not None else [],
            replicas_seen=list(parts.members) if parts is not None else [],
            partition_error=service.partition_error,
            last_scan_ok=service.last_scan_ok,
            last_scan_age_s=None if at is None else round(time.monotonic() - at, 3),
            locks=report.locks if report is not None else None,
            leases=report.leases if report is not None else None,
            last_scan=None
            if report is None
            else LastScanOut(
                locks=report.locks,
                looked=report.looked,
                leases=report.leases,
                due=report.due,
                revoked=report.revoked,
                seconds=round(report.seconds, 4),
                errors=report.errors[:10],
            ),
            revocations=watcher.revocations if watcher is not None else 0,
            scan_interval_s=settings.scan_interval,
            grace_s=settings.grace,
            partition_lease_s=settings.partition_lease,
            store=service.last_maintenance,
        )

    @app.get("/metrics", response_class=Response, summary="Prometheus metrics")
    async def metrics(service: ServiceDep) -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
