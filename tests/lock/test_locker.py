"""Lock client behaviour on the real SQLite store: try/timeout/cancel cleanup, loss, asyncio,
bad input, tombstone-safe head reads, and property tests for tickets and lock ids."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockclient import (
    CellStore,
    FencedResource,
    InvalidLockId,
    LockCancelled,
    LockLost,
    LockNotOwned,
    LockTimeout,
    RemoteLock,
    RemoteLocker,
    StaleFencingToken,
    open_store,
)
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN
from lockclient.lockid import MAX_LOCK_ID_BYTES, make_owner, make_ticket, ticket_time, validate_lock_id
from lockclient.store import Table
from lockclient.watermark import WINDOW_US, parse_marks
from tests.support.faulty import FaultyStore
from tests.support.waiting import wait_until


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5) as lk:
        yield lk


def other_locker(sqlite_url: str) -> RemoteLocker:
    """A second, independent client (own store connection, own clock, own renewer)."""
    return RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True)


def assert_only(locker: RemoteLocker, lock_id: str, owners: set[str]) -> None:
    status = locker.status(lock_id)
    assert set(status.holders) <= owners
    assert {q.owner for q in status.queue} == owners
    assert set(status.leases) == owners


def test_get_lock_is_a_context_manager_with_a_fencing_token(locker: RemoteLocker) -> None:
    with locker.get_lock("account:42") as lock:
        assert lock.held and lock.fencing_token == 1 and lock.thread_id == lock.owner
        assert locker.status("account:42").holders == [lock.owner]
    assert not lock.held
    with locker.get_lock("account:42") as again:
        assert again.fencing_token == 2
    assert_only(locker, "account:42", set())
    with pytest.raises(LockNotOwned):
        lock.__enter__()  # a released lock never runs a body again
    assert lock.release() is False  # idempotent


def test_try_get_lock_returns_none_at_once_and_leaves_nothing(locker: RemoteLocker, sqlite_url: str) -> None:
    holder = locker.get_lock("sms:42")
    with other_locker(sqlite_url) as other:
        for _ in range(20):
            before = other.store  # same store object; count ops through the metric on the lock instead
            assert other.try_get_lock("sms:42") is None
            assert before is other.store
        assert_only(locker, "sms:42", {holder.owner})
        holder.release()
        got = other.try_get_lock("sms:42")
        assert got is not None and got.fencing_token == 2
        got.release()
    assert_only(locker, "sms:42", set())


def test_try_get_lock_does_not_jump_the_queue(locker: RemoteLocker, sqlite_url: str) -> None:
    holder = locker.get_lock("q")
    with other_locker(sqlite_url) as waiter_side, other_locker(sqlite_url) as trier:
        waiting = threading.Thread(target=lambda: waiter_side.get_lock("q", timeout=30).release())
        waiting.start()
        while len(locker.status("q").queue) < 2:
            threading.Event().wait(0.01)
        holder.release()
        # The queued waiter is first in line: try_get_lock must not take the lock from it.
        attempt = trier.try_get_lock("q")
        if attempt is not None:  # only possible after the waiter already came and went
            attempt.release()
        waiting.join(timeout=30)
        assert not waiting.is_alive()
    assert_only(locker, "q", set())


def test_timed_out_get_lock_leaves_nothing_behind(locker: RemoteLocker, sqlite_url: str) -> None:
    holder = locker.get_lock("busy")
    with other_locker(sqlite_url) as other:
        with pytest.raises(LockTimeout) as info:
            other.get_lock("busy", timeout=0.3)
        assert info.value.lock_id == "busy" and "busy" in str(info.value)
        assert_only(locker, "busy", {holder.owner})
        with pytest.raises(LockTimeout):
            other.get_lock("busy", timeout=0)
    holder.release()
    assert_only(locker, "busy", set())


def test_pending_get_lock_can_be_cancelled(locker: RemoteLocker, sqlite_url: str) -> None:
    holder = locker.get_lock("c")
    cancel = threading.Event()
    errors: list[BaseException] = []
    with other_locker(sqlite_url) as other:

        def wait() -> None:
            try:
                other.get_lock("c", cancel=cancel)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=wait)
        t.start()
        while len(locker.status("c").queue) < 2:
            threading.Event().wait(0.01)
        cancel.set()
        t.join(timeout=10)
        assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], LockCancelled)
    assert_only(locker, "c", {holder.owner})
    holder.release()


def test_in_process_waiters_are_served_in_order(locker: RemoteLocker) -> None:
    order: list[int] = []
    first = locker.get_lock("fifo")
    threads = []

    def take(i: int) -> None:
        with locker.get_lock("fifo", timeout=30):
            order.append(i)

    for i in range(4):
        t = threading.Thread(target=take, args=(i,))
        t.start()
        while len(locker.status("fifo").queue) < i + 2:  # wait until queued, so arrival order is known
            threading.Event().wait(0.005)
        threads.append(t)
    first.release()
    for t in threads:
        t.join(timeout=30)
    assert order == [0, 1, 2, 3]


def test_holder_whose_renewals_fail_sees_lost_before_anyone_could_revoke(tmp_path: Path) -> None:
    db = tmp_path / "cells.db"
    store = open_store(f"sqlite:///{db}?busy_timeout=0.05")
    locker = RemoteLocker(store, lease=1.0)
    lock = locker.get_lock("fragile")
    reasons: list[str] = []
    lock.on_lost(reasons.append)
    record_before = store.read_versioned("fragile")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # the store is unavailable to the holder's renewals
    try:
        assert lock.lost.wait(timeout=10), "the holder never noticed it could not renew"
        # Its lease record is still there, unrevoked: the holder gave up on its own first.
        assert store.read_versioned("fragile")[HOLDER_COLUMN] is not None
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert "no renewal succeeded" in (lock.lost_reason or "")
    for _ in range(100):
        if reasons:
            break
        threading.Event().wait(0.01)
    assert reasons and "renewal" in reasons[0]
    assert set(record_before) == {FENCE_COLUMN, HOLDER_COLUMN}
    with pytest.raises(LockLost), lock:
        pass
    assert lock.release() is False
    locker.close()
    store.close()


def test_exit_raises_lock_lost_only_if_the_body_did_not_raise(locker: RemoteLocker, store: CellStore) -> None:
    lock = locker.get_lock("x")
    with pytest.raises(LockLost), lock:
        store.compare_and_set("x", {HOLDER_COLUMN: store.read_versioned("x")[HOLDER_COLUMN]}, {HOLDER_COLUMN: None})
        lock._lease.renew(store)  # the next renewal finds the record revoked
        assert lock.lost.is_set() and lock.lost_reason == "lease revoked"
    lock2 = locker.get_lock("y")
    with pytest.raises(ZeroDivisionError), lock2:
        lock2._lease.mark_lost("test")
        _ = 1 / 0


def test_max_hold_stops_renewing_a_hung_holder(store: CellStore) -> None:
    with RemoteLocker(store, lease=0.6, max_hold=0.3) as locker:
        lock = locker.get_lock("hung")
        assert lock.lost.wait(timeout=10)
        assert "no renewal" in (lock.lost_reason or "")
        lock.release()


def test_fenced_resource_rejects_stale_tokens(locker: RemoteLocker, store: CellStore) -> None:
    guard = FencedResource(store, "ledger")
    first = locker.get_lock("acct")
    t1 = first.fencing_token
    first.release()
    second = locker.get_lock("acct")
    guard.write(second.fencing_token, "balance", "100")
    with pytest.raises(StaleFencingToken) as info:
        guard.write(t1, "balance", "0")
    assert info.value.highest == second.fencing_token
    assert guard.read("balance") == "100"
    guard.write(second.fencing_token, "balance", "90")  # the current holder may write again
    assert guard.highest_token() == second.fencing_token
    with pytest.raises(ValueError):
        guard.write(0, "balance", "x")
    second.release()


def test_bad_lock_ids_and_timeouts_are_clear_errors_before_the_store(locker: RemoteLocker) -> None:
    for bad in ["", "a\x00b", "tab\there", "x" * (MAX_LOCK_ID_BYTES + 1), "é" * 129, "\ud800"]:
        with pytest.raises(InvalidLockId):
            locker.get_lock(bad)
        with pytest.raises(InvalidLockId):
            locker.try_get_lock(bad)
    with pytest.raises(InvalidLockId):
        locker.get_lock(42)  # type: ignore[arg-type]
    for timeout in (-1, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            locker.get_lock("ok", timeout=timeout)
    with pytest.raises(TypeError, match="timeout"):
        locker.get_lock("ok", timeout="5")  # type: ignore[arg-type]
    assert locker.status("ok").queue == []


def test_asyncio_twin_and_cancellation(locker: RemoteLocker, sqlite_url: str) -> None:
    async def scenario() -> None:
        async with await locker.aget_lock("async") as lock:
            assert lock.held
            assert await locker.atry_get_lock("async") is None
            other = other_locker(sqlite_url)
            pending = asyncio.create_task(other.aget_lock("async"))
            while len(locker.status("async").queue) < 2:  # noqa: ASYNC110 - polling the store, not an event
                await asyncio.sleep(0.01)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            assert {q.owner for q in locker.status("async").queue} == {lock.owner}
            other.close()
        # Two tasks of one loop contend: ownership is per task (the lock object), not per thread.
        held: list[str] = []

        async def task(name: str) -> None:
            async with await locker.aget_lock("shared", timeout=10):
                held.append(f"{name}+")
                await asyncio.sleep(0.02)
                held.append(f"{name}-")

        await asyncio.gather(task("a"), task("b"))
        assert held in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])

    asyncio.run(scenario())
    assert_only(locker, "async", set())


def test_head_read_skips_100k_tombstones_below_the_watermark(locker: RemoteLocker, sqlite_url: str) -> None:
    """DESIGN.md §5: reads of the queue head stay cheap after many acquisitions. 100k released
    tickets are written straight into the file (setup only), then SQLite's VM steps are counted."""
    base = locker.clock.now_us() - 3 * WINDOW_US
    db = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO cells (cf, row, col, value, ts, dead, expires_at, applied_at) VALUES (?,?,?,NULL,?,1,NULL,0)",
        ((str(Table.QUEUE), "hot", make_ticket(base + i, "old"), base + i) for i in range(100_000)),
    )
    conn.execute("COMMIT")
    # The lock was granted 100k times (that is where its tombstones came from): its fencing counter says so.
    assert locker.store.compare_and_set("hot", {FENCE_COLUMN: None}, {FENCE_COLUMN: "100000|old"}).applied
    with locker.get_lock("hot"):  # acquiring publishes the watermark (ticket - window), in the background
        pass
    deadline = time.monotonic() + 10
    while parse_marks(locker.store.read_versioned("hot"))[0] == 0:
        assert time.monotonic() < deadline, "the watermark was never published"
        threading.Event().wait(0.01)
    fresh = other_locker(sqlite_url)  # a new process: knows nothing, reads the stored watermark
    published, proposed = parse_marks(fresh.store.read_versioned("hot"))
    start = make_ticket(published, "")
    assert ticket_time(start) >= base + 100_000 - 1 - WINDOW_US
    assert proposed >= published

    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    query = "SELECT col FROM cells WHERE cf=? AND row=? AND col>=? AND dead=0 ORDER BY col LIMIT 1"
    conn.execute(query, (str(Table.QUEUE), "hot", "")).fetchall()
    from_start, steps[0] = steps[0], 0
    conn.execute(query, (str(Table.QUEUE), "hot", start)).fetchall()
    from_watermark = steps[0]
    conn.close()
    assert from_start > 1000 * max(from_watermark, 1), (from_start, from_watermark)
    with fresh.get_lock("hot") as lock:
        assert lock.store_ops <= 12
    fresh.close()


