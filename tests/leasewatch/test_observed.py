"""leasewatch.observed: grants, waits and store errors as a watcher sees them (injected clocks)."""

from __future__ import annotations

from leasewatch.observed import Grant, Observed, StoreErrorEvent, ticket_seconds
from lockclient.lockid import make_ticket


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def ticket(at_s: float, owner: str) -> str:
    return make_ticket(int(at_s * 1e6), owner)


def test_a_new_holder_is_one_grant_with_its_wait_from_the_ticket() -> None:
    wall, mono = Clock(1_000.0), Clock(50.0)
    grants: list[Grant] = []
    seen = Observed(wall=wall, monotonic=mono, on_grant=grants.append)
    t = ticket(994.0, "a")
    assert ticket_seconds(t) == 994.0
    seen.saw_lock("L", ("a", 1, t), [])
    seen.saw_lock("L", ("a", 1, t), [])  # the same holder at the next scan: no new grant
    assert [(g.owner, g.fencing_token, g.wait_s) for g in grants] == [("a", 1, 6.0)]
    mono.now, wall.now = 53.5, 1_003.5
    since, held = seen.held_for("L", "a") or (None, None)
    assert held == 3.5 and since is not None and since.timestamp() == 1_000.0
    assert seen.held_for("L", "b") is None
    seen.saw_lock("L", ("b", 2, ticket(1_001.0, "b")), [])
    assert [g.owner for g in seen.recent_grants("L")] == ["b", "a"]  # newest first
    assert seen.grants_seen == 2


def test_the_longest_wait_is_measured_in_seconds_and_in_leases() -> None:
    wall = Clock(2_000.0)
    seen = Observed(wall=wall)
    seen.begin_scan()
    # "short" has waited 40 s on a 10 s lease (4 leases); "long" 60 s on a 30 s lease (2 leases).
    seen.saw_lock("short", ("h", 1, ticket(1_900.0, "h")), [(ticket(1_960.0, "w1"), 10.0)])
    seen.saw_lock("long", ("h", 1, ticket(1_900.0, "h")), [(ticket(1_940.0, "w2"), 30.0)])
    waits = seen.end_scan(["short", "long"])
    assert (waits.seconds, waits.leases, waits.lock_id) == (60.0, 4.0, "short")
    # The next scan finds both queues empty: the gauge falls back to zero.
    seen.begin_scan()
    seen.saw_lock("short", None, [])
    assert seen.end_scan(["short"]).seconds == 0.0
    assert seen.recent_grants("long") == []  # forgotten with its live state
    assert [g.lock_id for g in seen.recent_grants()] == ["long", "short"]  # the global ring keeps them


def test_store_errors_are_kept_newest_first_and_reported() -> None:
    reported: list[StoreErrorEvent] = []
    seen = Observed(wall=Clock(10.0), on_error=reported.append)
    seen.store_error("scan", "StoreUnavailable", "store unavailable", "L")
    seen.store_error("scan", "StoreError", "store failed")
    assert [e.kind for e in seen.recent_errors()] == ["StoreError", "StoreUnavailable"]
    assert [e.lock_id for e in reported] == ["L", None]
