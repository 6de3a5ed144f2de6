"""Primitives with several holders — semaphores and read-write locks — on the fair lock's machinery.

A semaphore admits up to ``limit`` holders at once; a read-write lock admits many readers (up to
``max_readers``) or one writer. Both are built from exactly the parts of the fair lock
(:mod:`lockclient.fairqueue`), with one thing added: the lease row holds several holder records.

**Rows.** A semaphore named ``db`` lives in the rows ``db\\x1fsemaphore`` of the queue and lease
tables (:func:`lockclient.lockid.primitive_row`), a read-write lock in ``db\\x1frwlock``: never in the
rows of the lock ``db``, which no lock id can reach. The lease row holds

* ``~holder:<k>`` for ``k < limit`` — one *slot* per holder (a semaphore's permits, a read-write
  lock's readers). Each slot is a lease exactly like a lock's ``~holder``
  (:mod:`lockclient.lease`): granted, renewed, released and revoked by compare-and-set on its own
  value, ended with its own end record ``~ended:<k>``. So renewals of different holders never
  touch the same cell, and leasewatch revokes a dead holder of a slot the way it revokes a lock's;
* ``~holder`` — a read-write lock's writer;
* ``~fence`` — one fencing counter for every holder: each grant takes the next token in the same
  compare-and-set, so every holder has its own token, strictly increasing in grant order;
* ``~limit`` — the limit (``max_readers``) the primitive is used with, written by its first grant.
  Every grant is conditional on it, so two callers with different limits can never make more
  holders than the smaller one allows: a caller with another limit gets
  :class:`~lockclient.errors.LimitMismatch` while anybody holds, and changes it when nobody does
  (that grant is conditional on every slot of both limits being empty);
* the queue watermarks, as for a lock (:mod:`lockclient.watermark`).

**Why slots, and not a counter** (the one new store-level shape). A counter of holders would make
every grant *and every release* a compare-and-set on one shared cell — releases and revocations
racing each other, each needing a re-read and a retry, with no value to settle an unknown outcome
by. Slots keep each holder's record its own: a release or a revocation is the lock's exact
compare-and-set on one cell, the unknown-outcome rules (attempt ids, end records) apply unchanged,
and leasewatch needs no new reasoning — only to look at every ``~holder*`` column of a row. The
price: a writer's grant is conditional on every reader slot being empty (``max_readers`` + 3
cells in one compare-and-set; on Cassandra each condition on an absent cell is a statement that
restates it, i.e. a tombstone), so ``max_readers`` is bounded (default 16).

**Who may try** is decided by the queue, as for a lock — first come, first served. A contender
writes its queue cell (its lease, with its mode: ``r`` or ``w`` for a read-write lock), and a look
reads the cells just ahead of it (at most as many as can matter) and the lease row. Holders keep
their queue cells until they release, so the cells ahead are the holders and waiters that came
first. A contender may try when

* semaphore: fewer than ``limit`` cells are ahead of it;
* reader: fewer than ``max_readers`` cells are ahead, none of them a writer's;
* writer: no cell is ahead of it.

and the lease row has room for it (a free slot; for a reader no writer, for a writer nobody).
Then it takes a free slot by compare-and-set (:func:`lockclient.algorithm.take`, with the slot's
column): the store, not the queue, decides exclusion. A reader behind a waiting writer waits, so
writers never starve: a writer waits only for those who queued before it. The FIFO promise is the
lock's, per position: a contender is never granted while ``limit`` (for a writer: any; for a reader:
a writer's or ``max_readers``) cells with earlier tickets were visible to its deciding look.

**Waiting.** One release lets any of several waiters move, so a waiter cannot wait for exactly
one thing as a lock's waiter does. It watches the earliest cell its look read (on this machine its
departure wakes it at once, through the same wake-up sockets) and otherwise polls with a capped
back-off (``poll_min`` doubling to ``poll_max`` while nothing ahead changes): a hand-over takes
at most ``poll_max`` (0.25 s by default) when the cell that went is not the one watched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Literal

from lockclient.algorithm import Acquisition, Services, confirm_listed, new_waiter, take
from lockclient.clock import settle_ticket_time
from lockclient.errors import LimitMismatch, StoreError
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HeldLease,
    HolderRecord,
    WaiterLease,
    WaiterRecord,
    is_holder_column,
    slot_column,
)
from lockclient.lockid import owner_host, split_row, ticket_time
from lockclient.logs import get_logger
from lockclient.store import Cell, CellStore, Table
from lockclient.store.base import Delete, Put, ReadRow, ReadVersioned
from lockclient.wake import Listener, Taken, Watch
from lockclient.watermark import PROPOSED

__all__ = ["LIMIT_COLUMN", "MAX_LIMIT", "Shape", "SharedQueue", "holder_records"]

log = get_logger("lockclient")

LIMIT_COLUMN = "~limit"
"""The limit (``max_readers``) a semaphore (read-write lock) is used with, in its lease row."""
MAX_LIMIT = 256
"""The largest limit (and ``max_readers``) accepted: a look reads that many cells at most, and a
writer's grant is conditional on that many slots."""

