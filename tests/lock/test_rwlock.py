"""Read-write locks on the real SQLite store (issue 26): many readers or one writer at every grant,
across real processes; first come, first served among readers and writers, so a writer never
starves; ``try``; a dead reader is revoked by a real leasewatch and the writer goes on; a deposed
writer's fenced write is refused; the asyncio twins."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockclient import CellStore, FencedResource, RemoteLocker, StaleFencingToken, open_store
from lockclient.lease import holder_columns
from tests.lock import primitive_workers
from tests.lock.test_semaphore import BOUND, EARLIEST, GRACE, LEASE, SCAN, rows, run_processes, surely_overlapping
from tests.support.procs import Fleet
from tests.support.waiting import StallProbe, assert_within_bound, wait_queued, wait_until


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5, allow_store_clock=True) as lk:
        yield lk


def queued(store: CellStore, name: str) -> int:
    return len(rows(store, name, "rwlock")[1])


def surely_ahead(history: list[dict[str, Any]], grant: dict[str, Any]) -> list[dict[str, Any]]:
    """Contenders whose queue cell the grant's deciding look surely saw: a smaller ticket, written
    before that look started, and not yet removed after the grant (their release started later)."""
    return [
        h
        for h in history
        if h["ticket"] < grant["ticket"] and h["enqueued"] < grant["looked"] and h["held_until"] >= grant["granted"]
    ]


@pytest.mark.slow
def test_readers_share_a_writer_is_alone_and_nobody_overtakes_a_writer_across_processes(
    tmp_path: Path, sqlite_url: str
) -> None:
    history = run_processes(tmp_path, sqlite_url, "rwlock", "doc", 8, processes=4, k=40)
    assert len(history) == 4 * 2 * 40
    writes = [h for h in history if h["mode"] == "write"]
    reads = [h for h in history if h["mode"] == "read"]
    assert writes and reads
    most_readers = 0
    for grant in history:
        others = surely_overlapping(history, grant)
        if grant["mode"] == "write":
            assert not others, f"a writer was granted while others held: {grant} {others}"
        else:
            assert not [o for o in others if o["mode"] == "write"], f"a reader was granted beside a writer: {grant}"
            most_readers = max(most_readers, len(others) + 1)
            assert len(others) < 8
        # FIFO, the writer-starvation promise: nobody is granted over a writer queued before it,
        # and a writer over nobody queued before it.
        ahead = surely_ahead(history, grant)
        blocking = ahead if grant["mode"] == "write" else [a for a in ahead if a["mode"] == "write"]
        assert not blocking, f"{grant} was granted over {blocking}"
    tokens = [h["token"] for h in history]
    assert len(set(tokens)) == len(tokens)
    print(f"rwlock: {len(reads)} reads, {len(writes)} writes, up to {most_readers} readers at once")
    with open_store(sqlite_url) as store:
        row, queue = rows(store, "doc", "rwlock")
        assert holder_columns(row) == [] and queue == []


def test_readers_share_and_a_writer_is_alone(locker: RemoteLocker, store: CellStore) -> None:
    r1, r2 = locker.get_read_lock("shared"), locker.get_read_lock("shared")
    assert r1.mode == r2.mode == "read" and r1.fencing_token < r2.fencing_token
    assert locker.try_get_write_lock("shared") is None
    r3 = locker.try_get_read_lock("shared")
    assert r3 is not None, "readers share"
    r1.release()
    r2.release()
    assert locker.try_get_write_lock("shared") is None, "one reader is enough to keep a writer out"
    r3.release()
    w = locker.try_get_write_lock("shared")
    assert w is not None and w.mode == "write" and w.slot == "~holder"
    assert locker.try_get_read_lock("shared") is None and locker.try_get_write_lock("shared") is None
    w.release()
    row, queue = rows(store, "shared", "rwlock")
    assert holder_columns(row) == [] and queue == []


def test_a_writer_queued_behind_readers_is_not_overtaken_by_later_readers(
    locker: RemoteLocker, store: CellStore
) -> None:
    """No writer starvation: readers that come after a waiting writer wait for it, even though the
    lock is held by readers only and has room for more."""
    first = locker.get_read_lock("busy-doc")
    order: list[str] = []
    writer_done = threading.Event()

    def writer() -> None:
        with locker.get_write_lock("busy-doc", timeout=30):
            order.append("writer")
        writer_done.set()

    def late_reader(i: int) -> None:
        with locker.get_read_lock("busy-doc", timeout=30):
            order.append(f"reader{i}")

    w = threading.Thread(target=writer)
    w.start()
    wait_until(lambda: queued(store, "busy-doc") == 2, "the writer to queue")
    readers = [threading.Thread(target=late_reader, args=(i,)) for i in range(3)]
    for i, t in enumerate(readers):
        t.start()
        wait_until(lambda n=3 + i: queued(store, "busy-doc") == n, "a late reader to queue")
    assert locker.try_get_read_lock("busy-doc") is None, "a reader may not pass a waiting writer"
    time.sleep(0.3)
    assert order == [], "nobody was granted while the first reader held and the writer waited"
    first.release()
    w.join(30)
    for t in readers:
        t.join(30)
    assert order[0] == "writer" and sorted(order[1:]) == ["reader0", "reader1", "reader2"]


def test_writers_are_served_in_order_and_exclude_each_other(locker: RemoteLocker, sqlite_url: str) -> None:
    holder = locker.get_write_lock("w")
    order: list[int] = []
    other = RemoteLocker(open_store(sqlite_url), lease=5, allow_store_clock=True, owns_store=True)
    threads = []
    try:
        with open_store(sqlite_url) as view:
            for i in range(4):
                client = other if i % 2 else locker

                def wait(i: int = i, client: RemoteLocker = client) -> None:
                    with client.get_write_lock("w", timeout=60):
                        order.append(i)

                t = threading.Thread(target=wait)
                t.start()
                threads.append(t)
                wait_queued(
                    lambda: rows(view, "w", "rwlock")[1], i + 2, [locker.clock, other.clock], f"writer {i} to queue"
                )
        holder.release()
        for t in threads:
            t.join(60)
        assert order == [0, 1, 2, 3]
    finally:
        other.close()


def test_a_deposed_writers_fenced_write_is_refused(locker: RemoteLocker, store: CellStore) -> None:
    """A writer whose lease was revoked (here: its record removed, as leasewatch would) cannot write
    after the next writer did: tokens strictly increase across readers and writers."""
    from leasewatch.watcher import Watcher

    resource = FencedResource(store, "doc-store")
    old = locker.get_write_lock("fenced")
    resource.write(old.fencing_token, "k", "old")
    revoked = Watcher(store, grace=0).revoke_now(old.lock_id)
    assert revoked == [old.owner]
    new = locker.get_write_lock("fenced", timeout=5)
    resource.write(new.fencing_token, "k", "new")
    with pytest.raises(StaleFencingToken):
        resource.write(old.fencing_token, "k", "stale")
    wait_until(old.lost.is_set, "the deposed writer to learn it lost", timeout=10)
    assert old.release() is False
    new.release()


@pytest.mark.slow
def test_a_sigstopped_reader_is_revoked_and_the_writer_goes_on(
    processes: Fleet, tmp_path: Path, sqlite_url: str
) -> None:
    import os
    import signal

    processes.leasewatch(sqlite_url, scan_interval=SCAN, grace=GRACE)
    ready = tmp_path / "ready"
    ctx = multiprocessing.get_context("spawn")
    reader = ctx.Process(
        target=primitive_workers.hold_forever, args=(sqlite_url, "rwlock", "paused", 16, "read", str(ready))
    )
    reader.start()
    try:
        wait_until(ready.exists, "the reader to hold", timeout=60)
        with RemoteLocker(open_store(sqlite_url), lease=LEASE, allow_store_clock=True, owns_store=True) as locker:
            assert locker.try_get_write_lock("paused") is None
            assert reader.pid is not None
            with StallProbe() as stalls:
                stopped = time.monotonic_ns()
                os.kill(reader.pid, signal.SIGSTOP)
                writer = locker.get_write_lock("paused", timeout=BOUND + 60)
                took = (time.monotonic_ns() - stopped) / 1e9
            what = "rwlock: SIGSTOP of a reader -> the writer holds"
            assert_within_bound(took, BOUND, stalls, stopped, what, earliest=EARLIEST)
            dead = json.loads(ready.read_text())
            assert writer.fencing_token > dead["token"]
            writer.release()
    finally:
        reader.kill()
        reader.join(5)


def test_asyncio_twins(locker: RemoteLocker, store: CellStore) -> None:
    async def main() -> None:
        readers = [await locker.aget_read_lock("aio-doc") for _ in range(3)]
        assert await locker.atry_get_write_lock("aio-doc") is None
        writer = asyncio.ensure_future(locker.aget_write_lock("aio-doc", timeout=10))
        await asyncio.sleep(0.1)
        assert not writer.done()
        assert await locker.atry_get_read_lock("aio-doc") is None, "behind a waiting writer"
        for r in readers:
            r.release()
        async with await writer as held:
            assert held.mode == "write"

    asyncio.run(main())
    row, queue = rows(store, "aio-doc", "rwlock")
    assert holder_columns(row) == [] and queue == []