@given(st.integers(0, 10**19), st.integers(0, 10**19), st.text(min_size=1), st.text(min_size=1))
def test_tickets_order_by_time_then_owner(t1: int, t2: int, a: str, b: str) -> None:
    x, y = make_ticket(t1, a), make_ticket(t2, b)
    if t1 != t2:
        assert (x < y) == (t1 < t2)
    else:
        assert (x < y) == (a < b)
    assert ticket_time(x) == t1
    assert x.encode() < y.encode() or x == y or (x > y)  # byte order == code-point order


@given(st.text(min_size=1).filter(lambda s: len(s.encode("utf-8", "surrogatepass")) <= MAX_LOCK_ID_BYTES))
@settings(max_examples=300)
def test_lock_id_validation_accepts_exactly_printable_text(lock_id: str) -> None:
    has_control = any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) <= 0xDFFF for c in lock_id)
    # Look-alikes are refused too (issue 16): non-NFC text, format/separator characters, spaces
    # other than U+0020, unassigned code points.
    look_alike = not unicodedata.is_normalized("NFC", lock_id) or any(
        unicodedata.category(c) in ("Cf", "Zl", "Zp", "Cn") or (unicodedata.category(c) == "Zs" and c != " ")
        for c in lock_id
    )
    if has_control or look_alike:
        with pytest.raises(InvalidLockId):
            validate_lock_id(lock_id)
    else:
        assert validate_lock_id(lock_id) == lock_id


