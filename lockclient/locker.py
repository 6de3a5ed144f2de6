"""The fair lock: ``RemoteLocker.get_lock`` (thesis listing 6) and ``try_get_lock`` (listing 7).

Per lock id there are two rows (thesis §5): the **queue row**, whose columns
are tickets (20-digit global µs + owner, so column order is arrival order),
and the **owner row** ("main row"), whose columns are owners. A contender
enqueues, waits until its ticket is the head of the queue, writes itself into
the owner row and reads it back: alone means acquired (thesis theorem 1 —
by lemma 1, of two contenders that both write and then read at QUORUM, at
least one sees both cells, so two can never both see themselves alone).
Otherwise it deletes its owner cell and tries again.

Around that core this module adds what the thesis left open:

* leases for waiters *and* holders (:mod:`lockclient.lease`), written before
  the queue cell, so leasewatch can remove dead contenders instead of a TTL;
* a fencing token, bumped only while the lease is still valid;
* explicit, strictly increasing write timestamps seeded from global time
  (DESIGN.md "timestamps rule"): every mutation of our own cells carries a
  timestamp greater than the cell it supersedes, whatever this machine's
  wall clock says;
* waiting without hammering the store: waiters poll with capped exponential
  back-off scaled by their position in the queue, and waiters in the same
  process are woken directly by a release (cross-process wake-ups come from
  leasewatch's wait endpoint through the :class:`Waker` hook);
* tombstone-safe queue reads: the slice starts at a *watermark* below which
  the queue row holds only tombstones (see :meth:`RemoteLocker._watermark`).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, cast

from lockclient import metrics
from lockclient.clock import GlobalClock, StoreClock, TimeServiceClock
from lockclient.errors import LockCancelled, LockLost, LockNotOwned, LockTimeout, StoreError
from lockclient.lease import FENCE_COLUMN, Lease, LeaseRecord, Renewer, parse_fence
from lockclient.lockid import make_owner, make_ticket, ticket_time, validate_lock_id
from lockclient.logs import get_logger
from lockclient.store import CellStore, Table

__all__ = ["INDEX_SHARDS", "LockStatus", "QueueEntry", "RemoteLock", "RemoteLocker", "Waker", "index_shard"]

log = get_logger("lockclient")

INDEX_SHARDS = 64
"""Lock ids with live state are listed in INDEX rows "0".."63" for leasewatch's scan."""

ENQUEUE_WINDOW_US = 10_000_000
"""Bound on the time between taking a ticket and its queue cell being visible.

An enqueue that took longer than half of this is withdrawn and retried with a
fresh ticket, so any live queue cell has a ticket no older than
``head - ENQUEUE_WINDOW_US``; the watermark may skip everything below that.
"""

_QUEUE_SLICE = 64
"""How many queue cells one poll reads at most (enough to know our position)."""


def index_shard(lock_id: str) -> str:
    """The INDEX row that lists ``lock_id``: stable across processes and languages (CRC-32)."""
    return str(zlib.crc32(lock_id.encode("utf-8")) % INDEX_SHARDS)


class Waker(Protocol):
    """Cross-process wake-up hook: block until the lock's queue head or holder may have
    changed, or ``timeout`` elapses. leasewatch's ``/locks/{id}/wait`` implements it."""

    def wait_for_change(self, lock_id: str, head: str | None, timeout: float) -> bool:
        """Block until the head moves away from ``head`` or ``timeout`` elapses; return False
        at once (without waiting) if the wake-up service is unavailable."""
        ...


@dataclass(frozen=True, slots=True)
class QueueEntry:
    ticket: str
    owner: str
    enqueued_us: int


@dataclass(frozen=True, slots=True)
class LockStatus:
    """A snapshot of one lock, for ``lockctl status`` and leasewatch."""

    lock_id: str
    holders: list[str]
    fencing_token: int
    fencing_owner: str
    queue: list[QueueEntry]
    leases: dict[str, LeaseRecord]


