"""Waking waiters: on one machine directly, across machines through leasewatch.

A waiter waits for exactly one thing (ZooKeeper's lock recipe watches its predecessor
the same way): a waiter behind others waits for the queue cell just ahead of it to be
gone; the waiter at the head waits for the holder to change. So a release wakes the
next waiter only, not everyone in the queue.

* **On one machine** (:class:`LocalWakeups`, Linux): a waiter binds an abstract Unix
  datagram socket *named after what it watches* — the lock id and that ticket, or that
  holder. A releaser (or a withdrawing waiter) sends one empty datagram to the names of
  what it just removed; if the waiter that watches it runs on this machine (any process,
  the same one included), it wakes within microseconds. Nobody listening: the send
  fails silently. No registration, no server, no store round trip.
* **Across machines**: the releaser tells leasewatch (``POST /notify/{id}``, with what
  it removed), which answers at once the long-polls (``GET /wait/{id}``) of the waiters
  watching that, and polls the store for changes nobody announced (a crashed holder's
  revocation). A waiter runs its long-poll in the background and wakes on whichever
  comes first. Any failure (leasewatch down, slow, misconfigured) makes the waiter fall
  back to its own capped back-off polling, and skips leasewatch for a growing cool-down —
  the lock never depends on leasewatch for correctness, only for fewer store reads and
  quicker hand-overs.
* **Fallback** where abstract sockets are unavailable: in-process waiters are woken by
  :class:`InProcessSignals`; others poll.

A wake-up is only ever a hint: the waiter reads the store before acting on it, so a
lost, late, duplicated or forged datagram costs at most a read or a poll interval.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import quote

from lockclient import httpclient
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Event, Runtime

if TYPE_CHECKING:
    import httpx  # imported when a LeasewatchWaker is built (lockclient.httpclient)

__all__ = [
    "LOCAL_WAKEUPS",
    "NOTICE_QUIET_S",
    "QUIET_HOLD_S",
    "TAKEN",
    "InProcessSignals",
    "LeasewatchWaker",
    "Listener",
    "LocalWakeups",
    "Taken",
    "Waker",
    "Wakeups",
    "Watch",
]

log = get_logger("lockclient.wake")

QUIET_HOLD_S = 0.01
"""A release tells leasewatch only if its holder had to wait for its turn (others were queued,
so others likely are now), or it held the lock longer than this — leasewatch's own store poll
of awaited locks (``WAIT_POLL_S``, 10 ms) finds a waiter that came later as soon as a notice
would."""

NOTICE_QUIET_S = 0.5
"""After leasewatch answered a release's notice with "nobody long-polls this lock here", further
notices for that lock are not sent for this long. Only a waiter on another machine needs them
(one here is woken by its datagram); one that starts long-polling in that window is woken by
leasewatch's own store poll of awaited locks (``WAIT_POLL_S``, 10 ms) instead of at once. On one
machine at P = 5 (bench/peers) ~15 % of releases found no local listener yet and each paid an
HTTP round trip to leasewatch for nothing — the CPU that made wake-ups slower than polling."""

_UNAWAITED_LIMIT = 4096

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
    """Cross-machine wake-ups. leasewatch implements it (:class:`LeasewatchWaker`)."""

    def wait_for_change(self, lock_id: str, watch: Watch, timeout: float) -> bool:
        """Block until ``watch`` no longer describes the lock, or ``timeout`` elapses.
        Return False at once (without waiting) if the service is unavailable."""
        ...

    def watch_in_background(self, lock_id: str, watch: Watch, timeout: float, on_change: Callable[[], None]) -> bool:
        """Like :meth:`wait_for_change`, on the waker's own thread: call ``on_change`` when it
        returns because something changed. At most one such wait per (lock id, watch).
        False (and nothing started) when the service is known to be unavailable."""
        ...

    def notify(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> None:
        """The lock's holder or queue just changed — the queue cell ``gone`` was deleted, the
        holder ``released`` let go — wake its waiters now. Best effort; waiters re-read anyway."""
        ...


class Listener(Protocol):
    """One waiter's wake-up: bound to the name of what it watches until closed."""

    watch: Watch

    def wait(self, timeout: float, cancel: Event | None = None) -> bool:
        """True when woken, False after ``timeout`` (or once ``cancel`` is set)."""
        ...

    def wake(self) -> None:
        """Wake this listener (a background long-poll that answered)."""
        ...

    def close(self) -> None: ...


