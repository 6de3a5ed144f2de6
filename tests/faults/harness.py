"""The fault harness: real processes on loopback, a seeded nemesis, a merged history.

One :class:`MixedRun` starts, in its own work directory,

* 3 timesvc and 2 leasewatch replicas on one embedded SQLite store (every replica under
  libfaketime with a run-time ``FAKETIME_TIMESTAMP_FILE``, ``+0`` until the nemesis writes to it);
* a TCP proxy (:mod:`tests.faults.proxy`) with one link per (worker, service replica), so a
  partition can cut chosen processes from chosen services;
* lock-client workers (:mod:`tests.faults.worker`): sync, asyncio and ``lockctl run`` drivers; some
  under libfaketime, some under ``fiu-run`` (I/O errors switched on and off with ``fiu-ctrl``);
* a nemesis that plays a schedule drawn up front from a seeded RNG (``CHRONOLOCK_FAULT_SEED``
  replays it; the seed is printed and saved with the schedule), at most ``max_active`` faults at a
  time, every step bounded in count and wall time.

Afterwards it heals everything, lets the workers stop, polls each lock id's status until the store
is empty (or a deadline), merges every process' JSON Lines into ``history.jsonl`` and runs the
checkers. Every process is ours and is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lockclient import FencedResource, RemoteLocker, open_store
from tests.faults.checkers import History, NowStats, Violation, check_all
from tests.faults.recorder import Recorder, merge
from tests.support.procs import BIN, ServiceProcess, clock_file_env, free_port

HERE = Path(__file__).parent
REPO = HERE.parents[1]
NS = 1_000_000_000


def seed_from_env(default: int | None = None) -> int:
    raw = os.environ.get("CHRONOLOCK_FAULT_SEED")
    if raw:
        return int(raw)
    return default if default is not None else random.SystemRandom().randrange(1, 2**31)


@dataclass
class Settings:
    seed: int
    lease: float = 1.5
    scan: float = 0.2
    grace: float = 0.5
    orphan_after: float = 3.0
    max_skew: float = 1.0
    tick: float = 0.5
    locks: tuple[str, ...] = tuple(f"mix:{i}" for i in range(8))
    sync_workers: int = 6
    async_workers: int = 3
    lockctl_workers: int = 1
    """Each ``lockctl run`` costs two interpreter start-ups (~0.5 s of CPU): one driver is enough."""
    faketime_workers: int = 2  # the first N sync/async workers get a run-time clock file
    fiu_workers: int = 1  # the next N sync workers run under fiu-run
    target_acquisitions: int = 10_000
    max_duration: float = 600.0
    nemesis_gap: tuple[float, float] = (0.8, 3.0)
    max_active: int = 2
    fault_weights: dict[str, float] = field(default_factory=dict)
    now_period: float = 1.0
    waker_workers: int = 8
    """Workers that wait through leasewatch's long-poll (the others poll the store): each awaited
    lock costs leasewatch a store poll every 10 ms, the largest CPU cost on a 2-core machine."""
    lockctl_pause: float = 1.0
    slack: float = 2.0
    stall_threshold: float = 0.5
    """A probe of the host (a 50 ms sleep) or of the store (taking its write lock) that takes longer than
    this is recorded as an *observed* fault (``stall``): other work shares this machine, and a stall
    nobody injected delays grants just like one the nemesis injects."""
    nemesis: bool = True
    avoid_known_findings: bool = True
    """Restart a killed timesvc replica only once GlobalTime is being published again (finding 2)."""
    worker_args: tuple[str, ...] = ()

    @property
    def bound(self) -> float:
        """DESIGN.md §7.4: lease + scan + grace, plus slack for the next waiter's wake-up and acquisition."""
        return self.lease + self.scan + self.grace + self.slack


DEFAULT_WEIGHTS = {
    "kill-worker": 2,
    "pause-worker": 3,
    "kill-lockctl": 1,
    "pause-lockctl": 1,
    "kill-timesvc": 1,
    "pause-timesvc": 1,
    "kill-leasewatch": 1,
    "pause-leasewatch": 1,
    "clock-worker": 2,
    "clock-timesvc": 2,
    "clock-leasewatch": 1,
    "partition-worker": 3,
    "store-busy": 2,
    "io-errors": 1,
    "disk-full": 1,
    "readonly-client": 1,
}


FAULT_KINDS = {"store-busy": "busy", "io-errors": "ioerr", "disk-full": "diskfull", "readonly-client": "readonly"}
"""The ``fault`` recorded in the history (the checkers know ``kill`` and ``pause``)."""


