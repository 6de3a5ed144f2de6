"""The embedded store's housekeeping: garbage collection in small indexed batches, a bounded
write-ahead log, its size reported, and reads that never walk tombstones (issue 15)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lockclient.store import Table
from lockclient.store.sqlite import GC_BATCH, SQLiteStore


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "cells.db")


def fill_tombstones(path: str, count: int, *, applied_at: float) -> None:
    """Tombstones as deletes leave them, written in bulk (the store's own delete is one statement each)."""
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO cells (cf, row, col, value, ts, dead, expires_at, applied_at) "
            "VALUES (?, ?, ?, NULL, ?, 1, NULL, ?)",
            ((str(Table.QUEUE), f"lock-{i % 500}", f"t{i:08d}", 10, applied_at) for i in range(count)),
        )


def plan(path: str, sql: str, params: tuple[object, ...]) -> str:
    with sqlite3.connect(path) as conn:
        return " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_gc_purges_only_old_tombstones_and_expired_cells_through_their_indexes(db: str) -> None:
    store = SQLiteStore(db, gc_grace=60)
    store.put(Table.QUEUE, "live", "a", "x", timestamp=1)
    store.delete(Table.QUEUE, "recent", "b", timestamp=1)  # younger than gc_grace: kept
    fill_tombstones(db, 2 * GC_BATCH + 7, applied_at=time.time() - 120)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO cells VALUES (?, 'ttl', 'c', 'v', 1, 0, ?, ?)",
            (str(Table.INDEX), time.time() - 120, time.time() - 200),
        )
    assert store.collect_garbage() == 2 * GC_BATCH + 7 + 1
    with sqlite3.connect(db) as conn:
        left = conn.execute("SELECT row, col, dead FROM cells ORDER BY row").fetchall()
    assert left == [("live", "a", 0), ("recent", "b", 1)]
    assert store.collect_garbage() == 0
    # Found through the partial indexes, not by scanning the table.
    assert "cells_tombstones" in plan(
        db, "SELECT cf, row, col FROM cells INDEXED BY cells_tombstones WHERE dead = 1 AND applied_at < ?", (0,)
    )
    # Live reads walk the live cells only (a busy queue row collects tombstones for gc_grace).
    assert "cells_live" in plan(
        db,
        "SELECT col, value, ts FROM cells INDEXED BY cells_live WHERE cf = ? AND row = ? AND col >= ? AND dead = 0",
        ("q", "r", ""),
    )
    store.close()


def test_gc_never_holds_the_write_lock_for_long(db: str) -> None:
    """100,000 old tombstones: the old single DELETE held the database's write lock for the
    whole purge, so a writer in another connection finished nothing until it ended; in batches
    of 1,000 the writer keeps finishing writes all through the purge."""
    store = SQLiteStore(db, gc_grace=60)
    fill_tombstones(db, 100_000, applied_at=time.time() - 120)
    writer = SQLiteStore(db)  # another connection, as another process would have
    waits: list[float] = []
    finished: list[float] = []
    done = threading.Event()

    def write() -> None:
        i = 0
        while not done.is_set():
            started = time.monotonic()
            writer.put(Table.QUEUE, "busy", f"c{i}", "v", timestamp=i + 1)
            finished.append(time.monotonic())
            waits.append(finished[-1] - started)
            i += 1
            time.sleep(0.002)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        started = time.monotonic()
        purged = store.collect_garbage()
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join()
    assert purged == 100_000
    waits.sort()
    print(
        f"gc of 100,000 tombstones: {took:.2f} s; writer waits p50 {waits[len(waits) // 2] * 1000:.1f} ms, "
        f"max {waits[-1] * 1000:.1f} ms over {len(waits)} writes"
    )
    # What the batches guarantee, not how fast a busy machine schedules the writer thread (a
    # bound on its longest wait relative to the purge flaked in CI: 0.21 s of 0.57 s): writes
    # complete in each half of the purge. One DELETE for the whole purge completes none until
    # it ends.
    halves = [
        sum(1 for t in finished if started < t <= started + took / 2),
        sum(1 for t in finished if started + took / 2 < t < started + took),
    ]
    assert min(halves) >= 3, f"writes completed in each half of a {took:.3f} s purge: {halves}"
    writer.close()
    store.close()


