"""One lock holder for ``bench/clockfaults.py``: takes one lock and holds it until killed.

``python -m bench.clockfaults_holder --store URL --lock ID --lease S --status FILE``

Global time straight from the (embedded) store; the lease is renewed every ``lease / 3``. Writes
one JSON line to FILE once it holds the lock: ``{"event": "held", "owner": ..., "at_ns": ...}``
(CLOCK_MONOTONIC, system-wide: the benchmark compares it with its own). SIGKILL is how it dies.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from lockclient import RemoteLocker, open_store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--status", required=True)
    args = parser.parse_args(argv)
    locker = RemoteLocker(open_store(args.store), lease=args.lease, owns_store=True)
    lock = locker.get_lock(args.lock, timeout=60)
    with open(args.status, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "held", "owner": lock.owner, "at_ns": time.monotonic_ns()}) + "\n")
        f.flush()
    threading.Event().wait()  # until SIGKILL
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