RUNAWAY_CLOCK = {"clock-timesvc"}
PUBLISHING_STOPPED = {"store-busy", "disk-full", "pause-timesvc", "kill-timesvc"}
"""Finding 3 (issue 8 finding 8): a replica with a fast clock that sees nobody else publish for 4 ticks adopts
its own clock. With ``avoid_known_findings`` these two groups never overlap in the mix (test_findings.py
replays the combination deterministically)."""


@dataclass
class Step:
    """One entry of the nemesis' schedule: start after ``delay`` seconds, last ``duration``."""

    delay: float
    fault: str
    target: int
    duration: float
    params: dict[str, Any]


def make_schedule(settings: Settings, count: int = 2000) -> list[Step]:
    """The whole schedule from the seed alone, so a seed replays the same faults in the same order."""
    rng = random.Random(settings.seed)
    weights = settings.fault_weights or DEFAULT_WEIGHTS
    names = sorted(weights)
    steps = []
    for _ in range(count):
        fault = rng.choices(names, [weights[n] for n in names])[0]
        delay = rng.uniform(*settings.nemesis_gap)
        target = rng.randrange(1000)
        duration = rng.choice((0.3, 0.8, 1.5, settings.lease + settings.grace + 0.5, 2 * settings.lease + 1))
        params: dict[str, Any] = {}
        if fault.startswith("clock"):
            params["spec"] = rng.choice(("+600s", "-600s", "+3s", "-3s", "+0 x1.5", "+0 x0.5", "+0.5s"))
        elif fault == "partition-worker":
            params["mode"] = rng.choice(("blackhole", "reset", "delay:0.3", "delay:1.5"))
            params["services"] = rng.choice(("t", "lw", "t0", "*"))
        elif fault == "io-errors":
            params["probability"] = rng.choice((0.02, 0.1, 0.5))
        elif fault == "pause-timesvc":
            params["replicas"] = rng.choice((1, 1, 2))  # 2 of 3: a majority away, the third alone serves
        elif fault == "store-busy":
            duration = rng.choice((0.3, 1.0, 3.0, 6.0))  # the store's busy_timeout is 5 s
        steps.append(Step(delay, fault, target, duration, params))
    return steps


class ProxyControl:
    def __init__(self, port: int) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def ask(self, line: str) -> str:
        with self._lock:
            if self._sock is None:
                self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                self._file = self._sock.makefile("rwb")
            self._file.write((line + "\n").encode())
            self._file.flush()
            answer = self._file.readline().decode().strip()
        if answer.startswith("error"):
            raise RuntimeError(f"proxy: {line!r} -> {answer}")
        return answer

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._file.close()
                self._sock.close()
                self._sock = None


@dataclass
class Service:
    role: str  # "timesvc" / "leasewatch"
    index: int
    clock_file: Path
    proc: ServiceProcess | None = None
    generation: int = 0

    @property
    def name(self) -> str:
        return f"{'t' if self.role == 'timesvc' else 'lw'}{self.index}"


@dataclass
class WorkerSlot:
    index: int
    kind: str  # sync / async / lockctl
    clock_file: Path | None
    fiu: bool
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    log: Any = None

    @property
    def name(self) -> str:
        return f"w{self.index}"


CLOCK_RESET = "+0 x1\n"
"""What ends a clock fault. A bare ``+0`` would leave a rate (``x1.5``) in force: libfaketime keeps the
last rate until a spec names another one (seen here: the soak with seed 3476479561 ran a replica 74 s fast
long after its ``+0 x1.5`` fault had "ended")."""


