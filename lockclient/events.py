"""Lock events for applications: ``locker.watch(name)`` yields what happens to a lock.

Events, in the order they happened as far as the store can tell:

* ``granted`` — a holder was granted (owner, fencing token; for a semaphore or read-write lock the
  slot it took);
* ``released`` — a holder released (for a ``min_hold`` lock released early: with ``until_us``, the
  global time until which its record keeps the lock held);
* ``revoked`` — leasewatch (or an operator) revoked a holder;
* ``lost`` — a holder's record has not changed for a whole lease as this watch saw it: by the lease
  promise (docs/guarantees.md) the holder itself already sees ``held == False``; leasewatch revokes
  it after its grace;
* ``queue`` — the waiters changed (owners in queue order, the new state);
* ``behind`` — this watch missed something, and says exactly what: the tokens whose grant, or
  whose end, it could not see (``missed``).

**Nothing is missed silently — how.** Every grant takes the next number of the lock's fencing
counter, and every end of a holder record writes that record's end record (token, owner, how) in
the same compare-and-set (:mod:`lockclient.settle`). So two reads of the lease row tell, for every
token issued between them, whether its grant is still visible (a holder with that token), or its end
(the end record), or neither — and the last is reported in ``behind``. For a holder seen before and
gone now, its end record says how it ended, unless a later end overwrote it: reported in ``behind``
too. ``queue`` events are snapshots (a waiter that came and went between two reads is not
reported), and say so by being the new state, not a change.

**Pushed where a channel exists, read otherwise.** A watch reads the lease row and the queue (one
round trip) after every wake-up: a change made by this process wakes it at once (in-process
signals); with leasewatch configured, a holder change anywhere ends its long-poll
(``/wait/{id}?holder=``, which leasewatch answers within ~10 ms of a change in the store); and it
reads at least every ``poll`` seconds (and every quarter lease of the holder it watches, for
``lost``) whatever happens. A watch never binds a lock's wake-up sockets: those belong to its
waiters.

The diff itself is :class:`EventTracker`: pure (rows in, events out), so the deterministic simulator
checks it against the store's own history.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from lockclient import metrics
from lockclient.errors import StoreError
from lockclient.lease import (
    FENCE_COLUMN,
    HolderRecord,
    WaiterRecord,
    holder_columns,
    parse_fence,
)
from lockclient.lockid import primitive_row, validate_lock_id
from lockclient.runtime import Event
from lockclient.runtime.aio import AsyncioRuntime, run_in_greenlet
from lockclient.settle import EndRecord
from lockclient.store import Cell, Table
from lockclient.store.base import ReadRow, ReadVersioned
from lockclient.wake import Watch

if TYPE_CHECKING:
    from lockclient.locker import RemoteLocker

__all__ = ["EventKind", "EventTracker", "LockEvent", "Snapshot", "watch_events"]

EventKind = Literal["granted", "released", "revoked", "lost", "queue", "behind"]
Primitive = Literal["lock", "semaphore", "rwlock"]

QUEUE_SHOWN = 100
"""Waiters a ``queue`` event lists at most (the first in line)."""
REMEMBERED = 4096
"""Tokens whose events are remembered (to report each once); older ones are forgotten."""


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One thing that happened to a lock (see the module's docstring)."""

    kind: EventKind
    name: str
    owner: str | None = None
    token: int | None = None
    slot: str | None = None
    """The holder column: ``~holder`` (a lock's holder, a read-write lock's writer) or ``~holder:<k>``."""
    queue: tuple[str, ...] = ()
    """``queue``: the waiters' owners, first in line first."""
    missed: tuple[int, ...] = ()
    """``behind``: the tokens whose grant or end this watch did not see."""
    since_us: int | None = None
    """``granted``: the grant's global time, when the holder stamped it (elections, ``min_hold``)."""
    until_us: int | None = None
    """``released``: a ``min_hold`` hold parked until this global time."""
    initial: bool = False
    """Part of the state found when the watch started (not seen happen)."""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """The event as a JSON object, without empty fields (``lockctl watch`` prints these)."""
        data = asdict(self)
        return {key: value for key, value in data.items() if value not in (None, (), "", False)}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read of a lock: its lease row and its queue (from its watermark, in order)."""

    row: dict[str, str]
    queue: list[Cell]
    at: float
    """Monotonic time when the read completed."""
    started: float | None = None
    """Monotonic time when the read began (None: the same as ``at``). ``lost`` is judged from it:
    a holder may renew while a slow read is under way, so only the start of the read that still
    shows the old value proves the holder did not renew before then."""


@dataclass(slots=True)
class _Held:
    owner: str
    token: int
    value: str
    first_seen: float
    lease: float
    parked: bool


@dataclass
class EventTracker:
    """The events between successive snapshots of one lock (pure; see the module's docstring)."""

    name: str
    fence: int | None = None
    holders: dict[str, _Held] = field(default_factory=dict)
    waiters: tuple[str, ...] | None = None
    _granted: set[int] = field(default_factory=set)
    _ended: set[int] = field(default_factory=set)
    _lost: set[int] = field(default_factory=set)

    def feed(self, snap: Snapshot) -> list[LockEvent]:
        row = snap.row
        try:
            fence = parse_fence(row.get(FENCE_COLUMN))[0]
        except StoreError:
            fence = self.fence or 0
        if self.fence is not None and fence < self.fence:
            return []  # an older read than one already seen (a plain read may lag): nothing new in it
        initial = self.fence is None
        judged_at = snap.at if snap.started is None else snap.started
        records: dict[str, HolderRecord] = {}
        for column in holder_columns(row):
            try:
                records[column] = HolderRecord.decode(row[column])
            except StoreError:
                continue
        ends: dict[int, EndRecord] = {}
        for column, raw in row.items():
            if column.startswith("~ended"):
                end = EndRecord.decode(raw)
                if end is not None:
                    ends[end.token] = end
        events: list[LockEvent] = []
        missed: list[int] = []
        by_token = {record.token: (column, record) for column, record in records.items()}

        # Holders known before and gone (or replaced) now: their end record says how, if it is
        # still there; otherwise this watch missed it.
        for column, held in list(self.holders.items()):
            current = records.get(column)
            if current is not None and current.token == held.token:
                continue
            del self.holders[column]
            if held.token in self._ended:
                continue
            end = ends.get(held.token)
            if end is not None and end.owner == held.owner:
                events.append(self._end_event(end, column))
            else:
                missed.append(held.token)
                self._ended.add(held.token)

        # Tokens issued since the last read: granted to a holder still there, or granted and ended
        # in between (its end record is there), or not seen at all.
        # Grants are reported in token order (``fresh``: token -> its events), after the ends above.
        fresh: dict[int, list[LockEvent]] = {}
        first_new = fence + 1 if initial else (self.fence or 0) + 1
        for token in range(first_new, fence + 1):
            if token in self._granted:
                continue
            if token in by_token:
                continue  # reported below, with the holders
            end = ends.get(token)
            if end is not None:
                self._granted.add(token)
                fresh[token] = [
                    LockEvent("granted", self.name, end.owner, token, detail="granted and ended between reads"),
                    self._end_event(end, None),
                ]
            else:
                missed.append(token)
                self._granted.add(token)
                self._ended.add(token)

        # The holders now.
        for column, record in records.items():
            known = self.holders.get(column)
            value = row[column]
            if known is None or known.token != record.token:
                group = fresh.setdefault(record.token, [])
                if record.token not in self._granted:
                    self._granted.add(record.token)
                    group.append(
                        LockEvent(
                            "granted",
                            self.name,
                            record.owner,
                            record.token,
                            column,
                            since_us=record.since or None,
                            initial=initial,
                        )
                    )
                known = self.holders[column] = _Held(
                    record.owner, record.token, value, snap.at, record.lease, bool(record.until)
                )
                if record.until and record.token not in self._ended:
                    self._ended.add(record.token)
                    group.append(self._parked(record, column, initial))
                continue
            if known.value != value:
                known.value, known.first_seen, known.lease = value, snap.at, record.lease
                if record.until and not known.parked:
                    known.parked = True
                    if record.token not in self._ended:
                        self._ended.add(record.token)
                        events.append(self._parked(record, column, initial))
            elif (
                not known.parked
                and judged_at - known.first_seen >= known.lease
                and known.token not in self._lost
                and known.token not in self._ended
            ):
                self._lost.add(known.token)
                events.append(
                    LockEvent(
                        "lost",
                        self.name,
                        known.owner,
                        known.token,
                        column,
                        detail=f"not renewed for {judged_at - known.first_seen:.3f}s (lease {known.lease:g}s)",
                    )
                )

        for token in sorted(fresh):
            events.extend(fresh[token])

        # The waiters: queue cells that are not a holder's.
        tickets = {record.ticket for record in records.values()}
        waiters = tuple(_owner(cell.value) for cell in snap.queue if cell.column not in tickets)[:QUEUE_SHOWN]
        if waiters != self.waiters and (waiters or self.waiters is not None):
            events.append(LockEvent("queue", self.name, queue=waiters, initial=initial))
        self.waiters = waiters

        if missed:
            events.insert(0, LockEvent("behind", self.name, missed=tuple(sorted(set(missed)))))
        self.fence = fence
        self._forget(fence)
        return events

    def _end_event(self, end: EndRecord, column: str | None) -> LockEvent:
        self._ended.add(end.token)
        return LockEvent(end.how, self.name, end.owner, end.token, column)

    def _parked(self, record: HolderRecord, column: str, initial: bool) -> LockEvent:
        return LockEvent(
            "released",
            self.name,
            record.owner,
            record.token,
            column,
            until_us=record.until,
            initial=initial,
            detail="released before its min_hold: held until until_us",
        )

    def _forget(self, fence: int) -> None:
        if len(self._granted) + len(self._ended) + len(self._lost) < 3 * REMEMBERED:
            return
        floor = fence - REMEMBERED
        self._granted = {t for t in self._granted if t > floor}
        self._ended = {t for t in self._ended if t > floor}
        self._lost = {t for t in self._lost if t > floor}


def _owner(raw: str) -> str:
    try:
        return WaiterRecord.decode(raw).owner
    except StoreError:
        return "?"


def row_of(name: str, primitive: Primitive) -> str:
    return validate_lock_id(name) if primitive == "lock" else primitive_row(name, primitive)


def read_snapshot(locker: RemoteLocker, row_id: str) -> Snapshot:
    """One round trip: the lease row (plain read) and the queue from its watermark."""
    services = locker._services
    started = locker.runtime.monotonic()
    start = services.watermarks.start(row_id)
    row, queue = locker.store.execute_all(
        [ReadVersioned(row_id, serial=False), ReadRow(Table.QUEUE, row_id, start, QUEUE_SHOWN + 64)]
    )
    services.watermarks.observe(row_id, row)
    return Snapshot(row, queue, locker.runtime.monotonic(), started)


def watch_events(
    locker: RemoteLocker,
    name: str,
    primitive: Primitive = "lock",
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    cancel: Event | None = None,
) -> Iterator[LockEvent]:
    """:meth:`RemoteLocker.watch` (see the module's docstring)."""
    if not poll > 0:
        raise ValueError(f"poll must be positive, got {poll}")
    row_id = row_of(name, primitive)
    locker._check_open()
    runtime = locker.runtime
    services = locker._services
    tracker = EventTracker(name)
    deadline = None if timeout is None else runtime.monotonic() + timeout
    while True:
        seen = services.signals.generation(row_id)
        snap = read_snapshot(locker, row_id)
        for event in tracker.feed(snap):
            metrics.WATCH_EVENTS.labels(event.kind).inc()
            yield event
        wait = _next_wait(tracker, poll)
        if deadline is not None:
            left = deadline - runtime.monotonic()
            if left <= 0:
                return
            wait = min(wait, left)
        if cancel is not None and cancel.is_set():
            return
        holder = next(iter(tracker.holders.values()), None)
        waker = locker.waker
        if (
            waker is not None
            and cancel is None
            and waker.wait_for_change(row_id, Watch("holder", holder.owner if holder is not None else ""), wait)
        ):
            continue
        services.signals.wait(row_id, seen, wait, cancel, runtime=runtime)


def _next_wait(tracker: EventTracker, poll: float) -> float:
    """Read again within ``poll``, and within a quarter of the shortest lease watched (for ``lost``)."""
    leases = [held.lease for held in tracker.holders.values() if not held.parked]
    return min([poll, *(lease / 4 for lease in leases)])


async def awatch_events(
    locker: RemoteLocker, name: str, primitive: Primitive = "lock", *, poll: float = 1.0, timeout: float | None = None
) -> AsyncIterator[LockEvent]:
    """asyncio twin of :func:`watch_events`: the reads run on the runtime's own executor, the waits
    on the loop (a change made by this process wakes it within 20 ms; leasewatch's long-poll, when
    configured, in a thread of that executor)."""
    if not poll > 0:
        raise ValueError(f"poll must be positive, got {poll}")
    row_id = row_of(name, primitive)
    locker._check_open()
    runtime = AsyncioRuntime.current()
    services = locker._services
    tracker = EventTracker(name)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        seen = services.signals.generation(row_id)
        snap = await runtime.run_blocking(lambda: read_snapshot(locker, row_id))
        for event in tracker.feed(snap):
            metrics.WATCH_EVENTS.labels(event.kind).inc()
            yield event
        wait = _next_wait(tracker, poll)
        if deadline is not None:
            left = deadline - loop.time()
            if left <= 0:
                return
            wait = min(wait, left)
        holder = next(iter(tracker.holders.values()), None)
        waker = locker.waker
        if waker is not None:
            watch = Watch("holder", holder.owner if holder is not None else "")
            if await runtime.run_blocking(partial(waker.wait_for_change, row_id, watch, wait)):
                continue
        # A change made by this process (in-process signals), polled on the loop in a greenlet.
        await run_in_greenlet(partial(services.signals.wait, row_id, seen, wait, None, runtime=runtime))
