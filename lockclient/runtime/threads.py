"""The runtime of real clocks and OS threads (the synchronous API, the services, lockctl)."""

from __future__ import annotations

import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lockclient.runtime.base import Condition, Event, Lock, Pool, Task

__all__ = ["THREADS", "ThreadRuntime", "host_name"]

T = TypeVar("T")


def host_name() -> str:
    """This machine's name, reduced to what an owner id may contain."""
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in socket.gethostname())
    return cleaned[:40] or "host"


class _ThreadPool:
    def __init__(self, workers: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)

    def submit(self, fn: Callable[[], object]) -> None:
        self._executor.submit(fn)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class ThreadRuntime:
    """``time``, ``threading``, ``random`` and ``secrets`` as they are."""

    name = "threads"

    def __init__(self) -> None:
        self._host = host_name()

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
        return secrets.token_hex(nbytes)

    def host(self) -> str:
        return self._host

    def pid(self) -> int:
        return os.getpid()

    def task_name(self) -> str:
        return threading.current_thread().name


THREADS = ThreadRuntime()
"""The default runtime."""
