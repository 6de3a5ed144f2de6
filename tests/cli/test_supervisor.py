"""The supervisor's pieces on their own: the termination schedule on an injected clock
with a fake lock (no store, no processes), the settings rule, and the watchdog with
real processes but without lockctl (the fallback where PR_SET_PDEATHSIG is unavailable).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockclient.supervisor import (
    DEFAULT_KILL_GRACE,
    KILL_MARGIN,
    TerminationSchedule,
    Watchdog,
    default_kill_grace,
    kill_grace_problem,
)

TERM, KILL = signal.SIGTERM, signal.SIGKILL
WAIT = 30.0


class FakeClock:
    """Integer milliseconds, so deadlines compare exactly."""

    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> float:
        return self.ms / 1000


class FakeLock:
    """What the schedule reads from a RemoteLock: valid_until, lost, lost_reason."""

    def __init__(self, valid_until: float) -> None:
        self.valid_until = valid_until
        self.lost = threading.Event()
        self.lost_reason: str | None = None


def make(valid_until: float = 10.0, kill_grace: float = 2.0) -> tuple[FakeClock, FakeLock, TerminationSchedule]:
    clock, lock = FakeClock(), FakeLock(valid_until)
    return clock, lock, TerminationSchedule(lock, kill_grace, margin=0.5, monotonic=clock)


def run_until(
    clock: FakeClock, schedule: TerminationSchedule, until_ms: int, step_ms: int = 10
) -> list[tuple[int, signal.Signals]]:
    """Poll every ``step_ms`` like the supervisor does; the signals sent, with their times."""
    sent = []
    while clock.ms <= until_ms:
        decision = schedule.poll()
        if decision is not None:
            sent.append((clock.ms, decision.signal))
        clock.ms += step_ms
    return sent


def test_term_at_valid_until_minus_grace_minus_margin_and_kill_at_valid_until_minus_margin() -> None:
    clock, _, schedule = make(valid_until=10.0, kill_grace=2.0)
    assert schedule.next_event() == 7.5
    assert run_until(clock, schedule, 7480) == []
    assert clock.ms == 7490
    assert schedule.allows_running()
    assert run_until(clock, schedule, 7500) == [(7500, TERM)]
    assert not schedule.allows_running()
    assert schedule.next_event() == 9.5
    assert run_until(clock, schedule, 12000) == [(9500, KILL)]
    assert schedule.lease_ended
    assert schedule.next_event() == math.inf
    assert schedule.poll() is None


def test_a_renewal_in_time_moves_the_deadlines_and_nothing_is_sent() -> None:
    clock, lock, schedule = make(valid_until=10.0)
    assert run_until(clock, schedule, 6000) == []
    lock.valid_until = 16.0  # renewed: its start (t=6) + a 10 s lease
    assert run_until(clock, schedule, 13490) == []
    assert not schedule.lease_ended
    assert run_until(clock, schedule, 20000) == [(13500, TERM), (15500, KILL)]


def test_a_renewal_after_sigterm_cancels_nothing() -> None:
    clock, lock, schedule = make(valid_until=10.0)
    assert run_until(clock, schedule, 7500) == [(7500, TERM)]
    lock.valid_until = 17.6  # a renewal that was hung finally succeeded
    assert run_until(clock, schedule, 20000) == [(9500, KILL)]  # kill_grace after SIGTERM, as announced
    assert schedule.lease_ended


def test_lost_lock_terminates_at_once_and_kills_after_the_grace() -> None:
    clock, lock, schedule = make(valid_until=10.0)
    assert run_until(clock, schedule, 2990) == []
    lock.lost_reason = "lease revoked"
    lock.lost.set()
    decision = schedule.poll()
    assert decision is not None
    assert decision.signal == TERM
    assert "lease revoked" in decision.reason
    assert run_until(clock, schedule, 12000) == [(5000, KILL)]
    assert schedule.lease_ended


def test_lost_lock_near_the_end_is_killed_by_the_lease_deadline_not_the_grace() -> None:
    clock, lock, schedule = make(valid_until=10.0, kill_grace=2.0)
    clock.ms = 8000  # the supervisor woke late: SIGTERM now, and SIGKILL cannot wait the full grace
    lock.lost.set()
    decision = schedule.poll()
    assert decision is not None
    assert decision.signal == TERM
    assert "SIGKILL in 1.50 s" in decision.reason
    assert run_until(clock, schedule, 12000) == [(9500, KILL)]


def test_a_late_wake_up_past_the_kill_deadline_kills_without_sigterm() -> None:
    clock, _, schedule = make(valid_until=10.0)
    clock.ms = 9700  # the supervisor was not scheduled for a while
    assert run_until(clock, schedule, 12000) == [(9700, KILL)]
    assert schedule.lease_ended


def test_requested_termination_of_leftovers_is_not_a_lease_problem() -> None:
    clock, _, schedule = make(valid_until=10.0)
    clock.ms = 1000
    schedule.request("leftover processes of the command")
    assert run_until(clock, schedule, 6000) == [(1000, TERM), (3000, KILL)]
    assert not schedule.lease_ended


def test_leftover_termination_is_cut_short_by_the_lease() -> None:
    clock, _, schedule = make(valid_until=10.0)
    clock.ms = 8500  # leftovers found late in the lease (after a renewal failed, say)
    schedule.request("leftover processes of the command")
    assert run_until(clock, schedule, 12000) == [(8500, TERM), (9500, KILL)]
    assert schedule.lease_ended


@pytest.mark.parametrize(("latency_ms", "terminated"), [(490, False), (520, True)])
def test_healthy_renewals_never_terminate_at_the_settings_limit(latency_ms: int, terminated: bool) -> None:
    """lease 3, kill_grace 1 (kill_grace + margin = lease/2, the largest allowed): renewals
    every lease/3 that take up to lease/6 (0.5 s) never start a termination."""
    lease, kill_grace = 3.0, 1.0
    assert kill_grace_problem(kill_grace, lease) is None
    clock, lock = FakeClock(), FakeLock(valid_until=lease)  # acquired at t=0
    schedule = TerminationSchedule(lock, kill_grace, margin=0.5, monotonic=clock)
    sent = []
    while clock.ms <= 20_000:
        started_ms = (clock.ms // 1000) * 1000  # renewals start every lease/3 = 1 s ...
        if clock.ms - started_ms >= latency_ms:  # ... and succeed latency_ms later
            lock.valid_until = started_ms / 1000 + lease  # valid from the start of the renewal
        decision = schedule.poll()
        if decision is not None:
            sent.append(decision.signal)
        clock.ms += 10
    assert bool(sent) == terminated


@pytest.mark.parametrize(
    ("kill_grace", "lease", "ok"),
    [
        (DEFAULT_KILL_GRACE, 10.0, True),
        (4.5, 10.0, True),  # 4.5 + 0.5 = 10 / 2
        (4.6, 10.0, False),
        (5.0, 10.0, False),  # the old default: SIGKILL would come after leasewatch may revoke
        (0.5, 3.0, True),
        (1.0, 3.0, True),
        (0.5, 1.0, False),
        (0.0, 0.9, False),  # even without a grace the margin does not fit
        (math.nan, 10.0, False),
        (math.inf, 10.0, False),
        (-1.0, 10.0, False),
    ],
)
def test_kill_grace_must_fit_in_half_the_lease(kill_grace: float, lease: float, ok: bool) -> None:
    problem = kill_grace_problem(kill_grace, lease)
    assert (problem is None) == ok, problem
    if not ok:
        assert "--kill-grace" in problem  # type: ignore[operator]
    assert KILL_MARGIN == 0.5  # the documented constant


@pytest.mark.parametrize(("lease", "expected"), [(10.0, 2.0), (5.0, 2.0), (3.0, 1.0), (1.5, 0.25), (1.0, 0.0)])
def test_default_kill_grace_fits_the_lease(lease: float, expected: float) -> None:
    assert default_kill_grace(lease) == expected
    assert kill_grace_problem(default_kill_grace(lease), lease) is None


def test_no_default_kill_grace_fits_a_lease_under_a_second() -> None:
    assert default_kill_grace(0.8) < 0


# -- the watchdog alone (the fallback without PR_SET_PDEATHSIG) ---------------------------------


def can_run(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_for_file(path: Path) -> str:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.005)
    return path.read_text()


@pytest.fixture
def started_pids() -> Iterator[list[int]]:
    """Pids this test started (read from files); any still running at the end is killed by pid."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if can_run(pid):
            os.kill(pid, signal.SIGKILL)


