"""``python -m bench [all|now|locks|leasewatch|peers|election|ring|scale|queues|clockfaults|asyncio|startup] [--quick]
[--k K] [--only PEERS] [--max-n N] [--seconds S] [--parallel N] ...``.

See bench/README.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds through the benchmarks' finally blocks, which stop our processes by PID.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="chronolock benchmarks (DESIGN.md §9)")
    parser.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=[
            "all",
            "now",
            "locks",
            "leasewatch",
            "peers",
            "election",
            "ring",
            "scale",
            "queues",
            "clockfaults",
            "asyncio",
            "startup",
        ],
        help="which benchmark (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs (whole suite ~3 minutes)")
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help=(
            "acquisitions per process in the thesis experiment (locks: default 200, --quick 50; "
            "peers: default 1000, --quick 100; the thesis used 5000)"
        ),
    )
    parser.add_argument(
        "--only",
        default="",
        metavar="PEERS",
        help="peers benchmark: comma-separated rows to run (default all), e.g. chronolock-wake,kazoo",
    )
    parser.add_argument(
        "--max-n",
        type=int,
        default=None,
        help="largest number of live lock ids in the scale benchmark (default 100,000; with all or --quick 10,000)",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="REF",
        help="startup benchmark: also build this git ref's wheel and time it in the same rounds",
    )
    parser.add_argument(
        "--against-python",
        default=None,
        metavar="PYTHON",
        help="asyncio benchmark: also measure this interpreter's installed lockclient (an older checkout's "
        ".venv/bin/python), alternating with this tree's",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="asyncio benchmark: measurements per code version (default 1)"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="asyncio benchmark: also measure this tree with gc.freeze() called after start-up, in the same rounds",
    )
    parser.add_argument("--only-n", type=int, default=None, help="scale benchmark: only the points with this N")
    parser.add_argument(
        "--store-url",
        default=None,
        metavar="URL",
        help="scale benchmark: run on this store (e.g. cassandra://127.0.0.1:9242/chronolock_scale: each point "
        "gets its own keyspace, created and dropped; default a temporary SQLite file per point)",
    )
    parser.add_argument(
        "--points",
        default=None,
        metavar="N:K[:LEASE],...",
        help="scale benchmark: the points to run (live ids, leasewatch replicas, lease in s; default lease: 10 s, "
        "60 s above 10,000 on SQLite; on a networked store what its renewals allow, bench/scale.py ring_lease)",
    )
    parser.add_argument(
        "--victim-lease",
        type=float,
        default=None,
        help="scale benchmark: the 3 SIGKILLed victims' lease (default: the point's lease; on a networked store "
        "at most 60 s)",
    )
    parser.add_argument(
        "--setup-timeout",
        type=float,
        default=None,
        metavar="S",
        help="scale benchmark: if a point's locks are not all held after S seconds, its holders stop taking "
        "more and the point is measured at the N they hold (reported)",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="scale benchmark on Cassandra: the replication factor of each point's keyspace (default 3)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="clockfaults: seconds per clock fault (default 600; with all 60, with --quick 30)",
    )
    parser.add_argument(
        "--parallel", type=int, default=3, help="clockfaults: how many clock faults run side by side (default 3)"
    )
    args = parser.parse_args(argv)
    if args.k is not None and args.k < 1:
        parser.error("--k must be at least 1")
    if args.seconds is not None and args.seconds < 10:
        parser.error("--seconds must be at least 10")

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    if args.which in ("all", "now"):
        from bench import now

        now.run(quick=args.quick)
    if args.which in ("all", "locks"):
        from bench import locks

        locks.run(quick=args.quick, k=args.k)
    if args.which in ("all", "leasewatch"):
        from bench import leasewatch

        leasewatch.run(quick=args.quick)
    if args.which in ("all", "peers"):
        from bench import peers

        only = tuple(key.strip() for key in args.only.split(",") if key.strip())
        peers.run(quick=args.quick, k=args.k, only=only)
    if args.which in ("all", "election"):
        from bench import election

        election.run(quick=args.quick)
    if args.which in ("all", "ring"):
        from bench import ring  # skips itself (saying why) unless CHRONOLOCK_BENCH_CASSANDRA names a ring

        ring.run(quick=args.quick)
    if args.which in ("all", "scale"):
        from bench import scale

        # `make bench` (all) runs the short version, up to 10,000 lock ids; `bench scale` the whole.
        short = args.which == "all" or args.quick
        try:
            plan = scale.parse_points(args.points) if args.points else None
        except ValueError as exc:
            parser.error(str(exc))
        del plan  # validated before anything starts; run() parses it again
        scale.run(
            quick=short,
            max_n=args.max_n,
            only_n=args.only_n,
            store_url=args.store_url,
            points=args.points,
            victim_lease=args.victim_lease,
            replication_factor=args.replication_factor,
            setup_timeout=args.setup_timeout,
        )
    if args.which in ("all", "queues"):
        from bench import queues

        # `make bench` (all) runs the short version (one round, short windows); `bench queues` the whole.
        queues.run(quick=args.which == "all" or args.quick)
    if args.which in ("all", "clockfaults"):
        from bench import clockfaults

        default = 30.0 if args.quick else 60.0 if args.which == "all" else 600.0
        clockfaults.run(seconds=args.seconds or default, parallel=max(1, args.parallel))
    if args.which in ("all", "asyncio"):
        from bench import aio

        aio.run(
            quick=args.quick, against_python=args.against_python, rounds=max(1, args.rounds), gc_freeze=args.gc_freeze
        )
    if args.which in ("all", "startup"):
        from bench import startup

        startup.run(quick=args.quick, against=args.against)
    print(f"[bench] done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
