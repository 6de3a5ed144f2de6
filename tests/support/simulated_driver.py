"""A *simulated* cassandra-driver session backed by a SQLite cell store. It is not Cassandra.

What it is for: running the real :class:`~lockclient.store.cassandra.CassandraStore` code —
statement building (``_ModernDialect``), ``translate_error`` and the classification table,
``compare_and_set``'s resolution of unknown outcomes, ``_cas_result`` — without a server, and
making it meet exactly the failures a test names, raised as the driver's own exception objects
(``cassandra.WriteTimeout`` of write type CAS, ``WriteFailure``, a bare ``ErrorMessage`` with code
0x1700, ``NoHostAvailable``...), either before the statement runs (not applied) or after it was
applied to the backing store (applied, answer lost).

What it does: it executes the statements ``_ModernDialect`` builds (and only those: anything else
is an error) on a :class:`~lockclient.store.base.CellStore` through the port — a conditional batch
becomes one ``compare_and_set``, a ``SELECT col, value`` one ``read_versioned`` — and answers as the
driver does: result rows as tuples, and for a conditional batch ``was_applied`` plus, when not
applied, a row ``([applied], row, col, value)`` per conditioned cell that exists (Cassandra returns
nothing for unconditioned statements). The Paxos semantics are the backing store's (one SQLite
transaction): what this cannot show is what only a real ring does (a proposal a minority accepted,
completed by a later round) — the Cassandra tests do that, on a real node.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from cassandra.query import BatchStatement, BoundStatement, PreparedStatement

import lockclient.store.cassandra as cassandra_adapter
from lockclient.store import CellStore, Table, VersionedTable, parse_store_url
from lockclient.store.base import ANY
from lockclient.store.cassandra import PROFILE_CAS, PROFILE_SERIAL, CassandraStore

__all__ = ["SimCall", "SimulatedSession", "simulated_cassandra_store"]

KEYSPACE = "chronolock_sim"

_INSERT = re.compile(r"^INSERT INTO (\S+) \(row, col, value\) VALUES \(\?, \?, \?\) USING TIMESTAMP \?( AND TTL \?)?$")
_DELETE_LWW = re.compile(r"^DELETE FROM (\S+) USING TIMESTAMP \? WHERE row = \? AND col = \?$")
_GET = re.compile(r"^SELECT col, value, WRITETIME\(value\) FROM (\S+) WHERE row = \? AND col = \?$")
_SLICE = re.compile(
    r"^SELECT col, value, WRITETIME\(value\) FROM (\S+) WHERE row = \? AND col >= \?"
    r"( AND col <= \?)?( ORDER BY col DESC)?( LIMIT \?)?$"
)
_READ_VERSIONED = re.compile(r"^SELECT col, value FROM (\S+) WHERE row = \?$")
_CAS_WRITE = re.compile(r"^UPDATE (\S+) SET value = \? WHERE row = \? AND col = \? IF value = \?$")
_CAS_DELETE = re.compile(r"^DELETE FROM (\S+) WHERE row = \? AND col = \? IF value = \?$")
_ANY_WRITE = re.compile(r"^UPDATE (\S+) SET value = \? WHERE row = \? AND col = \?$")
_ANY_DELETE = re.compile(r"^DELETE FROM (\S+) WHERE row = \? AND col = \?$")


@dataclass(frozen=True)
class SimCall:
    """One statement as a test's failure rule sees it."""

    kind: str
    """``cas`` (a conditional batch), ``serial_read`` / ``read`` (of a versioned row), ``lww_read``,
    ``lww_write``."""
    table: str
    row: str
    expected: dict[str, str | None] = field(default_factory=dict)
    updates: dict[str, str | None] = field(default_factory=dict)

    def grants(self) -> bool:
        """A grant: the holder record expected absent and written."""
        return self.kind == "cas" and "~holder" in self.expected and self.expected["~holder"] is None

    def renews(self) -> bool:
        return self.kind == "cas" and self.expected.get("~holder") is not None and bool(self.updates.get("~holder"))

    def releases(self) -> bool:
        return (
            self.kind == "cas" and self.expected.get("~holder") is not None and self.updates.get("~holder", "") is None
        )


@dataclass
class _Rule:
    when: Callable[[SimCall], bool]
    error: BaseException
    applied: bool
    times: int


