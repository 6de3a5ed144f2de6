"""The asyncio runtime: the same blocking-style algorithm code, run on an event loop.

``aget_lock`` runs the acquisition (:meth:`lockclient.fairqueue.FairQueue.acquire`) inside a
greenlet driven by a coroutine (:func:`run_in_greenlet`). Whenever the algorithm waits — sleeps,
waits on an event, a lock, a wake-up socket — the runtime hands an awaitable to that coroutine,
which awaits it on the loop and resumes the greenlet with the result (SQLAlchemy's
``greenlet_spawn``/``await_only``). So a thousand waiting acquisitions are a thousand suspended
greenlets on one loop — no thread each, and nothing queues behind the default executor.

What cannot wait on the loop — a call into the store's driver or SQLite, an HTTP request to
timesvc — goes to a small executor of this runtime's own (:meth:`AsyncioRuntime.call_blocking`),
never to the loop's default executor, so an application's own ``asyncio.to_thread`` work and
chronolock's never starve each other.

Leases are renewed by the locker's keeper on its own threads (:mod:`lockclient.keeper`), as for
the synchronous API: the two meet only through thread-safe, non-blocking calls.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar, cast

from greenlet import getcurrent, greenlet

from lockclient.runtime.base import Condition, Event, Lock, Pool, Task
from lockclient.runtime.threads import host_name
from lockclient.store.base import (
    CasResult,
    Cell,
    CellStore,
    CheckpointResult,
    CompareAndSet,
    Op,
    Pending,
    Table,
    VersionedTable,
)
from lockclient.wake import Listener, LocalListener, Taken, Wakeups, Watch

__all__ = ["AioWakeups", "AsyncioRuntime", "BlockingStore", "run_in_greenlet"]

T = TypeVar("T")

BLOCKING_WORKERS = 16
"""Threads per event loop for calls that cannot wait on the loop (store drivers, HTTP)."""


class _Bridge(greenlet):
    """A greenlet run by :func:`run_in_greenlet`: the only place a runtime wait may happen."""


_RAISE = object()


class _Finish:
    """On cancellation, wait for this future anyway: the call it stands for (a store request) is
    under way, and its outcome must reach the algorithm — a grant that applied is a grant."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future


