"""The asyncio runtime: the same blocking-style algorithm code, run on an event loop.

``aget_lock`` runs the acquisition (:meth:`lockclient.fairqueue.FairQueue.acquire`) inside a
greenlet driven by callbacks on the loop (:class:`_Run`). Whenever the algorithm waits — sleeps,
waits on an event, a wake-up socket, a store call — the runtime hands a future to the run, which
attaches a callback to it and returns to the loop; the callback puts the run back in line, and
the greenlet resumes with the result (SQLAlchemy's ``greenlet_spawn``/``await_only``, without
the coroutine). So a thousand waiting acquisitions are a thousand suspended greenlets and the
futures they wait for — no thread each, no task each, and nothing queues behind the default
executor. (:func:`run_in_greenlet` is the same for a coroutine that awaits the result.)

What cannot wait on the loop — a call into the store's driver or SQLite, an HTTP request to
timesvc — goes to a small pool of threads of this runtime's own (:class:`_BlockingPool`,
:meth:`AsyncioRuntime.call_blocking`), never to the loop's default executor, so an application's
own ``asyncio.to_thread`` work and chronolock's never starve each other.

**The loop stays free for other work** (issue 25: a burst of 1,000 ``aget_lock`` calls held the
loop for 287–563 ms at a time, and 1,000 deadlines falling together made every ``LockTimeout``
~120 ms to 1.5 s late — the timers were on time, the loop that runs them was not):

- *Every step into a greenlet passes the loop's* :class:`_Pacer`: at most a slice of them
  (``SLICE_S`` of the loop thread's CPU, never more than ``MAX_SLICE_S``) per loop iteration; the
  rest wait in arrival order (FIFO), so timers, I/O and the application's own tasks run between
  slices. Waking a run is a callback, not a task step: a task per acquisition woke 900 tasks in
  one iteration only for each to find it had to wait for its turn (15–20 ms of the loop).
- *Deadlines are delivered in slices too, ahead of every step*: a thousand ``LockTimeout`` raised
  in one iteration were a thousand task steps of the application's at once. And they are one
  heap per loop under a single asyncio timer (:class:`_Deadlines`), which the runs leave their
  deadline to: a timer per caller, and one per run's wait capped at the same moment, were ~1,250
  callbacks that asyncio ran in one iteration when 1,000 deadlines fell together.
- *Each store call cost the loop a ``concurrent.futures`` future, a chained asyncio future, a
  shield and a wake-up of the loop's self-pipe*. :class:`_BlockingPool` hands a call to a worker
  with one queue put, and the workers hand the outcomes back in batches: one loop wake-up for
  all the calls that finished meanwhile.

What no runtime can bound: CPython's full garbage collections, which stop the loop for as long
as walking every tracked object of the process takes. So a waiting acquisition keeps few of them
(~60 with its caller's task, from ~120: no task, no closures, no look's cells, no timer or
context copy of its own; ``python -m bench asyncio`` reports them and the collections apart,
BENCHMARKS.md).

Leases are renewed by the locker's keeper on its own threads (:mod:`lockclient.keeper`), as for
the synchronous API: the two meet only through thread-safe, non-blocking calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
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
from typing import Any, Generic, Protocol, TypeVar, cast

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

IDLE_CHECK_S = 1.0
"""How often an idle worker looks whether its event loop was closed (then it ends)."""

SLICE_S = 0.002
"""At most about this much greenlet work per loop iteration (:class:`_Pacer`): what chronolock
adds to the loop's lag for other work when a thousand acquisitions want the loop at once."""

MAX_SLICE_S = 0.005
"""The longest slice, however slow the loop's other work (see :class:`_Pacer`)."""

ADMIT_COST_S = 0.000015
"""What letting an ``aget_lock`` call in is counted to cost the loop (:meth:`_Pacer.admit`): its
caller's task step then builds the acquisition (~15 µs on this machine: 499 callers let in
together took 7.5 ms of the next iteration), in the application's task."""

WAKE_COST_S = 0.000015
"""What waking a caller (a task step raising ``LockTimeout``) is counted to cost the loop: its
task step runs in the application's task, where the pacer cannot time it (15 µs: 1,000 of them,
with the benchmark's handling, took ~14 ms in one iteration on this machine at load 10-20)."""


class _Bridge(greenlet):
    """A greenlet driven by a :class:`_Run`: the only place a runtime wait may happen."""

    __slots__ = ("driver",)  # (else an instance dict per waiting acquisition, for the collector)

    driver: _Run[Any]


