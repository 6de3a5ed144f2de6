"""``lockctl run --limit / --shared / --exclusive``, ``lockctl elect`` and ``lockctl watch`` (issue 26), real
processes on a real SQLite store: permits and read/write locks admit exactly what they promise (read from
the store while the commands run, not from timing); an elected command whose lockctl is SIGKILLed dies at
once and the next candidate's command starts after leasewatch revoked the term, with a higher term;
``watch`` prints JSON lines; bad combinations exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockclient.lease import holder_columns
from lockclient.lockid import primitive_row
from lockclient.store import Table, open_store
from tests.cli.support import (
    EXIT_BUSY,
    HOLD,
    LOCKCTL,
    WAIT,
    Background,
    can_run,
    lockctl,
    read_marker,
    wait_for,
)
from tests.support.procs import Fleet

LEASE = 2.0


def held_and_queued(store_url: str, name: str, kind: str) -> tuple[int, int]:
    row_id = primitive_row(name, kind)
    with open_store(store_url) as store:
        return len(holder_columns(store.read_versioned(row_id))), len(store.read_row(Table.QUEUE, row_id))


def test_run_limit_runs_up_to_n_commands_at_once(env: dict[str, str], background: Background, store_url: str) -> None:
    holds = [background.hold("pool", f"p{i}", "--limit", "2") for i in range(3)]
    wait_for(
        lambda: held_and_queued(store_url, "pool", "semaphore") == (2, 3) and sum(m.exists() for m, _ in holds) == 2,
        "two commands running under the two permits, one waiting",
    )
    running = [marker for marker, _ in holds if marker.exists()]
    assert held_and_queued(store_url, "pool", "semaphore") == (2, 3) and len(running) == 2
    infos = [read_marker(marker) for marker in running]
    assert {i["CHRONOLOCK_LOCK_ID"] for i in infos} == {"pool"}
    assert {i["CHRONOLOCK_LOCK_KIND"] for i in infos} == {"semaphore"}
    assert len({i["CHRONOLOCK_FENCING_TOKEN"] for i in infos}) == 2
    assert lockctl(env, "run", "--limit", "2", "--try", "pool", "--", "true").returncode == EXIT_BUSY
    first_release = next(release for marker, release in holds if marker == running[0])
    first_release.touch()
    third = next(marker for marker, _ in holds if marker not in running)
    info = read_marker(third)
    assert int(info["CHRONOLOCK_FENCING_TOKEN"]) == 3
    for _, release in holds:
        release.touch()
    wait_for(lambda: held_and_queued(store_url, "pool", "semaphore") == (0, 0), "every permit released")


def test_run_shared_and_exclusive(env: dict[str, str], background: Background, store_url: str) -> None:
    readers = [background.hold("catalog", f"r{i}", "--shared") for i in range(2)]
    for marker, _ in readers:
        read_marker(marker)  # both run at once
    assert held_and_queued(store_url, "catalog", "rwlock") == (2, 2)
    writer_marker, writer_release = background.hold("catalog", "w", "--exclusive")
    wait_for(lambda: held_and_queued(store_url, "catalog", "rwlock") == (2, 3), "the writer queued")
    late_marker, late_release = background.hold("catalog", "late", "--shared")
    wait_for(lambda: held_and_queued(store_url, "catalog", "rwlock") == (2, 4), "a late reader queued")
    assert not writer_marker.exists() and not late_marker.exists(), "the writer waits; the late reader waits for it"
    for _, release in readers:
        release.touch()
    writer = read_marker(writer_marker)
    assert writer["CHRONOLOCK_LOCK_KIND"] == "rwlock"
    assert held_and_queued(store_url, "catalog", "rwlock")[0] == 1 and not late_marker.exists()
    writer_release.touch()
    read_marker(late_marker)
    late_release.touch()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "2", "--shared"], "exclude each other"),
        (["--once-per", "1h", "--timeout", "5"], "never waits"),
        (["--once-per", "soon"], "not a duration"),
        (["--once-per", "1h", "--tolerance", "40m"], "at most half"),
        (["--tolerance", "1m"], "goes with --once-per"),
        (["--limit", "0"], "between 1 and 256"),
    ],
)
def test_bad_combinations_exit_2(env: dict[str, str], args: list[str], message: str) -> None:
    result = lockctl(env, "run", *args, "job", "--", "true")
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_elect_runs_the_command_only_while_leader_and_fails_over(
    env: dict[str, str], background: Background, processes: Fleet, store_url: str, tmp_path: Path
) -> None:
    processes.leasewatch(store_url, scan_interval=0.2, grace=0.5)
    first_marker, _ = tmp_path / "c0.marker", tmp_path / "c0.release"
    first = background.start(
        "elect",
        "scheduler",
        "--lease",
        str(LEASE),
        "--",
        sys.executable,
        str(HOLD),
        str(first_marker),
        str(tmp_path / "c0.release"),
    )
    leader = read_marker(first_marker)
    assert leader["CHRONOLOCK_LOCK_KIND"] == "election" and leader["CHRONOLOCK_TERM"] == "1"
    assert leader["CHRONOLOCK_FENCING_TOKEN"] == leader["CHRONOLOCK_TERM"]
    second_marker = tmp_path / "c1.marker"
    background.start(
        "elect",
        "scheduler",
        "--lease",
        str(LEASE),
        "--",
        sys.executable,
        str(HOLD),
        str(second_marker),
        str(tmp_path / "c1.release"),
    )
    wait_for(
        lambda: len(json.loads(lockctl(env, "status", "scheduler", "--json").stdout)["queue"]) == 2,
        "a second candidate",
    )
    assert not second_marker.exists(), "only the leader runs its command"
    killed = time.monotonic()
    first.send_signal(signal.SIGKILL)
    wait_for(lambda: not can_run(int(leader["pid"])), "the deposed leader's command to die", timeout=5)
    died = time.monotonic() - killed
    follower = read_marker(second_marker)
    took = time.monotonic() - killed
    print(f"lockctl elect: SIGKILL -> command dead after {died * 1000:.0f} ms, next leader's command after {took:.2f}s")
    assert int(follower["CHRONOLOCK_TERM"]) > int(leader["CHRONOLOCK_TERM"])
    assert took < LEASE + 0.5 + 0.4 + 1.5 + 2.0, "failover within the revocation bound (+ lockctl's start-up)"


def test_watch_prints_json_lines(env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(LOCKCTL), "watch", "job", "--count", "2", "--timeout", str(WAIT), "--poll", "0.05"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # lockctl's own start-up (a watch started later would see only the end state)
        deadline = time.monotonic() + WAIT
        while proc.poll() is None and time.monotonic() < deadline:
            assert (
                lockctl(env, "run", "job", "--", sys.executable, "-c", "import time; time.sleep(0.3)").returncode == 0
            )
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["kind"] for line in lines] == ["granted", "released"], lines
    assert lines[0]["token"] == lines[1]["token"] and lines[0]["name"] == "job" and "at" in lines[0]


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["run", "--help"], ["--limit", "--shared", "--exclusive", "--once-per", "--tolerance"]),
        (["elect", "--help"], ["CHRONOLOCK_TERM", "Exit status"]),
        (["watch", "--help"], ["granted", "behind", "--count"]),
    ],
)
def test_help(env: dict[str, str], command: list[str], words: list[str]) -> None:
    result = lockctl(env, *command)
    assert result.returncode == 0
    for word in words:
        assert word in result.stdout, word