class _Prepared(PreparedStatement):  # type: ignore[misc]
    """A prepared statement as far as ``BatchStatement.add`` needs one; values stay Python values
    (nothing is serialized: the session reads them back)."""

    def __init__(self, cql: str) -> None:
        super().__init__([], cql.encode(), None, cql, None, 5, None, None)

    def bind(self, values: Sequence[object]) -> BoundStatement:
        bound = BoundStatement(self)
        bound.values = list(values)
        return bound


class _Result:
    """What ``session.execute`` returns, as much of a ``ResultSet`` as the adapter uses."""

    def __init__(self, column_names: list[str], rows: list[tuple[Any, ...]], was_applied: bool | None = None) -> None:
        self.column_names = column_names
        self.current_rows = rows
        self._applied = was_applied

    @property
    def was_applied(self) -> bool:
        if self._applied is None:
            raise RuntimeError("was_applied on a result that is not a compare-and-set's")
        return self._applied

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.current_rows)


class _Future:
    def __init__(self, result: _Result | None, error: BaseException | None) -> None:
        self._result, self._error = result, error

    def result(self) -> _Result:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def add_callbacks(self, callback: Callable[[Any], object], errback: Callable[[BaseException], object]) -> None:
        if self._error is not None:
            errback(self._error)
        else:
            callback(self._result.current_rows if self._result is not None else None)


class _Cluster:
    def shutdown(self) -> None:
        pass


class SimulatedSession:
    """Stands in for ``cassandra.cluster.Session``; see the module docstring."""

    def __init__(self, backing: CellStore) -> None:
        self.backing = backing
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self.calls: list[SimCall] = []
        self.failed: list[tuple[SimCall, BaseException, bool]] = []

    # -- what a test arranges ---------------------------------------------------------------------

    def fail(self, when: Callable[[SimCall], bool], error: BaseException, *, applied: bool, times: int = 1) -> None:
        """The next ``times`` statements for which ``when`` holds raise ``error`` — after being
        applied to the backing store (``applied``: the answer was lost) or instead of running."""
        with self._lock:
            self._rules.append(_Rule(when, error, applied, times))

    def heal(self) -> None:
        with self._lock:
            self._rules.clear()

    # -- the driver's surface ------------------------------------------------------------------------

    def prepare(self, cql: str) -> PreparedStatement:
        return _Prepared(cql)

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> _Result:
        call, run = self._interpret(statement, params, kwargs.get("execution_profile"))
        with self._lock:
            self.calls.append(call)
            rule = next((r for r in self._rules if r.times > 0 and r.when(call)), None)
            if rule is not None:
                rule.times -= 1
        if rule is None:
            return run()
        if rule.applied:
            run()
        self.failed.append((call, rule.error, rule.applied))
        raise rule.error

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> _Future:
        try:
            return _Future(self.execute(statement, params, **kwargs), None)
        except Exception as exc:
            return _Future(None, exc)

    # -- executing the dialect's statements on the backing store ------------------------------------

    def _interpret(self, statement: Any, params: Any, profile: object) -> tuple[SimCall, Callable[[], _Result]]:
        if isinstance(statement, BatchStatement):
            parts = [(qid.decode(), list(values)) for _, qid, values in statement._statements_and_parameters]
            if any(" IF " in cql for cql, _ in parts):
                return self._cas(parts)
            return self._put_cells(parts)
        assert isinstance(statement, BoundStatement), f"the simulated driver runs bound statements, not {statement!r}"
        cql, values = statement.prepared_statement.query_string, list(statement.values)
        if found := _READ_VERSIONED.match(cql):
            versioned = VersionedTable(_name(found[1]))
            (row,) = values
            serial = profile == PROFILE_SERIAL
            call = SimCall("serial_read" if serial else "read", versioned, row)
            store = self.backing
            return call, lambda: _Result(
                ["col", "value"], sorted(store.read_versioned(row, table=versioned, serial=serial).items())
            )
        return self._last_write_wins(cql, values)

    def _last_write_wins(self, cql: str, values: list[Any]) -> tuple[SimCall, Callable[[], _Result]]:
        store = self.backing
        if found := _INSERT.match(cql):
            table = Table(_name(found[1]))
            row, col, value, ts, *ttl = values
            call = SimCall("lww_write", table, row)
            return call, lambda: _void(store.put(table, row, col, value, timestamp=ts, ttl=ttl[0] if ttl else None))
        if found := _DELETE_LWW.match(cql):
            table = Table(_name(found[1]))
            ts, row, col = values
            return SimCall("lww_write", table, row), lambda: _void(store.delete(table, row, col, timestamp=ts))
        if found := _GET.match(cql):
            table = Table(_name(found[1]))
            row, col = values
            return SimCall("lww_read", table, row), lambda: _cells_result(_opt(store.get(table, row, col)))
        if found := _SLICE.match(cql):
            table = Table(_name(found[1]))
            row, start, *rest = values
            end = rest.pop(0) if found[2] else None
            limit = rest.pop(0) if found[4] else None
            return SimCall("lww_read", table, row), lambda: _cells_result(
                store.read_row(table, row, start=start, limit=limit, end=end, reverse=bool(found[3]))
            )
        raise AssertionError(f"the simulated driver does not know this statement: {cql!r}")

    def _put_cells(self, parts: list[tuple[str, list[Any]]]) -> tuple[SimCall, Callable[[], _Result]]:
        cells: dict[str, str] = {}
        table = row = None
        ts: int = 0
        ttl: int | None = None
        for cql, values in parts:
            found = _INSERT.match(cql)
            assert found, f"the simulated driver does not know this batch statement: {cql!r}"
            table, (row, col, value, ts, *rest) = Table(_name(found[1])), values
            ttl = rest[0] if rest else None
            cells[col] = value
        assert table is not None and row is not None
        store, t, r = self.backing, table, row
        return SimCall("lww_write", t, r), lambda: _void(store.put_cells(t, r, cells, timestamp=ts, ttl=ttl))

    def _cas(self, parts: list[tuple[str, list[Any]]]) -> tuple[SimCall, Callable[[], _Result]]:
        expected: dict[str, str | None] = {}
        updates: dict[str, str | None] = {}
        table = row = None
        for cql, values in parts:
            if found := _CAS_WRITE.match(cql):
                new, row, col, want = values
                expected[col], updates[col] = want, new
            elif found := _CAS_DELETE.match(cql):
                row, col, want = values
                expected[col], updates[col] = want, None
            elif found := _ANY_WRITE.match(cql):
                new, row, col = values
                expected[col], updates[col] = ANY, new
            elif found := _ANY_DELETE.match(cql):
                row, col = values
                expected[col], updates[col] = ANY, None
            else:
                raise AssertionError(f"the simulated driver does not know this batch statement: {cql!r}")
            table = VersionedTable(_name(found[1]))
        assert table is not None and row is not None
        call = SimCall("cas", table, row, dict(expected), dict(updates))
        store, t, r = self.backing, table, row

        def run() -> _Result:
            result = store.compare_and_set(r, expected, updates, table=t)
            if result.applied:
                return _Result(["[applied]"], [(True,)], was_applied=True)
            found_rows = [(False, r, col, value) for col, value in sorted(result.current.items()) if value is not None]
            return _Result(["[applied]", "row", "col", "value"], found_rows, was_applied=False)

        return call, run