_RAISE = object()


class _Finish:
    """On cancellation, wait for this call anyway: it (a store request) is under way, and its
    outcome must reach the algorithm — a grant that applied is a grant."""

    __slots__ = ("call",)

    def __init__(self, call: _Call[Any]) -> None:
        self.call = call


def _await(awaitable: Awaitable[T], on_cancel: object = _RAISE) -> T:
    """Hand ``awaitable`` to the :class:`_Run` driving this greenlet and return its result.

    ``on_cancel``: what the algorithm gets if its run is interrupted meanwhile (see
    :meth:`_Run.interrupt`): a neutral answer for a wait (woken, not set), a :class:`_Finish`
    for I/O that must complete; by default the CancelledError itself. A future is waited for
    with a callback; anything else (a coroutine) runs as a task of its own — the rare paths."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        raise RuntimeError("an asyncio-runtime wait outside run_in_greenlet (use the thread runtime here)")
    parent = current.parent
    assert parent is not None
    return cast(T, parent.switch((awaitable, on_cancel)))


def in_bridge() -> bool:
    return isinstance(getcurrent(), _Bridge)


class Progress:
    """Where a greenlet run stands, for its caller: ``in_io`` while a store call (or another call
    on the runtime's workers) it started is under way or its outcome not yet taken in — a grant
    may be landing — and False while it merely waits."""

    __slots__ = ("in_io",)

    def __init__(self) -> None:
        self.in_io = False


_NEW, _READY, _RUNNING, _WAITING, _DONE = range(5)


class _Run(Generic[T]):
    """One blocking-style function run in a greenlet on the loop, driven by callbacks — no task.

    Whenever the function waits (:func:`_await`), the run attaches a callback to the future it
    waits for and returns to the loop; the callback puts the run back in its :class:`_Pacer`'s
    line, which steps it when its turn comes. :attr:`result` is resolved with the function's
    return value or error. A thousand waiting acquisitions are a thousand suspended greenlets
    and the futures they wait for — no task each, no coroutine frames, and a wake-up costs the
    loop a callback rather than a task step (issue 25: 900 acquisition tasks woken in one loop
    iteration, only to find they had to wait for their turn, held the loop for 15–20 ms).

    ``on_cancel``: see :meth:`interrupt`. ``name``: what :meth:`AsyncioRuntime.task_name` says
    inside (the caller's task name: owner ids name who asked). The greenlet runs in a copy of
    the caller's context (contextvars: structured-log bindings reach the algorithm's logs)."""

    __slots__ = (
        "_bridge",
        "_context",
        "_fn",
        "_if_cancelled",
        "_interrupt",
        "_pacer",
        "_resume",
        "_runtime",
        "_state",
        "_tracked",
        "_waiting_on",
        "_wrapped",
        "deadline",
        "deadline_event",
        "name",
        "on_cancel",
        "on_done",
        "progress",
        "result",
    )

    def __init__(
        self,
        runtime: AsyncioRuntime,
        fn: Callable[[], T],
        *,
        on_cancel: Callable[[], None] | None = None,
        progress: Progress | None = None,
        name: str | None = None,
        on_done: Callable[[asyncio.Future[T]], None] | None = None,
    ) -> None:
        self._fn = fn
        self._runtime = runtime
        self._tracked = False
        self.on_done = on_done
        """Called with :attr:`result` as soon as it is settled (not for a drop), in the same step —
        cheaper than a done callback (no context copy, no scheduled call)."""
        self._pacer = runtime.pacer
        self.result: asyncio.Future[T] = runtime.loop.create_future()
        self.on_cancel = on_cancel
        self.progress = progress
        self.name = name if name is not None else runtime.task_name()
        self._context = contextvars.copy_context()
        self._bridge: _Bridge | None = None
        self._state = _NEW
        self._resume: Callable[[], Any] | None = None
        self._waiting_on: asyncio.Future[Any] | None = None
        self._wrapped = False
        self._if_cancelled: object = _RAISE
        self._interrupt: BaseException | None = None
        self.deadline: float | None = None
        """With :attr:`deadline_event`: the caller sets that event once this ``time.monotonic()``
        deadline has passed (``aget_lock``: its caller's LockTimeout, or the cancellation before
        it), so a wait that the event interrupts and that would last until the deadline anyway
        needs no timer of its own (:func:`_ended_by_deadline`)."""
        self.deadline_event: Event | None = None

    @property
    def started(self) -> bool:
        """Its first step ran (or it was dropped): it may have done something that needs undoing."""
        return self._state != _NEW

    def start(self) -> None:
        """Take a turn for the first step, in line (never in the caller's own task step: a burst of
        a thousand calls costs that iteration a deque entry each, and their first steps come in
        the next slices)."""
        self._pacer.enqueue(self)

    def drop(self) -> bool:
        """Never start it (its caller has gone before its first turn); False if it has started."""
        if self._state != _NEW:
            return False
        self._state = _DONE
        if self._tracked:
            self._runtime._run_done(self)
        self.result.cancel()
        return True

    def interrupt(self, exc: BaseException) -> None:
        """The caller was cancelled: with ``on_cancel``, the run is told (``on_cancel()``, an
        acquisition sets its cancel event) and the wait in progress returns its neutral answer
        — or, for a store call in flight, its real outcome (:class:`_Finish`) — so the algorithm
        unwinds by itself; without it (or for a wait with no neutral answer), ``exc`` is raised
        at the wait. A run not waiting right now (in line for its turn) gets the same treatment
        at its next step; one that finished is not affected."""
        if self._state == _DONE:
            return
        if self._state == _WAITING:
            self._interrupt_wait(exc)
            return
        if self.on_cancel is not None:
            self.on_cancel()
        else:
            self._interrupt = exc  # raised at its next step, where it waits

    def _interrupt_wait(self, exc: BaseException) -> None:
        if self.on_cancel is not None and self._if_cancelled is not _RAISE:
            self.on_cancel()
            if isinstance(self._if_cancelled, _Finish):
                return  # the call is under way: its outcome comes as usual
            resume: Callable[[], Any] = partial(self._switch, self._if_cancelled)
        else:
            resume = partial(self._throw, exc)
        self._detach()
        self._resume = resume
        self._state = _READY
        self._pacer.ready(self)

    def _detach(self) -> None:
        waited, self._waiting_on = self._waiting_on, None
        if waited is not None:
            waited.remove_done_callback(self._woken)
            if self._wrapped:
                waited.cancel()  # a coroutine's task (an asyncio.Lock acquisition): give it up

    def _switch(self, value: object) -> Any:
        assert self._bridge is not None
        return self._bridge.switch(value)

    def _throw(self, exc: BaseException) -> Any:
        assert self._bridge is not None
        return self._bridge.throw(exc)

    def step(self) -> bool:
        """Run the greenlet until it waits or ends (on the loop, from its pacer); True if it ended
        (its caller wakes: the pacer counts ``WAKE_COST_S`` for that)."""
        if self._state == _DONE:
            return False  # dropped while in line
        if self._state == _NEW:
            if self._interrupt is not None:
                exc, self._interrupt = self._interrupt, None
                self._finish(None, exc)
                return True
            bridge = self._bridge = _Bridge(self._fn, parent=getcurrent())
            bridge.driver = self
            bridge.gr_context = self._context
            resume: Callable[[], Any] = bridge.switch
        else:
            assert self._resume is not None
            resume, self._resume = self._resume, None
            if self._interrupt is not None:
                # Interrupted while in line (no on_cancel): the wait it was woken from raises.
                resume, self._interrupt = partial(self._throw, self._interrupt), None
        self._state = _RUNNING
        try:
            request = resume()
        except BaseException as exc:
            # The run's own frames go from the traceback: they reference the run, which keeps the
            # error in its result — a reference cycle per failed acquisition, left to the collector
            # (62 objects per LockTimeout: 1,000 deadlines together made a full collection longer).
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code in _OWN_CODE:
                tb = tb.tb_next
            exc.__traceback__ = tb
            self._finish(None, exc)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return True
        current = self._bridge
        assert current is not None
        if current.dead:
            self._finish(request, None)
            return True
        awaitable, if_cancelled = request
        if self.progress is not None:
            self.progress.in_io = isinstance(if_cancelled, _Finish)
        self._if_cancelled = if_cancelled
        if asyncio.isfuture(awaitable):
            waited = awaitable
            self._wrapped = False
        else:
            waited = asyncio.ensure_future(awaitable)
            self._wrapped = True
        self._waiting_on = waited
        self._state = _WAITING
        # In the runtime's own empty context, not a copy of whatever context this step runs in:
        # one Context object less per waiting run (the greenlet runs in its own context anyway).
        waited.add_done_callback(self._woken, context=self._runtime.quiet_context)
        if self._interrupt is not None and not waited.done():
            exc, self._interrupt = self._interrupt, None
            self._interrupt_wait(exc)
        return False

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self._state = _DONE
        self._bridge = None  # (a dead greenlet: nothing to keep)
        if self._tracked:
            self._runtime._run_done(self)
        if self.result.done():
            return
        if error is None:
            self.result.set_result(value)
        elif isinstance(error, asyncio.CancelledError):
            self.result.cancel()
        else:
            self.result.set_exception(error)
        if self.on_done is not None:
            self.on_done(self.result)

    def _woken(self, waited: asyncio.Future[Any]) -> None:
        if waited is not self._waiting_on:
            return
        self._waiting_on = None
        if waited.cancelled():
            resume: Callable[[], Any] = partial(self._throw, asyncio.CancelledError())
        else:
            error = waited.exception()
            resume = partial(self._throw, error) if error is not None else partial(self._switch, waited.result())
        self._resume = resume
        self._state = _READY
        self._pacer.ready(self)


_OWN_CODE = frozenset({_Run.step.__code__, _Run._switch.__code__, _Run._throw.__code__})


async def run_in_greenlet(
    fn: Callable[[], T],
    *,
    on_cancel: Callable[[], None] | None = None,
    progress: Progress | None = None,
) -> T:
    """Run blocking-style ``fn`` on this loop (a :class:`_Run`) and return its result.

    With ``on_cancel``, cancelling the awaiting task never tears the algorithm apart mid-step:
    ``on_cancel()`` runs (an acquisition sets its cancel event), the wait in progress returns a
    neutral answer or — for a store call in flight — its real outcome, and the algorithm unwinds
    by itself (withdrawing its queue cell, giving back a grant). Its own result or error is the
    task's: a lock granted just as the task was cancelled is returned, so its caller can release
    it. Without ``on_cancel``, the cancellation is raised at the wait in progress."""
    run = _Run(AsyncioRuntime.current(), fn, on_cancel=on_cancel, progress=progress)
    run.start()
    result = run.result
    while not result.done():
        notice: asyncio.Future[None] = result.get_loop().create_future()
        result.add_done_callback(partial(_resolve_with, notice))
        try:
            await notice
        except asyncio.CancelledError as exc:
            run.interrupt(exc)
    return result.result()


def _resolve_with(notice: asyncio.Future[None], _: object) -> None:
    if not notice.done():
        notice.set_result(None)


class _Stepper(Protocol):
    """What waits in a pacer's line: a :class:`_Run` (or a test's stand-in)."""

    def step(self) -> object:
        """Take a step; true if that woke a caller (counted ``WAKE_COST_S``)."""
        ...


class _Pacer:
    """Keeps one loop's greenlet steps from hogging it: about ``slice_s`` of them per iteration.

    A run that becomes ready (its first step, or the wait it was in ended) is stepped at once
    while nobody is in line and this iteration's slice has time left — a lone hand-over is not
    delayed — and otherwise waits in line, first come first served. Once per iteration
    (:meth:`_next_slice`, a ``call_soon`` callback, so it runs after what was already ready —
    timers, I/O, other tasks) the pacer steps runs from the line until the slice is spent, by
    :attr:`clock`: the loop's other work runs between slices. A run in line costs the loop a
    deque entry, no future and no task step.

    Time is the loop thread's CPU time (``clock``; a test passes its own, by which a step "costs"
    what it says): what the machine's load adds — the thread descheduled, or waiting for the
    GIL — is not chronolock's work. Measured by the wall clock, a step on a machine at load 50
    "cost" ten times its work, a slice held one or two, and the steps 1,000 waiters need to poll
    outgrew the slices: the line grew without end and new callers never got their turn.

    A slice is ``slice_s``, or as long as the loop's other work took since the last one if that
    is longer — at most ``max_slice_s``: on a loop whose other work is slow, chronolock's runs
    still get a share, but no slice ever holds the loop longer than ``max_slice_s`` (the loop lag
    chronolock may add; it was 50 ms before, and loop CPU stretches of 20–50 ms followed). The
    widening is for steps only: admissions (:meth:`admit`) keep to ``slice_s``, since the callers
    let in run their task steps in the next iteration, outside any slice.

    Wake-ups of callers (:meth:`wake`: a ``LockTimeout`` to deliver) have a line of their own,
    served first in every slice, up to ``max_slice_s`` — a deadline never waits behind a thousand
    enqueues — and each counts ``WAKE_COST_S`` against the slice, the price of the task step it
    causes: a thousand deadlines that fall together wake their callers in three or four
    iterations, not in one."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        slice_s: float = SLICE_S,
        clock: Callable[[], float] = time.thread_time,
        *,
        max_slice_s: float = MAX_SLICE_S,
    ) -> None:
        self._loop = loop
        self.slice_s = slice_s
        self.max_slice_s = max_slice_s
        self.clock = clock
        self.line: deque[_Stepper] = deque()
        """Runs waiting for their turn, in arrival order."""
        self.wakes: deque[Callable[[], None]] = deque()
        """Wake-ups waiting for their turn (ahead of every run), in arrival order."""
        self.admissions: deque[tuple[asyncio.Future[bool], float]] = deque()
        """Calls waiting to be let in (:meth:`admit`), in arrival order."""
        self._used = 0.0
        """What steps took since the last slice began (that slice's, then inline ones)."""
        self._inline = 0.0
        """What inline steps took since the last slice: the next slice is that much shorter."""
        self._deferred = 0.0
        """What the last slice's wake-ups and admissions were counted to cost: their callers' task
        steps run in the next iteration, beside the next slice, which is that much shorter."""
        self._stepping = False
        self._slice_due = False
        self._budget = slice_s
        self._slice_started = clock()
        self._spent = 0.0
        """Measured step time since the slice started (the rest of the interval is other work)."""
        self._context = contextvars.Context()
        """The slices' own (empty) context: not a copy of whoever made the slice due."""

    def ready(self, run: _Stepper) -> None:
        """``run`` may take a step: now if nobody is in line and the slice has room (and we are
        on the loop's own greenlet, not inside another step), else in line."""
        if self.line or self._stepping or self._used >= self._budget or in_bridge():
            self.enqueue(run)
            return
        self._stepping = True
        started = self.clock()
        woke = False
        try:
            woke = bool(run.step())
        finally:
            self._stepping = False
            took = self.clock() - started + (WAKE_COST_S if woke else 0.0)
            self._inline += took
            self.spent(took)

    def enqueue(self, run: _Stepper) -> None:
        """``run`` takes a step in its turn, in a slice."""
        self.line.append(run)
        self._due()

    def admit(self, deadline: float | None = None) -> asyncio.Future[bool] | None:
        """A new call may start: None if it may now (the slice has room and nobody waits), else a
        future resolved True when it is let in — a slice's worth per iteration, ``ADMIT_COST_S``
        each, in arrival order — or False once ``deadline`` (``time.monotonic()``) has passed when
        its turn comes (no timer each: admissions are served first in every slice, a few hundred
        per iteration). So a burst of a thousand ``aget_lock`` calls costs their iteration a
        future each, not a thousand acquisitions' set-up. A future cancelled by then (its caller
        was) is skipped."""
        if not self.admissions and not self.line and self._used < self._budget:
            self._used += ADMIT_COST_S
            self._inline += ADMIT_COST_S
            self._due()
            return None
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self.admissions.append((waiter, math.inf if deadline is None else deadline))
        self._due()
        return waiter

    def wake(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (it wakes a caller) in its turn: never more wake-ups in one iteration
        than ``max_slice_s`` has room for."""
        if self.wakes or self._used >= self.max_slice_s:
            self.wakes.append(callback)
            self._due()
            return
        callback()
        self.spent(WAKE_COST_S)

    def spent(self, seconds: float) -> None:
        """Steps took ``seconds`` of this iteration (by :attr:`clock`)."""
        self._used += seconds
        self._spent += seconds
        self._due()

    def _due(self) -> None:
        if not self._slice_due:
            self._slice_due = True
            self._loop.call_soon(self._next_slice, context=self._context)

    def _next_slice(self) -> None:
        self._slice_due = False
        clock = self.clock
        now = clock()
        other_work = now - self._slice_started - self._spent
        self._slice_started, self._spent = now, 0.0
        budget = self._budget = min(max(self.slice_s, other_work), self.max_slice_s)
        # Steps taken inline since the last slice (in this iteration, or the last one's tail) count
        # against this one: one slice's worth per iteration in all, give or take one step.
        used, self._inline = self._inline + self._deferred, 0.0
        deferred = 0.0
        line, wakes = self.line, self.wakes
        self._stepping = True
        try:
            # Wake-ups get up to the longest slice, whatever the steps' budget: every iteration
            # that a deadline waits is an iteration of the loop's other work, however long the
            # machine's load makes it (at load 50, ten iterations of 100 wake-ups each made
            # LockTimeout 0.4-0.8 s late).
            # At least one per slice, however much the steps taken inline since the last one used:
            # a loop busy with hand-overs in every iteration must still deliver its deadlines.
            wake_room = max(self.max_slice_s, used + WAKE_COST_S / 2)
            while wakes and used < wake_room:
                wakes.popleft()()
                used += WAKE_COST_S
                deferred += WAKE_COST_S
            admissions = self.admissions
            if admissions:
                now_s = time.monotonic()
                # At most ``slice_s``, however long the loop's other work was: a caller let in runs
                # its task step in the next iteration, outside any slice, so a longer budget only
                # makes that iteration longer (1,000 calls at once: 333 let in, 3.7 ms of their
                # steps in one iteration, three such iterations in one 1 ms tick of the benchmark).
                # But one caller per slice, whatever ran before it (inline steps, wake-ups), as for
                # wake-ups: a loop whose every iteration is full of hand-overs must let new calls in.
                room = max(min(budget, self.slice_s), used + ADMIT_COST_S / 2)
                while admissions and used < room:
                    admitted, deadline = admissions.popleft()
                    if admitted.done():
                        continue  # its caller was cancelled
                    if deadline <= now_s:
                        admitted.set_result(False)  # LockTimeout, having done nothing
                        used += WAKE_COST_S
                        deferred += WAKE_COST_S
                        continue
                    admitted.set_result(True)
                    used += ADMIT_COST_S
                    deferred += ADMIT_COST_S
            if line and used >= budget:
                used = budget - 1e-9  # but one step per slice, whatever happened inline: progress
            while line and used < budget:
                entry = line.popleft()
                started = clock()
                woke = False
                try:
                    woke = bool(entry.step())
                finally:
                    used += clock() - started + (WAKE_COST_S if woke else 0.0)
        finally:
            self._stepping = False
            self._used = used
            self._spent += used
            self._deferred = deferred
            if line or wakes or self.admissions:
                self._due()


class _Expiring(Protocol):
    """What a deadline wakes: an ``aget_lock`` caller (its state object)."""

    def notify(self) -> None:
        """The deadline has passed: wake the caller (it decides what that means)."""
        ...


COMPACT_AT = 64
"""A deadline heap holding more than this, over half of them withdrawn, is rebuilt."""


class _Deadlines:
    """Every ``aget_lock`` deadline of one loop in one heap, under a single asyncio timer.

    A deadline used to be an asyncio timer of its own, and the run waiting for the lock had a
    second one, capped at the same moment (its wait's timeout is ``min(back-off, remaining)``):
    asyncio runs every timer that is due in one loop iteration, and when 1,000 deadlines fell
    together ~1,250 callbacks ran in that one iteration — chronolock's longest stretch on the loop
    (17 ms, issue 25). Here the loop holds one timer, for the earliest deadline; when it fires,
    the deadlines that are due go to the pacer's wake-up line (:meth:`_Pacer.wake`, served first
    in every slice, a slice's worth per iteration), at most ``slice_s`` of this thread's CPU per
    iteration spent taking them off the heap — the rest are taken in the next iteration. The runs
    leave their deadline to it: their waits set no timer for it (:func:`_ended_by_deadline`).

    The heap holds ``(deadline, key)`` pairs — a float and an int, which CPython's collector stops
    tracking — and :attr:`_waiting` the key's caller; :meth:`discard` (the caller got its answer
    first) forgets the caller at once and leaves the pair, skipped when it comes up; the heap is
    rebuilt when more than half of it is such pairs."""

    def __init__(
        self,
        runtime: AsyncioRuntime,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
        slice_s: float = MAX_SLICE_S,
    ) -> None:
        self._runtime = runtime
        self._loop = runtime.loop
        self._clock = clock
        self._cpu = cpu
        self.slice_s = slice_s
        self._heap: list[tuple[float, int]] = []
        self._waiting: dict[int, _Expiring] = {}
        self._next_key = 0
        self._timer: asyncio.Handle | None = None
        self._timer_at = math.inf
        """When :attr:`_timer` fires (``clock`` time); ``-inf`` for a continuation due at once."""
        self.timers_set = 0
        """How many times an asyncio timer (or continuation) was scheduled: tests count it."""

    def __len__(self) -> int:
        """Deadlines not yet delivered nor discarded."""
        return len(self._waiting)

    @property
    def armed(self) -> bool:
        """The loop holds a timer (or a continuation) of ours."""
        return self._timer is not None

    def add(self, when: float, waiter: _Expiring) -> int:
        """Call ``waiter.notify()`` through the pacer's wake-up line once ``clock()`` reaches ``when``;
        returns the key for :meth:`discard`."""
        key = self._next_key
        self._next_key = key + 1
        heapq.heappush(self._heap, (when, key))
        self._waiting[key] = waiter
        if when < self._timer_at:
            self._arm()
        return key

    def discard(self, key: int) -> None:
        """Forget a deadline (delivered or not: its caller has its answer)."""
        if self._waiting.pop(key, None) is None:
            return
        heap = self._heap
        if not self._waiting:
            heap.clear()
            self._disarm()
        elif len(heap) > COMPACT_AT and len(heap) > 2 * len(self._waiting):
            waiting = self._waiting
            heap[:] = [entry for entry in heap if entry[1] in waiting]
            heapq.heapify(heap)
            # The timer stays: it fires at or before the earliest deadline left, and re-arms.

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf

    def _arm(self) -> None:
        """The timer for the earliest deadline left (none if there is none)."""
        self._disarm()
        heap, waiting = self._heap, self._waiting
        while heap and heap[0][1] not in waiting:
            heapq.heappop(heap)
        if not heap:
            return
        when = heap[0][0]
        loop = self._loop
        delay = max(0.0, when - self._clock())
        self._timer = loop.call_at(loop.time() + delay, self._fire, context=self._runtime.quiet_context)
        self._timer_at = when
        self.timers_set += 1

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        heap, waiting = self._heap, self._waiting
        wake = self._runtime.pacer.wake
        now = self._clock()
        started = self._cpu()
        taken = 0
        while heap and heap[0][0] <= now:
            _, key = heapq.heappop(heap)
            waiter = waiting.pop(key, None)
            if waiter is None:
                continue  # discarded: its caller had its answer first
            wake(waiter.notify)
            taken += 1
            if taken % 32 == 0 and self._cpu() - started >= self.slice_s:
                # The rest in the next iteration: a heap of thousands is work on the loop too.
                self._timer = self._loop.call_soon(self._fire, context=self._runtime.quiet_context)
                self._timer_at = -math.inf
                self.timers_set += 1
                return
        self._arm()


def _ended_by_deadline(timeout: float, event: object) -> bool:
    """Whether a wait of ``timeout`` seconds that ``event`` being set ends needs no timer: the
    greenlet waiting is a run whose caller sets ``event`` once the run's deadline has passed
    (:attr:`_Run.deadline_event`), and the wait would not end before that deadline anyway — its
    timeout is the time remaining (the algorithm caps every wait there). The deadline's own
    timer, one per loop (:class:`_Deadlines`), then ends it."""
    if event is None:
        return False
    current = getcurrent()
    if not isinstance(current, _Bridge):
        return False
    run = current.driver
    return run.deadline_event is event and run.deadline is not None and time.monotonic() + timeout >= run.deadline


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

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        runtime = self._runtime
        loop = runtime.loop
        waiter: asyncio.Future[None] = loop.create_future()
        timer = (
            None
            if timeout is None or _ended_by_deadline(timeout, self)
            else loop.call_later(timeout, _resolve, waiter, context=runtime.quiet_context)
        )
        self.add_waiter(waiter)
        try:
            _await(waiter, False)
        finally:
            self.remove_waiter(waiter)
            if timer is not None:
                timer.cancel()
        return self._flag


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
    nobody waits for any more (its caller was cancelled) is never reported as unretrieved. A run
    interrupted while it waits for a call keeps waiting for it (:class:`_Finish`): nothing but
    :meth:`AsyncioRuntime.run_blocking`'s cancelled caller ever cancels it."""

    __slots__ = ("done",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.done: asyncio.Future[tuple[T | None, BaseException | None]] = loop.create_future()

    def settle(self, outcome: tuple[T | None, BaseException | None]) -> None:
        """On the loop: the worker has finished."""
        if not self.done.done():
            self.done.set_result(outcome)


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
        call: _Call[T] = _Call(self._loop)
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
            try:
                fn, call = self._jobs.get(timeout=IDLE_CHECK_S)
            except queue.Empty:
                # Its loop is gone (closed): nothing can come any more. (Without this, every event
                # loop that ever used chronolock left its workers blocked here for good: 16
                # threads per asyncio.run.)
                with self._count_lock:
                    self._idle -= 1
                    if self._loop.is_closed():
                        self._threads -= 1
                        return
                continue
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


class _Last(threading.local):
    """The runtime this thread asked for last (a loop runs in one thread)."""

    runtime: AsyncioRuntime | None = None


_LAST = _Last()


class AsyncioRuntime:
    """The runtime of one event loop (:meth:`current`)."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()
        """The thread that runs the loop (the one that called :meth:`current`)."""
        self.blocking = _BlockingPool(loop, BLOCKING_WORKERS, "chronolock-io")
        self.quiet_context = contextvars.Context()
        """An empty context for the runtime's own loop callbacks (timers, wake-ups), which read no
        context variable: passing it saves the copy of the current context that asyncio makes for
        every callback otherwise — an object per waiting acquisition for the collector to walk.
        One per loop: a context may be entered by one thread at a time."""
        self.pacer = _Pacer(loop)
        self.deadlines = _Deadlines(self)
        """Every acquisition deadline of this loop, under one timer."""
        self._random = RandomPool()
        self._host = host_name()
        self._tasks: set[asyncio.Task[object]] = set()
        self._runs: set[_Run[Any]] = set()
        self._all_done: asyncio.Future[None] | None = None
        self._guardian: asyncio.Task[None] | None = None
        self._adapters: weakref.WeakKeyDictionary[object, object] = weakref.WeakKeyDictionary()

    @classmethod
    def current(cls) -> AsyncioRuntime:
        """The runtime of the running loop (one per loop, made on first use)."""
        loop = asyncio.get_running_loop()
        last = _LAST.runtime
        if last is not None and last.loop is loop:
            return last  # (the common case, without a lock and a weak-key lookup: every aget_lock asks)
        with _RUNTIMES_LOCK:
            runtime = _RUNTIMES.get(loop)
            if runtime is None:
                runtime = _RUNTIMES[loop] = cls(loop)
        _LAST.runtime = runtime
        return runtime

    def adapters(self, owner: object, make: Callable[[], T]) -> T:
        """What ``owner`` (a locker) needs on this loop, made once by ``make()`` and kept while both
        live — not anew for every acquisition (its store and wake-ups as the loop waits for them:
        two more objects per waiting acquisition for the collector to walk)."""
        made = self._adapters.get(owner)
        if made is None:
            made = self._adapters[owner] = make()
        return cast(T, made)

    def start(self, run: _Run[T]) -> None:
        """Start ``run``, which no task awaits to the end: an acquisition whose caller may leave
        (``LockTimeout``, cancellation) while it still cleans up. Such runs are watched by one
        task per loop (:meth:`_guard`): when the loop shuts down (``asyncio.run`` cancels every
        task), they are interrupted and waited for, as a task of their own would be — so a queue
        cell is withdrawn, not renewed by the keeper for as long as the process lives."""
        self._runs.add(run)
        run._tracked = True
        if self._guardian is None:
            self._guardian = self.loop.create_task(self._guard(), name="chronolock-runs")
        run.start()

    def _run_done(self, run: _Run[Any]) -> None:
        self._runs.discard(run)
        if not self._runs and self._all_done is not None:
            _resolve(self._all_done)

    async def _guard(self) -> None:
        interrupted: BaseException | None = None
        try:
            while self._runs:
                self._all_done = self.loop.create_future()
                try:
                    await self._all_done
                except asyncio.CancelledError as exc:
                    interrupted = exc
                    for run in list(self._runs):
                        run.interrupt(exc)
        finally:
            self._guardian = self._all_done = None
        if interrupted is not None:
            raise interrupted

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
        # A future and a timer, not asyncio.sleep (a coroutine would need a task of its own).
        waiter: asyncio.Future[None] = self.loop.create_future()
        timer = self.loop.call_later(max(0.0, seconds), _resolve, waiter, context=self.quiet_context)
        try:
            _await(waiter, None)
        finally:
            timer.cancel()

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
        current = getcurrent()
        if isinstance(current, _Bridge):
            return current.driver.name  # the task that started the run (greenlets run in none)
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

    def wait(self, timeout: float, cancel: Event | None = None) -> bool:
        if cancel is not None and cancel.is_set():
            return False
        if not self._woken and timeout > 0:
            loop = self._runtime.loop
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            hooked = cancel if isinstance(cancel, _AioEvent) else None
            timer = (
                None
                if _ended_by_deadline(timeout, hooked)
                else loop.call_later(timeout, _resolve, waiter, context=self._runtime.quiet_context)
            )
            if hooked is not None:
                hooked.add_waiter(waiter)
            try:
                _await(waiter, None)
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
                if hooked is not None:
                    hooked.remove_waiter(waiter)
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
