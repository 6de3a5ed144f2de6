"""`pip install chronolock` works from a built wheel and sdist, with the documented extras.

Built the way a release is (``python -m build``: the sdist from a clean copy of the tracked
files, then the wheel *from that sdist*, in an isolated build environment), installed into
fresh virtualenvs from the package index, and used only through what the installation put
there. Nothing of the source tree is on the new environments' paths:

* the **base install** (``pip install chronolock``, no extras) is the library with light
  dependencies: ``import lockclient`` loads no CLI, server, Cassandra, HTTP or asyncio module,
  the README's application example runs against an SQLite store, and ``lockctl`` says which
  extra it needs (issue 25, item 3);
* with ``[server,cassandra]``: the import, ``lockctl``, and ``timesvc serve`` answering
  ``GET /now`` on 127.0.0.1.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from lockclient.version import __version__
from tests.support.procs import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 300
INSTALL_TIMEOUT = 420
BASE_DEPENDENCIES = {"httpx", "pydantic", "pydantic-settings", "prometheus-client", "structlog", "greenlet"}
"""What ``pip install chronolock`` brings: not typer, rich, fastapi, uvicorn or apscheduler."""
HEAVY_MODULES = ("typer", "rich", "click", "fastapi", "uvicorn", "apscheduler", "cassandra", "httpx", "asyncio")
"""What ``import lockclient`` must not load (the CLI, the servers, the driver, HTTP and asyncio
are imported where they are used)."""


def _run(command: list[str], *, cwd: Path | None = None, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done.stdout


def _clean_env() -> dict[str, str]:
    """The environment without this virtualenv or the project's settings."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env = {k: v for k, v in env.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT, timeout=60).split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = work / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], timeout=BUILD_TIMEOUT, env=_clean_env())
    return out


def test_the_sdist_and_wheel_carry_what_the_package_needs(dist: Path) -> None:
    (sdist,) = dist.glob("chronolock-*.tar.gz")
    (wheel,) = dist.glob("chronolock-*-py3-none-any.whl")
    assert sdist.name == f"chronolock-{__version__}.tar.gz"
    assert wheel.name == f"chronolock-{__version__}-py3-none-any.whl"
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "leasewatch/static/index.html",
        "lockclient/py.typed",
    ):
        assert needed in names, f"{needed} is missing from the sdist"
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        meta = email.message_from_bytes(archive.read(f"chronolock-{__version__}.dist-info/METADATA"))
        entry_points = archive.read(f"chronolock-{__version__}.dist-info/entry_points.txt").decode()
    for needed in ("leasewatch/static/index.html", "lockclient/py.typed", "timesvc/py.typed", "leasewatch/py.typed"):
        assert needed in files, f"{needed} is missing from the wheel"
    assert not any(name.startswith(("tests/", "bench/")) for name in files)
    assert meta["Version"] == __version__
    assert set(meta.get_all("Provides-Extra") or []) >= {"cli", "server", "cassandra"}
    base = {
        re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower()
        for req in meta.get_all("Requires-Dist") or []
        if "extra ==" not in req
    }
    assert base == BASE_DEPENDENCIES, f"the base install depends on {sorted(base)}"
    for script in ("timesvc", "leasewatch", "lockctl"):
        assert f"{script} = lockclient.console:{script}" in entry_points


def test_the_wheel_installs_with_its_extras_and_serves(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("chronolock-*.whl")
    venv = tmp_path / "venv"
    env = _clean_env()
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, env=env)
    bin_dir = venv / "bin"
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[server,cassandra]"],
        timeout=INSTALL_TIMEOUT,
        env=env,
    )
    where = _run(
        [
            str(bin_dir / "python"),
            "-c",
            "import lockclient, timesvc.app, leasewatch.app, cassandra, lockclient.version as v;"
            "print(lockclient.__file__); print(v.__version__)",
        ],
        cwd=tmp_path,
        timeout=120,
        env=env,
    ).splitlines()
    assert Path(where[0]).is_relative_to(venv), where  # the installed copy, not the source tree
    assert where[1] == __version__
    assert "Usage: lockctl" in _run([str(bin_dir / "lockctl"), "--help"], cwd=tmp_path, timeout=60, env=env)
    assert (
        _run([str(bin_dir / "lockctl"), "--version"], cwd=tmp_path, timeout=60, env=env) == f"lockctl {__version__}\n"
    )

    port = free_port()
    serve_env = env | {
        "CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path / 'cells.db'}",
        "TIMESVC_HOST": "127.0.0.1",
        "TIMESVC_PORT": str(port),
        "TIMESVC_REPLICAS": "1",
        "TIMESVC_REPLICA_ID": "installed",
    }
    log = (tmp_path / "timesvc.log").open("wb")
    server = subprocess.Popen(
        [str(bin_dir / "timesvc"), "serve"], cwd=tmp_path, env=serve_env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        body = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/now", timeout=2)
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 200:
                body = answer.json()
                break
            time.sleep(0.1)
        assert body is not None, (tmp_path / "timesvc.log").read_text()[-3000:]
        assert body["replica"] == "installed"
        assert abs(body["now_us"] / 1e6 - time.time()) < 60
        assert httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).json()["version"] == __version__
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.close()


def _readme_example() -> str:
    """The README's application example: its first Python block that builds a locker from the environment."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL):
        if "RemoteLocker.from_env()" in block:
            return block
    raise AssertionError("the README has no Python example using RemoteLocker.from_env()")


def test_the_base_install_is_the_library_alone_and_runs_the_readme_example(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("chronolock-*.whl")
    venv = tmp_path / "venv"
    env = _clean_env()
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, env=env)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], timeout=INSTALL_TIMEOUT, env=env)
    installed = {
        re.split(r"==| @ ", line, maxsplit=1)[0].lower().replace("_", "-")
        for line in _run([str(python), "-m", "pip", "freeze", "--all"], timeout=120, env=env).splitlines()
    }
    for heavy in ("typer", "rich", "fastapi", "uvicorn", "apscheduler", "cassandra-driver"):
        assert heavy not in installed, f"pip install chronolock installed {heavy}"

    loaded = _run(
        [str(python), "-c", "import sys, lockclient; print(lockclient.__file__); print(' '.join(sys.modules))"],
        cwd=tmp_path,
        timeout=120,
        env=env,
    ).splitlines()
    assert Path(loaded[0]).is_relative_to(venv), loaded[0]
    modules = {name.split(".")[0] for name in loaded[1].split()}
    assert not modules & set(HEAVY_MODULES), f"import lockclient loaded {sorted(modules & set(HEAVY_MODULES))}"

    # The README's example, as an application would run it: charge() is the application's.
    app = tmp_path / "app.py"
    app.write_text(
        "calls = []\n"
        "def charge(account, fencing_token):\n    calls.append(('charge', account, fencing_token))\n"
        + _readme_example()
        + "\nlocker.close()\nprint(calls)\n",
        encoding="utf-8",
    )
    run_env = env | {"CHRONOLOCK_STORE_URL": f"sqlite:///{tmp_path / 'cells.db'}"}
    done = subprocess.run(
        [str(python), str(app)], cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "[('charge', 42, 1)]", done.stdout + done.stderr

    # The console script is there, and says what it needs instead of a traceback.
    lockctl = subprocess.run(
        [str(venv / "bin" / "lockctl"), "run", "x", "--", "true"],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert lockctl.returncode == 78, lockctl.stderr
    assert "pip install 'chronolock[cli]'" in lockctl.stderr and "Traceback" not in lockctl.stderr
