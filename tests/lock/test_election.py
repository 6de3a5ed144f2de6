"""Leader election on the real SQLite store (issue 26): one leader per term, terms strictly increase;
candidates served in order; ``leader()``; ``run`` / ``arun`` stop as leader when leadership is lost
(``arun`` cancels the coroutine); and with real processes and a real leasewatch: a SIGKILLed or
SIGSTOPped leader is replaced within the revocation bound, and the paused one's write, once it
resumes, is refused by the fenced resource."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, LockLost, RemoteLocker, open_store
from lockclient.election import Leadership
from tests.lock import election_worker
from tests.lock.test_semaphore import BOUND, EARLIEST, GRACE, LEASE, SCAN
from tests.support.procs import Fleet
from tests.support.waiting import StallProbe, assert_within_bound, wait_queued, wait_until


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5, allow_store_clock=True) as lk:
        yield lk


def test_leader_term_and_since(locker: RemoteLocker) -> None:
    election = locker.election("scheduler")
    assert election.leader() is None
    before = locker.clock.now_us()
    elected: list[Leadership] = []
    election.on_elected(elected.append)
    with election.campaign() as leadership:
        after = locker.clock.now_us()
        info = election.leader()
        assert info is not None and elected == [leadership]
        assert (info.owner, info.term) == (leadership.owner, leadership.term) == (leadership.owner, 1)
        assert info.since_us is not None and before <= info.since_us <= after
        assert leadership.fencing_token == leadership.term and leadership.held
        assert election.candidates() == [leadership.owner]
        # The election is the lock of its name: lockctl status shows its leader.
        assert locker.status("scheduler").holders == [leadership.owner]
    assert election.leader() is None and leadership.resigned and not leadership.held
    with election.campaign() as second:
        assert second.term == 2


def test_candidates_are_elected_in_the_order_they_stood(locker: RemoteLocker, sqlite_url: str) -> None:
    election = locker.election("ordered")
    first = election.campaign()
    order: list[int] = []
    other = RemoteLocker(open_store(sqlite_url), lease=5, allow_store_clock=True, owns_store=True)
    threads = []
    try:
        for i in range(4):
            client = other if i % 2 else locker

            def stand(i: int = i, client: RemoteLocker = client) -> None:
                client.election("ordered").run(lambda leadership: order.append(i), timeout=60)

            t = threading.Thread(target=stand)
            t.start()
            threads.append(t)
            wait_queued(
                lambda: [entry.ticket for entry in locker.status(election.name).queue],
                i + 2,
                [locker.clock, other.clock],
                f"candidate {i} to stand",
            )
        first.resign()
        for t in threads:
            t.join(60)
        assert order == [0, 1, 2, 3]
        info = election.leader()
        assert info is None
    finally:
        other.close()


def test_run_reports_a_term_lost_while_leading(locker: RemoteLocker, store: CellStore) -> None:
    election = locker.election("revoked")
    lost: list[tuple[int, str]] = []
    election.on_lost(lambda leadership, reason: lost.append((leadership.term, reason)))

    def lead(leadership: Leadership) -> str:
        Watcher(store, grace=0).revoke_now("revoked")  # an operator (or leasewatch) deposes us
        assert leadership.lost.wait(10), "a deposed leader learns it at its next renewal"
        return "stopped"

    with pytest.raises(LockLost):
        election.run(lead)
    wait_until(lambda: bool(lost), "on_lost")
    assert lost[0][0] == 1 and "revoked" in lost[0][1]


def test_arun_cancels_the_leader_coroutine_when_leadership_is_lost(locker: RemoteLocker, store: CellStore) -> None:
    election = locker.election("aio-leader")
    cancelled = threading.Event()

    async def lead(leadership: Leadership) -> None:
        try:
            await asyncio.to_thread(Watcher(store, grace=0).revoke_now, "aio-leader")
            await asyncio.sleep(60)  # never ends by itself: only losing leadership stops it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(LockLost):
            await election.arun(lead)
        return time.monotonic() - started

    took = asyncio.run(main())
    assert cancelled.is_set() and took < 30
    assert election.leader() is None


def test_arun_returns_the_coroutines_result_and_resigns(locker: RemoteLocker) -> None:
    election = locker.election("aio-ok")

    async def lead(leadership: Leadership) -> int:
        assert (await election.aleader()) is not None
        return leadership.term

    assert asyncio.run(election.arun(lead)) == 1
    assert election.leader() is None


def read(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def start_candidates(tmp_path: Path, sqlite_url: str, name: str, n: int) -> tuple[Path, list[Any]]:
    out = tmp_path / f"{name}.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=election_worker.candidate, args=(sqlite_url, name, str(out), LEASE)) for _ in range(n)]
    for p in procs:
        p.start()
    wait_until(lambda: sum(1 for e in read(out) if e["what"] == "ready") == n, "candidates to start", timeout=60)
    return out, procs


def first_elected_after(out: Path, at_ns: int) -> dict[str, Any] | None:
    return next((e for e in read(out) if e["what"] == "elected" and e["at"] > at_ns), None)


def assert_one_leader_per_term(history: list[dict[str, Any]]) -> None:
    terms = [e["term"] for e in history if e["what"] == "elected"]
    assert terms == sorted(terms) and len(set(terms)) == len(terms), f"terms {terms}"


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_failed_leader_is_replaced_within_the_bound_and_cannot_write_after(
    processes: Fleet, tmp_path: Path, sqlite_url: str, fault: str
) -> None:
    processes.leasewatch(sqlite_url, scan_interval=SCAN, grace=GRACE)
    out, procs = start_candidates(tmp_path, sqlite_url, f"leader-{fault}", 3)
    try:
        wait_until(lambda: first_elected_after(out, 0) is not None, "a first leader", timeout=30)
        first = first_elected_after(out, 0)
        assert first is not None
        wait_until(lambda: any(e["what"] == "wrote" for e in read(out)), "the leader to write")
        with StallProbe() as stalls:
            failed_at = time.monotonic_ns()
            os.kill(first["pid"], signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
            wait_until(lambda: first_elected_after(out, failed_at) is not None, "a new leader", timeout=BOUND + 60)
        second = first_elected_after(out, failed_at)
        assert second is not None
        took = (second["at"] - failed_at) / 1e9
        what = f"election: {fault} of the leader -> a new leader"
        assert_within_bound(took, BOUND, stalls, failed_at, what, earliest=EARLIEST)
        assert second["pid"] != first["pid"] and second["term"] > first["term"]
        if fault == "SIGSTOP":
            wait_until(
                lambda: any(e["what"] == "wrote" and e["term"] == second["term"] for e in read(out)),
                "the new leader to write",
            )
            os.kill(first["pid"], signal.SIGCONT)
            wait_until(
                lambda: any(e["pid"] == first["pid"] and e["what"] in ("refused", "lost") for e in read(out)),
                "the resumed leader to find out",
            )
            resumed = [e for e in read(out) if e["pid"] == first["pid"] and e["at"] > failed_at]
            # Its first act after the pause is a write with its old term: the resource refuses it.
            assert resumed[0]["what"] == "refused", resumed[:3]
        history = read(out)
        assert_one_leader_per_term(history)
        late = [e for e in history if e["pid"] == first["pid"] and e["what"] == "wrote" and e["at"] > failed_at]
        assert not late, f"the deposed leader wrote after the failover: {late}"
    finally:
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.join(5)
