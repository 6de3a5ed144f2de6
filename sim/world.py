"""The simulated world: virtual time, processes with clocks of their own, and a seeded scheduler.

Everything runs in one OS thread. Each concurrent activity of a simulated process (a
``get_lock`` call, the keeper's dispatcher, a renewal on a keeper worker, a leasewatch
scan loop, a timesvc tick loop...) is a *task*: a greenlet running the real algorithm code.
A task runs until it asks the runtime to wait — for time, an event, a lock, or the store's
answer — and then switches back to the *hub* (:meth:`World.run`), which decides what runs
next:

* among the tasks that are ready *now*, one chosen by the seeded random generator — so a
  seed chooses every interleaving, not the OS;
* when none is ready, virtual time jumps to the next timer.

Nothing else is a source of nondeterminism: every delay, fault and random number comes
from generators seeded from the world's seed, clocks are functions of virtual time, and
set iteration never reaches the history. Same seed → same history, byte for byte.

**Clocks.** Virtual time (``World.now``, ns) is *real time*. Each process has its own
monotonic clock (a boot offset and a rate error, e.g. ±500 ppm; it keeps running while the
process is paused, as ``CLOCK_MONOTONIC`` does across SIGSTOP) and its own wall clock (an
offset, a rate — 1.6 for a clock running 1.6× fast, 0 for a stopped one — and steps either
way). The checkers compare everything with real time.

**Faults.** A process can be paused (its tasks are not run; what would have woken them
waits until it is resumed), crashed (its tasks never run again — no ``finally`` block runs,
as after SIGKILL) and restarted as a new incarnation.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from greenlet import GreenletExit, getcurrent, greenlet

if TYPE_CHECKING:
    from sim.runtime import SimRuntime

__all__ = ["EPOCH_NS", "NS", "Process", "SimTask", "Waiter", "WallClock", "World", "WorldStopped"]

NS = 1_000_000_000
EPOCH_NS = 1_790_000_000 * NS
"""Every wall clock reads this at virtual time 0 (plus its own offset): 2026-09-21."""


class WorldStopped(GreenletExit):
    """Raised inside a task whose process crashed or whose world ended, at its next wait: the
    task unwinds without touching anything (the world no longer runs what it would do)."""


class SimTask:
    """One greenlet of one process."""

    __slots__ = ("dead", "done", "glet", "name", "process")

    def __init__(self, process: Process, name: str, glet: greenlet) -> None:
        self.process = process
        self.name = name
        self.glet = glet
        self.dead = False
        self.done = False

    def is_alive(self) -> bool:
        return not (self.done or self.dead)

    def join(self, timeout: float | None = None) -> None:
        world = self.process.world
        deadline = None if timeout is None else world.now + self.process.real_delay_ns(timeout)
        while self.is_alive():
            if deadline is not None and world.now >= deadline:
                return
            world.sleep_real(min(10_000_000, deadline - world.now) if deadline is not None else 10_000_000)

    def __repr__(self) -> str:
        return f"<task {self.process.name}/{self.name}>"


class Waiter:
    """One wait of the current task: the first :meth:`fire` wins and wakes it with its value."""

    __slots__ = ("done", "on_timeout", "task", "world")

    def __init__(self, world: World) -> None:
        self.world = world
        self.task = world.running()
        self.done = False
        self.on_timeout: object = False

    def fire(self, value: object) -> None:
        if self.done:
            return  # the other way of waking it came first (a timeout's timer just runs out)
        self.done = True
        self.world.wake(self.task, value)

    def wait(self, timeout_ns: int | None, on_timeout: object = False) -> Any:
        """Block until fired, or until ``timeout_ns`` of real time passed (then ``on_timeout``)."""
        if timeout_ns is not None:
            self.on_timeout = on_timeout
            self.world.after(timeout_ns, self._time_out)
        return self.world.block()

    def _time_out(self) -> None:
        self.fire(self.on_timeout)


class WallClock:
    """A process's wall clock: piecewise linear in real time, with steps."""

    def __init__(self, world: World, offset_ns: int = 0, rate: float = 1.0) -> None:
        self._world = world
        self._anchor_real = world.now
        self._anchor_wall = EPOCH_NS + world.now + offset_ns
        self.rate = rate

    def now_ns(self) -> int:
        return self._anchor_wall + int((self._world.now - self._anchor_real) * self.rate)

    def _reanchor(self) -> None:
        self._anchor_wall = self.now_ns()
        self._anchor_real = self._world.now

    def step(self, delta_ns: int) -> None:
        self._reanchor()
        self._anchor_wall += delta_ns

    def set_rate(self, rate: float) -> None:
        self._reanchor()
        self.rate = rate

    def offset_ns(self) -> int:
        """How far this clock is from real time now."""
        return self.now_ns() - (EPOCH_NS + self._world.now)


