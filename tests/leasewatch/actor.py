"""A lock actor for the leasewatch fault tests: one process that takes one lock and reports.

Run as ``python tests/leasewatch/actor.py LOCK_ID --status FILE [options]`` with the
``CHRONOLOCK_STORE_URL``, ``CHRONOLOCK_TIMESVC_URLS`` and ``CHRONOLOCK_LEASE`` environment
(``RemoteLocker.from_env()``), and PYTHONPATH containing the repository root.

Every step is one JSON line appended to the status file (stdout when ``--status -``), each
with ``at_ns`` = ``time.monotonic_ns()`` (CLOCK_MONOTONIC is system-wide, so the test can
compare it with its own; libfaketime leaves it alone with FAKETIME_DONT_FAKE_MONOTONIC=1):

* ``{"event": "started", "wall": time.time()}`` — before get_lock (shows the skewed wall clock);
* ``{"event": "held", "token": N, "owner": ...}`` — acquired (``--mode wait`` reports the same);
* ``{"event": "fenced_write", "phase": "initial"|"after_go", "ok": bool, "error": ..., "stale": bool,
  "lost_at_write": bool}`` — a ``FencedResource(store, --resource).write(token, "k", owner)``;
* ``{"event": "lost", "reason": ...}`` — as soon as ``lock.lost`` fires (an on_lost callback);
* ``{"event": "lost_check", "lost": bool, "reason": ..., "valid_until_ns": ...}`` — after the write following ``--go``:
  whether ``lock.lost`` was set within ``--lost-wait`` seconds;
* ``{"event": "released", "ok": bool}`` — ``lock.release()``'s answer;
* ``{"event": "error", "error": ...}`` — anything unexpected (then exit 1).

Modes: ``hold`` (and its alias ``wait``): get_lock, optionally an initial fenced write, then
(``--go FILE``) wait for FILE, write again with the same token and check ``lock.lost``; then
hold until ``--release FILE`` exists or ``--hold-for`` seconds passed, and release.

Sleeps use ``threading.Event().wait`` (``time.sleep`` fails under libfaketime without the
test sitecustomize).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:  # normally on PYTHONPATH already; harmless otherwise
    sys.path.append(str(_REPO))

from lockclient import FencedResource, RemoteLocker, StaleFencingToken  # noqa: E402

_POLL = 0.01


class Reporter:
    """Appends JSON lines (one write + flush each, so a reader never sees half a line)."""

    def __init__(self, target: str) -> None:
        self._lock = threading.Lock()
        self._stream = sys.stdout if target == "-" else Path(target).open("a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "at_ns": time.monotonic_ns(), "pid": os.getpid(), **fields}) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()
            if self._stream is not sys.stdout:
                os.fsync(self._stream.fileno())


def wait_for_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        pause.wait(_POLL)
    return True


def fenced_write(report: Reporter, guard: FencedResource, token: int, owner: str, phase: str, lost: bool) -> None:
    try:
        guard.write(token, "k", owner, holder=owner)
    except StaleFencingToken as exc:
        report("fenced_write", phase=phase, ok=False, stale=True, error=str(exc), token=token, lost_at_write=lost)
    except Exception as exc:
        report("fenced_write", phase=phase, ok=False, stale=False, error=repr(exc), token=token, lost_at_write=lost)
    else:
        report("fenced_write", phase=phase, ok=True, stale=False, error=None, token=token, lost_at_write=lost)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lock_id")
    parser.add_argument("--status", default="-", help="JSON-lines status file ('-': stdout)")
    parser.add_argument("--mode", choices=["hold", "wait"], default="hold")
    parser.add_argument("--release", type=Path, help="release once this file exists")
    parser.add_argument("--hold-for", type=float, default=60.0, help="release after this many seconds at most")
    parser.add_argument("--resource", help="fenced resource name: write k=owner with the token once held")
    parser.add_argument("--go", type=Path, help="after holding, wait for this file, then write again")
    parser.add_argument("--lost-wait", type=float, default=5.0, help="s to wait for lock.lost after the go write")
    parser.add_argument("--timeout", type=float, default=60.0, help="get_lock timeout")
    args = parser.parse_args(argv)

    report = Reporter(args.status)
    report("started", lock_id=args.lock_id, wall=time.time())
    try:
        locker = RemoteLocker.from_env()
    except Exception as exc:
        report("error", error=repr(exc))
        return 1
    try:
        lock = locker.get_lock(args.lock_id, timeout=args.timeout)
        report("held", token=lock.fencing_token, owner=lock.owner, lock_id=args.lock_id)
        lock.on_lost(lambda reason: report("lost", reason=reason))
        guard = FencedResource(locker.store, args.resource) if args.resource else None
        if guard is not None:
            fenced_write(report, guard, lock.fencing_token, lock.owner, "initial", lock.lost.is_set())
        if args.go is not None:
            if not wait_for_file(args.go, args.hold_for):
                report("error", error=f"{args.go} did not appear")
                return 1
            if guard is not None:
                fenced_write(report, guard, lock.fencing_token, lock.owner, "after_go", lock.lost.is_set())
            lost = lock.lost.wait(args.lost_wait)
            # valid_until cannot have moved while the process was stopped (no renewal ran), and a
            # renewal after it resumed finds the lease revoked: this is the value it had all along.
            report("lost_check", lost=lost, reason=lock.lost_reason, valid_until_ns=int(lock.valid_until * 1e9))
        started = time.monotonic()
        remaining = args.hold_for
        if args.release is not None:
            wait_for_file(args.release, remaining)
        else:
            threading.Event().wait(max(0.0, started + remaining - time.monotonic()))
        report("released", ok=lock.release(), lost=lock.lost.is_set(), reason=lock.lost_reason)
        return 0
    except Exception as exc:
        report("error", error=repr(exc))
        return 1
    finally:
        locker.close()


if __name__ == "__main__":
    sys.exit(main())
