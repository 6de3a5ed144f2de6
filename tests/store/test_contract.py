"""The store contract: one suite, every adapter (SQLite always, the local Cassandra node always,
a modern Cassandra when CHRONOLOCK_TEST_CASSANDRA names one). See lockclient/store/base.py."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockclient.errors import ConfigurationError, StoreUnavailable
from lockclient.store import CasResult, CellStore, Table, VersionedTable, open_store, parse_store_url
from lockclient.store.base import ANY, CompareAndSet, Put
from lockclient.store.sqlite import SQLiteStore
from tests.store import workers

T = TypeVar("T")


def fresh_row() -> str:
    return f"row-{uuid.uuid4().hex}"


def needs_cas(store: CellStore) -> None:
    if not store.supports_compare_and_set:
        pytest.skip("compare-and-set needs lightweight transactions (Cassandra 2.0+); this node is 1.2")


# -- last-write-wins ------------------------------------------------------------------


def test_put_then_get_returns_value_and_timestamp(store: CellStore) -> None:
    row = fresh_row()
    store.put(Table.QUEUE, row, "alice", "hello", timestamp=1_000)
    cell = store.get(Table.QUEUE, row, "alice")
    assert cell is not None
    assert (cell.column, cell.value, cell.timestamp) == ("alice", "hello", 1_000)
    assert store.get(Table.QUEUE, row, "bob") is None


def test_tables_are_separate(store: CellStore) -> None:
    row = fresh_row()
    store.put(Table.BACKOFF_MAIN, row, "c", "x", timestamp=10)
    assert store.get(Table.QUEUE, row, "c") is None


def test_higher_timestamp_wins_whatever_the_arrival_order(store: CellStore) -> None:
    row = fresh_row()
    store.put(Table.QUEUE, row, "c", "new", timestamp=200)
    store.put(Table.QUEUE, row, "c", "old", timestamp=100)  # arrives later, older: ignored
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and (cell.value, cell.timestamp) == ("new", 200)
    store.put(Table.QUEUE, row, "c", "newest", timestamp=300)
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and (cell.value, cell.timestamp) == ("newest", 300)


def test_delete_hides_cells_up_to_its_timestamp_including_late_older_writes(store: CellStore) -> None:
    row = fresh_row()
    store.put(Table.QUEUE, row, "c", "v", timestamp=100)
    store.delete(Table.QUEUE, row, "c", timestamp=150)
    assert store.get(Table.QUEUE, row, "c") is None
    store.put(Table.QUEUE, row, "c", "late", timestamp=120)  # older than the tombstone
    assert store.get(Table.QUEUE, row, "c") is None
    assert store.read_row(Table.QUEUE, row) == []
    store.put(Table.QUEUE, row, "c", "after", timestamp=151)
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and cell.value == "after"


def test_delete_of_a_cell_never_written_still_shadows_older_writes(store: CellStore) -> None:
    row = fresh_row()
    store.delete(Table.QUEUE, row, "ghost", timestamp=500)
    store.put(Table.QUEUE, row, "ghost", "boo", timestamp=499)
    assert store.get(Table.QUEUE, row, "ghost") is None


@pytest.mark.parametrize("delete_first", [False, True])
def test_tombstone_beats_live_cell_at_equal_timestamp(store: CellStore, delete_first: bool) -> None:
    row = fresh_row()
    if delete_first:
        store.delete(Table.QUEUE, row, "c", timestamp=777)
        store.put(Table.QUEUE, row, "c", "zzz", timestamp=777)
    else:
        store.put(Table.QUEUE, row, "c", "zzz", timestamp=777)
        store.delete(Table.QUEUE, row, "c", timestamp=777)
    assert store.get(Table.QUEUE, row, "c") is None


@pytest.mark.parametrize("order", [("apple", "banana"), ("banana", "apple")])
def test_larger_value_wins_between_live_cells_at_equal_timestamp(store: CellStore, order: tuple[str, str]) -> None:
    row = fresh_row()
    for value in order:
        store.put(Table.QUEUE, row, "c", value, timestamp=42)
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and cell.value == "banana"


def test_row_is_read_in_column_order_with_lower_bound_and_limit(store: CellStore) -> None:
    row = fresh_row()
    columns = ["00000000000000000300b", "00000000000000000100a", "00000000000000000200z", "00000000000000000100b"]
    for i, col in enumerate(columns):
        store.put(Table.QUEUE, row, col, f"v{i}", timestamp=10 + i)
    assert [c.column for c in store.read_row(Table.QUEUE, row)] == sorted(columns)
    assert [c.column for c in store.read_row(Table.QUEUE, row, limit=2)] == sorted(columns)[:2]
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="00000000000000000200")] == [
        "00000000000000000200z",
        "00000000000000000300b",
    ]
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="00000000000000000100b", limit=1)] == [
        "00000000000000000100b"
    ]
    assert store.read_row(Table.QUEUE, row, start="9") == []


def test_column_order_is_utf8_byte_order(store: CellStore) -> None:
    row = fresh_row()
    names = ["b", "a", "Z", "é", "ß", "\u4e2d", "a\u00e9", "aa"]
    for i, name in enumerate(names):
        store.put(Table.QUEUE, row, name, "x", timestamp=i + 1)
    got = [c.column for c in store.read_row(Table.QUEUE, row)]
    assert got == sorted(names, key=lambda s: s.encode("utf-8"))


def test_row_read_skips_tombstones_and_limit_counts_live_cells(store: CellStore) -> None:
    row = fresh_row()
    for i in range(10):
        store.put(Table.QUEUE, row, f"c{i:02d}", "x", timestamp=100)
    for i in range(0, 10, 2):
        store.delete(Table.QUEUE, row, f"c{i:02d}", timestamp=101)
    assert [c.column for c in store.read_row(Table.QUEUE, row, limit=3)] == ["c01", "c03", "c05"]


def test_rows_are_independent(store: CellStore) -> None:
    a, b = fresh_row(), fresh_row()
    store.put(Table.QUEUE, a, "c", "in-a", timestamp=1)
    store.delete(Table.QUEUE, b, "c", timestamp=5)
    cell = store.get(Table.QUEUE, a, "c")
    assert cell is not None and cell.value == "in-a"


def test_ttl_expires_cell_and_counts_from_application(store: CellStore) -> None:
    row = fresh_row()
    # An old timestamp must not make the TTL expire early: TTL counts from when the store applies it.
    store.put(Table.INDEX, row, "short", "x", timestamp=1, ttl=1)
    store.put(Table.INDEX, row, "long", "y", timestamp=1, ttl=60)
    assert store.get(Table.INDEX, row, "short") is not None
    deadline = time.monotonic() + 10
    while store.get(Table.INDEX, row, "short") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.get(Table.INDEX, row, "short") is None
    assert [c.column for c in store.read_row(Table.INDEX, row)] == ["long"]


def test_bad_arguments_are_rejected_before_the_store(store: CellStore) -> None:
    with pytest.raises(ValueError, match="limit"):
        store.read_row(Table.QUEUE, fresh_row(), limit=0)
    with pytest.raises(ValueError, match="ttl"):
        store.put(Table.QUEUE, fresh_row(), "c", "v", timestamp=1, ttl=0)


# -- several processes ------------------------------------------------------------------


def test_concurrent_writers_from_processes_converge_on_the_highest_timestamp(store: CellStore, store_url: str) -> None:
    row = fresh_row()
    plans = [[p * 7 + i * 31 + 1 for i in range(40)] for p in range(4)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.starmap(workers.write_versions, [(store_url, row, "c", plan) for plan in plans])
    top = max(max(p) for p in plans)
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and cell.timestamp == top and cell.value == f"v{top:020d}"


def test_concurrent_appenders_from_processes_lose_nothing(store: CellStore, store_url: str) -> None:
    row = fresh_row()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.starmap(workers.append_columns, [(store_url, row, f"p{p}", 50) for p in range(4)])
    cells = store.read_row(Table.QUEUE, row)
    assert len(cells) == 200
    assert [c.column for c in cells] == sorted(c.column for c in cells)


# -- compare-and-set ------------------------------------------------------------------------


def test_cas_insert_if_absent_then_conflict_reports_current(store: CellStore) -> None:
    needs_cas(store)
    row = fresh_row()
    first = store.compare_and_set(row, {"lease": None}, {"lease": "v1"})
    assert first.applied and first.current == {"lease": "v1"}
    second = store.compare_and_set(row, {"lease": None}, {"lease": "other"})
    assert not second.applied and second.current == {"lease": "v1"}
    assert store.read_versioned(row) == {"lease": "v1"}


def test_cas_update_and_delete_on_expected_value(store: CellStore) -> None:
    needs_cas(store)
    row = fresh_row()
    assert store.compare_and_set(row, {"a": None}, {"a": "1"}).applied
    stale = store.compare_and_set(row, {"a": "0"}, {"a": "2"})
    assert not stale.applied and stale.current == {"a": "1"}
    assert store.compare_and_set(row, {"a": "1"}, {"a": "2"}).applied
    assert store.compare_and_set(row, {"a": "2"}, {"a": None}).applied
    assert store.read_versioned(row) == {}
    gone = store.compare_and_set(row, {"a": "2"}, {"a": None})
    assert not gone.applied and gone.current == {"a": None}


def test_cas_over_several_cells_needs_every_condition(store: CellStore) -> None:
    needs_cas(store)
    row = fresh_row()
    assert store.compare_and_set(row, {"fence": None, "lease": None}, {"fence": "0", "lease": "v1"}).applied
    # Condition on lease fails: the fence must not move either.
    result = store.compare_and_set(row, {"fence": "0", "lease": "v0"}, {"fence": "1"})
    assert not result.applied
    assert result.current["lease"] == "v1"
    assert store.read_versioned(row) == {"fence": "0", "lease": "v1"}
    # Both hold: the fence moves, the lease (condition only) stays.
    ok = store.compare_and_set(row, {"fence": "0", "lease": "v1"}, {"fence": "1"})
    assert ok.applied
    assert store.read_versioned(row) == {"fence": "1", "lease": "v1"}
    # An absent-condition on one cell plus a value condition on another.
    assert not store.compare_and_set(row, {"lease": None, "fence": "1"}, {"fence": "2"}).applied
    assert store.compare_and_set(row, {"other": None, "fence": "1"}, {"fence": "2", "other": "x"}).applied
    assert store.read_versioned(row) == {"fence": "2", "lease": "v1", "other": "x"}


def test_cas_rejects_blind_writes(store: CellStore) -> None:
    needs_cas(store)
    with pytest.raises(ValueError, match="precondition"):
        store.compare_and_set(fresh_row(), {"a": None}, {"b": "1"})
    with pytest.raises(ValueError, match="at least one"):
        store.compare_and_set(fresh_row(), {"a": None}, {})


def test_an_unconditioned_end_record_is_written_only_when_the_conditions_hold(store: CellStore) -> None:
    """``ANY``: a release or revocation writes ``~ended`` whatever it held (the previous holder's
    end), in the same compare-and-set, conditional on the holder record alone. On Cassandra: an
    unconditioned statement in the conditional batch, applied by the same Paxos round."""
    needs_cas(store)
    row = fresh_row()
    assert store.compare_and_set(row, {"h": None}, {"h": "v1"}).applied
    refused = store.compare_and_set(row, {"h": "other", "e": ANY}, {"h": None, "e": "end-1"})
    assert not refused.applied and refused.current == {"h": "v1"}, "unconditioned cells are not reported"
    assert store.read_versioned(row) == {"h": "v1"}
    ended = store.compare_and_set(row, {"h": "v1", "e": ANY}, {"h": None, "e": "end-1"})
    assert ended.applied and ended.current == {"h": None, "e": "end-1"}
    assert store.read_versioned(row) == {"e": "end-1"}
    assert store.compare_and_set(row, {"h": None}, {"h": "v2"}).applied
    assert store.compare_and_set(row, {"h": "v2", "e": ANY}, {"h": None, "e": "end-2"}).applied
    assert store.read_versioned(row) == {"e": "end-2"}, "the next end overwrites the last"


def test_cas_needs_one_real_condition_and_any_only_for_written_cells(store: CellStore) -> None:
    needs_cas(store)
    with pytest.raises(ValueError, match="real condition"):
        store.compare_and_set(fresh_row(), {"e": ANY}, {"e": "x"})
    with pytest.raises(ValueError, match="only for columns the call writes"):
        store.compare_and_set(fresh_row(), {"h": None, "e": ANY}, {"h": "x"})


def test_cas_rows_are_independent(store: CellStore) -> None:
    needs_cas(store)
    a, b = fresh_row(), fresh_row()
    assert store.compare_and_set(a, {"x": None}, {"x": "1"}).applied
    assert store.read_versioned(b) == {}


def test_versioned_tables_are_separate_namespaces(store: CellStore) -> None:
    """A lock id and a fenced resource of the same name never share a row (the old
    "fenced-resource:X" collision)."""
    needs_cas(store)
    row = fresh_row()
    assert store.compare_and_set(row, {"x": None}, {"x": "lease"}).applied
    assert store.read_versioned(row, table=VersionedTable.FENCED) == {}
    assert store.compare_and_set(row, {"x": None}, {"x": "fenced"}, table=VersionedTable.FENCED).applied
    assert store.read_versioned(row) == {"x": "lease"}
    assert store.read_versioned(row, table=VersionedTable.FENCED, serial=False) == {"x": "fenced"}
    assert store.read_versioned(row, table=VersionedTable.PARTITION) == {}
    assert store.compare_and_set(row, {"x": None}, {"x": "partition"}, table=VersionedTable.PARTITION).applied
    assert store.read_versioned(row) == {"x": "lease"}


def test_plain_read_of_a_versioned_row_sees_completed_writes(store: CellStore) -> None:
    needs_cas(store)
    row = fresh_row()
    assert store.compare_and_set(row, {"a": None, "b": None}, {"a": "1", "b": "2"}).applied
    assert store.read_versioned(row, serial=False) == {"a": "1", "b": "2"}


def test_not_applied_while_holding_our_own_values_counts_as_applied(store: CellStore) -> None:
    """A re-proposed Paxos round can answer "not applied" with the caller's own value in the
    row; unique values make that recognisable (DESIGN.md §3). Reproduced here by sending the
    same unique write twice: the second finds its own value."""
    needs_cas(store)
    row = fresh_row()
    unique = f"mine-{uuid.uuid4().hex}"
    assert store.compare_and_set(row, {"a": None}, {"a": unique}).applied
    again = store.compare_and_set(row, {"a": None}, {"a": unique})
    if isinstance(store, SQLiteStore):
        assert not again.applied  # one file: no Paxos rounds, nothing re-proposed; plain answer
    else:
        assert again.applied and again.current["a"] == unique


def test_slices_with_an_upper_bound_and_in_reverse(store: CellStore) -> None:
    row = fresh_row()
    for name in ("a", "b", "c", "d", "e"):
        store.put(Table.QUEUE, row, name, name.upper(), timestamp=10)
    store.delete(Table.QUEUE, row, "c", timestamp=11)
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="b", end="d")] == ["b", "d"]
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="a", end="d", reverse=True)] == ["d", "b", "a"]
    # What a waiter reads: its own cell and the one ahead of it, down to the watermark.
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="b", end="e", limit=2, reverse=True)] == [
        "e",
        "d",
    ]
    assert [c.column for c in store.read_row(Table.QUEUE, row, start="b", end="b", limit=2, reverse=True)] == ["b"]
    assert store.read_row(Table.QUEUE, row, start="f", end="z", reverse=True) == []


def test_execute_all_and_begin(store: CellStore) -> None:
    from lockclient.store.base import Delete, Get, Put, ReadRow

    row = fresh_row()
    assert store.execute_all([Put(Table.QUEUE, row, "a", "1", 5), Put(Table.QUEUE, row, "b", "2", 5)]) == [None, None]
    pending = store.begin([Delete(Table.QUEUE, row, "a", 6)])
    got = store.get(Table.QUEUE, row, "b")  # other work while the delete is in flight
    assert pending.wait() == [None] and got is not None
    cells, missing = store.execute_all([ReadRow(Table.QUEUE, row), Get(Table.QUEUE, row, "a")])
    assert [c.column for c in cells] == ["b"] and missing is None


def test_run_concurrently_keeps_order_and_raises_after_all_ran(store: CellStore) -> None:
    row = fresh_row()
    results = store.run_concurrently(
        [
            lambda: store.put(Table.QUEUE, row, "a", "1", timestamp=5),
            lambda: store.put(Table.QUEUE, row, "b", "2", timestamp=5),
        ]
    )
    assert results == [None, None]
    got = store.run_concurrently([lambda: store.get(Table.QUEUE, row, "b"), lambda: store.get(Table.QUEUE, row, "a")])
    assert [c.value if c else None for c in got] == ["2", "1"]

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        store.run_concurrently([boom, lambda: store.put(Table.QUEUE, row, "c", "3", timestamp=5)])
    cell = store.get(Table.QUEUE, row, "c")
    assert cell is not None and cell.value == "3", "the other call still ran"


def test_put_cells_with_ttl(store: CellStore) -> None:
    row = fresh_row()
    sent = time.monotonic()
    store.put_cells(Table.GLOBAL_TIME, row, {"a": "1", "b": "2"}, timestamp=7, ttl=2)
    seen = {c.column for c in store.read_row(Table.GLOBAL_TIME, row)}
    if time.monotonic() - sent < 2:  # (a node stalled at load ~17 answered after the cells expired)
        assert seen == {"a", "b"}
    deadline = time.monotonic() + 10
    while store.read_row(Table.GLOBAL_TIME, row):
        assert time.monotonic() < deadline, "TTL'd cells did not expire"
        time.sleep(0.2)


# -- many rows at once (leasewatch's scan) --------------------------------------------------------


def test_read_rows_many_reads_each_row_from_its_own_start(store: CellStore) -> None:
    a, b, c, empty, gone = (fresh_row() for _ in range(5))
    for name in ("t1", "t2", "t3"):
        store.put(Table.QUEUE, a, name, f"a-{name}", timestamp=10)
    store.put(Table.QUEUE, b, "x", "b-x", timestamp=10)
    store.put(Table.QUEUE, b, "y", "b-y", timestamp=12)
    store.put(Table.QUEUE, c, "only", "c", timestamp=10)
    store.put(Table.QUEUE, gone, "z", "z", timestamp=10)
    store.delete(Table.QUEUE, gone, "z", timestamp=11)  # a row of tombstones only: left out
    store.delete(Table.QUEUE, a, "t2", timestamp=11)
    store.put(Table.BACKOFF_MAIN, empty, "other-table", "v", timestamp=10)

    got = store.read_rows_many(Table.QUEUE, [a, b, c, empty, gone, a], starts={b: "y", c: "p"})
    assert set(got) == {a, b}, "rows without live cells (from their start) are left out"
    assert [(x.column, x.value, x.timestamp) for x in got[a]] == [("t1", "a-t1", 10), ("t3", "a-t3", 10)]
    assert [(x.column, x.value, x.timestamp) for x in got[b]] == [("y", "b-y", 12)]
    assert store.read_rows_many(Table.QUEUE, []) == {}
    # Exactly what read_row answers, row by row.
    for row, cells in got.items():
        assert cells == store.read_row(Table.QUEUE, row, start={b: "y"}.get(row, ""))


def test_read_rows_many_over_more_rows_than_one_query_takes(store: CellStore) -> None:
    """1,200 rows: several chunks (SQLite: 500 rows per query), and first a small share of the
    table (each row sought) then all of it (SQLite walks the table instead): same answers."""
    prefix = fresh_row()
    rows = [f"{prefix}-{i:04d}" for i in range(1200)]
    puts = [Put(Table.INDEX, row, f"col-{j}", f"{row}/{j}", 100 + j) for row in rows for j in range(i_cells(row))]
    for i in range(0, len(puts), 200):  # groups: a busy 3-node ring times out 2,400 writes sent at once
        store.execute_all(puts[i : i + 200])
    for row in rows[::7]:
        store.delete(Table.INDEX, row, "col-0", timestamp=1000)
    expected = {row: [f"{row}/{j}" for j in range(i_cells(row)) if not (j == 0 and row in rows[::7])] for row in rows}
    expected = {row: values for row, values in expected.items() if values}
    few = store.read_rows_many(Table.INDEX, rows[:40])
    assert {row: [c.value for c in cells] for row, cells in few.items()} == {
        row: expected[row] for row in rows[:40] if row in expected
    }
    every = store.read_rows_many(Table.INDEX, rows, starts={rows[1]: "col-1"})
    expected[rows[1]] = [v for v in expected.get(rows[1], []) if not v.endswith("/0")]
    expected = {row: values for row, values in expected.items() if values}
    assert {row: [c.value for c in cells] for row, cells in every.items()} == expected
    for cells in every.values():
        assert [c.column for c in cells] == sorted(c.column for c in cells)


def i_cells(row: str) -> int:
    """1 to 3 cells per row, fixed per row name."""
    return 1 + sum(row.encode()) % 3


def test_read_rows_many_newer_than_keeps_only_later_writes(store: CellStore) -> None:
    """What leasewatch's incremental index reads rely on: cells written with a timestamp above
    the bound, from every row (a rewrite with a newer timestamp counts; a delete does not)."""
    a, b, c = fresh_row(), fresh_row(), fresh_row()
    store.put(Table.INDEX, a, "old", "", timestamp=100)
    store.put(Table.INDEX, a, "new", "", timestamp=300)
    store.put(Table.INDEX, b, "rewritten", "", timestamp=100)
    store.put(Table.INDEX, b, "rewritten", "x", timestamp=250)
    store.put(Table.INDEX, c, "deleted", "", timestamp=300)
    store.delete(Table.INDEX, c, "deleted", timestamp=400)
    got = store.read_rows_many(Table.INDEX, [a, b, c], newer_than=200)
    assert {row: [(x.column, x.value, x.timestamp) for x in cells] for row, cells in got.items()} == {
        a: [("new", "", 300)],
        b: [("rewritten", "x", 250)],
    }
    assert set(store.read_rows_many(Table.INDEX, [a, b, c], newer_than=300)) == set()
    assert [x.column for x in store.read_rows_many(Table.INDEX, [a])[a]] == ["new", "old"]


def test_read_rows_many_returns_every_page_of_a_long_row(store: CellStore) -> None:
    """More cells in one row than one response page holds (Cassandra pages at 1,000)."""
    long_row, short_row = fresh_row(), fresh_row()
    puts = [Put(Table.QUEUE, long_row, f"c{i:05d}", "x", 10) for i in range(1100)]
    for i in range(0, len(puts), 200):
        store.execute_all(puts[i : i + 200])
    store.put(Table.QUEUE, short_row, "only", "y", timestamp=10)
    got = store.read_rows_many(Table.QUEUE, [long_row, short_row], starts={long_row: "c00050"})
    assert [c.column for c in got[long_row]] == [f"c{i:05d}" for i in range(50, 1100)]
    assert [c.value for c in got[short_row]] == ["y"]


def test_compare_and_set_many_answers_each_on_its_own(store: CellStore) -> None:
    """What the keeper's batched renewals and leasewatch's batched revocations rely on: every
    operation's own outcome — applied, or not applied with the current values."""
    needs_cas(store)
    rows = [fresh_row() for _ in range(6)]
    for row in rows:
        assert store.compare_and_set(row, {"v": None}, {"v": f"{row}-1"}).applied
    ops = [
        CompareAndSet(row, {"v": f"{row}-1" if i % 2 == 0 else "stale"}, {"v": f"{row}-2"})
        for i, row in enumerate(rows)
    ]
    ops.append(CompareAndSet(rows[0], {"w": None}, {"w": "new"}, VersionedTable.FENCED))
    results = dict(store.compare_and_set_many(ops))
    assert sorted(results) == list(range(len(ops)))
    for i, row in enumerate(rows):
        result = results[i]
        assert isinstance(result, CasResult), result
        assert result.applied is (i % 2 == 0)
        assert result.current["v"] == (f"{row}-2" if i % 2 == 0 else f"{row}-1")
        assert store.read_versioned(row)["v"] == result.current["v"]
    last = results[len(rows)]
    assert isinstance(last, CasResult) and last.applied
    assert list(store.compare_and_set_many([])) == []


