"""Issue 23: leases and grants stay exact when the store cannot say whether a write landed.

Each of the review's three findings is replayed twice, and fails on the code before the fix
(c056ae8) both times:

* on SQLite, with :class:`FaultyStore` injecting the answers ("applied, answer lost" = the write
  is performed, then the error raised);
* through the real :class:`~lockclient.store.cassandra.CassandraStore` code — statements,
  ``translate_error`` and the classification table, ``compare_and_set``'s re-reads,
  ``_cas_result`` — over a *simulated* driver session backed by SQLite
  (``tests/support/simulated_driver.py``), which raises the driver's own exception objects
  (``WriteTimeout`` of write type CAS, ``ReadTimeout`` on SERIAL re-reads, ``WriteFailure``,
  ``OverloadedErrorMessage``, a bare ``ErrorMessage`` 0x1700, ``NoHostAvailable``).

Finding 1 runs leasewatch's real :class:`Watcher` on an injected clock, and asserts the lease
promise itself: when leasewatch revokes, the holder no longer sees ``held``. Time is a fake
monotonic clock, moved by the test: nothing here depends on how fast the machine runs.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, ReadTimeout, WriteFailure, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable
from cassandra.protocol import ErrorMessage, OverloadedErrorMessage, ServerError
from prometheus_client import REGISTRY

from leasewatch.watcher import Revocation, Watcher
from lockclient import CellStore, RemoteLocker, StoreError, StoreOutcomeUnknown, StoreUnavailable, open_store
from lockclient.lease import HOLDER_COLUMN, HeldLease, HolderRecord
from lockclient.lockid import index_shard, make_owner, make_ticket
from lockclient.store import Table
from lockclient.store.cassandra import CassandraStore
from tests.support.faulty import FaultyStore
from tests.support.simulated_driver import SimCall, inject_faults, simulated_cassandra_store
from tests.support.waiting import wait_until

LEASE = 10.0
GRACE = 2.0


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@dataclass
class Driver:
    """Where the adapter-path replays run: the real CassandraStore code over the simulated driver
    (always), or over a real modern Cassandra node with the failures injected around real
    statements (when ``CHRONOLOCK_TEST_CASSANDRA`` names one)."""

    name: str
    backing: CellStore
    """A plain store over the same data: what the tests read to check, and what W uses."""
    faulty: Callable[[float], tuple[CassandraStore, Any]]
    """A CassandraStore (``resolve_timeout`` seconds) with failure rules on its driver session."""
    plain: Callable[[], CellStore]

    def lock_id(self, base: str) -> str:
        return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["simulated-driver", "cassandra-modern"])
def driver(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[Driver]:
    opened: list[CellStore] = []

    def keep(store: CellStore) -> CellStore:
        opened.append(store)
        return store

    if request.param == "simulated-driver":
        backing = keep(open_store(sqlite_url))

        def simulated(resolve_timeout: float) -> tuple[CassandraStore, Any]:
            store, session = simulated_cassandra_store(backing, resolve_timeout=resolve_timeout)
            keep(store)
            return store, session

        found = Driver(request.param, backing, simulated, lambda: simulated_cassandra_store(backing)[0])
    else:
        if not os.environ.get("CHRONOLOCK_TEST_CASSANDRA"):
            pytest.skip("no modern Cassandra: set CHRONOLOCK_TEST_CASSANDRA=host:port to replay on a real node")
        url: str = request.getfixturevalue("modern_cassandra_url")
        backing = keep(open_store(url))

        def real(resolve_timeout: float) -> tuple[CassandraStore, Any]:
            store = keep(open_store(f"{url}?resolve_timeout={resolve_timeout}"))
            assert isinstance(store, CassandraStore)
            return store, inject_faults(store)

        found = Driver(request.param, backing, real, lambda: open_store(url))
    try:
        yield found
    finally:
        for store in reversed(opened):
            store.close()


def lost_count() -> float:
    return REGISTRY.get_sample_value("chronolock_client_locks_lost_total") or 0.0


def cas_timeout() -> WriteTimeout:
    return WriteTimeout(
        "Operation timed out - received only 0 responses.",
        consistency=ConsistencyLevel.SERIAL,
        required_responses=2,
        received_responses=0,
        write_type=WriteType.CAS,
    )


def serial_timeout() -> ReadTimeout:
    return ReadTimeout(
        "Operation timed out - received only 1 responses.",
        consistency=ConsistencyLevel.SERIAL,
        required_responses=2,
        received_responses=1,
        data_retrieved=False,
    )


def no_host() -> NoHostAvailable:
    return NoHostAvailable("Unable to complete the operation against any hosts", {})


def is_renewal_of(value: str) -> Callable[..., bool]:
    def match(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
        return expected.get(HOLDER_COLUMN) == value and updates.get(HOLDER_COLUMN) is not None

    return match


def is_renewal(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
    return expected.get(HOLDER_COLUMN) is not None and updates.get(HOLDER_COLUMN) is not None


def holder_value(store: CellStore, lock_id: str) -> str:
    return store.read_versioned(lock_id)[HOLDER_COLUMN]


# -- finding 1: a lease is dated from the attempt whose value the store holds -------------------------


def grant(store: CellStore, lock_id: str, clock: Clock) -> HeldLease:
    """What :func:`lockclient.algorithm.take` does, on a clock the test moves."""
    owner = make_owner()
    record = HolderRecord(owner, 1, LEASE, make_ticket(1, owner), 1)
    started = clock()
    assert store.compare_and_set(lock_id, {HOLDER_COLUMN: None}, {HOLDER_COLUMN: record.encode()}).applied
    store.put(Table.INDEX, index_shard(lock_id), lock_id, "", timestamp=1)  # listed for leasewatch
    return HeldLease(lock_id, record, renewed_at=started, monotonic=clock)


def watch_until_revoked(watcher: Watcher, clock: Clock, lease: HeldLease, revoked: list[tuple[float, bool]]) -> None:
    """Move the clock in steps of 0.25 s, letting the watcher look each step, until it revokes."""
    while not revoked and clock.now < 140:
        clock.now = round(clock.now + 0.25, 2)
        watcher.scan([index_shard(lease.lock_id)])  # only this lock's shard (a shared keyspace has others)
        watcher.check_due()
    assert revoked, "leasewatch never revoked the stale lease"
    at, held = revoked[0]
    assert not held, (
        f"leasewatch revoked at {at} while the holder still saw held == True "
        f"(its lease ran until {lease.valid_until()}: dated from an attempt that wrote nothing)"
    )
    assert lease.valid_until() <= at


def revocation_probe(lease: HeldLease, clock: Clock, revoked: list[tuple[float, bool]]) -> Callable[[Revocation], None]:
    def on_revoke(event: Revocation) -> None:
        if event.lock_id == lease.lock_id:
            revoked.append((clock(), not lease.lost.is_set()))  # is_set() checks valid_until now

    return on_revoke


def test_finding_1_the_lease_is_dated_from_the_attempt_whose_value_the_store_holds_sqlite(store: CellStore) -> None:
    """R1 (v1 → v2) applies, its answer lost; R2 four seconds later (longer than the grace) times
    out without applying; R3 is refused — the store holds R1's value — and the renewal that would
    follow from it fails too. Before the fix R1 and R2 wrote the *same* value, so R3's refusal was
    matched to R2 and the lease dated from R2's start: leasewatch, which stamped v2 when R1 wrote
    it, revoked while the holder still saw ``held``. With attempt ids the value is R1's alone."""
    clock = Clock(100.0)
    faulty = FaultyStore(store)
    lease = grant(store, "f1", clock)
    revoked: list[tuple[float, bool]] = []
    watcher = Watcher(
        store, grace=GRACE, orphan_after=60, monotonic=clock, on_revoke=revocation_probe(lease, clock, revoked)
    )
    clock.now = 100.1
    watcher.scan()

    clock.now = 103.4  # R1, due at lease/3: applied, answer lost
    faulty.arm("compare_and_set", raise_after=StoreOutcomeUnknown("injected: applied, answer lost"), when=is_renewal)
    lease.renew(faulty)
    r1_value = holder_value(store, "f1")
    assert HolderRecord.decode(r1_value).version == 2
    clock.now = 103.5
    watcher.scan()  # leasewatch sees R1's value: stamped 103.5

    clock.now = 107.4  # R2: outcome unknown, did not apply
    faulty.arm("compare_and_set", raise_before=StoreOutcomeUnknown("injected: timed out"), when=is_renewal)
    lease.renew(faulty)
    clock.now = 107.5  # R3: refused (the store holds R1's value); the renewal from it fails
    faulty.arm("compare_and_set", raise_before=StoreUnavailable("injected: store away"), when=is_renewal_of(r1_value))
    lease.renew(faulty)
    assert holder_value(store, "f1") == r1_value

    watch_until_revoked(watcher, clock, lease, revoked)
    assert lease.value == r1_value, "R1's value is recognised as ours"
    assert lease.valid_until() == pytest.approx(103.4 + LEASE), "dated from R1's start"


