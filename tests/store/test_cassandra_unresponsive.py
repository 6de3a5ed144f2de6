"""Cassandra 1.2 (protocol v1): a node that stops answering costs a request no more than a
speculative delay, instead of the whole request timeout.

What the ring test (tests/faults/test_ring.py) saw before: with node 3 paused (SIGSTOP), 14–34 %
of ``/now`` reads failed with the driver's client-side ``OperationTimedOut``. The driver's v1/v2
connection pool forgives timeouts, so a paused node whose heartbeats went unanswered stayed "up"
with an empty pool, and every request routed to it waited there for the driver's fixed 2 s before
another node was tried — the whole request timeout. And 1.2 has no server-side speculative retry,
so a slow coordinator (just resumed, replaying hints, waiting on a replica gossip has not marked
down yet) held its requests as long. These tests pin the two remedies on the policies and
statements the adapter hands the driver; the ring test measures them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.connection import DefaultEndPoint
from cassandra.policies import ConvictionPolicy, RoundRobinPolicy, SimpleConvictionPolicy
from cassandra.pool import Host

from lockclient.store.cassandra import DEFAULT_SPECULATE_AFTER, ConnectedHostsFirstPolicy, _dialect_for
from lockclient.store.url import parse_store_url

V1_URL = "cassandra://127.0.0.1,127.0.0.2,127.0.0.3:9042/ks?protocol_version=1"


def _host(address: str = "127.0.0.3", conviction: type[ConvictionPolicy] = SimpleConvictionPolicy) -> Host:
    return Host(DefaultEndPoint(address, 9042), conviction, datacenter="datacenter1", rack="rack1")


class _Session:
    """What the policy reads of a driver session: ``get_pool_state()``, one ``in_flights`` entry
    per connection in a host's pool (the driver's own format, ``HostConnectionPool.get_state``)."""

    def __init__(self, connections: Mapping[Host, int | None]) -> None:
        self.connections = dict(connections)

    def get_pool_state(self) -> dict[Host, dict[str, Any]]:
        return {
            host: {"shutdown": False, "open_count": n, "in_flights": [0] * n, "orphan_requests": [set()] * n}
            for host, n in self.connections.items()
            if n is not None  # None: no pool at all (the host is down or not yet added)
        }


def _plans(policy: ConnectedHostsFirstPolicy, count: int = 6) -> list[list[str]]:
    return [[h.endpoint.address for h in policy.make_query_plan("ks", None)] for _ in range(count)]


def test_a_node_whose_connections_were_all_lost_is_tried_last() -> None:
    one, two, three = _host("127.0.0.1"), _host("127.0.0.2"), _host("127.0.0.3")
    child = RoundRobinPolicy()
    child.populate(None, [one, two, three])
    policy = ConnectedHostsFirstPolicy(child)
    before = _plans(policy)  # before attach: the child's plans, every host first in turn
    assert all(sorted(plan) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"] for plan in before)
    assert {plan[0] for plan in before} == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    session = _Session({one: 2, two: 1, three: 2})
    policy.attach(session)
    # Node 3 paused: its heartbeats failed and its connections were closed; the pool is empty
    # while it tries to reconnect, but the host is still "up" in the driver.
    session.connections[three] = 0
    plans = _plans(policy)
    assert all(plan[-1] == "127.0.0.3" and len(plan) == 3 for plan in plans)
    assert {plan[0] for plan in plans} == {"127.0.0.1", "127.0.0.2"}  # the others still share the load
    # A host with no pool at all is tried last too; one that reconnected is back in rotation.
    session.connections[two], session.connections[three] = None, 1
    assert all(plan[-1] == "127.0.0.2" for plan in _plans(policy))
    assert {plan[0] for plan in _plans(policy)} == {"127.0.0.1", "127.0.0.3"}
    # With no connection anywhere, every host is still tried (a single node that is coming back).
    session.connections = {one: 0, two: 0, three: 0}
    assert all(sorted(plan) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"] for plan in _plans(policy))


def test_the_12_dialect_routes_by_connections_once_attached() -> None:
    dialect = _dialect_for(parse_store_url(V1_URL))
    policy = dialect.profiles(None, 2.0, local=False)[EXEC_PROFILE_DEFAULT].load_balancing_policy
    assert isinstance(policy, ConnectedHostsFirstPolicy)
    up, lost = _host("127.0.0.1"), _host("127.0.0.3")
    policy.populate(None, [lost, up])
    dialect.attach(_Session({up: 1, lost: 0}))
    assert all(plan == ["127.0.0.1", "127.0.0.3"] for plan in _plans(policy))


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
    first = _host()
    assert plan.next_execution(first) == DEFAULT_SPECULATE_AFTER
    assert plan.next_execution(first) < 0  # one more coordinator at most: bounded extra load


def test_speculation_can_be_turned_off_for_the_12_dialect() -> None:
    dialect = _dialect_for(parse_store_url(f"{V1_URL}&speculate_after=0"))
    profile = dialect.profiles(None, 2.0, local=False)[EXEC_PROFILE_DEFAULT]
    statement, _ = dialect.get("t", "r", "c")
    assert profile.speculative_execution_policy.new_plan("ks", statement).next_execution(None) < 0
