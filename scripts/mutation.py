"""``make mutation``: mutmut over the algorithm cores ([tool.mutmut] in pyproject.toml), then a score
per module (issue 24; BENCHMARKS.md, docs/mutation-triage.md).

All of them is ~4,900 mutants: a mutant that survives runs every test that reaches its function
(about a minute on an idle machine), so a full run takes many hours on this project's 2-core
machines. By default each module is judged by a fixed, seeded sample of its mutants
(``MUTATION_SAMPLE`` per module, default 20; ``MUTATION_SAMPLE=all`` runs everything): the same
seed picks the same sample from the same code. Steps:

1. ``mutmut run <the sample>`` — mutmut generates every mutant into ``mutants/``, measures which
   tests reach which function, then runs the sample (a mutant already judged in ``mutants/`` is
   not run again);
2. a table per module from mutmut's own results (``mutants/**/*.py.meta``), over the sample only.

Workers run under ``nice -n 15`` (``MUTATION_JOBS``, default 2). Exit code 0 whatever the score:
the score is reported, survivors are triaged by a person.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")
SAMPLE_SEED = 24

STATUSES = ("killed", "timeout", "survived", "no tests", "suspicious", "segfault")
"""mutmut's verdicts (mutmut.stats.status_by_exit_code); a timeout is a kill by SIGXCPU."""


def modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def results() -> dict[str, dict[str, int | None]]:
    """Mutant name → mutmut's exit code (None: not run), per module path."""
    out: dict[str, dict[str, int | None]] = {}
    for path in modules():
        meta = ROOT / "mutants" / f"{path}.meta"
        out[path] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    return out


def mutmut(names: list[str], jobs: int) -> None:
    command = ["nice", "-n", "15", str(MUTMUT), "run", "--max-children", str(jobs), *names]
    subprocess.run(command, cwd=ROOT, check=True)


def report(names: list[str], cpu_s: float | None, wall_s: float | None) -> None:
    from mutmut.stats import status_by_exit_code

    rows: list[tuple[str, dict[str, int]]] = []
    totals = dict.fromkeys(("mutants", "run", *STATUSES), 0)
    survivors: list[str] = []
    for path, codes in results().items():
        row = dict.fromkeys(("mutants", "run", *STATUSES), 0)
        judged = set(names)
        row["mutants"] = sum(name in judged for name in codes)
        for name, code in sorted(codes.items()):
            if name not in judged:
                continue
            status = status_by_exit_code[code]
            if status == "not checked":
                continue
            row["run"] += 1
            row[status] = row.get(status, 0) + 1
            if status not in ("killed", "timeout"):
                survivors.append(f"{name}  ({status})")
        for key in totals:
            totals[key] += row.get(key, 0)
        rows.append((path, row))
    rows.append(("overall", totals))
    print()
    print("| module | sampled | run | killed | timeout | survived | no tests | other | score |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path, row in rows:
        other = row["run"] - row["killed"] - row["timeout"] - row["survived"] - row["no tests"]
        score = f"{100 * (row['killed'] + row['timeout']) / row['run']:.1f} %" if row["run"] else "—"
        print(
            f"| {path} | {row['mutants']} | {row['run']} | {row['killed']} | {row['timeout']} | {row['survived']} "
            f"| {row['no tests']} | {other} | {score} |"
        )
    if cpu_s is not None and wall_s is not None:
        print(f"\nCPU {cpu_s:.0f} s (mutmut and its workers), wall {wall_s:.0f} s")
    print("\nnot killed:")
    for line in survivors:
        print(f"  {line}")


def sample(per_module: int | None) -> list[str]:
    """The mutants judged: every one, or ``per_module`` of each module drawn with a fixed seed."""
    names: list[str] = []
    for path, codes in results().items():
        every = sorted(codes)
        if per_module is None or per_module >= len(every):
            names += every
        else:
            names += sorted(random.Random(f"{SAMPLE_SEED}/{path}").sample(every, per_module))
    return names


def generate(jobs: int) -> None:
    """Have mutmut generate the mutants (and measure which tests reach which function) without
    judging any: it is given a name that matches no mutant, and stops there with an error."""
    command = ["nice", "-n", "15", str(MUTMUT), "run", "--max-children", str(jobs), "none.generate*only"]
    subprocess.run(command, cwd=ROOT, check=False, capture_output=True)
    if not all(results().values()):
        sys.exit("mutmut generated no mutants (run `mutmut run` by hand to see why)")


def main() -> None:
    jobs = int(os.environ.get("MUTATION_JOBS", "2"))
    raw = os.environ.get("MUTATION_SAMPLE", "20")
    per_module = None if raw == "all" else int(raw)
    wall = time.monotonic()
    cpu0 = os.times()
    if not all(results().values()):
        generate(jobs)
    names = sample(per_module)
    mutmut(names, jobs)
    cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
    report(names, cpu, time.monotonic() - wall)


if __name__ == "__main__":
    if sys.argv[1:] == ["--report"]:
        raw = os.environ.get("MUTATION_SAMPLE", "20")
        report(sample(None if raw == "all" else int(raw)), None, None)
    else:
        main()