def test_finding_1_through_the_cassandra_adapter(driver: Driver) -> None:
    """The review's replay, with the real CassandraStore code: R1 answers ``WriteTimeout`` (CAS)
    after applying and the SERIAL re-reads time out; the retry four seconds later sent the
    *identical* compare-and-set, the store refused it, and ``_cas_result`` reported it applied
    because the row held "our" values — dating the lease from the retry. leasewatch runs on a
    CassandraStore of its own, watching only this lock's shard."""
    clock = Clock(100.0)
    lock_id = driver.lock_id("f1c")
    holder_store, session = driver.faulty(0.2)
    watcher_store = driver.plain()
    with watcher_store:
        lease = grant(holder_store, lock_id, clock)
        revoked: list[tuple[float, bool]] = []
        probe = revocation_probe(lease, clock, revoked)
        watcher = Watcher(watcher_store, grace=GRACE, orphan_after=60, monotonic=clock, on_revoke=probe)
        clock.now = 100.1
        watcher.scan([index_shard(lock_id)])

        clock.now = 103.4  # R1: applied; its answer a CAS WriteTimeout; every SERIAL re-read times out
        session.fail(SimCall.renews, cas_timeout(), applied=True)
        session.fail(lambda call: call.kind == "serial_read", serial_timeout(), applied=False, times=10**6)
        lease.renew(holder_store)
        session.heal()
        r1_value = holder_value(driver.backing, lock_id)
        assert HolderRecord.decode(r1_value).version == 2
        assert lease.renew_failures == 1, "R1's outcome stayed unknown"
        clock.now = 103.5
        watcher.scan([index_shard(lock_id)])

        clock.now = 107.4  # R2 is refused: the store holds R1's value; the renewal from it finds no host
        session.fail(
            lambda call: call.renews() and call.expected["~holder"] == r1_value, no_host(), applied=False, times=10**6
        )
        lease.renew(holder_store)
        assert holder_value(driver.backing, lock_id) == r1_value

        watch_until_revoked(watcher, clock, lease, revoked)
        assert lease.valid_until() == pytest.approx(103.4 + LEASE), "dated from R1's start, not the retry's"


