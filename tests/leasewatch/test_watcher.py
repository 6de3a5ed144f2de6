"""The watcher core on a real SQLite store with its monotonic clock injected (DESIGN.md §6)."""

from __future__ import annotations

import threading
import time

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, LockTimeout, RemoteLock, RemoteLocker
from lockclient.backoff import BACKOFF_INDEX_MARK
from lockclient.lease import HOLDER_COLUMN, WaiterRecord
from lockclient.listing import INDEX_KEPT_S
from lockclient.lockid import index_shard, make_ticket, ticket_time
from lockclient.store import Table
from tests.leasewatch.conftest import FakeMonotonic
from tests.support.faulty import FaultyStore


def watcher(store: CellStore, clock: FakeMonotonic, name: str = "w", grace: float = 1.0) -> Watcher:
    return Watcher(store, grace=grace, orphan_after=5.0, replica_id=name, monotonic=clock)


def stop_renewing(locker: RemoteLocker, lock: RemoteLock) -> None:
    """The holder "dies": its keeper no longer renews it (the process is otherwise untouched)."""
    locker._services.keeper.remove(lock._lease)


def wait_until(predicate: object, what: str, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.01)


def test_revokes_only_after_lease_plus_grace_of_observed_silence(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    stop_renewing(locker, lock)
    w = watcher(store, clock)
    assert w.scan().revoked == 0  # first sighting starts the clock
    clock.now += 4.9
    assert w.scan().revoked == 0  # 4.9 s < lease 4 + grace 1
    clock.now += 0.2
    report = w.scan()
    assert report.revoked == 1 and w.revocations == 1
    assert HOLDER_COLUMN not in store.read_versioned("L")
    assert store.get(Table.QUEUE, "L", lock.ticket) is None
    event = w.events[-1]
    assert event.holder and event.owner == lock.owner and event.by == "w"
    # The next contender gets the lock and a larger fencing token.
    with RemoteLocker(store, lease=4.0) as other, other.get_lock("L", timeout=5) as again:
        assert again.fencing_token == lock.fencing_token + 1
    lock._lease.renew(store)  # the dead holder wakes up: its renewal finds the record revoked
    assert lock.lost.is_set() and lock.lost_reason == "lease revoked"
    assert lock.release() is False
    locker.close()


def test_renewing_holders_are_never_revoked_even_by_a_watcher_that_was_paused(
    store: CellStore, clock: FakeMonotonic
) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    w = watcher(store, clock)
    w.scan()
    # The watcher is paused for 3 leases; the holder keeps renewing meanwhile.
    for _ in range(3):
        lock._lease.renew(store)
    clock.now += 12.0
    assert w.scan().revoked == 0  # the value changed: the clock restarts
    # Worse: the watcher observed, then paused before acting; the holder renewed in between.
    stale_value = store.read_versioned("L")[HOLDER_COLUMN]
    lock._lease.renew(store)
    assert not w._revoke_holder("L", stale_value, "test", None)
    assert not lock.lost.is_set()
    lock.release()
    locker.close()


def test_a_stalled_read_is_stamped_when_it_completes(store: CellStore, clock: FakeMonotonic) -> None:
    """Finding 1: the watcher took `now` before reading; a read that stalled returned a value
    written during the stall, stamped too early. Schedule: lease 2 s, grace 0.5 s; the
    watcher's read stalls 1.2 s, during which the holder renews (its last success) and
    dies. The revocation must not come before 1.7 + 2 + 0.5 = 4.2 s on the watcher's clock."""
    faulty = FaultyStore(store)
    locker = RemoteLocker(store, lease=2.0)
    lock = locker.get_lock("stall")
    stop_renewing(locker, lock)
    w = watcher(faulty, clock, grace=0.5)
    clock.now = 0.0
    w.scan()  # t = 0: first sighting of v1

    def renew_during_the_stall(*args: object, **kwargs: object) -> None:
        clock.now += 1.2  # the read stalls...
        lock._lease.renew(store)  # ...and the holder's last renewal lands meanwhile

    clock.now = 0.5
    # The scan reads every lease row in one bulk read: that read stalls.
    faulty.arm("read_versioned_many", before=renew_during_the_stall, when=lambda rows, **kw: "stall" in rows)
    w.scan()  # the read started at 0.5 and completed at 1.7 with v2
    assert faulty.calls["read_versioned_many"] == 2, "the schedule did not run"
    clock.now = 3.1  # 3.1 - 0.5 > 2.5: a watcher stamping at the read's start revokes here
    assert w.scan().revoked == 0, "revoked before the holder's own deadline"
    assert not lock.lost.is_set()
    clock.now = 4.3  # 4.3 - 1.7 > 2.5
    assert w.scan().revoked == 1
    locker.close()


def test_fresh_watcher_revokes_nothing_until_it_watched_a_full_lease(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=4.0)
    lock = locker.get_lock("L")
    stop_renewing(locker, lock)
    first = watcher(store, clock, "first")
    first.scan()
    clock.now += 3.0
    restarted = watcher(store, clock, "restarted")  # a new replica, or the same one after a restart
    assert restarted.scan().revoked == 0
    clock.now += 3.0  # 6 s after `first` saw it, 3 s after `restarted` did
    assert restarted.scan().revoked == 0
    assert first.scan().revoked == 1
    assert restarted.scan().revoked == 0  # idempotent: nothing left to revoke
    clock.now += 3.0
    assert restarted.scan().revoked == 0
    locker.close()


def test_two_watchers_revoke_each_dead_lease_exactly_once(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=2.0)
    dead = [locker.get_lock(f"dead-{i}") for i in range(3)]
    for lock in dead:
        stop_renewing(locker, lock)
    a, b = watcher(store, clock, "a"), watcher(store, clock, "b")
    a.scan()
    b.scan()
    clock.now += 3.5
    assert a.scan().revoked + b.scan().revoked == 3
    assert a.revocations + b.revocations == 3
    locker.close()


def test_a_dead_waiter_is_revoked_for_good_and_a_slow_one_queues_again(store: CellStore, clock: FakeMonotonic) -> None:
    """A waiter's lease is its queue cell. Revoked, it is deleted with a timestamp no later
    renewal can beat: a waiter that was only slow finds it gone and queues again."""
    locker = RemoteLocker(store, lease=2.0)
    holder = locker.get_lock("W")
    result: list[RemoteLock] = []
    waiting = threading.Thread(target=lambda: result.append(locker.get_lock("W", timeout=30)))
    waiting.start()
    wait_until(lambda: len(locker.status("W").queue) == 2, "the waiter to queue")
    waiter_cell = locker.status("W").queue[1]
    keeper = locker._services.keeper
    # The cell is written before the keeper starts renewing it: wait for that too.
    wait_until(
        lambda: any(lease.ticket == waiter_cell.ticket for lease in list(keeper._waiters)), "the waiter's renewals"
    )
    waiter_lease = next(lease for lease in list(keeper._waiters) if lease.ticket == waiter_cell.ticket)
    keeper.remove(waiter_lease)  # the waiter stops renewing (as if paused)
    w = watcher(store, clock)
    w.scan()
    clock.now += 3.1
    holder._lease.renew(store)  # the holder is alive (the fake clock ran ahead of its renewer)
    assert w.scan().revoked == 1
    event = w.events[-1]
    assert not event.holder and event.owner == waiter_cell.owner
    waiter_lease.renew(store, locker._services.timestamps.next)  # a late renewal...
    assert store.get(Table.QUEUE, "W", waiter_cell.ticket) is None  # ...cannot bring it back
    # The waiter notices at its next look and queues again, behind the holder.
    wait_until(
        lambda: any(q.ticket != waiter_cell.ticket for q in locker.status("W").queue[1:]), "the waiter to requeue"
    )
    holder.release()
    waiting.join(timeout=30)
    assert result and result[0].fencing_token == holder.fencing_token + 1
    result[0].release()
    locker.close()


def test_orphan_cells_are_cleared_and_the_lock_works_again(store: CellStore, clock: FakeMonotonic) -> None:
    # Cells nobody renews that are not leases: a baseline contender that crashed holding a
    # shadow cell and a main cell (no holder record), and a malformed queue cell.
    # Listed the way the baseline lists a lock id: leasewatch reads the baseline's rows for those.
    store.put(Table.INDEX, index_shard("orphaned"), "orphaned", BACKOFF_INDEX_MARK, timestamp=10)
    store.put(Table.BACKOFF_MAIN, "orphaned", "ghost", "", timestamp=100)
    store.put(Table.BACKOFF_SHADOW, "orphaned", "ghost2", "", timestamp=100)
    ticket = make_ticket(50, "ghost3")
    store.put(Table.QUEUE, "orphaned", ticket, "not a lease", timestamp=50)
    with RemoteLocker(store, lease=2.0) as locker:
        assert locker.try_get_lock("orphaned") is None  # blocked by the malformed queue cell
        w = watcher(store, clock)
        assert w.scan().orphans_cleared == 0
        clock.now += 5.5
        assert w.scan().orphans_cleared == 3
        assert store.read_row(Table.BACKOFF_MAIN, "orphaned") == []
        assert store.read_row(Table.BACKOFF_SHADOW, "orphaned") == []
        assert store.get(Table.QUEUE, "orphaned", ticket) is None
        got = locker.try_get_lock("orphaned")
        assert got is not None
        got.release()
        # The lock id, now without any state, leaves the index after the window (never sooner than
        # INDEX_KEPT_S: clients rely on an entry they wrote staying that long, lockclient.listing).
        w.scan()
        clock.now += 1.0  # global time now past the entry's stamp: the idle count starts
        w.scan()
        clock.now += max(5.5, INDEX_KEPT_S + 0.5)
        w.scan()
        assert store.get(Table.INDEX, index_shard("orphaned"), "orphaned") is None


def test_idle_index_deletion_never_hides_a_new_contender(store: CellStore, clock: FakeMonotonic) -> None:
    """Finding 4: the watcher decided a lock id was idle from one set of reads, then deleted the
    index cell with a later timestamp; a contender that listed the lock in between had its
    fresh entry deleted, and if it then died holding, it was never revoked. The deletion now
    uses the timestamp of the first idle sighting: it cannot shadow a newer entry."""
    faulty = FaultyStore(store)
    locker = RemoteLocker(store, lease=2.0)
    locker.get_lock("idle").release()
    w = watcher(faulty, clock)
    w.scan()
    clock.now += 1.0
    w.scan()  # first idle sighting with global time past the entry's stamp
    clock.now += max(5.5, INDEX_KEPT_S + 0.5)
    contender: list[RemoteLock] = []

    def contender_arrives(*args: object, **kwargs: object) -> None:
        if not contender:  # once: after the watcher's reads, before it touches the index entry
            contender.append(locker.get_lock("idle"))  # lists the lock again, queues, takes it

    for method in ("get", "delete"):
        faulty.arm(method, before=contender_arrives, when=lambda table, *a, **k: table == Table.INDEX)
    w.scan()  # decides "idle" from its reads, then the contender arrives, then it deletes
    assert contender, "the schedule did not run"
    assert store.get(Table.INDEX, index_shard("idle"), "idle") is not None, "the new entry was deleted"
    stop_renewing(locker, contender[0])  # ...and it dies holding
    w.scan()
    clock.now += 3.1
    assert w.scan().revoked == 1, "a dead holder of a lock id missing from the index is never revoked"
    with RemoteLocker(store, lease=2.0) as other:
        assert other.try_get_lock("idle") is not None
    locker.close()


def test_operator_revocation_and_lock_view(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=5.0)
    lock = locker.get_lock("ops")
    w = watcher(store, clock)
    w.scan()
    clock.now += 1.5
    view = w.view("ops")
    assert view.holders == [lock.owner] and view.fencing_token == 1 and view.head == lock.ticket
    assert view.leases[lock.owner].observed_age == pytest.approx(1.5)
    assert w.revoke_now("ops") == [lock.owner]
    lock._lease.renew(store)
    assert lock.lost.is_set()
    assert w.view("ops").holders == []
    locker.close()


def test_scan_cost_follows_live_locks_not_history(store: CellStore, clock: FakeMonotonic) -> None:
    with RemoteLocker(store, lease=2.0) as locker:
        for i in range(50):  # history: 50 lock ids used and released
            locker.get_lock(f"old-{i}").release()
        live = locker.get_lock("live")
        w = watcher(store, clock)
        assert w.scan().locks == 51
        clock.now += 1.0
        w.scan()  # global time past the entries' stamps: the idle count starts (lockclient.listing)
        live._lease.renew(store)  # the live holder renews while the (fake) time passes
        clock.now += max(5.5, INDEX_KEPT_S + 0.5)
        live._lease.renew(store)
        w.scan()  # idle lock ids leave the index after the window
        report = w.scan()
        assert report.locks == 1 and report.leases == 1
        live.release()


def test_two_watchers_racing_on_the_same_stale_value_revoke_once(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=2.0)
    lock = locker.get_lock("race")
    stop_renewing(locker, lock)
    raw = store.read_versioned("race")[HOLDER_COLUMN]
    a, b = watcher(store, clock, "a"), watcher(store, clock, "b")
    # Both observed the same version go stale and act at the same moment: one CAS wins.
    assert a._revoke_holder("race", raw, "stale", 3.0) is True
    assert b._revoke_holder("race", raw, "stale", 3.0) is False
    assert a.revocations + b.revocations == 1
    assert store.get(Table.QUEUE, "race", lock.ticket) is None
    locker.close()


def test_queue_cells_hold_waiter_leases(store: CellStore) -> None:
    with RemoteLocker(store, lease=3.0) as locker:
        lock = locker.get_lock("cells")
        cell = store.get(Table.QUEUE, "cells", lock.ticket)
        assert cell is not None
        record = WaiterRecord.decode(cell.value)
        assert record.owner == lock.owner and record.lease == 3.0
        lock.release()


# -- issue 15: looks that follow what is due, the due schedule, bulk revocation, pages ---------------


def test_a_dead_holder_is_revoked_at_its_deadline_not_at_the_next_scan(store: CellStore, clock: FakeMonotonic) -> None:
    """The due schedule: a lease whose deadline (stamp + lease + grace) comes before its lock's
    next look is re-read at that deadline exactly — the bound does not grow by a scan interval."""
    locker = RemoteLocker(store, lease=2.0)
    lock = locker.get_lock("due")
    stop_renewing(locker, lock)
    w = watcher(store, clock, grace=0.5)  # scan interval 1 s: looks at this lock every 1 s
    clock.now = 0.0
    w.scan()  # first sighting at 0: deadline 2.5
    clock.now = 1.0
    report = w.scan()
    assert report.looked == 1 and report.due == 1 and w.next_due() == pytest.approx(2.5)
    clock.now = 2.45
    assert w.check_due().revoked == 0  # not yet
    clock.now = 2.55  # the next scan would come at 3.0 at the earliest
    assert w.check_due().revoked == 1
    assert HOLDER_COLUMN not in store.read_versioned("due")
    assert w.events[-1].unchanged_for == pytest.approx(2.55)
    assert w.next_due() is None
    locker.close()


def test_the_due_check_re_reads_and_spares_a_lease_renewed_since(store: CellStore, clock: FakeMonotonic) -> None:
    locker = RemoteLocker(store, lease=2.0)
    lock = locker.get_lock("renewed")
    stop_renewing(locker, lock)
    w = watcher(store, clock, grace=0.5)
    clock.now = 0.0
    w.scan()
    clock.now = 1.0
    w.scan()
    lock._lease.renew(store)  # its last renewal lands after the scan, before the deadline
    clock.now = 2.6
    assert w.check_due().revoked == 0
    assert not lock.lost.is_set()
    assert w.view("renewed").leases[lock.owner].observed_age == pytest.approx(0.0)  # a fresh stamp
    clock.now = 5.2  # 2.6 + lease + grace, and past
    assert w.scan().revoked + w.check_due().revoked == 1
    locker.close()


def test_long_leases_are_looked_at_less_often_and_new_contenders_at_once(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """Look period = max(scan interval, lease / 10): 6 s for a 60 s lease. Every enqueue rewrites
    the lock's index entry, so a new contender is looked at by the very next scan anyway.

    An entry is stamped with the upper end of global time's interval: until global time has passed
    that stamp, a later contender's entry may be stamped below it and not change it, so the lock is
    looked at every scan until then, and at the scan after (as after a change). Here the watcher's
    clock moves 1 s per scan, so global time passes the stamps at the second scan: three looks."""
    with RemoteLocker(store, lease=60.0) as locker:
        held = [locker.get_lock(f"long-{i}") for i in range(5)]
        w = watcher(store, clock)
        assert w.scan().looked == 5  # new locks are looked at twice (as after any index change)
        clock.now += 1.0
        assert w.scan().looked == 5
        clock.now += 1.0
        assert w.scan().looked == 5  # global time passed their stamps at the second: once more
        clock.now += 1.0
        assert w.scan().looked == 0  # nothing due: the index is read, no lock
        # A contender enqueues, gives up, withdraws (its own locker: this thread holds long-0, and
        # taking it again here would be re-entry, refused at once without touching the store).
        with RemoteLocker(store, lease=60.0) as contender, pytest.raises(LockTimeout):
            contender.get_lock("long-0", timeout=0.05)
        newcomer = locker.get_lock("fresh")
        clock.now += 1.0
        report = w.scan()
        assert report.looked == 2 and report.locks == 6  # "long-0" (index entry rewritten) and "fresh"
        clock.now += 1.0
        assert w.scan().looked == 2  # once more, in case a queue cell landed after its index entry
        clock.now += 1.0
        assert w.scan().looked == 0  # (stamped below global time as this watcher reads it: no third)
        clock.now += 2.0  # 6 s after the third look at the first four
        assert w.scan().looked == 4
        for lock in [*held, newcomer]:
            lock.release()


def test_a_process_dying_with_many_locks_is_revoked_in_a_few_store_calls(
    store: CellStore, clock: FakeMonotonic
) -> None:
    faulty = FaultyStore(store)
    locker = RemoteLocker(store, lease=2.0)
    held = [locker.get_lock(f"many-{i}") for i in range(200)]
    for lock in held:
        stop_renewing(locker, lock)
    w = watcher(faulty, clock, grace=0.5)
    w.scan()
    clock.now += 2.6
    faulty.calls.clear()
    report = w.scan()
    assert report.revoked == 200 and w.revocations == 200
    assert all(
        HOLDER_COLUMN not in row for row in store.read_versioned_many([f"many-{i}" for i in range(200)]).values()
    )
    assert all(store.get(Table.QUEUE, lock.lock_id, lock.ticket) is None for lock in held)
    # One bulk read per table and one batch of compare-and-sets: no per-lock reads (the one `get`
    # is the GlobalTime cell, read once per scan).
    assert faulty.calls.get("read_row", 0) == 0 and faulty.calls.get("get", 0) == 1
    assert faulty.calls["read_versioned_many"] == 1 and faulty.calls["read_rows_many"] == 2
    locker.close()


def test_pages_list_every_lock_once_in_order_and_search_by_prefix(store: CellStore, clock: FakeMonotonic) -> None:
    with RemoteLocker(store, lease=10.0) as locker:
        ids = [f"orders/{i:03d}" for i in range(230)] + [f"users/{i:02d}" for i in range(20)]
        held = [locker.get_lock(lock_id) for lock_id in ids]
        w = watcher(store, clock)
        w.scan()
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page, cursor = w.page(after=cursor, limit=100)
            seen += [line.lock_id for line in page]
            assert len(page) <= 100
            if cursor is None:
                break
        assert seen == sorted(ids)
        first = w.page(limit=3)[0]
        assert [(x.lock_id, x.holder, x.fencing_token, x.queue_length) for x in first] == [
            (h.lock_id, h.owner, 1, 1) for h in held[:3]
        ]
        assert first[0].oldest_lease_age == pytest.approx(0.0)
        users, more = w.page(prefix="users/", limit=100)
        assert [x.lock_id for x in users] == ids[230:] and more is None
        later, more = w.page(prefix="orders/", after="orders/225", limit=100)
        assert [x.lock_id for x in later] == ids[226:230] and more is None
        assert w.page(prefix="nothing", limit=10) == ([], None)
        with pytest.raises(ValueError, match="limit"):
            w.page(limit=0)
        for lock in held:
            lock.release()


def test_grants_and_waits_are_observed_but_an_inherited_holder_is_no_grant(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """leasewatch.observed through the watcher: a holder found by the first scan was granted
    before this watcher looked (no grant); a later acquisition in a watched shard is one grant
    with a wait; a queued waiter counts towards the longest wait until it is granted."""
    with RemoteLocker(store, lease=4.0) as locker:
        first = locker.get_lock("inherited")
        w = watcher(store, clock)
        w.scan()
        assert w.observed.grants_seen == 0 and w.observed.held_for("inherited", first.owner) is not None
        first.release()
        again = locker.get_lock("inherited")  # the same shard, now watched: a grant
        granted, done = threading.Event(), threading.Event()

        def wait_then_hold() -> None:
            with locker.get_lock("inherited", timeout=10):
                granted.set()
                done.wait(10)

        waiter = threading.Thread(target=wait_then_hold)
        waiter.start()
        wait_until(lambda: len(store.read_row(Table.QUEUE, "inherited")) == 2, "the waiter's queue cell")
        # A wait is measured from the waiter's ticket — the upper end of global time's interval, a
        # little ahead of the wall clock — to the wall clock: let it have begun (a fast run scanned
        # before, and saw a wait of 0 s, no longest wait).
        ticket = store.read_row(Table.QUEUE, "inherited")[-1].column
        wait_until(lambda: time.time() * 1e6 > ticket_time(ticket) + 1000, "the wall clock to pass the ticket")
        clock.now += 1.0
        w.scan()
        assert w.observed.grants_seen == 1
        assert [g.owner for g in w.observed.recent_grants("inherited")] == [again.owner]
        assert w.observed.longest_wait().lock_id == "inherited"
        again.release()
        assert granted.wait(10)
        clock.now += 1.0
        w.scan()
        done.set()
        waiter.join(10)
        assert w.observed.grants_seen == 2 and w.observed.longest_wait().seconds == 0.0


def test_a_page_says_how_overdue_each_lock_is_in_its_own_lease_lengths(store: CellStore, clock: FakeMonotonic) -> None:
    """The page's "most overdue" column: unchanged-for / lease of its most overdue lease. Holder
    records written directly (nobody renews them), so only the injected clock moves."""
    from lockclient.lease import FENCE_COLUMN, HolderRecord

    leases = {"short": 4.0, "long": 40.0}
    for lock_id, lease in leases.items():
        store.put_cells(Table.INDEX, index_shard(lock_id), {lock_id: ""}, timestamp=1)
        record = HolderRecord(f"owner-{lock_id}", 1, lease, make_ticket(1, f"owner-{lock_id}"), 1).encode()
        cells = {HOLDER_COLUMN: record, FENCE_COLUMN: f"1|owner-{lock_id}"}
        assert store.compare_and_set(lock_id, {HOLDER_COLUMN: None, FENCE_COLUMN: None}, cells).applied
    w = watcher(store, clock, grace=100.0)  # nothing is revoked while the clock moves
    before = {line.lock_id: line.most_overdue for line in w.page()[0]}
    assert before == {"long": None, "short": None}, "not observed yet: unknown, not zero"
    w.scan()
    clock.now += 6.0
    lines = {line.lock_id: line for line in w.page()[0]}
    assert lines["short"].most_overdue == pytest.approx(1.5) and lines["long"].most_overdue == pytest.approx(0.15)
    assert lines["short"].oldest_lease_age == pytest.approx(6.0)


def test_a_lock_whose_look_failed_is_looked_at_again(store: CellStore, clock: FakeMonotonic) -> None:
    """A scan takes the locks due off its time wheel and reschedules each at its look; a look that
    failed (the store did not answer the bulk read) must not leave a lock off the wheel for good —
    its dead holder would never be revoked (found by the simulator: a parked min_hold record left
    at the end of a run whose scan read failed once during a lossy minute)."""
    from lockclient.errors import StoreUnavailable

    locker = RemoteLocker(store, lease=10.0)
    lock = locker.get_lock("looked-again")
    stop_renewing(locker, lock)
    faulty = FaultyStore(store)
    w = watcher(faulty, clock, grace=0.5)  # scan interval 1 s
    clock.now = 0.0
    w.scan()  # first sighting
    clock.now = 1.0
    w.scan()  # looked at twice (a new lock is): from now on only the wheel brings it back
    clock.now = 2.0
    faulty.arm("read_versioned_many", raise_before=StoreUnavailable("no answer"))
    with pytest.raises(StoreUnavailable):
        w.scan()
    while clock.now < 14.0:  # lease 10 + grace 0.5 after the first sighting, and a few scans more
        clock.now += 1.0
        w.scan()
        w.check_due()
    assert w.revocations == 1, "the dead holder was never looked at again after one failed read"
    assert HOLDER_COLUMN not in store.read_versioned("looked-again")
    locker.close()


def test_a_read_write_lock_view_gives_each_queue_cell_its_mode(store: CellStore, clock: FakeMonotonic) -> None:
    """The view of a read-write lock's row says which ticket is a reader's and which a writer's
    (``GET /primitives/rwlock/...`` shows a queue's modes from it)."""
    from lockclient.lockid import primitive_row

    row = primitive_row("doc", "rwlock")
    with RemoteLocker(store, lease=5.0) as locker:
        reader = locker.get_read_lock("doc")
        tickets: list[str] = []

        def write() -> None:
            writer = locker.get_write_lock("doc", timeout=30)
            tickets.append(writer.ticket)
            writer.release()

        writing = threading.Thread(target=write)
        writing.start()
        try:
            wait_until(lambda: len(store.read_row(Table.QUEUE, row)) == 2, "the writer queued behind the reader")
            view = watcher(store, clock).view(row)
        finally:
            reader.release()
            writing.join(30)
        assert [ticket for ticket, _ in view.queue] == [reader.ticket, *tickets]
        assert view.modes == {reader.ticket: "r", tickets[0]: "w"}


def test_an_operator_revocation_of_a_backoff_holder_clears_its_main_cell_too(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """``revoke_now`` (one holder at a time, not the scan's batch) also deletes the baseline holder's
    main cell: the next contender need not wait for the orphan sweep."""
    locker = RemoteLocker(store, lease=30.0, algorithm="backoff")
    lock = locker.get_lock("ops-backoff")
    assert [c.column for c in store.read_row(Table.BACKOFF_MAIN, "ops-backoff")] == [lock.owner]
    w = watcher(store, clock)
    assert w.revoke_now("ops-backoff") == [lock.owner]
    assert HOLDER_COLUMN not in store.read_versioned("ops-backoff")
    assert store.read_row(Table.BACKOFF_MAIN, "ops-backoff") == []
    lock._lease.renew(store)
    assert lock.lost.is_set() and lock.release() is False
    locker.close()


def test_a_malformed_holder_record_is_an_orphan_cleared_after_the_window(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """A holder record that is not a lease (nobody's: no owner to revoke) is watched like an orphan
    cell — left alone for ``orphan_after``, then removed by a compare-and-set on exactly that
    value — and the lock works again."""
    store.put(Table.INDEX, index_shard("bad-holder"), "bad-holder", "", timestamp=10)
    assert store.compare_and_set("bad-holder", {HOLDER_COLUMN: None}, {HOLDER_COLUMN: "not a lease"}).applied
    w = watcher(store, clock)
    report = w.scan()
    assert report.orphans_cleared == 0 and report.revoked == 0
    clock.now += 3.0
    assert w.scan().orphans_cleared == 0  # 3 s < orphan_after (5 s)
    clock.now += 2.5
    assert w.scan().orphans_cleared == 1
    assert HOLDER_COLUMN not in store.read_versioned("bad-holder")
    with RemoteLocker(store, lease=2.0) as locker:
        got = locker.try_get_lock("bad-holder")
        assert got is not None
        got.release()


def test_an_idle_entry_stays_index_kept_s_after_its_idle_count_starts_whatever_orphan_after(
    store: CellStore, clock: FakeMonotonic
) -> None:
    """lockclient.listing: a client that saw its index write acknowledged relies on the entry for
    INDEX_KEPT_S. So leasewatch counts a lock idle only from a look with global time past the
    entry's stamp, and deletes the entry no sooner than INDEX_KEPT_S after — even with a shorter
    orphan_after (this watcher's is 5 s)."""
    with RemoteLocker(store, lease=2.0) as locker:
        locker.get_lock("kept").release()
        w = watcher(store, clock)
        w.scan()
        clock.now += 1.0
        w.scan()  # the idle count starts here
        clock.now += INDEX_KEPT_S - 0.5  # past orphan_after, not past INDEX_KEPT_S
        w.scan()
        assert store.get(Table.INDEX, index_shard("kept"), "kept") is not None, "deleted before INDEX_KEPT_S"
        clock.now += 1.0
        w.scan()
        assert store.get(Table.INDEX, index_shard("kept"), "kept") is None, "an idle entry was kept for good"


def test_a_revocation_that_failed_is_tried_again_at_the_next_look(store: CellStore, clock: FakeMonotonic) -> None:
    """A store error while revoking loses nothing: the lease is still unchanged at the next look,
    so it is stale at once and revoked then — not stamped afresh by that look and revoked a whole
    lease + grace later (the observation used to be forgotten before the compare-and-set)."""
    from lockclient.errors import StoreUnavailable

    locker = RemoteLocker(store, lease=10.0)
    lock = locker.get_lock("revoke-failed")
    stop_renewing(locker, lock)
    faulty = FaultyStore(store)
    w = watcher(faulty, clock, grace=0.5)  # scan interval 1 s: a look every scan (lease / 10)
    clock.now = 0.0
    w.scan()  # first sighting: stale after 10.5 s
    while clock.now < 10.0:
        clock.now += 1.0
        w.scan()
    clock.now = 10.6
    faulty.arm("compare_and_set", raise_before=StoreUnavailable("no answer"))
    assert w.check_due().revoked == 0  # at its deadline: the revocation's compare-and-set fails
    assert HOLDER_COLUMN in store.read_versioned("revoke-failed")
    clock.now = 11.0
    assert w.scan().revoked == 1, "the next look stamped the unchanged lease afresh"
    assert HOLDER_COLUMN not in store.read_versioned("revoke-failed")
    assert w.events[-1].owner == lock.owner
    locker.close()


def test_a_waiter_revocation_that_failed_is_tried_again_at_the_next_look(
    store: CellStore, clock: FakeMonotonic
) -> None:
    from lockclient.errors import StoreUnavailable

    ticket = make_ticket(50, "gone-waiter")
    store.put(Table.INDEX, index_shard("waiter-failed"), "waiter-failed", "", timestamp=10)
    store.put(Table.QUEUE, "waiter-failed", ticket, WaiterRecord("gone-waiter", 1, 2.0).encode(), timestamp=50)
    faulty = FaultyStore(store)
    w = watcher(faulty, clock, grace=0.5)
    w.scan()  # first sighting: stale after 2.5 s
    clock.now += 2.6
    faulty.arm("get", raise_before=StoreUnavailable("no answer"), when=lambda table, *a, **k: table == Table.QUEUE)
    report = w.scan()  # the re-read before the deletion fails
    assert report.revoked == 0 and report.errors
    assert store.get(Table.QUEUE, "waiter-failed", ticket) is not None
    clock.now += 1.0
    assert w.scan().revoked == 1, "the next look stamped the unchanged lease afresh"
    assert store.get(Table.QUEUE, "waiter-failed", ticket) is None
