"""A long horizon (issue 22, "long horizons — a simulated hour or more — in the deterministic
simulator"): one seed of the ``clocks`` profile simulated for an hour — three timesvc replicas whose
clocks step by up to ±600 s, run at 0.5× to 10×, stop, or restart misconfigured with
``TIMESVC_REPLICAS=1`` and +600 s (one replica at a time), client and leasewatch clocks doing the
same, and pauses and crashes everywhere, about 700 faults — judged by every checker: `/now`
monotonic and never more than ``max_skew`` ahead of real time, fencing, lease exclusion at every
grant, FIFO, revocation within its bound, nothing stuck.

The seed is fixed (a schedule known to exercise every clock fault kind in the hour); the fresh
seeds are ``tests/sim/test_search.py``'s, and ``SIM_SEED=<s> SIM_PROFILE=clocks SIM_DURATION=3600
make sim`` runs any other. Simulated acquisitions per CPU-second are reported (BENCHMARKS.md), not
asserted."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.search import PROFILES, config_for_seed, run_seed

SEED = 424244
HOUR = 3600.0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_hour_of_clock_faults_breaks_no_promise() -> None:
    config = config_for_seed(SEED, PROFILES["clocks"])
    assert config.timesvc >= 3, "the seed must deploy three timesvc replicas for their clocks to fail"
    outcome, _ = run_seed(SEED, "clocks", duration=HOUR)
    kinds = Counter(
        event["params"].get("kind", event["family"]) if event["family"] == "clock" else event["family"]
        for event in outcome.schedule
    )
    print(
        f"seed {SEED}: {outcome.virtual_s:.0f} simulated seconds, {outcome.acquisitions} acquisitions, "
        f"{len(outcome.schedule)} faults {dict(sorted(kinds.items()))}, {outcome.cpu_s:.1f} CPU-seconds "
        f"({outcome.acquisitions / max(outcome.cpu_s, 1e-9):.0f} acquisitions per CPU-second)"
    )
    assert {"step", "rate", "stop", "misconfigured"} <= set(kinds), kinds
    assert outcome.acquisitions > 1000
    assert not outcome.violations, "\n".join(outcome.violations[:20])
