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
    tokens = [h["token"] for h in history]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "tokens strictly increase in hold order"
    assert not any(h["stale"] for h in history), "the fenced resource refused a current holder"


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
    window = window_until_first_finishes(fair, k)
    shares = {pid: sum(1 for h in window if h["pid"] == pid) / len(window) for pid in {h["pid"] for h in fair}}
    assert len(shares) == n
    assert longest_run(fair) <= 2, f"longest run by one process: {longest_run(fair)}"
    for pid, share in shares.items():
        assert abs(share - 1 / n) <= 0.1 / n, f"process {pid} got {share:.1%} of acquisitions, fair is {1 / n:.0%}"
    ops = sorted(h["ops"] for h in fair)
    assert ops[len(ops) // 2] <= 30, f"median store ops per contended acquisition: {ops[len(ops) // 2]}"

    # The baseline on the same store and time service: exclusive too, but unfair.
    unfair = run_contenders(tmp_path, sqlite_url, urls, n, k // 2, "backoff", "backoff-lock")
    assert_mutual_exclusion(unfair, n * k // 2)
    unfair_window = window_until_first_finishes(unfair, k // 2)
    unfair_shares = [
        sum(1 for h in unfair_window if h["pid"] == pid) / len(unfair_window) for pid in {h["pid"] for h in unfair}
    ]
    assert longest_run(unfair) > 2 or max(abs(s - 1 / n) for s in unfair_shares) > 0.1 / n, (
        "the backoff baseline was expected to be unfair"
    )
    assert longest_run(unfair) > longest_run(fair)


def test_lock_state_is_empty_after_the_run(tmp_path: Path, sqlite_url: str) -> None:
    run_contenders(tmp_path, sqlite_url, "", 3, 20, "queue", "tidy")
    with open_store(sqlite_url) as store, RemoteLocker(store) as locker:
        status = locker.status("tidy")
        assert status.holders == [] and status.queue == [] and status.leases == {}
        assert status.fencing_token == 60


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