Kind = Literal["semaphore", "rwlock"]
Mode = Literal["", "r", "w"]


@dataclass(frozen=True, slots=True)
class Shape:
    """What one acquisition asks for."""

    kind: Kind
    limit: int
    """A semaphore's permits; a read-write lock's ``max_readers``."""
    mode: Mode = ""
    """``""`` for a semaphore permit, ``"r"`` / ``"w"`` for a reader / the writer."""

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError(f"limit must be an int, not {type(self.limit).__name__}")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {self.limit}")
        if (self.kind == "semaphore") != (self.mode == ""):
            raise ValueError(f"mode {self.mode!r} does not fit a {self.kind}")

    @property
    def reach(self) -> int:
        """How many cells ahead of ours can matter to a look."""
        return 1 if self.mode == "w" else self.limit

    def eligible(self, ahead: list[Cell]) -> bool:
        """May a contender with these cells just ahead of it (nearest first) try?"""
        if self.mode == "w":
            return not ahead
        if len(ahead) >= self.limit:
            return False
        return self.mode != "r" or not any(_mode(cell.value) == "w" for cell in ahead)


class _Turn(enum.Enum):
    REVOKED = "our queue cell is gone (revoked by leasewatch)"
    REQUEUE = "our ticket is below the proposed watermark"
    NOT_NOW = "busy (not waiting)"


@dataclass(frozen=True, slots=True)
class _Plan:
    column: str
    expect: dict[str, str | None]
    also_set: dict[str, str | None]


