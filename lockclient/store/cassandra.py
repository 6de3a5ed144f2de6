"""The Cassandra adapter: the cell store on Apache Cassandra 4.x/5.x through ``cassandra-driver``.

Cassandra's storage model *is* the port (thesis section 2), so the mapping is
direct: one CQL table per :class:`~lockclient.store.base.Table` with the shape
``(row text, col text, value text, PRIMARY KEY (row, col))`` — ``row`` is the
partition, ``col`` the clustering column (ascending, UTF-8 byte order), and
``value`` the one regular column, whose ``WRITETIME`` is the cell timestamp.
The schema lives in :mod:`lockclient.store.cassandra_schema`.

Rules this module keeps (see shared/DESIGN.md section 3):

* **Explicit timestamps.** Every last-write-wins mutation carries
  ``USING TIMESTAMP`` from the caller; the server's reconciliation (higher
  timestamp wins, tombstone wins ties, larger value wins ties) does the rest.
* **Explicit consistency** on every statement, through named execution
  profiles: QUORUM/SERIAL — cluster-wide even when the URL names the local
  datacenter (``?dc=`` only routes requests there). LOCAL_QUORUM/LOCAL_SERIAL
  only with the explicit opt-in ``?lock_scope=datacenter``: each datacenter
  then runs its own locks. The driver's default, LOCAL_ONE, would break the
  visibility argument of thesis lemma 1 (a write and a later read need
  overlapping replica sets).
* **Compare-and-set only through Paxos** on its own tables
  (:class:`~lockclient.store.base.VersionedTable`), which are never written
  any other way: a plain write bypasses Paxos and can be reordered with it.
  Unknown outcomes are resolved by value (:meth:`CassandraStore.compare_and_set`).
* **Errors**: anything the driver raises is classified by one table
  (:mod:`lockclient.store.outcomes`): a write that may have applied becomes
  :class:`~lockclient.errors.StoreOutcomeUnknown` (settled by reading back), one
  that surely did not :class:`~lockclient.errors.StoreUnavailable` (worth another
  try) or :class:`~lockclient.errors.StoreError`, with the driver's exception as
  ``__cause__``.

Cassandra 1.2 (the only Cassandra that runs on the test machines, see
shared/cassandra-local.md) is reached through ``?protocol_version=1``. Every
accommodation for it lives in :class:`_Cql12Dialect`; the modern path
(:class:`_ModernDialect`) never looks at it.
"""

from __future__ import annotations

import math
import queue
import re
import ssl
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from cassandra import AuthenticationFailed, ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    FallthroughRetryPolicy,
    RetryPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
    WrapperPolicy,
)
from cassandra.query import BatchStatement, BatchType, SimpleStatement, tuple_factory

from lockclient.errors import ConfigurationError, StoreAccessDenied, StoreError, StoreOutcomeUnknown, StoreUnavailable
from lockclient.logs import get_logger
from lockclient.redact import register_secret
from lockclient.store.base import (
    CasResult,
    Cell,
    CellStore,
    CompareAndSet,
    Delete,
    Get,
    Op,
    Pending,
    Put,
    ReadRow,
    ReadVersioned,
    Table,
    VersionedTable,
    check_cas_arguments,
    columns_of,
    conditioned,
    is_any,
    perform,
    validate_limit,
)
from lockclient.store.outcomes import Fate, classify
from lockclient.store.settling import not_applied_answer, serial_read, settled_compare_and_set
from lockclient.store.tls import driver_tls_arguments
from lockclient.store.url import StoreUrl, TlsOptions, parse_store_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_PORT",
    "DEFAULT_PROTOCOL_VERSION",
    "DEFAULT_SPECULATE_AFTER",
    "DEFAULT_TIMEOUT",
    "PROFILE_CAS",
    "PROFILE_SERIAL",
    "CassandraStore",
    "ConnectedHostsFirstPolicy",
    "ContactPointDCPolicy",
    "connect_cluster",
    "translate_error",
]

DEFAULT_PORT: Final = 9042
DEFAULT_TIMEOUT: Final = 2.0
"""Seconds per request (URL option ``timeout``). Shorter than a lease's renewal interval (lease/3,
3.3 s by default): a request stuck on a node that stopped answering must end — and be retried
elsewhere, or resolved — while the lease is still valid."""
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
"""Seconds to connect (URL option ``connect_timeout``)."""
DEFAULT_HEARTBEAT: Final = 0.5
"""Seconds between heartbeats on a connection that received nothing (URL option ``heartbeat``;
0 turns them off). A node that stops answering (SIGSTOP, a GC pause, a frozen VM) stays "up" in
gossip for as long as it is stopped, so the driver would keep sending it requests that wait out
their timeouts; a heartbeat unanswered within ``heartbeat_timeout`` (default 1 s, at most
``timeout``) marks its connections defunct and the host down, and requests go to the other
replicas. A healthy node answers a heartbeat in milliseconds."""
DEFAULT_SPECULATE_AFTER: Final = 0.2
"""Seconds after which an idempotent statement (every last-write-wins read and write: they carry
explicit timestamps) is also sent to the next replica (URL option ``speculate_after``; 0 = never).
Compare-and-sets and serial reads are never sent twice."""
DEFAULT_PROTOCOL_VERSION: Final = 5
"""Native protocol of Cassandra 4.x/5.x. Pinned, so that connecting does not negotiate downwards
with a WARNING per connection; ``protocol_version=4`` for older servers."""

log = get_logger("lockclient.store.cassandra")


class ContactPointDCPolicy(DCAwareRoundRobinPolicy):  # type: ignore[misc]
    """``DCAwareRoundRobinPolicy`` that adopts its contact points' datacenter without an INFO line.

    Without ``?dc=`` the driver's policy takes the datacenter of the first contact point
    that comes up — what we want — and says so at INFO, once per policy: three lines per
    process (one policy per execution profile), each telling the operator to "specify a
    local_dc". :func:`connect_cluster` reports the datacenter once instead, in its own
    ``cassandra connected`` event, and warns only when it matters (the cluster has several
    datacenters and none was named: requests then never leave the adopted one).

    The adoption rule is the driver's own (a host whose endpoint is one of the contact
    points); this class only sets ``local_dc`` before the driver's ``on_up`` would, so the
    driver's branch that logs is never taken. ``_endpoints`` is the driver's private list
    of resolved contact points (cassandra-driver 3.x); were it ever missing, the driver
    adopts the datacenter itself and logs its line again — noise, never a wrong route
    (``tests/store/test_cassandra_logs.py`` pins it)."""

    local_dc: str

    def on_up(self, host: Any) -> None:
        if not self.local_dc and host.datacenter and host.endpoint in getattr(self, "_endpoints", ()):
            self.local_dc = host.datacenter
        super().on_up(host)


