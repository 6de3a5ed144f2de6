"""Contender processes for the semaphore and read-write lock tests (spawned: top-level functions only)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

from lockclient import RemoteLocker, open_store
from lockclient.permits import Permit


def contend(store_url: str, kind: str, name: str, limit: int, k: int, out_dir: str, go_file: str, seed: int) -> None:
    """Take a permit of ``name`` k times from two threads: a semaphore permit (``kind`` semaphore),
    or at random a read or a write lock (``kind`` rwlock, ``limit`` = max_readers). Inside, record
    when it was surely granted (after the call returned), its grant's send time, token, ticket,
    and until when it surely believed it held (before release(), or its lease's end). One JSON
    history file per process."""
    locker = RemoteLocker(open_store(store_url), lease=10, allow_store_clock=True, owns_store=True)
    rng = random.Random(seed)
    history: list[dict[str, object]] = []
    lock = threading.Lock()
    Path(out_dir, f"ready-{os.getpid()}").touch()
    go = Path(go_file)
    while not go.exists():
        threading.Event().wait(0.005)

    def work(seed: int) -> None:
        pick = random.Random(seed)
        for _ in range(k):
            mode = "permit"
            permit: Permit
            if kind == "semaphore":
                permit = locker.get_semaphore(name, limit, timeout=120)
            else:
                mode = "write" if pick.random() < 0.3 else "read"
                get = locker.get_write_lock if mode == "write" else locker.get_read_lock
                permit = get(name, timeout=120, max_readers=limit)
            done = time.monotonic()
            threading.Event().wait(pick.uniform(0.0005, 0.004))
            until = min(time.monotonic(), permit.valid_until)
            lost = permit.lost.is_set()
            permit.release()
            with lock:
                history.append(
                    {
                        "pid": os.getpid(),
                        "owner": permit.owner,
                        "mode": mode,
                        "token": permit.fencing_token,
                        "ticket": permit.ticket,
                        "sent": permit.granted_at,
                        "granted": done,
                        "held_until": until,
                        "looked": permit.looked_at,
                        "enqueued": permit.enqueued_at,
                        "lost": lost,
                    }
                )

    threads = [threading.Thread(target=work, args=(rng.random(),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    locker.close()
    Path(out_dir, f"history-{os.getpid()}.json").write_text(json.dumps(history))


def hold_forever(store_url: str, kind: str, name: str, limit: int, mode: str, ready_file: str) -> None:
    """Take one permit and hold it until killed (SIGKILL/SIGSTOP tests): writes the ready file with
    the permit's owner and token once held."""
    locker = RemoteLocker(open_store(store_url), lease=2.0, allow_store_clock=True, owns_store=True)
    if kind == "semaphore":
        permit = locker.get_semaphore(name, limit, timeout=60)
    elif mode == "write":
        permit = locker.get_write_lock(name, timeout=60, max_readers=limit)
    else:
        permit = locker.get_read_lock(name, timeout=60, max_readers=limit)
    Path(ready_file).write_text(json.dumps({"owner": permit.owner, "token": permit.fencing_token}))
    while True:
        threading.Event().wait(1.0)
