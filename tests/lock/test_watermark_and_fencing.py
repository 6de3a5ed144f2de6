"""Finding 9 and the "also fix" list: the watermark stays sound when global time jumps, fenced
resources refuse an equal token from another holder and never share a row with a lock, the
lock paths use cluster-wide consistency unless told otherwise, and global time straight from a
shared store is refused unless allowed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from leasewatch.watcher import Watcher
from lockclient import (
    CellStore,
    ConfigurationError,
    FencedResource,
    RemoteLock,
    RemoteLocker,
    StaleFencingToken,
    StoreClock,
    open_store,
)
from lockclient.lease import FENCE_COLUMN
from lockclient.lockid import make_ticket, ticket_time
from lockclient.store import Table
from lockclient.store.base import Op, Pending, Put
from lockclient.watermark import HEAD, PROPOSED, WINDOW_US, parse_marks
from tests.support.faulty import FaultyStore
from tests.support.waiting import wait_until

S = 1_000_000


class JumpingClock:
    """Global time that a test moves by hand (a forward jump the guard allowed, or an
    unguarded StoreClock on a machine whose clock jumped)."""

    def __init__(self, now_us: int) -> None:
        self.value = now_us

    def now_us(self) -> int:
        return self.value

    def close(self) -> None:
        pass


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def hot_lock(store: CellStore, lock_id: str) -> None:
    """A lock granted many times already (its fencing counter says so): holders publish its
    watermark (lockclient/watermark.py EVERY_GRANTS)."""
    assert store.compare_and_set(lock_id, {FENCE_COLUMN: None}, {FENCE_COLUMN: "5000|earlier"}).applied


def hidden_cells(store: CellStore, lock_id: str) -> list[str]:
    """Live queue cells below the published watermark: invisible to everyone who reads from it."""
    published, _ = parse_marks(store.read_versioned(lock_id))
    return [c.column for c in store.read_row(Table.QUEUE, lock_id) if ticket_time(c.column) < published]


def test_a_ticket_taken_before_a_global_time_jump_is_never_hidden_below_the_watermark(store: CellStore) -> None:
    """Finding 9: A takes a ticket at T; global time jumps +60 s; B queues at T+60 s, is granted
    and publishes the watermark T+50 s — before A's queue cell lands (A was slow by a few ms of
    real time only, so the old local-clock check let it stay). A's cell was then below the
    watermark: others, status() and leasewatch no longer saw it while A saw itself first in line.
    Now A's first look finds the proposed watermark above its ticket and it queues again."""
    clock = JumpingClock(1_000_000 * S)
    faulty = FaultyStore(store)
    landed, go = threading.Event(), threading.Event()

    def a_is_slow(table: Table, row: str, column: str, *args: object, **kwargs: object) -> None:
        go.wait(10)

    hot_lock(store, "jump")
    faulty.arm("put", before=a_is_slow, when=lambda table, *a, **k: table == Table.QUEUE)
    a_side = RemoteLocker(faulty, clock, lease=5)
    b_side = RemoteLocker(store, clock, lease=5)
    granted: list[RemoteLock] = []
    a_thread = threading.Thread(target=lambda: granted.append(a_side.get_lock("jump", timeout=30)))
    a_thread.start()
    wait_until(lambda: faulty.calls.get("put", 0) >= 1, "A to take its ticket and start writing")
    first_ticket_time = clock.value
    clock.value += 60 * S  # the jump
    b = b_side.get_lock("jump")
    wait_until(lambda: parse_marks(store.read_versioned("jump"))[0] > 0, "B to publish the watermark")
    published, proposed = parse_marks(store.read_versioned("jump"))
    assert published > first_ticket_time and proposed >= published
    go.set()  # A's queue cell lands now, below the published watermark
    landed.set()
    # A must notice on its first look and queue again above the watermark; from then on no live
    # cell is hidden, and status() (which reads from the watermark) shows A waiting.
    wait_until(lambda: not hidden_cells(store, "jump"), "A to leave its hidden cell")
    wait_until(lambda: len(b_side.status("jump").queue) == 2, "A to wait visibly behind B")
    waiting = b_side.status("jump").queue[1]
    assert ticket_time(waiting.ticket) >= published
    b.release()
    a_thread.join(timeout=30)
    assert granted and granted[0].fencing_token == b.fencing_token + 1
    assert ticket_time(granted[0].ticket) > first_ticket_time, "A was granted on its hidden ticket"
    granted[0].release()
    a_side.close()
    b_side.close()


