"""An acquisition's retries, in virtual time (mutation testing, issue 24: none of these was pinned):

* :meth:`Acquisition.retrying` tries an idempotent store step again while the store is away, for as
  long as the caller is willing to wait — right up to its deadline, never past it — and, with no
  deadline, until it succeeds;
* :func:`take` sends at most three compare-and-sets when the fencing counter it was told is stale
  each time (then the caller looks again), as documented.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from lockclient import LockTimeout, StoreUnavailable
from lockclient.algorithm import Acquisition, Services, take
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HeldLease
from lockclient.lockid import make_owner, make_ticket
from lockclient.runtime import Runtime
from lockclient.store import CasResult
from lockclient.store.counting import CountingStore
from lockclient.watermark import PROPOSED
from tests.lock.test_grant_settling import VirtualTime


def acquisition(clock: VirtualTime, store: object = None, deadline: float | None = None) -> Acquisition:
    runtime = cast(Runtime, clock)
    return Acquisition(
        "L", cast(CountingStore, store), deadline=deadline, cancel=None, max_hold=None, blocking=True, runtime=runtime
    )


def failing(times: int) -> Any:
    calls: list[int] = []

    def step() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise StoreUnavailable("injected: away")
        return "done"

    return step


def test_a_step_is_retried_right_up_to_the_deadline_and_never_past_it() -> None:
    clock = VirtualTime()
    # Away for 0.05 + 0.1 + 0.2 = 0.35 s, the deadline 0.5 s away: it waits that out.
    assert acquisition(clock, deadline=100.5).retrying(failing(3)) == "done"
    assert clock.now == pytest.approx(100.35)
    # Away for good: a LockTimeout at the deadline exactly — the last pause cut to what was left.
    clock = VirtualTime()
    with pytest.raises(LockTimeout):
        acquisition(clock, deadline=100.12).retrying(failing(10**6))
    assert clock.now == pytest.approx(100.12)
    assert clock.sleeps == pytest.approx([0.05, 0.07])


def test_without_a_deadline_a_step_is_retried_until_it_succeeds() -> None:
    clock = VirtualTime()
    assert acquisition(clock).retrying(failing(8)) == "done"
    assert len(clock.sleeps) == 8 and max(clock.sleeps) == 1.0  # backs off to a second


class VirtualRuntime(VirtualTime):
    """Also the attempt ids a grant asks its runtime for."""

    def token_hex(self, nbytes: int) -> str:
        return "ab" * nbytes

    def lock(self) -> threading.Lock:  # the granted lease's store mutex
        return threading.Lock()


class StaleFence:
    """A lock row whose fencing counter moves on (another grant) just before each of our grants."""

    def __init__(self) -> None:
        self.fence = 10
        self.sent = 0

    def compare_and_set(self, row: str, expected: dict[str, Any], updates: dict[str, Any], **kw: Any) -> CasResult:
        self.sent += 1
        self.fence += 1
        return CasResult(applied=False, current={HOLDER_COLUMN: None, FENCE_COLUMN: f"{self.fence}|other"})


def test_a_grant_told_a_stale_fencing_counter_each_time_sends_three_compare_and_sets_then_looks_again() -> None:
    clock = VirtualRuntime()
    store = StaleFence()
    services = cast(
        Services, type("S", (), {"runtime": cast(Runtime, clock), "lease": 30.0, "monotonic": clock.monotonic})
    )
    owner = make_owner()
    taken = take(services, acquisition(clock, store), owner, make_ticket(1, owner), "10|other")
    assert taken is None and store.sent == 3


class FenceMovedOnce:
    """A lock row whose fencing counter moved once (another grant came and went) before ours: our
    first compare-and-set, told the old counter, is refused; one told the current counter applies."""

    def __init__(self, proposed: str | None) -> None:
        self.row: dict[str, Any] = {HOLDER_COLUMN: None, FENCE_COLUMN: "11|other", PROPOSED: proposed}
        self.sent = 0

    def compare_and_set(self, row: str, expected: dict[str, Any], updates: dict[str, Any], **kw: Any) -> CasResult:
        self.sent += 1
        if all(self.row.get(column) == value for column, value in expected.items()):
            self.row.update(updates)
            return CasResult(applied=True, current=dict(self.row))
        return CasResult(applied=False, current=dict(self.row))


@pytest.mark.parametrize("proposed", [None, "5000|publisher"], ids=["no-proposal", "proposal-unchanged"])
def test_a_grant_told_a_stale_fencing_counter_retries_with_the_current_one(proposed: str | None) -> None:
    """Refused only because the counter it was told is stale — the watermark proposal it is also
    conditional on (a fair-queue grant from an overlapped look) unchanged — the grant is sent again
    with the counter the refusal returned, and applies: token 12, no second look."""
    clock = VirtualRuntime()
    store = FenceMovedOnce(proposed)
    services = cast(
        Services, type("S", (), {"runtime": cast(Runtime, clock), "lease": 30.0, "monotonic": clock.monotonic})
    )
    owner = make_owner()
    held = take(
        services, acquisition(clock, store), owner, make_ticket(1, owner), "10|other", also_expect={PROPOSED: proposed}
    )
    assert isinstance(held, HeldLease) and held.token == 12 and store.sent == 2
