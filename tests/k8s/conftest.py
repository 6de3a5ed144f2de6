"""Offline proof of the Kubernetes manifests and the Dockerfile (issue 5).

Every tool runs as a subprocess (never imported: pytest turns warnings into
errors, and checkov is noisy). The linters come from the virtualenv's bin
directory; ``kubectl`` (with its built-in kustomize) from PATH. A missing tool
fails the tests with a clear message: it never skips them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
BIN = Path(sys.executable).parent
OVERLAYS = ("dev", "prod")
NAMESPACE = "chronolock"
# Oldest Kubernetes minor the manifests support (kubernetes-validate -k).
OLDEST_KUBERNETES = "1.28.0"

# Secrets the prod overlay expects to exist in the namespace (created by the
# operator or External Secrets, k8s/README.md), with the keys the pods read.
# The dev overlay generates them; rendered Secrets are checked directly.
EXTERNAL_SECRETS: dict[str, dict[str, frozenset[str]]] = {
    # dev turns TLS off, so its (optional) certificate Secrets need not exist.
    "dev": {
        "cassandra-tls": frozenset({"tls.crt", "tls.key", "ca.crt"}),
        "chronolock-cassandra-client-tls": frozenset({"tls.crt", "tls.key", "ca.crt"}),
    },
    "prod": {
        "cassandra-credentials": frozenset({"username", "password"}),
        "cassandra-schema-credentials": frozenset({"username", "password"}),
        "leasewatch-admin": frozenset({"tokens"}),
        "chronolock-read-token": frozenset({"token"}),
        "cassandra-tls": frozenset({"tls.crt", "tls.key", "ca.crt"}),
        "chronolock-cassandra-client-tls": frozenset({"tls.crt", "tls.key", "ca.crt"}),
    },
}

# Environment for the tools: nothing may reach the network.
TOOL_ENV = {
    **os.environ,
    "BC_SKIP_MAPPING": "TRUE",  # checkov: no guideline mapping download
    "LOG_LEVEL": "WARNING",  # checkov: quiet logging
    "PYTHONWARNINGS": "ignore",
}


def venv_tool(name: str) -> Path:
    """A console script installed in the test virtualenv; fail (not skip) if it is missing."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: run `pip install -e '.[dev]'` (it is a dev dependency)")
    return path


def kubectl() -> str:
    """kubectl with its built-in kustomize; fail with a clear message if it is not on PATH."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: it renders the Kustomize overlays (kubectl kustomize); install it")
    return path


def run(cmd: Sequence[str | Path], *, timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run a tool with a bound on its runtime; the caller asserts on the result."""
    try:
        return subprocess.run(
            [str(part) for part in cmd],
            cwd=cwd,
            env=TOOL_ENV,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd[0]} did not finish within {timeout} s: {exc}")


def report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@dataclass(frozen=True)
class Rendered:
    """One overlay rendered by ``kubectl kustomize``."""

    overlay: str
    text: str
    path: Path
    docs: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if doc["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.overlay}: expected exactly one {kind}/{name}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] in WORKLOAD_KINDS]


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]  # type: ignore[no-any-return]
    return workload["spec"]["template"]  # type: ignore[no-any-return]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(pod_template(workload)["metadata"].get("labels", {}))


def containers(workload: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    spec = pod_template(workload)["spec"]
    found = list(spec.get("containers", []))
    if init:
        found += spec.get("initContainers", [])
    return found


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels + matchExpressions); {} matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def render(overlay: str, out_dir: Path) -> Rendered:
    proc = run([kubectl(), "kustomize", K8S / "overlays" / overlay], timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize k8s/overlays/{overlay} failed\n{report(proc)}"
    path = out_dir / f"{overlay}.yaml"
    path.write_text(proc.stdout, encoding="utf-8")
    docs = tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)
    assert docs, f"k8s/overlays/{overlay} rendered no objects"
    return Rendered(overlay=overlay, text=proc.stdout, path=path, docs=docs)


@pytest.fixture(scope="session")
def rendered_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    """Every overlay, rendered once per test session."""
    out_dir = tmp_path_factory.mktemp("k8s-rendered")
    return {overlay: render(overlay, out_dir) for overlay in OVERLAYS}


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, rendered_all: dict[str, Rendered]) -> Rendered:
    """One overlay (the test runs once per overlay)."""
    return rendered_all[str(request.param)]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No chronolock settings leak in from the developer's environment."""
    for name in list(os.environ):
        if name.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_")):
            monkeypatch.delenv(name)
    yield monkeypatch
