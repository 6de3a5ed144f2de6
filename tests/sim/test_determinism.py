"""Same seed, same history — byte for byte, in this process or another with another hash seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim.search import run_seed

ROOT = Path(__file__).resolve().parents[2]


def test_one_seed_is_one_history_in_process() -> None:
    first, _ = run_seed(11, "mixed", duration=20.0)
    second, _ = run_seed(11, "mixed", duration=20.0)
    other, _ = run_seed(12, "mixed", duration=20.0)
    assert first.acquisitions > 0
    assert first.digest == second.digest
    assert first.digest != other.digest


def test_make_sim_with_a_seed_prints_the_same_digest_in_fresh_processes() -> None:
    digests = []
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "SIM_SEED": "7"}
        env.pop("SIM_REPLAY", None)
        done = subprocess.run(
            [sys.executable, "-m", "sim"], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("history sha256: ")]
        assert lines, done.stdout + done.stderr
        assert done.stdout.rstrip().splitlines()[-1].startswith("sim: 1 seeds, ")
        digests.append(lines[0])
    assert digests[0] == digests[1]


def test_the_primitives_profile_is_one_history_per_seed_too() -> None:
    first, _ = run_seed(11, "primitives", duration=20.0)
    second, _ = run_seed(11, "primitives", duration=20.0)
    assert first.digest == second.digest and first.ops == second.ops
    assert all(first.ops.get(kind, 0) > 0 for kind in ("semaphore", "rwlock", "election", "once", "watch"))
