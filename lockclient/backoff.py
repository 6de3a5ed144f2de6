"""The baseline the thesis replaced (listings 3–4), behind the same API: ``algorithm="backoff"``.

Kept only so that benchmarks and the fairness test can show what the queue
fixes: contenders fight over a *shadow row* with no order among them, so a
thread that just released can immediately win again while the others sleep a
random back-off — long runs by one process and waits of minutes (thesis
table 2, figure 2). It uses the same leases and fencing tokens as the fair
lock so the comparison is like for like.

TryLock (listing 3) returns Success, AnotherThreadIsOwner or ConcurrentAttempt;
GetLock (listing 4) retries, sleeping up to ``backoff_owner_wait`` after
AnotherThreadIsOwner and up to ``backoff_step * attempt`` after ConcurrentAttempt.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from lockclient.errors import LockCancelled, LockTimeout
from lockclient.lease import Lease
from lockclient.lockid import make_owner
from lockclient.store import CellStore, Table

if TYPE_CHECKING:
    from lockclient.locker import RemoteLock, RemoteLocker

__all__ = ["TryLockResult", "backoff_acquire", "backoff_release"]


class TryLockResult(enum.Enum):
    SUCCESS = "Success"
    ANOTHER_THREAD_IS_OWNER = "AnotherThreadIsOwner"
    CONCURRENT_ATTEMPT = "ConcurrentAttempt"


def try_lock(locker: RemoteLocker, store: CellStore, lock_id: str, owner: str) -> TryLockResult:
    """Listing 3."""
    ts = locker._timestamps
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


def backoff_acquire(
    locker: RemoteLocker,
    store: CellStore,
    lock_id: str,
    deadline: float | None,
    cancel: threading.Event | None,
    max_hold: float | None,
    counts: Counter[str],
    *,
    blocking: bool,
) -> RemoteLock | None:
    """Listing 4 (blocking) or one listing-3 attempt (not blocking)."""
    from lockclient.locker import RemoteLock

    owner = make_owner()
    lease = Lease(store, lock_id, owner, "", locker.lease, max_hold=max_hold)
    lease.create()
    locker._renewer.add(lease)
    attempt = 1
    try:
        while True:
            result = try_lock(locker, store, lock_id, owner)
            if result is TryLockResult.SUCCESS:
                break
            if not blocking:
                locker._renewer.remove(lease)
                lease.end()
                return None
            if result is TryLockResult.ANOTHER_THREAD_IS_OWNER:
                pause = random.uniform(0, locker.backoff_owner_wait)
            else:
                pause = random.uniform(0, locker.backoff_step * attempt)
                attempt += 1
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            if cancel is not None and cancel.wait(pause):
                raise LockCancelled("get_lock was cancelled", lock_id=lock_id)
            if cancel is None:
                time.sleep(pause)
            if deadline is not None and time.monotonic() >= deadline:
                raise LockTimeout("timed out waiting for the lock", lock_id=lock_id)
        token = lease.bump_fence()
    except BaseException:
        locker._renewer.remove(lease)
        store.delete(Table.BACKOFF_MAIN, lock_id, owner, timestamp=locker._timestamps.next())
        lease.end()
        raise
    lease.mark_holding()
    return RemoteLock(locker, lease, token, counts, "backoff")


def backoff_release(locker: RemoteLocker, lease: Lease) -> None:
    locker.store.delete(Table.BACKOFF_MAIN, lease.lock_id, lease.owner, timestamp=locker._timestamps.next())