@given(st.text(st.characters(max_codepoint=0x7F), min_size=1, max_size=MAX_LOCK_ID_BYTES + 2))
@settings(max_examples=300)
def test_ascii_lock_ids_take_the_fast_path_with_the_same_verdicts(lock_id: str) -> None:
    """ASCII ids are checked in C (``isprintable``); the verdict is the per-character rules'."""
    refused = any(ord(c) < 32 or ord(c) == 0x7F for c in lock_id) or len(lock_id) > MAX_LOCK_ID_BYTES
    if refused:
        with pytest.raises(InvalidLockId):
            validate_lock_id(lock_id)
    else:
        assert validate_lock_id(lock_id) == lock_id


def test_owners_are_unique_and_readable() -> None:
    owners = {make_owner() for _ in range(1000)}
    assert len(owners) == 1000
    assert all("MainThread" in o for o in owners)


def test_local_wakeups_reach_exactly_the_watcher_of_what_was_removed() -> None:
    from lockclient.wake import TAKEN, LocalWakeups, Watch

    if not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    cell = Watch("gone", make_ticket(5, "a"))
    holder = Watch("holder", "host.1.t.abc")
    listener = LocalWakeups.listen("wl", cell)
    assert listener is not None
    assert LocalWakeups.listen("wl", cell) is TAKEN, "one watcher per name: a second bind is told it looked too early"
    other = LocalWakeups.listen("wl", holder)
    assert other is not None
    try:
        assert not listener.wait(0.01)
        assert LocalWakeups.announce("wl", gone=cell.value) is True
        assert listener.wait(1.0) and not other.wait(0.01)
        assert LocalWakeups.announce("wl", released="host.1.t.abc") is True
        assert other.wait(1.0) and not listener.wait(0.01)
        assert LocalWakeups.announce("another-lock", gone=cell.value) is False  # nobody watches that
        cancel = threading.Event()
        cancel.set()
        started = time.monotonic()
        assert not listener.wait(5.0, cancel) and time.monotonic() - started < 1.0
    finally:
        listener.close()
        other.close()
    assert LocalWakeups.announce("wl", gone=cell.value) is False


