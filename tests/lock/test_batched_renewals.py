"""Renewals of several leases of one process, due together, go to the store as one batch
(:meth:`lockclient.keeper.Keeper._renew_holders`, :meth:`CellStore.compare_and_set_many`) — and
a batch keeps every live lease held and reports exactly the revoked one lost (mutation testing,
issue 24: no test and no judge seed reached the batched path)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from lockclient import CellStore, RemoteLocker, open_store
from lockclient.lease import HOLDER_COLUMN


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def test_batched_renewals_keep_every_live_lease_and_lose_only_the_revoked_one(
    store: CellStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    original = store.compare_and_set_many

    def counted(ops: Sequence[Any]) -> Any:
        batches.append(len(ops))
        return original(ops)

    monkeypatch.setattr(store, "compare_and_set_many", counted)
    with RemoteLocker(store, lease=0.6) as locker:
        # Taken back to back, so their renewals fall due within the keeper's batching window.
        locks = [locker.get_lock(f"batch-{i}") for i in range(4)]
        first = {lock.lock_id: store.read_versioned(lock.lock_id)[HOLDER_COLUMN] for lock in locks}
        victim = locks[0]
        # A revocation, as leasewatch makes it: the holder record removed, conditionally.
        assert store.compare_and_set(
            victim.lock_id, {HOLDER_COLUMN: first[victim.lock_id]}, {HOLDER_COLUMN: None}
        ).applied
        assert victim.lost.wait(timeout=10), "the revoked lease was never reported lost"
        assert victim.lost_reason == "lease revoked"
        threading.Event().wait(3 * 0.6)  # three lease lengths, renewed in batches meanwhile
        assert any(size > 1 for size in batches), f"the renewals were never batched: {batches}"
        for lock in locks[1:]:
            assert not lock.lost.is_set(), (lock.lock_id, lock.lost_reason)
            now = store.read_versioned(lock.lock_id)[HOLDER_COLUMN]
            assert now is not None and now != first[lock.lock_id], "the lease was not renewed"
        for lock in locks[1:]:
            assert lock.release() is True
        assert victim.release() is False
