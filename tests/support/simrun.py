"""Run ``python -m sim`` as ``make sim`` does, from a test, and read its summary line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"sim: (\d+) seeds, (\d+) simulated acquisitions, (\d+) violations")


@dataclass(frozen=True)
class SimRun:
    """One finished search: its output, summary and wall time (reported, never asserted)."""

    returncode: int
    stdout: str
    output: str
    seeds: int
    acquisitions: int
    violations: int
    took_s: float

    @property
    def lines(self) -> list[str]:
        return self.stdout.rstrip().splitlines()


def run_sim(*args: str, limit_s: float) -> SimRun:
    """Run a search in a fresh process (no inherited ``SIM_*`` variable), print its output, and
    fail the calling test with the output's tail when it ends without the summary line.
    ``limit_s`` only guards against a hang: a busy machine may be slow."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIM_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sim", *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit_s,
    )
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    print(output)
    lines = done.stdout.rstrip().splitlines()
    found = SUMMARY.fullmatch(lines[-1]) if lines else None
    assert found, f"no summary line:\n{output[-3000:]}"
    seeds, acquisitions, violations = map(int, found.groups())
    return SimRun(done.returncode, done.stdout, output, seeds, acquisitions, violations, took)
