"""Nothing of an acquisition lands in a lock's rows before the lock's index entry has: leasewatch
finds a lock only through its index entry, so a queue cell or holder record written while the
index write failed, by a process that then died, would never be revoked (found by the simulator,
seed 1892896576 of the mixed profile: a holder record left for good on a fresh lock id; see
``Acquisition.list_for_leasewatch``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from lockclient import LockTimeout, RemoteLocker, open_store
from lockclient.errors import StoreUnavailable
from lockclient.lease import HOLDER_COLUMN
from lockclient.listing import INDEX_KEPT_S, LISTED_FOR_S, Listings
from lockclient.lockid import index_shard, primitive_row
from lockclient.store import CellStore, Table
from tests.support.faulty import FaultyStore

LOCK = "acct:7"


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def _unlisted_state(store: CellStore, lock_id: str) -> list[str]:
    """What lives in the lock's rows while its index entry does not (what leasewatch cannot see)."""
    if store.get(Table.INDEX, index_shard(lock_id), lock_id) is not None:
        return []
    state = [f"queue cell {cell.column}" for cell in store.read_row(Table.QUEUE, lock_id)]
    if store.read_versioned(lock_id, serial=True).get(HOLDER_COLUMN):
        state.append("holder record")
    return state


def _index_refused_and_no_cleanup(store: CellStore) -> FaultyStore:
    """Every index write is refused, and every delete too: the process died before it could clean
    up (a withdrawal that never runs)."""
    faulty = FaultyStore(store)
    faulty.arm(
        "put",
        raise_before=StoreUnavailable("the index write is refused (injected)"),
        when=lambda table, *a, **k: table is Table.INDEX,
        times=10**6,
    )
    faulty.arm("delete", raise_before=StoreUnavailable("died before cleaning up (injected)"), times=10**6)
    return faulty


@pytest.mark.parametrize("blocking", [False, True], ids=["try_get_lock", "get_lock"])
def test_no_state_lands_unlisted_when_the_index_write_fails_and_the_process_dies(
    store: CellStore, blocking: bool
) -> None:
    """The index write is refused, and every delete after it too — the process died before it
    could clean up (a withdrawal that never runs). First use of the id, so the speculative grant
    would ride with the enqueue. Whatever the acquisition left must be listed for leasewatch."""
    faulty = _index_refused_and_no_cleanup(store)
    with RemoteLocker(faulty, lease=60) as locker:
        if blocking:
            with pytest.raises(LockTimeout):
                locker.get_lock(LOCK, timeout=0.3)
        else:
            with pytest.raises(StoreUnavailable):
                locker.try_get_lock(LOCK)
        assert _unlisted_state(store, LOCK) == []
    assert _unlisted_state(store, LOCK) == []


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
def test_shared_queues_list_the_row_before_queueing(store: CellStore, kind: str) -> None:
    """The same for the shared queue (semaphores, read-write locks)."""
    faulty = _index_refused_and_no_cleanup(store)
    with RemoteLocker(faulty, lease=60) as locker, pytest.raises(LockTimeout):
        if kind == "semaphore":
            locker.get_semaphore("pool", 2, timeout=0.3)
        else:
            locker.get_read_lock("pool", timeout=0.3)
    assert _unlisted_state(store, primitive_row("pool", kind)) == []


def test_a_lock_listed_lately_is_not_listed_again_first_and_the_cache_forgets() -> None:
    """lockclient.listing: a lock counts as listed for LISTED_FOR_S from the ticket time of an
    acknowledged index write; an enqueue acknowledged after that is not covered; old entries go."""
    listings = Listings(listed_for=5.0)
    assert not listings.listed("a", 100.0)
    listings.note("a", 100.0, 100.1)
    assert listings.listed("a", 104.9) and not listings.listed("a", 105.0)
    assert listings.listed("a", 104.9) and not listings.listed("a", 105.1)
    listings.note("a", 99.0, 106.0)  # an older ticket never moves the listing back
    assert listings.listed_until("a") == 105.0
    listings.note("b", 200.0, 200.0)  # "a" (since 100) is past any use: dropped
    assert len(listings) == 1 and listings.listed_until("a") is None
    assert LISTED_FOR_S <= INDEX_KEPT_S / 2


def test_an_enqueue_acknowledged_after_the_listing_could_lapse_lists_the_lock_again(store: CellStore) -> None:
    """The process stalls between listing the lock and its queue cell's acknowledgement for longer
    than the listing is sure to last (leasewatch may have dropped the idle entry meanwhile): the
    acquisition lists the lock again before it goes on — its index entry is then newer than its
    queue cell."""
    faulty = FaultyStore(store)
    faulty.arm("put", before=lambda *a, **k: time.sleep(0.3), when=lambda table, *a, **k: table is Table.QUEUE)
    with RemoteLocker(faulty, lease=60) as locker:
        locker._services.listings = Listings(listed_for=0.2)
        lock = locker.get_lock(LOCK, timeout=30)
        cell = store.get(Table.QUEUE, LOCK, lock.ticket)
        entry = store.get(Table.INDEX, index_shard(LOCK), LOCK)
        assert cell is not None and entry is not None
        assert entry.timestamp > cell.timestamp, "the lock was not listed again after the late enqueue"
        lock.release()
