"""What one leasewatch replica has *seen happen*, beyond what the store holds right now.

The store says who holds a lock and who waits; it does not say when a holder was granted,
how long the waiters ahead of it waited, or what went wrong a minute ago. A watcher *looks*
at each lock it watches regularly (at least once per ``LOOK_FRACTION`` of its shortest lease,
and within one scan of a new contender: :mod:`leasewatch.watcher`), so it can tell — as
observations, with the resolution of its looks:

* **grants**: a holder (owner, fencing token) not seen at the previous look is a grant.
  Its *observed wait* is the wall time of that first sighting minus its ticket (tickets are
  global time, which follows the replicas' synchronized wall clocks within ``max_skew``), so
  it errs long by up to one look period plus clock skew, never short by more than the skew.
  A holder that came and went between two looks is not seen at all. A holder found at the
  first look at a lock this replica *inherited* (at its start, or by taking over a
  partition) is recorded without a grant: it was granted while somebody else watched.
* **waits now**: per lock, its oldest queued waiter as of the last look (ticket and lease);
  :meth:`Observed.longest_wait` ages them to *now* when asked (a scrape), so a lock not
  looked at in this scan still counts, and the cost is paid per scrape, not per scan. In
  seconds and in units of that waiter's own lease — what the "waited beyond N × lease"
  alert needs, without a per-lock metric label (lock ids are unbounded).
* **hold time**: since the grant was first seen.
* **store errors**: the last ones, with times and the public kind of failure.

Everything here is bounded (recent grants and errors in rings; per-lock state only for
locks the watcher still watches — it calls :meth:`Observed.forget` when it drops one),
thread-safe (scans run in a worker thread, the HTTP handlers and scrapes in the event
loop), and clocks are injectable for tests.
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
    """The longest wait among the queued waiters of all watched locks: ``seconds`` is the
    longest in seconds, ``leases`` the longest in the waiter's own lease lengths (of lock
    ``lock_id``; not necessarily the same waiter)."""

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
        self._waiting: dict[str, tuple[float, float]] = {}
        """lock id -> (ticket seconds, lease) of its oldest waiter at the last look."""
        self.grants_seen = 0

    # -- fed by the watcher -------------------------------------------------------------------

    def saw_lock(
        self,
        lock_id: str,
        holder: tuple[str, int, str] | None,
        waiters: Iterable[tuple[str, float]],
        *,
        inherited: bool = False,
    ) -> None:
        """One look at one lock: ``holder`` = (owner, fencing token, ticket) or None;
        ``waiters`` = (ticket, lease seconds) of each queued waiter that does not hold it.
        ``inherited``: the first look at a lock this replica did not watch before (a holder
        found then is remembered, not counted as a grant)."""
        oldest: tuple[float, float] | None = None  # (ticket seconds, lease) of the oldest waiter
        for ticket, lease in waiters:
            issued = ticket_seconds(ticket)
            if issued is not None and (oldest is None or issued < oldest[0]):
                oldest = (issued, lease)
        if self._waiting.get(lock_id) == oldest:
            # The common looks change nothing: an idle lock, or the same holder and oldest waiter.
            # Decided without the lock (dict reads are atomic, and only scans write, one at a
            # time under the watcher's lock), as this runs for every lock looked at.
            known = self._holding.get(lock_id)
            if holder is None and known is None:
                return
            if holder is not None and known is not None and (known.owner, known.token) == holder[:2]:
                return
        grant: Grant | None = None
        with self._lock:
            if oldest is None:
                self._waiting.pop(lock_id, None)
            else:
                self._waiting[lock_id] = oldest
            if holder is None:
                self._holding.pop(lock_id, None)
            else:
                owner, token, ticket = holder
                known = self._holding.get(lock_id)
                if known is None or (known.owner, known.token) != (owner, token):
                    wall = self._wall()
                    seen = datetime.fromtimestamp(wall, UTC)
                    self._holding[lock_id] = _Holding(owner, token, self._monotonic(), seen)
                    if not (inherited and known is None):
                        issued = ticket_seconds(ticket)
                        grant = Grant(
                            lock_id, owner, token, ticket, seen, None if issued is None else max(0.0, wall - issued)
                        )
                        self._grants.append(grant)
                        self._per_lock.setdefault(lock_id, deque(maxlen=RECENT_GRANTS_PER_LOCK)).append(grant)
                        self.grants_seen += 1
        if grant is not None and self._on_grant is not None:
            self._on_grant(grant)

    def forget(self, lock_id: str) -> None:
        """The watcher no longer watches this lock (idle, or its partition went elsewhere).
        Its grants stay in the global ring; the per-lock state goes."""
        with self._lock:
            self._holding.pop(lock_id, None)
            self._waiting.pop(lock_id, None)
            self._per_lock.pop(lock_id, None)

    def longest_wait(self) -> LockWaits:
        """The longest wait of any queued waiter now, in seconds and in its own leases, over
        the oldest waiter of every watched lock as of its last look (a waiter granted since
        counts until the next look: at most one look period)."""
        wall = self._wall()
        seconds, best = 0.0, LockWaits()
        with self._lock:
            for lock_id, (issued, lease) in self._waiting.items():
                waited = max(0.0, wall - issued)
                seconds = max(seconds, waited)
                in_leases = waited / lease if lease > 0 else 0.0
                if in_leases > best.leases:
                    best = LockWaits(waited, in_leases, lock_id)
        return LockWaits(seconds, best.leases, best.lock_id)

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
