"""The queue watermark: where queue reads start, so they skip the tombstones of past hand-overs.

Every hand-over leaves a tombstone in the lock's queue row; after 100,000 of them a
read of the queue head from the start of the row would scan 100,000 tombstones. So
each lock has a *watermark*: a ticket time below which its queue row holds only
tombstones. Readers start their slice there.

**Why it is sound — under any movement of global time.** A holder with ticket ``t``
knows that when it was granted, no live cell was ahead of it; but a contender that
took a ticket earlier may still be writing its queue cell. The previous rule bounded
that with the local monotonic clock ("an enqueue slower than 5 s is redone"), which
broke when global time jumped forward: a ticket taken just before a jump looked ten
minutes old a moment later. Now the publication is a handshake that does not care how
tickets relate to real time (Dekker's, on two registers; thesis lemma 1's visibility —
a read that starts after a write completed sees it — is all it needs):

1. the publisher writes ``proposed = t - WINDOW`` (a max-register), *then* reads the
   queue below it, and publishes ``head = min(proposed, lowest live ticket found)``;
2. every contender writes its queue cell, *then* reads ``proposed`` (in the same
   round trip as its first head read); if its ticket is below it, it withdraws and
   queues again with a fresh ticket.

Of a publisher and a contender racing, at least one sees the other's write: either
the publisher finds the contender's cell and keeps the watermark below it, or the
contender finds the proposal and moves itself above it. So no live cell is ever below
``head``. ``WINDOW`` only keeps contenders that are merely slow (by up to ten seconds of
global time) from being sent to the back; it is not what makes the watermark safe.

Both cells live in the lock's row of the lease table (``~wm-proposed``, ``~wm-head``),
so the look every contender makes anyway (queue + lease row, one round trip) also reads
them; they are raised only by compare-and-set, and only ever upwards (max-registers). A
publication needs Paxos rounds, but happens at most once per window of ticket time, by
the holder, off its acquiring path. The handshake's two orders hold: the publisher's
compare-and-set is committed at QUORUM before it reads the queue, and a contender reads
the row at QUORUM after its queue cell was written.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from lockclient.lockid import make_ticket, ticket_time
from lockclient.runtime import THREADS, Runtime
from lockclient.store import CellStore, Table
from lockclient.store.base import new_attempt_id

__all__ = ["HEAD", "PROPOSED", "WINDOW_US", "Watermarks", "parse_marks"]

WINDOW_US = 10_000_000
"""Publish ``holder's ticket - WINDOW_US``, at most once per ``WINDOW_US`` of ticket time."""
EVERY_GRANTS = 64
"""...and only once the lock was granted this many times since the last publication: a queue's
tombstones come from past hand-overs, which the fencing token counts. A lock used now and then
never publishes (its few tombstones cost nothing), and no new lock id pays for a publication."""
HEAD = "~wm-head"
"""``"<ticket time>|<fencing token when published>|<attempt id>"``."""
PROPOSED = "~wm-proposed"
"""``"<ticket time>|<attempt id>"`` (``"<ticket time>"`` before attempt ids)."""


def _time(value: str | None) -> int:
    number = (value or "").partition("|")[0]
    return int(number) if number.isdigit() else 0


def parse_marks(row: Mapping[str, str]) -> tuple[int, int]:
    """(published, proposed) ticket times from the lock's lease row; 0 for absent."""
    return _time(row.get(HEAD)), _time(row.get(PROPOSED))


def _head_token(row: Mapping[str, str]) -> int:
    token = (row.get(HEAD) or "").partition("|")[2].partition("|")[0]
    return int(token) if token.isdigit() else 0


class Watermarks:
    """What this process knows of each lock's published watermark (a cache of a
    max-register: never ahead of the store, only ever moving forward)."""

    def __init__(self, runtime: Runtime = THREADS) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._published: dict[str, int] = {}
        self._head_token: dict[str, int] = {}

    def published(self, lock_id: str) -> int:
        with self._lock:
            return self._published.get(lock_id, 0)

    def start(self, lock_id: str, own_ticket: str | None = None) -> str:
        """Where a queue read starts: the published watermark, or our own ticket if that is
        lower (a contender always sees its own cell)."""
        bound = self.published(lock_id)
        if own_ticket is not None:
            bound = min(bound, ticket_time(own_ticket))
        return make_ticket(bound, "")

    def observe(self, lock_id: str, row: Mapping[str, str]) -> tuple[int, int]:
        """Record the lease row's marks as read; returns (published, proposed)."""
        published, proposed = parse_marks(row)
        self._note(lock_id, published, _head_token(row))
        return published, proposed

    def _note(self, lock_id: str, published: int, token: int) -> None:
        with self._lock:
            if published > self._published.get(lock_id, 0):
                self._published[lock_id] = published
            if token > self._head_token.get(lock_id, 0):
                self._head_token[lock_id] = token

    def due(self, lock_id: str, holder_ticket: str, token: int) -> bool:
        """Should a holder with this ticket and fencing token publish? Only after
        ``EVERY_GRANTS`` grants since the last publication, and a whole window of ticket time."""
        with self._lock:
            since = token - self._head_token.get(lock_id, 0)
        return since >= EVERY_GRANTS and ticket_time(holder_ticket) - WINDOW_US - self.published(lock_id) >= WINDOW_US

    def advance(self, store: CellStore, lock_id: str, holder_ticket: str, token: int) -> int:
        """The publisher's side of the handshake (run off the acquiring path). Returns the
        published watermark."""
        candidate = ticket_time(holder_ticket) - WINDOW_US
        row = store.read_versioned(lock_id, serial=False)
        published, proposed = parse_marks(row)
        self._note(lock_id, published, _head_token(row))
        if candidate <= published:
            return published
        if candidate > proposed:
            _raise(store, lock_id, PROPOSED, candidate, f"{candidate}|{new_attempt_id(self._runtime)}")
        # Strictly after the proposal is committed: any contender we miss here sees it.
        lowest = store.read_row(Table.QUEUE, lock_id, start=make_ticket(published, ""), limit=1)
        bound = candidate
        if lowest and ticket_time(lowest[0].column) < candidate:
            bound = ticket_time(lowest[0].column)  # a live cell below: keep it visible
        if bound > published:
            published = _raise(store, lock_id, HEAD, bound, f"{bound}|{token}|{new_attempt_id(self._runtime)}")
            self._note(lock_id, published, token)
        return published


def _raise(store: CellStore, lock_id: str, column: str, value: int, encoded: str) -> int:
    """A max-register by compare-and-set: set ``column`` to ``encoded`` (whose time is
    ``value``, and which carries an attempt id like every compare-and-set value) unless it
    already holds at least that time. Returns the time it holds after. A max-register needs no
    more than "it holds at least ``value``", so an outcome the store left unknown (it raises) is
    simply tried again by the caller's next publication."""
    current = store.read_versioned(lock_id, serial=False).get(column)
    while True:
        if _time(current) >= value:
            return _time(current)
        result = store.compare_and_set(lock_id, {column: current}, {column: encoded})
        if result.applied:
            return value
        current = result.current.get(column)
