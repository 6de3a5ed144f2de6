"""Leader election: ``locker.election(name)`` — the lock ``name``, seen as a leadership.

An election *is* the fair lock of its name (:mod:`lockclient.fairqueue`): the candidates are its
contenders, queued first come, first served; the leader is its holder; a **term** is one grant, and
its number is that grant's fencing token. So everything the lock promises, an election promises:

* **one leader per term, terms strictly increase.** Each term is one compare-and-set on the lock's
  lease row that also issues the next fencing token; there is never more than one holder record,
  and no candidate that was not granted ever gets a term number. A resource that refuses a term
  below the largest it has seen (:class:`~lockclient.fencing.FencedResource`, or ``WHERE term <
  ?``) refuses a deposed leader's writes — also one that was paused and does not know it yet.
* **a leader knows when it stops leading.** ``leadership.held`` is true only while its lease is
  valid by its own clock, and leasewatch never revokes before that moment (docs/guarantees.md):
  at the next leader's election, the previous one already sees ``held == False`` (unless its
  process is paused between looking and acting: the term number catches that).
* **failover within the revocation bound.** A leader that dies (or is paused, or cut off from the
  store) is revoked within ``lease + grace + look period + scan`` of its last renewal, and the
  next candidate in line is elected at once (woken by the revocation or its own poll).
* **candidates are served in order** — the lock's FIFO: the earliest candidate still standing is
  the next leader.

``leader()`` reads the lease row linearizably (a SERIAL read on Cassandra): who holds the current
term, its number, and since when — the global time read just before the term's compare-and-set
was sent (the term began at or after it, within that round trip). A leader that died is reported
until leasewatch revokes it; its ``valid`` answer is the store's, not a guess.

``run(func)`` campaigns, calls ``func(leadership)`` as leader and resigns when it returns. Python
cannot stop a thread from outside, so a synchronous ``func`` must look at ``leadership.lost`` (an
event, also set when the lease runs out) and stop; ``arun`` (asyncio) *cancels* the coroutine the
moment leadership is lost. ``lockctl elect NAME -- CMD`` kills the command's process group instead
(:mod:`lockclient.supervisor`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from lockclient import metrics
from lockclient.errors import LockLost, StoreError
from lockclient.lease import HOLDER_COLUMN, HolderRecord
from lockclient.lockid import validate_lock_id
from lockclient.logs import get_logger
from lockclient.runtime import Event
from lockclient.runtime.aio import AsyncioRuntime

if TYPE_CHECKING:
    from lockclient.locker import RemoteLock, RemoteLocker

__all__ = ["Election", "LeaderInfo", "Leadership"]

log = get_logger("lockclient.election")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads an election, as the store says now (:meth:`Election.leader`)."""

    name: str
    owner: str
    """The leader's owner id (host.pid.thread.random)."""
    term: int
    """The term number: the fencing token of the leader's grant."""
    since_us: int | None
    """Global time (µs) read just before the term's grant was sent; None if the holder took the
    lock without stamping it (a plain ``get_lock`` of the same name)."""
    lease: float
    """The leader's lease length (seconds): it renews every third of it."""


