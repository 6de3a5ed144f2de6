"""Session-wide fixtures: real stores and real service processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.cassandra_node import LocalCassandraNode


@pytest.fixture(scope="session")
def local_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCassandraNode]:
    """One real Cassandra 1.2.0 node for the whole test session (shared/cassandra-local.md)."""
    from tests.support.cassandra_node import LocalCassandraNode

    node = LocalCassandraNode(tmp_path_factory.mktemp("cassandra"))
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def local_cassandra_url(local_cassandra: LocalCassandraNode) -> str:
    return local_cassandra.store_url("chronolock_test")


@pytest.fixture(scope="session")
def modern_cassandra_url() -> str:
    """``CHRONOLOCK_TEST_CASSANDRA=host[,host...]:port``: a keyspace at RF = live nodes (max 3)."""
    from tests.support.cassandra_node import modern_test_url

    return modern_test_url(os.environ["CHRONOLOCK_TEST_CASSANDRA"])


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cells.db'}"


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[object]:
    """Service processes for one test, stopped (by PID) when it ends."""
    from tests.support.procs import fleet

    with fleet(tmp_path) as started:
        yield started
