"""A lock worker for the ring scenario (tests/lock/test_ring.py), run as a separate process:
take one lock again and again until a stop file appears, writing through a fenced resource
twice per hold; every step is a JSON line with CLOCK_MONOTONIC nanoseconds (system-wide).

``python tests/lock/ring_worker.py STORE_URL LOCK_ID OUT.jsonl STOP_FILE TIMESVC_URLS``
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.append(str(_REPO))

from lockclient import (  # noqa: E402
    ChronolockError,
    FencedResource,
    LockTimeout,
    RemoteLocker,
    StaleFencingToken,
    TimeServiceClock,
    open_store,
)


def main() -> int:
    store_url, lock_id, out, stop, timesvc_urls = sys.argv[1:6]
    stop_file = Path(stop)
    log = Path(out).open("a", encoding="utf-8")  # noqa: SIM115

    def record(event: str, **fields: object) -> None:
        log.write(json.dumps({"event": event, "pid": os.getpid(), "ns": time.monotonic_ns(), **fields}) + "\n")
        log.flush()

    store = open_store(store_url)
    locker = RemoteLocker(store, TimeServiceClock(timesvc_urls), lease=10)
    guard = FencedResource(store, f"ring:{lock_id}")
    pause = threading.Event()
    record("started")
    try:
        while not stop_file.exists():
            invoked = time.monotonic_ns()
            try:
                lock = locker.get_lock(lock_id, timeout=60)
            except LockTimeout as exc:
                record("error", op="get_lock", type="LockTimeout", error=str(exc), invoked=invoked)
                continue
            except ChronolockError as exc:
                record("error", op="get_lock", type=type(exc).__name__, error=str(exc), invoked=invoked)
                pause.wait(0.5)
                continue
            granted = time.monotonic_ns()
            record(
                "granted",
                owner=lock.owner,
                token=lock.fencing_token,
                invoked=invoked,
                granted_at=int(lock.granted_at * 1e9),
                round_trips=lock.round_trips,
                lwt=lock.lwt_rounds,
            )
            for phase in ("first", "second"):
                try:
                    guard.write(lock.fencing_token, "last", lock.owner, holder=lock.owner)
                    record("write", phase=phase, owner=lock.owner, token=lock.fencing_token, ok=True)
                except StaleFencingToken as exc:
                    record(
                        "write",
                        phase=phase,
                        owner=lock.owner,
                        token=lock.fencing_token,
                        ok=False,
                        stale=True,
                        error=str(exc),
                    )
                except ChronolockError as exc:
                    record("error", op="fenced_write", type=type(exc).__name__, error=str(exc))
                if phase == "first":
                    pause.wait(0.05)
            held_until = min(time.monotonic(), lock.valid_until)
            lost = lock.lost.is_set()
            releasing = time.monotonic_ns()
            clean = lock.release()
            record(
                "released",
                owner=lock.owner,
                token=lock.fencing_token,
                granted=granted,
                releasing=releasing,
                held_until=int(held_until * 1e9),
                lost=lost or not clean,
                reason=lock.lost_reason,
            )
    finally:
        locker.close()
        store.close()
        record("stopped")
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
