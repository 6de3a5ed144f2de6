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


def test_the_longest_wait_is_measured_in_seconds_and_in_leases_aged_to_now() -> None:
    wall = Clock(2_000.0)
    seen = Observed(wall=wall)
    # "short" has waited 40 s on a 10 s lease (4 leases); "long" 60 s on a 30 s lease (2 leases).
    seen.saw_lock("short", ("h", 1, ticket(1_900.0, "h")), [(ticket(1_960.0, "w1"), 10.0)])
    seen.saw_lock("long", ("h", 1, ticket(1_900.0, "h")), [(ticket(1_940.0, "w2"), 30.0)])
    waits = seen.longest_wait()
    assert (waits.seconds, waits.leases, waits.lock_id) == (60.0, 4.0, "short")
    # Not looked at again (looks are spaced by the lease): the waits still grow with the wall clock.
    wall.now = 2_010.0
    assert (seen.longest_wait().seconds, seen.longest_wait().leases) == (70.0, 5.0)
    # The next look finds "short"'s queue empty; "long" is forgotten (idle, or handed over).
    seen.saw_lock("short", ("h", 1, ticket(1_900.0, "h")), [])
    seen.forget("long")
    assert seen.longest_wait().seconds == 0.0 and seen.longest_wait().lock_id is None
    assert seen.recent_grants("long") == []  # forgotten with its live state
    assert [g.lock_id for g in seen.recent_grants()] == ["long", "short"]  # the global ring keeps them


def test_the_oldest_waiter_of_a_lock_is_the_one_with_the_smallest_ticket() -> None:
    seen = Observed(wall=Clock(100.0))
    seen.saw_lock("L", None, [(ticket(95.0, "b"), 1.0), (ticket(90.0, "a"), 5.0), ("garbage", 1.0)])
    waits = seen.longest_wait()
    assert (waits.seconds, waits.leases) == (10.0, 2.0)


def test_a_holder_found_at_the_first_look_of_an_inherited_lock_is_no_grant() -> None:
    """At a start or a partition take-over the holder was granted while another replica watched:
    counting it would add a wait as long as its whole hold to the histogram."""
    grants: list[Grant] = []
    seen = Observed(wall=Clock(1_000.0), on_grant=grants.append)
    seen.saw_lock("L", ("a", 7, ticket(100.0, "a")), [], inherited=True)
    assert grants == [] and seen.held_for("L", "a") is not None
    seen.saw_lock("L", ("b", 8, ticket(990.0, "b")), [], inherited=False)
    assert [(g.owner, g.wait_s) for g in grants] == [("b", 10.0)]


def test_store_errors_are_kept_newest_first_and_reported() -> None:
    reported: list[StoreErrorEvent] = []
    seen = Observed(wall=Clock(10.0), on_error=reported.append)
    seen.store_error("scan", "StoreUnavailable", "store unavailable", "L")
    seen.store_error("scan", "StoreError", "store failed")
    assert [e.kind for e in seen.recent_errors()] == ["StoreError", "StoreUnavailable"]
    assert [e.lock_id for e in reported] == ["L", None]
