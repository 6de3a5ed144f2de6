"""Leases: how a holder and a waiter prove they are alive (DESIGN.md §5–6).

**The holder's lease** is one cell, ``~holder``, in the lock's row of the lease table
(a versioned table: written only by compare-and-set, Paxos on Cassandra). Its value
names the owner, a version, the lease length, the ticket and the fencing token. The
same row holds the fencing counter ``~fence``. Every change to the holder goes through
one compare-and-set on that row:

* **acquire**: ``~holder`` absent and ``~fence`` = n  →  ``~holder`` = me (v1, token n+1),
  ``~fence`` = n+1. One Paxos round grants the lock *and* issues the token, so a
  contender that is not granted never gets a token, and tokens strictly increase in
  grant order. The compare-and-set is also what makes the lock exclusive: two
  contenders can never both find ``~holder`` absent and write it.
* **renew** (every ``lease/3``): ``~holder`` = me@v → me@v+1;
* **release**: ``~holder`` = me@v → absent, ``~ended`` = my end record (released);
* **revoke** (leasewatch): ``~holder`` = the value it watched go stale → absent, ``~ended`` = its
  end record (revoked).

A renewal and a revocation can never both succeed on the same version, and a holder
learns of its revocation at its very next renewal.

**Validity, as the holder sees it.** A holder cannot wait for the renewal that tells
it it was revoked — the store may be unreachable. So the lease counts as lost a lease
length after the *start* of the last successful renewal (or of the acquiring
compare-and-set), measured on this process's monotonic clock. Measuring from the
start is what makes it safe: leasewatch saw the new value no earlier than the
renewal started, stamps its observation when its read *completes*, and waits a lease
plus a grace on its own clock before revoking — so it never revokes before the holder
has given up, as long as the two clocks' rates differ by less than grace/lease (the C#
heartbeat idiom: "measured from before the call"). ``valid_until`` and the ``lost``
event are computed from that at the moment they are asked, not when a renewer thread
happens to look: a renewal stuck in a slow store call cannot keep a lease "valid".

**A waiter's lease** is its queue cell itself: the value (owner, version, length) is
rewritten every ``lease/3`` by a plain write with this process's increasing
timestamps. Waiters never touch the lock's Paxos row, so they never contend with the
holder or with each other there. A waiter wrongly revoked only loses its place: its
cell is deleted with a timestamp no later renewal can beat, and it queues again.

**Unknown outcomes** (:mod:`lockclient.settle`, DESIGN.md §7.7). Every value written here
carries an attempt id, fresh for every compare-and-set — a renewal's retry too — so a
compare-and-set whose outcome was unknown is settled exactly by value: the adapters resolve
what they can (``CellStore.compare_and_set``); what they could not settle, the lease
remembers as *pending* — every such attempt, each with its own start — and recognises at its
next attempt, dating the lease from the start of the attempt whose value the store holds.
A removal writes an end record, so a holder that finds its record gone reads who ended it.
``lost`` fires for a revocation, an expiry or ``max_hold`` — never for a lock this process
released: once ``release()`` was called on a valid lease, only a revocation fires ``lost`` (an
end record naming one, or the record found gone before any release of ours was sent), never
an expiry — the release may have landed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from lockclient import metrics
from lockclient.errors import StoreError, StoreUnavailable
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.settle import ENDED_COLUMN, EndRecord, Found, How, judge_answer, settle_end
from lockclient.store import CasResult, CellStore, Table
from lockclient.store.base import ANY, CompareAndSet, new_attempt_id

__all__ = [
    "ENDED_COLUMN",
    "FENCE_COLUMN",
    "HOLDER_COLUMN",
    "SLOT_PREFIX",
    "HeldLease",
    "HolderRecord",
    "LeaseRecord",
    "LostEvent",
    "WaiterLease",
    "WaiterRecord",
    "ended_column_for",
    "format_fence",
    "handover",
    "holder_columns",
    "is_holder_column",
    "parse_fence",
    "removal",
    "slot_column",
]

HOLDER_COLUMN = "~holder"
"""The holder's lease record in the lock's row of the lease table."""
FENCE_COLUMN = "~fence"
"""The fencing counter in the same row: ``"<n>|<owner that took n>"``."""
SLOT_PREFIX = "~holder:"
"""Primitives with several holders (:mod:`lockclient.sharedqueue`: semaphores, readers of a
read-write lock) keep one holder record per *slot*, ``~holder:<k>``, beside the fencing counter.
Each slot is a lease exactly like ``~holder`` — renewed, released and revoked by compare-and-set
on its own value, with its own end record ``~ended:<k>`` — so everything below applies to a slot
unchanged; only the column differs."""


def slot_column(slot: int) -> str:
    """The holder column of slot ``slot`` (``~holder:<slot>``)."""
    return f"{SLOT_PREFIX}{slot}"


def is_holder_column(column: str) -> bool:
    """``~holder`` or a slot's ``~holder:<k>``."""
    return column == HOLDER_COLUMN or column.startswith(SLOT_PREFIX)


