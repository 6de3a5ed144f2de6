"""A publication of the watermark (:meth:`lockclient.watermark.Watermarks.advance`) called
directly: what it returns is what the store holds and what this process then knows — never
ahead of a live cell below it (mutation testing, issue 24: advance() runs as a deferred keeper
task, which retries whatever it raises, so a publication that crashed after writing passed every
test and every judge seed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockclient import CellStore, open_store
from lockclient.lockid import make_ticket
from lockclient.store import Table
from lockclient.watermark import WINDOW_US, Watermarks, parse_marks

T = 5_000_000_000_000  # a ticket time (µs), far from 0


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


def test_a_publication_returns_what_the_store_holds_and_this_process_knows(store: CellStore) -> None:
    marks = Watermarks()
    published = marks.advance(store, "wm", make_ticket(T, "holder"), token=70)
    assert published == T - WINDOW_US
    assert parse_marks(store.read_versioned("wm"))[0] == published
    assert marks.published("wm") == published
    # Published once: a second call for the same holder changes nothing.
    assert marks.advance(store, "wm", make_ticket(T, "holder"), token=70) == published


def test_a_publication_stops_below_a_live_queue_cell(store: CellStore) -> None:
    marks = Watermarks()
    waiting = make_ticket(T - 2 * WINDOW_US, "early-waiter")
    store.put(Table.QUEUE, "wm2", waiting, '{"l":5.0,"o":"early-waiter","v":1}', timestamp=1)
    published = marks.advance(store, "wm2", make_ticket(T, "holder"), token=70)
    assert published == T - 2 * WINDOW_US  # the waiter's cell stays visible to every reader
    assert parse_marks(store.read_versioned("wm2"))[0] == published
    assert marks.published("wm2") == published
    assert marks.start("wm2") <= waiting


def test_a_publication_reads_one_queue_cell_however_long_the_queue(store: CellStore) -> None:
    """Only the lowest live cell at or above the published watermark bounds the publication: it is
    read alone (one cell, not the whole queue of waiters behind the holder)."""
    from lockclient.store import Cell
    from tests.support.faulty import FaultyStore

    cells: list[int] = []

    class CellsRead(FaultyStore):
        def read_row(
            self,
            table: Table,
            row: str,
            *,
            start: str = "",
            limit: int | None = None,
            end: str | None = None,
            reverse: bool = False,
        ) -> list[Cell]:
            found = super().read_row(table, row, start=start, limit=limit, end=end, reverse=reverse)
            if table is Table.QUEUE:
                cells.append(len(found))
            return found

    for i in range(50):  # the holder's cell and 49 waiters behind it
        owner = f"w{i}"
        store.put(Table.QUEUE, "wm3", make_ticket(T + i, owner), f'{{"l":5.0,"o":"{owner}","v":1}}', timestamp=1)
    counted = CellsRead(store)
    published = Watermarks().advance(counted, "wm3", make_ticket(T, "w0"), token=70)
    assert published == T - WINDOW_US
    assert cells == [1]


@pytest.mark.parametrize("host", ["0box", "Alpha", "vm"])
def test_a_contender_always_sees_its_own_cell_whatever_its_owner_id(host: str) -> None:
    """A queue read starts at the published watermark, or at our own ticket if that is lower — at
    its time, *before every owner id* of that time (ours may begin with a digit or a capital)."""
    own = make_ticket(T, f"{host}.1.MainThread.abcd")
    marks = Watermarks()
    assert marks.start("own", own) <= own  # nothing published here: start at 0
    marks._note("own", T + WINDOW_US, 70)  # published above our ticket
    assert marks.published("own") == T + WINDOW_US
    assert marks.start("own", own) <= own
    assert marks.start("own") > own  # without a ticket of ours: the watermark


def test_a_publication_read_from_the_row_counts_as_the_last_one_for_when_the_next_is_due() -> None:
    """A holder publishes only every EVERY_GRANTS grants: the fencing token of the last publication,
    as the row's head says (``time|token|attempt``), counts even when another process published it."""
    from lockclient.watermark import EVERY_GRANTS, HEAD

    marks = Watermarks()
    marks.observe("head", {HEAD: f"{T}|5000|a1"})
    far_ahead = make_ticket(T + 10 * WINDOW_US, "holder")
    assert not marks.due("head", far_ahead, token=5000 + EVERY_GRANTS - 1)
    assert marks.due("head", far_ahead, token=5000 + EVERY_GRANTS)
