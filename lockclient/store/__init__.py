"""The cell store: one port (:class:`CellStore`), two adapters, chosen by URL.

* ``sqlite:///path/to/cells.db`` — the embedded default; one file shared by
  every local process. Query options: ``busy_timeout`` (seconds, default 5),
  ``gc_grace`` (seconds a tombstone is kept, default 3600).
* ``cassandra://host1,host2:9042/keyspace?dc=dc1`` — Apache Cassandra 4.x/5.x
  through ``cassandra-driver`` (the ``cassandra`` extra). Query options: ``dc``
  (local datacenter: LOCAL_QUORUM/LOCAL_SERIAL; without it QUORUM/SERIAL),
  ``timeout`` (seconds per request, default 5), ``protocol_version`` (``1``
  selects the Cassandra 1.2 compatibility path used by the local test node).
  Credentials: ``cassandra://user:password@host/ks`` or the
  ``CHRONOLOCK_CASSANDRA_USERNAME`` / ``CHRONOLOCK_CASSANDRA_PASSWORD`` settings.
"""

from __future__ import annotations

from lockclient.store.base import VERSIONED_TABLE, CasResult, Cell, CellStore, Table, VersionedTable, concurrently
from lockclient.store.url import StoreUrl, open_store, parse_store_url

__all__ = [
    "VERSIONED_TABLE",
    "CasResult",
    "Cell",
    "CellStore",
    "StoreUrl",
    "Table",
    "VersionedTable",
    "concurrently",
    "open_store",
    "parse_store_url",
]
