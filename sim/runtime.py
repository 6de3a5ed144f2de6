"""The simulator's :class:`~lockclient.runtime.Runtime`: one per simulated process.

Every wait suspends the calling task's greenlet and hands control to the world's hub
(:mod:`sim.world`), which resumes it when the event is set, the lock is handed to it, or
the process's monotonic clock has advanced by the timeout — in virtual time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from sim.world import SimTask, Waiter

if TYPE_CHECKING:
    from sim.world import Process, World

__all__ = ["SimCondition", "SimEvent", "SimLock", "SimPool", "SimRuntime"]

T = TypeVar("T")


class SimEvent:
    def __init__(self, process: Process) -> None:
        self._process = process
        self._flag = False
        self._waiters: list[Waiter] = []

    def set(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.fire(True)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        waiter = Waiter(self._process.world)
        self._waiters.append(waiter)
        try:
            waiter.wait(None if timeout is None else self._process.real_delay_ns(timeout), False)
        finally:
            if not waiter.done or waiter in self._waiters:
                waiter.done = True
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self._flag


class SimLock:
    """A non-reentrant lock whose waiters are served in order."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self._held = False
        self._waiters: deque[Waiter] = deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._held:
            self._held = True
            return True
        if not blocking or timeout == 0:
            return False
        waiter = Waiter(self._process.world)
        self._waiters.append(waiter)
        try:
            # True: release() handed the lock to us; False: the timeout came first.
            return bool(waiter.wait(None if timeout < 0 else self._process.real_delay_ns(timeout), False))
        finally:
            waiter.done = True
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self) -> None:
        if not self._held:
            raise RuntimeError("release of an unlocked lock")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done and not waiter.task.dead:
                waiter.fire(True)  # handed over: stays held, now by the waiter
                return
        self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class SimCondition:
    def __init__(self, process: Process, lock: SimLock | None = None) -> None:
        self._process = process
        self._lock = lock if lock is not None else SimLock(process)
        self._waiters: deque[Waiter] = deque()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        waiter = Waiter(self._process.world)
        self._waiters.append(waiter)
        self._lock.release()
        notified = False
        try:
            notified = bool(
                waiter.wait(None if timeout is None else self._process.real_delay_ns(max(0.0, timeout)), False)
            )
        finally:
            waiter.done = True
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            self._lock.acquire()
        return notified

    def notify(self, n: int = 1) -> None:
        while n > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done:
                waiter.fire(True)
                n -= 1

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class SimPool:
    """At most ``workers`` tasks running submitted work, started on demand."""

    def __init__(self, process: Process, workers: int, name: str) -> None:
        self._process = process
        self._workers = workers
        self._name = name
        self._queue: deque[Callable[[], object]] = deque()
        self._running = 0
        self._closed = False
        self._count = 0

    def submit(self, fn: Callable[[], object]) -> None:
        if self._closed:
            raise RuntimeError("pool shut down")
        self._queue.append(fn)
        if self._running < self._workers:
            self._running += 1
            self._count += 1
            self._process.spawn(self._work, f"{self._name}-{self._count}")

    def _work(self) -> None:
        try:
            while self._queue and not self._closed:
                self._queue.popleft()()
        finally:
            self._running -= 1

    def shutdown(self) -> None:
        self._closed = True
        self._queue.clear()


class SimRuntime:
    """Time, waits, tasks and randomness of one simulated process."""

    name = "simulation"

    def __init__(self, process: Process) -> None:
        self.process = process
        self.world: World = process.world

    def monotonic(self) -> float:
        return self.process.monotonic_ns() / 1e9

    def monotonic_ns(self) -> int:
        return self.process.monotonic_ns()

    def wall_us(self) -> int:
        return self.process.wall.now_ns() // 1_000

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            self.world.yield_now()
            return
        self.world.sleep_real(self.process.real_delay_ns(seconds))

    def event(self) -> SimEvent:
        return SimEvent(self.process)

    def lock(self) -> SimLock:
        return SimLock(self.process)

    def condition(self, lock: object | None = None) -> SimCondition:
        if lock is not None and not isinstance(lock, SimLock):
            raise TypeError("a simulated condition needs a simulated lock")
        return SimCondition(self.process, lock)

    def spawn(self, target: Callable[[], object], *, name: str) -> SimTask:
        return self.process.spawn(target, name)

    def pool(self, workers: int, *, name: str) -> SimPool:
        return SimPool(self.process, workers, name)

    def call_blocking(self, fn: Callable[[], T]) -> T:
        return fn()  # simulated I/O suspends the task by itself

    def uniform(self, a: float, b: float) -> float:
        return self.process.rng.uniform(a, b)

    def token_hex(self, nbytes: int) -> str:
        return self.process.rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    def host(self) -> str:
        return self.process.host

    def pid(self) -> int:
        return self.process.pid

    def task_name(self) -> str:
        current = self.world._current
        return current.name if current is not None else "hub"
