"""Semaphores and read-write locks: what :meth:`RemoteLocker.get_semaphore`,
:meth:`~RemoteLocker.get_read_lock` and :meth:`~RemoteLocker.get_write_lock` (and their ``try_`` and
``a…`` twins) hand out — a :class:`Permit` — and how they get it (:mod:`lockclient.sharedqueue`).

A :class:`Permit` is a :class:`~lockclient.locker.RemoteLock` in every respect a holder relies on —
its own fencing token, a lease renewed by the locker's keeper, ``lost`` / ``on_lost``,
``valid_until``, ``release()``, ``with`` and ``async with`` — so ``lockctl run --limit`` and
``--shared`` supervise a command under one exactly as under a lock.
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

from lockclient import metrics
from lockclient.algorithm import Acquisition
from lockclient.errors import LockCancelled, LockTimeout
from lockclient.lease import HeldLease
from lockclient.locker import RemoteLock, RemoteLocker, aacquire
from lockclient.lockid import primitive_row, validate_lock_id
from lockclient.logs import get_logger
from lockclient.runtime import Event, Runtime
from lockclient.runtime.aio import AioWakeups, AsyncioRuntime, BlockingStore
from lockclient.sharedqueue import Shape, SharedQueue
from lockclient.store import CellStore
from lockclient.store.counting import CountingStore, OpCounts
from lockclient.wake import Wakeups

__all__ = ["DEFAULT_MAX_READERS", "Permit", "aacquire_permit", "acquire_permit"]

log = get_logger("lockclient")

DEFAULT_MAX_READERS = 16
"""Readers of one read-write lock at once, by default (see :mod:`lockclient.sharedqueue` for why
there is a bound, and what a larger one costs a writer's grant)."""

L = TypeVar("L", bound=RemoteLock)

_MODES = {"": "permit", "r": "read", "w": "write"}


class Permit(RemoteLock):
    """A semaphore's permit, or a held read or write lock.

    ``name`` is the primitive's name; ``lock_id`` the row it lives in (``name`` + ``\\x1f`` + kind:
    :func:`lockclient.lockid.primitive_row`). ``fencing_token`` is this holder's own: tokens of all
    holders of one primitive strictly increase in grant order, so a resource that accepts a token
    only if it is not below the largest it has seen refuses a paused holder whose lease ran out
    after a later grant. (Two permits of one semaphore hold at once, with different tokens: a
    resource shared by all permit holders should fence per holder, not by the largest token.)
    """

    def __init__(
        self, locker: RemoteLocker, lease: HeldLease, counts: OpCounts, *, name: str, shape: Shape, impl: SharedQueue
    ) -> None:
        super().__init__(locker, lease, counts, SharedQueue.name)
        self._impl = impl
        self.name = name
        self.kind = shape.kind
        self.mode = _MODES[shape.mode]
        """``permit`` (a semaphore's), ``read`` or ``write``."""
        self.limit = shape.limit
        """The semaphore's limit, or the read-write lock's ``max_readers``."""
        self.slot = lease.column
        """The holder column this permit holds (``~holder:<k>``; a writer's: ``~holder``)."""

    def __enter__(self) -> Permit:
        super().__enter__()
        return self

    async def __aenter__(self) -> Permit:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await super().__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        state = "released" if self.released else ("lost" if self._lease.lost.is_set() else "held")
        return f"<Permit {self.kind} {self.name!r} {self.mode} owner={self.owner} token={self.fencing_token} {state}>"


def _shared(locker: RemoteLocker) -> SharedQueue:
    shared = locker._shared_queue
    if shared is None:
        shared = locker._shared_queue = SharedQueue(locker._services)
    return shared


def acquire_permit(
    locker: RemoteLocker,
    name: str,
    shape: Shape,
    deadline: float | None,
    cancel: Event | None,
    *,
    blocking: bool,
    max_hold: float | None = None,
    runtime: Runtime | None = None,
    label: str = "",
    payload: str = "",
) -> Permit | None:
    """One acquisition of a permit (a semaphore's, a reader's or the writer's), on the caller's
    runtime. None: not blocking and busy. Mirrors :meth:`RemoteLocker._acquire`."""
    validate_lock_id(name)
    locker._check_open()
    row = primitive_row(name, shape.kind)
    counts = OpCounts()
    store: CellStore = locker.store
    wakeups: Wakeups | None = None
    if isinstance(runtime, AsyncioRuntime):
        store = BlockingStore(store, runtime)
        wakeups = AioWakeups(locker._services.wakeups, runtime)
    attempt = Acquisition(
        lock_id=row,
        store=CountingStore(store, counts),
        deadline=deadline,
        cancel=cancel,
        max_hold=locker.max_hold if max_hold is None else max_hold,
        blocking=blocking,
        runtime=runtime or locker.runtime,
        wakeups=wakeups,
        label=label,
        payload=payload,
    )
    shared = _shared(locker)
    started = locker.runtime.monotonic()
    outcome = "error"
    primitive = shape.kind if shape.kind == "semaphore" else f"{_MODES[shape.mode]}_lock"
    try:
        lease = shared.acquire(attempt, shape)
        if lease is None:
            outcome = "busy"
            return None
        locker._services.keeper.add_holder(lease)
        outcome = "acquired"
        log.debug("acquired", lock_id=row, owner=lease.owner, fencing_token=lease.token, slot=lease.column)
        return Permit(locker, lease, counts, name=name, shape=shape, impl=shared)
    except LockTimeout:
        outcome = "timeout"
        raise
    except LockCancelled:
        outcome = "cancelled"
        raise
    finally:
        metrics.PRIMITIVE_ACQUIRE_SECONDS.labels(primitive, outcome).observe(locker.runtime.monotonic() - started)


async def aacquire_permit(
    locker: RemoteLocker,
    name: str,
    shape: Shape,
    timeout: float | None,
    *,
    blocking: bool,
    max_hold: float | None = None,
    label: str = "",
    payload: str = "",
) -> Permit | None:
    """asyncio twin of :func:`acquire_permit`, on the event loop like ``aget_lock``
    (:func:`lockclient.locker.aacquire`: the loop's pacer and deadline heap, no thread per waiter)."""
    validate_lock_id(name)
    locker._check_open()

    def acquire(runtime: AsyncioRuntime, cancel: Event, deadline: float | None) -> Permit | None:
        return acquire_permit(
            locker,
            name,
            shape,
            deadline,
            cancel,
            blocking=blocking,
            max_hold=max_hold,
            runtime=runtime,
            label=label,
            payload=payload,
        )

    return await aacquire(acquire, primitive_row(name, shape.kind), timeout)
