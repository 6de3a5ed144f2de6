"""Render, schema-validate and lint the manifests and the Dockerfile, offline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import (
    K8S,
    OLDEST_KUBERNETES,
    OVERLAYS,
    REPO,
    Rendered,
    report,
    run,
    venv_tool,
)

CHECKOV_CONFIG = K8S / ".checkov.yaml"


def test_overlays_render_distinct_objects(rendered: Rendered) -> None:
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in rendered.docs]
    assert len(keys) == len(set(keys)), f"{rendered.overlay}: duplicate objects {sorted(keys)}"
    for doc in rendered.docs:
        assert "apiVersion" in doc, f"{rendered.overlay}: {doc['kind']} without apiVersion"


def test_kubernetes_validate_strict(rendered: Rendered) -> None:
    """Strict OpenAPI validation with the bundled schemas of the oldest supported version."""
    proc = run([venv_tool("kubernetes-validate"), "--strict", "-k", OLDEST_KUBERNETES, rendered.path], timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, report(proc)
    # An unknown kind (e.g. a CRD or a typo in apiVersion) is only a WARN and exit 0: fail on it.
    problems = [line for line in output.splitlines() if line.startswith(("WARN", "ERROR"))]
    assert not problems, "\n".join(problems)
    passed = [line for line in output.splitlines() if line.startswith("INFO") and " passed for resource " in line]
    assert len(passed) == len(rendered.docs), f"not every object was validated:\n{output}"


def test_yamllint_clean() -> None:
    proc = run([venv_tool("yamllint"), "--strict", "-f", "parsable", "k8s", ".yamllint"], timeout=60)
    assert proc.returncode == 0, report(proc)


def test_hadolint_clean() -> None:
    proc = run([venv_tool("hadolint"), "--no-color", "Dockerfile"], timeout=60)
    assert proc.returncode == 0, report(proc)


def test_dockerfile_shape() -> None:
    """What the linters do not check: pinned slim base, multi-stage, numeric non-root user, env."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    # The base is a build argument (make image-test overrides it); its default must be pinned.
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.MULTILINE))
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], b) for b in re.findall(r"^FROM\s+(\S+)", text, re.M)]
    assert len(bases) >= 2, "multi-stage build expected"
    for base in bases:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), f"base {base} is not an exact python:3.11.x-slim tag"
    final = text[text.rindex("\nFROM ") :]
    assert "pip install" not in final and "apt-get" not in final, "the runtime stage must only copy the venv"
    assert re.search(r"^COPY --from=builder /opt/chronolock /opt/chronolock$", final, flags=re.MULTILINE)
    user = re.findall(r"^USER\s+(\S+)", final, flags=re.MULTILINE)
    assert user and re.fullmatch(r"\d+(:\d+)?", user[-1]) and not user[-1].startswith("0"), user
    for env in ("PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"):
        assert env in final
    assert "'.[server,cassandra]'" in text
    # The build context is an allow-list: everything is excluded, then only what the image needs.
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()]
    assert "*" in ignore and ignore.index("*") < ignore.index("!pyproject.toml"), ".dockerignore must start from '*'"
    assert not any(line in ignore for line in ("!.venv", "!.git", "!tests"))


# ---- checkov: slow (seconds per run), so one run per target, shared by its tests


def _checkov(target: Path, framework: str) -> dict[str, Any]:
    proc = run(
        [
            venv_tool("checkov"),
            "--config-file",
            CHECKOV_CONFIG,
            "--framework",
            framework,
            "--skip-download",
            "--output",
            "json",
            "-f",
            target,
        ],
        timeout=180,
    )
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov produced no JSON report\n{report(proc)}")
    assert isinstance(result, dict), f"checkov: expected one report, got {type(result)}\n{report(proc)}"
    result["_returncode"] = proc.returncode
    return result


@pytest.fixture(scope="module")
def checkov_manifests(rendered_all: dict[str, Rendered]) -> dict[str, dict[str, Any]]:
    return {overlay: _checkov(rendered_all[overlay].path, "kubernetes") for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def checkov_dockerfile() -> dict[str, Any]:
    return _checkov(REPO / "Dockerfile", "dockerfile")


def _failures(result: dict[str, Any]) -> str:
    failed = result.get("results", {}).get("failed_checks", [])
    return "\n".join(f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in failed)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_manifests(checkov_manifests: dict[str, dict[str, Any]], overlay: str) -> None:
    result = checkov_manifests[overlay]
    summary = result["summary"]
    assert summary["parsing_errors"] == 0, summary
    assert summary["passed"] > 100, f"checkov ran suspiciously few checks: {summary}"
    assert summary["failed"] == 0 and result["_returncode"] == 0, _failures(result)


def test_checkov_dockerfile(checkov_dockerfile: dict[str, Any]) -> None:
    summary = checkov_dockerfile["summary"]
    assert summary["passed"] > 10, summary
    assert summary["failed"] == 0 and checkov_dockerfile["_returncode"] == 0, _failures(checkov_dockerfile)


def test_checkov_skips_are_few_and_explained() -> None:
    """Every globally skipped check has a comment line right above it with its reason."""
    lines = CHECKOV_CONFIG.read_text(encoding="utf-8").splitlines()
    skipped = [(i, line.strip()[2:]) for i, line in enumerate(lines) if re.match(r"\s+- CKV", line)]
    assert 0 < len(skipped) <= 6, skipped
    for index, check in skipped:
        reason = lines[index - 1].strip()
        assert reason.startswith("# ") and len(reason) > 20, f"{check} has no one-line reason above it"
    # In-manifest skips (checkov.io/skip annotations) carry a reason too.
    for path in sorted(K8S.rglob("*.yaml")):
        for match in re.finditer(r"checkov\.io/skip\d+:\s*(.+)$", path.read_text(encoding="utf-8"), flags=re.MULTILINE):
            assert "=" in match.group(1) and len(match.group(1).split("=", 1)[1]) > 3, f"{path}: {match.group(0)}"
