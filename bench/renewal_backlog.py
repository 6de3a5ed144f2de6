"""How late one process renews N leases when each renewal round trip is slow (issue 27, scale).

``python -m bench.renewal_backlog [--locks N] [--lease S] [--delay S] [--seconds S]``

One ``RemoteLocker`` on a fresh SQLite store whose renewal batches
(:meth:`CellStore.compare_and_set_many`, what the keeper renews with) each take ``--delay``
seconds more, whatever their size — a loaded Cassandra ring, where one batch is one round trip
of Paxos rounds in flight together. The locks are taken spread over one renewal interval (as a
long setup on the ring spreads them), then held for ``--seconds``; every successful renewal's
lateness (start − due, due = the previous renewal's start + lease / 3) is recorded as in
``bench/scale_holder.py``. Prints one JSON line: the lateness summary, the batches the keeper
sent (count, mean and largest size) and the leases lost.

The 10,000-lock holder on the ring renewed up to 48 s late with the keeper of bf3dbe7 (a renewal
due while every worker was busy waited in the pool as a batch of its own); run this with
``PYTHONPATH`` pointing at an older ``lockclient`` to compare (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.scale_holder import _Lateness, _record_renewals
from lockclient import RemoteLocker, open_store
from lockclient.errors import StoreError
from lockclient.store.base import CasResult, CompareAndSet
from lockclient.store.counting import CountingStore


class _SlowBatches(CountingStore):
    """Every renewal batch takes ``delay`` seconds more (one slow round trip, whatever its size)."""

    def __init__(self, store: object, delay: float) -> None:
        super().__init__(store)  # type: ignore[arg-type]  # (no client_metrics=False: older lockclients lack it)
        self.delay = delay
        self.batches: list[int] = []

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        self.batches.append(len(ops))
        time.sleep(self.delay)
        return super().compare_and_set_many(ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locks", type=int, default=1500)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds each renewal batch takes more")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the locks are held after taking")
    args = parser.parse_args(argv)

    lateness = _Lateness()
    _record_renewals(None, lateness)
    tmp = tempfile.mkdtemp(prefix="chronolock-backlog-")
    try:
        inner = open_store(f"sqlite:///{Path(tmp) / 'cells.db'}")
        store = _SlowBatches(inner, args.delay)
        locker = RemoteLocker(store, lease=args.lease)
        started = time.monotonic()
        locks = []
        for i in range(args.locks):
            locks.append(locker.get_lock(f"backlog-{i:06d}", timeout=60))
            # Spread over one renewal interval, so that renewals come due at a steady rate.
            time.sleep(max(0.0, (args.lease / 3) * (i + 1) / args.locks - (time.monotonic() - started)))
        time.sleep(args.seconds)
        batches = list(store.batches)
        result = {
            "locks": args.locks,
            "lease_s": args.lease,
            "delay_s": args.delay,
            "held_s": args.seconds,
            "renewals": lateness.summary(),
            "batches": len(batches),
            "batch_mean": round(sum(batches) / len(batches), 1) if batches else 0,
            "batch_max": max(batches, default=0),
            "lost": sum(1 for lock in locks if lock.lost.is_set()),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
        print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Leave without releasing (the store is gone): closing the locker would release every lock
    # through the slow store first.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
