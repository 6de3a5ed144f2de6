"""The embedded store: one SQLite file shared by every local process.

It keeps Cassandra's cell semantics rather than SQL's: every row of ``cells``
is one *version* of one cell with its write timestamp, and a delete is not a
``DELETE`` but a tombstone row (``dead = 1``) with its own timestamp. The
upsert below is the whole of Cassandra's reconciliation rule in one
``WHERE``: the incoming version replaces the stored one only if its timestamp
is larger, or equal and it is a tombstone over a live cell, or equal, both
live, and its value is larger. Because that decision is one statement, it is
atomic across processes without any explicit transaction.

Tombstones are kept for ``gc_grace`` seconds (default one hour) so that a
write with an older timestamp arriving after a delete stays invisible — the
exact case that matters when a paused process wakes up and writes late.
:meth:`SQLiteStore.collect_garbage` purges older ones (leasewatch calls it).

Concurrency: WAL journal, one connection per thread (sqlite3 connections are
not thread-safe), ``busy_timeout`` so a writer waits for another process's
transaction instead of failing at once. Compare-and-set runs in
``BEGIN IMMEDIATE``, which takes the database's single write lock before
reading, so the check and the write are one serializable step.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TypeVar

from lockclient.errors import StoreError, StoreUnavailable
from lockclient.store.base import (
    CasResult,
    Cell,
    CellStore,
    CompareAndSet,
    Table,
    VersionedTable,
    check_cas_arguments,
    validate_limit,
)
from lockclient.store.url import StoreUrl

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cells (
    cf          TEXT    NOT NULL,
    row         TEXT    NOT NULL,
    col         TEXT    NOT NULL,
    value       TEXT,
    ts          INTEGER NOT NULL,
    dead        INTEGER NOT NULL,
    expires_at  REAL,
    applied_at  REAL    NOT NULL,
    PRIMARY KEY (cf, row, col)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cas_cells (
    tbl   TEXT NOT NULL,
    row   TEXT NOT NULL,
    col   TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tbl, row, col)
) WITHOUT ROWID;
"""

_SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of a store file this code wrote. Version 1 (chronolock 0.1.0) kept
one versioned table, ``versioned``, that lock leases and fenced resources shared."""

# Cassandra's reconciliation, as an upsert guard (see module docstring).
_UPSERT = """
INSERT INTO cells (cf, row, col, value, ts, dead, expires_at, applied_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (cf, row, col) DO UPDATE SET
    value = excluded.value, ts = excluded.ts, dead = excluded.dead,
    expires_at = excluded.expires_at, applied_at = excluded.applied_at
WHERE excluded.ts > cells.ts
   OR (excluded.ts = cells.ts AND excluded.dead > cells.dead)
   OR (excluded.ts = cells.ts AND excluded.dead = 0 AND cells.dead = 0 AND excluded.value > cells.value)
"""

_LIVE = "dead = 0 AND (expires_at IS NULL OR expires_at > ?)"


def _cas_in_transaction(conn: sqlite3.Connection, op: CompareAndSet) -> CasResult:
    tbl, row = op.table.value, op.row
    current: dict[str, str | None] = {}
    for col in op.expected:
        found = conn.execute(
            "SELECT value FROM cas_cells WHERE tbl = ? AND row = ? AND col = ?", (tbl, row, col)
        ).fetchone()
        current[col] = None if found is None else found[0]
    if any(current[col] != want for col, want in op.expected.items()):
        return CasResult(applied=False, current=current)
    for col, value in op.updates.items():
        if value is None:
            conn.execute("DELETE FROM cas_cells WHERE tbl = ? AND row = ? AND col = ?", (tbl, row, col))
        else:
            conn.execute(
                "INSERT INTO cas_cells (tbl, row, col, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tbl, row, col) DO UPDATE SET value = excluded.value",
                (tbl, row, col, value),
            )
        current[col] = value
    return CasResult(applied=True, current=current)


class SQLiteStore(CellStore):
    """:class:`CellStore` on one SQLite file. Safe to share between threads and processes."""

    batches_compare_and_set = True

    def __init__(self, path: str, *, busy_timeout: float = 5.0, gc_grace: float = 3600.0) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._gc_grace = gc_grace
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the directory for the SQLite store {path!r}: {exc}") from exc
        self._run(self._create_schema)

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # one process creates or migrates; the others wait
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise StoreError(
                    f"this SQLite store was written by a newer chronolock (schema {version} > {_SCHEMA_VERSION})"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            old = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'versioned'").fetchone()
            if old is not None:
                # Schema 1: lease rows kept their lock id as the row; fenced resources used the
                # prefix "fenced-resource:" in the same table (a lock id could collide with it).
                # The 0.1 lease layout (one record per owner) is not carried over: its holders
                # and waiters belong to the old algorithm, and leasewatch clears what they left.
                conn.execute(
                    "INSERT OR IGNORE INTO cas_cells (tbl, row, col, value) "
                    "SELECT ?, substr(row, 17), col, value "
                    "FROM versioned WHERE row LIKE 'fenced-resource:%'",
                    (VersionedTable.FENCED.value,),
                )
                conn.execute(
                    "INSERT OR IGNORE INTO cas_cells (tbl, row, col, value) "
                    "SELECT ?, row, col, value FROM versioned WHERE col = '~fence'",
                    (VersionedTable.LEASE.value,),
                )
                conn.execute("DROP TABLE versioned")
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @classmethod
    def from_url(cls, url: StoreUrl) -> SQLiteStore:
        return cls(
            url.path,
            busy_timeout=url.float_option("busy_timeout", 5.0),
            gc_grace=url.float_option("gc_grace", 3600.0),
        )

    @property
    def url(self) -> str:
        return f"sqlite:///{self._path}"

    # -- connection handling ---------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"the SQLite store {self._path!r} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: autocommit; transactions only where we BEGIN them.
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable across process crashes in WAL mode (only an OS crash
            # can lose the last transactions) — the failure model of a lock service.
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._connection())
        except sqlite3.OperationalError as exc:
            message = str(exc).lower()
            if "locked" in message or "busy" in message or "unable to open" in message or "disk i/o" in message:
                raise StoreUnavailable(f"SQLite store {self._path!r} unavailable: {exc}") from exc
            raise StoreError(f"SQLite store {self._path!r} failed: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self._path!r} failed: {exc}") from exc

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- last-write-wins tables ------------------------------------------------

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
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        now = time.time()
        expires = None if ttl is None else now + ttl
        self._run(lambda c: c.execute(_UPSERT, (str(table), row, column, value, timestamp, 0, expires, now)))

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        if not cells:
            return
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        now = time.time()
        expires = None if ttl is None else now + ttl
        # One multi-row upsert: a single statement is atomic on its own (the GlobalTime hot path).
        values = ", ".join(["(?, ?, ?, ?, ?, 0, ?, ?)"] * len(cells))
        sql = _UPSERT.replace("VALUES (?, ?, ?, ?, ?, ?, ?, ?)", f"VALUES {values}")
        params: list[object] = []
        for column, value in cells.items():
            params += [str(table), row, column, value, timestamp, expires, now]
        self._run(lambda c: c.execute(sql, params))

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        now = time.time()
        self._run(lambda c: c.execute(_UPSERT, (str(table), row, column, None, timestamp, 1, None, now)))

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        found = self._run(
            lambda c: c.execute(
                f"SELECT col, value, ts FROM cells WHERE cf = ? AND row = ? AND col = ? AND {_LIVE}",
                (str(table), row, column, time.time()),
            ).fetchone()
        )
        return None if found is None else Cell(found[0], found[1], found[2])

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
        validate_limit(limit)
        upper = "" if end is None else "AND col <= ? "
        order = "DESC" if reverse else "ASC"
        params: list[object] = [str(table), row, start]
        if end is not None:
            params.append(end)
        params += [time.time(), -1 if limit is None else limit]
        rows = self._run(
            lambda c: c.execute(
                f"SELECT col, value, ts FROM cells WHERE cf = ? AND row = ? AND col >= ? {upper}AND {_LIVE} "
                f"ORDER BY col {order} LIMIT ?",
                params,
            ).fetchall()
        )
        return [Cell(col, value, ts) for col, value, ts in rows]

    # -- versioned tables ----------------------------------------------------------

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        # One SQLite file is linearizable for every reader: serial or not is the same read.
        rows = self._run(
            lambda c: c.execute(
                "SELECT col, value FROM cas_cells WHERE tbl = ? AND row = ?", (table.value, row)
            ).fetchall()
        )
        return dict(rows)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        check_cas_arguments(expected, updates)
        op = CompareAndSet(row, expected, updates, table)

        def attempt(conn: sqlite3.Connection) -> CasResult:
            with self._transaction(conn):
                return _cas_in_transaction(conn, op)

        # In SQLite a failed COMMIT rolls back as a whole, so there is no
        # "unknown" outcome to resolve here (unlike a Cassandra CAS timeout).
        return self._run(attempt)

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        """All in one transaction: one write lock and one commit for many renewals."""
        for op in ops:
            check_cas_arguments(op.expected, op.updates)
        if not ops:
            return

        def attempt(conn: sqlite3.Connection) -> list[CasResult]:
            with self._transaction(conn):
                return [_cas_in_transaction(conn, op) for op in ops]

        try:
            results: list[CasResult | StoreError] = list(self._run(attempt))
        except StoreError as exc:
            results = [exc for _ in ops]
        yield from enumerate(results)

    # -- housekeeping --------------------------------------------------------------

    def collect_garbage(self) -> int:
        cutoff = time.time() - self._gc_grace
        cursor = self._run(
            lambda c: c.execute(
                "DELETE FROM cells WHERE (dead = 1 AND applied_at < ?) OR (expires_at IS NOT NULL AND expires_at < ?)",
                (cutoff, cutoff),
            )
        )
        return cursor.rowcount

    def close(self) -> None:
        self._closed = True
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):  # closing a broken connection
                conn.close()
