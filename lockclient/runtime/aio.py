"""The asyncio runtime: the same blocking-style algorithm code, run on an event loop.

``aget_lock`` runs the acquisition (:meth:`lockclient.fairqueue.FairQueue.acquire`) inside a
greenlet driven by a coroutine (:func:`run_in_greenlet`). Whenever the algorithm waits — sleeps,
waits on an event, a lock, a wake-up socket — the runtime hands an awaitable to that coroutine,
which awaits it on the loop and resumes the greenlet with the result (SQLAlchemy's
``greenlet_spawn``/``await_only``). So a thousand waiting acquisitions are a thousand suspended
greenlets on one loop — no thread each, and nothing queues behind the default executor.

What cannot wait on the loop — a call into the store's driver or SQLite, an HTTP request to
timesvc — goes to a small pool of threads of this runtime's own (:class:`_BlockingPool`,
:meth:`AsyncioRuntime.call_blocking`), never to the loop's default executor, so an application's
own ``asyncio.to_thread`` work and chronolock's never starve each other.

**The loop stays free for other work** (issue 25: a burst of 1,000 ``aget_lock`` calls held the
loop for 287–563 ms at a time, and 1,000 deadlines falling together made every ``LockTimeout``
~120 ms to 1.5 s late — the timers were on time, the loop that runs them was not). Two causes,
two cures:

- *All the greenlets that became ready in one loop iteration ran in it*, however many: 1,000
  enqueues or 1,000 clean-ups after a deadline, ~0.3 ms of Python each, in one stretch. Each
  step into a greenlet now passes :class:`_Pacer`: the steps of one loop iteration are cut off
  after ``SLICE_S`` of work; the rest wait in arrival order (FIFO) and are let through a slice per
  iteration, so timers, I/O and the application's own tasks run between slices.
- *Each store call cost the loop a ``concurrent.futures`` future, a chained asyncio future, a
  shield and a wake-up of the loop's self-pipe* — half the loop's time in the burst, and every
  self-pipe wake-up a chance to lose the GIL to one of 24 busy threads for a switch interval.
  :class:`_BlockingPool` hands a call to a worker with one queue put, and the workers hand the
  outcomes back in batches: one loop wake-up for all the calls that finished meanwhile.

Leases are renewed by the locker's keeper on its own threads (:mod:`lockclient.keeper`), as for
the synchronous API: the two meet only through thread-safe, non-blocking calls.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from greenlet import getcurrent, greenlet

from lockclient.logs import get_logger
from lockclient.runtime.base import Condition, Event, Lock, Pool, Task
from lockclient.runtime.threads import RandomPool, host_name
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

__all__ = ["AioWakeups", "AsyncioRuntime", "BlockingStore", "Progress", "run_in_greenlet"]

T = TypeVar("T")

log = get_logger("lockclient")

BLOCKING_WORKERS = 16
"""Threads per event loop for calls that cannot wait on the loop (store drivers, HTTP)."""

SLICE_S = 0.002
"""At most about this much greenlet work per loop iteration (:class:`_Pacer`): what chronolock
adds to the loop's lag for other work when a thousand acquisitions want the loop at once."""

MAX_SLICE_S = 0.05
"""The longest slice, however slow the loop's other work (see :class:`_Pacer`)."""

FIRST_STEP_COST_S = 0.0003
"""What a greenlet step is taken to cost before any was measured (an enqueue, on this machine)."""


class _Bridge(greenlet):
    """A greenlet run by :func:`run_in_greenlet`: the only place a runtime wait may happen."""


_RAISE = object()


class _Finish:
    """On cancellation, wait for this call anyway: it (a store request) is under way, and its
    outcome must reach the algorithm — a grant that applied is a grant."""

    __slots__ = ("call",)

    def __init__(self, call: _Call[Any]) -> None:
        self.call = call


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


class Progress:
    """Where a greenlet run by :func:`run_in_greenlet` stands, for its caller: ``in_io`` while a
    store call (or another call on the runtime's workers) it started is under way or its outcome
    not yet taken in — a grant may be landing — and False while it merely waits."""

    __slots__ = ("in_io",)

    def __init__(self) -> None:
        self.in_io = False