class _Timestamps:
    """Strictly increasing write timestamps (µs), never below the global time they are seeded with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self, at_least: int = 0) -> int:
        with self._lock:
            self._last = max(self._last + 1, at_least)
            return self._last


class _CountingStore:
    """Counts the store operations of one acquisition (exported as a metric and kept on the lock)."""

    def __init__(self, store: CellStore, counts: Counter[str]) -> None:
        self._store = store
        self.counts = counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        counts = self.counts

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            metrics.STORE_OPS.labels(name).inc()
            return attr(*args, **kwargs)

        return counted


class _Revoked(Exception):
    """Our waiting lease was revoked (we were paused, or the store was away longer than a lease)."""


class _Signals:
    """In-process wake-ups: a release wakes the other waiters of that lock id in this process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation: dict[str, int] = {}

    def generation(self, lock_id: str) -> int:
        with self._cond:
            return self._generation.get(lock_id, 0)

    def notify(self, lock_id: str) -> None:
        with self._cond:
            self._generation[lock_id] = self._generation.get(lock_id, 0) + 1
            self._cond.notify_all()

    def wait(self, lock_id: str, seen: int, timeout: float, cancel: threading.Event | None) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation.get(lock_id, 0) == seen:
                if cancel is not None and cancel.is_set():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                # Wake at least every 50 ms to notice `cancel` (an Event cannot notify our Condition).
                self._cond.wait(min(remaining, 0.05) if cancel is not None else remaining)


