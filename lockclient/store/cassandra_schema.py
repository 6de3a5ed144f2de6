"""The CQL schema of the Cassandra store, and an idempotent ``create_schema`` (``lockctl schema``).

Every table has the one shape the cell-store port needs::

    CREATE TABLE <ks>.<table> (
        row   text,   -- partition: a lock id, a shard, "GlobalTime"
        col   text,   -- clustering column: the cell name (ticket, owner, lock id)
        value text,   -- the only regular column: WRITETIME(value) is the cell timestamp
        PRIMARY KEY (row, col)
    ) WITH CLUSTERING ORDER BY (col ASC)

``value`` must be a regular column, not part of the key: ``WRITETIME()`` works
only on non-key columns, and the algorithms read cell timestamps.

Why the table options are what they are:

* **Leveled compaction**, not time-window. The queue and index rows are
  delete-heavy: a ticket lives for one lock hand-over, then becomes a tombstone
  in the same partition as the live tickets read next. Reads slice those
  partitions constantly, so what matters is how many SSTables a read touches and
  how soon tombstones meet the data they shadow; LCS bounds both (about 90 % of
  a partition's data in one SSTable). Time-window compaction suits append-only,
  TTL-expiring time series and never compacts across windows, so a tombstone in
  a newer window could not purge the older window's cells and slices would scan
  ever more tombstones. The lease table is update-heavy (every renewal rewrites
  the lease cell), which also favours LCS; the global-time row is one partition
  overwritten all the time, the same pattern.
* **gc_grace_seconds** is how long a tombstone is kept before compaction may
  purge it. A replica that missed a delete learns it from a hint (kept for
  ``max_hint_window``, 3 h by default) or from repair; if the tombstone is
  purged elsewhere before either reaches it, the deleted ticket or owner cell
  comes back to life ("zombie" data — here a phantom waiter). So the
  value must be no lower than the hint window *and* no lower than the interval
  between completed repairs. The default is Cassandra's own, 864000 s (10 days),
  safe with the usual weekly repairs. A long grace would normally make queue-head
  reads scan many tombstones; here it does not, because readers start their slice
  at the lock's watermark (lockclient/locker.py), past the released tickets. With
  repairs completing at least every 3 h (incremental repair scheduled by Reaper)
  it may be lowered to the hint window, 10800 s; lower values are refused. Even a
  resurrected queue cell is not fatal: nobody renews it, so leasewatch clears it
  like any dead waiter.
* **The LWT tables** (``lock_lease``, ``fenced_resource``, ``leasewatch_partition``) are never written
  without ``IF``: plain writes carry a client/coordinator timestamp that bypasses
  Paxos ballots, so a plain write could be reordered with (or silently lost
  against) a conditional one. The adapter only ever writes them through
  conditional batches.

**Roles (least privilege).** The lock client, timesvc and leasewatch need only ``SELECT``
and ``MODIFY`` on the keyspace (a lightweight transaction needs both). Creating the
keyspace and tables is the schema command's job, run under its own role:
:func:`role_statements` (``lockctl roles``, run once with an administrator's login) creates
a *schema role* with ``CREATE ON ALL KEYSPACES`` (it then owns the keyspace it creates)
and a *client role* with no permissions; ``create_schema(grant_to=...)`` (``lockctl
schema --grant-to ROLE``) grants the client role ``SELECT`` and ``MODIFY`` on the keyspace.
Nobody needs a superuser login after that.
"""

from __future__ import annotations

import re
from typing import Any, Final

from lockclient.errors import ConfigurationError, StoreError
from lockclient.store.base import Table, VersionedTable
from lockclient.store.url import StoreUrl, TlsOptions, parse_store_url

__all__ = [
    "DEFAULT_GC_GRACE_SECONDS",
    "LWT_TABLES",
    "MIN_GC_GRACE_SECONDS",
    "SCHEMA_VERSION",
    "TABLES",
    "create_roles",
    "create_schema",
    "grant_statements",
    "replication_map",
    "role_statements",
    "schema_statements",
]

SCHEMA_VERSION: int = 2
"""Bumped whenever a statement below changes; written into every table's comment.
v2: the owner and watermark tables are gone (the holder and the watermarks live in the lease row),
fenced resources have their own LWT table, and leasewatch replicas share the lock-id space through
``leasewatch_partition`` (added before v2 was released, so without a bump)."""

TABLES: Final[tuple[str, ...]] = (*(str(t) for t in Table), *(str(t) for t in VersionedTable))
LWT_TABLES: Final[tuple[str, ...]] = tuple(str(t) for t in VersionedTable)

MIN_GC_GRACE_SECONDS: Final = 10800
"""Cassandra's default ``max_hint_window`` (3 h): gc_grace must not be lower (see module docstring)."""
DEFAULT_GC_GRACE_SECONDS: Final = 864000

_DDL_TIMEOUT: Final = 60.0
_NAME_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_STRATEGIES: Final = ("SimpleStrategy", "NetworkTopologyStrategy")
_ROLE_RE: Final = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
CLIENT_PERMISSIONS: Final = ("SELECT", "MODIFY")
"""Everything a lock client, timesvc or leasewatch needs on the keyspace (LWT needs both)."""

