"""``lockctl`` as a user runs it: real processes on a real SQLite store, no mocks.

Synchronisation is by files (the command under the lock writes a marker, then waits
for a release file) and by polling ``lockctl status``; never by fixed sleeps.
"""

from __future__ import annotations

import itertools
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lockclient.settings import ClientSettings, env_names
from tests.cli.support import (
    EXIT_BUSY,
    EXIT_LOCK_LOST,
    EXIT_UNAVAILABLE,
    WAIT,
    Background,
    assert_free,
    lockctl,
    pid_alive,
    read_marker,
    revoke,
    status,
    wait_for,
)

if TYPE_CHECKING:
    from tests.support.cassandra_node import LocalCassandraNode

# -- run -------------------------------------------------------------------------------------


def test_run_holds_the_lock_for_the_commands_lifetime(env: dict[str, str], background: Background) -> None:
    marker, release = background.hold("job:1", "holder")
    info = read_marker(marker)
    proc = background.procs[0]

    data = status(env, "job:1")
    owner = info["CHRONOLOCK_LOCK_OWNER"]
    assert info["CHRONOLOCK_LOCK_ID"] == "job:1"
    assert data["held"] is True
    assert data["holders"] == [owner]
    assert data["fencing_token"] == int(info["CHRONOLOCK_FENCING_TOKEN"])
    assert data["fencing_owner"] == owner
    assert [entry["owner"] for entry in data["queue"]] == [owner]
    assert [lease["owner"] for lease in data["leases"]] == [owner]
    assert data["leases"][0]["holding"] is True

    started = time.monotonic()
    busy = lockctl(env, "run", "--try", "job:1", "--", "true")
    assert busy.returncode == EXIT_BUSY, busy.stderr
    assert "busy" in busy.stderr
    assert time.monotonic() - started < 10  # at once: a process start, never a wait on the holder
    timed_out = lockctl(env, "run", "--timeout", "0.3", "job:1", "--", "true")
    assert timed_out.returncode == EXIT_BUSY, timed_out.stderr
    assert "timed out" in timed_out.stderr
    assert status(env, "job:1")["holders"] == [owner]  # neither attempt disturbed the holder

    release.touch()
    assert proc.wait(timeout=WAIT) == 0, background.stderr(proc)
    assert_free(env, "job:1")
    assert lockctl(env, "run", "--try", "job:1", "--", "true").returncode == 0


def test_two_runs_on_one_name_serialize(env: dict[str, str], background: Background, tmp_path: Path) -> None:
    log = tmp_path / "intervals.log"
    append = (
        "import os, sys, time\n"
        "def note(what):\n"
        "    with open(sys.argv[1], 'a') as f:\n"
        "        f.write(f'{what} {os.getpid()} {time.time_ns()}\\n')\n"
        "note('start')\n"
        "time.sleep(0.3)  # widen the critical section; not used for synchronisation\n"
        "note('end')\n"
    )
    procs = [background.start("run", "shared", "--", sys.executable, "-c", append, str(log)) for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=WAIT) == 0, background.stderr(proc)

    intervals: dict[str, dict[str, int]] = {}
    for line in log.read_text().splitlines():
        what, pid, at = line.split()
        intervals.setdefault(pid, {})[what] = int(at)
    assert len(intervals) == 3
    spans = sorted((span["start"], span["end"]) for span in intervals.values())
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        assert end <= next_start, f"critical sections overlap: {spans}"
    assert_free(env, "shared")


def test_exit_status_environment_and_fencing_tokens(env: dict[str, str]) -> None:
    assert lockctl(env, "run", "job", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert lockctl(env, "run", "job", "--", sys.executable, "-c", killed).returncode == 128 + signal.SIGKILL

    show = "import os; print(os.environ['CHRONOLOCK_FENCING_TOKEN'], os.environ['CHRONOLOCK_LOCK_ID'])"
    first = lockctl(env, "run", "job", "--", sys.executable, "-c", show)
    second = lockctl(env, "run", "job", "--", sys.executable, "-c", show)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    # stdout belongs to the command: exactly its line, nothing from lockctl
    token1, lock_id = first.stdout.split()
    token2, _ = second.stdout.split()
    assert lock_id == "job"
    assert int(token1) > 0
    assert int(token2) > int(token1)
    assert_free(env, "job")


def test_command_not_found_releases_the_lock(env: dict[str, str]) -> None:
    result = lockctl(env, "run", "job", "--", "/nonexistent/command")
    assert result.returncode == 127
    assert "not found" in result.stderr
    assert_free(env, "job")


def test_sigterm_terminates_the_command_and_releases(env: dict[str, str], background: Background) -> None:
    marker, _ = background.hold("job", "holder")
    info = read_marker(marker)
    proc = background.procs[0]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT) == 128 + signal.SIGTERM, background.stderr(proc)
    assert marker.with_name(marker.name + ".term").read_text() == str(int(signal.SIGTERM))  # forwarded
    assert not pid_alive(info["pid"])
    assert_free(env, "job")


