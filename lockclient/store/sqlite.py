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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TypeVar

from lockclient.errors import StoreError, StoreMisconfigured, StoreUnavailable
from lockclient.store.base import (
    CasResult,
    Cell,
    CellStore,
    CheckpointResult,
    CompareAndSet,
    Table,
    VersionedTable,
    check_cas_arguments,
    conditioned,
    is_any,
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
CREATE INDEX IF NOT EXISTS cells_live ON cells (cf, row, col) WHERE dead = 0;
CREATE INDEX IF NOT EXISTS cells_tombstones ON cells (applied_at) WHERE dead = 1;
CREATE INDEX IF NOT EXISTS cells_expiring ON cells (expires_at) WHERE expires_at IS NOT NULL;
"""
# Why the three indexes (all partial, so each holds only what its readers look for):
# * cells_live: reads of live cells (row slices, many rows at once) walk only live cells, never the
#   tombstones a busy queue row collects between garbage collections (gc_grace, an hour by default);
# * cells_tombstones, cells_expiring: garbage collection finds what it may purge without a full
#   table scan, and deletes it in small batches (see collect_garbage).

_SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of a store file this code wrote. Version 1 (chronolock 0.1.0) kept
one versioned table, ``versioned``, that lock leases and fenced resources shared. (Version 2 is
unreleased; its partial indexes and the ``leasewatch_partition`` namespace were added to it
without a bump: ``CREATE INDEX IF NOT EXISTS`` adds them to a file an earlier build wrote.)"""

_CHUNK = 500
"""Rows per ``row IN (...)`` query (well below SQLite's bound-parameter limit)."""
_SCAN_FRACTION = 0.25
"""A many-rows read that asks for at least this share of a table's rows walks the whole table
once instead of seeking each row (measured: a seek costs 2–4 times as much as a step of a walk)."""
_SIZE_TTL_S = 30.0
"""How long a table's row count, used for that choice, is reused before it is counted again."""
GC_BATCH = 1000
"""Cells purged per transaction: each batch holds the database's write lock for a few ms only."""
GC_PAUSE_S = 0.002
"""Pause between two batches, so that writers waiting for the lock get it in between."""
CHECKPOINT_BUSY_MS = 200
"""How long a checkpoint waits for readers and writers to let it finish. A TRUNCATE checkpoint
blocks new writers while it waits, so this must stay far below a lease's renewal interval."""
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
"""Bytes the write-ahead log file is cut back to whenever it restarts from its beginning."""

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
    for col, want in op.expected.items():
        if is_any(want):
            continue  # written whatever it holds (an end record): no condition, not reported
        found = conn.execute(
            "SELECT value FROM cas_cells WHERE tbl = ? AND row = ? AND col = ?", (tbl, row, col)
        ).fetchone()
        current[col] = None if found is None else found[0]
    if any(current[col] != want for col, want in conditioned(op.expected).items()):
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


def _cannot_write(error: BaseException | None) -> bool:
    """Whether SQLite failed because the file or its directory cannot be opened or written:
    SQLITE_CANTOPEN (no permission to create the file or its -wal/-shm, a path that is a
    directory), SQLITE_READONLY*, SQLITE_PERM."""
    if not isinstance(error, sqlite3.Error):
        return False
    name = getattr(error, "sqlite_errorname", "")
    return name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")) or name in ("SQLITE_PERM", "SQLITE_AUTH")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class SQLiteStore(CellStore):
    """:class:`CellStore` on one SQLite file. Safe to share between threads and processes."""

    batches_compare_and_set = True

    def __init__(self, path: str, *, busy_timeout: float = 5.0, gc_grace: float = 3600.0) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._gc_grace = gc_grace
        self._local = threading.local()
        # Each thread's connection, with the lock it holds while using it: close() takes each
        # lock before closing, so a connection is never closed under a running statement (another
        # thread's — a clock refresh, a renewal — which crashed the interpreter in sqlite3).
        self._connections: list[tuple[sqlite3.Connection, threading.RLock]] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        self._sizes: dict[tuple[str, str], tuple[float, int]] = {}
        # The directory is never created here: a misspelt path used to become a new, private
        # store that no other process locked in (the file itself is created on first use, in a
        # directory someone made on purpose: `make up`'s, a deployment's volume, a test's tmp dir).
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise StoreMisconfigured(
                f"the directory {directory!r} of the SQLite store does not exist: chronolock does not "
                "create it (a misspelt path would make a store no other process uses); create it, or "
                "correct the store URL"
            )
        try:
            self._run(self._create_schema)
        except StoreError as exc:
            self.close()
            if _cannot_write(exc.__cause__):
                # Not "unavailable" (exit 69, try again later): only a change of permissions or of
                # the path helps, so it is a configuration error (exit 78) that services back off on.
                raise StoreMisconfigured(
                    f"the SQLite store {path!r} cannot be opened for writing ({exc.__cause__}): every "
                    "process that locks must be able to write the file and its directory (SQLite "
                    "creates its -wal and -shm files there); check their owner and permissions, or the path"
                ) from exc.__cause__
            raise

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

    def _connection(self) -> tuple[sqlite3.Connection, threading.RLock]:
        if self._closed:
            raise StoreError(f"the SQLite store {self._path!r} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: autocommit; transactions only where we BEGIN them.
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                self._wal(conn)
                # NORMAL is durable across process crashes in WAL mode (only an OS crash
                # can lose the last transactions) — the failure model of a lock service.
                conn.execute("PRAGMA synchronous = NORMAL")
                # Without a limit the log file keeps the size of its largest burst forever.
                conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            except BaseException:
                conn.close()
                raise
            self._local.conn = conn
            self._local.in_use = threading.RLock()
            with self._connections_lock:
                if self._closed:
                    conn.close()
                    raise StoreError(f"the SQLite store {self._path!r} is closed")
                self._connections.append((conn, self._local.in_use))
        return conn, self._local.in_use

    def _wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode, waiting up to ``busy_timeout`` for other processes.

        Switching a file to WAL takes an exclusive lock, and SQLite may answer "database is
        locked" at once — without waiting in the busy handler — while another process is
        opening or creating the same file. Under load that failed a ``lockctl run`` started
        beside another on a fresh store (exit 69, "unavailable"), and a test worker; so the
        switch is retried for as long as any other statement would wait. A file already in WAL
        mode answers without any lock."""
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.002
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() and "busy" not in str(exc).lower():
                    raise
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            conn, in_use = self._connection()
            with in_use:
                if self._closed:
                    raise StoreError(f"the SQLite store {self._path!r} is closed")
                return fn(conn)
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
                f"SELECT col, value, ts FROM cells INDEXED BY cells_live "
                f"WHERE cf = ? AND row = ? AND col >= ? {upper}AND {_LIVE} ORDER BY col {order} LIMIT ?",
                params,
            ).fetchall()
        )
        return list(map(Cell._make, rows))

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        wanted = list(dict.fromkeys(rows))
        if not wanted:
            return {}
        bounds = starts or {}
        cf = str(table)

        def run(conn: sqlite3.Connection) -> dict[str, list[Cell]]:
            out: dict[str, list[Cell]] = {}
            now = time.time()
            walk = self._walk_is_cheaper(conn, "cells", cf, len(wanted))
            want = set(wanted) if walk else None
            # Filtered here, in SQLite: an unchanged cell costs no Python object at all.
            newer, since = ("AND ts > ? ", (newer_than,)) if newer_than is not None else ("", ())
            queries: list[tuple[str, Sequence[object]]] = []
            if walk:
                sql = f"SELECT row, col, value, ts FROM cells INDEXED BY cells_live WHERE cf = ? {newer}AND {_LIVE}"
                queries.append((sql, (cf, *since, now)))
            else:
                for i in range(0, len(wanted), _CHUNK):
                    chunk = wanted[i : i + _CHUNK]
                    sql = (
                        "SELECT row, col, value, ts FROM cells INDEXED BY cells_live "
                        f"WHERE cf = ? AND row IN ({','.join('?' * len(chunk))}) {newer}AND {_LIVE}"
                    )
                    queries.append((sql, (cf, *chunk, *since, now)))
            # Rows arrive grouped, each in column order (the index is (cf, row, col)): one lookup
            # per row, not per cell.
            last: str | None = None
            cells: list[Cell] = []
            bound = ""
            skip = False
            for sql, params in queries:
                for row, col, value, ts in conn.execute(sql, params):
                    if row != last:
                        last = row
                        skip = want is not None and row not in want
                        if not skip:
                            cells = out.setdefault(row, [])
                            bound = bounds.get(row, "")
                    if not skip and col >= bound:
                        cells.append(Cell(col, value, ts))
            return {row: found for row, found in out.items() if found}

        # Both walks visit each row's cells in index order (cf, row, col): column order.
        return self._run(run)

    def _walk_is_cheaper(self, conn: sqlite3.Connection, kind: str, name: str, asked: int) -> bool:
        """Walk the whole table instead of seeking each asked row? Only for big asks: a table's
        row count is counted (on its index, a few ms per 100,000 rows) at most every
        ``_SIZE_TTL_S`` seconds."""
        if asked < _CHUNK:
            return False
        key = (kind, name)
        now = time.monotonic()
        cached = self._sizes.get(key)
        if cached is None or now - cached[0] > _SIZE_TTL_S:
            if kind == "cells":
                sql = "SELECT count(*) FROM cells INDEXED BY cells_live WHERE cf = ? AND dead = 0"
            else:
                sql = "SELECT count(DISTINCT row) FROM cas_cells WHERE tbl = ?"
            cached = (now, conn.execute(sql, (name,)).fetchone()[0])
            self._sizes[key] = cached
        return asked >= _SCAN_FRACTION * cached[1]

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

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        wanted = list(dict.fromkeys(rows))
        if not wanted:
            return {}
        tbl = table.value

        def run(conn: sqlite3.Connection) -> dict[str, dict[str, str]]:
            out: dict[str, dict[str, str]] = {}
            walk = self._walk_is_cheaper(conn, "cas", tbl, len(wanted))
            want = set(wanted) if walk else None
            queries: list[tuple[str, Sequence[object]]] = []
            if walk:
                queries.append(("SELECT row, col, value FROM cas_cells WHERE tbl = ?", (tbl,)))
            else:
                for i in range(0, len(wanted), _CHUNK):
                    chunk = wanted[i : i + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    sql = f"SELECT row, col, value FROM cas_cells WHERE tbl = ? AND row IN ({marks})"
                    queries.append((sql, (tbl, *chunk)))
            last: str | None = None
            cells: dict[str, str] = {}
            skip = False
            for sql, params in queries:
                for row, col, value in conn.execute(sql, params):
                    if row != last:
                        last = row
                        skip = want is not None and row not in want
                        if not skip:
                            cells = out.setdefault(row, {})
                    if not skip:
                        cells[col] = value
            return out

        return self._run(run)

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

    def collect_garbage(self, *, batch: int = GC_BATCH, pause: float = GC_PAUSE_S) -> int:
        """Purge tombstones applied more than ``gc_grace`` ago and cells expired that long ago,
        ``batch`` cells per transaction found through their partial indexes: the cost follows
        what is purged, not the size of the store, and no transaction holds the write lock for
        long (the old single ``DELETE`` scanned the whole table under the lock)."""
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        cutoff = time.time() - self._gc_grace
        purged = 0
        for index, condition in (
            ("cells_tombstones", "dead = 1 AND applied_at < ?"),
            ("cells_expiring", "expires_at IS NOT NULL AND expires_at < ?"),
        ):
            sql = (
                "DELETE FROM cells WHERE (cf, row, col) IN "
                f"(SELECT cf, row, col FROM cells INDEXED BY {index} WHERE {condition} LIMIT ?)"
            )

            def purge(conn: sqlite3.Connection, sql: str = sql) -> int:
                return conn.execute(sql, (cutoff, batch)).rowcount

            while True:
                done = self._run(purge)
                purged += done
                if done < batch:
                    break
                time.sleep(pause)
        return purged

    def checkpoint(self) -> CheckpointResult:
        """``PRAGMA wal_checkpoint(TRUNCATE)``: copy the write-ahead log into the database and cut
        the log file to zero bytes. It needs a moment with no reader on old pages and blocks new
        writers while it waits, so it waits at most ``CHECKPOINT_BUSY_MS``; a busy outcome is
        reported (and the log is cut back at a later attempt, or to ``JOURNAL_SIZE_LIMIT`` when
        it next restarts)."""
        wal = f"{self._path}-wal"
        before = _size(wal)
        started = time.monotonic()

        def run(conn: sqlite3.Connection) -> tuple[int, int, int]:
            conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_MS}")
            try:
                busy, frames, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            return int(busy), int(frames), int(done)

        busy, frames, done = self._run(run)
        return CheckpointResult(
            busy=bool(busy),
            wal_frames=max(frames, 0),
            checkpointed_frames=max(done, 0),
            wal_bytes_before=before,
            wal_bytes_after=_size(wal),
            seconds=time.monotonic() - started,
        )

    def storage_bytes(self) -> dict[str, int]:
        files = (("database", ""), ("wal", "-wal"), ("shm", "-shm"))
        return {name: _size(self._path + suffix) for name, suffix in files}

    def close(self) -> None:
        self._closed = True
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn, in_use in connections:
            with in_use, contextlib.suppress(sqlite3.Error):  # closing a broken connection
                conn.close()
