"""Issue 25, item 4, at the command line: ``lockctl run`` labels its holder with its command (or
``--label``), ``lockctl list`` shows the locks held or awaited straight from the store (no
leasewatch running here), and ``lockctl revoke NAME --token N`` ends exactly that holder.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.cli.support import EXIT_LOCK_LOST, HOLD, Background, lockctl, read_marker, status, wait_for

pytestmark = pytest.mark.slow


def _list(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = lockctl(env, "list", "--json", *args)
    assert result.returncode == 0, result.stderr
    data: list[dict[str, Any]] = json.loads(result.stdout)
    return data


def test_list_shows_holder_label_token_held_for_and_waiters(env: dict[str, str], background: Background) -> None:
    assert _list(env) == []
    assert lockctl(env, "list").stdout.strip() == "no lock is held or awaited"
    marker, release = background.hold("job", "holder")
    held = read_marker(marker)
    waiter = background.start("run", "--label", "nightly report (cron on web-3)", "job", "--", "true")
    wait_for(lambda: len(status(env, "job")["queue"]) == 2, "the waiter to queue")
    (line,) = _list(env)
    (holder,) = line["holders"]
    assert (line["lock_id"], line["kind"], line["waiters"]) == ("job", "lock", 1)
    assert holder["owner"] == held["CHRONOLOCK_LOCK_OWNER"]
    assert holder["fencing_token"] == int(held["CHRONOLOCK_FENCING_TOKEN"]) == 1
    # The default label is the command line, shortened to 200 bytes (here: long temporary paths).
    command = f"lockctl run: {sys.executable} {HOLD} {marker} {release} exit-on-term"
    assert holder["label"] == (command if len(command) <= 200 else command[:197] + "…")  # "…": 3 bytes
    assert holder["label"].startswith(f"lockctl run: {sys.executable} ")
    assert holder["held_for_s"] is not None and 0 <= holder["held_for_s"] < 60
    assert line["waiter_labels"] == ["nightly report (cron on web-3)"]
    table = lockctl(env, "list").stdout
    assert held["CHRONOLOCK_LOCK_OWNER"] in table and "lockctl run:" in table, table
    shown = status(env, "job")
    assert [entry["label"] for entry in shown["queue"]] == [holder["label"], "nightly report (cron on web-3)"]
    release.touch()
    assert waiter.wait(timeout=30) == 0
    assert _list(env) == [] and [line["lock_id"] for line in _list(env, "--all")] == ["job"]


def test_a_long_command_is_shortened_and_a_bad_label_is_refused(env: dict[str, str], background: Background) -> None:
    marker, release = background.hold("long", "holder", "--label", "x" * 200)
    read_marker(marker)
    assert _list(env)[0]["holders"][0]["label"] == "x" * 200
    release.touch()
    assert background.procs[0].wait(timeout=30) == 0
    done = lockctl(env, "run", "--try", "long", "--", sys.executable, "-c", "import sys; sys.exit(0)", "y" * 300)
    assert done.returncode == 0, done.stderr
    for bad, why in (("x" * 201, "the limit is 200"), ("a\nb", "control characters")):
        refused = lockctl(env, "run", "--label", bad, "long", "--", "true")
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr


def test_revoke_ends_the_holder_with_that_token_only(env: dict[str, str], background: Background) -> None:
    marker, _release = background.hold("stuck", "holder", "--label", "stuck job")
    held = read_marker(marker)
    token = int(held["CHRONOLOCK_FENCING_TOKEN"])
    waiter = background.start("run", "stuck", "--", "true")
    wait_for(lambda: len(status(env, "stuck")["queue"]) == 2, "the waiter to queue")

    wrong = lockctl(env, "revoke", "stuck", "--token", str(token + 1))
    assert wrong.returncode == 1, wrong.stderr
    assert f"no current holder of lock 'stuck' has fencing token {token + 1}" in wrong.stderr
    assert f"held by {held['CHRONOLOCK_LOCK_OWNER']} (token {token})" in wrong.stderr
    assert status(env, "stuck")["holders"] == [held["CHRONOLOCK_LOCK_OWNER"]]  # nothing revoked
    assert lockctl(env, "revoke", "nobody-holds-this", "--token", "1").returncode == 1
    assert lockctl(env, "revoke", "stuck").returncode == 2  # --token is required

    done = lockctl(env, "revoke", "stuck", "--token", str(token))
    assert done.returncode == 0, done.stderr
    assert f"revoked lock 'stuck': holder {held['CHRONOLOCK_LOCK_OWNER']} (stuck job), fencing token {token}" in (
        done.stderr
    )
    # The waiter takes its turn; the revoked lockctl learns at its next renewal and stops its command.
    assert waiter.wait(timeout=30) == 0
    assert background.procs[0].wait(timeout=30) == EXIT_LOCK_LOST
    assert "lost lock 'stuck'" in background.stderr(background.procs[0])


def test_revoke_a_semaphore_permit(env: dict[str, str], background: Background) -> None:
    marker, _release = background.hold("pool", "first", "--limit", "2", "--label", "first permit")
    first = read_marker(marker)
    marker2, release2 = background.hold("pool", "second", "--limit", "2")
    second = read_marker(marker2)
    (line,) = _list(env)
    assert (line["lock_id"], line["kind"]) == ("pool", "semaphore")
    assert sorted(h["fencing_token"] for h in line["holders"]) == [1, 2]
    token = int(first["CHRONOLOCK_FENCING_TOKEN"])
    assert lockctl(env, "revoke", "pool", "--token", str(token)).returncode == 1  # not the lock "pool"
    done = lockctl(env, "revoke", "pool", "--kind", "semaphore", "--token", str(token))
    assert done.returncode == 0, done.stderr
    assert background.procs[0].wait(timeout=30) == EXIT_LOCK_LOST
    (after,) = _list(env)
    assert [h["owner"] for h in after["holders"]] == [second["CHRONOLOCK_LOCK_OWNER"]]
    release2.touch()
    assert background.procs[1].wait(timeout=30) == 0


def test_help_says_list_reads_the_store_and_revoke_needs_the_token(env: dict[str, str]) -> None:
    listed = lockctl(env, "list", "--help").stdout
    assert "without" in listed and "leasewatch" in listed and "--json" in listed, listed
    revoked = lockctl(env, "revoke", "--help").stdout
    assert "--token" in revoked and "--kind" in revoked, revoked
    assert "--label" in lockctl(env, "run", "--help").stdout
