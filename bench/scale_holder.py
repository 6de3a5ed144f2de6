"""One holder process for ``bench/scale.py``: takes many locks with one ``RemoteLocker`` and keeps them.

``python -m bench.scale_holder --store URL --prefix P --count N --lease S --status FILE
[--timesvc URL] [--threads T] [--victim]``

Global time comes from the store on the embedded store (one machine) and from timesvc
(``--timesvc``) on a networked store, as users deploy it. ``--threads`` acquisitions run at
once (each its own lock id; the locks are still held by one ``RemoteLocker``, one keeper):
on a networked store one acquisition is a few round trips, and 100,000 of them one after the
other would take longer than the measurement.

Writes JSON lines to FILE (one write + flush each):

* ``{"event": "progress", "held": n}`` every 1,000 locks, then ``{"event": "held", "held": N,
  "seconds": ...}`` once all are held;
* ``{"event": "alive", "lost": k, "held": N, "requests": r, "ops": {...}, "renewals": {...}}``
  every second: ``lost`` counts ``lock.lost`` callbacks (a live holder revoked, or a renewal
  that failed for a whole lease); ``requests`` the store requests this process made so far
  (:class:`~lockclient.store.counting.CountingStore`: acquisitions, renewals, clock);
  ``renewals`` the successful renewals so far and their *lateness* — when the renewal started
  minus when it was due (the previous successful renewal's start + lease / 3; the keeper
  batches renewals due within 50 ms, so a little early is normal): count, p50, p99, max, and
  the smallest validity left when a renewal started (lease − time since the previous one);
* with ``--victim``: ``{"event": "renewed", "started_ns": ..., "done_ns": ...}`` for every
  successful renewal (CLOCK_MONOTONIC, system-wide: the benchmark compares it with its own).

SIGUSR1 while it is taking its locks: take no more, report ``held`` with what it holds (the
acquisitions in flight finish). The process holds until it is signalled; SIGTERM exits without releasing (the store is a
temporary file, or a keyspace the benchmark drops), SIGKILL is how a victim dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

from lockclient import RemoteLocker, open_store
from lockclient.clock import TimeServiceClock
from lockclient.errors import ChronolockError
from lockclient.lease import HeldLease, HolderRecord
from lockclient.store.counting import CountingStore

ATTEMPTS = 5
"""Tries per lock id while taking the locks (each with the library's own retries inside)."""


class _Report:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at_ns": time.monotonic_ns(), **fields}) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()


class _Lateness:
    """Every successful renewal's lateness (start − due) and the validity it had left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.late: list[float] = []
        self.least_left: float | None = None

    def add(self, late: float, left: float) -> None:
        with self._lock:
            self.late.append(late)
            self.least_left = left if self.least_left is None else min(self.least_left, left)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            ordered = sorted(self.late)
            least_left = self.least_left
        if not ordered:
            return {"count": 0}

        def pick(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

        return {
            "count": len(ordered),
            "p50_s": pick(0.5),
            "p99_s": pick(0.99),
            "max_s": round(ordered[-1], 4),
            "least_left_s": None if least_left is None else round(least_left, 3),
        }


def _record_renewals(report: _Report | None, lateness: _Lateness) -> None:
    """Every successful renewal of this process: its lateness, and for a victim its start and
    completion (the victim's clock). ``HeldLease._adopt`` is where a renewal that applied is
    taken on, dated from the attempt's start."""
    adopt = HeldLease._adopt

    def recorded(self: HeldLease, record: HolderRecord, started: float, value: str | None = None) -> None:
        previous = self.renewed_at
        adopt(self, record, started, value)
        if started > previous:  # a renewal (the grant itself is not adopted here)
            lateness.add(started - (previous + self.lease / 3), self.lease - (started - previous))
            if report is not None:
                report("renewed", started_ns=int(started * 1e9), done_ns=time.monotonic_ns())

    HeldLease._adopt = recorded  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--timesvc", default=None, help="timesvc base URL (global time; default: from the store)")
    parser.add_argument("--threads", type=int, default=1, help="acquisitions at once while taking the locks")
    parser.add_argument("--victim", action="store_true", help="record every successful renewal")
    args = parser.parse_args(argv)

    report = _Report(args.status)
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    enough = threading.Event()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        enough.set()  # take no more locks: hold what is held (the benchmark's setup deadline)

    signal.signal(signal.SIGUSR1, on_usr1)
    lateness = _Lateness()
    _record_renewals(report if args.victim else None, lateness)
    lost = 0
    lost_lock = threading.Lock()

    def on_lost(reason: str) -> None:
        nonlocal lost
        with lost_lock:
            lost += 1

    inner = open_store(args.store)
    store = CountingStore(inner)  # every request of this process: acquisitions, renewals, clock
    clock = TimeServiceClock(args.timesvc) if args.timesvc else None  # else from the store: one machine
    # Never released at exit: thousands of releases through a loaded store would keep a failed
    # holder alive for minutes; the benchmark drops the store (a temporary file or keyspace).
    locker = RemoteLocker(store, clock, lease=args.lease, release_at_exit=False)
    started = time.monotonic()
    held: list[Any] = []
    held_lock = threading.Lock()

    errors: list[str] = []
    failed: list[str] = []

    def take(i: int) -> None:
        for attempt in range(ATTEMPTS):
            if stop.is_set() or enough.is_set():
                return
            try:
                lock = locker.get_lock(f"{args.prefix}{i:06d}", timeout=120)
                break
            except ChronolockError as exc:  # a loaded ring times out now and then: counted, tried again
                with held_lock:
                    errors.append(repr(exc))
                    if attempt == ATTEMPTS - 1:
                        # Given up on this id (reported): one id must not end a process holding
                        # thousands (seen on the ring: one id per process timed out 5 times).
                        failed.append(f"{args.prefix}{i:06d}")
                        return
                stop.wait(1.0)
        else:
            return
        lock.on_lost(on_lost)
        with held_lock:
            held.append(lock)
            if len(held) % 1000 == 0:
                report("progress", held=len(held))

    with ThreadPoolExecutor(max(1, args.threads), thread_name_prefix="take") as pool:
        for future in [pool.submit(take, i) for i in range(args.count)]:
            future.result()
    if stop.is_set():
        return 0
    report(
        "held",
        held=len(held),
        seconds=round(time.monotonic() - started, 2),
        pid=os.getpid(),
        acquire_errors=len(errors),
        first_errors=errors[:5],
        failed=failed,
    )
    while not stop.wait(1.0):
        with lost_lock:
            lost_now = lost
        try:
            ops = dict(store.counts.ops)
        except RuntimeError:  # a new op name counted meanwhile (another thread): next second
            continue
        report(
            "alive", lost=lost_now, held=len(held), requests=store.counts.requests, ops=ops, renewals=lateness.summary()
        )
    # SIGTERM: leave without releasing (thousands of releases would only slow the teardown down).
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
