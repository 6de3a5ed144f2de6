"""A simulated cell store with Cassandra's semantics, and the network between it and each process.

:class:`SimCells` is the store's state, applied atomically at the virtual instant a request
*arrives* (a linearizable model of QUORUM writes and reads, and of Paxos for the versioned
tables): per-cell write timestamps, last-write-wins with Cassandra's tie rules, tombstones
that hide older writes arriving later, TTLs counted from when the write applies, ordered row
slices, and compare-and-set over cells of one row.

:class:`SimStoreClient` is one process's :class:`~lockclient.store.CellStore`. Every call is a
request that travels (a seeded delay, with a long tail), applies, and answers (another delay)
— unless :class:`Network` decides otherwise:

* the process is cut off from the store: requests never arrive, answers never come back;
* an answer is lost after the request applied (the driver's client timeout: outcome unknown);
* a compare-and-set answers "outcome unknown" (Cassandra's WriteTimeout of type CAS, or error
  0x1700) having applied, or having not;
* a request is refused before it applies (Unavailable).

A plain write or read that fails raises :class:`~lockclient.errors.StoreUnavailable` (the
adapter's translation); a compare-and-set whose outcome is unknown is settled by SERIAL
re-reads, as the Cassandra adapter does (:meth:`SimStoreClient.compare_and_set`).

It is a simulation, named so: it adds to the real-store tests (SQLite, Cassandra 1.2, a modern
ring), it never replaces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from cassandra import ConsistencyLevel, OperationTimedOut, Unavailable, WriteFailure, WriteTimeout, WriteType
from cassandra.protocol import ErrorMessage
from sortedcontainers import SortedDict

from lockclient.errors import StoreError
from lockclient.store import CasResult, Cell, CellStore, Table, VersionedTable
from lockclient.store.base import (
    CompareAndSet,
    Delete,
    Get,
    Op,
    Pending,
    Put,
    ReadRow,
    ReadVersioned,
    check_cas_arguments,
    conditioned,
    validate_limit,
)
from lockclient.store.cassandra import translate_error
from lockclient.store.outcomes import CAS_RESULT_UNKNOWN
from lockclient.store.settling import not_applied_answer, serial_read, settled_compare_and_set
from sim.world import NS, Waiter

if TYPE_CHECKING:
    from sim.world import Process, World

__all__ = ["Network", "SimCells", "SimStoreClient"]

T = TypeVar("T")

_LIVE, _TOMB = 0, 1


PURGE_AFTER_NS = 30 * NS
"""Tombstones (and expired cells) older than this are dropped when a read passes them — Cassandra's
compaction after gc_grace_seconds, with a grace far longer than any request can be in flight here
(a delayed write older than the tombstone could otherwise come back)."""


@dataclass(slots=True)
class _Stored:
    value: str
    timestamp: int
    kind: int
    expires: int | None  # virtual ns
    written: int  # virtual ns


class SimCells:
    """The store's state (see the module docstring). Every method applies atomically, now."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._rows: dict[tuple[str, str], SortedDict] = {}
        self._versioned: dict[tuple[str, str], dict[str, str]] = {}
        self.applied_cas: list[tuple[int, str, str, dict[str, str | None], dict[str, str | None]]] = []
        """Every compare-and-set that applied: (time, table, row, expected, updates) — the checkers'
        linearization order of grants, renewals, releases and revocations."""
        self.on_cas: Callable[[int, str, str, Mapping[str, str | None], Mapping[str, str | None]], None] | None = None
        self.on_write: Callable[[int, str, str, str, str | None], None] | None = None

    # -- last-write-wins ----------------------------------------------------------------------------

    def _alive(self, stored: _Stored) -> bool:
        return stored.kind == _LIVE and (stored.expires is None or stored.expires > self._world.now)

    def _effective_kind(self, stored: _Stored) -> int:
        # An expired TTL cell is a tombstone with the cell's timestamp (as in Cassandra).
        return (
            _TOMB
            if stored.kind == _TOMB or (stored.expires is not None and stored.expires <= self._world.now)
            else _LIVE
        )

    def _wins(self, new: _Stored, old: _Stored | None) -> bool:
        if old is None:
            return True
        if new.timestamp != old.timestamp:
            return new.timestamp > old.timestamp
        old_kind, new_kind = self._effective_kind(old), new.kind
        if old_kind == _TOMB:
            return False  # a tombstone wins a tie against anything
        if new_kind == _TOMB:
            return True
        return new.value > old.value

    def _write(self, table: str, row: str, column: str, new: _Stored) -> None:
        cells = self._rows.get((table, row))
        if cells is None:
            cells = self._rows[(table, row)] = SortedDict()
        if self._wins(new, cells.get(column)):
            cells[column] = new
            if self.on_write is not None:
                self.on_write(self._world.now, table, row, column, new.value if new.kind == _LIVE else None)

    def put(self, table: str, row: str, column: str, value: str, timestamp: int, ttl: float | None) -> None:
        now = self._world.now
        expires = None if ttl is None else now + int(ttl * NS)
        self._write(table, row, column, _Stored(value, timestamp, _LIVE, expires, now))

    def delete(self, table: str, row: str, column: str, timestamp: int) -> None:
        self._write(table, row, column, _Stored("", timestamp, _TOMB, None, self._world.now))

    def get(self, table: str, row: str, column: str) -> Cell | None:
        cells = self._rows.get((table, row))
        stored = None if cells is None else cells.get(column)
        if stored is None or not self._alive(stored):
            return None
        return Cell(column, stored.value, stored.timestamp)

    def read_row(
        self, table: str, row: str, start: str, limit: int | None, end: str | None, reverse: bool
    ) -> list[Cell]:
        cells = self._rows.get((table, row))
        if not cells:
            return []
        out: list[Cell] = []
        now = self._world.now
        purge: list[str] = []
        for column in cells.irange(minimum=start or None, maximum=end, reverse=reverse):
            stored = cells[column]
            if stored.kind == _LIVE and (stored.expires is None or stored.expires > now):
                out.append(Cell(column, stored.value, stored.timestamp))
                if limit is not None and len(out) >= limit:
                    break
            elif now - (stored.written if stored.kind == _TOMB else stored.expires or 0) > PURGE_AFTER_NS:
                purge.append(column)
        for column in purge:
            del cells[column]
        return out

    # -- versioned (compare-and-set) -----------------------------------------------------------------

    def read_versioned(self, table: str, row: str) -> dict[str, str]:
        return dict(self._versioned.get((table, row), {}))

    def compare_and_set(
        self, table: str, row: str, expected: Mapping[str, str | None], updates: Mapping[str, str | None]
    ) -> CasResult:
        """Linearizable, as Paxos: every real condition must hold (``ANY`` columns are written
        unconditioned). Not applied: ``current`` holds the conditioned columns, as Cassandra
        answers a failed conditional batch."""
        current = self._versioned.get((table, row), {})
        conditions = conditioned(expected)
        if any(current.get(column) != want for column, want in conditions.items()):
            return CasResult(applied=False, current={c: current.get(c) for c in conditions})
        stored = self._versioned.setdefault((table, row), {})
        for column, value in updates.items():
            if value is None:
                stored.pop(column, None)
            else:
                stored[column] = value
        if not stored:
            del self._versioned[(table, row)]
        self.applied_cas.append((self._world.now, table, row, dict(expected), dict(updates)))
        if self.on_cas is not None:
            self.on_cas(self._world.now, table, row, expected, updates)
        return CasResult(applied=True, current={**conditions, **updates})


