"""One candidate of bench/election.py: ``python -m bench.election_candidate chronolock|kazoo PARAMS OUT``.

It stands for election ``PARAMS["name"]`` and, when elected, appends ``{"what": "elected", "pid", "at"
(CLOCK_MONOTONIC ns), "term"}`` to OUT, then leads until it is killed (or, for chronolock, until it
loses the term: then it stands again)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _note(out: Path, **fields: object) -> None:
    with out.open("a") as f:
        f.write(json.dumps({"pid": os.getpid(), "at": time.monotonic_ns(), **fields}) + "\n")


def chronolock(params: dict[str, Any], out: Path) -> None:
    from lockclient import RemoteLocker, TimeServiceClock, open_store
    from lockclient.election import Leadership
    from lockclient.errors import LockLost
    from lockclient.wake import LeasewatchWaker

    locker = RemoteLocker(
        open_store(params["store_url"]),
        TimeServiceClock(params["timesvc_urls"]),
        lease=float(params["lease"]),
        waker=LeasewatchWaker(params["leasewatch_url"]),
        owns_store=True,
    )
    election = locker.election(params["name"])

    def lead(leadership: Leadership) -> None:
        _note(out, what="elected", term=leadership.term)
        leadership.lost.wait()

    while True:
        try:
            election.run(lead)
        except LockLost:
            continue


def kazoo(params: dict[str, Any], out: Path) -> None:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=params["hosts"], timeout=float(params["timeout"]))
    client.start(timeout=30)
    election = client.Election(f"/bench/{params['name']}", identifier=str(os.getpid()))

    def lead() -> None:
        _note(out, what="elected", term=None)
        threading.Event().wait()

    election.run(lead)


def main() -> None:
    system, params, out = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    {"chronolock": chronolock, "kazoo": kazoo}[system](params, out)


if __name__ == "__main__":
    main()
