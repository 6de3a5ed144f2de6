"""A worker records its own stalls (no CPU for its process) as observed faults on itself, so the
FIFO and liveness checkers judge a starved worker as they judge a paused one (tests/faults/worker.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.faults import worker
from tests.faults.checkers import History, check_fifo
from tests.faults.recorder import Recorder, read_events


class _Starved(threading.Event):
    """Each wait "takes" 2 s of monotonic time (the process got no CPU), then the monitor stops."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock[0] += 2_000_000_000
        self.set()
        return True


def test_a_starved_worker_records_a_stall_on_itself_that_excuses_its_fifo_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [10**12]
    monkeypatch.setattr("tests.faults.worker.time.monotonic_ns", lambda: clock[0])
    rec = Recorder(tmp_path / "w3.1.jsonl", "w3.1")
    worker.stall_monitor(rec, _Starved(clock))
    rec.close()
    events = read_events(tmp_path / "w3.1.jsonl")
    start = next(e for e in events if e["type"] == "fault_start")
    assert start["fault"] == "stall" and start["pids"] == [rec.pid] and start["t_start"] == 10**12
    assert start["params"]["host_s"] == pytest.approx(1.95)
    assert any(e["type"] == "fault_end" and e["fid"] == start["fid"] for e in events)

    # The stall is a disturbance of that process only: its overtaking is excused, nobody else's.
    h = History(events)
    assert h.disturbed("w3.1", rec.pid, 10**12 - 1, 10**12 + 1)
    assert not h.disturbed("w4.1", rec.pid + 1, 10**12 - 1, 10**12 + 1)
    assert check_fifo(h) == []
