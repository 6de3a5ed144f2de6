"""Issue 16, also-fix: what services say about store errors, and how often they try to log in.

* error bodies and ``/readyz`` reasons name the kind of failure, never the store's host,
  port or file path (those stay in the logs);
* a full disk is reported as the store failing, not as a runaway clock;
* wrong Cassandra credentials: a service backs off (the review counted 27 login attempts
  in 12 s from one replica), and ``lockctl`` exits 78 (configuration), not 69.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from lockclient.globaltime import GLOBAL_TIME_COLUMN, GLOBAL_TIME_ROW, SOURCE_COLUMN, wall_clock_us
from lockclient.store import Table, open_store
from tests.support.fake_cql import fake_cql_node
from tests.support.procs import BIN, Fleet, ServiceProcess, free_port, service_env

PASSWORD = "Wr0ng-but-secret-password-16"

pytestmark = pytest.mark.slow


def _no_location(text: str, *where: str) -> None:
    for secret in where:
        assert secret not in text, f"{secret!r} leaked into {text!r}"


def test_error_bodies_and_readyz_name_no_path(processes: Fleet, tmp_path: Path) -> None:
    db = tmp_path / "private-dir" / "cells.db"
    db.parent.mkdir()  # a store's directory is never created implicitly (issue 25)
    url = f"sqlite:///{db}?busy_timeout=0.2"
    timesvc = processes.timesvc(url, name="t")
    timesvc.wait_ready()
    # leasewatch on a store that cannot even be opened: a file where its directory should be.
    (tmp_path / "not-a-dir").write_text("")
    leasewatch = processes.leasewatch(f"sqlite:///{tmp_path}/not-a-dir/cells.db", name="l")
    # ...and one whose store opens and then stays locked (its scans and partitions fail).
    busy_watch = processes.leasewatch(url, name="l2")
    busy_watch.wait_ready()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # every write is busy now
    try:
        with httpx.Client(timeout=5) as http:
            deadline = time.monotonic() + 15
            while http.get(f"{timesvc.url}/readyz").status_code != 503:
                assert time.monotonic() < deadline, "readyz stayed 200 while the store was locked"
                time.sleep(0.1)
            bodies = [
                http.get(f"{timesvc.url}/now"),
                http.get(f"{timesvc.url}/readyz"),
                http.get(f"{timesvc.url}/status"),
                http.get(f"{leasewatch.url}/readyz"),
                http.get(f"{leasewatch.url}/locks/some-lock"),
                http.get(f"{leasewatch.url}/locks"),
                # /status needs no token: its errors (partitions, the last scan) must be generic too.
                http.get(f"{leasewatch.url}/status"),
                http.get(f"{busy_watch.url}/status"),
            ]
        assert bodies[0].status_code == 503 and "store unavailable" in bodies[0].json()["detail"]
        assert bodies[3].status_code == 503 and bodies[4].status_code == 503
        for response in bodies:
            _no_location(response.text, str(tmp_path), "private-dir", "not-a-dir", "cells.db")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    # The details are in the logs, for the operator.
    assert "not-a-dir" in leasewatch.log_tail(200)


def test_full_disk_is_the_store_failing_not_a_runaway_clock(tmp_path: Path) -> None:
    """Writes fail ("database or disk is full"), reads work, and GlobalTime is stale (nobody could
    advance it): the replica cannot publish, and its own clock looks "ahead". Before issue 16
    /readyz then also said "local clock runaway", sending operators after the clock."""
    import asyncio

    from lockclient.errors import StoreError
    from lockclient.globaltime import GlobalTimeNotCurrent
    from tests.support.faulty import FaultyStore
    from timesvc.app import TimeService
    from timesvc.settings import TimesvcSettings

    inner = open_store(f"sqlite:///{tmp_path}/cells.db")
    stale = wall_clock_us() - 30_000_000
    inner.put_cells(
        Table.GLOBAL_TIME, GLOBAL_TIME_ROW, {GLOBAL_TIME_COLUMN: str(stale), SOURCE_COLUMN: "ok:gone"}, timestamp=stale
    )
    store = FaultyStore(inner)
    full = StoreError(f"SQLite store {str(tmp_path)!r} failed: database or disk is full")
    full.__cause__ = sqlite3.OperationalError("database or disk is full")  # as the adapter raises it
    for method in ("put", "put_cells", "delete"):
        store.arm(method, raise_before=full, times=10_000)
    settings = TimesvcSettings(store_url=f"sqlite:///{tmp_path}/cells.db", replicas=3, replica_id="r")
    service = TimeService(settings, store=store)

    async def run() -> None:
        await service.tick()  # publishes this replica's clock reading: a write, fails
        # GlobalTime is stale and no majority vouches for it: the answer is a 503 — the store
        # failing (the carry it would publish cannot be written) or "cannot vouch" — never a time.
        with pytest.raises((GlobalTimeNotCurrent, StoreError)):
            await service.now()

    asyncio.run(run())
    ready, reasons = service.readiness()
    assert not ready
    assert any("disk is full" in reason for reason in reasons), reasons
    assert not any("runaway" in reason for reason in reasons), reasons
    assert not any(str(tmp_path) in reason for reason in reasons), reasons
    inner.close()


def _count_logins(program: str, node_address: str, tmp_path: Path, seconds: float) -> tuple[int, ServiceProcess]:
    port = free_port()
    prefix = program.upper()
    env = service_env(
        {
            "CHRONOLOCK_STORE_URL": f"cassandra://app:{PASSWORD}@{node_address}/ks?protocol_version=4&timeout=2",
            f"{prefix}_PORT": str(port),
            f"{prefix}_HOST": "127.0.0.1",
            "TIMESVC_TICK": "0.5",
            "LEASEWATCH_SCAN_INTERVAL": "0.2",
        }
    )
    proc = ServiceProcess(program, [str(BIN / program), "serve"], env, port, tmp_path / f"{program}.log")
    proc.wait_healthy()
    return port, proc


@pytest.mark.parametrize("program", ["timesvc", "leasewatch"])
def test_wrong_credentials_back_off_instead_of_logging_in_per_tick(program: str, tmp_path: Path) -> None:
    with fake_cql_node() as node:
        _, proc = _count_logins(program, node.address, tmp_path, 6)
        try:
            started = time.monotonic()
            with httpx.Client(base_url=proc.url, timeout=5) as http:
                path = "/now" if program == "timesvc" else "/locks/x"
                while time.monotonic() - started < 6:
                    response = http.get(path)  # requests must not add logins either
                    time.sleep(0.1)
                assert response.status_code == 503
                assert "refused access" in response.json()["detail"]
                _no_location(response.text, PASSWORD, node.address)
                reasons = http.get("/readyz").json()["reasons"]
                assert any("refused access" in reason for reason in reasons), reasons
            logins = len(node.logins)
        finally:
            proc.stop()
        # Back-off 1, 2, 4 s after the first failure: attempts at ~0, 1, 3 (and maybe 7) s.
        assert 1 <= logins <= 4, f"{logins} login attempts in 6 s"
        log = proc.log_tail(400)
        assert PASSWORD not in log and "store_open_failed" in log


def test_lockctl_exits_78_when_the_store_refuses_the_credentials(tmp_path: Path) -> None:
    with fake_cql_node() as node:
        env = service_env(
            {"CHRONOLOCK_STORE_URL": f"cassandra://app:{PASSWORD}@{node.address}/ks?protocol_version=4&timeout=2"}
        )
        for args in (["status", "x"], ["run", "x", "--", "true"]):
            result = subprocess.run(
                [str(Path(sys.executable).parent / "lockctl"), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 78, (result.returncode, result.stderr)
            assert "rejected the credentials" in result.stderr
            assert PASSWORD not in result.stderr
