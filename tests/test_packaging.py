"""`pip install chronolock` works from a built wheel and sdist, with the documented extras.

Built the way a release is (``python -m build``: the sdist from a clean copy of the tracked
files, then the wheel *from that sdist*, in an isolated build environment), installed into a
fresh virtualenv with ``[server,cassandra]`` from the package index, and used only through
what the installation put there: the import, ``lockctl``, and ``timesvc serve`` answering
``GET /now`` on 127.0.0.1. Nothing of the source tree is on the new environment's path.
"""

from __future__ import annotations

import email
import os
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
    assert set(meta.get_all("Provides-Extra") or []) >= {"server", "cassandra"}
    for script in ("timesvc = timesvc.cli:main", "leasewatch = leasewatch.cli:main", "lockctl = lockclient.cli:main"):
        assert script in entry_points


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
