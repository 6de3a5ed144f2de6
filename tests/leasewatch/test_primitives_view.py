"""leasewatch's view of semaphores, read-write locks and elections (issue 26): ``GET
/primitives/{kind}/{name}`` answers the holders slot by slot (mode, token, lease), the limit and the
queue with modes; ``/wait`` and ``/notify`` accept a primitive's row; the operator page shows a
semaphore named ``name (semaphore)`` and its holders in a real browser."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from lockclient import RemoteLocker, open_store
from lockclient.lockid import primitive_row
from lockclient.store import Table
from tests.support.browser import chromium, dump_dom, elements
from tests.support.procs import Fleet, ServiceProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def leasewatch(processes: Fleet, sqlite_url: str) -> ServiceProcess:
    return processes.leasewatch(sqlite_url)


@pytest.fixture
def locker(sqlite_url: str) -> Iterator[RemoteLocker]:
    with RemoteLocker(open_store(sqlite_url), lease=5, allow_store_clock=True, owns_store=True) as lk:
        yield lk


def queued(locker: RemoteLocker, name: str, kind: str) -> int:
    return len(locker.store.read_row(Table.QUEUE, primitive_row(name, kind)))


def get(service: ServiceProcess, path: str) -> dict:  # type: ignore[type-arg]
    response = httpx.get(f"{service.url}{path}", timeout=10)
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def test_a_semaphore_read_write_lock_and_election_as_leasewatch_shows_them(
    leasewatch: ServiceProcess, locker: RemoteLocker, tmp_path: Path
) -> None:
    permits = [locker.get_semaphore("db-pool", 2) for _ in range(2)]
    waiter = threading.Thread(target=lambda: locker.get_semaphore("db-pool", 2, timeout=30).release())
    waiter.start()
    wait_until(lambda: queued(locker, "db-pool", "semaphore") == 3, "a third in line")
    sem = get(leasewatch, "/primitives/semaphore/db-pool")
    assert sem["kind"] == "semaphore" and sem["limit"] == 2 and sem["fencing_token"] == 2
    assert sorted((h["owner"], h["fencing_token"], h["mode"]) for h in sem["holders"]) == sorted(
        (p.owner, p.fencing_token, "permit") for p in permits
    )
    assert [q["holding"] for q in sem["queue"]] == [True, True, False]

    reader = locker.get_read_lock("catalog")
    writer_waits = threading.Thread(target=lambda: locker.get_write_lock("catalog", timeout=30).release())
    writer_waits.start()
    wait_until(lambda: queued(locker, "catalog", "rwlock") == 2, "the writer in line")
    rw = get(leasewatch, "/primitives/rwlock/catalog")
    assert [(h["owner"], h["mode"]) for h in rw["holders"]] == [(reader.owner, "read")]
    assert [q["mode"] for q in rw["queue"]] == ["read", "write"] and rw["limit"] == 16

    election = locker.election("scheduler")
    leadership = election.campaign()
    info = get(leasewatch, "/primitives/election/scheduler")
    assert info["holders"][0]["mode"] == "leader" and info["holders"][0]["fencing_token"] == leadership.term
    assert info["holders"][0]["since"] is not None

    # /locks/{row} and /wait accept a primitive's row (a waiter on another machine long-polls it).
    row = quote(primitive_row("db-pool", "semaphore"), safe="")
    assert get(leasewatch, f"/locks/{row}")["holders"]
    assert (
        httpx.get(f"{leasewatch.url}/wait/{row}", params={"holder": "x", "timeout": "0.1"}, timeout=10).status_code
        == 200
    )

    # The operator page, in a real browser: the semaphore's holders by slot.
    chromium()
    dom = dump_dom(f"{leasewatch.url}/#lock={row}", tmp_path / "profile")
    found = elements(dom)
    error = next(e for e in found if e[1].get("id") == "error")[2]
    assert not error, f"every endpoint answered: {error}"
    title = next(e for e in found if e[1].get("id") == "lock-id")[2]
    assert title == "db-pool (semaphore, limit 2)"
    slots = {e[1]["data-slot"] for e in found if "data-slot" in e[1]}
    assert slots == {p.slot for p in permits}

    leadership.resign()
    reader.release()
    for p in permits:
        p.release()
    waiter.join(30)
    writer_waits.join(30)
