"""Replicas share the lock-id space: partition leases judged by observation (leasewatch/partitions.py).

In-process replicas on a real SQLite store with one injected monotonic clock; the same protocol
with real leasewatch processes is in test_partition_failover.py."""

from __future__ import annotations

from leasewatch.partitions import MEMBERS_ROW, OWNER_COLUMN, PartitionLeases, assign
from leasewatch.watcher import Watcher
from lockclient import CellStore, RemoteLocker
from lockclient.lockid import INDEX_SHARDS, index_shard
from lockclient.store import VersionedTable
from tests.leasewatch.conftest import FakeMonotonic

LEASE = 3.0
GRACE = 0.5


def replica(store: CellStore, clock: FakeMonotonic, name: str) -> PartitionLeases:
    return PartitionLeases(store, name, lease=LEASE, grace=GRACE, monotonic=clock, linger=lambda: 5.0)


def settle(replicas: list[PartitionLeases], clock: FakeMonotonic, rounds: int = 4, step: float = 0.5) -> None:
    for _ in range(rounds):
        for r in replicas:
            r.refresh()
        clock.now += step


def owners(store: CellStore) -> dict[int, str]:
    rows = store.read_versioned_many([str(p) for p in range(INDEX_SHARDS)], table=VersionedTable.PARTITION)
    return {int(row): cells[OWNER_COLUMN] for row, cells in rows.items() if OWNER_COLUMN in cells}


def test_assignment_is_deterministic_balanced_and_stable() -> None:
    three = assign(["a", "b", "c"])
    assert three == assign(["c", "b", "a"])
    loads = sorted(list(three.values()).count(m) for m in "abc")
    assert sum(loads) == 64 and loads[-1] <= 22  # ceil(64 / 3)
    two = assign(["a", "b"])
    assert sorted(list(two.values()).count(m) for m in "ab") == [32, 32]
    # "c" leaving moves c's partitions; most of a's and b's stay where they were.
    kept = sum(1 for p, m in three.items() if m != "c" and two[p] == m)
    assert kept >= 36
    assert assign([]) == {}


def test_a_lone_replica_claims_every_partition_at_once(store: CellStore, clock: FakeMonotonic) -> None:
    lone = replica(store, clock, "lone")
    status = lone.refresh()
    assert status.owned == frozenset(range(INDEX_SHARDS)) and status.watching == status.owned
    assert status.members == (lone.member,)
    assert len(owners(store)) == INDEX_SHARDS
    assert lone.member in store.read_versioned(MEMBERS_ROW, table=VersionedTable.PARTITION)


def test_replicas_share_the_partitions_and_a_joiner_gets_its_share(store: CellStore, clock: FakeMonotonic) -> None:
    a = replica(store, clock, "a")
    a.refresh()
    b, c = replica(store, clock, "b"), replica(store, clock, "c")
    settle([a, b, c], clock)
    shares = [r.status().owned for r in (a, b, c)]
    assert sum(len(s) for s in shares) == INDEX_SHARDS
    assert all(20 <= len(s) <= 22 for s in shares), [len(s) for s in shares]
    assert not (shares[0] & shares[1]) and not (shares[1] & shares[2]) and not (shares[0] & shares[2])
    # What a handed over, it keeps watching for a while (the joiner needs a full lease first).
    assert a.status().watching > a.status().owned
    clock.now += 6.0
    a.refresh()
    assert a.status().watching == a.status().owned


def test_a_dead_replicas_partitions_are_taken_over_after_its_lease_never_before(
    store: CellStore, clock: FakeMonotonic
) -> None:
    a, b, c = (replica(store, clock, n) for n in "abc")
    settle([a, b, c], clock)
    dead_share = c.status().owned
    assert dead_share
    clock.now += LEASE / 3
    c.refresh()  # c's last renewal (every lease/3: due now)...
    died_at = clock.now  # ...and then it stops (a SIGKILL: it renews nothing any more)
    while clock.now < died_at + LEASE + GRACE - 0.1:
        for r in (a, b):
            r.refresh()
            assert not (r.status().owned & dead_share), "taken over before c's lease + grace ran out"
        clock.now += 0.2
    clock.now = died_at + LEASE + GRACE + 0.6  # c's last renewal was up to lease/3 before it died
    settle([a, b], clock, rounds=3, step=0.2)
    taken = a.status().owned | b.status().owned
    assert taken == frozenset(range(INDEX_SHARDS))
    assert a.takeovers + b.takeovers == len(dead_share)
    assert sorted(len(r.status().owned) for r in (a, b)) == [32, 32]
    assert c.member not in store.read_versioned(MEMBERS_ROW, table=VersionedTable.PARTITION)  # cleaned up


def test_a_paused_replica_loses_nothing_it_renews_and_gets_its_share_back(
    store: CellStore, clock: FakeMonotonic
) -> None:
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    settle([a, b], clock)
    before = b.status().owned
    clock.now += 3 * LEASE  # b is paused for three leases; a refreshes meanwhile
    settle([a], clock, rounds=2, step=0.2)
    assert a.status().owned == frozenset(range(INDEX_SHARDS))
    settle([a, b], clock, rounds=6, step=0.5)  # b resumes: it learns what it lost, then gets a share
    assert b.status().owned and not (a.status().owned & b.status().owned)
    assert len(a.status().owned) + len(b.status().owned) == INDEX_SHARDS
    assert b.status().owned == before  # the same assignment as before the pause


def test_a_clean_shutdown_hands_everything_over_at_once(store: CellStore, clock: FakeMonotonic) -> None:
    a, b = replica(store, clock, "a"), replica(store, clock, "b")
    settle([a, b], clock)
    b.release_all()
    settle([a], clock, rounds=2, step=0.1)  # no lease to wait for
    assert a.status().owned == frozenset(range(INDEX_SHARDS))


def lock_in(shard: int, tag: str) -> str:
    """A lock id whose index shard (= partition) is ``shard``."""
    return next(f"{tag}-{i}" for i in range(10_000) if index_shard(f"{tag}-{i}") == str(shard))


def test_a_new_owner_revokes_nothing_before_it_watched_a_full_lease(store: CellStore, clock: FakeMonotonic) -> None:
    """The take-over rule: whoever watches a partition now judges its leases by its own
    observations only — a dead holder in a dead replica's partition is revoked late, never early."""
    with RemoteLocker(store, lease=2.0) as locker:
        mine, theirs = lock_in(1, "mine"), lock_in(2, "theirs")
        dead_mine, dead_theirs = locker.get_lock(mine), locker.get_lock(theirs)
        for lock in (dead_mine, dead_theirs):
            locker._services.keeper.remove(lock._lease)  # both holders die now
        a = Watcher(store, grace=GRACE, monotonic=clock, replica_id="a")
        report = a.scan(shards={1})
        assert report.locks == 1 and report.leases == 1  # only its own partition's lock
        clock.now += 1.0
        a.scan(shards={1, 2})  # it took partition 2 over: its first sighting of that holder
        clock.now += 1.6  # 2.6 s > lease + grace for the first lock, 1.6 s for the second
        report = a.scan(shards={1, 2})
        assert report.revoked == 1 and a.events[-1].lock_id == mine
        clock.now += 1.0  # 2.6 s since it first saw the second holder
        assert a.scan(shards={1, 2}).revoked == 1 and a.events[-1].lock_id == theirs
        assert a.events[-1].unchanged_for is not None and a.events[-1].unchanged_for > 2.0 + GRACE
