"""Cross-process wake-ups from leasewatch's long-poll ``GET /locks/{id}/wait``.

A waiter that is not at the head of the queue asks leasewatch to answer when
the queue head or the holder of its lock changes, instead of polling the store.
Any failure (leasewatch down, slow, misconfigured) makes the waiter fall back to
its own capped back-off polling, and skips leasewatch for a growing cool-down —
so the lock never depends on leasewatch for correctness or speed, only for
fewer store reads.
"""

from __future__ import annotations

import threading
import time

import httpx

from lockclient.logs import get_logger

__all__ = ["LeasewatchWaker"]

log = get_logger("lockclient.wake")

_COOLDOWN_S = 1.0
_MAX_COOLDOWN_S = 10.0


class LeasewatchWaker:
    """Implements :class:`lockclient.locker.Waker` over leasewatch's wait endpoint."""

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

    def wait_for_change(self, lock_id: str, head: str | None, timeout: float) -> bool:
        """Long-poll leasewatch. Returns False at once when leasewatch failed recently or fails
        now, so the caller falls back to its own back-off polling instead of sleeping here."""
        with self._lock:
            if time.monotonic() < self._skip_until:
                self.fallbacks += 1
                return False
        try:
            response = self._client.get(
                f"{self.url}/locks/{_quote(lock_id)}/wait",
                # A waiter behind the head only progresses when the head moves; the holder's
                # owner cell disappears a moment *before* its queue cell, and waking on that
                # would only cost a useless queue read.
                params={
                    "timeout": f"{max(timeout, 0.001):.3f}",
                    "watch": "head",
                    **({"after": head} if head is not None else {}),
                },
                timeout=httpx.Timeout(self._timeout + timeout),
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            with self._lock:
                self._failures += 1
                self.fallbacks += 1
                # Circuit breaker: do not pay a connection attempt (or a black-holed timeout)
                # on every wait while leasewatch is away.
                self._skip_until = time.monotonic() + min(_COOLDOWN_S * self._failures, _MAX_COOLDOWN_S)
                if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
                    log.warning("leasewatch_wait_failed", url=self.url, error=str(exc) or type(exc).__name__)
            return False
        with self._lock:
            self._failures = 0
            self.wakeups += 1
        return True

    def close(self) -> None:
        self._client.close()


def _quote(lock_id: str) -> str:
    from urllib.parse import quote

    return quote(lock_id, safe="")
