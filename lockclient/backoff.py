"""The baseline the thesis replaced (listings 3–4), behind the same API: ``algorithm="backoff"``.

Kept only so that benchmarks and the fairness test can show what the queue fixes:
contenders fight over a *shadow row* with no order among them, so a process that just
released can immediately win again while the others sleep a random back-off — long
runs by one process and waits of minutes (thesis table 2, figure 2).

TryLock (listing 3) returns Success, AnotherThreadIsOwner or ConcurrentAttempt;
GetLock (listing 4) retries, sleeping up to ``owner_wait`` after AnotherThreadIsOwner
and up to ``step * attempt`` after ConcurrentAttempt. A contender that wins the shadow
contest is granted the lock by the same compare-and-set as the fair queue
(:func:`lockclient.algorithm.take`), so it gets the same lease and fencing token, and the
two algorithms exclude each other on one lock id. Contenders hold no lease while they
contend (they do not queue); a crashed contender's shadow or main cell has no holder
record, and leasewatch clears it as an orphan.
"""

from __future__ import annotations

import contextlib
import enum
from typing import ClassVar

from lockclient.algorithm import Acquisition, Services, take
from lockclient.clock import take_ticket_time
from lockclient.errors import StoreError
from lockclient.lease import FENCE_COLUMN, HeldLease
from lockclient.lockid import index_shard, make_owner
from lockclient.store import CellStore, Table
from lockclient.store.base import Delete

__all__ = ["BACKOFF_INDEX_MARK", "Backoff", "TryLockResult"]


BACKOFF_INDEX_MARK = "backoff"
"""The value of a lock's index entry written by this algorithm (the fair queue writes ""): leasewatch
reads the baseline's two rows only for lock ids so marked, so that the baseline, which exists for
benchmarks, costs its scan nothing elsewhere. Every attempt writes it again, so a lock id the fair
queue re-listed since is marked again by the next baseline contender — the only kind of contender
a baseline cell left behind can block."""


class TryLockResult(enum.Enum):
    SUCCESS = "Success"
    ANOTHER_THREAD_IS_OWNER = "AnotherThreadIsOwner"
    CONCURRENT_ATTEMPT = "ConcurrentAttempt"


class Backoff:
    """``algorithm="backoff"``: the thesis' listings 3–4."""

    name: ClassVar[str] = "backoff"

    def __init__(self, services: Services, *, owner_wait: float = 1.0, step: float = 0.05) -> None:
        self.s = services
        self.owner_wait = owner_wait
        self.step = step

    def try_lock(self, store: CellStore, lock_id: str, owner: str) -> TryLockResult:
        """Listing 3."""
        ts = self.s.timestamps
        main = store.read_row(Table.BACKOFF_MAIN, lock_id, limit=2)
        if main:
            if len(main) == 1 and main[0].column == owner:
                return TryLockResult.SUCCESS
            return TryLockResult.ANOTHER_THREAD_IS_OWNER
        store.put(Table.BACKOFF_SHADOW, lock_id, owner, "", timestamp=ts.next())
        shadow = store.read_row(Table.BACKOFF_SHADOW, lock_id, limit=2)
        if len(shadow) == 1 and shadow[0].column == owner and not store.read_row(Table.BACKOFF_MAIN, lock_id, limit=1):
            store.put(Table.BACKOFF_MAIN, lock_id, owner, "", timestamp=ts.next())
            store.delete(Table.BACKOFF_SHADOW, lock_id, owner, timestamp=ts.next())
            return TryLockResult.SUCCESS
        store.delete(Table.BACKOFF_SHADOW, lock_id, owner, timestamp=ts.next())
        return TryLockResult.CONCURRENT_ATTEMPT

    def acquire(self, attempt: Acquisition) -> HeldLease | None:
        """Listing 4 (blocking) or one listing-3 attempt (not blocking)."""
        store, lock_id = attempt.store, attempt.lock_id
        owner = make_owner(runtime=self.s.runtime)
        # The upper end of global time's interval, as the fair queue's index writes: an index entry
        # stamped below global time could be hidden by an entry written before it (last-write-wins),
        # and leasewatch notices a new contender by its index entry changing (leasewatch.watcher,
        # "Index entries stamped ahead").
        stamp = self.s.timestamps.next(attempt.io(lambda: take_ticket_time(self.s.clock)))
        # Marked: leasewatch reads the baseline's rows only for lock ids listed with this value.
        store.put(Table.INDEX, index_shard(lock_id), lock_id, BACKOFF_INDEX_MARK, timestamp=stamp)
        tries = 1
        try:
            while True:
                result = self.try_lock(store, lock_id, owner)
                if result is TryLockResult.SUCCESS:
                    row = store.read_versioned(lock_id, serial=False)
                    taken = take(self.s, attempt, owner, "", row.get(FENCE_COLUMN))
                    if isinstance(taken, HeldLease):
                        return taken
                    # The main row said free but the lock is held (by a fair-queue holder, or a
                    # holder whose main cell was cleared): give our main cell back and wait.
                    store.delete(Table.BACKOFF_MAIN, lock_id, owner, timestamp=self.s.timestamps.next())
                    result = TryLockResult.ANOTHER_THREAD_IS_OWNER
                if not attempt.blocking:
                    return None
                if result is TryLockResult.ANOTHER_THREAD_IS_OWNER:
                    pause = self.s.runtime.uniform(0, self.owner_wait)
                else:
                    pause = self.s.runtime.uniform(0, self.step * tries)
                    tries += 1
                remaining = attempt.remaining()
                if remaining is not None:
                    pause = min(pause, remaining)
                if attempt.cancel is not None:
                    attempt.cancel.wait(pause)
                else:
                    self.s.runtime.sleep(pause)
                attempt.check()
        except BaseException:
            # No lease was granted; if the store is away, leasewatch clears the orphan main cell.
            with contextlib.suppress(StoreError):
                store.delete(Table.BACKOFF_MAIN, lock_id, owner, timestamp=self.s.timestamps.next())
            raise

    def release(self, lease: HeldLease, store: CellStore) -> bool:
        pending = store.begin([Delete(Table.BACKOFF_MAIN, lease.lock_id, lease.owner, self.s.timestamps.next())])
        clean = lease.release(store)
        pending.wait()
        return clean