_PURPOSE: Final[dict[str, str]] = {
    Table.GLOBAL_TIME.value: "global clock row",
    Table.QUEUE.value: "lock queues: one row per lock, tickets as columns, waiter leases as values",
    Table.INDEX.value: "per-shard index of locks with live state",
    Table.BACKOFF_MAIN.value: "baseline algorithm main row (benchmarks)",
    Table.BACKOFF_SHADOW.value: "baseline algorithm shadow row (benchmarks)",
    VersionedTable.LEASE.value: "holder lease records, fencing counters, queue watermarks; written ONLY with LWT (IF)",
    VersionedTable.FENCED.value: "fenced resources (highest token + keys); written ONLY with LWT (IF)",
    VersionedTable.PARTITION.value: "leasewatch replicas and the partitions each watches; written ONLY with LWT (IF)",
}


def replication_map(
    *, replication_factor: int = 1, strategy: str = "SimpleStrategy", datacenter: str | None = None
) -> dict[str, str | int]:
    """The keyspace replication map for ``SimpleStrategy`` RF=n or ``NetworkTopologyStrategy`` {dc: n}."""
    if replication_factor < 1:
        raise ConfigurationError(f"replication_factor must be at least 1, got {replication_factor}")
    if strategy not in _STRATEGIES:
        raise ConfigurationError(f"replication strategy {strategy!r} is not one of {', '.join(_STRATEGIES)}")
    if strategy == "SimpleStrategy":
        return {"class": strategy, "replication_factor": replication_factor}
    if not datacenter or not re.fullmatch(r"[A-Za-z0-9_.-]+", datacenter):
        raise ConfigurationError("NetworkTopologyStrategy needs a datacenter name (letters, digits, _ . -)")
    return {"class": strategy, datacenter: replication_factor}


def _cql_map(mapping: dict[str, str | int]) -> str:
    items = (f"'{key}': {value if isinstance(value, int) else repr(str(value))}" for key, value in mapping.items())
    return "{" + ", ".join(items) + "}"


def schema_statements(
    keyspace: str,
    replication: dict[str, str | int],
    *,
    if_not_exists: bool = True,
    gc_grace_seconds: int = DEFAULT_GC_GRACE_SECONDS,
) -> list[str]:
    """The DDL, in order. ``if_not_exists=False`` for Cassandra 1.2, which lacks the clause."""
    if not _NAME_RE.match(keyspace):
        raise ConfigurationError(f"Cassandra keyspace {keyspace!r} must be letters, digits and underscores")
    if gc_grace_seconds < MIN_GC_GRACE_SECONDS:
        raise ConfigurationError(
            f"gc_grace_seconds={gc_grace_seconds} is below the hint window ({MIN_GC_GRACE_SECONDS} s): "
            "deleted lock cells could come back"
        )
    guard = " IF NOT EXISTS" if if_not_exists else ""
    statements = [
        f"CREATE KEYSPACE{guard} {keyspace} WITH replication = {_cql_map(replication)} AND durable_writes = true"
    ]
    for table in TABLES:
        comment = f"chronolock schema v{SCHEMA_VERSION}: {_PURPOSE.get(table, 'lock state')}"
        statements.append(
            f"CREATE TABLE{guard} {keyspace}.{table} ("
            "row text, col text, value text, PRIMARY KEY (row, col)"
            ") WITH CLUSTERING ORDER BY (col ASC)"
            " AND compaction = {'class': 'LeveledCompactionStrategy'}"
            f" AND gc_grace_seconds = {int(gc_grace_seconds)}"
            f" AND comment = '{comment}'"
        )
    return statements


def _role(name: str) -> str:
    if not _ROLE_RE.match(name):
        raise ConfigurationError(f"role name {name!r} must be lower-case letters, digits and underscores")
    return name


def _cql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def grant_statements(keyspace: str, roles: tuple[str, ...]) -> list[str]:
    """``GRANT SELECT`` and ``GRANT MODIFY`` on the keyspace to each client role — nothing else."""
    if not _NAME_RE.match(keyspace):
        raise ConfigurationError(f"Cassandra keyspace {keyspace!r} must be letters, digits and underscores")
    return [f"GRANT {p} ON KEYSPACE {keyspace} TO {_role(r)}" for r in roles for p in CLIENT_PERMISSIONS]


def role_statements(*, schema_role: str, schema_password: str, client_role: str, client_password: str) -> list[str]:
    """Create (or update the password of) the schema role and the client role.

    The schema role gets ``CREATE ON ALL KEYSPACES`` only: the keyspace it creates is then
    its own (Cassandra grants a creator every permission on what it created), so it can
    create the tables and grant the client role. The client role gets no permission here;
    ``lockctl schema --grant-to`` grants it SELECT and MODIFY on the keyspace alone.
    Neither is a superuser."""
    statements: list[str] = []
    for role, password in ((schema_role, schema_password), (client_role, client_password)):
        if len(password) < 16:
            raise ConfigurationError(f"the password of role {role!r} must have at least 16 characters")
        name = _role(role)
        statements += [
            f"CREATE ROLE IF NOT EXISTS {name} WITH LOGIN = true AND SUPERUSER = false AND PASSWORD = "
            + _cql_string(password),
            f"ALTER ROLE {name} WITH LOGIN = true AND SUPERUSER = false AND PASSWORD = " + _cql_string(password),
        ]
    if schema_role == client_role:
        raise ConfigurationError("the schema role and the client role must differ")
    statements.append(f"GRANT CREATE ON ALL KEYSPACES TO {_role(schema_role)}")
    return statements


