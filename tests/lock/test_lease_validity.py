"""Finding 2: validity is per lease and computed when asked; one lease's slow store call delays
neither another lease's renewal nor any lease's loss signal (DESIGN.md §5, §7.1).

Schedules are replayed with a real SQLite store wrapped in :class:`FaultyStore`, which stalls
exactly one chosen compare-and-set."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, RemoteLocker, open_store
from lockclient.lease import HOLDER_COLUMN, HolderRecord
from tests.support.faulty import FaultyStore
from tests.support.waiting import wait_until

LEASE = 2.0


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def is_renewal(expected: dict[str, str | None]) -> bool:
    return expected.get(HOLDER_COLUMN) is not None


def version(store: CellStore, lock_id: str) -> int:
    return HolderRecord.decode(store.read_versioned(lock_id)[HOLDER_COLUMN]).version


def test_a_stuck_renewal_of_one_lock_delays_neither_another_lease_nor_its_own_loss(store: CellStore) -> None:
    """One slow compare-and-set on lock X used to delay lock Y's renewal and Y's loss signal, and X
    kept reporting held=True past its own deadline.

    Asserted as guarantees, ordered by events rather than counted in wall time (a count of Y's
    renewals within X's lease flaked on a machine at load 20): X's call stays stuck until the
    test lets it go, and *while it is stuck* X is held exactly until its own deadline and lost
    from then on, Y is renewed again and again (two renewals completed after X's call got
    stuck), and Y is never lost."""
    faulty = FaultyStore(store)
    release_stall = threading.Event()
    stalled = threading.Event()

    def stall(*args: object, **kwargs: object) -> None:
        stalled.set()
        release_stall.wait(60)  # until the test lets it go

    with RemoteLocker(faulty, lease=LEASE) as locker:
        x = locker.get_lock("X")
        y = locker.get_lock("Y")
        lost_at: list[float] = []
        x.on_lost(lambda reason: lost_at.append(time.monotonic()))
        faulty.arm(
            "compare_and_set", before=stall, when=lambda row, expected, *a, **k: row == "X" and is_renewal(expected)
        )
        try:
            assert stalled.wait(20), "X's renewal never started"
            y_before = version(store, "Y")
            deadline = x.valid_until
            # X is valid until its own deadline, and not a moment longer, whatever its stuck call does.
            while True:
                held = x.held
                read_by = time.monotonic()  # `held` was read before this moment
                if read_by >= deadline:
                    break
                assert held, "X is valid until its own deadline"
                threading.Event().wait(0.05)
            while time.monotonic() < deadline:
                threading.Event().wait(0.005)
            assert not x.held and x.lost.is_set()
            assert "no renewal succeeded" in (x.lost_reason or "")
            # Y's renewals go on while X's call is still stuck: two completed after it got stuck.
            wait_until(lambda: version(store, "Y") >= y_before + 2, "Y's renewals while X's call is stuck", timeout=30)
            assert not release_stall.is_set() and faulty.calls["compare_and_set"] > 0
            assert y.held and not y.lost.is_set(), y.lost_reason
            # The loss signal reached the callback, never before the deadline.
            wait_until(lambda: lost_at, "X's on_lost callback", timeout=30)
            assert lost_at[0] >= deadline - 0.01, "X's loss signal came before its deadline"
        finally:
            release_stall.set()
        assert x.release() is False
        assert y.release() is True


def test_at_a_grant_the_previous_holder_no_longer_holds_by_its_own_clock(store: CellStore, sqlite_url: str) -> None:
    """The lease-level promise: leasewatch revokes X (its renewal is stuck), another client is
    granted X; at that grant, X's own `valid_until` has passed and `held` is False."""
    faulty = FaultyStore(store)
    release_stall = threading.Event()
    watcher = Watcher(store, grace=0.5, orphan_after=30)
    second = RemoteLocker(open_store(sqlite_url), lease=LEASE, owns_store=True)
    with RemoteLocker(faulty, lease=LEASE) as first, second:
        x = first.get_lock("X")
        faulty.arm(
            "compare_and_set",
            before=lambda *a, **k: release_stall.wait(10),
            when=lambda row, expected, *a, **k: row == "X" and is_renewal(expected),
        )
        stop = threading.Event()

        def scan() -> None:
            while not stop.is_set():
                watcher.scan()
                threading.Event().wait(0.05)

        scanner = threading.Thread(target=scan)
        scanner.start()
        try:
            successor = second.get_lock("X", timeout=20)
            held_at_grant = x.held
        finally:
            stop.set()
            scanner.join()
            release_stall.set()
        assert successor.fencing_token == x.fencing_token + 1
        assert x.valid_until < successor.granted_at, "granted while the old holder's lease was valid by its clock"
        assert not held_at_grant
        assert watcher.revocations == 1
        successor.release()
        x.release()


def test_a_lease_past_max_hold_stops_renewing_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """Past ``max_hold`` a lease wants no more renewals (it is left to expire); the warning that
    says so is logged the first time, not at every look of the keeper."""
    import logging

    from lockclient.lease import HeldLease
    from lockclient.lockid import make_owner, make_ticket

    now = [100.0]
    owner = make_owner()
    lease = HeldLease(
        "hung",
        HolderRecord(owner, 1, 30.0, make_ticket(1, owner), 1),  # valid throughout
        renewed_at=100.0,
        max_hold=5.0,
        monotonic=lambda: now[0],
    )
    caplog.set_level(logging.WARNING)
    assert lease.wants_renewal() and not lease.renewing_stopped
    now[0] = 105.5
    assert [lease.wants_renewal() for _ in range(3)] == [False, False, False]
    assert lease.renewing_stopped
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("max_hold_exceeded")]
    assert len(warnings) == 1, warnings


def test_a_new_waiter_lease_is_first_renewed_a_third_of_a_lease_after_its_enqueue() -> None:
    """A queue cell just written needs no renewal before lease/3 (the renewal period); only after a
    failed renewal does the next come sooner (lease/10, at most a second)."""
    from lockclient.lease import WaiterLease

    waiter = WaiterLease("L", "w", "t", 9.0)
    assert waiter.renew_failures == 0
    assert waiter.next_due() == waiter.renewed_at + 3.0
    waiter.renew_failures = 1
    assert waiter.next_due() == waiter.last_attempt_at + 0.9
