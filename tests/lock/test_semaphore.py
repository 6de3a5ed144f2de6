"""Semaphores on the real SQLite store (issue 26): at most ``limit`` holders at every grant, across
real processes; each holder its own strictly increasing token; first come, first served; ``try``,
timeouts and cancellation leave nothing; a limit held differently is refused; a dead holder is
revoked by a real leasewatch within the bound; the asyncio twins."""

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

from lockclient import CellStore, LimitMismatch, LockCancelled, LockTimeout, RemoteLocker, open_store
from lockclient.lease import FENCE_COLUMN, holder_columns, parse_fence
from lockclient.lockid import primitive_row
from lockclient.permits import Permit
from lockclient.sharedqueue import LIMIT_COLUMN
from lockclient.store import Table
from tests.lock import primitive_workers
from tests.support.procs import Fleet
from tests.support.waiting import StallProbe, assert_within_bound, wait_queued, wait_until

LEASE = 2.0
SCAN = 0.2
GRACE = 0.5
SLACK = 1.5
BOUND = LEASE + GRACE + 2 * SCAN + SLACK
"""A dead holder's slot is free within lease + grace + look period (a scan: 0.2 s) + a scan's own
duration, plus SLACK for the store round trips and a waiter's poll (tests/leasewatch/test_faults.py)."""
EARLIEST = LEASE - LEASE / 3 + GRACE - 0.3
"""...and never sooner: the last renewal committed at most lease/3 before the kill."""


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5, allow_store_clock=True) as lk:
        yield lk


def rows(store: CellStore, name: str, kind: str = "semaphore") -> tuple[dict[str, str], list[str]]:
    row_id = primitive_row(name, kind)
    return store.read_versioned(row_id), [c.column for c in store.read_row(Table.QUEUE, row_id)]


def run_processes(
    tmp_path: Path, sqlite_url: str, kind: str, name: str, limit: int, processes: int, k: int
) -> list[Any]:
    out = tmp_path / f"out-{name}"
    out.mkdir()
    go = tmp_path / f"go-{name}"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=primitive_workers.contend, args=(sqlite_url, kind, name, limit, k, str(out), str(go), i))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    wait_until(lambda: len(list(out.glob("ready-*"))) == processes, "contenders to start", timeout=60)
    go.touch()
    for p in procs:
        p.join(timeout=240)
    for p in procs:
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"contender exited with {p.exitcode}"
    history: list[dict[str, Any]] = []
    for f in out.glob("history-*.json"):
        history.extend(json.loads(f.read_text()))
    return history


def surely_overlapping(history: list[dict[str, Any]], grant: dict[str, Any]) -> list[dict[str, Any]]:
    """The other holders that surely still believed they held when ``grant`` was made: granted
    (their call returned) before its compare-and-set was sent, and held until after its call
    returned. Exact up to one compare-and-set round trip — no scheduling luck involved."""
    return [
        h for h in history if h is not grant and h["granted"] <= grant["sent"] and h["held_until"] >= grant["granted"]
    ]


@pytest.mark.slow
def test_at_most_limit_holders_across_processes_and_tokens_strictly_increase(tmp_path: Path, sqlite_url: str) -> None:
    limit, processes, k = 3, 4, 40
    history = run_processes(tmp_path, sqlite_url, "semaphore", "pool", limit, processes, k)
    assert len(history) == processes * 2 * k, "every acquisition accounted for"
    most = 0
    for grant in history:
        others = surely_overlapping(history, grant)
        most = max(most, len(others) + 1)
        assert len(others) < limit, f"granted with {len(others)} others holding: {grant} {others}"
        # First come, first served: never granted while `limit` earlier contenders were surely
        # queued ahead of it (seen by its deciding look, still there after its grant).
        ahead = [
            h
            for h in history
            if h["ticket"] < grant["ticket"] and h["enqueued"] < grant["looked"] and h["held_until"] >= grant["granted"]
        ]
        assert len(ahead) < limit, f"{grant} was granted with {len(ahead)} earlier contenders ahead"
    by_send = sorted(history, key=lambda h: h["sent"])
    tokens = [h["token"] for h in history]
    assert len(set(tokens)) == len(tokens), "every holder has its own token"
    surely_after = [(a, b) for a in by_send for b in by_send if a["granted"] < b["sent"]]
    assert all(a["token"] < b["token"] for a, b in surely_after), "a later grant got a smaller token"
    assert not any(h["lost"] for h in history), "a holder lost its permit without any fault"
    print(f"semaphore: {len(history)} grants, up to {most} holders seen at once (limit {limit})")
    with open_store(sqlite_url) as store:
        row, queue = rows(store, "pool")
        assert holder_columns(row) == [] and queue == [], "nothing is left in the store"
        assert parse_fence(row.get(FENCE_COLUMN))[0] == processes * 2 * k


