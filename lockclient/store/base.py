"""The cell-store port: exactly the part of Cassandra's data model the algorithms need.

A *table* holds *rows* (partitions); a row holds *cells* ordered by column name
(UTF-8 byte order, which is also Python's code-point order for ``str``). Every
mutation carries an explicit write timestamp in microseconds, and the store
resolves conflicts the way Cassandra does (thesis section 2):

* a write wins only over a cell with a smaller timestamp;
* a delete is a tombstone with a timestamp; it hides every cell whose
  timestamp is <= its own, including writes that arrive *later* with an older
  timestamp;
* at equal timestamps a tombstone beats a live cell, and between two live
  cells the larger value wins (so every replica converges on the same cell);
* a TTL counts from the moment the store applies the write.

Lease records and the fencing counter need something stronger than
last-write-wins: :meth:`CellStore.compare_and_set` is linearizable over one or
more cells of one row of the *versioned* table (a conditional batch on one
partition in Cassandra, one transaction in SQLite). The versioned table is
never written any other way: Cassandra forbids mixing LWT and plain writes on
one table, because plain writes bypass Paxos and can reorder with it.

A compare-and-set whose outcome is unknown (a timeout after the proposal was
sent) is never reported as failed: adapters re-read (at SERIAL consistency on
Cassandra, which finishes any in-flight Paxos round) and report what actually
happened. Callers make every value they write unique (a version and an owner),
so "my value is there" is proof that the write was applied.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

__all__ = [
    "VERSIONED_TABLE",
    "CasResult",
    "Cell",
    "CellStore",
    "Table",
]


class Table(enum.StrEnum):
    """The last-write-wins tables. Names are the CQL table names."""

    GLOBAL_TIME = "global_time"
    """One row ``GlobalTime``: the global clock, value == write timestamp."""
    QUEUE = "lock_queue"
    """Row per lock id; columns are tickets (20-digit µs + owner)."""
    OWNER = "lock_owner"
    """Row per lock id ("main row"); columns are owners."""
    WATERMARK = "lock_watermark"
    """Row per lock id, one cell: a ticket time below which the queue row holds only tombstones.
    A max-register like GlobalTime (value == timestamp), so it never moves back."""
    INDEX = "lock_index"
    """Row per shard; columns are lock ids with live state, for leasewatch's scan."""
    BACKOFF_MAIN = "backoff_main"
    """The baseline algorithm's main row (thesis listing 3), benchmarks only."""
    BACKOFF_SHADOW = "backoff_shadow"
    """The baseline algorithm's shadow row (thesis listing 3), benchmarks only."""


VERSIONED_TABLE = "lock_lease"
"""The compare-and-set table: lease records and fencing counters, one row per lock id."""


@dataclass(frozen=True, slots=True)
class Cell:
    """A live cell as read back from a last-write-wins table."""

    column: str
    value: str
    timestamp: int
    """Write timestamp in microseconds (Cassandra's ``WRITETIME``)."""


@dataclass(frozen=True, slots=True)
class CasResult:
    """Outcome of :meth:`CellStore.compare_and_set`.

    ``current`` maps each column named in the call to its value as the store
    saw it when deciding (``None`` for absent). When ``applied`` is true it
    holds the values just written.
    """

    applied: bool
    current: Mapping[str, str | None] = field(default_factory=dict)


class CellStore(ABC):
    """The port. Adapters: :mod:`lockclient.store.sqlite`, :mod:`lockclient.store.cassandra`.

    Every method raises :class:`~lockclient.errors.StoreUnavailable` when the
    store cannot be reached and :class:`~lockclient.errors.StoreError` for any
    other failure, with the driver's exception as ``__cause__``.
    """

    #: True when :meth:`compare_and_set` is available (Cassandra 1.2 has no LWT).
    supports_compare_and_set: bool = True

    @property
    @abstractmethod
    def url(self) -> str:
        """The store URL without credentials."""

    # -- last-write-wins tables -------------------------------------------------

    @abstractmethod
    def put(
        self,
        table: Table,
        row: str,
        column: str,
        value: str,
        *,
        timestamp: int,
        ttl: float | None = None,
    ) -> None:
        """Write one cell with an explicit timestamp (µs) and an optional TTL (seconds)."""

    def put_cells(self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int) -> None:
        """Write several cells of one row with one timestamp, atomically (one partition:
        a single-partition batch on Cassandra, one transaction on SQLite). Each cell still
        obeys last-write-wins on its own."""
        for column, value in cells.items():
            self.put(table, row, column, value, timestamp=timestamp)

    @abstractmethod
    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        """Write a tombstone: hides every version of the cell with timestamp <= ``timestamp``."""

    @abstractmethod
    def get(self, table: Table, row: str, column: str) -> Cell | None:
        """Read one live cell, or ``None``."""

    @abstractmethod
    def read_row(
        self,
        table: Table,
        row: str,
        *,
        start: str = "",
        limit: int | None = None,
    ) -> list[Cell]:
        """Live cells of ``row`` with ``column >= start`` in column order, at most ``limit``."""

    # -- the versioned (compare-and-set) table ----------------------------------

    @abstractmethod
    def read_versioned(self, row: str) -> dict[str, str]:
        """Every cell of one row of the versioned table, linearizably (SERIAL on Cassandra)."""

    @abstractmethod
    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
    ) -> CasResult:
        """Atomically: if every ``expected`` column has that value (``None`` = absent),
        apply ``updates`` (``None`` = delete) to the same row. All or nothing.

        Every column in ``updates`` must also appear in ``expected``: a write
        whose precondition was not stated is a blind write, which is exactly
        what this table exists to prevent.
        """

    # -- housekeeping ----------------------------------------------------------

    def collect_garbage(self) -> int:
        """Purge tombstones and expired cells older than the store's grace period.

        Returns how many cells were purged. Cassandra does this in compaction,
        so its adapter returns 0.
        """
        return 0

    @abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent."""

    def __enter__(self) -> CellStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_cas_arguments(expected: Mapping[str, str | None], updates: Mapping[str, str | None]) -> None:
    """Shared argument check for :meth:`CellStore.compare_and_set` implementations."""
    if not updates:
        raise ValueError("compare_and_set needs at least one update")
    blind = sorted(set(updates) - set(expected))
    if blind:
        raise ValueError(f"compare_and_set: updates without a stated precondition: {blind}")


def validate_limit(limit: int | None) -> None:
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")


def check_updates_visible(updates: Mapping[str, str | None], current: Mapping[str, str]) -> bool:
    """After an unknown compare-and-set outcome: are all our updates what the store now holds?"""
    return all(current.get(col) == val for col, val in updates.items())


def columns_of(expected: Mapping[str, str | None], updates: Mapping[str, str | None]) -> Sequence[str]:
    return sorted(set(expected) | set(updates))
