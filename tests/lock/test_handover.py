"""Issue 27's hand-over in one Paxos round, on the real SQLite store (and real processes where a
waiter must die): a holder that waited for its lock hands it, in its release's compare-and-set, to
the first waiter in queue order, who adopts it on its next look without a Paxos round of its own.

What is asserted is what the algorithm promises, never timing: who is granted, in which order,
with which token, and how many compare-and-sets (Paxos rounds) each side spent — counted by the
store's counting wrapper (``RemoteLock.store_op_counts``, ``RemoteLock.release_counts``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, LockTimeout, RemoteLock, RemoteLocker, open_store
from lockclient.fairqueue import FairQueue
from lockclient.lease import HOLDER_COLUMN, HolderRecord
from lockclient.lockid import ticket_time
from lockclient.store import Table
from tests.lock.handover_worker import wait_for_lock
from tests.support.faulty import FaultyStore
from tests.support.waiting import wait_queued, wait_until

LEASE = 5.0


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def client(sqlite_url: str, lease: float = LEASE, store: CellStore | None = None) -> RemoteLocker:
    """An independent client: its own store connection, clock, keeper and wake-ups. Its first use of
    a lock id sends no speculative grant with the enqueue (that compare-and-set, refused on a held
    lock, is not what these tests count): as if it had used every id before."""
    faulty = store if isinstance(store, FaultyStore) else FaultyStore(store or open_store(sqlite_url))
    locker = RemoteLocker(faulty, lease=lease, owns_store=True)
    algorithm = locker._algorithm
    assert isinstance(algorithm, FairQueue)
    algorithm._first_use.first = lambda lock_id: False  # type: ignore[method-assign]
    return locker


def looks(locker: RemoteLocker, lock_id: str) -> threading.Semaphore:
    """Released at the end of each look ``locker`` takes at ``lock_id`` (its plain read of the lease
    row): a waiter that looked while the lock was held waits for it, its grant will say so."""
    store = locker.store
    assert isinstance(store, FaultyStore)
    looked = threading.Semaphore(0)
    store.arm(
        "read_versioned",
        after=lambda *a, **k: looked.release(),
        when=lambda row, **k: row == lock_id and k.get("serial") is False,
        times=10_000,
    )
    return looked


def tickets(store: CellStore, lock_id: str) -> Callable[[], list[str]]:
    return lambda: [cell.column for cell in store.read_row(Table.QUEUE, lock_id)]


def holder(store: CellStore, lock_id: str) -> HolderRecord | None:
    raw = store.read_versioned(lock_id).get(HOLDER_COLUMN)
    return None if raw is None else HolderRecord.decode(raw)


class Waiting:
    """``get_lock`` on a thread: the lock it got, or the error it raised."""

    def __init__(self, locker: RemoteLocker, lock_id: str, timeout: float = 60.0) -> None:
        self.lock: RemoteLock | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.lock = locker.get_lock(lock_id, timeout=timeout)
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def result(self, timeout: float = 60.0) -> RemoteLock:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "get_lock did not return"
        assert self.error is None, f"get_lock raised {self.error!r}"
        assert self.lock is not None
        return self.lock


def contended_holder(first: RemoteLocker, second: RemoteLocker, store: CellStore, lock_id: str) -> RemoteLock:
    """A holder that waited for the lock (``first`` takes it at once, ``second`` waits and is granted
    at its release): its release hands the lock over."""
    lock = first.get_lock(lock_id)
    looked = looks(second, lock_id)
    waiting = Waiting(second, lock_id)
    assert looked.acquire(timeout=30), "the second contender never looked"
    wait_queued(tickets(store, lock_id), 2, [first.clock, second.clock], "the second contender queued")
    lock.release()
    held = waiting.result()
    assert held.waited
    return held


def hold_back(go: threading.Event) -> None:
    assert go.wait(30), "never let through"


def compare_and_sets(counts: dict[str, int]) -> int:
    return counts.get("compare_and_set", 0) + counts.get("compare_and_set_many", 0)


def test_a_release_hands_the_lock_to_the_first_in_line_in_its_one_compare_and_set(
    store: CellStore, sqlite_url: str
) -> None:
    """The holder waited, so its release reads the queue's head and grants the waiter behind it in
    the same compare-and-set that ends its own record: one Paxos round per hand-over — the release's
    — and the waiter's acquisition none at all (before issue 27: the release's and the waiter's
    grant, two). Fencing tokens go up by one per hand-over."""
    with (
        client(sqlite_url) as a,
        client(sqlite_url) as b,
        client(sqlite_url) as c,
        client(sqlite_url) as d,
        client(sqlite_url) as e,
    ):
        held = contended_holder(a, b, store, "one-round")
        clocks = [x.clock for x in (a, b, c, d, e)]
        waiting = []
        for n, locker in enumerate((c, d, e), start=2):
            # One at a time, each enqueue complete before the next starts: the order is known.
            waiting.append(Waiting(locker, "one-round"))
            wait_queued(tickets(store, "one-round"), n, clocks, f"{n - 1} waiters queued")
        chain = [held]
        for successor in waiting:
            previous = chain[-1]
            assert previous.release() is True
            assert compare_and_sets(previous.release_counts.ops) == 1, previous.release_counts.ops
            assert previous.release_counts.lwt_rounds == 1
            lock = successor.result()
            assert lock.fencing_token == previous.fencing_token + 1
            assert lock.waited
            assert compare_and_sets(lock.store_op_counts) == 0, f"the waiter sent a grant: {lock.store_op_counts}"
            assert lock.lwt_rounds == 0
            chain.append(lock)
        assert [ticket_time(lock.ticket) for lock in chain[1:]] == sorted(
            ticket_time(lock.ticket) for lock in chain[1:]
        )
        last = chain[-1]
        assert last.release() is True
        assert holder(store, "one-round") is None, "the last release, with nobody in line, ends the record"
        assert tickets(store, "one-round")() == []


def test_the_release_hands_over_to_a_cell_ahead_of_its_own_not_to_the_one_behind_it(
    store: CellStore, sqlite_url: str
) -> None:
    """Cells with a ticket below the holder's are in line too: X takes its ticket, its enqueue is held
    up in the store; H, with a later ticket, is granted meanwhile (X's cell did not exist at H's look);
    then X's cell lands — ahead of H's — and W queues behind H. H's release must hand the lock to X,
    the first in queue order, not to W, the one right behind it (``handover-to-the-second-in-line``)."""
    slow = FaultyStore(open_store(sqlite_url))
    landed = threading.Event()
    go = threading.Event()
    slow.arm(
        "put",
        before=lambda *a, **k: hold_back(go),
        after=lambda *a, **k: landed.set(),
        when=lambda table, row, *a, **k: table == Table.QUEUE and row == "ahead",
    )
    with (
        client(sqlite_url) as g,
        client(sqlite_url) as h,
        client(sqlite_url) as w,
        client(sqlite_url, store=slow) as x,
    ):
        first = g.get_lock("ahead")
        x_waiting = Waiting(x, "ahead")  # its ticket is taken now; its cell is held back
        wait_until(lambda: slow.calls.get("put", 0) >= 1, "X's enqueue to be sent")
        h_looked = looks(h, "ahead")
        h_waiting = Waiting(h, "ahead")
        assert h_looked.acquire(timeout=30), "H never looked"  # while G held: H waits, so it hands over
        wait_queued(tickets(store, "ahead"), 2, [g.clock, h.clock, x.clock], "H queued behind G")
        first.release()
        held = h_waiting.result()  # waited: its release hands over
        go.set()
        assert landed.wait(30)
        queue = tickets(store, "ahead")()
        assert len(queue) == 2 and ticket_time(queue[0]) < ticket_time(held.ticket), "X's cell is ahead of H's"
        w_waiting = Waiting(w, "ahead")
        wait_queued(tickets(store, "ahead"), 3, [g.clock, h.clock, w.clock, x.clock], "W queued behind H")
        assert held.release() is True
        assert compare_and_sets(held.release_counts.ops) == 1
        got = x_waiting.result()
        assert got.fencing_token == held.fencing_token + 1, "X, the first in queue order, was handed the lock"
        handed = held._lease.handed_to
        assert handed is not None and handed.ticket == got.ticket == queue[0], "by H's release"
        assert w_waiting.lock is None, "W was not granted over X"
        got.release()
        after = w_waiting.result()
        assert after.fencing_token == got.fencing_token + 1
        after.release()


def test_a_waiter_that_times_out_while_the_lock_is_handed_to_it_hands_it_on(store: CellStore, sqlite_url: str) -> None:
    """The release read W's cell; W then gives up (its timeout) and withdraws; the release's
    compare-and-set applies after that and hands W the lock. W is gone, but the lock is not left
    granted to it: W checks the row after it left and hands the lock on to the next in line, V."""
    releasing = FaultyStore(open_store(sqlite_url))
    with (
        client(sqlite_url) as a,
        client(sqlite_url, store=releasing) as h,
        client(sqlite_url) as w,
        client(sqlite_url) as v,
    ):
        held = contended_holder(a, h, store, "leaving")
        w_waiting = Waiting(w, "leaving", timeout=3.0)
        wait_queued(tickets(store, "leaving"), 2, [a.clock, h.clock, w.clock], "W queued")
        v_waiting = Waiting(v, "leaving")
        wait_queued(tickets(store, "leaving"), 3, [a.clock, h.clock, w.clock, v.clock], "V queued")
        # The release reads the head (W first) now; its compare-and-set waits until W has timed out
        # and withdrawn its cell.
        w_ticket = tickets(store, "leaving")()[1]
        releasing.arm(
            "compare_and_set",
            before=lambda *a, **k: wait_until(lambda: w_ticket not in tickets(store, "leaving")(), "W left", 30),
            when=lambda row, expected, updates, *a, **k: (
                row == "leaving" and "~ended" in updates and bool(updates.get(HOLDER_COLUMN))
            ),
        )
        released: list[bool] = []
        releaser = threading.Thread(target=lambda: released.append(held.release()))
        releaser.start()
        w_waiting.thread.join(30)
        releaser.join(30)
        assert isinstance(w_waiting.error, LockTimeout)
        assert released == [True]
        assert held._lease.handed_to is not None and held._lease.handed_to.ticket == w_ticket, "handed to W"
        lock = v_waiting.result(timeout=30)
        assert lock.fencing_token == held.fencing_token + 2, "W's token was issued and handed on"
        assert compare_and_sets(lock.store_op_counts) == 0, "V was handed the lock by W's hand-on"
        lock.release()


def test_a_dead_waiter_handed_the_lock_is_revoked_like_a_dead_holder(store: CellStore, sqlite_url: str) -> None:
    """A waiter process is SIGKILLed while queued; before leasewatch removes its cell, the release
    hands it the lock. Nobody renews that record: leasewatch revokes it (the lock is unavailable for
    up to lease + grace meanwhile) and the next waiter is granted, with the next token."""
    lease = 2.0
    watcher = Watcher(store, grace=0.5, orphan_after=30)
    ctx = multiprocessing.get_context("spawn")
    with client(sqlite_url, lease) as a, client(sqlite_url, lease) as h, client(sqlite_url, lease) as v:
        held = contended_holder(a, h, store, "dead")
        process = ctx.Process(target=wait_for_lock, args=(sqlite_url, "dead", lease))
        process.start()
        try:
            wait_until(lambda: len(tickets(store, "dead")()) == 2, "the waiter process queued", 60)
            dead_ticket = tickets(store, "dead")()[1]
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)
            process.join(30)
            v_waiting = Waiting(v, "dead")
            wait_until(lambda: len(tickets(store, "dead")()) == 3, "V queued", 30)
            assert held.release() is True
            record = holder(store, "dead")
            assert record is not None and record.ticket == dead_ticket, "the dead waiter was handed the lock"
            assert record.token == held.fencing_token + 1
            stop = threading.Event()

            def scan() -> None:
                while not stop.is_set():
                    watcher.scan()
                    stop.wait(0.05)

            scanner = threading.Thread(target=scan)
            scanner.start()
            try:
                lock = v_waiting.result(timeout=60)
            finally:
                stop.set()
                scanner.join()
            assert watcher.revocations >= 1
            assert lock.fencing_token == record.token + 1
            lock.release()
        finally:
            if process.is_alive():
                process.kill()
            process.join(10)


def test_a_holder_granted_on_its_first_look_releases_as_before(store: CellStore, sqlite_url: str) -> None:
    """Uncontended holders do not read the queue at release (that would slow every quiet
    acquire + release): one round trip, the record and the queue cell together; the waiter woken
    then sends its own grant at once, as before issue 27."""
    with client(sqlite_url) as a, client(sqlite_url) as b:
        lock = a.get_lock("quiet")
        assert not lock.waited
        waiting = Waiting(b, "quiet")
        wait_queued(tickets(store, "quiet"), 2, [a.clock, b.clock], "B queued")
        assert lock.release() is True
        assert lock.release_counts.ops.get("read_row", 0) == 0
        assert lock.release_counts.round_trips == 1
        got = waiting.result()
        assert compare_and_sets(got.store_op_counts) == 1
        got.release()


def test_a_waiter_that_leaves_checks_for_a_hand_over_with_one_plain_read_and_one_serial(
    store: CellStore, sqlite_url: str
) -> None:
    """A waiter that takes hand-overs and leaves checks in the background whether a release handed
    it the lock: at once with a plain read (a hand-over that landed is committed), and
    ``HAND_ON_RECHECK_S`` (≤ lease / 3) later at SERIAL, which settles one in flight — one Paxos
    round per waiter that leaves, not two. Nothing was handed to it here: the holder keeps the lock."""
    faulty = FaultyStore(open_store(sqlite_url))
    reads: list[bool] = []  # the reads of the row off the caller's thread: the background checks
    faulty.arm(
        "read_versioned",
        after=lambda row, serial=True, **k: reads.append(serial),
        when=lambda row, serial=True, **k: (
            row == "leaves" and threading.current_thread() is not threading.main_thread()
        ),
        times=100,
    )
    with client(sqlite_url) as a, client(sqlite_url, store=faulty) as w:
        held = a.get_lock("leaves")
        with pytest.raises(LockTimeout):
            w.get_lock("leaves", timeout=0.5)
        wait_until(lambda: len(reads) >= 2, "both background checks")
        time.sleep(0.2)  # (nothing more comes: a third read would show here)
        assert reads == [False, True]
        assert held.release() is True