class Wakeups(Protocol):
    """Wake-ups between waiters on one machine (:class:`LocalWakeups` on Linux; the simulator
    has its own): bind the name of what you watch, and announce what you removed."""

    def listen(self, lock_id: str, watch: Watch) -> Listener | Taken | None:
        """Bind the wake-up name of ``watch``; None if unavailable (then the caller polls);
        :data:`TAKEN` if another waiter on this machine already watches it."""
        ...

    def announce(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> bool:
        """Wake the waiters watching the queue cell ``gone`` and the holder ``released`` on this
        machine. True if one of them was reached."""
        ...


class InProcessSignals:
    """A release wakes the other waiters of that lock id in this process.

    Generations come from one process-wide counter, so a value never repeats: pruning the
    entries of lock ids nobody waits on (memory follows waiters, not history) can cause
    at most a spurious wake-up, never a lost one."""

    _PRUNE_AT = 4096

    def __init__(self, runtime: Runtime = THREADS) -> None:
        self._runtime = runtime
        self._cond = runtime.condition()
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

    def wait(
        self, lock_id: str, seen: int, timeout: float, cancel: Event | None, *, runtime: Runtime | None = None
    ) -> None:
        """Wait until the generation moves past ``seen``, ``cancel`` is set, or ``timeout``.
        From another ``runtime`` than these signals' own (an ``aget_lock`` on the event loop),
        the generation is polled every 20 ms: a notify cannot wake a wait of another runtime,
        and the wait is only a hint anyway (the caller reads the store next)."""
        if runtime is not None and runtime is not self._runtime:
            deadline = runtime.monotonic() + timeout
            while self.generation(lock_id) == seen and not (cancel is not None and cancel.is_set()):
                remaining = deadline - runtime.monotonic()
                if remaining <= 0:
                    return
                runtime.sleep(min(remaining, 0.02))
            return
        monotonic = self._runtime.monotonic
        deadline = monotonic() + timeout
        with self._cond:
            self._waiting[lock_id] = self._waiting.get(lock_id, 0) + 1
            try:
                while self._generation.get(lock_id, 0) == seen:
                    if cancel is not None and cancel.is_set():
                        return
                    remaining = deadline - monotonic()
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


def _wake_name(lock_id: str, kind: str, value: str) -> bytes:
    digest = hashlib.sha256(f"{lock_id}\0{kind}\0{value}".encode()).hexdigest()[:40]
    return b"\0chronolock-wake/" + digest.encode()


class LocalListener:
    """One waiter's wake-up socket, bound to the name of what it watches."""

    def __init__(self, sock: socket.socket, name: bytes, watch: Watch) -> None:
        self._sock = sock
        self.name = name
        self.watch = watch

    def wait(self, timeout: float, cancel: Event | None = None) -> bool:
        """True when woken, False after ``timeout`` (or once ``cancel`` is set)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (cancel is not None and cancel.is_set()):
                return False
            # With a cancel event, look at it at least every 50 ms (an Event cannot wake a socket).
            self._sock.settimeout(min(remaining, 0.05) if cancel is not None else remaining)
            try:
                self._sock.recv(16)
            except TimeoutError:
                continue
            except OSError:
                return False
            self._drain()
            return True

    def _drain(self) -> None:
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                self._sock.recv(16)

    def fileno(self) -> int:
        """The socket, for an event loop to wait on (:mod:`lockclient.runtime.aio`)."""
        return self._sock.fileno()

    def drain(self) -> bool:
        """Consume every wake-up already received (non-blocking); True if there was one."""
        self._sock.setblocking(False)
        got = False
        with contextlib.suppress(OSError):
            while True:
                self._sock.recv(16)
                got = True
        return got

    def for_event_loop(self) -> None:
        """Make the socket non-blocking for good, for :meth:`consume_one` (an event loop's reader)."""
        self._sock.setblocking(False)

    def consume_one(self) -> bool:
        """Read one wake-up if one is there, in one system call (after :meth:`for_event_loop`);
        a level-triggered reader is called again while more are queued."""
        try:
            self._sock.recv(16)
        except OSError:  # BlockingIOError: none there
            return False
        return True

    def wake(self) -> None:
        """Wake this listener (from another thread: a background long-poll that answered)."""
        LocalWakeups.send(self.name)

    def close(self) -> None:
        self._sock.close()


class Taken:
    """What :meth:`LocalWakeups.listen` answers when another waiter already watches that name."""

    def __repr__(self) -> str:
        return "TAKEN"


TAKEN = Taken()


class LocalWakeups:
    """Wake-ups between processes on one machine: abstract Unix datagram sockets (Linux)."""

    available = sys.platform.startswith("linux")

    @staticmethod
    def listen(lock_id: str, watch: Watch) -> LocalListener | Taken | None:
        """Bind the wake-up name of ``watch``; None if unavailable (then the caller polls);
        :data:`TAKEN` if another waiter on this machine already watches it — two waiters never
        legitimately watch the same thing for long: one of them looked before the other's queue
        cell was visible, and should look again rather than wait."""
        if not LocalWakeups.available:
            return None
        name = _wake_name(lock_id, watch.kind, watch.value)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            return None  # out of descriptors, or no AF_UNIX: poll instead
        try:
            sock.bind(name)
        except OSError as exc:
            sock.close()
            return TAKEN if exc.errno == errno.EADDRINUSE else None
        return LocalListener(sock, name, watch)

    _sender: socket.socket | None = None
    _sender_lock = threading.Lock()

    @staticmethod
    def _sending_socket() -> socket.socket:
        # One unbound, non-blocking socket per process, shared by every thread (a datagram send is
        # atomic): a socket, a flag change and a close per wake-up were three more system calls on
        # every release and withdrawal — each one a GIL hand-over an event loop pays for.
        sender = LocalWakeups._sender
        if sender is None:
            with LocalWakeups._sender_lock:
                sender = LocalWakeups._sender
                if sender is None:
                    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    sender.setblocking(False)
                    LocalWakeups._sender = sender
        return sender

    @staticmethod
    def send(name: bytes) -> bool:
        """True if a listener on this machine got it (an abstract name nobody bound refuses)."""
        try:
            LocalWakeups._sending_socket().sendto(b"!", name)
        except BlockingIOError:
            return True  # its buffer is full of wake-ups: it is awake anyway
        except OSError:
            return False  # nobody listens on this machine (or no descriptor for a socket: poll instead)
        return True

    @staticmethod
    def announce(lock_id: str, *, gone: str | None = None, released: str | None = None) -> bool:
        """Wake the local waiter watching the queue cell ``gone`` and the one watching the
        holder ``released``, if they run on this machine. True if one of them was reached."""
        if not LocalWakeups.available:
            return False
        reached = False
        if gone is not None:
            reached |= LocalWakeups.send(_wake_name(lock_id, "gone", gone))
        if released is not None:
            reached |= LocalWakeups.send(_wake_name(lock_id, "holder", released))
        return reached


LOCAL_WAKEUPS: Wakeups = LocalWakeups()
"""The wake-ups of the threads runtime (abstract Unix datagram sockets)."""


class LeasewatchWaker:
    """:class:`Waker` over leasewatch's ``GET /wait/{id}`` and ``POST /notify/{id}``."""

    _BACKGROUND = 32
    """Concurrent background long-polls per waker (one per waiting acquisition)."""

    def __init__(self, url: str, *, timeout: float = 2.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"leasewatch URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._monotonic = monotonic
        self._unawaited: dict[str, float] = {}
        """Lock id -> until when notices for it are not sent (leasewatch said nobody long-polls)."""
        self.notices_skipped = 0
        self._client = httpclient.client([self.url], timeout=timeout)  # per call: timeout + the long poll
        self._errors = httpclient.http_errors()
        self._failures = 0
        self._skip_until = 0.0
        self._lock = threading.Lock()
        self.wakeups = 0
        self.fallbacks = 0
        self.notifications = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pending: set[tuple[str, Watch]] = set()

    def _available(self) -> bool:
        with self._lock:
            if time.monotonic() < self._skip_until:
                self.fallbacks += 1
                return False
            return True

    def _failed(self, exc: Exception, what: str) -> None:
        if self._client.is_closed:
            return  # closed under a background long-poll: not leasewatch's fault
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
                timeout=self._timeout + timeout,
            )
            response.raise_for_status()
        except self._errors as exc:
            self._failed(exc, "wait")
            return False
        with self._lock:
            self._failures = 0
            self.wakeups += 1
        return True

    def watch_in_background(self, lock_id: str, watch: Watch, timeout: float, on_change: Callable[[], None]) -> bool:
        key = (lock_id, watch)
        with self._lock:
            if time.monotonic() < self._skip_until:
                return False  # leasewatch failed recently: the caller polls
            if key in self._pending:
                return True
            self._pending.add(key)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._BACKGROUND, thread_name_prefix="chronolock-longpoll")
            pool = self._pool

        def run() -> None:
            try:
                if self.wait_for_change(lock_id, watch, timeout):
                    on_change()
            finally:
                with self._lock:
                    self._pending.discard(key)

        try:
            pool.submit(run)
        except RuntimeError:  # closed meanwhile
            with self._lock:
                self._pending.discard(key)
            return False
        return True

    def notify(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> None:
        """Tell leasewatch — unless it said within :data:`NOTICE_QUIET_S` that nobody long-polls
        this lock there."""
        with self._lock:
            if self._unawaited.get(lock_id, 0.0) > self._monotonic():
                self.notices_skipped += 1
                return
        if not self._available():
            return
        params = {k: v for k, v in (("gone", gone), ("released", released)) if v is not None}
        try:
            response = self._client.post(
                f"{self.url}/notify/{quote(lock_id, safe='')}", params=params, timeout=self._timeout
            )
            response.raise_for_status()
        except self._errors as exc:
            self._failed(exc, "notify")
            return
        awaited = _says_awaited(response)
        with self._lock:
            self.notifications += 1
            if awaited:
                self._unawaited.pop(lock_id, None)
                return
            now = self._monotonic()
            self._unawaited[lock_id] = now + NOTICE_QUIET_S
            if len(self._unawaited) > _UNAWAITED_LIMIT:
                self._unawaited = {k: until for k, until in self._unawaited.items() if until > now}
                if len(self._unawaited) > _UNAWAITED_LIMIT:
                    self._unawaited.clear()  # only costs notices that were not needed

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _says_awaited(response: httpx.Response) -> bool:
    """leasewatch's answer to a notice: does anyone long-poll that lock there? Anything but a
    plain ``{"waiters": false}`` counts as yes (keep notifying)."""
    try:
        body = response.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("waiters") is False)
