"""A real store with hooks around chosen calls: to replay a schedule deterministically.

``FaultyStore(inner)`` delegates every call to a real store (SQLite or Cassandra). A test
arms a hook on one method — "before the watcher's next ``read_versioned``, let the holder
renew and move the fake clock 1.2 s", "make the next ``compare_and_set`` apply and then
raise a timeout", "stall the next ``put`` for 4.5 s" — and the store behaves exactly like
the real one otherwise. Only time and failures are injected; the data is real.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lockclient.store import CasResult, Cell, CellStore, Table, VersionedTable

T = TypeVar("T")

Hook = Callable[..., None]
"""Called with the call's arguments (positional and keyword)."""


@dataclass
class _Arm:
    before: Hook | None
    after: Hook | None
    raise_before: BaseException | None
    raise_after: BaseException | None
    when: Callable[..., bool]
    times: int


class FaultyStore(CellStore):
    """Delegates to ``inner``; runs armed hooks around the matching calls."""

    def __init__(self, inner: CellStore) -> None:
        self.inner = inner
        self.supports_compare_and_set = inner.supports_compare_and_set
        self.spans_machines = inner.spans_machines
        self._arms: dict[str, list[_Arm]] = {}
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def arm(
        self,
        method: str,
        *,
        before: Hook | None = None,
        after: Hook | None = None,
        raise_before: BaseException | None = None,
        raise_after: BaseException | None = None,
        when: Callable[..., bool] = lambda *a, **k: True,
        times: int = 1,
    ) -> None:
        """On the next ``times`` calls of ``method`` for which ``when(*args, **kwargs)`` holds:
        run ``before``, maybe raise ``raise_before`` (the call never reaches the store), make
        the call, run ``after``, maybe raise ``raise_after`` (the call *did* apply)."""
        with self._lock:
            self._arms.setdefault(method, []).append(_Arm(before, after, raise_before, raise_after, when, times))

    def disarm(self) -> None:
        with self._lock:
            self._arms.clear()

    def _take(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Arm | None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            for arm in self._arms.get(method, []):
                if arm.times > 0 and arm.when(*args, **kwargs):
                    arm.times -= 1
                    return arm
        return None

    def _call(self, method: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        arm = self._take(method, args, kwargs)
        if arm is not None and arm.before is not None:
            arm.before(*args, **kwargs)
        if arm is not None and arm.raise_before is not None:
            raise arm.raise_before
        result = fn(*args, **kwargs)
        if arm is not None and arm.after is not None:
            arm.after(*args, **kwargs)
        if arm is not None and arm.raise_after is not None:
            raise arm.raise_after
        return result

    @property
    def url(self) -> str:
        return self.inner.url

    def put(self, table: Table, row: str, column: str, value: str, *, timestamp: int, ttl: float | None = None) -> None:
        self._call("put", self.inner.put, table, row, column, value, timestamp=timestamp, ttl=ttl)

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        self._call("put_cells", self.inner.put_cells, table, row, cells, timestamp=timestamp, ttl=ttl)

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        self._call("delete", self.inner.delete, table, row, column, timestamp=timestamp)

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        return self._call("get", self.inner.get, table, row, column)

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
        return self._call(
            "read_row", self.inner.read_row, table, row, start=start, limit=limit, end=end, reverse=reverse
        )

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        return self._call("read_versioned", self.inner.read_versioned, row, table=table, serial=serial)

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        return self._call("read_rows_many", self.inner.read_rows_many, table, list(rows), starts, newer_than=newer_than)

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        return self._call("read_versioned_many", self.inner.read_versioned_many, list(rows), table=table, serial=serial)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        return self._call("compare_and_set", self.inner.compare_and_set, row, expected, updates, table=table)

    def run_concurrently(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        return CellStore.run_concurrently(self, calls)  # the calls are this wrapper's own methods

    def collect_garbage(self) -> int:
        return self.inner.collect_garbage()

    def close(self) -> None:
        """The wrapped store belongs to the test."""