def faketime_env(env: dict[str, str], clock_file: Path) -> dict[str, str]:
    """libfaketime on the process itself, its wall clock read from ``clock_file``: writing ``+600s`` /
    ``+0 x1.5`` / ``+0 x1`` there moves it at run time, within a second (the file is re-read once a
    second: ``FAKETIME_NO_CACHE=1`` re-read it at every clock call, and a serving process makes
    thousands a second — on a loaded machine the skewed processes answered in seconds). The monotonic
    clock stays real (``Event.wait`` needs it); the sitecustomize fixes ``time.sleep``."""
    env = clock_file_env(env, clock_file, initial=CLOCK_RESET.strip())
    env.pop("FAKETIME", None)
    return env


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class MixedRun:
    """A mixed-fault run on the embedded store; see the module docstring."""

    def __init__(self, workdir: Path, settings: Settings) -> None:
        self.workdir = workdir
        self.s = settings
        self.hist = workdir / "history"
        self.hist.mkdir(parents=True, exist_ok=True)
        self.rec = Recorder(self.hist / "harness.jsonl", "harness")
        self.nem = Recorder(self.hist / "nemesis.jsonl", "nemesis")
        self.stop_file = workdir / "stop"
        self.store_dir = workdir / "store"
        self.store_dir.mkdir(exist_ok=True)
        self.tmpfs = False
        self.db = self.store_dir / "cells.db"
        self.store_url = f"sqlite:///{self.db}"
        self.services: list[Service] = []
        self.workers: list[WorkerSlot] = []
        self.proxy: subprocess.Popen[bytes] | None = None
        self.control: ProxyControl | None = None
        self.links: dict[str, str] = {}  # link name -> proxy URL
        self.wall_minus_mono = time.time_ns() - time.monotonic_ns()
        self.faults_injected: Counter[str] = Counter()
        self.fault_errors: list[str] = []
        self._stopping = threading.Event()
        self._revocations_seen: set[tuple[str, str, str]] = set()
        self._lock = threading.RLock()
        self._others: list[subprocess.Popen[bytes]] = []
        self.schedule: list[Step] = []
        self.started_at = 0.0
        self._busy: set[str] = set()
        self._active: dict[str, str] = {}
        self.skipped = 0
        self.stalls: list[float] = []

    # -- processes ---------------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
        env.pop("LD_PRELOAD", None)
        env["CHRONOLOCK_STORE_URL"] = self.store_url
        env["PYTHONPATH"] = str(REPO)
        return env

    def start_service(self, svc: Service) -> None:
        port = free_port()
        svc.generation += 1
        name = f"{svc.name}.{svc.generation}"
        env = self._base_env()
        if svc.role == "timesvc":
            env.update(
                TIMESVC_HOST="127.0.0.1",
                TIMESVC_PORT=str(port),
                TIMESVC_TICK=str(self.s.tick),
                TIMESVC_MAX_SKEW=str(self.s.max_skew),
                TIMESVC_REPLICA_ID=svc.name,
                TIMESVC_SHUTDOWN_GRACE="1",
                TIMESVC_LOG_LEVEL="warning",
            )
            command = [str(BIN / "timesvc"), "serve"]
        else:
            env.update(
                LEASEWATCH_HOST="127.0.0.1",
                LEASEWATCH_PORT=str(port),
                LEASEWATCH_SCAN_INTERVAL=str(self.s.scan),
                LEASEWATCH_GRACE=str(self.s.grace),
                LEASEWATCH_ORPHAN_AFTER=str(self.s.orphan_after),
                LEASEWATCH_REPLICA_ID=svc.name,
                LEASEWATCH_SHUTDOWN_GRACE="1",
                LEASEWATCH_LOG_LEVEL="warning",
            )
            command = [str(BIN / "leasewatch"), "serve"]
        env = faketime_env(env, svc.clock_file)
        svc.proc = ServiceProcess(name, command, env, port, self.workdir / f"{svc.name}.log")
        self.rec.emit("proc_start", name=name, role=svc.role, service_pid=svc.proc.pid, port=port)
        svc.proc.wait_healthy()
        if self.control is not None:
            for link in self.links:
                if link.endswith("/" + svc.name):
                    self.control.ask(f"upstream {link} 127.0.0.1:{port}")

    def start_proxy(self) -> None:
        port = free_port()
        with (self.workdir / "proxy.log").open("ab") as log:
            self.proxy = subprocess.Popen([sys.executable, str(HERE / "proxy.py"), str(port)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the proxy did not start") from None
                time.sleep(0.05)
        self.control = ProxyControl(port)

    def link(self, worker: str, svc: Service) -> str:
        name = f"{worker}/{svc.name}"
        if name not in self.links:
            assert self.control is not None and svc.proc is not None
            port = self.control.ask(f"listen {name} 127.0.0.1:{svc.proc.port}")
            self.links[name] = f"http://127.0.0.1:{port}"
        return self.links[name]

    def start_worker(self, slot: WorkerSlot) -> None:
        slot.generation += 1
        name = f"{slot.name}.{slot.generation}"
        timesvc = [s for s in self.services if s.role == "timesvc"]
        leasewatch = [s for s in self.services if s.role == "leasewatch"]
        env = self._base_env()
        env["CHRONOLOCK_TIMESVC_URLS"] = ",".join(self.link(slot.name, t) for t in timesvc)
        if slot.index % max(1, len(self.workers) // max(1, self.s.waker_workers)) == 0:
            env["CHRONOLOCK_LEASEWATCH_URL"] = self.link(slot.name, leasewatch[0])
        env["CHRONOLOCK_LEASE"] = str(self.s.lease)
        env["CHRONOLOCK_HTTP_TIMEOUT"] = "1.0"
        if slot.clock_file is not None:
            env = faketime_env(env, slot.clock_file)
        command = [sys.executable, str(HERE / "worker.py"), name, "--history", str(self.hist)]
        command += ["--kind", slot.kind, "--locks", ",".join(self.s.locks), "--stop-file", str(self.stop_file)]
        command += ["--seed", str(self.s.seed * 1000 + slot.index * 10 + slot.generation)]
        command += ["--duration", str(self.s.max_duration + 30), "--now-period", str(self.s.now_period)]
        command += ["--now-urls", ",".join(self.link(slot.name, t) for t in timesvc)]
        command += ["--long-hold", str(self.s.lease + 0.5)]
        if slot.kind == "lockctl":
            command += ["--hold", "0.05", "--long-hold-p", "0.05", "--lockctl-pause", str(self.s.lockctl_pause)]
        command += list(self.s.worker_args)
        if slot.fiu:
            command = ["fiu-run", "-x", *command]
        if slot.log is None:
            slot.log = (self.workdir / f"{slot.name}.log").open("ab")
        slot.proc = subprocess.Popen(command, env=env, stdout=slot.log, stderr=subprocess.STDOUT)
        self.rec.emit("proc_start", name=name, role=slot.kind, worker_pid=slot.proc.pid)

    def setup(self) -> None:
        self.maybe_tmpfs()
        for i in range(3):
            self.services.append(Service("timesvc", i, self.workdir / f"clock-t{i}"))
        for i in range(2):
            self.services.append(Service("leasewatch", i, self.workdir / f"clock-lw{i}"))
        for svc in self.services:
            self.start_service(svc)
        for svc in self.services:
            assert svc.proc is not None
            svc.proc.wait_ready()
        self.start_proxy()
        kinds = ["sync"] * self.s.sync_workers + ["async"] * self.s.async_workers
        kinds += ["lockctl"] * self.s.lockctl_workers
        fiu_left = self.s.fiu_workers if shutil.which("fiu-run") else 0
        for i, kind in enumerate(kinds):
            clock = self.workdir / f"clock-w{i}" if i < self.s.faketime_workers and kind != "lockctl" else None
            fiu = clock is None and kind == "sync" and fiu_left > 0
            fiu_left -= fiu
            self.workers.append(WorkerSlot(i, kind, clock, fiu))
        for slot in self.workers:
            self.start_worker(slot)

    def maybe_tmpfs(self) -> None:
        """Put the store on a 64 MiB tmpfs of its own so the nemesis can fill the disk."""
        if os.geteuid() != 0:
            return
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(self.store_dir)], capture_output=True, check=False
        )
        self.tmpfs = done.returncode == 0

    # -- faults ------------------------------------------------------------------------------------

    def pick(self, items: list[Any], target: int) -> Any:
        return items[target % len(items)]

    def _fault(self, step: Step, target: str, pids: list[int], **params: Any) -> str:
        fid = f"f{self.faults_injected.total() + 1}"
        self.faults_injected[step.fault] += 1
        with self._lock:
            self._active[fid] = step.fault
        kind = FAULT_KINDS.get(step.fault, step.fault.split("-")[0])
        self.nem.emit("fault_start", fid=fid, fault=kind, name=step.fault, target=target,
                      pids=pids, params={**step.params, **params, "duration": step.duration})  # fmt: skip
        return fid

    def _end(self, fid: str, **fields: Any) -> None:
        self.nem.emit("fault_end", fid=fid, **fields)
        with self._lock:
            self._active.pop(fid, None)

    def _global_time_stale(self) -> bool:
        """Whether GlobalTime may be going stale now: the store refuses writes, or timesvc replicas are
        paused or down. A replica started then serves stale time (finding 2 of tests/faults/README.md)."""
        with self._lock:
            return any(
                name in ("store-busy", "disk-full", "pause-timesvc", "kill-timesvc") for name in self._active.values()
            )

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def run_step(self, step: Step) -> None:  # noqa: PLR0911 - one branch per fault kind
        kind = step.fault
        if kind in ("kill-worker", "pause-worker"):
            slot: WorkerSlot = self.pick(self.workers, step.target)
            if slot.proc is None or slot.proc.poll() is not None:
                return
            pids = [slot.proc.pid, *self._descendants(slot.proc.pid)]
            if kind == "kill-worker":
                fid = self._fault(step, slot.name, pids)
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                slot.proc.wait(timeout=10)
                self._wait(step.duration)
                if not self._stopping.is_set():
                    self.start_worker(slot)
                self._end(fid)
            else:
                self._pause(step, slot.name, [slot.proc.pid])
            return
        if kind in ("kill-lockctl", "pause-lockctl"):
            drivers = [w for w in self.workers if w.kind == "lockctl" and w.proc is not None]
            if not drivers:
                return
            slot = self.pick(drivers, step.target)
            assert slot.proc is not None
            supervisors = children(slot.proc.pid)
            if not supervisors:
                return
            if kind == "kill-lockctl":
                fid = self._fault(step, "lockctl", supervisors)
                for pid in supervisors:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                self._end(fid)
            else:
                self._pause(step, "lockctl", supervisors)
            return
        if kind in ("kill-timesvc", "pause-timesvc", "kill-leasewatch", "pause-leasewatch"):
            role = kind.split("-")[1]
            svc: Service = self.pick([s for s in self.services if s.role == role], step.target)
            assert svc.proc is not None
            if kind.startswith("kill"):
                if role == "leasewatch":
                    self.poll_revocations()
                fid = self._fault(step, f"{role}:{svc.name}", [svc.proc.pid])
                svc.proc.kill()
                svc.proc.stop()  # closes its log
                self._wait(step.duration)
                if role == "timesvc" and self.s.avoid_known_findings:
                    with self._lock:
                        self._active.pop(fid, None)  # our own kill does not count
                    deadline = time.monotonic() + 60
                    while self._global_time_stale() and time.monotonic() < deadline:
                        time.sleep(0.05)
                self.start_service(svc)
                self._end(fid)
            else:
                group = [s for s in self.services if s.role == role]
                count = min(int(step.params.get("replicas", 1)), len(group))
                first = group.index(svc)
                chosen = [group[(first + i) % len(group)] for i in range(count)]
                pids = [s.proc.pid for s in chosen if s.proc is not None]
                self._pause(step, f"{role}:{'+'.join(s.name for s in chosen)}", pids)
            return
        if kind in ("clock-worker", "clock-timesvc", "clock-leasewatch"):
            if kind == "clock-worker":
                slots = [w for w in self.workers if w.clock_file is not None and w.proc is not None]
                if not slots:
                    return
                slot = self.pick(slots, step.target)
                assert slot.clock_file is not None and slot.proc is not None
                target, clock_file, pids = slot.name, slot.clock_file, [slot.proc.pid]
            else:
                role = kind.split("-")[1]
                svc = self.pick([s for s in self.services if s.role == role], step.target)
                assert svc.proc is not None
                target, clock_file, pids = f"{role}:{svc.name}", svc.clock_file, [svc.proc.pid]
            fid = self._fault(step, target, pids)
            clock_file.write_text(step.params["spec"] + "\n")
            self._wait(step.duration)
            clock_file.write_text(CLOCK_RESET)
            self._end(fid)
            return
        if kind == "partition-worker":
            slot = self.pick(self.workers, step.target)
            assert self.control is not None
            prefix = f"{slot.name}/" + ("" if step.params["services"] == "*" else step.params["services"])
            pids = [slot.proc.pid] if slot.proc is not None else []
            fid = self._fault(step, slot.name, pids, links=prefix)
            self.control.ask(f"mode {prefix} {step.params['mode']}")
            self._wait(step.duration)
            self.control.ask(f"mode {prefix} pass")
            self._end(fid)
            return
        if kind == "store-busy":
            fid = self._fault(step, "store", [])
            conn = sqlite3.connect(self.db, timeout=10, isolation_level=None)
            try:
                conn.execute("BEGIN EXCLUSIVE")
                self.nem.emit("note", fid=fid, note="store locked (BEGIN EXCLUSIVE)")
                self._wait(step.duration)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self.fault_errors.append(f"store-busy: {exc}")
            finally:
                conn.close()
                self._end(fid)
            return
        if kind == "io-errors":
            slots = [w for w in self.workers if w.fiu and w.proc is not None]
            if not slots:
                return
            slot = self.pick(slots, step.target)
            assert slot.proc is not None
            pid = slot.proc.pid
            spec = f"enable_random name=posix/io/rw/pwrite,probability={step.params['probability']}"
            fid = self._fault(step, slot.name, [pid])
            ok = subprocess.run(["fiu-ctrl", "-c", spec, str(pid)], capture_output=True, check=False)
            if ok.returncode != 0:
                self.fault_errors.append(f"fiu-ctrl enable: {ok.stderr.decode()[:200]}")
            self._wait(step.duration)
            subprocess.run(["fiu-ctrl", "-c", "disable name=posix/io/rw/pwrite", str(pid)], capture_output=True,
                           check=False)  # fmt: skip
            self._end(fid)
            return
        if kind == "disk-full":
            if not self.tmpfs:
                return
            fid = self._fault(step, "store", [])
            ballast = self.store_dir / "ballast"
            try:
                with ballast.open("wb") as f:
                    block = b"\0" * (1 << 20)
                    with contextlib.suppress(OSError):
                        while True:
                            f.write(block)
                            f.flush()
                self._wait(step.duration)
            finally:
                ballast.unlink(missing_ok=True)
                self._end(fid)
            return
        if kind == "readonly-client":
            self.readonly_client(step)
            return
        raise ValueError(f"unknown fault {kind!r}")

    def _descendants(self, pid: int) -> list[int]:
        out = []
        for child in children(pid):
            out.append(child)
            out.extend(self._descendants(child))
        return out

    def _pause(self, step: Step, target: str, pids: list[int]) -> None:
        fid = self._fault(step, target, pids)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        try:
            self._wait(step.duration)
        finally:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
            self._end(fid)

    def readonly_client(self, step: Step) -> None:
        """A client whose view of the store is read-only (its own mount namespace with a read-only
        bind mount): every acquisition must fail with a clear error, never report "acquired"."""
        if not shutil.which("unshare"):
            return
        d = str(self.store_dir)
        name = f"ro{self.faults_injected['readonly-client'] + 1}"
        fid = self._fault(step, name, [])
        env = self._base_env()
        env["CHRONOLOCK_LEASE"] = str(self.s.lease)
        script = (
            f"mount --bind {d} {d} && mount -o remount,bind,ro {d} && exec {sys.executable} {HERE / 'worker.py'} "
            f"{name} --history {self.hist} --kind sync --locks {','.join(self.s.locks)} --stop-file "
            f"{self.stop_file} --max-ops 5 --timeout 1 --seed {step.target}"
        )
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        self._end(fid, exit=done.returncode, stderr=done.stderr.decode(errors="replace")[-300:])

    # -- the run -----------------------------------------------------------------------------------

    def poll_revocations(self) -> None:
        with self._lock, httpx.Client(timeout=2.0) as http:
            for svc in self.services:
                if svc.role != "leasewatch" or svc.proc is None or svc.proc.proc.poll() is not None:
                    continue
                try:
                    events = http.get(f"{svc.proc.url}/revocations").json()
                except (httpx.HTTPError, ValueError):
                    continue
                for e in events:
                    key = (e["owner"], e["lock_id"], str(e["at"]))
                    if key not in self._revocations_seen:
                        self._revocations_seen.add(key)
                        self.rec.emit("revocation", owner=e["owner"], lock=e["lock_id"], by=e["by"],
                                      unchanged_for=e["unchanged_for_s"], holder=e["holder"], at=e["at"])  # fmt: skip

    def acquisitions_so_far(self, offsets: dict[Path, int], count: list[int]) -> int:
        """Grants recorded so far (read incrementally: each file from where the last call stopped)."""
        for path in self.hist.glob("w*.jsonl"):
            with path.open("rb") as f:
                f.seek(offsets.get(path, 0))
                data = f.read()
            cut = data.rfind(b"\n") + 1
            offsets[path] = offsets.get(path, 0) + cut
            for line in data[:cut].splitlines():
                if b'"type":"cmd_start"' in line or (
                    b'"type":"ok"' in line and b'"op":"acquire"' in line and b'"mode":"lockctl"' not in line
                ):
                    count[0] += 1
        return count[0]

    def stall_monitor(self) -> None:
        """Record host and store stalls nobody injected, as ``stall`` faults (see ``stall_threshold``)."""
        conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        n = 0
        try:
            while not self._stopping.is_set():
                n += 1
                started = time.monotonic_ns()
                self._stopping.wait(0.05)
                host = (time.monotonic_ns() - started) / 1e9 - 0.05
                store = 0.0
                if not self._injected_store_fault():
                    probe = time.monotonic_ns()
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                    store = (time.monotonic_ns() - probe) / 1e9
                worst = max(host, store)
                if worst > self.s.stall_threshold and not self._injected_store_fault():
                    fid = f"stall{n}"
                    self.nem.emit("fault_start", fid=fid, fault="stall", name="observed-stall", target="*",
                                  pids=[], params={"host_s": round(host, 3), "store_s": round(store, 3)},
                                  t_start=started)  # fmt: skip
                    self.nem.emit("fault_end", fid=fid)
                    self.stalls.append(worst)
        finally:
            conn.close()

    def _injected_store_fault(self) -> bool:
        with self._lock:
            return any(name in ("store-busy", "disk-full") for name in self._active.values())

    def nemesis(self) -> None:
        active: list[threading.Thread] = []
        for step in self.schedule:
            if self._stopping.wait(step.delay):
                break
            active = [t for t in active if t.is_alive()]
            while len(active) >= self.s.max_active and not self._stopping.is_set():
                active[0].join(timeout=0.1)
                active = [t for t in active if t.is_alive()]
            if self._stopping.is_set():
                break
            thread = threading.Thread(target=self._safe_step, args=(step,), daemon=True)
            thread.start()
            active.append(thread)
        for t in active:
            t.join(timeout=60)

    def _safe_step(self, step: Step) -> None:
        # One fault of each kind at a time: two concurrent kills of one service would each start a
        # replacement, and the first replacement would outlive the run. Different kinds mix freely.
        family = step.fault
        with self._lock:
            conflicting = self.s.avoid_known_findings and any(
                {step.fault, other} & RUNAWAY_CLOCK and {step.fault, other} & PUBLISHING_STOPPED for other in self._busy
            )
            if family in self._busy or conflicting:
                self.skipped += 1
                return
            self._busy.add(family)
        try:
            self.run_step(step)
        except Exception as exc:  # a harness problem: report it, keep the run going
            self.fault_errors.append(f"{step.fault}: {exc!r}")
        finally:
            with self._lock:
                self._busy.discard(family)

    def run(self) -> None:
        self.schedule = make_schedule(self.s) if self.s.nemesis else []
        (self.workdir / "schedule.json").write_text(
            json.dumps({"seed": self.s.seed, "steps": [s.__dict__ for s in self.schedule[:500]]}, indent=1)
        )
        self.rec.emit("run_start", seed=self.s.seed, wall_minus_mono=self.wall_minus_mono, settings=str(self.s))
        self.started_at = time.monotonic()
        nemesis = threading.Thread(target=self.nemesis, daemon=True)
        nemesis.start()
        monitor = threading.Thread(target=self.stall_monitor, daemon=True)
        monitor.start()
        offsets: dict[Path, int] = {}
        count = [0]
        deadline = self.started_at + self.s.max_duration
        last_poll = 0.0
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if time.monotonic() - last_poll > 1.0:
                self.poll_revocations()
                last_poll = time.monotonic()
            if self.acquisitions_so_far(offsets, count) >= self.s.target_acquisitions:
                break
            for slot in self.workers:  # a worker that died by itself is a harness failure: restart it
                if slot.proc is not None and slot.proc.poll() not in (None, -9):
                    self.fault_errors.append(f"{slot.name} exited with {slot.proc.returncode}")
                    self.start_worker(slot)
        self.rec.emit("nemesis_stop", acquisitions=count[0])
        self._stopping.set()
        nemesis.join(timeout=90)
        monitor.join(timeout=60)
        self.heal()
        self.stop_file.touch()
        for slot in self.workers:
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.fault_errors.append(f"{slot.name} did not stop: killed")
                    slot.proc.kill()
                    slot.proc.wait()
                self.rec.emit("proc_exit", proc=slot.name, pid=slot.proc.pid, code=slot.proc.returncode)
        self.poll_revocations()
        self.final_state()
        self.poll_revocations()

    def heal(self) -> None:
        if self.control is not None:
            self.control.ask("mode w pass")
        for svc in self.services:
            svc.clock_file.write_text(CLOCK_RESET)
            if svc.proc is not None:
                svc.proc.signal(signal.SIGCONT)
        for slot in self.workers:
            if slot.clock_file is not None:
                slot.clock_file.write_text(CLOCK_RESET)
            if slot.proc is not None and slot.proc.poll() is None:
                for pid in [slot.proc.pid, *self._descendants(slot.proc.pid)]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)
                if slot.fiu:
                    subprocess.run(["fiu-ctrl", "-c", "disable name=posix/io/rw/pwrite", str(slot.proc.pid)],
                                   capture_output=True, check=False)  # fmt: skip

    def final_state(self) -> None:
        """Poll each lock id until holders, queue and leases are empty, within a bound."""
        waited_from = time.monotonic()
        limit = self.s.lease + self.s.scan + self.s.grace + self.s.orphan_after + 10.0
        with open_store(self.store_url) as store, RemoteLocker(store, lease=self.s.lease) as locker:
            for lock_id in self.s.locks:
                while True:
                    st = locker.status(lock_id)
                    empty = not st.holders and not st.queue and not st.leases
                    if empty or time.monotonic() - waited_from > limit:
                        break
                    time.sleep(0.1)
                self.rec.emit(
                    "final", lock=lock_id, holders=st.holders, queue=[q.owner for q in st.queue],
                    leases=sorted(st.leases), waited_s=round(time.monotonic() - waited_from, 3),
                    fencing_token=st.fencing_token,
                )  # fmt: skip
                highest = FencedResource(store, f"res:{lock_id}").highest_token()
                self.rec.emit("resource_final", lock=lock_id, highest=highest)

    def close(self) -> None:
        self._stopping.set()
        for slot in self.workers:
            if slot.proc is not None and slot.proc.poll() is None:
                for pid in [*self._descendants(slot.proc.pid), slot.proc.pid]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                slot.proc.wait(timeout=10)
            if slot.log is not None:
                slot.log.close()
        for svc in self.services:
            if svc.proc is not None:
                svc.proc.stop()
        if self.control is not None:
            self.control.close()
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait(timeout=10)
        self.rec.close()
        self.nem.close()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.store_dir)], capture_output=True, check=False)

    # -- results -----------------------------------------------------------------------------------

    def check(self) -> Report:
        events = merge(self.hist, self.workdir / "history.jsonl")
        h = History(events)
        violations, now_stats = check_all(
            h, bound=self.s.bound, max_skew=self.s.max_skew, wall_minus_mono_ns=self.wall_minus_mono
        )
        return Report.build(self, h, violations, now_stats)


