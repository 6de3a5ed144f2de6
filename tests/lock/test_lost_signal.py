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


def test_lost_wait_looks_again_just_after_the_deadline_and_keeps_the_callers_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lost.wait()`` sleeps until the lease's deadline (+1 ms), then finds it expired; a caller's
    timeout shorter than the lease is kept (it answers False, the lease still valid). The event's
    sleeps are replaced by moves of a fake clock, so the test reads no real time."""
    from lockclient.lease import HeldLease, HolderRecord
    from lockclient.lockid import make_owner, make_ticket

    now = [100.0]
    owner = make_owner()
    lease = HeldLease(
        "wait", HolderRecord(owner, 1, 2.0, make_ticket(1, owner), 1), renewed_at=98.5, monotonic=lambda: now[0]
    )
    slept: list[float] = []
    real_wait = threading.Event.wait

    def fake_wait(event: threading.Event, timeout: float | None = None) -> bool:
        if event is not lease.lost:
            return real_wait(event, timeout)
        assert timeout is not None, "an expiring lease's lost.wait() slept with no deadline"
        slept.append(round(timeout, 6))
        now[0] += timeout
        return False

    monkeypatch.setattr(threading.Event, "wait", fake_wait)
    # Valid until 100.5: a caller that waits 0.2 s is answered False after 0.2 s (+1 ms).
    assert lease.lost.wait(0.2) is False
    assert slept == [0.201] and not lease.lost.is_set()
    # Waiting without a timeout: one sleep to 1 ms past the deadline, then lost.
    slept.clear()
    assert lease.lost.wait() is True
    assert slept == [round(100.5 - 100.201 + 0.001, 6)]
    assert lease.lost_reason is not None and "no renewal succeeded" in lease.lost_reason
