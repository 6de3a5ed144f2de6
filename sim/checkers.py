"""The simulator's checkers: exact, because the simulation sees everything at once.

Each judges the run against a promise of docs/guarantees.md / DESIGN.md §7, at the virtual instant it
is due — not from samples, and never with a tolerance for the machine's load:

* **fencing** — every grant (the compare-and-set that writes ``~holder``) issues the next token
  of that lock id: tokens strictly increase in grant order, none is issued twice; every fenced
  resource accepts tokens in non-decreasing order, an equal token only from the same holder.
* **lease-level exclusion** — at the instant a grant applies in the store, no other owner of that
  lock id still sees ``held == True`` (not released, ``lost`` not set, and its own monotonic clock
  before its ``valid_until``) — a paused process included: its clock runs on while it is paused.
* **FIFO**, as docs/guarantees.md states it — a grant's deciding look (``RemoteLock.looked_at``; for a
  lock handed over by a release, the releaser's read of the queue's head) sees every
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
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HolderRecord,
    WaiterRecord,
    ended_column_for,
    holder_columns,
    is_holder_column,
    parse_fence,
)
from lockclient.lockid import split_row, ticket_time
from lockclient.settle import EndRecord
from lockclient.store import Table, VersionedTable
from sim.world import EPOCH_NS, NS, Process

if TYPE_CHECKING:
    from lockclient.events import LockEvent
    from lockclient.locker import RemoteLock
    from sim.scenario import Client, Simulation

__all__ = ["Checkers", "HolderState", "WatchLog"]

_QUEUE, _LEASE, _FENCED = Table.QUEUE.value, VersionedTable.LEASE.value, VersionedTable.FENCED.value
"""The tables the store reports writes to, as it names them (an enum's ``.value`` costs a lookup)."""

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
    mode: str = "lock"
    """``lock``; a semaphore's ``permit``; a read-write lock's ``read`` or ``write``."""


@dataclass
class WatchLog:
    """One ``RemoteLocker.watch`` run by a simulated client, as the checkers follow it."""

    row: str
    process: Process
    events: list[tuple[int, LockEvent]] = field(default_factory=list)
    granted: set[int] = field(default_factory=set)
    ended: set[int] = field(default_factory=set)
    missed: set[int] = field(default_factory=set)
    last_granted: int = 0
    since: set[int] = field(default_factory=set)
    """Tokens reported as happening (not the state found at the start): they must leave no gap."""
    initial_top: int = 0
    """The largest token of the state found at the start."""


@dataclass
class _Grant:
    at: int
    owner: str
    token: int
    ticket: str
    column: str = HOLDER_COLUMN
    look_real: int | None = None
    """A hand-over: when the releaser's read of the queue's head started (real time), if known."""
    handed_over: bool = False
    """Written by a release's compare-and-set, not by the owner's own acquisition."""


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
        self._token_owner: dict[tuple[str, int], str] = {}
        """(row, token) -> the owner the store granted it to."""
        self._token_end: dict[tuple[str, int], tuple[str, int]] = {}
        """(row, token) -> how its holder record ended (released, revoked, deleted) and when."""
        self._parked: dict[tuple[str, int], int] = {}
        """(row, token) -> the global time until which its released record was parked (min_hold)."""
        self._timeline: dict[str, list[tuple[int, str, tuple[str, int] | None]]] = {}
        """row -> (time, holder column, (owner, token) granted or None removed), in order."""
        self._cell_mode: dict[tuple[str, str], str] = {}
        """(row, ticket) -> the mode its queue cell was written with (``r``, ``w`` or empty)."""
        self.ops: dict[str, int] = {}
        """Operations judged, per primitive (lock acquisitions, permits, read/write locks, terms,
        once-per firings, watch events)."""
        self._once: dict[str, tuple[int, int, str]] = {}
        """job -> (token, hold_until, owner) of its last run released early (parked)."""
        self._once_periods: dict[tuple[str, int], list[tuple[bool, int]]] = {}
        """(job, period) -> (whether it ran, when it was invoked) of each firing (quiet runs are judged
        per period)."""
        self._watches: list[WatchLog] = []
        self._queue_owners: dict[str, set[str]] = {}
        """row -> owners that ever had a queue cell in it."""
        self.revocation_checks: list[tuple[str, str, int, int]] = []
        """(lock id, owner, crash time, deadline) of holders that died while leasewatch was healthy."""
        self.revocation_times: list[float] = []
        self._came_back_empty: list[tuple[int, str, str, Process, int, int]] = []
        """(op, lock id, owner prefix, process, invoked, returned) of lock acquisitions that
        returned no lock (an error, a timeout, a cancellation)."""

    # -- reporting --------------------------------------------------------------------------------

    def violation(self, kind: str, message: str) -> None:
        now = self.sim.world.now
        text = f"[{kind}] t={now / NS:.6f}s {message}"
        self.violations.append(text)
        self.sim.record("VIOLATION", kind=kind, message=message.replace(" ", "_")[:300])

    # -- the store's view ---------------------------------------------------------------------------

    def on_write(self, now: int, table: str, row: str, column: str, value: str | None) -> None:
        if table != _QUEUE:
            return
        key = (row, column)
        if value is not None:
            if key not in self._cell_written:
                if '"k":' in value:
                    self._cell_mode[key] = _mode(value)
                self._queue_owners.setdefault(row, set()).add(column[20:])
            self._cell_written.setdefault(key, now)
        else:
            self._cell_deleted.setdefault(key, now)

    def on_cas(
        self, now: int, table: str, row: str, expected: Mapping[str, str | None], updates: Mapping[str, str | None]
    ) -> None:
        if table == _FENCED:
            self._on_fenced(row, updates)
            return
        if table != _LEASE:
            return
        for column in [c for c in updates if is_holder_column(c)]:
            # A lock's holder (``~holder``), or a slot of a semaphore or read-write lock (``~holder:<k>``).
            new, old = updates[column], expected.get(column)
            if new is not None and old is None:
                self._on_grant(now, row, new, updates.get(FENCE_COLUMN), column)
            elif new is None and old is not None:
                self._on_removal(now, row, column, old, updates)
            elif new is not None and old is not None and _handed_over(old, new):
                # A release that hands the lock to the first in line (lockclient.fairqueue): the
                # holder's end and the next grant in one compare-and-set. FIFO is judged by the
                # releaser's read of the queue's head.
                releaser = self._on_removal(now, row, column, old, updates)
                look_real = None
                state = None if releaser is None else self._states.get(releaser)
                if state is not None and state.lock._lease.handed_read_at is not None:
                    look_real = state.process.real_at_monotonic(state.lock._lease.handed_read_at)
                self._on_grant(now, row, new, updates.get(FENCE_COLUMN), column, look_real=look_real, handed_over=True)
                self.sim.stats.handovers += 1
            elif new is not None:
                record = _holder(new)
                if record is not None:
                    self._last_renewal[record.owner] = now
                    if record.until and (row, record.token) not in self._parked:
                        self._parked[(row, record.token)] = record.until
                        self.sim.record("parked", lock=row, owner=record.owner, until=record.until)

    def _on_removal(self, now: int, row: str, column: str, old: str, updates: Mapping[str, str | None]) -> str | None:
        """A holder record ended (released or revoked, by its end record): its owner, if well-formed."""
        record = _holder(old)
        if record is None:
            return None
        self._holder_removed[record.owner] = now
        end = EndRecord.decode(updates.get(ended_column_for(column)))
        how = end.how if end is not None and end.ends(record.token, record.owner) else "deleted"
        self._removed_how[record.owner] = how
        self._token_end[(row, record.token)] = (how, now)
        self._timeline.setdefault(row, []).append((now, column, None))
        self.sim.record("holder_gone", lock=row, owner=record.owner, how=how)
        return record.owner

    def _on_grant(
        self,
        now: int,
        lock_id: str,
        raw: str,
        fence: str | None,
        column: str = HOLDER_COLUMN,
        *,
        look_real: int | None = None,
        handed_over: bool = False,
    ) -> None:
        """``look_real``: a hand-over's deciding look (the releaser's read), in real time."""
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
        grant = _Grant(now, record.owner, record.token, record.ticket, column, look_real, handed_over)
        self._grants.setdefault(lock_id, []).append(grant)
        self._granted_owner[record.owner] = grant
        self._last_renewal[record.owner] = now
        self._token_owner[(lock_id, record.token)] = record.owner
        self._timeline.setdefault(lock_id, []).append((now, column, (record.owner, record.token)))
        self.sim.record("grant", lock=lock_id, owner=record.owner, token=record.token)
        kind = split_row(lock_id)[1]
        others = [o for o in self._holding.get(lock_id, []) if o.lock.owner != record.owner and _believes_held(o)]
        if kind != "lock":
            self._judge_shared_grant(now, lock_id, kind, column, record, others)
            return
        for other in others:
            lease = other.lock._lease
            self.violation(
                "lease",
                f"{lock_id}: granted to {record.owner} (token {record.token}) while {other.lock.owner} "
                f"(token {other.token}) still sees held == True for "
                f"{lease.valid_until() - lease.monotonic():.3f}s more",
            )

    def _judge_shared_grant(
        self, now: int, row: str, kind: str, column: str, record: HolderRecord, others: list[HolderState]
    ) -> None:
        """A semaphore's or read-write lock's grant, at its instant: in the store, at most ``limit``
        holder records (no reader beside a writer); and among the other holders that still see
        ``held == True``, at most ``limit - 1`` permits, no writer beside anybody, no reader beside a
        writer, at most ``max_readers - 1`` other readers."""
        limit = self.sim.config.limit
        stored = holder_columns(self.sim.cells.read_versioned(VersionedTable.LEASE.value, row))
        writer = kind == "rwlock" and column == HOLDER_COLUMN
        if len(stored) > limit or (kind == "rwlock" and HOLDER_COLUMN in stored and len(stored) > 1):
            self.violation("exclusion", f"{row}: after the grant to {record.owner} the store holds {stored}")
        if kind == "semaphore":
            bad = others if len(others) >= limit else []
            what = f"{len(others)} other permit holders (limit {limit})"
        elif writer:
            bad, what = others, "other holders beside the writer"
        else:
            writers = [o for o in others if o.mode == "write"]
            bad = writers or (others if len(others) >= limit else [])
            what = "a writer" if writers else f"{len(others)} other readers (max_readers {limit})"
        if bad:
            self.violation(
                "exclusion",
                f"{row}: granted {column} to {record.owner} (token {record.token}) while {what} still see held == "
                f"True: {[(o.lock.owner, o.mode, o.token) for o in bad]}",
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

    def came_back_empty(self, op: int, owner_prefix: str) -> None:
        """Operation ``op`` (still pending) returned no lock; its attempts' owner ids start with
        ``owner_prefix`` (lockclient.lockid.owner_prefix). Judged by _check_abandoned_grants."""
        process, lock_id, invoked, _ = self._pending[op]
        self._came_back_empty.append((op, lock_id, owner_prefix, process, invoked, self.sim.world.now))

    def completed(self, op: int, *, error: BaseException | None = None) -> None:
        self._pending.pop(op, None)
        if error is not None and not isinstance(error, ChronolockError):
            self.violation("errors", f"op {op}: get_lock raised {type(error).__name__}: {error}")

    def granted(
        self,
        op: int,
        client: Client,
        lock_id: str,
        lock: RemoteLock,
        *,
        mode: str = "lock",
        primitive: str | None = "lock",
    ) -> HolderState:
        """``primitive``: what the operation counts for (None: counted elsewhere, a once-per firing)."""
        if primitive is not None:
            self.ops[primitive] = self.ops.get(primitive, 0) + 1
        process = client.process
        look = None if lock.looked_at is None else process.real_at_monotonic(lock.looked_at)
        handed = self._granted_owner.get(lock.owner)
        if look is None and handed is not None and handed.token == lock.fencing_token:
            look = handed.look_real  # handed over: FIFO is judged by the releaser's read
        state = HolderState(
            op, lock_id, lock, process, lock.fencing_token, lock.ticket, self.sim.world.now, look, mode=mode
        )
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
        # landed (docs/guarantees.md: lost fires for a revocation, an expiry or max_hold) — never when the
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

    # -- elections -------------------------------------------------------------------------------------

    def leader_answer(self, row: str, invoked: int, completed: int, answer: tuple[str, int] | None) -> None:
        """``Election.leader()`` is linearizable: its answer was the store's holder (owner, term) — or
        nobody — at some instant between its call and its return."""
        timeline = self._timeline.get(row, [])
        # Changes are appended in time order: the state at `invoked` is the last change up to it.
        index = bisect.bisect_right(timeline, invoked, key=lambda change: change[0])
        current = timeline[index - 1][2] if index else None
        possible: list[tuple[str, int] | None] = [current]
        for at, _, value in timeline[index:]:
            if at > completed:
                break
            possible.append(value)
        if answer not in possible:
            self.violation(
                "election", f"{row}: leader() answered {answer}, but the store's holder was only {possible} meanwhile"
            )

    # -- once per period -------------------------------------------------------------------------------

    def once_fired(self, job: str, period: int, ran: bool, invoked: int) -> None:
        self.ops["once"] = self.ops.get("once", 0) + 1
        self._once_periods.setdefault((job, period), []).append((ran, invoked))

    def once_ran(self, job: str, state: HolderState) -> None:
        """A run granted: no earlier than the hold of the last run released early — the upper end of
        global time's interval read just before its grant (at least any global time anybody saw before)
        is at or past that hold's ``until`` (docs/api.md, "Once per period")."""
        last = self._once.get(job)
        if last is None or last[0] >= state.token:
            return
        token, until, owner = last
        upper = state.lock._lease.granted_upper_us
        if upper < until:
            self.violation(
                "once",
                f"{job}: run {state.token} ({state.lock.owner}) granted at global time <= {upper}, "
                f"{(until - upper) / 1e6:.6f}s before run {token} ({owner})'s min_hold ended",
            )

    def once_released(self, job: str, state: HolderState) -> None:
        lease = state.lock._lease
        if lease.parked:
            self._once[job] = (state.token, state.lock.hold_until, state.lock.owner)

    def _check_once_periods(self) -> None:
        """Without faults (every host's wall clock right, cron firing within a quarter of the tolerance),
        each period's firings run the job at most once — and at least once, unless every firing of the
        period found the lock held (the last run still parked: its hold counts from its grant, so a run
        that took long to be granted holds into the next period's firings; docs/api.md, "Once per period")."""
        if self.sim.config.faults != "none":
            return
        holders: dict[str, tuple[list[int], list[tuple[str, int] | None]]] = {}
        for row, timeline in self._timeline.items():
            changes = [(when, value) for when, column, value in timeline if column == HOLDER_COLUMN]
            holders[row] = ([when for when, _ in changes], [value for _, value in changes])

        def holder_at(row: str, at: int) -> tuple[str, int] | None:
            times, values = holders.get(row, ([], []))
            index = bisect.bisect_right(times, at)
            return values[index - 1] if index else None

        for (job, period), firings in sorted(self._once_periods.items()):
            runs = sum(ran for ran, _ in firings)
            if runs > 1:
                self.violation("once", f"{job}: period {period} ran {runs} times from {len(firings)} firings")
            elif runs == 0:
                free = [at for _, at in firings if holder_at(job, at) is None]
                if free:
                    self.violation(
                        "once",
                        f"{job}: period {period} never ran, though {len(free)} of its {len(firings)} firings "
                        f"found nobody holding (first at {free[0] / NS:.6f}s)",
                    )

    # -- semaphores and read-write locks: first come, first served -----------------------------------

    def _check_shared_fifo(self) -> None:
        """Each grant handed to a caller was admitted by the queue cells its deciding look surely saw
        ahead of it — a smaller ticket, written before the look started, still there when the grant
        applied (a cell removed in between may have been gone when the look's read arrived): fewer than
        ``limit`` for a semaphore's permit; none for a writer; none of a writer's, and fewer than
        ``max_readers``, for a reader. So nobody passes a waiting writer (no writer starvation), and a
        permit always goes to one of the first ``limit`` in line. A sweep over time keeps the cells live
        at each look."""
        limit = self.sim.config.limit
        for row, grants in self._grants.items():
            kind = split_row(row)[1]
            if kind == "lock":
                continue
            events: list[tuple[int, int, str, _Grant | None]] = []
            for (r, ticket), written in self._cell_written.items():
                if r != row:
                    continue
                events.append((written, 2, ticket, None))
                deleted = self._cell_deleted.get((r, ticket))
                if deleted is not None:
                    events.append((deleted, 0, ticket, None))
            for handed in grants:
                state = self._states.get(handed.owner)
                if state is not None and self._handed(handed) and state.look_real is not None:
                    events.append((state.look_real, 1, handed.ticket, handed))
            events.sort(key=lambda e: (e[0], e[1], e[2]))
            live: set[str] = set()
            for _, order, ticket, grant in events:
                if order == 2:
                    live.add(ticket)
                elif order == 0:
                    live.discard(ticket)
                elif grant is not None:
                    # Surely seen by the look: written before it started, still there when the grant
                    # applied (so also when the look's read arrived, whatever the network's delays).
                    ahead = [
                        t for t in live if t < ticket and (self._cell_deleted.get((row, t)) or grant.at + 1) > grant.at
                    ]
                    writer = kind == "rwlock" and grant.column == HOLDER_COLUMN
                    if kind == "semaphore":
                        bad = len(ahead) >= limit
                    elif writer:
                        bad = bool(ahead)
                    else:
                        bad = len(ahead) >= limit or any(self._cell_mode.get((row, t)) == "w" for t in ahead)
                    if bad:
                        self.violation(
                            "fifo",
                            f"{row}: {grant.owner} ({'writer' if writer else kind}, token {grant.token}) was granted "
                            f"with {len(ahead)} cells ahead at its look: "
                            f"{sorted((t[20:], self._cell_mode.get((row, t), '')) for t in ahead)[:6]}",
                        )

    # -- lock events (RemoteLocker.watch) ----------------------------------------------------------------

    def watching(self, log: WatchLog) -> None:
        self._watches.append(log)

    def watch_event(self, log: WatchLog, event: LockEvent) -> None:
        """Each event is what the store did (granted: that token to that owner; released / revoked:
        that token's record ended so — or was parked, for min_hold; behind: tokens the store issued),
        grants come in token order, ``lost`` only once the holder itself no longer sees ``held``, and
        ``queue`` names only real contenders."""
        self.ops["watch"] = self.ops.get("watch", 0) + 1
        row = log.row
        now = self.sim.world.now
        log.events.append((now, event))
        token = event.token
        where = f"{row!r} watched by {log.process.name}"
        if event.kind == "granted" and token is not None:
            if self._token_owner.get((row, token)) != event.owner:
                self.violation(
                    "watch",
                    f"{where}: granted {token} to {event.owner}, the store to {self._token_owner.get((row, token))}",
                )
            if token <= log.last_granted:
                self.violation("watch", f"{where}: granted {token} after {log.last_granted}")
            log.last_granted = max(log.last_granted, token)
            log.granted.add(token)
            if event.initial:
                log.initial_top = max(log.initial_top, token)
            else:
                log.since.add(token)
        elif event.kind in ("released", "revoked") and token is not None:
            log.ended.add(token)
            if event.until_us is not None:
                if self._parked.get((row, token)) != event.until_us:
                    self.violation(
                        "watch",
                        f"{where}: {token} parked until {event.until_us}, the store says "
                        f"{self._parked.get((row, token))}",
                    )
            else:
                end = self._token_end.get((row, token))
                if end is None or end[0] != event.kind:
                    self.violation("watch", f"{where}: {token} {event.kind}, the store: {end}")
        elif event.kind == "behind":
            issued = self._last_token.get(row, 0)
            for missed in event.missed:
                if missed > issued:
                    self.violation("watch", f"{where}: missed token {missed}, but only {issued} were issued")
                log.missed.add(missed)
                if missed > log.initial_top:  # else: the end of a holder found at the start
                    log.since.add(missed)
        elif event.kind == "lost" and token is not None:
            state = self._states.get(event.owner or "")
            if state is not None and state.token == token and _believes_held(state):
                lease = state.lock._lease
                left = lease.valid_until() - lease.monotonic()
                # Allowed: the clocks' rate difference over a lease (the lease promise's assumption).
                if left > lease.lease * 2 * self.sim.config.mono_ppm / 1e6 + 1e-6:
                    self.violation("watch", f"{where}: lost {token} while its holder sees {left:.6f}s of lease left")
        elif event.kind == "queue":
            known = self._queue_owners.get(row, set())
            strangers = [owner for owner in event.queue if owner not in known]
            if strangers:
                self.violation("watch", f"{where}: queue lists {strangers}, who never queued")

    def _check_watch(self, log: WatchLog, *, final: bool) -> None:
        """Nothing missed silently: every token between the first and the last a watch reported was
        reported granted or missed; on a lock, every token granted before a later one was reported
        ended (released, revoked) or missed."""
        seen = log.granted | log.missed
        if not seen:
            return
        happened = log.since  # from the first token issued after the watch's first read
        gaps = [t for t in range(min(happened), max(happened) + 1) if t not in happened] if happened else []
        if gaps:
            self.violation("watch", f"{log.row!r} watched by {log.process.name}: tokens {gaps[:10]} never reported")
        if split_row(log.row)[1] == "lock":
            top = max(seen)
            open_ = [t for t in log.granted if t < top and t not in log.ended and t not in log.missed]
            if open_:
                self.violation(
                    "watch",
                    f"{log.row!r} watched by {log.process.name}: tokens {sorted(open_)[:10]} granted, "
                    "followed by later grants, and never reported ended",
                )

    # -- faults --------------------------------------------------------------------------------------

    def crashed(
        self, process: Process, *, leasewatch_healthy_until: int | None, leasewatch_recovered_at: int = 0
    ) -> None:
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
                # From the last renewal, or from leasewatch's recovery (a take-over starts watching
                # afresh; a request sent before a network fault ended is answered or timed out) if
                # that came later (sim.nemesis.Nemesis._mark).
                deadline = max(last, leasewatch_recovered_at) + int(bound * NS)
                if leasewatch_healthy_until is not None and deadline <= leasewatch_healthy_until:
                    self.revocation_checks.append((lock_id, owner, last, deadline))

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> None:
        sim = self.sim
        self._check_fifo()
        self._check_shared_fifo()
        self._check_once_periods()
        self._check_abandoned_grants()
        for log in self._watches:
            self._check_watch(log, final=True)
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
            for column in holder_columns(row):
                holder = _holder(row[column])
                if holder is not None:
                    self.violation("liveness", f"{lock_id!r}: {column} still held by {holder.owner} at the end")
            for cell in sim.cells.read_row(Table.QUEUE.value, lock_id, "", None, None, False):
                self.violation(
                    "liveness", f"{lock_id}: queue cell {cell.column[20:]} ({_waiter(cell.value)}) left at the end"
                )

    def _check_abandoned_grants(self) -> None:
        """A call that returned no lock leaves nothing of itself for leasewatch: a grant of its own
        that landed (applied with its answer lost, a failure after a quorum accepted, a grant racing
        the timeout) is released by the process itself once its requests go through again — within
        the keeper's retry pause (2 s) after the driver's request timeout (2 s) after the last fault
        that held it up (docs/guarantees.md, "Unknown outcomes"). Judged only when the process
        lived, and leasewatch revoked the record more than that (plus 1 s) after the call returned
        and after those faults ended: issue 23's orphaned grant, which the old code left to leasewatch
        (or, without it, held for good). A grant handed over by a release is not the call's own: a
        waiter that left is revoked like a dead holder (docs/guarantees.md, "Hand-over")."""
        allowance = int((self.sim.network.client_timeout + 2.0 + 1.0) * NS)
        times: dict[str, list[int]] = {}
        for op, lock_id, prefix, process, invoked, returned in self._came_back_empty:
            grants = self._grants.get(lock_id, [])  # in grant order
            if lock_id not in times:
                times[lock_id] = [g.at for g in grants]
            at = times[lock_id]
            for grant in grants[bisect.bisect_left(at, invoked) : bisect.bisect_right(at, returned)]:
                if grant.handed_over:
                    continue
                if not grant.owner.startswith(prefix) or grant.owner in self._states:
                    continue
                how, removed = self._token_end.get((lock_id, grant.token), ("held", 0))
                if how != "revoked":
                    continue  # released by the process (or still held: the end-of-run check says so)
                client = process.name.partition("#")[0]
                quiet = self.sim.nemesis.client_undisturbed_since(client, returned, removed)
                if quiet is not None and removed - quiet > allowance:
                    self.violation(
                        "abandoned",
                        f"{lock_id}: op {op} ({process.name}) returned no lock at {returned / NS:.3f}s, but its "
                        f"grant of token {grant.token} ({grant.owner}) stayed until leasewatch revoked it at "
                        f"{removed / NS:.3f}s, {(removed - quiet) / NS:.3f}s after the process could reach the "
                        "store again",
                    )

    def _handed(self, grant: _Grant) -> bool:
        state = self._states.get(grant.owner)
        return state is not None and state.token == grant.token

    def _check_fifo(self) -> None:
        """No grant overtakes a ticket whose cell was written before the grant's deciding look
        started and which was later granted with that same ticket (docs/guarantees.md, "Order (FIFO)").

        For each grant ``later``, the grants made while it waited (after its cell was written)
        are the only ones that can have overtaken it."""
        for lock_id, grants in self._grants.items():
            if split_row(lock_id)[1] != "lock":
                continue  # semaphores and read-write locks: _check_shared_fifo
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
                    # Surely seen by the look: written before it started and still there when the grant
                    # applied. A waiter whose cell leasewatch revoked has lost its place (docs/guarantees.md "Order
                    # (FIFO)") — also when the grant's look started before the revocation and its read
                    # arrived after it, and even if that waiter is granted later with the same ticket (a
                    # grant sent with its enqueue, delayed in the network past the revocation: found by
                    # the primitives profile).
                    if written < state.look_real and (deleted is None or deleted > first.at):
                        self.violation(
                            "fifo",
                            f"{lock_id}: {first.owner} (ticket {ticket_time(first.ticket)}) was granted token "
                            f"{first.token} over {later.owner} (ticket {ticket_time(later.ticket)}, cell written "
                            f"{(state.look_real - written) / NS:.6f}s before that grant's look), granted "
                            f"{later.token} later",
                        )


def _handed_over(old: str, new: str) -> bool:
    """A compare-and-set from one holder record to another owner's handed-over record."""
    before, after = _holder(old), _holder(new)
    return before is not None and after is not None and after.cell != 0 and after.owner != before.owner


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


def _mode(raw: str) -> str:
    try:
        return WaiterRecord.decode(raw).mode
    except ChronolockError:
        return "w"
