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

The holder's lease record, the fencing counter and fenced resources need
something stronger than last-write-wins: :meth:`CellStore.compare_and_set` is
linearizable over one or more cells of one row of a *versioned* table (a
conditional batch on one partition in Cassandra, one transaction in SQLite).
The versioned tables are never written any other way: Cassandra forbids mixing
LWT and plain writes on one table, because plain writes bypass Paxos and can
reorder with it.

A compare-and-set whose outcome is unknown (a timeout after the proposal was
sent) is never reported as failed: adapters re-read (at SERIAL consistency on
Cassandra, which finishes any in-flight Paxos round) and report what actually
happened. That is exact because of one rule every caller keeps (DESIGN.md §7.7):
**every compare-and-set writes at least one value unique to that call** — an
attempt id (:func:`new_attempt_id`), fresh for every call, also for a retry of
"the same" change. So "my value is there" proves that *this* call applied, and
"it is not there" that it did not (or was overwritten since: then the row cannot
tell, and the result says ``uncertain``). A delete leaves no value behind, so a
removal writes an *end record* in the same call (:data:`ANY`); a pure delete is
never reported applied on the strength of a cell being absent.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, NamedTuple, TypeVar, overload

from lockclient.errors import StoreError
from lockclient.runtime import THREADS, Runtime

__all__ = [
    "ANY",
    "VERSIONED_TABLE",
    "CasResult",
    "Cell",
    "CellStore",
    "CheckpointResult",
    "CompareAndSet",
    "Delete",
    "Get",
    "Op",
    "Outcome",
    "Pending",
    "Put",
    "ReadRow",
    "ReadVersioned",
    "Table",
    "VersionedTable",
    "concurrently",
    "conditioned",
    "is_any",
    "new_attempt_id",
    "perform",
    "resolve_by_value",
]

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


class Table(enum.StrEnum):
    """The last-write-wins tables. Names are the CQL table names."""

    GLOBAL_TIME = "global_time"
    """One row ``GlobalTime``: the global clock, value == write timestamp."""
    QUEUE = "lock_queue"
    """Row per lock id; columns are tickets (20-digit µs + owner), values the waiter's lease
    (owner, version, length): a waiter renews its lease by rewriting its own queue cell."""
    INDEX = "lock_index"
    """Row per shard; columns are lock ids with live state, for leasewatch's scan."""
    BACKOFF_MAIN = "backoff_main"
    """The baseline algorithm's main row (thesis listing 3), benchmarks only."""
    BACKOFF_SHADOW = "backoff_shadow"
    """The baseline algorithm's shadow row (thesis listing 3), benchmarks only."""


class VersionedTable(enum.StrEnum):
    """The compare-and-set tables, written only through :meth:`CellStore.compare_and_set`."""

    LEASE = "lock_lease"
    """Row per lock id: the holder's lease record, the fencing counter and the queue's
    watermarks (:mod:`lockclient.watermark`)."""
    FENCED = "fenced_resource"
    """Row per fenced resource (:class:`~lockclient.fencing.FencedResource`): the highest
    accepted token and the resource's keys. A table of its own, so no lock id can ever
    share a row with a resource."""
    PARTITION = "leasewatch_partition"
    """leasewatch replicas sharing the lock-id space (:mod:`leasewatch.partitions`): row
    ``members`` (one cell per running replica, its heartbeat) and one row per partition
    (``~owner``: the replica watching it, renewed like a holder's lease)."""


VERSIONED_TABLE = VersionedTable.LEASE.value
"""The lease table's name (kept for the schema module and old callers)."""


class _AnyValue(str):
    """The type of :data:`ANY`: a ``str``, so that ``expected`` keeps its type everywhere, and a
    store that does not know it compares it as the literal text — which no cell holds, so such a
    store refuses the call instead of writing blindly."""

    __slots__ = ()


