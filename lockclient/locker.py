"""The public API: ``RemoteLocker.get_lock`` / ``try_get_lock`` and the held ``RemoteLock``.

A :class:`RemoteLocker` owns what every acquisition shares — the store, the global
clock, the keeper that renews leases (:mod:`lockclient.keeper`), the watermark cache,
the in-process wake-ups — and runs one algorithm: the fair queue
(:mod:`lockclient.fairqueue`, the default) or the thesis' baseline
(:mod:`lockclient.backoff`, for benchmarks). To follow one acquisition top to bottom,
read :meth:`RemoteLocker.get_lock`, then :meth:`lockclient.fairqueue.FairQueue.acquire`,
then :func:`lockclient.algorithm.take`.

What a held lock promises (DESIGN.md §5, §7; docs/guarantees.md states the bounds):

* **Fencing**: ``fencing_token`` strictly increases across all holders of one lock id,
  and a contender that was not granted never gets one (the grant and the token are
  one compare-and-set).
* **Lease**: ``held`` is true only while the lease is valid *by this process's own
  clock* (start of the last successful renewal + lease length), computed when asked;
  leasewatch never revokes before that moment has passed (given clock rates that
  differ by less than grace/lease). So at any grant, no other owner of that lock id
  still sees ``held == True`` — unless its process was paused (GC, SIGSTOP, a frozen
  VM) between looking and acting, which only the fencing token can catch.
* **Release** takes one round trip, never raises because the store is away, and
  finishes in the background (renewing until then) if it could not finish at once.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from lockclient import metrics, shutdown
from lockclient.algorithm import Acquisition, Algorithm, Services, Timestamps
from lockclient.backoff import Backoff
from lockclient.clock import GlobalClock, StoreClock, TimeServiceClock
from lockclient.errors import LockCancelled, LockLost, LockNotOwned, LockReentered, LockTimeout, StoreError
from lockclient.fairqueue import FairQueue
from lockclient.hold import check_min_hold, hold_until, prepare_park
from lockclient.keeper import Keeper
from lockclient.labels import check_label, check_payload
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HeldLease,
    HolderRecord,
    LeaseRecord,
    WaiterRecord,
    parse_fence,
)
from lockclient.lockid import INDEX_SHARDS, index_shard, ticket_time, validate_lock_id
from lockclient.logs import get_logger
from lockclient.runtime import THREADS, Event, Runtime
from lockclient.sharedqueue import Shape, SharedQueue
from lockclient.store import CellStore, Table
from lockclient.store.counting import CountingStore, OpCounts
from lockclient.wake import LOCAL_WAKEUPS, QUIET_HOLD_S, InProcessSignals, Waker, Wakeups, Watch
from lockclient.watermark import Watermarks

if TYPE_CHECKING:
    import asyncio

    from lockclient.clientenv import ClientConfig
    from lockclient.election import Election
    from lockclient.events import LockEvent
    from lockclient.permits import Permit
    from lockclient.runtime.aio import AsyncioRuntime

# asyncio and the asyncio runtime (greenlet) are imported by the async methods that use them:
# an application that never awaits a lock does not pay for them at import (issue 25: import time).

__all__ = [
    "INDEX_SHARDS",
    "LockStatus",
    "QueueEntry",
    "RemoteLock",
    "RemoteLocker",
    "Waker",
    "Watch",
    "index_shard",
]

log = get_logger("lockclient")

RELEASE_RETRY_FOR = 3.0
"""A release that could not finish keeps trying for this many leases (renewing meanwhile)."""

TIMEOUT_GRACE_S = 0.05
"""``aget_lock`` raises LockTimeout this long after its deadline at the latest, whatever the store
does (at the deadline itself when no store call of the acquisition is under way); an acquisition
still busy then (its last look, withdrawing its cell) finishes in the background."""

H = TypeVar("H", bound="Releasable")


class Releasable(Protocol):
    def release(self) -> bool: ...


OnLoopAcquire = Callable[["AsyncioRuntime", Event, float | None], H | None]
"""A blocking-style acquisition run on the event loop by :func:`aacquire`: given the asyncio
runtime, the event that cancels it and its deadline (on the runtime's monotonic clock), it returns
what it acquired (released if nobody awaits it any more), or None (not blocking, busy)."""


@dataclass(frozen=True, slots=True)
class QueueEntry:
    ticket: str
    owner: str
    enqueued_us: int
    label: str = ""
    """The owner's label (``get_lock(..., label=...)``; empty: none)."""


@dataclass(frozen=True, slots=True)
class LockStatus:
    """A snapshot of one lock, for ``lockctl status`` and leasewatch."""

    lock_id: str
    holders: list[str]
    fencing_token: int
    fencing_owner: str
    queue: list[QueueEntry]
    """The holder's cell first (it keeps it until it releases), then the waiters in order."""
    leases: dict[str, LeaseRecord]


class Releases(Protocol):
    """What releases a held lease (an :class:`Algorithm`, or the shared queue of semaphores)."""

    def release(self, lease: HeldLease, store: CellStore) -> bool: ...


class RemoteLock:
    """A held lock. Use as a context manager, or call :meth:`release`.

    ``lost`` is set (and ``on_lost`` callbacks run) when the lease is revoked, could not
    be renewed within its length, or ran past ``max_hold``; the holder must then stop
    touching the protected resource. ``fencing_token`` strictly increases across all
    holders of one lock id: pass it to the resource so it can refuse stale holders.
    """

    _impl: Releases | None = None
    """The algorithm that releases this lock when it is not the locker's own (a semaphore's permit,
    a read or write lock: :mod:`lockclient.permits`)."""
    hold_until: int = 0
    """With ``min_hold``: the global time (µs) until which the lock stays held, even if released
    earlier (:mod:`lockclient.hold`); 0 otherwise."""

    def __init__(self, locker: RemoteLocker, lease: HeldLease, counts: OpCounts, algorithm: str) -> None:
        self._locker = locker
        self._lease = lease
        self.lock_id = lease.lock_id
        self.owner = lease.owner
        self.ticket = lease.ticket
        self.fencing_token = lease.token
        self.granted_at = lease.holding_since
        """``time.monotonic()`` when the compare-and-set that granted the lock was sent (the grant
        happened no earlier): with ``valid_until`` of other holders, what the lease-level
        invariant is checked against. For a lock handed over by the previous holder's release
        (fair queue, issue 27): when this process found the grant — the grant came earlier, after
        the previous holder's ``release()`` began."""
        self.enqueued_at = lease.enqueued_at
        """``time.monotonic()`` when this holder's queue cell was written (fair queue)."""
        self.looked_at = lease.looked_at
        """``time.monotonic()`` when the queue read that preceded the grant started (fair queue):
        every queue cell written before it was visible to that read — FIFO is promised
        among those (a cell still being written may lose its turn to a later ticket). None for a
        lock handed over by the previous holder's release: that read was the releaser's."""
        self.waited = lease.contended
        """Whether the acquisition had to wait for another contender (False: granted on its first
        look, so its ticket skipped the commit wait — docs/guarantees.md, "Order (FIFO)")."""
        self.store_ops = counts.total
        """Store operations the acquisition needed."""
        self.store_op_counts = dict(counts.ops)
        """The same, by operation (``read_row``, ``put``, ``compare_and_set``, ...)."""
        self.round_trips = counts.round_trips
        """Sequential store round trips on the acquisition's path (a concurrent group counts once)."""
        self.lwt_rounds = counts.lwt_rounds
        """Paxos rounds (compare-and-sets, serial reads) the acquisition needed."""
        self.release_counts = OpCounts()
        """What the release cost (filled in by :meth:`release`)."""
        self.algorithm = algorithm
        self.released = False
        self._release_lock = threading.Lock()  # never held across a call: fine on every runtime
        self._cleanup_done = locker.runtime.event()

    @property
    def thread_id(self) -> str:
        """The thesis' name for the owner id (``IRemoteLock.ThreadId``)."""
        return self.owner

    @property
    def label(self) -> str:
        """The label this lock was taken with (empty: none), as its holder record carries it."""
        return self._lease.record.label

    @property
    def payload(self) -> str:
        """The payload this lock was taken with (empty: none)."""
        return self._lease.record.payload

    @property
    def lost(self) -> threading.Event:
        """Set when the lock is lost; also reads as set once ``valid_until`` has passed."""
        return self._lease.lost

    @property
    def lost_reason(self) -> str | None:
        return self._lease.lost_reason

    @property
    def lease(self) -> float:
        """The lease length in seconds."""
        return self._lease.lease

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` value after which this holder must consider the lease lost:
        the start of its last successful renewal plus the lease length. leasewatch never
        revokes before this moment (DESIGN.md §6). Computed when asked."""
        return self._lease.valid_until()

    @property
    def held(self) -> bool:
        """True while acquired, not released, not lost and the lease still valid *now*."""
        return not self.released and not self._lease.lost.is_set()

    @property
    def cleanup_pending(self) -> bool:
        """True while a release that could not reach the store is still being retried."""
        return self.released and not self._cleanup_done.is_set()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (in its own thread) when the lock is lost; at once if it already is."""
        self._lease.on_lost(callback)

    def release(self) -> bool:
        """Release the lock: True if it was held until now, False if it had been lost (or was
        already released). One store round trip; never raises because the store is away —
        then the release finishes in the background (and the lease is renewed until it
        does, so a waiter never waits for leasewatch). Idempotent: a second call returns
        False and retries a pending cleanup once, at once."""
        with self._release_lock:
            again, self.released = self.released, True
        if not again:
            self._locker._forget(self)
        if again:
            if not self._cleanup_done.is_set():
                self._locker._finish_release(self, background=False)
            return False
        return self._locker._release(self)

    def __enter__(self) -> RemoteLock:
        if self.released:
            raise LockNotOwned("this lock was already released", lock_id=self.lock_id)
        if self._lease.lost.is_set():
            raise LockLost(f"lock lost before use: {self.lost_reason}", lock_id=self.lock_id)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held = self.release()
        if not held and exc_type is None:
            raise LockLost(f"the lock was lost while held: {self.lost_reason}", lock_id=self.lock_id)

    async def __aenter__(self) -> RemoteLock:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # On the runtime's own executor, never the loop's default one: a release must not queue
        # behind an application's to_thread work (nor stall the loop while a renewal holds the lease).
        from lockclient.runtime.aio import AsyncioRuntime

        held = await AsyncioRuntime.current().run_blocking(self.release)
        if not held and exc_type is None:
            raise LockLost(f"the lock was lost while held: {self.lost_reason}", lock_id=self.lock_id)

    def __repr__(self) -> str:
        state = "released" if self.released else ("lost" if self._lease.lost.is_set() else "held")
        return f"<RemoteLock {self.lock_id!r} owner={self.owner} token={self.fencing_token} {state}>"


def _caller() -> object:
    """Who is asking, for re-entry: the running asyncio task, else the current greenlet (the
    simulator runs its tasks as greenlets of one thread), else the thread. A module that is not
    imported cannot be in use, so nothing is imported here."""
    aio = sys.modules.get("asyncio")
    if aio is not None:
        try:
            task = aio.current_task()
        except RuntimeError:  # no event loop runs in this thread
            task = None
        if task is not None:
            return task
    greenlets = sys.modules.get("greenlet")
    if greenlets is not None:
        return greenlets.getcurrent()
    return threading.current_thread()


class _AsyncAcquisition:
    """What one asyncio acquisition (``aget_lock``, ``aget_semaphore``, ``aget_read_lock``,
    ``acampaign``, their ``atry_`` twins) shares between its caller (a coroutine) and its run (a
    greenlet): an object with slots rather than closures — a thousand waiters are a thousand of
    these, and every closure cell is one more object for CPython's collector to walk."""

    __slots__ = ("abandoned", "cancel", "deadline", "dealt_with", "fn", "lock_id", "notice", "progress", "runtime")

    def __init__(self, fn: OnLoopAcquire[Any], lock_id: str, deadline: float | None, runtime: AsyncioRuntime) -> None:
        from lockclient.runtime.aio import Progress

        self.fn = fn
        self.lock_id = lock_id
        self.deadline = deadline
        self.runtime = runtime
        self.cancel = runtime.event()
        self.progress = Progress()
        self.abandoned = False
        """The caller has gone (LockTimeout, cancelled): the outcome is nobody's but ours."""
        self.dealt_with = False
        self.notice: asyncio.Future[None] = runtime.loop.create_future()
        """What the caller awaits now: resolved when the run ends, or by a deadline."""

    def acquire(self) -> Any:
        """The run's function (in its greenlet)."""
        return self.fn(self.runtime, self.cancel, self.deadline)

    def notify(self) -> None:
        if not self.notice.done():
            self.notice.set_result(None)

    def finished(self, result: asyncio.Future[Any]) -> None:
        """The run has ended (its ``on_done``)."""
        self.notify()
        self.settled(result)

    def settled(self, result: asyncio.Future[Any]) -> None:
        """When the run ends, and by the caller leaving once it has ended: acts once, and only
        for an outcome nobody awaits any more."""
        if result.cancelled():
            return  # dropped before its first step: it did nothing
        error = result.exception()
        if not self.abandoned or self.dealt_with:
            return  # the caller takes the outcome
        self.dealt_with = True
        if error is None:
            lock = result.result()
            if lock is not None:
                # Granted, but the caller is gone: nobody else will ever release it.
                self.runtime.submit_blocking(lock.release)
        elif not isinstance(error, LockCancelled | LockTimeout):
            # Nobody awaits it any more (the caller has had its LockTimeout or was cancelled): an
            # error of its clean-up (the store closed meanwhile) is logged, never left to asyncio
            # as an unretrieved exception.
            log.warning("abandoned_acquisition_failed", lock_id=self.lock_id, error=repr(error))


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")


class RemoteLocker:
    """Fair distributed locks over a cell store. Thread-safe; one per process is plenty.

    ``algorithm="queue"`` is the fair FIFO lock. ``algorithm="backoff"`` is the
    baseline the thesis replaced (listings 3–4), kept for benchmarks only.
    """

    def __init__(
        self,
        store: CellStore,
        clock: GlobalClock | None = None,
        *,
        lease: float = 10.0,
        algorithm: Literal["queue", "backoff"] = "queue",
        poll_min: float = 0.002,
        poll_max: float = 0.25,
        max_hold: float | None = None,
        waker: Waker | None = None,
        owns_store: bool = False,
        backoff_owner_wait: float = 1.0,
        backoff_step: float = 0.05,
        keeper_workers: int = 8,
        allow_store_clock: bool = False,
        clock_max_age: float = 1.0,
        runtime: Runtime = THREADS,
        wakeups: Wakeups = LOCAL_WAKEUPS,
        release_at_exit: bool = True,
    ) -> None:
        """``release_at_exit``: release this locker's unreleased locks when the interpreter exits
        normally, instead of leaving them to leasewatch (:mod:`lockclient.shutdown`; SIGTERM needs
        :func:`lockclient.exit_on_sigterm`)."""
        if not (lease > 0 and math.isfinite(lease)):
            raise ValueError(f"lease must be a positive number of seconds, got {lease}")
        if not 0 < poll_min <= poll_max:
            raise ValueError(f"need 0 < poll_min <= poll_max, got {poll_min}, {poll_max}")
        if max_hold is not None and not max_hold > 0:
            raise ValueError(f"max_hold must be positive, got {max_hold}")
        if algorithm not in ("queue", "backoff"):
            raise ValueError(f"algorithm must be 'queue' or 'backoff', got {algorithm!r}")
        if not store.supports_compare_and_set:
            raise StoreError(
                f"{store.url} cannot do compare-and-set (lightweight transactions need Cassandra 2.0+); "
                "leases and fencing tokens depend on it"
            )
        self.store = store
        self.runtime = runtime
        self.clock: GlobalClock = (
            clock
            if clock is not None
            else StoreClock(store, allow_shared=allow_store_clock, max_age=clock_max_age, runtime=runtime)
        )
        self._owns_clock = clock is None
        self.lease = lease
        self.algorithm = algorithm
        self.max_hold = max_hold
        self.waker = waker
        self._owns_store = owns_store
        timestamps = Timestamps()
        self._services = Services(
            store=store,
            clock=self.clock,
            timestamps=timestamps,
            keeper=Keeper(store, timestamps.next, workers=keeper_workers, runtime=runtime),
            watermarks=Watermarks(runtime),
            signals=InProcessSignals(runtime),
            waker=waker,
            lease=lease,
            poll_min=poll_min,
            poll_max=poll_max,
            runtime=runtime,
            wakeups=wakeups,
        )
        self._algorithm: Algorithm = (
            FairQueue(self._services)
            if algorithm == "queue"
            else Backoff(self._services, owner_wait=backoff_owner_wait, step=backoff_step)
        )
        self._shared_queue: SharedQueue | None = None  # semaphores, read-write locks (made when first used)
        self._closed = False
        # Locks acquired and not released yet, and by whom (a thread, a task): to refuse re-entry
        # (LockReentered) and to release them at interpreter exit (lockclient.shutdown).
        self._holding: dict[RemoteLock, tuple[str, object]] = {}
        self._held_by: dict[tuple[str, object], int] = {}
        self._holding_lock = threading.Lock()
        if release_at_exit:
            shutdown.release_at_exit(self)

    @classmethod
    def from_env(cls, **overrides: Any) -> RemoteLocker:
        """Build from ``CHRONOLOCK_*`` settings (docs/configuration.md lists them); keyword arguments override."""
        from lockclient.settings import ClientSettings

        return cls.from_settings(ClientSettings(), **overrides)

    @classmethod
    def from_settings(cls, settings: ClientConfig, **overrides: Any) -> RemoteLocker:
        """Build from settings already read: :class:`~lockclient.settings.ClientSettings`, or what
        ``lockctl run`` read without pydantic (:mod:`lockclient.clientenv`); keyword arguments override."""
        store = settings.open_store()
        clock: GlobalClock | None = None
        waker: Waker | None = None
        try:
            if settings.timesvc_urls:
                clock = TimeServiceClock(
                    settings.timesvc_urls, timeout=settings.http_timeout, max_age=settings.clock_max_age
                )
            if settings.leasewatch_url:
                from lockclient.wake import LeasewatchWaker

                waker = LeasewatchWaker(settings.leasewatch_url, timeout=settings.http_timeout)
            kwargs: dict[str, Any] = {
                "lease": settings.lease,
                "waker": waker,
                "owns_store": True,
                "allow_store_clock": settings.allow_store_clock,
                "clock_max_age": settings.clock_max_age,
            }
            kwargs.update(overrides)
            return cls(store, clock, **kwargs)
        except BaseException:
            store.close()
            if clock is not None:
                clock.close()
            if waker is not None:
                waker.close()  # type: ignore[attr-defined]
            raise

    # -- public API ----------------------------------------------------------------------

    def get_lock(
        self,
        lock_id: str,
        timeout: float | None = None,
        *,
        cancel: Event | None = None,
        max_hold: float | None = None,
        min_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> RemoteLock:
        """Block until the lock is held (first come, first served) and return it.

        Raises :class:`LockTimeout` after ``timeout`` seconds (None: wait forever),
        :class:`LockCancelled` when ``cancel`` is set. Either way nothing is left
        behind in the store (or, if the store is away, it is removed in the background).
        ``min_hold``: the lock stays held at least this many seconds of global time from the
        grant, even if released earlier (:mod:`lockclient.hold`).

        ``label``: a short text saying who holds the lock, for people ("billing-worker on web-3";
        at most 200 bytes, no control characters); ``payload``: a small text for whoever looks
        (JSON, say; at most 1 KiB). Both are stored with the lease and shown by :meth:`status`,
        ``lockctl list`` and leasewatch; too long is a ValueError (:mod:`lockclient.labels`).
        """
        validate_lock_id(lock_id)
        _check_timeout(timeout)
        check_min_hold(min_hold)
        label, payload = check_label(label), check_payload(payload)
        self._check_open()
        who = self._refuse_reentry(lock_id)
        deadline = None if timeout is None else self.runtime.monotonic() + timeout
        lock = self._acquire(
            lock_id, deadline, cancel, max_hold, blocking=True, min_hold=min_hold, label=label, payload=payload
        )
        assert lock is not None
        self._note_held(lock, who)
        return lock

    def try_get_lock(
        self,
        lock_id: str,
        *,
        max_hold: float | None = None,
        min_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> RemoteLock | None:
        """Take the lock if nobody holds it or waits for it; never waits on a holder.

        Returns None when busy, and then leaves nothing behind in the store. ``min_hold``,
        ``label``, ``payload``: as for :meth:`get_lock` (with ``min_hold``, a job fired on many
        hosts runs once: ``lockctl run --once-per``).
        """
        validate_lock_id(lock_id)
        check_min_hold(min_hold)
        label, payload = check_label(label), check_payload(payload)
        self._check_open()
        # Never waits, so re-entry cannot wait for itself: the holder's own try finds it busy (None).
        return self._note_held(
            self._acquire(
                lock_id, None, None, max_hold, blocking=False, min_hold=min_hold, label=label, payload=payload
            ),
            (lock_id, _caller()),
        )

    async def aget_lock(
        self,
        lock_id: str,
        timeout: float | None = None,
        *,
        max_hold: float | None = None,
        min_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> RemoteLock:
        """asyncio twin of :meth:`get_lock`, on the event loop (:mod:`lockclient.runtime.aio`): no
        thread per waiter. Cancelling the awaiting task cancels the acquisition and cleans up —
        however many times it is cancelled, and even if the lock was granted just then (an
        acquisition nobody awaits any more is released). Ownership is the returned object, never
        the thread or the task. :class:`LockTimeout` comes at most ``TIMEOUT_GRACE_S`` after the
        deadline whatever the store does; what the acquisition still had to do by then (withdraw
        its queue cell) finishes in the background."""
        validate_lock_id(lock_id)
        _check_timeout(timeout)
        # Its turn at the loop's pacer comes first: a burst of a thousand calls started together
        # costs the iteration that starts them a future each, and everything below comes in
        # slices (a thousand calls' checks and set-up in that one iteration were 17 ms of CPU on
        # the quiet machine; the bound on chronolock's stretches is 10 ms).
        deadline, admission = _aadmission(timeout)
        if admission is not None and not await admission:
            raise LockTimeout("timed out waiting for a turn on the event loop", lock_id=lock_id)
        check_min_hold(min_hold)
        label, payload = check_label(label), check_payload(payload)
        self._check_open()
        who = self._refuse_reentry(lock_id)
        acquire = partial(self._acquire_on_loop, lock_id, max_hold, True, min_hold, label, payload)
        lock = await aacquire(acquire, lock_id, timeout, admitted=True, deadline=deadline)
        assert lock is not None
        self._note_held(lock, who)
        return lock

    async def atry_get_lock(
        self,
        lock_id: str,
        *,
        max_hold: float | None = None,
        min_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> RemoteLock | None:
        """asyncio twin of :meth:`try_get_lock`."""
        validate_lock_id(lock_id)
        _, admission = _aadmission(None)  # as aget_lock's
        if admission is not None:
            await admission  # (no deadline: always let in)
        check_min_hold(min_hold)
        label, payload = check_label(label), check_payload(payload)
        self._check_open()
        who = (lock_id, _caller())  # no re-entry check: see try_get_lock
        acquire = partial(self._acquire_on_loop, lock_id, max_hold, False, min_hold, label, payload)
        lock = await aacquire(acquire, lock_id, None, admitted=True, deadline=None)
        return self._note_held(lock, who)

    def _acquire_on_loop(
        self,
        lock_id: str,
        max_hold: float | None,
        blocking: bool,
        min_hold: float | None,
        label: str,
        payload: str,
        runtime: AsyncioRuntime,
        cancel: Event,
        deadline: float | None,
    ) -> RemoteLock | None:
        return self._acquire(
            lock_id,
            deadline,
            cancel,
            max_hold,
            blocking=blocking,
            runtime=runtime,
            min_hold=min_hold,
            label=label,
            payload=payload,
        )

    def status(self, lock_id: str) -> LockStatus:
        """Holder, fencing token, queue in order and leases of one lock (linearizable lease row)."""
        validate_lock_id(lock_id)
        store = self.store
        row = store.read_versioned(lock_id)
        self._services.watermarks.observe(lock_id, row)
        cells = store.read_row(Table.QUEUE, lock_id, start=self._services.watermarks.start(lock_id))
        token, fence_owner = parse_fence(row.get(FENCE_COLUMN))
        holders: list[str] = []
        leases: dict[str, LeaseRecord] = {}
        raw_holder = row.get(HOLDER_COLUMN)
        holder = HolderRecord.decode(raw_holder) if raw_holder is not None else None
        if holder is not None:
            holders.append(holder.owner)
            leases[holder.owner] = LeaseRecord(
                holder.version,
                holder.lease,
                holder.ticket,
                holding=True,
                label=holder.label,
                payload=holder.payload,
                granted_us=holder.granted,
            )
        queue: list[QueueEntry] = []
        for cell in cells:
            try:
                waiter = WaiterRecord.decode(cell.value)
            except StoreError:
                queue.append(QueueEntry(cell.column, "?", ticket_time(cell.column)))
                continue
            queue.append(QueueEntry(cell.column, waiter.owner, ticket_time(cell.column), waiter.label))
            if holder is None or cell.column != holder.ticket:
                leases[waiter.owner] = LeaseRecord(waiter.version, waiter.lease, cell.column, label=waiter.label)
        return LockStatus(lock_id, holders, token, fence_owner, queue, leases)

    def close(self, timeout: float = 5.0) -> None:
        """Finish pending releases (up to ``timeout`` seconds), stop renewing (held locks then
        expire and leasewatch revokes them), and close what this locker opened."""
        if self._closed:
            return
        self._closed = True
        self._services.keeper.close(timeout)
        if self._owns_clock or self._owns_store:
            self.clock.close()
        close_waker = getattr(self.waker, "close", None)
        if self._owns_store and close_waker is not None:
            close_waker()
        if self._owns_store:
            self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def release_held(self, *, reason: str = "asked") -> int:
        """Release every lock this locker acquired and nobody released yet; how many there were.
        What :mod:`lockclient.shutdown` calls at interpreter exit."""
        with self._holding_lock:
            held = list(self._holding)
        for lock in held:
            log.info("released_unreleased_lock", lock_id=lock.lock_id, owner=lock.owner, reason=reason)
            lock.release()
        return len(held)

    def __enter__(self) -> RemoteLocker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- re-entry ------------------------------------------------------------------------------

    def _refuse_reentry(self, lock_id: str) -> tuple[str, object]:
        """Raise LockReentered if the caller already holds ``lock_id`` through this locker.

        "The caller" is the thread, or the asyncio task (:func:`_caller`): the flow of control
        that would wait for itself — until the timeout, or forever. Other threads and tasks of
        the process may well wait for the lock through the same locker (even tasks the holder
        started): that is contention, and FIFO serves them. Not caught: the holder waiting for
        the lock in another task or thread it awaits (``asyncio.wait_for`` on Python 3.11 runs
        its awaitable as a task of its own, ``asyncio.to_thread``)."""
        who = (lock_id, _caller())
        with self._holding_lock:
            if self._held_by.get(who):
                raise LockReentered(
                    "this thread or task already holds this lock (acquired through this RemoteLocker, not "
                    "released): waiting for it would wait for itself. Locks are not re-entrant; pass the "
                    "held lock down instead of taking it again",
                    lock_id=lock_id,
                )
        return who

    def _note_held(self, lock: RemoteLock | None, who: tuple[str, object]) -> RemoteLock | None:
        if lock is not None:
            with self._holding_lock:
                if not lock.released:
                    self._holding[lock] = who
                    self._held_by[who] = self._held_by.get(who, 0) + 1
        return lock

    def _forget(self, lock: RemoteLock) -> None:
        """``lock`` is being released: not held by its caller any more, nor to release at exit."""
        with self._holding_lock:
            who = self._holding.pop(lock, None)
            if who is not None:
                left = self._held_by[who] - 1
                if left:
                    self._held_by[who] = left
                else:
                    del self._held_by[who]

    # -- elections and events (lockclient.election, lockclient.events) ------------------------------

    def election(self, name: str) -> Election:
        """Leader election on the lock ``name``: candidates served in order, the term is the fencing
        token, a dead leader replaced within the revocation bound (:mod:`lockclient.election`)."""
        from lockclient.election import Election

        return Election(self, name)

    def watch(
        self,
        name: str,
        *,
        kind: Literal["lock", "semaphore", "rwlock"] = "lock",
        poll: float = 1.0,
        timeout: float | None = None,
        cancel: Event | None = None,
    ) -> Iterator[LockEvent]:
        """What happens to lock ``name`` (or the semaphore / read-write lock ``name``), as it happens:
        granted (to whom, token), released, revoked, lost, queue changed — and ``behind`` with
        exactly what this watch could not see, never a silent gap (:mod:`lockclient.events`).
        Runs until ``timeout`` seconds have passed (None: forever), ``cancel`` is set, or the
        caller stops iterating."""
        from lockclient.events import watch_events

        return watch_events(self, name, kind, poll=poll, timeout=timeout, cancel=cancel)

    def awatch(
        self,
        name: str,
        *,
        kind: Literal["lock", "semaphore", "rwlock"] = "lock",
        poll: float = 1.0,
        timeout: float | None = None,
    ) -> AsyncIterator[LockEvent]:
        """asyncio twin of :meth:`watch`: ``async for event in locker.awatch(name): ...``."""
        from lockclient.events import awatch_events

        return awatch_events(self, name, kind, poll=poll, timeout=timeout)

    # -- semaphores and read-write locks (lockclient.permits, lockclient.sharedqueue) ---------------

    def get_semaphore(
        self,
        name: str,
        limit: int,
        timeout: float | None = None,
        *,
        cancel: Event | None = None,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """Block until one of the ``limit`` permits of semaphore ``name`` is ours (first come, first
        served) and return it. Up to ``limit`` holders at once, each with its own fencing token; the
        limit is the semaphore's (:class:`~lockclient.errors.LimitMismatch` if it is held with
        another). Raises like :meth:`get_lock`; a semaphore ``name`` is not the lock ``name``."""
        permit = self._permit(
            name, _semaphore(limit), timeout, cancel, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    def try_get_semaphore(
        self,
        name: str,
        limit: int,
        *,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """A permit if one is free and nobody waits; None (leaving nothing behind) otherwise."""
        return self._permit(name, _semaphore(limit), None, None, max_hold, blocking=False, label=label, payload=payload)

    async def aget_semaphore(
        self,
        name: str,
        limit: int,
        timeout: float | None = None,
        *,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """asyncio twin of :meth:`get_semaphore`."""
        permit = await self._apermit(
            name, _semaphore(limit), timeout, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    async def atry_get_semaphore(
        self,
        name: str,
        limit: int,
        *,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """asyncio twin of :meth:`try_get_semaphore`."""
        return await self._apermit(
            name, _semaphore(limit), None, max_hold, blocking=False, label=label, payload=payload
        )

    def get_read_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        max_readers: int = 16,
        cancel: Event | None = None,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """Block until we may read ``name``: no writer holds it, and no writer queued before us
        (writers never starve). Up to ``max_readers`` readers at once."""
        permit = self._permit(
            name, _rw(max_readers, "r"), timeout, cancel, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    def get_write_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        max_readers: int = 16,
        cancel: Event | None = None,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """Block until we are the only holder of ``name`` — no reader, no other writer — in our
        turn (first come, first served among readers and writers)."""
        permit = self._permit(
            name, _rw(max_readers, "w"), timeout, cancel, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    def try_get_read_lock(
        self,
        name: str,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """A read lock now if no writer holds or waits and a reader slot is free; else None."""
        return self._permit(
            name, _rw(max_readers, "r"), None, None, max_hold, blocking=False, label=label, payload=payload
        )

    def try_get_write_lock(
        self,
        name: str,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """The write lock now if nobody holds or waits; else None."""
        return self._permit(
            name, _rw(max_readers, "w"), None, None, max_hold, blocking=False, label=label, payload=payload
        )

    async def aget_read_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """asyncio twin of :meth:`get_read_lock`."""
        permit = await self._apermit(
            name, _rw(max_readers, "r"), timeout, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    async def aget_write_lock(
        self,
        name: str,
        timeout: float | None = None,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit:
        """asyncio twin of :meth:`get_write_lock`."""
        permit = await self._apermit(
            name, _rw(max_readers, "w"), timeout, max_hold, blocking=True, label=label, payload=payload
        )
        assert permit is not None
        return permit

    async def atry_get_read_lock(
        self,
        name: str,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """asyncio twin of :meth:`try_get_read_lock`."""
        return await self._apermit(
            name, _rw(max_readers, "r"), None, max_hold, blocking=False, label=label, payload=payload
        )

    async def atry_get_write_lock(
        self,
        name: str,
        *,
        max_readers: int = 16,
        max_hold: float | None = None,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """asyncio twin of :meth:`try_get_write_lock`."""
        return await self._apermit(
            name, _rw(max_readers, "w"), None, max_hold, blocking=False, label=label, payload=payload
        )

    def _permit(
        self,
        name: str,
        shape: Shape,
        timeout: float | None,
        cancel: Event | None,
        max_hold: float | None,
        *,
        blocking: bool,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        """``label``, ``payload``: as for :meth:`get_lock` (stored with the permit's holder record)."""
        from lockclient.permits import acquire_permit

        _check_timeout(timeout)
        label, payload = check_label(label), check_payload(payload)
        deadline = None if timeout is None else self.runtime.monotonic() + timeout
        return acquire_permit(
            self, name, shape, deadline, cancel, blocking=blocking, max_hold=max_hold, label=label, payload=payload
        )

    async def _apermit(
        self,
        name: str,
        shape: Shape,
        timeout: float | None,
        max_hold: float | None,
        *,
        blocking: bool,
        label: str | None = None,
        payload: str | None = None,
    ) -> Permit | None:
        from lockclient.permits import aacquire_permit

        _check_timeout(timeout)
        label, payload = check_label(label), check_payload(payload)
        return await aacquire_permit(
            self, name, shape, timeout, blocking=blocking, max_hold=max_hold, label=label, payload=payload
        )

    # -- acquisition and release ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RemoteLocker is closed")

    def _acquire(
        self,
        lock_id: str,
        deadline: float | None,
        cancel: Event | None,
        max_hold: float | None,
        *,
        blocking: bool,
        runtime: Runtime | None = None,
        min_hold: float | None = None,
        stamp: bool = False,
        label: str = "",
        payload: str = "",
    ) -> RemoteLock | None:
        """``runtime``: the caller's, when it is not the locker's own (``aget_lock``'s event loop).
        ``stamp``: put the global time of the grant in the holder record (an election's leader)."""
        if min_hold is not None and self.algorithm != "queue":
            raise ValueError("min_hold needs the fair queue (algorithm='queue')")
        counts = OpCounts()
        store: CellStore = self.store
        wakeups: Wakeups | None = None
        if runtime is not None and runtime.name == "asyncio":
            store, wakeups = self._loop_adapters(runtime)
        attempt = Acquisition(
            lock_id=lock_id,
            store=CountingStore(store, counts),
            deadline=deadline,
            cancel=cancel,
            max_hold=self.max_hold if max_hold is None else max_hold,
            blocking=blocking,
            runtime=runtime or self.runtime,
            wakeups=wakeups,
            stamp_grant=stamp or min_hold is not None,
            label=label,
            payload=payload,
        )
        started = self.runtime.monotonic()
        outcome = "error"
        try:
            lease = self._algorithm.acquire(attempt)
            if lease is None:
                outcome = "busy"
                return None
            self._services.keeper.add_holder(lease)
            outcome = "acquired"
            log.debug("acquired", lock_id=lock_id, owner=lease.owner, fencing_token=lease.token, ops=counts.total)
            lock = RemoteLock(self, lease, counts, self.algorithm)
            if min_hold is not None:
                lock.hold_until = hold_until(lease, min_hold, self.runtime.monotonic())
            return lock
        except LockTimeout:
            outcome = "timeout"
            raise
        except LockCancelled:
            outcome = "cancelled"
            raise
        finally:
            metrics.ACQUIRE_SECONDS.labels(self.algorithm, outcome).observe(self.runtime.monotonic() - started)
            metrics.STORE_OPS_PER_ACQUISITION.labels(self.algorithm, outcome).observe(counts.total)

    def _loop_adapters(self, runtime: Runtime) -> tuple[CellStore, Wakeups]:
        """The store and the wake-ups as ``runtime``'s event loop waits for them, one pair per loop.
        (A method of its own: a closure in :meth:`_acquire` would put a cell per captured name in
        every waiting acquisition's frame.)"""
        from lockclient.runtime.aio import AioWakeups, AsyncioRuntime, BlockingStore

        assert isinstance(runtime, AsyncioRuntime)
        return runtime.adapters(
            self, lambda: (BlockingStore(self.store, runtime), AioWakeups(self._services.wakeups, runtime))
        )

    def _release(self, lock: RemoteLock) -> bool:
        lease = lock._lease
        held = not lease.lost.is_set()  # also checks the lease's validity right now
        lease.releasing = True
        if held and lock.hold_until:
            # min_hold: park, not remove. After `releasing` (found by the simulator): reading global
            # time may take a while, and the lease must not expire into "lost" meanwhile.
            prepare_park(self._services, lease, lock.hold_until)
        try:
            clean = (lock._impl or self._algorithm).release(lease, CountingStore(self.store, lock.release_counts))
        except StoreError as exc:
            # The store is away or slow: finish in the background, renewing meanwhile so
            # that the lock is handed over as soon as the store answers again.
            lease.note_release_attempt()
            log.warning("release_deferred", lock_id=lock.lock_id, owner=lock.owner, error=str(exc))
            self._finish_release(lock, background=True)
            return held
        self._released(lock)
        log.debug("released", lock_id=lock.lock_id, owner=lock.owner)
        return held and clean

    def _finish_release(self, lock: RemoteLock, *, background: bool) -> None:
        lease = lock._lease

        def attempt() -> None:
            try:
                (lock._impl or self._algorithm).release(lease, self.store)
            except StoreError:
                lease.note_release_attempt()
                raise
            self._released(lock)

        if not background:
            try:
                attempt()
            except StoreError as exc:
                log.warning("release_still_pending", lock_id=lock.lock_id, owner=lock.owner, error=str(exc))
            return

        def given_up(succeeded: bool) -> None:
            if not succeeded:
                # Stop renewing: the lease runs out and leasewatch revokes what is left.
                self._services.keeper.remove(lease)
                lock._cleanup_done.set()

        self._services.keeper.defer(
            attempt,
            what="release",
            lock_id=lock.lock_id,
            give_up_after=RELEASE_RETRY_FOR * self.lease,
            on_done=given_up,
        )

    def _released(self, lock: RemoteLock) -> None:
        lease = lock._lease
        self._services.keeper.remove(lease)
        lock._cleanup_done.set()
        remote = lease.contended or lease.monotonic() - lease.holding_since > QUIET_HOLD_S
        # A parked record still holds the lock (min_hold): nobody is woken to take it over.
        released = None if lease.parked else lock.owner
        self._services.announce(lock.lock_id, gone=lock.ticket or None, released=released, remote=remote)


def _semaphore(limit: int) -> Shape:
    return Shape("semaphore", limit)


def _rw(max_readers: int, mode: Literal["r", "w"]) -> Shape:
    return Shape("rwlock", max_readers, mode)


def _aadmission(timeout: float | None) -> tuple[float | None, asyncio.Future[bool] | None]:
    """A new asyncio call's deadline (``time.monotonic()``, from ``timeout``) and its turn at the
    running loop's pacer: None if it may go on now, else a future resolved True when it is let
    in, False if its deadline passed first (:meth:`lockclient.runtime.aio._Pacer.admit`). Not a
    coroutine, and the first thing a call does: its cost is what a burst pays in one iteration."""
    runtime = _current_runtime()
    deadline = None if timeout is None else runtime.monotonic() + timeout
    return deadline, runtime.pacer.admit(deadline)


def _current_runtime() -> AsyncioRuntime:
    """The running loop's :class:`~lockclient.runtime.aio.AsyncioRuntime`. Its module is imported
    on first use (``import lockclient`` does not import asyncio), then found in a global: an
    import statement in a function costs every call a microsecond."""
    global _RUNTIME_TYPE  # noqa: PLW0603 - a cache of a class, set once
    if _RUNTIME_TYPE is None:
        from lockclient.runtime.aio import AsyncioRuntime

        _RUNTIME_TYPE = AsyncioRuntime
    return _RUNTIME_TYPE.current()


_RUNTIME_TYPE: type[AsyncioRuntime] | None = None


async def aacquire(
    acquire: OnLoopAcquire[H],
    lock_id: str,
    timeout: float | None,
    *,
    admitted: bool = False,
    deadline: float | None = None,
) -> H | None:
    """Run ``acquire`` on the running event loop (:mod:`lockclient.runtime.aio`) — how every
    asyncio acquisition runs (locks, semaphores, read-write locks, elections): no thread per
    waiter; admitted by the loop's pacer (a burst comes in a slice at a time); its deadline an
    entry in the loop's one deadline heap, :class:`LockTimeout` at most ``TIMEOUT_GRACE_S`` after
    it whatever the store does; cancelling the awaiting task cancels the acquisition and cleans up
    — however many times it is cancelled, and even if it was granted just then (what nobody
    awaits any more is released). ``admitted``: the caller already had its turn at the pacer
    (:func:`_aadmission`), with ``deadline`` computed then from ``timeout``."""
    # The outcome's error is raised here, not where it was decided: an exception's traceback
    # keeps every frame it passed through alive with all their locals, and the frame below
    # holds the whole acquisition (its run, its state, the run's own error and that error's
    # frames) — ~60 objects for the collector per LockTimeout an application keeps (logs
    # later, stores in a result). This frame holds the arguments only.
    outcome = await _aacquisition(acquire, lock_id, timeout, admitted, deadline)
    if isinstance(outcome, BaseException):
        try:
            raise outcome
        finally:
            # The error's traceback holds this frame: without the `del`, the frame would hold
            # the error in turn, a reference cycle per LockTimeout left to the collector.
            del outcome
    return outcome


async def _aacquisition(
    acquire: OnLoopAcquire[H], lock_id: str, timeout: float | None, admitted: bool, deadline: float | None
) -> H | BaseException | None:
    """:func:`aacquire`'s work: what was acquired, None (not blocking, busy), or the error to
    raise (never raised here but on cancellation)."""
    import asyncio

    from lockclient.runtime.aio import AsyncioRuntime, _Run

    runtime = AsyncioRuntime.current()
    loop = runtime.loop
    if not admitted:
        # A burst of calls (a thousand tasks started together) comes in a slice at a time: each
        # waits here, a future, until it is let in — or told its deadline passed first, having
        # done nothing that needs undoing.
        deadline, admission = _aadmission(timeout)
        if admission is not None and not await admission:
            return LockTimeout("timed out waiting for a turn on the event loop", lock_id=lock_id)
    # The acquisition runs in a greenlet driven by callbacks (lockclient.runtime.aio, _Run),
    # not by a task: its first step, and every step after a wait, takes its turn at the loop's
    # pacer — a burst of a thousand calls comes onto the loop in slices. It learns of the
    # caller's cancellation or timeout through `cancel`, and cleans up (withdraws its queue
    # cell) by itself; its outcome is `run.result`, which this coroutine never awaits
    # directly (a cancellation of the caller must not cancel it).
    state = _AsyncAcquisition(acquire, lock_id, deadline, runtime)
    cancel = state.cancel
    run: _Run[H | None] = _Run(
        runtime, state.acquire, on_cancel=cancel.set, progress=state.progress, on_done=state.finished
    )
    result = run.result
    deadlines = runtime.deadlines
    expiry: int | None = None
    if deadline is not None:
        # The deadline is an entry in the loop's one deadline heap, not a timer of its own, and
        # its wake-up takes its turn at the pacer (a thousand deadlines that fall together wake
        # their callers a slice at a time, not all in one iteration). The run leaves its
        # deadline to it: a wait of its that would last until the deadline sets no timer —
        # this coroutine sets `cancel` once the deadline has passed (below), which ends it.
        expiry = deadlines.add(deadline, state)
        run.deadline, run.deadline_event = deadline, cancel
    runtime.start(run)
    try:
        await state.notice
        if not result.done() and state.progress.in_io:
            # The acquisition honours its deadline by itself, but what it does after it — a
            # last look, withdrawing its queue cell — is store calls, which can queue behind
            # other work (a thousand waiters timing out at once, the renewals of their leases):
            # 0.4 s late in issue 25. One with a store call of its own under way (a grant may be
            # landing) gets TIMEOUT_GRACE_S more; one that merely waits has nothing that could
            # still grant it the lock: LockTimeout now, its clean-up in the background — not
            # after it had its turn on the loop behind a thousand others whose deadlines fell
            # at the same moment.
            assert deadline is not None and expiry is not None
            state.notice = loop.create_future()
            deadlines.discard(expiry)
            expiry = deadlines.add(deadline + TIMEOUT_GRACE_S, state)
            await state.notice
        if result.done():
            if result.cancelled():  # (only a drop cancels it, and only below)
                return LockTimeout("timed out waiting for a turn on the event loop", lock_id=lock_id)
            error = result.exception()
            return result.result() if error is None else error
        state.abandoned = True
        cancel.set()
        if run.drop():
            # Its first turn never came: nothing was written, nothing to clean up.
            return LockTimeout("timed out waiting for a turn on the event loop", lock_id=lock_id)
        return LockTimeout("timed out waiting for the lock (its clean-up finishes in the background)", lock_id=lock_id)
    except asyncio.CancelledError:
        # No await may stand between here and `abandoned = True`: a second cancellation
        # landing on it would leave a granted lock renewed forever.
        state.abandoned = True
        cancel.set()
        if run.drop():
            raise
        if result.done():
            state.settled(result)
            raise
        # Let the acquisition finish its clean-up, if we may wait (cancelled again: we go, and
        # it finishes in the background).
        with contextlib.suppress(BaseException):
            await asyncio.wait([result])
        raise
    finally:
        if expiry is not None:
            deadlines.discard(expiry)