class Process:
    """A simulated OS process: its tasks, its clocks, and whether it is paused or dead."""

    def __init__(
        self,
        world: World,
        name: str,
        *,
        host: str,
        mono_rate: float = 0.0,
        wall_offset_ns: int = 0,
        wall_rate: float = 1.0,
    ) -> None:
        from sim.runtime import SimRuntime

        self.world = world
        self.name = name
        self.host = host
        self.pid = world.next_pid()
        self.rng = random.Random(f"{world.seed}/process/{name}/{self.pid}")
        self.mono_rate = mono_rate
        self._mono_base = self.rng.randrange(10**9, 10**15)  # boot times differ
        self._started = world.now
        self.wall = WallClock(world, wall_offset_ns, wall_rate)
        self.paused = False
        self.dead = False
        self.parked: list[tuple[SimTask, object]] = []
        self.tasks: list[SimTask] = []
        self.runtime: SimRuntime = SimRuntime(self)
        world.processes.append(self)

    # -- clocks -----------------------------------------------------------------------------------

    def monotonic_ns(self) -> int:
        return self._mono_base + int((self.world.now - self._started) * (1.0 + self.mono_rate))

    def real_delay_ns(self, seconds: float) -> int:
        """Real nanoseconds until this process's monotonic clock has advanced ``seconds`` — at
        least one nanosecond of its own, however small ``seconds`` (a wait of a fraction of a
        nanosecond on a slow clock must not come back to a clock that has not moved: the keeper's
        dispatcher waited like that forever)."""
        if seconds <= 0:
            return 0
        rate = 1.0 + self.mono_rate
        base, started, now = self._mono_base, self._started, self.world.now
        target = base + int((now - started) * rate) + max(1, math.ceil(seconds * NS))
        when = started + math.ceil((target - base) / rate)
        while base + int((when - started) * rate) < target:
            when += 1
        return max(1, when - now)

    def real_at_monotonic(self, mono_seconds: float) -> int:
        """The virtual (real) time at which this process's monotonic clock reads ``mono_seconds``."""
        return self._started + math.ceil((mono_seconds * NS - self._mono_base) / (1.0 + self.mono_rate))

    # -- tasks ------------------------------------------------------------------------------------

    def spawn(self, target: Callable[[], object], name: str) -> SimTask:
        world = self.world
        task: SimTask

        def run(_: object = None) -> None:
            try:
                target()
            except GreenletExit:
                pass
            except BaseException as exc:  # a bug in the code under test (or in the simulation)
                if not (task.dead or world.stopped):
                    world.task_failed(task, exc)
            finally:
                task.done = True

        task = SimTask(self, name, greenlet(run, parent=world.hub_greenlet()))
        self.tasks.append(task)
        if self.dead:
            task.dead = True
            return task
        world.wake(task, None)
        return task

    # -- faults -----------------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        parked, self.parked = self.parked, []
        for task, value in parked:
            self.world.wake(task, value)

    def crash(self) -> None:
        """SIGKILL: nothing of this process runs again."""
        self.dead = True
        self.paused = False
        self.parked.clear()
        for task in self.tasks:
            if not task.done:
                task.dead = True
                self.world.graveyard.append(task)
        self.tasks = []

    def __repr__(self) -> str:
        return f"<process {self.name} pid {self.pid}>"


