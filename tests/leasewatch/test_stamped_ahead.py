"""Index entries stamped ahead of global time (leasewatch.watcher, "Index entries stamped ahead"), on
a real SQLite store with the watcher's monotonic clock injected.

A contender stamps its lock's index entry with the upper end of global time's interval. After a
pause during a ``/now`` round trip that end can be seconds ahead (the simulator's seed 1676192381:
7.2 s), and until global time passes that stamp every later contender's entry, correctly stamped
below it, loses last-write-wins: the entry does not change, and leasewatch notices new contenders by
their entry changing. Here the "ahead" contender is an index write stamped by hand; the later
contender is a real ``RemoteLocker`` (its clock: global time in the same store)."""

from __future__ import annotations

from leasewatch.watcher import INDEX_FULL_EVERY, Watcher
from lockclient import CellStore, RemoteLocker
from lockclient.lease import HOLDER_COLUMN
from lockclient.lockid import index_shard
from lockclient.runtime import THREADS
from lockclient.store import Table
from tests.leasewatch.conftest import FakeMonotonic
from tests.leasewatch.test_watcher import stop_renewing

LEASE, GRACE, SCAN = 2.0, 0.5, 1.0
ORPHAN_AFTER = 20.0
"""An idle lock is looked at every orphan_after / 4 = 5 s: longer than the revocation bound's look."""
BOUND = LEASE + GRACE + max(SCAN, LEASE / 10) + SCAN
"""docs/guarantees.md: lease + grace + look period + a scan (in the watcher's clock: scans are instant here)."""


def watcher(store: CellStore, clock: FakeMonotonic) -> Watcher:
    return Watcher(store, grace=GRACE, orphan_after=ORPHAN_AFTER, replica_id="w", monotonic=clock, scan_interval=SCAN)


def list_ahead(store: CellStore, lock_id: str, ahead_s: float) -> int:
    """An enqueue's index write by a contender whose stamp ran ``ahead_s`` ahead of global time."""
    stamp = THREADS.wall_us() + int(ahead_s * 1e6)
    store.put(Table.INDEX, index_shard(lock_id), lock_id, "", timestamp=stamp)
    return stamp


def revoked_after(w: Watcher, clock: FakeMonotonic, store: CellStore, lock_id: str) -> float:
    """Run the watcher as ``leasewatch serve`` does — a scan every SCAN, the due check every 50 ms —
    until the lock's holder record is gone; how long that took on the watcher's clock."""
    start = next_scan = clock.now
    while HOLDER_COLUMN in store.read_versioned(lock_id):
        assert clock.now < start + 4 * BOUND, f"the dead holder of {lock_id} was never revoked"
        if clock.now >= next_scan:
            w.scan()
            next_scan += SCAN
        w.check_due()
        clock.now += 0.05
    return clock.now - start


def test_a_contender_whose_index_write_lost_to_an_entry_stamped_ahead_is_still_seen_at_once(
    store: CellStore, clock: FakeMonotonic
) -> None:
    with RemoteLocker(store, lease=LEASE) as locker:
        locker.get_lock("warm").release()  # global time published in the store (the embedded clock)
        ahead = list_ahead(store, "L", 30.0)
        w = watcher(store, clock)
        for _ in range(3):  # the ahead contender's entry seen: looked at, idle (it came and went)
            w.scan()
            clock.now += SCAN
        lock = locker.get_lock("L")
        # The mechanism: its index write is stamped below the entry, and last-write-wins keeps that.
        entry = store.get(Table.INDEX, index_shard("L"), "L")
        assert entry is not None and entry.timestamp == ahead, "the new contender's index write changed the entry"
        stop_renewing(locker, lock)  # ...and it dies holding
        took = revoked_after(w, clock, store, "L")
        assert took <= BOUND, f"revoked {took:.2f} s after its grant (bound {BOUND} s)"


def test_an_idle_entry_stamped_ahead_is_not_deleted_while_it_could_shadow_a_re_listing(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """Idle entries are deleted with their own stamp: stamped ahead, that tombstone would shadow a
    later contender's entry stamped below it, and the lock would drop out of the index for good."""
    with RemoteLocker(store, lease=LEASE) as locker:
        locker.get_lock("warm").release()
        list_ahead(store, "idle-ahead", 3600.0)
        w = watcher(store, clock)
        for _ in range(int(2 * ORPHAN_AFTER / SCAN)):  # idle for twice the window
            w.scan()
            clock.now += SCAN
        assert store.get(Table.INDEX, index_shard("idle-ahead"), "idle-ahead") is not None
        lock = locker.get_lock("idle-ahead")  # listed again (hidden by the entry: it stays listed)
        stop_renewing(locker, lock)
        took = revoked_after(w, clock, store, "idle-ahead")
        assert took <= BOUND, f"revoked {took:.2f} s after its grant (bound {BOUND} s)"


def test_an_entry_stamped_far_ahead_does_not_hide_new_locks_from_the_incremental_index_read(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """Between full index reads only entries stamped within a window below the newest seen are read:
    one stamped far ahead must not move that window past every correctly stamped new entry."""
    with RemoteLocker(store, lease=LEASE) as locker:
        locker.get_lock("warm").release()
        list_ahead(store, "far-ahead", 3600.0)
        w = watcher(store, clock)
        w.scan()  # a full read
        clock.now += SCAN
        lock = locker.get_lock("new-lock")
        stop_renewing(locker, lock)
        report = w.scan()  # an incremental read (the next full one is INDEX_FULL_EVERY scans away)
        assert w._scan_no % INDEX_FULL_EVERY != 0
        assert report.locks == 3, "the new lock's entry was not read"
        took = revoked_after(w, clock, store, "new-lock")
        assert took <= BOUND, f"revoked {took:.2f} s after its grant (bound {BOUND} s)"
