"""Request coalescing for ``GET /now`` (DESIGN.md §4).

Many concurrent ``/now`` requests share one store round trip, but only
requests that arrived *before that round trip started* may share it. A
request that arrives while a round trip is in flight must wait for the next
one: the in-flight read may have been served before another replica's write
that completed before this request arrived, and reusing it could hand out a
value smaller than one that replica already returned — breaking monotonicity
across replicas.

So there is at most one round trip running and at most one batch waiting:
requests join the waiting batch; when the running trip ends, the waiting batch
starts its own.

**Bounding the store load** (``min_interval``). Without it a client that sends
requests one after another costs one store round trip per request (2,419 requests
→ 2,435 trips in a security review), so a flood of requests is a flood of store
writes. Answering from the last *completed* trip when it is recent would be
cheaper, but is not safe: that trip may have started before the request arrived,
and another replica may have handed out a larger value in between (DESIGN.md §4).
So instead trip *starts* are rate-limited: on average at most one per
``min_interval`` (a virtual schedule that advances by ``min_interval`` per trip),
with a burst of ``burst`` trips so that occasional requests never wait. When the
schedule is ahead, the next trip waits for its slot and requests arriving
meanwhile join the waiting batch. Every request is still served by a trip that
started after it arrived — the rule above is untouched — and the store sees at most
``1 / min_interval`` trips per second from one replica (plus the burst), however
many requests arrive; a request waits at most about ``min_interval`` longer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

T = TypeVar("T")


class Coalescer(Generic[T]):
    """Single-flight with a generation rule: a caller only gets a result produced after it called."""

    def __init__(
        self,
        operation: Callable[[], Awaitable[T]],
        *,
        min_interval: float = 0.0,
        burst: int = 8,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not min_interval >= 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self._operation = operation
        self._min_interval = min_interval
        self._slack = (burst - 1) * min_interval
        self._monotonic = monotonic
        self._schedule = float("-inf")
        """When the next trip may start at the earliest, if no burst were allowed."""
        self._waiting: asyncio.Future[T] | None = None
        self._runner: asyncio.Task[None] | None = None
        self.round_trips = 0

    async def __call__(self) -> T:
        if self._waiting is None:
            self._waiting = asyncio.get_running_loop().create_future()
        batch = self._waiting
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        # shield: one cancelled caller must not cancel the batch the others wait on.
        return await asyncio.shield(batch)

    async def _drain(self) -> None:
        while self._waiting is not None:
            pause = self._schedule - self._slack - self._monotonic()
            if pause > 0:
                # Requests arriving now join the batch; it is taken only after the pause, so
                # its trip still starts after every one of them arrived.
                await asyncio.sleep(pause)
            batch, self._waiting = self._waiting, None
            self._schedule = max(self._schedule, self._monotonic()) + self._min_interval
            self.round_trips += 1
            try:
                result = await self._operation()
            except Exception as exc:
                if not batch.done():
                    batch.set_exception(exc)
                # Mark retrieved so a batch nobody awaits any more does not warn.
                batch.exception()
            else:
                if not batch.done():
                    batch.set_result(result)
