"""Reproducible chronolock benchmarks (DESIGN.md §9): ``python -m bench [all|now|locks] [--quick]``.

* :mod:`bench.now` — ``GET /now`` throughput and latency against the bare ``/healthz``
  endpoint of the same timesvc process, measured side by side in one run.
* :mod:`bench.locks` — uncontended acquire+release latency, and the thesis experiment
  (P = 1, 3, 5 processes each take one lock K times) for the fair queue lock and the
  backoff baseline, with timeline plots.

Each writes ``bench/results/<name>.json`` (gitignored), ``bench/results/<name>.md``
(the Markdown tables, committed) and prints the tables.
"""
