"""Listing a lock for leasewatch: its index entry must be in place whenever anything of an
acquisition lands in the lock's rows.

leasewatch finds a lock only through its index entry (``Table.INDEX``). A queue cell or holder
record that lands while the lock is not listed is one leasewatch cannot see: if its process
then dies, nothing revokes it — the lock stays held, or its queue blocked, until somebody else
lists the lock again (found by the simulator, seed 1892896576 of the mixed profile: the index
write, sent beside the queue cell and a speculative grant on a fresh lock id, failed while the
other two landed; the process died, and the holder record stayed for good).

**What leasewatch promises** (:data:`INDEX_KEPT_S`, ``leasewatch.watcher``, "Idle index
entries"): it deletes an index entry only once it has watched the lock idle — no lease, no
cell — for ``max(orphan_after, INDEX_KEPT_S)`` of its own clock, counted from a look that
read that very version of the entry with global time known to have passed its stamp. So an
entry whose write a client saw acknowledged is still there at least ``INDEX_KEPT_S`` after
the client took the stamp's ticket — whether the client's version won last-write-wins (then
leasewatch read it after it was written) or lost to one stamped at or above it (that one was
at or above global time when the client took its ticket, so leasewatch only starts counting
after that).

**What the client does** (:class:`Listings`, one per locker): it counts a lock as *listed*
for :data:`LISTED_FOR_S` — half of ``INDEX_KEPT_S``: margin for both clocks' rates and for
the look that starts leasewatch's count — from the ticket time of its last acknowledged
index write. An acquisition of a lock that is not listed writes the entry first, alone, and
waits for it (one plain round trip); one of a listed lock sends the entry beside its queue
cell (a changed entry is how leasewatch notices a new contender) without waiting for it. And
whichever it did, the acquisition checks that its writes were acknowledged while the lock was
still surely listed (:meth:`Listings.listed` at the acknowledgement: the writes landed before
it); one held up longer than that — a pause of the
process, a store that answered late — lists the lock again before it goes on.

What is left: a process that stalls for more than ``LISTED_FOR_S`` between listing the lock
and its queue cell landing, and then dies before it lists the lock again, can leave a cell
that leasewatch finds only when somebody lists the lock again (their own acquisition does:
then it is revoked like any dead waiter's). Making that impossible too would take a write
that lands atomically in two partitions (a logged batch) or a scan of every row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["INDEX_KEPT_S", "LISTED_FOR_S", "Listings"]

INDEX_KEPT_S = 10.0
"""leasewatch never deletes an index entry sooner than this after a look that read that version
idle with global time past its stamp (leasewatch.watcher, "Idle index entries"): a protocol
constant shared by clients and leasewatch, not a setting — a client must be able to rely on it
whatever leasewatch's ``orphan_after``."""

LISTED_FOR_S = INDEX_KEPT_S / 2
"""How long after the ticket time of its last acknowledged index write a client counts the lock
as listed (half of :data:`INDEX_KEPT_S`: both monotonic clocks' rate errors and the look that
starts leasewatch's count fit many times in the other half)."""


class Listings:
    """The locks this process listed lately: lock id → the monotonic time of the ticket whose
    index write was acknowledged. Bounded by what is still useful: entries older than
    :data:`LISTED_FOR_S` are dropped as new ones come (a process that locks 100,000 ids keeps
    only those of the last few seconds)."""

    def __init__(self, listed_for: float = LISTED_FOR_S) -> None:
        self.listed_for = listed_for
        self._since: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def listed_until(self, lock_id: str) -> float | None:
        """Until when (this process's monotonic clock) the lock is surely listed, or None."""
        with self._lock:
            since = self._since.get(lock_id)
        return None if since is None else since + self.listed_for

    def listed(self, lock_id: str, now: float) -> bool:
        """Whether the lock is surely listed at ``now`` (monotonic) — also asked of the moment an
        enqueue was acknowledged: its writes landed before that."""
        until = self.listed_until(lock_id)
        return until is not None and now < until

    def note(self, lock_id: str, since: float, now: float) -> None:
        """An index write for ``lock_id`` whose ticket was taken at ``since`` was acknowledged."""
        with self._lock:
            if self._since.get(lock_id, float("-inf")) >= since:
                return
            self._since[lock_id] = since
            self._since.move_to_end(lock_id)
            horizon = now - self.listed_for
            while self._since:
                oldest, at = next(iter(self._since.items()))
                if at >= horizon:
                    break
                del self._since[oldest]

    def __len__(self) -> int:
        with self._lock:
            return len(self._since)
