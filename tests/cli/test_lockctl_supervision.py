"""``lockctl run`` never lets its command run without the lock — real processes, real SQLite store.

* lockctl SIGKILLed: the command and its grandchild are gone at once (PR_SET_PDEATHSIG
  and the watchdog), long before the lease could be revoked;
* the command exits leaving a process in its group: that process is dead before the
  next holder's command starts;
* lockctl cut off from the store (libfiu fails its reads and writes) while leasewatch
  keeps working: the command is dead before leasewatch revokes the lease and the next
  holder's command starts — from CLOCK_MONOTONIC timestamps written by the commands;
* settings where that cannot work are refused;
* under a terminal: the command reads the terminal and gets Ctrl-C.

Synchronisation is by files and polling, never by fixed sleeps; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import (
    EXIT_LOCK_LOST,
    HOLD,
    LOCKCTL,
    WAIT,
    WITNESS,
    Background,
    assert_free,
    can_run,
    lockctl,
    proc_stat,
    read_marker,
    read_pid,
    revoke,
    status,
    wait_for,
)
from tests.support.procs import fleet


def heartbeats(log: Path) -> tuple[list[int], list[int]]:
    """(heartbeat times, SIGTERM times) written by ``witness.py heartbeat``, in ns."""
    beats, terms = [], []
    for line in log.read_text().splitlines():
        if line.startswith("term "):
            terms.append(int(line.split()[1]))
        elif line:
            beats.append(int(line))
    return beats, terms


def children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat[1] == pid:
                found.append(int(name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def quoted(*words: str | Path) -> str:
    return " ".join(shlex.quote(str(word)) for word in words)


# -- lockctl killed ------------------------------------------------------------------------------


def test_sigkill_of_lockctl_kills_the_command_and_its_grandchild_at_once(
    env: dict[str, str], background: Background, tmp_path: Path
) -> None:
    gc_pid, cmd_pid = tmp_path / "grandchild.pid", tmp_path / "command.pid"
    # The grandchild ignores SIGHUP/SIGINT/SIGTERM: only SIGKILL removes it.
    script = (
        f"(trap '' HUP INT TERM; exec sleep 60) & echo $! > {gc_pid}.tmp && mv {gc_pid}.tmp {gc_pid}; "
        f"echo $$ > {cmd_pid}.tmp && mv {cmd_pid}.tmp {cmd_pid}; wait"
    )
    supervisor = background.start("run", "job", "--lease", "10", "--", "/bin/sh", "-c", script)
    command, grandchild = read_pid(cmd_pid), read_pid(gc_pid)
    background.pids += [command, grandchild]

    # The command leads its own process group, the grandchild is in it, lockctl is not.
    assert proc_stat(command) is not None
    assert proc_stat(command)[2] == command  # type: ignore[index]
    assert proc_stat(grandchild)[2] == command  # type: ignore[index]
    assert os.getpgid(supervisor.pid) != command
    watchdogs = [pid for pid in children(supervisor.pid) if "chronolock-watchdog" in cmdline(pid)]
    assert len(watchdogs) == 1, [cmdline(pid) for pid in children(supervisor.pid)]
    assert status(env, "job")["held"] is True

    killed_at = time.monotonic()
    supervisor.kill()  # SIGKILL: no handler, no clean-up in lockctl
    wait_for(
        lambda: not can_run(command) and not can_run(grandchild),
        "the command and its grandchild to die",
        timeout=8.0,
        interval=0.001,
    )
    elapsed = time.monotonic() - killed_at
    assert supervisor.wait(timeout=WAIT) < 0
    # The guarantee: gone before the lease (10 s from the last renewal, plus leasewatch's grace)
    # could be revoked. PDEATHSIG acts at once (milliseconds, printed below); the bound is half
    # the lease so that a loaded machine cannot turn scheduling delay into a failure.
    assert elapsed < 5.0, f"the command outlived lockctl by {elapsed:.3f} s"
    wait_for(lambda: not can_run(watchdogs[0]), "the watchdog to exit after its work")
    # lockctl could not release: the lock stays held until leasewatch revokes it, with nobody running.
    assert status(env, "job")["held"] is True
    print(f"\nSIGKILL of lockctl -> command and grandchild dead in {elapsed * 1000:.1f} ms")


# -- leftovers of the command -------------------------------------------------------------------


@pytest.mark.parametrize("leftover", ["exits-on-term", "ignores-term"])
def test_leftovers_in_the_group_are_dead_before_the_lock_is_released(
    env: dict[str, str], background: Background, tmp_path: Path, leftover: str
) -> None:
    log, leftover_pid = tmp_path / "leftover.log", tmp_path / "leftover.pid"
    go, report = tmp_path / "go", tmp_path / "second.json"
    witness = [sys.executable, WITNESS, "heartbeat", log, leftover_pid]
    if leftover == "ignores-term":
        witness.append("ignore-term")
    # The command starts a background process (same group, no job control in sh -c) and exits 3.
    script = f"{quoted(*witness)} & while [ ! -f {go} ]; do sleep 0.01; done; exit 3"
    first = background.start("run", "job", "--kill-grace", "0.5", "--", "/bin/sh", "-c", script)
    pid = read_pid(leftover_pid)
    background.pids.append(pid)
    second = background.start(
        "run", "job", "--", sys.executable, str(WITNESS), "report-start", str(report), str(leftover_pid)
    )
    wait_for(lambda: len(status(env, "job")["queue"]) == 2, "the second lockctl to queue up")

    go.touch()
    assert first.wait(timeout=WAIT) == 3, background.stderr(first)  # the command's own status
    assert second.wait(timeout=WAIT) == 0, background.stderr(second)
    started = json.loads(report.read_text())
    beats, terms = heartbeats(log)
    assert started["other_could_run"] is False  # dead when the next holder's command started
    assert beats[-1] < started["start_ns"]
    assert terms, "SIGTERM comes first"
    stderr = background.stderr(first)
    assert "left 1 process(es)" in stderr
    if leftover == "ignores-term":
        assert "sent SIGKILL" in stderr
        assert beats[-1] - terms[0] >= 0.4e9  # it ran on for (about) the 0.5 s grace
    assert_free(env, "job")


def test_a_stuck_stderr_does_not_delay_termination(
    env: dict[str, str], background: Background, tmp_path: Path, store_url: str
) -> None:
    """lockctl's stderr is a full pipe nobody reads (a stuck log collector): every write to it
    blocks. The lock is revoked; the command ignores SIGTERM. It must still be killed on time."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 4096)
    os.set_blocking(write_end, True)  # lockctl's writes now block, as on a real stuck pipe
    marker, release = tmp_path / "holder.marker", tmp_path / "holder.release"
    hold = [sys.executable, str(HOLD), str(marker), str(release), "ignore-term"]
    proc = subprocess.Popen(
        [str(LOCKCTL), "run", "job", "--lease", "3", "--kill-grace", "0.5", "--", *hold],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=write_end,
    )
    os.close(write_end)
    drained: list[bytes] = []
    drain = threading.Thread(target=lambda: drained.extend(iter(lambda: os.read(read_end, 65536), b"")))
    try:
        info = read_marker(marker)
        background.pids.append(info["pid"])
        revoke(store_url, "job", info["CHRONOLOCK_LOCK_OWNER"])
        revoked = time.monotonic()
        # lockctl learns of the revocation at its next renewal (every lease/3 = 1 s), then SIGTERM,
        # then SIGKILL 0.5 s later — while every message it tries to write is stuck.
        wait_for(lambda: not can_run(info["pid"]), "the command to be killed", timeout=10.0)
        assert time.monotonic() - revoked < 5.0
        assert marker.with_name(marker.name + ".term").exists()
        assert proc.poll() is None  # lockctl itself is still stuck writing its messages
    finally:
        drain.start()
        try:
            proc.wait(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
            drain.join(timeout=WAIT)
            os.close(read_end)
    assert proc.returncode == EXIT_LOCK_LOST
    assert b"sent SIGKILL" in b"".join(drained)


# -- lockctl cut off from the store --------------------------------------------------------------

FIU_RUN, FIU_CTRL = shutil.which("fiu-run"), shutil.which("fiu-ctrl")


@pytest.mark.skipif(
    FIU_RUN is None or FIU_CTRL is None,
    reason="libfiu's fiu-run/fiu-ctrl are not installed (Debian fiu-utils; `make system-deps` installs it)",
)
def test_command_is_dead_before_the_next_holder_starts_when_lockctl_loses_the_store(
    env: dict[str, str], background: Background, tmp_path: Path, store_url: str
) -> None:
    """Issue 8, finding 3: lease 3 s, leasewatch grace 0.5 s, scan 0.2 s; the first command
    ignores SIGTERM, so only the SIGKILL due ``KILL_MARGIN`` before the lease ends stops it."""
    log, first_pid, report = tmp_path / "first.log", tmp_path / "first.pid", tmp_path / "second.json"
    fiu = tmp_path / "fiu"
    with fleet(tmp_path) as services:
        watcher = services.leasewatch(store_url, scan_interval=0.2, grace=0.5)
        env = {**env, "CHRONOLOCK_LEASEWATCH_URL": watcher.url}
        settings = ["--lease", "3", "--kill-grace", "0.5"]
        first = background.start(
            "run",
            "job",
            *settings,
            "--",
            sys.executable,
            str(WITNESS),
            "heartbeat",
            str(log),
            str(first_pid),
            "ignore-term",
            prefix=[str(FIU_RUN), "-x", "-f", str(fiu), sys.executable],  # fiu-run execs: same pid
            env=env,
        )
        command = read_pid(first_pid)
        background.pids.append(command)
        second = background.start(
            "run", "job", *settings, "--", sys.executable, str(WITNESS), "report-start", str(report), str(first_pid),
            env=env,
        )  # fmt: skip
        wait_for(lambda: len(status(env, "job")["queue"]) == 2, "the second lockctl to queue up")
        wait_for(Path(f"{fiu}-{first.pid}.in").exists, "libfiu's control fifo of the first lockctl")

        # From now on every pread/pwrite of the first lockctl fails: its SQLite store is gone for
        # it (renewals fail), while leasewatch and the second lockctl use the same file normally.
        faults = ["-c", "enable name=posix/io/rw/pwrite", "-c", "enable name=posix/io/rw/pread"]
        subprocess.run([str(FIU_CTRL), "-f", str(fiu), *faults, str(first.pid)], check=True, timeout=WAIT)
        cut = time.monotonic_ns()
        wait_for(lambda: not can_run(command), "the first command to die", interval=0.001)
        seen_dead = time.monotonic_ns()  # an upper bound of its death, taken from outside

        assert first.wait(timeout=WAIT) == EXIT_LOCK_LOST, background.stderr(first)
        wait_for(report.exists, "the second command to start")
        assert second.wait(timeout=WAIT) == 0, background.stderr(second)

    started: dict[str, Any] = json.loads(report.read_text())
    beats, terms = heartbeats(log)
    assert started["other_could_run"] is False
    assert beats[-1] < started["start_ns"]
    assert seen_dead < started["start_ns"], "the first command may still have run when the second started"
    assert terms, "SIGTERM came first (and was ignored)"
    assert terms[0] < beats[-1]
    assert "the lease runs out" in background.stderr(first)
    gap = (started["start_ns"] - beats[-1]) / 1e9
    print(
        f"\nstore cut -> first command dead: {(beats[-1] - cut) / 1e9:.3f} s; "
        f"SIGTERM -> SIGKILL: {(beats[-1] - terms[0]) / 1e9:.3f} s; "
        f"first command's last sign of life -> second command's start: {gap:.3f} s "
        f"(seen dead from outside {(started['start_ns'] - seen_dead) / 1e9:.3f} s before it)"
    )


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "extra_env", "expected"),
    [
        (["--lease", "3", "--kill-grace", "2"], {}, "--lease 3"),
        (["--kill-grace", "5"], {}, "10 s from CHRONOLOCK_LEASE"),  # the old default, with the default lease
        (["--kill-grace", "1.6"], {"CHRONOLOCK_LEASE": "4"}, "4 s from CHRONOLOCK_LEASE"),
        (["--lease", "0.8"], {}, "at least 1 s"),  # no grace fits: the margin alone is half of it
        (["--kill-grace", "-1"], {}, "--kill-grace"),
        (["--kill-grace", "nan"], {}, "--kill-grace"),
        (["--kill-grace", "inf"], {}, "--kill-grace"),
    ],
)
def test_kill_grace_that_cannot_beat_the_lease_is_refused(
    env: dict[str, str], tmp_path: Path, args: list[str], extra_env: dict[str, str], expected: str
) -> None:
    ran = tmp_path / "ran"
    result = lockctl({**env, **extra_env}, "run", *args, "job", "--", "touch", str(ran))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not ran.exists()


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [
        (["--lease", "5"], {}),  # the default 2 s grace: 2 + 0.5 = 5 / 2, the limit
        (["--lease", "1.5"], {}),  # a short lease without --kill-grace: the grace shrinks to 0.25 s
        ([], {"CHRONOLOCK_LEASE": "3"}),
        (["--lease", "3", "--kill-grace", "1"], {}),
    ],
)
def test_kill_grace_that_fits_the_lease_is_accepted(
    env: dict[str, str], tmp_path: Path, args: list[str], extra_env: dict[str, str]
) -> None:
    ran = tmp_path / "ran"
    result = lockctl({**env, **extra_env}, "run", *args, "job", "--", "touch", str(ran))
    assert result.returncode == 0, result.stderr
    assert ran.exists()


