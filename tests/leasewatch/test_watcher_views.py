"""What the watcher's paths that no other test reached do (mutation testing, issue 24): its page
counts the waiters' leases, not only the holder's; a revoked baseline holder loses its main cell
with its record. Only the injected clock moves."""

from __future__ import annotations

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HolderRecord, WaiterRecord
from lockclient.lockid import index_shard, make_ticket
from lockclient.store import Table
from tests.leasewatch.conftest import FakeMonotonic


def test_a_page_counts_an_overdue_waiter_as_well_as_the_holder(store: CellStore, clock: FakeMonotonic) -> None:
    lock_id = "queued"
    store.put_cells(Table.INDEX, index_shard(lock_id), {lock_id: ""}, timestamp=1)
    holder = HolderRecord("holder", 1, 40.0, make_ticket(1, "holder"), 1).encode()
    assert store.compare_and_set(
        lock_id, {HOLDER_COLUMN: None, FENCE_COLUMN: None}, {HOLDER_COLUMN: holder, FENCE_COLUMN: "1|holder"}
    ).applied
    waiter = make_ticket(2, "waiter")
    store.put_cells(Table.QUEUE, lock_id, {waiter: WaiterRecord("waiter", 1, 4.0).encode()}, timestamp=2)
    w = Watcher(store, grace=100.0, orphan_after=500.0, replica_id="w", monotonic=clock)  # revokes nothing here
    w.scan()
    clock.now += 6.0
    [line] = w.page()[0]
    assert line.lock_id == lock_id and line.holder == "holder" and line.queue_length == 1
    # The waiter's 4 s lease, unchanged for 6 s, is the most overdue (the holder's 40 s one: 0.15).
    assert line.most_overdue == pytest.approx(1.5)
    assert line.oldest_lease_age == pytest.approx(6.0)


def test_revoking_a_dead_backoff_holder_clears_its_main_cell_too(store: CellStore, clock: FakeMonotonic) -> None:
    """The baseline (``algorithm="backoff"``) holder keeps a main cell besides its holder record:
    a revocation deletes both, so the next contender does not wait for the orphan sweep."""
    from lockclient import RemoteLocker

    locker = RemoteLocker(store, lease=2.0, algorithm="backoff")
    lock = locker.get_lock("baseline")
    assert [c.column for c in store.read_row(Table.BACKOFF_MAIN, "baseline")] == [lock.owner]
    locker._services.keeper.remove(lock._lease)  # the holder "dies": nobody renews it
    w = Watcher(store, grace=1.0, orphan_after=500.0, replica_id="w", monotonic=clock)
    assert w.scan().revoked == 0
    clock.now += 3.1
    report = w.scan()
    assert report.revoked == 1 and report.orphans_cleared == 0
    assert HOLDER_COLUMN not in store.read_versioned("baseline")
    assert store.read_row(Table.BACKOFF_MAIN, "baseline") == []
    with RemoteLocker(store, lease=2.0, algorithm="backoff") as other:
        got = other.try_get_lock("baseline")
        assert got is not None and got.fencing_token == lock.fencing_token + 1
        got.release()
    assert lock.release() is False
    locker.close()
