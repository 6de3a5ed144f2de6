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
* **release**: ``~holder`` = me@v → absent;
* **revoke** (leasewatch): ``~holder`` = the value it watched go stale → absent.

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

**Unknown outcomes.** Every value written here is unique (owner + version), so a
compare-and-set whose outcome was unknown is settled by value: the adapters resolve
what they can (``CellStore.compare_and_set``); what they could not settle, the lease
remembers as *pending* and recognises at its next attempt.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from lockclient import metrics
from lockclient.errors import StoreError
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CasResult, CellStore, Table
from lockclient.store.base import CompareAndSet

__all__ = [
    "FENCE_COLUMN",
    "HOLDER_COLUMN",
    "HeldLease",
    "HolderRecord",
    "LeaseRecord",
    "LostEvent",
    "WaiterLease",
    "WaiterRecord",
    "format_fence",
    "parse_fence",
]

HOLDER_COLUMN = "~holder"
"""The holder's lease record in the lock's row of the lease table."""
FENCE_COLUMN = "~fence"
"""The fencing counter in the same row: ``"<n>|<owner that took n>"``."""

log = get_logger("lockclient.lease")


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

    def encode(self) -> str:
        return json.dumps(
            {"o": self.owner, "v": self.version, "l": self.lease, "t": self.ticket, "f": self.token},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def decode(cls, raw: str) -> HolderRecord:
        data = _loads(raw, "holder record")
        try:
            return cls(str(data["o"]), int(data["v"]), float(data["l"]), str(data["t"]), int(data["f"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed holder record {raw[:100]!r}") from exc

    def renewed(self) -> HolderRecord:
        return replace(self, version=self.version + 1)


@dataclass(frozen=True, slots=True)
class WaiterRecord:
    """The value of a queue cell: the waiter's lease."""

    owner: str
    version: int
    lease: float

    def encode(self) -> str:
        return json.dumps({"o": self.owner, "v": self.version, "l": self.lease}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> WaiterRecord:
        data = _loads(raw, "queue cell")
        try:
            return cls(str(data["o"]), int(data["v"]), float(data["l"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed queue cell {raw[:100]!r}") from exc


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease as ``status()`` and leasewatch show it (a holder's or a waiter's)."""

    version: int
    lease: float
    ticket: str
    holding: bool = False


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
            wake = self._lease.valid_until()
            if deadline is not None:
                wake = min(wake, deadline)
            if super().wait(max(0.0, wake - now) + 0.001) or self.is_set():
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
    ) -> None:
        self.lock_id = lock_id
        self.owner = record.owner
        self.ticket = record.ticket
        self.lease = record.lease
        self.token = record.token
        self.max_hold = max_hold
        self.runtime = runtime
        self.monotonic = runtime.monotonic
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
        self.proposal_seen: str | None = None
        """Fair queue: the lock's watermark proposal as the look before the grant read it."""
        self._pending: tuple[HolderRecord, str, float] | None = None
        """A renewal whose outcome stayed unknown: (record, value, start); ours if found."""
        self._release_tried = False
        self._released_clean = False
        self.releasing = False
        """release() was called: a record found gone is a release that landed, not a loss."""
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
        if not self.ended and self.monotonic() >= self.valid_until():
            self._fire_lost(f"no renewal succeeded within the lease ({self.lease:g} s)")

    def next_due(self) -> float:
        """When the next renewal should start: every lease/3; sooner after a failure."""
        if self.renew_failures:
            return self.last_attempt_at + min(self.lease / 10, 1.0)
        return self.renewed_at + self.lease / 3

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
            for _ in range(2):  # once more if the row held an earlier proposal of ours
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
        """The next renewal's compare-and-set (caller holds the mutex)."""
        new = self.record.renewed()
        new_value = new.encode()
        op = CompareAndSet(self.lock_id, {HOLDER_COLUMN: self.value}, {HOLDER_COLUMN: new_value})
        return op, new, new_value

    def settle_renewal(
        self, new: HolderRecord, new_value: str, started: float, outcome: CasResult | StoreError
    ) -> tuple[str, str | None]:
        """Take a renewal's outcome into account (caller holds the mutex). Returns a verdict —
        ``ok``, ``error``, ``again`` (an earlier proposal of ours was found applied: renew once
        more from it) or ``lost`` — and the reason to fire the lost signal with, if any (the
        caller fires it after letting go of the mutex)."""
        if isinstance(outcome, StoreError):
            # Outcome unknown even after the adapter's re-reads: remember the proposal, so that
            # finding it later proves it applied (values are unique).
            self._pending = (new, new_value, started)
            self.renew_failures += 1
            metrics.RENEWALS.labels("error").inc()
            log.warning("lease_renewal_failed", lock_id=self.lock_id, owner=self.owner, error=str(outcome))
            return "error", None
        if outcome.applied:
            self._adopt(new, new_value, started)
            metrics.RENEWALS.labels("ok").inc()
            return "ok", None
        current = outcome.current.get(HOLDER_COLUMN)
        if self._adopt_pending(current):
            return "again", None
        if current is None and self.releasing and self._release_tried:
            self._end(clean=True)  # our release landed; its answer was lost
            return "ok", None
        metrics.RENEWALS.labels("revoked").inc()
        return "lost", "lease revoked" if current is None else "lease record changed by another writer"

    def _adopt(self, record: HolderRecord, value: str, started: float) -> None:
        self.record, self.value = record, value
        self.renewed_at = max(self.renewed_at, started)
        self.renew_failures = 0
        self._pending = None

    def _adopt_pending(self, current: str | None) -> bool:
        """The row holds the value of an earlier attempt whose answer was lost: it applied.
        Go on from it (caller holds the mutex). False if ``current`` is not that value."""
        pending = self._pending
        if pending is None or current != pending[1]:
            return False
        self._adopt(*pending)
        return True

    def release(self, store: CellStore) -> bool:
        """Delete the record if it is still ours. True if it was ours until now; False if it
        had been revoked or changed (the lock was lost). Raises StoreError when the outcome
        stays unknown — the caller retries, and a retry recognises an earlier success."""
        with self._mutex:
            if self.ended:
                return self._released_clean
            for _ in range(2):
                sent_at = self.monotonic()
                result = store.compare_and_set(self.lock_id, {HOLDER_COLUMN: self.value}, {HOLDER_COLUMN: None})
                if result.applied:
                    self._end(clean=True)
                    return True
                current = result.current.get(HOLDER_COLUMN)
                if result.uncertain and sent_at < self.valid_until():
                    # Outcome unknown and the lock has a new holder already (a contended
                    # hand-over on a ring). Our lease was valid when the delete left, so no
                    # revocation could have removed our record before it (leasewatch waits
                    # lease + grace past our last renewal): the record was ours until our
                    # delete, which therefore applied, and the next waiter took the lock.
                    self._end(clean=True)
                    return True
                if current is None and self._release_tried:
                    # Gone after an attempt of ours whose answer was lost: that was us (a
                    # revocation meanwhile would have needed our value, which only we renew).
                    self._end(clean=True)
                    return True
                if not self._adopt_pending(current):
                    break
            self._fire_lost("lease revoked before release")
            self._end(clean=False)
            return False

    def note_release_attempt(self) -> None:
        """A release call raised (outcome unknown): a later "already gone" is our own doing."""
        self._release_tried = True

    def _end(self, *, clean: bool) -> None:
        self.ended = True
        self._released_clean = clean

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
    ) -> None:
        self.lock_id = lock_id
        self.owner = owner
        self.ticket = ticket
        self.lease = lease
        self.monotonic = monotonic = runtime.monotonic
        self.record = WaiterRecord(owner, 1, lease)
        self.renewed_at = monotonic()
        self.enqueued_at: float | None = None
        self.renew_failures = 0
        self.last_attempt_at = self.renewed_at
        self.ended = False
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
        change it saw before it revokes."""
        return self.monotonic() - self.renewed_at < self.lease

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
            try:
                store.put(Table.QUEUE, self.lock_id, self.ticket, record.encode(), timestamp=stamp)
            except StoreError as exc:
                self.renew_failures += 1
                log.warning("waiter_renewal_failed", lock_id=self.lock_id, owner=self.owner, error=str(exc))
                return
            self.record, self.renewed_at, self.renew_failures = record, started, 0

    def end(self) -> None:
        """Stop renewing (the caller deletes the cell, or it became the holder's). Never waits
        for a renewal in flight (see :meth:`renew`)."""
        with self._state:
            self.ended = True
