"""The lease watcher: revocation by observation, not by TTL (DESIGN.md §6).

Staleness is judged the way Kubernetes leader election judges it: the watcher
remembers, **on its own monotonic clock**, when it first saw each lease's current
value. A holder renews its record (``~holder`` in the lock's lease row) by
compare-and-set every ``lease/3``; a waiter rewrites its queue cell as often. A value
unchanged for longer than its lease length plus a grace is stale. No wall clock of one
machine is ever compared with another's, and no TTL decides anything — the thesis
needed a 15-minute TTL because cells vanished when node clocks drifted apart.

**When an observation is stamped.** The stamp is taken when the read that returned
the value has *completed*. A read that stalls (GC, a slow replica, a retried timeout)
may return a value written during the stall; stamping it with a time taken before the
read would date it too early and revoke up to the stall's length before the holder's
own deadline. Stamped after the read, the stamp is never earlier than the renewal
that wrote the value, so the watcher revokes no earlier than ``renewal start + lease
+ grace`` by its clock, while the holder gives up at ``renewal start + lease`` by its
own: the holder has always given up first, as long as the two clocks' rates differ by
less than ``grace / (2 * lease)`` (e.g. 10 % with the defaults, lease 10 s, grace 2 s).

**Revoking a holder** is ``delete ~holder if it still holds the value I watched go
stale`` — a compare-and-set — so a watcher paused between its observation and its
action cannot revoke a holder that renewed meanwhile, and several watchers may run:
only one compare-and-set can win. Then its queue cell is deleted.

**Revoking a waiter** deletes its queue cell with a timestamp well above the cell's
(``writetime + 1 h``): its later renewals can never bring it back, so a waiter that
was only slow finds its cell gone at its next look and queues again. A waiter
wrongly revoked loses its place, never safety.

**Orphans** — cells nobody renews that are not leases (a baseline contender's shadow
or main cell without a holder record, a malformed cell) — are cleared after the
orphan window, so no cell can block a lock forever.

**Cost**: a scan reads the lock index (64 shard rows of lock ids with live state) and,
per listed lock, its lease row (a plain read, no Paxos round), its queue from the
watermark and the two baseline rows. A lock id whose state is gone leaves the index
after the orphan window, so the work grows with live locks, not with history.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from leasewatch.observed import Observed
from lockclient.errors import StoreError
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HolderRecord, WaiterRecord, parse_fence
from lockclient.lockid import INDEX_SHARDS, index_shard, make_ticket
from lockclient.logs import get_logger
from lockclient.store import Cell, CellStore, Table
from lockclient.store.opener import public_error
from lockclient.watermark import parse_marks

__all__ = ["REVOKED_CELL_SHADOW_US", "LeaseView", "LockView", "Revocation", "ScanReport", "Watcher"]

log = get_logger("leasewatch")

REVOKED_CELL_SHADOW_US = 3_600_000_000
"""A revoked waiter's queue cell is deleted this far above its write timestamp: no renewal
the waiter sends before it notices can resurrect it (ticket columns are unique per attempt,
so nothing else is ever shadowed)."""


@dataclass
class _Observation:
    value: str
    changed_at: float  # watcher's monotonic clock, taken after the read that saw the value


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
    caller: str | None = None
    """Who asked, for an operator revocation: the name of the admin token used."""


@dataclass(frozen=True)
class LeaseView:
    owner: str
    ticket: str
    version: int
    lease: float
    holding: bool
    observed_age: float | None
    """Seconds since this watcher last saw the lease change (None: not seen yet)."""


@dataclass(frozen=True)
class LockView:
    lock_id: str
    holders: list[str]
    fencing_token: int
    fencing_owner: str
    queue: list[tuple[str, str]]
    """(ticket, owner) in order; the holder's cell first while it holds."""
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


@dataclass
class _LockState:
    """One lock's cells as one scan read them."""

    holder_raw: str | None
    holder: HolderRecord | None
    fence: str | None
    queue: list[Cell]
    backoff: list[Cell]
    shadow: list[Cell]


