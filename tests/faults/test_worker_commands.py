"""The command a ``lockctl run`` driver runs records when it stops believing it holds the lock, on
every way out (tests/faults/worker.py): the lease checker ends a lockctl hold there, and with no
record it runs the belief on to lockctl's own exit — after lockctl's release and the grants that
follow it, which it then reports as lease violations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import worker
from tests.faults.checkers import History, check_lease_exclusion
from tests.faults.recorder import read_events


def test_a_command_whose_store_cannot_open_records_its_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk made the command's SQLite store fail to open (CI beside stress-ng, 2026-12-07);
    # here a path under a regular file does. The witness process is the other record of a
    # command's end; it records nothing if it starts after the command is gone, so it is left out.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("CHRONOLOCK_STORE_URL", f"sqlite:///{blocker}/store.db")
    monkeypatch.setenv("FAULTS_OP_ID", "drv.1")
    monkeypatch.setenv("CHRONOLOCK_LOCK_ID", "mix:4")
    monkeypatch.setenv("CHRONOLOCK_FENCING_TOKEN", "234")
    monkeypatch.setenv("CHRONOLOCK_LOCK_OWNER", "vm.1.MainThread.cmd")
    history = tmp_path / "history"
    history.mkdir()
    argv = ["drv.cmd1", "--history", str(history), "--kind", "command", "--stop-file", str(tmp_path / "stop")]
    command = worker.Worker(worker.parse(argv))
    monkeypatch.setattr(command, "_witness_death", lambda *args: None)
    with pytest.raises(Exception):  # noqa: B017 - whatever the store raises, the command fails
        command.run_command()
    command.rec.close()
    events = read_events(history / "drv.cmd1.jsonl")
    exits = [e for e in events if e["type"] == "cmd_exit"]
    assert len(exits) == 1 and exits[0]["reason"].startswith("error: ")

    # The checker ends the command's belief there, so a grant after it is no violation.
    start = next(e for e in events if e["type"] == "cmd_start")
    later = start["t"] + 10**9
    grant = {"t": later, "type": "ok", "op": "acquire", "id": "w1.1", "lock": "mix:4", "mode": "get",
             "owner": "w1.owner", "token": 235, "proc": "w1", "pid": 1, "until": later + 5 * 10**9}  # fmt: skip
    release = {"t": later + 10**7, "type": "invoke", "op": "release", "owner": "w1.owner", "proc": "w1", "pid": 1}
    lockctl_exit = {"t": later + 10**8, "type": "fail", "op": "acquire", "id": "drv.1", "lock": "mix:4",
                    "mode": "lockctl", "exit": 1, "proc": "drv", "pid": 2}  # fmt: skip
    h = History([*events, grant, release, lockctl_exit])
    hold = next(x for x in h.holds if x.kind == "lockctl")
    assert hold.end_reason == "command exited" and hold.end == exits[0]["t"]
    assert check_lease_exclusion(h) == []
