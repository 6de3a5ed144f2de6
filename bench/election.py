"""Fail-over of an elected leader: chronolock's ``locker.election(name)`` against kazoo's ``Election``
(ZooKeeper), measured in the same run (issue 26).

**The experiment.** Three candidate processes stand for one election (``bench/election_candidate.py``:
chronolock's ``Election.run`` on the embedded SQLite store with one ``timesvc serve`` and one
``leasewatch serve``; kazoo's ``Election.run`` against a standalone ZooKeeper). Once a leader has led
for a second, the bench **SIGKILLs** or **SIGSTOPs** it and measures, on ``CLOCK_MONOTONIC`` (one clock
for every process here), from the signal to the moment another candidate reports itself elected. Each
round starts three fresh candidates on a fresh election name (znode path); a stopped leader is killed
after its round. All processes run on this machine, started and stopped by PID.

**The settings compared** — what bounds each:

* chronolock: the revocation bound ``lease + grace + look period + scan`` (DESIGN.md §6) after the
  leader's last renewal, then the next candidate's wake-up (leasewatch's long-poll, or its own poll);
* kazoo: the ZooKeeper **session timeout** — the dead (or frozen) client's ephemeral node stays until
  the server expires its session; then the next candidate's watch fires.

``defaults`` compares each as shipped (chronolock: lease 10 s, ``LEASEWATCH_GRACE`` 2 s,
``LEASEWATCH_SCAN_INTERVAL`` 1 s — bound 13 s; kazoo: ``timeout=10`` s with ZooKeeper's ``tickTime``
2000 ms); ``tight`` sets both to about 2 s (chronolock: lease 2 s, grace 0.5 s, scan 0.2 s — bound
2.9 s; kazoo: ``timeout=2`` s, ``tickTime`` 500 ms so that ZooKeeper accepts it).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import fleet, machine_info, markdown_table, write_results
from bench.peers import Servers

__all__ = ["run"]

CANDIDATE = [sys.executable, "-m", "bench.election_candidate"]


@dataclass(frozen=True)
class Setting:
    name: str
    lease: float
    grace: float
    scan: float
    zk_timeout: float
    zk_tick_ms: int

    @property
    def bound(self) -> float:
        return self.lease + self.grace + max(self.scan, self.lease / 10) + self.scan


SETTINGS = (
    Setting("defaults", lease=10.0, grace=2.0, scan=1.0, zk_timeout=10.0, zk_tick_ms=2000),
    Setting("tight", lease=2.0, grace=0.5, scan=0.2, zk_timeout=2.0, zk_tick_ms=500),
)


def _read(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _elected(out: Path, after_ns: int = 0) -> dict[str, Any] | None:
    return next((e for e in _read(out) if e["what"] == "elected" and e["at"] > after_ns), None)


def _wait(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    return None


def one_round(system: str, params: dict[str, Any], fault: str, workdir: Path, timeout: float) -> dict[str, Any]:
    """Three candidates; fault the leader; the time until another is elected (None: not within timeout)."""
    tag = uuid.uuid4().hex[:8]
    out = workdir / f"{system}-{fault}-{tag}.jsonl"
    params = {**params, "name": f"election-{tag}"}
    procs = [
        subprocess.Popen(
            [*CANDIDATE, system, json.dumps(params), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / f"{system}-{tag}-{i}.err").open("wb"),
        )
        for i in range(3)
    ]
    try:
        first = _wait(lambda: _elected(out), 60)
        if first is None:
            raise RuntimeError(f"{system}: nobody was elected within 60 s")
        time.sleep(1.0)  # a leader in its stride (renewing / heartbeating), not one just elected
        before = _elected(out)
        assert before is not None
        faulted = before["pid"]
        at = time.monotonic_ns()
        os.kill(faulted, signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
        second = _wait(lambda: _elected(out, at), timeout)
        took = None if second is None else (second["at"] - at) / 1e9
        terms = [e.get("term") for e in _read(out) if e["what"] == "elected"]
        return {"system": system, "fault": fault, "failover_s": took, "terms": terms}
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def run(*, quick: bool = False) -> dict[str, Any]:
    rounds = 2 if quick else 5
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chronolock-bench-election-") as tmp:
        workdir = Path(tmp)
        for setting in SETTINGS:
            print(f"[bench] election fail-over, {setting.name}: {rounds} rounds per system and fault", flush=True)
            servers = Servers(workdir / setting.name)
            (workdir / setting.name).mkdir()
            with fleet(workdir / setting.name) as services:
                store = f"sqlite:///{workdir / setting.name / 'cells.db'}"
                timesvc = services.timesvc(store, f"timesvc-{setting.name}")
                leasewatch = services.leasewatch(
                    store,
                    f"leasewatch-{setting.name}",
                    scan_interval=setting.scan,
                    settings={"GRACE": str(setting.grace)},
                )
                timesvc.wait_ready()
                leasewatch.wait_ready()
                chronolock = {
                    "store_url": store,
                    "timesvc_urls": timesvc.url,
                    "leasewatch_url": leasewatch.url,
                    "lease": setting.lease,
                }
                kazoo: dict[str, Any] | None = None
                try:
                    servers.zookeeper_tick_ms = setting.zk_tick_ms
                    servers.start("zookeeper")
                    if "zookeeper" in servers.params:
                        kazoo = {**servers.params["zookeeper"], "timeout": setting.zk_timeout}
                    for fault in ("SIGKILL", "SIGSTOP"):
                        for system, params in (("chronolock", chronolock), ("kazoo", kazoo)):
                            if params is None:
                                continue
                            for _ in range(rounds):
                                timeout = 3 * max(setting.bound, setting.zk_timeout) + 10
                                result = one_round(system, params, fault, workdir / setting.name, timeout)
                                result["setting"] = setting.name
                                results.append(result)
                                print(f"  {setting.name} {system} {fault}: {result['failover_s']}", flush=True)
                finally:
                    servers.stop_all()
            skipped = servers.skipped.get("zookeeper")
    table = []
    for setting in SETTINGS:
        for system in ("chronolock", "kazoo"):
            for fault in ("SIGKILL", "SIGSTOP"):
                times = [
                    r["failover_s"]
                    for r in results
                    if r["setting"] == setting.name and r["system"] == system and r["fault"] == fault
                ]
                done = [t for t in times if t is not None]
                if not times:
                    continue
                bound = (
                    f"{setting.bound:.1f} s (revocation)"
                    if system == "chronolock"
                    else f"{setting.zk_timeout:g} s (session)"
                )
                table.append(
                    [
                        setting.name,
                        system,
                        fault,
                        len(done),
                        statistics.median(done) if done else float("nan"),
                        min(done) if done else float("nan"),
                        max(done) if done else float("nan"),
                        bound,
                    ]
                )
    markdown = "\n\n".join(
        [
            "### Leader fail-over: chronolock Election vs kazoo Election (seconds from the signal to the next "
            "leader's election, 3 candidates, same machine, same run)",
            markdown_table(["setting", "system", "fault", "rounds", "median s", "min s", "max s", "bound"], table),
            "chronolock: embedded SQLite store, one timesvc, one leasewatch; kazoo: standalone ZooKeeper. "
            + ("" if skipped is None else f"kazoo skipped: {skipped}. ")
            + "See bench/election.py for the settings.",
        ]
    )
    data = {"machine": machine_info(), "rounds": results, "table": table}
    write_results("election", data, markdown)
    return data
