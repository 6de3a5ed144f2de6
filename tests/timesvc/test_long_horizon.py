"""Global time over a simulated hour per clock fault: the real ``GlobalTimeUpdater`` code, three
replicas over one SQLite store, with simulated wall and monotonic clocks (DESIGN.md §4, §7.3).

Real processes cannot run for an hour in a test, and libfaketime cannot change a monotonic clock's
rate; here time is virtual. Each replica ticks on its own monotonic clock (staggered, as real
replicas are), clients ask random replicas for ``/now`` at random moments, and after every run
the promise is checked against real (simulated) time:

* a majority of replicas (two of three) have correct clocks: within ``max_skew/2`` of real time
  (here +0.45 s and -0.45 s: the edges), rate errors within ρ on every monotonic clock;
* whatever the third does — fast at any rate, slow, stepping ±600 s, stopped, lying, configured
  ``TIMESVC_REPLICAS=1`` — global time is never more than ``max_skew`` ahead of real time, never
  decreases, and never freezes while any replica runs; and the faulty replica refuses its clock.

Seeded, so a failure replays exactly; a few seconds of CPU for all scenarios.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lockclient import CellStore, open_store
from lockclient.globaltime import GlobalTimeNotEstablished, GlobalTimeUpdater

S = 1_000_000  # µs
NS = 1_000_000_000
T0_US = 1_800_000_000 * S  # real time at the start of the simulation (µs since the epoch)
MAX_SKEW = 1.0
TICK = 2.0  # s: coarser than the default 0.5 s, so an hour stays cheap; lags are larger, not smaller
STALE_AFTER = 4 * TICK
HOUR = 3600.0
RHO = 500e-6

WallFn = Callable[[float], float]
"""Real seconds since the start → this replica's wall clock, in seconds since the start."""


def correct(offset: float) -> WallFn:
    return lambda t: t + offset


def rate(r: float, offset: float = 0.0, start: float = 0.0) -> WallFn:
    return lambda t: offset + (t if t < start else start + (t - start) * r)


def jump(by: float, at: float, offset: float = 0.0) -> WallFn:
    return lambda t: t + offset + (by if t >= at else 0.0)


def stopped(at: float) -> WallFn:
    return lambda t: min(t, at)


@dataclass
class Replica:
    name: str
    wall: WallFn
    mono_rate: float = 1.0
    replicas: int = 3
    phase: float = 0.0
    runs: Callable[[float], bool] = lambda t: True
    """Whether the process runs at real time t (a stopped process neither ticks nor answers)."""
    updater: GlobalTimeUpdater | None = None
    refused: bool = False
    """Did it ever refuse its clock ("clock")."""

    def wall_us(self, now: list[float]) -> Callable[[], int]:
        return lambda: T0_US + int(self.wall(now[0]) * S)

    def monotonic_ns(self, now: list[float]) -> Callable[[], int]:
        return lambda: 10**12 + int(now[0] * self.mono_rate * NS)


@dataclass
class Outcome:
    max_ahead_s: float = -1e9
    max_behind_s: float = -1e9
    values: list[tuple[float, int]] = field(default_factory=list)
    """(real time, global time) after each run."""
    runs: int = 0


def simulate(
    store: CellStore,
    replicas: list[Replica],
    *,
    seconds: float = HOUR,
    seed: int = 1,
    requests_per_s: float = 0.25,
) -> Outcome:
    """Run the replicas' ticks and random /now requests for ``seconds`` of real time, checking
    after every run that global time never decreased and was never more than max_skew ahead."""
    rng = random.Random(seed)
    now = [0.0]
    for r in replicas:
        r.updater = GlobalTimeUpdater(
            store,
            replica_id=r.name,
            max_skew=MAX_SKEW,
            replicas=r.replicas,
            stale_after=STALE_AFTER,
            wall_us=r.wall_us(now),
            monotonic_ns=r.monotonic_ns(now),
        )
    events: list[tuple[float, int, str, int]] = []
    order = 0
    for i, r in enumerate(replicas):
        # Ticks are scheduled on each replica's monotonic clock: a real period of TICK / rate.
        heapq.heappush(events, (r.phase, order, "tick", i))
        order += 1
    heapq.heappush(events, (rng.expovariate(requests_per_s), order, "now", -1))
    out = Outcome()
    highest = 0
    while events:
        t, _, kind, i = heapq.heappop(events)
        if t > seconds:
            break
        now[0] = t
        if kind == "tick":
            heapq.heappush(events, (t + TICK / replicas[i].mono_rate, order := order + 1, "tick", i))
        else:
            heapq.heappush(events, (t + rng.expovariate(requests_per_s), order := order + 1, "now", -1))
            i = rng.randrange(len(replicas))
        r = replicas[i]
        if not r.runs(t):
            continue
        assert r.updater is not None
        try:
            result = r.updater.update(report_clock=kind == "tick")
        except GlobalTimeNotEstablished:
            continue  # the first value needs a majority; nothing was handed out
        out.runs += 1
        real_us = T0_US + int(t * S)
        assert result.now_us >= highest, f"global time decreased at t={t:.3f}s ({r.name})"
        highest = result.now_us
        value = result.now_us  # the cell after this run: runs are sequential here
        ahead = (value - real_us) / S
        assert ahead <= MAX_SKEW + 1e-6, f"global time {ahead:+.3f}s ahead of real time at t={t:.1f}s ({r.name})"
        out.max_ahead_s = max(out.max_ahead_s, ahead)
        if t > 60:
            out.max_behind_s = max(out.max_behind_s, -ahead)
        out.values.append((t, value))
        r.refused = r.refused or result.runaway  # its clock refused ("clock" in result.refusing)
    return out