def test_read_versioned_many(store: CellStore) -> None:
    needs_cas(store)
    a, b, missing = fresh_row(), fresh_row(), fresh_row()
    assert store.compare_and_set(a, {"~holder": None, "~fence": None}, {"~holder": "h", "~fence": "1|h"}).applied
    assert store.compare_and_set(b, {"~fence": None}, {"~fence": "7|x"}).applied
    assert store.compare_and_set(missing, {"~owner": None}, {"~owner": "p"}, table=VersionedTable.PARTITION).applied
    got = store.read_versioned_many([a, b, missing, a])
    assert got == {a: {"~holder": "h", "~fence": "1|h"}, b: {"~fence": "7|x"}}
    assert store.read_versioned_many([a, missing], table=VersionedTable.PARTITION) == {missing: {"~owner": "p"}}
    assert store.read_versioned_many([b], serial=True) == {b: {"~fence": "7|x"}}
    assert store.read_versioned_many([]) == {}


def test_read_versioned_many_over_many_rows(store: CellStore) -> None:
    needs_cas(store)
    prefix = fresh_row()
    rows = [f"{prefix}-{i:04d}" for i in range(600)]
    list(store.compare_and_set_many([CompareAndSet(row, {"v": None}, {"v": row}) for row in rows[::2]]))
    assert store.read_versioned_many(rows[:50]) == {row: {"v": row} for row in rows[:50:2]}
    assert store.read_versioned_many(rows) == {row: {"v": row} for row in rows[::2]}