class SharedQueue:
    """The algorithm behind :meth:`RemoteLocker.get_semaphore` and the read-write lock."""

    name: ClassVar[str] = "shared"

    def __init__(self, services: Services) -> None:
        self.s = services

    # -- acquire --------------------------------------------------------------------------------

    def acquire(self, attempt: Acquisition, shape: Shape) -> HeldLease | None:
        """The granted lease (not yet kept alive: the caller hands it to the keeper), or None when
        not blocking and it could not be had at once. Leaves nothing behind on any error."""
        store = attempt.store
        if not attempt.blocking and self._busy(attempt, shape):
            return None
        while True:
            waiter, unsettled = self._enqueue(attempt, shape)
            try:
                turn = self._wait_turn(attempt, waiter, shape, unsettled)
            except BaseException:
                self._withdraw(store, waiter)
                raise
            if isinstance(turn, HeldLease):
                waiter.end()
                self.s.keeper.remove(waiter)  # the queue cell now belongs to the holder
                if self.s.watermarks.due(attempt.lock_id, turn.ticket, turn.token):
                    self._advance_watermark(attempt.lock_id, turn.ticket, turn.token)
                return turn
            self._withdraw(store, waiter)
            if turn is _Turn.NOT_NOW or not attempt.blocking:
                return None
            log.info("requeue", lock_id=attempt.lock_id, owner=waiter.owner, reason=turn.value)
            attempt.check()

    def _busy(self, attempt: Acquisition, shape: Shape) -> bool:
        """``try_…``: somebody waits, or there is no room for us now (nothing is enqueued)."""
        store, lock_id = attempt.store, attempt.lock_id
        start = self.s.watermarks.start(lock_id)
        cells, row = store.execute_all(
            [ReadRow(Table.QUEUE, lock_id, start, shape.limit + 1), ReadVersioned(lock_id, serial=False)]
        )
        self.s.watermarks.observe(lock_id, row)
        tickets = {record.ticket for record in holder_records(row).values()}
        if any(cell.column not in tickets for cell in cells):
            return True
        return self._plan(row, shape, 0, lock_id) is None

    def _enqueue(self, attempt: Acquisition, shape: Shape) -> tuple[WaiterLease, int]:
        """A ticket from global time; the lock listed for leasewatch (:mod:`lockclient.listing`);
        the queue cell (our lease, with our mode)."""
        store, lock_id = attempt.store, attempt.lock_id
        waiter, now, stamp, beside = new_waiter(self.s, attempt, mode=shape.mode)
        enqueue = [*beside, Put(Table.QUEUE, lock_id, waiter.ticket, waiter.value, stamp)]
        try:
            attempt.retrying(partial(store.execute_all, enqueue))
            confirm_listed(self.s, attempt, beside)
        except BaseException:
            self._withdraw(store, waiter)
            raise
        waiter.enqueued_at = self.s.monotonic()
        self.s.keeper.add_waiter(waiter)
        return waiter, now

    def _wait_turn(self, attempt: Acquisition, waiter: WaiterLease, shape: Shape, unsettled: int) -> HeldLease | _Turn:
        waiting = _Waiting(self.s, attempt)
        try:
            return self._look_and_wait(attempt, waiter, shape, unsettled, waiting)
        finally:
            waiting.close()

    def _look_and_wait(
        self, attempt: Acquisition, waiter: WaiterLease, shape: Shape, unsettled: int, waiting: _Waiting
    ) -> HeldLease | _Turn:
        store, lock_id, ticket = attempt.store, attempt.lock_id, waiter.ticket
        handshake_done = False
        contended = False
        settled = False
        delay = self.s.poll_min
        last: tuple[object, ...] | None = None
        while True:
            seen = self.s.signals.generation(lock_id)
            start = self.s.watermarks.start(lock_id, ticket)
            looked_at = self.s.monotonic()
            cells, row = attempt.retrying(partial(self._look, store, lock_id, start, ticket, shape.reach + 1))
            _, proposed = self.s.watermarks.observe(lock_id, row)
            if ticket_time(ticket) < proposed and not handshake_done:
                return _Turn.REQUEUE  # the watermark handshake: our cell may be invisible
            handshake_done = True  # every look starts after our enqueue completed
            if not cells or cells[0].column != ticket:
                return _Turn.REVOKED
            ahead = cells[1:]
            plan = self._plan(row, shape, len(ahead), lock_id) if shape.eligible(ahead) else None
            if plan is not None:
                taken = take(
                    self.s,
                    attempt,
                    waiter.owner,
                    ticket,
                    row.get(FENCE_COLUMN),
                    also_expect=plan.expect,
                    also_set=plan.also_set or None,
                    column=plan.column,
                )
                if isinstance(taken, HeldLease):
                    taken.enqueued_at, taken.looked_at = waiter.enqueued_at, looked_at
                    taken.proposal_seen = row.get(PROPOSED)
                    taken.contended = contended
                    return taken
                # Another contender took that slot, or the row changed: each refusal means somebody
                # else was granted, so looking again at once cannot spin without progress.
                attempt.check()
                continue
            if not attempt.blocking:
                return _Turn.NOT_NOW
            contended = True
            if not settled:
                # Before we wait, the enqueue must be done: global time surely past our ticket, so a
                # contender that starts after this takes a larger one (the lock's commit wait).
                settled = True
                attempt.io(lambda: settle_ticket_time(self.s.clock, unsettled))
            holders = holder_records(row)
            if ahead:
                watch, who = Watch("gone", ahead[-1].column), _waiter_owner(ahead[-1].value)
            else:
                first = next(iter(holders.values()), None)
                who = first.owner if first is not None else ""
                watch = Watch("holder", who)
            progress = (tuple(cell.column for cell in ahead), tuple(sorted(row.get(c, "") for c in holders)))
            delay = min(delay * 2, self.s.poll_max) if progress == last else self.s.poll_min
            last = progress
            attempt.check()
            local = owner_host(who) == self.s.runtime.host()
            waiting.wait(lock_id, watch, delay * self.s.runtime.uniform(0.5, 1.0), seen, local=local)

    def _plan(self, row: dict[str, str], shape: Shape, position: int, lock_id: str) -> _Plan | None:
        """The grant to send, if the lease row has room for us: the column to take and what the
        compare-and-set must also find (None: no room now). ``position``: cells ahead of ours, to
        spread contenders eligible at once over the free slots."""
        limit_raw = row.get(LIMIT_COLUMN)
        stored = _parse_limit(limit_raw)
        held = [column for column in row if is_holder_column(column)]
        width = shape.limit
        expect: dict[str, str | None] = {LIMIT_COLUMN: limit_raw}
        if limit_raw != str(shape.limit):
            if held:
                what = "limit" if shape.kind == "semaphore" else "max_readers"
                raise LimitMismatch(
                    f"this {shape.kind} is held with {what}={limit_raw}, not {shape.limit}",
                    lock_id=split_row(lock_id)[0],
                )
            # Nobody holds it: change the limit, conditional on every slot of both limits being empty.
            width = max(shape.limit, stored or 0, MAX_LIMIT if stored is None and limit_raw is not None else 0)
            expect.update({slot_column(k): None for k in range(width)})
            if shape.kind == "rwlock":
                expect[HOLDER_COLUMN] = None
        also_set: dict[str, str | None] = {} if limit_raw == str(shape.limit) else {LIMIT_COLUMN: str(shape.limit)}
        if shape.mode == "w":
            if held:
                return None
            expect.update({slot_column(k): None for k in range(width)})
            expect.pop(HOLDER_COLUMN, None)
            return _Plan(HOLDER_COLUMN, expect, also_set)
        if shape.mode == "r":
            if HOLDER_COLUMN in row:
                return None
            expect[HOLDER_COLUMN] = None  # no writer at the grant's instant
        free = [k for k in range(shape.limit) if slot_column(k) not in row]
        if not free:
            return None
        column = slot_column(free[position % len(free)])
        expect.pop(column, None)
        return _Plan(column, expect, also_set)

    @staticmethod
    def _look(store: CellStore, lock_id: str, start: str, ticket: str, limit: int) -> tuple[list[Cell], dict[str, str]]:
        """One look, one round trip: our cell and the ones just ahead (newest first, at most as many
        as can matter) and the lease row (plain read: the grant's compare-and-set re-checks it)."""
        mine_and_before, row = store.execute_all(
            [
                ReadRow(Table.QUEUE, lock_id, start, limit=limit, end=ticket, reverse=True),
                ReadVersioned(lock_id, serial=False),
            ]
        )
        return mine_and_before, row

    # -- leave the queue --------------------------------------------------------------------------

    def _withdraw(self, store: CellStore, waiter: WaiterLease) -> None:
        """Remove our queue cell; if the store is away, keep trying in the background."""
        waiter.end()
        self.s.keeper.remove(waiter)
        stamp = self.s.timestamps.next()
        lock_id = waiter.lock_id

        def delete() -> None:
            self.s.store.delete(Table.QUEUE, lock_id, waiter.ticket, timestamp=stamp)

        try:
            store.delete(Table.QUEUE, lock_id, waiter.ticket, timestamp=stamp)
        except StoreError as exc:
            log.warning("withdraw_deferred", lock_id=lock_id, owner=waiter.owner, error=str(exc))
            self.s.keeper.defer(delete, what="withdraw a queue cell", lock_id=lock_id, give_up_after=3 * self.s.lease)
        self.s.announce(lock_id, gone=waiter.ticket)

    # -- release -------------------------------------------------------------------------------------

    def release(self, lease: HeldLease, store: CellStore) -> bool:
        """The slot's record (with its end record) and the queue cell, in one round trip."""
        pending = store.begin([Delete(Table.QUEUE, lease.lock_id, lease.ticket, self.s.timestamps.next())])
        clean = lease.release(store)
        pending.wait()
        return clean

    def _advance_watermark(self, lock_id: str, ticket: str, token: int) -> None:
        def run() -> None:
            self.s.watermarks.advance(self.s.store, lock_id, ticket, token)

        self.s.keeper.defer(run, what="advance the watermark", lock_id=lock_id, give_up_after=self.s.lease)


