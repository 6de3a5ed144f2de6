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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

T = TypeVar("T")


class Coalescer(Generic[T]):
    """Single-flight with a generation rule: a caller only gets a result produced after it called."""

    def __init__(self, operation: Callable[[], Awaitable[T]]) -> None:
        self._operation = operation
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
            batch, self._waiting = self._waiting, None
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