def test_cas_is_linearizable_under_racing_processes(store: CellStore, store_url: str) -> None:
    needs_cas(store)
    row = fresh_row()
    processes, times = 3, 15
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        results = pool.starmap(workers.cas_increment, [(store_url, row, times)] * processes)
    written = [value for values, _ in results for value in values]
    uncertain = sum(count for _, count in results)
    final = workers.counter_value(store.read_versioned(row).get("counter"))
    # Every increment reported applied wrote its own step of the counter: no step twice.
    assert len({workers.counter_value(v) for v in written}) == len(written) == processes * times
    # Nothing reported "not applied" did apply, except the attempts reported *uncertain*
    # (a ring under contention: an unknown outcome, and other writers moved on before the
    # re-read). On one node and on SQLite there are none, and the count is exact.
    assert processes * times <= final <= processes * times + uncertain, (final, uncertain)
    if uncertain:
        print(f"\n{uncertain} uncertain outcome(s); counter {final} for {processes * times} applied")


# -- URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "",
        "cells.db",
        "redis://x/0",
        "sqlite://relative.db",
        "sqlite:///",
        "cassandra:///ks",
        "cassandra://h:x/ks",
        "cassandra://h:9042/",
        "cassandra://h/bad-keyspace",
        "cassandra://h:70000/ks",
    ],
)
def test_bad_store_urls_are_clear_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_store_url(url)


