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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from lockclient import RemoteLocker, open_store
from lockclient.errors import StoreError
from lockclient.store import CellStore, VersionedTable
from lockclient.store.base import CasResult, CompareAndSet
from lockclient.store.counting import CountingStore


class GatedStore(CountingStore):
    """Renewals (``compare_and_set_many``, and ``compare_and_set`` for one due alone): their sizes
    are recorded in ``batches`` while ``recording`` is set, and they wait for ``gate`` while
    ``closed`` is set."""

    def __init__(self, store: CellStore) -> None:
        super().__init__(store, client_metrics=False)
        self.recording = threading.Event()
        self.closed = threading.Event()
        self.gate = threading.Event()
        self.batches: list[int] = []
        self.blocked = 0
        self._cond = threading.Condition()

    def _renewing(self, size: int) -> None:
        with self._cond:
            if self.recording.is_set():
                self.batches.append(size)
            gated = self.closed.is_set()
            if gated:
                self.blocked += 1
                self._cond.notify_all()
        if gated:
            assert self.gate.wait(120), "the test never opened the gate"

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        self._renewing(len(ops))
        return super().compare_and_set_many(ops)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        # A renewal due alone goes through the single compare-and-set (after the locks are taken,
        # nothing else sends one here).
        self._renewing(1)
        return super().compare_and_set(row, expected, updates, table=table)

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
    count = 40
    with open_store(f"sqlite:///{tmp_path}/cells.db") as inner:
        store = GatedStore(inner)
        # One worker; a long lease (first renewal 40 s after the grant): the locks are all taken before it,
        # and nothing expires while the test holds renewals back, whatever the load.
        locker = RemoteLocker(store, lease=120.0, keeper_workers=1)
        try:
            monotonic = locker.runtime.monotonic
            first = locker.get_lock("gated-000", timeout=60)
            # The others come due well after the first (the keeper batches what is due within 50 ms).
            gap_from = monotonic()
            assert _wait_until(lambda: monotonic() > gap_from + 5.0)
            locks = [first] + [locker.get_lock(f"gated-{i:03d}", timeout=60) for i in range(1, count)]
            leases = [lock._lease for lock in locks]
            store.recording.set()
            store.closed.set()
            # The worker stuck in the first lease's renewal ...
            assert store.wait_blocked(1), "the worker never started renewing"
            assert store.batches == [1], store.batches
            # ... until every other lease has come due (each due lease/3 after its grant).
            latest_due = max(lease.next_due() for lease in leases)
            assert _wait_until(lambda: monotonic() > latest_due + 0.2)
            store.closed.clear()
            store.gate.set()
            # The rest comes in one batch once the worker is free.
            assert _wait_until(lambda: sum(store.batches) >= count)
            store.recording.clear()
            assert store.batches[:2] == [1, count - 1], store.batches
            assert not any(lock.lost.is_set() for lock in locks)
        finally:
            locker.close()