SLOW_LEG_NS = 50_000_000
"""The shortest slow leg (a GC pause, a slow replica); an ordinary leg takes 0.1–3 ms."""


class Network:
    """Delays and faults between processes and the store. All choices are seeded."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.cut: dict[str, int] = {}
        """Process name -> virtual time until which it is cut off from the store."""
        self.lose_reply = 0.0
        """Probability that an answer is lost after its request applied."""
        self.cas_unknown = 0.0
        """Probability that a compare-and-set answers "outcome unknown" (applied or not)."""
        self.refuse = 0.0
        """Probability that a request is refused before it applies (Unavailable)."""
        self.slow = 0.0
        """Probability that one leg of a request takes 50–1500 ms (a GC pause, a slow replica)."""
        self.client_timeout = 2.0
        """The driver's request timeout (seconds, on the client's clock)."""
        self.paxos_for: dict[str, int] = {}
        """Process name -> virtual time until which that process's Paxos rounds time out (half after
        applying) while everyone else's go through: the coordinator it talks to cannot reach a
        quorum, or its link to it drops answers (token-aware routing pins a client's rows to a few
        coordinators). Its SERIAL re-reads fail too, so an unknown outcome of its stays unknown."""
        self.paxos_until = -1
        self.stalled_until: dict[str, int] = {}
        """Process name -> the latest virtual time at which one of its requests that a fault held up
        (cut off, its answer lost, a slow leg) is settled: answered, or given up by the driver's
        request timeout. The caller waits for it and does nothing else meanwhile."""
        """Until then (virtual ns) every Paxos round — compare-and-sets and SERIAL reads — times out,
        half of them after applying: a replica paused (a long GC, a frozen VM) stays "up" in gossip,
        and rounds needing it time out for the pause and some seconds after (cassandra-modern/README)."""

    def delay(self) -> int:
        draw = self.rng.random
        if self.slow and draw() < self.slow:
            return SLOW_LEG_NS + int(draw() * 1_450_000_000)  # 50–1500 ms
        return 100_000 + int(draw() * 2_900_000)  # 0.1–3 ms

    def stall(self, process: Process, until: int) -> None:
        if until > self.stalled_until.get(process.name, 0):
            self.stalled_until[process.name] = until

    def is_cut(self, process: Process) -> bool:
        return self.cut.get(process.name, -1) > self.world.now


def _cas_unknown(applied: bool, rng_draw: float) -> BaseException:
    """What a 4.1 ring answers a compare-and-set whose outcome it cannot tell — the driver's own
    exception objects, classified by :mod:`lockclient.store.outcomes` like any real answer. A
    commit that timed out after a quorum accepted (write type SIMPLE) only ever follows an
    applied proposal."""
    error: BaseException
    if applied and rng_draw < 0.2:
        error = WriteTimeout(
            "Operation timed out - received only 1 responses.",
            consistency=ConsistencyLevel.QUORUM,
            required_responses=2,
            received_responses=1,
            write_type=WriteType.SIMPLE,
        )
    elif rng_draw < 0.45:
        error = WriteTimeout(
            "CAS operation timed out - received 0 of 2 required responses.",
            consistency=ConsistencyLevel.SERIAL,
            required_responses=2,
            received_responses=0,
            write_type=WriteType.CAS,
        )
    elif rng_draw < 0.7:
        error = ErrorMessage(
            CAS_RESULT_UNKNOWN, "CAS operation result is unknown - proposal accepted by 1 but not a quorum.", None
        )
    elif rng_draw < 0.85:
        error = WriteFailure(
            "Operation failed - received 1 responses and 1 failures",
            consistency=ConsistencyLevel.SERIAL,
            required_responses=2,
            received_responses=1,
            failures=1,
            write_type=WriteType.CAS,
        )
    else:
        error = Unavailable(
            "Cannot achieve consistency level QUORUM",
            consistency=ConsistencyLevel.QUORUM,
            required_replicas=2,
            alive_replicas=1,
        )
    return error


class _Call:
    """One request in flight; :meth:`result` waits for its answer."""

    __slots__ = ("_done", "_error", "_result", "_waiter", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._waiter: Waiter | None = None

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        self._result, self._error = result, error
        if self._waiter is not None:
            self._waiter.fire(True)

    def result(self, process: Process, timeout: float) -> Any:
        if not self._done:
            self._waiter = Waiter(process.world)
            self._waiter.wait(process.real_delay_ns(timeout), False)
            if not self._done:
                self._done = True
                # The driver's client-side timeout: the request may have run (UNKNOWN).
                cause = OperationTimedOut({"sim": "Client request timeout"}, None)
                raise translate_error(cause, self.what) from cause
        if self._error is not None:
            error = self._error
            if isinstance(error, StoreError):
                raise error
            raise translate_error(error, self.what) from error
        return self._result


class SimStoreClient(CellStore):
    """One process's view of :class:`SimCells` through :class:`Network` (a simulation)."""

    spans_machines = True
    batches_compare_and_set = True

    def __init__(self, cells: SimCells, network: Network, process: Process, *, resolve_for: float = 4.0) -> None:
        self._cells = cells
        self._net = network
        self._process = process
        self._resolve_for = resolve_for
        self.requests = 0

    @property
    def url(self) -> str:
        return "sim://cells"

    # -- the wire -----------------------------------------------------------------------------------

    def _send(self, apply: Callable[[], Any], *, cas: bool = False, what: str = "request") -> _Call:
        """Send one request: it travels, applies at the store, and its answer travels back — or the
        network decides otherwise (see the module). Failures reach the caller as the driver's own
        exception objects, translated by the Cassandra adapter's table when waited for."""
        net, world, process = self._net, self._process.world, self._process
        self.requests += 1
        call = _Call(what)
        if net.is_cut(process):
            net.stall(process, world.now + process.real_delay_ns(net.client_timeout))
            return call  # never arrives; the client times out
        draw = net.rng.random
        there, back = net.delay(), net.delay()
        if net.refuse and draw() < net.refuse:
            refused = Unavailable(
                "Cannot achieve consistency level QUORUM",
                consistency=ConsistencyLevel.QUORUM,
                required_replicas=2,
                alive_replicas=1,
            )
            world.after(there + back, lambda: call.answer(error=refused))
            return call
        unknown = cas and net.cas_unknown and draw() < net.cas_unknown
        unknown_applies = unknown and draw() < 0.5
        kind = draw()
        lost = net.lose_reply and draw() < net.lose_reply
        if cas and (world.now < net.paxos_until or world.now < net.paxos_for.get(process.name, -1)):
            # Times out: the answer never comes (the client's timeout settles it as unknown).
            unknown, unknown_applies, lost = True, draw() < 0.5, True
        if lost or there + back >= SLOW_LEG_NS:
            timeout = process.real_delay_ns(net.client_timeout)
            net.stall(process, world.now + (timeout if lost else min(there + back, timeout)))

        def arrive() -> None:
            if unknown and not unknown_applies:
                if lost:
                    return  # never applied, never answered
                result: Any = None
            else:
                try:
                    result = apply()
                except StoreError as exc:
                    failure = exc
                    world.after(back, lambda: call.answer(error=failure))
                    return
            if lost:
                return  # applied; the answer never comes back
            if unknown:
                error = _cas_unknown(bool(unknown_applies), kind)
                world.after(back, lambda: call.answer(error=error))
                return

            def reply() -> None:
                if not net.is_cut(process):
                    call.answer(result)

            world.after(back, reply)

        world.after(there, arrive)
        return call

    def _rpc(self, apply: Callable[[], T], *, cas: bool = False, what: str = "request") -> T:
        result: T = self._send(apply, cas=cas, what=what).result(self._process, self._net.client_timeout)
        return result

    # -- last-write-wins tables ---------------------------------------------------------------------

    def put(self, table: Table, row: str, column: str, value: str, *, timestamp: int, ttl: float | None = None) -> None:
        self._rpc(lambda: self._cells.put(table.value, row, column, value, timestamp, ttl))

    def put_cells(
        self, table: Table, row: str, cells: Mapping[str, str], *, timestamp: int, ttl: float | None = None
    ) -> None:
        items = dict(cells)

        def apply() -> None:
            for column, value in items.items():
                self._cells.put(table.value, row, column, value, timestamp, ttl)

        self._rpc(apply)

    def delete(self, table: Table, row: str, column: str, *, timestamp: int) -> None:
        self._rpc(lambda: self._cells.delete(table.value, row, column, timestamp))

    def get(self, table: Table, row: str, column: str) -> Cell | None:
        return self._rpc(lambda: self._cells.get(table.value, row, column))

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
        validate_limit(limit)
        name = table.value
        return self._rpc(lambda: self._cells.read_row(name, row, start, limit, end, reverse))

    def read_rows_many(
        self,
        table: Table,
        rows: Iterable[str],
        starts: Mapping[str, str] | None = None,
        *,
        newer_than: int | None = None,
    ) -> dict[str, list[Cell]]:
        """One request for all the rows (they are read at one instant): the Cassandra adapter sends
        one request per row, overlapped — a bulk read arriving at once is one of its schedules, and
        keeps leasewatch's scans (64 index rows, 65 partition rows) from dominating the run."""
        bounds = dict(starts or {})
        wanted = list(dict.fromkeys(rows))
        cells = self._cells
        name = table.value

        def apply() -> dict[str, list[Cell]]:
            out: dict[str, list[Cell]] = {}
            for row in wanted:
                found = cells.read_row(name, row, bounds.get(row, ""), None, None, False)
                if newer_than is not None:
                    found = [c for c in found if c.timestamp > newer_than]
                if found:
                    out[row] = found
            return out

        return self._rpc(apply)

    # -- versioned tables ---------------------------------------------------------------------------

    def read_versioned(
        self, row: str, *, table: VersionedTable = VersionedTable.LEASE, serial: bool = True
    ) -> dict[str, str]:
        name = table.value

        def read() -> dict[str, str]:
            # A SERIAL read is a Paxos round: it can answer "unknown" like a write (cas=True).
            return self._rpc(lambda: self._cells.read_versioned(name, row), cas=serial, what="read_versioned")

        if not serial:
            return read()
        return serial_read(read, resolve_for=self._resolve_for, runtime=self._process.runtime)

    def read_versioned_many(
        self, rows: Iterable[str], *, table: VersionedTable = VersionedTable.LEASE, serial: bool = False
    ) -> dict[str, dict[str, str]]:
        wanted = list(dict.fromkeys(rows))
        if serial:
            return {row: found for row in wanted if (found := self.read_versioned(row, table=table, serial=True))}
        store = self._cells
        name = table.value

        def apply() -> dict[str, dict[str, str]]:  # one request, as read_rows_many
            return {row: found for row in wanted if (found := store.read_versioned(name, row))}

        return self._rpc(apply)

    def compare_and_set(
        self,
        row: str,
        expected: Mapping[str, str | None],
        updates: Mapping[str, str | None],
        *,
        table: VersionedTable = VersionedTable.LEASE,
    ) -> CasResult:
        """The Cassandra adapter's compare-and-set, over the simulated wire: the same settling code
        (:func:`lockclient.store.settling.settled_compare_and_set`) around one send."""
        check_cas_arguments(expected, updates)
        expected, updates = dict(expected), dict(updates)
        cells = self._cells
        name = table.value

        def send() -> CasResult:
            answer: CasResult = self._rpc(
                lambda: cells.compare_and_set(name, row, expected, updates), cas=True, what="compare_and_set"
            )
            return answer if answer.applied else not_applied_answer(updates, answer.current)

        return settled_compare_and_set(
            send,
            lambda: self.read_versioned(row, table=table),
            row,
            expected,
            updates,
            resolve_for=self._resolve_for,
            runtime=self._process.runtime,
        )

    # -- concurrency ---------------------------------------------------------------------------------

    def begin(self, ops: Sequence[Op]) -> Pending:
        """Every plain operation sent at once (each travels on its own); compare-and-sets and
        SERIAL reads go through their own resolution when waited for."""
        started: list[tuple[Op, _Call | None]] = []
        for op in ops:
            apply = self._plain(op)
            started.append((op, None if apply is None else self._send(apply)))

        def finish() -> list[Any]:
            results: list[Any] = []
            error: BaseException | None = None
            for op, call in started:
                try:
                    if call is None:
                        results.append(_perform(self, op))
                    else:
                        results.append(call.result(self._process, self._net.client_timeout))
                except StoreError as exc:
                    error = error or exc
                    results.append(None)
            if error is not None:
                raise error
            return results

        return Pending(finish)

    def _plain(self, op: Op) -> Callable[[], Any] | None:
        cells = self._cells
        match op:
            case Put():
                return lambda: cells.put(op.table.value, op.row, op.column, op.value, op.timestamp, op.ttl)
            case Delete():
                return lambda: cells.delete(op.table.value, op.row, op.column, op.timestamp)
            case Get():
                return lambda: cells.get(op.table.value, op.row, op.column)
            case ReadRow():
                validate_limit(op.limit)
                return lambda: cells.read_row(op.table.value, op.row, op.start, op.limit, op.end, op.reverse)
            case ReadVersioned() if not op.serial:
                return lambda: cells.read_versioned(op.table.value, op.row)
        return None

    def run_concurrently(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        if len(calls) <= 1:
            return [call() for call in calls]
        process = self._process
        results: list[Any] = [None] * len(calls)
        errors: list[BaseException | None] = [None] * len(calls)
        done = process.runtime.event()
        left = [len(calls)]

        def run(index: int, call: Callable[[], T]) -> None:
            try:
                results[index] = call()
            except BaseException as exc:
                errors[index] = exc
            finally:
                left[0] -= 1
                if not left[0]:
                    done.set()

        for index, call in enumerate(calls):
            process.spawn(partial(run, index, call), "store-concurrent")
        done.wait()
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results

    def compare_and_set_many(self, ops: Sequence[CompareAndSet]) -> Any:
        results: list[tuple[int, CasResult | StoreError]] = []
        for index, op in enumerate(ops):
            try:
                results.append((index, self.compare_and_set(op.row, op.expected, op.updates, table=op.table)))
            except StoreError as exc:
                results.append((index, exc))
        return iter(results)

    def close(self) -> None:
        """Nothing to release."""


def _perform(store: CellStore, op: Op) -> Any:
    from lockclient.store.base import perform

    return perform(store, op)
