"""What every benchmark shares: timesvc processes stopped by PID, percentiles, output files.

Processes are started on 127.0.0.1 only and always stopped by the PID we started
(SIGTERM, then SIGKILL), in ``finally`` blocks — never by name.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "Fleet",
    "ServiceProcess",
    "TimesvcProcess",
    "cpu_seconds",
    "free_port",
    "machine_info",
    "markdown_table",
    "percentile",
    "rss_kib",
    "system_busy_seconds",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def rss_kib(pid: int, field: str = "VmRSS") -> int | None:
    """VmRSS (or another /proc status field such as VmHWM, the peak) of a process in KiB, or None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc/<pid>/stat), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat), to see what else loaded the machine."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait.
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted data; NaN for no data."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _http_get_json(url: str, timeout: float = 1.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our own loopback server
        return json.loads(response.read())


class ServiceProcess:
    """One ``timesvc serve`` or ``leasewatch serve`` on 127.0.0.1 with a free port, logging to a file."""

    def __init__(
        self,
        service: str,
        name: str,
        store_url: str,
        log_dir: Path,
        settings: dict[str, str],
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """``extra_env``: more environment variables (e.g. libfaketime's), set last."""
        self.name = name
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        prefix = service.upper()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMESVC_", "LEASEWATCH_", "CHRONOLOCK_"))}
        env.update(
            {
                "CHRONOLOCK_STORE_URL": store_url,
                f"{prefix}_HOST": HOST,
                f"{prefix}_PORT": str(self.port),
                f"{prefix}_REPLICA_ID": name,
                f"{prefix}_SHUTDOWN_GRACE": "1",
                # One log line per request would be measured too; keep warnings only.
                f"{prefix}_LOG_LEVEL": "warning",
                **{f"{prefix}_{k}": v for k, v in settings.items()},
            }
        )
        env.update(extra_env or {})
        self._log = self.log_path.open("ab")
        # The interpreter itself (not a console-script shim), so self.pid is the server.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"{service}.cli", "serve"], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        data: dict[str, Any] = _http_get_json(f"{self.url}/status", timeout)
        return data

    def metrics(self, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=timeout) as response:  # noqa: S310 - loopback
            text: str = response.read().decode()
            return text

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1.0) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become ready in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it does not exit within 10 s."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()


TimesvcProcess = ServiceProcess


class Fleet:
    """Every process one benchmark started; :meth:`stop_all` stops each by its PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[ServiceProcess] = []

    def timesvc(
        self,
        store_url: str,
        name: str,
        *,
        tick: float = 0.5,
        replicas: int = 1,
        extra_env: dict[str, str] | None = None,
        log_level: str = "warning",
    ) -> ServiceProcess:
        settings = {"TICK": str(tick), "REPLICAS": str(replicas), "LOG_LEVEL": log_level}
        proc = ServiceProcess("timesvc", name, store_url, self.log_dir, settings, extra_env)
        self.processes.append(proc)
        return proc

    def leasewatch(
        self,
        store_url: str,
        name: str,
        *,
        scan_interval: float = 1.0,
        settings: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        """``settings``: more ``LEASEWATCH_*`` variables, without the prefix."""
        proc = ServiceProcess(
            "leasewatch",
            name,
            store_url,
            self.log_dir,
            {"SCAN_INTERVAL": str(scan_interval), **(settings or {})},
            extra_env,
        )
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        errors: list[BaseException] = []
        for proc in self.processes:
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self.processes.clear()
        if errors:
            raise errors[0]


@contextmanager
def fleet(log_dir: Path) -> Iterator[Fleet]:
    f = Fleet(log_dir)
    try:
        yield f
    finally:
        f.stop_all()


def machine_info() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m_at_start": round(load[0], 2),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "–"
            return f"{value:.3g}" if abs(value) < 10 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, data: dict[str, Any], markdown: str) -> None:
    """``bench/results/<name>.json`` (raw numbers) and ``<name>.md`` (the tables); print the tables."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (RESULTS_DIR / f"{name}.md").write_text(markdown.rstrip() + "\n")
    print(markdown, flush=True)
    print(f"\n(wrote {RESULTS_DIR / name}.json and .md)\n", flush=True)
