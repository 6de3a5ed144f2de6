"""A command for ``lockctl run`` in the tests: reports its lock environment, then holds on.

Usage: hold.py MARKER RELEASE [exit-on-term|ignore-term]

Writes MARKER (atomically: a JSON object with its pid and the CHRONOLOCK_* variables
lockctl passed), then waits until RELEASE exists (at most 60 s) and exits 0. On SIGTERM
it writes MARKER.term and exits 0, or keeps waiting with ``ignore-term``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

marker, release = Path(sys.argv[1]), Path(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "exit-on-term"


def on_term(signum: int, frame: FrameType | None) -> None:
    marker.with_name(marker.name + ".term").write_text(str(signum))
    if mode == "exit-on-term":
        sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
info: dict[str, object] = {
    name: os.environ.get(name)
    for name in (
        "CHRONOLOCK_LOCK_ID",
        "CHRONOLOCK_FENCING_TOKEN",
        "CHRONOLOCK_LOCK_OWNER",
        "CHRONOLOCK_LOCK_KIND",
        "CHRONOLOCK_TERM",
    )
}
info["pid"] = os.getpid()
tmp = marker.with_name(marker.name + ".tmp")
tmp.write_text(json.dumps(info))
tmp.replace(marker)
deadline = time.monotonic() + 60
while not release.exists():
    if time.monotonic() > deadline:
        sys.exit(99)
    time.sleep(0.01)