def test_a_retry_with_a_new_attempt_id_is_not_reported_applied_by_the_adapter(driver: Driver) -> None:
    """The adapter's side of finding 1: ``_cas_result`` and the re-read call a write applied only
    when the values *this call* writes are there."""
    cassandra_store, session = driver.faulty(0.2)
    row = driver.lock_id("r")
    assert cassandra_store.compare_and_set(row, {"h": None}, {"h": "v1#a0"}).applied
    session.fail(lambda call: call.kind == "cas", cas_timeout(), applied=True)
    session.fail(lambda call: call.kind == "serial_read", serial_timeout(), applied=False, times=10**6)
    with pytest.raises(StoreOutcomeUnknown):
        cassandra_store.compare_and_set(row, {"h": "v1#a0"}, {"h": "v2#a1"})
    session.heal()
    retry = cassandra_store.compare_and_set(row, {"h": "v1#a0"}, {"h": "v2#a2"})
    assert not retry.applied and retry.current == {"h": "v2#a1"}
    # The same call sent again (the adapter's own resend) is recognised as applied.
    assert cassandra_store.compare_and_set(row, {"h": "v1#a0"}, {"h": "v2#a1"}).applied


# -- finding 2: a lock released cleanly is never reported lost -----------------------------------------


def is_release(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
    return expected.get(HOLDER_COLUMN) is not None and HOLDER_COLUMN in updates and updates[HOLDER_COLUMN] is None


def test_finding_2_a_released_lock_whose_answer_was_lost_is_not_lost_sqlite(sqlite_url: str) -> None:
    """H's release lands, its answer is lost, and H's store calls fail for a while; W is granted;
    H's renewal — which goes on while the release is pending — finds W's record. Before the fix
    that fired ``lost``, the callbacks, the warning and the metric, with no leasewatch running.
    Now the end record says the release was H's own. The outage lets only the renewal through at
    first (so the release's own retry cannot settle it first), then the SERIAL reads too."""
    faulty = FaultyStore(open_store(sqlite_url))
    outage, reads_back = threading.Event(), threading.Event()
    away = StoreUnavailable("injected: store away")

    def blocked(row: str, *args: object, **kwargs: object) -> bool:
        return outage.is_set()

    def blocked_write(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **k: object) -> bool:
        return outage.is_set() and not is_renewal(row, expected, updates)

    def blocked_read(row: str, **kwargs: object) -> bool:
        return outage.is_set() and not reads_back.is_set()

    with (
        RemoteLocker(faulty, lease=30) as h_locker,
        RemoteLocker(open_store(sqlite_url), lease=30, owns_store=True) as w_locker,
    ):
        lock = h_locker.get_lock("f2")
        reasons: list[str] = []
        lock.on_lost(reasons.append)
        before = lost_count()
        lost_answer = StoreOutcomeUnknown("injected: released, answer lost")
        faulty.arm("compare_and_set", raise_after=lost_answer, after=lambda *a, **k: outage.set(), when=is_release)
        faulty.arm("compare_and_set", raise_before=away, when=blocked_write, times=10**6)
        faulty.arm("read_versioned", raise_before=away, when=blocked_read, times=10**6)
        for method in ("delete", "get", "read_row"):
            faulty.arm(method, raise_before=away, when=blocked, times=10**6)
        assert lock.release() is True
        w_lock = w_locker.get_lock("f2", timeout=20)  # W's own store: unaffected
        assert w_lock.held
        lock._lease.renew(faulty)  # the keeper's next renewal, while the release is pending: finds W's record
        reads_back.set()
        lock._lease.renew(faulty)  # ...and settles from the end record
        assert not lock.lost.is_set(), f"a released lock reported lost: {lock.lost_reason}"
        assert lock._lease.ended, "settled as released by the renewal"
        outage.clear()
        wait_until(lambda: not lock.cleanup_pending, "the pending release to finish", timeout=20)
        assert not lock.lost.is_set(), lock.lost_reason
        assert reasons == [] and lock.lost_reason is None
        assert lost_count() == before
        assert w_lock.held and w_lock.release() is True
        faulty.inner.close()


def test_finding_2_through_the_cassandra_adapter(driver: Driver) -> None:
    """The same with H on the real CassandraStore code: the release's answer is a CAS
    ``WriteTimeout`` after it applied, then every call but the renewal times out
    (``OperationTimedOut``) — the SERIAL re-reads too, until the second renewal."""
    lock_id = driver.lock_id("f2c")
    h_store, session = driver.faulty(0.2)
    outage, reads_back = threading.Event(), threading.Event()
    with (
        RemoteLocker(h_store, lease=30, allow_store_clock=True) as h_locker,
        RemoteLocker(driver.plain(), lease=30, owns_store=True, allow_store_clock=True) as w_locker,
    ):
        lock = h_locker.get_lock(lock_id)
        reasons: list[str] = []
        lock.on_lost(reasons.append)
        before = lost_count()

        def released_then_away(call: SimCall) -> bool:
            if call.releases() and not outage.is_set():
                outage.set()
                return True
            return False

        def blocked(call: SimCall) -> bool:
            reading = call.kind == "serial_read" and reads_back.is_set()
            return outage.is_set() and not call.renews() and not reading

        session.fail(released_then_away, cas_timeout(), applied=True)
        session.fail(blocked, OperationTimedOut("Client request timeout"), applied=False, times=10**6)
        assert lock.release() is True
        w_lock = w_locker.get_lock(lock_id, timeout=20)
        assert w_lock.held
        lock._lease.renew(h_store)  # finds W's record
        reads_back.set()
        lock._lease.renew(h_store)  # reads the end record
        assert not lock.lost.is_set(), f"a released lock reported lost: {lock.lost_reason}"
        assert lock._lease.ended, "settled as released by the renewal"
        outage.clear()
        session.heal()
        wait_until(lambda: not lock.cleanup_pending, "the pending release to finish", timeout=20)
        assert not lock.lost.is_set(), lock.lost_reason
        assert reasons == [] and lost_count() == before
        assert w_lock.release() is True


def test_a_release_whose_end_record_was_overwritten_is_settled_by_the_lease_bound(sqlite_url: str) -> None:
    """The fallback: W was granted *and* released before H looked, so ``~ended`` names W's end,
    not H's. Only H's release or a revocation removes H's record, and H saw it gone before its
    own ``valid_until`` (leasewatch revokes only ``lease + grace`` after the last renewal): it was
    H's release."""
    faulty = FaultyStore(open_store(sqlite_url))
    with (
        RemoteLocker(faulty, lease=30) as h_locker,
        RemoteLocker(open_store(sqlite_url), lease=30, owns_store=True) as w_locker,
    ):
        lock = h_locker.get_lock("f2o")
        faulty.arm(
            "compare_and_set", raise_after=StoreOutcomeUnknown("injected: released, answer lost"), when=is_release
        )
        faulty.arm("compare_and_set", raise_before=StoreUnavailable("injected: away"), times=10**6)
        assert lock.release() is True
        w_locker.get_lock("f2o", timeout=20).release()
        faulty.disarm()
        lock._lease.renew(faulty)
        wait_until(lambda: not lock.cleanup_pending, "the pending release to settle", timeout=20)
        assert not lock.lost.is_set(), lock.lost_reason
        faulty.inner.close()


def test_a_revocation_that_wins_over_a_pending_release_is_still_reported(store: CellStore) -> None:
    """Exact both ways: when the end record names a revocation of H's record (H's release never
    landed), H learns it was revoked — ``lost`` fires, with the reason."""
    clock = Clock(100.0)
    faulty = FaultyStore(store)
    lease = grant(store, "f2r", clock)
    lease.releasing = True
    faulty.arm("compare_and_set", raise_before=StoreOutcomeUnknown("injected: timed out"), when=is_release)
    with pytest.raises(StoreOutcomeUnknown):
        lease.release(faulty)
    watcher = Watcher(store, grace=GRACE, orphan_after=60, monotonic=clock)
    watcher.scan()
    clock.now = 100 + LEASE + GRACE + 1
    watcher.scan()
    assert watcher.revocations == 1
    lease.renew(faulty)
    assert lease.lost.is_set() and lease.lost_reason == "lease revoked"


# -- finding 3: a grant that fails is settled, never orphaned ---------------------------------------------


def is_grant(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
    return HOLDER_COLUMN in expected and expected[HOLDER_COLUMN] is None and updates.get(HOLDER_COLUMN) is not None


def assert_granted_and_cleaned_up(store: CellStore, lock_id: str, get: Callable[[], Any]) -> None:
    try:
        lock = get()
    except StoreError as exc:
        row = store.read_versioned(lock_id)
        pytest.fail(f"the grant raised {exc!r} and left the lock's row as {row} — a holder record nobody owns")
    assert lock.held and lock.fencing_token == 1
    assert HolderRecord.decode(holder_value(store, lock_id)).owner == lock.owner
    assert lock.release() is True
    assert HOLDER_COLUMN not in store.read_versioned(lock_id)


def test_finding_3_a_grant_that_fails_after_applying_is_adopted_sqlite(store: CellStore) -> None:
    """The grant applies and then fails with a plain StoreError (what a WriteFailure after a quorum
    accepted used to become): before the fix ``get_lock`` raised and the holder record stayed,
    never renewed, never removed — the lock blocked for good without leasewatch."""
    faulty = FaultyStore(store)
    with RemoteLocker(faulty, lease=30) as locker:
        faulty.arm(
            "compare_and_set", raise_after=StoreError("injected: WriteFailure after a quorum accepted"), when=is_grant
        )
        assert_granted_and_cleaned_up(store, "f3", lambda: locker.get_lock("f3", timeout=10))


def test_a_grant_refused_for_good_raises_and_leaves_nothing(store: CellStore) -> None:
    faulty = FaultyStore(store)
    with RemoteLocker(faulty, lease=30) as locker:
        faulty.arm("compare_and_set", raise_before=StoreError("injected: invalid request"), when=is_grant)
        with pytest.raises(StoreError, match="invalid request"):
            locker.get_lock("f3n", timeout=10)
        assert HOLDER_COLUMN not in store.read_versioned("f3n")


def test_a_grant_whose_outcome_stays_unknown_past_the_deadline_is_released_in_the_background(store: CellStore) -> None:
    faulty = FaultyStore(store)
    away = threading.Event()
    away.set()
    with RemoteLocker(faulty, lease=30) as locker:
        faulty.arm("compare_and_set", raise_after=StoreOutcomeUnknown("injected: applied, answer lost"), when=is_grant)
        faulty.arm(
            "read_versioned",
            raise_before=StoreUnavailable("injected: away"),
            when=lambda row, serial=True, **k: serial and away.is_set(),
            times=10**6,
        )
        faulty.arm(
            "compare_and_set",
            raise_before=StoreUnavailable("injected: away"),
            when=lambda *a, **k: away.is_set(),
            times=10**6,
        )
        with pytest.raises(StoreUnavailable):
            locker.get_lock("f3u", timeout=1)
        assert HOLDER_COLUMN in store.read_versioned("f3u"), "the grant applied"
        away.clear()
        wait_until(lambda: HOLDER_COLUMN not in store.read_versioned("f3u"), "the unconfirmed grant to be released")
        assert "|released|" in store.read_versioned("f3u")["~ended"]
        lock = locker.get_lock("f3u", timeout=10)
        assert lock.fencing_token == 2
        lock.release()


@pytest.mark.parametrize(
    "failure",
    [
        WriteFailure(
            "Operation failed - received 1 responses and 1 failures",
            consistency=ConsistencyLevel.SERIAL,
            required_responses=2,
            received_responses=1,
            failures=1,
            write_type=WriteType.CAS,
        ),
        OverloadedErrorMessage(0x1001, "Too many in flight hints", None),
        ServerError(0x0000, "java.lang.RuntimeException: commit failed", None),
        ErrorMessage(0x1700, "CAS operation result is unknown - proposal accepted by 1 but not a quorum.", None),
    ],
    ids=["write-failure", "overloaded", "server-error", "0x1700"],
)
def test_finding_3_through_the_cassandra_adapter(driver: Driver, failure: BaseException) -> None:
    """The grant applies (a quorum accepted) and the driver raises the commit step's failure.
    Before the fix WriteFailure, Overloaded and ServerError were plain StoreErrors: get_lock raised
    and the holder record stayed."""
    cassandra_store, session = driver.faulty(0.3)
    lock_id = driver.lock_id("f3c")
    with RemoteLocker(cassandra_store, lease=30, allow_store_clock=True) as locker:
        session.fail(SimCall.grants, failure, applied=True)
        assert_granted_and_cleaned_up(driver.backing, lock_id, lambda: locker.get_lock(lock_id, timeout=10))
        assert session.failed and session.failed[0][1] is failure


def test_a_semaphore_grant_whose_outcome_stays_unknown_is_released_from_its_own_slot(store: CellStore) -> None:
    """As above for a semaphore: the grant took a slot's column (``~holder:<k>``), and the background
    release ends that slot — with the slot's end record — not the lock's ``~holder``, which is not
    there (its compare-and-set would never apply, and the permit stay taken until leasewatch)."""
    from lockclient.lease import is_holder_column
    from lockclient.lockid import primitive_row

    def is_slot_grant(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
        return any(is_holder_column(c) and expected.get(c, "x") is None and updates.get(c) for c in updates)

    row = primitive_row("f3s", "semaphore")

    def slots() -> dict[str, str]:
        return {c: v for c, v in store.read_versioned(row).items() if is_holder_column(c)}

    faulty = FaultyStore(store)
    away = threading.Event()
    away.set()
    with RemoteLocker(faulty, lease=30) as locker:
        faulty.arm(
            "compare_and_set", raise_after=StoreOutcomeUnknown("injected: applied, answer lost"), when=is_slot_grant
        )
        faulty.arm(
            "read_versioned",
            raise_before=StoreUnavailable("injected: away"),
            when=lambda row, serial=True, **k: serial and away.is_set(),
            times=10**6,
        )
        faulty.arm(
            "compare_and_set",
            raise_before=StoreUnavailable("injected: away"),
            when=lambda *a, **k: away.is_set(),
            times=10**6,
        )
        with pytest.raises(StoreUnavailable):
            locker.get_semaphore("f3s", 2, timeout=1)
        [(column, _)] = slots().items()
        assert column != HOLDER_COLUMN, "the grant applied, in a slot"
        away.clear()
        wait_until(lambda: not slots(), "the unconfirmed grant to be released")
        assert "|released|" in store.read_versioned(row)["~ended" + column[len(HOLDER_COLUMN) :]]
        permit = locker.get_semaphore("f3s", 2, timeout=10)
        permit.release()


def test_a_holder_record_written_before_attempt_ids_has_no_attempt_and_encodes_back_the_same() -> None:
    """Records from before attempt ids (no ``a``) are still read: their attempt is empty, and the
    record encodes back to exactly the value the store holds (what a compare-and-set expects)."""
    legacy = '{"f":3,"l":5.0,"o":"host.1.t.abc","t":"0000000000000001-host.1.t.abc","v":2}'
    record = HolderRecord.decode(legacy)
    assert record.attempt == "" and (record.owner, record.version, record.token) == ("host.1.t.abc", 2, 3)
    assert record.encode() == legacy


def test_a_parking_whose_answer_was_lost_is_a_clean_release_every_time_it_is_asked(store: CellStore) -> None:
    """min_hold: the release *parks* the record. Its answer is lost (it applied); the retry finds our
    parked value and reports a clean release — and so does every later call (a caller that asks
    again, like the locker's background retry, must not be told the lock was lost)."""
    clock = Clock(100.0)
    lease = grant(store, "park-lost", clock)
    lease.park_until, lease.park_lease = 2**60, 5.0

    def is_parking(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **kw: object) -> bool:
        value = updates.get(HOLDER_COLUMN)
        return value is not None and HolderRecord.decode(value).until > 0

    faulty = FaultyStore(store)
    faulty.arm("compare_and_set", raise_after=StoreOutcomeUnknown("injected: parked, answer lost"), when=is_parking)
    with pytest.raises(StoreOutcomeUnknown):
        lease.release(faulty)
    assert HolderRecord.decode(holder_value(store, "park-lost")).until == 2**60, "the parking applied"
    assert lease.release(faulty) is True  # finds its own parked value
    assert lease.ended and lease.parked
    assert lease.release(faulty) is True
    assert not lease.lost.is_set()