def _await(awaitable: Awaitable[T], on_cancel: object = _RAISE) -> T:
    """Hand ``awaitable`` to the coroutine driving this greenlet and return its result.

    ``on_cancel``: what the algorithm gets if the driving task is cancelled meanwhile (see
    :func:`run_in_greenlet`): a neutral answer for a wait (woken, not set), a :class:`_Finish`
    for I/O that must complete; by default the CancelledError itself."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        raise RuntimeError("an asyncio-runtime wait outside run_in_greenlet (use the thread runtime here)")
    parent = current.parent
    assert parent is not None
    return cast(T, parent.switch((awaitable, on_cancel)))


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def in_bridge() -> bool:
    return isinstance(getcurrent(), _Bridge)


async def run_in_greenlet(fn: Callable[[], T], *, on_cancel: Callable[[], None] | None = None) -> T:
    """Run blocking-style ``fn`` on this loop: its runtime waits become awaits here.

    With ``on_cancel``, cancelling the driving task never tears the algorithm apart mid-step:
    ``on_cancel()`` runs (an acquisition sets its cancel event), the wait in progress returns a
    neutral answer or — for a store call in flight — its real outcome, and the algorithm unwinds
    by itself (withdrawing its queue cell, giving back a grant). Its own result or error is the
    task's: a lock granted just as the task was cancelled is returned, so its caller can release it."""
    bridge = _Bridge(fn, parent=getcurrent())
    request = bridge.switch()
    while not bridge.dead:
        awaitable, if_cancelled = request
        try:
            value = await awaitable
        except asyncio.CancelledError as exc:
            if on_cancel is None or if_cancelled is _RAISE:
                request = bridge.throw(exc)
                continue
            on_cancel()
            try:
                value = (await if_cancelled.future) if isinstance(if_cancelled, _Finish) else if_cancelled
            except BaseException as error:
                request = bridge.throw(error)
                continue
            request = bridge.switch(value)
        except BaseException as exc:
            request = bridge.throw(exc)
        else:
            request = bridge.switch(value)
    return cast(T, request)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _AioEvent:
    """An event whose :meth:`set` may come from any thread; waited for on the loop.

    A wait is one future (and a timer), resolved by :meth:`set` or the timeout — no task, so that
    a thousand waiters' waits cost the loop little; :class:`_AioListener` resolves the same
    future when it is set (a cancelled acquisition stops waiting for its wake-up socket)."""

    def __init__(self, runtime: AsyncioRuntime) -> None:
        self._runtime = runtime
        self._flag = False
        self._waiters: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        self._flag = True
        self._runtime.on_loop(self._wake)

    def _wake(self) -> None:
        for waiter in self._waiters:
            _resolve(waiter)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Resolve ``waiter`` (on the loop) when the event is set, until :meth:`remove_waiter`."""
        self._waiters.add(waiter)
        if self._flag:
            _resolve(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    async def _wait(self, timeout: float | None) -> bool:
        loop = self._runtime.loop
        waiter: asyncio.Future[None] = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        self.add_waiter(waiter)
        try:
            await waiter
        finally:
            self.remove_waiter(waiter)
            if timer is not None:
                timer.cancel()
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        return _await(self._wait(timeout), self._flag)


class _AioLock:
    """A lock for the greenlets of one loop (an ``asyncio.Lock``)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.locked():
            return _await(self._lock.acquire())
        if not blocking or timeout == 0:
            return False
        if timeout < 0:
            return _await(self._lock.acquire())

        async def within() -> bool:
            try:
                return await asyncio.wait_for(self._lock.acquire(), timeout)
            except TimeoutError:
                return False

        return _await(within())

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class _AioCondition:
    def __init__(self, lock: _AioLock | None = None) -> None:
        self._lock = lock or _AioLock()
        self._condition = asyncio.Condition(self._lock._lock)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        async def waiting() -> bool:
            try:
                await asyncio.wait_for(self._condition.wait(), timeout)
            except TimeoutError:
                return False
            return True

        return _await(waiting())

    def notify(self, n: int = 1) -> None:
        self._condition.notify(n)

    def notify_all(self) -> None:
        self._condition.notify_all()


class _AioTask:
    def __init__(self, task: asyncio.Task[object], name: str) -> None:
        self._task = task
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def is_alive(self) -> bool:
        return not self._task.done()

    def join(self, timeout: float | None = None) -> None:
        _await(asyncio.wait([self._task], timeout=timeout))


class _AioPool:
    """``workers`` greenlet tasks at most, started on demand."""

    def __init__(self, runtime: AsyncioRuntime, workers: int, name: str) -> None:
        self._runtime = runtime
        self._workers = workers
        self._name = name
        self._queue: list[Callable[[], object]] = []
        self._running = 0
        self._closed = False

    def submit(self, fn: Callable[[], object]) -> None:
        if self._closed:
            raise RuntimeError("pool shut down")
        self._queue.append(fn)
        if self._running < self._workers:
            self._running += 1
            self._runtime.spawn(self._work, name=self._name)

    def _work(self) -> None:
        try:
            while self._queue and not self._closed:
                self._queue.pop(0)()
        finally:
            self._running -= 1

    def shutdown(self) -> None:
        self._closed = True
        self._queue.clear()


_RUNTIMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncioRuntime] = weakref.WeakKeyDictionary()
_RUNTIMES_LOCK = threading.Lock()


