"""``min_hold`` and ``lockctl run --once-per`` (issue 26): a lock released early stays held — parked —
until the grant's global time + min_hold; nobody is granted over it (a try sees it busy, a waiter
waits for it); a contender removes it once global time has passed, leasewatch if nobody comes; and a
job fired on three "hosts" a second apart — one with its wall clock 10 minutes ahead — runs once per
period, judged by global time from timesvc."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from leasewatch.watcher import Watcher
from lockclient import CellStore, RemoteLocker, open_store
from lockclient.lease import HOLDER_COLUMN, HolderRecord
from tests.support.procs import Fleet
from tests.support.waiting import wait_until


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5, allow_store_clock=True) as lk:
        yield lk


def parked(store: CellStore, lock_id: str) -> HolderRecord | None:
    raw = store.read_versioned(lock_id).get(HOLDER_COLUMN)
    return None if raw is None else HolderRecord.decode(raw)


def test_a_lock_released_before_its_min_hold_stays_held_until_then(locker: RemoteLocker, store: CellStore) -> None:
    lock = locker.try_get_lock("nightly", min_hold=1.5)
    assert lock is not None
    granted_before = lock._lease.record.since
    assert lock.hold_until >= granted_before + 1_500_000
    assert lock.release() is True and not lock.lost.is_set()
    record = parked(store, "nightly")
    assert record is not None and record.until == lock.hold_until and record.owner == lock.owner
    assert locker.status("nightly").queue == [], "the queue cell went with the release"
    # Busy for everybody until global time passes `until`: a try, and a blocking waiter.
    assert locker.try_get_lock("nightly") is None
    waiter = locker.get_lock("nightly", timeout=10)
    granted_at = locker.clock.now_us()
    assert granted_at >= record.until, "granted only once global time had passed the hold"
    assert waiter.fencing_token == lock.fencing_token + 1
    waiter.release()
    assert parked(store, "nightly") is None


def test_a_release_after_min_hold_is_a_plain_release(locker: RemoteLocker, store: CellStore) -> None:
    lock = locker.get_lock("short", min_hold=0.05)
    time.sleep(0.1)
    lock.release()
    assert parked(store, "short") is None
    assert locker.try_get_lock("short") is not None


def test_a_parked_record_nobody_claims_is_removed_by_leasewatch_after_its_hold(
    locker: RemoteLocker, store: CellStore
) -> None:
    watcher = Watcher(store, grace=0.2, scan_interval=0.1)
    lock = locker.get_lock("left", min_hold=1.0)
    lock.release()
    started = time.monotonic()
    record = parked(store, "left")
    assert record is not None
    while parked(store, "left") is not None:
        watcher.scan()
        watcher.check_due()
        time.sleep(0.05)
        assert time.monotonic() - started < 20, "leasewatch never removed the parked record"
    removed_at = locker.clock.now_us()
    assert removed_at >= record.until, "leasewatch removed the parked record before its hold was over"
    assert watcher.longest_lease <= 5, "a parked record's hold does not count as a lease"


def test_min_hold_is_refused_where_it_cannot_hold(locker: RemoteLocker) -> None:
    with pytest.raises(ValueError, match="min_hold"):
        locker.get_lock("x", min_hold=0)
    with pytest.raises(TypeError):
        locker.try_get_lock("x", min_hold="1h")  # type: ignore[arg-type]


def test_a_blocking_waiter_queued_behind_a_parked_record_keeps_its_place(locker: RemoteLocker, sqlite_url: str) -> None:
    """FIFO holds across a parked hold: waiters queued while it was parked are granted in order."""
    first = locker.get_lock("queue-behind", min_hold=0.8)
    first.release()
    order: list[int] = []
    threads = []
    for i in range(3):

        def wait(i: int = i) -> None:
            with locker.get_lock("queue-behind", timeout=20):
                order.append(i)

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        wait_until(lambda n=i + 1: len(locker.status("queue-behind").queue) == n, f"waiter {i} to queue")
    for t in threads:
        t.join(30)
    assert order == [0, 1, 2]


@pytest.mark.slow
def test_once_per_runs_a_job_fired_on_three_hosts_a_second_apart_once_per_period(
    processes: Fleet, tmp_path: Path, sqlite_url: str
) -> None:
    """Cron on three hosts fires `lockctl run --once-per 6s job` at +0, +1 and +2 s of each period; host 1's
    wall clock is 10 minutes fast (libfaketime), as a badly synchronised host's would be. Exactly one run per
    period, never two at once. (That runs start at least period - tolerance apart in global time is the
    min_hold promise, checked exactly above and in the simulator.)"""
    replicas = [processes.timesvc(sqlite_url, name=f"t{i}", replicas=2) for i in range(2)]
    for replica in replicas:
        replica.wait_ready()
    urls = ",".join(r.url for r in replicas)
    runs = tmp_path / "runs.jsonl"
    job = (
        "import json, os, sys, time, httpx; "
        f"now = httpx.get('{replicas[0].url}/now').json()['now_us']; "
        f"open({str(runs)!r}, 'a').write(json.dumps({{'host': sys.argv[1], 'global_us': now, "
        "'token': int(os.environ['CHRONOLOCK_FENCING_TOKEN']), 'start': time.monotonic(), "
        "'end': time.monotonic() + 0.3}) + '\\n'); time.sleep(0.3)"
    )
    env = {"CHRONOLOCK_STORE_URL": sqlite_url, "CHRONOLOCK_TIMESVC_URLS": urls}
    period, periods = 6.0, 3
    firings = []
    started = time.monotonic()
    for k in range(periods):
        for host in range(3):
            at = started + k * period + host * 1.0
            time.sleep(max(0.0, at - time.monotonic()))
            args = ["-m", "lockclient.cli", "run", "--once-per", f"{period:g}s", "job", "--"]
            args += [sys.executable, "-c", job, f"h{host}"]
            firings.append(processes.python(f"fire-{k}-{host}", args, env, skew="+600s" if host == 1 else None))
    for proc in firings:
        assert proc.proc.wait(timeout=120) == 0, proc.log_tail()
    ended = time.monotonic()
    ran = [json.loads(line) for line in runs.read_text().splitlines()]
    print(f"once-per: {len(ran)} runs from {len(firings)} firings: {[(r['host'], r['token']) for r in ran]}")
    # Runs start at least a period (less the ticket's width and clock rates: 1 s here) apart, so at
    # most this many fit between the first firing and the last one's end: 3 on a quiet machine
    # (14.x s), more only when the load spread the firings out (at load ~40 they ran over 19 s, 4
    # runs, each a period after the one before).
    most = 1 + int((ended - started) / (period - 1.0))
    assert 1 <= len(ran) <= most, f"{len(ran)} runs in {ended - started:.1f} s, at most {most}: {ran}"
    ran.sort(key=lambda r: r["start"])
    # And a period after the first run, the firings still to come must run again: with the first
    # run begun within a period of the first firing, the last firing (2 periods + 2 s after the
    # first) cannot find it holding.
    if ran[0]["start"] - started < period:
        assert len(ran) >= 2, f"only one run: {ran}"
    for before, after in pairwise(ran):
        assert before["end"] <= after["start"], "two runs at once"
    assert [r["token"] for r in ran] == sorted(r["token"] for r in ran)