async def run_in_greenlet(
    fn: Callable[[], T],
    *,
    on_cancel: Callable[[], None] | None = None,
    admitted: bool = False,
    progress: Progress | None = None,
) -> T:
    """Run blocking-style ``fn`` on this loop: its runtime waits become awaits here.

    With ``on_cancel``, cancelling the driving task never tears the algorithm apart mid-step:
    ``on_cancel()`` runs (an acquisition sets its cancel event), the wait in progress returns a
    neutral answer or — for a store call in flight — its real outcome, and the algorithm unwinds
    by itself (withdrawing its queue cell, giving back a grant). Its own result or error is the
    task's: a lock granted just as the task was cancelled is returned, so its caller can release it.

    Every step into the greenlet takes its turn at the loop's :class:`_Pacer` first (``admitted``:
    the first step's turn was taken already, by :meth:`_Pacer.admit`)."""
    pacer = AsyncioRuntime.current().pacer
    bridge = _Bridge(fn, parent=getcurrent())
    resume: Callable[[], Any] = bridge.switch
    while True:
        cancelled: BaseException | None = None
        if not admitted and not pacer.may_run():
            cancelled = await _wait_for(pacer.turn())
        admitted = False
        # Let through with others, but the slice is spent already: first in line for the next.
        while cancelled is None and pacer.spent_out():
            cancelled = await _wait_for(pacer.turn(first=True))
        if cancelled is not None:
            # Cancelled while waiting for its turn: what the greenlet is owed (a wait's or a store
            # call's outcome) is at hand; the cancellation reaches it as during a wait.
            if on_cancel is None:
                resume = partial(bridge.throw, cancelled)
            else:
                on_cancel()
        started = pacer.clock()
        try:
            request = resume()
        finally:
            pacer.spent(pacer.clock() - started)
        if bridge.dead:
            return cast(T, request)
        awaitable, if_cancelled = request
        if progress is not None:
            progress.in_io = isinstance(if_cancelled, _Finish)
        try:
            value = await awaitable
        except asyncio.CancelledError as exc:
            if on_cancel is None or if_cancelled is _RAISE:
                resume = partial(bridge.throw, exc)
                continue
            on_cancel()
            try:
                value = (await if_cancelled.call.outcome()) if isinstance(if_cancelled, _Finish) else if_cancelled
            except BaseException as error:
                resume = partial(bridge.throw, error)
                continue
            resume = partial(bridge.switch, value)
        except BaseException as exc:
            resume = partial(bridge.throw, exc)
        else:
            resume = partial(bridge.switch, value)


async def _wait_for(turn: asyncio.Future[bool]) -> BaseException | None:
    """Wait for a turn; the cancellation that came instead, if one did."""
    try:
        await turn
    except asyncio.CancelledError as exc:
        return exc
    return None


