"""One holder process for ``bench/scale.py``: takes many locks with one ``RemoteLocker`` and keeps them.

``python -m bench.scale_holder --store URL --prefix P --count N --lease S --status FILE [--victim]``

Writes JSON lines to FILE (one write + flush each):

* ``{"event": "progress", "held": n}`` every 1,000 locks, then ``{"event": "held", "held": N,
  "seconds": ...}`` once all are held;
* ``{"event": "alive", "lost": k, "held": N}`` every second: ``lost`` counts ``lock.lost``
  callbacks (a live holder revoked, or a renewal that failed for a whole lease);
* with ``--victim``: ``{"event": "renewed", "started_ns": ..., "done_ns": ...}`` for every
  successful renewal (CLOCK_MONOTONIC, system-wide: the benchmark compares it with its own).

The process holds until it is signalled; SIGTERM exits without releasing (the store is a
temporary file), SIGKILL is how a victim dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from lockclient import RemoteLocker, open_store
from lockclient.lease import HeldLease


class _Report:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at_ns": time.monotonic_ns(), **fields}) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()


def _record_renewals(report: _Report) -> None:
    """Every successful renewal of this process, start and completion (the victim's clock)."""
    adopt = HeldLease._adopt

    def recorded(self: HeldLease, record: Any, value: str, started: float) -> None:
        adopt(self, record, value, started)
        report("renewed", started_ns=int(started * 1e9), done_ns=time.monotonic_ns())

    HeldLease._adopt = recorded  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--victim", action="store_true", help="record every successful renewal")
    args = parser.parse_args(argv)

    report = _Report(args.status)
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    if args.victim:
        _record_renewals(report)
    lost = 0
    lost_lock = threading.Lock()

    def on_lost(reason: str) -> None:
        nonlocal lost
        with lost_lock:
            lost += 1

    store = open_store(args.store)
    locker = RemoteLocker(store, lease=args.lease)  # global time from the store: one machine
    started = time.monotonic()
    held = []
    for i in range(args.count):
        if stop.is_set():
            return 0
        lock = locker.get_lock(f"{args.prefix}{i:06d}", timeout=60)
        lock.on_lost(on_lost)
        held.append(lock)
        if (i + 1) % 1000 == 0:
            report("progress", held=i + 1)
    report("held", held=len(held), seconds=round(time.monotonic() - started, 2), pid=os.getpid())
    while not stop.wait(1.0):
        with lost_lock:
            report("alive", lost=lost, held=len(held))
    # SIGTERM: leave without releasing (thousands of releases would only slow the teardown down).
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