def test_waiters_are_served_when_local_wakeups_are_unavailable(
    locker: RemoteLocker, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lockclient.wake import LocalWakeups

    monkeypatch.setattr(LocalWakeups, "available", False)
    done: list[RemoteLock] = []
    with other_locker(sqlite_url) as other:
        first = locker.get_lock("nolocal")
        t = threading.Thread(target=lambda: done.append(other.get_lock("nolocal", timeout=20)))
        t.start()
        while len(locker.status("nolocal").queue) < 2:
            threading.Event().wait(0.01)
        first.release()
        t.join(timeout=20)
        assert [lock.fencing_token for lock in done] == [2]
        assert done[0].release() is True


class RecordingWaker:
    """A leasewatch stand-in that only records what it was asked (and never answers early)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def wait_for_change(self, lock_id: str, watch: object, timeout: float) -> bool:
        self.asked.append(f"wait {lock_id}")
        return False

    def watch_in_background(self, lock_id: str, watch: object, timeout: float, on_change: object) -> bool:
        self.asked.append(f"watch {lock_id}")
        return False

    def notify(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_waiter_whose_watch_is_taken_looks_again_instead_of_long_polling(
    locker: RemoteLocker, sqlite_url: str
) -> None:
    """Two waiters on one machine watching the same queue cell means one of them looked while the
    other's cell was being written (it sits between them). The late one used to fall back to a
    leasewatch long-poll for a change that is not its to wait for (~10 % of waits at P = 5 in
    bench/peers, which made wake-ups slower than polling); it now looks again after its back-off."""
    from lockclient.wake import TAKEN, LocalWakeups, Watch

    if not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    holder = locker.get_lock("taken")
    squatter = LocalWakeups.listen("taken", Watch("gone", holder.ticket))  # the waiter it did not see
    assert squatter is not None and squatter is not TAKEN
    waker = RecordingWaker()
    done: list[RemoteLock] = []
    with RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True, waker=waker) as other:
        t = threading.Thread(target=lambda: done.append(other.get_lock("taken", timeout=20)))
        t.start()
        try:
            while len(locker.status("taken").queue) < 2:
                threading.Event().wait(0.01)
            threading.Event().wait(0.2)  # several looks and waits on the taken watch
        finally:
            squatter.close()
            holder.release()
            t.join(timeout=20)
        assert [lock.fencing_token for lock in done] == [holder.fencing_token + 1]
        done[0].release()
    assert waker.asked == [], "a waiter whose watch was taken long-polled leasewatch"


def counting_looks(store: CellStore, lock_id: str, *, times: int) -> tuple[FaultyStore, threading.Semaphore]:
    """``store`` wrapped so that the returned semaphore is released at the end of each of the next
    ``times`` looks at ``lock_id``. A look ends with its plain read of the lock's lease row — except
    the enqueue's look of a process's first use of the lock, which sends a speculative grant instead
    (issue 27) and takes the row from its answer: that look ends with the grant's compare-and-set,
    the first one of the wrapped store."""
    faulty = FaultyStore(store)
    looked = threading.Semaphore(0)
    faulty.arm("compare_and_set", after=lambda *a, **k: looked.release(), when=lambda row, *a, **k: row == lock_id)
    faulty.arm(
        "read_versioned",
        after=lambda *a, **k: looked.release(),
        when=lambda row, **k: row == lock_id and k.get("serial") is False,
        times=times - 1,
    )
    return faulty, looked


def test_the_first_in_line_woken_by_the_release_it_watched_is_granted_without_looking_again(
    locker: RemoteLocker, store: CellStore
) -> None:
    """Issue 14's hand-over: the waiter just behind the holder is woken by the holder's release
    (a datagram to the name of the cell it watches) and sends the grant's compare-and-set at once,
    conditional on the fencing counter its last look read — one Paxos round, no queue read. Its
    FIFO judgement is that last look (``looked_at``), taken while the holder still held."""
    from lockclient.wake import LocalWakeups

    if not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    # The enqueue's overlapped look, then one sequential look (which completes the watermark
    # handshake): each ends with its read of the lock's lease row.
    faulty, looked = counting_looks(store, "handover", times=2)
    holder = locker.get_lock("handover")
    done: list[RemoteLock] = []
    # poll_max 60 s: once bound, the waiter's only way to wake in time is the release's datagram.
    with RemoteLocker(faulty, lease=5, poll_max=60) as other:
        t = threading.Thread(target=lambda: done.append(other.get_lock("handover", timeout=30)))
        t.start()
        try:
            assert looked.acquire(timeout=20) and looked.acquire(timeout=20), "the waiter never looked twice"
            before = dict(faulty.calls)
            released_at = time.monotonic()
            holder.release()
        finally:
            t.join(timeout=30)
        after = dict(faulty.calls)
        assert done, "the waiter was not granted"
        lock = done[0]
        assert lock.fencing_token == holder.fencing_token + 1 and lock.waited
        assert lock.looked_at is not None and lock.looked_at < released_at, "FIFO is judged by the look before the wait"
        spent = {m: after.get(m, 0) - before.get(m, 0) for m in set(after) | set(before)}
        cas_and_reads = (spent.get("compare_and_set"), spent.get("read_row", 0), spent.get("read_versioned", 0))
        assert cas_and_reads == (1, 0, 0), spent
        lock.release()


def test_a_hand_over_grant_refused_because_someone_else_took_the_lock_looks_again(
    locker: RemoteLocker, store: CellStore
) -> None:
    """The wake-up is only a hint: between the release and the waiter's compare-and-set another
    contender (one whose queue cell its last look could not see) takes the lock. The grant is
    refused by the fencing counter, nobody is granted twice, and the waiter looks again, waits for
    that holder and is granted after it."""
    from lockclient.lease import HolderRecord, format_fence
    from lockclient.wake import LocalWakeups

    if not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    faulty, looked = counting_looks(store, "stolen", times=2)
    holder = locker.get_lock("stolen")
    intruder = HolderRecord("zz-intruder", 1, 5.0, make_ticket(1, "zz-intruder"), holder.fencing_token + 1).encode()

    def intruder_takes_it(*args: object, **kwargs: object) -> None:
        applied = store.compare_and_set(
            "stolen",
            {HOLDER_COLUMN: None, FENCE_COLUMN: format_fence(holder.fencing_token, holder.owner)},
            {HOLDER_COLUMN: intruder, FENCE_COLUMN: format_fence(holder.fencing_token + 1, "zz-intruder")},
        ).applied
        assert applied

    done: list[RemoteLock] = []
    with RemoteLocker(faulty, lease=5, poll_max=60) as other:
        t = threading.Thread(target=lambda: done.append(other.get_lock("stolen", timeout=30)))
        t.start()
        try:
            assert looked.acquire(timeout=20) and looked.acquire(timeout=20), "the waiter never looked twice"
            faulty.arm("compare_and_set", before=intruder_takes_it, when=lambda row, *a, **k: row == "stolen")
            holder.release()
            wait_until(lambda: other.status("stolen").holders == ["zz-intruder"], "the intruder to hold")
            threading.Event().wait(0.2)  # the waiter's refused grant and its next look
            assert not done, "granted while the intruder held the lock"
        finally:
            store.compare_and_set("stolen", {HOLDER_COLUMN: intruder}, {HOLDER_COLUMN: None})
            LocalWakeups.announce("stolen", released="zz-intruder")
            t.join(timeout=30)
        assert done and done[0].fencing_token == holder.fencing_token + 2
        done[0].release()


def test_a_waiter_behind_the_holder_is_not_handed_the_lock_over_a_cell_ahead_of_the_holders(
    locker: RemoteLocker, store: CellStore
) -> None:
    """The holder keeps its queue cell until it releases, so the waiter right behind it watches
    that cell. A contender whose ticket sorts *below the holder's* (it enqueued while the holder,
    granted on its first look, skipped the commit wait) is next once the holder goes. The waiter
    behind the holder, woken by the release, must not grant itself without a look: it looks,
    finds that cell ahead and waits for it. (With a two-cell look the waiter could not see it and
    granted itself over it; bench/peers saw one contender overtaken by 16 later tickets.)"""
    from lockclient.lease import WaiterRecord
    from lockclient.wake import LocalWakeups

    if not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    lock_id = "behind-holder"
    holder = locker.get_lock(lock_id)
    early_owner = make_owner("early")
    early = make_ticket(ticket_time(holder.ticket) - 1, early_owner)
    store.put(Table.QUEUE, lock_id, early, WaiterRecord(early_owner, 1, 30.0).encode(), timestamp=1)

    faulty, looked = counting_looks(store, lock_id, times=3)
    done: list[RemoteLock] = []
    with RemoteLocker(faulty, lease=5, poll_max=60) as other:
        t = threading.Thread(target=lambda: done.append(other.get_lock(lock_id, timeout=30)))
        t.start()
        try:
            # The enqueue's overlapped look, then a sequential one (the watermark handshake):
            # it sees the holder's cell just ahead of its own, and waits for it to go.
            assert looked.acquire(timeout=20) and looked.acquire(timeout=20), "the waiter never looked twice"
            cas_before = faulty.calls.get("compare_and_set", 0)
            holder.release()
            assert looked.acquire(timeout=20), "woken by the release, the waiter did not look again"
            threading.Event().wait(0.2)  # time enough for a grant it should not send
            assert faulty.calls.get("compare_and_set", 0) == cas_before, "the waiter tried to take the lock"
            assert not done and other.status(lock_id).holders == [], "granted over an earlier ticket"
        finally:
            store.delete(Table.QUEUE, lock_id, early, timestamp=2)
            LocalWakeups.announce(lock_id, gone=early)
            t.join(timeout=30)
    assert done and done[0].fencing_token == holder.fencing_token + 1
    done[0].release()


@pytest.mark.parametrize("local_wakeups", [True, False], ids=["socket", "no-socket"])
def test_a_waiter_asks_leasewatch_in_the_background_with_a_socket_and_inline_without(
    locker: RemoteLocker, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, local_wakeups: bool
) -> None:
    """With its wake-up socket bound, a waiter that has waited past LOCAL_PATIENCE_S hands the
    leasewatch long-poll to the waker's own thread (its answer wakes the socket); with no socket
    it long-polls leasewatch itself, and only an answer that something changed ends its wait."""
    from lockclient.wake import LocalWakeups

    if local_wakeups and not LocalWakeups.available:
        pytest.skip("abstract Unix sockets are Linux-only")
    if not local_wakeups:
        monkeypatch.setattr(LocalWakeups, "available", False)
    lock_id = f"asks-{'socket' if local_wakeups else 'inline'}"
    holder = locker.get_lock(lock_id)
    waker = RecordingWaker()
    done: list[RemoteLock] = []
    with RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True, waker=waker) as other:
        t = threading.Thread(target=lambda: done.append(other.get_lock(lock_id, timeout=30)))
        t.start()
        try:
            asked = f"{'watch' if local_wakeups else 'wait'} {lock_id}"
            wait_until(lambda: asked in waker.asked, f"the waiter to ask leasewatch ({asked})", timeout=20)
        finally:
            holder.release()
            t.join(timeout=30)
        assert [lock.fencing_token for lock in done] == [holder.fencing_token + 1]
        done[0].release()
    assert set(waker.asked) == {asked}, waker.asked


def test_status_shows_each_waiters_lease_version_as_its_queue_cell_holds_it(locker: RemoteLocker) -> None:
    """A waiter's lease renewals count up in its queue cell; ``status()`` reports the count (as
    leasewatch's view does), the way it reports the holder's."""
    from lockclient.lease import WaiterRecord

    ticket = make_ticket(time.time_ns() // 1000, "waiter-elsewhere")
    locker.store.put(Table.QUEUE, "ver", ticket, WaiterRecord("waiter-elsewhere", 7, 5.0).encode(), timestamp=1)
    lease = locker.status("ver").leases["waiter-elsewhere"]
    assert (lease.version, lease.lease, lease.ticket, lease.holding) == (7, 5.0, ticket, False)


def test_a_release_nobody_here_waits_for_tells_leasewatch_off_the_callers_path(
    locker: RemoteLocker, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock held for a while (others may queue elsewhere) and released with no waiter on this
    machine to wake: leasewatch is told, by a keeper task (best effort: a failure is logged, as
    "notify leasewatch", and given up at once)."""
    import logging

    class NotifiedWaker(RecordingWaker):
        def __init__(self) -> None:
            super().__init__()
            self.notified: list[tuple[str, str | None, str | None]] = []

        def notify(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> None:
            self.notified.append((lock_id, gone, released))
            if lock_id == "told-fails":
                raise RuntimeError("injected: leasewatch is away")

    caplog.set_level(logging.WARNING)
    waker = NotifiedWaker()
    with RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True, waker=waker) as other:
        for lock_id in ("told", "told-fails"):
            lock = other.get_lock(lock_id)
            threading.Event().wait(0.05)  # held longer than a quiet hold (wake.QUIET_HOLD_S)
            lock.release()
            wait_until(lambda lock_id=lock_id: any(n[0] == lock_id for n in waker.notified), f"{lock_id}: told")
            assert [n for n in waker.notified if n[0] == lock_id] == [(lock_id, lock.ticket, lock.owner)]
        wait_until(lambda: other._services.keeper.pending_tasks() == 0, "the failed notice given up")
    given_up = [r.getMessage() for r in caplog.records if "deferred_task_given_up" in r.getMessage()]
    assert len(given_up) == 1 and "notify leasewatch" in given_up[0], given_up


def test_a_locker_keeps_no_waiter_leases_once_its_waits_are_over(locker: RemoteLocker, sqlite_url: str) -> None:
    """Every wait registers its queue cell's lease with the keeper; a grant (or a give-up) removes
    it — the keeper renews, and remembers, only waiters that still wait."""
    from lockclient import LockTimeout

    with other_locker(sqlite_url) as other:
        holder = locker.get_lock("waits")
        with pytest.raises(LockTimeout):
            other.get_lock("waits", timeout=0.2)  # waited, gave up
        done: list[RemoteLock] = []
        t = threading.Thread(target=lambda: done.append(other.get_lock("waits", timeout=30)))
        t.start()
        wait_until(lambda: len(locker.status("waits").queue) == 2, "the second waiter queued")
        holder.release()
        t.join(timeout=30)
        assert done and done[0].held  # waited, granted
        keeper = other._services.keeper
        with keeper._cond:
            assert not keeper._waiters, "waiter leases kept after their waits ended"
        done[0].release()
