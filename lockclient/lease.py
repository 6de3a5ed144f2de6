"""Leases: versioned records renewed by compare-and-set, watched by leasewatch (DESIGN.md §5–6).

Every waiter and every holder has a lease record in the versioned table: row
= lock id, column = owner, value = ``{"v": version, "lease": seconds,
"ticket": ...}``. The record is written *before* the queue cell, so no queue
cell is ever invisible to leasewatch, and it is renewed every ``lease/3`` by
``version v -> v+1 if still v``. leasewatch revokes with ``delete if still
the version I watched go stale``; so a renewal and a revocation can never
both succeed on the same version, and a holder learns of its revocation at
its very next renewal.

**Self-expiry.** A holder cannot wait for the renewal that tells it it was
revoked — the store may be unreachable. So if no renewal has *succeeded* for
a whole lease, measured on this process's monotonic clock from the *start* of
the last successful renewal, the lease counts as lost. Measuring from the
start (not the end) of that renewal is what makes this safe: leasewatch saw
the record change no earlier than the renewal started, and waits a lease
plus a grace after *its* observation, so it never revokes before the holder
has given up (the C# heartbeat idiom: "measured from before the call").

**The fencing token** is a counter in the same row as the lease records:
``counter n -> n+1, if my lease record is still at the version I hold`` —
one conditional write over two cells of one partition. A holder revoked
before its bump therefore never gets a token, and tokens strictly increase
in acquisition order. The owner is stored beside the counter so that the
bump's own value is unique, which is what lets an unknown outcome (a
timeout) be resolved by re-reading instead of retrying blindly.

One renewer thread per :class:`~lockclient.locker.RemoteLocker` serves all of
its leases (not a thread per lock).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lockclient import metrics
from lockclient.errors import LockLost, StoreError
from lockclient.logs import get_logger
from lockclient.store import CellStore

__all__ = ["FENCE_COLUMN", "Lease", "LeaseRecord", "Renewer", "parse_fence"]

FENCE_COLUMN = "~fence"
"""The fencing counter's column in the versioned row (owners never start with '~')."""

log = get_logger("lockclient.lease")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    version: int
    lease: float
    ticket: str
    holding: bool = False

    def encode(self) -> str:
        return json.dumps(
            {"v": self.version, "lease": self.lease, "ticket": self.ticket, "holding": self.holding},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def decode(cls, raw: str) -> LeaseRecord:
        try:
            data = json.loads(raw)
            return cls(int(data["v"]), float(data["lease"]), str(data["ticket"]), bool(data.get("holding", False)))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"malformed lease record {raw[:100]!r}") from exc


def parse_fence(raw: str | None) -> tuple[int, str]:
    """``"17|owner"`` -> (17, owner); absent -> (0, "")."""
    if raw is None:
        return 0, ""
    number, _, owner = raw.partition("|")
    try:
        return int(number), owner
    except ValueError as exc:
        raise StoreError(f"malformed fencing counter {raw[:100]!r}") from exc