def test_signal_while_waiting_withdraws_from_the_queue(env: dict[str, str], background: Background) -> None:
    marker, release = background.hold("job", "holder")
    holder = read_marker(marker)["CHRONOLOCK_LOCK_OWNER"]
    waiter = background.start("run", "job", "--", "true")
    wait_for(lambda: len(status(env, "job")["queue"]) == 2, "the waiter to queue up")

    waiter.send_signal(signal.SIGINT)  # no terminal here: lockctl handles it like any other signal
    assert waiter.wait(timeout=WAIT) == 128 + signal.SIGINT, background.stderr(waiter)
    assert "SIGINT" in background.stderr(waiter)
    data = status(env, "job")
    assert data["holders"] == [holder]
    assert [entry["owner"] for entry in data["queue"]] == [holder]
    assert [lease["owner"] for lease in data["leases"]] == [holder]

    release.touch()
    assert background.procs[0].wait(timeout=WAIT) == 0
    assert_free(env, "job")


@pytest.mark.parametrize("mode", ["exit-on-term", "ignore-term"])
def test_lost_lock_terminates_the_command(
    env: dict[str, str], background: Background, store_url: str, mode: str
) -> None:
    marker, _ = background.hold("job", "holder", "--lease", "3", "--kill-grace", "0.5", mode=mode)
    info = read_marker(marker)
    owner = info["CHRONOLOCK_LOCK_OWNER"]
    proc = background.procs[0]

    revoke(store_url, "job", owner)

    assert proc.wait(timeout=WAIT) == EXIT_LOCK_LOST, background.stderr(proc)
    assert "lost lock 'job'" in background.stderr(proc)
    if mode == "ignore-term":
        assert "SIGKILL" in background.stderr(proc)
    assert marker.with_name(marker.name + ".term").exists()  # SIGTERM came first
    assert not pid_alive(info["pid"])
    assert_free(env, "job")


# -- bad input and failures ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a\x01b"])
def test_invalid_lock_id_exits_2(env: dict[str, str], name: str) -> None:
    for args in (["run", name, "--", "true"], ["status", name]):
        result = lockctl(env, *args)
        assert result.returncode == 2, result.stderr
        assert "lock id" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("option", [["--timeout", "-1"], ["--timeout", "nan"], ["--lease", "0"]])
def test_bad_numbers_exit_2(env: dict[str, str], option: list[str]) -> None:
    result = lockctl(env, "run", *option, "job", "--", "true")
    assert result.returncode == 2, result.stderr
    assert option[0] in result.stderr
    assert "Traceback" not in result.stderr


def test_store_unavailable_exits_69(env: dict[str, str], tmp_path: Path) -> None:
    """A store that is there but busy beyond busy_timeout: temporary, so 69. (This test used a
    path that is a directory; that is a configuration error now, exit 78: tests/security/
    test_settings_fail_loudly.py.)"""
    db = tmp_path / "cells.db"
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process's long write transaction
        env = {**env, "CHRONOLOCK_STORE_URL": f"sqlite:///{db}?busy_timeout=0.2"}
        result = lockctl(env, "run", "job", "--", "true")
    finally:
        holder.close()
    assert result.returncode == EXIT_UNAVAILABLE, result.stderr
    assert "unavailable" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_settings_exit_78(env: dict[str, str]) -> None:
    result = lockctl({**env, "CHRONOLOCK_STORE_URL": "mysql://nope"}, "status", "job")
    assert result.returncode == 78
    assert "store URL" in result.stderr
    assert "Traceback" not in result.stderr


# -- schema, status, help --------------------------------------------------------------------


def test_schema_on_sqlite_and_status_of_a_never_used_lock(env: dict[str, str], tmp_path: Path) -> None:
    for _ in range(2):  # idempotent
        result = lockctl(env, "schema")
        assert result.returncode == 0, result.stderr
        assert "SQLite" in result.stdout
    assert (tmp_path / "cells.db").exists()

    data = status(env, "never-used")
    assert data == {
        "lock_id": "never-used",
        "held": False,
        "holders": [],
        "fencing_token": 0,
        "fencing_owner": None,
        "queue": [],
        "leases": [],
    }
    table = lockctl(env, "status", "never-used")
    assert table.returncode == 0, table.stderr
    assert "none (free)" in table.stdout
    assert "never-used" in table.stdout


@pytest.mark.parametrize("command", [[], ["run"], ["status"], ["schema"]])
def test_help_lists_the_settings(env: dict[str, str], command: list[str]) -> None:
    result = lockctl(env, *command, "--help")
    assert result.returncode == 0, result.stderr
    for name in env_names(ClientSettings):
        assert name in result.stdout
    assert "[default: 10.0]" in result.stdout  # rich markup must not eat the defaults


@pytest.mark.cassandra
def test_schema_on_cassandra_is_idempotent(env: dict[str, str], local_cassandra: LocalCassandraNode) -> None:
    from lockclient.store.cassandra_schema import SCHEMA_VERSION

    env = {**env, "CHRONOLOCK_STORE_URL": local_cassandra.store_url("lockctl_schema")}
    for _ in range(2):
        result = lockctl(env, "schema", timeout=120)
        assert result.returncode == 0, result.stderr
        assert "CREATE KEYSPACE" in result.stdout
        assert "lockctl_schema.lock_lease" in result.stdout
        assert f"schema version {SCHEMA_VERSION}" in result.stdout
    # The local node is Cassandra 1.2: no lightweight transactions, so no locks; a clear refusal.
    refused = lockctl(env, "run", "job", "--", "true")
    assert refused.returncode == EXIT_UNAVAILABLE
    assert "compare-and-set" in refused.stderr