# -- under a terminal ----------------------------------------------------------------------------


class Terminal:
    """The master side of a pseudo-terminal: what a user types and sees."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = ""
        self._pos = 0

    def expect(self, text: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen[self._pos :]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {text!r} on the terminal; it shows:\n{self.seen}")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # EIO: every slave end is closed
                data = b""
            if not data:
                raise AssertionError(f"the terminal closed before {text!r}; it shows:\n{self.seen}")
            self.seen += data.decode(errors="replace")
        self._pos = self.seen.index(text, self._pos) + len(text)

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)


def test_command_reads_the_terminal_and_gets_ctrl_c(env: dict[str, str], tmp_path: Path) -> None:
    """A session on a pty whose leader is a shell: lockctl runs in its foreground, lends the
    terminal to the command's group and takes it back — the shell can read it again after."""
    lockctl_cmd = quoted(LOCKCTL, "run", "tty-job", "--", sys.executable, WITNESS)
    script = (
        f"{lockctl_cmd} tty-read; echo status1=$?; "
        f"{lockctl_cmd} tty-int; echo status2=$?; "
        "read -r after; echo after=$after"
    )
    master, slave = os.openpty()
    try:
        # setsid --ctty: a new session whose controlling terminal is the pty (stdin).
        shell = subprocess.Popen(
            ["setsid", "--ctty", "/bin/sh", "-c", script], stdin=slave, stdout=slave, stderr=slave, env=env
        )
        os.close(slave)
        slave = -1
        terminal = Terminal(master)
        try:
            terminal.expect("tty-read ready")
            terminal.type(b"hello\n")  # read from the terminal: no SIGTTIN, so the group is in the foreground
            terminal.expect("got:hello")
            terminal.expect("status1=0")
            terminal.expect("tty-int ready")
            terminal.type(b"\x03")  # Ctrl-C: SIGINT to the foreground group — the command's, not lockctl's
            terminal.expect("got SIGINT")
            terminal.expect("status2=7")  # lockctl itself got no signal (it would exit 130)
            terminal.type(b"back\n")  # the shell reads the terminal again: lockctl gave it back
            terminal.expect("after=back")
            assert shell.wait(timeout=WAIT) == 0
        finally:
            if shell.poll() is None:
                shell.kill()
                shell.wait(timeout=WAIT)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert_free(env, "tty-job")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for an interactive job-control shell")
