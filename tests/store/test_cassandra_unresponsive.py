"""Cassandra 1.2 (protocol v1): a node that stops answering costs a request no more than a
speculative delay, instead of the whole request timeout.

What the ring test (tests/faults/test_ring.py) saw before: with node 3 paused (SIGSTOP), 14–22 %
of ``/now`` reads failed with the driver's client-side ``OperationTimedOut``. The driver's v1/v2
connection pool forgives timeouts (``SimpleConvictionPolicy``), so a paused node whose heartbeats
went unanswered stayed "up" with an empty pool, and every request routed to it waited there for
the driver's fixed 2 s before another node was tried — the whole request timeout. And 1.2 has no
server-side speculative retry, so a slow coordinator (just resumed, replaying hints, waiting on a
replica gossip has not marked down yet) held its requests as long. These tests pin the two
remedies on the statements and policies the adapter hands the driver; the ring test measures them.
"""

from __future__ import annotations

from cassandra import OperationTimedOut
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.connection import DefaultEndPoint
from cassandra.policies import ConvictionPolicy, SimpleConvictionPolicy
from cassandra.pool import Host

from lockclient.store.cassandra import DEFAULT_SPECULATE_AFTER, _dialect_for
from lockclient.store.url import parse_store_url

V1_URL = "cassandra://127.0.0.1,127.0.0.2,127.0.0.3:9042/ks?protocol_version=1"


def _host(conviction: type[ConvictionPolicy]) -> Host:
    return Host(DefaultEndPoint("127.0.0.3", 9042), conviction, datacenter="datacenter1", rack="rack1")


def test_a_node_that_stops_answering_is_convicted_at_its_first_unanswered_heartbeat() -> None:
    options = _dialect_for(parse_store_url(V1_URL)).cluster_options(None, None)
    conviction = options["conviction_policy_factory"]
    # The errors the driver signals for a paused node: a heartbeat, then a reconnection, timed out.
    heartbeat = OperationTimedOut("Connection heartbeat timeout after 1.0 seconds", DefaultEndPoint("127.0.0.3"))
    connect = OperationTimedOut("Timed out creating connection (5.0 seconds)")
    for error in (heartbeat, connect):
        assert _host(conviction).signal_connection_failure(error) is True
    # Refused and reset connections (a killed node) are convicted as before.
    assert _host(conviction).signal_connection_failure(ConnectionRefusedError(111, "Connection refused")) is True
    # Why the adapter needs its own policy: the driver's default forgives exactly these errors.
    assert _host(SimpleConvictionPolicy).signal_connection_failure(heartbeat) is False


def test_every_statement_of_the_12_dialect_may_go_to_a_second_coordinator() -> None:
    dialect = _dialect_for(parse_store_url(V1_URL))
    statements = [
        dialect.put("t", "r", "c", "v", timestamp=10, ttl=None),
        dialect.put("t", "r", "c", "v", timestamp=10, ttl=5),
        dialect.put_cells("t", "r", {"a": "1", "b": "2"}, 10, None),
        dialect.delete("t", "r", "c", 11),
        dialect.get("t", "r", "c"),
        dialect.read_row("t", "r", "", None),
    ]
    # The driver speculates only on statements marked idempotent; every statement of this
    # dialect is a last-write-wins write with an explicit timestamp or a read, so sending it
    # twice changes nothing.
    assert all(statement.is_idempotent for statement, _ in statements)
    profile = dialect.profiles(None, 2.0, local=False)[EXEC_PROFILE_DEFAULT]
    plan = profile.speculative_execution_policy.new_plan("ks", statements[-1][0])
    first = _host(SimpleConvictionPolicy)
    assert plan.next_execution(first) == DEFAULT_SPECULATE_AFTER
    assert plan.next_execution(first) < 0  # one more coordinator at most: bounded extra load


def test_speculation_can_be_turned_off_for_the_12_dialect() -> None:
    dialect = _dialect_for(parse_store_url(f"{V1_URL}&speculate_after=0"))
    profile = dialect.profiles(None, 2.0, local=False)[EXEC_PROFILE_DEFAULT]
    statement, _ = dialect.get("t", "r", "c")
    assert profile.speculative_execution_policy.new_plan("ks", statement).next_execution(None) < 0