class _Pacer:
    """Keeps one loop's greenlet steps from hogging it: about ``slice_s`` of them per iteration.

    A step (a resumption of a bridge greenlet, :func:`run_in_greenlet`) may run at once while the
    current slice has time left and nobody is waiting; otherwise it waits for its turn in arrival
    order. Once per iteration (:meth:`_next_slice`, a ``call_soon`` callback, so it runs after what
    was already ready — timers, I/O, other tasks) a new slice starts and lets through as many
    waiting steps as fit in it, judged by what steps have been costing lately (measured, so a
    slower or busier machine lets fewer through). A waiting step costs the loop a future, not a
    poll. ``clock``: for tests (a step "costs" what this clock says it took).

    How many to let through is judged by the steps' average cost; a step let through that finds
    the slice spent twice over (dearer steps than the average) waits again, first in line for the
    next slice — so a slice never runs much over, and the average keeps the line moving: judged
    by the dearest recent step instead, a loaded machine (every step sometimes descheduled)
    let so few through that 750 waiters' looks outran the slices and a new ``aget_lock`` waited
    more than 60 s for its turn.

    A slice is ``slice_s`` or as long as the loop's other work took since the last one, whichever
    is longer (at most ``MAX_SLICE_S``): on a loop whose other work is slow (a synchronous call in
    the application's own code), chronolock's steps still get half of it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        slice_s: float = SLICE_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self.slice_s = slice_s
        self.clock = clock
        self._used = 0.0
        self._step_cost = FIRST_STEP_COST_S
        self._waiting: deque[asyncio.Future[bool]] = deque()
        self._slice_due = False
        self._budget = slice_s
        self._slice_started = clock()
        self._spent = 0.0
        """Measured step time since the slice started (the rest of the interval is other work)."""

    def may_run(self) -> bool:
        return not self._waiting and self._used < self.slice_s

    def spent_out(self) -> bool:
        """This slice has run twice its length: a step let through should wait for the next."""
        return self._used >= 2 * self._budget

    def turn(self, *, first: bool = False) -> asyncio.Future[bool]:
        """Resolved (True) when it is this step's turn (FIFO; ``first``: ahead of everyone, for a
        step that had its turn but found the slice spent). Cancelling it gives the turn up."""
        waiter: asyncio.Future[bool] = self._loop.create_future()
        if first:
            self._waiting.appendleft(waiter)
        else:
            self._waiting.append(waiter)
        self._due()
        return waiter

    async def admit(self, deadline: float | None) -> bool:
        """Wait for a turn to start an acquisition (before its task and greenlet exist: a burst of
        a thousand ``aget_lock`` calls costs the loop a future each, then comes in slices).
        False: ``deadline`` (``time.monotonic()``) passed first."""
        if self.may_run():
            # What its first step will cost, counted now: that step runs an iteration later,
            # and the other calls of this burst must not all find the slice still empty.
            self._used += self._step_cost
            self._due()
            return True
        waiter = self.turn()
        timer = None if deadline is None else self._loop.call_later(deadline - time.monotonic(), _give_up, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()

    def spent(self, seconds: float) -> None:
        """A step ran for ``seconds`` (by :attr:`clock`, which run_in_greenlet passes on)."""
        self._used += seconds
        self._spent += seconds
        self._step_cost += (seconds - self._step_cost) * 0.1
        self._due()

    def _due(self) -> None:
        if not self._slice_due:
            self._slice_due = True
            self._loop.call_soon(self._next_slice)

    def _next_slice(self) -> None:
        self._slice_due = False
        self._used = 0.0
        now = self.clock()
        other_work = now - self._slice_started - self._spent
        self._slice_started, self._spent = now, 0.0
        # (Capped: what a step costs the loop beyond its measured switch — waking its task — counts
        # as other work, and must not feed the next slice without end.)
        budget = self._budget = min(max(self.slice_s, other_work), MAX_SLICE_S)
        if not self._waiting:
            return
        # The steps let through now run in the next iteration, before the next slice starts: the
        # callback below is scheduled after their wake-ups, so it runs after them.
        room = max(1, int(budget / max(self._step_cost, 1e-6)))
        waiting = self._waiting
        while waiting and room > 0:
            waiter = waiting.popleft()
            if not waiter.done():  # else cancelled, or its deadline passed, while waiting
                waiter.set_result(True)
                room -= 1
        # This iteration's room is given: newcomers queue behind (may_run is False while anyone
        # waits, and the steps let through count what they spend against spent_out).
        self._due()


def _give_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


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


class _Call(Generic[T]):
    """One call on a :class:`_BlockingPool`'s worker; its outcome reaches the loop in a batch.

    :attr:`done` is resolved with ``(value, error)`` — never with an exception, so an outcome
    nobody waits for any more (its caller was cancelled) is never reported as unretrieved."""

    __slots__ = ("_late", "_outcome", "done", "fn")

    def __init__(self, fn: Callable[[], T], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.done: asyncio.Future[tuple[T | None, BaseException | None]] = loop.create_future()
        self._outcome: tuple[T | None, BaseException | None] | None = None
        self._late: asyncio.Future[tuple[T | None, BaseException | None]] | None = None

    def settle(self, outcome: tuple[T | None, BaseException | None]) -> None:
        """On the loop: the worker has finished."""
        self._outcome = outcome
        if not self.done.done():
            self.done.set_result(outcome)
        if self._late is not None and not self._late.done():
            self._late.set_result(outcome)

    async def outcome(self) -> tuple[T | None, BaseException | None]:
        """What :attr:`done` tells, even after it was cancelled with its waiter."""
        if self._outcome is not None:
            return self._outcome
        if self._late is None:
            self._late = self.done.get_loop().create_future()
        return await asyncio.shield(self._late)


def _unpack(outcome: tuple[T | None, BaseException | None]) -> T:
    value, error = outcome
    if error is not None:
        raise error
    return cast(T, value)


class _BlockingPool:
    """Up to ``workers`` threads for the calls of one loop that cannot wait on it.

    Handing a call over is one queue put (a thread is started only while none is idle); the
    outcomes go back to the loop in batches: a worker that finishes a call schedules one
    delivery callback unless one is due already, and that callback settles every call finished
    by then — one wake-up of the loop for many calls. The threads are daemons: a call still
    running at interpreter exit (a release) is cut short, as a crash would cut it, and the
    lease's expiry covers it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int, name: str) -> None:
        self._loop = loop
        self._max = workers
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], _Call[Any] | None]] = queue.SimpleQueue()
        self._finished: deque[tuple[_Call[Any], tuple[Any, BaseException | None]]] = deque()
        self._delivery_due = False
        self._count_lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def start(self, fn: Callable[[], T]) -> _Call[T]:
        """On the loop: run ``fn`` on a worker; :attr:`_Call.done` tells its outcome."""
        call = _Call(fn, self._loop)
        self._put(fn, call)
        return call

    def submit(self, fn: Callable[[], object]) -> None:
        """From any thread: run ``fn`` on a worker, for its effect only (an error is logged)."""
        self._put(fn, None)

    def _put(self, fn: Callable[[], Any], call: _Call[Any] | None) -> None:
        self._jobs.put((fn, call))
        # Read without the lock: taking a lock the workers take too was itself a stall on the
        # loop (contended, it gives up the GIL). A stale count only starts a thread late or early.
        if self._idle > 0 or self._threads >= self._max:
            return
        with self._count_lock:
            if self._threads >= self._max:
                return
            self._threads += 1
            index = self._threads - 1
        threading.Thread(target=self._work, name=f"{self._name}_{index}", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._count_lock:
                self._idle += 1
            fn, call = self._jobs.get()
            with self._count_lock:
                self._idle -= 1
            try:
                outcome: tuple[Any, BaseException | None] = (fn(), None)
            except BaseException as error:  # handed to the caller, as an executor would
                outcome = (None, error)
            if call is None:
                if outcome[1] is not None:
                    log.warning("background_call_failed", call=repr(fn), error=repr(outcome[1]))
                continue
            self._finished.append((call, outcome))
            if not self._delivery_due:
                self._delivery_due = True
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    self._finished.clear()

    def _deliver(self) -> None:
        # Cleared before draining: a call finished from here on schedules the next delivery
        # (or is drained now and finds an empty deque later, which is harmless).
        self._delivery_due = False
        finished = self._finished
        while finished:
            call, outcome = finished.popleft()
            call.settle(outcome)


_RUNTIMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncioRuntime] = weakref.WeakKeyDictionary()
_RUNTIMES_LOCK = threading.Lock()