class Watcher:
    """Scans live leases and revokes the stale ones. Usable in-process.

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
        observed: Observed | None = None,
    ) -> None:
        if grace < 0 or orphan_after <= 0:
            raise ValueError("grace must be >= 0 and orphan_after > 0")
        self.store = store
        self.grace = grace
        self.orphan_after = orphan_after
        self.replica_id = replica_id
        self._monotonic = monotonic
        self._on_revoke = on_revoke
        self.observed = observed if observed is not None else Observed()
        """Grants, waits and store errors as this watcher saw them (leasewatch.observed)."""
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], _Observation] = {}
        self._orphans: dict[tuple[str, str, str], float] = {}
        self._idle: dict[str, tuple[float, int]] = {}  # lock id -> (first idle sighting, index cell timestamp)
        self.events: deque[Revocation] = deque(maxlen=500)
        self.revocations = 0
        self.last_report: ScanReport | None = None
        self.started_at = monotonic()

    # -- scanning ---------------------------------------------------------------------------------

    def index(self) -> list[Cell]:
        """The index cells (column = lock id), shard by shard."""
        cells: list[Cell] = []
        for shard in range(INDEX_SHARDS):
            cells.extend(self.store.read_row(Table.INDEX, str(shard)))
        return cells

    def lock_ids(self) -> list[str]:
        return [c.column for c in self.index()]

    def scan(self) -> ScanReport:
        """One pass over every lock with live state. Raises StoreError if the index cannot be read."""
        started = self._monotonic()
        report = ScanReport()
        with self._lock:
            seen_leases: set[tuple[str, str]] = set()
            seen_orphans: set[tuple[str, str, str]] = set()
            index = self.index()
            self.observed.begin_scan()
            for entry in index:
                report.locks += 1
                try:
                    self._scan_lock(entry, report, seen_leases, seen_orphans)
                except StoreError as exc:
                    report.errors.append(f"{entry.column}: {exc}")
                    log.warning("scan_lock_failed", lock_id=entry.column, error=str(exc))
                    self.observed.store_error("scan", type(exc).__name__, public_error(exc), entry.column)
            # Forget what no longer exists, so memory follows live state too.
            for key in set(self._leases) - seen_leases:
                del self._leases[key]
            for okey in set(self._orphans) - seen_orphans:
                del self._orphans[okey]
            listed = {c.column for c in index}
            self.observed.end_scan(listed)
            for idle in set(self._idle) - listed:
                del self._idle[idle]
        report.seconds = self._monotonic() - started
        self.last_report = report
        return report

    def _read(self, lock_id: str) -> _LockState:
        row = self.store.read_versioned(lock_id, serial=False)
        queue = self.store.read_row(Table.QUEUE, lock_id, start=queue_start(row))
        backoff = self.store.read_row(Table.BACKOFF_MAIN, lock_id)
        shadow = self.store.read_row(Table.BACKOFF_SHADOW, lock_id)
        holder_raw = row.get(HOLDER_COLUMN)
        holder: HolderRecord | None = None
        if holder_raw is not None:
            try:
                holder = HolderRecord.decode(holder_raw)
            except StoreError:
                holder = None  # malformed: treated as an orphan below
        return _LockState(holder_raw, holder, row.get(FENCE_COLUMN), queue, backoff, shadow)

    def _scan_lock(
        self,
        entry: Cell,
        report: ScanReport,
        seen_leases: set[tuple[str, str]],
        seen_orphans: set[tuple[str, str, str]],
    ) -> None:
        lock_id = entry.column
        state = self._read(lock_id)
        now = self._monotonic()  # after the reads completed: see "When an observation is stamped"

        # The holder's lease.
        if state.holder_raw is not None and state.holder is not None:
            key = (lock_id, HOLDER_COLUMN)
            seen_leases.add(key)
            report.leases += 1
            unchanged = self._observe(key, state.holder_raw, now)
            if unchanged is not None and unchanged > state.holder.lease + self.grace:
                if self._revoke_holder(lock_id, state.holder_raw, f"lease unchanged for {unchanged:.1f}s", unchanged):
                    report.revoked += 1
                self._leases.pop(key, None)
        elif state.holder_raw is not None:
            self._orphan(report, seen_orphans, now, lock_id, "holder", HOLDER_COLUMN, state.holder_raw)

        # Waiters' leases: their queue cells (the holder's own cell is covered by its record).
        holder_ticket = state.holder.ticket if state.holder is not None else None
        waiting: list[tuple[str, float]] = []
        for cell in state.queue:
            if cell.column == holder_ticket:
                continue
            try:
                record = WaiterRecord.decode(cell.value)
            except StoreError:
                self._orphan(report, seen_orphans, now, lock_id, str(Table.QUEUE), cell.column, cell.value, cell)
                continue
            key = (lock_id, cell.column)
            seen_leases.add(key)
            report.leases += 1
            waiting.append((cell.column, record.lease))
            unchanged = self._observe(key, cell.value, now)
            if unchanged is not None and unchanged > record.lease + self.grace:
                if self._revoke_waiter(lock_id, cell, record, f"lease unchanged for {unchanged:.1f}s", unchanged):
                    report.revoked += 1
                self._leases.pop(key, None)

        holder = state.holder
        self.observed.saw_lock(
            lock_id, None if holder is None else (holder.owner, holder.token, holder.ticket), waiting
        )

        # The baseline's cells: a contender's shadow or main cell without a holder record of
        # that owner blocks every later baseline attempt (ConcurrentAttempt forever).
        holder_owner = state.holder.owner if state.holder is not None else None
        for table, cells in ((Table.BACKOFF_MAIN, state.backoff), (Table.BACKOFF_SHADOW, state.shadow)):
            for cell in cells:
                if cell.column != holder_owner:
                    self._orphan(report, seen_orphans, now, lock_id, str(table), cell.column, cell.value, cell)

        # A lock with no state at all leaves the index after the window (cost follows live state).
        if state.holder_raw is None and not state.queue and not state.backoff and not state.shadow:
            first, stamp = self._idle.setdefault(lock_id, (now, entry.timestamp))
            if now - first > self.orphan_after:
                # Delete exactly the version seen idle first: a contender that listed the lock
                # again since wrote a newer version, which this tombstone cannot shadow.
                self.store.delete(Table.INDEX, index_shard(lock_id), lock_id, timestamp=stamp)
                del self._idle[lock_id]
        else:
            self._idle.pop(lock_id, None)

    def _observe(self, key: tuple[str, str], value: str, now: float) -> float | None:
        """Seconds the value has been unchanged, or None on a first sighting / a change."""
        obs = self._leases.get(key)
        if obs is None or obs.value != value:
            self._leases[key] = _Observation(value, now)
            return None
        return now - obs.changed_at

    def _orphan(
        self,
        report: ScanReport,
        seen: set[tuple[str, str, str]],
        now: float,
        lock_id: str,
        table: str,
        column: str,
        value: str,
        cell: Cell | None = None,
    ) -> None:
        okey = (table, lock_id, column)
        seen.add(okey)
        first = self._orphans.setdefault(okey, now)
        if now - first <= self.orphan_after:
            return
        del self._orphans[okey]
        if table == "holder":
            # A malformed holder record: only a compare-and-set on exactly that value removes it.
            if self.store.compare_and_set(lock_id, {HOLDER_COLUMN: value}, {HOLDER_COLUMN: None}).applied:
                report.orphans_cleared += 1
                log.warning("orphan_cleared", lock_id=lock_id, table="lock_lease", column=column)
            return
        assert cell is not None
        if table != str(Table.QUEUE):
            # Re-check right before deleting: the contender may have been granted meanwhile.
            row = self.store.read_versioned(lock_id)
            raw = row.get(HOLDER_COLUMN)
            if raw is not None and _owner_of(raw) == column:
                return
        self.store.delete(Table(table), lock_id, column, timestamp=cell.timestamp + REVOKED_CELL_SHADOW_US)
        report.orphans_cleared += 1
        log.warning("orphan_cleared", lock_id=lock_id, table=table, column=column)

    def queue_start(self, lock_id: str) -> str:
        """Where a read of this lock's queue starts: its published watermark."""
        return queue_start(self.store.read_versioned(lock_id, serial=False))

    # -- revocation ----------------------------------------------------------------------------

    def _revoke_holder(
        self, lock_id: str, raw: str, reason: str, unchanged: float | None, *, caller: str | None = None
    ) -> bool:
        """Compare-and-set delete of the record we watched; then its queue cell."""
        result = self.store.compare_and_set(lock_id, {HOLDER_COLUMN: raw}, {HOLDER_COLUMN: None})
        if not result.applied:
            log.info("revoke_skipped", lock_id=lock_id, detail="record changed or already gone")
            return False
        record = HolderRecord.decode(raw)
        if record.ticket:
            cell = self.store.get(Table.QUEUE, lock_id, record.ticket)
            if cell is not None:
                self.store.delete(
                    Table.QUEUE, lock_id, record.ticket, timestamp=cell.timestamp + REVOKED_CELL_SHADOW_US
                )
        backoff = self.store.get(Table.BACKOFF_MAIN, lock_id, record.owner)
        if backoff is not None:
            self.store.delete(Table.BACKOFF_MAIN, lock_id, record.owner, timestamp=backoff.timestamp + 1)
        self._record(lock_id, record.owner, reason, unchanged, holder=True, caller=caller)
        return True

    def _revoke_waiter(
        self,
        lock_id: str,
        cell: Cell,
        record: WaiterRecord,
        reason: str,
        unchanged: float | None,
        *,
        caller: str | None = None,
    ) -> bool:
        # Re-read right before deleting: a waiter that renewed since our look is alive.
        current = self.store.get(Table.QUEUE, lock_id, cell.column)
        if current is None or current.value != cell.value:
            log.info("revoke_skipped", lock_id=lock_id, owner=record.owner, detail="queue cell changed or gone")
            return False
        self.store.delete(Table.QUEUE, lock_id, cell.column, timestamp=current.timestamp + REVOKED_CELL_SHADOW_US)
        self._record(lock_id, record.owner, reason, unchanged, holder=False, caller=caller)
        return True

    def _record(
        self,
        lock_id: str,
        owner: str,
        reason: str,
        unchanged: float | None,
        *,
        holder: bool,
        caller: str | None = None,
    ) -> None:
        event = Revocation(
            lock_id=lock_id,
            owner=owner,
            reason=reason,
            unchanged_for=None if unchanged is None else round(unchanged, 3),
            at=datetime.now(UTC),
            by=self.replica_id,
            holder=holder,
            caller=caller,
        )
        self.events.append(event)
        self.revocations += 1
        log.warning(
            "lease_revoked",
            lock_id=lock_id,
            owner=owner,
            holder=holder,
            reason=reason,
            by=self.replica_id,
            caller=caller,
        )
        if self._on_revoke is not None:
            self._on_revoke(event)

    def revoke_now(
        self,
        lock_id: str,
        owner: str | None = None,
        *,
        reason: str = "revoked by an operator",
        caller: str | None = None,
    ) -> list[str]:
        """Operator revocation (``POST /revoke/{id}``): the holder, or one named owner.

        The holder is revoked by compare-and-set on the value just read, retried a few
        times if it renews in between; a waiter by deleting its queue cell."""
        revoked: list[str] = []
        with self._lock:
            for _ in range(5):
                state = self._read(lock_id)
                if state.holder_raw is not None and (owner is None or _owner_of(state.holder_raw) == owner):
                    if self._revoke_holder(lock_id, state.holder_raw, reason, None, caller=caller):
                        revoked.append(_owner_of(state.holder_raw))
                        self._leases.pop((lock_id, HOLDER_COLUMN), None)
                        return revoked
                    continue  # it renewed meanwhile: look again
                if owner is None:
                    return revoked
                for cell in state.queue:
                    try:
                        record = WaiterRecord.decode(cell.value)
                    except StoreError:
                        continue
                    if record.owner == owner and self._revoke_waiter(
                        lock_id, cell, record, reason, None, caller=caller
                    ):
                        revoked.append(owner)
                        return revoked
                return revoked
        return revoked

    # -- introspection -----------------------------------------------------------------------------

    def view(self, lock_id: str) -> LockView:
        state = self._read(lock_id)
        now = self._monotonic()
        token, fence_owner = parse_fence(state.fence)
        holders = [state.holder.owner] if state.holder is not None else []
        holders += [c.column for c in state.backoff if c.column not in holders]
        leases: dict[str, LeaseView] = {}
        with self._lock:
            if state.holder is not None and state.holder_raw is not None:
                obs = self._leases.get((lock_id, HOLDER_COLUMN))
                age = None if obs is None or obs.value != state.holder_raw else round(now - obs.changed_at, 3)
                h = state.holder
                leases[h.owner] = LeaseView(h.owner, h.ticket, h.version, h.lease, True, age)
            queue: list[tuple[str, str]] = []
            for cell in state.queue:
                try:
                    record = WaiterRecord.decode(cell.value)
                except StoreError:
                    queue.append((cell.column, "?"))
                    continue
                queue.append((cell.column, record.owner))
                if state.holder is not None and cell.column == state.holder.ticket:
                    continue
                obs = self._leases.get((lock_id, cell.column))
                age = None if obs is None or obs.value != cell.value else round(now - obs.changed_at, 3)
                leases[record.owner] = LeaseView(record.owner, cell.column, record.version, record.lease, False, age)
        return LockView(lock_id, holders, token, fence_owner, queue, leases, queue[0][0] if queue else None)


def queue_start(row: dict[str, str]) -> str:
    published, _ = parse_marks(row)
    return make_ticket(published, "")


def _owner_of(raw: str) -> str:
    try:
        return HolderRecord.decode(raw).owner
    except StoreError:
        return ""
