"""Contender processes for the lock tests (spawned, so top-level functions only)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Literal

from lockclient import FencedResource, RemoteLocker, StaleFencingToken, open_store
from lockclient.clock import TimeServiceClock


def contend(
    store_url: str,
    timesvc_urls: str,
    lock_id: str,
    k: int,
    out_dir: str,
    go_file: str,
    algorithm: Literal["queue", "backoff"] = "queue",
    hold: float = 0.001,
) -> None:
    """Take `lock_id` k times; inside the critical section record (owner, token, enter, exit)
    and write through a fenced resource. Writes one JSON history file per process."""
    store = open_store(store_url)
    clock = TimeServiceClock(timesvc_urls) if timesvc_urls else None
    locker = RemoteLocker(
        store,
        clock,
        lease=10,
        algorithm=algorithm,
        backoff_owner_wait=0.05,
        backoff_step=0.005,
        allow_store_clock=True,  # processes on one machine: one wall clock
    )
    guard = FencedResource(store, f"resource:{lock_id}")
    history: list[dict[str, object]] = []
    # Warm up (first HTTP connection, first SQLite connection) so all contenders start together.
    locker.clock.now_us()
    locker.status(lock_id)
    Path(out_dir, f"ready-{os.getpid()}").touch()
    go = Path(go_file)
    while not go.exists():
        threading.Event().wait(0.005)
    pause = threading.Event()
    ns = 1e9  # CLOCK_MONOTONIC is system-wide: times are comparable across processes
    for _ in range(k):
        lock = locker.get_lock(lock_id, timeout=120)
        enter = time.monotonic_ns()
        stale = False
        try:
            guard.write(lock.fencing_token, "last_writer", lock.owner, holder=lock.owner)
        except StaleFencingToken:
            stale = True
        pause.wait(hold)
        exit_ = time.monotonic_ns()
        # The lease-level invariant: this owner considers itself holding from its grant until it
        # calls release() (held turns False first thing) or its lease runs out by its own clock.
        held_until = min(time.monotonic(), lock.valid_until)
        lost = lock.lost.is_set()
        released = lock.release()
        # A release that handed the lock over (issue 27): to whom, and when its read of the queue's
        # head began — the deciding look of that grant, whose new holder has no looked_at of its own.
        handed = lock._lease.handed_to
        handed_read = lock._lease.handed_read_at
        history.append(
            {
                "pid": os.getpid(),
                "owner": lock.owner,
                "token": lock.fencing_token,
                "ticket": lock.ticket,
                "granted": int(lock.granted_at * ns),
                "enqueued": None if lock.enqueued_at is None else int(lock.enqueued_at * ns),
                "looked": None if lock.looked_at is None else int(lock.looked_at * ns),
                "held_until": int(held_until * ns),
                "enter": enter,
                "exit": exit_,
                "ops": lock.store_ops,
                "round_trips": lock.round_trips,
                "stale": stale,
                "lost": lost or not released,
                "handed_to": None if handed is None else handed.ticket,
                "handed_read": None if handed_read is None or handed is None else int(handed_read * ns),
            }
        )
    Path(out_dir, f"history-{os.getpid()}.json").write_text(json.dumps(history))
    locker.close()
    store.close()
