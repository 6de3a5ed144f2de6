"""The simulator's checkers: exact, because the simulation sees everything at once.

Each judges the run against a promise of the README / DESIGN.md §7, at the virtual instant it
is due — not from samples, and never with a tolerance for the machine's load:

* **fencing** — every grant (the compare-and-set that writes ``~holder``) issues the next token
  of that lock id: tokens strictly increase in grant order, none is issued twice; every fenced
  resource accepts tokens in non-decreasing order, an equal token only from the same holder.
* **lease-level exclusion** — at the instant a grant applies in the store, no other owner of that
  lock id still sees ``held == True`` (not released, ``lost`` not set, and its own monotonic clock
  before its ``valid_until``) — a paused process included: its clock runs on while it is paused.
* **FIFO**, as the README states it — a grant's deciding look (``RemoteLock.looked_at``) sees every
  queue cell written before it started, so no contender whose cell was live when that look started
  (written before it, not yet withdrawn or revoked), and who was later granted with that same
  ticket, is overtaken by a later ticket.
* **lost** — ``lost`` fires only for a revocation, an expiry or ``max_hold``: never for a lock whose
  ``release()`` answered that it held it until then.
* **global time** — every ``/now`` answer is ≥ every answer that completed before it was asked
  (across clients and replicas), and never more than ``max_skew`` ahead of real time.
* **liveness** — after the quiet phase nothing is left: every ``get_lock`` returned, no holder
  record or queue cell is left in the store, none belongs to a process that died; a holder that
  crashed while leasewatch ran undisturbed was revoked within ``lease + grace + look period +
  scan`` of its last renewal; no task died of an unexpected exception.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lockclient.errors import ChronolockError
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HolderRecord, WaiterRecord, parse_fence
from lockclient.lockid import ticket_time
from lockclient.settle import ENDED_COLUMN, EndRecord
from lockclient.store import Table, VersionedTable
from sim.world import EPOCH_NS, NS, Process

if TYPE_CHECKING:
    from lockclient.locker import RemoteLock
    from sim.scenario import Client, Simulation

__all__ = ["Checkers", "HolderState"]

FENCED_MAX = "~max-token"


@dataclass
class HolderState:
    """A lock handed to a worker, as the checkers follow it."""

    op: int
    lock_id: str
    lock: RemoteLock
    process: Process
    token: int
    ticket: str
    granted_at: int
    look_real: int | None
    releasing_at: int | None = None
    released_held: bool | None = None
    lost_reasons: list[str] = field(default_factory=list)


@dataclass
class _Grant:
    at: int
    owner: str
    token: int
    ticket: str


class Checkers:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.violations: list[str] = []
        self._last_token: dict[str, int] = {}
        self._grants: dict[str, list[_Grant]] = {}
        self._granted_owner: dict[str, _Grant] = {}
        self._cell_written: dict[tuple[str, str], int] = {}
        self._cell_deleted: dict[tuple[str, str], int] = {}
        self._holding: dict[str, list[HolderState]] = {}
        self._states: dict[str, HolderState] = {}
        self._pending: dict[int, tuple[Process, str, int, bool]] = {}
        self._fenced_last: dict[str, tuple[int, str]] = {}
        self._now_done: list[int] = []
        self._now_prefix_max: list[int] = []
        self._holder_removed: dict[str, int] = {}
        self._removed_how: dict[str, str] = {}
        """owner -> how its holder record ended: released, revoked (its end record says), deleted."""
        self._last_renewal: dict[str, int] = {}
        self.revocation_checks: list[tuple[str, str, int, int]] = []
        """(lock id, owner, crash time, deadline) of holders that died while leasewatch was healthy."""
        self.revocation_times: list[float] = []

    # -- reporting --------------------------------------------------------------------------------

    def violation(self, kind: str, message: str) -> None:
        now = self.sim.world.now
        text = f"[{kind}] t={now / NS:.6f}s {message}"
        self.violations.append(text)
        self.sim.record("VIOLATION", kind=kind, message=message.replace(" ", "_")[:300])

    # -- the store's view ---------------------------------------------------------------------------

    def on_write(self, now: int, table: str, row: str, column: str, value: str | None) -> None:
        if table != Table.QUEUE.value:
            return
        key = (row, column)
        if value is not None:
            self._cell_written.setdefault(key, now)
        else:
            self._cell_deleted.setdefault(key, now)

    def on_cas(
        self, now: int, table: str, row: str, expected: Mapping[str, str | None], updates: Mapping[str, str | None]
    ) -> None:
        if table == VersionedTable.FENCED.value:
            self._on_fenced(row, updates)
            return
        if table != VersionedTable.LEASE.value or HOLDER_COLUMN not in updates:
            return
        new, old = updates[HOLDER_COLUMN], expected.get(HOLDER_COLUMN)
        if new is not None and old is None:
            self._on_grant(now, row, new, updates.get(FENCE_COLUMN))
        elif new is None and old is not None:
            record = _holder(old)
            if record is not None:
                self._holder_removed[record.owner] = now
                end = EndRecord.decode(updates.get(ENDED_COLUMN))
                how = end.how if end is not None and end.ends(record.token, record.owner) else "deleted"
                self._removed_how[record.owner] = how
                self.sim.record("holder_gone", lock=row, owner=record.owner, how=how)
        elif new is not None:
            record = _holder(new)
            if record is not None:
                self._last_renewal[record.owner] = now

    def _on_grant(self, now: int, lock_id: str, raw: str, fence: str | None) -> None:
        record = _holder(raw)
        if record is None:
            self.violation("fencing", f"{lock_id}: a grant wrote a malformed holder record {raw[:80]!r}")
            return
        token = parse_fence(fence)[0] if fence is not None else record.token
        last = self._last_token.get(lock_id, 0)
        if token <= last or token != record.token:
            self.violation(
                "fencing",
                f"{lock_id}: grant to {record.owner} issued token {token} (record {record.token}) after {last}",
            )
        self._last_token[lock_id] = max(last, token)
        grant = _Grant(now, record.owner, record.token, record.ticket)
        self._grants.setdefault(lock_id, []).append(grant)
        self._granted_owner[record.owner] = grant
        self._last_renewal[record.owner] = now
        self.sim.record("grant", lock=lock_id, owner=record.owner, token=record.token)
        for other in self._holding.get(lock_id, []):
            if other.lock.owner != record.owner and _believes_held(other):
                lease = other.lock._lease
                self.violation(
                    "lease",
                    f"{lock_id}: granted to {record.owner} (token {record.token}) while {other.lock.owner} "
                    f"(token {other.token}) still sees held == True for "
                    f"{lease.valid_until() - lease.monotonic():.3f}s more",
                )

    def _on_fenced(self, row: str, updates: Mapping[str, str | None]) -> None:
        raw = updates.get(FENCED_MAX)
        if raw is None:
            return
        number, _, rest = raw.partition("|")
        holder = rest.partition("|")[0]  # "token|holder|attempt id"
        token = int(number)
        last = self._fenced_last.get(row)
        if last is not None and (token < last[0] or (token == last[0] and holder != last[1])):
            self.violation("fencing", f"{row}: accepted token {token} ({holder}) after {last[0]} ({last[1]})")
        self._fenced_last[row] = (token, holder)

    # -- the workers' view --------------------------------------------------------------------------

    def invoked(self, op: int, process: Process, lock_id: str, *, blocking: bool) -> None:
        self._pending[op] = (process, lock_id, self.sim.world.now, blocking)

    def completed(self, op: int, *, error: BaseException | None = None) -> None:
        self._pending.pop(op, None)
        if error is not None and not isinstance(error, ChronolockError):
            self.violation("errors", f"op {op}: get_lock raised {type(error).__name__}: {error}")

    def granted(self, op: int, client: Client, lock_id: str, lock: RemoteLock) -> HolderState:
        process = client.process
        look = None if lock.looked_at is None else process.real_at_monotonic(lock.looked_at)
        state = HolderState(op, lock_id, lock, process, lock.fencing_token, lock.ticket, self.sim.world.now, look)
        self._holding.setdefault(lock_id, []).append(state)
        self._states[lock.owner] = state
        grant = self._granted_owner.get(lock.owner)
        if grant is None or grant.token != lock.fencing_token:
            self.violation(
                "fencing",
                f"{lock_id}: {lock.owner} was handed token {lock.fencing_token} but the store granted "
                f"{'nothing' if grant is None else grant.token}",
            )
        self.sim.record("acquired", op=op, lock=lock_id, owner=lock.owner, token=lock.fencing_token, ticket=lock.ticket)
        return state

    def releasing(self, state: HolderState) -> None:
        state.releasing_at = self.sim.world.now

    def released(self, state: HolderState, held: bool) -> None:
        state.released_held = held
        holding = self._holding.get(state.lock_id, [])
        if state in holding:
            holding.remove(state)
        if held and state.lost_reasons:
            self._lost_after_clean_release(state)

    def lost(self, state: HolderState, reason: str) -> None:
        self.sim.stats.lost += 1
        state.lost_reasons.append(reason)
        self.sim.record("lost", owner=state.lock.owner, reason=reason.replace(" ", "_"))
        if state.released_held:
            self._lost_after_clean_release(state)

    def _lost_after_clean_release(self, state: HolderState) -> None:
        # lost may fire for a lock whose release() was called if it was revoked before the release
        # landed (README: lost fires for a revocation, an expiry or max_hold) — never when the
        # record was ended by this owner's own release.
        if self._removed_how.get(state.lock.owner) == "revoked":
            return
        self.violation(
            "lost",
            f"{state.lock_id}: {state.lock.owner} released the lock cleanly (release() answered True) and "
            f"lost fired anyway: {state.lost_reasons}",
        )

    def fenced_write(self, state: HolderState, *, ok: bool) -> None:
        if not ok and _believes_held(state):
            self.violation(
                "lease",
                f"{state.lock_id}: {state.lock.owner}'s fenced write (token {state.token}) was refused as stale "
                "while it still saw held == True",
            )

    def on_now(self, client: str, invoked: int, completed: int, value: int) -> None:
        c = self.sim.config
        ahead_us = value - (EPOCH_NS + completed) // 1000
        if ahead_us > c.max_skew * 1e6:
            self.violation(
                "time",
                f"/now answered {value} to {client}: {ahead_us / 1e6:.3f}s ahead of real time (max_skew {c.max_skew})",
            )
        index = bisect.bisect_left(self._now_done, invoked)
        if index and self._now_prefix_max[index - 1] > value:
            self.violation(
                "time",
                f"/now answered {value} to {client}, below {self._now_prefix_max[index - 1]} answered "
                "before it was asked",
            )
        self._now_done.append(completed)
        self._now_prefix_max.append(max(value, self._now_prefix_max[-1] if self._now_prefix_max else value))
        self.sim.record("now", client=client, value=value)

    # -- faults --------------------------------------------------------------------------------------

    def crashed(self, process: Process, *, leasewatch_healthy_until: int | None) -> None:
        """A client process died: the holder records it owned must be revoked within the bound."""
        c = self.sim.config
        look = max(c.scan_interval, c.lease / 10)
        for lock_id, states in self._holding.items():
            for state in list(states):
                if state.process is not process:
                    continue
                states.remove(state)
                owner = state.lock.owner
                if owner in self._holder_removed:
                    continue
                last = self._last_renewal.get(owner, state.granted_at)
                # The holder's lease on its clock, leasewatch's lease + grace on its own, the look period
                # and a scan, with both clocks' rate errors (2 × 500 ppm) and a slack for store round trips.
                bound = (c.lease + c.grace + look + c.scan_interval) * (1 + 2 * c.mono_ppm / 1e6) + 0.5
                deadline = last + int(bound * NS)
                if leasewatch_healthy_until is not None and deadline <= leasewatch_healthy_until:
                    self.revocation_checks.append((lock_id, owner, last, deadline))

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> None:
        sim = self.sim
        self._check_fifo()
        for lock_id, owner, last, deadline in self.revocation_checks:
            removed = self._holder_removed.get(owner)
            if removed is None or removed > deadline:
                late = "never" if removed is None else f"{(removed - last) / NS:.3f}s after its last renewal"
                self.violation(
                    "liveness",
                    f"{lock_id}: the dead holder {owner} was revoked {late} (bound {(deadline - last) / NS:.3f}s)",
                )
            else:
                self.revocation_times.append((removed - last) / NS)
        for op, (process, lock_id, at, blocking) in sorted(self._pending.items()):
            if process.dead or not blocking:
                continue
            self.violation("liveness", f"op {op} ({process.name}, {lock_id}) invoked at {at / NS:.3f}s never returned")
        for lock_id in sorted({*self._grants, *(f"L{i}" for i in range(sim.config.locks))}):
            row = sim.cells.read_versioned(VersionedTable.LEASE.value, lock_id)
            holder = _holder(row.get(HOLDER_COLUMN))
            if holder is not None:
                self.violation("liveness", f"{lock_id}: still held by {holder.owner} at the end")
            for cell in sim.cells.read_row(Table.QUEUE.value, lock_id, "", None, None, False):
                self.violation(
                    "liveness", f"{lock_id}: queue cell {cell.column[20:]} ({_waiter(cell.value)}) left at the end"
                )

    def _handed(self, grant: _Grant) -> bool:
        state = self._states.get(grant.owner)
        return state is not None and state.token == grant.token

    def _check_fifo(self) -> None:
        """No grant overtakes a ticket whose cell was written before the grant's deciding look
        started and which was later granted with that same ticket (README, "Order (FIFO)").

        For each grant ``later``, the grants made while it waited (after its cell was written)
        are the only ones that can have overtaken it."""
        for lock_id, grants in self._grants.items():
            times = [g.at for g in grants]
            for j, later in enumerate(grants):
                written = self._cell_written.get((lock_id, later.ticket))
                if written is None or not self._handed(later):
                    continue
                for first in grants[bisect.bisect_right(times, written) : j]:
                    # Only grants handed to a caller count: a speculative grant given back before
                    # anybody was told of it (its token skipped) decided nothing.
                    state = self._states.get(first.owner)
                    if state is None or not self._handed(first) or state.look_real is None:
                        continue
                    if first.ticket <= later.ticket:
                        continue
                    deleted = self._cell_deleted.get((lock_id, later.ticket))
                    # Live when the look started: written before it, not yet removed (a waiter whose
                    # cell leasewatch revoked has lost its place, README "Order (FIFO)").
                    if written < state.look_real and (deleted is None or deleted > state.look_real):
                        self.violation(
                            "fifo",
                            f"{lock_id}: {first.owner} (ticket {ticket_time(first.ticket)}) was granted token "
                            f"{first.token} over {later.owner} (ticket {ticket_time(later.ticket)}, cell written "
                            f"{(state.look_real - written) / NS:.6f}s before that grant's look), granted "
                            f"{later.token} later",
                        )


def _holder(raw: str | None) -> HolderRecord | None:
    if raw is None:
        return None
    try:
        return HolderRecord.decode(raw)
    except ChronolockError:
        return None


def _waiter(raw: str) -> str:
    try:
        return WaiterRecord.decode(raw).owner
    except ChronolockError:
        return raw[:60]


def _believes_held(state: HolderState) -> bool:
    """``lock.held`` as its process would compute it now — without firing anything."""
    lock = state.lock
    if state.process.dead or lock.released:
        return False
    lease = lock._lease
    if threading.Event.is_set(lease.lost):
        return False
    return lease.monotonic() < lease.valid_until()