def test_permits_are_shared_up_to_the_limit_and_each_has_its_own_token(locker: RemoteLocker, store: CellStore) -> None:
    permits = [locker.get_semaphore("db", 3) for _ in range(3)]
    assert [p.fencing_token for p in permits] == [1, 2, 3]
    assert sorted(p.slot for p in permits) == ["~holder:0", "~holder:1", "~holder:2"]
    assert all(isinstance(p, Permit) and p.held and p.limit == 3 and p.kind == "semaphore" for p in permits)
    assert locker.try_get_semaphore("db", 3) is None, "a fourth permit is not free"
    row, queue = rows(store, "db")
    assert row[LIMIT_COLUMN] == "3" and len(queue) == 3, "holders keep their queue cells; try left nothing"
    permits[1].release()
    with locker.get_semaphore("db", 3) as again:
        assert again.fencing_token == 4 and again.slot == permits[1].slot, "the only free slot"
    for p in permits:
        p.release()
    row, queue = rows(store, "db")
    assert holder_columns(row) == [] and queue == []
    # A semaphore is not the lock of the same name, nor the read-write lock.
    with locker.get_lock("db") as lock, locker.get_semaphore("db", 1) as permit:
        assert lock.held and permit.held and lock.lock_id != permit.lock_id


def test_first_come_first_served(locker: RemoteLocker, sqlite_url: str) -> None:
    """Waiters queued one after another (each surely queued before the next starts) are granted in
    that order as permits come free, whatever process they run in."""
    holders = [locker.get_semaphore("fifo", 2) for _ in range(2)]
    granted: list[int] = []
    done = threading.Event()
    others = [RemoteLocker(open_store(sqlite_url), lease=5, allow_store_clock=True, owns_store=True) for _ in range(2)]
    threads: list[threading.Thread] = []
    try:
        for i in range(6):
            client = others[i % 2]

            def wait(i: int = i, client: RemoteLocker = client) -> None:
                with client.get_semaphore("fifo", 2, timeout=60):
                    granted.append(i)
                    done.wait(0.02)

            t = threading.Thread(target=wait)
            t.start()
            threads.append(t)
            with open_store(sqlite_url) as view:
                wait_queued(lambda: rows(view, "fifo")[1], i + 3, [o.clock for o in others], f"waiter {i} to queue")
        for h in holders:
            h.release()
        for t in threads:
            t.join(timeout=60)
        # Two permits: the waiters run two at a time, so each pair may finish in either order; the
        # order of grants is what FIFO promises: waiter i is granted no later than the pair after it.
        assert sorted(granted) == list(range(6))
        for position, waiter in enumerate(granted):
            assert abs(position - waiter) <= 1, f"grant order {granted}"
    finally:
        for other in others:
            other.close()


def test_a_holder_that_releases_hands_its_permit_to_the_first_waiter_not_a_later_one(
    locker: RemoteLocker, sqlite_url: str
) -> None:
    """Strict order with one permit in play: a semaphore of 1 is a fair lock."""
    holder = locker.get_semaphore("one", 1)
    order: list[int] = []
    other = RemoteLocker(open_store(sqlite_url), lease=5, allow_store_clock=True, owns_store=True)
    threads = []
    try:
        for i in range(5):
            client = other if i % 2 else locker

            def wait(i: int = i, client: RemoteLocker = client) -> None:
                with client.get_semaphore("one", 1, timeout=60):
                    order.append(i)

            t = threading.Thread(target=wait)
            t.start()
            threads.append(t)
            with open_store(sqlite_url) as view:
                wait_queued(lambda: rows(view, "one")[1], i + 2, [locker.clock, other.clock], f"waiter {i} to queue")
        holder.release()
        for t in threads:
            t.join(timeout=60)
        assert order == [0, 1, 2, 3, 4]
    finally:
        other.close()


