"""One version, from pyproject.toml through the installed metadata to every place that reports it."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lockclient.version import __version__
from tests.support.procs import BIN, Fleet

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_pyprojects() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert __version__ == declared


def test_every_command_prints_it() -> None:
    for program in ("lockctl", "timesvc", "leasewatch"):
        done = subprocess.run(
            [str(BIN / program), "--version"], check=False, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{program} {__version__}\n"


def _build_info(metrics_text: str) -> dict[str, str]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "chronolock_build_info":
            (sample,) = family.samples
            assert sample.name == "chronolock_build_info"
            assert sample.value == 1
            return sample.labels
    raise AssertionError("no chronolock_build_info in /metrics")


def test_the_services_report_it_in_status_metrics_and_openapi(processes: Fleet, sqlite_url: str) -> None:
    timesvc = processes.timesvc(sqlite_url)
    leasewatch = processes.leasewatch(sqlite_url)
    for service, component in ((timesvc, "timesvc"), (leasewatch, "leasewatch")):
        service.wait_ready()
        status = httpx.get(f"{service.url}/status", timeout=5).json()
        assert status["version"] == __version__
        labels = _build_info(httpx.get(f"{service.url}/metrics", timeout=5).text)
        assert labels["component"] == component
        assert labels["version"] == __version__
        assert httpx.get(f"{service.url}/openapi.json", timeout=5).json()["info"]["version"] == __version__
    lw_status = httpx.get(f"{leasewatch.url}/status", timeout=5).json()
    assert lw_status["ready"] is True
    assert lw_status["last_scan_ok"] is True
    assert lw_status["locks"] == 0
