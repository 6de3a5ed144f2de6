"""Waking waiters: in-process signals, and leasewatch's long-poll across processes.

A waiter waits for exactly one thing (ZooKeeper's lock recipe watches its predecessor
the same way): a waiter behind others waits for the queue cell just ahead of it to be
gone; the waiter at the head waits for the holder to change. So a release wakes the
next waiter only, not everyone in the queue.

* **In-process**: a release or a withdrawal bumps a per-lock generation; waiters of
  that lock id in the same process wake at once (:class:`InProcessSignals`).
* **Across processes**: the releaser tells leasewatch (``POST /notify/{id}``), which
  re-reads that lock at once and answers the long-polls (``GET /wait/{id}``) of the
  waiters whose watched cell or holder changed; leasewatch also polls the store for
  changes nobody announced (a crashed holder's revocation). Any failure (leasewatch
  down, slow, misconfigured) makes the waiter fall back to its own capped back-off
  polling, and skips leasewatch for a growing cool-down — the lock never depends on
  leasewatch for correctness, only for fewer store reads and quicker hand-overs.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import quote

import httpx

from lockclient.logs import get_logger

__all__ = ["InProcessSignals", "LeasewatchWaker", "Waker", "Watch"]

log = get_logger("lockclient.wake")

_COOLDOWN_S = 1.0
_MAX_COOLDOWN_S = 10.0


@dataclass(frozen=True, slots=True)
class Watch:
    """What a waiter waits to see change."""

    kind: Literal["gone", "holder"]
    value: str
    """``gone``: the ticket of the queue cell ahead of us. ``holder``: the holder's owner
    as we last saw it ("" for none)."""


class Waker(Protocol):
    """Cross-process wake-ups. leasewatch implements it (:class:`LeasewatchWaker`)."""

    def wait_for_change(self, lock_id: str, watch: Watch, timeout: float) -> bool:
        """Block until ``watch`` no longer describes the lock, or ``timeout`` elapses.
        Return False at once (without waiting) if the service is unavailable."""
        ...

    def notify(self, lock_id: str) -> None:
        """The lock's holder or queue just changed: wake its waiters now. Best effort."""
        ...


class InProcessSignals:
    """A release wakes the other waiters of that lock id in this process.

    Generations come from one process-wide counter, so a value never repeats: pruning the
    entries of lock ids nobody waits on (memory follows waiters, not history) can cause
    at most a spurious wake-up, never a lost one."""

    _PRUNE_AT = 4096

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counter = itertools.count(1)
        self._generation: dict[str, int] = {}
        self._waiting: dict[str, int] = {}

    def generation(self, lock_id: str) -> int:
        with self._cond:
            return self._generation.get(lock_id, 0)

    def notify(self, lock_id: str) -> None:
        with self._cond:
            self._generation[lock_id] = next(self._counter)
            if len(self._generation) > self._PRUNE_AT:
                for key in [k for k in self._generation if k not in self._waiting]:
                    del self._generation[key]
            self._cond.notify_all()

    def wait(self, lock_id: str, seen: int, timeout: float, cancel: threading.Event | None) -> None:
        """Wait until the generation moves past ``seen``, ``cancel`` is set, or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting[lock_id] = self._waiting.get(lock_id, 0) + 1
            try:
                while self._generation.get(lock_id, 0) == seen:
                    if cancel is not None and cancel.is_set():
                        return
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    # Wake at least every 50 ms to notice `cancel` (an Event cannot notify us).
                    self._cond.wait(min(remaining, 0.05) if cancel is not None else remaining)
            finally:
                left = self._waiting[lock_id] - 1
                if left:
                    self._waiting[lock_id] = left
                else:
                    del self._waiting[lock_id]


class LeasewatchWaker:
    """:class:`Waker` over leasewatch's ``GET /wait/{id}`` and ``POST /notify/{id}``."""

    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"leasewatch URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._client = httpx.Client(timeout=timeout)  # per call: timeout + the long poll
        self._failures = 0
        self._skip_until = 0.0
        self._lock = threading.Lock()
        self.wakeups = 0
        self.fallbacks = 0
        self.notifications = 0

    def _available(self) -> bool:
        with self._lock:
            if time.monotonic() < self._skip_until:
                self.fallbacks += 1
                return False
            return True

    def _failed(self, exc: Exception, what: str) -> None:
        with self._lock:
            self._failures += 1
            self.fallbacks += 1
            # Circuit breaker: do not pay a connection attempt (or a black-holed timeout)
            # on every wait while leasewatch is away.
            self._skip_until = time.monotonic() + min(_COOLDOWN_S * self._failures, _MAX_COOLDOWN_S)
            if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
                log.warning(f"leasewatch_{what}_failed", url=self.url, error=str(exc) or type(exc).__name__)

    def wait_for_change(self, lock_id: str, watch: Watch, timeout: float) -> bool:
        """Long-poll leasewatch. Returns False at once when leasewatch failed recently or fails
        now, so the caller falls back to its own back-off polling instead of sleeping here."""
        if not self._available():
            return False
        try:
            response = self._client.get(
                f"{self.url}/wait/{quote(lock_id, safe='')}",
                params={"timeout": f"{max(timeout, 0.001):.3f}", watch.kind: watch.value},
                timeout=httpx.Timeout(self._timeout + timeout),
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self._failed(exc, "wait")
            return False
        with self._lock:
            self._failures = 0
            self.wakeups += 1
        return True

    def notify(self, lock_id: str) -> None:
        if not self._available():
            return
        try:
            self._client.post(f"{self.url}/notify/{quote(lock_id, safe='')}", timeout=self._timeout).raise_for_status()
        except httpx.HTTPError as exc:
            self._failed(exc, "notify")
            return
        with self._lock:
            self.notifications += 1

    def close(self) -> None:
        self._client.close()
