"""What one leasewatch replica has *seen happen*, beyond what the store holds right now.

The store says who holds a lock and who waits; it does not say when a holder was granted,
how long the waiters ahead of it waited, or what went wrong a minute ago. A watcher reads
every lock it watches on each scan, so it can tell — as observations, with the scan's
resolution:

* **grants**: a holder (owner, fencing token) not seen at the previous look is a grant.
  Its *observed wait* is the wall time of that first sighting minus its ticket (tickets are
  global time, which follows the replicas' synchronized wall clocks within ``max_skew``), so
  it errs long by up to one scan interval plus clock skew, never short by more than the skew.
  A holder that came and went between two looks is not seen at all.
* **waits now**: every queued waiter's age (wall now minus its ticket), the longest one and
  the longest in units of that waiter's own lease — what the "waited beyond N × lease" alert
  needs, without a per-lock metric label (lock ids are unbounded).
* **hold time**: since the grant was first seen.
* **store errors**: the last ones, with times and the public kind of failure.

Everything here is bounded (recent grants and errors in rings; per-lock state only for
locks that still have live state), thread-safe (scans run in a worker thread, the HTTP
handlers in the event loop), and clocks are injectable for tests.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["Grant", "LockWaits", "Observed", "StoreErrorEvent", "ticket_seconds"]

RECENT_GRANTS = 1000
RECENT_GRANTS_PER_LOCK = 20
RECENT_ERRORS = 200


def ticket_seconds(ticket: str) -> float | None:
    """A queue ticket's global time (seconds since the epoch): its first 20 digits are µs."""
    head = ticket[:20]
    return int(head) / 1e6 if len(head) == 20 and head.isdigit() else None


@dataclass(frozen=True)
class Grant:
    lock_id: str
    owner: str
    fencing_token: int
    ticket: str
    seen_at: datetime
    """Wall time of the first sighting of this holder."""
    wait_s: float | None
    """``seen_at`` minus the ticket's global time (None: ticket unreadable)."""


@dataclass(frozen=True)
class StoreErrorEvent:
    at: datetime
    where: str
    kind: str
    detail: str
    lock_id: str | None = None


@dataclass(frozen=True)
class LockWaits:
    """The longest wait among the queued waiters of all watched locks, at the last scan."""

    seconds: float = 0.0
    leases: float = 0.0
    lock_id: str | None = None


@dataclass
class _Holding:
    owner: str
    token: int
    since_monotonic: float
    since: datetime


class Observed:
    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_grant: Callable[[Grant], None] | None = None,
        on_error: Callable[[StoreErrorEvent], None] | None = None,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._on_grant = on_grant
        self._on_error = on_error
        self._lock = threading.Lock()
        self._holding: dict[str, _Holding] = {}
        self._grants: deque[Grant] = deque(maxlen=RECENT_GRANTS)
        self._per_lock: dict[str, deque[Grant]] = {}
        self._errors: deque[StoreErrorEvent] = deque(maxlen=RECENT_ERRORS)
        self._scan_waits = LockWaits()
        self.waits = LockWaits()
        self.grants_seen = 0

    # -- fed by the watcher -------------------------------------------------------------------

    def begin_scan(self) -> None:
        self._scan_waits = LockWaits()

    def saw_lock(
        self,
        lock_id: str,
        holder: tuple[str, int, str] | None,
        waiters: Iterable[tuple[str, float]],
    ) -> None:
        """One lock as a scan read it: ``holder`` = (owner, fencing token, ticket) or None;
        ``waiters`` = (ticket, lease seconds) of each queued waiter that does not hold it."""
        wall = self._wall()
        with self._lock:
            if holder is None:
                self._holding.pop(lock_id, None)
            else:
                owner, token, ticket = holder
                known = self._holding.get(lock_id)
                if known is None or (known.owner, known.token) != (owner, token):
                    seen = datetime.fromtimestamp(wall, UTC)
                    self._holding[lock_id] = _Holding(owner, token, self._monotonic(), seen)
                    issued = ticket_seconds(ticket)
                    grant = Grant(
                        lock_id, owner, token, ticket, seen, None if issued is None else max(0.0, wall - issued)
                    )
                    self._grants.append(grant)
                    self._per_lock.setdefault(lock_id, deque(maxlen=RECENT_GRANTS_PER_LOCK)).append(grant)
                    self.grants_seen += 1
                    if self._on_grant is not None:
                        self._on_grant(grant)
            longest = self._scan_waits
            for ticket, lease in waiters:
                issued = ticket_seconds(ticket)
                if issued is None:
                    continue
                waited = max(0.0, wall - issued)
                in_leases = waited / lease if lease > 0 else 0.0
                seconds = max(longest.seconds, waited)
                if in_leases > longest.leases:
                    longest = LockWaits(seconds, in_leases, lock_id)
                else:
                    longest = LockWaits(seconds, longest.leases, longest.lock_id)
            self._scan_waits = longest

    def end_scan(self, live: Iterable[str]) -> LockWaits:
        """The scan is over: publish its longest wait, forget locks without live state."""
        keep = set(live)
        with self._lock:
            self.waits = self._scan_waits
            for lock_id in set(self._holding) - keep:
                del self._holding[lock_id]
            # Grants of locks that went idle stay in the global ring; per-lock rings follow live locks.
            for lock_id in set(self._per_lock) - keep:
                del self._per_lock[lock_id]
            return self.waits

    def store_error(self, where: str, kind: str, detail: str, lock_id: str | None = None) -> None:
        event = StoreErrorEvent(datetime.fromtimestamp(self._wall(), UTC), where, kind, detail, lock_id)
        with self._lock:
            self._errors.append(event)
        if self._on_error is not None:
            self._on_error(event)

    # -- read by the API --------------------------------------------------------------------------

    def held_for(self, lock_id: str, owner: str) -> tuple[datetime, float] | None:
        """When ``owner``'s hold of the lock was first seen, and seconds since (None: not seen)."""
        with self._lock:
            known = self._holding.get(lock_id)
            if known is None or known.owner != owner:
                return None
            return known.since, self._monotonic() - known.since_monotonic

    def recent_grants(self, lock_id: str | None = None, limit: int = 100) -> list[Grant]:
        """Newest first."""
        with self._lock:
            ring = self._grants if lock_id is None else self._per_lock.get(lock_id, ())
            return list(reversed(ring))[:limit]

    def recent_errors(self, limit: int = 100) -> list[StoreErrorEvent]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._errors))[:limit]
