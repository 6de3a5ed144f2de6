"""The pure helpers of bench/peers.py (no processes, no timing)."""

from __future__ import annotations

from typing import Any

from bench.peers import ticket_overtakes


def grant(acquired: float, ticket: int | None, enqueued_at: float | None = None, looked_at: float | None = None) -> Any:
    """One grant as bench.peers.analyse builds it: acquired first; ticket, enqueued-at, looked-at last."""
    return (acquired, 0.0, 0.0, 0, 0.0, 0, (), (), ticket, enqueued_at, looked_at)


def test_grants_in_ticket_order_overtake_nobody() -> None:
    grants = [grant(1.0, 10, 0.5, 0.9), grant(2.0, 20, 0.6, 1.9), grant(3.0, 30, 0.7, 2.9)]
    assert ticket_overtakes(grants) == {
        "grants_overtaken": 0,
        "overtakers_max": 0,
        "overtake_ticket_gap_max_ms": 0.0,
        "fifo_violations": 0,
    }


def test_an_overtake_is_a_fifo_violation_only_if_the_overtaker_looked_after_the_cell_was_written() -> None:
    grants = [
        # 9,000 µs decided at 1.0 s, before the cells of 7,000 (1.1 s) and 5,000 (1.5 s) were
        # written: no violation.
        grant(1.2, 9_000, 0.1, 1.0),
        # 7,000 µs decided at 1.8 s, after the cell of 5,000 was written: a violation.
        grant(2.0, 7_000, 1.1, 1.8),
        grant(3.0, 5_000, 1.5, 2.9),
        grant(4.0, 10_000, 3.5, 3.9),
    ]
    result = ticket_overtakes(grants)
    assert result == {
        "grants_overtaken": 2,  # 7,000 (by 9,000) and 5,000 (by both)
        "overtakers_max": 2,
        "overtake_ticket_gap_max_ms": 4.0,
        "fifo_violations": 1,
    }


def test_locks_without_tickets_are_not_judged() -> None:
    assert ticket_overtakes([grant(1.0, 1), grant(2.0, None)])["grants_overtaken"] is None
    assert ticket_overtakes([])["fifo_violations"] is None
