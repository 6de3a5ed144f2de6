"""Nothing of an acquisition lands in a lock's rows before the lock's index entry has: leasewatch
finds a lock only through its index entry, so a queue cell or holder record written while the
index write failed, by a process that then died, would never be revoked (found by the simulator,
seed 1892896576 of the mixed profile: a holder record left for good on a fresh lock id; see
``Acquisition.list_for_leasewatch``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockclient import LockTimeout, RemoteLocker, open_store
from lockclient.errors import StoreUnavailable
from lockclient.lease import HOLDER_COLUMN
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
