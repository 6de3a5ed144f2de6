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

KNOWN_OPEN_FINDINGS: dict[str, str] = {}
"""Triggers of findings that are open and replayed elsewhere: left out of the random mix so that this
run guards everything else. CHRONOLOCK_FAULT_INCLUDE_KNOWN=1 puts them back (then expect violations).
Keys are worker flags (``"--double-cancel-p"`` → ``0``) or ``"avoid_known_findings"`` (the timesvc
fault combinations of findings 2 and 3). Empty: findings 1–3 are fixed and back in the mix."""


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
        avoid_known_findings="avoid_known_findings" in KNOWN_OPEN_FINDINGS and not include_known(),
    )
    run_mixed(tmp_path, settings)