class ConnectedHostsFirstPolicy(WrapperPolicy):  # type: ignore[misc]
    """Puts the hosts whose connection pool holds no connection at the end of every query plan.

    For native protocol v1/v2 (Cassandra 1.2), whose per-host pool is the driver's older
    ``HostConnectionPool``. A node that stops answering (SIGSTOP, a long GC pause, a frozen VM)
    fails its heartbeats and its connections are closed, but the driver's default conviction
    policy forgives timeouts, so the host stays "up" while the pool tries to replace them (each
    attempt waits out the connect timeout). A request routed to that host then waits up to 2 s
    for a connection (the driver's fixed ``borrow_connection`` wait) before the next host is
    tried — the whole request timeout: it fails with ``OperationTimedOut`` although the other
    nodes could have answered (14–34 % of ``/now`` reads while a ring node was paused). On v3+
    the driver marks such a host down itself.

    The host keeps its place in the driver (up, its pool reconnecting as before: back in use
    as soon as a connection succeeds), and is still tried when no host has a connection.
    Connections are read from :meth:`Session.get_pool_state` (one ``in_flights`` entry per
    connection in the pool) of the session given to :meth:`attach`; before that, the plan is
    the child's."""

    def __init__(self, child_policy: Any) -> None:
        super().__init__(child_policy)
        self._pool_state: Callable[[], Mapping[Any, Mapping[str, Any]]] | None = None

    def attach(self, session: Any) -> None:
        self._pool_state = session.get_pool_state

    def make_query_plan(self, working_keyspace: str | None = None, query: Any = None) -> Iterator[Any]:
        plan = self._child_policy.make_query_plan(working_keyspace, query)
        states = self._pool_state() if self._pool_state is not None else {}
        if not states:
            yield from plan
            return
        unconnected = []
        for host in plan:
            state = states.get(host)
            if state is not None and not state["shutdown"] and state["in_flights"]:
                yield host
            else:
                unconnected.append(host)
        yield from unconnected


PROFILE_SERIAL: Final = "chronolock-serial"
"""Execution profile for linearizable reads of the versioned table (SERIAL / LOCAL_SERIAL)."""
PROFILE_CAS: Final = "chronolock-cas"
"""Execution profile for conditional writes: QUORUM commit, SERIAL Paxos, and no driver retries."""

_PAGE_SIZE: Final = 1000
_CAS_UNSUPPORTED: Final = "compare-and-set needs lightweight transactions (Cassandra 2.0+)"
_KEYSPACE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")

_WRITES: Final = frozenset({"put", "put_cells", "delete", "compare_and_set"})

_T = TypeVar("_T")
_Params = Sequence[object]
_Query = tuple[Any, _Params | None]
"""A driver statement and its parameters (``None`` when already bound)."""


def translate_error(exc: BaseException, what: str) -> StoreError:
    """Map a driver exception to the port's error hierarchy (the caller raises it ``from exc``),
    by the classification table (:mod:`lockclient.store.outcomes`): an outcome that may have
    applied becomes :class:`StoreOutcomeUnknown`; one that surely did not becomes
    :class:`StoreUnavailable` when trying again can help, else :class:`StoreError`."""
    if isinstance(exc, StoreError):
        return exc
    verdict = classify(exc)
    if verdict.fate is Fate.UNKNOWN:
        return StoreOutcomeUnknown(f"Cassandra during {what}: result unknown ({verdict.why}): {exc}")
    if verdict.transient:
        return StoreUnavailable(f"Cassandra unavailable during {what} ({verdict.fate.value}): {exc}")
    return StoreError(f"Cassandra failed during {what} ({verdict.fate.value}): {exc}")


@dataclass(frozen=True, slots=True)
class _Plan:
    query: _Query
    what: str
    profile: object
    finish: Callable[[Any], Any]


def _nothing(result: Any) -> None:
    return None


def _cells(result: Any) -> list[Cell]:
    return [Cell(col, value, written) for col, value, written in result if value is not None]


def _first_cell(result: Any) -> Cell | None:
    return next(iter(_cells(result)), None)


def _values(result: Any) -> dict[str, str]:
    return {col: value for col, value in result if value is not None}


def _idempotent(statement: Any) -> Any:
    """Last-write-wins statements carry explicit timestamps: sending one twice changes nothing,
    so the driver may retry it or send it to a second replica (speculative execution)."""
    statement.is_idempotent = True
    return statement


def _speculation(after: float) -> ConstantSpeculativeExecutionPolicy | None:
    """Send an idempotent statement to one more coordinator when the first has not answered
    within ``after`` seconds (``speculate_after``; 0 = never)."""
    return ConstantSpeculativeExecutionPolicy(after, 1) if after > 0 else None


def _ttl_seconds(ttl: float | None) -> int | None:
    if ttl is None:
        return None
    if not ttl > 0:
        raise ValueError(f"ttl must be positive, got {ttl}")
    return math.ceil(ttl)  # Cassandra TTLs are whole seconds >= 1: never expire early


def _validated_keyspace(keyspace: str) -> str:
    if not _KEYSPACE_RE.match(keyspace):
        raise ConfigurationError(f"Cassandra keyspace {keyspace!r} must be letters, digits and underscores")
    return keyspace


def _int_option(url: StoreUrl, name: str) -> int | None:
    raw = url.options.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigurationError(f"store URL option {name}={raw!r} is not an integer") from exc


# -- dialects ---------------------------------------------------------------------------------