def test_timeout_cancel_and_try_leave_nothing_behind(locker: RemoteLocker, store: CellStore) -> None:
    held = locker.get_semaphore("busy", 1)
    with pytest.raises(LockTimeout):
        locker.get_semaphore("busy", 1, timeout=0.2)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(LockCancelled):
        locker.get_semaphore("busy", 1, cancel=cancel)
    assert locker.try_get_semaphore("busy", 1) is None
    row, queue = rows(store, "busy")
    assert queue == [held.ticket] and holder_columns(row) == ["~holder:0"]
    held.release()
    assert holder_columns(rows(store, "busy")[0]) == []


def test_a_limit_other_than_the_holders_is_refused_and_changes_when_nobody_holds(
    locker: RemoteLocker, store: CellStore
) -> None:
    with locker.get_semaphore("limited", 2):
        with pytest.raises(LimitMismatch, match="limit=2, not 5"):
            locker.get_semaphore("limited", 5, timeout=1)
        assert len(rows(store, "limited")[1]) == 1, "the refused contender's queue cell is gone"
    permits = [locker.get_semaphore("limited", 5) for _ in range(5)]
    assert rows(store, "limited")[0][LIMIT_COLUMN] == "5"
    for p in permits:
        p.release()
    with pytest.raises(ValueError, match="limit"):
        locker.get_semaphore("limited", 0)


@pytest.mark.slow
def test_a_sigkilled_holder_is_revoked_by_leasewatch_within_the_bound(
    processes: Fleet, tmp_path: Path, sqlite_url: str
) -> None:
    """Two processes hold both permits; one is SIGKILLed. A real leasewatch revokes its slot (by
    compare-and-set, with the slot's end record) and the waiter gets it — not before the dead
    holder's lease ran out, not later than the bound."""
    processes.leasewatch(sqlite_url, scan_interval=SCAN, grace=GRACE)
    ctx = multiprocessing.get_context("spawn")
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    holders = [
        ctx.Process(target=primitive_workers.hold_forever, args=(sqlite_url, "semaphore", "dead", 2, "", str(r)))
        for r in ready
    ]
    for p in holders:
        p.start()
    try:
        for r in ready:
            wait_until(r.exists, "a holder to hold", timeout=60)
        with RemoteLocker(open_store(sqlite_url), lease=LEASE, allow_store_clock=True, owns_store=True) as locker:
            assert locker.try_get_semaphore("dead", 2) is None
            with StallProbe() as stalls:
                killed = time.monotonic_ns()
                holders[0].kill()
                permit = locker.get_semaphore("dead", 2, timeout=BOUND + 60)
                took = (time.monotonic_ns() - killed) / 1e9
            dead = json.loads(ready[0].read_text())
            what = "semaphore: SIGKILL -> the waiter holds the dead holder's permit"
            assert_within_bound(took, BOUND, stalls, killed, what, earliest=EARLIEST)
            row = locker.store.read_versioned(permit.lock_id)
            ends = [v for c, v in row.items() if c.startswith("~ended")]
            assert any(f"{dead['token']}|{dead['owner']}|revoked|" in end for end in ends), ends
            permit.release()
    finally:
        for p in holders:
            p.kill()
            p.join(5)


def test_asyncio_twins_share_the_permits_and_cancel_cleanly(locker: RemoteLocker, store: CellStore) -> None:
    async def main() -> None:
        inside = 0
        most = 0

        async def use() -> None:
            nonlocal inside, most
            async with await locker.aget_semaphore("aio", 2, timeout=30) as permit:
                assert isinstance(permit, Permit)
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(use() for _ in range(8)))
        assert most == 2
        held = [await locker.aget_semaphore("aio", 2) for _ in range(2)]
        assert await locker.atry_get_semaphore("aio", 2) is None
        waiter = asyncio.ensure_future(locker.aget_semaphore("aio", 2))
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        for p in held:
            p.release()

    asyncio.run(main())
    row, queue = rows(store, "aio")
    assert holder_columns(row) == [] and queue == [], "a cancelled waiter left nothing"
