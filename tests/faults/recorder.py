"""JSON Lines history recording, shared by the harness, the nemesis and every worker process.

One file per process (``<name>.jsonl``), one event per line, written and flushed at once:
a SIGKILL loses nothing already written (the data is in the kernel's page cache), and a
reader tolerates a torn last line. Every event carries ``t`` = ``time.monotonic_ns()``:
CLOCK_MONOTONIC is system-wide on Linux, so times from different processes are comparable,
and libfaketime leaves it alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), so skewed processes
record on the same clock as everyone else.

Event vocabulary (what :mod:`tests.faults.checkers` reads) — ``type``:

* ``invoke`` / ``ok`` / ``fail`` / ``info`` with ``op`` and ``id``: an operation's invocation and
  its completion (``info`` = indeterminate: a timeout whose effect is unknown, or the process was
  killed mid-call — the merge adds ``info`` for every invoke without a completion).
  ``op`` is ``acquire`` (``mode`` get/aget/try/lockctl; ``ok`` has ``owner``, ``ticket``,
  ``token``, ``until`` = ``valid_until`` in monotonic ns), ``write`` (``token``, ``owner``,
  ``result`` ok/stale/error), ``release`` (``result`` = release()'s answer).
* ``valid``: a holder's sample of ``held`` and ``valid_until`` (``until``, ns).
* ``lost``: a holder's ``lock.lost`` fired (``owner``, ``reason``).
* ``cmd_start`` / ``cmd_exit``: a command run by ``lockctl run`` (``owner``, ``token``,
  ``supervisor``: lockctl's pid); the command's own view of holding the lock.
* ``now``: one ``GET /now`` (``invoke``, ``t`` = completion, ``value``, ``replica``, ``ok``).
* ``fault_start`` / ``fault_end``: the nemesis (``fault``, ``fid``, ``target``, ``pids``, ``params``).
* ``proc_start`` / ``proc_exit``: the harness started or saw the end of a process.
* ``revocation``: one event from a leasewatch replica's ``/revocations``.
* ``final``: the store's state of a lock id after the run (``holders``, ``queue``, ``leases``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any


class Recorder:
    """Appends events to one JSON Lines file; thread-safe; one write + flush per event."""

    def __init__(self, path: Path | str, proc: str) -> None:
        self.path = Path(path)
        self.proc = proc
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")  # lives as long as the recorder
        self._ids = 0

    def next_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"{self.proc}:{self._ids}"

    def emit(self, type_: str, /, **fields: Any) -> int:
        t = time.monotonic_ns()
        event = {"t": t, "type": type_, "proc": self.proc, "pid": self.pid, **fields}
        line = json.dumps(event, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        return t

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Events of one file; a torn last line (the writer was killed mid-write) is skipped."""
    events = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def merge(directory: Path, out: Path) -> list[dict[str, Any]]:
    """Merge every ``*.jsonl`` in ``directory`` into one history sorted by time, and mark each
    invocation that never completed as indeterminate (``info``, ``reason: no completion``)."""
    events: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        if path.resolve() != out.resolve():
            events.extend(read_events(path))
    completed = {e["id"] for e in events if e["type"] in ("ok", "fail", "info") and "id" in e}
    last_t = max((e["t"] for e in events), default=0)
    for e in list(events):
        if e["type"] == "invoke" and e["id"] not in completed:
            events.append(
                {
                    "t": last_t,
                    "type": "info",
                    "op": e["op"],
                    "id": e["id"],
                    "proc": e["proc"],
                    "pid": e["pid"],
                    "lock": e.get("lock"),
                    "reason": "no completion (process killed or stopped mid-call)",
                }
            )
    events.sort(key=lambda e: (e["t"], e["type"] != "invoke"))
    with out.open("w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":"), default=str) + "\n")
    return events
