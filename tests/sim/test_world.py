"""The simulator's world and runtime: waits happen in virtual time, in the order a seed chooses,
pauses park tasks and crashes run nothing more — the ground the simulated algorithms stand on."""

from __future__ import annotations

from sim.runtime import SimCondition, SimEvent, SimLock
from sim.world import NS, Process, World


def test_a_sleep_takes_virtual_time_on_the_process_clock() -> None:
    world = World(1)
    fast = Process(world, "fast", host="h", mono_rate=0.5)  # its monotonic clock runs 1.5x
    woke: list[int] = []
    fast.spawn(lambda: (fast.runtime.sleep(3.0), woke.append(world.now)), "sleeper")
    world.run(10 * NS)
    assert woke == [2 * NS]  # 3 s on a clock running 1.5x fast are 2 s of real time


def test_an_event_wakes_its_waiters_and_a_timeout_returns_false() -> None:
    world = World(2)
    p = Process(world, "p", host="h")
    event = SimEvent(p)
    seen: list[tuple[str, bool, int]] = []
    p.spawn(lambda: seen.append(("timed", event.wait(1.0), world.now)), "a")
    p.spawn(lambda: seen.append(("set", event.wait(5.0), world.now)), "b")
    world.at(2 * NS, event.set)
    world.run(10 * NS)
    assert sorted(seen) == [("set", True, 2 * NS), ("timed", False, 1 * NS)]


def test_a_lock_is_handed_to_its_waiters_in_order() -> None:
    world = World(3)
    p = Process(world, "p", host="h")
    lock = SimLock(p)
    order: list[str] = []

    def worker(name: str, hold: float) -> None:
        with lock:
            order.append(name)
            p.runtime.sleep(hold)

    p.spawn(lambda: worker("first", 1.0), "first")
    world.run(0)
    p.spawn(lambda: worker("second", 0.0), "second")
    world.run(int(0.1 * NS))
    p.spawn(lambda: worker("third", 0.0), "third")
    world.run(10 * NS)
    assert order == ["first", "second", "third"]
    assert not lock.locked()


def test_a_condition_wait_releases_the_lock_and_notify_wakes_one() -> None:
    world = World(4)
    p = Process(world, "p", host="h")
    cond = SimCondition(p)
    woken: list[bool] = []

    def waiter() -> None:
        with cond:
            woken.append(cond.wait(5.0))

    def notifier() -> None:
        p.runtime.sleep(1.0)
        with cond:
            cond.notify()

    p.spawn(waiter, "w")
    p.spawn(notifier, "n")
    world.run(10 * NS)
    assert woken == [True]


def test_a_paused_process_runs_nothing_until_resumed_and_its_clock_runs_on() -> None:
    world = World(5)
    p = Process(world, "p", host="h")
    ticks: list[int] = []

    def ticker() -> None:
        for _ in range(5):
            p.runtime.sleep(1.0)
            ticks.append(world.now // NS)

    p.spawn(ticker, "t")
    world.at(int(1.5 * NS), p.pause)
    world.at(int(4.5 * NS), p.resume)
    mono_at_pause: list[float] = []
    world.at(int(1.5 * NS), lambda: mono_at_pause.append(p.runtime.monotonic()))
    world.run(20 * NS)
    assert ticks[0] == 1 and ticks[1] == 4  # the tick due at 2 s ran only once resumed (4.5 s)
    assert p.runtime.monotonic() - mono_at_pause[0] > 18  # CLOCK_MONOTONIC ran through the pause


def test_a_crashed_process_runs_no_more_code_not_even_its_finally_blocks() -> None:
    world = World(6)
    p = Process(world, "p", host="h")
    ran: list[str] = []

    def task() -> None:
        try:
            p.runtime.sleep(5.0)
            ran.append("after sleep")
        finally:
            ran.append("finally")

    p.spawn(task, "t")
    world.at(1 * NS, p.crash)
    world.run(10 * NS)
    assert ran == [], "nothing of a crashed process runs while the world runs"


def test_wall_clocks_step_run_fast_and_stop_while_real_time_goes_on() -> None:
    world = World(7)
    p = Process(world, "p", host="h")
    wall = p.wall
    start = wall.now_ns()
    world.run(1 * NS)
    assert wall.now_ns() - start == NS
    wall.set_rate(2.0)
    world.run(2 * NS)
    assert wall.now_ns() - start == 3 * NS
    wall.step(-600 * NS)
    wall.set_rate(0.0)
    world.run(5 * NS)
    assert wall.now_ns() - start == -597 * NS
    assert wall.offset_ns() == -602 * NS


def test_leasewatch_recovers_from_a_network_fault_when_its_held_up_request_is_settled() -> None:
    """A request leasewatch sent while every answer was lost is settled only by the store driver's
    timeout, after the fault ended: until then its scan sees nothing, so a holder that dies
    meanwhile is judged from that timeout, not from the fault's end (CI's seed 20261476: a dead
    leader's renewal made during such a wait was first seen 1.6 s after it, and the checker judged
    the revocation from the fault's end)."""
    from sim.nemesis import FaultEvent
    from sim.scenario import Config, Simulation

    sim = Simulation(20261476, Config(duration=4.0, quiet=1.0, clients=1, leasewatch=1, timesvc=0, faults="none"))
    lossy = {"lose_reply": 1.0, "cas_unknown": 0.0, "refuse": 0.0, "slow": 0.0}
    sim.nemesis.events = [FaultEvent(1.0, "lossy", "*", 0.5, lossy)]
    sim.run()
    process = sim.leasewatch[0].process
    stalled = sim.network.stalled_until[process.name]
    timeout = process.real_delay_ns(sim.network.client_timeout)
    # Sent while answers were lost (1.0-1.5 s): given up by the driver's timeout, after the fault.
    assert int(1.5 * NS) < stalled <= int(1.5 * NS) + timeout
    assert stalled >= int(1.0 * NS) + timeout
    # A crash after the fault's end but during that wait is judged from the wait's end.
    assert sim.nemesis.recovered_at(int(1.6 * NS)) == stalled
    # Later faults-free waits change nothing: the recovery stays where the last held-up request ended.
    assert sim.nemesis.recovered_at(sim.end) == stalled
