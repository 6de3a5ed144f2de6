"""`make up`'s launcher: three timesvc replicas and leasewatch on one SQLite file, stopped on Ctrl-C."""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parent.parent


def _load_up() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chronolock_up_script", ROOT / "scripts" / "up.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


up = _load_up()


def _plain_bind_refused(port: int) -> bool:
    """What the check did before: a bind without SO_REUSEADDR."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
        return False


def _time_wait_on(port: int) -> None:
    """Leave a server-side connection of ``port`` in TIME_WAIT, as a stopped server does."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side ends in TIME_WAIT
        assert client.recv(1) == b""  # the server's FIN arrived
        client.close()


def test_a_port_in_time_wait_is_free_as_uvicorn_sees_it() -> None:
    port = free_port()
    _time_wait_on(port)
    assert _plain_bind_refused(port), "precondition: TIME_WAIT blocks a bind without SO_REUSEADDR"
    assert up.port_is_free(port)

    async def listen() -> None:  # what uvicorn does: asyncio's create_server
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", port)
        server.close()
        await server.wait_closed()

    asyncio.run(listen())


def test_a_port_someone_listens_on_is_busy() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert not up.port_is_free(listener.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CHRONOLOCK_", "TIMESVC_", "LEASEWATCH_"))}


def _start_up(base: int, store: Path | str, cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    env = _clean_env() | {"CHRONOLOCK_UP_PORT": str(base), "CHRONOLOCK_STORE_URL": f"sqlite:///{store}"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "up.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C stops everything" in line or "in use" in line:
            break
    return proc, "".join(lines)


def _stop(proc: subprocess.Popen[str]) -> int:
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
def test_up_starts_the_stack_stops_it_on_ctrl_c_and_starts_again_at_once(tmp_path: Path) -> None:
    base = free_port()
    while any(not up.port_is_free(base + i) for i in range(4)):
        base = free_port()
    proc, out = _start_up(base, tmp_path / "cells.db")
    try:
        assert "chronolock is up" in out, out
        urls = re.findall(r"http://127\.0\.0\.1:\d+", out)
        assert len(set(urls)) == 4
        # Keep-alive connections that the servers close when they stop: their side of
        # each one is left in TIME_WAIT, as after any real run.
        with httpx.Client(timeout=5) as client:
            for i in range(3):
                assert client.get(f"http://127.0.0.1:{base + i}/now").json()["replica"] == f"timesvc-{i + 1}"
            assert client.get(f"http://127.0.0.1:{base + 3}/locks").json() == []
            assert client.get(f"http://127.0.0.1:{base + 3}/time").json()["configured"] == 3  # the page's panel
            # Revocation over HTTP is enabled (issue 25: it was refused after `make up`), with a token
            # only this user can read; without it, 401.
            token_file = ROOT / ".chronolock" / "admin-token"
            assert token_file.stat().st_mode & 0o077 == 0
            token = token_file.read_text().strip()
            revoke = f"http://127.0.0.1:{base + 3}/revoke/nobody-holds-this"
            assert client.post(revoke).status_code == 401
            answer = client.post(revoke, headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200 and answer.json()["revoked"] == [], answer.text
            assert "revocation over HTTP: curl -X POST" in out and token not in out
            assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            _stop(proc)
    for i in range(4):
        assert up.port_is_free(base + i), "a service outlived `make up`"
    assert any(_plain_bind_refused(base + i) for i in range(4)), "precondition: no port left in TIME_WAIT"

    again, out = _start_up(base, tmp_path / "cells.db")
    try:
        assert "chronolock is up" in out, out
        assert httpx.get(f"http://127.0.0.1:{base}/now", timeout=5).status_code == 200
    finally:
        assert _stop(again) == 0


def _free_base() -> int:
    base = free_port()
    while any(not up.port_is_free(base + i) for i in range(4)):
        base = free_port()
    return base


def test_a_relative_store_url_is_made_absolute() -> None:
    assert up.absolute_store_url("sqlite:///state/cells.db?busy_timeout=1") == (
        f"sqlite:///{Path.cwd()}/state/cells.db?busy_timeout=1"
    )
    assert up.absolute_store_url("sqlite:////abs/cells.db") == "sqlite:////abs/cells.db"
    assert up.absolute_store_url("cassandra://h/ks") == "cassandra://h/ks"


@pytest.mark.slow
def test_the_printed_exports_work_pasted_into_a_shell_in_any_directory(tmp_path: Path) -> None:
    """Issue 25: clients refuse to run without CHRONOLOCK_STORE_URL and to resolve a relative SQLite
    path, so what `make up` prints must name files by absolute path — even when it was given a
    relative store URL — and a shell elsewhere that pastes it must lock in the stack's store."""
    (tmp_path / "clone" / "state").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc, out = _start_up(_free_base(), "state/cells.db", cwd=tmp_path / "clone")
    try:
        assert "chronolock is up" in out, out
        exports = dict(re.findall(r"export (CHRONOLOCK_[A-Z_]+)=(\S+)", out))
        assert set(exports) == {"CHRONOLOCK_STORE_URL", "CHRONOLOCK_TIMESVC_URLS", "CHRONOLOCK_LEASEWATCH_URL"}
        assert exports["CHRONOLOCK_STORE_URL"] == f"sqlite:///{tmp_path / 'clone' / 'state' / 'cells.db'}"
        lockctl = re.search(r"then e\.g\.:\s+(\S+) run my-lock", out)
        assert lockctl is not None and Path(lockctl.group(1)).is_absolute(), out
        pasted = subprocess.run(
            ["sh", "-c", f"{out[out.index('export CHRONOLOCK_STORE_URL'):].split('then e.g.')[0]}\n"
             f"{lockctl.group(1)} run demo -- true && {lockctl.group(1)} status demo --json"],
            env=_clean_env(),
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        assert pasted.returncode == 0, pasted.stderr
        assert '"fencing_token": 1' in pasted.stdout  # taken in the stack's store...
        assert list(elsewhere.iterdir()) == []  # ...and nothing made where the shell was
    finally:
        assert _stop(proc) == 0
