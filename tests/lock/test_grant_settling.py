"""A grant whose outcome stayed unknown is settled by re-reading the row while the store is away
(:func:`lockclient.algorithm._settle`), in virtual time: the re-reads back off, but never to more
than a second apart — a grant that did apply is confirmed within a second of the store's return
(mutation testing, issue 24: a longer cap passed every test)."""

from __future__ import annotations

from typing import Any, cast

from lockclient.algorithm import Acquisition, Services, _settle
from lockclient.errors import StoreOutcomeUnknown, StoreUnavailable
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HolderRecord
from lockclient.lockid import make_owner, make_ticket
from lockclient.runtime import Runtime
from lockclient.store.counting import CountingStore


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