class Lease:
    """One lease record this process keeps alive. All store calls on it are serialized."""

    def __init__(
        self,
        store: CellStore,
        lock_id: str,
        owner: str,
        ticket: str,
        lease: float,
        *,
        max_hold: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lock_id = lock_id
        self.owner = owner
        self.ticket = ticket
        self.lease = lease
        self.max_hold = max_hold
        self._monotonic = monotonic
        self._mutex = threading.Lock()
        self._record = LeaseRecord(1, lease, ticket)
        self._value: str | None = None
        self.renewed_at = monotonic()
        """Start (monotonic) of the last successful create/renewal."""
        self.holding_since: float | None = None
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.ended = False
        self._callbacks: list[Callable[[str], None]] = []
        self.renew_failures = 0
        self.last_attempt_at = self.renewed_at
        self.renewing_stopped = False

    # -- lifecycle -------------------------------------------------------------------

    def create(self) -> None:
        started = self._monotonic()
        value = self._record.encode()
        with self._mutex:
            result = self.store.compare_and_set(self.lock_id, {self.owner: None}, {self.owner: value})
            if not result.applied:  # owners are unique per attempt: this cannot be someone else's
                raise StoreError(f"lease record for {self.owner} already exists")
            self._value = value
            self.renewed_at = started

    def renew(self) -> None:
        """One renewal: ``v -> v+1 if still v``. Called by the renewer thread."""
        if self.ended or self.lost.is_set():
            return
        hold_started = self.holding_since
        if self.max_hold is not None and hold_started is not None and self._monotonic() - hold_started > self.max_hold:
            # A hung holder: stop renewing; the lease runs out and leasewatch revokes it.
            if not self.renewing_stopped:
                log.warning("max_hold_exceeded", lock_id=self.lock_id, owner=self.owner, max_hold=self.max_hold)
            self.renewing_stopped = True
            self.check_expiry()
            return
        started = self.last_attempt_at = self._monotonic()
        with self._mutex:
            if self.ended or self._value is None:
                return
            record = LeaseRecord(self._record.version + 1, self.lease, self.ticket, self._record.holding)
            new_value = record.encode()
            try:
                result = self.store.compare_and_set(self.lock_id, {self.owner: self._value}, {self.owner: new_value})
            except StoreError as exc:
                self.renew_failures += 1
                metrics.RENEWALS.labels("error").inc()
                log.warning("lease_renewal_failed", lock_id=self.lock_id, owner=self.owner, error=str(exc))
                self._check_expiry_locked()
                return
            if result.applied:
                self._record, self._value = record, new_value
                self.renewed_at = started
                self.renew_failures = 0
                metrics.RENEWALS.labels("ok").inc()
                return
        metrics.RENEWALS.labels("revoked").inc()
        current = result.current.get(self.owner)
        self.mark_lost("lease revoked" if current is None else "lease record changed by another writer")

    def check_expiry(self) -> None:
        with self._mutex:
            self._check_expiry_locked()

    def _check_expiry_locked(self) -> None:
        if not self.ended and self._monotonic() - self.renewed_at > self.lease:
            self._fire_lost(f"no renewal succeeded within the lease ({self.lease}s)")

    def next_due(self) -> float:
        """Monotonic time of the next renewal: every lease/3; sooner after a failure."""
        if self.renewing_stopped:
            return self.renewed_at + self.lease + 0.001  # only the expiry check remains
        if self.renew_failures:
            return self.last_attempt_at + min(self.lease / 10, 1.0)
        return self.renewed_at + self.lease / 3

    def bump_fence(self) -> int:
        """Increment the fencing counter iff this lease is still at its version; return the token."""
        while True:
            with self._mutex:
                if self.lost.is_set():
                    raise LockLost(f"lease lost before the fencing token: {self.lost_reason}", lock_id=self.lock_id)
                mine = self._value
                row = self.store.read_versioned(self.lock_id)
                if row.get(self.owner) != mine:
                    reason = "lease revoked before the fencing token was issued"
                    self._fire_lost(reason)
                    raise LockLost(reason, lock_id=self.lock_id)
                current = row.get(FENCE_COLUMN)
                token = parse_fence(current)[0] + 1
                result = self.store.compare_and_set(
                    self.lock_id,
                    {FENCE_COLUMN: current, self.owner: mine},
                    {FENCE_COLUMN: f"{token}|{self.owner}"},
                )
                if result.applied:
                    return token
                if result.current.get(self.owner) != mine:
                    reason = "lease revoked before the fencing token was issued"
                    self._fire_lost(reason)
                    raise LockLost(reason, lock_id=self.lock_id)
            # Another holder's bump raced ours (it can only be an older holder finishing): re-read.

    def mark_holding(self) -> None:
        """From now on this lease belongs to a holder; the next renewal publishes that."""
        self.holding_since = self._monotonic()
        with self._mutex:
            self._record = LeaseRecord(self._record.version, self.lease, self.ticket, holding=True)

    def end(self) -> None:
        """Stop renewing and delete the record if it is still ours (release). Idempotent."""
        with self._mutex:
            if self.ended:
                return
            self.ended = True
            value = self._value
            if value is not None:
                self.store.compare_and_set(self.lock_id, {self.owner: value}, {self.owner: None})

    # -- lost signal ---------------------------------------------------------------------

    def on_lost(self, callback: Callable[[str], None]) -> None:
        fire_now = False
        with self._mutex:
            if self.lost.is_set():
                fire_now = True
            else:
                self._callbacks.append(callback)
        if fire_now:
            self._run_callback(callback, self.lost_reason or "lost")

    def mark_lost(self, reason: str) -> None:
        with self._mutex:
            self._fire_lost(reason)

    def _fire_lost(self, reason: str) -> None:
        if self.lost.is_set() or self.ended:
            return
        self.lost_reason = reason
        self.lost.set()
        metrics.LOCKS_LOST.inc()
        log.warning("lock_lost", lock_id=self.lock_id, owner=self.owner, reason=reason)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            # Callbacks run on the renewer thread without our mutex held would be nicer, but
            # they are user code: run them in their own thread so none can stall renewals.
            threading.Thread(target=self._run_callback, args=(callback, reason), daemon=True).start()

    def _run_callback(self, callback: Callable[[str], None], reason: str) -> None:
        try:
            callback(reason)
        except Exception:
            log.exception("on_lost_callback_failed", lock_id=self.lock_id)


class Renewer:
    """One thread renewing every lease of one locker, each every ``lease/3``."""

    def __init__(self, name: str = "chronolock-renewer", monotonic: Callable[[], float] = time.monotonic) -> None:
        self._leases: set[Lease] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name
        self._monotonic = monotonic

    def add(self, lease: Lease) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the locker is closed")
            self._leases.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, lease: Lease) -> None:
        with self._cond:
            self._leases.discard(lease)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = self._monotonic()
                due = [lease for lease in self._leases if lease.next_due() <= now]
                if not due:
                    wake = min((lease.next_due() for lease in self._leases), default=now + 1.0)
                    self._cond.wait(timeout=max(0.0, min(wake - now, 1.0)))
                    continue
            for lease in due:
                try:
                    lease.renew()
                    lease.check_expiry()
                except Exception:  # never let one lease kill the renewer
                    log.exception("lease_renewer_error", lock_id=lease.lock_id)
                if lease.lost.is_set() or lease.ended:
                    self.remove(lease)