def test_store_url_parsing() -> None:
    parsed = parse_store_url("cassandra://u:p%40ss@h1,h2:9042/chrono?dc=dc1&timeout=2")
    assert parsed.hosts == ("h1", "h2") and parsed.port == 9042 and parsed.path == "chrono"
    assert (parsed.username, parsed.password) == ("u", "p@ss")
    assert parsed.options == {"dc": "dc1", "timeout": "2"}
    assert "p@ss" not in parsed.redacted() and "p@ss" not in repr(parsed)
    assert parse_store_url("sqlite:////tmp/x.db").path == "/tmp/x.db"
    assert parse_store_url("sqlite:///x.db").path == "x.db"


def test_open_store_rejects_negative_options(tmp_path: object) -> None:
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=-1")


def test_put_cells_writes_one_row_atomically_with_one_timestamp(store: CellStore) -> None:
    row = fresh_row()
    store.put_cells(Table.GLOBAL_TIME, row, {"value": "200", "source": "ok:a"}, timestamp=200)
    cells = {c.column: c for c in store.read_row(Table.GLOBAL_TIME, row)}
    assert {k: (c.value, c.timestamp) for k, c in cells.items()} == {"value": ("200", 200), "source": ("ok:a", 200)}
    store.put_cells(Table.GLOBAL_TIME, row, {"value": "100", "source": "ok:b"}, timestamp=100)  # older: ignored
    store.put(Table.GLOBAL_TIME, row, "source", "ok:c", timestamp=300)
    cells = {c.column: c for c in store.read_row(Table.GLOBAL_TIME, row)}
    assert cells["value"].value == "200" and cells["source"].value == "ok:c"  # each cell is still LWW


