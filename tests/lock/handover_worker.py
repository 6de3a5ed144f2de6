"""A waiter process for tests/lock/test_handover.py (spawned, so a top-level function)."""

from __future__ import annotations

from lockclient import RemoteLocker, open_store


def wait_for_lock(store_url: str, lock_id: str, lease: float) -> None:
    """Queue for ``lock_id`` and hold it once granted (the test kills this process while it waits)."""
    with RemoteLocker(open_store(store_url), lease=lease, owns_store=True) as locker:
        lock = locker.get_lock(lock_id, timeout=120)
        lock.release()
