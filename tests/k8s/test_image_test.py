"""`make image-test` (scripts/image_test.py) is slow and needs root and podman, so `make test`
only checks its shape: the target exists apart from `test`, installs its tools, and the script
builds the repository's Dockerfile on a local base and runs what it builds read-only as the
image's numeric user. Running it for real is `make image-test` (docs/operations.md)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.k8s.conftest import REPO

SCRIPT = REPO / "scripts" / "image_test.py"


def _target(makefile: str, name: str) -> tuple[list[str], str]:
    """A Makefile target's prerequisites and recipe."""
    match = re.search(rf"^{name}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, flags=re.MULTILINE)
    assert match, f"no `{name}` target in the Makefile"
    return match.group(1).split(), match.group(2)


def test_make_image_test_is_its_own_target_and_installs_its_tools() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    needs, recipe = _target(makefile, "image-test")
    assert "image-deps" in needs and "scripts/image_test.py" in recipe
    packages = re.search(r"^IMAGE_DEBIAN_PACKAGES\s*:=\s*(.*)$", makefile, flags=re.MULTILINE)
    assert packages and {"podman", "runc", "mmdebstrap"} <= set(packages.group(1).split())
    deps, _ = _target(makefile, "image-deps")
    assert deps == []
    assert "$(IMAGE_DEBIAN_PACKAGES)" in _target(makefile, "image-deps")[1]
    # Slow and root-only: never pulled into `make test`.
    test_needs, test_recipe = _target(makefile, "test")
    assert "image-test" not in test_needs and "image" not in test_recipe


def test_the_script_builds_the_dockerfile_on_a_local_base_and_runs_it_read_only() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    assert "mmdebstrap" in text and '"import"' in text
    assert '"--build-arg", f"PYTHON_BASE={base_image}"' in text  # the Dockerfile's overridable base
    assert re.search(r'^USER = "10001:10001"$', text, flags=re.MULTILINE)
    assert "USER 10001:10001" in (REPO / "Dockerfile").read_text(encoding="utf-8")
    common = re.search(r"common = \[([^\]]*)\]", text)
    assert common and all(flag in common.group(1) for flag in ('"--read-only"', '"--user", USER'))
    # A private image store: the run never touches (or prunes) anybody else's images.
    assert '"--root"' in text and '"--runroot"' in text and "prune" not in text
    for probe in ("/now", "/healthz", "/readyz", "/status", "/observed", "lockctl"):
        assert probe in text, probe
    # Every external command is bounded.
    calls = re.findall(r"\brun\(\s*\[", text)
    assert calls and len(re.findall(r"timeout=", text)) >= len(calls)


def test_the_script_explains_itself_without_side_effects() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--keep" in done.stdout and "podman" in done.stdout
