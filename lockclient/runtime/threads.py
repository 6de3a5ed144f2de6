"""The runtime of real clocks and OS threads (the synchronous API, the services, lockctl)."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lockclient.runtime.base import Condition, Event, Lock, Pool, Task

__all__ = ["THREADS", "RandomPool", "ThreadRuntime", "host_name"]

T = TypeVar("T")


def host_name() -> str:
    """This machine's name, reduced to what an owner id may contain."""
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in socket.gethostname())
    return cleaned[:40] or "host"


class RandomPool:
    """``secrets.token_hex`` from a pool of ``os.urandom`` bytes drawn 4 KiB at a time (thread-safe).

    ``secrets.token_hex`` is a ``getrandom()`` system call per owner name and attempt id, and a
    system call on an event loop's thread lets another thread take the GIL: with 1,000 ``aget_lock``
    calls at once it was the largest single place the loop stalled (issue 25). A forked child
    draws a pool of its own (never its parent's next names)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._used = 0
        self._pid = 0

    def token_hex(self, nbytes: int) -> str:
        with self._lock:
            pid = os.getpid()  # no GIL release
            if len(self._bytes) - self._used < nbytes or pid != self._pid:
                self._bytes, self._used, self._pid = os.urandom(max(4096, nbytes)), 0, pid
            start = self._used
            self._used += nbytes
            return self._bytes[start : start + nbytes].hex()


class _ThreadPool:
    def __init__(self, workers: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)

    def submit(self, fn: Callable[[], object]) -> None:
        self._executor.submit(fn)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class ThreadRuntime:
    """``time``, ``threading`` and ``random`` as they are (random names: :class:`RandomPool`)."""

    name = "threads"

    def __init__(self) -> None:
        self._host = host_name()
        self._random = RandomPool()

    def monotonic(self) -> float:
        return time.monotonic()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def wall_us(self) -> int:
        return time.time_ns() // 1_000

    def sleep(self, seconds: float) -> None:
        # Not time.sleep: under libfaketime with a real monotonic clock it fails (EINVAL).
        threading.Event().wait(max(0.0, seconds))

    def event(self) -> Event:
        return threading.Event()

    def lock(self) -> Lock:
        return threading.Lock()

    def condition(self, lock: Lock | None = None) -> Condition:
        return threading.Condition(lock)  # type: ignore[arg-type]

    def spawn(self, target: Callable[[], object], *, name: str) -> Task:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def pool(self, workers: int, *, name: str) -> Pool:
        return _ThreadPool(workers, name)

    def call_blocking(self, fn: Callable[[], T]) -> T:
        return fn()

    def uniform(self, a: float, b: float) -> float:
        return random.uniform(a, b)

    def token_hex(self, nbytes: int) -> str:
        return self._random.token_hex(nbytes)

    def host(self) -> str:
        return self._host

    def pid(self) -> int:
        return os.getpid()

    def task_name(self) -> str:
        return threading.current_thread().name


THREADS = ThreadRuntime()
"""The default runtime."""
