"""Real service processes for tests: started on 127.0.0.1, stopped by the PID we started.

Clock skew uses libfaketime the way shared/TESTING.md prescribes: LD_PRELOAD on the
process itself (never the `faketime` wrapper, whose PID is not the server's),
FAKETIME_DONT_FAKE_MONOTONIC=1, and a sitecustomize that fixes time.sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
FAKETIME_SITE = Path(__file__).parent / "faketime_site"
STARTUP_WAIT_S = 90.0
"""How long a test waits for a service it started to answer (a wait, not a measurement)."""
_LIBFAKETIME_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
]


def libfaketime() -> str:
    for path in _LIBFAKETIME_CANDIDATES:
        if os.path.exists(path):
            return path
    found = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=False).stdout
    for line in found.splitlines():
        if line.endswith("/libfaketime.so.1"):
            return line
    raise RuntimeError("libfaketime is not installed: `make test` installs Debian's faketime package")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServiceProcess:
    """One service process (``timesvc serve`` or ``leasewatch serve``) we started."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    # Starting a service is waited for, never timed: at load ~40 (a fresh-clone run beside
    # stress-ng, a ring and other tests) importing FastAPI and uvicorn alone took over 20 s.
    def wait_healthy(self, timeout: float = STARTUP_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become healthy in {timeout}s:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = STARTUP_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become ready in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def service_env(extra: dict[str, str], *, skew: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
    env.update(extra)
    if skew is not None:
        env["LD_PRELOAD"] = libfaketime()
        env["FAKETIME"] = skew
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKETIME_SITE), env.get("PYTHONPATH", "")]))
    return env


def clock_file_env(extra: dict[str, str], clock_file: Path, *, initial: str = "+0 x1") -> dict[str, str]:
    """``extra`` plus libfaketime on the process itself, its wall clock read from ``clock_file``
    (write ``+600s``, ``-60s``, ``+0 x1.6`` or an absolute time — frozen — there at run time).

    The file is re-read at most once a second (``FAKETIME_CACHE_DURATION=1``), not at every call
    (``FAKETIME_NO_CACHE=1``): that opens and reads the file at each of the thousands of clock
    calls a serving process makes per second, and on a loaded machine (load ~20) it made the skewed
    replica answer in seconds. A change takes effect within about a second. The monotonic clock
    stays real; the sitecustomize fixes ``time.sleep``. ``initial`` is written first; end a rate
    with ``+0 x1`` (a bare ``+0`` keeps the last rate)."""
    clock_file.write_text(initial + "\n")
    env = dict(extra)
    env["LD_PRELOAD"] = libfaketime()
    env["FAKETIME_TIMESTAMP_FILE"] = str(clock_file)
    env["FAKETIME_CACHE_DURATION"] = "1"
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(FAKETIME_SITE), extra.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))])
    )
    return env


class Fleet:
    """Processes started by one test; all stopped at the end, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[ServiceProcess] = []

    def timesvc(
        self,
        store_url: str,
        *,
        name: str | None = None,
        skew: str | None = None,
        tick: float = 0.5,
        max_skew: float = 1.0,
        replicas: int = 1,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        port = free_port()
        name = name or f"timesvc-{len(self.processes)}"
        env = service_env(
            {
                "CHRONOLOCK_STORE_URL": store_url,
                "TIMESVC_HOST": "127.0.0.1",
                "TIMESVC_PORT": str(port),
                "TIMESVC_TICK": str(tick),
                "TIMESVC_MAX_SKEW": str(max_skew),
                "TIMESVC_REPLICAS": str(replicas),
                "TIMESVC_REPLICA_ID": name,
                "TIMESVC_SHUTDOWN_GRACE": "1",
                **(env or {}),
            },
            skew=skew,
        )
        proc = ServiceProcess(name, [str(BIN / "timesvc"), "serve"], env, port, self.workdir / f"{name}.log")
        self.processes.append(proc)
        if wait:
            proc.wait_healthy()
        return proc

    def leasewatch(
        self,
        store_url: str,
        *,
        name: str | None = None,
        scan_interval: float = 0.2,
        grace: float = 0.5,
        orphan_after: float = 3.0,
        partition_lease: float = 2.0,
        admin_token: str | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        """``partition_lease`` is short by default (tests use short lock leases): a replica killed
        without a clean shutdown hands its partitions over after it + grace."""
        port = free_port()
        name = name or f"leasewatch-{len(self.processes)}"
        extra = {
            "CHRONOLOCK_STORE_URL": store_url,
            "LEASEWATCH_HOST": "127.0.0.1",
            "LEASEWATCH_PORT": str(port),
            "LEASEWATCH_SCAN_INTERVAL": str(scan_interval),
            "LEASEWATCH_GRACE": str(grace),
            "LEASEWATCH_ORPHAN_AFTER": str(orphan_after),
            "LEASEWATCH_PARTITION_LEASE": str(partition_lease),
            "LEASEWATCH_REPLICA_ID": name,
            "LEASEWATCH_SHUTDOWN_GRACE": "1",
        }
        if admin_token is not None:
            extra["LEASEWATCH_ADMIN_TOKENS"] = admin_token
        extra.update(env or {})
        proc = ServiceProcess(
            name, [str(BIN / "leasewatch"), "serve"], service_env(extra), port, self.workdir / f"{name}.log"
        )
        self.processes.append(proc)
        if wait:
            proc.wait_healthy()
        return proc

    def python(self, name: str, args: list[str], env: dict[str, str], *, skew: str | None = None) -> ServiceProcess:
        """Any Python program (an actor holding or waiting for a lock); no port."""
        proc = ServiceProcess(
            name, [sys.executable, *args], service_env(env, skew=skew), 0, self.workdir / f"{name}.log"
        )
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.processes:
            proc.stop()


@contextmanager
def fleet(workdir: Path) -> Iterator[Fleet]:
    f = Fleet(workdir)
    try:
        yield f
    finally:
        f.stop_all()
