"""Seeds that found a bug (or a checker's mistake) in a fresh search, replayed on today's code:
each must be clean. The seeds' histories change whenever the code does, so this is a floor, not
the proof — the proof is the fresh searches of tests/sim/test_search.py and
test_primitives_search.py, which found them."""

from __future__ import annotations

import pytest

from sim.search import run_seed

SEEDS = [
    # CI, stop 28: the keeper spun on a batched renewal its release held (a livelock).
    (1472820187, "mixed"),
    (1472820247, "mixed"),
    # CI, stop 28: a dead holder judged against the plain bound right after leasewatch restarted.
    (1472820382, "mixed"),
    # A lock whose scan read failed once fell off leasewatch's time wheel for good.
    (634799923, "primitives"),
    # A speculative grant kept on a look sent after its own overlapped look went unanswered: FIFO.
    (1343306215, "primitives"),
    # A dead leader judged from its last renewal though both leasewatch replicas had just been
    # disturbed (a take-over watches afresh).
    (1343306433, "primitives"),
    # A watch reported `lost` from a slow read's completion: the holder renewed while it ran.
    (1424017622, "primitives"),
    # A dead holder revoked 3.2 s beyond its bound: another client's index entry, stamped 7.2 s ahead
    # of global time after a pause during a /now round trip, won last-write-wins against every
    # enqueue for 7 s, so leasewatch kept the busy lock on its idle schedule (orphan_after / 4).
    (1676192381, "primitives"),
    # CI, stop 29: a fresh lock id's index write failed while its queue cell and a speculative grant
    # landed; the process died, and leasewatch, which finds locks by their index entries, never
    # saw the holder (every acquisition now writes the index entry first).
    (1892896576, "mixed"),
    # A dead leader judged from the end of a lossy window though leasewatch's scan was still waiting
    # for a read whose answer the window lost: it timed out 1.8 s later (the driver's 2 s request
    # timeout), and the leader's last renewal, made meanwhile, was first seen 1.6 s after it. The
    # checker's mistake: leasewatch recovers from a network fault when its last request is settled.
    (20261476, "primitives"),
    # CI, stop 30 (the [abandoned] checker): a read lock's grant applied with its answer lost, and
    # another reader's grant moved the shared fencing counter before the SERIAL re-read; the grant
    # read its own record as another holder's, timed out and left it to leasewatch.
    (20261561, "primitives"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "profile"), SEEDS)
def test_a_seed_that_found_a_bug_is_clean(seed: int, profile: str) -> None:
    outcome, _ = run_seed(seed, profile)
    assert not outcome.violations, "\n".join(outcome.violations[:10])
