"""What an operator does to locks: list them, and revoke one holder (``lockctl list``,
``lockctl revoke``; leasewatch's ``POST /revoke/{id}`` revokes through :func:`end_holder` too).

Both work on the store alone — the embedded SQLite file with no leasewatch running, or
Cassandra — because that is what every lock's state is: anyone who may lock in a store may
list its locks and end a holder there, as leasewatch does.

**Listing** reads the lock index (every lock id a contender wrote, shard by shard), then the
lease rows and queue rows of the ids found, in bulk: a fixed number of reads per page of ids,
whatever the number of locks. Ids whose locks are idle (no holder, nobody queued) are left out
unless asked for; leasewatch drops idle ids from the index after a while.

**Revoking one holder** is a compare-and-set on exactly the holder record read — the value,
not only the owner — that deletes it and writes its end record ``~ended`` ("revoked"), as
leasewatch's revocation of a stale lease does (:func:`lockclient.lease.removal`). A holder that
renews in between changes the value: the revocation reads again and retries (the token does not
change with a renewal). The holder learns of it at its next renewal (``lost`` fires; ``lockctl
run`` terminates its command and exits 70). Then its queue cell is deleted with a timestamp far
above its own, so that no renewal of the holder's that was already under way can bring it back,
and waiters take their turn. A compare-and-set whose outcome is unknown is settled by reading
the end record back: ours there means it applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lockclient.errors import StoreError, StoreOutcomeUnknown
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HolderRecord,
    WaiterRecord,
    ended_column_for,
    holder_columns,
    parse_fence,
    removal,
)
from lockclient.lockid import INDEX_SHARDS, make_ticket, split_row
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, Table
from lockclient.store.base import ReadRow
from lockclient.watermark import HEAD, parse_marks

__all__ = [
    "REVOKED_CELL_SHADOW_US",
    "HolderSummary",
    "LockSummary",
    "Revoked",
    "end_holder",
    "list_locks",
    "revoke_token",
]

REVOKED_CELL_SHADOW_US = 3_600_000_000
"""A revoked holder's or waiter's queue cell is deleted this far above its write timestamp: no
renewal the owner sends before it notices can resurrect it (ticket columns are unique per
attempt, so nothing else is ever shadowed)."""


@dataclass(frozen=True, slots=True)
class HolderSummary:
    """One holder of a listed lock (a semaphore or a read-write lock may have several)."""

    owner: str
    token: int
    label: str = ""
    payload: str = ""
    granted_us: int = 0
    """The grant's global time, estimated (:attr:`HolderRecord.granted`); 0: unknown."""
    column: str = HOLDER_COLUMN
    """Its holder column: ``~holder``, or a slot's ``~holder:<k>``."""
    parked: bool = False
    """Released before its ``min_hold`` was over: held by nobody alive until that passes."""


@dataclass(frozen=True, slots=True)
class LockSummary:
    """One line of :func:`list_locks`."""

    lock_id: str
    """The row id: the lock's id, or a primitive's ``name\\x1fkind``."""
    name: str
    kind: str
    """``lock``, ``semaphore`` or ``rwlock``."""
    fencing_token: int
    """The last token handed out for it."""
    holders: list[HolderSummary] = field(default_factory=list)
    waiters: int = 0
    """Queue cells that are not a holder's: contenders waiting for their turn."""
    waiter_labels: list[str] = field(default_factory=list)
    """The waiters' labels in queue order (empty strings for unlabelled ones)."""


def _queue_start(row: dict[str, str]) -> str:
    published, _ = parse_marks(row)
    return make_ticket(published, "")


