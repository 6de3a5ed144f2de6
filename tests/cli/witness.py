"""Commands for the supervision tests of ``lockctl run``; each leaves evidence in files.

Usage:
  witness.py heartbeat LOG PIDFILE [ignore-term]
      Write PIDFILE (atomically), then append ``time.monotonic_ns()`` to LOG every
      2 ms until killed (at most 60 s). On SIGTERM append ``term <ns>`` and exit,
      or keep going with ``ignore-term``.
  witness.py report-start REPORT OTHER_PIDFILE
      At once: write REPORT (JSON, atomically) with this command's start time
      (``time.monotonic_ns()``), the pid in OTHER_PIDFILE and whether that process
      could still run at this moment (``/proc``: a zombie cannot). Then exit 0.
  witness.py tty-read
      Print "tty-read ready", read one line from stdin (the terminal), print "got:LINE".
  witness.py tty-int
      Print "tty-int ready" and wait (at most 60 s); on SIGINT print "got SIGINT" and exit 7.

CLOCK_MONOTONIC is system-wide, so times written by different processes compare.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def can_run(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def heartbeat(log: Path, pidfile: Path, ignore_term: bool) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_term(signum: int, frame: FrameType | None) -> None:
        os.write(fd, f"term {time.monotonic_ns()}\n".encode())
        if not ignore_term:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    write_atomically(pidfile, str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        os.write(fd, f"{time.monotonic_ns()}\n".encode())
        time.sleep(0.002)
    sys.exit(99)


def report_start(report: Path, other_pidfile: Path) -> None:
    started = time.monotonic_ns()
    other = int(other_pidfile.read_text())
    running = can_run(other)
    write_atomically(report, json.dumps({"start_ns": started, "other_pid": other, "other_could_run": running}))


def tty_read() -> None:
    print("tty-read ready", flush=True)
    line = sys.stdin.readline().strip()
    print(f"got:{line}", flush=True)


def tty_int() -> None:
    def on_int(signum: int, frame: FrameType | None) -> None:
        print("got SIGINT", flush=True)
        sys.exit(7)

    signal.signal(signal.SIGINT, on_int)
    print("tty-int ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(99)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "heartbeat":
        heartbeat(Path(args[0]), Path(args[1]), ignore_term=args[2:] == ["ignore-term"])
    elif mode == "report-start":
        report_start(Path(args[0]), Path(args[1]))
    elif mode == "tty-read":
        tty_read()
    elif mode == "tty-int":
        tty_int()
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