class _Dialect(ABC):
    """How statements are written and executed for one generation of Cassandra."""

    supports_lwt: ClassVar[bool]
    ddl_if_not_exists: ClassVar[bool]
    """Whether ``CREATE ... IF NOT EXISTS`` is understood (else "already exists" is caught)."""

    def __init__(self, keyspace: str) -> None:
        self.keyspace = keyspace
        self._session: Any = None

    def attach(self, session: Any) -> None:
        self._session = session

    def table(self, name: str) -> str:
        return f"{self.keyspace}.{name}"

    @abstractmethod
    def cluster_options(self, username: str | None, password: str | None) -> dict[str, Any]:
        """Keyword arguments for :class:`cassandra.cluster.Cluster` (protocol version, auth)."""

    @abstractmethod
    def profiles(self, dc: str | None, timeout: float, *, local: bool) -> dict[object, ExecutionProfile]:
        """The named execution profiles: every statement runs under one of them.

        ``dc`` routes requests to that datacenter's nodes; ``local`` (only with the
        operator's explicit ``lock_scope=datacenter``) also narrows consistency to it."""

    @abstractmethod
    def put(self, table: str, row: str, column: str, value: str, *, timestamp: int, ttl: int | None) -> _Query: ...

    @abstractmethod
    def put_cells(self, table: str, row: str, cells: dict[str, str], timestamp: int, ttl: int | None) -> _Query:
        """One single-partition batch: atomic and isolated on the replicas (no batch log needed)."""

    @abstractmethod
    def delete(self, table: str, row: str, column: str, timestamp: int) -> _Query: ...

    @abstractmethod
    def get(self, table: str, row: str, column: str) -> _Query: ...

    @abstractmethod
    def read_row(
        self, table: str, row: str, start: str, limit: int | None, end: str | None = None, reverse: bool = False
    ) -> _Query: ...


class _ModernDialect(_Dialect):
    """Cassandra 4.x/5.x: prepared statements for everything, bind markers for timestamps and TTLs."""

    supports_lwt = True
    ddl_if_not_exists = True

    def __init__(self, keyspace: str, protocol_version: int | None, *, speculate_after: float = 0.0) -> None:
        super().__init__(keyspace)
        self._protocol_version = protocol_version
        self._speculate_after = speculate_after
        self._prepared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def cluster_options(self, username: str | None, password: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"protocol_version": self._protocol_version or DEFAULT_PROTOCOL_VERSION}
        if username is not None:
            options["auth_provider"] = PlainTextAuthProvider(username=username, password=password or "")
        return options

    def profiles(self, dc: str | None, timeout: float, *, local: bool) -> dict[object, ExecutionProfile]:
        # Cluster-wide consistency unless the operator asked for per-datacenter locks: with
        # LOCAL_QUORUM / LOCAL_SERIAL two datacenters can each grant the same lock and bump
        # its fencing counter to the same value (each DC runs its own Paxos quorum).
        if local:
            quorum, serial = ConsistencyLevel.LOCAL_QUORUM, ConsistencyLevel.LOCAL_SERIAL
        else:
            quorum, serial = ConsistencyLevel.QUORUM, ConsistencyLevel.SERIAL

        def balancing() -> TokenAwarePolicy:
            # Without a dc the policy adopts the datacenter of the first contact point.
            # Each profile gets its own policy instance (the driver requires it). Replicas in
            # random order: with a fixed order every request for a lock goes first to the same
            # replica, and if that one has stopped answering, every one of them waits for it.
            child = DCAwareRoundRobinPolicy(local_dc=dc) if dc else ContactPointDCPolicy()
            return TokenAwarePolicy(child, shuffle_replicas=True)

        common: dict[str, Any] = {"request_timeout": timeout, "row_factory": tuple_factory}
        speculation = _speculation(self._speculate_after)
        return {
            # Last-write-wins reads and writes. Writes carry explicit timestamps, so they are
            # idempotent and the driver's default retry policy may safely resend them.
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                load_balancing_policy=balancing(),
                retry_policy=RetryPolicy(),
                consistency_level=quorum,
                serial_consistency_level=serial,
                speculative_execution_policy=speculation,
                **common,
            ),
            # Linearizable reads of the versioned table: a SERIAL read runs a Paxos round,
            # finishing any proposal that was accepted but not yet committed.
            PROFILE_SERIAL: ExecutionProfile(
                load_balancing_policy=balancing(),
                retry_policy=RetryPolicy(),
                consistency_level=serial,
                **common,
            ),
            # Conditional writes. Never retried by the driver: a resent LWT whose first attempt
            # was in fact applied would see its own result, fail its condition and be reported
            # as "not applied". Ambiguous failures are resolved by CassandraStore instead.
            PROFILE_CAS: ExecutionProfile(
                load_balancing_policy=balancing(),
                retry_policy=FallthroughRetryPolicy(),
                consistency_level=quorum,
                serial_consistency_level=serial,
                **common,
            ),
        }

    def prepare(self, cql: str) -> Any:
        with self._lock:
            found = self._prepared.get(cql)
        if found is not None:
            return found
        prepared = self._session.prepare(cql)  # outside the lock: it is a network round trip
        with self._lock:
            return self._prepared.setdefault(cql, prepared)

    def put(self, table: str, row: str, column: str, value: str, *, timestamp: int, ttl: int | None) -> _Query:
        target = self.table(table)
        if ttl is None:
            cql = f"INSERT INTO {target} (row, col, value) VALUES (?, ?, ?) USING TIMESTAMP ?"
            return _idempotent(self.prepare(cql).bind((row, column, value, timestamp))), None
        cql = f"INSERT INTO {target} (row, col, value) VALUES (?, ?, ?) USING TIMESTAMP ? AND TTL ?"
        return _idempotent(self.prepare(cql).bind((row, column, value, timestamp, ttl))), None

    def put_cells(self, table: str, row: str, cells: dict[str, str], timestamp: int, ttl: int | None) -> _Query:
        base = f"INSERT INTO {self.table(table)} (row, col, value) VALUES (?, ?, ?) USING TIMESTAMP ?"
        insert = self.prepare(base if ttl is None else f"{base} AND TTL ?")
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for column, value in cells.items():
            batch.add(insert, (row, column, value, timestamp) if ttl is None else (row, column, value, timestamp, ttl))
        return _idempotent(batch), None

    def delete(self, table: str, row: str, column: str, timestamp: int) -> _Query:
        cql = f"DELETE FROM {self.table(table)} USING TIMESTAMP ? WHERE row = ? AND col = ?"
        return _idempotent(self.prepare(cql).bind((timestamp, row, column))), None

    def get(self, table: str, row: str, column: str) -> _Query:
        cql = f"SELECT col, value, WRITETIME(value) FROM {self.table(table)} WHERE row = ? AND col = ?"
        return _idempotent(self.prepare(cql).bind((row, column))), None

    def read_row(
        self, table: str, row: str, start: str, limit: int | None, end: str | None = None, reverse: bool = False
    ) -> _Query:
        cql = f"SELECT col, value, WRITETIME(value) FROM {self.table(table)} WHERE row = ? AND col >= ?"
        values: list[object] = [row, start]
        if end is not None:
            cql += " AND col <= ?"
            values.append(end)
        if reverse:
            cql += " ORDER BY col DESC"  # a reversed slice: Cassandra reads the partition backwards
        if limit is not None:
            cql += " LIMIT ?"
            values.append(limit)
        bound = self.prepare(cql).bind(tuple(values))
        # Every page bounded; the result set pages on.
        bound.fetch_size = _PAGE_SIZE if limit is None else min(limit, _PAGE_SIZE)
        return _idempotent(bound), None

    # -- the versioned table (LWT only) ----------------------------------------------------

    def read_versioned(self, table: str, row: str) -> _Query:
        bound = self.prepare(f"SELECT col, value FROM {self.table(table)} WHERE row = ?").bind((row,))
        # A lease row holds a handful of cells: one unpaged response, which also keeps the
        # SERIAL read a single Paxos-protected read of the partition.
        bound.fetch_size = None
        return _idempotent(bound), None

    def cas_batch(
        self, table: str, row: str, expected: Mapping[str, str | None], updates: Mapping[str, str | None]
    ) -> Any:
        """One conditional batch on one partition: every column named gets exactly one statement.

        * ``IF value = ?`` with a bound ``null`` means "absent": Cassandra evaluates a
          condition on a missing row against a null cell (``ColumnCondition.getCell``
          returns null for a missing row, and ``= null`` holds for a null cell), so one
          form covers both present and absent expectations. (``INSERT ... IF NOT EXISTS``
          would do for absent-then-written columns too, but would be a second shape.)
        * Writing a value: ``UPDATE ... SET value = ? ... IF value = ?``.
        * Deleting (``None``): ``DELETE ... IF value = ?``.
        * A column with a condition but no update is *restated*: the statement writes
          back the expected value (or deletes an expected-absent cell) under the same
          condition. CQL has no condition-only statement in a batch, and rewriting the
          expected value changes nothing when the condition holds (which is the only
          case in which anything is written: the batch is all or nothing).
        * A column expected :data:`~lockclient.store.base.ANY` (an end record) gets a
          statement *without* ``IF``: a conditional batch may hold unconditioned
          statements (``BatchStatement.getCasRequest`` adds every statement's row update
          and only the conditioned ones' conditions), which are applied by the same
          Paxos round if and only if every condition holds.
        * No ``USING TIMESTAMP``: Cassandra rejects it with ``IF`` (Paxos picks the
          timestamp from its ballot).
        """
        target = self.table(table)
        write = self.prepare(f"UPDATE {target} SET value = ? WHERE row = ? AND col = ? IF value = ?")
        remove = self.prepare(f"DELETE FROM {target} WHERE row = ? AND col = ? IF value = ?")
        # UNLOGGED: a conditional batch on one partition is applied by one Paxos round;
        # the batch log plays no part in it.
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for column in columns_of(expected, updates):
            want = expected[column]
            new = updates.get(column, want)
            if is_any(want):
                if new is None:
                    batch.add(self.prepare(f"DELETE FROM {target} WHERE row = ? AND col = ?"), (row, column))
                else:
                    overwrite = self.prepare(f"UPDATE {target} SET value = ? WHERE row = ? AND col = ?")
                    batch.add(overwrite, (new, row, column))
            elif new is None:
                batch.add(remove, (row, column, want))
            else:
                batch.add(write, (new, row, column, want))
        return batch