def list_locks(store: CellStore, *, prefix: str = "", limit: int = 1000, idle: bool = False) -> list[LockSummary]:
    """Locks listed in the store's index, in id order: the first ``limit`` ids that start with
    ``prefix`` (a primitive's row id starts with its name), held or awaited ones only unless
    ``idle``. Reads: one slice per index shard, then the lease and queue rows of those ids."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    slices = store.execute_all([ReadRow(Table.INDEX, str(s), prefix, limit) for s in range(INDEX_SHARDS)])
    ids = sorted({c.column for cells in slices for c in cells if c.column.startswith(prefix)})[:limit]
    rows = store.read_versioned_many(ids)
    starts = {lock_id: _queue_start(row) for lock_id, row in rows.items() if HEAD in row}
    queues = store.read_rows_many(Table.QUEUE, ids, starts)
    out: list[LockSummary] = []
    for lock_id in ids:
        row = rows.get(lock_id, {})
        holders: list[HolderSummary] = []
        for column in holder_columns(row):
            try:
                record = HolderRecord.decode(row[column])
            except StoreError:
                holders.append(HolderSummary("?", 0, column=column))  # malformed: leasewatch clears it
                continue
            holders.append(
                HolderSummary(
                    record.owner,
                    record.token,
                    record.label,
                    record.payload,
                    record.granted,
                    column,
                    bool(record.until),
                )
            )
        tickets = {row_ticket for row_ticket in _tickets(row)}
        waiting = [cell for cell in queues.get(lock_id, ()) if cell.column not in tickets]
        labels: list[str] = []
        for cell in waiting:
            try:
                labels.append(WaiterRecord.decode(cell.value).label)
            except StoreError:
                labels.append("")
        if not holders and not waiting and not idle:
            continue
        try:
            token = parse_fence(row.get(FENCE_COLUMN))[0]
        except StoreError:
            token = 0
        name, kind = split_row(lock_id)
        out.append(LockSummary(lock_id, name, kind, token, holders, len(waiting), labels))
    return out


def _tickets(row: dict[str, str]) -> set[str]:
    """The queue cells the holders of a lease row keep until they release."""
    tickets: set[str] = set()
    for column in holder_columns(row):
        try:
            tickets.add(HolderRecord.decode(row[column]).ticket)
        except StoreError:
            continue
    return tickets


def end_holder(
    store: CellStore,
    lock_id: str,
    raw: str,
    *,
    column: str = HOLDER_COLUMN,
    runtime: Runtime = THREADS,
) -> HolderRecord | None:
    """Revoke the holder record ``raw`` of ``column`` in ``lock_id``'s row: compare-and-set delete
    of exactly that value with its end record ("revoked"), then its queue cell (shadowed for good)
    and its baseline main cell. Returns the record revoked; None if the row no longer held
    ``raw`` (it renewed, released, or was revoked by someone else). Raises StoreError when the
    store failed and the outcome could not be settled; a malformed ``raw`` is the caller's case
    (it has no owner to name in an end record)."""
    record = HolderRecord.decode(raw)
    op = removal(lock_id, raw, record, "revoked", runtime=runtime, column=column)
    ended = ended_column_for(column)
    try:
        applied = store.compare_and_set(op.row, op.expected, op.updates).applied
    except StoreOutcomeUnknown:
        # Settled by value: our end record (its attempt id is ours alone) there means it applied.
        applied = store.read_versioned(lock_id).get(ended) == op.updates[ended]
    if not applied:
        return None
    if record.ticket:
        cell = store.get(Table.QUEUE, lock_id, record.ticket)
        if cell is not None:
            store.delete(Table.QUEUE, lock_id, record.ticket, timestamp=cell.timestamp + REVOKED_CELL_SHADOW_US)
    backoff = store.get(Table.BACKOFF_MAIN, lock_id, record.owner)
    if backoff is not None:
        store.delete(Table.BACKOFF_MAIN, lock_id, record.owner, timestamp=backoff.timestamp + 1)
    return record


@dataclass(frozen=True, slots=True)
class Revoked:
    """What :func:`revoke_token` did."""

    revoked: HolderRecord | None
    """The holder record ended (None: nothing was revoked)."""
    holders: list[HolderRecord]
    """The holders found at the last read (when nothing was revoked: who holds it instead)."""


def revoke_token(store: CellStore, lock_id: str, token: int, *, runtime: Runtime = THREADS, tries: int = 5) -> Revoked:
    """Revoke the holder of ``lock_id`` (a lock id, or a primitive's row id) whose fencing token is
    ``token`` — only that holder, and only while it holds: a compare-and-set on exactly the record
    read (linearizably), retried when the holder renewed in between. Nothing is revoked when no
    current holder has that token (``Revoked.revoked`` is None; ``holders`` says who holds)."""
    holders: list[HolderRecord] = []
    for _ in range(tries):
        row = store.read_versioned(lock_id)
        holders = []
        target: tuple[str, str, HolderRecord] | None = None
        for column in holder_columns(row):
            try:
                record = HolderRecord.decode(row[column])
            except StoreError:
                continue
            holders.append(record)
            if record.token == token:
                target = (column, row[column], record)
        if target is None:
            return Revoked(None, holders)
        column, raw, _ = target
        ended = end_holder(store, lock_id, raw, column=column, runtime=runtime)
        if ended is not None:
            return Revoked(ended, holders)
    return Revoked(None, holders)
