"""Three real leasewatch replicas share the lock-id space; one is SIGKILLed (issue 15).

Shown on the embedded store always, and on a 3-node Cassandra ring when
``CHRONOLOCK_TEST_CASSANDRA=h1,h2,h3:port`` names one (e.g. shared/cassandra-modern/ring41.sh),
in a keyspace of its own (partition rows are shared by every replica of a keyspace).

What must hold:

* each replica owns about a third of the 64 partitions, none twice;
* after the SIGKILL, the survivors own every partition within ``partition lease + grace``
  (+ a refresh and slack) of it — and split them evenly;
* a holder that died with the replica, in one of its partitions, is revoked by a survivor —
  not before that survivor has watched it unchanged for ``lease + grace`` (never early),
  and within take-over + lease + grace + a look period (+ slack) of the kill;
* live holders in the dead replica's partitions (and elsewhere) are never revoked.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lockclient import open_store
from lockclient.lease import HOLDER_COLUMN
from lockclient.lockid import INDEX_SHARDS, index_shard
from tests.support.procs import Fleet, ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ACTOR = Path(__file__).with_name("actor.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Timing:
    lease: float
    grace: float
    scan: float
    partition_lease: float
    slack: float

    @property
    def takeover_bound(self) -> float:
        refresh = min(self.scan, self.partition_lease / 6)
        return self.partition_lease + self.grace + refresh + self.slack

    @property
    def look(self) -> float:
        return max(self.scan, self.lease / 10)


SQLITE = Timing(lease=2.0, grace=0.5, scan=0.2, partition_lease=2.0, slack=2.0)
RING = Timing(lease=4.0, grace=1.0, scan=0.5, partition_lease=3.0, slack=4.0)


@pytest.fixture(params=["sqlite", "cassandra-ring"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Timing, dict[str, str]]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cells.db'}", SQLITE, {}
        return
    target = os.environ.get("CHRONOLOCK_TEST_CASSANDRA", "")
    if target.count(",") < 2:
        pytest.skip(
            "no 3-node Cassandra ring: set CHRONOLOCK_TEST_CASSANDRA=h1,h2,h3:port "
            "(e.g. shared/cassandra-modern/ring41.sh) to run this on Cassandra"
        )
    from lockclient.store.cassandra import connect_cluster
    from lockclient.store.cassandra_schema import create_schema
    from tests.support.cassandra_node import live_nodes

    hosts, _, port = target.rpartition(":")
    rf = min(3, live_nodes(f"{hosts}:{port}"))
    keyspace = f"chronolock_partitions_{uuid.uuid4().hex[:8]}"
    url = f"cassandra://{hosts}:{port}/{keyspace}"
    create_schema(url, replication_factor=rf)
    try:
        # No timesvc here: global time from the store, explicitly allowed (one machine).
        yield url, RING, {"CHRONOLOCK_ALLOW_STORE_CLOCK": "true"}
    finally:
        cluster, session, _ = connect_cluster(url)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        finally:
            cluster.shutdown()


def status(http: httpx.Client, lw: ServiceProcess) -> dict[str, Any]:
    response = http.get(f"{lw.url}/status")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def lock_in(partition: int, tag: str) -> str:
    return next(f"{tag}-{i}" for i in range(100_000) if index_shard(f"{tag}-{i}") == str(partition))


def test_three_replicas_share_the_work_and_survive_one_sigkill(
    processes: Fleet, backend: tuple[str, Timing, dict[str, str]], tmp_path: Path
) -> None:
    url, t, extra_env = backend
    replicas = [
        processes.leasewatch(
            url, name=f"lw-{n}", scan_interval=t.scan, grace=t.grace, partition_lease=t.partition_lease
        )
        for n in "abc"
    ]
    http = httpx.Client(timeout=10)

    def shares() -> list[set[int]]:
        return [set(status(http, lw)["partitions"]) for lw in replicas]

    last: list[list[set[int]]] = []

    def balanced() -> list[set[int]] | None:
        found = shares()
        total = sum(len(s) for s in found)
        disjoint = len(set().union(*found)) == total
        ok = total == INDEX_SHARDS and disjoint and all(18 <= len(s) <= 23 for s in found)
        settled = ok and bool(last) and last[-1] == found  # the same in two polls: converged
        last.append(found)
        time.sleep(0.3)
        return found if settled else None

    owned = wait_for(balanced, 60, "three replicas to share the 64 partitions")
    print("partitions per replica:", [len(s) for s in owned])
    for lw, mine in zip(replicas, owned, strict=True):
        ready = http.get(f"{lw.url}/readyz").json()
        assert ready["ready"] and set(ready["partitions"]) == mine
        metric = f"leasewatch_partitions_owned {float(len(mine))}"
        wait_for(lambda lw=lw, metric=metric: metric in http.get(f"{lw.url}/metrics").text, 5, metric)

    a, _, c = replicas
    victim = sorted(owned[2])
    dead_lock, live_lock = lock_in(victim[0], "dies-with-c"), lock_in(victim[1], "lives-in-c")
    elsewhere = lock_in(sorted(owned[0])[0], "lives-in-a")

    def actor(name: str, lock_id: str) -> tuple[ServiceProcess, Path]:
        status_file = tmp_path / f"{name}.jsonl"
        env = {
            "PYTHONPATH": str(REPO),
            "CHRONOLOCK_STORE_URL": url,
            "CHRONOLOCK_LEASE": str(t.lease),
            **extra_env,
        }
        proc = processes.python(name, [str(ACTOR), lock_id, "--status", str(status_file), "--hold-for", "200"], env)
        return proc, status_file

    def events(path: Path) -> list[dict[str, Any]]:
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]

    named = (("dead", dead_lock), ("live", live_lock), ("other", elsewhere))
    holders = {lock_id: actor(name, lock_id) for name, lock_id in named}
    for lock_id, (_, path) in holders.items():
        wait_for(lambda p=path: any(e["event"] == "held" for e in events(p)), 60, f"{lock_id} to be held")
    time.sleep(t.lease)  # every lease renewed at least twice and watched by its partition's owner

    store = open_store(url)
    try:
        killed_at = time.monotonic()
        holders[dead_lock][0].kill()
        c.kill()

        survivors = replicas[:2]
        wait_for(
            lambda: len(set().union(*(set(status(http, lw)["partitions"]) for lw in survivors))) == INDEX_SHARDS,
            t.takeover_bound + 30,
            "the survivors to own every partition",
        )
        took_over = time.monotonic() - killed_at
        print(f"take-over of the dead replica's partitions: {took_over:.2f} s (bound {t.takeover_bound:.1f} s)")
        assert took_over <= t.takeover_bound

        revoked = wait_for(
            lambda: HOLDER_COLUMN not in store.read_versioned(dead_lock, serial=False) and time.monotonic(),
            t.takeover_bound + t.lease + t.grace + t.look + t.slack + 30,
            "the dead holder to be revoked",
        )
        latency = revoked - killed_at
        bound = t.takeover_bound + t.lease + t.grace + t.look + t.slack
        print(f"dead holder in the dead replica's partition: kill -> revoked {latency:.2f} s (bound {bound:.1f} s)")
        assert latency <= bound
        by = [e for lw in survivors for e in http.get(f"{lw.url}/revocations").json()]
        assert [(e["lock_id"], e["holder"]) for e in by] == [(dead_lock, True)]
        assert by[0]["unchanged_for_s"] >= t.lease + t.grace, "revoked before its new watcher saw a full lease"
        assert by[0]["by"] in ("lw-a", "lw-b")

        # The live holders keep their locks through the take-over and two more leases.
        time.sleep(2 * t.lease)
        for lock_id in (live_lock, elsewhere):
            assert not [e for e in events(holders[lock_id][1]) if e["event"] in ("lost", "error")], lock_id
            assert HOLDER_COLUMN in store.read_versioned(lock_id, serial=False)
        assert sorted(len(status(http, lw)["partitions"]) for lw in survivors) == [32, 32]
        assert sum(status(http, lw)["revocations"] for lw in survivors) == 1
        assert status(http, a)["replicas_seen"] and len(status(http, a)["replicas_seen"]) == 2
    finally:
        store.close()
        http.close()
