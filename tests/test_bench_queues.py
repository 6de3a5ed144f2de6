"""The pure helpers of bench/queues.py (no processes, no timing)."""

from __future__ import annotations

import math

from bench.queues import QueuePoint, in_window, longest_run, per, prometheus_value, summarise_queues


def test_longest_run_counts_consecutive_grants_to_one_owner() -> None:
    assert longest_run([]) == 0
    assert longest_run(["a"]) == 1
    assert longest_run(["a", "b", "a", "b"]) == 1
    assert longest_run(["a", "a", "b", "a", "a", "a", "b"]) == 3


def test_in_window_keeps_grants_inside_and_orders_them_by_token() -> None:
    records = [
        {"acquired": 9.9, "token": 1},
        {"acquired": 10.5, "token": 4},
        {"acquired": 10.0, "token": 3},
        {"acquired": 12.0, "token": 5},  # the window is [10, 12)
    ]
    assert [r["token"] for r in in_window(records, 10.0, 2.0)] == [3, 4]


def test_per_is_nan_for_nothing() -> None:
    assert per(3, 2) == 1.5
    assert math.isnan(per(3, 0))


def test_prometheus_value_reads_an_unlabelled_sample() -> None:
    text = (
        "# HELP leasewatch_wait_polls_total store read pairs\n"
        "leasewatch_wait_polls_total 1234.0\n"
        "leasewatch_waiters 7.0\n"
        "leasewatch_wait_polls_created 1.7e+09\n"
    )
    assert prometheus_value(text, "leasewatch_wait_polls") == 1234.0
    assert prometheus_value(text, "leasewatch_waiters") == 7.0
    assert prometheus_value(text, "leasewatch_absent") == 0.0


def test_summarise_queues_weights_costs_by_acquisitions_and_adds_timeouts() -> None:
    a = QueuePoint(q=5, round=1, window_s=10, acquisitions=100, ops_per_acq=10, timeouts=0, longest_process_run=1)
    b = QueuePoint(q=5, round=2, window_s=10, acquisitions=300, ops_per_acq=20, timeouts=2, longest_process_run=3)
    a.loadavg, b.loadavg = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    (s,) = summarise_queues([a, b])
    assert s["acq_per_s"] == 20.0  # 400 grants in 20 s of windows
    assert s["ops_per_acq"] == 17.5
    assert s["timeouts"] == 2
    assert s["longest_process_run"] == 3
    assert s["loadavg_1m"] == [1.0, 2.0]