# -- property: the adapter reconciles exactly like Cassandra's rules ------------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete"]),
        st.sampled_from(["a", "b", "c"]),  # few columns: many collisions
        st.integers(1, 6),  # few timestamps: many ties
        st.sampled_from(["x", "y", "z"]),
    ),
    min_size=1,
    max_size=12,
)


def _model(ops: list[tuple[str, str, int, str]]) -> dict[str, tuple[str, int]]:
    """Cassandra's reconciliation: higher timestamp wins; at a tie a tombstone beats a live
    cell and the larger value beats the smaller. Returns the live cells."""
    best: dict[str, tuple[int, int, str]] = {}
    for op, col, ts, value in ops:
        candidate = (ts, 1 if op == "delete" else 0, "" if op == "delete" else value)
        current = best.get(col)
        if current is None or candidate > current:
            best[col] = candidate
    return {col: (v, ts) for col, (ts, dead, v) in best.items() if not dead}


@given(ops=_ops)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_sequence_of_writes_ends_in_the_state_cassandra_would_reach(
    store: CellStore, ops: list[tuple[str, str, int, str]]
) -> None:
    row = fresh_row()
    for op, col, ts, value in ops:
        if op == "put":
            _patiently(partial(store.put, Table.QUEUE, row, col, value, timestamp=ts))
        else:
            _patiently(partial(store.delete, Table.QUEUE, row, col, timestamp=ts))
    got = {c.column: (c.value, c.timestamp) for c in _patiently(partial(store.read_row, Table.QUEUE, row))}
    assert got == _model(ops)


def _patiently(call: Callable[[], T]) -> T:
    """What this property is about is the state the writes reach, not the node's availability: a
    write that timed out (a 1.2 node stalled at load ~14: "Connection defunct by heartbeat") is sent
    again as it was — same timestamp, same value, so last-write-wins makes the repeat a no-op
    whether the first one applied or not. Bounded: a node that stays away still fails the test."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
