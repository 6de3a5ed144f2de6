"""The fair lock: first come, first served (thesis listings 5–7, DESIGN.md §5).

Per lock id, the **queue row** holds one cell per contender, named by its *ticket*
(20-digit global time in µs, then the owner), so column order is arrival order; the
cell's value is the contender's lease (it rewrites it every ``lease/3``). The lock's
row in the lease table holds the **holder** (``~holder``) and the fencing counter.

One acquisition, top to bottom (:meth:`FairQueue.acquire`):

1. **enqueue and first look** — take a ticket from global time; list the lock for leasewatch
   (its index entry: written first, alone, and acknowledged — unless this process listed it
   in the last few seconds — so that nothing of ours can land in the lock's rows unlisted,
   where a crash would leave it for good: :mod:`lockclient.listing`); then write the queue
   cell (and the index entry again, beside it) and in the same round trip read the queue from
   the watermark and the lease row (holder, fencing counter, watermarks; a plain read, no
   Paxos) — the requests overlap;
2. **look** (again, after a wait) — the same two reads, one round trip. The first look
   that starts after the enqueue finished completes the watermark handshake
   (:mod:`lockclient.watermark`): a ticket below the proposed watermark queues again;
3. **take** — if our ticket is first and nobody holds the lock, one compare-and-set
   grants it and issues the fencing token (:func:`lockclient.algorithm.take`);
4. otherwise **wait** for the one thing that can let us move: the cell just ahead of
   ours to be gone, or — first in line — the holder to change; then look again. A look
   reads three queue cells at most (ours and the two ahead), so it costs the same in a
   queue of 2 or 200.

So an uncontended acquisition costs one plain round trip and one Paxos round — overlapped
into one round trip when the grant is sent with the enqueue (below) — plus, for a lock this
process did not list lately, the index entry's own round trip first; a release costs one round
trip (the holder record and the queue cell, together) — a contended one two (below).

**A contended hand-over in one Paxos round** (issue 27): the release grants the next holder
itself, as a fair mutex hands its lock off. A holder that waited for the lock (others likely wait
behind it; its holder record says so, ``h``) does at release:

1. one plain read of the queue's head — the first two cells from the watermark — sent with the
   delete of its own queue cell (``_head_read``). The first cell in queue order that is not its
   own is the one in line (``_first_in_line``): a cell with a ticket *below* the holder's is in
   line too (the "three cells" story below) — handing the lock to "the one right behind me"
   instead is the broken variant ``handover-to-the-second-in-line`` of sim/findings.py;
2. if that waiter takes hand-overs (its queue cell says so, ``h``: a waiter of an older
   chronolock, a ``try_get_lock``, a stamped grant or a payload does not), one compare-and-set,
   conditional on ``~holder`` = its own record (as a release is), on the fencing counter its grant
   wrote and on the watermark proposal it knows (``proposal_seen``; a waiter whose ticket is below
   it is not handed the lock: a publisher may have sent it to the back without our read seeing the
   proposal — the watermark handshake); it writes ``~holder`` := the waiter's record (its owner,
   lease, ticket and label, token n + 1, a fresh attempt id, and ``c`` = the version of the queue
   cell the read found), ``~fence`` := n + 1 and ``~ended`` := our own end record (released). No
   waiter, a read that failed, or a refusal while our record is still there (the proposal moved):
   the release goes on as a plain one, and the waiter grants itself as below.

The waiter woken by that release (the datagram to the name of what it watches, or leasewatch's
answer, as before) *looks* instead of sending a grant (which would be refused: a Paxos round lost):
its look reads the lease row, finds ``~holder`` naming its owner and ticket, and **adopts** it — the
holder with that record and token, with no Paxos round of its own. So a contended hand-over is one
plain read, one Paxos round and one plain read after the wake-up, where it was two Paxos rounds.

* *The adopted lease is dated from the start of the waiter's own write of the queue-cell version
  the releaser read* (``_adopted_since``; each waiter remembers when its last few writes began,
  the earliest attempt of each version). The releaser read that version before its compare-and-set
  wrote the record, and leasewatch cannot start timing a record before it exists: so the lease, as
  the waiter counts it, ends before leasewatch's lease + grace — the lease-level promise. Dating it
  from the look that found it is the broken variant ``handover-dated-from-the-look``: a waiter
  paused or cut off before that look would hold a lease that outlasts leasewatch's. A grant found
  too late to be valid (by our clock) is handed on at once, and the waiter queues again.
* *FIFO* is judged by the releaser's read: a cell written before that read began is never
  overtaken (it is the first in line, or one ahead of it is). ``RemoteLock.looked_at`` of an adopted
  lock is None: the read was another process's.
* *Fencing*: the token is n + 1 on exactly the counter n that the releaser's grant left — nobody
  can be granted while its record is there — so tokens strictly increase.
* *Unknown outcomes*: the hand-over's compare-and-set is a release (``HeldLease.release``): a lost
  answer is retried in the background, and a retry that finds the successor's record (or any other)
  reads ``~ended`` at SERIAL — our own end record proves that our release landed, so a released
  lock is never reported lost; and the successor's record is never orphaned, it is its owner's to
  find and adopt (or leasewatch's to revoke, below).
* *A waiter that leaves* (timeout, cancel, revoked, queueing again) while a release that read its
  cell may hand it the lock checks, in the background, at once (a plain read: a hand-over that
  landed is committed) and :data:`HAND_ON_RECHECK_S` later (a SERIAL read, which also settles a
  compare-and-set in flight), and hands on what it finds (the
  same release: to the next in line, or to nobody). A waiter handed a lock it can no longer take —
  dead, paused for long, or whose check came before a compare-and-set held up in the network for
  longer than that — is revoked by leasewatch like any dead holder: the lock is then unavailable
  for up to ``lease + grace`` (plus leasewatch's look period) after the hand-over.

An uncontended holder (granted on its first look) releases as before, in one round trip with no
read; and a waiter woken by the release of a holder that does not hand over (its record has no
``h``) sends its own grant at once, as described next.

**A hand-over skips the look.** The first in line, woken by the release of the holder its
last look saw (a datagram to the name of what it watches, or leasewatch's answer), sends
the grant at once — conditional on nobody holding and on the fencing counter that look
read, i.e. on nobody having been granted since. So a contended hand-over is the release's
Paxos round, a wake-up and the grant's Paxos round: what the naive LWT lock pays for one
acquire and release. FIFO is judged by that last look, as always by the look before the
grant (``looked_at``): a cell with a smaller ticket written after it is one whose enqueue
had not completed when ours started (a later look would not promise it more). Taken only
after the watermark handshake, while our own lease is surely unrevoked, and only on a
notice — a back-off timeout looks first (a refused compare-and-set costs a Paxos round; a
look, a plain read). Refused (a hint that was not a release, or a contender the look could
not see took the lock): look again, as before.

Only when nobody's cell is ahead of the holder's: the holder keeps its queue cell until it
releases, so a waiter right behind it sees that cell as the one ahead — and a cell *ahead of
the holder's* (a ticket below the holder's: a contender that enqueued while the holder, granted
on its first look, skipped the commit wait, or whose cell the holder's overlapped look could
not see yet) is next once the holder goes. A look reads one cell more than it watches for
exactly this; with two cells the waiter behind the holder could not see such a cell and
granted itself over it, again and again while the contender raced every hand-over
(bench/peers, P = 5: one grant overtaken by 16 later tickets, 30 ms).

**A speculative grant: one round trip for a re-take and for a first use (after the index
entry's).** The grant's
compare-and-set may be sent *together with* the enqueue and the first look, on a guess of what
the lock's row holds (issue 27):

* a **re-take**: this process took the lock without waiting and released it cleanly; it guesses
  the fencing counter it left and the watermark proposal it saw (nobody took the lock since);
* a **first use**: a lock id this process never used; it guesses that the lock's row does not
  exist — no holder, no fencing counter, no proposal (most ids a service locks, ``account:42``,
  are taken once, or rarely, and a brand-new one has no row).

The guess is only ever a condition: the compare-and-set applies iff nobody holds the lock, the
fencing counter is as guessed (absent, for a first use) and so is the proposal — so it issues
token n + 1 on exactly the counter n that is there, as any grant. If the look that overlapped it
finds nobody ahead (and our ticket not below the proposal), the grant stands: one round trip, one
Paxos round, like the naive LWT lock. If the look finds a cell ahead (a contender whose enqueue
completed before our look began), the grant is given back before anybody was told of it — the
holder record is deleted, its fencing token skipped and never used (tokens need only increase) —
and the acquisition queues like any other. So:

* *mutual exclusion and fencing* rest on the compare-and-set alone, as always: two speculative
  first grants on a new id race on the same condition, and Paxos applies one (the other is refused
  and reads the winner as holder);
* *FIFO* is judged by the same overlapped look as a grant that follows it would be (see below),
  and a speculative grant is kept only on *that* look's answer — never on a look sent later (one
  that had to be re-sent after a cut-off gives the grant back first: a later look may no longer
  see a cell that was ahead of us when the grant applied);
* an *unknown outcome* of the speculative compare-and-set (a timeout, 0x1700) is settled as any
  grant's (:func:`lockclient.algorithm.take`): the store re-reads at SERIAL within the caller's
  deadline, and a grant found applied is kept or given back by the look like one answered at
  once. If it cannot be settled before the deadline (or the caller cancels), the acquisition fails
  and a background task keeps ending the record *if it is ours* (``_release_if_ours``, for
  3 leases); a record it cannot reach is not renewed by anybody, and leasewatch revokes it after
  ``lease + grace`` (that long the lock is unavailable; no holder is ever told of it, so exclusion
  is untouched). A speculative grant is never left to a keeper: only one that stands is added;
* the lease row is not read beside a speculative grant: its compare-and-set answers with the cells
  a look needs (holder, fencing counter, proposal), read by its Paxos round after our look was
  sent — one request less on the ring than a plain read beside it. A refused guess therefore
  costs a Paxos round *in parallel with the look* and no extra read; when the lock turns out to
  be free (a first use of an id others used before), the normal grant follows with the counter
  the refusal returned: two Paxos rounds, one after the other, where the plain path has a plain
  read and then one.

So a wrong guess costs a round trip more than not guessing, and a Paxos round on a row others may
be using. Hence the guesses are rationed: a refusal or any wait forgets a re-take (a contended
lock is never guessed at twice in a row); a lock id is guessed new only on this process's first
use of it, and only while at least half of the recent first-use guesses here were right
(:class:`_FirstUse`: a fleet sharing ids stops guessing after a few refusals, and probes again
every 16th first use).

**Why the first look may overlap the enqueue** (issue 14: on a 3-node ring the sequential
look made an uncontended acquire 2.7× the naive LWT lock's). What the look decides needs
no order against our own write: FIFO is judged among the cells whose writes completed
before the look started, which an overlapped look sees as well as a later one; our own
cell may be missing from it, so its absence means nothing there (a later look's does).
Only the watermark handshake needs "our cell written, *then* ``proposed`` read"; so a
grant from an overlapped look is a compare-and-set that also expects ``proposed`` as
read — a Paxos round, which runs after our write completed: if a publisher raised it
meanwhile, the grant fails and a sequential look finishes the handshake.

**Where this departs from the thesis, and why.** Listing 6 decides the holder with a
contest in an owner row ("write my owner cell, read the row back: alone means
acquired", theorem 1). Here the compare-and-set on ``~holder`` decides it: it is
linearizable where the owner-row contest relies on quorum visibility, it costs one
round instead of two sequential ones, and the fencing token needs that Paxos round
anyway. The queue still decides *who may try*, which is what makes the lock fair;
only the first in line ever touches the lock's Paxos row, and waiters renew their
leases with plain writes, so waiters never contend with each other or the holder.

The holder keeps its queue cell until it releases, so the queue in the store shows
the holder first and its successor watches that cell like any other predecessor.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, TypeVar

from lockclient.algorithm import Acquisition, Services, confirm_listed, new_waiter, take
from lockclient.clock import settle_ticket_time
from lockclient.errors import StoreError, StoreUnavailable
from lockclient.hold import lapse_parked
from lockclient.lease import (
    FENCE_COLUMN,
    HOLDER_COLUMN,
    HeldLease,
    HolderRecord,
    WaiterLease,
    WaiterRecord,
    format_fence,
)
from lockclient.lockid import owner_host, ticket_time
from lockclient.logs import get_logger
from lockclient.store import Cell, CellStore, Table
from lockclient.store.base import Delete, Op, Put, ReadRow, ReadVersioned, new_attempt_id
from lockclient.wake import TAKEN, Listener, Taken, Watch
from lockclient.watermark import PROPOSED, parse_marks

__all__ = ["FairQueue"]

T = TypeVar("T")

log = get_logger("lockclient")

LONG_POLL_S = 2.0
"""Longest single wait on leasewatch (a missed wake-up costs at most this)."""

HAND_ON_RECHECK_S = 1.0
"""A waiter that left the queue checks whether it was handed the lock at once and this much later
(at most a third of its lease): a release that read its cell before it went may still be sending
its compare-and-set."""

LOCAL_PATIENCE_S = 0.5
"""How long a waiter watching a process on its own machine relies on the local wake-up alone
before it also asks leasewatch."""


class _Turn(enum.Enum):
    REVOKED = "our queue cell is gone (revoked by leasewatch)"
    REQUEUE = "our ticket is below the proposed watermark"
    NOT_NOW = "busy (not waiting)"


class FairQueue:
    """``algorithm="queue"``: the fair FIFO lock."""

    name: ClassVar[str] = "queue"

    def __init__(self, services: Services) -> None:
        self.s = services
        self._quiet = _QuietLocks()
        self._first_use = _FirstUse()
        self._withdrawing = _Withdrawing()

    def _guess(self, lock_id: str) -> _Quiet | None:
        """What the grant sent with the enqueue may expect of the lock's row, or None to send none:
        the row as this process left it after a quiet hold (a re-take), or — for a lock id this
        process never used — no row at all, while such guesses mostly come true here."""
        quiet = self._quiet.pop(lock_id)
        fresh = self._first_use.first(lock_id)
        if quiet is None and fresh and self._first_use.worth_guessing():
            return _Quiet(None, None, first_use=True)
        return quiet

    # -- acquire --------------------------------------------------------------------------

    def acquire(self, attempt: Acquisition) -> HeldLease | None:
        store = attempt.store
        if not attempt.blocking and self._busy(attempt):
            return None  # listing 7, line 1: held or awaited; do not even enqueue
        while True:
            waiter, first_look = self._enqueue(attempt, self._guess(attempt.lock_id))
            looks = [first_look]
            del first_look  # (held by the list alone, which the wait empties: see _look_and_wait)
            try:
                turn = self._wait_turn(attempt, waiter, looks)
            except BaseException:
                self._withdraw(store, waiter)
                raise
            if isinstance(turn, HeldLease):
                waiter.end()
                self.s.keeper.remove(waiter)  # the queue cell now belongs to the holder
                if self.s.watermarks.due(attempt.lock_id, turn.ticket, turn.token):
                    self._advance_watermark(attempt.lock_id, turn.ticket, turn.token)
                return turn
            self._withdraw(store, waiter)
            if turn is _Turn.NOT_NOW or not attempt.blocking:
                return None
            log.info("requeue", lock_id=attempt.lock_id, owner=waiter.owner, reason=turn.value)
            attempt.check()

    def _busy(self, attempt: Acquisition) -> bool:
        store, lock_id = attempt.store, attempt.lock_id
        start = self.s.watermarks.start(lock_id)
        head, row = store.execute_all([ReadRow(Table.QUEUE, lock_id, start, 1), ReadVersioned(lock_id, serial=False)])
        holder = row.get(HOLDER_COLUMN)
        if head or holder is None:
            return bool(head)
        left = lapse_parked(self.s, attempt, holder)  # min_hold: a parked record past its time goes
        return left is None or left > 0

    def _enqueue(self, attempt: Acquisition, quiet: _Quiet | None) -> tuple[WaiterLease, _Look]:
        """Listing 5: a ticket from global time; the lock listed for leasewatch (its index entry
        first, alone, unless listed lately: :mod:`lockclient.listing`), the queue cell (our lease)
        — and, overlapping it, the first look (see the module's docstring). ``quiet``: this
        process took and released the lock last, uncontended — the grant is sent too."""
        store, lock_id = attempt.store, attempt.lock_id
        # A lock handed over is written by the releaser: only a waiter that waits, and needs nothing
        # in its record the releaser cannot know (a stamped grant, a payload), asks for it.
        adopts = attempt.blocking and not attempt.stamp_grant and not attempt.payload
        waiter, now, stamp, beside = new_waiter(self.s, attempt, adopts=adopts)
        start = self.s.watermarks.start(lock_id, waiter.ticket)
        enqueue: list[Op] = [*beside, Put(Table.QUEUE, lock_id, waiter.ticket, waiter.value, stamp)]
        ops = [*enqueue, *self._look_ops(lock_id, start, waiter.ticket)]
        speculative: HeldLease | None = None
        try:
            if quiet is None:
                answers, looked_at = self._stamped(attempt, partial(store.execute_all, ops))
                *_, mine_and_before, row = answers
            else:
                looked_at = self.s.monotonic()
                # The lease row is not read: the speculative grant's compare-and-set answers with
                # the cells the look needs (holder, fencing counter, watermark proposal), read by
                # its Paxos round — as fresh as a plain read sent with it, and one request less
                # for the ring (on a 2-core ring each request sent beside the grant slowed it).
                pending = store.begin([*enqueue, self._look_ops(lock_id, start, waiter.ticket)[0]])
                speculative, found = self._speculate(attempt, waiter, quiet)
                row = {name: value for name, value in found.items() if value is not None}
                try:
                    *_, mine_and_before = pending.wait()
                except StoreUnavailable:
                    # The look that overlapped the speculative grant never answered, and only that
                    # look may decide it: one sent later may no longer see a cell that was ahead of
                    # us when the grant applied (found by the simulator: a grant whose enqueue was
                    # cut off for 9 s was kept on a look after the waiter it had overtaken was
                    # served). Give it back before anyone relies on it; wait in line instead.
                    if speculative is not None:
                        self._give_back(store, speculative)
                        speculative = None
                    answers, looked_at = self._stamped(attempt, partial(store.execute_all, ops))
                    *_, mine_and_before, row = answers
                else:
                    if speculative is None and not found:
                        # The guess could not be settled into an answer: read the row like any look.
                        row, looked_at = self._stamped(attempt, partial(store.read_versioned, lock_id, serial=False))
            confirm_listed(self.s, attempt, beside)
        except BaseException:
            if speculative is not None:
                self._give_back(store, speculative)
            self._withdraw(store, waiter)
            raise
        waiter.enqueued_at = self.s.monotonic()
        self.s.keeper.add_waiter(waiter)
        # The ticket is settled (global time surely past it) later, before we wait or return
        # granted: see _look_and_wait.
        return waiter, _Look(mine_and_before, row, looked_at, overlapped=True, unsettled=now, speculative=speculative)

    def _speculate(
        self, attempt: Acquisition, waiter: WaiterLease, quiet: _Quiet
    ) -> tuple[HeldLease | None, dict[str, str | None]]:
        """The grant, sent with the enqueue on the guess that the lock is as quiet as we left it
        — or, first use, that its row does not exist (see the module's docstring): one
        compare-and-set, conditional on nobody holding, the fencing counter we left (absent) and
        the watermark proposal we saw (absent). Not applied: somebody used the lock since. Also
        returns the row's cells as the compare-and-set found them (empty if it found nothing)."""
        found: dict[str, str | None] = {}
        taken = take(
            self.s,
            attempt,
            waiter.owner,
            waiter.ticket,
            quiet.fence,
            also_expect={PROPOSED: quiet.proposal},
            tries=1,
            found=found,
        )
        if quiet.first_use:
            self._first_use.guessed(right=isinstance(taken, HeldLease) or found.get(FENCE_COLUMN) is None)
        return (taken if isinstance(taken, HeldLease) else None), found

    def _give_back(self, store: CellStore, held: HeldLease) -> None:
        """Undo a speculative grant nobody was told about: delete the holder record (keeping the
        counter it advanced; a fencing token is only ever used once) and wake whoever watches it."""
        try:
            held.release(store)
        except StoreError as exc:
            log.warning("give_back_deferred", lock_id=held.lock_id, owner=held.owner, error=str(exc))

            def run() -> None:
                held.release(self.s.store)

            self.s.keeper.defer(
                run, what="give back a speculative grant", lock_id=held.lock_id, give_up_after=3 * held.lease
            )
        self.s.announce(held.lock_id, released=held.owner)

    def _wait_turn(self, attempt: Acquisition, waiter: WaiterLease, looks: list[_Look]) -> HeldLease | _Turn:
        """Listing 6 (blocking) / 7 (not): look, take when first and free, else wait. ``looks``:
        the first look, in a list that the wait empties (see :meth:`_look_and_wait`)."""
        waiting = _Waiting(self.s, attempt)
        try:
            return self._look_and_wait(attempt, waiter, waiting, looks)
        finally:
            waiting.close()

    def _look_and_wait(
        self, attempt: Acquisition, waiter: WaiterLease, waiting: _Waiting, looks: list[_Look]
    ) -> HeldLease | _Turn:
        # What this frame holds while it waits is held once per waiting acquisition — a thousand
        # waiters of one process, each walked by every full collection of CPython's collector
        # (issue 25): no closure (its cells, its function), and no look's cells once they are
        # judged — the first look is taken out of `looks` (its callers keep no other reference),
        # and the cells of each look are dropped before the wait. Only what the wake-up needs
        # (the fencing counter the look read, when it started) stays.
        store, lock_id, ticket = attempt.store, attempt.lock_id, waiter.ticket
        handshake_done = False
        next_after_holder = False
        contended = False
        delay = self.s.poll_min
        last: tuple[Watch, str | None] | None = None
        look: _Look | None = looks.pop()
        assert look is not None
        unsettled = look.unsettled
        speculative = look.speculative
        hand_over: _HandOver | None = None

        while True:
            seen = self.s.signals.generation(lock_id)
            if hand_over is not None:
                # Woken by the release of the holder just ahead of us: grant without looking again.
                held = self._take_handed_over(attempt, waiter, hand_over)
                hand_over = None
                if held is not None:
                    return held
            if look is None:
                start = self.s.watermarks.start(lock_id, ticket)
                look = self._look_again(attempt, store, lock_id, start, ticket)
            mine_and_before, row, looked_at = look.cells, look.row, look.looked_at
            overlapped, look = look.overlapped, None
            _, proposed = self.s.watermarks.observe(lock_id, row)
            if speculative is not None:
                # Granted with the enqueue: ours to keep only if the look that overlapped it found
                # nobody ahead (a cell written before that look began keeps its turn) and no
                # watermark proposal above our ticket; otherwise give it back before anyone saw it
                # and carry on as a waiter, from a look that starts after our cell is written.
                held, speculative = speculative, None
                nobody_before_us = all(cell.column == ticket for cell in mine_and_before)
                if nobody_before_us and ticket_time(ticket) >= proposed:
                    held.enqueued_at, held.looked_at = waiter.enqueued_at, looked_at
                    held.proposal_seen = row.get(PROPOSED)
                    return held
                self._give_back(store, held)
                del held  # (not kept through the waits to come)
                continue
            # Handed over to us by the release of the holder ahead (before the handshake too: the
            # hand-over expected a proposal our ticket is not below).
            turn = self._adopt(attempt, waiter, row, looked_at)
            if turn is None and ticket_time(ticket) < proposed and not handshake_done:
                turn = _Turn.REQUEUE  # the watermark handshake: our cell may be invisible
            if turn is not None:
                return turn
            if overlapped:
                # Our own cell may not be visible to a read that overlapped its write.
                if mine_and_before and mine_and_before[0].column == ticket:
                    mine_and_before = mine_and_before[1:]
                predecessor = mine_and_before[0] if mine_and_before else None
                # The grant's compare-and-set checks `proposed` after our write (see above).
                fenced_by_watermark = {PROPOSED: row.get(PROPOSED)}
                next_after_holder = False
            else:
                handshake_done = True
                if not mine_and_before or mine_and_before[0].column != ticket:
                    return _Turn.REVOKED
                predecessor = mine_and_before[1] if len(mine_and_before) > 1 else None
                next_after_holder = len(mine_and_before) <= 2  # nobody's cell ahead of the one ahead
                fenced_by_watermark = None
            # The cell ahead may be one of this process's own, withdrawn by an attempt that gave up
            # while the store was away and still queued as a deferred task: delete it now instead of
            # waiting behind it (see _Withdrawing).
            if (
                predecessor is not None
                and self._withdrawing.pending(lock_id, predecessor.column)
                and self._finish_withdrawal(attempt, lock_id, predecessor.column)
            ):
                continue
            holder: str | None = row.get(HOLDER_COLUMN)
            parked_left: float | None = None
            if predecessor is None and holder is not None:
                # min_hold (lockclient.hold): a parked record is the holder until global time passes
                # its `until`; then whoever finds it removes it and looks again.
                parked_left = lapse_parked(self.s, attempt, holder)
                if parked_left == 0.0:
                    continue
            if predecessor is None and holder is None:
                taken = take(
                    self.s,
                    attempt,
                    waiter.owner,
                    ticket,
                    row.get(FENCE_COLUMN),
                    also_expect=fenced_by_watermark,
                    hands_over=contended,
                )
                if isinstance(taken, HeldLease):
                    taken.enqueued_at, taken.looked_at = waiter.enqueued_at, looked_at
                    taken.proposal_seen = row.get(PROPOSED)
                    taken.contended = contended
                    return taken
                holder = taken
                if holder is None:
                    continue  # the counter moved under us three times: look again
            if not attempt.blocking:
                return _Turn.NOT_NOW
            contended = True
            if predecessor is None:
                assert holder is not None
                watch = Watch("holder", _holder_owner(holder))
                ahead = watch.value
            else:
                watch = Watch("gone", predecessor.column)
                ahead = _waiter_owner(predecessor.value)
            # Polling (without a waker, or as its fallback): soon after any progress, then back off
            # while nothing moves. Progress is what we watch changing *or the holder changing*: the
            # waiter behind the first one watches a cell that does not change until it is gone, and
            # backing off on it alone found every hand-over up to poll_max late (~130 ms per grant
            # at P=5 in bench/peers); a new holder means the line moved and our turn is nearer.
            progress = (watch, holder)
            delay = min(delay * 2, self.s.poll_max) if progress == last else self.s.poll_min
            last = progress
            if parked_left is not None:
                delay = min(delay, max(parked_left, self.s.poll_min))
            attempt.check()
            if unsettled is not None:
                # Before we wait, the enqueue must be done: global time surely past our ticket, so a
                # contender that starts after this takes a larger one (Spanner's commit wait; at most
                # the round trip of the best recent /now answer, overlapped with the queue write).
                # A contender granted on its first look never waits for it: nobody can overtake a
                # holder, so whether a later contender's ticket sorts below ours decides nothing — it
                # waits for our release like any other (the commit wait cost an uncontended embedded
                # acquisition 2 ms of its 2.3; issue 9).
                value, unsettled = unsettled, None
                attempt.io(partial(settle_ticket_time, self.s.clock, value))
            local = owner_host(ahead) == self.s.runtime.host()
            fence, proposal = row.get(FENCE_COLUMN), row.get(PROPOSED)
            del mine_and_before, row, predecessor  # (see the top of this method)
            woken = waiting.wait(watch, delay * self.s.runtime.uniform(0.5, 1.0), seen, local=local)
            handed_over = woken and handshake_done and next_after_holder
            if handed_over and holder is not None and ahead == _holder_owner(holder):
                # That holder's release may hand the lock to the first in line itself (most likely
                # us): then we adopt it instead of granting ourselves (a grant of our own would be
                # refused, a Paxos round lost).
                adopt = waiter.record.adopts and _hands_over(holder)
                hand_over = _HandOver(fence, looked_at, proposal, adopt)

    def _look_again(self, attempt: Acquisition, store: CellStore, lock_id: str, start: str, ticket: str) -> _Look:
        (cells, row), looked_at = self._stamped(attempt, partial(self._look, store, lock_id, start, ticket))
        return _Look(cells, row, looked_at, overlapped=False)

    def _take_handed_over(
        self, attempt: Acquisition, waiter: WaiterLease, hand_over: _HandOver
    ) -> HeldLease | _Turn | None:
        """The first in line, woken by the release it watched, sends the grant straight away (see
        the module's docstring): conditional on nobody holding and the fencing counter being the
        one the released holder's grant left — so on nobody having been granted since. Or, when
        that release hands the lock over itself, reads the lease row alone (one plain read, not a
        whole look) and adopts the lock it finds handed to us. None: not granted (someone else was,
        the wake-up was not a release, or the release did not hand the lock to us); look again."""
        if not waiter.alive():
            return None  # leasewatch may have removed our cell: a look decides
        attempt.check()
        if hand_over.adopt:
            row, looked_at = self._stamped(
                attempt, partial(attempt.store.read_versioned, attempt.lock_id, serial=False)
            )
            return self._adopt(attempt, waiter, row, looked_at)
        taken = take(self.s, attempt, waiter.owner, waiter.ticket, hand_over.fence, tries=1, hands_over=True)
        if not isinstance(taken, HeldLease):
            return None
        taken.enqueued_at, taken.looked_at = waiter.enqueued_at, hand_over.looked_at
        taken.proposal_seen = hand_over.proposal
        taken.contended = True
        return taken

    def _adopt(
        self, attempt: Acquisition, waiter: WaiterLease, row: dict[str, str], looked_at: float
    ) -> HeldLease | _Turn | None:
        """The holder record our look read names us, written by the previous holder's release: the
        lock is ours, without a Paxos round of our own. Dated from the start of our write of the
        queue-cell version the releaser read (:func:`_adopted_since`); if that lease has already run
        out by our clock (we were paused, or cut off from the store, for about a lease), we cannot
        use it — leasewatch may be about to revoke it — so it is handed on at once and we queue
        again. None: nothing was handed to us."""
        held = self._handed(waiter, row, looked_at, attempt.max_hold)
        if held is None:
            return None
        if held.monotonic() < held.valid_until():
            # Held from now, as far as this process (and RemoteLock.granted_at) is concerned: the
            # grant came before, after the previous holder's release began.
            now = held.holding_since = held.monotonic()
            # Its lease is dated from our cell write, often a third of a lease ago or more: renew it
            # half-way through what is left, and no later than a third of a lease from now — not at
            # once, which would add a Paxos round to every hand-over (and hold up a quick release).
            held.renew_not_before = now + min(held.lease / 3, (held.valid_until() - now) / 2)
            log.debug("handed_over", lock_id=waiter.lock_id, owner=waiter.owner, fencing_token=held.token)
            return held
        log.info("handed_over_too_late", lock_id=waiter.lock_id, owner=waiter.owner, fencing_token=held.token)
        self._hand_on(held, attempt.store)
        return _Turn.REQUEUE

    def _handed(
        self, waiter: WaiterLease, row: dict[str, str], looked_at: float, max_hold: float | None = None
    ) -> HeldLease | None:
        """The lease of a holder record in ``row`` (read by a look that started at ``looked_at``) that
        a release handed to ``waiter``, if there is one."""
        raw = row.get(HOLDER_COLUMN)
        if raw is None or not waiter.record.adopts:
            return None
        try:
            record = HolderRecord.decode(raw)
        except StoreError:
            return None
        if not record.cell or record.owner != waiter.owner or record.ticket != waiter.ticket:
            return None
        since = _adopted_since(waiter, record, looked_at)
        # A version we no longer remember was written more than a few renewals ago: already run out.
        renewed_at = since if since is not None else self.s.monotonic() - record.lease
        held = HeldLease(waiter.lock_id, record, renewed_at=renewed_at, max_hold=max_hold, runtime=self.s.runtime)
        held.value = raw
        held.enqueued_at = waiter.enqueued_at
        held.contended = True
        held.proposal_seen = row.get(PROPOSED)
        # looked_at stays None: FIFO was judged by the releaser's read, which this process cannot date.
        return held

    def _hand_on(self, held: HeldLease, store: CellStore) -> None:
        """A lock handed to a waiter that cannot take it (left the queue, or its lease ran out before
        it found the grant): release it as its holder would — to the next in line, or to nobody.
        If the store is away, keep trying in the background (then leasewatch revokes it after
        ``lease + grace`` at the latest: nobody renews it)."""

        def run() -> None:
            self.release(held, self.s.store)
            self.s.announce(held.lock_id, gone=held.ticket, released=held.owner)

        try:
            self.release(held, store)
        except StoreError as exc:
            held.note_release_attempt()
            log.warning("hand_on_deferred", lock_id=held.lock_id, owner=held.owner, error=str(exc))
            self.s.keeper.defer(run, what="hand on a lock", lock_id=held.lock_id, give_up_after=3 * held.lease)
            return
        self.s.announce(held.lock_id, gone=held.ticket, released=held.owner)

    def _stamped(self, attempt: Acquisition, look: Callable[[], T]) -> tuple[T, float]:
        """A look (alone, or with the enqueue), retried while the store is away, and when the try
        that answered *started*: FIFO is judged by that moment (``RemoteLock.looked_at``), so a
        retried look must not claim the first try's. (Found by the simulator: a look retried
        through a 4 s cut-off was dated from before it, and the grant appeared to overtake a cell
        revoked in between.)"""
        started = [self.s.monotonic()]

        def once() -> T:
            started[0] = self.s.monotonic()
            return look()

        return attempt.retrying(once), started[0]

    @staticmethod
    def _look_ops(lock_id: str, start: str, ticket: str) -> list[Op]:
        """One look, whatever the queue's length: our own cell and the two just ahead of it (a
        reverse slice from our ticket down to the watermark, three cells at most: ours missing
        means revoked, none ahead means first in line; the second one ahead only matters when
        the first is the holder's: see "A hand-over skips the look" above) and the lease row (holder,
        fencing counter, watermarks; a plain read, no Paxos round)."""
        return [
            ReadRow(Table.QUEUE, lock_id, start, limit=3, end=ticket, reverse=True),
            ReadVersioned(lock_id, serial=False),
        ]

    @staticmethod
    def _look(store: CellStore, lock_id: str, start: str, ticket: str) -> tuple[list[Cell], dict[str, str]]:
        """One look, one round trip."""
        mine_and_before, row = store.execute_all(FairQueue._look_ops(lock_id, start, ticket))
        return mine_and_before, row

    # -- leave the queue ----------------------------------------------------------------------

    def _withdraw(self, store: CellStore, waiter: WaiterLease) -> None:
        """Remove our queue cell; if the store is away, keep trying in the background (and if
        that fails too, the cell stops being renewed and leasewatch removes it)."""
        waiter.end()
        self.s.keeper.remove(waiter)
        stamp = self.s.timestamps.next()
        lock_id = waiter.lock_id

        def delete() -> None:
            if self._withdrawing.pending(lock_id, waiter.ticket):  # else deleted on a later attempt's path
                self.s.store.delete(Table.QUEUE, lock_id, waiter.ticket, timestamp=stamp)

        try:
            store.delete(Table.QUEUE, lock_id, waiter.ticket, timestamp=stamp)
        except StoreError as exc:
            log.warning("withdraw_deferred", lock_id=lock_id, owner=waiter.owner, error=str(exc))
            self._withdrawing.add(lock_id, waiter.ticket)
            self.s.keeper.defer(
                delete,
                what="withdraw a queue cell",
                lock_id=lock_id,
                give_up_after=3 * self.s.lease,
                on_done=lambda _: self._withdrawing.discard(lock_id, waiter.ticket),
            )
        self.s.announce(lock_id, gone=waiter.ticket)
        if waiter.record.adopts:
            self._hand_on_if_handed(waiter)

    def _hand_on_if_handed(self, waiter: WaiterLease) -> None:
        """A waiter that takes hand-overs left the queue (timed out, cancelled, revoked, or queues
        again): a release that read its cell before it was gone may have handed it the lock. In the
        background, off the caller's path: read the lock's row and, if the lock was handed to us,
        hand it on — at once, with a plain read (a hand-over that has landed is committed: a plain
        read sees it), and once more :data:`HAND_ON_RECHECK_S` later at SERIAL (which also settles a
        compare-and-set in flight), for a release whose read came just before our cell went and
        whose compare-and-set came after our first check. One Paxos round per waiter that leaves,
        not two. One held up in the network longer than that is left to leasewatch, which revokes
        it after ``lease + grace`` like a dead holder's (the lock is unavailable that long)."""
        self._check_handed(waiter, 0.0, serial=False)
        self._check_handed(waiter, min(HAND_ON_RECHECK_S, waiter.lease / 3), serial=True)

    def _check_handed(self, waiter: WaiterLease, delay: float, *, serial: bool) -> None:
        found: list[HeldLease] = []

        def run() -> None:
            if not found:
                looked_at = self.s.monotonic()
                row = self.s.store.read_versioned(waiter.lock_id, serial=serial)
                held = self._handed(waiter, row, looked_at)
                if held is None:
                    return
                log.info("handed_to_a_waiter_that_left", lock_id=waiter.lock_id, owner=waiter.owner)
                found.append(held)
            self.release(found[0], self.s.store)
            self.s.announce(waiter.lock_id, gone=waiter.ticket, released=waiter.owner)

        what = "hand on a lock handed to a waiter that left"
        self.s.keeper.defer(run, what=what, lock_id=waiter.lock_id, give_up_after=3 * waiter.lease, delay=delay)

    def _finish_withdrawal(self, attempt: Acquisition, lock_id: str, ticket: str) -> bool:
        """Delete our own withdrawn cell ``ticket`` from the acquisition's path; False if the store
        refused (the deferred task keeps trying, and leasewatch revokes the cell after its lease)."""
        stamp = self.s.timestamps.next()
        try:
            attempt.io(lambda: attempt.store.delete(Table.QUEUE, lock_id, ticket, timestamp=stamp))
        except StoreError as exc:
            log.info("withdraw_still_deferred", lock_id=lock_id, ticket=ticket, error=str(exc))
            return False
        self._withdrawing.discard(lock_id, ticket)
        self.s.announce(lock_id, gone=ticket)
        return True

    # -- release ---------------------------------------------------------------------------------

    def release(self, lease: HeldLease, store: CellStore) -> bool:
        delete = Delete(Table.QUEUE, lease.lock_id, lease.ticket, self.s.timestamps.next())
        if lease.ended or not (lease.record.handing_over and not lease.park_until and lease.column == HOLDER_COLUMN):
            # One round trip: the queue cell's delete is in flight while the holder record goes.
            pending = store.begin([delete])
            clean = lease.release(store)
            pending.wait()
        else:
            # It waited, so others likely wait behind it (and its record told them it hands over):
            # read the head of the queue (with the delete), then hand the lock to the first in line
            # in the release's compare-and-set.
            start = self.s.watermarks.start(lease.lock_id)
            read_at = self.s.monotonic()
            failed: StoreError | None = None
            successor: tuple[HolderRecord, dict[str, str | None]] | None = None
            try:
                _, head = store.execute_all([delete, _head_read(lease.lock_id, start, lease.ticket)])
            except StoreError as exc:
                failed = exc  # released as before; the delete is retried with the release's retry
            else:
                successor = self._successor(lease, head)
            if successor is None:
                clean = lease.release(store)
            else:
                lease.handed_read_at = read_at
                clean = lease.release(store, *successor)
            if failed is not None:
                raise failed
        if clean and not lease.contended and not lease.parked:
            # Nobody was waiting for it: the next acquisition here sends its grant with the enqueue.
            self._quiet.put(lease.lock_id, _Quiet(format_fence(lease.token, lease.owner), lease.proposal_seen))
        return clean

    def _successor(self, lease: HeldLease, head: list[Cell]) -> tuple[HolderRecord, dict[str, str | None]] | None:
        """Whom a release hands the lock to, and what the hand-over is also conditional on: the first
        cell of the queue's head that is not ours (cells below our ticket are in line too: see "A
        hand-over skips the look"), if its waiter takes hand-overs and its ticket is not below the
        watermark proposal we know — the compare-and-set expects that proposal, so a waiter a
        publisher may have sent to the back (the watermark handshake) is never handed the lock."""
        cell = _first_in_line(head, lease.ticket)
        if cell is None:
            return None
        try:
            waiter = WaiterRecord.decode(cell.value)
        except StoreError:
            return None
        proposal = lease.proposal_seen
        proposed = parse_marks({PROPOSED: proposal} if proposal is not None else {})[1]
        if not waiter.adopts or waiter.mode or ticket_time(cell.column) < proposed:
            return None
        # For display only ("held for"): our own grant's estimate, moved on by our monotonic clock.
        mine = lease.record.granted
        granted = mine + max(0, int((self.s.monotonic() - lease.holding_since) * 1_000_000)) if mine else 0
        record = HolderRecord(
            waiter.owner,
            1,
            waiter.lease,
            cell.column,
            lease.token + 1,
            new_attempt_id(self.s.runtime),
            label=waiter.label,
            granted=granted,
            cell=waiter.version,
        )
        return record, {PROPOSED: proposal}

    # -- the watermark ---------------------------------------------------------------------------

    def _advance_watermark(self, lock_id: str, ticket: str, token: int) -> None:
        def run() -> None:
            self.s.watermarks.advance(self.s.store, lock_id, ticket, token)

        self.s.keeper.defer(run, what="advance the watermark", lock_id=lock_id, give_up_after=self.s.lease)


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look read: our cell and the one ahead (reverse order), and the lease row."""

    cells: list[Cell]
    row: dict[str, str]
    looked_at: float
    overlapped: bool
    """Sent together with our enqueue: our own cell may be missing, and the watermark
    handshake is not done by it."""
    unsettled: int | None = None
    """Our ticket's time, not yet settled (the first look only)."""
    speculative: HeldLease | None = None
    """The grant sent with the enqueue, if it applied (the first look only)."""


@dataclass(frozen=True, slots=True)
class _HandOver:
    """The first in line was woken by the release of the holder its last look saw."""

    fence: str | None
    """The fencing counter that look read: the released holder's grant."""
    looked_at: float
    """When that look started: FIFO is judged by it (the grant skips a look)."""
    proposal: str | None
    """The watermark proposal that look read."""
    adopt: bool = False
    """That holder hands the lock over at release, and we take hand-overs: read the lease row and
    adopt the lock instead of sending a grant."""


@dataclass(frozen=True, slots=True)
class _Quiet:
    """How this process left a lock it took without waiting and released cleanly — or, for a
    lock id it never used, the guess that the lock's row does not exist (both None)."""

    fence: str | None
    """The fencing counter after our grant (unchanged since, if nobody took the lock)."""
    proposal: str | None
    """The watermark proposal our look read."""
    first_use: bool = False
    """A guess about a lock id this process never used (counted by :class:`_FirstUse`)."""


class _FirstUse:
    """Which lock ids this process used, and whether guessing that a new one's row does not exist
    pays here.

    A guess costs nothing when right (the grant rides with the enqueue: one round trip instead of
    two) and a refused compare-and-set when wrong — a Paxos round beside the look, on a lock row
    other contenders may be using, and a round trip more than the plain path when the lock is
    free (the grant then follows the look). Where the ids a process locks were mostly used by
    other processes before (a fleet of workers sharing ``account:<n>``), the guess is mostly
    wrong: so it is made while at least half of the last :data:`WINDOW` guesses were right (and
    always for the first :data:`FIRST`), otherwise only every :data:`PROBE_EVERY`-th first use, to
    notice when that changes.

    The ids are remembered in a bounded LRU (:data:`LIMIT`): an id forgotten is guessed at again,
    which costs at most one refused compare-and-set."""

    LIMIT = 8192
    WINDOW = 32
    FIRST = 4
    """Guesses always made before the window judges (a refusal or two proves nothing)."""
    PROBE_EVERY = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: OrderedDict[str, None] = OrderedDict()
        self._outcomes: deque[bool] = deque(maxlen=self.WINDOW)
        self._skipped = 0

    def first(self, lock_id: str) -> bool:
        """Whether this is the process's first use of ``lock_id`` (now remembered as used)."""
        with self._lock:
            if lock_id in self._used:
                self._used.move_to_end(lock_id)
                return False
            self._used[lock_id] = None
            while len(self._used) > self.LIMIT:
                self._used.popitem(last=False)
            return True

    def worth_guessing(self) -> bool:
        with self._lock:
            right = sum(self._outcomes)
            if len(self._outcomes) < self.FIRST or 2 * right >= len(self._outcomes):
                return True
            self._skipped += 1
            return self._skipped % self.PROBE_EVERY == 0

    def guessed(self, *, right: bool) -> None:
        with self._lock:
            self._outcomes.append(right)


class _Withdrawing:
    """This process's queue cells whose withdrawal failed and waits in the keeper as a deferred
    task (the store was away when their attempt gave up). Such a cell is nobody's turn any more,
    but until the task gets through, or leasewatch revokes it after its waiter lease, it sits in
    the queue — and the next attempt of this same process on the same lock id, whose ticket is
    larger, waits behind it. With the long waiter leases of many-lock deployments (6,000 s at
    100,000 ids, docs/limits.md) and a keeper busy with renewals, that was one lock id given up
    after five 120 s timeouts on the ring (BENCHMARKS.md, "100,000 ids"). An acquisition that finds
    one of these just ahead of its own cell deletes it itself (it is ours: the same delete the
    task sends). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: set[tuple[str, str]] = set()

    def add(self, lock_id: str, ticket: str) -> None:
        with self._lock:
            self._tickets.add((lock_id, ticket))

    def discard(self, lock_id: str, ticket: str) -> None:
        with self._lock:
            self._tickets.discard((lock_id, ticket))

    def pending(self, lock_id: str, ticket: str) -> bool:
        with self._lock:
            return (lock_id, ticket) in self._tickets


class _QuietLocks:
    """The locks this process may take with a speculative grant: a bounded, thread-safe map. An
    entry is popped by the acquisition that uses it, so only one acquisition here speculates."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Quiet] = OrderedDict()

    def put(self, lock_id: str, quiet: _Quiet) -> None:
        with self._lock:
            self._entries[lock_id] = quiet
            self._entries.move_to_end(lock_id)
            while len(self._entries) > self.LIMIT:
                self._entries.popitem(last=False)

    def pop(self, lock_id: str) -> _Quiet | None:
        with self._lock:
            return self._entries.pop(lock_id, None)


class _Waiting:
    """How one waiting acquisition sleeps until what it watches may have changed.

    Three sources, whichever comes first: a datagram on its local wake-up socket (a release
    on this machine, or its own background leasewatch long-poll answering), in-process
    signals when no socket could be bound, and its own back-off (the fallback polling)."""

    def __init__(self, services: Services, attempt: Acquisition) -> None:
        self.s = services
        self.attempt = attempt
        self.listener: Listener | None = None
        self.taken = False
        """Another waiter on this machine watches what we watch: our look missed a queue cell
        between us and it (written while we looked), so we look again after our back-off
        instead of long-polling leasewatch for a change that is not ours to wait for."""
        self.watching_since = 0.0

    def wait(self, watch: Watch, backoff: float, seen: int, *, local: bool) -> bool:
        """``local``: what we watch belongs to a process on this machine, whose release or
        withdrawal wakes our socket directly. True when woken by a notice that what we watch
        changed (a datagram to its name, or leasewatch's answer); False after the back-off or
        an in-process signal (any change to the lock id)."""
        attempt = self.attempt
        lock_id = attempt.lock_id
        fresh = self.listener is None or self.listener.watch != watch
        if fresh:
            if self.listener is not None:
                self.listener.close()
            bound = (attempt.wakeups or self.s.wakeups).listen(lock_id, watch)
            self.taken = bound is TAKEN
            self.listener = None if bound is None or isinstance(bound, Taken) else bound
            self.watching_since = self.s.monotonic()
        elif local and self.listener is not None:
            # Bound since our last look, and what we watch wakes us when it goes: polling is only
            # a safety net now. (The first wait after binding stays short: a release between our
            # look and the bind sent its datagram to nobody, and the next look catches it.) What
            # sends no datagram — a crashed owner, revoked after lease + grace anyway, or one that
            # cannot reach us — costs at most LONG_POLL_S, as a missed leasewatch answer does:
            # polling every poll_max here was 4,000 store reads a second for 1,000 waiters of one
            # process, which starved their own hand-overs and the event loop (issue 25). Jittered,
            # so that waiters that queued together do not all look together, every time.
            backoff = max(backoff, self.s.poll_max, LONG_POLL_S * self.s.runtime.uniform(0.5, 1.0))
        remaining = attempt.remaining()
        waker = self.s.waker
        patient = self.s.monotonic() - self.watching_since > LOCAL_PATIENCE_S
        if waker is not None and not self.taken and (self.listener is None or not local or patient):
            # leasewatch answers when the watched cell or holder changes (a release tells it
            # at once); with it, store polling only bounds what a lost wake-up can cost. Not
            # asked while a process on this machine is what we watch: its release reaches our
            # socket within microseconds, and an HTTP long-poll per wait would cost more CPU
            # than it saves (asked after LOCAL_PATIENCE_S anyway, in case the datagram cannot
            # reach us: another network namespace on the same host name).
            cap = LONG_POLL_S if remaining is None else min(LONG_POLL_S, remaining)
            listener = self.listener
            if listener is not None and cap > 0:
                if waker.watch_in_background(lock_id, watch, cap, listener.wake):
                    backoff = max(backoff, cap)
            elif cap > 0 and attempt.io(
                # (A partial, not a lambda: a lambda here made its every captured name a cell in
                # each call of this method, five objects per waiting acquisition for the collector.)
                partial(waker.wait_for_change, lock_id, watch, cap if attempt.cancel is None else 0.5)
            ):
                return True
        if remaining is not None:
            backoff = min(backoff, remaining)
        if self.listener is not None:
            return self.listener.wait(backoff, attempt.cancel)
        self.s.signals.wait(lock_id, seen, backoff, attempt.cancel, runtime=attempt.runtime)
        return False

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def _head_read(lock_id: str, start: str, own_ticket: str) -> ReadRow:
    """A releaser's read of the queue's head: the first two cells from the watermark — ours and the
    first in line, whichever comes first (a cell below our ticket is in line too). Reading from our
    own ticket instead ("the one right behind me") is the broken variant
    ``handover-to-the-second-in-line`` of sim/findings.py."""
    return ReadRow(Table.QUEUE, lock_id, start, limit=2)


def _first_in_line(cells: list[Cell], own_ticket: str) -> Cell | None:
    """The first cell of the queue's head, in queue order, that is not the releaser's own."""
    for cell in cells:
        if cell.column != own_ticket:
            return cell
    return None


def _adopted_since(waiter: WaiterLease, record: HolderRecord, looked_at: float) -> float | None:
    """When a lock handed to ``waiter`` is dated from: the start of its own write of the queue-cell
    version the releaser read (and copied into the record). The releaser read that version before
    its compare-and-set wrote the record, and leasewatch cannot have started timing the record
    before it was written — so leasewatch's lease + grace ends after ours. Not from ``looked_at``,
    the start of the look that found the record: that look may come long after leasewatch began
    timing the record (we were paused, or cut off), and a lease dated from it would outlast
    leasewatch's (the broken variant ``handover-dated-from-the-look`` of sim/findings.py).
    None: a version too old to remember."""
    return waiter.written_at(record.cell)


def _hands_over(raw: str) -> bool:
    try:
        return HolderRecord.decode(raw).handing_over
    except StoreError:
        return False


def _waiter_owner(raw: str) -> str:
    try:
        return WaiterRecord.decode(raw).owner
    except StoreError:
        return ""


def _holder_owner(raw: str) -> str:
    try:
        return HolderRecord.decode(raw).owner
    except StoreError:
        return raw