def test_the_published_watermark_never_hides_a_live_waiter_in_steady_use(store: CellStore) -> None:
    clock = JumpingClock(2_000_000 * S)
    hot_lock(store, "steady")
    with RemoteLocker(store, clock, lease=5) as locker:
        for _ in range(30):
            clock.value += 3 * S  # time moves on (a window every few grants)
            for _ in range(70):  # ...and the lock is busy: a publication needs 64 grants since the last
                locker.get_lock("steady").release()
            locker.get_lock("steady").release()
            assert not hidden_cells(store, "steady")
        # Publications run in the background, at most one per window of ticket time and per 64
        # grants: with this many grants per window it trails the newest ticket by at most two.
        wait_until(
            lambda: clock.value - WINDOW_US - parse_marks(store.read_versioned("steady"))[0] < 2 * WINDOW_US,
            "the watermark to follow the grants",
        )


def test_equal_tokens_from_different_holders_are_refused(store: CellStore) -> None:
    """Two datacenters granting one lock (lock_scope=datacenter), or a store that lost acknowledged
    writes, can hand two holders the same token: the resource accepts only the first of them."""
    guard = FencedResource(store, "ledger")
    guard.write(7, "balance", "100", holder="dc1-holder")
    guard.write(7, "balance", "90", holder="dc1-holder")  # the same holder may write again
    with pytest.raises(StaleFencingToken, match="already used by another holder"):
        guard.write(7, "balance", "0", holder="dc2-holder")
    with pytest.raises(StaleFencingToken):
        guard.write(7, "balance", "0")  # unnamed is "another holder" too
    with pytest.raises(StaleFencingToken, match="stale"):
        guard.write(6, "balance", "0", holder="old")
    guard.write(8, "balance", "80", holder="next")
    assert guard.read("balance") == "80" and guard.highest_token() == 8


def test_a_lock_id_never_shares_a_row_with_a_fenced_resource(store: CellStore) -> None:
    """A lock id such as 'fenced-resource:X' used to share its lease row with FencedResource("X"),
    and leasewatch then failed to decode that row and never revoked that lock."""
    guard = FencedResource(store, "X")
    guard.write(1, "k", "v")
    locker = RemoteLocker(store, lease=2)
    lock = locker.get_lock("fenced-resource:X")
    guard.write(2, "k", "w")
    locker._services.keeper.remove(lock._lease)  # the holder dies
    clock = [100.0]
    watcher = Watcher(store, grace=0.5, monotonic=lambda: clock[0])
    report = watcher.scan()
    assert not report.errors
    clock[0] += 2.6
    report = watcher.scan()
    assert not report.errors and report.revoked == 1
    assert guard.read("k") == "w" and guard.highest_token() == 2
    locker.close()


def test_lock_paths_use_cluster_wide_consistency_unless_opted_out() -> None:
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    from lockclient.store.cassandra import PROFILE_CAS, PROFILE_SERIAL, _ModernDialect, connect_cluster

    dialect = _ModernDialect("ks", None)
    routed = dialect.profiles("dc1", 5.0, local=False)
    assert routed[EXEC_PROFILE_DEFAULT].consistency_level == ConsistencyLevel.QUORUM
    assert routed[PROFILE_SERIAL].consistency_level == ConsistencyLevel.SERIAL
    assert routed[PROFILE_CAS].serial_consistency_level == ConsistencyLevel.SERIAL
    local = dialect.profiles("dc1", 5.0, local=True)
    assert local[EXEC_PROFILE_DEFAULT].consistency_level == ConsistencyLevel.LOCAL_QUORUM
    assert local[PROFILE_CAS].serial_consistency_level == ConsistencyLevel.LOCAL_SERIAL
    with pytest.raises(ConfigurationError, match="lock_scope=datacenter needs dc"):
        connect_cluster("cassandra://127.0.0.1:1/ks?lock_scope=datacenter")
    with pytest.raises(ConfigurationError, match="lock_scope"):
        connect_cluster("cassandra://127.0.0.1:1/ks?lock_scope=everywhere")


