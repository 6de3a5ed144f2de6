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

Both cells are max-registers (value == write timestamp, like GlobalTime), so they
never move back, and a holder publishes at most once per window of ticket time.
"""

from __future__ import annotations

import threading

from lockclient.lockid import make_ticket, ticket_time
from lockclient.store import Cell, CellStore, Table

__all__ = ["HEAD", "PROPOSED", "WINDOW_US", "Watermarks"]

WINDOW_US = 10_000_000
"""Publish ``holder's ticket - WINDOW_US``, at most once per ``WINDOW_US`` of ticket time."""
HEAD = "head"
PROPOSED = "proposed"


def parse_marks(cells: list[Cell]) -> tuple[int, int]:
    """(published, proposed) from the watermark row; 0 for absent."""
    marks = {c.column: int(c.value) for c in cells if c.column in (HEAD, PROPOSED) and c.value.isdigit()}
    return marks.get(HEAD, 0), marks.get(PROPOSED, 0)


class Watermarks:
    """What this process knows of each lock's published watermark (a cache of a
    max-register: never ahead of the store, only ever moving forward)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: dict[str, int] = {}

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

    def observe(self, lock_id: str, cells: list[Cell]) -> tuple[int, int]:
        """Record the watermark row as read; returns (published, proposed)."""
        published, proposed = parse_marks(cells)
        self._note(lock_id, published)
        return published, proposed

    def _note(self, lock_id: str, published: int) -> None:
        with self._lock:
            if published > self._published.get(lock_id, 0):
                self._published[lock_id] = published

    def due(self, lock_id: str, holder_ticket: str) -> bool:
        """Would a holder with this ticket move the watermark by a whole window?"""
        return ticket_time(holder_ticket) - WINDOW_US - self.published(lock_id) >= WINDOW_US

    def advance(self, store: CellStore, lock_id: str, holder_ticket: str) -> int:
        """The publisher's side of the handshake (run off the acquiring path). Returns the
        published watermark."""
        published = self.published(lock_id)
        candidate = ticket_time(holder_ticket) - WINDOW_US
        if candidate <= published:
            return published
        store.put(Table.WATERMARK, lock_id, PROPOSED, str(candidate), timestamp=candidate)
        # Strictly after the proposal is written: any contender we miss here sees it.
        lowest = store.read_row(Table.QUEUE, lock_id, start=make_ticket(published, ""), limit=1)
        bound = candidate
        if lowest and ticket_time(lowest[0].column) < candidate:
            bound = ticket_time(lowest[0].column)  # a live cell below: keep it visible
        if bound > published:
            store.put(Table.WATERMARK, lock_id, HEAD, str(bound), timestamp=bound)
            self._note(lock_id, bound)
        return max(bound, published)
