"""A busy chronolock for the operator page: real processes, real locks, nothing faked.

:func:`busy_state` starts two timesvc replicas (the second with its wall clock 0.2 s ahead
under libfaketime, when it is installed) and names a third URL where nothing listens; a
leasewatch that polls all three; then makes it busy:

* 1,000 lock ids ``fleet/rack-RR/node-NN`` held (holder records written directly, with a
  600 s lease, so they stay for the test without 1,000 renewals);
* ``orders/eu:42`` held, with three waiters queued behind the holder, in order;
* ``jobs/nightly-report`` taken and released over and over by two contending threads
  (grants, waits, ``/now`` traffic);
* ``printer:3rd-floor`` revoked by an operator (admin token named ``oncall``);
* ``payments/batch-7`` held by a process that is killed (SIGKILL): leasewatch revokes it
  when its lease runs out.

Lockers take their tickets from the two timesvc replicas. ``python -m tests.leasewatch.busy
[DIR]`` keeps the state up until Ctrl-C and prints the page's address (to look at it, or to
take new screenshots for docs/).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from lockclient import RemoteLocker, open_store
from lockclient.clock import TimeServiceClock
from lockclient.lease import FENCE_COLUMN, HOLDER_COLUMN, HolderRecord
from lockclient.lockid import index_shard, make_ticket
from lockclient.store import Table
from lockclient.store.base import CompareAndSet
from tests.support.procs import Fleet, ServiceProcess, fleet, free_port, libfaketime

REPO = Path(__file__).resolve().parents[2]
ACTOR = Path(__file__).with_name("actor.py")
ADMIN = "oncall-token-0123456789abcdef0123456789"
QUEUED = "orders/eu:42"
CHURNED = "jobs/nightly-report"
REVOKED = "printer:3rd-floor"
CRASHED = "payments/batch-7"
LEASE = 5.0


def fleet_ids(n: int) -> list[str]:
    return [f"fleet/rack-{i // 100:02d}/node-{i % 100:02d}" for i in range(n)]


@dataclass
class Busy:
    processes: Fleet
    store_url: str
    leasewatch: ServiceProcess
    timesvc: list[ServiceProcess]
    skewed: bool
    """timesvc-b runs 0.2 s ahead (libfaketime was available)."""
    holder: str = ""
    waiters: list[str] = field(default_factory=list)
    revoked: str = ""
    crashed: str = ""
    ids: list[str] = field(default_factory=list)

    def leasewatch_with(self, *, env: dict[str, str], name: str) -> ServiceProcess:
        """Another leasewatch replica on the same store (it takes over a share of the partitions)."""
        other = self.processes.leasewatch(self.store_url, name=name, env=env)
        other.wait_ready()
        return other

    def get(self, path: str, **params: object) -> Any:
        response = httpx.get(f"{self.leasewatch.url}{path}", params=params or None, timeout=10)
        response.raise_for_status()
        return response.json()


def _until(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def _seed_held(store_url: str, ids: list[str]) -> None:
    with open_store(store_url) as store:
        shards: dict[str, dict[str, str]] = {}
        for lock_id in ids:
            shards.setdefault(index_shard(lock_id), {})[lock_id] = ""
        for shard, cells in shards.items():
            store.put_cells(Table.INDEX, shard, cells, timestamp=time.time_ns() // 1000)
        ops = []
        for i, lock_id in enumerate(ids):
            owner = f"worker-{i:04d}.fleet"
            record = HolderRecord(owner, 1, 600.0, make_ticket(time.time_ns() // 1000, owner), 1).encode()
            cells = {HOLDER_COLUMN: record, FENCE_COLUMN: f"1|{owner}"}
            ops.append(CompareAndSet(lock_id, {HOLDER_COLUMN: None, FENCE_COLUMN: None}, cells))
        results = store.compare_and_set_many(ops)
        assert all(not isinstance(r, Exception) and r.applied for _, r in results)


@contextmanager
def busy_state(processes: Fleet, workdir: Path, *, trend_interval: float = 0.5, ids: int = 1000) -> Iterator[Busy]:
    store_url = f"sqlite:///{workdir / 'cells.db'}"
    # Before leasewatch starts: found by its first index read, their holders are not grants it saw.
    held = fleet_ids(ids)
    _seed_held(store_url, held)
    try:
        libfaketime()
        skew: str | None = "+0.2s"
    except RuntimeError:
        skew = None
    ts_a = processes.timesvc(store_url, name="timesvc-a", replicas=2)
    ts_b = processes.timesvc(store_url, name="timesvc-b", replicas=2, skew=skew)
    nobody = f"http://127.0.0.1:{free_port()}"  # a replica that is down
    lw = processes.leasewatch(
        store_url,
        name="leasewatch-1",
        admin_token=f"oncall:{ADMIN}",
        env={
            "LEASEWATCH_TIMESVC_URLS": f"{ts_a.url},{ts_b.url},{nobody}",
            "LEASEWATCH_TREND_INTERVAL": str(trend_interval),
        },
    )
    ts_a.wait_ready()
    ts_b.wait_ready()
    lw.wait_ready()
    busy = Busy(processes, store_url, lw, [ts_a, ts_b], skew is not None, ids=held)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    urls = [ts_a.url, ts_b.url]

    with ExitStack() as cleanup:

        def locker() -> RemoteLocker:
            clock = TimeServiceClock(urls)
            cleanup.callback(clock.close)
            made = RemoteLocker(open_store(store_url), clock, lease=LEASE, owns_store=True)
            cleanup.callback(made.close)
            return made

        def start(target: object, *args: object) -> None:
            thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
            thread.start()
            threads.append(thread)

        # A holder and three waiters, queued one after the other.
        holder = locker().get_lock(QUEUED, timeout=30)
        busy.holder = holder.owner

        def wait_in_line(side: RemoteLocker) -> None:
            side.get_lock(QUEUED, timeout=300).release()

        for n in range(3):
            side = locker()
            start(wait_in_line, side)
            _until(
                "a waiter queued",
                lambda n=n: len(busy.get(f"/locks/{quote(QUEUED, safe='')}")["queue"]) == n + 2,
                30,
            )
        queue = busy.get(f"/locks/{quote(QUEUED, safe='')}")["queue"]
        busy.waiters = [entry["owner"] for entry in queue[1:]]

        # Two threads taking turns on one lock.
        def churn(side: RemoteLocker) -> None:
            while not stop.is_set():
                with side.get_lock(CHURNED, timeout=60):
                    stop.wait(0.3)
                stop.wait(0.05)

        for _ in range(2):
            start(churn, locker())

        # An operator revocation.
        victim = locker().get_lock(REVOKED, timeout=30)
        busy.revoked = victim.owner
        answer = httpx.post(
            f"{lw.url}/revoke/{quote(REVOKED, safe='')}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )
        assert answer.json()["revoked"] == [victim.owner], answer.text

        # A holder that dies: revoked once its lease ran out unrenewed.
        status = workdir / "crashed.jsonl"
        actor = processes.python(
            "crashed-holder",
            [str(ACTOR), CRASHED, "--status", str(status), "--hold-for", "300"],
            {
                "PYTHONPATH": str(REPO),
                "CHRONOLOCK_STORE_URL": store_url,
                "CHRONOLOCK_TIMESVC_URLS": ",".join(urls),
                "CHRONOLOCK_LEASE": "2",
            },
        )
        _until("the doomed holder held", lambda: status.exists() and '"held"' in status.read_text(), 30)
        busy.crashed = next(json.loads(line)["owner"] for line in status.read_text().splitlines() if '"held"' in line)
        actor.kill()
        _until(
            "the dead holder revoked",
            lambda: any(e["owner"] == busy.crashed for e in busy.get("/revocations")),
            30,
        )
        try:
            yield busy
        finally:
            stop.set()
            holder.release()
            for thread in threads:
                thread.join(timeout=30)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM too (a background job ignores SIGINT): the processes are stopped on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    # Absolute: the services refuse a relative SQLite path (each process would resolve it on its own).
    workdir = (Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".chronolock/busy")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("cells.db*"):
        old.unlink()
    with fleet(workdir) as processes, busy_state(processes, workdir, trend_interval=1.0) as busy:
        print(f"busy: {busy.leasewatch.url}/  (lock view: /#lock={quote(QUEUED, safe='')}); Ctrl-C stops", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