class AsyncioRuntime:
    """The runtime of one event loop (:meth:`current`)."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()
        """The thread that runs the loop (the one that called :meth:`current`)."""
        self.executor = ThreadPoolExecutor(BLOCKING_WORKERS, thread_name_prefix="chronolock-io")
        self._host = host_name()
        self._tasks: set[asyncio.Task[object]] = set()

    @classmethod
    def current(cls) -> AsyncioRuntime:
        """The runtime of the running loop (one per loop, made on first use)."""
        loop = asyncio.get_running_loop()
        with _RUNTIMES_LOCK:
            runtime = _RUNTIMES.get(loop)
            if runtime is None:
                runtime = _RUNTIMES[loop] = cls(loop)
        return runtime

    def on_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop: now if we are on it, else soon (thread-safe)."""
        if threading.get_ident() == self.loop_thread:
            fn()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn)

    # -- time -----------------------------------------------------------------------------------------

    def monotonic(self) -> float:
        return time.monotonic()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def wall_us(self) -> int:
        return time.time_ns() // 1_000

    def sleep(self, seconds: float) -> None:
        _await(asyncio.sleep(max(0.0, seconds)), None)

    # -- primitives -----------------------------------------------------------------------------------

    def event(self) -> Event:
        return _AioEvent(self)

    def lock(self) -> Lock:
        return _AioLock()

    def condition(self, lock: Lock | None = None) -> Condition:
        if lock is not None and not isinstance(lock, _AioLock):
            raise TypeError("an asyncio-runtime condition needs an asyncio-runtime lock")
        return _AioCondition(lock)

    def spawn(self, target: Callable[[], object], *, name: str) -> Task:
        task: asyncio.Task[object] = self.loop.create_task(run_in_greenlet(target), name=name)
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)
        return _AioTask(task, name)

    def pool(self, workers: int, *, name: str) -> Pool:
        return _AioPool(self, workers, name)

    def call_blocking(self, fn: Callable[[], T]) -> T:
        """Run a call that blocks on I/O (a store driver, HTTP) on this runtime's executor; called
        from outside a bridge greenlet (already on an executor thread), it simply runs."""
        if not in_bridge():
            return fn()
        return self.finish_blocking(self.start_blocking(fn))

    def start_blocking(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Start ``fn`` on this runtime's executor now (from the loop); :meth:`finish_blocking`
        waits for it. Its error is kept for that wait (never reported as unretrieved)."""
        future = self.loop.run_in_executor(self.executor, fn)
        future.add_done_callback(_retrieve)
        return future

    def finish_blocking(self, future: asyncio.Future[T]) -> T:
        """Wait (in a bridge greenlet) for a call started by :meth:`start_blocking`. Cancelling the
        driving task does not abandon it: the call is under way and its outcome is returned."""
        return _await(asyncio.shield(future), _Finish(future))

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        """:meth:`call_blocking` for coroutines."""
        return await self.loop.run_in_executor(self.executor, fn)

    # -- randomness and names ---------------------------------------------------------------------------

    def uniform(self, a: float, b: float) -> float:
        return random.uniform(a, b)

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)

    def host(self) -> str:
        return self._host

    def pid(self) -> int:
        return os.getpid()

    def task_name(self) -> str:
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            task = None
        return task.get_name() if task is not None else threading.current_thread().name


class BlockingStore(CellStore):
    """A store whose every call goes through :meth:`AsyncioRuntime.call_blocking` (a sync driver,
    used from greenlets on the loop)."""

    def __init__(self, store: CellStore, runtime: AsyncioRuntime) -> None:
        self.inner = store
        self._runtime = runtime
        self.supports_compare_and_set = store.supports_compare_and_set
        self.spans_machines = store.spans_machines
        self.batches_compare_and_set = store.batches_compare_and_set

    def _io(self, fn: Callable[[], T]) -> T:
        return self._runtime.call_blocking(fn)

    @property
    def url(self) -> str:
        return self.inner.url

    def put(self, table: Table, row: str, column: str, value: str, *, timestamp: int, ttl: float | None = None) -> None:
        self._io(lambda: self.inner.put(table, row, column, value, timestamp=timestamp, ttl=ttl))

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        self._io(lambda: self.inner.put_cells(table, row, cells, timestamp=timestamp, ttl=ttl))

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        self._io(lambda: self.inner.delete(table, row, column, timestamp=timestamp))

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        return self._io(lambda: self.inner.get(table, row, column))

    def read_row(
        self,
        table: Table,
        row: str,
        *,
        start: str = "",
        limit: int | None = None,
        end: str | None = None,
        reverse: bool = False,
    ) -> list[Cell]:
        return self._io(lambda: self.inner.read_row(table, row, start=start, limit=limit, end=end, reverse=reverse))

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        wanted = list(rows)
        return self._io(lambda: self.inner.read_rows_many(table, wanted, starts, newer_than=newer_than))

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        return self._io(lambda: self.inner.read_versioned(row, table=table, serial=serial))

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        wanted = list(rows)
        return self._io(lambda: self.inner.read_versioned_many(wanted, table=table, serial=serial))

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        return self._io(lambda: self.inner.compare_and_set(row, expected, updates, table=table))

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | Any]]:
        return iter(self._io(lambda: list(self.inner.compare_and_set_many(ops))))

    def begin(self, ops: Sequence[Op]) -> Pending:
        # One trip to the executor, started now and awaited by wait(): the operations overlap
        # whatever the caller does meanwhile, as the Cassandra adapter's begin() promises.
        if not in_bridge():
            return self.inner.begin(ops)
        wanted = list(ops)
        future = self._runtime.start_blocking(lambda: self.inner.begin(wanted).wait())
        return Pending(lambda: self._runtime.finish_blocking(future))

    def run_concurrently(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        return self._io(lambda: self.inner.run_concurrently(calls))

    def collect_garbage(self) -> int:
        return self._io(self.inner.collect_garbage)

    def checkpoint(self) -> CheckpointResult | None:
        return self._io(self.inner.checkpoint)

    def storage_bytes(self) -> dict[str, int]:
        return self._io(self.inner.storage_bytes)

    def close(self) -> None:
        """The wrapped store belongs to the caller."""


class _AioListener:
    """A local wake-up socket waited for by the event loop, not by a thread.

    The socket is registered with the loop (``add_reader``) once, for as long as it is bound, and
    a datagram is consumed by the reader callback as it arrives; a wait is then a future and a
    timer, with no system call. Why it matters: every system call releases the GIL, and getting it
    back from threads busy with store calls (this runtime's executor, the keeper's renewals) can
    take a switch interval (5 ms) each — registering, draining and unregistering the socket on
    every wait of 1,000 waiters made the loop late by 100–300 ms for everyone else (issue 25)."""

    def __init__(self, listener: LocalListener, runtime: AsyncioRuntime) -> None:
        self._listener = listener
        self._runtime = runtime
        self.watch = listener.watch
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._fd = listener.fileno()
        self._closed = False
        listener.for_event_loop()
        runtime.loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        # Level-triggered: consume it now, or the loop calls us again on every turn.
        if self._listener.consume_one():
            self._woken = True
            if self._waiter is not None:
                _resolve(self._waiter)

    async def _readable(self, timeout: float, cancel: Event | None) -> None:
        loop = self._runtime.loop
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(timeout, _resolve, waiter)
        hooked = cancel if isinstance(cancel, _AioEvent) else None
        if hooked is not None:
            hooked.add_waiter(waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            timer.cancel()
            if hooked is not None:
                hooked.remove_waiter(waiter)

    def wait(self, timeout: float, cancel: Event | None = None) -> bool:
        if cancel is not None and cancel.is_set():
            return False
        if not self._woken and timeout > 0:
            _await(self._readable(timeout, cancel), None)
        woken, self._woken = self._woken, False
        return woken

    def wake(self) -> None:
        self._listener.wake()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def unregister_and_close() -> None:
            # Unregistered before the descriptor is closed (a reused number must not inherit it).
            if not self._runtime.loop.is_closed():
                self._runtime.loop.remove_reader(self._fd)
            self._listener.close()

        if threading.get_ident() == self._runtime.loop_thread or self._runtime.loop.is_closed():
            unregister_and_close()
        else:
            self._runtime.on_loop(unregister_and_close)


class AioWakeups:
    """The local wake-ups (:data:`lockclient.wake.LOCAL_WAKEUPS`) for waiters on an event loop."""

    def __init__(self, base: Wakeups, runtime: AsyncioRuntime) -> None:
        self._base = base
        self._runtime = runtime

    def listen(self, lock_id: str, watch: Watch) -> Listener | Taken | None:
        bound = self._base.listen(lock_id, watch)
        if isinstance(bound, LocalListener):
            return _AioListener(bound, self._runtime)
        return bound

    def announce(self, lock_id: str, *, gone: str | None = None, released: str | None = None) -> bool:
        return self._base.announce(lock_id, gone=gone, released=released)
