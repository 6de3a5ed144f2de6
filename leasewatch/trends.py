"""Trends: the last hour of what one leasewatch replica saw, in memory, for the page's sparklines.

Prometheus keeps history for those who run it (the Grafana dashboard draws the same
quantities from ``/metrics``); the page must answer "is it getting worse?" without one. So
every ``LEASEWATCH_TREND_INTERVAL`` (5 s) a :class:`TrendSample` is cut from what happened
since the previous one, and the last :data:`TREND_SAMPLES` (720: an hour at 5 s) are kept —
a fixed ring, a few hundred bytes a sample, whatever the number of locks.

A sample holds counts *over its interval* (grants seen, revocations, store errors), the
waits of the grants seen in it (p50 and p99, exact over up to :data:`WAIT_RESERVOIR` waits,
a uniform random sample of them beyond), and levels *at its end* (the longest current wait,
the locks listed by the last scan, each timesvc replica's clock offset to GlobalTime and the
replicas' ``/now`` rate from :mod:`leasewatch.timeview`).

Grants and waits have the meaning :mod:`leasewatch.observed` gives them: what this replica
saw, in the partitions it watches — with several replicas, each has its own share.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["TREND_SAMPLES", "WAIT_RESERVOIR", "TrendSample", "TrendWindow", "Trends", "quantile", "window"]

TREND_SAMPLES = 720
WAIT_RESERVOIR = 4096


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-quantile of ``values`` (sorted in place); None when empty."""
    if not values:
        return None
    values.sort()
    return values[max(0, math.ceil(q * len(values)) - 1)]


@dataclass(frozen=True)
class TrendSample:
    at: datetime
    """Wall time at the end of the interval."""
    seconds: float
    """The interval's length (monotonic)."""
    grants: int
    grants_per_s: float
    wait_p50_s: float | None
    """Of the grants seen in the interval (None: no grant had a readable ticket)."""
    wait_p99_s: float | None
    revocations: int
    store_errors: int
    longest_wait_s: float
    """The longest wait of a queued waiter at the end of the interval."""
    locks: int | None
    """Lock ids with live state in the last scan (None: no scan yet)."""
    now_per_s: float | None
    """timesvc ``/now`` answers per second, summed over the replicas that answered (None: none)."""
    clock_offsets_s: dict[str, float]
    """Each timesvc replica's wall clock minus GlobalTime (replica id, or #position when unnamed)."""


@dataclass(frozen=True)
class TrendWindow:
    """Totals and peaks over a run of samples (what the page prints beside each sparkline)."""

    samples: int
    grants: int
    revocations: int
    store_errors: int
    max_grants_per_s: float | None
    max_wait_p99_s: float | None
    max_longest_wait_s: float | None
    max_now_per_s: float | None


def window(samples: list[TrendSample]) -> TrendWindow:
    def peak(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    return TrendWindow(
        samples=len(samples),
        grants=sum(s.grants for s in samples),
        revocations=sum(s.revocations for s in samples),
        store_errors=sum(s.store_errors for s in samples),
        max_grants_per_s=peak([s.grants_per_s for s in samples]),
        max_wait_p99_s=peak([s.wait_p99_s for s in samples]),
        max_longest_wait_s=peak([s.longest_wait_s for s in samples]),
        max_now_per_s=peak([s.now_per_s for s in samples]),
    )


class Trends:
    """The ring of samples and the counters of the interval in progress. Thread-safe: grants
    and revocations arrive from scan threads, samples are cut on the event loop."""

    def __init__(
        self,
        *,
        size: int = TREND_SAMPLES,
        reservoir: int = WAIT_RESERVOIR,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if size <= 0 or reservoir <= 0:
            raise ValueError("size and reservoir must be positive")
        self._wall = wall
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._reservoir = reservoir
        self._lock = threading.Lock()
        self._samples: deque[TrendSample] = deque(maxlen=size)
        self._started = monotonic()
        self._grants = 0
        self._waits: list[float] = []
        self._waits_seen = 0
        self._revocations = 0
        self._errors = 0

    @property
    def size(self) -> int:
        return self._samples.maxlen or 0

    def grant(self, wait_s: float | None) -> None:
        with self._lock:
            self._grants += 1
            if wait_s is None:
                return
            self._waits_seen += 1
            if len(self._waits) < self._reservoir:
                self._waits.append(wait_s)
            else:  # Algorithm R: every wait of the interval is kept with the same probability
                slot = self._rng.randrange(self._waits_seen)
                if slot < self._reservoir:
                    self._waits[slot] = wait_s

    def revocation(self) -> None:
        with self._lock:
            self._revocations += 1

    def store_error(self) -> None:
        with self._lock:
            self._errors += 1

    def sample(
        self,
        *,
        longest_wait_s: float = 0.0,
        locks: int | None = None,
        now_per_s: float | None = None,
        clock_offsets_s: dict[str, float] | None = None,
    ) -> TrendSample:
        """Close the interval in progress: append its sample and start the next."""
        with self._lock:
            now = self._monotonic()
            seconds = max(now - self._started, 1e-9)
            waits = self._waits
            p50, p99 = quantile(waits, 0.5), quantile(waits, 0.99)
            sample = TrendSample(
                at=datetime.fromtimestamp(self._wall(), UTC),
                seconds=round(seconds, 3),
                grants=self._grants,
                grants_per_s=round(self._grants / seconds, 3),
                wait_p50_s=None if p50 is None else round(p50, 3),
                wait_p99_s=None if p99 is None else round(p99, 3),
                revocations=self._revocations,
                store_errors=self._errors,
                longest_wait_s=round(longest_wait_s, 3),
                locks=locks,
                now_per_s=None if now_per_s is None else round(now_per_s, 3),
                clock_offsets_s=dict(clock_offsets_s or {}),
            )
            self._samples.append(sample)
            self._started = now
            self._grants = self._waits_seen = self._revocations = self._errors = 0
            self._waits = []
            return sample

    def samples(self, limit: int | None = None) -> list[TrendSample]:
        """Oldest first; ``limit``: only the newest that many."""
        with self._lock:
            found = list(self._samples)
        return found if limit is None else found[-limit:] if limit > 0 else []
