"""Mutual exclusion and fairness with real processes, a real store and timesvc (DESIGN.md §7.1, §7.4)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from itertools import groupby, pairwise
from pathlib import Path
from typing import Any

import pytest

from lockclient import RemoteLocker, StoreError, open_store
from tests.lock import workers
from tests.support.procs import Fleet

pytestmark = pytest.mark.slow


def run_contenders(
    tmp_path: Path, store_url: str, timesvc_urls: str, processes: int, k: int, algorithm: str, lock_id: str
) -> list[dict[str, Any]]:
    out = tmp_path / f"out-{algorithm}"
    out.mkdir()
    go = tmp_path / f"go-{algorithm}"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=workers.contend,
            args=(store_url, timesvc_urls, lock_id, k, str(out), str(go), algorithm),
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    while len(list(out.glob("ready-*"))) < processes:  # every contender warmed up
        assert time.monotonic() < deadline, "contenders did not start"
        time.sleep(0.01)
    go.touch()  # start together
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"contender exited with {p.exitcode}"
    history: list[dict[str, Any]] = []
    for f in out.glob("history-*.json"):
        history.extend(json.loads(f.read_text()))
    return sorted(history, key=lambda h: h["enter"])


def assert_mutual_exclusion(history: list[dict[str, Any]], expected: int) -> None:
    assert len(history) == expected, "every acquisition accounted for"
    for before, after in pairwise(history):
        assert before["exit"] < after["enter"], f"overlapping holds: {before} and {after}"
    by_grant = sorted(history, key=lambda h: h["granted"])
    for before, after in pairwise(by_grant):
        # The lease-level invariant: at every grant, no other owner still holds with a lease it
        # considers valid (held until it called release(), or its lease ran out by its clock).
        assert before["held_until"] < after["granted"], f"granted while another owner held: {before} {after}"
    tokens = [h["token"] for h in history]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "tokens strictly increase in hold order"
    assert not any(h["stale"] for h in history), "the fenced resource refused a current holder"
    assert not any(h["lost"] for h in history), "a holder lost its lock without any fault"


def assert_fifo_by_ticket(history: list[dict[str, Any]]) -> None:
    """What the fair queue promises (DESIGN.md §5): the lock goes to the earliest ticket among
    the queue cells the grant's look could see. So a grant to ticket t is a violation only if
    another contender's cell with a smaller ticket was already written when that look started,
    and that contender was granted later. A lock handed over by its holder's release (issue 27)
    was decided by the releaser's read of the queue's head: that is its look (CLOCK_MONOTONIC is
    one clock for the processes of one machine)."""
    handed_reads = {h["handed_to"]: h["handed_read"] for h in history if h.get("handed_to")}
    for h in history:
        if h["looked"] is None and h["ticket"] in handed_reads:
            h["looked"] = handed_reads[h["ticket"]]
    assert all(h["looked"] is not None for h in history), "a grant whose deciding read is unknown"
    by_grant = sorted(history, key=lambda h: h["granted"])
    for i, granted in enumerate(by_grant):
        for later in by_grant[i + 1 :]:
            if later["ticket"] < granted["ticket"]:
                assert later["enqueued"] > granted["looked"], f"FIFO: {later} was queued ahead of {granted}"


def window_until_first_finishes(history: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The part of the run in which every process was still contending."""
    counts: dict[int, int] = {}
    for i, h in enumerate(history):
        counts[h["pid"]] = counts.get(h["pid"], 0) + 1
        if counts[h["pid"]] == k:
            return history[: i + 1]
    return history


def longest_run(history: list[dict[str, Any]]) -> int:
    return max(len(list(group)) for _, group in groupby(h["pid"] for h in history))


def test_five_processes_mutual_exclusion_and_fairness_vs_backoff(
    processes: Fleet, tmp_path: Path, sqlite_url: str
) -> None:
    replicas = [processes.timesvc(sqlite_url, name=f"t{i}") for i in range(2)]
    for r in replicas:
        r.wait_ready()
    urls = ",".join(r.url for r in replicas)
    n, k = 5, 200

    fair = run_contenders(tmp_path, sqlite_url, urls, n, k, "queue", "fair-lock")
    assert_mutual_exclusion(fair, n * k)
    assert_fifo_by_ticket(fair)
    window = window_until_first_finishes(fair, k)
    shares = {pid: sum(1 for h in window if h["pid"] == pid) / len(window) for pid in {h["pid"] for h in fair}}
    assert len(shares) == n, "every process was served while all contended"
    ops = sorted(h["ops"] for h in fair)
    assert ops[len(ops) // 2] <= 30, f"median store ops per contended acquisition: {ops[len(ops) // 2]}"
    # Runs and shares follow from FIFO only as far as the scheduler lets every process re-queue
    # in time: reported (bench/ measures them), not asserted — a busy machine changes them.
    print(f"fair: longest run {longest_run(fair)}, shares {sorted(round(v, 3) for v in shares.values())}")

    # The baseline on the same store and time service: exclusive too (the same grant).
    unfair = run_contenders(tmp_path, sqlite_url, urls, n, k // 2, "backoff", "backoff-lock")
    assert_mutual_exclusion(unfair, n * k // 2)
    print(f"backoff: longest run {longest_run(unfair)}")


def test_lock_state_is_empty_after_the_run(tmp_path: Path, sqlite_url: str) -> None:
    run_contenders(tmp_path, sqlite_url, "", 3, 20, "queue", "tidy")
    with open_store(sqlite_url) as store, RemoteLocker(store) as locker:
        status = locker.status("tidy")
        assert status.holders == [] and status.queue == [] and status.leases == {}
        # One per grant, and one per speculative grant given back (lockclient/fairqueue.py): the
        # counter only ever moves up, by at least one per holder.
        assert status.fencing_token >= 60


@pytest.mark.cassandra
def test_mutual_exclusion_on_a_modern_cassandra(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not os.environ.get("CHRONOLOCK_TEST_CASSANDRA"):
        pytest.skip(
            "leases and fencing need compare-and-set (LWT, Cassandra 2.0+) and the local node is 1.2: "
            "set CHRONOLOCK_TEST_CASSANDRA=host:port to run this against Cassandra 4.x/5.x"
        )
    url: str = request.getfixturevalue("modern_cassandra_url")
    history = run_contenders(tmp_path, url, "", 3, 30, "queue", f"cassandra-lock-{os.getpid()}")
    assert_mutual_exclusion(history, 90)


@pytest.mark.cassandra
def test_locker_refuses_a_store_without_compare_and_set(local_cassandra_url: str) -> None:
    """On the local Cassandra 1.2 node the lock must refuse clearly, never run without leases."""
    with open_store(local_cassandra_url) as store, pytest.raises(StoreError, match="compare-and-set"):
        RemoteLocker(store)