def test_ctrl_z_stops_lockctl_with_its_command_and_fg_continues_both(env: dict[str, str], tmp_path: Path) -> None:
    """In an interactive shell: Ctrl-Z stops the command; lockctl takes the terminal back and stops
    itself so that the shell gets its prompt; ``fg`` continues lockctl, which lends the terminal to
    the command again and continues it (the lease is still good)."""
    env = {**env, "PS1": "PROMPT$ ", "TERM": "dumb", "HISTFILE": str(tmp_path / "history")}
    master, slave = os.openpty()
    try:
        shell = subprocess.Popen(
            ["setsid", "--ctty", "bash", "--norc", "--noprofile", "-i"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=tmp_path,
        )
        os.close(slave)
        slave = -1
        terminal = Terminal(master)
        try:
            terminal.expect("PROMPT$ ")
            terminal.type(f"{quoted(LOCKCTL, 'run', 'z-job', '--', sys.executable, WITNESS, 'tty-read')}\n".encode())
            terminal.expect("tty-read ready")
            terminal.type(b"\x1a")  # Ctrl-Z
            terminal.expect("Stopped")
            terminal.expect("PROMPT$ ")  # the shell has its terminal back: lockctl stopped too
            assert status(env, "z-job")["held"] is True  # still ours while briefly stopped
            terminal.type(b"fg\n")
            terminal.expect("tty-read")  # bash names the job it continues
            terminal.type(b"hello\n")  # queued on the terminal until the foreground command reads it
            terminal.expect("got:hello")
            terminal.expect("PROMPT$ ")
            terminal.type(b"echo status=$?\n")
            terminal.expect("status=0")
            terminal.type(b"exit\n")
            assert shell.wait(timeout=WAIT) == 0
        finally:
            if shell.poll() is None:
                shell.kill()
                shell.wait(timeout=WAIT)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert_free(env, "z-job")
