"""A store wrapper that counts what one acquisition or release costs.

Three numbers per operation, the ones the benchmarks report and the tests bound:

* ``ops`` — every store call, by name (``put``, ``read_row``, ``compare_and_set``, ...);
* ``round_trips`` — *sequential* round trips on the caller's path: one per call, except
  that a group run with :meth:`CountingStore.run_concurrently` counts once (its calls
  overlap on Cassandra; on the embedded store they run one after the other in
  microseconds, and the count shows what the algorithm asks of a networked store);
* ``lwt_rounds`` — Paxos rounds: compare-and-sets and serial reads of a versioned table;
* ``requests`` — requests a networked store serves: one per call or grouped operation, but
  one per *row* for the many-rows reads (:meth:`CellStore.read_rows_many`,
  :meth:`CellStore.read_versioned_many`), which Cassandra answers with one request per row
  (the embedded store with one query). This is the store's load: what leasewatch and the
  scale benchmark report per live lock id per second.

The counters belong to one operation (one acquisition attempt, one release), which
runs on one thread; background work (renewals, deferred cleanup) uses the store
directly and is not counted here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lockclient import metrics
from lockclient.errors import StoreError
from lockclient.store.base import (
    CasResult,
    Cell,
    CellStore,
    CheckpointResult,
    CompareAndSet,
    Delete,
    Get,
    Op,
    Pending,
    Put,
    ReadRow,
    ReadVersioned,
    Table,
    VersionedTable,
)

__all__ = ["CountingStore", "OpCounts"]

T = TypeVar("T")


@dataclass
class OpCounts:
    """What one operation cost the store."""

    ops: Counter[str] = field(default_factory=Counter)
    round_trips: int = 0
    lwt_rounds: int = 0
    requests: int = 0

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def add(self, other: OpCounts) -> None:
        self.ops.update(other.ops)
        self.round_trips += other.round_trips
        self.lwt_rounds += other.lwt_rounds
        self.requests += other.requests


class CountingStore(CellStore):
    """Delegates every call to ``store`` and counts it into ``counts``.

    ``on_requests(op, n)``, if given, is called (on the calling thread) with every count of
    requests: a service exports its store load with it (leasewatch's
    ``leasewatch_store_requests_total``). ``client_metrics=False``: leave the lock client's
    ``chronolock_client_store_ops`` alone (a service that is not a lock client)."""

    def __init__(
        self,
        store: CellStore,
        counts: OpCounts | None = None,
        *,
        on_requests: Callable[[str, int], None] | None = None,
        client_metrics: bool = True,
    ) -> None:
        self.inner = store
        self.counts = counts if counts is not None else OpCounts()
        self._on_requests = on_requests
        self._client_metrics = client_metrics
        self.supports_compare_and_set = store.supports_compare_and_set
        self.spans_machines = store.spans_machines
        self.batches_compare_and_set = store.batches_compare_and_set
        self._grouped = 0
        self._lock = threading.Lock()  # grouped calls may run on the adapter's threads

    def _count(self, op: str, *, lwt: bool = False, requests: int = 1) -> None:
        with self._lock:
            self.counts.ops[op] += 1
            self.counts.requests += requests
            if lwt:
                self.counts.lwt_rounds += 1
            if not self._grouped:
                self.counts.round_trips += 1
        if self._client_metrics:
            metrics.count_store_op(op)
        if self._on_requests is not None and requests:
            self._on_requests(op, requests)

    @property
    def url(self) -> str:
        return self.inner.url

    def put(self, table: Table, row: str, column: str, value: str, *, timestamp: int, ttl: float | None = None) -> None:
        self._count("put")
        self.inner.put(table, row, column, value, timestamp=timestamp, ttl=ttl)

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        self._count("put_cells")
        self.inner.put_cells(table, row, cells, timestamp=timestamp, ttl=ttl)

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        self._count("delete")
        self.inner.delete(table, row, column, timestamp=timestamp)

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        self._count("get")
        return self.inner.get(table, row, column)

    def read_row(
        self,
        table: Table,
        row: str,
        *,
        start: str = "",
        limit: int | None = None,
        end: str | None = None,
        reverse: bool = False,
    ) -> list[Cell]:
        self._count("read_row")
        return self.inner.read_row(table, row, start=start, limit=limit, end=end, reverse=reverse)

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        self._count("read_versioned" if serial else "read_versioned_hint", lwt=serial)
        return self.inner.read_versioned(row, table=table, serial=serial)

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        wanted = list(dict.fromkeys(rows))
        self._count("read_rows_many", requests=len(wanted))
        return self.inner.read_rows_many(table, wanted, starts, newer_than=newer_than)

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        wanted = list(dict.fromkeys(rows))
        self._count("read_versioned_many", lwt=serial, requests=len(wanted))
        return self.inner.read_versioned_many(wanted, table=table, serial=serial)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        self._count("compare_and_set", lwt=True)
        return self.inner.compare_and_set(row, expected, updates, table=table)

    def begin(self, ops: Sequence[Op]) -> Pending:
        """Each operation counted by name; the group costs one round trip — unless other calls
        made while it is in flight already counted one (then it overlapped with them)."""
        with self._lock:
            self._grouped += 1
        try:
            for op in ops:
                name, lwt = _op_name(op)
                self._count(name, lwt=lwt)
        finally:
            with self._lock:
                self._grouped -= 1
                trips_at_start = self.counts.round_trips
        pending = self.inner.begin(ops)

        def finish() -> list[Any]:
            try:
                return pending.wait()
            finally:
                with self._lock:
                    if self.counts.round_trips == trips_at_start and not self._grouped:
                        self.counts.round_trips += 1

        return Pending(finish)

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        for _ in ops:
            self._count("compare_and_set", lwt=True)
        return self.inner.compare_and_set_many(ops)

    def execute_all(self, ops: Sequence[Op]) -> list[Any]:
        if not ops:
            return []
        return self.begin(ops).wait()

    def run_concurrently(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """One round trip for the whole group (the calls are this wrapper's own methods,
        so each is still counted as an operation)."""
        with self._lock:
            if not self._grouped:
                self.counts.round_trips += 1
            self._grouped += 1
        try:
            return self.inner.run_concurrently(calls)
        finally:
            with self._lock:
                self._grouped -= 1

    def collect_garbage(self) -> int:
        return self.inner.collect_garbage()

    def checkpoint(self) -> CheckpointResult | None:
        return self.inner.checkpoint()

    def storage_bytes(self) -> dict[str, int]:
        return self.inner.storage_bytes()

    def close(self) -> None:
        """The wrapped store belongs to the caller."""

    def __getattr__(self, name: str) -> Any:  # adapter extras (e.g. SQLite's path)
        return getattr(self.inner, name)


def _op_name(op: Op) -> tuple[str, bool]:
    """The counter name of an operation, and whether it is a Paxos round."""
    match op:
        case Put():
            return "put", False
        case Delete():
            return "delete", False
        case Get():
            return "get", False
        case ReadRow():
            return "read_row", False
        case ReadVersioned():
            return ("read_versioned", True) if op.serial else ("read_versioned_hint", False)
        case CompareAndSet():
            return "compare_and_set", True
