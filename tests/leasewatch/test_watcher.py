"""The watcher core on a real SQLite store with its monotonic clock injected (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, RemoteLocker, open_store
from lockclient.locker import index_shard
from lockclient.lockid import make_ticket
from lockclient.store import Table


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def clock() -> FakeMonotonic:
    return FakeMonotonic()


def watcher(store: CellStore, clock: FakeMonotonic, name: str = "w") -> Watcher:
    return Watcher(store, grace=1.0, orphan_after=5.0, replica_id=name, monotonic=clock)


def test_revokes_only_after_lease_plus_grace_of_observed_silence(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    locker._renewer.remove(lock._lease)  # the holder "dies": no more renewals
    w = watcher(store, clock)
    assert w.scan().revoked == 0  # first sighting starts the clock
    clock.now += 4.9
    assert w.scan().revoked == 0  # 4.9 s < lease 4 + grace 1
    clock.now += 0.2
    report = w.scan()
    assert report.revoked == 1 and w.revocations == 1
    assert store.read_versioned("L").get(lock.owner) is None
    assert store.read_row(Table.OWNER, "L") == [] and store.get(Table.QUEUE, "L", lock.ticket) is None
    event = w.events[-1]
    assert event.holder and event.owner == lock.owner and event.by == "w"
    # The next contender gets the lock and a larger fencing token.
    with RemoteLocker(store, lease=4.0) as other, other.get_lock("L", timeout=5) as again:
        assert again.fencing_token == lock.fencing_token + 1
    lock._lease.renew()  # the dead holder wakes up: its renewal finds the record revoked
    assert lock.lost.is_set() and lock.lost_reason == "lease revoked"
    assert lock.release() is False
    locker.close()


def test_renewing_holders_are_never_revoked_even_by_a_watcher_that_was_paused(
    store: CellStore, clock: FakeMonotonic
) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    w = watcher(store, clock)
    w.scan()
    # The watcher is paused for 3 leases; the holder keeps renewing meanwhile.
    for _ in range(3):
        lock._lease.renew()
    clock.now += 12.0
    assert w.scan().revoked == 0  # the value changed: the clock restarts
    # Worse: the watcher observed, then paused before acting; the holder renewed in between.
    stale_value = store.read_versioned("L")[lock.owner]
    lock._lease.renew()
    assert not w._revoke("L", lock.owner, stale_value, lock._lease._record, "test", None)
    assert not lock.lost.is_set()
    lock.release()
    locker.close()


def test_fresh_watcher_revokes_nothing_until_it_watched_a_full_lease(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    locker._renewer.remove(lock._lease)
    first = watcher(store, clock, "first")
    first.scan()
    clock.now += 3.0
    restarted = watcher(store, clock, "restarted")  # a new replica, or the same one after a restart
    assert restarted.scan().revoked == 0
    clock.now += 3.0  # 6 s after `first` saw it, 3 s after `restarted` did
    assert restarted.scan().revoked == 0
    assert first.scan().revoked == 1
    assert restarted.scan().revoked == 0  # idempotent: nothing left to revoke
    clock.now += 3.0
    assert restarted.scan().revoked == 0
    locker.close()


def test_two_watchers_revoke_each_dead_lease_exactly_once(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=2.0)
    dead = [locker.get_lock(f"dead-{i}") for i in range(3)]
    for lock in dead:
        locker._renewer.remove(lock._lease)
    a, b = watcher(store, clock, "a"), watcher(store, clock, "b")
    a.scan()
    b.scan()
    clock.now += 3.5
    assert a.scan().revoked + b.scan().revoked == 3
    assert a.revocations + b.revocations == 3
    locker.close()


def test_orphan_cells_without_a_lease_are_cleared_and_the_lock_works_again(
    store: CellStore, clock: FakeMonotonic
) -> None:
    # A writer that crashed between its writes: an owner cell and a queue cell, no lease record.
    store.put(Table.INDEX, index_shard("orphaned"), "orphaned", "", timestamp=10)
    store.put(Table.OWNER, "orphaned", "ghost", "t", timestamp=100)
    ticket = make_ticket(50, "ghost")
    store.put(Table.QUEUE, "orphaned", ticket, "ghost", timestamp=50)
    with RemoteLocker(store, lease=2.0) as locker:
        assert locker.try_get_lock("orphaned") is None  # blocked by the ghost
        w = watcher(store, clock)
        assert w.scan().orphans_cleared == 0
        clock.now += 5.5
        assert w.scan().orphans_cleared == 2
        assert store.read_row(Table.OWNER, "orphaned") == [] and store.get(Table.QUEUE, "orphaned", ticket) is None
        got = locker.try_get_lock("orphaned")
        assert got is not None
        got.release()
        # The lock id, now without any state, leaves the index after the window.
        w.scan()
        clock.now += 5.5
        w.scan()
        assert store.get(Table.INDEX, index_shard("orphaned"), "orphaned") is None


def test_operator_revocation_and_lock_view(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=5.0)
    lock = locker.get_lock("ops")
    w = watcher(store, clock)
    w.scan()
    clock.now += 1.5
    view = w.view("ops")
    assert view.holders == [lock.owner] and view.fencing_token == 1 and view.head == lock.ticket
    assert view.leases[lock.owner].observed_age == pytest.approx(1.5)
    assert w.revoke_now("ops") == [lock.owner]
    lock._lease.renew()
    assert lock.lost.is_set()
    assert w.view("ops").holders == []
    locker.close()


def test_scan_cost_follows_live_locks_not_history(store: CellStore, clock: FakeMonotonic) -> None:
    with RemoteLocker(store, lease=2.0) as locker:
        for i in range(50):  # history: 50 lock ids used and released
            locker.get_lock(f"old-{i}").release()
        live = locker.get_lock("live")
        w = watcher(store, clock)
        assert w.scan().locks == 51
        live._lease.renew()  # the live holder renews while the (fake) time passes
        clock.now += 5.5
        w.scan()  # idle lock ids leave the index after the window
        report = w.scan()
        assert report.locks == 1 and report.leases == 1
        live.release()


def test_two_watchers_racing_on_the_same_stale_value_revoke_once(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=2.0)
    lock = locker.get_lock("race")
    locker._renewer.remove(lock._lease)
    raw = store.read_versioned("race")[lock.owner]
    record = lock._lease._record
    a, b = watcher(store, clock, "a"), watcher(store, clock, "b")
    # Both observed the same version go stale and act at the same moment: one CAS wins.
    assert a._revoke("race", lock.owner, raw, record, "stale", 3.0) is True
    assert b._revoke("race", lock.owner, raw, record, "stale", 3.0) is False
    assert a.revocations + b.revocations == 1
    assert store.read_row(Table.OWNER, "race") == []
    locker.close()
