"""``locker.watch(name)`` on the real SQLite store (issue 26): granted / released / revoked / lost / queue
as they happen, for a lock, a semaphore and an election; a watch that fell behind is told exactly which
tokens it missed; the asyncio twin."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, RemoteLocker, open_store
from lockclient.events import EventTracker, LockEvent, read_snapshot
from lockclient.lockid import primitive_row
from tests.support.waiting import wait_until


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5, allow_store_clock=True) as lk:
        yield lk


class Recorder:
    """A watch running in a thread, its events collected."""

    def __init__(self, locker: RemoteLocker, name: str, **options: object) -> None:
        self.events: list[LockEvent] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(locker, name, options))
        self.thread.start()
        wait_until(lambda: self.started, "the watch to read once")

    started = False

    def _run(self, locker: RemoteLocker, name: str, options: dict[str, object]) -> None:
        events = locker.watch(name, cancel=self.stop, poll=0.05, **options)  # type: ignore[arg-type]
        self.started = True
        for event in events:
            self.events.append(event)

    def kinds(self) -> list[tuple[str, int | None]]:
        return [(e.kind, e.token) for e in self.events if e.kind != "queue"]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_grants_releases_and_the_queue_as_they_happen(locker: RemoteLocker) -> None:
    watch = Recorder(locker, "job")
    try:
        first = locker.get_lock("job")
        wait_until(lambda: ("granted", 1) in watch.kinds(), "the grant")
        waiter: list[object] = []
        thread = threading.Thread(target=lambda: waiter.append(locker.get_lock("job", timeout=10)))
        thread.start()
        wait_until(lambda: any(e.kind == "queue" and e.queue for e in watch.events), "the waiter in the queue")
        first.release()
        thread.join(10)
        wait_until(lambda: ("granted", 2) in watch.kinds(), "the second grant")
        waiter[0].release()  # type: ignore[attr-defined]
        wait_until(lambda: ("released", 2) in watch.kinds(), "the second release")
    finally:
        watch.close()
    assert watch.kinds() == [("granted", 1), ("released", 1), ("granted", 2), ("released", 2)]
    granted = [e for e in watch.events if e.kind == "granted"]
    assert granted[0].owner == first.owner and granted[0].slot == "~holder"
    queues = [e.queue for e in watch.events if e.kind == "queue"]
    assert queues[-1] == () and any(len(q) == 1 for q in queues)


def test_a_watch_that_fell_behind_is_told_exactly_what_it_missed(locker: RemoteLocker) -> None:
    """Between two reads: token 1's holder released (its end record then overwritten by later ones), token 2
    granted and released (end overwritten too), token 3 granted and released (its end is the last): the
    watch reports `behind` for 1 and 2 — and what it can still see of 3."""
    tracker = EventTracker("gap")
    one = locker.get_lock("gap")
    assert [e.kind for e in tracker.feed(read_snapshot(locker, "gap"))] == ["granted"]
    one.release()
    for _ in range(2):
        locker.get_lock("gap").release()
    events = tracker.feed(read_snapshot(locker, "gap"))
    assert events[0].kind == "behind" and events[0].missed == (1, 2)
    assert [(e.kind, e.token) for e in events[1:]] == [("granted", 3), ("released", 3)]
    # Nothing is reported twice, and nothing new comes from an unchanged store.
    assert tracker.feed(read_snapshot(locker, "gap")) == []


def test_lost_then_revoked_for_a_holder_that_stopped_renewing(sqlite_url: str, store: CellStore) -> None:
    """A holder whose process stops renewing (its keeper closed, as a frozen process's would be): the
    watch says `lost` once its record went unchanged for a lease — when the holder itself already sees
    held == False — and `revoked` when leasewatch revokes it."""
    holder_locker = RemoteLocker(open_store(sqlite_url), lease=1.0, allow_store_clock=True, owns_store=True)
    watcher_locker = RemoteLocker(open_store(sqlite_url), lease=1.0, allow_store_clock=True, owns_store=True)
    watch = Recorder(watcher_locker, "frozen")
    try:
        lock = holder_locker.get_lock("frozen")
        wait_until(lambda: ("granted", 1) in watch.kinds(), "the grant")
        holder_locker._services.keeper.close(0)  # renews nothing from now on
        wait_until(lambda: ("lost", 1) in watch.kinds(), "lost", timeout=10)
        assert not lock.held, "lost is reported only once the holder itself sees its lease over"
        leasewatch = Watcher(store, grace=0.2, scan_interval=0.1)
        deadline = time.monotonic() + 15
        while ("revoked", 1) not in watch.kinds():
            leasewatch.scan()
            leasewatch.check_due()
            time.sleep(0.05)
            assert time.monotonic() < deadline, watch.kinds()
    finally:
        watch.close()
        holder_locker.close(0)
        watcher_locker.close()
    assert watch.kinds() == [("granted", 1), ("lost", 1), ("revoked", 1)]


def test_a_semaphore_watch_sees_every_slot(locker: RemoteLocker) -> None:
    watch = Recorder(locker, "pool", kind="semaphore")
    try:
        permits = [locker.get_semaphore("pool", 2) for _ in range(2)]
        wait_until(lambda: len([e for e in watch.events if e.kind == "granted"]) == 2, "two grants")
        for p in permits:
            p.release()
        wait_until(lambda: len([e for e in watch.events if e.kind == "released"]) == 2, "two releases")
    finally:
        watch.close()
    slots = {e.slot for e in watch.events if e.kind == "granted"}
    assert slots == {p.slot for p in permits} and len(slots) == 2
    assert sorted(t for k, t in watch.kinds() if k == "granted") == [1, 2]


def test_an_election_watch_shows_the_term_and_since(locker: RemoteLocker) -> None:
    election = locker.election("leader")
    with election.campaign() as leadership:
        events = list(locker.watch("leader", timeout=0.2, poll=0.05))
    initial = [e for e in events if e.kind == "granted"]
    assert initial and initial[0].initial and initial[0].token == leadership.term
    assert initial[0].since_us == leadership.since_us


def test_the_asyncio_twin(locker: RemoteLocker) -> None:
    async def main() -> list[tuple[str, int | None]]:
        seen: list[tuple[str, int | None]] = []

        async def watch() -> None:
            async for event in locker.awatch("aio", poll=0.05, timeout=5):
                if event.kind != "queue":
                    seen.append((event.kind, event.token))
                if len(seen) == 2:
                    return

        task = asyncio.ensure_future(watch())
        await asyncio.sleep(0.2)
        lock = await locker.aget_lock("aio")
        await asyncio.sleep(0.2)
        lock.release()
        await asyncio.wait_for(task, 10)
        return seen

    assert asyncio.run(main()) == [("granted", 1), ("released", 1)]
    assert primitive_row("aio", "semaphore") != "aio"
