"""``lost`` fires once, with its first reason, and never for a lease that already ended cleanly —
whatever verdict arrives late (a renewal's, computed before the release landed); a callback
registered after it fired gets that reason at once (mutation testing, issue 24: neither was
pinned by a test or a judge seed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from lockclient import RemoteLocker, open_store


@pytest.fixture
def locker(sqlite_url: str) -> Iterator[RemoteLocker]:
    with RemoteLocker(open_store(sqlite_url), lease=5, owns_store=True) as lk:
        yield lk


def wait_for(items: list[str], count: int) -> None:
    for _ in range(500):
        if len(items) >= count:
            return
        threading.Event().wait(0.01)


def test_a_cleanly_released_lock_ignores_a_late_lost_verdict(locker: RemoteLocker) -> None:
    lock = locker.get_lock("late")
    reasons: list[str] = []
    lock.on_lost(reasons.append)
    assert lock.release() is True
    lock._lease.mark_lost("lease revoked")  # a renewal's verdict, computed before the release landed
    assert not lock.lost.is_set()
    threading.Event().wait(0.05)
    assert reasons == []


def test_lost_fires_once_with_its_first_reason_and_late_callbacks_get_it(locker: RemoteLocker) -> None:
    lock = locker.get_lock("twice")
    early: list[str] = []
    lock.on_lost(early.append)
    lock._lease.mark_lost("lease revoked")
    lock._lease.mark_lost("no renewal succeeded")  # a second report changes nothing
    assert lock.lost.is_set() and lock.lost_reason == "lease revoked"
    late: list[str] = []
    lock.on_lost(late.append)  # registered after it fired: called at once, with the reason
    wait_for(early, 1)
    wait_for(late, 1)
    threading.Event().wait(0.05)
    assert early == ["lease revoked"]
    assert late == ["lease revoked"]
    assert lock.release() is False