@pytest.mark.cassandra
def test_global_time_straight_from_a_shared_store_is_refused_unless_allowed(local_cassandra_url: str) -> None:
    """One skewed laptop without CHRONOLOCK_TIMESVC_URLS would drag global time forward for
    everyone sharing the store."""
    with open_store(local_cassandra_url) as shared:
        with pytest.raises(ConfigurationError, match="CHRONOLOCK_TIMESVC_URLS"):
            StoreClock(shared)
        StoreClock(shared, allow_shared=True).close()


def test_tickets_sort_by_time_first() -> None:
    assert make_ticket(5, "b") < make_ticket(6, "a")


class ReadsFirst(FaultyStore):
    """The enqueue's batch as a ring can answer it: the overlapped look's reads are served
    before our queue cell lands, and ``between`` runs in that gap (once)."""

    def __init__(self, inner: CellStore, between: Callable[[list[object]], None]) -> None:
        super().__init__(inner)
        self.between: Callable[[list[object]], None] | None = between

    def begin(self, ops: Sequence[Op]) -> Pending:
        results = self.execute_all(ops)
        return Pending(lambda: results)

    def execute_all(self, ops: Sequence[Op]) -> list[Any]:
        writes = [i for i, op in enumerate(ops) if isinstance(op, Put) and op.table == Table.QUEUE]
        if self.between is None or not writes or len(ops) < 2:
            return self.inner.execute_all(ops)
        between, self.between = self.between, None
        reads = [i for i in range(len(ops)) if i not in writes]
        results: list[Any] = [None] * len(ops)
        for i, result in zip(reads, self.inner.execute_all([ops[i] for i in reads]), strict=True):
            results[i] = result
        between(list(ops))
        for i, result in zip(writes, self.inner.execute_all([ops[i] for i in writes]), strict=True):
            results[i] = result
        return results


def test_a_grant_from_an_overlapped_look_still_completes_the_watermark_handshake(store: CellStore) -> None:
    """Issue 14 overlaps the first look with the enqueue (one round trip less). A publisher that
    raises the proposal and publishes the watermark in the gap — after our look read the row,
    before our cell landed — must not leave us holding the lock on a ticket below it (our cell
    hidden from everyone reading from the watermark): the grant is conditional on the proposal
    as read, fails, and a sequential look sends us to queue again above it."""
    clock = JumpingClock(1_000_000 * S)
    hot_lock(store, "gap")
    marks: list[int] = []

    def publisher_in_the_gap(ops: list[object]) -> None:
        ours = next(op for op in ops if isinstance(op, Put) and op.table == Table.QUEUE)
        mark = ticket_time(ours.column) + S  # a holder with a ticket 11 s later proposed - 10 s
        assert store.compare_and_set("gap", {PROPOSED: None}, {PROPOSED: str(mark)}).applied
        assert store.compare_and_set("gap", {HEAD: None}, {HEAD: f"{mark}|5000"}).applied
        marks.append(mark)
        clock.value += 60 * S  # global time moved on meanwhile (the jump that made it possible)

    with RemoteLocker(ReadsFirst(store, publisher_in_the_gap), clock, lease=5) as locker:
        lock = locker.get_lock("gap", timeout=10)
        assert marks, "the gap was not exercised"
        assert ticket_time(lock.ticket) >= marks[0], "granted on a ticket below the published watermark"
        assert not hidden_cells(store, "gap")
        lock.release()


def test_a_first_use_is_one_round_trip_and_one_paxos_round_after_the_index_entry(store: CellStore) -> None:
    """Issue 27: a lock id this process never used is guessed to have no row at all — the grant,
    conditional on that, rides with the enqueue and the look, as a re-take's does. The lock's index
    entry goes first, alone (``Acquisition.list_for_leasewatch``): two round trips, one Paxos round."""
    with RemoteLocker(store, lease=5) as locker:
        lock = locker.get_lock("brand-new")
        assert (lock.round_trips, lock.lwt_rounds) == (2, 1), lock.store_op_counts
        assert lock.fencing_token == 1 and not lock.waited
        assert "read_versioned" not in lock.store_op_counts, "the grant's answer is the look's lease row"
        lock.release()