class _Waiting:
    """A waiter's sleep: its wake-up socket bound to what it watches (a release or withdrawal on
    this machine wakes it at once), else in-process signals; at most ``backoff`` either way."""

    def __init__(self, services: Services, attempt: Acquisition) -> None:
        self.s = services
        self.attempt = attempt
        self.listener: Listener | None = None
        self.watch: Watch | None = None

    def wait(self, lock_id: str, watch: Watch, backoff: float, seen: int, *, local: bool) -> None:
        attempt = self.attempt
        if watch != self.watch:
            self.close()
            self.watch = watch
            if local:
                bound = (attempt.wakeups or self.s.wakeups).listen(lock_id, watch)
                self.listener = None if bound is None or isinstance(bound, Taken) else bound
        remaining = attempt.remaining()
        if remaining is not None:
            backoff = min(backoff, remaining)
        if self.listener is not None:
            self.listener.wait(backoff, attempt.cancel)
            return
        self.s.signals.wait(lock_id, seen, backoff, attempt.cancel, runtime=attempt.runtime)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self.watch = None


def holder_records(row: dict[str, str]) -> dict[str, HolderRecord]:
    """The well-formed holder records of a lease row, by column (``~holder`` first, slots in order)."""
    out: dict[str, HolderRecord] = {}
    for column in sorted((c for c in row if is_holder_column(c)), key=lambda c: (c != HOLDER_COLUMN, len(c), c)):
        try:
            out[column] = HolderRecord.decode(row[column])
        except StoreError:
            continue
    return out


def _parse_limit(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() else None


def _mode(raw: str) -> str:
    """A queue cell's mode; a malformed cell counts as a writer's (it blocks readers, never admits)."""
    try:
        return WaiterRecord.decode(raw).mode
    except StoreError:
        return "w"


def _waiter_owner(raw: str) -> str:
    try:
        return WaiterRecord.decode(raw).owner
    except StoreError:
        return ""