def create_roles(
    store_url: str | StoreUrl,
    *,
    schema_role: str,
    schema_password: str,
    client_role: str,
    client_password: str,
    username: str | None = None,
    password: str | None = None,
    tls: TlsOptions | None = None,
) -> list[str]:
    """Run :func:`role_statements` with an administrator's login (``username``). If the
    keyspace already exists (made before roles were introduced), the schema role is also
    given every permission on it, so that it can manage and grant it. Returns the statements
    run, passwords masked."""
    from lockclient.redact import register_secret
    from lockclient.store.cassandra import connect_cluster, translate_error

    register_secret(schema_password)
    register_secret(client_password)
    url = store_url if isinstance(store_url, StoreUrl) else parse_store_url(store_url)
    statements = role_statements(
        schema_role=schema_role,
        schema_password=schema_password,
        client_role=client_role,
        client_password=client_password,
    )
    cluster, session, dialect = connect_cluster(url, username=username, password=password, tls=tls)
    if not dialect.ddl_if_not_exists:
        cluster.shutdown()
        raise ConfigurationError("roles need Cassandra 2.2 or later")
    ran: list[str] = []
    try:
        exists = session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (url.path,)
        ).one()
        if exists is not None:
            statements.append(f"GRANT ALL PERMISSIONS ON KEYSPACE {url.path} TO {_role(schema_role)}")
        for statement in statements:
            session.execute(statement, timeout=_DDL_TIMEOUT)
            ran.append(re.sub(r"PASSWORD = '(?:[^']|'')*'", "PASSWORD = '***'", statement))
    except StoreError:
        raise
    except Exception as exc:
        raise translate_error(exc, "create_roles") from exc
    finally:
        cluster.shutdown()
    return ran


def create_schema(
    store_url: str | StoreUrl,
    *,
    replication_factor: int = 1,
    strategy: str = "SimpleStrategy",
    datacenter: str | None = None,
    username: str | None = None,
    password: str | None = None,
    gc_grace_seconds: int = DEFAULT_GC_GRACE_SECONDS,
    tls: TlsOptions | None = None,
    grant_to: tuple[str, ...] = (),
) -> list[str]:
    """Create the keyspace the URL names and every table, if missing. Returns the statements run.

    Idempotent: ``IF NOT EXISTS`` on modern Cassandra; on the 1.2 compatibility
    path (``?protocol_version=1``) an "already exists" answer is accepted instead.
    An existing keyspace keeps its replication settings (changing them is an
    ``ALTER KEYSPACE`` plus a repair — an operator's decision, not a side effect).
    ``datacenter`` defaults to the URL's ``dc`` option. ``grant_to`` names client roles
    that get SELECT and MODIFY on the keyspace (:func:`grant_statements`).
    """
    from cassandra import AlreadyExists

    from lockclient.store.cassandra import connect_cluster, translate_error

    url = store_url if isinstance(store_url, StoreUrl) else parse_store_url(store_url)
    replication = replication_map(
        replication_factor=replication_factor,
        strategy=strategy,
        datacenter=datacenter or url.options.get("dc") or None,
    )
    # Validate everything (gc_grace_seconds included) before touching the network, so a bad
    # value is a configuration error even when the cluster is unreachable.
    schema_statements(url.path, replication, if_not_exists=True, gc_grace_seconds=gc_grace_seconds)
    grants = grant_statements(url.path, grant_to)
    cluster, session, dialect = connect_cluster(url, username=username, password=password, tls=tls)
    legacy = not dialect.ddl_if_not_exists
    statements = schema_statements(url.path, replication, if_not_exists=not legacy, gc_grace_seconds=gc_grace_seconds)
    statements += grants
    ran: list[str] = []
    try:
        for statement in statements:
            try:
                # DDL waits for the coordinator to apply it: allow more than one request's timeout.
                session.execute(statement, timeout=_DDL_TIMEOUT)
            except AlreadyExists:
                if not legacy:  # IF NOT EXISTS never answers this; anything else is a real error
                    raise
            ran.append(statement)
        _check_schema_agreement(cluster)
    except StoreError:
        raise
    except Exception as exc:
        raise translate_error(exc, "create_schema") from exc
    finally:
        cluster.shutdown()
    return ran


def _check_schema_agreement(cluster: Any) -> None:
    """DDL returns once the coordinator applied it; wait until every live node has the schema."""
    try:
        agreed = cluster.control_connection.wait_for_schema_agreement()
    except Exception as exc:
        raise StoreError(f"schema agreement check failed: {exc}") from exc
    if not agreed:
        raise StoreError("schema created, but the nodes did not agree on the schema version in time")
