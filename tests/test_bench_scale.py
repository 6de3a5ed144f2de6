"""bench/scale.py and bench/scale_holder.py: the pure helpers, the request counts the benchmark
divides by, and one small point run end to end on the embedded store (real processes).

The end-to-end point asserts what the benchmark promises, never a duration: every victim is
revoked and no live holder is, leasewatch's requests are counted by operation, renewals are
recorded. Whether revocation came within the bound is what the benchmark *reports*."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import scale
from bench.scale import Point, parse_points, parse_totals, ring_lease
from bench.scale_holder import _Lateness
from lockclient.store import Table, open_store
from lockclient.store.counting import CountingStore


def test_ring_lease_keeps_renewals_within_what_the_ring_carries() -> None:
    for n in (10, 1_000, 10_000, 100_000, 250_000):
        lease = ring_lease(n)
        assert lease >= 60
        assert lease % 60 == 0
        assert 3 * n / lease <= scale.RING_RENEWALS_PER_S  # one renewal per lock every lease / 3
    assert ring_lease(10_000) == 600
    assert ring_lease(100_000) == 6_000


def test_parse_points_reads_n_k_and_an_optional_lease() -> None:
    assert parse_points("10000:3:600, 100000:3") == [(10_000, 3, 600.0), (100_000, 3, None)]
    for bad in ("10000", "10000:0", "2:1", "100:1:0", "100:1:2:3", "a:b"):
        with pytest.raises(ValueError):
            parse_points(bad)


def test_keyspace_url_changes_only_the_keyspace() -> None:
    url, keyspace = scale._keyspace_url("cassandra://u:p@127.0.0.1:9242/chronolock_scale?timeout=3", "_10_3_ab")
    assert keyspace == "chronolock_scale_10_3_ab"
    assert url == "cassandra://u:p@127.0.0.1:9242/chronolock_scale_10_3_ab?timeout=3"


def test_parse_totals_reads_scans_looks_and_requests_by_operation() -> None:
    text = "\n".join(
        [
            "leasewatch_scan_seconds_sum 12.5",
            "leasewatch_scan_seconds_count 40.0",
            "leasewatch_looks_total 1234.0",
            'leasewatch_store_requests_total{op="read_versioned_many"} 1000.0',
            'leasewatch_store_requests_total{op="compare_and_set"} 7.0',
            'leasewatch_store_requests_created{op="compare_and_set"} 1.7e+09',
        ]
    )
    totals = parse_totals(text)
    assert (totals.scan_seconds, totals.scans, totals.looks) == (12.5, 40.0, 1234.0)
    assert totals.requests == {"read_versioned_many": 1000.0, "compare_and_set": 7.0}


def test_lateness_summary_orders_and_keeps_the_least_validity_left() -> None:
    lateness = _Lateness()
    assert lateness.summary() == {"count": 0}
    for late in (0.3, -0.01, 0.0, 0.1):
        lateness.add(late, 10.0 - late)
    summary = lateness.summary()
    assert summary["count"] == 4
    assert summary["p50_s"] == 0.1
    assert summary["max_s"] == 0.3
    assert summary["least_left_s"] == 9.7


def test_renewal_lateness_takes_the_worst_holder_process() -> None:
    def holder(summary: dict[str, Any]) -> Any:
        return SimpleNamespace(last_alive=lambda: {"renewals": summary})

    point = Point(n=10, k=1, lease=10.0)
    holders = [
        holder({"count": 5, "p50_s": 0.01, "p99_s": 0.2, "max_s": 0.3, "least_left_s": 9.0}),
        holder({"count": 7, "p50_s": 0.02, "p99_s": 0.1, "max_s": 0.5, "least_left_s": 8.5}),
        holder({"count": 0}),
    ]
    scale._renewal_lateness(point, holders)
    assert point.renewals == 12
    assert (point.renewal_late_p50_s, point.renewal_late_p99_s, point.renewal_late_max_s) == (0.02, 0.2, 0.5)
    assert point.renewal_least_left_s == 8.5


def test_counting_store_counts_a_many_rows_read_as_one_request_per_row(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    with open_store(f"sqlite:///{tmp_path / 'cells.db'}") as inner:
        store = CountingStore(inner, on_requests=lambda op, n: seen.append((op, n)), client_metrics=False)
        store.put(Table.QUEUE, "a", "t1", "v", timestamp=1)
        store.read_rows_many(Table.QUEUE, ["a", "b", "a", "c"])  # a repeated row is read once
        store.read_versioned_many(["a", "b"])
        store.read_versioned_many([])
    assert store.counts.requests == 1 + 3 + 2
    assert store.counts.total == 4  # calls: put, and one per many-rows read
    assert seen == [("put", 1), ("read_rows_many", 3), ("read_versioned_many", 2)]


@pytest.mark.slow
def test_a_small_point_on_the_embedded_store_revokes_the_victims_and_no_live_holder(tmp_path: Path) -> None:
    # Holders on a 10 s lease (renewed every 3.3 s: a loaded machine does not make them late by a
    # lease), victims on 3 s so that the point ends soon; K = 2 also measures a take-over.
    point = scale.run_point(tmp_path, 23, 2, 10.0, victim_lease=3.0)
    assert point.errors == [], point.errors
    assert point.store == "sqlite"
    assert len(point.revocation_s) == scale.VICTIMS
    assert all(r >= point.victim_lease for r in point.revocation_s), "revoked before its lease ran out"
    assert point.live_lost == 0
    assert point.revocations == scale.VICTIMS
    assert point.takeover_s is not None
    assert point.holder_processes == 1
    assert point.leasewatch_requests_per_id_s > 0
    assert "read_versioned_many" in point.leasewatch_requests_by_op
    assert point.holder_requests_per_id_s > 0  # renewals (and the clock) in the window
    assert point.renewals > 0 and not math.isnan(point.renewal_late_max_s)
    assert point.store_server_cpu_cores is None
    json.dumps(point.__dict__)  # what the results file holds