class World:
    """Virtual time and the scheduler (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(f"{seed}/schedule")
        self.now = 0
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._ready: list[tuple[SimTask, object]] = []
        self._seq = itertools.count()
        self._pids = itertools.count(100)
        self._hub: greenlet | None = None
        self._current: SimTask | None = None
        self.processes: list[Process] = []
        self.graveyard: list[SimTask] = []
        self.failures: list[str] = []
        self.stopped = False
        self.switches = 0

    def next_pid(self) -> int:
        return next(self._pids)

    def hub_greenlet(self) -> greenlet:
        if self._hub is None:
            self._hub = greenlet.getcurrent()
        return self._hub

    # -- timers -----------------------------------------------------------------------------------

    def at(self, when: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the hub at virtual time ``when`` (now, if that has passed)."""
        now = self.now
        heapq.heappush(self._timers, (when if when > now else now, next(self._seq), fn))

    def after(self, delay_ns: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.now + (delay_ns if delay_ns > 0 else 0), next(self._seq), fn))

    # -- tasks ------------------------------------------------------------------------------------

    def running(self) -> SimTask:
        task = self._current
        if task is None or greenlet.getcurrent() is not task.glet:
            raise RuntimeError("a simulated wait outside a simulated task (the hub must never block)")
        return task

    def wake(self, task: SimTask, value: object) -> None:
        if task.dead or task.done:
            return
        if task.process.paused:
            task.process.parked.append((task, value))
        else:
            self._ready.append((task, value))

    def block(self) -> Any:
        """Called by the running task: give the hub control until something wakes this task."""
        if self.stopped:
            raise WorldStopped
        task = self._current
        if task is None or getcurrent() is not task.glet:
            raise RuntimeError("a simulated wait outside a simulated task (the hub must never block)")
        if task.dead:
            raise WorldStopped
        hub = self._hub
        assert hub is not None
        value = hub.switch()
        if task.dead or self.stopped:
            raise WorldStopped
        return value

    def yield_now(self) -> None:
        """Let any other ready task run first (a zero-length sleep)."""
        task = self.running()
        self._ready.append((task, None))
        self.block()

    def sleep_real(self, delay_ns: int) -> None:
        waiter = Waiter(self)
        waiter.wait(max(0, delay_ns), None)

    def task_failed(self, task: SimTask, exc: BaseException) -> None:
        import traceback

        detail = "".join(traceback.format_exception(exc)).strip().splitlines()
        self.failures.append(f"uncaught {type(exc).__name__} in {task}: {exc} | " + " / ".join(detail[-6:]))

    # -- the hub ----------------------------------------------------------------------------------

    def run(self, until: int) -> None:
        """Run every task and timer up to virtual time ``until`` (ns)."""
        self.hub_greenlet()
        ready = self._ready
        timers = self._timers
        draw = self.rng.random
        while not self.stopped:
            if ready:
                last = len(ready) - 1
                pick = int(draw() * (last + 1)) if last else 0
                ready[pick], ready[last] = ready[last], ready[pick]
                task, value = ready.pop()
                if task.dead or task.done:
                    continue
                self._current = task
                self.switches += 1
                task.glet.switch(value)
                self._current = None
                continue
            if not timers or timers[0][0] > until:
                break
            when, _, fn = heapq.heappop(timers)
            self.now = when
            fn()
        self.now = max(self.now, until)

    def stop(self) -> None:
        """End the world: every task still suspended unwinds without running anything more."""
        self.stopped = True
        for process in self.processes:
            for task in process.tasks:
                task.dead = True
                self.graveyard.append(task)
        for task in self.graveyard:
            if task.glet and not task.glet.dead:
                self._current = task
                with contextlib.suppress(BaseException):  # whatever it raised while unwinding is moot now
                    task.glet.throw(WorldStopped)
                self._current = None
        self.graveyard.clear()
        self._ready.clear()
        self._timers.clear()
