"""A candidate process for the election tests (spawned: top-level functions only).

It stands for election ``name`` again and again; as leader it writes its term to a fenced resource
every 20 ms — the write first, then a look at ``leadership.lost``, so that a leader resumed after a
pause sends one write as a deposed leader would. Every step is a JSON line (CLOCK_MONOTONIC ns,
comparable across processes) in ``out``."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from lockclient import FencedResource, RemoteLocker, StaleFencingToken, open_store
from lockclient.election import Leadership


def candidate(store_url: str, name: str, out: str, lease: float) -> None:
    locker = RemoteLocker(open_store(store_url), lease=lease, allow_store_clock=True, owns_store=True)
    resource = FencedResource(locker.store, f"resource:{name}")
    pid = os.getpid()
    path = Path(out)

    def note(what: str, **fields: object) -> None:
        with path.open("a") as f:
            f.write(json.dumps({"pid": pid, "what": what, "at": time.monotonic_ns(), **fields}) + "\n")

    def lead(leadership: Leadership) -> None:
        note("elected", term=leadership.term, owner=leadership.owner, since_us=leadership.since_us)
        pause = threading.Event()
        while True:
            try:
                resource.write(leadership.term, "leader", leadership.owner, holder=leadership.owner)
                note("wrote", term=leadership.term)
            except StaleFencingToken:
                note("refused", term=leadership.term)
                return
            if leadership.lost.is_set():
                note("lost", term=leadership.term, reason=leadership.lost_reason)
                return
            pause.wait(0.02)

    election = locker.election(name)
    note("ready")
    while True:
        try:
            election.run(lead)
        except Exception as exc:  # LockLost after a lost term: stand again
            note("ended", error=type(exc).__name__)