def test_first_uses_of_ids_others_used_are_refused_guesses_until_the_process_stops_guessing(
    store: CellStore, sqlite_url: str
) -> None:
    """Issue 27: on an id another client used before, the guess "no row" is refused (a Paxos round
    beside the look) and the normal grant follows with the counter the refusal returned. Where that
    keeps happening the process stops guessing — an uncontended acquisition is then the plain path,
    two plain round trips (the index entry, then the enqueue and look) and one Paxos round — and
    probes again every 16th first use."""
    from lockclient.fairqueue import _FirstUse

    with RemoteLocker(store, lease=5) as mine, RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True) as other:
        ids = [f"shared-{i}" for i in range(_FirstUse.FIRST + _FirstUse.PROBE_EVERY)]
        for lock_id in ids:
            other.get_lock(lock_id).release()
        rounds = []
        for lock_id in ids:
            lock = mine.get_lock(lock_id)
            assert lock.fencing_token == 2 and not lock.waited
            rounds.append((lock.round_trips, lock.lwt_rounds))
            lock.release()
        guessed, refused = (3, 2), (3, 1)
        assert rounds[: _FirstUse.FIRST] == [guessed] * _FirstUse.FIRST, rounds
        probes = [i for i, r in enumerate(rounds) if r == guessed and i >= _FirstUse.FIRST]
        assert len(probes) == 1 and rounds.count(refused) == _FirstUse.PROBE_EVERY - 1, rounds
        # A lock this process did use is no first use: quiet, it is a re-take — listed lately, so
        # one round trip (lockclient.listing).
        again = mine.get_lock(ids[0])
        assert (again.round_trips, again.lwt_rounds) == (1, 1) and again.fencing_token == 3
        again.release()


def test_two_first_uses_of_one_new_id_are_granted_one_after_the_other(store: CellStore, sqlite_url: str) -> None:
    """Both guess that the row does not exist; the compare-and-set grants one of them. The other's
    guess is refused by the holder it finds, and it waits its turn: tokens 1 then 2."""
    with RemoteLocker(store, lease=5) as a, RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True) as b:
        first = a.get_lock("both-new")
        granted: list[RemoteLock] = []
        t = threading.Thread(target=lambda: granted.append(b.get_lock("both-new", timeout=30)))
        t.start()
        try:
            wait_until(lambda: len(a.status("both-new").queue) == 2, "the second first use to queue")
            assert not granted
        finally:
            first.release()
            t.join(30)
        assert first.fencing_token == 1 and granted and granted[0].fencing_token == 2 and granted[0].waited
        granted[0].release()


def test_a_first_use_that_finds_a_cell_ahead_gives_its_grant_back(store: CellStore) -> None:
    """A first use's grant applies on a new id (no row: the guess holds), but the look beside it
    finds a contender's queue cell ahead: the grant is given back before anyone saw it (token 1 is
    skipped, never used) and the acquisition waits for that contender (FIFO)."""
    from lockclient.lease import WaiterRecord

    with RemoteLocker(store, lease=30) as locker:
        early = make_ticket(1, "zz-early-contender")
        store.put(Table.QUEUE, "new-behind", early, WaiterRecord("zz-early-contender", 1, 30).encode(), timestamp=1)
        granted: list[RemoteLock] = []
        t = threading.Thread(target=lambda: granted.append(locker.get_lock("new-behind", timeout=30)))
        t.start()
        try:
            wait_until(
                lambda: (s := locker.status("new-behind")).fencing_token == 1 and not s.holders and len(s.queue) == 2,
                "the speculative first grant to be given back",
            )
            assert not granted, "granted past a queue cell written before it looked"
        finally:
            store.delete(Table.QUEUE, "new-behind", early, timestamp=2**53)
            t.join(30)
        assert granted and granted[0].fencing_token == 2 and granted[0].waited
        granted[0].release()


