"""The keeper batches renewals that came due while every worker was busy.

On a loaded Cassandra ring a renewal batch takes a round trip of seconds. The keeper used to hand
each renewal to its pool the moment it came due, so with every worker busy they queued in the
pool as batches of one or two, and renewals due at a steady rate fell further and further behind
(the scale benchmark on the ring: 10,000 leases in one process renewed up to 48 s late). Now they
wait in the keeper while no worker is free and go out together, one round trip for all of them.

Nothing here depends on timing: the store blocks renewals on an event, and the test waits for
conditions (workers busy, leases due), never for a duration."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from lockclient import RemoteLocker, open_store
from lockclient.errors import StoreError
from lockclient.keeper import BATCH_MAX
from lockclient.store import CellStore
from lockclient.store.base import CasResult, CompareAndSet
from lockclient.store.counting import CountingStore


class GatedStore(CountingStore):
    """Renewal batches (``compare_and_set_many``) wait for ``gate`` while ``closed`` is set."""

    def __init__(self, store: CellStore) -> None:
        super().__init__(store, client_metrics=False)
        self.closed = threading.Event()
        self.gate = threading.Event()
        self.batches: list[int] = []
        self.blocked = 0
        self._cond = threading.Condition()

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        with self._cond:
            self.batches.append(len(ops))
            gated = self.closed.is_set()
            if gated:
                self.blocked += 1
                self._cond.notify_all()
        if gated:
            assert self.gate.wait(120), "the test never opened the gate"
        return super().compare_and_set_many(ops)

    def wait_blocked(self, n: int, timeout: float = 120) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.blocked >= n, timeout)


def _wait_until(predicate: Callable[[], bool], timeout: float = 120) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passed (False): a bound, not a measure."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_renewals_due_while_every_worker_is_busy_go_out_in_one_batch(tmp_path: Path) -> None:
    workers = 2
    count = 40
    with open_store(f"sqlite:///{tmp_path}/cells.db") as inner:
        store = GatedStore(inner)
        # A long lease: nothing expires while the test holds renewals back, whatever the load.
        locker = RemoteLocker(store, lease=60.0, keeper_workers=workers)
        try:
            locks = [locker.get_lock(f"gated-{i:03d}", timeout=60) for i in range(count)]
            leases = [lock._lease for lock in locks]
            store.closed.set()
            # Every worker stuck in a renewal batch ...
            assert store.wait_blocked(workers), "the workers never started renewing"
            stuck = list(store.batches)
            # ... until every lease has come due (each due lease/3 after its grant).
            latest_due = max(lease.next_due() for lease in leases)
            assert _wait_until(lambda: locker.runtime.monotonic() > latest_due + 0.2)
            store.closed.clear()
            store.gate.set()
            renewed_once = sum(stuck)
            # The rest comes in one batch when a worker is free (at most BATCH_MAX at once).
            assert _wait_until(lambda: sum(store.batches) >= count)
            later = store.batches[len(stuck) :]
            assert max(later) >= min(BATCH_MAX, count - renewed_once), store.batches
            assert not any(lock.lost.is_set() for lock in locks)
        finally:
            locker.close()