ANY: Final[str] = _AnyValue("\x00chronolock:any-value")
"""In ``expected``: this column is written *whatever it holds now* — unconditioned, inside the
compare-and-set whose other conditions decide it (on Cassandra: a statement without ``IF`` in the
conditional batch, applied by the same Paxos round; BatchStatement allows it). For end records
only (a release or revocation writes ``~ended`` while deleting the holder record, conditional on
that exact record): nobody decides anything by comparing with such a cell, and its previous value
(the last holder's end) cannot be known by the next holder. At least one column of the call must
have a real condition. When the call is not applied, ``CasResult.current`` does not report
unconditioned columns (Cassandra returns only the conditioned ones)."""


def is_any(value: object) -> bool:
    """Whether an ``expected`` value is :data:`ANY`."""
    return isinstance(value, _AnyValue)


def conditioned(expected: Mapping[str, str | None]) -> dict[str, str | None]:
    """``expected`` without its :data:`ANY` columns: the conditions a call really states."""
    return {col: want for col, want in expected.items() if not isinstance(want, _AnyValue)}  # is_any, inlined


def new_attempt_id(runtime: Runtime = THREADS) -> str:
    """A fresh attempt id (64 random bits, hex): put one in every value a compare-and-set writes,
    new for every call — also when a call repeats a change whose first attempt's outcome was
    unknown, so that the row tells which attempt landed (issue 23, finding 1). Random from the
    caller's runtime (seeded in the simulator)."""
    return runtime.token_hex(8)