class Leadership:
    """One term of this candidate as leader. A context manager: leaving it resigns."""

    def __init__(self, election: Election, lock: RemoteLock) -> None:
        self.election = election
        self.lock = lock
        self.name = election.name
        self.term = lock.fencing_token
        """The term number (= the fencing token): hand it to whatever the leader writes to."""
        self.owner = lock.owner
        self.since_us = lock._lease.record.since or None
        self.resigned = False

    @property
    def fencing_token(self) -> int:
        return self.term

    @property
    def lost(self) -> threading.Event:
        """Set when leadership is lost (revoked, not renewed in time, or past ``max_hold``); also
        reads as set once the lease ran out, whether or not anything noticed yet."""
        return self.lock.lost

    @property
    def lost_reason(self) -> str | None:
        return self.lock.lost_reason

    @property
    def held(self) -> bool:
        """True while this candidate leads: not resigned, not lost, its lease valid *now*."""
        return self.lock.held

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` after which this leader must consider itself deposed."""
        return self.lock.valid_until

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """``callback(reason)`` when this term is lost (in its own thread); at once if it already is."""
        self.lock.on_lost(callback)

    def check(self) -> None:
        """Raise :class:`~lockclient.errors.LockLost` if this candidate no longer leads."""
        if not self.held:
            raise LockLost(f"leadership of term {self.term} lost: {self.lost_reason or 'resigned'}", lock_id=self.name)

    def resign(self) -> bool:
        """Step down: the next candidate in line is elected. True if we led until now."""
        if self.resigned:
            return False
        self.resigned = True
        held = self.lock.release()
        metrics.ELECTIONS.labels("resigned").inc()
        log.info("resigned", election=self.name, owner=self.owner, term=self.term, held=held)
        return held

    def __enter__(self) -> Leadership:
        self.check()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held = self.resign()
        if not held and exc_type is None:
            raise LockLost(
                f"leadership of term {self.term} was lost while leading: {self.lost_reason}", lock_id=self.name
            )

    def __repr__(self) -> str:
        state = "resigned" if self.resigned else ("leading" if self.held else "lost")
        return f"<Leadership {self.name!r} term={self.term} owner={self.owner} {state}>"


class Election:
    """Leader election on the lock ``name`` (see the module's docstring). Thread-safe; one object
    may campaign many times (one term each)."""

    def __init__(self, locker: RemoteLocker, name: str) -> None:
        self.locker = locker
        self.name = validate_lock_id(name)
        self._elected: list[Callable[[Leadership], None]] = []
        self._lost: list[Callable[[Leadership, str], None]] = []

    def on_elected(self, callback: Callable[[Leadership], None]) -> None:
        """``callback(leadership)`` each time this candidate is elected, before :meth:`campaign`
        returns (or ``run``'s function starts), in the campaigning thread."""
        self._elected.append(callback)

    def on_lost(self, callback: Callable[[Leadership, str], None]) -> None:
        """``callback(leadership, reason)`` each time this candidate loses a term it did not resign
        (revoked, or its lease ran out), in a thread of its own."""
        self._lost.append(callback)

    # -- campaigning ---------------------------------------------------------------------------

    def campaign(
        self, timeout: float | None = None, *, cancel: Event | None = None, max_hold: float | None = None
    ) -> Leadership:
        """Stand as a candidate and block until elected (first come, first served). Raises
        :class:`~lockclient.errors.LockTimeout` / :class:`~lockclient.errors.LockCancelled` like
        ``get_lock``, leaving nothing behind."""
        from lockclient.locker import _check_timeout

        _check_timeout(timeout)
        self.locker._check_open()
        deadline = None if timeout is None else self.locker.runtime.monotonic() + timeout
        lock = self.locker._acquire(self.name, deadline, cancel, max_hold, blocking=True, stamp=True)
        assert lock is not None
        return self._elected_with(lock)

    async def acampaign(self, timeout: float | None = None, *, max_hold: float | None = None) -> Leadership:
        """asyncio twin of :meth:`campaign`: no thread per candidate; cancelling the awaiting task
        withdraws the candidacy (and resigns a term granted just then)."""
        from lockclient.locker import _check_timeout, aacquire

        _check_timeout(timeout)
        self.locker._check_open()

        def acquire(runtime: AsyncioRuntime, cancel: Event, deadline: float | None) -> RemoteLock | None:
            return self.locker._acquire(
                self.name, deadline, cancel, max_hold, blocking=True, runtime=runtime, stamp=True
            )

        lock = await aacquire(acquire, self.name, timeout)
        assert lock is not None
        return self._elected_with(lock)

    def _elected_with(self, lock: RemoteLock) -> Leadership:
        leadership = Leadership(self, lock)
        metrics.ELECTIONS.labels("elected").inc()
        log.info("elected", election=self.name, owner=lock.owner, term=lock.fencing_token)

        def lost(reason: str) -> None:
            # The lock's `lost` never fires for a lock released cleanly (docs/guarantees.md): a term
            # resigned in time is never reported lost, whatever the order of the threads.
            metrics.ELECTIONS.labels("lost").inc()
            log.warning("leadership_lost", election=self.name, owner=lock.owner, term=lock.fencing_token, reason=reason)
            for callback in list(self._lost):
                try:
                    callback(leadership, reason)
                except Exception:
                    log.exception("on_lost_callback_failed", election=self.name)

        lock.on_lost(lost)
        for callback in list(self._elected):
            callback(leadership)
        return leadership

    def run(
        self,
        func: Callable[[Leadership], T],
        *,
        timeout: float | None = None,
        cancel: Event | None = None,
        max_hold: float | None = None,
    ) -> T:
        """Campaign, run ``func(leadership)`` as leader, resign when it returns (or raises). ``func``
        must stop when ``leadership.lost`` is set (a thread cannot be stopped from outside); if it
        returns after the term was lost, :class:`~lockclient.errors.LockLost` is raised."""
        with self.campaign(timeout, cancel=cancel, max_hold=max_hold) as leadership:
            return func(leadership)

    async def arun(
        self,
        func: Callable[[Leadership], Awaitable[T]],
        *,
        timeout: float | None = None,
        max_hold: float | None = None,
    ) -> T:
        """Campaign, run ``await func(leadership)`` as leader, resign when it ends. If leadership is
        lost first, the coroutine is *cancelled* at once and :class:`~lockclient.errors.LockLost`
        raised: it never runs on as a deposed leader (short of a paused process: the term number
        is for that)."""
        leadership = await self.acampaign(timeout, max_hold=max_hold)
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(func(leadership))
        deposed: list[str] = []

        def stop(reason: str) -> None:
            deposed.append(reason)
            loop.call_soon_threadsafe(task.cancel)

        leadership.on_lost(stop)
        try:
            return await task
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if deposed and (current is None or not current.cancelling()):
                # Cancelled by us, not by our caller: the term was lost.
                raise LockLost(f"leadership of term {leadership.term} lost: {deposed[0]}", lock_id=self.name) from exc
            raise
        finally:
            if not task.done():
                task.cancel()
            runtime = AsyncioRuntime.current()
            await runtime.run_blocking(leadership.resign)

    # -- looking -------------------------------------------------------------------------------

    def leader(self) -> LeaderInfo | None:
        """The current term as the store holds it (linearizable read), or None if nobody leads."""
        row = self.locker.store.read_versioned(self.name)
        raw = row.get(HOLDER_COLUMN)
        if raw is None:
            return None
        try:
            record = HolderRecord.decode(raw)
        except StoreError:
            return None
        return LeaderInfo(self.name, record.owner, record.token, record.since or None, record.lease)

    async def aleader(self) -> LeaderInfo | None:
        """asyncio twin of :meth:`leader` (on the runtime's own executor)."""
        return await AsyncioRuntime.current().run_blocking(self.leader)

    def candidates(self) -> list[str]:
        """Owners standing, in the order they will lead: the leader first (kazoo's ``contenders()``)."""
        status = self.locker.status(self.name)
        return [entry.owner for entry in status.queue]
