"""A grant whose outcome stayed unknown is settled by re-reading the row while the store is away
(:func:`lockclient.algorithm._settle`), in virtual time: the re-reads back off, but never to more
than a second apart — a grant that did apply is confirmed within a second of the store's return
(mutation testing, issue 24: a longer cap passed every test).

And a grant answered "not applied, uncertain" with our own record in its column applied: a slot of
a semaphore or read lock whose fencing counter another slot's grant moved meanwhile."""

from __future__ import annotations

from typing import Any, cast

from lockclient import CellStore, RemoteLocker, open_store
from lockclient.algorithm import Acquisition, Services, _settle
from lockclient.errors import StoreOutcomeUnknown, StoreUnavailable
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    SLOT_PREFIX,
    HolderRecord,
    format_fence,
    holder_columns,
    parse_fence,
    slot_column,
)
from lockclient.lockid import make_owner, make_ticket, primitive_row
from lockclient.runtime import Runtime
from lockclient.store import CasResult
from lockclient.store.counting import CountingStore
from tests.support.faulty import FaultyStore


class VirtualTime:
    """The runtime's clock and sleep, in virtual seconds."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert len(self.sleeps) < 1000, "still re-reading after 1000 pauses"
        self.sleeps.append(seconds)
        self.now += seconds


class AwayUntil:
    """A store whose reads fail until ``back_at`` (virtual time), then show ``row``."""

    def __init__(self, clock: VirtualTime, back_at: float, row: dict[str, str]) -> None:
        self.clock, self.back_at, self.row = clock, back_at, row
        self.reads: list[float] = []

    def read_versioned(self, lock_id: str, *args: Any, **kwargs: Any) -> dict[str, str]:
        self.reads.append(self.clock.now)
        if self.clock.now < self.back_at:
            raise StoreUnavailable("injected: away")
        return dict(self.row)


def test_an_unknown_grant_is_confirmed_within_a_second_of_the_store_coming_back() -> None:
    clock = VirtualTime()
    owner = make_owner()
    record = HolderRecord(owner, 1, 30.0, make_ticket(1, owner), 1)
    store = AwayUntil(clock, back_at=110.0, row={HOLDER_COLUMN: record.encode(), FENCE_COLUMN: f"1|{owner}"})
    runtime = cast(Runtime, clock)
    attempt = Acquisition(
        "L", cast(CountingStore, store), deadline=200.0, cancel=None, max_hold=None, blocking=True, runtime=runtime
    )
    # Nothing but the runtime is used while the grant is settled within the deadline.
    services = cast(Services, type("S", (), {"runtime": runtime, "lease": 30.0}))
    applied, current = _settle(services, attempt, record, StoreOutcomeUnknown("injected: answer lost"))
    assert applied and current[HOLDER_COLUMN] == record.encode()
    assert clock.now - 110.0 <= 1.0, f"confirmed {clock.now - 110.0:.2f} s after the store came back"
    assert max(clock.sleeps) == 1.0 and clock.sleeps[0] < 1.0  # backs off, to at most a second


def test_a_slot_grant_found_uncertain_because_another_slot_moved_the_fence_is_adopted(sqlite_url: str) -> None:
    """A semaphore's grant applies, its answer is lost, and before the adapter's SERIAL re-read
    another holder takes the other slot — moving the shared fencing counter. The adapter can only
    answer "not applied, uncertain" (neither all our values nor the expected ones are there), with
    our own record, attempt id and all, in our slot. That record is ours: the call returns the
    permit. (Read as "held by someone else", the call waited for a free slot, timed out and left
    its record for leasewatch — found by the simulator's ``[abandoned]`` checker, seed 20261561
    of the ``primitives`` profile, issue 24.)"""
    row_id = primitive_row("pool", "semaphore")
    other = make_owner()

    class OtherSlotTakenMeanwhile(FaultyStore):
        injected = False

        def compare_and_set(self, row: str, expected: Any, updates: Any, **kw: Any) -> CasResult:
            result = self.inner.compare_and_set(row, expected, updates, **kw)
            ours = [c for c, v in updates.items() if c.startswith(SLOT_PREFIX) and v is not None]
            if self.injected or row != row_id or not ours or not result.applied:
                return result
            self.injected = True
            fence = self.inner.read_versioned(row)[FENCE_COLUMN]
            free = next(slot_column(k) for k in range(2) if slot_column(k) not in ours)
            token = parse_fence(fence)[0] + 1
            record = HolderRecord(other, 1, 30.0, make_ticket(1, other), token).encode()
            taken = self.inner.compare_and_set(
                row, {free: None, FENCE_COLUMN: fence}, {free: record, FENCE_COLUMN: format_fence(token, other)}
            )
            assert taken.applied
            after = self.inner.read_versioned(row)
            return CasResult(applied=False, current={c: after.get(c) for c in {*expected, *updates}}, uncertain=True)

    def owners(store: CellStore) -> set[str]:
        row = store.read_versioned(row_id)
        return {HolderRecord.decode(row[column]).owner for column in holder_columns(row)}

    with open_store(sqlite_url) as inner:
        faulty = OtherSlotTakenMeanwhile(inner)
        with RemoteLocker(faulty, lease=30) as locker:
            permit = locker.get_semaphore("pool", 2, timeout=2.0)
            assert faulty.injected
            assert owners(inner) == {permit.owner, other}
            assert permit.release() is True
            assert owners(inner) == {other}, "the permit's release must remove its own slot's record"