def test_checkpoint_truncates_the_wal_and_reports_busy_readers(db: str) -> None:
    store = SQLiteStore(db)
    for i in range(2000):
        store.put(Table.QUEUE, f"row-{i % 50}", f"col-{i}", "x" * 200, timestamp=i + 1)
    assert store.storage_bytes()["wal"] > 0
    # A reader in the middle of a transaction pins old pages: the checkpoint cannot truncate
    # and says so, after waiting at most its busy limit (it blocks writers meanwhile).
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM cells").fetchone()
    store.put(Table.QUEUE, "after", "c", "v", timestamp=1)
    started = time.monotonic()
    busy = store.checkpoint()
    assert busy.busy and time.monotonic() - started < 2.0
    reader.execute("COMMIT")
    reader.close()
    result = store.checkpoint()
    assert not result.busy
    assert result.wal_frames == result.checkpointed_frames
    assert result.wal_bytes_before > 0 and result.wal_bytes_after == 0
    sizes = store.storage_bytes()
    assert set(sizes) == {"database", "wal", "shm"} and sizes["database"] > 0 and sizes["wal"] == 0
    store.close()


def test_wal_is_cut_back_when_it_restarts(db: str) -> None:
    """``journal_size_limit``: after a burst the log file does not keep its largest size forever
    (the issue measured a 53 MiB log beside a 6 MiB database)."""
    from lockclient.store.sqlite import JOURNAL_SIZE_LIMIT

    store = SQLiteStore(db)
    conn, _ = store._connection()
    conn.execute("BEGIN IMMEDIATE")  # one burst of ~24 MiB
    conn.executemany(
        "INSERT INTO cells VALUES (?, ?, ?, ?, 1, 0, NULL, 0)",
        ((str(Table.QUEUE), "burst", f"c{i:05d}", "x" * 4000) for i in range(6000)),
    )
    conn.execute("COMMIT")
    assert store.storage_bytes()["wal"] > JOURNAL_SIZE_LIMIT
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # what SQLite's auto-checkpoint does
    store.put(Table.QUEUE, "after", "c", "v", timestamp=1)  # the log restarts from its beginning...
    assert store.storage_bytes()["wal"] <= JOURNAL_SIZE_LIMIT  # ...and is cut back to the limit
    store.close()


def test_closing_the_store_while_other_threads_use_it_never_crashes(tmp_path: Path) -> None:
    """Found on the ring run of the suite: ``RemoteLocker.close()`` closed the SQLite store while
    the clock's background refresh was inside a query on its own connection, and the interpreter
    died in sqlite3 (SIGSEGV). Closing now waits for each connection's statement in flight; the
    threads then get ``StoreError``. Run in a child process so that a crash is a failed assertion."""
    script = f"""
import threading
from lockclient.errors import StoreError
from lockclient.store import Table, open_store
for round_ in range(30):
    store = open_store("sqlite:///{tmp_path}/crash-" + str(round_) + ".db")
    store.put(Table.QUEUE, "row", "c", "v", timestamp=1)
    def hammer():
        try:
            while True:
                store.read_row(Table.QUEUE, "row")
        except StoreError:
            pass
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    threading.Event().wait(0.01)
    store.close()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


class _LockedAtFirst:
    """A connection whose WAL switch answers "database is locked" ``times`` times, as SQLite may
    — at once, without the busy handler — while another process opens or creates the same file."""

    def __init__(self, real: sqlite3.Connection, times: int, message: str = "database is locked") -> None:
        self.real, self.times, self.message, self.tries = real, times, message, 0

    def execute(self, sql: str) -> sqlite3.Cursor:
        if sql.startswith("PRAGMA journal_mode"):
            self.tries += 1
            if self.tries <= self.times:
                raise sqlite3.OperationalError(self.message)
        return self.real.execute(sql)


def test_the_wal_switch_waits_out_another_process_opening_the_file(db: str) -> None:
    """A lockctl started beside another on a fresh store exited 69 ("unavailable") under load: the
    switch to WAL was refused at once. It is retried for as long as ``busy_timeout`` allows."""
    store = SQLiteStore(db, busy_timeout=5.0)
    real = sqlite3.connect(db, isolation_level=None)
    try:
        patient = _LockedAtFirst(real, times=3)
        store._wal(patient)  # type: ignore[arg-type]
        assert patient.tries == 4
        assert real.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            store._wal(_LockedAtFirst(real, times=1, message="disk I/O error"))  # type: ignore[arg-type]
    finally:
        real.close()
        store.close()


def test_the_wal_switch_gives_up_after_busy_timeout(db: str) -> None:
    store = SQLiteStore(db, busy_timeout=0.05)
    real = sqlite3.connect(db, isolation_level=None)
    try:
        stubborn = _LockedAtFirst(real, times=10**6)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store._wal(stubborn)  # type: ignore[arg-type]
        assert stubborn.tries < 100, "it backs off between tries"
    finally:
        real.close()
        store.close()
