"""timesvc on the real Cassandra node (1.2, shared/cassandra-local.md): GlobalTime needs only
last-write-wins and QUORUM visibility, which that node has. A stopped node is a store outage."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from tests.support.cassandra_node import LocalCassandraNode
from tests.support.history import monotonic_read_violations
from tests.support.procs import Fleet
from tests.timesvc.test_replicas import hammer

pytestmark = [pytest.mark.slow, pytest.mark.cassandra]


def test_replicas_on_cassandra_never_go_backwards(processes: Fleet, local_cassandra_url: str) -> None:
    replicas = [processes.timesvc(local_cassandra_url, name=f"c{i}") for i in range(3)]
    for r in replicas:
        r.wait_ready()
    reads = asyncio.run(hammer([r.url for r in replicas], clients=12, seconds=4))
    assert len(reads) > 100
    assert monotonic_read_violations(reads) == []


def test_cassandra_outage_gives_503_then_recovers(
    processes: Fleet, local_cassandra: LocalCassandraNode, local_cassandra_url: str
) -> None:
    url = local_cassandra_url + "&timeout=1"
    replica = processes.timesvc(url, name="c")
    replica.wait_ready()
    pid = local_cassandra.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the node stops answering: requests time out
    try:
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 20
            while client.get(f"{replica.url}/readyz").status_code != 503:
                assert time.monotonic() < deadline, "readyz stayed 200 during the outage"
                time.sleep(0.2)
            response = client.get(f"{replica.url}/now")
            assert response.status_code == 503
            assert "unavailable" in response.json()["detail"]
    finally:
        os.kill(pid, signal.SIGCONT)
    replica.wait_ready()
    assert httpx.get(f"{replica.url}/now", timeout=5).json()["now_us"] > 0