def ended_column_for(column: str) -> str:
    """The end record column of a holder column: ``~ended`` for ``~holder``, ``~ended:<k>`` for a slot."""
    return ENDED_COLUMN + column[len(HOLDER_COLUMN) :]


def holder_columns(row: Mapping[str, str]) -> list[str]:
    """The holder columns present in a lease row, ``~holder`` first, then the slots in order."""
    columns = [column for column in row if is_holder_column(column)]
    return sorted(columns, key=lambda c: (c != HOLDER_COLUMN, len(c), c))


log = get_logger("lockclient.lease")

WRITES_KEPT = 8
"""A waiter remembers when its last this-many queue-cell writes started: a lock handed over on an
older version (read more than ~2 leases ago) is dated as already expired."""


def _loads(raw: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StoreError(f"malformed {what} {raw[:100]!r}") from exc
    if not isinstance(data, dict):
        raise StoreError(f"malformed {what} {raw[:100]!r}")
    return data


@dataclass(frozen=True, slots=True)
class HolderRecord:
    """The value of ``~holder``."""

    owner: str
    version: int
    lease: float
    ticket: str
    token: int
    attempt: str = ""
    """The id of the compare-and-set that wrote this value (grant or renewal): unique per call, so
    two attempts of the same change never write the same value. Empty in records written before
    attempt ids existed (still decoded)."""
    since: int = 0
    """Global time (µs) read just before the grant's compare-and-set was sent: the hold began at or
    after it, within that compare-and-set's round trip. Only acquisitions that ask for it stamp it
    (an election's ``leader()`` answers "since when"); 0 otherwise."""
    until: int = 0
    """Non-zero: the record is *parked* — its owner released it before its ``min_hold`` was over,
    and the lock stays held until global time reaches this (µs). Nobody renews a parked record; a
    contender whose global clock has passed ``until`` removes it, and leasewatch does after its
    ``lease`` (set to the rest of the hold, with a margin) if nobody comes."""
    label: str = ""
    """The holder's label (:mod:`lockclient.labels`; empty: none). Like every optional field it is
    written only when set, and readers ignore fields they do not know: a record with a label reads
    as before in an older chronolock, and an older record reads here with an empty label."""
    payload: str = ""
    """The holder's payload (:mod:`lockclient.labels`; empty: none)."""
    granted: int = 0
    """Global time (µs) of the grant, *estimated* for display ("held for"): the ticket's global
    time plus this process's monotonic time from taking the ticket to sending the grant — or
    ``since`` when the grant was stamped. Never used to decide anything. 0: unknown (the baseline
    algorithm, records written before it existed)."""
    hands_over: bool = False
    """Its owner waited for the lock, so others likely wait behind it: its release reads the head of
    the queue and hands the lock to the first in line in the same compare-and-set. A waiter woken by
    the release of such a holder looks (the lock may be its own already) instead of sending a grant
    of its own, which the hand-over would make a Paxos round lost (:mod:`lockclient.fairqueue`)."""
    cell: int = 0
    """Non-zero: the record was *handed over* — written by the previous holder's release, not by
    its owner (:mod:`lockclient.fairqueue`, "A hand-over in one Paxos round"). It is the version of
    the owner's queue cell that the releaser read: the owner dates its lease from the start of its
    own write of that version (leasewatch can only have started timing the record after it)."""

    def encode(self) -> str:
        data: dict[str, object] = {"o": self.owner, "v": self.version, "l": self.lease, "t": self.ticket}
        data["f"] = self.token
        if self.attempt:
            data["a"] = self.attempt
        if self.since:
            data["s"] = self.since
        if self.until:
            data["u"] = self.until
        if self.label:
            data["n"] = self.label
        if self.payload:
            data["p"] = self.payload
        if self.granted:
            data["g"] = self.granted
        if self.hands_over:
            data["h"] = 1
        if self.cell:
            data["c"] = self.cell
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> HolderRecord:
        data = _loads(raw, "holder record")
        try:
            return cls(
                str(data["o"]),
                int(data["v"]),
                float(data["l"]),
                str(data["t"]),
                int(data["f"]),
                str(data.get("a", "")),
                int(data.get("s", 0)),
                int(data.get("u", 0)),
                str(data.get("n", "")),
                str(data.get("p", "")),
                int(data.get("g", 0)),
                bool(data.get("h", 0)),
                int(data.get("c", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed holder record {raw[:100]!r}") from exc

    @property
    def handing_over(self) -> bool:
        """Whether its release hands the lock over (:attr:`hands_over`; a lock handed over to its
        owner was waited for, so its release does too)."""
        return self.hands_over or bool(self.cell)

    def renewed(self, runtime: Runtime = THREADS) -> HolderRecord:
        """The next version, with a fresh attempt id (a new one for every renewal attempt)."""
        return replace(self, version=self.version + 1, attempt=new_attempt_id(runtime))

    def end(self, how: How, attempt: str | None = None, *, runtime: Runtime = THREADS) -> str:
        """The end record a removal of this record writes."""
        return EndRecord(self.token, self.owner, how, attempt or new_attempt_id(runtime)).encode()


def removal(
    lock_id: str,
    value: str,
    record: HolderRecord,
    how: How,
    *,
    runtime: Runtime = THREADS,
    column: str = HOLDER_COLUMN,
) -> CompareAndSet:
    """The compare-and-set that ends the holder record ``value`` of ``lock_id`` (its owner's
    release, or a revocation): delete it if it is exactly that value, and write its end record —
    whatever ``~ended`` held, the previous holder's end (:data:`~lockclient.store.base.ANY`).
    A fresh attempt id per call. ``column``: a slot's holder column (its end record is the slot's)."""
    ended = ended_column_for(column)
    return CompareAndSet(
        lock_id,
        {column: value, ended: ANY},
        {column: None, ended: record.end(how, runtime=runtime)},
    )


def handover(
    lock_id: str,
    value: str,
    record: HolderRecord,
    successor: HolderRecord,
    *,
    also_expect: Mapping[str, str | None] | None = None,
    runtime: Runtime = THREADS,
) -> CompareAndSet:
    """A release that grants the lock to ``successor`` in the same compare-and-set (the fair
    queue's hand-over): conditional on the holder record ``value`` as a release is (and on
    ``also_expect``), it writes our end record (released), the successor's holder record and the
    fencing counter its token makes. Nobody can have been granted while our record was there, so
    the counter is the one our grant wrote, and the successor's token is the next one."""
    return CompareAndSet(
        lock_id,
        {
            **(also_expect or {}),
            HOLDER_COLUMN: value,
            ENDED_COLUMN: ANY,
            # What our own grant wrote (and nothing can have changed while our record is there).
            FENCE_COLUMN: format_fence(record.token, record.owner),
        },
        {
            HOLDER_COLUMN: successor.encode(),
            FENCE_COLUMN: format_fence(successor.token, successor.owner),
            ENDED_COLUMN: record.end("released", runtime=runtime),
        },
    )


@dataclass(frozen=True, slots=True)
class WaiterRecord:
    """The value of a queue cell: the waiter's lease."""

    owner: str
    version: int
    lease: float
    mode: str = ""
    """What the waiter wants, where a primitive has several kinds of holder: ``"r"`` (a reader of a
    read-write lock) or ``"w"`` (its writer); empty for a lock or a semaphore."""
    label: str = ""
    """The waiter's label (:mod:`lockclient.labels`), written only when set. The payload is not
    here: it waits for the holder record (every look at the queue reads every cell)."""
    adopts: bool = False
    """The waiter takes a lock handed to it by the holder's release (:attr:`HolderRecord.cell`):
    the release may write its holder record. Written only when set, so a waiter of an older
    chronolock — which would never adopt such a record — is never handed the lock; a waiter that
    wants a stamped grant or a payload in its record does not set it either (the releaser cannot
    write what only the waiter knows)."""

    def encode(self) -> str:
        data: dict[str, object] = {"o": self.owner, "v": self.version, "l": self.lease}
        if self.mode:
            data["k"] = self.mode
        if self.label:
            data["n"] = self.label
        if self.adopts:
            data["h"] = 1
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> WaiterRecord:
        data = _loads(raw, "queue cell")
        try:
            return cls(
                str(data["o"]),
                int(data["v"]),
                float(data["l"]),
                str(data.get("k", "")),
                str(data.get("n", "")),
                bool(data.get("h", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed queue cell {raw[:100]!r}") from exc


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease as ``status()`` and leasewatch show it (a holder's or a waiter's)."""

    version: int
    lease: float
    ticket: str
    holding: bool = False
    label: str = ""
    """The owner's label (:mod:`lockclient.labels`; empty: none)."""
    payload: str = ""
    """The holder's payload (empty for a waiter, or none given)."""
    granted_us: int = 0
    """A holder's grant, in global µs, estimated (:attr:`HolderRecord.granted`; 0: unknown)."""


def parse_fence(raw: str | None) -> tuple[int, str]:
    """``"17|owner"`` -> (17, owner); absent -> (0, "")."""
    if raw is None:
        return 0, ""
    number, _, owner = raw.partition("|")
    try:
        return int(number), owner
    except ValueError as exc:
        raise StoreError(f"malformed fencing counter {raw[:100]!r}") from exc


def format_fence(token: int, owner: str) -> str:
    return f"{token}|{owner}"


class LostEvent(threading.Event):
    """``lock.lost``: set when the lease was revoked, could not be renewed in time, or ran
    past ``max_hold`` — and *also* whenever it is looked at after ``valid_until`` passed,
    whether or not any thread noticed yet (``is_set`` and ``wait`` check the deadline)."""

    def __init__(self, lease: HeldLease) -> None:
        super().__init__()
        self._lease = lease

    def is_set(self) -> bool:
        if super().is_set():
            return True
        self._lease.check_expiry()
        return super().is_set()

    isSet = is_set  # noqa: N815 - threading.Event's old alias must not bypass the check

    def wait(self, timeout: float | None = None) -> bool:
        monotonic = self._lease.monotonic
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            if self.is_set():
                return True
            now = monotonic()
            # A lease that can still expire into "lost" is looked at again at its deadline; one that
            # cannot (ended, or being released: see HeldLease.releasing) only when the event is set
            # or the caller's own deadline comes — never in a loop of 1 ms waits past valid_until.
            expires = not (self._lease.ended or self._lease.releasing)
            wakes = [w for w in (self._lease.valid_until() if expires else None, deadline) if w is not None]
            if super().wait(max(0.0, min(wakes) - now) + 0.001 if wakes else None) or self.is_set():
                return True
            if deadline is not None and monotonic() >= deadline:
                return False


class HeldLease:
    """The holder's side of one granted lock: its record, its validity, its lost signal.

    Store calls on one lease are serialized (renewal, release); validity is read without
    the mutex, so a stuck store call never delays the answer to "am I still valid?".
    """

    def __init__(
        self,
        lock_id: str,
        record: HolderRecord,
        *,
        renewed_at: float,
        max_hold: float | None = None,
        runtime: Runtime = THREADS,
        monotonic: Callable[[], float] | None = None,
        column: str = HOLDER_COLUMN,
    ) -> None:
        """``monotonic`` overrides the runtime's clock (tests move time by hand). ``column``: the
        holder column this lease lives in (a slot's, for primitives with several holders)."""
        self.column = column
        self.ended_column = ended_column_for(column)
        self.lock_id = lock_id
        self.owner = record.owner
        self.ticket = record.ticket
        self.lease = record.lease
        self.token = record.token
        self.max_hold = max_hold
        self.runtime = runtime
        self.monotonic = monotonic or runtime.monotonic
        self.record = record
        self.value = record.encode()
        self.renewed_at = renewed_at
        """Start (monotonic) of the compare-and-set that last proved this lease ours."""
        self.holding_since = renewed_at
        self.enqueued_at: float | None = None
        """Monotonic time the holder's queue cell was written (fair queue only)."""
        self.looked_at: float | None = None
        """Monotonic start of the queue read after which it was granted (fair queue only)."""
        self.contended = False
        """It had to wait for its turn: others are likely queued behind it when it releases."""
        self.granted_upper_us = 0
        """With a stamped grant: the upper end of global time's interval read just before the grant's
        compare-and-set — at least any global time anybody saw before (:mod:`lockclient.hold`)."""
        self.proposal_seen: str | None = None
        """Fair queue: the lock's watermark proposal as the look before the grant read it."""
        self.renew_not_before = 0.0
        """The first renewal's earliest start, for a lease dated from before it was granted (a lock
        handed over: :mod:`lockclient.fairqueue`) — whose ``renewed_at + lease/3`` is often past
        when it is adopted: renewing at once would cost every hand-over a second Paxos round."""
        self.handed_to: HolderRecord | None = None
        """Fair queue: the release handed the lock to this waiter (its compare-and-set applied)."""
        self.handed_read_at: float | None = None
        """Fair queue: monotonic start of the queue read that chose whom the release hands the lock
        to — FIFO is judged by it (no cell written before it is overtaken)."""
        self._pending: dict[str, tuple[HolderRecord, float]] = {}
        """Renewals whose outcome stayed unknown, since the last proven value: value -> (record,
        start). All are conditional on the same current value, so at most one of them applied;
        the one whose value the store holds is adopted, dated from its own start."""
        self._release_sent = False
        """A release of ours was sent and its outcome is not known (it may have landed)."""
        self._read_end = False
        """Our record was found gone or replaced while a release of ours may have landed: the next
        step reads the end record instead of renewing."""
        self._released_clean = False
        self.park_until = 0
        """Set before :meth:`release` by a holder with ``min_hold`` left: the release *parks* the
        record (see :attr:`HolderRecord.until`) instead of removing it."""
        self.park_lease = 0.0
        """The parked record's lease length (the rest of the hold, with a margin): when leasewatch
        may remove it if no contender does."""
        self._parked: set[str] = set()
        """Values of parking attempts sent (an outcome left unknown): finding one proves it landed."""
        self.parked = False
        """The release parked the record (it stays until ``park_until``)."""
        self.releasing = False
        """release() was called while the lease was valid: from now on ``lost`` fires only for a
        revocation — an end record naming one, or the record gone before any release of ours was
        sent — never for an expiry while the release is pending (it may have landed)."""
        self.lost = LostEvent(self)
        self.lost_reason: str | None = None
        self.ended = False
        """Released: the record is gone from the store (or was never ours)."""
        self.renew_failures = 0
        self.last_attempt_at = renewed_at
        self.renewing_stopped = False
        self._mutex = runtime.lock()  # serializes store calls on this lease (held across them)
        # Guards lost / callbacks; never held across a store call or a wait, so a plain lock
        # serves every runtime.
        self._state = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []

    # -- validity --------------------------------------------------------------------

    def valid_until(self) -> float:
        return self.renewed_at + self.lease

    def check_expiry(self) -> None:
        if not self.ended and not self.releasing and self.monotonic() >= self.valid_until():
            self._fire_lost(f"no renewal succeeded within the lease ({self.lease:g} s)")

    def next_due(self) -> float:
        """When the next renewal should start: every lease/3 (not before :attr:`renew_not_before`);
        sooner after a failure."""
        if self.renew_failures:
            return self.last_attempt_at + min(self.lease / 10, 1.0)
        return max(self.renewed_at + self.lease / 3, self.renew_not_before)

    # -- store calls --------------------------------------------------------------------

    def renew(self, store: CellStore) -> None:
        """One renewal: ``me@v -> me@v+1 if still me@v``. Called by the keeper."""
        if not self.wants_renewal():
            return
        lost_reason: str | None = None
        with self._mutex:
            if self.ended:
                return
            started = self.last_attempt_at = self.monotonic()
            # Once more if the row held an earlier attempt of ours (adopted: renew from it), and
            # once more again if our record was gone while a release of ours was pending.
            for _ in range(3):
                if self._read_end:
                    verdict, lost_reason = self._settle_from_row(store)
                else:
                    op, new, new_value = self.renewal()
                    try:
                        outcome: CasResult | StoreError = store.compare_and_set(op.row, op.expected, op.updates)
                    except StoreError as exc:
                        outcome = exc
                    verdict, lost_reason = self.settle_renewal(new, new_value, started, outcome)
                if verdict != "again":
                    break
        if lost_reason is not None:
            self._fire_lost(lost_reason)

    def wants_renewal(self) -> bool:
        """False when it is over (ended, lost) or past ``max_hold`` (then it is left to expire)."""
        if self.ended or self.lost.is_set():
            return False
        if self.max_hold is not None and self.monotonic() - self.holding_since > self.max_hold:
            # A hung holder: stop renewing; the lease runs out and leasewatch revokes it.
            if not self.renewing_stopped:
                log.warning("max_hold_exceeded", lock_id=self.lock_id, owner=self.owner, max_hold=self.max_hold)
            self.renewing_stopped = True
            return False
        return True

    def try_hold(self) -> bool:
        """Take this lease's store mutex without waiting (a batch renewal skips a lease that is
        busy releasing); :meth:`let_go` gives it back."""
        return self._mutex.acquire(blocking=False)

    def let_go(self) -> None:
        self._mutex.release()

    def renewal(self) -> tuple[CompareAndSet, HolderRecord, str]:
        """The next renewal's compare-and-set (caller holds the mutex): a new version and a new
        attempt id, also when it repeats a renewal whose outcome is unknown."""
        new = self.record.renewed(self.runtime)
        new_value = new.encode()
        op = CompareAndSet(self.lock_id, {self.column: self.value}, {self.column: new_value})
        return op, new, new_value

    def settle_renewal(
        self, new: HolderRecord, new_value: str, started: float, outcome: CasResult | StoreError
    ) -> tuple[str, str | None]:
        """Take a renewal's outcome into account (caller holds the mutex). Returns a verdict —
        ``ok``, ``error``, ``again`` (an earlier attempt of ours was found applied: renew once
        more from it; or our record is gone while a release of ours is pending: read its end
        record next) or ``lost`` — and the reason to fire the lost signal with, if any (the
        caller fires it after letting go of the mutex)."""
        if isinstance(outcome, StoreError):
            # Outcome unknown even after the adapter's re-reads: remember the attempt, so that
            # finding its value later proves it applied (attempt ids make every value unique).
            self._pending[new_value] = (new, started)
            self.renew_failures += 1
            metrics.RENEWALS.labels("error").inc()
            log.warning("lease_renewal_failed", lock_id=self.lock_id, owner=self.owner, error=str(outcome))
            return "error", None
        if outcome.applied:
            self._adopt(new, started, value=new_value)
            metrics.RENEWALS.labels("ok").inc()
            return "ok", None
        current = outcome.current.get(self.column)
        found = judge_answer(current, ours=self.value, pending=self._pending, release_sent=self._release_sent)
        if found is Found.READ_END and current in self._parked:
            found = Found.RELEASED  # our parking landed (its answer was lost): released
            self._end(clean=True, parked=True)
        if found is Found.PENDING:
            assert current is not None
            self._adopt(*self._pending[current], value=current)
            return "again", None
        if found is Found.READ_END:
            # Finding 2 of issue 23: a release of ours may have landed (its answer was lost) and
            # the next holder been granted since. Who ended our record decides, not "it is gone".
            self._read_end = True
            return "again", None
        if found is Found.OURS or found is Found.RELEASED:
            # Refused while holding exactly what it expected: not a loss; try again later. (Or
            # released: then nothing renews it again.)
            if found is Found.OURS:
                self.renew_failures += 1
            return "error", None
        metrics.RENEWALS.labels("revoked").inc()
        return "lost", "lease revoked" if current is None else "lease record changed by another writer"

    def _settle_from_row(self, store: CellStore) -> tuple[str, str | None]:
        """Read the row (SERIAL) and settle who ended our record (caller holds the mutex)."""
        try:
            row = store.read_versioned(self.lock_id)
        except StoreError as exc:
            self.renew_failures += 1
            log.warning("lease_end_read_failed", lock_id=self.lock_id, owner=self.owner, error=str(exc))
            return "error", None
        self._read_end = False
        verdict = self._settled(row, self.monotonic())
        if verdict is Found.PENDING or verdict is Found.OURS:
            return "again", None
        if verdict is Found.RELEASED:
            return "ok", None
        metrics.RENEWALS.labels("revoked").inc()
        return "lost", "lease revoked" if row.get(self.column) is None else "lease record changed by another writer"

    def _settled(self, row: dict[str, str], seen_at: float) -> Found:
        """Apply :func:`lockclient.settle.settle_end` to a row read linearizably (caller holds the
        mutex): adopts a pending value, or ends the lease when our release landed."""
        if row.get(self.column) in self._parked:
            self._end(clean=True, parked=True)
            return Found.RELEASED
        settled = settle_end(
            row,
            ours=self.value,
            pending=self._pending,
            token=self.token,
            owner=self.owner,
            holder_column=self.column,
            ended_column=self.ended_column,
            release_sent=self._release_sent,
            seen_before_valid_until=seen_at < self.valid_until(),
        )
        if settled.found is Found.PENDING:
            current = row[self.column]
            self._adopt(*self._pending[current], value=current)
        elif settled.found is Found.RELEASED:
            if not settled.proven:
                log.info("release_settled_unproven", lock_id=self.lock_id, owner=self.owner)
            self._end(clean=True)
        return settled.found

    def _adopt(self, record: HolderRecord, started: float, value: str | None = None) -> None:
        """The store holds ``record`` (written by an attempt that started at ``started``): go on
        from it, dated from that start — never from a later attempt's (finding 1)."""
        self.record, self.value = record, value if value is not None else record.encode()
        self.renewed_at = max(self.renewed_at, started)
        self.renew_failures = 0
        self._pending.clear()

    def release(
        self,
        store: CellStore,
        successor: HolderRecord | None = None,
        also_expect: Mapping[str, str | None] | None = None,
    ) -> bool:
        """Delete the record if it is still ours, writing our end record — or, with
        :attr:`park_until` set, park it (see :attr:`HolderRecord.until`). True if it was ours
        until now; False if it had been revoked (the lock was lost). Raises StoreError when the
        outcome stays unknown — the caller retries, and a retry recognises an earlier success by
        its end record (or its parked value).

        ``successor``: hand the lock over in the same compare-and-set (:func:`handover`; never
        when parking), also conditional on ``also_expect``. Refused while our record is still
        there (a cell of ``also_expect`` moved), the release goes on without it: a plain removal.
        Whether it was handed over: :attr:`handed_to`."""
        with self._mutex:
            if self.ended:
                return self._released_clean
            for _ in range(3):
                parking = bool(self.park_until)
                handing = successor is not None and not parking
                if handing:
                    assert successor is not None
                    op = handover(
                        self.lock_id, self.value, self.record, successor, also_expect=also_expect, runtime=self.runtime
                    )
                else:
                    op = self._parking() if parking else self._removal()
                try:
                    result = store.compare_and_set(op.row, op.expected, op.updates)
                except StoreError:
                    self._release_sent = True  # it may have landed: a later "gone" may be ours
                    raise
                if result.applied:
                    if handing:
                        self.handed_to = successor
                    self._end(clean=True, parked=parking)
                    return True
                if handing and result.current.get(self.column) == self.value:
                    successor = None  # our record is there: a condition of the hand-over moved
                    continue
                current = result.current.get(self.column)
                if current is not None and current in self._parked:
                    self._end(clean=True, parked=True)  # an earlier parking of ours landed
                    return True
                sent = self._release_sent or result.uncertain  # an uncertain answer may be ours
                found = judge_answer(current, ours=self.value, pending=self._pending, release_sent=sent)
                if found is Found.PENDING:
                    assert current is not None
                    self._adopt(*self._pending[current], value=current)
                    continue  # an earlier renewal of ours applied: release from it
                if found is Found.READ_END:
                    self._release_sent = sent
                    row = store.read_versioned(self.lock_id)  # StoreError: retried by the caller
                    found = self._settled(row, self.monotonic())
                    if found is Found.RELEASED:
                        return True
                if found is Found.LOST or found is Found.REVOKED:
                    self._fire_lost("lease revoked before release")
                    self._end(clean=False)
                    return False
            # Refused while the row held our own (adopted) value three times: not settled — the
            # caller retries later, and nothing is reported lost.
            raise StoreUnavailable(f"release of {self.lock_id!r} was refused while the record is ours")

    def _removal(self) -> CompareAndSet:
        return removal(self.lock_id, self.value, self.record, "released", runtime=self.runtime, column=self.column)

    def _parking(self) -> CompareAndSet:
        """Our record → the same record parked until :attr:`park_until` (a new version and attempt
        id, not renewed by anyone: its lease is the rest of the hold, so leasewatch leaves it be
        until then). The queue cell goes as in any release; the fencing counter stays, so nobody
        can be granted over the parked record (the grant expects no holder)."""
        parked = replace(
            self.record.renewed(self.runtime), until=self.park_until, lease=max(self.park_lease, 0.001)
        ).encode()
        self._parked.add(parked)
        return CompareAndSet(self.lock_id, {self.column: self.value}, {self.column: parked})

    def note_release_attempt(self) -> None:
        """A release call raised (outcome unknown): a later "already gone" may be our own doing."""
        self._release_sent = True

    def _end(self, *, clean: bool, parked: bool = False) -> None:
        self.ended = True
        self._released_clean = clean
        self.parked = self.parked or parked

    # -- lost signal ---------------------------------------------------------------------

    def on_lost(self, callback: Callable[[str], None]) -> None:
        # Expiry first, outside the state lock: checking it may fire the signal, which takes that
        # lock itself (found by the simulator: asking `lost.is_set()` under it deadlocked a caller
        # that registered a callback just after its lease ran out).
        self.check_expiry()
        with self._state:
            fire_now = threading.Event.is_set(self.lost) and not self.ended
            if not fire_now:
                self._callbacks.append(callback)
        if fire_now:
            self._run_callback(callback, self.lost_reason or "lost")

    def mark_lost(self, reason: str) -> None:
        self._fire_lost(reason)

    def _fire_lost(self, reason: str) -> None:
        with self._state:
            if threading.Event.is_set(self.lost) or self.ended:
                return
            self.lost_reason = reason
            threading.Event.set(self.lost)
            callbacks, self._callbacks = self._callbacks, []
        metrics.LOCKS_LOST.inc()
        log.warning("lock_lost", lock_id=self.lock_id, owner=self.owner, reason=reason)
        for callback in callbacks:
            # User code: each in its own thread (task), so none can stall renewals or expiry.
            self.runtime.spawn(partial(self._run_callback, callback, reason), name="chronolock-on-lost")

    def _run_callback(self, callback: Callable[[str], None], reason: str) -> None:
        try:
            callback(reason)
        except Exception:
            log.exception("on_lost_callback_failed", lock_id=self.lock_id)


class WaiterLease:
    """A waiter's queue cell, renewed by rewriting it (a plain write, never Paxos)."""

    def __init__(
        self,
        lock_id: str,
        owner: str,
        ticket: str,
        lease: float,
        *,
        runtime: Runtime = THREADS,
        mode: str = "",
        label: str = "",
        adopts: bool = False,
    ) -> None:
        """``mode``: what the waiter wants (:attr:`WaiterRecord.mode`); ``label``: its label;
        ``adopts``: it takes a lock handed over to it (:attr:`WaiterRecord.adopts`)."""
        self.lock_id = lock_id
        self.owner = owner
        self.ticket = ticket
        self.lease = lease
        self.monotonic = monotonic = runtime.monotonic
        self.record = WaiterRecord(owner, 1, lease, mode, label, adopts)
        self.renewed_at = monotonic()
        self._written: dict[int, float] = {1: self.renewed_at}
        """Version -> the earliest start of a write of it (the enqueue's is taken before it is sent):
        a lock handed over to us on a version a releaser read is dated from there."""
        self.enqueued_at: float | None = None
        self.renew_failures = 0
        self.last_attempt_at = self.renewed_at
        self.ended = False
        self.interrupted = False
        """A renewal started a lease or more after the last successful one (the store was away):
        leasewatch may have revoked the cell meanwhile, and a revoked cell's tombstone shadows every
        later renewal — which still *succeeds* (a plain write that loses to a newer tombstone). From
        then on only a look, never :meth:`alive`, says whether the cell is there (found by the
        simulator: a waiter cut off from the store for a lease was handed the lock over the waiters
        behind it, its cell long gone)."""
        self._mutex = runtime.lock()  # serializes renewals (held across the store call)
        self._state = threading.Lock()  # never held across a call: see renew()

    @property
    def value(self) -> str:
        return self.record.encode()

    def next_due(self) -> float:
        if self.renew_failures:
            return self.last_attempt_at + min(self.lease / 10, 1.0)
        return self.renewed_at + self.lease / 3

    def alive(self) -> bool:
        """No revocation can have removed our cell yet: the last renewal (or the enqueue) started
        less than a lease ago by our clock, and leasewatch waits a lease plus a grace past the last
        change it saw before it revokes — and no renewal ever came a lease or more after the one
        before it (see :attr:`interrupted`)."""
        return not self.interrupted and self.monotonic() - self.renewed_at < self.lease

    def renew(self, store: CellStore, timestamp: Callable[[], int]) -> None:
        with self._mutex:
            with self._state:
                # The timestamp is taken under the state lock that end() takes: a renewal that
                # starts after end() writes nothing, and one that started before has a smaller
                # timestamp than the withdrawal's delete (taken after end()), so it can never
                # bring the cell back — and end() never waits for a store call.
                if self.ended:
                    return
                started = self.last_attempt_at = self.monotonic()
                record = replace(self.record, version=self.record.version + 1)
                stamp = timestamp()
                # Before it is sent (it may land and its answer be lost), and the earliest attempt
                # of a version: a retry writes the same version again, later.
                self._written.setdefault(record.version, started)
                for old in [v for v in self._written if v <= record.version - WRITES_KEPT]:
                    del self._written[old]
            try:
                store.put(Table.QUEUE, self.lock_id, self.ticket, record.encode(), timestamp=stamp)
            except StoreError as exc:
                self.renew_failures += 1
                log.warning("waiter_renewal_failed", lock_id=self.lock_id, owner=self.owner, error=str(exc))
                return
            if started - self.renewed_at >= self.lease:
                self.interrupted = True
            self.record, self.renewed_at, self.renew_failures = record, started, 0

    def written_at(self, version: int) -> float | None:
        """When our write of that version of the cell started (its earliest attempt), if it is one of
        the last few."""
        with self._state:
            return self._written.get(version)

    def end(self) -> None:
        """Stop renewing (the caller deletes the cell, or it became the holder's). Never waits
        for a renewal in flight (see :meth:`renew`)."""
        with self._state:
            self.ended = True