def start_group(tmp_path: Path, started_pids: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """A process group like a command's: a shell leader and a grandchild that ignores SIGTERM."""
    script = "(trap '' HUP INT TERM; exec sleep 60) & echo $! > gc.tmp && mv gc.tmp gc.pid; exec sleep 60"
    leader = subprocess.Popen(["/bin/sh", "-c", script], cwd=tmp_path, process_group=0)
    started_pids.append(leader.pid)
    grandchild = int(wait_for_file(tmp_path / "gc.pid"))
    started_pids.append(grandchild)
    return leader, grandchild


def test_watchdog_kills_the_group_when_the_supervisor_end_closes(tmp_path: Path, started_pids: list[int]) -> None:
    watchdog = Watchdog.start()
    leader, grandchild = start_group(tmp_path, started_pids)
    watchdog.arm(leader.pid)

    started = time.monotonic()
    watchdog.close()  # what the kernel does to lockctl's end of the pipe when lockctl dies
    while can_run(leader.pid) or can_run(grandchild):
        assert time.monotonic() - started < 2.0, "the watchdog did not kill the group"
        time.sleep(0.001)
    elapsed = time.monotonic() - started
    assert leader.wait(timeout=WAIT) == -signal.SIGKILL
    watchdog.wait()
    assert watchdog.proc.returncode == 0
    print(f"watchdog alone: group dead {elapsed * 1000:.1f} ms after the supervisor's end closed")


def test_watchdog_survives_signals_and_a_disarmed_one_kills_nothing(tmp_path: Path, started_pids: list[int]) -> None:
    watchdog = Watchdog.start()
    leader, grandchild = start_group(tmp_path, started_pids)
    watchdog.arm(leader.pid)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(watchdog.proc.pid, sig)
    assert os.getsid(watchdog.proc.pid) == watchdog.proc.pid  # its own session: out of lockctl's job

    watchdog.disarm()  # pending signals reach it before it can read "done": a fatal one would show below
    watchdog.wait()
    assert watchdog.proc.returncode == 0
    assert can_run(leader.pid)
    assert can_run(grandchild)
    leader.kill()
    leader.wait(timeout=WAIT)
