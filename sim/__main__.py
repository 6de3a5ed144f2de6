"""``make sim`` / ``python -m sim``: search schedules, or replay one seed.

Environment (the Makefile passes it through; flags override):

* ``SIM_SEED=7`` — run that one seed and print ``history sha256: <digest>`` (the same every time);
  with ``SIM_REPLAY=<file>``, replay the fault schedule in that file (a shrunk failure) instead of
  the seed's own.
* ``SIM_ACQUISITIONS`` (default 100000), ``SIM_SEEDS``, ``SIM_SECONDS`` — when a search stops.
* ``SIM_PROFILE`` — ``mixed`` (default: every fault family, the deployment varied per seed),
  ``quiet``, ``clocks``, ``unknown``, ``processes``.
* ``SIM_JOBS`` — worker processes (default: one per CPU this process may use).
* ``SIM_DURATION`` — with ``SIM_SEED``: that many simulated seconds of work instead of the profile's
  (a long horizon; it reports simulated acquisitions per CPU-second).

A search starts from a fresh random base seed (printed) and ends with the line
``sim: N seeds, A simulated acquisitions, V violations``; every failing seed is printed with its
violations and the command that replays it, and the first one is shrunk to a minimal schedule.
Exit status 1 when anything was violated.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import sys
import time
from pathlib import Path

from sim.search import PROFILES, Outcome, run_seed, save_schedule, search, shrink, tune_gc


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=_env_int("SIM_SEED"), help="run this one seed")
    parser.add_argument("--replay", default=os.environ.get("SIM_REPLAY") or None, help="fault schedule file")
    parser.add_argument("--profile", default=os.environ.get("SIM_PROFILE", "mixed"), choices=sorted(PROFILES))
    parser.add_argument("--acquisitions", type=int, default=_env_int("SIM_ACQUISITIONS"))
    parser.add_argument(
        "--ops", type=int, default=_env_int("SIM_OPS"), help="until this many operations of every primitive"
    )
    parser.add_argument("--seeds", type=int, default=_env_int("SIM_SEEDS"))
    parser.add_argument("--seconds", type=float, default=_env_int("SIM_SECONDS"))
    parser.add_argument("--jobs", type=int, default=_env_int("SIM_JOBS"))
    parser.add_argument(
        "--duration",
        type=float,
        default=_env_int("SIM_DURATION"),
        help="simulated seconds of work for --seed (a long horizon: 3600 is an hour, 604800 a week)",
    )
    parser.add_argument("--base", type=int, default=_env_int("SIM_BASE"), help="first seed of a search")
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink the first failure")
    parser.add_argument("--out", default=os.environ.get("SIM_OUT", ".chronolock/sim"), help="where schedules go")
    parser.add_argument(
        "--finding",
        default=os.environ.get("SIM_FINDING") or None,
        help="hunt one of the review's findings with its old behaviour restored (sim/findings.py; 'list')",
    )
    args = parser.parse_args(argv)

    if args.finding is not None:
        return _hunt(args)

    if args.seed is not None:
        tune_gc()  # this process runs nothing but the simulation
        return _one(args)
    acquisitions = args.acquisitions
    if acquisitions is None and args.seeds is None and args.seconds is None and args.ops is None:
        acquisitions = 100_000
    base = args.base if args.base is not None else secrets.randbelow(2**31)
    print(f"sim: profile {args.profile}, base seed {base} (seeds {base}, {base + 1}, ...)", flush=True)
    started = time.monotonic()
    failed: list[Outcome] = []

    def report(outcome: Outcome) -> None:
        if outcome.violations:
            failed.append(outcome)
            print(f"seed {outcome.seed}: {len(outcome.violations)} violations", flush=True)
            for line in outcome.violations[:8]:
                print(f"  {line[:400]}", flush=True)
            print(f"  replay: SIM_SEED={outcome.seed} SIM_PROFILE={outcome.profile} make sim", flush=True)

    outcomes = search(
        itertools.count(base),
        profile=args.profile,
        jobs=args.jobs,
        acquisitions=acquisitions,
        max_seeds=args.seeds,
        seconds=args.seconds,
        on_outcome=report,
        ops=args.ops,
    )
    cpu = sum(o.cpu_s for o in outcomes)
    total = sum(o.acquisitions for o in outcomes)
    virtual = sum(o.virtual_s for o in outcomes)
    violations = sum(len(o.violations) for o in outcomes)
    print(
        f"sim: {len(outcomes)} seeds, {total} simulated acquisitions in {virtual:.0f} simulated seconds, "
        f"{cpu:.0f} CPU-seconds ({total / cpu if cpu else 0:.0f} acquisitions per CPU-second), "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    handovers = sum(o.handovers for o in outcomes)
    print(f"sim: {handovers} one-round hand-overs (FIFO judged by the releaser's read)", flush=True)
    per: dict[str, int] = {}
    for outcome in outcomes:
        for primitive, n in outcome.ops.items():
            per[primitive] = per.get(primitive, 0) + n
    if set(per) - {"lock"}:
        print("sim: operations per primitive: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items())), flush=True)
    if failed and not args.no_shrink:
        small = shrink(failed[0])
        path = save_schedule(small, Path(args.out))
        print(f"shrunk seed {small.seed} to {len(small.schedule)} faults ({path}):", flush=True)
        for event in small.schedule:
            print(f"  {event}", flush=True)
        for line in small.violations[:5]:
            print(f"  {line[:400]}", flush=True)
        print(f"  replay: SIM_SEED={small.seed} SIM_PROFILE={small.profile} SIM_REPLAY={path} make sim", flush=True)
    print(f"sim: {len(outcomes)} seeds, {total} simulated acquisitions, {violations} violations", flush=True)
    return 1 if violations else 0


def _hunt(args: argparse.Namespace) -> int:
    from sim.findings import FINDINGS, hunt

    if args.finding == "list" or args.finding not in FINDINGS:
        for name, finding in FINDINGS.items():
            print(f"{name}: issue {finding.issue}, {finding.title} (restored: {finding.what})")
        return 0 if args.finding == "list" else 2
    finding = FINDINGS[args.finding]
    base = args.base if args.base is not None else secrets.randbelow(2**31)
    print(f"sim: hunting {args.finding} (issue {finding.issue}: {finding.title})", flush=True)
    print(f"  restored: {finding.what}; profile {finding.profile}, seeds from {base}", flush=True)
    result = hunt(args.finding, base=base, max_seeds=args.seeds or 1000, max_cpu_s=args.seconds, jobs=args.jobs)
    if result.found is None:
        print(f"sim: {args.finding} not found in {result.seeds} seeds, {result.cpu_s:.0f} CPU-seconds", flush=True)
        return 1
    for line in result.found.violations[:5]:
        print(f"  {line[:500]}", flush=True)
    print(
        f"sim: {args.finding} found by seed {result.found.seed} after {result.seeds} seeds, "
        f"{result.cpu_s:.1f} CPU-seconds ({result.wall_s:.1f} s)",
        flush=True,
    )
    return 0


def _one(args: argparse.Namespace) -> int:
    import json

    schedule = None
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        schedule = data["schedule"]
        args.profile = data.get("profile", args.profile)
    long = args.duration is not None and args.duration > 600
    started = time.monotonic()
    # A long horizon keeps only the history's digest (an hour's history is ~10^6 lines).
    outcome, sim = run_seed(args.seed, args.profile, schedule=schedule, keep_history=not long, duration=args.duration)
    print(f"seed {outcome.seed} ({outcome.profile}): {sim.config}", flush=True)
    if long:
        print(f"  {len(outcome.schedule)} faults (SIM_DURATION ≤ 600 prints each)", flush=True)
    else:
        for event in outcome.schedule:
            print(f"  fault {event}", flush=True)
    for line in outcome.violations:
        print(f"  {line[:600]}", flush=True)
    if outcome.violations:
        print("  last events before the first violation:", flush=True)
        lines = sim.history.lines
        first = next((i for i, line in enumerate(lines) if " VIOLATION " in line), len(lines))
        for line in lines[max(0, first - 25) : first + 1]:
            print(f"    {line[:300]}", flush=True)
    print(f"history sha256: {outcome.digest}", flush=True)
    print(
        f"sim: {outcome.virtual_s:.0f} simulated seconds in {outcome.cpu_s:.1f} CPU-seconds "
        f"({time.monotonic() - started:.1f} s): {outcome.acquisitions / max(outcome.cpu_s, 1e-9):.0f} "
        "simulated acquisitions per CPU-second",
        flush=True,
    )
    if set(outcome.ops) - {"lock"}:
        print("sim: operations per primitive: " + ", ".join(f"{k} {v}" for k, v in sorted(outcome.ops.items())))
    print(f"sim: {outcome.handovers} one-round hand-overs (FIFO judged by the releaser's read)", flush=True)
    print(
        f"sim: 1 seeds, {outcome.acquisitions} simulated acquisitions, {len(outcome.violations)} violations",
        flush=True,
    )
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