class AsyncioRuntime:
    """The runtime of one event loop (:meth:`current`)."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()
        """The thread that runs the loop (the one that called :meth:`current`)."""
        self.blocking = _BlockingPool(loop, BLOCKING_WORKERS, "chronolock-io")
        self.pacer = _Pacer(loop)
        self._random = RandomPool()
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
        """Run a call that blocks on I/O (a store driver, HTTP) on this runtime's workers; called
        from outside a bridge greenlet (already on a worker thread), it simply runs."""
        if not in_bridge():
            return fn()
        return self.finish_blocking(self.start_blocking(fn))

    def start_blocking(self, fn: Callable[[], T]) -> _Call[T]:
        """Start ``fn`` on this runtime's workers now (from the loop); :meth:`finish_blocking`
        waits for it. Its error is kept for that wait (never reported as unretrieved)."""
        return self.blocking.start(fn)

    def finish_blocking(self, call: _Call[T]) -> T:
        """Wait (in a bridge greenlet) for a call started by :meth:`start_blocking`. Cancelling the
        driving task does not abandon it: the call is under way and its outcome is returned."""
        return _unpack(_await(call.done, _Finish(call)))

    def submit_blocking(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on this runtime's workers for its effect (a release nobody awaits); from any
        thread. An error is logged."""
        self.blocking.submit(fn)

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        """:meth:`call_blocking` for coroutines (cancelling the caller abandons the outcome)."""
        return _unpack(await self.blocking.start(fn).done)

    # -- randomness and names ---------------------------------------------------------------------------

    def uniform(self, a: float, b: float) -> float:
        return random.uniform(a, b)

    def token_hex(self, nbytes: int) -> str:
        return self._random.token_hex(nbytes)

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