class RemoteLock:
    """A held lock. Use as a context manager, or call :meth:`release`.

    ``lost`` is set (and ``on_lost`` callbacks run) when the lease is revoked or
    could not be renewed within its length; the holder must then stop touching
    the protected resource. ``fencing_token`` strictly increases across all
    holders of one lock id: pass it to the resource so it can refuse stale holders.
    """

    def __init__(
        self, locker: RemoteLocker, lease: Lease, fencing_token: int, store_ops: Counter[str], algorithm: str
    ) -> None:
        self._locker = locker
        self._lease = lease
        self.lock_id = lease.lock_id
        self.owner = lease.owner
        self.ticket = lease.ticket
        self.fencing_token = fencing_token
        self.store_ops = sum(store_ops.values())
        """Store operations the acquisition needed."""
        self.store_op_counts = dict(store_ops)
        """The same, by operation (``read_row``, ``put``, ``compare_and_set``, ...)."""
        self.algorithm = algorithm
        self.released = False

    @property
    def thread_id(self) -> str:
        """The thesis' name for the owner id (``IRemoteLock.ThreadId``)."""
        return self.owner

    @property
    def lost(self) -> threading.Event:
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
        return self._lease.renewed_at + self._lease.lease

    @property
    def held(self) -> bool:
        """True while acquired, not released, not lost and the lease still valid *now*."""
        if self.released or self._lease.lost.is_set():
            return False
        if time.monotonic() >= self.valid_until:
            self._lease.check_expiry()
            return False
        return True

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (in its own thread) when the lock is lost; at once if it already is."""
        self._lease.on_lost(callback)

    def release(self) -> bool:
        """Release the lock. Returns False (and does nothing harmful) if it was already lost
        or released. Idempotent; safe after a revocation."""
        if self.released:
            return False
        self.released = True
        was_lost = self._lease.lost.is_set()
        self._locker._release(self._lease, algorithm=self.algorithm)
        if was_lost:
            log.warning("release_after_loss", lock_id=self.lock_id, owner=self.owner, reason=self.lost_reason)
        return not was_lost

    def __enter__(self) -> RemoteLock:
        if self.released:
            raise LockNotOwned("this lock was already released", lock_id=self.lock_id)
        if self._lease.lost.is_set():
            raise LockLost(f"lock lost before use: {self.lost_reason}", lock_id=self.lock_id)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lost = self._lease.lost.is_set()
        self.release()
        if lost and exc_type is None:
            raise LockLost(f"the lock was lost while held: {self.lost_reason}", lock_id=self.lock_id)

    async def __aenter__(self) -> RemoteLock:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lost = self._lease.lost.is_set()
        await asyncio.to_thread(self.release)
        if lost and exc_type is None:
            raise LockLost(f"the lock was lost while held: {self.lost_reason}", lock_id=self.lock_id)

    def __repr__(self) -> str:
        state = "released" if self.released else ("lost" if self._lease.lost.is_set() else "held")
        return f"<RemoteLock {self.lock_id!r} owner={self.owner} token={self.fencing_token} {state}>"


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
    ) -> None:
        if lease <= 0 or not math.isfinite(lease):
            raise ValueError(f"lease must be a positive number of seconds, got {lease}")
        if not 0 < poll_min <= poll_max:
            raise ValueError(f"need 0 < poll_min <= poll_max, got {poll_min}, {poll_max}")
        if max_hold is not None and max_hold <= 0:
            raise ValueError(f"max_hold must be positive, got {max_hold}")
        if algorithm not in ("queue", "backoff"):
            raise ValueError(f"algorithm must be 'queue' or 'backoff', got {algorithm!r}")
        if not store.supports_compare_and_set:
            raise StoreError(
                f"{store.url} cannot do compare-and-set (lightweight transactions need Cassandra 2.0+); "
                "leases and fencing tokens depend on it"
            )
        self.store = store
        self.clock: GlobalClock = clock if clock is not None else StoreClock(store)
        self._owns_clock = clock is None
        self.lease = lease
        self.algorithm = algorithm
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.max_hold = max_hold
        self.waker = waker
        self._owns_store = owns_store
        # The baseline's random sleeps (thesis listing 4: 0..1000 ms, 0..50*attempt ms).
        self.backoff_owner_wait = backoff_owner_wait
        self.backoff_step = backoff_step
        self._timestamps = _Timestamps()
        self._renewer = Renewer()
        self._signals = _Signals()
        self._watermarks: dict[str, int] = {}  # what we may skip (stored or derived from a head we saw)
        self._stored_watermarks: dict[str, int] = {}  # what we know is stored
        self._watermarks_lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_env(cls, **overrides: Any) -> RemoteLocker:
        """Build from ``CHRONOLOCK_*`` settings (see the README); keyword arguments override."""
        from lockclient.settings import ClientSettings

        settings = ClientSettings()
        store = settings.open_store()
        clock: GlobalClock | None = None
        if settings.timesvc_urls:
            clock = TimeServiceClock(settings.timesvc_urls, timeout=settings.http_timeout)
        waker: Waker | None = None
        if settings.leasewatch_url:
            from lockclient.wake import LeasewatchWaker

            waker = LeasewatchWaker(settings.leasewatch_url, timeout=settings.http_timeout)
        kwargs: dict[str, Any] = {"lease": settings.lease, "waker": waker, "owns_store": True}
        kwargs.update(overrides)
        try:
            return cls(store, clock, **kwargs)
        except BaseException:
            store.close()
            if clock is not None:
                clock.close()
            raise

    # -- public API ----------------------------------------------------------------------

    def get_lock(
        self,
        lock_id: str,
        timeout: float | None = None,
        *,
        cancel: threading.Event | None = None,
        max_hold: float | None = None,
    ) -> RemoteLock:
        """Block until the lock is held (first come, first served) and return it.

        Raises :class:`LockTimeout` after ``timeout`` seconds (None: wait forever),
        :class:`LockCancelled` when ``cancel`` is set. Either way nothing is left
        behind in the store.
        """
        validate_lock_id(lock_id)
        _check_timeout(timeout)
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.perf_counter()
        outcome = "error"
        counts: Counter[str] = Counter()
        try:
            lock = self._acquire(lock_id, deadline, cancel, max_hold, counts, blocking=True)
            assert lock is not None
            outcome = "acquired"
            return lock
        except LockTimeout:
            outcome = "timeout"
            raise
        except LockCancelled:
            outcome = "cancelled"
            raise
        finally:
            metrics.ACQUIRE_SECONDS.labels(self.algorithm, outcome).observe(time.perf_counter() - started)
            metrics.STORE_OPS_PER_ACQUISITION.labels(self.algorithm, outcome).observe(sum(counts.values()))

    def try_get_lock(self, lock_id: str, *, max_hold: float | None = None) -> RemoteLock | None:
        """Take the lock if nobody holds it or waits for it; never waits on a holder.

        Returns None when busy, and then leaves nothing behind in the store.
        """
        validate_lock_id(lock_id)
        self._check_open()
        started = time.perf_counter()
        counts: Counter[str] = Counter()
        outcome = "error"
        try:
            lock = self._acquire(lock_id, None, None, max_hold, counts, blocking=False)
            outcome = "acquired" if lock is not None else "busy"
            return lock
        finally:
            metrics.ACQUIRE_SECONDS.labels(self.algorithm, outcome).observe(time.perf_counter() - started)
            metrics.STORE_OPS_PER_ACQUISITION.labels(self.algorithm, outcome).observe(sum(counts.values()))

    async def aget_lock(
        self,
        lock_id: str,
        timeout: float | None = None,
        *,
        max_hold: float | None = None,
    ) -> RemoteLock:
        """asyncio twin of :meth:`get_lock`. Cancelling the awaiting task cancels the
        acquisition and cleans up. Ownership is the returned object, never the thread."""
        cancel = threading.Event()
        task = asyncio.ensure_future(
            asyncio.to_thread(self.get_lock, lock_id, timeout, cancel=cancel, max_hold=max_hold)
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.set()
            try:
                lock = await task  # wait for the worker to clean up (or to finish acquiring)
            except (LockCancelled, LockTimeout):
                pass
            else:
                await asyncio.to_thread(lock.release)  # acquired just as we were cancelled
            raise

    async def atry_get_lock(self, lock_id: str, *, max_hold: float | None = None) -> RemoteLock | None:
        """asyncio twin of :meth:`try_get_lock`."""
        return await asyncio.to_thread(self.try_get_lock, lock_id, max_hold=max_hold)

    def status(self, lock_id: str) -> LockStatus:
        """Holder(s), fencing token, queue in order and lease records of one lock."""
        validate_lock_id(lock_id)
        holders = [c.column for c in self.store.read_row(Table.OWNER, lock_id)]
        start = make_ticket(self._watermark(lock_id, self.store), "")
        queue = [
            QueueEntry(c.column, c.value, ticket_time(c.column))
            for c in self.store.read_row(Table.QUEUE, lock_id, start=start)
        ]
        row = self.store.read_versioned(lock_id)
        token, fence_owner = parse_fence(row.pop(FENCE_COLUMN, None))
        leases = {owner: LeaseRecord.decode(raw) for owner, raw in row.items()}
        return LockStatus(lock_id, holders, token, fence_owner, queue, leases)

    def close(self) -> None:
        """Stop the renewer (held locks will then expire) and close what this locker opened."""
        if self._closed:
            return
        self._closed = True
        self._renewer.close()
        if self._owns_clock or self._owns_store:
            self.clock.close()
        close_waker = getattr(self.waker, "close", None)
        if self._owns_store and close_waker is not None:
            close_waker()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> RemoteLocker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- acquisition ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RemoteLocker is closed")

    def _acquire(
        self,
        lock_id: str,
        deadline: float | None,
        cancel: threading.Event | None,
        max_hold: float | None,
        counts: Counter[str],
        *,
        blocking: bool,
    ) -> RemoteLock | None:
        store = cast(CellStore, _CountingStore(self.store, counts))
        max_hold = self.max_hold if max_hold is None else max_hold
        if self.algorithm == "backoff":
            from lockclient.backoff import backoff_acquire

            return backoff_acquire(self, store, lock_id, deadline, cancel, max_hold, counts, blocking=blocking)
        if not blocking and store.read_row(Table.OWNER, lock_id, limit=1):
            return None  # listing 7, line 1: somebody holds it; do not even enqueue
        while True:
            lease = self._enqueue(store, lock_id, max_hold)
            try:
                acquired = self._wait_for_head(store, lease, deadline, cancel, blocking=blocking)
                if not acquired:
                    self._withdraw(store, lease)
                    return None
                token = lease.bump_fence()
            except (_Revoked, LockLost) as exc:
                # Revoked while waiting (paused longer than the lease, or the store was away):
                # our place in the queue is gone. Clean up and queue again while time remains.
                self._withdraw(store, lease)
                log.warning("lease_revoked_while_acquiring", lock_id=lock_id, owner=lease.owner, error=str(exc))
                if not blocking:
                    return None
                self._check_deadline(lock_id, deadline, cancel)
                continue
            except BaseException:
                self._withdraw_quietly(store, lease)
                raise
            lease.mark_holding()
            self._advance_watermark(store, lock_id, lease.ticket)
            log.debug("acquired", lock_id=lock_id, owner=lease.owner, fencing_token=token, ops=sum(counts.values()))
            return RemoteLock(self, lease, token, counts, self.algorithm)

    def _enqueue(self, store: CellStore, lock_id: str, max_hold: float | None) -> Lease:
        """Lease record first, then the index entry, then the queue cell (listing 5)."""
        while True:
            owner = make_owner()
            # Start timing before asking for the time: a slow /now answer makes the ticket
            # old too, and the bound below must cover it.
            taken = time.monotonic()
            now = self.clock.now_us()
            ticket = make_ticket(now, owner)
            lease = Lease(store, lock_id, owner, ticket, self.lease, max_hold=max_hold)
            lease.create()
            self._renewer.add(lease)
            try:
                store.put(Table.INDEX, index_shard(lock_id), lock_id, "", timestamp=self._timestamps.next(now))
                store.put(Table.QUEUE, lock_id, ticket, owner, timestamp=self._timestamps.next(now))
            except BaseException:
                self._withdraw_quietly(store, lease)
                raise
            if (time.monotonic() - taken) * 1e6 <= ENQUEUE_WINDOW_US / 2:
                return lease
            # Took too long: other readers' watermark may already be past our ticket.
            log.warning("slow_enqueue_retried", lock_id=lock_id, seconds=round(time.monotonic() - taken, 3))
            self._withdraw(store, lease)

    def _wait_for_head(
        self,
        store: CellStore,
        lease: Lease,
        deadline: float | None,
        cancel: threading.Event | None,
        *,
        blocking: bool,
    ) -> bool:
        """Listing 6 (blocking) / listing 7 (not): True once acquired; False only when not blocking."""
        lock_id, ticket, owner = lease.lock_id, lease.ticket, lease.owner
        delay = self.poll_min
        last_position: int | None = None
        contention = 0
        while True:
            if lease.lost.is_set():
                raise _Revoked(lease.lost_reason or "lost")
            seen = self._signals.generation(lock_id)
            start = make_ticket(min(self._watermark(lock_id, store), ticket_time(ticket)), "")
            cells = store.read_row(Table.QUEUE, lock_id, start=start, limit=_QUEUE_SLICE)
            position = next((i for i, c in enumerate(cells) if c.column == ticket), None)
            if position is None:
                if len(cells) < _QUEUE_SLICE or cells[-1].column > ticket:
                    raise _Revoked("our queue cell is gone (revoked by leasewatch)")
                position = _QUEUE_SLICE  # further back than one slice
            if cells:
                self._note_head(lock_id, cells[0].column)
            if position == 0:
                store.put(Table.OWNER, lock_id, owner, ticket, timestamp=self._timestamps.next())
                owners = store.read_row(Table.OWNER, lock_id, limit=2)
                if len(owners) == 1 and owners[0].column == owner:
                    return True
                # Not alone (theorem 1): withdraw the owner cell and try again. The other cell
                # is a holder still releasing, a racing contender, or an orphan leasewatch clears.
                store.delete(Table.OWNER, lock_id, owner, timestamp=self._timestamps.next())
                contention += 1
                if not blocking and contention >= 3:
                    return False
                wait = min(self.poll_max, self.poll_min * 2**contention) * random.uniform(0.5, 1.0)
            else:
                if not blocking:
                    return False
                if position != last_position:
                    delay = self.poll_min * position  # moved up: poll soon, further back polls slower
                else:
                    delay = min(delay * 2, self.poll_max * min(position, 4))
                last_position = position
                wait = delay * random.uniform(0.5, 1.0)
            self._check_deadline(lock_id, deadline, cancel)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            if self.waker is not None and position != 0:
                # leasewatch answers when the head or holder changes: wait for that instead of
                # polling (the back-off only bounds the wait, in case a wake-up is missed).
                remaining = self.poll_max * 20 if deadline is None else max(0.0, deadline - time.monotonic())
                head = cells[0].column if cells else None
                if not self.waker.wait_for_change(lock_id, head, min(remaining, 5.0)):
                    self._signals.wait(lock_id, seen, wait, cancel)  # leasewatch away: back-off polling
            else:
                self._signals.wait(lock_id, seen, wait, cancel)

    def _check_deadline(self, lock_id: str, deadline: float | None, cancel: threading.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise LockCancelled("get_lock was cancelled", lock_id=lock_id)
        if deadline is not None and time.monotonic() >= deadline:
            raise LockTimeout("timed out waiting for the lock", lock_id=lock_id)

    def _withdraw(self, store: CellStore, lease: Lease) -> None:
        """Remove every cell of this attempt: owner cell, queue cell, lease record."""
        self._renewer.remove(lease)
        store.delete(Table.OWNER, lease.lock_id, lease.owner, timestamp=self._timestamps.next())
        store.delete(Table.QUEUE, lease.lock_id, lease.ticket, timestamp=self._timestamps.next())
        lease.end()
        self._signals.notify(lease.lock_id)

    def _withdraw_quietly(self, store: CellStore, lease: Lease) -> None:
        """Clean up after a failure without masking it; if the store is away, leasewatch
        removes what is left once the (no longer renewed) lease runs out."""
        try:
            self._withdraw(store, lease)
        except StoreError as exc:
            log.warning("cleanup_failed", lock_id=lease.lock_id, owner=lease.owner, error=str(exc))

    def _release(self, lease: Lease, *, algorithm: str) -> None:
        """DESIGN.md §5 release: stop renewing, delete the owner cell, then the queue cell, then the lease."""
        if algorithm == "backoff":
            from lockclient.backoff import backoff_release

            self._renewer.remove(lease)
            backoff_release(self, lease)
            lease.end()
            return
        self._withdraw(self.store, lease)
        log.debug("released", lock_id=lease.lock_id, owner=lease.owner)

    # -- the watermark --------------------------------------------------------------------------

    def _watermark(self, lock_id: str, store: CellStore) -> int:
        """Ticket time below which the queue row holds only tombstones.

        Why it is safe: when a contender with ticket time t acquires the lock,
        every live queue cell is at or after it, except cells whose writers took
        their ticket before t but were slow to write it — and an enqueue slower
        than ``ENQUEUE_WINDOW_US/2`` is withdrawn and redone. So nothing live lies
        below ``t - ENQUEUE_WINDOW_US``. Holders publish that bound (a
        max-register, value == timestamp, like GlobalTime); readers skip the
        tombstones under it, which keeps a head read cheap after 100k
        acquisitions instead of scanning them all.
        """
        with self._watermarks_lock:
            cached = self._watermarks.get(lock_id)
        if cached is not None:
            return cached
        cell = store.get(Table.WATERMARK, lock_id, "head")
        value = int(cell.value) if cell is not None else 0
        with self._watermarks_lock:
            self._stored_watermarks[lock_id] = max(value, self._stored_watermarks.get(lock_id, 0))
            self._watermarks[lock_id] = max(value, self._watermarks.get(lock_id, 0))
            return self._watermarks[lock_id]

    def _note_head(self, lock_id: str, head_ticket: str) -> None:
        bound = ticket_time(head_ticket) - ENQUEUE_WINDOW_US
        with self._watermarks_lock:
            if bound > self._watermarks.get(lock_id, 0):
                self._watermarks[lock_id] = bound

    def _advance_watermark(self, store: CellStore, lock_id: str, ticket: str) -> None:
        bound = ticket_time(ticket) - ENQUEUE_WINDOW_US
        self._watermark(lock_id, store)  # make sure the stored value is known
        with self._watermarks_lock:
            stored = self._stored_watermarks.get(lock_id, 0)
        # Publish rarely (when it moved by a whole window): one write per window, not per acquisition.
        if bound - stored >= ENQUEUE_WINDOW_US:
            store.put(Table.WATERMARK, lock_id, "head", str(bound), timestamp=bound)
            with self._watermarks_lock:
                self._stored_watermarks[lock_id] = max(bound, self._stored_watermarks.get(lock_id, 0))
                self._watermarks[lock_id] = max(bound, self._watermarks.get(lock_id, 0))