@dataclass
class Report:
    seed: int
    acquisitions: int
    attempts: int
    indeterminate: int
    failed_by_error: dict[str, int]
    faults: dict[str, int]
    fault_errors: list[str]
    violations: list[Violation]
    revocation_s: list[float]
    now: NowStats
    duration_s: float
    skipped: int
    stalls: list[float]
    writes: int
    stale_writes: int
    history: Path
    handed_over: int = 0
    """Grants handed over by a release (issue 27), judged for FIFO by the releaser's read."""

    @classmethod
    def build(cls, run: MixedRun, h: History, violations: list[Violation], now: NowStats) -> Report:
        acq = h.acquisitions
        revocations = [float(e["unchanged_for"]) for e in h.events if e["type"] == "revocation" and e["unchanged_for"]]
        writes = [e for e in h.events if e["type"] == "ok" and e.get("op") == "write"]
        return cls(
            seed=run.s.seed,
            acquisitions=sum(1 for a in acq if a.outcome == "ok"),
            attempts=len(acq),
            indeterminate=sum(1 for a in acq if a.outcome == "info")
            + sum(1 for e in h.events if e["type"] == "info" and e.get("op") != "acquire"),
            failed_by_error=dict(Counter(a.error.split(":")[0][:40] for a in acq if a.outcome == "fail")),
            faults=dict(run.faults_injected),
            fault_errors=run.fault_errors,
            violations=violations,
            revocation_s=sorted(revocations),
            now=now,
            duration_s=time.monotonic() - run.started_at,
            skipped=run.skipped,
            stalls=sorted(run.stalls),
            writes=sum(1 for e in writes if e.get("result") == "ok"),
            stale_writes=sum(1 for e in writes if e.get("result") == "stale"),
            history=run.workdir / "history.jsonl",
            handed_over=sum(1 for e in h.events if e["type"] == "ok" and "handed_look" in e),
        )

    def revocation_summary(self) -> str:
        r = self.revocation_s
        if not r:
            return "none"
        q = statistics.quantiles(r, n=20) if len(r) >= 2 else [r[0]] * 19
        return f"n={len(r)} min {r[0]:.2f}s p50 {statistics.median(r):.2f}s p95 {q[18]:.2f}s max {r[-1]:.2f}s"

    def text(self) -> str:
        by_checker = Counter(v.checker for v in self.violations)
        lines = [
            f"seed {self.seed} (replay: CHRONOLOCK_FAULT_SEED={self.seed})",
            f"acquisitions {self.acquisitions} of {self.attempts} attempts; indeterminate ops {self.indeterminate}; "
            f"failed attempts {self.failed_by_error}",
            f"fenced writes accepted {self.writes}, refused stale {self.stale_writes}; hand-overs judged for FIFO "
            f"by the releaser's read: {self.handed_over}",
            f"faults injected {sum(self.faults.values())} (skipped {self.skipped}: one of that kind still running): "
            f"{dict(sorted(self.faults.items()))}; observed (not injected) host/store stalls: {len(self.stalls)}"
            + (f", longest {self.stalls[-1]:.2f}s" if self.stalls else ""),
            f"revocations (unchanged for, as leasewatch saw it): {self.revocation_summary()}",
            f"/now reads {self.now.reads} ({self.now.failed} failed); max offset to real time "
            f"{self.now.max_outside_s:.3f}s outside its read window (bounds with the read's latency: "
            f"{self.now.max_ahead_s:.3f}s ahead, {self.now.max_behind_s:.3f}s behind)",
            f"ticket order vs /now: {self.now.tickets_within_disagreement} deviations within one /now round "
            f"trip (replicas' disagreement); largest {self.now.max_ticket_deviation_s:.3f}s",
            f"violations {len(self.violations)} {dict(by_checker)}",
            f"run time {self.duration_s:.1f}s; history {self.history}",
        ]
        if self.fault_errors:
            lines.append(f"harness notes: {self.fault_errors[:10]}")
        for v in self.violations[:20]:
            lines.append(f"  {v}")
        return "\n".join(lines)
