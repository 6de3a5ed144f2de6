"""Client-side Prometheus metrics, in the process's default registry (the library convention:
the application exposes them with its own /metrics).

Created on first use, not at import: ``import lockclient`` does not import prometheus_client
(~30 ms, most of it its HTTP exposition: http.server, email, ssl). A process that can expose no
metrics at all — ``lockctl`` — calls :func:`record_nothing` and never imports it (issue 25:
``lockctl run -- true`` start-up).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    "record_nothing",
]

ACQUIRE_SECONDS: Histogram
STORE_OPS: Counter
STORE_OPS_PER_ACQUISITION: Histogram
RENEWALS: Counter
LOCKS_LOST: Counter
PRIMITIVE_ACQUIRE_SECONDS: Histogram
ELECTIONS: Counter
ONCE_PER_RUNS: Counter
WATCH_EVENTS: Counter

_NAMES = (
    "ACQUIRE_SECONDS",
    "ELECTIONS",
    "LOCKS_LOST",
    "ONCE_PER_RUNS",
    "PRIMITIVE_ACQUIRE_SECONDS",
    "RENEWALS",
    "STORE_OPS",
    "STORE_OPS_PER_ACQUISITION",
    "WATCH_EVENTS",
)

_lock = threading.Lock()
_made: dict[str, Any] = {}
_STORE_OP_COUNTERS: dict[str, Any] = {}


class _Nothing:
    """What a metric is in a process that records none: every call accepted, nothing kept."""

    def labels(self, *values: str) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


def record_nothing() -> None:
    """Record no client metrics in this process (it exposes none); call before the first lock."""
    with _lock:
        if not _made:
            _made.update(dict.fromkeys(_NAMES, _Nothing()))


def _make() -> dict[str, Any]:
    with _lock:
        if not _made:
            from prometheus_client import Counter, Histogram

            _made["ACQUIRE_SECONDS"] = Histogram(
                "chronolock_client_acquire_seconds",
                "time from get_lock/try_get_lock call to outcome",
                ["algorithm", "outcome"],
                buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            )
            _made["STORE_OPS"] = Counter(
                "chronolock_client_store_ops", "store operations issued by the lock client", ["op"]
            )
            _made["STORE_OPS_PER_ACQUISITION"] = Histogram(
                "chronolock_client_store_ops_per_acquisition",
                "store operations one acquisition attempt needed (the thesis' polling-load complaint)",
                ["algorithm", "outcome"],
                buckets=(4, 6, 8, 10, 15, 20, 30, 50, 75, 100, 200, 500, 1000),
            )
            _made["RENEWALS"] = Counter("chronolock_client_lease_renewals", "lease renewals by outcome", ["outcome"])
            _made["LOCKS_LOST"] = Counter(
                "chronolock_client_locks_lost", "leases lost (revoked or not renewed in time)"
            )
            _made["PRIMITIVE_ACQUIRE_SECONDS"] = Histogram(
                "chronolock_client_primitive_acquire_seconds",
                "time from a semaphore / read lock / write lock request to its outcome",
                ["primitive", "outcome"],
                buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            )
            _made["ELECTIONS"] = Counter(
                "chronolock_client_elections",
                "leadership events of this process's candidates: elected, lost (revoked or expired), resigned",
                ["event"],
            )
            _made["ONCE_PER_RUNS"] = Counter(
                "chronolock_client_once_per_runs",
                "once-per-period jobs (lockctl run --once-per): ran, or skipped (ran elsewhere this period or running)",
                ["outcome"],
            )
            _made["WATCH_EVENTS"] = Counter(
                "chronolock_client_watch_events",
                "events yielded by RemoteLocker.watch, by kind (behind: a gap the watcher was told about)",
                ["kind"],
            )
        return _made


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return _make()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def count_store_op(op: str) -> None:
    """``STORE_OPS.labels(op).inc()``, with the labelled child looked up once per name (every
    store call of every acquisition passes here)."""
    child = _STORE_OP_COUNTERS.get(op)
    if child is None:
        child = _STORE_OP_COUNTERS[op] = _make()["STORE_OPS"].labels(op)
    child.inc()
