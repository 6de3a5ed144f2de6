"""The algorithms take time, waits, threads and randomness only from their runtime: a simulated run
with the real clocks, sleep, threads and the global random generator booby-trapped for calls made
*by chronolock's own code* still runs, and trips nothing. (Libraries it uses may read the clock for
their own bookkeeping — httpx's cookie jar, prometheus-client's creation times; those calls pass.)"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sim.scenario import Config, Simulation

OURS = tuple(str(Path(__file__).resolve().parents[2] / package) for package in ("lockclient", "leasewatch", "timesvc"))


@pytest.fixture
def traps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []

    def trap(owner: object, name: str) -> None:
        original: Callable[..., object] = getattr(owner, name)

        def called(*args: object, **kwargs: object) -> object:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(OURS):
                calls.append(f"{name} from {caller}")
                raise AssertionError(f"{name} called by {caller} inside the simulation")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, called)

    for name in ("monotonic", "monotonic_ns", "time", "time_ns", "sleep", "perf_counter"):
        trap(time, name)
    trap(threading.Thread, "start")
    for name in ("random", "uniform", "randint", "randrange", "choice"):
        trap(random, name)
    yield calls


def test_no_hidden_clock_sleep_thread_or_randomness(traps: list[str]) -> None:
    # Every fault family, so that the error paths (unknown outcomes, pauses, crashes) run too.
    report = Simulation(20261126, Config(duration=30.0, quiet=15.0, fault_rate=0.3)).run()
    assert traps == [], f"hidden calls: {sorted(set(traps))}"
    assert report.stats.acquisitions > 50


def test_the_primitives_take_nothing_hidden_either(traps: list[str]) -> None:
    """Semaphores, read-write locks, elections, once-per jobs and watches (issue 26), every fault family."""
    simulation = Simulation(20261127, Config(duration=30.0, quiet=15.0, fault_rate=0.3, primitives="all"))
    report = simulation.run()
    assert traps == [], f"hidden calls: {sorted(set(traps))}"
    assert all(simulation.checkers.ops.get(kind, 0) > 20 for kind in ("semaphore", "rwlock", "election", "once")), (
        simulation.checkers.ops
    )
    assert report.events > 0