class Cell(NamedTuple):
    """A live cell as read back from a last-write-wins table.

    A named tuple rather than a frozen dataclass: leasewatch's scan builds hundreds of thousands
    of them per pass, and a tuple is built in a third of the time (measured: 30 vs 61 ms per
    100,000)."""

    column: str
    value: str
    timestamp: int
    """Write timestamp in microseconds (Cassandra's ``WRITETIME``)."""


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What :meth:`CellStore.checkpoint` did (SQLite: ``PRAGMA wal_checkpoint(TRUNCATE)``)."""

    busy: bool
    """The checkpoint could not finish: another connection was writing or still reading old pages."""
    wal_frames: int
    """Frames in the write-ahead log when it ran."""
    checkpointed_frames: int
    """Frames copied into the database file."""
    wal_bytes_before: int
    wal_bytes_after: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CasResult:
    """Outcome of :meth:`CellStore.compare_and_set`.

    ``current`` maps each column named in the call to its value as the store
    saw it when deciding (``None`` for absent) — except :data:`ANY` columns of a call
    that did not apply, which are left out. When ``applied`` is true it holds the
    values just written.

    ``uncertain`` (only with ``applied`` false): the write's outcome was unknown (a
    timeout, Cassandra's "CAS operation result is unknown") and the linearizable re-read
    found neither our values nor the expected ones. Then either it never applied, or it
    applied and another writer changed the row after it — the row cannot tell which.
    (Found on a 3-node ring: an unknown proposal was completed by a later Paxos round,
    two more increments followed, and "changed by another writer" had been reported as
    "not applied".) Callers that know nobody else can move past their value that soon —
    a grant, a renewal: only their owner or a revocation after ``lease + grace`` changes a
    holder record — may read it as "not applied"; others must treat it as unknown.
    """

    applied: bool
    current: Mapping[str, str | None] = field(default_factory=dict)
    uncertain: bool = False


class CellStore(ABC):
    """The port. Adapters: :mod:`lockclient.store.sqlite`, :mod:`lockclient.store.cassandra`.

    Every method raises :class:`~lockclient.errors.StoreUnavailable` when the
    store cannot be reached and :class:`~lockclient.errors.StoreError` for any
    other failure, with the driver's exception as ``__cause__``.
    """

    #: True when :meth:`compare_and_set` is available (Cassandra 1.2 has no LWT).
    supports_compare_and_set: bool = True
    #: True when processes on several machines may share this store (their wall clocks differ).
    spans_machines: bool = False
    #: True when :meth:`compare_and_set_many` really batches (one transaction, or requests that
    #: overlap and answer independently); the default runs them one after the other, so a
    #: caller should not batch independent work through it (one slow call would delay the rest).
    batches_compare_and_set: bool = False

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

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        """Write several cells of one row with one timestamp (and TTL), atomically (one
        partition: a single-partition batch on Cassandra, one statement on SQLite). Each cell
        still obeys last-write-wins on its own."""
        for column, value in cells.items():
            self.put(table, row, column, value, timestamp=timestamp, ttl=ttl)

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
        end: str | None = None,
        reverse: bool = False,
    ) -> list[Cell]:
        """Live cells of ``row`` with ``start <= column`` (and ``column <= end`` if given) in
        column order — descending with ``reverse`` (from ``end`` down) — at most ``limit``."""

    # -- many rows at once ------------------------------------------------------------

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        """Live cells of many rows at once, each row from its own ``starts[row]`` (default: the
        row's beginning), in column order — with ``newer_than``, only cells whose write
        timestamp is greater. Rows without such cells are left out of the answer.

        For scans over many rows (leasewatch): one query per chunk of rows on SQLite (or one pass
        over the table when most of it is asked for; ``newer_than`` filters inside SQLite, so
        unchanged cells cost no Python objects), overlapped requests on Cassandra (which cannot
        select by write time: it filters the answers). Each row is read as :meth:`read_row`
        would read it; the rows are not one snapshot."""
        bounds = starts or {}
        out: dict[str, list[Cell]] = {}
        for row in dict.fromkeys(rows):
            cells = [
                cell
                for cell in self.read_row(table, row, start=bounds.get(row, ""))
                if newer_than is None or cell.timestamp > newer_than
            ]
            if cells:
                out[row] = cells
        return out

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        """:meth:`read_versioned` of many rows at once; rows without cells are left out.

        Plain (``serial=False``, the default) reads are hints, as for :meth:`read_versioned`:
        whatever is decided from them is re-checked by a compare-and-set."""
        out: dict[str, dict[str, str]] = {}
        for row in dict.fromkeys(rows):
            cells = self.read_versioned(row, table=table, serial=serial)
            if cells:
                out[row] = cells
        return out

    # -- the versioned (compare-and-set) tables -------------------------------

    @abstractmethod
    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        """Every cell of one row of a versioned table.

        ``serial=True`` is linearizable (SERIAL on Cassandra: a Paxos round, which also
        completes any accepted but uncommitted proposal). ``serial=False`` is a plain
        QUORUM read: no Paxos round, so it never contends with the writers of the
        partition, but it may miss a compare-and-set that is still being committed. Use it
        for hints that a later compare-and-set re-checks (never for a decision on its own).
        """

    @abstractmethod
    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        """Atomically: if every ``expected`` column has that value (``None`` = absent),
        apply ``updates`` (``None`` = delete) to the same row. All or nothing.

        Every column in ``updates`` must also appear in ``expected``: a write
        whose precondition was not stated is a blind write, which is exactly
        what this table exists to prevent. :data:`ANY` states "whatever it holds"
        for an end record, next to at least one real condition.

        Unknown outcomes (a timeout, Cassandra's "CAS operation result is unknown")
        are resolved by the adapter, by value (:func:`resolve_by_value`): it re-reads
        the row linearizably; if every value this call writes is there, it was
        applied; if the row still holds ``expected``, the call is retried (within the
        store's timeout); anything else means another writer changed it. Only when
        the re-read itself keeps failing does it raise
        :class:`~lockclient.errors.StoreOutcomeUnknown` (outcome still unknown; the
        caller settles it by reading back later). Callers write at least one value
        unique to the call (:func:`new_attempt_id`), which is what makes "my value is
        there" a proof; a call that writes no value at all (a pure delete) is never
        reported applied by a re-read.
        """

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        """Several independent compare-and-sets (each on its own row, each all-or-nothing on its
        own), for renewing many leases at once: one transaction on SQLite, overlapped requests
        on Cassandra. Yields ``(index, result)`` *as each completes* — a slow one never holds
        back another's answer — where result is its :class:`CasResult` or the
        :class:`~lockclient.errors.StoreError` it failed with (outcome unknown even after the
        same resolution as :meth:`compare_and_set`)."""
        for index, op in enumerate(ops):
            try:
                yield index, self.compare_and_set(op.row, op.expected, op.updates, table=op.table)
            except StoreError as exc:
                yield index, exc

    # -- concurrency ------------------------------------------------------------

    def execute_all(self, ops: Sequence[Op]) -> list[Any]:
        """Perform independent operations, overlapping them where the adapter can (Cassandra
        sends them all at once with the driver's asynchronous API: one round trip of latency,
        no extra threads). Results in order (see :func:`perform`); if any fails, the first
        error is raised after all have finished."""
        return self.begin(ops).wait()

    def begin(self, ops: Sequence[Op]) -> Pending:
        """Start independent operations and return at once where the adapter can; the caller
        may do other work (other store calls included) before :meth:`Pending.wait`. The
        embedded store simply performs them now."""
        results: list[Any] = []
        error: BaseException | None = None
        for op in ops:
            try:
                results.append(perform(self, op))
            except Exception as exc:
                error = error or exc
                results.append(None)
        return Pending(lambda: _raise_or(results, error))

    def run_concurrently(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Run independent calls on this store and return their results in order.

        Adapters whose calls are network round trips (Cassandra) overlap them, so a group
        costs one round trip of latency; the embedded store runs them one after the
        other (each is a local call of a few microseconds, less than a thread hand-off).
        If any call raises, the first error is raised after every call has finished.
        """
        results: list[T] = []
        error: BaseException | None = None
        for call in calls:
            try:
                results.append(call())
            except BaseException as exc:
                error = error or exc
                results.append(None)  # type: ignore[arg-type]
        if error is not None:
            raise error
        return results

    # -- housekeeping ----------------------------------------------------------

    def collect_garbage(self) -> int:
        """Purge tombstones and expired cells older than the store's grace period.

        Returns how many cells were purged. Cassandra does this in compaction,
        so its adapter returns 0.
        """
        return 0

    def checkpoint(self) -> CheckpointResult | None:
        """Fold the store's journal back into its files and bound its size (SQLite's
        write-ahead log). ``None`` where the store has no such journal (Cassandra)."""
        return None

    def storage_bytes(self) -> dict[str, int]:
        """Bytes on disk by file (SQLite: ``database``, ``wal``, ``shm``); empty where the store
        is remote."""
        return {}

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
    if not expected.keys() >= updates.keys():
        blind = sorted(set(updates) - set(expected))
        raise ValueError(f"compare_and_set: updates without a stated precondition: {blind}")
    if not conditioned(expected):
        raise ValueError("compare_and_set: every column is ANY: at least one real condition is needed")
    idle = sorted(col for col, want in expected.items() if isinstance(want, _AnyValue) and col not in updates)
    if idle:
        raise ValueError(f"compare_and_set: ANY is only for columns the call writes: {idle}")


def validate_limit(limit: int | None) -> None:
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")


def check_updates_visible(updates: Mapping[str, str | None], current: Mapping[str, str | None]) -> bool:
    """Does the row hold what this compare-and-set wrote — *provably this call's* write?

    True only if the call writes at least one value and every value it writes is there. Exact
    because every call writes a value unique to it (an attempt id: another call, even a retry
    of the same change, writes a different one). Deleted columns are not looked at: an absent
    cell proves nothing (anybody may have deleted it), and a cell this call deleted may have
    been written again since by a later writer (the next holder) without making our write any
    less applied."""
    written = {col: val for col, val in updates.items() if val is not None}
    return bool(written) and all(current.get(col) == val for col, val in written.items())


@dataclass(frozen=True, slots=True)
class Put:
    table: Table
    row: str
    column: str
    value: str
    timestamp: int
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    table: Table
    row: str
    column: str
    timestamp: int


@dataclass(frozen=True, slots=True)
class Get:
    table: Table
    row: str
    column: str


@dataclass(frozen=True, slots=True)
class ReadRow:
    table: Table
    row: str
    start: str = ""
    limit: int | None = None
    end: str | None = None
    reverse: bool = False


@dataclass(frozen=True, slots=True)
class ReadVersioned:
    row: str
    table: VersionedTable = VersionedTable.LEASE
    serial: bool = True


@dataclass(frozen=True, slots=True)
class CompareAndSet:
    row: str
    expected: Mapping[str, str | None]
    updates: Mapping[str, str | None]
    table: VersionedTable = VersionedTable.LEASE


Op = Put | Delete | Get | ReadRow | ReadVersioned | CompareAndSet
"""One store operation as data, for :meth:`CellStore.execute_all`."""


class Pending:
    """Operations started by :meth:`CellStore.begin`."""

    def __init__(self, finish: Callable[[], list[Any]]) -> None:
        self._finish = finish
        self._done: list[Any] | None = None

    def wait(self) -> list[Any]:
        """Their results in order; raises the first error. Idempotent."""
        if self._done is None:
            self._done = self._finish()
        return self._done


def _raise_or(results: list[Any], error: BaseException | None) -> list[Any]:
    if error is not None:
        raise error
    return results


def perform(store: CellStore, op: Op) -> Any:
    """Run one operation with the store's ordinary methods; returns what that method returns."""
    match op:
        case Put():
            store.put(op.table, op.row, op.column, op.value, timestamp=op.timestamp, ttl=op.ttl)
            return None
        case Delete():
            store.delete(op.table, op.row, op.column, timestamp=op.timestamp)
            return None
        case Get():
            return store.get(op.table, op.row, op.column)
        case ReadRow():
            return store.read_row(op.table, op.row, start=op.start, limit=op.limit, end=op.end, reverse=op.reverse)
        case ReadVersioned():
            return store.read_versioned(op.row, table=op.table, serial=op.serial)
        case CompareAndSet():
            return store.compare_and_set(op.row, op.expected, op.updates, table=op.table)


class Outcome(enum.Enum):
    """How an ambiguous compare-and-set is resolved by re-reading the row."""

    APPLIED = "applied"
    """Every value this call writes is there (unique to the call: it applied)."""
    UNCHANGED = "unchanged"
    """The row still holds exactly what we expected: our write never applied; retry it."""
    CHANGED = "changed"
    """Someone else changed the row: our write did not apply."""


def resolve_by_value(
    expected: Mapping[str, str | None], updates: Mapping[str, str | None], current: Mapping[str, str | None]
) -> Outcome:
    """The DESIGN.md §3 rule for an unknown outcome, given the row as re-read linearizably
    (a SERIAL read first completes, or durably supersedes, any proposal still in flight, so
    after it our write is visible or will never apply).

    * every value this call writes is there → APPLIED (they are unique to the call);
    * every real condition still holds → UNCHANGED: it did not apply; the caller may send it
      again (:data:`ANY` columns are no condition);
    * anything else → CHANGED: another writer changed the row, before our write (it did not
      apply) or after it (it did) — the row cannot tell.

    A pure delete (no value written) is never APPLIED on the strength of a cell being absent:
    "gone" is what a revocation, or the owner's other attempt, leaves too. Releases and
    revocations write an end record instead (``~ended``, :mod:`lockclient.lease`)."""
    if check_updates_visible(updates, current):
        return Outcome.APPLIED
    if all(current.get(col) == want for col, want in conditioned(expected).items()):
        return Outcome.UNCHANGED
    return Outcome.CHANGED


def columns_of(expected: Mapping[str, str | None], updates: Mapping[str, str | None]) -> Sequence[str]:
    return sorted(set(expected) | set(updates))


@overload
def concurrently(store: CellStore, a: Callable[[], A], b: Callable[[], B], /) -> tuple[A, B]: ...
@overload
def concurrently(store: CellStore, a: Callable[[], A], b: Callable[[], B], c: Callable[[], C], /) -> tuple[A, B, C]: ...
def concurrently(store: CellStore, *calls: Callable[[], Any]) -> tuple[Any, ...]:
    """:meth:`CellStore.run_concurrently` for two or three calls, typed."""
    return tuple(store.run_concurrently(list(calls)))