class _Cql12Dialect(_Dialect):
    """Cassandra 1.2 compatibility (``?protocol_version=1``), used by the local test node only.

    What 1.2 lacks, and what this class does about it:

    * native protocol v1 only, which has no paging and no serial consistency;
    * consistency SERIAL or LOCAL_ONE makes the node drop the connection: only
      QUORUM is ever sent (LOCAL_QUORUM would need NetworkTopologyStrategy);
    * no bind markers for ``USING TIMESTAMP`` / ``TTL`` / ``LIMIT``: they are
      formatted into the CQL text as integer literals, and the values are passed
      as parameters (the driver escapes them client-side);
    * no lightweight transactions: compare-and-set is unsupported
      (:attr:`supports_lwt` is false, the store raises a clear StoreError);
    * no ``IF NOT EXISTS`` in DDL (handled in cassandra_schema);
    * no speculative retry on the server (2.0+): the driver's speculative execution
      (``speculate_after``) sends a slow statement to a second coordinator instead;
    * the driver's v1/v2 connection pool keeps an unresponsive node "up" with no connection
      (it forgives timeouts): :class:`ConnectedHostsFirstPolicy` sends requests elsewhere.
    """

    supports_lwt = False
    ddl_if_not_exists = False

    _NO_LIMIT: ClassVar[int] = 2_147_483_647
    """1.2 applies an implicit LIMIT 10000 and cannot page: an explicit maximum instead."""

    def __init__(self, keyspace: str, *, speculate_after: float = 0.0) -> None:
        super().__init__(keyspace)
        self._speculate_after = speculate_after
        self._balancing: list[ConnectedHostsFirstPolicy] = []

    def attach(self, session: Any) -> None:
        super().attach(session)
        for policy in self._balancing:
            policy.attach(session)

    def cluster_options(self, username: str | None, password: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"protocol_version": 1}
        if username is not None:
            # Protocol v1 takes a callable that returns the credentials map.
            credentials = {"username": username, "password": password or ""}
            options["auth_provider"] = lambda _host: credentials
        return options

    def profiles(self, dc: str | None, timeout: float, *, local: bool) -> dict[object, ExecutionProfile]:
        # Requests never wait on a node whose connections were all lost (ConnectedHostsFirstPolicy).
        balancing = ConnectedHostsFirstPolicy(DCAwareRoundRobinPolicy(local_dc=dc) if dc else RoundRobinPolicy())
        self._balancing.append(balancing)
        return {
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                load_balancing_policy=balancing,
                retry_policy=RetryPolicy(),
                consistency_level=ConsistencyLevel.QUORUM,
                serial_consistency_level=None,
                request_timeout=timeout,
                row_factory=tuple_factory,
                # 1.2 has no speculative retry of its own: a coordinator that is slow to answer
                # (just resumed, replaying hints, collecting garbage, or waiting on a replica that
                # gossip has not yet marked down) is overtaken by a second one. Every statement
                # of this dialect is last-write-wins with an explicit timestamp, so idempotent.
                speculative_execution_policy=_speculation(self._speculate_after),
            )
        }

    def put(self, table: str, row: str, column: str, value: str, *, timestamp: int, ttl: int | None) -> _Query:
        using = f"USING TIMESTAMP {int(timestamp)}" + ("" if ttl is None else f" AND TTL {int(ttl)}")
        cql = f"INSERT INTO {self.table(table)} (row, col, value) VALUES (%s, %s, %s) {using}"
        return _idempotent(SimpleStatement(cql)), (row, column, value)

    def put_cells(self, table: str, row: str, cells: dict[str, str], timestamp: int, ttl: int | None) -> _Query:
        # 1.2 rejects the driver's BatchStatement; a literal batch string works.
        using = f"USING TIMESTAMP {int(timestamp)}" + ("" if ttl is None else f" AND TTL {int(ttl)}")
        insert = f"INSERT INTO {self.table(table)} (row, col, value) VALUES (%s, %s, %s) {using}"
        cql = "BEGIN UNLOGGED BATCH " + " ".join(f"{insert};" for _ in cells) + " APPLY BATCH"
        params: list[str] = []
        for column, value in cells.items():
            params += [row, column, value]
        return _idempotent(SimpleStatement(cql)), tuple(params)

    def delete(self, table: str, row: str, column: str, timestamp: int) -> _Query:
        cql = f"DELETE FROM {self.table(table)} USING TIMESTAMP {int(timestamp)} WHERE row = %s AND col = %s"
        return _idempotent(SimpleStatement(cql)), (row, column)

    def get(self, table: str, row: str, column: str) -> _Query:
        cql = f"SELECT col, value, WRITETIME(value) FROM {self.table(table)} WHERE row = %s AND col = %s"
        return _idempotent(SimpleStatement(cql)), (row, column)

    def read_row(
        self, table: str, row: str, start: str, limit: int | None, end: str | None = None, reverse: bool = False
    ) -> _Query:
        cap = self._NO_LIMIT if limit is None else int(limit)
        upper = "" if end is None else " AND col <= %s"
        order = " ORDER BY col DESC" if reverse else ""
        cql = (
            f"SELECT col, value, WRITETIME(value) FROM {self.table(table)} WHERE row = %s AND col >= %s{upper}"
            f"{order} LIMIT {cap}"
        )
        return _idempotent(SimpleStatement(cql)), (row, start) if end is None else (row, start, end)


