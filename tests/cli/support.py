"""Shared by the ``lockctl`` tests: running lockctl, reading its status, processes by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockclient.lease import HOLDER_COLUMN
from lockclient.store import open_store

LOCKCTL = Path(sys.executable).parent / "lockctl"
HOLD = Path(__file__).with_name("hold.py")
WITNESS = Path(__file__).with_name("witness.py")
WAIT = 30.0  # bound on every wait for a process or a condition

EXIT_LOCK_LOST = 70
EXIT_BUSY = 75
EXIT_UNAVAILABLE = 69


def lockctl(env: dict[str, str], *args: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOCKCTL), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def status(env: dict[str, str], name: str) -> dict[str, Any]:
    result = lockctl(env, "status", name, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def assert_free(env: dict[str, str], name: str) -> None:
    data = status(env, name)
    assert data["holders"] == []
    assert data["queue"] == []
    assert data["leases"] == []
    assert data["held"] is False


def read_marker(marker: Path) -> dict[str, Any]:
    wait_for(marker.exists, f"{marker.name} (the command under the lock started)")
    data: dict[str, Any] = json.loads(marker.read_text())
    return data


def read_pid(path: Path) -> int:
    wait_for(path.exists, f"{path.name}")
    return int(path.read_text())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of ``pid`` from /proc, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2])


def can_run(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie is dead; PID 1 may reap it late)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def revoke(store_url: str, lock_id: str, owner: str) -> None:
    """Revoke a lease the way leasewatch does: delete the record if it is still the version seen."""
    store = open_store(store_url)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            current = store.read_versioned(lock_id).get(HOLDER_COLUMN)
            assert current is not None and owner in current
            if store.compare_and_set(lock_id, {HOLDER_COLUMN: current}, {HOLDER_COLUMN: None}).applied:
                return
            assert time.monotonic() < deadline  # a renewal raced us; read again
    finally:
        store.close()


class Background:
    """``lockctl`` processes started in the background by one test; stopped by PID at the end."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env = env
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []
        """Other processes the test started (commands, their children), read from files."""

    def start(
        self, *args: str, prefix: list[str] | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"lockctl-{len(self.procs)}.err").open("wb")
        proc = subprocess.Popen(
            [*(prefix or []), str(LOCKCTL), *args], env=env or self.env, stdout=subprocess.DEVNULL, stderr=log
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.workdir / f"lockctl-{self.procs.index(proc)}.err").read_text(errors="replace")

    def hold(self, name: str, tag: str, *options: str, mode: str = "exit-on-term") -> tuple[Path, Path]:
        """Start ``lockctl run NAME -- hold.py``; return (marker, release) paths."""
        marker, release = self.workdir / f"{tag}.marker", self.workdir / f"{tag}.release"
        self.start("run", name, *options, "--", sys.executable, str(HOLD), str(marker), str(release), mode)
        return marker, release

    def report(self) -> str:
        """Every process this test started: its command, whether it still runs or how it ended, and the
        end of its stderr — printed at teardown, so a failed test shows why a command never started."""
        lines = []
        for proc in self.procs:
            code = proc.poll()
            args = " ".join(map(str, proc.args))[:200] if isinstance(proc.args, list) else str(proc.args)
            state = "running" if code is None else f"exited {code}"
            tail = self.stderr(proc).strip().splitlines()[-8:]
            lines.append(f"{args} (pid {proc.pid}): {state}")
            lines.extend(f"    {line}" for line in tail)
        return "\n".join(lines)

    def stop_all(self) -> None:
        print(self.report())
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # lockctl forwards it to the command and releases
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in self.pids:
            if can_run(pid):
                os.kill(pid, signal.SIGKILL)
