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
A scan reads many locks in a few bulk reads and stamps everything they returned with
one time taken after the *last* of them completed: later than needed, never earlier.

**Revoking a holder** is ``delete ~holder if it still holds the value I watched go
stale`` — a compare-and-set — so a watcher paused between its observation and its
action cannot revoke a holder that renewed meanwhile, and several watchers may run:
only one compare-and-set can win. Then its queue cell is deleted.

**Several holders.** A semaphore's or read-write lock's lease row holds one holder record per
slot (``~holder:<k>``, :mod:`lockclient.sharedqueue`) beside a writer's ``~holder``. Each is a
lease of its own, watched and revoked exactly like a lock's holder — by compare-and-set on the
value watched, with the slot's own end record ``~ended:<k>`` — and each holder's queue cell is
covered by its record, as a lock holder's is. A *parked* record (``min_hold``, :mod:`lockclient.hold`)
carries the rest of its hold as its lease length: it is removed no earlier than that after it was
first seen (and does not count towards :attr:`Watcher.longest_lease`, which bounds holders' leases).

**Revoking a waiter** deletes its queue cell with a timestamp well above the cell's
(``writetime + 1 h``), after re-reading it unchanged: its later renewals can never
bring it back, so a waiter that was only slow finds its cell gone at its next look and
queues again. A waiter wrongly revoked loses its place, never safety.

**A fresh watcher revokes nothing before it has watched a lease for a full lease**: a
first sighting starts the clock; nothing is inferred from values seen before.

**Orphans** — cells nobody renews that are not leases (a baseline contender's shadow
or main cell without a holder record, a malformed cell) — are cleared after the
orphan window, so no cell can block a lock forever.

**When it looks, and the bound.** A scan (every ``scan_interval``) reads the lock
index of the partitions this replica watches, then *looks* — reads the lease row, the
queue from its watermark and, for lock ids the baseline algorithm listed, its two rows —
at the locks that are due, in a few bulk reads (:meth:`CellStore.read_rows_many`,
:meth:`CellStore.read_versioned_many`), never one read per lock. A lock is due

* when its index entry changed: every enqueue rewrites it, so a new contender (waiter, or
  holder-to-be) is seen within one scan — and looked at once more at the next scan, in
  case its queue cell landed just after its index entry;
* otherwise every *look period* ``max(scan_interval, LOOK_FRACTION × the shortest lease
  seen on the lock at its last look)`` — 1 s for the default 10 s lease, 6 s for a
  60 s lease (a lock without leases: every ``max(scan_interval, orphan_after / 4)``).

So the stamp of a holder's or waiter's last renewal is at most one look period (plus a
scan's duration) late. A lease whose deadline (``stamp + lease + grace``) comes before
its lock's next look also goes on a *due schedule* (a heap by deadline): at that
deadline exactly, :meth:`Watcher.check_due` re-reads only those locks and revokes what
is still unchanged. Hence a dead holder or waiter is revoked within ``lease + grace +
max(scan_interval, lease × LOOK_FRACTION)`` (plus a scan's duration and the due check's
read) of its last successful renewal, and the work per second follows what is due —
the locks divided by their look periods, plus one index read — not the history, and
with long leases not even every live lock.

**Idle index entries** are deleted with the timestamp the entry had when the lock was
first seen idle, so a contender that listed the lock again meanwhile (a newer write)
is never unlisted. And never sooner than ``max(orphan_after, INDEX_KEPT_S)`` after a look
that read that version idle with global time known to have passed its stamp: clients rely
on an index entry they saw written staying that long (:mod:`lockclient.listing`), so a
re-take need not wait for its index write before it writes its queue cell. Without a
``GlobalTime`` cell (nobody publishes global time in the store) no entry is deleted.

**Index entries stamped ahead.** "Every enqueue rewrites it" holds only if the rewrite wins
last-write-wins. A contender stamps the entry with its ticket, the *upper* end of global time's
interval (lockclient.clock): never below global time, but up to the interval's width above it —
and after a pause during a ``/now`` round trip that width is the pause (the simulator's seed
1676192381: a client paused 6 s stamped entries 7.2 s ahead, every other contender's entry for
the next 7 s lost to them, the lock stayed on the idle schedule, and a holder granted and dead
in that time was first seen 4.6 s after its grant and revoked 3.2 s beyond the bound). A write
can only lose while global time is below the entry's stamp, since every stamp is at least global
time. So each scan also reads the ``GlobalTime`` cell (one cell) and extrapolates it into a lower
bound of global time, as a client's clock does; a lock whose entry is stamped at or above it is
looked at *every scan* until global time has passed the stamp, and at that scan and the next, as
after a change. Usually that is one more look after an enqueue (the cell lags global time by up
to a tick); idle ids, stamped long ago, cost nothing more. The same bound keeps an idle entry
stamped ahead from being deleted (its tombstone would shadow a re-listing stamped below it), and
keeps the window of the incremental index read from rising above global time (one entry stamped
far ahead would hide every new one until the next full read). Without a ``GlobalTime`` cell in the
store (nobody publishes global time there) entries are not judged ahead.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from leasewatch.observed import Observed
from lockclient.admin import REVOKED_CELL_SHADOW_US, end_holder
from lockclient.backoff import BACKOFF_INDEX_MARK
from lockclient.clock import DRIFT
from lockclient.errors import StoreError, StoreOutcomeUnknown
from lockclient.globaltime import GLOBAL_TIME_COLUMN, GLOBAL_TIME_ROW
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HolderRecord,
    WaiterRecord,
    ended_column_for,
    holder_columns,
    is_holder_column,
    parse_fence,
)
from lockclient.listing import INDEX_KEPT_S
from lockclient.lockid import INDEX_SHARDS, index_shard, make_ticket
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.settle import ENDED_COLUMN, EndRecord
from lockclient.store import Cell, CellStore, Table
from lockclient.store.base import ANY, CompareAndSet, Delete, Get, Op, ReadRow, new_attempt_id
from lockclient.store.opener import public_error
from lockclient.watermark import HEAD, parse_marks

__all__ = [
    "LOOK_FRACTION",
    "REVOKED_CELL_SHADOW_US",
    "LeaseView",
    "LockSummaryView",
    "LockView",
    "Revocation",
    "ScanReport",
    "Watcher",
]

log = get_logger("leasewatch")

LOOK_FRACTION = 0.1
"""A lock is read at least once per this fraction of its shortest lease (and per scan interval)."""
INDEX_FULL_EVERY = 10
"""Every this many scans the whole lock index is read; in between only entries written in the
last ``INDEX_WINDOW_US`` (new contenders), filtered inside the store."""
INDEX_WINDOW_US = 10_000_000
"""How far below the newest index entry seen — or below global time, if that is lower — an entry
still counts as new: contenders stamp their entries with global time (never below it), so a new one
is never that far behind another; but an entry stamped far ahead of global time must not raise the
window above the entries stamped correctly after it (see "Index entries stamped ahead")."""

# A revoked waiter's (or holder's) queue cell is deleted this far above its write timestamp: see
# lockclient.admin, which ends a holder record for leasewatch and for `lockctl revoke` alike.

_Key = tuple[str, str]
"""(lock id, ``~holder``) for a holder's lease — (lock id, ``~holder:<k>``) for the holder of a slot
of a semaphore or read-write lock (:mod:`lockclient.sharedqueue`) — and (lock id, ticket) for a
waiter's. Tickets start with digits, holder columns with ``~``, so the two never meet."""


@dataclass(slots=True)
class _Observation:
    value: str
    changed_at: float
    """The watcher's monotonic clock, taken after the read that first returned this value."""
    lease: float
    owner: str
    ticket: str
    """A holder's: the ticket of its queue cell; a waiter's: its own ticket."""
    token: int = 0
    """A holder's fencing token (0 for a waiter)."""
    queued: float = 0.0
    """The deadline it sits on the due schedule with (0: not on it)."""


@dataclass(slots=True)
class _LockWatch:
    """What the watcher keeps per listed lock, between looks."""

    index_ts: int
    """The write timestamp of its index entry: every enqueue rewrites it, so a change means a new
    contender arrived (renewals never touch it)."""
    baseline: bool = False
    """Listed by the baseline algorithm (its two rows are read too)."""
    shard: int = 0
    bucket: int = -1
    """The time-wheel slot of its next look (see ``Watcher._wheel``)."""
    seen: int = 0
    """The scan that last found it listed."""
    next_look: float = 0.0
    again: int = 2
    """Looks still owed because the index entry changed (a new contender): this scan and the
    next, so that a queue cell written a moment after its index entry is seen at once too."""
    keys: tuple[_Key, ...] = ()
    """The leases observed at the last look."""
    orphans: dict[tuple[str, str], float] | None = None
    """(table, column) -> first sighting of a cell that is nobody's lease."""
    idle_since: float | None = None
    idle_ts: int = 0
    inherited: bool = False
    """Listed by the first index read of its shard here (this replica's start, or a partition
    taken over): a holder found at its first look was granted before we watched."""


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
    token: int = 0
    """The holder's fencing token (0 for a waiter)."""
    since_us: int = 0
    """A stamped grant's global time (an election's term; 0: not stamped)."""
    until_us: int = 0
    """A parked record's hold (``min_hold``): held until this global time (0: not parked)."""
    mode: str = ""
    """A queue cell's mode (``r`` / ``w`` for a read-write lock's reader / writer)."""
    label: str = ""
    """The owner's label (``get_lock(..., label=...)``; empty: none)."""
    payload: str = ""
    """The holder's payload (empty for a waiter, or none given)."""
    granted_us: int = 0
    """The holder's grant, in global µs, estimated (0: unknown)."""


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
    slots: dict[str, LeaseView] = field(default_factory=dict)
    """Holder column (``~holder``, ``~holder:<k>``) -> its holder: a semaphore's or read-write lock's
    several holders, by slot."""
    modes: dict[str, str] = field(default_factory=dict)
    """Ticket -> the mode of its queue cell (``r``, ``w``; absent for a lock's or a semaphore's)."""
    limit: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    """Ticket -> the label of its queue cell (absent: none)."""
    """A semaphore's limit (a read-write lock's max_readers), as stored."""


@dataclass(frozen=True)
class LockSummaryView:
    """One line of :meth:`Watcher.page`."""

    lock_id: str
    holder: str | None
    fencing_token: int
    queue_length: int
    oldest_lease_age: float | None
    most_overdue: float | None = None
    """The largest (unchanged for / its lease length) of its leases: above 1 a lease is overdue."""
    holder_label: str = ""
    """The holder's label (a semaphore's first slot's; empty: none)."""


@dataclass
class ScanReport:
    locks: int = 0
    leases: int = 0
    revoked: int = 0
    orphans_cleared: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    due: int = 0
    """Leases waiting on the due schedule after this pass."""
    looked: int = 0
    """Locks read in this pass (the others were not due for a look)."""


@dataclass
class _LockState:
    """One lock's cells as one read saw them."""

    holder_raw: str | None
    holder: HolderRecord | None
    fence: str | None
    queue: list[Cell]
    backoff: list[Cell]
    shadow: list[Cell]
    slots: dict[str, str] = field(default_factory=dict)
    """Every holder column (``~holder`` and a semaphore's or read-write lock's ``~holder:<k>``) -> its
    raw record."""
    limit: str | None = None


@dataclass
class _Reads:
    """What one scan (or one due check) read, and when the reads had all completed."""

    rows: dict[str, dict[str, str]]
    queues: dict[str, list[Cell]]
    backoff: dict[str, list[Cell]]
    shadow: dict[str, list[Cell]]
    at: float


_Stale = tuple[_Key, _Observation, float]
"""A lease found stale: its key, the observation, and how long it was unchanged."""


class Watcher:
    """Scans live leases and revokes the stale ones. Usable in-process.

    ``scan()`` is one full pass over the given index shards (all of them by default); a
    service calls it every ``scan_interval`` and :meth:`check_due` whenever
    :meth:`next_due` has come (:mod:`leasewatch.app`). ``monotonic`` is injectable so
    tests can move time.
    """

    def __init__(
        self,
        store: CellStore,
        *,
        grace: float = 2.0,
        orphan_after: float = 12.0,
        replica_id: str = "leasewatch",
        monotonic: Callable[[], float] | None = None,
        on_revoke: Callable[[Revocation], None] | None = None,
        scan_interval: float = 1.0,
        observed: Observed | None = None,
        runtime: Runtime = THREADS,
    ) -> None:
        if grace < 0 or orphan_after <= 0 or scan_interval <= 0:
            raise ValueError("grace must be >= 0, orphan_after and scan_interval > 0")
        self.store = store
        self.grace = grace
        self.orphan_after = orphan_after
        self.replica_id = replica_id
        self._monotonic = monotonic = monotonic or runtime.monotonic
        self._on_revoke = on_revoke
        self.scan_interval = scan_interval
        self.observed = observed if observed is not None else Observed()
        """Grants, waits and store errors as this watcher saw them (leasewatch.observed)."""
        self._runtime = runtime
        self._lock = runtime.lock()  # held across the store calls of a scan or a due check
        self._leases: dict[_Key, _Observation] = {}
        self._locks: dict[str, _LockWatch] = {}
        # The next looks, by time slot (monotonic seconds / scan interval): slot -> lock ids,
        # and a heap of the slots in use. A scan takes the slots that have come, not every lock.
        self._wheel: dict[int, set[str]] = {}
        self._slots: list[int] = []
        self._again: set[str] = set()
        self._shards: frozenset[int] | None = None
        self._index_high: int | None = None
        # Global time from the store's GlobalTime cell: (value µs, monotonic s after the read that
        # returned it), extrapolated into a lower bound (see "Index entries stamped ahead").
        self._global: tuple[int, float] | None = None
        self._ahead: dict[str, int] = {}
        """Lock id -> the write timestamp of its index entry, while global time has not surely
        passed it: a contender's index write may not change the entry, so it is looked at every scan."""
        self._due: list[tuple[float, int, _Key, str]] = []  # (deadline, seq, key, value): a heap
        self._seq = itertools.count()
        self._scan_no = 0
        self.events: deque[Revocation] = deque(maxlen=500)
        self.revocations = 0
        self.last_report: ScanReport | None = None
        self.longest_lease = 0.0
        """The longest lease this watcher has seen (never decreases): how long a new watcher of
        the same locks needs before it may revoke any of them."""
        self.started_at = monotonic()

    # -- scanning ---------------------------------------------------------------------------------

    def index(self, shards: Iterable[int] | None = None) -> list[Cell]:
        """The index cells (column = lock id), shard by shard."""
        rows = [str(s) for s in (range(INDEX_SHARDS) if shards is None else shards)]
        found = self.store.read_rows_many(Table.INDEX, rows)
        return [cell for row in rows for cell in found.get(row, ())]

    def lock_ids(self) -> list[str]:
        return [c.column for c in self.index()]

    def scan(self, shards: Collection[int] | None = None) -> ScanReport:
        """One pass over the locks with live state in ``shards`` (index shards = partitions;
        all by default): read the index — every ``INDEX_FULL_EVERY`` scans all of it, in
        between only what was written lately — look at the locks that are due, revoke what is
        stale. Raises StoreError if the reads fail; a failure while revoking is reported in
        ``errors`` and retried at the next pass."""
        started = self._monotonic()
        report = ScanReport()
        wanted = frozenset(range(INDEX_SHARDS) if shards is None else shards)
        with self._lock:
            self._scan_no += 1
            scan_no = self._scan_no
            full = wanted != self._shards or self._index_high is None or scan_no % INDEX_FULL_EVERY == 0
            rows = [str(shard) for shard in sorted(wanted)]
            if full:
                found = self.store.read_rows_many(Table.INDEX, rows)
            else:
                assert self._index_high is not None
                # Never above global time: an entry stamped far ahead must not push the window past
                # the entries correctly stamped after it (see "Index entries stamped ahead").
                floor = self._global_floor(self._monotonic())
                high = self._index_high if floor is None else min(self._index_high, floor)
                found = self.store.read_rows_many(Table.INDEX, rows, newer_than=high - INDEX_WINDOW_US)
            self._read_global_time()
            at = self._monotonic()
            floor = self._global_floor(at)
            ahead = self._ahead
            locks = self._locks
            high = self._index_high or 0
            known_shards = self._shards or frozenset()
            for row, cells in found.items():
                shard = int(row)
                inherited = shard not in known_shards
                for cell in cells:
                    watch = locks.get(cell.column)
                    if watch is None:
                        watch = locks[cell.column] = _LockWatch(cell.timestamp, shard=shard, inherited=inherited)
                        self._again.add(cell.column)
                    elif watch.index_ts != cell.timestamp:
                        watch.index_ts, watch.again = cell.timestamp, 2
                        self._again.add(cell.column)
                    watch.baseline = cell.value == BACKOFF_INDEX_MARK
                    watch.seen = scan_no
                    high = max(high, cell.timestamp)
                    if floor is not None and cell.timestamp >= floor:
                        ahead[cell.column] = cell.timestamp
            self._index_high = high
            if full:
                # Forget the locks no longer listed (or no longer ours to watch).
                for lock_id in [k for k, watch in locks.items() if watch.seen != scan_no]:
                    self._forget(lock_id)
                self._shards = wanted
            # Due: what changed (twice), and what the wheel says — with half a scan of tolerance,
            # so a look due "at the next scan" is never put off because that scan started early.
            due = set(self._again)
            if ahead:
                self._due_ahead(floor, due)
            now_slot = self._slot(at + self.scan_interval / 2)
            while self._slots and self._slots[0] <= now_slot:
                for lock_id in self._wheel.pop(heapq.heappop(self._slots), ()):
                    due.add(lock_id)
                    if lock_id in locks:
                        locks[lock_id].bucket = -1  # taken off the wheel: rescheduled by its look
            due_ids = sorted(lock_id for lock_id in due if lock_id in locks)
            try:
                reads = self._read_many(due_ids)
            except StoreError:
                # Taken off the wheel above, rescheduled only by a look: look again next scan (else
                # a lock whose look failed once is never looked at again until its index entry
                # changes — found by the simulator: a parked holder left for good).
                self._look_again(due_ids)
                raise
            now = reads.at  # after every read completed: see "When an observation is stamped"
            stale: list[_Stale] = []
            for lock_id in due_ids:
                try:
                    self._judge(lock_id, locks[lock_id], reads, at, now, report, stale)
                except StoreError as exc:
                    # Reported by /status, which needs no token: what failed, not where, and no
                    # lock id (a business identifier); the log has both.
                    report.errors.append(f"scan: {public_error(exc)}")
                    log.warning("scan_lock_failed", lock_id=lock_id, error=str(exc))
                    self.observed.store_error("scan", type(exc).__name__, public_error(exc), lock_id)
                    self._look_again([lock_id])
            self._revoke_stale(stale, reads, report)
            self._check_due_locked(report)  # whatever came due meanwhile, also for in-process callers
            report.locks, report.looked, report.leases = len(locks), len(due_ids), len(self._leases)
            report.due = len(self._due)
        report.seconds = self._monotonic() - started
        self.last_report = report
        return report

    def _read_global_time(self) -> None:
        """Read the GlobalTime cell (one cell: timesvc, or an embedded store clock, keeps it).
        A failed read keeps the last value: extrapolated, it is still a lower bound."""
        try:
            cell = self.store.get(Table.GLOBAL_TIME, GLOBAL_TIME_ROW, GLOBAL_TIME_COLUMN)
        except StoreError as exc:
            log.debug("global_time_read_failed", error=str(exc))
            return
        arrived = self._monotonic()
        if cell is None:
            return  # nobody published global time in this store: entries are not judged ahead
        try:
            value = int(cell.value)
        except ValueError:
            return
        if self._global is None or self._lower_at(*self._global, arrived) < value:
            self._global = (value, arrived)

    def _global_floor(self, now: float) -> int | None:
        """A lower bound of global time now (µs), or None if it was never read."""
        return None if self._global is None else self._lower_at(*self._global, now)

    @staticmethod
    def _lower_at(value: int, arrived: float, now: float) -> int:
        # As lockclient.clock's lower end: global time advances at real rate, this monotonic clock
        # may run fast by the rate bound — the same assumption every client's interval makes.
        return value + int(max(0.0, now - arrived) * (1 - DRIFT) * 1e6)

    def _due_ahead(self, floor: int | None, due: set[str]) -> None:
        """Locks whose index entry is stamped at or above global time are looked at every scan;
        once global time has passed the stamp, at this scan and the next (as for a change)."""
        for lock_id, stamp in list(self._ahead.items()):
            watch = self._locks.get(lock_id)
            if watch is None:
                del self._ahead[lock_id]
            elif floor is not None and stamp < floor:
                # Every index write from now on is stamped above the entry, so it changes it. Writes
                # hidden until now: looked for now and at the next scan, like a change just seen.
                del self._ahead[lock_id]
                watch.again = max(watch.again, 2)
                self._again.add(lock_id)
                due.add(lock_id)
            else:
                due.add(lock_id)

    def _look_again(self, lock_ids: list[str]) -> None:
        """Look at these locks at the next scan (their look failed before it rescheduled them)."""
        for lock_id in lock_ids:
            watch = self._locks.get(lock_id)
            if watch is not None:
                watch.again = max(watch.again, 1)
                self._again.add(lock_id)

    def _slot(self, when: float) -> int:
        return int(when / self.scan_interval)

    def _schedule(self, lock_id: str, watch: _LockWatch, when: float) -> None:
        slot = self._slot(when)
        if slot == watch.bucket:
            return
        if watch.bucket >= 0:
            self._wheel.get(watch.bucket, set()).discard(lock_id)
        members = self._wheel.get(slot)
        if members is None:
            members = self._wheel[slot] = set()
            heapq.heappush(self._slots, slot)
        members.add(lock_id)
        watch.bucket = slot

    def _forget(self, lock_id: str) -> None:
        watch = self._locks.pop(lock_id)
        self.observed.forget(lock_id)
        for key in watch.keys:
            self._leases.pop(key, None)
        if watch.bucket >= 0:
            self._wheel.get(watch.bucket, set()).discard(lock_id)
        self._again.discard(lock_id)
        self._ahead.pop(lock_id, None)

    def _read_many(self, lock_ids: list[str]) -> _Reads:
        """The lease rows, the queues (each from its watermark) and, for lock ids the baseline
        listed, its two rows: a few bulk reads, whatever the number of locks."""
        rows = self.store.read_versioned_many(lock_ids) if lock_ids else {}
        starts = {lock_id: queue_start(row) for lock_id, row in rows.items() if HEAD in row}
        queues = self.store.read_rows_many(Table.QUEUE, lock_ids, starts) if lock_ids else {}
        baseline = [lock_id for lock_id in lock_ids if self._locks[lock_id].baseline]
        backoff = self.store.read_rows_many(Table.BACKOFF_MAIN, baseline) if baseline else {}
        shadow = self.store.read_rows_many(Table.BACKOFF_SHADOW, baseline) if baseline else {}
        return _Reads(rows, queues, backoff, shadow, self._monotonic())

    def _judge(
        self,
        lock_id: str,
        watch: _LockWatch,
        reads: _Reads,
        scan_started: float,
        now: float,
        report: ScanReport,
        stale: list[_Stale],
    ) -> None:
        """One look at one lock: observe its leases, collect the stale ones, schedule the next look.
        (Written for speed: it runs for every lock due, tens of thousands per scan.)"""
        row = reads.rows.get(lock_id)
        queue = reads.queues.get(lock_id, ())
        keys: list[_Key] = []
        observed: list[_Observation] = []
        orphans: dict[tuple[str, str], float] = {}
        shortest = 0.0

        # The holder's lease (and, for a semaphore or read-write lock, every slot's).
        holder: _Observation | None = None
        holder_tickets: set[str] = set()
        columns = holder_columns(row) if row else ()
        for column in columns:
            assert row is not None
            raw = row[column]
            key = (lock_id, column)
            seen = self._observe(key, raw, now, holder=True)
            if seen is None:  # malformed: treated as an orphan
                self._orphan(report, watch, orphans, now, lock_id, "holder", column, raw)
                continue
            keys.append(key)
            observed.append(seen)
            holder_tickets.add(seen.ticket)
            if not shortest or seen.lease < shortest:
                shortest = seen.lease
            if holder is None or seen.token > holder.token:
                holder = seen  # the newest grant, for what leasewatch.observed records

        # Waiters' leases: their queue cells (a holder's own cell is covered by its record).
        for cell in queue:
            if cell.column in holder_tickets:
                continue
            key = (lock_id, cell.column)
            waiter = self._observe(key, cell.value, now, holder=False)
            if waiter is None:
                self._orphan(report, watch, orphans, now, lock_id, str(Table.QUEUE), cell.column, cell.value, cell)
            else:
                keys.append(key)
                observed.append(waiter)
                if not shortest or waiter.lease < shortest:
                    shortest = waiter.lease

        # The baseline's cells: a contender's shadow or main cell without a holder record of
        # that owner blocks every later baseline attempt (ConcurrentAttempt forever).
        # (Only on lock ids: the baseline never lists a semaphore's or read-write lock's row.)
        backoff = reads.backoff.get(lock_id, ()) if reads.backoff else ()
        shadow = reads.shadow.get(lock_id, ()) if reads.shadow else ()
        if backoff or shadow:
            holder_owner = holder.owner if holder is not None else None
            for table, cells in ((Table.BACKOFF_MAIN, backoff), (Table.BACKOFF_SHADOW, shadow)):
                for cell in cells:
                    if cell.column != holder_owner:
                        self._orphan(report, watch, orphans, now, lock_id, str(table), cell.column, cell.value, cell)
        if orphans or watch.orphans:
            watch.orphans = orphans or None

        self.observed.saw_lock(
            lock_id,
            None if holder is None else (holder.owner, holder.token, holder.ticket),
            [(obs.ticket, obs.lease) for obs in observed if obs is not holder],
            inherited=watch.inherited,
        )
        watch.inherited = False

        # The next look, and the leases that may go stale before it (on the due schedule).
        # A whole number of scans, counted from this scan's start: the look period never exceeds
        # max(scan interval, LOOK_FRACTION x lease) whatever the scans' own durations.
        interval = self.scan_interval
        period = LOOK_FRACTION * shortest if observed else self.orphan_after / 4
        next_look = watch.next_look = scan_started + interval * max(1, int(period / interval))
        self._schedule(lock_id, watch, next_look)
        if watch.again:
            watch.again -= 1
            if not watch.again:
                self._again.discard(lock_id)
        horizon = next_look + interval  # the next look may start late or take long
        if watch.keys:
            for old in watch.keys:
                if old not in keys:
                    self._leases.pop(old, None)  # released, withdrawn or revoked since the last look
        watch.keys = tuple(keys)
        grace = self.grace
        for i, obs in enumerate(observed):
            deadline = obs.changed_at + obs.lease + grace
            if now > deadline or (deadline < horizon and obs.queued != deadline):
                self._judge_lease(keys[i], obs, now, horizon, stale)

        # A lock with no state at all leaves the index after the window (cost follows live state).
        if not columns and not queue and not backoff and not shadow:
            floor = self._global_floor(now)
            if floor is None or watch.index_ts >= floor or lock_id in self._ahead:
                # Idle time is counted only from a look that read the entry with global time known
                # to have passed its stamp (lockclient.listing: a client that saw its index write
                # acknowledged relies on the entry staying INDEX_KEPT_S from its ticket, also when
                # its write lost last-write-wins to an entry stamped at or above it; and the
                # tombstone of an entry stamped ahead would shadow a re-listing stamped below it).
                watch.idle_since = None
            elif watch.idle_since is None:
                watch.idle_since, watch.idle_ts = now, watch.index_ts
            elif now - watch.idle_since > max(self.orphan_after, INDEX_KEPT_S):
                # Delete exactly the version seen idle first: a contender that listed the lock
                # again since wrote a newer version, which this tombstone cannot shadow (and the
                # next index read lists it again, as new).
                self.store.delete(Table.INDEX, index_shard(lock_id), lock_id, timestamp=watch.idle_ts)
                self._forget(lock_id)
        else:
            watch.idle_since = None

    def _observe(self, key: _Key, value: str, now: float, *, holder: bool) -> _Observation | None:
        """The observation of this lease's current value: the one we have if the value is
        unchanged, else a new one stamped ``now``. None if the value is malformed. Values are
        decoded only when they change (a renewal every lease/3), not at every look."""
        obs = self._leases.get(key)
        if obs is not None and obs.value == value:
            return obs
        try:
            if holder:
                record = HolderRecord.decode(value)
                obs = _Observation(value, now, record.lease, record.owner, record.ticket, record.token)
                if record.until:
                    # Parked (min_hold): its lease is the rest of a hold, not a holder's renewal
                    # period, and says nothing about how long a holder may go unrenewed.
                    self._leases[key] = obs
                    return obs
            else:
                waiter = WaiterRecord.decode(value)
                obs = _Observation(value, now, waiter.lease, waiter.owner, key[1])
        except StoreError:
            self._leases.pop(key, None)
            return None
        self._leases[key] = obs
        self.longest_lease = max(self.longest_lease, obs.lease)
        return obs

    def _judge_lease(self, key: _Key, obs: _Observation, now: float, horizon: float, stale: list[_Stale]) -> None:
        deadline = obs.changed_at + obs.lease + self.grace
        if now > deadline:
            stale.append((key, obs, now - obs.changed_at))
        elif deadline < horizon and obs.queued != deadline:
            # It may go stale before the next scan reads it: look at it at its deadline exactly.
            heapq.heappush(self._due, (deadline, next(self._seq), key, obs.value))
            obs.queued = deadline

    # -- the due schedule ---------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest deadline on the due schedule (monotonic), or None. Lock-free peek."""
        due = self._due
        try:
            return due[0][0]
        except IndexError:
            return None

    def check_due(self) -> ScanReport:
        """Re-read the leases whose deadline has come, and revoke those still unchanged. The
        re-read is what decides: a lease renewed since the last look gets a fresh stamp."""
        started = self._monotonic()
        report = ScanReport()
        with self._lock:
            self._check_due_locked(report)
            report.due = len(self._due)
        report.seconds = self._monotonic() - started
        return report

    def _check_due_locked(self, report: ScanReport) -> None:
        now = self._monotonic()
        due: dict[str, list[_Key]] = {}
        while self._due and self._due[0][0] <= now:
            _, _, key, value = heapq.heappop(self._due)
            obs = self._leases.get(key)
            if obs is None or obs.value != value:
                continue  # changed, revoked or forgotten since it was scheduled
            obs.queued = 0.0
            due.setdefault(key[0], []).append(key)
        if not due:
            return
        reads = self._read_due(list(due))
        now = reads.at
        stale: list[_Stale] = []
        for lock_id, keys in due.items():
            report.looked += 1
            row = reads.rows.get(lock_id, {})
            cells = {cell.column: cell.value for cell in reads.queues.get(lock_id, ())}
            watch = self._locks.get(lock_id)
            horizon = (watch.next_look if watch is not None else now) + self.scan_interval
            for key in keys:
                holder = is_holder_column(key[1])
                current = row.get(key[1]) if holder else cells.get(key[1])
                if current is None:
                    self._leases.pop(key, None)  # released, withdrawn or revoked meanwhile
                    continue
                fresh = self._observe(key, current, now, holder=holder)
                if fresh is not None:
                    self._judge_lease(key, fresh, now, horizon, stale)
        self._revoke_stale(stale, reads, report)

    def _read_due(self, lock_ids: list[str]) -> _Reads:
        rows = self.store.read_versioned_many(lock_ids)
        starts = {lock_id: queue_start(row) for lock_id, row in rows.items() if HEAD in row}
        queues = self.store.read_rows_many(Table.QUEUE, lock_ids, starts)
        return _Reads(rows, queues, {}, {}, self._monotonic())

    # -- revocation ----------------------------------------------------------------------------

    def _revoke_stale(self, stale: list[_Stale], reads: _Reads, report: ScanReport) -> None:
        """Revoke what one pass found stale, in bulk: the holders by one batch of
        compare-and-sets on the values watched, the waiters by deleting their cells after one
        batch of re-reads. A holder process that died holding thousands of locks is revoked
        in a few store round trips, not thousands."""
        holders = [s for s in stale if is_holder_column(s[0][1])]
        waiters = [s for s in stale if not is_holder_column(s[0][1])]
        for key, _, _ in stale:
            self._leases.pop(key, None)
        done: set[_Key] = set()
        try:
            if holders:
                self._revoke_holders(holders, reads, done)
            if waiters:
                self._revoke_waiters(waiters, done)
        except StoreError as exc:
            report.errors.append(f"revocations: {public_error(exc)}")
            log.warning("revocations_failed", error=str(exc))
            self.observed.store_error("revoke", type(exc).__name__, public_error(exc))
        finally:
            report.revoked += len(done)
            # Nothing is lost: a lease whose revocation failed keeps its observation, so the next
            # look finds it still unchanged — stale at once — and tries again. (Forgotten, it was
            # stamped afresh by that look and revoked a whole lease + grace later.) One that changed
            # or went meanwhile is judged anew by that look, as any other.
            for key, obs, _ in stale:
                if key not in done and key not in self._leases and key[0] in self._locks:
                    obs.queued = 0.0
                    self._leases[key] = obs

    def _revoke_holders(self, holders: list[_Stale], reads: _Reads, done: set[_Key]) -> None:
        """Revoke these holders; the key of each one revoked goes into ``done`` as soon as it is."""
        # Each revocation writes an end record naming this attempt, in the same compare-and-set:
        # an outcome the store could not settle is settled by reading it back (_settle_revocation).
        ends = [
            EndRecord(obs.token, obs.owner, "revoked", new_attempt_id(self._runtime)).encode() for _, obs, _ in holders
        ]
        ops = [
            CompareAndSet(
                key[0],
                {key[1]: obs.value, ended_column_for(key[1]): ANY},
                {key[1]: None, ended_column_for(key[1]): end},
            )
            for (key, obs, _), end in zip(holders, ends, strict=True)
        ]
        cleanup: list[Op] = []
        lookups: list[tuple[str, str]] = []
        for i, result in self.store.compare_and_set_many(ops):
            (lock_id, column), obs, unchanged = holders[i]
            if isinstance(result, StoreError):
                log.warning("revoke_outcome_unknown", lock_id=lock_id, owner=obs.owner, error=str(result))
                if not self._settle_revocation(lock_id, obs.owner, ends[i], ended_column_for(column)):
                    continue
            elif not result.applied:
                log.info("revoke_skipped", lock_id=lock_id, detail="record changed or already gone")
                continue
            # Its queue cell (the holder keeps it until it releases), shadowed for good.
            cell = next((c for c in reads.queues.get(lock_id, ()) if c.column == obs.ticket), None)
            if cell is not None:
                cleanup.append(Delete(Table.QUEUE, lock_id, obs.ticket, cell.timestamp + REVOKED_CELL_SHADOW_US))
            elif obs.ticket:
                lookups.append((lock_id, obs.ticket))
            main = next((c for c in reads.backoff.get(lock_id, ()) if c.column == obs.owner), None)
            if main is not None:
                cleanup.append(Delete(Table.BACKOFF_MAIN, lock_id, obs.owner, main.timestamp + 1))
            self._record(lock_id, obs.owner, f"lease unchanged for {unchanged:.1f}s", unchanged, holder=True)
            done.add(holders[i][0])
        if lookups:
            found = self.store.execute_all([Get(Table.QUEUE, lock_id, ticket) for lock_id, ticket in lookups])
            for (lock_id, ticket), got in zip(lookups, found, strict=True):
                if got is not None:
                    cleanup.append(Delete(Table.QUEUE, lock_id, ticket, got.timestamp + REVOKED_CELL_SHADOW_US))
        if cleanup:
            # If this fails, the cell is nobody's lease any more: it is revoked as a dead waiter later.
            self.store.execute_all(cleanup)

    def _settle_revocation(self, lock_id: str, owner: str, end: str, ended_column: str = ENDED_COLUMN) -> bool:
        """A revocation whose outcome the store could not settle: read the row (SERIAL) — our end
        record there means it applied; the record still there, that it did not (the lease is read
        again and found stale again at the next look); anything else, that the holder's own
        release (or another replica's revocation) ended it — or ours did and a later holder's end
        overwrote ours: then it is not counted (a revocation is recorded only when proven), and
        the holder's queue cell, renewed by nobody, is cleared as a dead waiter's."""
        try:
            row = self.store.read_versioned(lock_id)
        except StoreError as exc:
            log.warning("revoke_unsettled", lock_id=lock_id, owner=owner, error=str(exc))
            return False
        return row.get(ended_column) == end

    def _revoke_waiters(self, waiters: list[_Stale], done: set[_Key]) -> None:
        """Revoke these waiters; their keys go into ``done`` once their cells are deleted."""
        # Re-read right before deleting: a waiter that renewed since our look is alive.
        current = self.store.execute_all([Get(Table.QUEUE, key[0], key[1]) for key, _, _ in waiters])
        deletes: list[Op] = []
        revoked: list[_Stale] = []
        for stale, cell in zip(waiters, current, strict=True):
            (lock_id, ticket), obs, _ = stale
            if cell is None or cell.value != obs.value:
                log.info("revoke_skipped", lock_id=lock_id, owner=obs.owner, detail="queue cell changed or gone")
                continue
            deletes.append(Delete(Table.QUEUE, lock_id, ticket, cell.timestamp + REVOKED_CELL_SHADOW_US))
            revoked.append(stale)
        if deletes:
            self.store.execute_all(deletes)
        for key, obs, unchanged in revoked:
            self._record(key[0], obs.owner, f"lease unchanged for {unchanged:.1f}s", unchanged, holder=False)
            done.add(key)

    def _revoke_holder(
        self,
        lock_id: str,
        raw: str,
        reason: str,
        unchanged: float | None,
        *,
        caller: str | None = None,
        column: str = HOLDER_COLUMN,
    ) -> bool:
        """One holder (of ``column``: a slot's, for a semaphore or read-write lock): compare-and-set
        delete of the record we watched, with its end record; then its queue cell."""
        try:
            record = HolderRecord.decode(raw)
        except StoreError:
            # Malformed: nobody's lease, so no end record to name it by — a plain conditional delete.
            if not self.store.compare_and_set(lock_id, {column: raw}, {column: None}).applied:
                return False
            self._record(lock_id, _owner_of(raw), reason, unchanged, holder=True, caller=caller)
            return True
        # The same code path as `lockctl revoke`: compare-and-set on exactly `raw`, end record,
        # then the holder's queue cell and baseline cell (lockclient.admin.end_holder).
        try:
            ended = end_holder(self.store, lock_id, raw, column=column, runtime=self._runtime)
        except StoreOutcomeUnknown as exc:
            log.warning("revoke_unsettled", lock_id=lock_id, owner=record.owner, error=str(exc))
            return False
        if ended is None:
            log.info("revoke_skipped", lock_id=lock_id, detail="record changed or already gone")
            return False
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

    def _orphan(
        self,
        report: ScanReport,
        watch: _LockWatch,
        seen: dict[tuple[str, str], float],
        now: float,
        lock_id: str,
        table: str,
        column: str,
        value: str,
        cell: Cell | None = None,
    ) -> None:
        first = watch.orphans.get((table, column), now) if watch.orphans else now
        if now - first <= self.orphan_after:
            seen[(table, column)] = first
            return
        if table == "holder":
            # A malformed holder record: only a compare-and-set on exactly that value removes it.
            if self.store.compare_and_set(lock_id, {column: value}, {column: None}).applied:
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
            at=datetime.fromtimestamp(self._runtime.wall_us() / 1e6, UTC),
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
        token: int | None = None,
    ) -> list[str]:
        """Operator revocation (``POST /revoke/{id}``): the holder, or one named owner — or, with
        ``token``, only the holder whose fencing token it is (nothing if no current holder has it).

        The holder is revoked by compare-and-set on the value just read, retried a few
        times if it renews in between; a waiter by deleting its queue cell."""
        revoked: list[str] = []
        with self._lock:
            for _ in range(5):
                state = self._read(lock_id)
                # A semaphore's or read-write lock's row may have several holders: without an owner,
                # every one of them is revoked.
                targets = {
                    c: raw
                    for c, raw in state.slots.items()
                    if (owner is None or _owner_of(raw) == owner) and (token is None or _token_of(raw) == token)
                }
                if token is not None and not targets:
                    return revoked
                if targets:
                    for column, raw in targets.items():
                        if self._revoke_holder(lock_id, raw, reason, None, caller=caller, column=column):
                            revoked.append(_owner_of(raw))
                            self._leases.pop((lock_id, column), None)
                    if len(revoked) == len(targets):
                        return revoked
                    continue  # one renewed meanwhile: look again
                if owner is None or revoked:
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

    def _read(self, lock_id: str) -> _LockState:
        """One lock, read on its own (introspection and operator revocations)."""
        row = self.store.read_versioned(lock_id, serial=False)
        queue, backoff, shadow = self.store.execute_all(
            [
                ReadRow(Table.QUEUE, lock_id, queue_start(row)),
                ReadRow(Table.BACKOFF_MAIN, lock_id),
                ReadRow(Table.BACKOFF_SHADOW, lock_id),
            ]
        )
        holder_raw = row.get(HOLDER_COLUMN)
        holder: HolderRecord | None = None
        if holder_raw is not None:
            try:
                holder = HolderRecord.decode(holder_raw)
            except StoreError:
                holder = None  # malformed: treated as an orphan by the scan
        slots = {column: row[column] for column in holder_columns(row)}
        return _LockState(holder_raw, holder, row.get(FENCE_COLUMN), queue, backoff, shadow, slots, row.get("~limit"))

    def queue_start(self, lock_id: str) -> str:
        """Where a read of this lock's queue starts: its published watermark."""
        return queue_start(self.store.read_versioned(lock_id, serial=False))

    def _observed(self, key: _Key, value: str) -> _Observation | None:
        """The observation of this lease, if it is of this very value (else it changed since)."""
        obs = self._leases.get(key)
        return None if obs is None or obs.value != value else obs

    def _age(self, key: _Key, value: str, now: float) -> float | None:
        obs = self._observed(key, value)
        return None if obs is None else round(now - obs.changed_at, 3)

    def view(self, lock_id: str) -> LockView:
        state = self._read(lock_id)
        now = self._monotonic()
        token, fence_owner = parse_fence(state.fence)
        records: dict[str, HolderRecord] = {}
        for column, raw in state.slots.items():
            try:
                records[column] = HolderRecord.decode(raw)
            except StoreError:
                continue  # malformed: treated as an orphan by the scan
        holders = [h.owner for h in records.values()]
        holders += [c.column for c in state.backoff if c.column not in holders]
        tickets = {h.ticket for h in records.values()}
        leases: dict[str, LeaseView] = {}
        slots: dict[str, LeaseView] = {}
        modes: dict[str, str] = {}
        labels: dict[str, str] = {}
        with self._lock:
            for column, h in records.items():
                age = self._age((lock_id, column), state.slots[column], now)
                seen = LeaseView(
                    h.owner,
                    h.ticket,
                    h.version,
                    h.lease,
                    True,
                    age,
                    h.token,
                    h.since,
                    h.until,
                    label=h.label,
                    payload=h.payload,
                    granted_us=h.granted,
                )
                leases[h.owner] = slots[column] = seen
            queue: list[tuple[str, str]] = []
            for cell in state.queue:
                try:
                    record = WaiterRecord.decode(cell.value)
                except StoreError:
                    queue.append((cell.column, "?"))
                    continue
                queue.append((cell.column, record.owner))
                if record.mode:
                    modes[cell.column] = record.mode
                if record.label:
                    labels[cell.column] = record.label
                if cell.column in tickets:
                    continue
                age = self._age((lock_id, cell.column), cell.value, now)
                leases[record.owner] = LeaseView(
                    record.owner, cell.column, record.version, record.lease, False, age, label=record.label
                )
        head = queue[0][0] if queue else None
        return LockView(lock_id, holders, token, fence_owner, queue, leases, head, slots, modes, state.limit, labels)

    def page(
        self, *, after: str | None = None, limit: int = 100, prefix: str = ""
    ) -> tuple[list[LockSummaryView], str | None]:
        """Locks with live state in lock-id order: at most ``limit`` ids greater than ``after``
        that start with ``prefix``, and the cursor of the next page (None after the last).

        Costs one slice of at most ``limit`` cells per index shard (merged: the first ``limit``
        ids overall are among each shard's first ``limit``), and two bulk reads for the page's
        locks — the same at 100 lock ids as at 100,000."""
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        start = prefix
        if after is not None:
            # The smallest string greater than ``after``: lock ids contain no control characters.
            start = max(start, after + "\x00")
        slices = self.store.execute_all([ReadRow(Table.INDEX, str(s), start, limit) for s in range(INDEX_SHARDS)])
        ids = sorted({c.column for cells in slices for c in cells if c.column.startswith(prefix)})[:limit]
        rows = self.store.read_versioned_many(ids)
        starts = {lock_id: queue_start(row) for lock_id, row in rows.items() if HEAD in row}
        queues = self.store.read_rows_many(Table.QUEUE, ids, starts)
        now = self._monotonic()
        out: list[LockSummaryView] = []
        with self._lock:
            for lock_id in ids:
                row = rows.get(lock_id, {})
                columns = holder_columns(row)
                raw = row[columns[0]] if columns else None  # a lock's holder; a semaphore's first slot
                keys = [((lock_id, column), row[column]) for column in columns]
                keys += [((lock_id, c.column), c.value) for c in queues.get(lock_id, ())]
                seen = [self._observed(key, value) for key, value in keys]
                known = [round(now - obs.changed_at, 3) for obs in seen if obs is not None]
                overdue = [(now - obs.changed_at) / obs.lease for obs in seen if obs is not None and obs.lease > 0]
                try:
                    token = parse_fence(row.get(FENCE_COLUMN))[0]
                except StoreError:
                    token = 0
                out.append(
                    LockSummaryView(
                        lock_id=lock_id,
                        holder=None if raw is None else _owner_of(raw) or "?",
                        fencing_token=token,
                        queue_length=len(queues.get(lock_id, ())),
                        oldest_lease_age=max(known) if known else None,
                        most_overdue=round(max(overdue), 3) if overdue else None,
                        holder_label=_label_of(raw) if raw is not None else "",
                    )
                )
        return out, (ids[-1] if len(ids) == limit else None)


def queue_start(row: dict[str, str]) -> str:
    published, _ = parse_marks(row)
    return make_ticket(published, "")


def _owner_of(raw: str) -> str:
    try:
        return HolderRecord.decode(raw).owner
    except StoreError:
        return ""


def _label_of(raw: str) -> str:
    try:
        return HolderRecord.decode(raw).label
    except StoreError:
        return ""


def _token_of(raw: str) -> int | None:
    try:
        return HolderRecord.decode(raw).token
    except StoreError:
        return None
