"""The mixed-fault run on the embedded store (issue 10): ≥ 10,000 acquisitions by ≥ 8 workers while a
seeded nemesis mixes crashes, pauses, clock jumps and rate changes, partitions, storage faults and
cancellations; then every checker over the whole history. See tests/faults/README.md.

``CHRONOLOCK_FAULT_SEED`` replays a schedule; ``CHRONOLOCK_FAULT_ACQUISITIONS`` and
``CHRONOLOCK_FAULT_DURATION`` (seconds) resize the run (``make soak`` runs it for 10 minutes).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.harness import MixedRun, Settings, seed_from_env

pytestmark = pytest.mark.slow

CI_SEED = 20261123
"""The CI run is reproducible: a fixed seed unless CHRONOLOCK_FAULT_SEED says otherwise."""

KNOWN_OPEN_FINDINGS = {
    "--double-cancel-p": (
        "finding 1 (issue 8 finding 5): cancelling aget_lock twice leaks a held lock renewed forever; replayed "
        "deterministically by tests/faults/test_findings.py (xfail strict) until the fix lands"
    ),
    "avoid_known_findings": (
        "finding 2: a timesvc replica (re)started while GlobalTime is stale serves /now seconds behind real time; "
        "the nemesis restarts a killed replica only once nothing blocks publishing. Finding 3 (issue 8 finding 8): "
        "a replica whose clock runs ahead adopts it when nobody else could publish for 4 ticks (a store stall "
        "suffices): clock faults on timesvc never overlap store stalls or timesvc pauses/kills. Both are replayed "
        "by test_findings.py"
    ),
}
"""Triggers of findings that are open and replayed elsewhere: left out of the random mix so that this
run guards everything else. CHRONOLOCK_FAULT_INCLUDE_KNOWN=1 puts them back (then expect violations)."""


def include_known() -> bool:
    return os.environ.get("CHRONOLOCK_FAULT_INCLUDE_KNOWN") == "1"


def worker_args() -> tuple[str, ...]:
    args = os.environ.get("CHRONOLOCK_FAULT_WORKER_ARGS", "").split()
    if not include_known():
        for flag in (f for f in KNOWN_OPEN_FINDINGS if f.startswith("--")):
            if flag not in args:
                args += [flag, "0"]
    return tuple(args)


def run_mixed(tmp_path: Path, settings: Settings) -> None:
    run = MixedRun(tmp_path, settings)
    print(f"\nmixed-fault run: seed {settings.seed} (replay with CHRONOLOCK_FAULT_SEED={settings.seed}); {tmp_path}")
    try:
        run.setup()
        run.run()
    finally:
        run.close()
    report = run.check()
    text = report.text()
    (tmp_path / "report.txt").write_text(text + "\n")
    print(text)
    assert report.acquisitions >= settings.target_acquisitions or settings.target_acquisitions > 10**8, (
        f"only {report.acquisitions} acquisitions in {settings.max_duration}s\n{text}"
    )
    assert not report.violations, f"{len(report.violations)} violations; history: {report.history}\n{text}"


@pytest.mark.timeout(int(float(os.environ.get("CHRONOLOCK_FAULT_DURATION", "600"))) + 600)
def test_mixed_faults_on_the_embedded_store(tmp_path: Path) -> None:
    settings = Settings(
        seed=seed_from_env(CI_SEED),
        target_acquisitions=int(os.environ.get("CHRONOLOCK_FAULT_ACQUISITIONS", "10000")),
        max_duration=float(os.environ.get("CHRONOLOCK_FAULT_DURATION", "600")),
        nemesis=os.environ.get("CHRONOLOCK_FAULT_NEMESIS", "1") != "0",
        worker_args=worker_args(),
        avoid_known_findings=not include_known(),
    )
    run_mixed(tmp_path, settings)
