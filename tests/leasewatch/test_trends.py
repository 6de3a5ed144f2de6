"""leasewatch.trends: samples cut from counters, exact quantiles, a bounded ring and reservoir."""

from __future__ import annotations

import random

import pytest

from leasewatch.trends import Trends, quantile, window


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_sample_counts_its_interval_and_starts_the_next() -> None:
    clock = Clock()
    trends = Trends(wall=lambda: 1_700_000_000.0, monotonic=clock)
    for wait in (0.1, 0.2, 0.3, 0.4, None):
        trends.grant(wait)
    trends.revocation()
    trends.store_error()
    trends.store_error()
    clock.t += 5
    first = trends.sample(longest_wait_s=2.5, locks=7, now_per_s=12.0, clock_offsets_s={"a": -0.001})
    assert (first.grants, first.revocations, first.store_errors) == (5, 1, 2)
    assert first.seconds == 5 and first.grants_per_s == 1.0
    assert (first.wait_p50_s, first.wait_p99_s) == (0.2, 0.4)  # nearest rank over the 4 known waits
    assert first.longest_wait_s == 2.5 and first.locks == 7 and first.now_per_s == 12.0
    assert first.clock_offsets_s == {"a": -0.001}
    clock.t += 5
    second = trends.sample()
    assert (second.grants, second.revocations, second.store_errors) == (0, 0, 0)
    assert second.wait_p50_s is None and second.wait_p99_s is None and second.now_per_s is None
    assert trends.samples() == [first, second] and trends.samples(1) == [second]


def test_the_ring_keeps_the_newest_samples_only() -> None:
    clock = Clock()
    trends = Trends(size=3, monotonic=clock)
    for n in range(5):
        for _ in range(n):
            trends.grant(None)
        clock.t += 1
        trends.sample()
    assert [s.grants for s in trends.samples()] == [2, 3, 4]
    summary = window(trends.samples())
    assert summary.grants == 9 and summary.samples == 3 and summary.max_grants_per_s == 4.0
    assert summary.max_wait_p99_s is None and summary.max_now_per_s is None


def test_beyond_the_reservoir_waits_are_a_uniform_sample() -> None:
    clock = Clock()
    trends = Trends(reservoir=100, monotonic=clock, rng=random.Random(7))
    for i in range(10_000):
        trends.grant(i / 10_000)  # uniform on [0, 1)
    clock.t += 1
    sample = trends.sample()
    assert sample.grants == 10_000
    assert sample.wait_p50_s == pytest.approx(0.5, abs=0.15)
    assert sample.wait_p99_s is not None and sample.wait_p99_s > 0.85


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 0.5, None), ([3.0], 0.99, 3.0), ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0), ([1.0, 2.0], 0.99, 2.0)],
)
def test_quantile_is_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert quantile(values, q) == expected


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Trends(size=0)
