"""Issue 25, item 3: what start-up no longer pays for — checked by what is loaded, not by a clock.

The findings: ``import lockclient`` loaded 422 modules (the CLI, rich, httpx, structlog, asyncio,
prometheus-client) in 0.5–1.3 s; ``lockctl run -- true`` took 0.7–3.4 s, 0.15 s of it building two
TLS contexts for ``http://`` URLs. The times themselves are ``python -m bench startup``
(BENCHMARKS.md); a test on a shared machine can only check the causes.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockclient import TimeServiceClock
from lockclient.wake import LeasewatchWaker

ROOT = Path(__file__).resolve().parent.parent
NOT_AT_IMPORT = ("typer", "rich", "click", "fastapi", "uvicorn", "cassandra", "httpx", "structlog", "asyncio")
NOT_IN_LOCKCTL = ("prometheus_client", "structlog", "rich", "fastapi", "uvicorn", "cassandra")
# lockctl run through the lockctl script (lockclient.lockctl_run's fast path): not even typer or pydantic.
NOT_IN_LOCKCTL_RUN = (*NOT_IN_LOCKCTL, "typer", "click", "pydantic", "pydantic_core", "pydantic_settings", "asyncio")


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules), file=sys.stderr)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return {name.split(".")[0] for name in done.stderr.strip().splitlines()[-1].split()}


def test_import_lockclient_loads_no_cli_server_driver_http_or_asyncio() -> None:
    loaded = _modules_after("import lockclient")
    assert not loaded & set(NOT_AT_IMPORT), sorted(loaded & set(NOT_AT_IMPORT))


def test_lockctl_run_loads_no_metrics_structlog_or_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOCK_")}
    env["CHRONOLOCK_STORE_URL"] = f"sqlite:///{tmp_path / 'cells.db'}"
    loaded = _modules_after(
        "import sys\nfrom lockclient.cli import main\nsys.argv = ['lockctl', 'run', 'x', '--', 'true']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code",
        env,
    )
    assert "lockclient" in loaded
    assert not loaded & set(NOT_IN_LOCKCTL), sorted(loaded & set(NOT_IN_LOCKCTL))


def test_the_lockctl_script_runs_lockctl_run_without_typer_or_pydantic(tmp_path: Path) -> None:
    """Issue 25's start-up target (``python -c pass`` + 150 ms + the store's round trips): typer's
    application and pydantic's settings classes cost more than that on their own, so the script's
    ``lockctl run`` does without them — and the lock is still taken (exit 0, the command ran)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOCK_")}
    env["CHRONOLOCK_STORE_URL"] = f"sqlite:///{tmp_path / 'cells.db'}"
    marker = tmp_path / "ran"
    loaded = _modules_after(
        "import sys\nfrom lockclient.console import lockctl\n"
        f"sys.argv = ['lockctl', 'run', 'x', '--', 'touch', {str(marker)!r}]\n"
        "try:\n    lockctl()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code",
        env,
    )
    assert marker.exists()
    assert "lockclient" in loaded
    assert not loaded & set(NOT_IN_LOCKCTL_RUN), sorted(loaded & set(NOT_IN_LOCKCTL_RUN))


@pytest.fixture
def ca_loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every CA bundle an SSL context loads (what building a verifying TLS context costs)."""
    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    yield loads


def test_http_urls_build_no_tls_context(ca_loads: list[object]) -> None:
    TimeServiceClock(["http://127.0.0.1:1", "http://127.0.0.1:2"]).close()
    LeasewatchWaker("http://127.0.0.1:3").close()
    assert ca_loads == []
    TimeServiceClock(["https://127.0.0.1:1"]).close()  # the control: https:// still verifies
    assert ca_loads
