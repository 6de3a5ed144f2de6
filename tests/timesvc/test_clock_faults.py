"""One faulty clock among three real timesvc replicas (issue 22; DESIGN.md §4, §7.3).

Three ``timesvc serve`` processes on 127.0.0.1 share one SQLite store; two have correct clocks,
the third runs under libfaketime with a run-time clock file (``FAKETIME_TIMESTAMP_FILE``, re-read
every second: :func:`tests.support.procs.clock_file_env`; its monotonic clock stays real). Once all
three run, the third's clock goes wrong — fast at 1.1×, 1.6×, 2×, 10× (libfaketime applies a rate
since the process started, so it also jumps at once), slow at 0.5×, ±600 s, stopped — and clients
read ``/now`` from every replica in turn. The guarantee, judged against this test process's own (real) clock:

* every value is within ``max_skew`` of real time at some moment of its read's window [invoke,
  complete] (never more than ``max_skew`` ahead: the faulty clock does not drag global time);
* no client ever sees ``/now`` decrease, across replicas;
* the faulty replica refuses its clock once it is more than ``max_skew`` off, and says so on
  ``/readyz``, ``/status`` and ``/metrics``; the correct replicas never do.

A replica configured with ``TIMESVC_REPLICAS=1`` beside two configured for three, and wall-clock
steps of ±60 s on a timesvc host (its ticks keep their period), are here too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.history import Read, monotonic_read_violations
from tests.support.procs import Fleet, ServiceProcess, clock_file_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MAX_SKEW_US = 1_000_000
TICK = 0.5


@dataclass
class Observed:
    reads: list[Read] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    """503 answers per replica."""
    timed_out: int = 0
    """Reads that got no answer in time: a stall of this (shared, loaded) machine, not a value to judge."""
    max_ahead_us: int = -(10**18)
    """The largest (value - real time at the read's completion): how far ahead of real time a value
    certainly was (it was produced before its read completed)."""
    max_behind_us: int = -(10**18)
    """The largest (real time at the read's invocation - value)."""


def observe(client: httpx.Client, replicas: list[ServiceProcess], seconds: float, out: Observed) -> Observed:
    """Read /now from each replica in turn for ``seconds``, checking every answer as it comes."""
    deadline = time.monotonic() + seconds
    for i in itertools.count():
        if time.monotonic() > deadline:
            return out
        r = replicas[i % len(replicas)]
        invoked, wall_invoked = time.monotonic_ns(), time.time_ns() // 1000
        try:
            response = client.get(f"{r.url}/now")
        except httpx.TimeoutException:
            out.timed_out += 1
            continue
        completed, wall_completed = time.monotonic_ns(), time.time_ns() // 1000
        if response.status_code == 503:
            out.refused[r.name] = out.refused.get(r.name, 0) + 1
            continue
        assert response.status_code == 200, response.text
        value: int = response.json()["now_us"]
        out.reads.append(Read(0, invoked, completed, value, r.name))
        # The value was global time at some moment of [invoked, completed]: judged against the
        # real time of that window, ± max_skew.
        ahead, behind = value - wall_completed, wall_invoked - value
        out.max_ahead_us, out.max_behind_us = max(out.max_ahead_us, ahead), max(out.max_behind_us, behind)
        window = (wall_completed - wall_invoked) / 1e6
        assert ahead <= MAX_SKEW_US, f"{r.name} answered {ahead / 1e6:+.3f}s ahead of real time (read {window:.3f}s)"
        assert behind <= MAX_SKEW_US, f"{r.name} answered {behind / 1e6:.3f}s behind real time (read {window:.3f}s)"
        time.sleep(0.02)
    raise AssertionError("unreachable")


def observe_until(
    client: httpx.Client, replicas: list[ServiceProcess], done: Callable[[], bool], out: Observed, seconds: float = 60.0
) -> None:
    """:func:`observe` on, a second at a time, until ``done()`` or ``seconds`` have passed (the
    caller's assertions then judge). Refusing a clock only just over max_skew off takes fresh
    readings from the other replicas, which a loaded machine delays: beside stress-ng a replica
    1.1x fast still vouched for its clock after 14 s (fresh-clone run, 2026-12-08)."""
    more = time.monotonic() + seconds
    while not done() and time.monotonic() < more:
        observe(client, replicas, 1.0, out)


@dataclass
class Trio:
    healthy: list[ServiceProcess]
    faulty: ServiceProcess
    clock: Path
    """The faulty replica's libfaketime clock file."""

    @property
    def all(self) -> list[ServiceProcess]:
        return [*self.healthy, self.faulty]


def start_trio(
    processes: Fleet, sqlite_url: str, workdir: Path, *, faulty_replicas: int = 3, initial: str | None = None
) -> Trio:
    healthy = [processes.timesvc(sqlite_url, name=f"ok{i}", replicas=3, wait=False) for i in range(2)]
    for r in healthy:
        r.wait_ready()
    clock = workdir / "clock-faulty"
    env = clock_file_env({}, clock, initial=initial or "+0 x1")
    faulty = processes.timesvc(sqlite_url, name="faulty", replicas=faulty_replicas, env=env)
    return Trio(healthy, faulty, clock)


def metric(client: httpx.Client, replica: ServiceProcess, sample: str) -> float | None:
    for line in client.get(f"{replica.url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


FAULTS = {
    # Rates run from the process' start (libfaketime counts a rate from then: written later, it
    # would also jump the clock by the uptime at once); the rest strike a replica that ran healthy.
    "fast 1.1x": ("+0 x1.1", True),
    "fast 1.6x": ("+0 x1.6", True),
    "fast 2x": ("+0 x2", True),
    "fast 10x": ("+0 x10", True),
    "slow 0.5x": ("+0 x0.5", True),
    "jump +600 s": ("+600s", False),
    "jump -600 s": ("-600s", False),
    "stopped": ("STOPPED", False),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_one_faulty_clock_never_drags_now_and_is_refused(
    processes: Fleet, sqlite_url: str, tmp_path: Path, fault: str
) -> None:
    spec, from_start = FAULTS[fault]
    trio = start_trio(processes, sqlite_url, tmp_path, initial=spec if from_start else None)
    with httpx.Client(timeout=10) as client:
        out = Observed()
        if not from_start:
            trio.faulty.wait_ready()
            observe(client, trio.all, 2.0, out)  # all healthy: a baseline
            if spec == "STOPPED":
                spec = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())  # an absolute time: frozen
            trio.clock.write_text(spec + "\n")  # in force within a second (FAKETIME_CACHE_DURATION)
        # 1.1x gains 0.1 s/s: within ~12 s (and its start) it is more than max_skew off; the
        # others are at once or within a few seconds.
        observe(client, trio.all, 14.0, out)
        # On a loaded machine, on until it refuses (at most 60 s more: a 1.1x clock is then 7 s off).
        observe_until(client, trio.all, lambda: client.get(f"{trio.faulty.url}/readyz").status_code == 503, out)
        assert monotonic_read_violations(out.reads) == []
        for r in trio.healthy:
            assert out.refused.get(r.name, 0) == 0, f"a correct replica refused: {out.refused}"
            assert client.get(f"{r.url}/readyz").status_code == 200
        ready = client.get(f"{trio.faulty.url}/readyz")
        assert ready.status_code == 503, ready.text
        assert any(reason.startswith("clock:") for reason in ready.json()["refusing"]), ready.text
        status = client.get(f"{trio.faulty.url}/status").json()
        assert "clock" in status["refusing"] and status["runaway"] and status["fresh_readings"] == 3
        assert metric(client, trio.faulty, 'timesvc_refusing{reason="clock"}') == 1.0
        assert out.refused.get("faulty", 0) > 0, "the refusing replica must send clients elsewhere"
        print(
            f"{fault}: {len(out.reads)} reads, max {out.max_ahead_us / 1e6:+.3f}s ahead / "
            f"{out.max_behind_us / 1e6:+.3f}s behind real time, faulty refused {out.refused.get('faulty', 0)}"
        )


def test_a_replica_configured_for_one_beside_two_configured_for_three_cannot_move_now(
    processes: Fleet, sqlite_url: str, tmp_path: Path
) -> None:
    """Issue 22 finding 2: TIMESVC_REPLICAS=1 and a clock +600 s, started beside two healthy
    replicas configured for three: it was its own majority and global time jumped 600 s."""
    trio = start_trio(processes, sqlite_url, tmp_path, faulty_replicas=1, initial="+600s")
    with httpx.Client(timeout=10) as client:
        out = observe(client, trio.all, 8.0, Observed())

        def refusing_now() -> dict[str, str]:
            reasons: dict[str, str] = client.get(f"{trio.faulty.url}/status").json()["refusing"]
            return reasons

        observe_until(client, trio.all, lambda: {"clock", "replicas"} <= refusing_now().keys(), out)
        assert monotonic_read_violations(out.reads) == []
        refusing = refusing_now()
        assert {"clock", "replicas"} <= refusing.keys(), refusing
        assert metric(client, trio.faulty, 'timesvc_refusing{reason="replicas"}') == 1.0
        assert metric(client, trio.faulty, "timesvc_replicas_seen") == 3.0
        for r in trio.healthy:
            assert client.get(f"{r.url}/status").json()["refusing"] == {}


@pytest.mark.parametrize("step", ["-60s", "+60s"])
def test_a_wall_clock_step_on_a_timesvc_host_keeps_its_ticks_period(
    processes: Fleet, sqlite_url: str, tmp_path: Path, step: str
) -> None:
    """Ticks are scheduled on the monotonic clock: after the host's wall clock steps by ±60 s the
    replica keeps ticking every TIMESVC_TICK (APScheduler 3, which plans by datetime.now(), ran
    nothing for 60 s after a step back). Its clock is then refused, and /now stays bounded."""
    trio = start_trio(processes, sqlite_url, tmp_path)
    with httpx.Client(timeout=10) as client:
        trio.faulty.wait_ready()

        def ticks() -> int:
            count: int = client.get(f"{trio.faulty.url}/status").json()["ticks"]
            return count

        trio.clock.write_text(step + "\n")
        wait_until(
            lambda: "clock" in client.get(f"{trio.faulty.url}/status").json()["refusing"],
            "the stepped clock to take effect and be refused",
        )
        before, started = ticks(), time.monotonic()
        time.sleep(6.0)
        after, elapsed = ticks(), time.monotonic() - started
        # At least a third of the ticks its period allows (a loaded machine delays some; the
        # libfaketime'd process is slower than the others) — APScheduler ran none for 60 s.
        assert after - before >= elapsed / TICK / 3, f"{after - before} ticks in {elapsed:.1f}s after a {step} step"
        age = client.get(f"{trio.faulty.url}/status").json()["last_ok_tick_age_s"]
        assert age is not None and age < 3 * TICK + 2
        out = observe(client, trio.all, 3.0, Observed())
        assert monotonic_read_violations(out.reads) == []