def _name(qualified: str) -> str:
    return qualified.rpartition(".")[2]


def _void(_: None) -> _Result:
    return _Result([], [])


def _opt(cell: Any) -> list[Any]:
    return [] if cell is None else [cell]


def _cells_result(cells: Sequence[Any]) -> _Result:
    return _Result(["col", "value", "writetime(value)"], [(c.column, c.value, c.timestamp) for c in cells])


def simulated_cassandra_store(
    backing: CellStore, *, resolve_timeout: float = 0.3
) -> tuple[CassandraStore, SimulatedSession]:
    """A real :class:`CassandraStore` whose driver session is a :class:`SimulatedSession` over
    ``backing``. ``resolve_timeout``: how long the adapter chases an unknown outcome (real time)."""
    session = SimulatedSession(backing)
    url = parse_store_url(f"cassandra://127.0.0.1:9042/{KEYSPACE}?timeout=0.5&resolve_timeout={resolve_timeout}")
    dialect = cassandra_adapter._dialect_for(url)

    def connect(*args: object, **kwargs: object) -> tuple[_Cluster, SimulatedSession, Any]:
        dialect.attach(session)
        return _Cluster(), session, dialect

    with mock.patch.object(cassandra_adapter, "connect_cluster", connect):
        store = CassandraStore(url)
    assert PROFILE_CAS  # the profile names the session is given are the adapter's own
    return store, session
