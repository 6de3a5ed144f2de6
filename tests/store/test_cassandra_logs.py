"""A healthy start on a modern Cassandra logs nothing alarming.

The driver used to log, per connection, WARNINGs while negotiating the protocol down
("Downgrading core protocol version from 66 to 65 …") — the protocol is pinned to v5 —
and, per load-balancing policy, an INFO telling the operator to "specify a local_dc".
:class:`ContactPointDCPolicy` adopts the contact points' datacenter silently and
:func:`connect_cluster` says once where requests go.
"""

from __future__ import annotations

import logging
import os

import pytest
from cassandra.connection import DefaultEndPoint
from cassandra.policies import ConvictionPolicy, HostDistance, SimpleConvictionPolicy
from cassandra.pool import Host

from lockclient.store import open_store
from lockclient.store.base import Table
from lockclient.store.cassandra import DEFAULT_PROTOCOL_VERSION, ContactPointDCPolicy


class _Cluster:
    """What ``DCAwareRoundRobinPolicy.populate`` reads of a cluster: its resolved contact points."""

    def __init__(self, endpoints: list[DefaultEndPoint]) -> None:
        self.endpoints_resolved = endpoints


def _host(address: str, dc: str) -> Host:
    conviction: type[ConvictionPolicy] = SimpleConvictionPolicy
    return Host(DefaultEndPoint(address, 9042), conviction, datacenter=dc, rack="rack1")


def test_the_contact_points_datacenter_is_adopted_without_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    contact, peer, remote = _host("10.0.0.1", "dc-east"), _host("10.0.0.2", "dc-east"), _host("10.1.0.1", "dc-west")
    policy = ContactPointDCPolicy()
    policy.populate(_Cluster([contact.endpoint]), [])
    with caplog.at_level(logging.DEBUG):
        policy.on_up(remote)  # not a contact point: it never decides the datacenter
        assert not policy.local_dc
        policy.on_up(contact)
        policy.on_up(peer)
    assert policy.local_dc == "dc-east"
    assert [r for r in caplog.records if r.name.startswith("cassandra")] == []
    # The driver's routing is unchanged: the adopted datacenter is local, the other ignored.
    assert policy.distance(peer) == HostDistance.LOCAL
    assert policy.distance(remote) == HostDistance.IGNORED


def test_a_named_datacenter_is_never_replaced() -> None:
    contact = _host("10.0.0.1", "dc-east")
    policy = ContactPointDCPolicy(local_dc="dc-west")
    policy.populate(_Cluster([contact.endpoint]), [])
    policy.on_up(contact)
    assert policy.local_dc == "dc-west"


@pytest.mark.cassandra
def test_a_healthy_start_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    if not os.environ.get("CHRONOLOCK_TEST_CASSANDRA"):
        pytest.skip("needs a modern Cassandra: set CHRONOLOCK_TEST_CASSANDRA=host:port")
    from tests.support.cassandra_node import modern_test_url

    url = modern_test_url(os.environ["CHRONOLOCK_TEST_CASSANDRA"])  # schema set up before the capture
    caplog.clear()
    with caplog.at_level(logging.DEBUG), open_store(url) as store:
        store.get(Table.GLOBAL_TIME, "GlobalTime", "value")
    records = caplog.records
    loud = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.WARNING]
    assert loud == [], loud
    about_dc = [r.getMessage() for r in records if r.levelno >= logging.INFO and "local_dc" in r.getMessage()]
    assert about_dc == []
    assert not [r for r in records if "Downgrading" in r.getMessage()]
    connected = [r for r in records if r.name == "lockclient.store.cassandra" and "cassandra connected" in str(r.msg)]
    assert len(connected) == 1, [r.msg for r in records if r.name.startswith("lockclient")]
    event = connected[0].msg
    assert isinstance(event, dict)
    assert event["protocol_version"] == DEFAULT_PROTOCOL_VERSION
    assert event["requests_to_dc"] in event["datacenters"]
