"""A partition whose owner keeps renewing is never taken over, whatever the assignment says — a
takeover is judged by the owner's cell staying *unchanged* for lease + grace (mutation testing,
issue 24: a takeover that ignored the cell's value passed every test). The owner here is another
replica seen only through the store: its cell, renewed by the test, on one injected clock."""

from __future__ import annotations

from leasewatch.partitions import OWNER_COLUMN, PartitionLeases, _decode, _encode
from lockclient import CellStore
from lockclient.lockid import INDEX_SHARDS
from lockclient.store import VersionedTable
from tests.leasewatch.conftest import FakeMonotonic

LEASE = 3.0
GRACE = 0.5


def owner_of(store: CellStore, partition: int) -> str | None:
    raw = store.read_versioned(str(partition), table=VersionedTable.PARTITION).get(OWNER_COLUMN)
    decoded = _decode(raw) if raw is not None else None
    return None if decoded is None else decoded[0]


def test_a_partition_renewed_by_its_owner_is_never_taken_over_and_a_silent_one_is(
    store: CellStore, clock: FakeMonotonic
) -> None:
    # "b" holds partition 0 (its member heartbeat is not written: a lone "a" wants every partition).
    version = 1
    value = _encode("b", version, LEASE)
    claim = store.compare_and_set("0", {OWNER_COLUMN: None}, {OWNER_COLUMN: value}, table=VersionedTable.PARTITION)
    assert claim.applied
    a = PartitionLeases(store, "a", lease=LEASE, grace=GRACE, monotonic=clock, linger=lambda: 5.0)
    for step in range(1, 41):  # 10 lease lengths, a step of 0.25 s; b renews every lease / 3 (4 steps)
        a.refresh()
        assert owner_of(store, 0) == "b", "a partition whose owner renews it was taken over"
        clock.now += 0.25
        if step % 4 == 0:
            version += 1
            new = _encode("b", version, LEASE)
            cas = store.compare_and_set("0", {OWNER_COLUMN: value}, {OWNER_COLUMN: new}, table=VersionedTable.PARTITION)
            assert cas.applied
            value = new
    assert a.status().owned == frozenset(range(1, INDEX_SHARDS))
    # b stops renewing: taken over once its cell has stayed unchanged for lease + grace.
    silent_from = clock.now
    while owner_of(store, 0) == "b":
        a.refresh()
        clock.now += 0.25
        assert clock.now < silent_from + LEASE + GRACE + 2.0, "a silent owner's partition was never taken over"
    assert clock.now - silent_from > LEASE + GRACE
    assert owner_of(store, 0) == a.member and a.takeovers == 1
