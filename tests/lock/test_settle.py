"""The settle logic on its own (lockclient/settle.py: pure functions, what a simulator calls), and
the other callers of a compare-and-set whose answer was lost: leasewatch's revocation and a fenced
write (issue 23: "UNKNOWN is settled by reading back, in every caller")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, FencedResource, StaleFencingToken, StoreOutcomeUnknown, open_store
from lockclient.lease import HOLDER_COLUMN, HeldLease, HolderRecord
from lockclient.lockid import index_shard, make_ticket
from lockclient.settle import ENDED_COLUMN, EndRecord, Found, judge_answer, settle_end
from lockclient.store import Table, VersionedTable
from tests.support.faulty import FaultyStore

OURS = '{"v":3}'
PENDING = ['{"v":4,"a":"x1"}', '{"v":4,"a":"x2"}']


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def settle(row: dict[str, str], *, release_sent: bool, in_time: bool = True) -> tuple[Found, bool]:
    settled = settle_end(
        row,
        ours=OURS,
        pending=PENDING,
        token=7,
        owner="me",
        holder_column=HOLDER_COLUMN,
        release_sent=release_sent,
        seen_before_valid_until=in_time,
    )
    return settled.found, settled.proven


def test_end_records_round_trip_and_refuse_what_is_not_one() -> None:
    end = EndRecord(7, "host.1.main.ab12", "revoked", "c0ffee")
    assert EndRecord.decode(end.encode()) == end
    assert end.ends(7, "host.1.main.ab12") and not end.ends(8, "host.1.main.ab12")
    for raw in (None, "", "7|me|released", "x|me|released|a", "7|me|stolen|a", "7|me|released|a|b"):
        assert EndRecord.decode(raw) is None, raw


def test_judging_a_refused_answer() -> None:
    assert judge_answer(OURS, ours=OURS, pending=PENDING, release_sent=False) is Found.OURS
    assert judge_answer(PENDING[1], ours=OURS, pending=PENDING, release_sent=False) is Found.PENDING
    # Gone or replaced: a loss, unless a release of ours may have done it — then ~ended decides.
    assert judge_answer(None, ours=OURS, pending=PENDING, release_sent=False) is Found.LOST
    assert judge_answer('{"o":"next"}', ours=OURS, pending=PENDING, release_sent=False) is Found.LOST
    assert judge_answer('{"o":"next"}', ours=OURS, pending=PENDING, release_sent=True) is Found.READ_END
    assert judge_answer(None, ours=OURS, pending=PENDING, release_sent=True) is Found.READ_END


def test_settling_from_the_end_record() -> None:
    released = EndRecord(7, "me", "released", "r1").encode()
    revoked = EndRecord(7, "me", "revoked", "w9").encode()
    later = EndRecord(8, "next", "released", "n1").encode()
    # Our own end record: exact, whoever holds the lock now.
    assert settle({ENDED_COLUMN: released, HOLDER_COLUMN: '{"o":"next"}'}, release_sent=True) == (Found.RELEASED, True)
    assert settle({ENDED_COLUMN: revoked}, release_sent=True) == (Found.REVOKED, True)
    assert settle({ENDED_COLUMN: revoked}, release_sent=False) == (Found.REVOKED, True)
    # Still ours, or an earlier attempt of ours: nothing ended.
    assert settle({HOLDER_COLUMN: OURS, ENDED_COLUMN: later}, release_sent=True)[0] is Found.OURS
    assert settle({HOLDER_COLUMN: PENDING[0]}, release_sent=True)[0] is Found.PENDING
    # Overwritten by a later holder's end: released if a release of ours was sent — proven when
    # it was seen gone before our lease ran out (no revocation can have come first).
    assert settle({ENDED_COLUMN: later}, release_sent=True) == (Found.RELEASED, True)
    assert settle({ENDED_COLUMN: later}, release_sent=True, in_time=False) == (Found.RELEASED, False)
    # ...and without a release sent, only a revocation removes a holder's record.
    assert settle({ENDED_COLUMN: later}, release_sent=False)[0] is Found.REVOKED
    assert settle({ENDED_COLUMN: later, HOLDER_COLUMN: '{"o":"next"}'}, release_sent=False)[0] is Found.LOST


# -- leasewatch: a revocation whose answer was lost --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stale_holder(store: CellStore, lock_id: str) -> str:
    record = HolderRecord("dead-owner", 1, 5.0, make_ticket(1, "dead-owner"), 3, "g1")
    assert store.compare_and_set(lock_id, {HOLDER_COLUMN: None}, {HOLDER_COLUMN: record.encode()}).applied
    store.put(Table.INDEX, index_shard(lock_id), lock_id, "", timestamp=1)
    return record.encode()


def is_revocation(row: str, expected: dict[str, str | None], updates: dict[str, str | None], **k: object) -> bool:
    return ENDED_COLUMN in updates


@pytest.mark.parametrize("applied", [True, False], ids=["applied-answer-lost", "not-applied"])
def test_an_unknown_revocation_is_settled_by_its_end_record(store: CellStore, applied: bool) -> None:
    clock = Clock()
    faulty = FaultyStore(store)
    watcher = Watcher(faulty, grace=1.0, orphan_after=60, monotonic=clock)
    stale_holder(store, "rv")
    watcher.scan()
    clock.now += 7
    unknown = StoreOutcomeUnknown("injected: revocation timed out")
    if applied:
        faulty.arm("compare_and_set", raise_after=unknown, when=is_revocation)
    else:
        faulty.arm("compare_and_set", raise_before=unknown, when=is_revocation)
    watcher.scan()
    row = store.read_versioned("rv")
    if applied:
        end = EndRecord.decode(row[ENDED_COLUMN])
        assert end is not None and end.ends(3, "dead-owner") and end.how == "revoked"
        assert watcher.revocations == 1, "recorded exactly once, proven by its own end record"
    else:
        assert HOLDER_COLUMN in row and watcher.revocations == 0, "not applied: not recorded"
        for _ in range(4):  # a later look revokes it (the watcher watches it afresh after a failure)
            clock.now += 7
            watcher.scan()
        assert HOLDER_COLUMN not in store.read_versioned("rv") and watcher.revocations == 1


# -- a fenced write whose answer was lost -----------------------------------------------------------


def test_a_fenced_write_with_an_unknown_outcome_then_a_newer_token_says_it_may_have_applied(store: CellStore) -> None:
    """The first attempt applied (answer lost); before the retry a newer token wrote. The retry is
    refused — and says the write *may* have been accepted first (before the fix the retry started
    afresh and reported a plain refusal)."""
    faulty = FaultyStore(store)
    guard = FencedResource(faulty, "ledger")
    other = FencedResource(store, "ledger")

    def newer_token_writes(*args: object, **kwargs: object) -> None:
        other.write(6, "balance", "200", holder="b")

    faulty.arm(
        "compare_and_set",
        after=newer_token_writes,
        raise_after=StoreOutcomeUnknown("injected: applied, answer lost"),
    )
    with pytest.raises(StaleFencingToken) as refused:
        guard.write(5, "balance", "100", holder="a", timeout=5)
    assert refused.value.maybe_applied
    assert guard.read("balance") == "200"


def test_every_fenced_write_carries_its_own_attempt_id(store: CellStore) -> None:
    guard = FencedResource(store, "ledger-2")
    guard.write(5, "k", "v", holder="a")
    first = store.read_versioned("ledger-2", table=VersionedTable.FENCED)["~max-token"]
    guard.write(5, "k", "v", holder="a")
    second = store.read_versioned("ledger-2", table=VersionedTable.FENCED)["~max-token"]
    assert first != second and first.startswith("5|a|") and second.startswith("5|a|")
    assert guard.highest_token() == 5


def test_a_lease_being_released_does_not_expire_into_lost() -> None:
    """An expiry while a release is pending may be a release that landed: not reported as a loss;
    a lease nobody released is lost at its deadline."""
    clock = Clock()
    record = HolderRecord("me", 1, 5.0, make_ticket(1, "me"), 1, "g")
    releasing = HeldLease("a", record, renewed_at=clock(), monotonic=clock)
    held = HeldLease("b", record, renewed_at=clock(), monotonic=clock)
    releasing.releasing = True
    clock.now += 6
    assert not releasing.lost.is_set()
    assert held.lost.is_set() and held.lost_reason is not None and "no renewal succeeded" in held.lost_reason
