"""Waiting for a condition in a test, with a bound that names what was awaited."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from lockclient.clock import GlobalClock
from lockclient.lockid import ticket_time


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.01)


def wait_queued(
    tickets: Callable[[], Sequence[str]], count: int, clocks: Sequence[GlobalClock], what: str, timeout: float = 10.0
) -> None:
    """Wait until ``count`` contenders are queued (``tickets``: the queue's ticket columns) and the
    newest one's enqueue is *complete* in the sense of the FIFO promise (docs/guarantees.md, "Order
    (FIFO)"): global time, as each of ``clocks`` sees it (the lower end of its interval), has passed
    its ticket — so a contender that starts after this, on any of these clocks, takes a larger ticket.

    Waiting only for the queue cell to appear is not enough: its owner may still be in its commit
    wait, and a contender started then on another client's clock may rightly take a smaller ticket
    and be served first (a run at load ~20 saw grants in the order [0, 1, 2, 4, 3])."""

    def settled() -> bool:
        queue = tickets()
        if len(queue) != count:
            return False
        newest = max(ticket_time(t) for t in queue)
        return all(clock.now_us() > newest for clock in clocks)

    wait_until(settled, what, timeout)


class StallProbe:
    """How much of the machine the test's processes were denied: a thread that, every ``period``,
    wakes up and does a fixed small piece of work, and records as a stall (its start on
    ``CLOCK_MONOTONIC``, its length) how much later than ``period + jitter`` it woke up and how much
    longer than its quietest run the work took.

    A liveness bound on real processes holds while they get the CPU; on a shared 2-core machine
    (CI, or a test run beside ``stress-ng``) they may not: a process that is runnable but not
    running, or runs at a third of a core, reaches its deadline late. Like the fault harness's
    *observed* stalls (tests/faults/harness.py), the stall this probe saw during a measured window
    is added to the bound, so the test judges the promise and not the machine's load. The probe is
    one more thread among the test's processes (about 5 % of a core), so it waits as they do."""

    def __init__(self, period: float = 0.02, jitter: float = 0.005, work_s: float = 0.001) -> None:
        self.period = period
        self.jitter = jitter
        self._stalls: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rounds = self._calibrate(work_s)
        self._quietest = min(self._work() for _ in range(20))
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)

    @staticmethod
    def _calibrate(work_s: float) -> int:
        rounds = 1000
        while True:
            started = time.perf_counter()
            sum(range(rounds))
            if time.perf_counter() - started >= work_s or rounds > 10**8:
                return rounds
            rounds *= 2

    def _work(self) -> int:
        started = time.monotonic_ns()
        sum(range(self._rounds))
        return time.monotonic_ns() - started

    def __enter__(self) -> StallProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            before = time.monotonic_ns()
            if self._stop.wait(self.period):
                return
            late = time.monotonic_ns() - before - int(self.period * 1e9)
            lost = (late if late > self.jitter * 1e9 else 0) + max(0, self._work() - self._quietest)
            if lost > 0:
                with self._lock:
                    self._stalls.append((before, lost))

    def stalled_s(self, since_ns: int, until_ns: int | None = None) -> float:
        """Seconds of stall whose sleep began in ``[since_ns, until_ns]`` (until now if None)."""
        until = time.monotonic_ns() if until_ns is None else until_ns
        with self._lock:
            return sum(late for start, late in self._stalls if since_ns <= start <= until) / 1e9


def assert_within_bound(
    took: float, bound: float, stalls: StallProbe, since_ns: int, what: str, *, earliest: float | None = None
) -> None:
    """``took`` seconds from ``since_ns`` (``time.monotonic_ns``) is within ``bound`` plus the stall
    ``stalls`` observed meanwhile (a liveness bound holds while the processes get the CPU), and —
    ``earliest`` — not below it (safety: never excused)."""
    stalled = stalls.stalled_s(since_ns, since_ns + int(took * 1e9))
    print(f"{what}: {took:.3f}s (bound {bound:.1f}s + {stalled:.3f}s of observed stalls)")
    assert took <= bound + stalled, f"{what} took {took:.3f}s (bound {bound:.1f}s + {stalled:.3f}s stalled)"
    if earliest is not None:
        assert took >= earliest, f"{what} took only {took:.3f}s: too early (earliest {earliest:.3f}s)"
