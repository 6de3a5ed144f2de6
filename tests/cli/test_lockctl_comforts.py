"""Issue 25, item 4, at the command line: ``lockctl run -E CODE``, a ``-v`` that says where the run
stands in the queue (not httpx's request lines), ``--try`` shown as a flag, and services that do
not log their own HTTP polling.

The findings: ``lockctl -v`` printed raw httpx request lines instead of "waiting behind X, 2nd in
line"; leasewatch logged ~1.5 httpx INFO lines a second about its own polling; typer showed
``--try <bool>`` as if it took a value; and there was no flock-like ``-E`` for the conflict status.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.cli.support import EXIT_BUSY, Background, lockctl, read_marker, status, wait_for
from tests.support.procs import fleet

pytestmark = pytest.mark.slow


def test_conflict_exit_code_like_flock_e(env: dict[str, str], background: Background) -> None:
    marker, release = background.hold("job", "holder")
    read_marker(marker)
    assert lockctl(env, "run", "--try", "-E", "9", "job", "--", "true").returncode == 9
    assert lockctl(env, "run", "--timeout", "0.2", "--conflict-exit-code", "3", "job", "--", "true").returncode == 3
    assert lockctl(env, "run", "--try", "job", "--", "true").returncode == EXIT_BUSY  # the default stays 75
    refused = lockctl(env, "run", "--try", "-E", "256", "job", "--", "true")
    assert refused.returncode == 2, refused.stderr  # an exit status is 0-255
    release.touch()
    assert background.procs[0].wait(timeout=30) == 0
    # -E only renames the conflict: the command's own status passes through.
    assert lockctl(env, "run", "-E", "9", "job", "--", sys.executable, "-c", "raise SystemExit(4)").returncode == 4


def test_verbose_says_where_the_run_waits_and_no_http_request_lines(
    env: dict[str, str], background: Background, store_url: str, tmp_path: Path
) -> None:
    services = tmp_path / "services"
    services.mkdir()
    with fleet(services) as processes:
        timesvc = processes.timesvc(store_url)
        env = env | {"CHRONOLOCK_TIMESVC_URLS": timesvc.url}
        background.env = env
        marker, release = background.hold("job", "holder")
        holder = read_marker(marker)["CHRONOLOCK_LOCK_OWNER"]
        first = background.start("run", "-v", "job", "--", "true")
        wait_for(lambda: len(status(env, "job")["queue"]) == 2, "the first waiter to queue")
        second = background.start("run", "-v", "job", "--", "true")
        wait_for(lambda: len(status(env, "job")["queue"]) == 3, "the second waiter to queue")
        first_owner = status(env, "job")["queue"][1]["owner"]
        for waiter in (first, second):
            wait_for(lambda waiter=waiter: "in line" in background.stderr(waiter), "each waiter to say where it stands")
        time.sleep(1.5)  # a renewal or two, each an HTTP request to timesvc for global time
        release.touch()
        assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    said_first, said_second = background.stderr(first), background.stderr(second)
    assert f"lockctl: lock 'job': waiting behind {holder} (the holder), 1st in line" in said_first, said_first
    assert f"lockctl: lock 'job': waiting behind {first_owner}, 2nd in line" in said_second, said_second
    assert re.search(r"lockctl: lock 'job': acquired after [\d.]+ s, fencing token \d+; running true", said_first)
    for said in (said_first, said_second):
        assert "HTTP Request" not in said and "httpx" not in said, said


def test_try_is_shown_as_a_flag_in_help(env: dict[str, str]) -> None:
    shown = lockctl(env, "run", "--help").stdout
    lines = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│ --")}
    assert "<bool>" not in lines["--try"] and "<int>" not in lines["--verbose"], shown
    assert "<float>" in lines["--timeout"]  # options that take a value still say which
    assert "CODE" in lines["--conflict-exit-code"]


def test_leasewatch_does_not_log_its_own_http_polling(store_url: str, tmp_path: Path) -> None:
    """leasewatch polls every timesvc replica every 2 s; at the default level (info) its log must
    not carry a line per request."""
    with fleet(tmp_path) as processes:
        timesvc = processes.timesvc(store_url)
        watcher = processes.leasewatch(
            store_url, env={"LEASEWATCH_TIMESVC_URLS": timesvc.url, "LEASEWATCH_LOG_LEVEL": "info"}
        )
        wait_for(lambda: _polled(watcher.url), "leasewatch's first poll of timesvc")
        time.sleep(5)  # two or three more polls, every 2 s
        log = watcher.log_path.read_text()
    assert "HTTP Request" not in log, log[-2000:]


def _polled(url: str) -> bool:
    import httpx

    try:
        replicas = httpx.get(f"{url}/time", timeout=2).json()["replicas"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return bool(replicas) and all(r.get("offset_s") is not None for r in replicas)
