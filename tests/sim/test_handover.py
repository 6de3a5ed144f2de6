"""Issue 27's one-round hand-over in the simulator: releases of holders that waited hand the lock to
the first in line in their compare-and-set, the checkers judge each such hand-over (the holder's
end and the next grant; FIFO by the releaser's read of the queue's head), and a quiet run counts
them. The fresh random searches of tests/sim/test_search.py judge them under every fault."""

from __future__ import annotations

from sim.search import run_seed


def test_a_quiet_run_hands_contended_locks_over_in_one_round_and_is_clean() -> None:
    outcome, sim = run_seed(7, "quiet")
    assert not outcome.violations, "\n".join(outcome.violations[:10])
    assert outcome.handovers > 0, "no release handed the lock over"
    assert outcome.handovers == sim.stats.handovers
    # Every hand-over is also a grant the fencing checker saw: never more of them than grants.
    assert outcome.handovers <= sum(len(grants) for grants in sim.checkers._grants.values())
