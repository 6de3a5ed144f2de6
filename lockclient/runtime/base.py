"""The runtime's interface (see :mod:`lockclient.runtime`)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol, TypeVar

__all__ = ["Condition", "Event", "Lock", "Pool", "Runtime", "Task"]

T = TypeVar("T")


class Event(Protocol):
    """``threading.Event``'s interface."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Lock(Protocol):
    """``threading.Lock``'s interface. Held across blocking calls (a store call) only where the
    code says so; a runtime may suspend the holder there."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class Condition(Protocol):
    """``threading.Condition``'s interface."""

    def __enter__(self) -> bool: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def notify(self, n: int = 1) -> None: ...

    def notify_all(self) -> None: ...


class Task(Protocol):
    """A concurrent activity started by :meth:`Runtime.spawn`."""

    @property
    def name(self) -> str: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class Pool(Protocol):
    """A bounded set of workers (``ThreadPoolExecutor`` on threads)."""

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on a worker; raises RuntimeError once shut down."""
        ...

    def shutdown(self) -> None:
        """Stop taking work; queued work is dropped, running work finishes on its own."""
        ...


class Runtime(Protocol):
    """Time, waiting, concurrency and randomness for the algorithms."""

    name: str

    def monotonic(self) -> float:
        """This process's monotonic clock, seconds."""
        ...

    def monotonic_ns(self) -> int: ...

    def wall_us(self) -> int:
        """This host's wall clock, µs since the epoch (only ever *published*, never trusted)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def event(self) -> Event: ...

    def lock(self) -> Lock: ...

    def condition(self, lock: Lock | None = None) -> Condition: ...

    def spawn(self, target: Callable[[], object], *, name: str) -> Task:
        """Start ``target`` concurrently (a daemon: it never keeps the process alive)."""
        ...

    def pool(self, workers: int, *, name: str) -> Pool: ...

    def call_blocking(self, fn: Callable[[], T]) -> T:
        """Run a call that blocks on I/O this runtime cannot wait for itself (a store driver, an
        HTTP request): directly on threads and in the simulator, on a small executor on asyncio."""
        ...

    def uniform(self, a: float, b: float) -> float:
        """A random float in [a, b] (jitter)."""
        ...

    def token_hex(self, nbytes: int) -> str:
        """Random hex for unique ids (owners, attempts)."""
        ...

    def host(self) -> str:
        """This machine's name, as it appears in owner ids."""
        ...

    def pid(self) -> int: ...

    def task_name(self) -> str:
        """The current thread's (task's) name, as it appears in owner ids."""
        ...
