"""Client-side Prometheus metrics, in the process's default registry (the library convention:
the application exposes them with its own /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = [
    "ACQUIRE_SECONDS",
    "ELECTIONS",
    "LOCKS_LOST",
    "ONCE_PER_RUNS",
    "PRIMITIVE_ACQUIRE_SECONDS",
    "RENEWALS",
    "STORE_OPS",
    "STORE_OPS_PER_ACQUISITION",
    "WATCH_EVENTS",
    "count_store_op",
]

ACQUIRE_SECONDS = Histogram(
    "chronolock_client_acquire_seconds",
    "time from get_lock/try_get_lock call to outcome",
    ["algorithm", "outcome"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
STORE_OPS = Counter("chronolock_client_store_ops", "store operations issued by the lock client", ["op"])
_STORE_OP_COUNTERS: dict[str, Counter] = {}


def count_store_op(op: str) -> None:
    """``STORE_OPS.labels(op).inc()``, with the labelled child looked up once per name (every
    store call of every acquisition passes here)."""
    child = _STORE_OP_COUNTERS.get(op)
    if child is None:
        child = _STORE_OP_COUNTERS[op] = STORE_OPS.labels(op)
    child.inc()


STORE_OPS_PER_ACQUISITION = Histogram(
    "chronolock_client_store_ops_per_acquisition",
    "store operations one acquisition attempt needed (the thesis' polling-load complaint)",
    ["algorithm", "outcome"],
    buckets=(4, 6, 8, 10, 15, 20, 30, 50, 75, 100, 200, 500, 1000),
)
RENEWALS = Counter("chronolock_client_lease_renewals", "lease renewals by outcome", ["outcome"])
LOCKS_LOST = Counter("chronolock_client_locks_lost", "leases lost (revoked or not renewed in time)")
PRIMITIVE_ACQUIRE_SECONDS = Histogram(
    "chronolock_client_primitive_acquire_seconds",
    "time from a semaphore / read lock / write lock request to its outcome",
    ["primitive", "outcome"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ELECTIONS = Counter(
    "chronolock_client_elections",
    "leadership events of this process's candidates: elected, lost (revoked or expired), resigned",
    ["event"],
)
ONCE_PER_RUNS = Counter(
    "chronolock_client_once_per_runs",
    "once-per-period jobs (lockctl run --once-per): ran, or skipped (ran elsewhere this period, or running)",
    ["outcome"],
)
WATCH_EVENTS = Counter(
    "chronolock_client_watch_events",
    "events yielded by RemoteLocker.watch, by kind (behind: a gap the watcher was told about)",
    ["kind"],
)
