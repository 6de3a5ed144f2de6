"""Issue 25, item 4: owner labels and small payloads, the lock listing and revoking one holder by
its fencing token — on the real embedded store.

The findings: an owner (``host.pid.thread.suffix``) said which process held a lock, never what it
was doing; nothing listed the locks held or awaited without leasewatch; and ending a stuck holder
by hand meant leasewatch's admin endpoint, which ``make up`` left disabled.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import pytest

from lockclient import CellStore, RemoteLock, RemoteLocker, open_store
from lockclient.lease import HOLDER_COLUMN, HolderRecord, WaiterRecord
from lockclient.settle import EndRecord

try:  # new with these tests: on the code before them they must fail, not stop collecting
    from lockclient.admin import list_locks, revoke_token
    from lockclient.labels import MAX_LABEL_BYTES, MAX_PAYLOAD_BYTES
except ImportError:  # pragma: no cover - only on the old code
    list_locks = revoke_token = None  # type: ignore[assignment]
    MAX_LABEL_BYTES, MAX_PAYLOAD_BYTES = 200, 1024


@pytest.fixture
def store(sqlite_url: str) -> Iterator[CellStore]:
    with open_store(sqlite_url) as s:
        yield s


@pytest.fixture
def locker(store: CellStore) -> Iterator[RemoteLocker]:
    with RemoteLocker(store, lease=5) as lk:
        yield lk


def test_a_label_and_payload_are_stored_with_the_holder_and_shown_by_status(locker: RemoteLocker) -> None:
    payload = json.dumps({"batch": 17, "host": "web-3"})
    with locker.get_lock("billing", label="billing-worker on web-3", payload=payload) as lock:
        assert (lock.label, lock.payload) == ("billing-worker on web-3", payload)
        status = locker.status("billing")
        lease = status.leases[lock.owner]
        assert (lease.label, lease.payload) == ("billing-worker on web-3", payload)
        assert status.queue[0].label == "billing-worker on web-3"  # the holder's queue cell
        assert lease.granted_us > 0
        time.sleep(2.0)  # renewals (every lease/3) keep the label and the payload
        again = locker.status("billing").leases[lock.owner]
        assert again.version > 1 and (again.label, again.payload) == ("billing-worker on web-3", payload)


def test_a_waiter_is_labelled_in_the_queue_but_carries_no_payload(locker: RemoteLocker, store: CellStore) -> None:
    holder = locker.get_lock("q", label="first")
    other = RemoteLocker(store, lease=5)
    got: list[str] = []
    waiter = threading.Thread(
        target=lambda: got.append(other.get_lock("q", timeout=20, label="second", payload="p").label)
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while len(locker.status("q").queue) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    status = locker.status("q")
    assert [entry.label for entry in status.queue] == ["first", "second"]
    waiting = next(lease for owner, lease in status.leases.items() if owner != holder.owner)
    assert (waiting.label, waiting.payload) == ("second", "")  # the payload waits for the grant
    holder.release()
    waiter.join(timeout=20)
    assert got == ["second"]
    granted = locker.status("q")
    assert granted.leases[granted.holders[0]].payload == "p"
    other.close()


def test_try_and_async_acquisitions_take_a_label(locker: RemoteLocker) -> None:
    lock = locker.try_get_lock("t", label="tried", payload="x")
    assert lock is not None and locker.status("t").leases[lock.owner].label == "tried"
    lock.release()

    async def main() -> tuple[str, str]:
        async with await locker.aget_lock("a", label="awaited") as held:
            first = locker.status("a").leases[held.owner].label
        tried = await locker.atry_get_lock("a", label="async try", payload="y")
        assert tried is not None
        second = locker.status("a").leases[tried.owner].payload
        tried.release()
        return first, second

    assert asyncio.run(main()) == ("awaited", "y")


def test_the_primitives_take_a_label(locker: RemoteLocker, store: CellStore) -> None:
    with locker.get_semaphore("pool", 2, label="backup of db-1") as permit:
        assert permit.label == "backup of db-1"
        assert list_locks is not None
        (line,) = list_locks(store)
        assert (line.name, line.kind) == ("pool", "semaphore")
        assert [h.label for h in line.holders] == ["backup of db-1"]
    with locker.get_read_lock("catalog", label="reader") as reader:
        assert reader.label == "reader"
    with locker.get_write_lock("catalog", label="writer") as writer:
        assert writer.payload == "" and writer.label == "writer"


@pytest.mark.parametrize(
    ("label", "payload", "message"),
    [
        ("x" * (MAX_LABEL_BYTES + 1), None, f"label is {MAX_LABEL_BYTES + 1} bytes of UTF-8; the limit is 200"),
        ("é" * 101, None, "label is 202 bytes"),  # bytes of UTF-8, not characters
        ("two\nlines", None, "control characters"),
        ("\x1b[31mred", None, "control characters"),
        (None, "p" * (MAX_PAYLOAD_BYTES + 1), "payload is 1025 bytes of UTF-8; the limit is 1024 (1 KiB)"),
    ],
)
def test_too_long_or_unprintable_labels_and_payloads_are_refused_before_the_store(
    locker: RemoteLocker, label: str | None, payload: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        locker.get_lock("refused", label=label, payload=payload)
    with pytest.raises(ValueError):
        locker.try_get_lock("refused", label=label, payload=payload)
    assert locker.status("refused").queue == []  # nothing was written
    with pytest.raises(TypeError, match="payload must be a string"):
        locker.get_lock("refused", payload=b"bytes")  # type: ignore[arg-type]


def test_labels_are_optional_fields_old_and_new_readers_agree_on() -> None:
    # A record written before labels existed reads with none...
    old = '{"a":"x","f":3,"l":10.0,"o":"vm.1.Main.ab","t":"0001vm.1.Main.ab","v":2}'
    assert HolderRecord.decode(old).label == "" and HolderRecord.decode(old).granted == 0
    assert WaiterRecord.decode('{"l":10.0,"o":"vm.1.Main.ab","v":1}').label == ""
    # ...a record without a label is byte for byte what it was (nothing new is written)...
    plain = HolderRecord("vm.1.Main.ab", 2, 10.0, "0001vm.1.Main.ab", 3, "x")
    assert plain.encode() == old
    # ...and one with a label adds keys only: the keys older readers read are unchanged.
    labelled = HolderRecord("vm.1.Main.ab", 2, 10.0, "0001vm.1.Main.ab", 3, "x", label="l", payload="p", granted=7)
    data = json.loads(labelled.encode())
    assert {k: v for k, v in data.items() if k not in ("n", "p", "g")} == json.loads(old)
    assert HolderRecord.decode(labelled.encode()) == labelled
    assert labelled.renewed().label == "l" and labelled.renewed().payload == "p"


def test_list_locks_shows_held_and_awaited_locks_only(locker: RemoteLocker, store: CellStore) -> None:
    assert list_locks is not None
    lock = locker.get_lock("jobs/a", label="job a", payload="{}")
    locker.get_lock("jobs/b").release()  # idle now: listed only on request
    other = RemoteLocker(store, lease=5)
    waiter = threading.Thread(target=lambda: other.get_lock("jobs/a", timeout=20, label="job a, again").release())
    waiter.start()
    deadline = time.monotonic() + 10
    while not list_locks(store) or list_locks(store)[0].waiters < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (line,) = list_locks(store, prefix="jobs/")
    assert (line.lock_id, line.kind, line.fencing_token, line.waiters) == ("jobs/a", "lock", 1, 1)
    (holder,) = line.holders
    assert (holder.owner, holder.label, holder.payload, holder.token) == (lock.owner, "job a", "{}", 1)
    assert 0 < holder.granted_us <= locker.clock.now_us()
    assert line.waiter_labels == ["job a, again"]
    assert [s.lock_id for s in list_locks(store, idle=True)] == ["jobs/a", "jobs/b"]
    assert list_locks(store, prefix="nothing") == []
    lock.release()
    waiter.join(timeout=20)
    other.close()


def test_revoke_token_ends_exactly_that_holder_and_the_next_waiter_gets_the_lock(
    locker: RemoteLocker, store: CellStore
) -> None:
    assert revoke_token is not None
    lock = locker.get_lock("stuck", label="stuck job")
    lost: list[str] = []
    lock.on_lost(lost.append)
    other = RemoteLocker(store, lease=5)
    taken: list[RemoteLock] = []
    waiter = threading.Thread(target=lambda: taken.append(other.get_lock("stuck", timeout=20)))
    waiter.start()
    # Not the holder's token: nothing is revoked, and who holds it is said.
    refused = revoke_token(store, "stuck", lock.fencing_token + 1)
    assert refused.revoked is None and [h.owner for h in refused.holders] == [lock.owner]
    assert store.read_versioned("stuck").get(HOLDER_COLUMN) is not None
    done = revoke_token(store, "stuck", lock.fencing_token)
    assert done.revoked is not None and (done.revoked.owner, done.revoked.label) == (lock.owner, "stuck job")
    ended = EndRecord.decode(store.read_versioned("stuck")["~ended"])
    assert ended is not None and (ended.owner, ended.how, ended.token) == (lock.owner, "revoked", 1)  # as leasewatch
    waiter.join(timeout=20)
    assert [t.fencing_token for t in taken] == [2]  # the waiter took its turn
    deadline = time.monotonic() + 10  # the holder learns at its next renewal (lease/3)
    while not lost:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # "changed by another writer" when the next holder was granted before the renewal looked.
    assert lost[0] in ("lease revoked", "lease record changed by another writer") and not lock.held
    # Revoking token 1 again revokes nothing: token 2 holds now.
    again = revoke_token(store, "stuck", 1)
    assert again.revoked is None and [h.token for h in again.holders] == [2]
    assert lock.release() is False
    taken[0].release()
    other.close()
