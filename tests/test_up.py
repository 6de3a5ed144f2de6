"""`make up`'s launcher: three timesvc replicas and leasewatch on one SQLite file, stopped on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def test_up_starts_the_stack_and_stops_it_on_ctrl_c(tmp_path: Path) -> None:
    base = free_port()
    while any(not _free(base + i) for i in range(4)):
        base = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env |= {"CHRONOLOCK_UP_PORT": str(base), "CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path / 'cells.db'}"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "up.py")], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        out = "".join(lines)
        assert "chronolock is up" in out, out
        urls = re.findall(r"http://127\.0\.0\.1:\d+", out)
        assert len(set(urls)) == 4
        for i in range(3):
            body = httpx.get(f"http://127.0.0.1:{base + i}/now", timeout=5).json()
            assert body["replica"] == f"timesvc-{i + 1}"
        assert httpx.get(f"http://127.0.0.1:{base + 3}/locks", timeout=5).json() == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for i in range(4):
        assert _free(base + i), "a service outlived `make up`"


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