def assert_never_frozen(
    out: Outcome, *, window: float = 60.0, running: Callable[[float], bool] = lambda t: True
) -> None:
    """In every window in which some replica runs, global time advanced at (close to) real rate."""
    by_window: dict[int, list[int]] = {}
    for t, v in out.values:
        by_window.setdefault(int(t // window), []).append(v)
    for w, values in by_window.items():
        if w == 0 or not running(w * window):
            continue
        previous = by_window.get(w - 1)
        if not previous:
            continue
        advanced = (max(values) - max(previous)) / S
        assert advanced >= window * (1 - 4 * RHO) - 2 * TICK, f"global time froze: {advanced:.3f}s in window {w}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CellStore]:
    with open_store(f"sqlite:///{tmp_path}/cells.db") as s:
        yield s


def healthy() -> list[Replica]:
    """Two correct replicas at the edges of max_skew/2, their monotonic clocks ±ρ off."""
    return [
        Replica("a", correct(+0.45), mono_rate=1 + RHO, phase=0.1),
        Replica("b", correct(-0.45), mono_rate=1 - RHO, phase=0.45),
    ]


FAULTS: dict[str, Callable[[], Replica]] = {
    "fast 1.1x": lambda: Replica("f", rate(1.1), phase=0.8),
    "fast 2x": lambda: Replica("f", rate(2.0), phase=0.8),
    "fast 10x": lambda: Replica("f", rate(10.0), phase=0.8),
    "fast 1.6x from minute 5": lambda: Replica("f", rate(1.6, start=300.0), phase=0.8),
    "slow 0.5x": lambda: Replica("f", rate(0.5), phase=0.8),
    "jump +600 s": lambda: Replica("f", jump(+600.0, at=300.0), phase=0.8),
    "jump -600 s": lambda: Replica("f", jump(-600.0, at=300.0), phase=0.8),
    "stopped clock": lambda: Replica("f", stopped(at=300.0), phase=0.8),
    "lying reading 10^13 s": lambda: Replica("f", correct(1e13), phase=0.8),
    "TIMESVC_REPLICAS=1, +600 s": lambda: Replica("f", correct(600.0), replicas=1, phase=0.8),
    "monotonic +500 ppm, clock +0.45 s": lambda: Replica("f", correct(0.45), mono_rate=1 + RHO, phase=0.8),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_hour_of_one_faulty_clock_never_drags_global_time(store: CellStore, fault: str) -> None:
    faulty = FAULTS[fault]()
    replicas = [*healthy(), faulty]
    out = simulate(store, replicas, seed=zlib.crc32(fault.encode()))
    assert out.runs > 3 * HOUR / TICK * 0.9
    assert out.max_ahead_s <= MAX_SKEW
    # Two correct replicas run: global time also stays near real time from below.
    assert out.max_behind_s <= MAX_SKEW, f"global time fell {out.max_behind_s:.3f}s behind real time"
    assert_never_frozen(out)
    wrong_by_more_than_max_skew = fault not in ("monotonic +500 ppm, clock +0.45 s",)
    if wrong_by_more_than_max_skew:
        assert faulty.refused, "a clock that disagrees with the majority by more than max_skew must be refused"
    assert not any(r.refused for r in replicas[:2]), "a correct clock was refused"


def test_never_frozen_and_never_dragged_while_only_a_fast_replica_runs(store: CellStore) -> None:
    """The healthy replicas stop for 20 minutes (killed, partitioned away); the one left runs at 2×.
    Without a majority it publishes only the carry: global time keeps advancing at (close to) real
    rate, and not at its clock's rate."""

    def healthy_runs(t: float) -> bool:
        return not 600.0 <= t < 1800.0

    a, b = healthy()
    a.runs = b.runs = healthy_runs
    fast = Replica("f", rate(2.0), phase=0.8)
    out = simulate(store, [a, b, fast], seed=7)
    assert out.max_ahead_s <= MAX_SKEW
    assert_never_frozen(out)
    # While only the fast replica ran, global time went on from the carry alone.
    during = [v for t, v in out.values if 700.0 <= t < 1800.0]
    assert (during[-1] - during[0]) / S >= (1800.0 - 700.0) * (1 - 4 * RHO) - 2 * TICK


def test_a_monotonic_clock_fast_by_rho_cannot_drag_global_time_by_its_carry(store: CellStore) -> None:
    """Every replica's monotonic clock runs 500 ppm fast (all within ρ) and no clock is faulty:
    an undiscounted carry (observed + elapsed) would move global time 1.8 s ahead per hour."""
    replicas = [
        Replica("a", correct(0.0), mono_rate=1 + RHO, phase=0.1),
        Replica("b", correct(0.0), mono_rate=1 + RHO, phase=0.45),
        Replica("c", correct(0.0), mono_rate=1 + RHO, phase=0.8),
    ]
    out = simulate(store, replicas, seed=3)
    assert out.max_ahead_s <= MAX_SKEW / 2 + 0.01, f"{out.max_ahead_s:.3f}s ahead with every clock correct"
    assert_never_frozen(out)