# -- connecting ---------------------------------------------------------------------------------


def _dialect_for(url: StoreUrl) -> _Dialect:
    keyspace = _validated_keyspace(url.path)
    protocol_version = _int_option(url, "protocol_version")
    speculate_after = url.float_option("speculate_after", DEFAULT_SPECULATE_AFTER)
    if protocol_version == 1:
        return _Cql12Dialect(keyspace, speculate_after=speculate_after)
    if protocol_version is not None and protocol_version < 3:
        # v2 (Cassandra 2.0) has LWT but no serial consistency on batches: unsupported.
        raise ConfigurationError(f"protocol_version={protocol_version} is not supported: use 1 (Cassandra 1.2) or 3+")
    return _ModernDialect(keyspace, protocol_version, speculate_after=speculate_after)


def connect_cluster(
    url: StoreUrl | str,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: TlsOptions | None = None,
) -> tuple[Any, Any, _Dialect]:
    """Connect to the cluster a store URL names. Returns ``(cluster, session, dialect)``.

    The session is not bound to the keyspace (statements name it), so this also
    serves schema creation before the keyspace exists. ``tls`` holds the TLS settings
    (``CHRONOLOCK_CASSANDRA_SSL*``); the URL's ``ssl*`` options override them. Raises
    :class:`StoreUnavailable` when no contact point answers within the timeout, and
    :class:`StoreAccessDenied` when the credentials are rejected or a node's certificate
    does not verify (retrying would not help).
    """
    parsed = url if isinstance(url, StoreUrl) else parse_store_url(url)
    if parsed.scheme != "cassandra":
        raise ConfigurationError(f"not a Cassandra store URL: {parsed.redacted()}")
    dialect = _dialect_for(parsed)
    timeout = parsed.float_option("timeout", DEFAULT_TIMEOUT)
    dc = parsed.options.get("dc") or None
    scope = parsed.options.get("lock_scope", "cluster")
    user = parsed.username if parsed.username is not None else username
    secret = parsed.password if parsed.username is not None else password
    register_secret(secret)
    tls_arguments = driver_tls_arguments(parsed.tls(tls))
    try:
        cluster = Cluster(
            contact_points=list(parsed.hosts),
            port=parsed.port or DEFAULT_PORT,
            execution_profiles=dialect.profiles(dc, timeout, local=scope == "datacenter"),
            connect_timeout=parsed.float_option("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
            control_connection_timeout=parsed.float_option("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
            idle_heartbeat_interval=parsed.float_option("heartbeat", DEFAULT_HEARTBEAT),
            idle_heartbeat_timeout=min(timeout, parsed.float_option("heartbeat_timeout", 1.0)),
            **tls_arguments,
            **dialect.cluster_options(user, secret),
        )
    except Exception as exc:
        raise StoreError(f"cannot configure the Cassandra driver for {parsed.redacted()}: {exc}") from exc
    try:
        session = cluster.connect()
    except Exception as exc:
        cluster.shutdown()
        raise _connect_error(exc, parsed) from exc
    dialect.attach(session)
    _log_connected(cluster, parsed, dc)
    return cluster, session, dialect


def _log_connected(cluster: Any, url: StoreUrl, dc: str | None) -> None:
    """One event per connected cluster: where requests go, over which protocol.

    The driver's own start-up lines are per policy or per host; this is the one line an
    operator needs, and a WARNING only for a real question: a cluster with several
    datacenters and no ``?dc=`` (requests stay in whichever datacenter a contact point
    happened to be in)."""
    hosts = list(cluster.metadata.all_hosts())
    datacenters = sorted({h.datacenter for h in hosts if h.datacenter})
    policy = cluster.profile_manager.default.load_balancing_policy
    child = getattr(policy, "_child_policy", policy)
    routed_to = dc or getattr(child, "local_dc", None)
    fields = {
        "store": url.redacted(),
        "protocol_version": cluster.protocol_version,
        "nodes": len(hosts),
        "datacenters": datacenters,
        "requests_to_dc": routed_to,
        "dc_source": "configured" if dc else "contact points",
    }
    if dc is None and len(datacenters) > 1:
        log.warning("cassandra connected: several datacenters and no ?dc= in the store URL", **fields)
    else:
        log.info("cassandra connected", **fields)


def _tls_refused(exc: BaseException) -> bool:
    """Whether a connection error is (or was caused by) a failed TLS verification or handshake.

    The driver re-raises an ``ssl.SSLError`` as a plain ``OSError`` whose message keeps the
    reason ("Tried connecting to [...]. Last error: [SSL: CERTIFICATE_VERIFY_FAILED] ..."),
    so both the chain and the text are looked at."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        text = str(seen)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text or "[SSL" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _connect_error(exc: BaseException, url: StoreUrl) -> StoreError:
    error = translate_error(exc, "connect")
    if isinstance(error, StoreOutcomeUnknown):
        error = StoreUnavailable(str(error))  # connecting writes nothing: no outcome to settle
    if isinstance(exc, NoHostAvailable):
        causes = list((getattr(exc, "errors", None) or {}).values())
        if causes and all(isinstance(c, AuthenticationFailed) for c in causes):
            # Not transient: retrying will not help (and every attempt is a failed login
            # in the cluster's audit log), so not "unavailable".
            return StoreAccessDenied(f"Cassandra at {url.redacted()} rejected the credentials: {exc}")
        if causes and all(isinstance(c, BaseException) and _tls_refused(c) for c in causes):
            return StoreAccessDenied(
                f"TLS to Cassandra at {url.redacted()} failed: a node's certificate did not verify against "
                f"ssl_ca / ssl_hostname, or the node does not speak TLS: {exc}"
            )
        return StoreUnavailable(f"cannot reach Cassandra at {url.redacted()}: {exc}")
    return error


# -- the store ----------------------------------------------------------------------------------


class CassandraStore(CellStore):
    """:class:`CellStore` on Cassandra. Thread-safe (the driver session is); one per process."""

    spans_machines = True
    batches_compare_and_set = True

    _CONCURRENCY: ClassVar[int] = 16
    """Threads for :meth:`run_concurrently` (calls block on the driver, which is thread-safe)."""
    _MANY_IN_FLIGHT: ClassVar[int] = 128
    """Requests in flight at once for the many-rows reads (leasewatch's scan): enough to hide the
    round trip, and a bound, so that a scan of 100,000 lock ids never queues 100,000 requests in
    the driver at once or starves the lock clients' requests on the same nodes."""

    def __init__(
        self,
        url: StoreUrl,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        self._redacted = url.redacted()
        self._timeout = url.float_option("timeout", DEFAULT_TIMEOUT)
        # How long an unknown compare-and-set outcome may be chased (re-reads and retries).
        self._resolve_for = url.float_option("resolve_timeout", 2 * self._timeout)
        self._cluster, self._session, self._dialect = connect_cluster(
            url, username=username, password=password, tls=tls
        )
        self.supports_compare_and_set = self._dialect.supports_lwt
        self._closed = False
        self._close_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_url(
        cls,
        url: StoreUrl,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: TlsOptions | None = None,
    ) -> CassandraStore:
        return cls(url, username=username, password=password, tls=tls)

    @property
    def url(self) -> str:
        return self._redacted

    def run_concurrently(self, calls: Sequence[Callable[[], _T]]) -> list[_T]:
        if len(calls) <= 1:
            return [call() for call in calls]
        with self._close_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._CONCURRENCY, thread_name_prefix="chronolock-cql")
            pool = self._pool
        futures = [pool.submit(call) for call in calls]
        errors = [f.exception() for f in futures]  # waits for every call
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]

    # -- execution ---------------------------------------------------------------------------

    def _execute(self, query: _Query, what: str, profile: object = EXEC_PROFILE_DEFAULT) -> Any:
        if self._closed:
            raise StoreError(f"the Cassandra store {self._redacted} is closed")
        statement, params = query
        try:
            return self._session.execute(statement, params, execution_profile=profile)
        except Exception as exc:
            raise translate_error(exc, what) from exc

    def _statement(self, build: Any, *args: Any, **kwargs: Any) -> _Query:
        """Build a statement; preparing it is a round trip that can fail like any other."""
        if self._closed:
            raise StoreError(f"the Cassandra store {self._redacted} is closed")
        try:
            query: _Query = build(*args, **kwargs)
        except Exception as exc:
            raise translate_error(exc, "prepare") from exc
        return query

    # -- last-write-wins tables -------------------------------------------------------------------

    def put(
        self,
        table: Table,
        row: str,
        column: str,
        value: str,
        *,
        timestamp: int,
        ttl: float | None = None,
    ) -> None:
        self._run(self._plan(Put(table, row, column, value, timestamp, ttl)))

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        if not cells:
            return
        seconds = _ttl_seconds(ttl)
        query = self._statement(self._dialect.put_cells, str(table), row, dict(cells), int(timestamp), seconds)
        self._execute(query, "put_cells")

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        self._run(self._plan(Delete(table, row, column, timestamp)))

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        result: Cell | None = self._run(self._plan(Get(table, row, column)))
        return result

    def read_row(
        self,
        table: Table,
        row: str,
        *,
        start: str = "",
        limit: int | None = None,
        end: str | None = None,
        reverse: bool = False,
    ) -> list[Cell]:
        result: list[Cell] = self._run(self._plan(ReadRow(table, row, start, limit, end, reverse)))
        return result

    # -- operations as data: one at a time, or overlapped -------------------------------------------

    def _plan(self, op: Put | Delete | Get | ReadRow | ReadVersioned) -> _Plan:
        """The statement an operation sends and how its answer becomes the port's result."""
        match op:
            case Put():
                query = self._statement(
                    self._dialect.put,
                    str(op.table),
                    op.row,
                    op.column,
                    op.value,
                    timestamp=int(op.timestamp),
                    ttl=_ttl_seconds(op.ttl),
                )
                return _Plan(query, "put", EXEC_PROFILE_DEFAULT, _nothing)
            case Delete():
                query = self._statement(self._dialect.delete, str(op.table), op.row, op.column, int(op.timestamp))
                return _Plan(query, "delete", EXEC_PROFILE_DEFAULT, _nothing)
            case Get():
                query = self._statement(self._dialect.get, str(op.table), op.row, op.column)
                return _Plan(query, "get", EXEC_PROFILE_DEFAULT, _first_cell)
            case ReadRow():
                validate_limit(op.limit)
                query = self._statement(
                    self._dialect.read_row, str(op.table), op.row, op.start, op.limit, op.end, op.reverse
                )
                return _Plan(query, "read_row", EXEC_PROFILE_DEFAULT, _cells)
            case ReadVersioned():
                query = self._statement(self._modern().read_versioned, op.table.value, op.row)
                return _Plan(query, "read_versioned", PROFILE_SERIAL if op.serial else EXEC_PROFILE_DEFAULT, _values)

    def _run(self, plan: _Plan) -> Any:
        try:
            result = self._execute(plan.query, plan.what, plan.profile)
            try:
                return plan.finish(result)  # may fetch further pages: a round trip each
            except Exception as exc:
                raise translate_error(exc, plan.what) from exc
        except StoreOutcomeUnknown as exc:
            if plan.what in _WRITES:
                raise
            # A read has no outcome to settle: it simply got no answer (and may be tried again).
            raise StoreUnavailable(str(exc)) from exc.__cause__

    def begin(self, ops: Sequence[Op]) -> Pending:
        """Every plain operation is sent at once with the driver's asynchronous API (one round
        trip of latency, no thread hand-offs); compare-and-sets and serial reads — which chase
        unknown outcomes with retries — run on the waiting thread when it waits."""
        if self._closed:
            raise StoreError(f"the Cassandra store {self._redacted} is closed")
        sent: list[tuple[int, _Plan, Any]] = []
        errors: list[tuple[int, BaseException]] = []
        deferred: list[int] = []
        for i, op in enumerate(ops):
            if isinstance(op, CompareAndSet) or (isinstance(op, ReadVersioned) and op.serial):
                deferred.append(i)
                continue
            try:
                plan = self._plan(op)
                future = self._session.execute_async(plan.query[0], plan.query[1], execution_profile=plan.profile)
            except Exception as exc:
                errors.append((i, translate_error(exc, "begin")))
                continue
            sent.append((i, plan, future))

        def finish() -> list[Any]:
            results: list[Any] = [None] * len(ops)
            failed = list(errors)
            for i in deferred:
                try:
                    results[i] = perform(self, ops[i])
                except StoreError as exc:
                    failed.append((i, exc))
            for i, plan, future in sent:
                try:
                    results[i] = plan.finish(future.result())
                except Exception as exc:
                    failed.append((i, translate_error(exc, plan.what)))
            if failed:
                raise min(failed, key=lambda f: f[0])[1]
            return results

        return Pending(finish)

    # -- many rows at once: bounded concurrency -------------------------------------------------------

    def _run_many(self, plans: Sequence[_Plan]) -> list[Any]:
        """Every plan's result, in order: at most ``_MANY_IN_FLIGHT`` requests in flight, the next
        sent as soon as one answers (the driver's futures; no extra threads). Results are
        finished on this thread — a result set that pages on fetches its next page here, never on
        the driver's event loop. If any fails, the first error (in plan order) is raised after
        every request has answered."""
        if self._closed:
            raise StoreError(f"the Cassandra store {self._redacted} is closed")
        answered: queue.SimpleQueue[int] = queue.SimpleQueue()
        futures: dict[int, Any] = {}
        unsent: dict[int, BaseException] = {}

        def send(i: int) -> None:
            plan = plans[i]
            try:
                futures[i] = self._session.execute_async(plan.query[0], plan.query[1], execution_profile=plan.profile)
            except Exception as exc:
                unsent[i] = exc
                answered.put(i)
                return
            # The callbacks only say which request answered (a callback's argument is the first
            # page of rows, not the result set); the result is taken from the future below.
            futures[i].add_callbacks(
                callback=lambda _rows, i=i: answered.put(i), errback=lambda _e, i=i: answered.put(i)
            )

        results: list[Any] = [None] * len(plans)
        failed: list[tuple[int, StoreError]] = []
        sent = 0
        while sent < min(len(plans), self._MANY_IN_FLIGHT):
            send(sent)
            sent += 1
        done: set[int] = set()
        while len(done) < len(plans):
            i = answered.get()
            if i in done:
                # A future can answer twice: with speculative execution (idempotent reads go to a
                # second replica after speculate_after) both responses may fire the callbacks.
                continue
            done.add(i)
            if sent < len(plans):
                send(sent)
                sent += 1
            failure: BaseException | None = unsent.get(i)
            if failure is None:
                try:
                    results[i] = plans[i].finish(futures.pop(i).result())
                    continue
                except Exception as exc:
                    failure = exc
            failed.append((i, translate_error(failure, plans[i].what)))
        if failed:
            raise min(failed, key=lambda f: f[0])[1]
        return results

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        """One slice per row from its own start (so a queue read skips the tombstones below its
        watermark), ``_MANY_IN_FLIGHT`` at a time, token-aware: each goes to a replica of its row.
        CQL cannot select by ``WRITETIME``: ``newer_than`` filters the answers here."""
        wanted = list(dict.fromkeys(rows))
        bounds = starts or {}
        plans = [self._plan(ReadRow(table, row, bounds.get(row, ""))) for row in wanted]
        out: dict[str, list[Cell]] = {}
        for row, found in zip(wanted, self._run_many(plans), strict=True):
            cells = found if newer_than is None else [cell for cell in found if cell.timestamp > newer_than]
            if cells:
                out[row] = cells
        return out

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        wanted = list(dict.fromkeys(rows))
        if serial:
            # Paxos rounds chase contention with retries (read_versioned): one at a time.
            return super().read_versioned_many(wanted, table=table, serial=True)
        plans = [self._plan(ReadVersioned(row, table, serial=False)) for row in wanted]
        return {row: cells for row, cells in zip(wanted, self._run_many(plans), strict=True) if cells}

    # -- the versioned table ----------------------------------------------------------------------

    def _modern(self) -> _ModernDialect:
        if not isinstance(self._dialect, _ModernDialect):
            raise StoreError(_CAS_UNSUPPORTED)
        return self._dialect

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        def read() -> dict[str, str]:
            values: dict[str, str] = self._run(self._plan(ReadVersioned(row, table, serial)))
            return values

        if not serial:
            return read()
        # A SERIAL read is a Paxos round: under contention on a ring it can time out or answer
        # 0x1700 like a write. It is a read, so trying again is always safe.
        return serial_read(read, resolve_for=self._resolve_for)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        check_cas_arguments(expected, updates)
        dialect = self._modern()

        def send() -> CasResult:
            try:
                # Preparing is a round trip of its own: if it fails, the compare-and-set was not sent.
                batch = self._statement(dialect.cas_batch, table.value, row, expected, updates)
            except StoreError as exc:
                raise StoreUnavailable(f"compare_and_set not sent: {exc}") from exc
            # Failures come classified (lockclient.store.outcomes): UNKNOWN (a CAS WriteTimeout,
            # 0x1700, a WriteFailure or Unavailable after a quorum accepted, a connection lost
            # mid-request...) as StoreOutcomeUnknown — re-read, never resent blindly (the datastax
            # lwt.rst idiom); NOT_SENT / NOT_APPLIED as StoreUnavailable when worth another try.
            result = self._execute((batch, None), "compare_and_set", PROFILE_CAS)
            return self._cas_result(result, expected, updates)

        return settled_compare_and_set(
            send,
            lambda: self.read_versioned(row, table=table),
            row,
            expected,
            updates,
            resolve_for=self._resolve_for,
        )

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Iterator[tuple[int, CasResult | StoreError]]:
        """All sent at once (driver futures), yielded as each answers. An operation that failed is
        settled through :meth:`compare_and_set` with the same values: if the failure was UNKNOWN,
        its first step sends the same write again, whose answer — or the re-read it leads to —
        recognises the earlier send by value (the values carry the caller's attempt id, and both
        sends are one call of the caller's: it dates from before the first); if NOT_SENT or
        NOT_APPLIED, that is simply the retry."""
        dialect = self._modern()
        # The callbacks only say *which* request answered: a callback's argument is the first page
        # of rows, not the result set (no ``was_applied``), so the answer is taken from the future
        # on this thread. Each index is taken once (a future's callbacks may fire twice).
        answered: queue.SimpleQueue[int] = queue.SimpleQueue()
        futures: dict[int, Any] = {}
        failed_to_send: dict[int, BaseException] = {}
        for index, op in enumerate(ops):
            check_cas_arguments(op.expected, op.updates)
            try:
                batch = self._statement(dialect.cas_batch, op.table.value, op.row, op.expected, op.updates)
                futures[index] = self._session.execute_async(batch, None, execution_profile=PROFILE_CAS)
            except Exception as exc:
                failed_to_send[index] = exc
                answered.put(index)
                continue
            futures[index].add_callbacks(
                callback=lambda _rows, i=index: answered.put(i), errback=lambda _exc, i=index: answered.put(i)
            )
        done: set[int] = set()
        while len(done) < len(ops):
            index = answered.get()
            if index in done:
                continue
            done.add(index)
            op = ops[index]
            failure: BaseException | None = failed_to_send.get(index)
            if failure is None:
                try:
                    result = futures[index].result()
                    yield index, self._cas_result(result, op.expected, op.updates)
                    continue
                except Exception as exc:
                    failure = exc
            error = translate_error(failure, "compare_and_set")
            if isinstance(error, StoreUnavailable):  # UNKNOWN (settled by value) or worth another try
                try:
                    yield index, self.compare_and_set(op.row, op.expected, op.updates, table=op.table)
                except StoreError as exc:
                    yield index, exc
            else:
                yield index, error

    def _cas_result(
        self,
        result: Any,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
    ) -> CasResult:
        try:
            applied = bool(result.was_applied)
            names = list(result.column_names or [])
            rows = list(result.current_rows)
        except Exception as exc:
            # The request was executed; only its answer cannot be read: the outcome is unknown.
            raise StoreOutcomeUnknown(f"compare_and_set: unreadable answer ({exc!r})") from exc
        conditions = conditioned(expected)
        if applied:
            return CasResult(applied=True, current={**conditions, **updates})
        # A failed conditional batch returns [applied]=false plus, for every row a condition
        # named that exists, its primary key and current value (batches always include the key
        # columns). Missing rows are absent from the result; unconditioned (ANY) rows are never
        # in it.
        current: dict[str, str | None] = dict.fromkeys(conditions)
        if "col" in names and "value" in names:
            col_at, value_at = names.index("col"), names.index("value")
            for found in rows:
                name = found[col_at]
                if name in current:
                    current[name] = found[value_at]
        # "Not applied" while the row holds this call's own values (unique to the call: they carry
        # its attempt id) means a Paxos round re-proposed our earlier, timed-out send of this same
        # call and committed it, and this send's condition then failed against it — seen on a
        # 3-node 4.1 ring under contention. Never the case for a *different* call that repeats a
        # change (a renewal's retry): it writes a different attempt id.
        return not_applied_answer(updates, current)

    # -- housekeeping -------------------------------------------------------------------------------

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._cluster.shutdown()
