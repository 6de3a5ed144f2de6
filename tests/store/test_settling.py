"""lockclient.store.settling on its own, in virtual time: an unknown compare-and-set is settled by
re-reading, and every loop of it gives up *within* ``resolve_for`` on the caller's runtime clock
(the module's promise) — mutation testing, issue 24: a loop that overshot its deadline by a
pause or two passed every test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from lockclient.errors import StoreOutcomeUnknown, StoreUnavailable
from lockclient.runtime import Runtime
from lockclient.store.base import CasResult
from lockclient.store.settling import serial_read, settled_compare_and_set

EXPECTED = {"~holder": "v1|a1"}
UPDATES = {"~holder": "v2|a2"}


class VirtualTime:
    """The two things settling asks a runtime for: its monotonic clock and a sleep that moves it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        # A retry loop whose pauses shrink never reaches its deadline in virtual time: fail, not hang.
        assert len(self.sleeps) < 1000, f"still retrying after 1000 pauses, the last {seconds} s"
        self.sleeps.append(seconds)
        self.now += seconds


def runtime(clock: VirtualTime) -> Runtime:
    return cast(Runtime, clock)


def always(exc: Exception) -> Callable[[], Any]:
    def fail() -> Any:
        raise exc

    return fail


@pytest.mark.parametrize("resolve_for", [0.005, 0.3, 1.0, 2.5])
def test_an_unknown_outcome_whose_re_reads_keep_failing_gives_up_within_resolve_for(resolve_for: float) -> None:
    clock = VirtualTime()
    reads = 0

    def reread() -> dict[str, str]:
        nonlocal reads
        reads += 1
        raise StoreUnavailable("SERIAL read timed out")

    with pytest.raises(StoreOutcomeUnknown):
        settled_compare_and_set(
            always(StoreOutcomeUnknown("write timeout")),
            reread,
            "L",
            EXPECTED,
            UPDATES,
            resolve_for=resolve_for,
            runtime=runtime(clock),
        )
    assert clock.now - 100.0 <= resolve_for
    assert reads >= 1


@pytest.mark.parametrize("resolve_for", [0.005, 0.3, 1.0, 2.5])
def test_sends_refused_as_unavailable_give_up_within_resolve_for(resolve_for: float) -> None:
    clock = VirtualTime()
    with pytest.raises(StoreUnavailable):
        settled_compare_and_set(
            always(StoreUnavailable("no quorum")),
            always(AssertionError("nothing to re-read: it surely did not apply")),
            "L",
            EXPECTED,
            UPDATES,
            resolve_for=resolve_for,
            runtime=runtime(clock),
        )
    assert clock.now - 100.0 <= resolve_for


@pytest.mark.parametrize("resolve_for", [0.005, 0.3, 1.0, 2.5])
def test_a_serial_read_retried_while_unavailable_gives_up_within_resolve_for(resolve_for: float) -> None:
    clock = VirtualTime()
    with pytest.raises(StoreUnavailable):
        serial_read(always(StoreUnavailable("contention")), resolve_for=resolve_for, runtime=runtime(clock))
    assert clock.now - 100.0 <= resolve_for


def test_an_unknown_outcome_re_read_to_our_values_is_applied_and_to_the_old_ones_is_sent_again() -> None:
    clock = VirtualTime()
    sends = 0

    def send() -> CasResult:
        nonlocal sends
        sends += 1
        if sends == 1:
            raise StoreOutcomeUnknown("write timeout")
        return CasResult(applied=True, current=dict(UPDATES))

    # The first send did not apply (the row still holds the expected value): sent again.
    result = settled_compare_and_set(
        send, lambda: dict(EXPECTED), "L", EXPECTED, UPDATES, resolve_for=1.0, runtime=runtime(clock)
    )
    assert result.applied and sends == 2
    # It did apply (the row holds our value): applied, not sent again.
    result = settled_compare_and_set(
        always(StoreOutcomeUnknown("write timeout")),
        lambda: dict(UPDATES),
        "L",
        EXPECTED,
        UPDATES,
        resolve_for=1.0,
        runtime=runtime(clock),
    )
    assert result.applied and not result.uncertain
    # Someone else's value: not ours, and uncertain (a CHANGED row), never reported applied.
    result = settled_compare_and_set(
        always(StoreOutcomeUnknown("write timeout")),
        lambda: {"~holder": "v9|other"},
        "L",
        EXPECTED,
        UPDATES,
        resolve_for=1.0,
        runtime=runtime(clock),
    )
    assert not result.applied and result.uncertain


@pytest.mark.parametrize("away_for", [0.005, 0.02, 0.041, 0.1, 0.33, 0.7, 1.9, 4.2])
def test_re_reads_back_off_by_at_most_doubling(away_for: float) -> None:
    """While the SERIAL re-reads (or the sends) fail, each pause is at most double the last (and at most
    MAX_PAUSE): once the store is back, the outcome is settled no later than the time it had already
    waited (plus the first pause) — a steeper back-off left it waiting longer than it had been away."""
    from lockclient.store.settling import FIRST_PAUSE, MAX_PAUSE

    for loop in ("settle", "send", "serial_read"):
        clock = VirtualTime()
        back_at = 100.0 + away_for

        def reread(clock: VirtualTime = clock, back_at: float = back_at) -> dict[str, str]:
            if clock.now < back_at:
                raise StoreUnavailable("SERIAL read timed out")
            return dict(UPDATES)

        if loop == "settle":
            result = settled_compare_and_set(
                always(StoreOutcomeUnknown("write timeout")),
                reread,
                "L",
                EXPECTED,
                UPDATES,
                resolve_for=10.0,
                runtime=runtime(clock),
            )
            assert result.applied
        elif loop == "send":  # sends refused (surely not applied) until the store is back

            def send(clock: VirtualTime = clock, back_at: float = back_at) -> CasResult:
                if clock.now < back_at:
                    raise StoreUnavailable("no quorum")
                return CasResult(applied=True, current=dict(UPDATES))

            nothing = always(AssertionError("nothing to re-read: it surely did not apply"))
            result = settled_compare_and_set(
                send, nothing, "L", EXPECTED, UPDATES, resolve_for=10.0, runtime=runtime(clock)
            )
            assert result.applied
        else:
            assert serial_read(reread, resolve_for=10.0, runtime=runtime(clock)) == UPDATES
        late = clock.now - back_at
        assert late <= min(away_for + FIRST_PAUSE, MAX_PAUSE) + 1e-9, f"{loop}: settled {late:.3f} s after"
        assert all(b <= 2 * a + 1e-12 for a, b in zip(clock.sleeps, clock.sleeps[1:], strict=False)), clock.sleeps
