"""A timed-out attempt's queue cell, when the store was away at its withdrawal, must not block the
same process's next attempt on the same lock id (BENCHMARKS.md, "100,000 ids": one id per holder
process timed out five times on the ring, the retries queued behind the first attempt's cell while
its deferred withdrawal waited in a busy keeper, with a waiter lease of 6,000 s)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from lockclient import LockTimeout, RemoteLocker, open_store
from lockclient.errors import StoreUnavailable
from lockclient.store import CellStore, Table
from tests.support.faulty import FaultyStore


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def test_a_retry_deletes_its_own_withdrawn_cell_instead_of_waiting_behind_it(store: CellStore) -> None:
    """The first attempt times out behind a holder; its withdrawal fails (the store is away), and
    the deferred task that retries it keeps failing (a keeper busy elsewhere: every delete from
    another thread is refused). No leasewatch runs and the waiter lease is long, so nothing else
    would remove the cell. After the holder releases, the same process's next attempt — whose
    ticket sorts after the stale cell — must be granted: it deletes its own cell itself."""
    acquiring = threading.current_thread()
    faulty = FaultyStore(store)
    queue_cell = {"row": "acct:42"}

    def in_queue(table: Table, row: str, column: str, **_: object) -> bool:
        return table is Table.QUEUE and row == queue_cell["row"]

    faulty.arm(
        "delete",
        raise_before=StoreUnavailable("the store is away (injected)"),
        when=lambda *a, **k: in_queue(*a, **k) and threading.current_thread() is acquiring,
    )
    faulty.arm(
        "delete",
        raise_before=StoreUnavailable("the keeper's retry never gets through (injected)"),
        when=lambda *a, **k: in_queue(*a, **k) and threading.current_thread() is not acquiring,
        times=10**6,
    )
    with RemoteLocker(store, lease=60) as holding, RemoteLocker(faulty, lease=60) as retrying:
        holder = holding.get_lock("acct:42")
        with pytest.raises(LockTimeout):
            retrying.get_lock("acct:42", timeout=0.5)
        stale = [q.owner for q in retrying.status("acct:42").queue]
        assert len(stale) == 2, "the first attempt's cell should still be queued behind the holder"
        holder.release()
        lock = retrying.get_lock("acct:42", timeout=30)
        try:
            assert lock.fencing_token == holder.fencing_token + 1
            owners = [q.owner for q in retrying.status("acct:42").queue]
            assert owners == [lock.owner], "the withdrawn cell is still in the queue"
        finally:
            lock.release()