def test_retaking_a_quiet_lock_is_one_round_trip(store: CellStore) -> None:
    """Issue 14: a process that took and released a lock without contention sends the next grant
    with its enqueue — one round trip, one Paxos round (as the naive LWT lock, with the queue's
    order kept: see the next test). The lock was listed for leasewatch moments ago, so its index
    entry rides with the enqueue too (lockclient.listing)."""
    with RemoteLocker(store, lease=5) as locker:
        first = locker.get_lock("retake")
        first.release()
        again = locker.get_lock("retake")
        assert (again.round_trips, again.lwt_rounds) == (1, 1), again.store_op_counts
        assert again.fencing_token == first.fencing_token + 1 and not again.waited
        again.release()


def test_a_speculative_grant_that_finds_a_waiter_ahead_is_given_back(store: CellStore) -> None:
    """The grant sent with the enqueue cannot know the queue: when the look beside it finds a cell
    ahead (here a contender whose cell was written but who has not looked yet), the grant is given
    back before anyone saw it — its token is skipped, never used — and the acquisition waits its
    turn behind that cell."""
    from lockclient.lease import WaiterRecord

    with RemoteLocker(store, lease=30) as locker:
        first = locker.get_lock("spec")
        first.release()
        slow = make_ticket(ticket_time(first.ticket) + 1, "zz-slow-contender")
        store.put(Table.QUEUE, "spec", slow, WaiterRecord("zz-slow-contender", 1, 30).encode(), timestamp=1)
        granted: list[RemoteLock] = []
        t = threading.Thread(target=lambda: granted.append(locker.get_lock("spec", timeout=30)))
        t.start()
        try:
            wait_until(
                lambda: (
                    (s := locker.status("spec")).fencing_token == first.fencing_token + 1
                    and not s.holders
                    and len(s.queue) == 2
                ),
                "the speculative grant to be given back",
            )
            assert not granted, "granted past a queue cell written before it looked"
        finally:
            store.delete(Table.QUEUE, "spec", slow, timestamp=2**53)  # the slow contender withdraws
            t.join(30)
        assert granted and granted[0].fencing_token == first.fencing_token + 2 and granted[0].waited
        granted[0].release()


def test_a_speculative_grant_after_someone_else_took_the_lock_fails_and_the_normal_path_follows(
    store: CellStore, sqlite_url: str
) -> None:
    with RemoteLocker(store, lease=5) as locker, RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True) as b:
        locker.get_lock("moved").release()
        b.get_lock("moved").release()
        lock = locker.get_lock("moved")
        assert lock.fencing_token == 3 and not lock.waited
        assert lock.lwt_rounds == 2, "the guess (fencing counter as we left it) was sent and refused"
        lock.release()


def test_a_proposal_raised_between_the_enqueue_and_the_grant_of_an_overlapped_look_refuses_that_grant(
    store: CellStore,
) -> None:
    """The first look overlaps the enqueue, so it cannot finish the watermark handshake: its grant
    also expects ``~wm-proposed`` as read. A publisher that raises the proposal above our ticket in
    between makes that grant fail, and the acquisition queues again (a ticket above the proposal)
    instead of holding the lock with a ticket the raised watermark may hide."""
    from lockclient.lease import HOLDER_COLUMN, HolderRecord

    raised: list[int] = []

    def publisher_raises_the_proposal(row: str, expected: dict[str, Any], updates: dict[str, Any], **kw: Any) -> None:
        ticket = HolderRecord.decode(updates[HOLDER_COLUMN]).ticket
        proposal = ticket_time(ticket) + 1  # just above our ticket
        current = store.read_versioned(row).get(PROPOSED)
        assert store.compare_and_set(row, {PROPOSED: current}, {PROPOSED: f"{proposal}|publisher"}).applied
        raised.append(proposal)

    def is_grant(row: str, expected: dict[str, Any], updates: dict[str, Any], **kw: Any) -> bool:
        return row == "overlap" and expected.get(HOLDER_COLUMN, "x") is None and bool(updates.get(HOLDER_COLUMN))

    faulty = FaultyStore(store)
    faulty.arm("compare_and_set", before=publisher_raises_the_proposal, when=is_grant)
    with RemoteLocker(faulty, lease=30) as locker:
        lock = locker.get_lock("overlap", timeout=10)
        assert raised, "the grant's compare-and-set was not reached"
        assert ticket_time(lock.ticket) >= raised[0], "granted with a ticket below the raised proposal"
        lock.release()
