"""The cell store: one port (:class:`CellStore`), two adapters, chosen by URL.

* ``sqlite:///path/to/cells.db`` — the embedded default; one file shared by
  every local process. Query options: ``busy_timeout`` (seconds, default 5),
  ``gc_grace`` (seconds a tombstone is kept, default 3600).
* ``cassandra://host1,host2:9042/keyspace?dc=dc1`` — Apache Cassandra 4.x/5.x
  through ``cassandra-driver`` (the ``cassandra`` extra). Query options: ``dc``
  (route requests to that datacenter), ``lock_scope``, ``timeout``,
  ``resolve_timeout``, ``protocol_version`` (``1`` selects the Cassandra 1.2
  compatibility path used by the local test node), and TLS: ``ssl``, ``ssl_ca``,
  ``ssl_cert``, ``ssl_key``, ``ssl_hostname``, ``ssl_verify``
  (:mod:`lockclient.store.tls`). Credentials: ``cassandra://user:password@host/ks``
  or the ``CHRONOLOCK_CASSANDRA_USERNAME`` / ``CHRONOLOCK_CASSANDRA_PASSWORD`` settings.

Unknown options, options given twice, and numbers that are not finite or out of range
are refused when the URL is parsed (:mod:`lockclient.store.url`).
"""

from __future__ import annotations

from lockclient.errors import ConfigurationError
from lockclient.store.base import (
    VERSIONED_TABLE,
    CasResult,
    Cell,
    CellStore,
    CheckpointResult,
    Table,
    VersionedTable,
    concurrently,
)
from lockclient.store.url import StoreUrl, TlsOptions, parse_store_url

__all__ = [
    "VERSIONED_TABLE",
    "CasResult",
    "Cell",
    "CellStore",
    "CheckpointResult",
    "StoreUrl",
    "Table",
    "TlsOptions",
    "VersionedTable",
    "concurrently",
    "open_store",
    "parse_store_url",
]


def open_store(
    url: str | StoreUrl,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: TlsOptions | None = None,
) -> CellStore:
    """Open the store a URL names (the tooz idiom: the scheme picks the backend). Cassandra
    needs the ``cassandra`` extra installed. ``username``/``password`` are used when the URL
    carries no credentials; ``tls`` when it carries no ``ssl*`` option. Adapters are imported
    here, on demand: they import the URL parser, never the other way round."""
    parsed = url if isinstance(url, StoreUrl) else parse_store_url(url)
    if parsed.scheme == "sqlite":
        from lockclient.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(parsed)
    try:
        from lockclient.store.cassandra import CassandraStore
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError(
            "the Cassandra store needs cassandra-driver: pip install 'chronolock[cassandra]'"
        ) from exc
    store: CellStore = CassandraStore.from_url(parsed, username=username, password=password, tls=tls)
    return store
