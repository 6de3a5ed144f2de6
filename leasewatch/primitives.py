"""leasewatch's view of semaphores, read-write locks and elections (issue 26): their routes and response
models, beside the lock's (``/locks/{id}`` in :mod:`leasewatch.app`).

``GET /primitives/{kind}/{name}`` — ``kind`` is ``semaphore``, ``rwlock`` or ``election`` — answers
who holds it, slot by slot (each holder's owner, fencing token, mode, lease age as this replica saw it,
and for an election the term's start in global time), its limit, the fencing counter, and the queue in
order with each waiter's mode. The operator page (``/``) shows it for any row id it lists with a kind
(``name\\x1fsemaphore``): the lock list names them ``name (semaphore)``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import FastAPI, Path
from pydantic import BaseModel, Field

from leasewatch.app import _REFUSALS, AuthorizationHeader, Leasewatch, ServiceDep
from leasewatch.observed import ticket_seconds
from leasewatch.watcher import LockView
from lockclient.lease import HOLDER_COLUMN
from lockclient.lockid import primitive_row, validate_lock_id

__all__ = ["PrimitiveOut", "add_primitive_routes", "primitive_out"]

Kind = Literal["semaphore", "rwlock", "election"]


class SlotOut(BaseModel):
    slot: str = Field(
        description="the holder column: ~holder (a lock's, an election's leader, a writer) or ~holder:<k>"
    )
    owner: str
    mode: str = Field(description="permit, read, write or leader")
    fencing_token: int = Field(description="this holder's own token (an election's term)")
    version: int
    lease_s: float
    observed_age_s: float | None = Field(description="seconds since this replica saw the lease change")
    since: datetime | None = Field(description="an election's term: global time just before its grant")
    held_until: datetime | None = Field(description="min_hold: released early, held until this global time")
    label: str | None = Field(default=None, description="the holder's label; None: none")
    payload: str | None = Field(default=None, description="the holder's payload; None: none")


class WaiterOut(BaseModel):
    position: int
    owner: str
    mode: str = Field(description="permit, read, write or candidate")
    ticket: str
    enqueued_at: datetime
    holding: bool
    waited_s: float | None
    label: str | None = Field(default=None, description="the owner's label; None: none")


class PrimitiveOut(BaseModel):
    name: str
    kind: Kind
    row: str = Field(description="the row id in the store (name, then \\x1f and the kind; an election's: its name)")
    limit: int | None = Field(description="a semaphore's permits, a read-write lock's max_readers")
    fencing_token: int = Field(description="the last token issued (every holder's token is below or equal)")
    holders: list[SlotOut]
    queue: list[WaiterOut]


_MODES = {"semaphore": "permit", "election": "leader"}


def _utc(us: int) -> datetime | None:
    return datetime.fromtimestamp(us / 1e6, UTC) if us else None


def primitive_out(name: str, kind: Kind, row: str, view: LockView, wall: float) -> PrimitiveOut:
    holders = [
        SlotOut(
            slot=column,
            owner=lease.owner,
            mode=_MODES.get(kind) or ("write" if column == HOLDER_COLUMN else "read"),
            fencing_token=lease.token,
            version=lease.version,
            lease_s=lease.lease,
            observed_age_s=lease.observed_age,
            since=_utc(lease.since_us),
            held_until=_utc(lease.until_us),
            label=lease.label or None,
            payload=lease.payload or None,
        )
        for column, lease in view.slots.items()
    ]
    held = {lease.ticket for lease in view.slots.values()}
    queue = []
    for position, (ticket, owner) in enumerate(view.queue):
        issued = ticket_seconds(ticket)
        mode = {"r": "read", "w": "write"}.get(
            view.modes.get(ticket, ""), "candidate" if kind == "election" else "permit"
        )
        queue.append(
            WaiterOut(
                position=position,
                owner=owner,
                mode=mode,
                ticket=ticket,
                enqueued_at=datetime.fromtimestamp((issued or 0.0), UTC),
                holding=ticket in held,
                waited_s=None if ticket in held or issued is None else round(max(0.0, wall - issued), 3),
                label=view.labels.get(ticket) or None,
            )
        )
    limit = int(view.limit) if view.limit is not None and view.limit.isdigit() else None
    return PrimitiveOut(
        name=name, kind=kind, row=row, limit=limit, fencing_token=view.fencing_token, holders=holders, queue=queue
    )


def add_primitive_routes(app: FastAPI, require_reader: Callable[[Leasewatch, str | None], None]) -> None:
    """Register ``GET /primitives/{kind}/{name}`` on leasewatch's app (``create_app`` calls it with its
    reader check, so the route is guarded exactly as ``/locks/{id}`` is)."""

    @app.get(
        "/primitives/{kind}/{name:path}",
        response_model=PrimitiveOut,
        summary="A semaphore, read-write lock or election: holders by slot, limit, queue with modes",
        responses=_REFUSALS,
    )
    async def primitive(
        service: ServiceDep,
        kind: Annotated[Kind, Path(description="semaphore, rwlock or election")],
        name: Annotated[str, Path(description="its name (a lock id), URL-encoded")],
        authorization: AuthorizationHeader = None,
    ) -> PrimitiveOut:
        require_reader(service, authorization)
        validate_lock_id(name, legacy=True)
        row = name if kind == "election" else primitive_row(name, kind)
        watcher = await service.ready()
        view = await asyncio.to_thread(watcher.view, row)
        return primitive_out(name, kind, row, view, time.time())
