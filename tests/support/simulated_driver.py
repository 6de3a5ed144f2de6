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

:class:`InjectingSession` wraps a *real* driver session (a modern Cassandra node) with the same
failure rules: the statement runs on the node (or does not), and the driver's exception object is
raised — so the same replays run on a real server when ``CHRONOLOCK_TEST_CASSANDRA`` names one.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from cassandra.query import BatchStatement, BoundStatement, PreparedStatement

import lockclient.store.cassandra as cassandra_adapter
from lockclient.store import CellStore, Table, VersionedTable, parse_store_url
from lockclient.store.base import ANY
from lockclient.store.cassandra import PROFILE_CAS, PROFILE_SERIAL, CassandraStore

__all__ = ["InjectingSession", "SimCall", "SimulatedSession", "inject_faults", "simulated_cassandra_store"]

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


class _Faults:
    """Failure rules, shared by the simulated session and the injecting wrapper."""

    def __init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self.calls: list[SimCall] = []
        self.failed: list[tuple[SimCall, BaseException, bool]] = []

    def fail(self, when: Callable[[SimCall], bool], error: BaseException, *, applied: bool, times: int = 1) -> None:
        """The next ``times`` statements for which ``when`` holds raise ``error`` — after being
        applied (``applied``: the answer was lost) or instead of running."""
        with self._lock:
            self._rules.append(_Rule(when, error, applied, times))

    def heal(self) -> None:
        with self._lock:
            self._rules.clear()

    def _run_with_rules(self, call: SimCall, run: Callable[[], Any]) -> Any:
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


class SimulatedSession(_Faults):
    """Stands in for ``cassandra.cluster.Session``; see the module docstring. ``backing`` None:
    it only describes statements (what :class:`InjectingSession` uses it for)."""

    def __init__(self, backing: CellStore | None) -> None:
        super().__init__()
        self._backing = backing

    @property
    def backing(self) -> CellStore:
        assert self._backing is not None, "a describe-only session runs nothing"
        return self._backing

    # -- the driver's surface ------------------------------------------------------------------------

    def prepare(self, cql: str) -> PreparedStatement:
        return _Prepared(cql)

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> _Result:
        call, run = self._interpret(statement, params, kwargs.get("execution_profile"))
        result: _Result = self._run_with_rules(call, run)
        return result

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> _Future:
        try:
            return _Future(self.execute(statement, params, **kwargs), None)
        except Exception as exc:
            return _Future(None, exc)

    def describe(self, statement: Any, params: Any, profile: object) -> SimCall:
        """What a failure rule sees of a statement (nothing is run)."""
        return self._interpret(statement, params, profile)[0]

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
            return call, lambda: _Result(
                ["col", "value"], sorted(self.backing.read_versioned(row, table=versioned, serial=serial).items())
            )
        return self._last_write_wins(cql, values)

    def _last_write_wins(self, cql: str, values: list[Any]) -> tuple[SimCall, Callable[[], _Result]]:
        store = _Lazy(self)
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
        t, r = table, row
        return SimCall("lww_write", t, r), lambda: _void(self.backing.put_cells(t, r, cells, timestamp=ts, ttl=ttl))

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
        t, r = table, row

        def run() -> _Result:
            result = self.backing.compare_and_set(r, expected, updates, table=t)
            if result.applied:
                return _Result(["[applied]"], [(True,)], was_applied=True)
            found_rows = [(False, r, col, value) for col, value in sorted(result.current.items()) if value is not None]
            return _Result(["[applied]", "row", "col", "value"], found_rows, was_applied=False)

        return call, run


class _Lazy:
    """The backing store, looked up when a statement runs (a describe-only session has none)."""

    def __init__(self, session: SimulatedSession) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session.backing, name)


class InjectingSession(_Faults):
    """A real driver session with failure rules: a statement a rule matches raises the rule's
    exception instead of running, or after running on the real node (``applied``)."""

    def __init__(self, real: Any, prepared: Iterable[PreparedStatement] = ()) -> None:
        super().__init__()
        self.real = real
        self._describer = SimulatedSession(None)
        self._by_id: dict[bytes, PreparedStatement] = {p.query_id: p for p in prepared}

    def prepare(self, cql: str) -> PreparedStatement:
        prepared = self.real.prepare(cql)
        self._by_id[prepared.query_id] = prepared
        return prepared

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        call = self._describe(statement, params, kwargs.get("execution_profile"))
        return self._run_with_rules(call, lambda: self.real.execute(statement, params, **kwargs))

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        call = self._describe(statement, params, kwargs.get("execution_profile"))
        with self._lock:
            matched = any(r.times > 0 and r.when(call) for r in self._rules)
        if not matched:
            with self._lock:
                self.calls.append(call)
            return self.real.execute_async(statement, params, **kwargs)
        try:
            return _Future(self._run_with_rules(call, lambda: self.real.execute(statement, params, **kwargs)), None)
        except Exception as exc:
            return _Future(None, exc)

    def _describe(self, statement: Any, params: Any, profile: object) -> SimCall:
        """The real statement (serialized values, server-assigned ids) as the simulated one."""
        if isinstance(statement, BatchStatement):
            plain = BatchStatement()
            for _, query_id, values in statement._statements_and_parameters:
                prepared = self._by_id[query_id]
                decoded = self._decode(prepared, values)
                plain._statements_and_parameters.append((True, prepared.query_string.encode(), decoded))
            return self._describer.describe(plain, None, profile)
        if isinstance(statement, BoundStatement):
            prepared = statement.prepared_statement
            bound = _Prepared(prepared.query_string).bind(self._decode(prepared, statement.values))
            return self._describer.describe(bound, None, profile)
        return SimCall("other", "", "")

    @staticmethod
    def _decode(prepared: PreparedStatement, values: Sequence[Any]) -> list[Any]:
        return [
            None if value is None else column.type.deserialize(value, 5)
            for value, column in zip(values, prepared.column_metadata, strict=True)
        ]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def inject_faults(store: CassandraStore) -> InjectingSession:
    """Put failure rules between a real :class:`CassandraStore` and its driver session."""
    dialect = store._dialect
    session = InjectingSession(store._session, getattr(dialect, "_prepared", {}).values())
    store._session = session
    dialect.attach(session)
    return session


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
