"""The lease watcher: revocation by observation, not by TTL (DESIGN.md §6).

Staleness is judged the way Kubernetes leader election judges it: the
watcher remembers, **on its own monotonic clock**, when it last saw each lease
record *change*. Holders and waiters renew by compare-and-set (``v -> v+1``),
so a live lease changes every ``lease/3``. A record unchanged for longer than
its lease length plus a grace is stale. No wall clock of one machine is ever
compared with another's, and no TTL decides anything — the thesis needed a
15-minute TTL because cells vanished when node clocks drifted apart by more
than the TTL.

Revocation is ``delete the record if it still holds the value I watched go
stale`` — compare-and-set again — so:

* a watcher paused between its observation and its action cannot revoke a
  holder that renewed meanwhile (the value differs, the delete does not apply);
* a freshly started watcher has no observations: the first sighting starts the
  clock, so it revokes nothing until it has watched a lease for a full length;
* several watchers may run: only one compare-and-set can win, the others see
  "not applied", and the cell deletions that follow are idempotent.

Only after the record is revoked are the owner's owner cell and queue cell
deleted, with ``writetime(cell) + 1`` — a timestamp that provably beats the
cell, whatever this machine's clock says (DESIGN.md "timestamps rule").

**Orphans** — queue or owner cells whose lease record does not exist (a
writer that crashed between its writes, a record lost to an operator) — are
found the same way: first sighting starts the clock, and after the orphan
window they are deleted, so no cell can block a lock forever.

**Cost**: the scan reads the lock index (64 shard rows of lock ids with live
state) and, per listed lock, its lease row, owner row and the queue from its
watermark. Lock ids whose state is gone are dropped from the index after the
orphan window, so the work grows with live leases, not with history.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lockclient.errors import StoreError
from lockclient.lease import FENCE_COLUMN, LeaseRecord, parse_fence
from lockclient.locker import INDEX_SHARDS
from lockclient.lockid import make_ticket
from lockclient.logs import get_logger
from lockclient.store import Cell, CellStore, Table

__all__ = ["LeaseView", "LockView", "Revocation", "ScanReport", "Watcher"]

log = get_logger("leasewatch")


@dataclass
class _Observation:
    value: str
    changed_at: float  # watcher's monotonic clock


@dataclass(frozen=True)
class Revocation:
    """One revocation, as recorded in the event log."""

    lock_id: str
    owner: str
    reason: str
    unchanged_for: float | None
    at: datetime
    by: str
    holder: bool


@dataclass(frozen=True)
class LeaseView:
    owner: str
    ticket: str
    version: int
    lease: float
    holding: bool
    observed_age: float | None
    """Seconds since this watcher last saw the record change (None: not seen yet)."""


@dataclass(frozen=True)
class LockView:
    lock_id: str
    holders: list[str]
    fencing_token: int
    fencing_owner: str
    queue: list[tuple[str, str]]
    """(ticket, owner) in order."""
    leases: dict[str, LeaseView]
    head: str | None


@dataclass
class ScanReport:
    locks: int = 0
    leases: int = 0
    revoked: int = 0
    orphans_cleared: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def _cell_map(cells: list[Cell]) -> dict[str, Cell]:
    return {c.column: c for c in cells}


class Watcher:
    """Scans live lease records and revokes the stale ones. Usable in-process.

    ``scan()`` is one full pass; a service calls it every ``scan_interval``
    (APScheduler in :mod:`leasewatch.app`). ``monotonic`` is injectable so
    tests can move time.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        grace: float = 2.0,
        orphan_after: float = 12.0,
        replica_id: str = "leasewatch",
        monotonic: Callable[[], float] = time.monotonic,
        on_revoke: Callable[[Revocation], None] | None = None,
    ) -> None:
        if grace < 0 or orphan_after <= 0:
            raise ValueError("grace must be >= 0 and orphan_after > 0")
        self.store = store
        self.grace = grace
        self.orphan_after = orphan_after
        self.replica_id = replica_id
        self._monotonic = monotonic
        self._on_revoke = on_revoke
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], _Observation] = {}
        self._orphans: dict[tuple[str, str, str], float] = {}
        self._idle_locks: dict[str, float] = {}
        self.events: deque[Revocation] = deque(maxlen=500)
        self.revocations = 0
        self.last_report: ScanReport | None = None
        self.started_at = monotonic()

    # -- scanning ---------------------------------------------------------------------------------

    def lock_ids(self) -> list[str]:
        ids: list[str] = []
        for shard in range(INDEX_SHARDS):
            ids.extend(c.column for c in self.store.read_row(Table.INDEX, str(shard)))
        return ids

    def scan(self) -> ScanReport:
        """One pass over every lock with live state. Raises StoreError if the index cannot be read."""
        started = self._monotonic()
        report = ScanReport()
        with self._lock:
            seen_leases: set[tuple[str, str]] = set()
            seen_orphans: set[tuple[str, str, str]] = set()
            lock_ids = self.lock_ids()
            for lock_id in lock_ids:
                report.locks += 1
                try:
                    self._scan_lock(lock_id, report, seen_leases, seen_orphans)
                except StoreError as exc:
                    report.errors.append(f"{lock_id}: {exc}")
                    log.warning("scan_lock_failed", lock_id=lock_id, error=str(exc))
            # Forget what no longer exists, so memory follows live state too.
            for key in set(self._leases) - seen_leases:
                del self._leases[key]
            for okey in set(self._orphans) - seen_orphans:
                del self._orphans[okey]
            for idle in set(self._idle_locks) - set(lock_ids):
                del self._idle_locks[idle]
        report.seconds = self._monotonic() - started
        self.last_report = report
        return report

    def _scan_lock(
        self,
        lock_id: str,
        report: ScanReport,
        seen_leases: set[tuple[str, str]],
        seen_orphans: set[tuple[str, str, str]],
    ) -> None:
        now = self._monotonic()
        row = self.store.read_versioned(lock_id)
        row.pop(FENCE_COLUMN, None)
        for owner, raw in row.items():
            key = (lock_id, owner)
            seen_leases.add(key)
            report.leases += 1
            obs = self._leases.get(key)
            if obs is None or obs.value != raw:
                self._leases[key] = _Observation(raw, now)
                continue
            record = LeaseRecord.decode(raw)
            unchanged = now - obs.changed_at
            if unchanged > record.lease + self.grace:
                if self._revoke(lock_id, owner, raw, record, f"lease unchanged for {unchanged:.1f}s", unchanged):
                    report.revoked += 1
                del self._leases[key]
        leases = set(row)
        # Cells whose owner has no lease record: orphans, cleared after the same kind of window.
        owners = self.store.read_row(Table.OWNER, lock_id)
        queue = self.store.read_row(Table.QUEUE, lock_id, start=self._queue_start(lock_id))
        backoff = self.store.read_row(Table.BACKOFF_MAIN, lock_id)
        shadow = self.store.read_row(Table.BACKOFF_SHADOW, lock_id)
        candidates = [(Table.OWNER, c) for c in owners if c.column not in leases]
        candidates += [(Table.QUEUE, c) for c in queue if c.value not in leases]
        candidates += [(Table.BACKOFF_MAIN, c) for c in backoff if c.column not in leases]
        # A baseline contender that died between its shadow write and delete would block
        # every later baseline attempt (ConcurrentAttempt forever).
        candidates += [(Table.BACKOFF_SHADOW, c) for c in shadow if c.column not in leases]
        for table, cell in candidates:
            okey = (str(table), lock_id, cell.column)
            seen_orphans.add(okey)
            first = self._orphans.setdefault(okey, now)
            if now - first > self.orphan_after:
                # Re-check right before deleting: a lease record is written before its cells,
                # and an owner never re-creates one, so "still no record" is final.
                owner = cell.value if table is Table.QUEUE else cell.column
                if owner not in self.store.read_versioned(lock_id):
                    self.store.delete(table, lock_id, cell.column, timestamp=cell.timestamp + 1)
                    report.orphans_cleared += 1
                    log.warning("orphan_cleared", lock_id=lock_id, table=str(table), column=cell.column)
                del self._orphans[okey]
        # A lock with no state at all leaves the index after the window (cost follows live state).
        if not row and not owners and not queue and not backoff and not shadow:
            first_idle = self._idle_locks.setdefault(lock_id, now)
            if now - first_idle > self.orphan_after:
                from lockclient.locker import index_shard

                entry = self.store.get(Table.INDEX, index_shard(lock_id), lock_id)
                if entry is not None:
                    self.store.delete(Table.INDEX, index_shard(lock_id), lock_id, timestamp=entry.timestamp + 1)
                del self._idle_locks[lock_id]
        else:
            self._idle_locks.pop(lock_id, None)

    def _queue_start(self, lock_id: str) -> str:
        cell = self.store.get(Table.WATERMARK, lock_id, "head")
        return make_ticket(int(cell.value), "") if cell is not None else ""

    # -- revocation ----------------------------------------------------------------------------

    def _revoke(
        self, lock_id: str, owner: str, raw: str, record: LeaseRecord, reason: str, unchanged: float | None
    ) -> bool:
        """Compare-and-set delete of the record we watched; then the cells, beating their timestamps."""
        result = self.store.compare_and_set(lock_id, {owner: raw}, {owner: None})
        if not result.applied:
            log.info("revoke_skipped", lock_id=lock_id, owner=owner, detail="record changed or already revoked")
            return False
        held = self._delete_cells(lock_id, owner, record.ticket)
        event = Revocation(
            lock_id=lock_id,
            owner=owner,
            reason=reason,
            unchanged_for=None if unchanged is None else round(unchanged, 3),
            at=datetime.now(UTC),
            by=self.replica_id,
            holder=record.holding or held,
        )
        self.events.append(event)
        self.revocations += 1
        log.warning(
            "lease_revoked",
            lock_id=lock_id,
            owner=owner,
            holder=event.holder,
            reason=reason,
            by=self.replica_id,
        )
        if self._on_revoke is not None:
            self._on_revoke(event)
        return True

    def _delete_cells(self, lock_id: str, owner: str, ticket: str) -> bool:
        """Delete the owner's cells; True if it had an owner cell (it was the holder)."""
        cell = self.store.get(Table.OWNER, lock_id, owner)
        if cell is not None:
            self.store.delete(Table.OWNER, lock_id, owner, timestamp=cell.timestamp + 1)
        if ticket:
            qcell = self.store.get(Table.QUEUE, lock_id, ticket)
            if qcell is not None:
                self.store.delete(Table.QUEUE, lock_id, ticket, timestamp=qcell.timestamp + 1)
        bcell = self.store.get(Table.BACKOFF_MAIN, lock_id, owner)
        if bcell is not None:
            self.store.delete(Table.BACKOFF_MAIN, lock_id, owner, timestamp=bcell.timestamp + 1)
        return cell is not None or bcell is not None

    def revoke_now(
        self, lock_id: str, owner: str | None = None, *, reason: str = "revoked by an operator"
    ) -> list[str]:
        """Operator revocation (``POST /locks/{id}/revoke``): the holder, or one named owner.

        Still a compare-and-set on the value just read, so it never races a renewal into a
        half-revoked state; retried a few times if the owner renews in between.
        """
        revoked: list[str] = []
        with self._lock:
            for _ in range(5):
                row = self.store.read_versioned(lock_id)
                row.pop(FENCE_COLUMN, None)
                if owner is not None:
                    targets = {owner: row[owner]} if owner in row else {}
                else:
                    holders = {c.column for c in self.store.read_row(Table.OWNER, lock_id)}
                    holders |= {c.column for c in self.store.read_row(Table.BACKOFF_MAIN, lock_id)}
                    targets = {o: v for o, v in row.items() if o in holders or LeaseRecord.decode(v).holding}
                if not targets:
                    return revoked
                pending = False
                for target, raw in targets.items():
                    if self._revoke(lock_id, target, raw, LeaseRecord.decode(raw), reason, None):
                        revoked.append(target)
                        self._leases.pop((lock_id, target), None)
                    else:
                        pending = True
                if not pending:
                    return revoked
        return revoked

    # -- introspection -----------------------------------------------------------------------------

    def view(self, lock_id: str) -> LockView:
        now = self._monotonic()
        row = self.store.read_versioned(lock_id)
        token, fence_owner = parse_fence(row.pop(FENCE_COLUMN, None))
        holders = [c.column for c in self.store.read_row(Table.OWNER, lock_id)]
        holders += [c.column for c in self.store.read_row(Table.BACKOFF_MAIN, lock_id)]
        queue = [
            (c.column, c.value) for c in self.store.read_row(Table.QUEUE, lock_id, start=self._queue_start(lock_id))
        ]
        leases: dict[str, LeaseView] = {}
        for owner, raw in row.items():
            record = LeaseRecord.decode(raw)
            with self._lock:
                obs = self._leases.get((lock_id, owner))
            age = None if obs is None or obs.value != raw else round(now - obs.changed_at, 3)
            leases[owner] = LeaseView(owner, record.ticket, record.version, record.lease, record.holding, age)
        return LockView(lock_id, holders, token, fence_owner, queue, leases, queue[0][0] if queue else None)
